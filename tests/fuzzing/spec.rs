//! Job specs from users: `gpuq submit` flag vectors, `#SBATCH`/`#GPUQ`
//! directives in scripts, and each value parser on its own (time, memory,
//! GPUs, arrays, dependencies, signals, ...), all through the real
//! `spec::` code down to `build_spec`'s checks. The parsers that promise a
//! round trip (`format_time`, `format_mem`) are held to it.

use std::path::Path;

use clap::Parser;
use gpuq::spec::{self, memory, placement, queue, time, values};
use rand::rngs::StdRng;
use rand::Rng;

use super::seeds::{Flags, FLAG_LINES};
use super::{mutate, Target};

pub fn targets() -> Vec<Target> {
    vec![
        Target {
            name: "spec-flags",
            weight: 10,
            generate: gen_flags,
            check: check_flags,
        },
        Target {
            name: "spec-script",
            weight: 10,
            generate: gen_script,
            check: check_script,
        },
        Target {
            name: "spec-values",
            weight: 20,
            generate: gen_value,
            check: check_value,
        },
    ]
}

/// Flags and values users type, good and bad.
const SPEC_WORDS: &[&str] = &[
    "--nodes",
    "-N",
    "--ntasks-per-node",
    "--gpus-per-node",
    "--gres",
    "-G",
    "--gpus",
    "--gpu-type",
    "-C",
    "--constraint",
    "-w",
    "--nodelist",
    "-x",
    "--exclude",
    "--topology",
    "-c",
    "--cpus-per-task",
    "--mem",
    "-t",
    "--time",
    "-A",
    "-p",
    "-q",
    "--nice",
    "-o",
    "-e",
    "-D",
    "--export",
    "--requeue",
    "--no-requeue",
    "--max-restarts",
    "-d",
    "--dependency",
    "-b",
    "--begin",
    "-H",
    "--hold",
    "-a",
    "--array",
    "--signal",
    "--wrap",
    "--",
    "-J",
    "0",
    "1",
    "4294967295",
    "4294967296",
    "-1",
    "-10001",
    "gpu:8",
    "gpu:h100:0",
    "gpu::",
    "h100:4294967295",
    "1:00:00",
    "0:0",
    "UNLIMITED",
    "365-00:00:00",
    "99999999-0",
    "16G",
    "0M",
    "1T",
    "1099511627776",
    "9999999999999T",
    "0-99%8",
    "0-4294967295",
    "1-100000:0",
    "%0",
    "afterok:0",
    "afterany:1:2:3",
    "singleton,after:5",
    "now+99999999999week",
    "2026-02-30T25:61",
    "now",
    "USR1@60",
    "B:KILL@0",
    "SIGRTMAX@5",
    "ALL",
    "NONE,A=b",
    "ALL,=x",
    "leaf",
    "spine",
    "ib&nvme",
    "ib|nvme",
    "n[1-4]",
    "out-%j.%t.%x.%u.%%",
    "%A_%a",
    "/abs/path",
    "sub/dir",
];

fn split(input: &[u8]) -> Vec<String> {
    input
        .split(|&b| b == 0)
        .map(|w| String::from_utf8_lossy(w).into_owned())
        .collect()
}

fn join(words: &[String]) -> Vec<u8> {
    words.join("\0").into_bytes()
}

/// A seed flag line with words replaced, inserted, repeated or dropped.
fn gen_flags(rng: &mut StdRng) -> Vec<u8> {
    let line = FLAG_LINES[rng.gen_range(0..FLAG_LINES.len())];
    let mut words: Vec<String> = line.iter().map(|w| w.to_string()).collect();
    for _ in 0..rng.gen_range(1..=3) {
        let at = rng.gen_range(0..=words.len());
        match rng.gen_range(0..5) {
            0 | 1 if at < words.len() => words[at] = mutate::edge_string(rng, SPEC_WORDS),
            2 => {
                let flags: Vec<&str> = SPEC_WORDS
                    .iter()
                    .copied()
                    .filter(|w| w.starts_with('-') && w.len() > 2)
                    .collect();
                let flag = flags[rng.gen_range(0..flags.len())].to_string();
                let value = mutate::edge_string(rng, SPEC_WORDS);
                words.splice(at..at, [flag, value]);
            }
            3 if at < words.len() => {
                let w = words[at].clone();
                words.insert(at, w);
            }
            _ if at < words.len() => {
                words.remove(at);
            }
            _ => {}
        }
    }
    join(&words)
}

