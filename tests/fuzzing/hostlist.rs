//! Hostlists: `model::expand_hostlist` on mutated lists, and the agents'
//! `compress_hostlist` (`GPUQ_NODELIST`) held to its promise that expanding
//! what it wrote gives the same names back, in the same order.

use gpuq::model::expand_hostlist;
use gpuq::model::hostlist::compress_hostlist;
use rand::rngs::StdRng;
use rand::Rng;

use super::{mutate, Target};

pub fn targets() -> Vec<Target> {
    vec![
        Target {
            name: "hostlist",
            weight: 8,
            generate: gen_list,
            check: check_list,
        },
        Target {
            name: "hostlist-names",
            weight: 10,
            generate: gen_names,
            check: check_names,
        },
    ]
}

const LISTS: &[&str] = &[
    "n1",
    "n[1-4]",
    "gpu[01-16,20],login1",
    "r[1-2]-n[1-3]",
    "node[001-064]",
    "a,b,c[7-9]",
    "[1-2]x",
    "n[9-11],m[08-10]",
];

const LIST_WORDS: &[&str] = &[
    "[",
    "]",
    ",",
    "-",
    "0",
    "00",
    "007",
    "9",
    "18446744073709551615",
    "18446744073709551616",
    "[0-65535]",
    "[1-65536]",
    "[0-9,0-9]",
    "[00-99]",
    "n",
    "gpu",
    " ",
    "\t",
    "x[1-300]y[1-300]",
];

fn gen_list(rng: &mut StdRng) -> Vec<u8> {
    let mut list = LISTS[rng.gen_range(0..LISTS.len())].as_bytes().to_vec();
    mutate::text(rng, &mut list, LIST_WORDS);
    list
}

/// Expands a list; what expands must compress to a list that expands to the
/// same names. (The round trip is left out for the longest lists: it costs
/// a second of a debug build each, and the long ones are the same ranges.)
fn check_list(input: &[u8]) {
    let Ok(list) = std::str::from_utf8(input) else {
        return;
    };
    let Ok(names) = expand_hostlist(list) else {
        return;
    };
    if names.len() <= 4096 {
        round_trip(&names);
    }
}

fn round_trip(names: &[String]) {
    let compressed = compress_hostlist(names);
    match expand_hostlist(&compressed) {
        Ok(back) => assert!(
            back == names,
            "compress_hostlist({names:?}) = {compressed:?}, which expands to {back:?}"
        ),
        Err(e) => {
            panic!("compress_hostlist({names:?}) = {compressed:?}, which does not expand: {e}")
        }
    }
}

/// Distinct node names: a prefix and a number of some width, numbers near
/// the edges included. Encoded one name a line.
fn gen_names(rng: &mut StdRng) -> Vec<u8> {
    const PREFIXES: &[&str] = &["n", "gpu", "r1-n", "", "a0b", "x-"];
    let mut names: Vec<String> = Vec::new();
    for _ in 0..rng.gen_range(1..12) {
        let prefix = PREFIXES[rng.gen_range(0..PREFIXES.len())];
        let number: u64 = match rng.gen_range(0..4) {
            0 => u64::MAX - rng.gen_range(0..3),
            1 => rng.gen_range(0..1000),
            2 => rng.gen_range(0..20),
            _ => rng.gen(),
        };
        let width = rng.gen_range(0..5);
        let name = format!("{prefix}{number:0width$}");
        if !names.contains(&name) {
            names.push(name);
        }
        if rng.gen_bool(0.3) {
            names.sort();
        }
    }
    names.join("\n").into_bytes()
}

fn check_names(input: &[u8]) {
    let Ok(text) = std::str::from_utf8(input) else {
        return;
    };
    let names: Vec<String> = text.lines().map(str::to_string).collect();
    // Only what expand_hostlist could have produced: names it accepts alone.
    if names
        .iter()
        .any(|n| expand_hostlist(n).ok().as_deref() != Some(&[n.clone()][..]))
    {
        return;
    }
    let mut distinct = names.clone();
    distinct.sort();
    distinct.dedup();
    if distinct.len() != names.len() {
        return;
    }
    round_trip(&names);
}
