//! Fuzzing on stable Rust: every way a stranger's bytes reach gpuq, driven
//! with generated and mutated inputs, shared by `tests/fuzz.rs` (100,000
//! inputs, in CI) and `benches/fuzz.rs` (10 million).
//!
//! A [`Target`] is a pair of plain functions: `generate` makes one input
//! (bytes) from a random source, mostly by mutating valid encodings of real
//! messages (structure-aware mutation reaches the code behind the decoder,
//! which random bytes almost never do), and `check` feeds those bytes to the
//! real code the way a peer, a user or a config file would. Bad input must
//! come back as an error: a panic (including an arithmetic overflow in the
//! debug profile), an input that allocates more than [`ALLOC_LIMIT`] or one
//! that runs longer than [`SLOW_INPUT`] is a crash.
//!
//! Input `i` of a target is made from its own seed (the target's name, the
//! run's seed and `i`), so any input reproduces alone:
//! `GPUQ_FUZZ_ONLY=NAME GPUQ_FUZZ_FROM=i GPUQ_FUZZ_CASES=1`; and the bytes of
//! each crash are saved under `target/fuzz-crashes/` for `GPUQ_FUZZ_REPLAY`.
//! No nightly, no libFuzzer: coverage guidance is traded for seeds and
//! mutators that know the formats.

#![allow(dead_code)]

pub mod alloc;
pub mod cluster;
pub mod config;
pub mod hostlist;
pub mod mutate;
pub mod seeds;
pub mod spec;
pub mod wire;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::SeedableRng;

/// More bytes than this live at once, for one input, is a crash: every
/// decoder and parser must bound what a small input can make it allocate.
pub const ALLOC_LIMIT: usize = 256 << 20;

/// An input that takes longer than this (debug profile, a loaded machine) is
/// a crash: a hang waiting to happen.
pub const SLOW_INPUT: Duration = Duration::from_secs(5);

/// The run's seed unless `GPUQ_FUZZ_SEED` says otherwise.
pub const DEFAULT_SEED: u64 = 20;

/// One fuzz target: where inputs come from and which real code they drive.
pub struct Target {
    /// Short, stable name (`frame-api`), used in tables, seeds and files.
    pub name: &'static str,
    /// This target's share of a run's inputs, relative to the others.
    pub weight: u32,
    /// Makes one input.
    pub generate: fn(&mut StdRng) -> Vec<u8>,
    /// Drives the real code with one input; it panics only on a bug of gpuq.
    pub check: fn(&[u8]),
}

/// Every target, in the order runs print them.
pub fn targets() -> Vec<Target> {
    let mut all = Vec::new();
    all.extend(wire::targets());
    all.extend(cluster::targets());
    all.extend(spec::targets());
    all.extend(config::targets());
    all.extend(hostlist::targets());
    all
}

/// One crash: what happened, and where its input is saved.
#[derive(Debug)]
pub struct Crash {
    pub case: u64,
    pub why: String,
    pub saved: Option<PathBuf>,
}

/// What running one target did.
#[derive(Debug)]
pub struct Report {
    pub target: &'static str,
    pub inputs: u64,
    pub crashes: Vec<Crash>,
    pub elapsed: Duration,
    /// The slowest single input.
    pub slowest: Duration,
}

impl Report {
    pub fn inputs_per_sec(&self) -> f64 {
        self.inputs as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// Runs inputs `from..from + count` of `target`; `seed` picks the run.
pub fn run(target: &Target, seed: u64, from: u64, count: u64) -> Report {
    quiet_panics();
    let base = seed ^ fnv(target.name.as_bytes());
    let mut crashes = Vec::new();
    let mut slowest = Duration::ZERO;
    let started = Instant::now();
    for case in from..from + count {
        let mut rng = StdRng::seed_from_u64(base.wrapping_add(case.wrapping_mul(0x9E37_79B9)));
        let input = (target.generate)(&mut rng);
        let (took, why) = drive(target, &input);
        slowest = slowest.max(took);
        if let Some(why) = why {
            let saved = save(target.name, &input);
            crashes.push(Crash { case, why, saved });
        }
    }
    Report {
        target: target.name,
        inputs: count,
        crashes,
        elapsed: started.elapsed(),
        slowest,
    }
}

/// Runs `check` on one input; says how long it took and why it is a crash.
pub fn drive(target: &Target, input: &[u8]) -> (Duration, Option<String>) {
    IN_CHECK.with(|c| c.set(true));
    alloc::arm();
    let t0 = Instant::now();
    let result = catch_unwind(AssertUnwindSafe(|| (target.check)(input)));
    let took = t0.elapsed();
    let peak = alloc::disarm();
    IN_CHECK.with(|c| c.set(false));
    let why = match result {
        Err(payload) => Some(format!(
            "panic at {}: {}",
            PANIC_AT.with(|p| p.take()),
            panic_text(&*payload)
        )),
        Ok(()) if peak > ALLOC_LIMIT => Some(format!(
            "allocated {} MiB at once for a {}-byte input",
            peak >> 20,
            input.len()
        )),
        Ok(()) if took > SLOW_INPUT => Some(format!(
            "took {:.1} s for a {}-byte input",
            took.as_secs_f64(),
            input.len()
        )),
        Ok(()) => None,
    };
    (took, why)
}

/// Splits `total` inputs among `targets` by weight (each gets at least one).
pub fn shares(targets: &[Target], total: u64) -> Vec<u64> {
    let weights: u64 = targets.iter().map(|t| u64::from(t.weight)).sum();
    targets
        .iter()
        .map(|t| (total * u64::from(t.weight) / weights.max(1)).max(1))
        .collect()
}

/// A number from the environment, or `default`.
pub fn env_u64(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => v
            .replace('_', "")
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a whole number")),
        Err(_) => default,
    }
}

/// Replays a saved input (`GPUQ_FUZZ_REPLAY=target/fuzz-crashes/NAME-HASH.bin`).
pub fn replay(path: &Path) -> (&'static str, Option<String>) {
    let file = path
        .file_name()
        .and_then(|f| f.to_str())
        .unwrap_or_default();
    let all = targets();
    let target = all
        .iter()
        .filter(|t| file.starts_with(&format!("{}-", t.name)))
        .max_by_key(|t| t.name.len())
        .unwrap_or_else(|| panic!("{file}: no target's name starts the file name"));
    let input = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    (target.name, drive(target, &input).1)
}

/// Saves a crash's input; returns where, or `None` if it could not.
fn save(target: &str, input: &[u8]) -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/fuzz-crashes");
    std::fs::create_dir_all(&dir).ok()?;
    let path = dir.join(format!("{target}-{:016x}.bin", fnv(input)));
    std::fs::write(&path, input).ok()?;
    Some(path)
}

fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "(a panic without a message)".into()
    }
}

std::thread_local! {
    /// Whether this thread is inside a target's `check`.
    static IN_CHECK: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// Where the last panic inside a `check` happened.
    static PANIC_AT: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
}

/// The default hook prints every caught panic; inside a `check` the runner
/// reports crashes itself, with the panic's text (`GPUQ_FUZZ_VERBOSE=1`
/// prints them as they happen, with the location).
fn quiet_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        let verbose = std::env::var_os("GPUQ_FUZZ_VERBOSE").is_some();
        std::panic::set_hook(Box::new(move |info| {
            if let Some(at) = info.location() {
                PANIC_AT.with(|p| *p.borrow_mut() = at.to_string());
            }
            if verbose || !IN_CHECK.with(|c| c.get()) {
                default(info);
            }
        }));
    });
}

/// FNV-1a: a stable hash for seeds and file names (std's hasher is seeded).
pub fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}