/// Parses flags as `gpuq submit` does and builds the spec. A program word
/// that names a file is read as a script; the inputs never name one that
/// blocks on read (no `/dev/` paths are generated).
fn check_flags(input: &[u8]) {
    let words = split(input);
    if words
        .iter()
        .any(|w| w.starts_with("/dev") || w.starts_with("/proc"))
    {
        return;
    }
    let Ok(flags) = Flags::try_parse_from(&words) else {
        return;
    };
    let env = [("PATH".to_string(), "/usr/bin".to_string())];
    if let Ok(spec) = spec::build_spec(&flags.args, &env, Path::new("/tmp")) {
        assert!(
            spec.check_invariants().is_ok(),
            "build_spec accepted a spec that breaks its invariants: {spec:?}"
        );
    }
}

/// A script whose header holds directives made of the seed flag lines.
fn gen_script(rng: &mut StdRng) -> Vec<u8> {
    let mut script = String::from("#!/bin/bash\n");
    for _ in 0..rng.gen_range(1..=3) {
        let line = FLAG_LINES[rng.gen_range(0..FLAG_LINES.len())];
        let flags: Vec<&str> = line
            .iter()
            .copied()
            .take_while(|w| *w != "--" && *w != "--wrap")
            .collect();
        for pair in flags.chunks(2) {
            let prefix = if rng.gen_bool(0.5) {
                "#SBATCH"
            } else {
                "#GPUQ"
            };
            let quoted: Vec<String> = pair.iter().map(|w| quote(rng, w)).collect();
            script.push_str(&format!("{prefix} {}\n", quoted.join(" ")));
        }
    }
    script.push_str("\n# a comment\npython train.py \"$@\"\n#SBATCH --late-is-ignored\n");
    let mut bytes = script.into_bytes();
    mutate::text(rng, &mut bytes, SPEC_WORDS);
    bytes
}

fn quote(rng: &mut StdRng, word: &str) -> String {
    match rng.gen_range(0..4) {
        0 => format!("'{word}'"),
        1 => format!("\"{word}\""),
        _ => word.to_string(),
    }
}

/// Reads the directives as `build_spec` does for a script, then builds the
/// spec from them with `--wrap` standing in for the script.
fn check_script(input: &[u8]) {
    let Ok(script) = std::str::from_utf8(input) else {
        return;
    };
    let Ok(mut args) = spec::parse_directives(script, "job.sh") else {
        return;
    };
    args.wrap = Some("true".into());
    let _ = spec::build_spec(&args, &[], Path::new("/tmp"));
}

/// The value parsers, by the first byte of the input.
const PARSERS: u8 = 16;

fn gen_value(rng: &mut StdRng) -> Vec<u8> {
    let mut text = mutate::edge_string(rng, SPEC_WORDS).into_bytes();
    if rng.gen_bool(0.7) {
        mutate::text(rng, &mut text, SPEC_WORDS);
    }
    let mut out = vec![rng.gen_range(0..PARSERS)];
    out.extend(text);
    out
}

fn check_value(input: &[u8]) {
    let Some((&which, text)) = input.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(text);
    let s = text.as_ref();
    match which % PARSERS {
        0 => {
            if let Ok(Some(secs)) = time::parse_time(s) {
                let shown = time::format_time(secs);
                assert_eq!(
                    time::parse_time(&shown).ok(),
                    Some(Some(secs)),
                    "format_time({secs}) = {shown:?} does not parse back"
                );
            }
        }
        1 => {
            if let Ok(mib) = memory::parse_mem(s) {
                let shown = memory::format_mem(mib);
                assert_eq!(
                    memory::parse_mem(&shown).ok(),
                    Some(mib),
                    "format_mem({mib}) = {shown:?} does not parse back"
                );
            }
        }
        2 => drop(values::parse_gpus_per_node(s)),
        3 => drop(values::parse_gres(s)),
        4 => drop(values::parse_export(s)),
        5 => drop(values::parse_output_pattern(s)),
        6 => drop(queue::parse_dependency(s)),
        7 => {
            if let Ok(begin) = queue::parse_begin(s) {
                let _ = begin.resolve(u64::MAX - 1);
            }
        }
        8 => {
            if let Ok(array) = queue::parse_array(s) {
                assert!(
                    array.indices.windows(2).all(|w| w[0] < w[1]),
                    "array {s:?} gave indices that are not distinct and ascending"
                );
            }
        }
        9 => drop(queue::parse_signal(s)),
        10 => drop(placement::parse_constraint(s)),
        11 => drop(placement::parse_topology(s)),
        12 => drop(placement::parse_gpus_total(s)),
        13 => drop(placement::parse_gpu_type(s)),
        14 => drop(time::parse_ttl(s)),
        _ => drop(spec::directives::split_words(s)),
    }
}
