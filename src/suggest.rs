//! "Did you mean ...?" for mistyped flags and config keys.
//!
//! A candidate that starts with what the user typed wins (`--gpu` is most
//! likely a short `--gpus-per-node`), else the closest by edit distance, if it
//! is close enough that the suggestion is more help than noise.

/// The known word nearest to `input`, if one is plausibly what was meant.
pub fn nearest<'a, I>(input: &str, candidates: I) -> Option<&'a str>
where
    I: IntoIterator<Item = &'a str>,
{
    let input = input.to_ascii_lowercase();
    if input.is_empty() {
        return None;
    }
    let mut by_prefix: Option<&'a str> = None;
    let mut by_distance: Option<(usize, &'a str)> = None;
    for candidate in candidates {
        if candidate == input {
            return Some(candidate);
        }
        if candidate.starts_with(&input) && by_prefix.is_none_or(|p| candidate.len() < p.len()) {
            by_prefix = Some(candidate);
        }
        let d = edit_distance(&input, candidate);
        if by_distance.is_none_or(|(best, _)| d < best) {
            by_distance = Some((d, candidate));
        }
    }
    if by_prefix.is_some() {
        return by_prefix;
    }
    let limit = (input.chars().count() / 3).max(2);
    by_distance.filter(|(d, _)| *d <= limit).map(|(_, c)| c)
}

/// Levenshtein distance over chars (insert, delete, substitute all cost 1).
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = if ca == *cb {
                diagonal
            } else {
                1 + diagonal.min(above).min(row[j])
            };
            diagonal = above;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    const FLAGS: &[&str] = &["gres", "gpus-per-node", "time", "nodes", "ntasks-per-node"];

    #[test]
    fn prefix_beats_a_shorter_edit_distance() {
        // "gres" is 3 edits from "gpu"; "gpus-per-node" is 10, but starts with it.
        assert_eq!(nearest("gpu", FLAGS.iter().copied()), Some("gpus-per-node"));
        assert_eq!(
            nearest("gpus", FLAGS.iter().copied()),
            Some("gpus-per-node")
        );
    }

    #[test]
    fn typos_find_the_closest_word() {
        assert_eq!(nearest("tme", FLAGS.iter().copied()), Some("time"));
        assert_eq!(nearest("node", FLAGS.iter().copied()), Some("nodes"));
        assert_eq!(nearest("ndoes", FLAGS.iter().copied()), Some("nodes"));
        assert_eq!(
            nearest("hearbeat_ms", ["heartbeat_ms", "election_timeout_min_ms"]),
            Some("heartbeat_ms")
        );
        assert_eq!(nearest("TIME", FLAGS.iter().copied()), Some("time"));
    }

    #[test]
    fn unrelated_words_get_no_suggestion() {
        assert_eq!(nearest("mail-user", FLAGS.iter().copied()), None);
        assert_eq!(nearest("", FLAGS.iter().copied()), None);
        assert_eq!(nearest("x", FLAGS.iter().copied()), None);
    }

    #[test]
    fn edit_distance_counts_edits() {
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("same", "same"), 0);
    }
}
