//! Parsing of the queue flags: `--dependency`, `--begin`, `--array`,
//! `--signal`. Each error names the input and shows the accepted forms.

use crate::model::{
    ArraySpec, Dependency, DependencyKind, JobId, Millis, SignalSpec, MAX_ARRAY_TASKS,
};

const DEP_FORMS: &str = "use afterok:ID[:ID...], afterany:ID, afternotok:ID, after:ID or \
     singleton, comma-separated for several (all must hold), e.g. afterok:12:13,afterany:9";

/// A parsed `--dependency` (a newtype so an absent flag and an empty list differ).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dependencies(pub Vec<Dependency>);

/// Parses `afterok:1:2,afterany:3,singleton`. Array task ids (`12_3`) are not
/// accepted: name the array (`12`, all of its tasks) or the task's own id.
pub fn parse_dependency(input: &str) -> Result<Dependencies, String> {
    let text = input.trim();
    if text.is_empty() {
        return Err(format!("the dependency is empty; {DEP_FORMS}"));
    }
    if text.contains('?') {
        return Err(format!(
            "dependency {input:?}: '?' (any of) is not supported; {DEP_FORMS}"
        ));
    }
    let mut out = Vec::new();
    for term in text.split(',') {
        let mut parts = term.trim().split(':');
        let word = parts.next().unwrap_or_default().to_ascii_lowercase();
        let kind = DependencyKind::ALL
            .into_iter()
            .find(|k| k.as_str() == word)
            .ok_or_else(|| format!("dependency {input:?}: unknown kind {word:?}; {DEP_FORMS}"))?;
        let jobs = parts
            .map(|p| {
                p.trim()
                    .parse::<u64>()
                    .ok()
                    .filter(|&n| n > 0)
                    .map(JobId)
                    .ok_or_else(|| {
                        format!("dependency {input:?}: {p:?} is not a job id; {DEP_FORMS}")
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        match (kind, jobs.is_empty()) {
            (DependencyKind::Singleton, false) => {
                return Err(format!(
                    "dependency {input:?}: singleton takes no job ids; {DEP_FORMS}"
                ))
            }
            (DependencyKind::Singleton, true) => {}
            (_, true) => {
                return Err(format!(
                    "dependency {input:?}: {word} needs job ids ({word}:ID); {DEP_FORMS}"
                ))
            }
            _ => {}
        }
        out.push(Dependency { kind, jobs });
    }
    Ok(Dependencies(out))
}

/// A parsed `--begin`: an absolute UTC time or one relative to submission.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Begin {
    At(Millis),
    /// `now+N[units]`, in seconds.
    After(u64),
}

impl Begin {
    /// The absolute time, given the submitter's `now`.
    pub fn resolve(self, now: Millis) -> Millis {
        match self {
            Begin::At(t) => t,
            Begin::After(secs) => now.saturating_add(secs.saturating_mul(1000)),
        }
    }
}

const BEGIN_FORMS: &str = "use YYYY-MM-DDTHH:MM[:SS] (UTC, e.g. 2026-12-01T15:00), \
     YYYY-MM-DD, or now+N with a unit (now+90, now+10min, now+2hours, now+1day; seconds \
     without a unit)";

/// Parses `--begin`: `2026-12-01T15:00[:SS]`, `2026-12-01`, `now`, `now+10min`.
pub fn parse_begin(input: &str) -> Result<Begin, String> {
    let text = input.trim();
    let bad = || format!("begin time {input:?} is not a time; {BEGIN_FORMS}");
    if text.eq_ignore_ascii_case("now") {
        return Ok(Begin::After(0));
    }
    if let Some(rest) = text
        .strip_prefix("now+")
        .or_else(|| text.strip_prefix("NOW+"))
    {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        let n: u64 = rest[..digits].parse().map_err(|_| bad())?;
        let unit = rest[digits..].to_ascii_lowercase();
        let mult = match unit.as_str() {
            "" | "s" | "sec" | "secs" | "second" | "seconds" => 1,
            "m" | "min" | "mins" | "minute" | "minutes" => 60,
            "h" | "hour" | "hours" => 3600,
            "d" | "day" | "days" => 86_400,
            "w" | "week" | "weeks" => 7 * 86_400,
            _ => return Err(bad()),
        };
        return n.checked_mul(mult).map(Begin::After).ok_or_else(bad);
    }
    let (date, time) = match text.split_once('T') {
        Some((d, t)) => (d, Some(t.trim_end_matches('Z'))),
        None => (text, None),
    };
    let nums = |s: &str, sep: char| -> Option<Vec<u64>> {
        s.split(sep).map(|p| p.parse::<u64>().ok()).collect()
    };
    let d = nums(date, '-').filter(|d| d.len() == 3).ok_or_else(bad)?;
    let t = match time {
        Some(t) => nums(t, ':')
            .filter(|t| t.len() == 2 || t.len() == 3)
            .ok_or_else(bad)?,
        None => vec![0, 0],
    };
    let (y, m, day) = (d[0], d[1], d[2]);
    let (hh, mm, ss) = (t[0], t[1], t.get(2).copied().unwrap_or(0));
    if !(1970..=9999).contains(&y)
        || !(1..=12).contains(&m)
        || !(1..=days_in_month(y, m)).contains(&day)
        || hh > 23
        || mm > 59
        || ss > 59
    {
        return Err(format!(
            "begin time {input:?} is not a valid date and time; {BEGIN_FORMS}"
        ));
    }
    let days = days_from_civil(y as i64, m as i64, day as i64);
    let secs = days as u64 * 86_400 + hh * 3600 + mm * 60 + ss;
    Ok(Begin::At(secs * 1000))
}

fn days_in_month(y: u64, m: u64) -> u64 {
    match m {
        4 | 6 | 9 | 11 => 30,
        2 if (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 => 29,
        2 => 28,
        _ => 31,
    }
}

/// Days since 1970-01-01 (Howard Hinnant's days-from-civil).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

const ARRAY_FORMS: &str = "use indices and ranges: 0-99, 1,3,5-7, 0-15:4 (a step), with an \
     optional %N throttle (0-99%8: at most 8 tasks at once)";

/// Parses `--array`: `0-99%8`, `1,3,5-7`, `0-15:4`.
pub fn parse_array(input: &str) -> Result<ArraySpec, String> {
    let text = input.trim();
    let bad = |why: &str| format!("array {input:?}: {why}; {ARRAY_FORMS}");
    let (list, throttle) = match text.split_once('%') {
        Some((l, t)) => {
            let n: u32 = t
                .trim()
                .parse()
                .map_err(|_| bad("the throttle after % is not a number"))?;
            if n == 0 {
                return Err(bad("the throttle %0 would never run a task"));
            }
            (l, Some(n))
        }
        None => (text, None),
    };
    if list.trim().is_empty() {
        return Err(bad("no indices"));
    }
    let num = |s: &str| -> Result<u32, String> {
        s.trim()
            .parse::<u32>()
            .map_err(|_| bad(&format!("{s:?} is not an index (0 or more)")))
    };
    let mut indices = std::collections::BTreeSet::new();
    for part in list.split(',') {
        let (range, step) = match part.split_once(':') {
            Some((r, s)) => (r, num(s)?),
            None => (part, 1),
        };
        if step == 0 {
            return Err(bad("a step of 0"));
        }
        let (lo, hi) = match range.split_once('-') {
            Some((a, b)) => (num(a)?, num(b)?),
            None => {
                let n = num(range)?;
                (n, n)
            }
        };
        if lo > hi {
            return Err(bad(&format!("the range {lo}-{hi} goes down")));
        }
        let mut i = lo;
        loop {
            indices.insert(i);
            if indices.len() > MAX_ARRAY_TASKS {
                return Err(bad(&format!("more than {MAX_ARRAY_TASKS} tasks")));
            }
            match i.checked_add(step) {
                Some(n) if n <= hi => i = n,
                _ => break,
            }
        }
    }
    Ok(ArraySpec {
        indices: indices.into_iter().collect(),
        throttle,
    })
}

const SIGNAL_FORMS: &str = "use [B:]SIG[@SECS], e.g. USR1@60, B:TERM@120 or 10@30 \
     (SECS defaults to 60)";

/// Parses `--signal [B:]SIG[@SECS]` (Slurm's form; SECS defaults to 60).
pub fn parse_signal(input: &str) -> Result<SignalSpec, String> {
    let text = input.trim();
    let (batch_only, rest) = match text.strip_prefix("B:").or_else(|| text.strip_prefix("b:")) {
        Some(r) => (true, r),
        None => (false, text),
    };
    let (sig, secs) = match rest.split_once('@') {
        Some((s, n)) => (
            s,
            n.trim().parse::<u64>().map_err(|_| {
                format!("signal {input:?}: {n:?} is not a number of seconds; {SIGNAL_FORMS}")
            })?,
        ),
        None => (rest, 60),
    };
    if secs > 65_535 {
        return Err(format!(
            "signal {input:?}: at most 65535 seconds before the limit; {SIGNAL_FORMS}"
        ));
    }
    let signal = signal_number(sig)
        .ok_or_else(|| format!("signal {input:?}: unknown signal {sig:?}; {SIGNAL_FORMS}"))?;
    Ok(SignalSpec {
        signal,
        secs_before: secs,
        batch_only,
    })
}

/// A signal's number from its name (`USR1`, `SIGUSR1`) or number (`10`).
pub fn signal_number(name: &str) -> Option<i32> {
    let upper = name.trim().to_ascii_uppercase();
    if let Ok(n) = upper.parse::<i32>() {
        return (1..=64).contains(&n).then_some(n);
    }
    let bare = upper.strip_prefix("SIG").unwrap_or(&upper);
    let n = match bare {
        "HUP" => libc::SIGHUP,
        "INT" => libc::SIGINT,
        "QUIT" => libc::SIGQUIT,
        "KILL" => libc::SIGKILL,
        "USR1" => libc::SIGUSR1,
        "USR2" => libc::SIGUSR2,
        "TERM" => libc::SIGTERM,
        "ALRM" => libc::SIGALRM,
        "CONT" => libc::SIGCONT,
        "STOP" => libc::SIGSTOP,
        "URG" => libc::SIGURG,
        "XCPU" => libc::SIGXCPU,
        "WINCH" => libc::SIGWINCH,
        _ => return None,
    };
    Some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dependencies_parse() {
        let d = parse_dependency("afterok:12:13,afterany:9,singleton")
            .unwrap()
            .0;
        assert_eq!(d.len(), 3);
        assert_eq!(d[0].kind, DependencyKind::AfterOk);
        assert_eq!(d[0].jobs, vec![JobId(12), JobId(13)]);
        assert_eq!(d[1].to_string(), "afterany:9");
        assert_eq!(d[2].kind, DependencyKind::Singleton);
        assert!(d[2].jobs.is_empty());
        assert_eq!(
            parse_dependency("AFTERNOTOK:4").unwrap().0[0].kind,
            DependencyKind::AfterNotOk
        );
    }

    #[test]
    fn bad_dependencies_name_the_input_and_the_fix() {
        for (input, says) in [
            ("", "empty"),
            ("afterok", "needs job ids"),
            ("afterok:x", "\"x\" is not a job id"),
            ("afterok:0", "\"0\" is not a job id"),
            ("aftrok:1", "unknown kind \"aftrok\""),
            ("singleton:3", "singleton takes no job ids"),
            ("afterok:1?afterany:2", "not supported"),
            ("afterok:12_3", "is not a job id"),
        ] {
            let e = parse_dependency(input).unwrap_err();
            assert!(e.contains(says), "{input:?}: {e}");
            assert!(e.contains("afterok:ID"), "{input:?} shows the forms: {e}");
        }
    }

    #[test]
    fn begin_times_parse() {
        // 2026-12-01T15:00:00Z
        assert_eq!(
            parse_begin("2026-12-01T15:00").unwrap(),
            Begin::At(1_796_137_200_000)
        );
        assert_eq!(
            parse_begin("2026-12-01T15:00:30").unwrap(),
            Begin::At(1_796_137_230_000)
        );
        assert_eq!(
            parse_begin("2026-12-01").unwrap(),
            Begin::At(1_796_083_200_000)
        );
        assert_eq!(parse_begin("now+10min").unwrap(), Begin::After(600));
        assert_eq!(parse_begin("now+90").unwrap(), Begin::After(90));
        assert_eq!(parse_begin("now+2hours").unwrap(), Begin::After(7200));
        assert_eq!(parse_begin("now").unwrap(), Begin::After(0));
        assert_eq!(Begin::After(600).resolve(1000), 601_000);
    }

    #[test]
    fn bad_begin_times_are_refused() {
        for input in [
            "tomorrow",
            "now+10parsecs",
            "now+",
            "2026-13-01",
            "2026-02-30",
            "2026-12-01T25:00",
            "12/01/2026",
        ] {
            let e = parse_begin(input).unwrap_err();
            assert!(e.contains(input), "{input:?}: {e}");
            assert!(e.contains("now+10min"), "{input:?}: {e}");
        }
    }

    #[test]
    fn arrays_parse() {
        let a = parse_array("0-99%8").unwrap();
        assert_eq!(a.indices.len(), 100);
        assert_eq!(a.throttle, Some(8));
        assert_eq!(parse_array("1,3,5-7").unwrap().indices, vec![1, 3, 5, 6, 7]);
        assert_eq!(parse_array("0-15:4").unwrap().indices, vec![0, 4, 8, 12]);
        assert_eq!(parse_array("3,1,3").unwrap().indices, vec![1, 3]);
        assert_eq!(parse_array("0-9999").unwrap().indices.len(), 10_000);
    }

    #[test]
    fn bad_arrays_are_refused() {
        for (input, says) in [
            ("", "no indices"),
            ("5-1", "goes down"),
            ("0-9%0", "%0"),
            ("0-9%x", "throttle"),
            ("a-b", "not an index"),
            ("0-10:0", "step of 0"),
            ("-1", "not an index"),
            ("0-200000", "more than"),
        ] {
            let e = parse_array(input).unwrap_err();
            assert!(e.contains(says), "{input:?}: {e}");
            assert!(e.contains("0-99%8"), "{input:?}: {e}");
        }
    }

    #[test]
    fn signals_parse() {
        assert_eq!(
            parse_signal("USR1@30").unwrap(),
            SignalSpec {
                signal: libc::SIGUSR1,
                secs_before: 30,
                batch_only: false
            }
        );
        let b = parse_signal("B:SIGTERM@120").unwrap();
        assert!(b.batch_only);
        assert_eq!(b.signal, libc::SIGTERM);
        assert_eq!(parse_signal("10").unwrap().secs_before, 60);
        for input in ["FOO@3", "USR1@x", "USR1@99999", "0@1"] {
            let e = parse_signal(input).unwrap_err();
            assert!(e.contains("USR1@60"), "{input:?}: {e}");
        }
    }
}
