//! Slurm's hostlist syntax (`n[1-4]`, `gpu[01-16,20],login1`,
//! `r[1-2]-n[1-3]`), expanded into node names. `--nodelist` and `--exclude`
//! take it, and so does anything else that names many nodes at once. The
//! other direction, [`compress_hostlist`], writes the agents' `GPUQ_NODELIST`
//! and the node column of `gpuq acct`, so it lives here with the parser
//! rather than in either role.

/// Names one list may expand to: a typo such as `n[1-1000000]` is refused
/// instead of filling memory.
pub const MAX_HOSTLIST_NAMES: usize = 65_536;

/// The longest node name a list may expand to (a DNS name's limit): with
/// [`MAX_HOSTLIST_NAMES`], it bounds what a list of a few bytes may make
/// the reader allocate (`x...x[1-65536]` would otherwise be 65,536 copies
/// of the x's).
pub const MAX_NODE_NAME_LEN: usize = 253;

/// Why a hostlist was refused; each message quotes the list and the part at fault.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HostlistError {
    #[error("host list {0:?} is empty; name nodes, e.g. n1,n2 or n[1-4]")]
    Empty(String),
    #[error("host list {list:?} has an empty name (two commas in a row, or a comma at an end)")]
    EmptyName { list: String },
    #[error("host list {list:?} has a '[' without its ']'")]
    Unclosed { list: String },
    #[error("host list {list:?} has a ']' without its '['")]
    Unopened { list: String },
    #[error("host list {list:?} has a '[' inside another; ranges do not nest")]
    Nested { list: String },
    #[error("host list {list:?}: range {range:?} is not a number or LOW-HIGH, e.g. [1-4,7]")]
    BadRange { list: String, range: String },
    #[error("host list {list:?}: range {range:?} runs backwards; write the low number first")]
    Backwards { list: String, range: String },
    #[error("host list {list:?}: {name:?} is not a node name (no spaces or control characters)")]
    BadName { list: String, name: String },
    #[error("host list {list:?} names more than {MAX_HOSTLIST_NAMES} nodes; check the ranges")]
    TooLong { list: String },
    #[error("host list {list:?} makes node names longer than {MAX_NODE_NAME_LEN} characters; check the list")]
    NameTooLong { list: String },
}

/// Expands `list` into node names, in the order written, each once.
pub fn expand_hostlist(list: &str) -> Result<Vec<String>, HostlistError> {
    let trimmed = list.trim();
    if trimmed.is_empty() {
        return Err(HostlistError::Empty(list.to_string()));
    }
    let mut out: Vec<String> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for item in split_items(trimmed)? {
        if item.is_empty() {
            return Err(HostlistError::EmptyName {
                list: list.to_string(),
            });
        }
        for name in expand_item(list, item)? {
            if name.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return Err(HostlistError::BadName {
                    list: list.to_string(),
                    name,
                });
            }
            if seen.insert(name.clone()) {
                out.push(name);
                if out.len() > MAX_HOSTLIST_NAMES {
                    return Err(HostlistError::TooLong {
                        list: list.to_string(),
                    });
                }
            }
        }
    }
    Ok(out)
}

