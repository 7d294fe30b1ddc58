//! Durations users type: Slurm `--time` limits and token TTLs.
//!
//! `--time` takes Slurm's formats exactly (`M`, `M:S`, `H:M:S`, `D-H`,
//! `D-H:M`, `D-H:M:S`, `UNLIMITED`), so scripts move over unchanged. Unlike
//! Slurm, fields after the first are range-checked (`25:99` is a typo, not 26
//! minutes 39 seconds) and `0` is refused rather than meaning "no limit":
//! `UNLIMITED` says that without ambiguity.

use std::time::Duration;

const TIME_FORMATS: &str = "use minutes (30), M:SS (30:00), H:MM:SS (1:30:00), \
     D-H (2-12), D-H:MM (2-12:30) or D-H:MM:SS (2-12:30:00), or UNLIMITED for no limit";

/// Why a `--time` value was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TimeError {
    #[error("the time limit is empty; {TIME_FORMATS}")]
    Empty,
    #[error("time limit {input:?} is not a time; {TIME_FORMATS}")]
    Malformed { input: String },
    #[error(
        "time limit {input:?} is negative; give a positive limit such as 1:00:00, or UNLIMITED"
    )]
    Negative { input: String },
    #[error("time limit {input:?}: {field} must be 0-{max}; {fix}")]
    OutOfRange {
        input: String,
        field: &'static str,
        max: u64,
        fix: &'static str,
    },
    #[error("time limit {input:?} is zero; give a positive limit such as 1:00:00, or UNLIMITED for no limit")]
    Zero { input: String },
    #[error("time limit {input:?} is too large; give at most a few years, or UNLIMITED")]
    TooLarge { input: String },
}

/// A parsed `--time`: `Some(seconds)`, or `None` for `UNLIMITED`. A newtype so
/// that "given as UNLIMITED" and "not given" stay distinct when flags and
/// directives merge.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimeLimit(pub Option<u64>);

/// Parses a Slurm `--time` value into seconds; `UNLIMITED` / `infinite` is `None`.
pub fn parse_time(input: &str) -> Result<Option<u64>, TimeError> {
    let text = input.trim();
    if text.is_empty() {
        return Err(TimeError::Empty);
    }
    if text.eq_ignore_ascii_case("unlimited") || text.eq_ignore_ascii_case("infinite") {
        return Ok(None);
    }
    let malformed = || TimeError::Malformed {
        input: input.to_string(),
    };
    if let Some(rest) = text.strip_prefix('-') {
        let numeric = !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_digit() || b == b':');
        return Err(if numeric {
            TimeError::Negative {
                input: input.to_string(),
            }
        } else {
            malformed()
        });
    }
    let (days, clock) = match text.split_once('-') {
        Some((d, rest)) => (Some(number(d, input)?), rest),
        None => (None, text),
    };
    let fields = clock
        .split(':')
        .map(|f| number(f, input))
        .collect::<Result<Vec<u64>, _>>()?;
    // (days, hours, minutes, seconds); which fields are bounded depends on the
    // shape: the first field given is free, every later one has a range.
    let (d, h, m, s) = match (days, fields.as_slice()) {
        (None, [m]) => (0, 0, *m, 0),
        (None, [m, s]) => (0, 0, *m, check(*s, SECONDS, input)?),
        (None, [h, m, s]) => (
            0,
            *h,
            check(*m, MINUTES, input)?,
            check(*s, SECONDS, input)?,
        ),
        (Some(d), [h]) => (d, check(*h, HOURS, input)?, 0, 0),
        (Some(d), [h, m]) => (d, check(*h, HOURS, input)?, check(*m, MINUTES, input)?, 0),
        (Some(d), [h, m, s]) => (
            d,
            check(*h, HOURS, input)?,
            check(*m, MINUTES, input)?,
            check(*s, SECONDS, input)?,
        ),
        _ => return Err(malformed()),
    };
    let too_large = || TimeError::TooLarge {
        input: input.to_string(),
    };
    let total = d
        .checked_mul(86_400)
        .and_then(|t| t.checked_add(h.checked_mul(3600)?))
        .and_then(|t| t.checked_add(m.checked_mul(60)?))
        .and_then(|t| t.checked_add(s))
        .ok_or_else(too_large)?;
    if total == 0 {
        return Err(TimeError::Zero {
            input: input.to_string(),
        });
    }
    // Far beyond any sane limit, and keeps seconds * 1000 (Millis) in range.
    if total > 100 * 365 * 86_400 {
        return Err(too_large());
    }
    Ok(Some(total))
}

