//! MIG (Multi-Instance GPU): an H100 or H200 split into up to seven
//! isolated instances, each scheduled as a GPU of its own.
//!
//! Why slices are inventory entries and not a count on a GPU: a MIG-enabled
//! GPU cannot run a whole-GPU job, and each instance has its own UUID
//! (`MIG-...`) that CUDA selects it by. So an agent reports a partitioned
//! GPU as its instances, each a [`GpuInfo`](super::GpuInfo) with a
//! [`MigSlice`] and an index of its own, and never as the whole GPU; the
//! scheduler's GPU sets, allocations, accounting and tables then work on
//! slices as they do on GPUs. A whole GPU keeps its CUDA index; slices are
//! numbered after the node's physical GPUs (8 GPUs: slices from 8), so an
//! index never names two things.
//!
//! A layout is first checked against 7 compute and 8 memory slices with
//! the 80 GB H100 profiles' sizes (and names from every model); `gpuq node
//! mig set` then checks it against the node's GPU model ([`MODELS`]): the
//! H200 141GB, H100 94GB and 80GB, A100 80GB and 40GB, and A30 (4 compute
//! and 4 memory slices) each have their own profiles.

use serde::{Deserialize, Serialize};

/// Compute slices of a whole GPU of most models (an A30 has 4).
pub const COMPUTE_SLICES: u8 = 7;
/// Memory slices of a whole GPU.
pub const MEMORY_SLICES: u8 = 8;

/// One MIG instance, as a field of the inventory entry it is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigSlice {
    /// The profile, e.g. `1g.10gb`.
    pub profile: String,
    /// The index of the physical GPU it is part of.
    pub parent: u32,
    /// Compute slices out of [`COMPUTE_SLICES`].
    pub compute_slices: u8,
    /// The first compute slice it occupies (NVML's placement start).
    #[serde(default)]
    pub placement: u8,
    /// A time-sliced slot (`model::share`, profile `shared`): the number of
    /// slots its GPU is shared into; 0 for a MIG instance.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub slots: u8,
}

fn is_zero(n: &u8) -> bool {
    *n == 0
}

impl MigSlice {
    /// The share of its GPU it is, for accounting: its profile's [`share`]
    /// (compute slices / 7 on most models), or 1 / slots for a time-sliced
    /// slot.
    pub fn fraction(&self) -> f64 {
        if self.slots > 0 {
            return 1.0 / f64::from(self.slots);
        }
        let (part, whole) = share(Some(&self.profile));
        part as f64 / whole as f64
    }
}

/// A MIG profile a GPU can be split into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MigProfile {
    pub name: &'static str,
    pub compute_slices: u8,
    pub memory_slices: u8,
    /// Memory of one instance in MiB.
    pub memory_mb: u64,
}

/// The profiles of an 80 GB H100 or A100, smallest first.
pub const PROFILES: [MigProfile; 6] = [
    profile("1g.10gb", 1, 1, 9_856),
    profile("1g.20gb", 1, 2, 19_968),
    profile("2g.20gb", 2, 2, 19_968),
    profile("3g.40gb", 3, 4, 40_192),
    profile("4g.40gb", 4, 4, 40_192),
    profile("7g.80gb", 7, 8, 80_896),
];

/// A GPU model that MIG can partition: its slices and its profiles, from
/// NVIDIA's MIG user guide ("Supported MIG Profiles").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MigModel {
    pub name: &'static str,
    pub compute_slices: u8,
    pub memory_slices: u8,
    pub profiles: &'static [MigProfile],
}

/// The models `mig set` knows, matched by [`model_of`].
pub const MODELS: [MigModel; 6] = [
    mig_model("H200 141GB", 7, 8, &H200_141GB),
    mig_model("H100 94GB", 7, 8, &H100_94GB),
    mig_model("H100 80GB", 7, 8, &PROFILES),
    mig_model("A100 80GB", 7, 8, &PROFILES),
    mig_model("A100 40GB", 7, 8, &A100_40GB),
    mig_model("A30 24GB", 4, 4, &A30_24GB),
];

