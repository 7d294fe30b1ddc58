//! Mutators: how a valid input becomes a nearly valid one.
//!
//! Three levels. Bytes: flips, inserts, deletes, splices, truncation, for any
//! format. MessagePack: a scan of the encoding into tokens (integers,
//! strings, container headers) so that a mutation replaces a whole value with
//! an edge case (`u64::MAX`, an empty name, `../..`, a hostlist of a million
//! nodes) or lies about a container's length; most such inputs still decode,
//! which is what gets them past the decoder into the code that trusts the
//! decoded value. Text: lines and words from a dictionary of the format's
//! own vocabulary, for scripts, TOML and hostlists.

use rand::rngs::StdRng;
use rand::Rng;

/// Integers at the edges of every width gpuq's messages use.
pub const EDGE_INTS: &[i128] = &[
    0,
    1,
    2,
    7,
    31,
    32,
    127,
    128,
    255,
    256,
    1023,
    1024,
    65_535,
    65_536,
    1 << 20,
    i32::MAX as i128,
    u32::MAX as i128 - 1,
    u32::MAX as i128,
    u32::MAX as i128 + 1,
    i64::MAX as i128,
    u64::MAX as i128 - 1,
    u64::MAX as i128,
    -1,
    -32,
    -33,
    -128,
    i32::MIN as i128,
    i64::MIN as i128,
];

/// Strings that have broken parsers and path handling before.
pub const EDGE_STRINGS: &[&str] = &[
    "",
    " ",
    "n1",
    "n2",
    "n3",
    "gpu0001",
    "root",
    "alice",
    "default",
    "normal",
    "n[1-65536]",
    "n[0-18446744073709551615]",
    "n[18446744073709551615]",
    "a[1-300]b[1-300]",
    "../../../etc/passwd",
    "/",
    "%j%t%n%x%u%%%",
    "%",
    "\0",
    "\n\r\t",
    "\u{202e}evil",
    "é",
    "-1",
    "99999999999999999999",
    "1:2:3:4",
    "UNLIMITED",
    "afterok:1:2",
    "0-4294967295%0",
    "USR1@18446744073709551615",
    "127.0.0.1:0",
    "[::1]:7420",
    "host:99999",
];

/// Applies one to four byte-level mutations.
pub fn bytes(rng: &mut StdRng, data: &mut Vec<u8>) {
    for _ in 0..rng.gen_range(1..=4) {
        byte_once(rng, data);
    }
}

fn byte_once(rng: &mut StdRng, data: &mut Vec<u8>) {
    let len = data.len();
    match rng.gen_range(0..8) {
        0 if len > 0 => {
            let i = rng.gen_range(0..len);
            data[i] ^= 1 << rng.gen_range(0..8);
        }
        1 if len > 0 => {
            let i = rng.gen_range(0..len);
            data[i] = *[
                0x00, 0x7f, 0x80, 0xc0, 0xc1, 0xcf, 0xdc, 0xdd, 0xde, 0xdf, 0xff,
            ]
            .get(rng.gen_range(0..11))
            .unwrap_or(&0);
        }
        2 => {
            let at = rng.gen_range(0..=len);
            let n = rng.gen_range(1..=8);
            let junk: Vec<u8> = (0..n).map(|_| rng.gen()).collect();
            data.splice(at..at, junk);
        }
        3 if len > 0 => {
            let at = rng.gen_range(0..len);
            let n = rng.gen_range(1..=(len - at).min(16));
            data.drain(at..at + n);
        }
        4 if len > 1 => {
            // Copy a chunk of the input over another place in it.
            let from = rng.gen_range(0..len);
            let n = rng.gen_range(1..=(len - from).min(32));
            let chunk = data[from..from + n].to_vec();
            let at = rng.gen_range(0..=len);
            data.splice(at..at, chunk);
        }
        5 if len > 0 => data.truncate(rng.gen_range(0..len)),
        6 if len > 0 => {
            let i = rng.gen_range(0..len);
            data[i] = data[i].wrapping_add(rng.gen_range(1..=3));
        }
        _ => {
            let at = rng.gen_range(0..=len);
            data.insert(at, rng.gen());
        }
    }
}

/// What one MessagePack token is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Int,
    Str,
    Bin,
    /// An array or map header; `count` is what it announces.
    Header {
        count: u32,
        map: bool,
    },
    Other,
}

/// One token of a MessagePack encoding: `data[start..start + len]`.
#[derive(Clone, Copy, Debug)]
pub struct Token {
    pub start: usize,
    pub len: usize,
    pub kind: Kind,
}