/// The clap value parser for `--time`.
pub fn parse_time_limit(input: &str) -> Result<TimeLimit, TimeError> {
    parse_time(input).map(TimeLimit)
}

/// Formats seconds the way Slurm prints limits: `M:SS`, `H:MM:SS` or
/// `D-HH:MM:SS`. `parse_time` reads every output back to the same value.
pub fn format_time(secs: u64) -> String {
    let (d, h, m, s) = (secs / 86_400, secs / 3600 % 24, secs / 60 % 60, secs % 60);
    if d > 0 {
        format!("{d}-{h:02}:{m:02}:{s:02}")
    } else if h > 0 {
        format!("{h}:{m:02}:{s:02}")
    } else {
        format!("{m}:{s:02}")
    }
}

/// Formats an optional limit; `None` is `UNLIMITED`.
pub fn format_time_limit(limit: Option<u64>) -> String {
    limit.map_or_else(|| "UNLIMITED".to_string(), format_time)
}

struct Field {
    name: &'static str,
    max: u64,
    fix: &'static str,
}

const SECONDS: Field = Field {
    name: "seconds",
    max: 59,
    fix: "use MM:SS or HH:MM:SS, e.g. 1:30:00",
};
const MINUTES: Field = Field {
    name: "minutes after hours",
    max: 59,
    fix: "use HH:MM:SS, e.g. 1:30:00",
};
const HOURS: Field = Field {
    name: "hours after days",
    max: 23,
    fix: "use D-HH:MM:SS, e.g. 1-12:00:00",
};

fn check(value: u64, field: Field, input: &str) -> Result<u64, TimeError> {
    if value > field.max {
        return Err(TimeError::OutOfRange {
            input: input.to_string(),
            field: field.name,
            max: field.max,
            fix: field.fix,
        });
    }
    Ok(value)
}

fn number(field: &str, input: &str) -> Result<u64, TimeError> {
    if field.is_empty() || !field.bytes().all(|b| b.is_ascii_digit()) {
        return Err(TimeError::Malformed {
            input: input.to_string(),
        });
    }
    field.parse().map_err(|_| TimeError::TooLarge {
        input: input.to_string(),
    })
}

/// Why a TTL (`--ttl 24h`) was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("TTL {input:?} {problem}; use numbers with units d, h, m or s, largest first, e.g. 24h, 30m, 7d or 1h30m")]
pub struct TtlError {
    pub input: String,
    pub problem: &'static str,
}