/// H200 (SXM5 and NVL), 141 GB: 8 memory slices of about 17.6 GB.
const H200_141GB: [MigProfile; 6] = [
    profile("1g.18gb", 1, 1, 16_384),
    profile("1g.35gb", 1, 2, 32_768),
    profile("2g.35gb", 2, 2, 32_768),
    profile("3g.71gb", 3, 4, 65_536),
    profile("4g.71gb", 4, 4, 65_536),
    profile("7g.141gb", 7, 8, 131_072),
];

/// H100 NVL (and SXM5) with 94 GB.
const H100_94GB: [MigProfile; 6] = [
    profile("1g.12gb", 1, 1, 11_008),
    profile("1g.24gb", 1, 2, 22_016),
    profile("2g.24gb", 2, 2, 22_016),
    profile("3g.47gb", 3, 4, 44_032),
    profile("4g.47gb", 4, 4, 44_032),
    profile("7g.94gb", 7, 8, 88_064),
];

/// A100 with 40 GB: 8 memory slices of 5 GB, so `1g.10gb` is two of them.
const A100_40GB: [MigProfile; 6] = [
    profile("1g.5gb", 1, 1, 4_864),
    profile("1g.10gb", 1, 2, 9_856),
    profile("2g.10gb", 2, 2, 9_856),
    profile("3g.20gb", 3, 4, 19_968),
    profile("4g.20gb", 4, 4, 19_968),
    profile("7g.40gb", 7, 8, 40_192),
];

/// A30, 24 GB: 4 compute and 4 memory slices.
const A30_24GB: [MigProfile; 3] = [
    profile("1g.6gb", 1, 1, 5_888),
    profile("2g.12gb", 2, 2, 11_904),
    profile("4g.24gb", 4, 4, 24_064),
];

const fn mig_model(
    name: &'static str,
    compute: u8,
    memory: u8,
    profiles: &'static [MigProfile],
) -> MigModel {
    MigModel {
        name,
        compute_slices: compute,
        memory_slices: memory,
        profiles,
    }
}

/// The MIG model of a GPU by its marketing name (`NVIDIA H100 80GB HBM3`,
/// `NVIDIA H100 NVL`, `NVIDIA A100-SXM4-40GB`, `NVIDIA A30`); `None`: a
/// GPU MIG cannot partition (or one not known here).
pub fn model_of(gpu_model: &str) -> Option<&'static MigModel> {
    let m = gpu_model.to_ascii_uppercase();
    let pick = |name: &str| MODELS.iter().find(|x| x.name == name);
    if m.contains("H200") {
        pick("H200 141GB")
    } else if m.contains("H100") && (m.contains("NVL") || m.contains("94GB")) {
        pick("H100 94GB")
    } else if m.contains("H100") {
        pick("H100 80GB")
    } else if m.contains("A100") && m.contains("80GB") {
        pick("A100 80GB")
    } else if m.contains("A100") {
        pick("A100 40GB")
    } else if m.contains("A30") {
        pick("A30 24GB")
    } else {
        None
    }
}