/// Scans a MessagePack encoding into its tokens, in order; stops at the
/// first byte that cannot start a token or a token that runs past the end.
pub fn scan(data: &[u8]) -> Vec<Token> {
    let mut out = Vec::new();
    let mut at = 0;
    let be = |from: usize, n: usize| -> Option<usize> {
        let bytes = data.get(from..from + n)?;
        Some(
            bytes
                .iter()
                .fold(0usize, |acc, &b| (acc << 8) | usize::from(b)),
        )
    };
    while at < data.len() {
        let b = data[at];
        let (len, kind) = match b {
            0x00..=0x7f | 0xe0..=0xff => (1, Kind::Int),
            0x80..=0x8f => (1, header(u32::from(b & 0x0f), true)),
            0x90..=0x9f => (1, header(u32::from(b & 0x0f), false)),
            0xa0..=0xbf => (1 + usize::from(b & 0x1f), Kind::Str),
            0xc0 | 0xc2 | 0xc3 => (1, Kind::Other),
            0xc4..=0xc6 => {
                let n = 1 << (b - 0xc4);
                let Some(l) = be(at + 1, n) else { break };
                (1 + n + l, Kind::Bin)
            }
            0xc7..=0xc9 => {
                let n = 1 << (b - 0xc7);
                let Some(l) = be(at + 1, n) else { break };
                (2 + n + l, Kind::Other)
            }
            0xca => (5, Kind::Other),
            0xcb => (9, Kind::Other),
            0xcc..=0xcf => (1 + (1 << (b - 0xcc)), Kind::Int),
            0xd0..=0xd3 => (1 + (1 << (b - 0xd0)), Kind::Int),
            0xd4..=0xd8 => (2 + (1 << (b - 0xd4)), Kind::Other),
            0xd9..=0xdb => {
                let n = 1 << (b - 0xd9);
                let Some(l) = be(at + 1, n) else { break };
                (1 + n + l, Kind::Str)
            }
            0xdc | 0xdd => {
                let n = if b == 0xdc { 2 } else { 4 };
                let Some(c) = be(at + 1, n) else { break };
                (1 + n, header(c as u32, false))
            }
            0xde | 0xdf => {
                let n = if b == 0xde { 2 } else { 4 };
                let Some(c) = be(at + 1, n) else { break };
                (1 + n, header(c as u32, true))
            }
            0xc1 => break,
        };
        if at + len > data.len() {
            break;
        }
        out.push(Token {
            start: at,
            len,
            kind,
        });
        at += len;
    }
    out
}

fn header(count: u32, map: bool) -> Kind {
    Kind::Header { count, map }
}

/// The shortest MessagePack encoding of an integer.
pub fn encode_int(v: i128) -> Vec<u8> {
    if v >= 0 {
        let v = v as u64;
        match v {
            0..=0x7f => vec![v as u8],
            0x80..=0xff => vec![0xcc, v as u8],
            0x100..=0xffff => [&[0xcd][..], &(v as u16).to_be_bytes()].concat(),
            0x1_0000..=0xffff_ffff => [&[0xce][..], &(v as u32).to_be_bytes()].concat(),
            _ => [&[0xcf][..], &v.to_be_bytes()].concat(),
        }
    } else {
        let v = v as i64;
        match v {
            -32..=-1 => vec![v as u8],
            -128..=-33 => vec![0xd0, v as u8],
            -32768..=-129 => [&[0xd1][..], &(v as i16).to_be_bytes()].concat(),
            -2_147_483_648..=-32769 => [&[0xd2][..], &(v as i32).to_be_bytes()].concat(),
            _ => [&[0xd3][..], &v.to_be_bytes()].concat(),
        }
    }
}

/// The MessagePack encoding of a string.
pub fn encode_str(s: &str) -> Vec<u8> {
    let n = s.len();
    let mut out = match n {
        0..=31 => vec![0xa0 | n as u8],
        32..=255 => vec![0xd9, n as u8],
        256..=65_535 => [&[0xda][..], &(n as u16).to_be_bytes()].concat(),
        _ => [&[0xdb][..], &(n as u32).to_be_bytes()].concat(),
    };
    out.extend_from_slice(s.as_bytes());
    out
}

