//! Bad input never crashes gpuq: every fuzz target of `tests/fuzzing/` runs
//! its share of 100,000 inputs (`GPUQ_FUZZ_CASES` sets the total) from a
//! fixed seed (`GPUQ_FUZZ_SEED`), and none may panic, allocate without
//! bound or hang. A crash names its input's case number and saved file; see
//! `tests/fuzzing/mod.rs` for replaying one. `benches/fuzz.rs` runs the
//! same targets with 10 million inputs.

mod fuzzing;

use std::path::Path;

use fuzzing::mutate::{encode_int, encode_str, scan, Kind, EDGE_INTS};

#[global_allocator]
static ALLOC: fuzzing::alloc::Counting = fuzzing::alloc::Counting;

/// Inputs across all targets unless `GPUQ_FUZZ_CASES` says otherwise.
const DEFAULT_CASES: u64 = 100_000;

#[test]
fn no_input_crashes_any_target() {
    if let Ok(path) = std::env::var("GPUQ_FUZZ_REPLAY") {
        let (target, why) = fuzzing::replay(Path::new(&path));
        assert!(
            why.is_none(),
            "{target}: {path}: {}",
            why.unwrap_or_default()
        );
        return;
    }
    let total = fuzzing::env_u64("GPUQ_FUZZ_CASES", DEFAULT_CASES);
    let seed = fuzzing::env_u64("GPUQ_FUZZ_SEED", fuzzing::DEFAULT_SEED);
    let from = fuzzing::env_u64("GPUQ_FUZZ_FROM", 0);
    let only = std::env::var("GPUQ_FUZZ_ONLY").ok();
    let mut targets = fuzzing::targets();
    if let Some(only) = &only {
        targets.retain(|t| t.name == only);
        assert!(!targets.is_empty(), "GPUQ_FUZZ_ONLY={only}: no such target");
    }
    let shares = fuzzing::shares(&targets, total);
    let mut failures = Vec::new();
    println!(
        "{:<16} {:>8} {:>8} {:>10} {:>10}",
        "target", "inputs", "crashes", "inputs/s", "slowest ms"
    );
    for (target, count) in targets.iter().zip(shares) {
        let report = fuzzing::run(target, seed, from, count);
        println!(
            "{:<16} {:>8} {:>8} {:>10.0} {:>10.1}",
            report.target,
            report.inputs,
            report.crashes.len(),
            report.inputs_per_sec(),
            report.slowest.as_secs_f64() * 1e3
        );
        for crash in report.crashes.iter().take(5) {
            failures.push(format!(
                "{} case {} ({}): {}",
                report.target,
                crash.case,
                crash
                    .saved
                    .as_ref()
                    .map_or("not saved".into(), |p| p.display().to_string()),
                crash.why
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "crashes (seed {seed}):\n{}",
        failures.join("\n")
    );
}

#[test]
fn a_panicking_target_is_counted_as_a_crash() {
    // The runner itself must be able to fail: a target that panics on some
    // inputs is reported, with the case and the panic's text.
    let target = fuzzing::Target {
        name: "self-check",
        weight: 1,
        generate: |rng| vec![rand::Rng::gen_range(rng, 0u8..4)],
        check: |input| assert!(input[0] != 0, "zero byte"),
    };
    let report = fuzzing::run(&target, 1, 0, 200);
    assert!(!report.crashes.is_empty());
    assert!(
        report.crashes[0].why.contains("zero byte"),
        "{}",
        report.crashes[0].why
    );
    let hungry = fuzzing::Target {
        name: "self-check-alloc",
        weight: 1,
        generate: |_| vec![1],
        check: |_| drop(std::hint::black_box(vec![1u8; fuzzing::ALLOC_LIMIT + 1])),
    };
    let report = fuzzing::run(&hungry, 1, 0, 1);
    assert_eq!(
        report.crashes.len(),
        1,
        "an allocation over the limit is a crash"
    );
}

#[test]
fn scan_finds_every_token_of_an_encoding() {
    let data = rmp_serde::to_vec_named(&(1u8, "ab", vec![300u32, 70_000], -5i8)).unwrap();
    let kinds: Vec<Kind> = scan(&data).iter().map(|t| t.kind).collect();
    assert_eq!(
        kinds,
        [
            Kind::Header {
                count: 4,
                map: false
            },
            Kind::Int,
            Kind::Str,
            Kind::Header {
                count: 2,
                map: false
            },
            Kind::Int,
            Kind::Int,
            Kind::Int
        ]
    );
}

#[test]
fn encodings_decode_back() {
    for &v in EDGE_INTS {
        let enc = encode_int(v);
        let back = if v < 0 {
            i128::from(rmp_serde::from_slice::<i64>(&enc).unwrap())
        } else {
            i128::from(rmp_serde::from_slice::<u64>(&enc).unwrap())
        };
        assert_eq!(back, v);
    }
    for s in [
        "",
        "abc",
        &"y".repeat(40),
        &"z".repeat(300),
        &"w".repeat(70_000),
    ] {
        let back: String = rmp_serde::from_slice(&encode_str(s)).unwrap();
        assert_eq!(back, s);
    }
}
