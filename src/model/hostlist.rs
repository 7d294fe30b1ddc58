//! Slurm's hostlist syntax (`n[1-4]`, `gpu[01-16,20],login1`,
//! `r[1-2]-n[1-3]`), expanded into node names. `--nodelist` and `--exclude`
//! take it, and so does anything else that names many nodes at once; the
//! agents' `GPUQ_NODELIST` is the same syntax in the other direction.

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