impl MigModel {
    /// Its profile names, comma-separated, for messages.
    pub fn profile_names(&self) -> String {
        self.profiles
            .iter()
            .map(|p| p.name)
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Whether `layout` fits one GPU of this model: every profile is one
    /// of its own, and their slices (its sizes) fit its compute and memory
    /// slices. The error names the model and what it supports.
    pub fn check(&self, layout: &MigLayout) -> Result<(), String> {
        let (mut compute, mut memory) = (0u32, 0u32);
        for p in &layout.0 {
            let Some(own) = self.profiles.iter().find(|q| q.name == p.name) else {
                return Err(format!(
                    "the {} has no MIG profile {}; it supports {}",
                    self.name,
                    p.name,
                    self.profile_names()
                ));
            };
            compute += u32::from(own.compute_slices);
            memory += u32::from(own.memory_slices);
        }
        if compute > u32::from(self.compute_slices) || memory > u32::from(self.memory_slices) {
            return Err(format!(
                "{} needs {compute} compute slices and {memory} memory slices of a {}, which \
                 has {} and {}",
                layout.to_text(),
                self.name,
                self.compute_slices,
                self.memory_slices
            ));
        }
        Ok(())
    }
}

const fn profile(name: &'static str, compute: u8, memory: u8, mb: u64) -> MigProfile {
    MigProfile {
        name,
        compute_slices: compute,
        memory_slices: memory,
        memory_mb: mb,
    }
}

/// The share of a GPU one GPU entry of a job asking for `slice` is, as
/// (compute slices, compute slices of the GPU model the profile is of):
/// (7, 7) for a whole GPU or an unknown profile, (1, 7) for a `1g.10gb`,
/// (1, 4) for an A30's `1g.6gb`. Accounting and fair share charge a
/// slice's time by this share.
pub fn share(slice: Option<&str>) -> (u64, u64) {
    let whole = (u64::from(COMPUTE_SLICES), u64::from(COMPUTE_SLICES));
    let Some(name) = slice.map(str::trim) else {
        return whole;
    };
    MODELS
        .iter()
        .find_map(|m| {
            let p = m
                .profiles
                .iter()
                .find(|p| p.name.eq_ignore_ascii_case(name))?;
            Some((u64::from(p.compute_slices), u64::from(m.compute_slices)))
        })
        .or_else(|| {
            let p = find_profile(name).ok()?;
            Some((u64::from(p.compute_slices), u64::from(COMPUTE_SLICES)))
        })
        .unwrap_or(whole)
}

/// Why a profile or a layout was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MigError {
    #[error("unknown MIG profile {input:?}; known profiles: {}", known_profiles())]
    UnknownProfile { input: String },
    #[error("MIG layout {input:?} is not PROFILE[:COUNT][,PROFILE[:COUNT]...], e.g. 1g.10gb:7 or 3g.40gb,2g.20gb,1g.10gb:2")]
    BadLayout { input: String },
    #[error(
        "MIG layout {input:?} does not fit one GPU: it needs {compute} compute slices and \
         {memory} memory slices; a GPU has {COMPUTE_SLICES} and {MEMORY_SLICES}"
    )]
    TooLarge {
        input: String,
        compute: u32,
        memory: u32,
    },
}

/// Every profile of every model, each name once (the first model's sizes
/// for a name two models share, e.g. `1g.10gb`), 80 GB H100 ones first.
fn all_profiles() -> impl Iterator<Item = &'static MigProfile> {
    PROFILES.iter().chain(
        MODELS
            .iter()
            .flat_map(|m| m.profiles.iter())
            .enumerate()
            .filter(|(i, p)| {
                !PROFILES.iter().any(|q| q.name == p.name)
                    && !MODELS
                        .iter()
                        .flat_map(|m| m.profiles.iter())
                        .take(*i)
                        .any(|q| q.name == p.name)
            })
            .map(|(_, p)| p),
    )
}