/// Applies one to three value-level mutations to a MessagePack encoding
/// (falling back to byte mutations where it has no tokens to work on).
/// `strings` adds the format's own vocabulary to [`EDGE_STRINGS`].
pub fn msgpack(rng: &mut StdRng, data: &mut Vec<u8>, strings: &[&str]) {
    for _ in 0..rng.gen_range(1..=3) {
        let tokens = scan(data);
        if tokens.is_empty() {
            bytes(rng, data);
            continue;
        }
        let pick = |rng: &mut StdRng, want: fn(Kind) -> bool| -> Option<Token> {
            let fit: Vec<&Token> = tokens.iter().filter(|t| want(t.kind)).collect();
            (!fit.is_empty()).then(|| *fit[rng.gen_range(0..fit.len())])
        };
        match rng.gen_range(0..10) {
            0..=2 => {
                if let Some(t) = pick(rng, |k| k == Kind::Int) {
                    let v = if rng.gen_bool(0.8) {
                        EDGE_INTS[rng.gen_range(0..EDGE_INTS.len())]
                    } else {
                        i128::from(rng.gen::<u32>() % 100)
                    };
                    data.splice(t.start..t.start + t.len, encode_int(v));
                }
            }
            3..=5 => {
                if let Some(t) = pick(rng, |k| k == Kind::Str) {
                    let s = edge_string(rng, strings);
                    data.splice(t.start..t.start + t.len, encode_str(&s));
                }
            }
            6 => {
                if let Some(t) = pick(rng, |k| matches!(k, Kind::Header { .. })) {
                    let Kind::Header { count, map } = t.kind else {
                        continue;
                    };
                    let new = match rng.gen_range(0..4) {
                        0 => count.saturating_add(1),
                        1 => count.saturating_sub(1),
                        2 => 0,
                        _ => [0xffff, 0xffff_ffff, 1 << 20][rng.gen_range(0..3)],
                    };
                    let code: &[u8] = if map { &[0xdf] } else { &[0xdd] };
                    let enc = [code, &new.to_be_bytes()].concat();
                    data.splice(t.start..t.start + t.len, enc);
                }
            }
            7 => {
                // Repeat a token (an array element, a key, a value).
                let t = tokens[rng.gen_range(0..tokens.len())];
                let copy = data[t.start..t.start + t.len].to_vec();
                data.splice(t.start..t.start, copy);
            }
            8 => {
                let t = tokens[rng.gen_range(0..tokens.len())];
                data.drain(t.start..t.start + t.len);
            }
            _ => bytes(rng, data),
        }
    }
}

/// A string from the edge cases, the format's vocabulary, or random text.
pub fn edge_string(rng: &mut StdRng, strings: &[&str]) -> String {
    match rng.gen_range(0..10) {
        0..=4 => EDGE_STRINGS[rng.gen_range(0..EDGE_STRINGS.len())].to_string(),
        5..=7 if !strings.is_empty() => strings[rng.gen_range(0..strings.len())].to_string(),
        8 => "x".repeat(rng.gen_range(1..5000)),
        _ => (0..rng.gen_range(0..12))
            .map(|_| char::from(rng.gen_range(0x20u8..0x7f)))
            .collect(),
    }
}

/// Applies one to four text mutations, with words and lines from `words`.
/// The result may be invalid UTF-8 (byte mutations are among them).
pub fn text(rng: &mut StdRng, data: &mut Vec<u8>, words: &[&str]) {
    for _ in 0..rng.gen_range(1..=4) {
        let len = data.len();
        match rng.gen_range(0..10) {
            0..=2 => {
                // Insert a word at a random place.
                let w = edge_string(rng, words);
                let at = char_boundary(data, rng.gen_range(0..=len));
                data.splice(at..at, w.into_bytes());
            }
            3 | 4 => {
                // Replace a whitespace-separated word.
                let spans = word_spans(data);
                if let Some(&(a, b)) = spans.get(rng.gen_range(0..spans.len().max(1))) {
                    let w = edge_string(rng, words);
                    data.splice(a..b, w.into_bytes());
                }
            }
            5 => {
                // Duplicate or drop a line.
                let lines = line_spans(data);
                if let Some(&(a, b)) = lines.get(rng.gen_range(0..lines.len().max(1))) {
                    if rng.gen_bool(0.5) {
                        let line = data[a..b].to_vec();
                        data.splice(a..a, line);
                    } else {
                        data.drain(a..b);
                    }
                }
            }
            6 => {
                let punct = [
                    "[", "]", ",", "-", "=", "\"", "'", "\\", "#", "\n", ":", "%", "@", "{", "}",
                    ".", "0", "9", " ",
                ];
                let p = punct[rng.gen_range(0..punct.len())];
                let at = char_boundary(data, rng.gen_range(0..=len));
                data.splice(at..at, p.bytes());
            }
            _ => bytes(rng, data),
        }
    }
}

/// Moves `at` back to the start of the UTF-8 character it falls in.
fn char_boundary(data: &[u8], mut at: usize) -> usize {
    while at > 0 && at < data.len() && (data[at] & 0xc0) == 0x80 {
        at -= 1;
    }
    at
}

fn word_spans(data: &[u8]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut start = None;
    for (i, &b) in data.iter().enumerate() {
        let sep = b.is_ascii_whitespace() || b"=,[]\"'".contains(&b);
        match (sep, start) {
            (true, Some(s)) => {
                out.push((s, i));
                start = None;
            }
            (false, None) => start = Some(i),
            _ => {}
        }
    }
    if let Some(s) = start {
        out.push((s, data.len()));
    }
    out
}

fn line_spans(data: &[u8]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut start = 0;
    for (i, &b) in data.iter().enumerate() {
        if b == b'\n' {
            out.push((start, i + 1));
            start = i + 1;
        }
    }
    if start < data.len() {
        out.push((start, data.len()));
    }
    out
}
