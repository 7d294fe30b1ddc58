//! A MIG-enabled GPU's instances through NVML. nvml-wrapper 0.11 reads a
//! GPU's MIG mode but cannot list its instances, so this opens NVML's own
//! bindings (`nvml-wrapper-sys`, the same library, loaded once more) for
//! the two calls that find them, and reads each instance through the safe
//! wrapper as a device of its own (UUID, name, memory).
//!
//! An instance's profile is the last word of its name (`NVIDIA H100 80GB
//! HBM3 MIG 1g.10gb`), as `nvidia-smi -L` shows it.

use std::sync::OnceLock;

use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};
use nvml_wrapper_sys::bindings::{
    nvmlDevice_t, nvmlReturn_enum_NVML_ERROR_NOT_FOUND, nvmlReturn_enum_NVML_SUCCESS, NvmlLib,
    NVML_DEVICE_MIG_ENABLE,
};

use super::GpuError;
use crate::model::{GpuInfo, MigSlice};

/// The library for the calls nvml-wrapper lacks; `None` when it would not load.
fn raw_lib() -> Option<&'static NvmlLib> {
    static LIB: OnceLock<Option<NvmlLib>> = OnceLock::new();
    LIB.get_or_init(|| {
        // SAFETY: loads the library nvml-wrapper already loaded and
        // initialised; only its symbols are looked up here.
        unsafe { NvmlLib::new("libnvidia-ml.so.1") }
            .map_err(|e| tracing::warn!("cannot load NVML for MIG instances: {e}"))
            .ok()
    })
    .as_ref()
}

/// The instances of `device` (GPU `parent`), each numbered from `*next`
/// on; `None` when MIG is off (or not supported) on it.
pub fn instances(
    nvml: &'static Nvml,
    device: &Device<'static>,
    parent: &GpuInfo,
    next: &mut u32,
) -> Result<Option<Vec<GpuInfo>>, GpuError> {
    let gpu = Some(parent.index);
    match device.mig_mode() {
        Ok(mode) if mode.current == NVML_DEVICE_MIG_ENABLE => {}
        Ok(_) | Err(NvmlError::NotSupported) => return Ok(None),
        Err(source) => {
            return Err(GpuError::Nvml {
                what: "read the MIG mode",
                gpu,
                source,
            })
        }
    }
    let lib = raw_lib().ok_or(GpuError::Nvml {
        what: "load NVML's MIG calls",
        gpu,
        source: NvmlError::FunctionNotFound,
    })?;
    // SAFETY: the handle is the wrapper's own, for a library that stays
    // loaded for the process's life (`shared_nvml`).
    let handle: nvmlDevice_t = unsafe { device.handle() };
    let mut max: std::os::raw::c_uint = 0;
    // SAFETY: a valid device handle and a pointer to a local.
    let ret = unsafe { lib.nvmlDeviceGetMaxMigDeviceCount(handle, &mut max) };
    if ret != nvmlReturn_enum_NVML_SUCCESS {
        return Err(nvml_failed("count MIG instances", gpu, ret));
    }
    let mut out = Vec::new();
    for i in 0..max {
        let mut mig: nvmlDevice_t = std::ptr::null_mut();
        // SAFETY: as above; `i` is below the count NVML gave.
        let ret = unsafe { lib.nvmlDeviceGetMigDeviceHandleByIndex(handle, i, &mut mig) };
        if ret == nvmlReturn_enum_NVML_ERROR_NOT_FOUND {
            continue;
        }
        if ret != nvmlReturn_enum_NVML_SUCCESS {
            return Err(nvml_failed("open a MIG instance", gpu, ret));
        }
        // SAFETY: a MIG device handle NVML just gave, used with the same
        // library; NVML accepts it where a device handle is expected.
        let instance = unsafe { Device::new(mig, nvml) };
        let err = |what| move |source| GpuError::Nvml { what, gpu, source };
        let name = instance.name().map_err(err("read a MIG instance's name"))?;
        let Some(profile) = profile_of(&name) else {
            tracing::warn!(
                gpu = parent.index,
                name,
                "a MIG instance without a profile in its name; left out"
            );
            continue;
        };
        let memory = instance
            .memory_info()
            .map_err(err("read a MIG instance's memory"))?;
        let uuid = instance.uuid().map_err(err("read a MIG instance's UUID"))?;
        let compute_slices = profile
            .split_once('g')
            .and_then(|(n, _)| n.parse::<u8>().ok())
            .unwrap_or(1);
        let slice = MigSlice {
            profile: profile.to_string(),
            parent: parent.index,
            compute_slices,
            placement: 0,
            slots: 0,
        };
        out.push(super::mig::slice_entry(
            parent,
            *next,
            uuid,
            memory.total >> 20,
            slice,
        ));
        *next += 1;
    }
    Ok(Some(out))
}

/// The profile at the end of a MIG instance's name, e.g. `1g.10gb`.
pub fn profile_of(name: &str) -> Option<&str> {
    let last = name.split_whitespace().last()?;
    crate::model::mig::looks_like_profile(last).then_some(last)
}

fn nvml_failed(what: &'static str, gpu: Option<u32>, ret: u32) -> GpuError {
    GpuError::Nvml {
        what,
        gpu,
        source: nvml_wrapper::error::nvml_try(ret)
            .err()
            .unwrap_or(NvmlError::UnexpectedVariant(ret)),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_profile_is_the_last_word_of_an_instance_name() {
        assert_eq!(
            super::profile_of("NVIDIA H100 80GB HBM3 MIG 1g.10gb"),
            Some("1g.10gb")
        );
        assert_eq!(super::profile_of("NVIDIA H100 80GB HBM3"), None);
    }
}