/// The known profile names, comma-separated, for messages.
pub fn known_profiles() -> String {
    all_profiles()
        .map(|p| p.name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Whether `word` has a MIG profile's shape (`<N>g.<M>gb`), known or not:
/// what tells `--gpus-per-node 1g.10gb:2` from a GPU type such as `h100:2`.
pub fn looks_like_profile(word: &str) -> bool {
    let w = word.to_ascii_lowercase();
    let Some((g, mem)) = w.split_once("g.") else {
        return false;
    };
    let Some(gb) = mem.strip_suffix("gb") else {
        return false;
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    digits(g) && digits(gb)
}

/// The profile named `name` (any case).
pub fn find_profile(name: &str) -> Result<&'static MigProfile, MigError> {
    all_profiles()
        .find(|p| p.name.eq_ignore_ascii_case(name.trim()))
        .ok_or_else(|| MigError::UnknownProfile {
            input: name.to_string(),
        })
}

/// A GPU's MIG layout: its instances, largest first (the order NVML's
/// placements fill a GPU in).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MigLayout(pub Vec<&'static MigProfile>);

impl MigLayout {
    /// Parses `1g.10gb:7` or `3g.40gb,2g.20gb,1g.10gb:2` and checks that it
    /// fits one GPU.
    pub fn parse(input: &str) -> Result<MigLayout, MigError> {
        let bad = || MigError::BadLayout {
            input: input.to_string(),
        };
        let mut out: Vec<&'static MigProfile> = Vec::new();
        for item in input.split(',') {
            let item = item.trim();
            let (name, count) = match item.split_once(':') {
                Some((n, c)) => (n, c.trim().parse::<u32>().map_err(|_| bad())?),
                None => (item, 1),
            };
            // More than a GPU's slices is refused below, saying so.
            if name.is_empty() || count == 0 || count > 64 {
                return Err(bad());
            }
            let p = find_profile(name)?;
            out.extend(std::iter::repeat_n(p, count as usize));
        }
        let compute: u32 = out.iter().map(|p| u32::from(p.compute_slices)).sum();
        let memory: u32 = out.iter().map(|p| u32::from(p.memory_slices)).sum();
        if compute > u32::from(COMPUTE_SLICES) || memory > u32::from(MEMORY_SLICES) {
            return Err(MigError::TooLarge {
                input: input.to_string(),
                compute,
                memory,
            });
        }
        out.sort_by_key(|p| std::cmp::Reverse(p.compute_slices));
        Ok(MigLayout(out))
    }

    /// `1g.10gb:7`, `3g.40gb:1,2g.20gb:1,1g.10gb:2`.
    pub fn to_text(&self) -> String {
        let mut parts: Vec<(&str, u32)> = Vec::new();
        for p in &self.0 {
            match parts.last_mut() {
                Some((name, n)) if *name == p.name => *n += 1,
                _ => parts.push((p.name, 1)),
            }
        }
        parts
            .iter()
            .map(|(name, n)| format!("{name}:{n}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The instances with the first compute slice each occupies.
    pub fn placed(&self) -> Vec<(&'static MigProfile, u8)> {
        let mut start = 0u8;
        self.0
            .iter()
            .map(|p| {
                let at = start;
                start += p.compute_slices;
                (*p, at)
            })
            .collect()
    }
}

/// The word that asks for whole GPUs (MIG off) where a layout is expected.
pub const NO_MIG: &str = "none";

/// A layout for every GPU of a node (`gpuq node mig set --layout`), or
/// `None` for [`NO_MIG`].
pub fn parse_target(layout: &str) -> Result<Option<MigLayout>, MigError> {
    if layout.trim().eq_ignore_ascii_case(NO_MIG) {
        return Ok(None);
    }
    MigLayout::parse(layout).map(Some)
}

impl Serialize for MigLayout {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_text())
    }
}

impl<'de> Deserialize<'de> for MigLayout {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<MigLayout, D::Error> {
        let text = String::deserialize(d)?;
        MigLayout::parse(&text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_parse_and_must_fit_seven_compute_and_eight_memory_slices() {
        let l = MigLayout::parse("1g.10gb:7").unwrap();
        assert_eq!(l.0.len(), 7);
        assert_eq!(l.to_text(), "1g.10gb:7");
        let mixed = MigLayout::parse("1g.10gb:2,3g.40gb,2g.20gb").unwrap();
        assert_eq!(mixed.to_text(), "3g.40gb:1,2g.20gb:1,1g.10gb:2");
        assert_eq!(
            mixed.placed().iter().map(|(_, at)| *at).collect::<Vec<_>>(),
            [0, 3, 5, 6]
        );
        for ok in [
            "1g.20gb:4",
            "2g.20gb:3",
            "3g.40gb:2",
            "4g.40gb",
            "7g.80gb:1",
        ] {
            assert!(MigLayout::parse(ok).is_ok(), "{ok}");
        }
        let err = MigLayout::parse("1g.10gb:8").unwrap_err().to_string();
        assert!(
            err.contains("needs 8 compute slices and 8 memory slices"),
            "{err}"
        );
        let err = MigLayout::parse("1g.20gb:5").unwrap_err().to_string();
        assert!(err.contains("10 memory slices"), "{err}");
        let err = MigLayout::parse("4g.40gb,4g.40gb").unwrap_err().to_string();
        assert!(err.contains("8 compute slices"), "{err}");
        let err = MigLayout::parse("1g.7gb:7").unwrap_err().to_string();
        assert!(
            err.contains("unknown MIG profile") && err.contains("1g.10gb"),
            "{err}"
        );
        assert!(MigLayout::parse("1g.10gb:x").is_err());
        assert!(MigLayout::parse("").is_err());
    }

    #[test]
    fn a_slice_is_charged_its_share_of_its_own_models_gpu() {
        assert_eq!(share(None), (7, 7));
        assert_eq!(share(Some("1g.10gb")), (1, 7));
        assert_eq!(share(Some("3G.40GB")), (3, 7));
        assert_eq!(share(Some("1g.18gb")), (1, 7));
        // An A30 has 4 compute slices: its smallest slice is a quarter.
        assert_eq!(share(Some("1g.6gb")), (1, 4));
        assert_eq!(share(Some("2g.12gb")), (2, 4));
        assert_eq!(share(Some("no-such")), (7, 7));
    }

    #[test]
    fn each_gpu_model_holds_its_own_profiles_only() {
        let model = |name: &str| model_of(name).map(|m| m.name);
        assert_eq!(model("NVIDIA H200"), Some("H200 141GB"));
        assert_eq!(model("NVIDIA H100 NVL"), Some("H100 94GB"));
        assert_eq!(model("NVIDIA H100 80GB HBM3"), Some("H100 80GB"));
        assert_eq!(model("NVIDIA A100-SXM4-80GB"), Some("A100 80GB"));
        assert_eq!(model("NVIDIA A100-PCIE-40GB"), Some("A100 40GB"));
        assert_eq!(model("NVIDIA A30"), Some("A30 24GB"));
        assert_eq!(model("NVIDIA L40S"), None);
        let fits = |gpu: &str, layout: &str| {
            model_of(gpu)
                .unwrap()
                .check(&MigLayout::parse(layout).unwrap())
        };
        for (gpu, ok) in [
            ("NVIDIA H200", "1g.18gb:7"),
            ("NVIDIA H200", "3g.71gb:2"),
            ("NVIDIA H200", "1g.35gb:4"),
            ("NVIDIA H200", "7g.141gb"),
            ("NVIDIA H200", "4g.71gb,2g.35gb,1g.18gb"),
            ("NVIDIA H100 NVL", "2g.24gb:3"),
            ("NVIDIA H100 NVL", "7g.94gb"),
            ("NVIDIA A100-SXM4-40GB", "1g.5gb:7"),
            ("NVIDIA A100-SXM4-40GB", "1g.10gb:4"),
            ("NVIDIA A100-SXM4-40GB", "3g.20gb,2g.10gb,1g.5gb:2"),
            ("NVIDIA A100-SXM4-80GB", "1g.10gb:7"),
            ("NVIDIA A30", "1g.6gb:4"),
            ("NVIDIA A30", "2g.12gb,1g.6gb:2"),
            ("NVIDIA A30", "4g.24gb"),
        ] {
            assert_eq!(fits(gpu, ok), Ok(()), "{gpu} {ok}");
        }
        let err = fits("NVIDIA H200", "1g.10gb:7").unwrap_err();
        assert_eq!(
            err,
            "the H200 141GB has no MIG profile 1g.10gb; it supports 1g.18gb, 1g.35gb, 2g.35gb, \
             3g.71gb, 4g.71gb, 7g.141gb"
        );
        // 1g.10gb is two of an A100 40GB's 5 GB memory slices: 4 at most.
        let err = fits("NVIDIA A100-SXM4-40GB", "1g.10gb:5").unwrap_err();
        assert!(
            err.contains("needs 5 compute slices and 10 memory slices of a A100 40GB"),
            "{err}"
        );
        let err = fits("NVIDIA A30", "1g.6gb:5").unwrap_err();
        assert!(err.contains("which has 4 and 4"), "{err}");
        let err = fits("NVIDIA A30", "3g.40gb").unwrap_err();
        assert!(err.contains("1g.6gb, 2g.12gb, 4g.24gb"), "{err}");
        // Names of every model are known at submit, each once.
        let known = known_profiles();
        assert!(known.starts_with("1g.10gb, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb, 1g.18gb"));
        assert_eq!(known.matches("1g.10gb").count(), 1, "{known}");
        assert!(find_profile("7G.141GB").is_ok() && find_profile("1g.6gb").is_ok());
    }

    #[test]
    fn profile_shaped_words_are_told_from_gpu_types() {
        assert!(looks_like_profile("1g.10gb") && looks_like_profile("7G.80GB"));
        assert!(looks_like_profile("1g.5gb"));
        for not in ["h100", "a100-80gb", "g.10gb", "1g.gb", "1g10gb"] {
            assert!(!looks_like_profile(not), "{not}");
        }
    }
}
