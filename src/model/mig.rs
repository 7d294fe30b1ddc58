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
//! The profiles are those of an 80 GB H100/H200: a GPU has 7 compute slices
//! and 8 memory slices, and a layout must fit both.

use serde::{Deserialize, Serialize};

/// Compute slices of a whole GPU (what accounting divides by).
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
}

impl MigSlice {
    /// The share of its GPU it is, for accounting: compute slices / 7.
    pub fn fraction(&self) -> f64 {
        f64::from(self.compute_slices) / f64::from(COMPUTE_SLICES)
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

/// The profiles of an 80 GB H100 or H200, smallest first.
pub const PROFILES: [MigProfile; 6] = [
    profile("1g.10gb", 1, 1, 9_856),
    profile("1g.20gb", 1, 2, 19_968),
    profile("2g.20gb", 2, 2, 19_968),
    profile("3g.40gb", 3, 4, 40_192),
    profile("4g.40gb", 4, 4, 40_192),
    profile("7g.80gb", 7, 8, 80_896),
];

const fn profile(name: &'static str, compute: u8, memory: u8, mb: u64) -> MigProfile {
    MigProfile {
        name,
        compute_slices: compute,
        memory_slices: memory,
        memory_mb: mb,
    }
}

/// How many sevenths of a GPU one GPU entry of a job asking for `slice` is:
/// 7 for a whole GPU (or an unknown profile), a slice's compute slices.
/// Accounting and fair-share charge a slice's time by this share.
pub fn sevenths(slice: Option<&str>) -> u64 {
    slice
        .and_then(|p| find_profile(p).ok())
        .map_or(u64::from(COMPUTE_SLICES), |p| u64::from(p.compute_slices))
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

/// The known profile names, comma-separated, for messages.
pub fn known_profiles() -> String {
    PROFILES.map(|p| p.name).join(", ")
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
    PROFILES
        .iter()
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
        let err = MigLayout::parse("1g.5gb:7").unwrap_err().to_string();
        assert!(
            err.contains("unknown MIG profile") && err.contains("1g.10gb"),
            "{err}"
        );
        assert!(MigLayout::parse("1g.10gb:x").is_err());
        assert!(MigLayout::parse("").is_err());
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