/// Parses a TTL such as `24h`, `30m`, `90s`, `7d` or `1h30m`.
pub fn parse_ttl(input: &str) -> Result<Duration, TtlError> {
    let fail = |problem| TtlError {
        input: input.to_string(),
        problem,
    };
    let text = input.trim();
    if text.is_empty() {
        return Err(fail("is empty"));
    }
    let mut total: u64 = 0;
    let mut last_unit = u64::MAX;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(fail("is not a duration"));
        }
        let value: u64 = rest[..digits].parse().map_err(|_| fail("is too large"))?;
        let unit_char = rest[digits..].chars().next();
        let unit = match unit_char.map(|c| c.to_ascii_lowercase()) {
            Some('d') => 86_400,
            Some('h') => 3600,
            Some('m') => 60,
            Some('s') => 1,
            None => return Err(fail("has a number without a unit")),
            Some(_) => return Err(fail("has an unknown unit")),
        };
        if unit >= last_unit {
            return Err(fail("repeats a unit or has them out of order"));
        }
        last_unit = unit;
        total = value
            .checked_mul(unit)
            .and_then(|v| v.checked_add(total))
            .ok_or_else(|| fail("is too large"))?;
        rest = &rest[digits + 1..];
    }
    if total == 0 {
        return Err(fail("is zero"));
    }
    Ok(Duration::from_secs(total))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn secs(s: &str) -> u64 {
        parse_time(s)
            .unwrap_or_else(|e| panic!("{s}: {e}"))
            .expect("limited")
    }

    #[test]
    fn every_slurm_format() {
        assert_eq!(secs("30"), 30 * 60);
        assert_eq!(secs("30:15"), 30 * 60 + 15);
        assert_eq!(secs("90:00"), 90 * 60, "the first field is free");
        assert_eq!(secs("1:30:00"), 5400);
        assert_eq!(secs("48:00:00"), 48 * 3600);
        assert_eq!(secs("2-12"), 2 * 86_400 + 12 * 3600);
        assert_eq!(secs("2-12:30"), 2 * 86_400 + 12 * 3600 + 30 * 60);
        assert_eq!(secs("1-00:00:01"), 86_401);
        assert_eq!(secs("0-0:0:1"), 1);
        assert_eq!(secs(" 10 "), 600);
    }

    #[test]
    fn unlimited_is_none() {
        for s in ["UNLIMITED", "unlimited", "infinite", "Infinite"] {
            assert_eq!(parse_time(s), Ok(None), "{s}");
        }
    }

    #[test]
    fn out_of_range_fields_say_which_and_how() {
        let e = parse_time("25:99").unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("\"25:99\""), "{msg}");
        assert!(msg.contains("seconds must be 0-59"), "{msg}");
        assert!(msg.contains("use MM:SS or HH:MM:SS, e.g. 1:30:00"), "{msg}");
        assert!(matches!(
            parse_time("1:60:00"),
            Err(TimeError::OutOfRange {
                field: "minutes after hours",
                ..
            })
        ));
        assert!(matches!(
            parse_time("1-24"),
            Err(TimeError::OutOfRange { max: 23, .. })
        ));
        assert!(matches!(
            parse_time("1-1:1:60"),
            Err(TimeError::OutOfRange { max: 59, .. })
        ));
    }

    #[test]
    fn bad_inputs_are_errors() {
        assert_eq!(parse_time(""), Err(TimeError::Empty));
        assert_eq!(parse_time("   "), Err(TimeError::Empty));
        assert!(matches!(parse_time("-1"), Err(TimeError::Negative { .. })));
        assert!(matches!(parse_time("0"), Err(TimeError::Zero { .. })));
        assert!(matches!(parse_time("0:00:00"), Err(TimeError::Zero { .. })));
        assert!(matches!(parse_time("0-0"), Err(TimeError::Zero { .. })));
        for bad in [
            "abc",
            "1h",
            "1:2:3:4",
            "1-2-3",
            "1-",
            "-",
            ":",
            "1::2",
            "1.5",
            "+5",
            "1 2",
            "2-1:2:3:4",
            "--1",
        ] {
            assert!(
                matches!(parse_time(bad), Err(TimeError::Malformed { .. })),
                "{bad}: {:?}",
                parse_time(bad)
            );
        }
        assert!(matches!(
            parse_time("99999999999999999999"),
            Err(TimeError::TooLarge { .. })
        ));
        assert!(matches!(
            parse_time("999999999-0"),
            Err(TimeError::TooLarge { .. })
        ));
        let msg = parse_time("abc").unwrap_err().to_string();
        assert!(msg.contains("\"abc\"") && msg.contains("1:30:00"), "{msg}");
    }

    #[test]
    fn formats_like_slurm() {
        assert_eq!(format_time(59), "0:59");
        assert_eq!(format_time(300), "5:00");
        assert_eq!(format_time(5400), "1:30:00");
        assert_eq!(format_time(86_400 + 1), "1-00:00:01");
        assert_eq!(format_time_limit(None), "UNLIMITED");
        assert_eq!(format_time_limit(Some(3600)), "1:00:00");
    }

    proptest! {
        #[test]
        fn format_then_parse_round_trips(s in 1u64..(100 * 365 * 86_400)) {
            prop_assert_eq!(parse_time(&format_time(s)), Ok(Some(s)));
        }

        #[test]
        fn parse_never_panics(s in "\\PC{0,16}") {
            let _ = parse_time(&s);
            let _ = parse_ttl(&s);
        }
    }

    #[test]
    fn ttls() {
        let d = |s: &str| parse_ttl(s).unwrap_or_else(|e| panic!("{e}")).as_secs();
        assert_eq!(d("24h"), 86_400);
        assert_eq!(d("30m"), 1800);
        assert_eq!(d("90s"), 90);
        assert_eq!(d("7d"), 7 * 86_400);
        assert_eq!(d("1h30m"), 5400);
        assert_eq!(d("1d2h3m4s"), 86_400 + 7200 + 184);
        assert_eq!(d("2H"), 7200);
    }

    #[test]
    fn bad_ttls() {
        for (bad, problem) in [
            ("", "is empty"),
            ("24", "has a number without a unit"),
            ("1h30", "has a number without a unit"),
            ("5y", "has an unknown unit"),
            ("h", "is not a duration"),
            ("-1h", "is not a duration"),
            ("30m1h", "repeats a unit or has them out of order"),
            ("1h1h", "repeats a unit or has them out of order"),
            ("0h", "is zero"),
            ("99999999999999999999d", "is too large"),
        ] {
            assert_eq!(parse_ttl(bad).map_err(|e| e.problem), Err(problem), "{bad}");
        }
        let msg = parse_ttl("5y").unwrap_err().to_string();
        assert!(msg.contains("\"5y\"") && msg.contains("24h"), "{msg}");
    }
}