/// Splits at the commas outside brackets, checking that brackets pair up.
fn split_items(list: &str) -> Result<Vec<&str>, HostlistError> {
    let mut items = Vec::new();
    let mut depth = 0;
    let mut start = 0;
    for (i, c) in list.char_indices() {
        match c {
            '[' if depth > 0 => {
                return Err(HostlistError::Nested {
                    list: list.to_string(),
                })
            }
            '[' => depth = 1,
            ']' if depth == 0 => {
                return Err(HostlistError::Unopened {
                    list: list.to_string(),
                })
            }
            ']' => depth = 0,
            ',' if depth == 0 => {
                items.push(list[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth > 0 {
        return Err(HostlistError::Unclosed {
            list: list.to_string(),
        });
    }
    items.push(list[start..].trim());
    Ok(items)
}

/// One item: literal text and bracketed ranges, expanded as their product
/// (`r[1-2]-n[1-2]` is r1-n1, r1-n2, r2-n1, r2-n2).
fn expand_item(list: &str, item: &str) -> Result<Vec<String>, HostlistError> {
    let mut names = vec![String::new()];
    // The longest name so far, checked before every step that lengthens them.
    let mut longest = 0;
    let too_long = || HostlistError::NameTooLong {
        list: list.to_string(),
    };
    let mut rest = item;
    while !rest.is_empty() {
        let (literal, after) = match rest.find('[') {
            Some(open) => (&rest[..open], Some(&rest[open + 1..])),
            None => (rest, None),
        };
        longest += literal.len();
        if longest > MAX_NODE_NAME_LEN {
            return Err(too_long());
        }
        for n in &mut names {
            n.push_str(literal);
        }
        let Some(after) = after else { break };
        // split_items checked that every '[' has its ']'.
        let close = after.find(']').unwrap_or(after.len());
        let values = expand_ranges(list, &after[..close])?;
        if names.len().saturating_mul(values.len()) > MAX_HOSTLIST_NAMES {
            return Err(HostlistError::TooLong {
                list: list.to_string(),
            });
        }
        longest += values.iter().map(String::len).max().unwrap_or(0);
        if longest > MAX_NODE_NAME_LEN {
            return Err(too_long());
        }
        names = names
            .iter()
            .flat_map(|n| values.iter().map(move |v| format!("{n}{v}")))
            .collect();
        rest = after.get(close + 1..).unwrap_or("");
    }
    Ok(names)
}

/// `1-4,07,9-10` into its numbers as text; a leading zero fixes the width
/// (`[08-10]` is 08, 09, 10).
fn expand_ranges(list: &str, ranges: &str) -> Result<Vec<String>, HostlistError> {
    let mut out = Vec::new();
    for range in ranges.split(',') {
        let range = range.trim();
        let bad = || HostlistError::BadRange {
            list: list.to_string(),
            range: range.to_string(),
        };
        let (lo, hi) = range.split_once('-').unwrap_or((range, range));
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        if !digits(lo) || !digits(hi) {
            return Err(bad());
        }
        if lo.len() > MAX_NODE_NAME_LEN {
            return Err(HostlistError::NameTooLong {
                list: list.to_string(),
            });
        }
        let (a, b): (u64, u64) = (
            lo.parse().map_err(|_| bad())?,
            hi.parse().map_err(|_| bad())?,
        );
        if a > b {
            return Err(HostlistError::Backwards {
                list: list.to_string(),
                range: range.to_string(),
            });
        }
        if b - a >= MAX_HOSTLIST_NAMES as u64 || out.len() > MAX_HOSTLIST_NAMES {
            return Err(HostlistError::TooLong {
                list: list.to_string(),
            });
        }
        let width = if lo.len() > 1 && lo.starts_with('0') {
            lo.len()
        } else {
            0
        };
        out.extend((a..=b).map(|v| format!("{v:0width$}")));
    }
    Ok(out)
}

/// A host name split into a prefix and a numeric suffix (`node` + `007`).
struct HostName<'a> {
    prefix: &'a str,
    digits: &'a str,
    number: u64,
}

fn split_host(name: &str) -> Option<HostName<'_>> {
    let cut = name.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    let digits = &name[cut..];
    let number = digits.parse().ok()?;
    Some(HostName {
        prefix: &name[..cut],
        digits,
        number,
    })
}

fn is_padded(digits: &str) -> bool {
    digits.len() > 1 && digits.starts_with('0')
}

/// Compresses host names Slurm-style (`node[001-064]`, `a1,b[2-3]`). The order
/// is kept, so expanding the result gives the node-rank order back: only
/// neighbours with the same prefix (and, when zero-padded, the same width)
/// share brackets, and only ascending runs become ranges.
pub fn compress_hostlist<S: AsRef<str>>(names: &[S]) -> String {
    struct Group<'a> {
        prefix: &'a str,
        width: usize,
        /// Every member's suffix has `width` digits.
        uniform: bool,
        padded: bool,
        numbers: Vec<u64>,
    }
    let mut groups: Vec<Result<Group<'_>, &str>> = Vec::new();
    for name in names.iter().map(AsRef::as_ref) {
        let Some(host) = split_host(name) else {
            groups.push(Err(name));
            continue;
        };
        let padded = is_padded(host.digits);
        if let Some(Ok(group)) = groups.last_mut() {
            let same_width = group.uniform && group.width == host.digits.len();
            if group.prefix == host.prefix && (same_width || !(group.padded || padded)) {
                group.padded |= padded;
                group.uniform = same_width;
                group.numbers.push(host.number);
                continue;
            }
        }
        groups.push(Ok(Group {
            prefix: host.prefix,
            width: host.digits.len(),
            uniform: true,
            padded,
            numbers: vec![host.number],
        }));
    }
    let parts: Vec<String> = groups
        .into_iter()
        .map(|group| match group {
            Err(name) => name.to_string(),
            Ok(group) => {
                let fmt = |n: u64| {
                    if group.padded {
                        format!("{n:0width$}", width = group.width)
                    } else {
                        n.to_string()
                    }
                };
                if group.numbers.len() == 1 {
                    return format!("{}{}", group.prefix, fmt(group.numbers[0]));
                }
                let mut ranges: Vec<String> = Vec::new();
                let mut i = 0;
                while i < group.numbers.len() {
                    let start = group.numbers[i];
                    let mut end = start;
                    // `checked_add`: a name may end in u64::MAX, which no
                    // range continues.
                    while i + 1 < group.numbers.len()
                        && Some(group.numbers[i + 1]) == end.checked_add(1)
                    {
                        end += 1;
                        i += 1;
                    }
                    ranges.push(if start == end {
                        fmt(start)
                    } else {
                        format!("{}-{}", fmt(start), fmt(end))
                    });
                    i += 1;
                }
                format!("{}[{}]", group.prefix, ranges.join(","))
            }
        })
        .collect();
    parts.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &str) -> Vec<String> {
        expand_hostlist(list).unwrap_or_else(|e| panic!("{list}: {e}"))
    }

    #[test]
    fn expands_ranges_lists_and_products() {
        assert_eq!(names("n1"), ["n1"]);
        assert_eq!(names("n[1-4]"), ["n1", "n2", "n3", "n4"]);
        assert_eq!(names("n[1-2,7],login"), ["n1", "n2", "n7", "login"]);
        assert_eq!(names("gpu[08-10]"), ["gpu08", "gpu09", "gpu10"]);
        assert_eq!(names("n[9-11]"), ["n9", "n10", "n11"]);
        assert_eq!(names("r[1-2]-n[1-2]"), ["r1-n1", "r1-n2", "r2-n1", "r2-n2"]);
        assert_eq!(names(" a , b[3] "), ["a", "b3"]);
        assert_eq!(names("n[1-3],n2"), ["n1", "n2", "n3"], "each name once");
        assert_eq!(names("[1-2]x"), ["1x", "2x"]);
    }

    #[test]
    fn refuses_malformed_lists_with_the_part_at_fault() {
        // Found by fuzzing: a 4 KB name times 65,536 indices made the
        // expansion allocate most of a GiB; names are now bounded.
        let too_long_name = "x".repeat(254);
        let too_long_range = format!("{}[1-65536]", "x".repeat(250));
        let too_long_width = format!("n[{}1-2]", "0".repeat(300));
        let rows = [
            ("", "is empty"),
            ("  ", "is empty"),
            ("n1,,n2", "empty name"),
            ("n1,", "empty name"),
            ("n[1-4", "'[' without its ']'"),
            ("n1-4]", "']' without its '['"),
            ("n[1[2]]", "do not nest"),
            ("n[a-b]", "range \"a-b\" is not a number"),
            ("n[]", "range \"\" is not a number"),
            ("n[1-]", "range \"1-\" is not a number"),
            ("n[1-2-3]", "range \"1-2-3\" is not a number"),
            ("n[4-1]", "range \"4-1\" runs backwards"),
            ("n[1-9999999]", "more than 65536 nodes"),
            ("a[1-300]b[1-300]", "more than 65536 nodes"),
            ("n 1", "\"n 1\" is not a node name"),
            (&too_long_name, "longer than 253 characters"),
            (&too_long_range, "longer than 253 characters"),
            (&too_long_width, "longer than 253 characters"),
        ];
        for (list, want) in rows {
            match expand_hostlist(list) {
                Err(e) if e.to_string().contains(want) => {}
                other => panic!("{list:?}: expected an error with {want:?}, got {other:?}"),
            }
        }
    }
}

#[cfg(test)]
mod compress_tests {
    use super::*;
    use proptest::prelude::*;

    /// Expands a compressed host list, to check that compression loses nothing.
    fn expand(list: &str) -> Vec<String> {
        let mut out = Vec::new();
        let mut rest = list;
        while !rest.is_empty() {
            let next_comma = rest.find(',').unwrap_or(rest.len());
            let bracket = rest.find('[').filter(|&b| b < next_comma);
            let Some(open) = bracket else {
                out.push(rest[..next_comma].to_string());
                rest = rest.get(next_comma + 1..).unwrap_or("");
                continue;
            };
            let close = rest.find(']').unwrap();
            let prefix = &rest[..open];
            for range in rest[open + 1..close].split(',') {
                let (lo, hi) = range.split_once('-').unwrap_or((range, range));
                let width = if lo.len() > 1 && lo.starts_with('0') {
                    lo.len()
                } else {
                    0
                };
                for n in lo.parse::<u64>().unwrap()..=hi.parse::<u64>().unwrap() {
                    out.push(format!("{prefix}{n:0width$}"));
                }
            }
            rest = rest.get(close + 2..).unwrap_or("");
        }
        out
    }

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn hostlist_compresses_ranges() {
        let nodes: Vec<String> = (1..=64).map(|i| format!("node{i:03}")).collect();
        assert_eq!(compress_hostlist(&nodes), "node[001-064]");
        assert_eq!(compress_hostlist(&names(&["a1", "b2", "b3"])), "a1,b[2-3]");
        assert_eq!(compress_hostlist(&names(&["gpu7"])), "gpu7");
        assert_eq!(compress_hostlist(&names(&["login"])), "login");
        assert_eq!(compress_hostlist::<String>(&[]), "");
        assert_eq!(
            compress_hostlist(&names(&["n1", "n2", "n3", "n5", "n7", "n8"])),
            "n[1-3,5,7-8]"
        );
        assert_eq!(compress_hostlist(&names(&["n9", "n10", "n11"])), "n[9-11]");
        assert_eq!(
            compress_hostlist(&names(&["node099", "node100"])),
            "node[099-100]"
        );
    }

    #[test]
    fn hostlist_with_the_largest_number_compresses_without_overflow() {
        // Found by the fuzz target hostlist-names: `end + 1` overflowed.
        let max = u64::MAX;
        let list = names(&[
            &format!("n{max}"),
            "n1",
            "n2",
            &format!("m{}", max - 1),
            &format!("m{max}"),
        ]);
        let compressed = compress_hostlist(&list);
        assert_eq!(compressed, format!("n[{max},1-2],m[{}-{max}]", max - 1));
        assert_eq!(expand_hostlist(&compressed).unwrap(), list);
    }

    #[test]
    fn hostlist_keeps_node_rank_order_and_widths_apart() {
        assert_eq!(compress_hostlist(&names(&["n3", "n1", "n2"])), "n[3,1-2]");
        assert_eq!(compress_hostlist(&names(&["a1", "b1", "a2"])), "a1,b1,a2");
        assert_eq!(compress_hostlist(&names(&["n01", "n1"])), "n01,n1");
        assert_eq!(compress_hostlist(&names(&["n1", "n01"])), "n1,n01");
        assert_eq!(compress_hostlist(&names(&["n01", "n100"])), "n01,n100");
        assert_eq!(
            compress_hostlist(&names(&["n10", "n5", "n07"])),
            "n[10,5],n07"
        );
        assert_eq!(
            compress_hostlist(&names(&["rack1-node1", "rack1-node2"])),
            "rack1-node[1-2]"
        );
    }

    proptest! {
        #[test]
        fn hostlist_expands_back_to_its_input(
            hosts in proptest::collection::vec((0usize..3, 0u64..40, 0usize..3), 0..20)
        ) {
            let prefixes = ["gpu", "node", "x"];
            let list: Vec<String> = hosts
                .iter()
                .map(|&(p, n, w)| format!("{}{n:0w$}", prefixes[p], w = w + 1))
                .collect();
            prop_assert_eq!(expand(&compress_hostlist(&list)), list);
        }
    }
}
