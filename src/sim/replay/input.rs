//! Reading a replay's trace: a CSV with a header line, whose columns are
//! named on the command line (`--columns arrival=submit,gpus=n,...`) or
//! recognised as the ITP trace's, turned into [`TraceJob`]s sorted by arrival
//! with the first arrival at 0.
//!
//! Traces come from many schedulers (Slurm's `sacct`, Philly, Alibaba, ITP),
//! each with its own column names and its own way of writing times, so the
//! mapping is data, not code: a [`Columns`] says which column holds each
//! field, and each value is accepted in the forms those exports use (seconds
//! or `YYYY-MM-DD HH:MM:SS` timestamps for times, seconds or Slurm's
//! `[D-]HH:MM:SS` for durations). Reading is all or nothing: a bad row fails
//! the read with its line and column, because a replay of a silently thinned
//! trace would judge a policy on a workload nobody asked for. The CSV
//! splitter and the calendar arithmetic live here, small, because the crate
//! has no csv or chrono dependency and a trace needs only their simplest
//! parts.

use std::borrow::Cow;
use std::path::Path;

use super::TraceJob;
use crate::model::Millis;

/// The fields a `--columns` spec may name, in the order `Columns` holds them.
const FIELDS: [&str; 8] = [
    "arrival", "gpus", "duration", "start", "end", "user", "limit", "id",
];
/// The same, as a message lists them.
const FIELD_LIST: &str = "arrival, gpus, duration, start, end, user, limit, id";
/// The ITP trace's columns we read; a header holding all of them is the ITP
/// trace's.
const ITP_COLUMNS: &str = "job_id,cluster,submit_time_s,num_gpus,runtime_s";

/// Which trace column holds each field (`--columns arrival=submit_time,gpus=num_gpu,...`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Columns {
    /// When the job was submitted: seconds or a timestamp.
    pub arrival: String,
    /// GPUs in all, a whole number.
    pub gpus: String,
    /// How long it ran: seconds or `[D-]HH:MM:SS`; else `end - start`.
    pub duration: Option<String>,
    /// When it started (used with `end` when there is no `duration`).
    pub start: Option<String>,
    /// When it ended (used with `start` when there is no `duration`).
    pub end: Option<String>,
    /// Who submitted it.
    pub user: Option<String>,
    /// Its time limit: seconds, `[D-]HH:MM:SS`, empty or `UNLIMITED`.
    pub limit: Option<String>,
    /// Its id; the line number when absent.
    pub id: Option<String>,
}

impl Columns {
    /// Parses `field=COLUMN` pairs separated by commas.
    pub fn parse(spec: &str) -> Result<Columns, InputError> {
        let mut slots: [Option<String>; 8] = Default::default();
        for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (field, column) = item
                .split_once('=')
                .ok_or_else(|| InputError::SpecNoEquals(item.into()))?;
            let (field, column) = (field.trim(), column.trim());
            let unknown = || InputError::SpecUnknownField(field.into());
            let at = FIELDS
                .iter()
                .position(|f| *f == field)
                .ok_or_else(unknown)?;
            if column.is_empty() {
                return Err(InputError::SpecEmptyColumn(FIELDS[at]));
            }
            if slots[at].is_some() {
                return Err(InputError::SpecDuplicate(FIELDS[at]));
            }
            slots[at] = Some(column.to_string());
        }
        let [arrival, gpus, duration, start, end, user, limit, id] = slots;
        let columns = Columns {
            arrival: arrival.ok_or(InputError::SpecMissing("arrival"))?,
            gpus: gpus.ok_or(InputError::SpecMissing("gpus"))?,
            duration,
            start,
            end,
            user,
            limit,
            id,
        };
        columns.check_duration()?;
        Ok(columns)
    }

    /// The ITP trace's header (`traces/itp/itp_all_clusters.csv`); its
    /// `cluster` stands in for the user, as the trace records none.
    pub fn itp() -> Columns {
        Columns {
            arrival: "submit_time_s".into(),
            gpus: "num_gpus".into(),
            duration: Some("runtime_s".into()),
            start: None,
            end: None,
            user: Some("cluster".into()),
            limit: None,
            id: Some("job_id".into()),
        }
    }

    fn check_duration(&self) -> Result<(), InputError> {
        if self.duration.is_none() && (self.start.is_none() || self.end.is_none()) {
            return Err(InputError::SpecNoDuration);
        }
        Ok(())
    }
}

/// How to read a trace: its columns, a filter and a cap on the job count.
#[derive(Clone, Debug, Default)]
pub struct ReadOptions {
    /// `None`: the header must be the ITP trace's.
    pub columns: Option<Columns>,
    /// Keep the first N jobs (after filtering), in arrival order.
    pub limit: Option<usize>,
    /// `--where COLUMN=VALUE` pairs; a row is kept when all match exactly.
    pub filter: Vec<(String, String)>,
}

/// A trace as read: its jobs and what was left out.
#[derive(Clone, Debug)]
pub struct Trace {
    /// Sorted by (arrival, line); the first arrives at 0.
    pub jobs: Vec<TraceJob>,
    /// Data rows read (blank lines and the header not counted).
    pub rows: usize,
    /// Rows that did not match the filter (rows cut by `limit` are neither
    /// here nor in `jobs`).
    pub filtered_out: usize,
}

/// Parses one `--where COLUMN=VALUE`.
pub fn parse_filter(s: &str) -> Result<(String, String), InputError> {
    match s.split_once('=') {
        Some((column, value)) if !column.trim().is_empty() => {
            Ok((column.trim().to_string(), value.trim().to_string()))
        }
        _ => Err(InputError::BadFilter(s.into())),
    }
}

/// Why a trace could not be read.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    #[error("--columns: `{0}` has no `=`; write FIELD=COLUMN pairs separated by commas, fields among {FIELD_LIST}")]
    SpecNoEquals(String),
    #[error("--columns: unknown field `{0}`; the fields are {FIELD_LIST}")]
    SpecUnknownField(String),
    #[error("--columns: field `{0}` is given twice; name each field once")]
    SpecDuplicate(&'static str),
    #[error("--columns: field `{0}` names no column; write {0}=COLUMN")]
    SpecEmptyColumn(&'static str),
    #[error("--columns: field `{0}` is required; add {0}=COLUMN (fields: {FIELD_LIST})")]
    SpecMissing(&'static str),
    #[error("--columns: no duration; add duration=COLUMN, or both start=COLUMN and end=COLUMN")]
    SpecNoDuration,
    #[error("--where `{0}`: expected COLUMN=VALUE, e.g. --where cluster=cluster04")]
    BadFilter(String),
    #[error("cannot read the trace {path}: {source}; check the path (a UTF-8 CSV file)")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path} has no jobs: it is empty or holds only a header; give a CSV with a header line and one job per line")]
    NoJobs { path: String },
    #[error("{path}: none of its {rows} rows matches --where {filter}; check the column and the value (matching is exact)")]
    NoneMatch {
        path: String,
        rows: usize,
        filter: String,
    },
    #[error("{path} line {line}: the header is not the ITP trace's ({ITP_COLUMNS}); say which column holds what with --columns arrival=COL,gpus=COL,duration=COL (also user, id, limit, start, end); this header's columns are: {header}")]
    UnknownFormat {
        path: String,
        line: usize,
        header: String,
    },
    #[error("{path} line {line}: the header has no column `{column}` (named by {by}); its columns are: {header}")]
    MissingColumn {
        path: String,
        line: usize,
        column: String,
        by: String,
        header: String,
    },
    #[error("{path} line {line}: {got} fields where the header has {want}; quote a field that holds a comma (\"a,b\")")]
    FieldCount {
        path: String,
        line: usize,
        got: usize,
        want: usize,
    },
    #[error("{path} line {line}: a quoted field is not closed or has text after its closing quote; write it as \"...\" with \"\" for a quote inside")]
    Quoting { path: String, line: usize },
    #[error("{path} line {line}, column `{column}`: {value:?} {problem}")]
    BadValue {
        path: String,
        line: usize,
        column: String,
        value: String,
        problem: &'static str,
    },
    /// `start` and `end` are each a column's name and its value.
    #[error("{path} line {line}: the end, {end}, is before the start, {start}; fix the row, or name a duration column")]
    EndBeforeStart {
        path: String,
        line: usize,
        start: String,
        end: String,
    },
}

const NOT_GPUS: &str = "is not a whole number of GPUs (0 or more)";
const NOT_TIME: &str = "is not a time: give seconds (e.g. 1614816000 or 12.5) or a timestamp YYYY-MM-DD HH:MM:SS, optionally with .fff and Z or +HH:MM";
const NOT_DURATION: &str =
    "is not a duration: give seconds (e.g. 3600 or 1.5) or [D-]HH:MM:SS or MM:SS";
const NEGATIVE: &str = "is negative: durations and limits are 0 or more";

/// Reads the trace at `path`: every row is checked, then the filter, the
/// sort by arrival and the limit are applied, and arrivals are made relative
/// to the earliest kept job's.
pub fn read(path: &Path, opts: &ReadOptions) -> Result<Trace, InputError> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| InputError::Read {
        path: shown.clone(),
        source,
    })?;
    let text = text.strip_prefix('\u{feff}').unwrap_or(&text);
    let mut lines = text
        .lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l))
        .filter(|(_, l)| !l.trim().is_empty());
    let Some((header_line, header)) = lines.next() else {
        return Err(InputError::NoJobs { path: shown });
    };
    let quoting = |line| InputError::Quoting {
        path: shown.clone(),
        line,
    };
    let mut fields: Vec<Cow<str>> = Vec::new();
    split(header, &mut fields).ok_or_else(|| quoting(header_line))?;
    let detected;
    let columns = match &opts.columns {
        Some(c) => c,
        None if ITP_COLUMNS
            .split(',')
            .all(|c| fields.iter().any(|f| f == c)) =>
        {
            detected = Columns::itp();
            &detected
        }
        None => {
            return Err(InputError::UnknownFormat {
                path: shown,
                line: header_line,
                header: fields.join(","),
            })
        }
    };
    let layout = Layout::resolve(columns, &opts.filter, &fields, &shown, header_line)?;

    let mut kept: Vec<(i64, TraceJob)> = Vec::new();
    let (mut rows, mut filtered_out) = (0, 0);
    for (line, text) in lines {
        rows += 1;
        split(text, &mut fields).ok_or_else(|| quoting(line))?;
        if fields.len() != layout.width {
            return Err(InputError::FieldCount {
                path: shown,
                line,
                got: fields.len(),
                want: layout.width,
            });
        }
        let job = layout.job(&fields, line, &shown)?;
        if layout
            .filter
            .iter()
            .all(|(at, value)| fields[*at] == *value)
        {
            kept.push(job);
        } else {
            filtered_out += 1;
        }
    }
    if rows == 0 {
        return Err(InputError::NoJobs { path: shown });
    }
    if kept.is_empty() && filtered_out > 0 {
        let filter: Vec<String> = opts
            .filter
            .iter()
            .map(|(c, v)| format!("{c}={v}"))
            .collect();
        return Err(InputError::NoneMatch {
            path: shown,
            rows,
            filter: filter.join(" and "),
        });
    }
    kept.sort_by_key(|(t, job)| (*t, job.line));
    if let Some(n) = opts.limit {
        kept.truncate(n);
    }
    let first = kept.first().map_or(0, |(t, _)| *t);
    // Sorted, so `t >= first`: the difference is the arrival.
    let jobs = kept.into_iter().map(|(t, job)| TraceJob {
        arrival: t.abs_diff(first),
        ..job
    });
    Ok(Trace {
        jobs: jobs.collect(),
        rows,
        filtered_out,
    })
}

/// A field's place in the rows and the column name messages give.
#[derive(Clone, Copy)]
struct Col<'c> {
    at: usize,
    name: &'c str,
}

/// `Columns` resolved against one header.
struct Layout<'c> {
    arrival: Col<'c>,
    gpus: Col<'c>,
    duration: Option<Col<'c>>,
    span: Option<(Col<'c>, Col<'c>)>,
    user: Option<Col<'c>>,
    limit: Option<Col<'c>>,
    id: Option<Col<'c>>,
    filter: Vec<(usize, &'c str)>,
    /// Fields per row (the header's count).
    width: usize,
}

impl<'c> Layout<'c> {
    fn resolve(
        columns: &'c Columns,
        filter: &'c [(String, String)],
        header: &[Cow<str>],
        path: &str,
        line: usize,
    ) -> Result<Layout<'c>, InputError> {
        columns.check_duration()?;
        let find =
            |name: &'c str, by: &dyn Fn() -> String| match header.iter().position(|h| h == name) {
                Some(at) => Ok(Col { at, name }),
                None => Err(InputError::MissingColumn {
                    path: path.to_string(),
                    line,
                    column: name.to_string(),
                    by: by(),
                    header: header.join(","),
                }),
            };
        let named =
            |field: &str, name: &'c str| find(name, &|| format!("--columns {field}={name}"));
        let optional = |field: &str, name: &'c Option<String>| {
            name.as_deref().map(|n| named(field, n)).transpose()
        };
        let span = optional("start", &columns.start)?.zip(optional("end", &columns.end)?);
        let mut kept_filter = Vec::with_capacity(filter.len());
        for (column, value) in filter {
            let col = find(column, &|| format!("--where {column}={value}"))?;
            kept_filter.push((col.at, value.as_str()));
        }
        Ok(Layout {
            arrival: named("arrival", &columns.arrival)?,
            gpus: named("gpus", &columns.gpus)?,
            duration: optional("duration", &columns.duration)?,
            span,
            user: optional("user", &columns.user)?,
            limit: optional("limit", &columns.limit)?,
            id: optional("id", &columns.id)?,
            filter: kept_filter,
            width: header.len(),
        })
    }

    /// One row as a job, with its absolute arrival in ms (the job's own
    /// `arrival` is set once the earliest is known).
    fn job(&self, f: &[Cow<str>], line: usize, path: &str) -> Result<(i64, TraceJob), InputError> {
        let bad = |col: Col, problem| InputError::BadValue {
            path: path.to_string(),
            line,
            column: col.name.to_string(),
            value: f[col.at].to_string(),
            problem,
        };
        let value = |col: Col<'c>| -> &str { &f[col.at] };
        let arrival = parse_time(value(self.arrival)).ok_or_else(|| bad(self.arrival, NOT_TIME))?;
        let gpus = value(self.gpus)
            .parse::<u32>()
            .map_err(|_| bad(self.gpus, NOT_GPUS))?;
        let duration = match (self.duration, self.span) {
            (Some(col), _) => parse_duration(value(col)).map_err(|p| bad(col, p))?,
            (None, Some((start, end))) => {
                let t0 = parse_time(value(start)).ok_or_else(|| bad(start, NOT_TIME))?;
                let t1 = parse_time(value(end)).ok_or_else(|| bad(end, NOT_TIME))?;
                if t1 < t0 {
                    let shown = |c: Col<'c>| format!("`{}` {:?}", c.name, value(c));
                    return Err(InputError::EndBeforeStart {
                        path: path.to_string(),
                        line,
                        start: shown(start),
                        end: shown(end),
                    });
                }
                t1.abs_diff(t0)
            }
            // `resolve` checked that one of the two is there.
            (None, None) => 0,
        };
        let limit = match self.limit {
            Some(col) => parse_limit(value(col)).map_err(|p| bad(col, p))?,
            None => None,
        };
        let job = TraceJob {
            id: self
                .id
                .map_or_else(|| line.to_string(), |c| value(c).to_string()),
            arrival: 0,
            gpus,
            duration,
            user: self.user.map(|c| value(c).to_string()).unwrap_or_default(),
            limit,
            line,
        };
        Ok((arrival, job))
    }
}

/// Splits one CSV line into `out` (cleared first), trimming blanks around
/// fields; quoted fields may hold commas and `""` for a quote. `None`: a
/// quote is not closed or is followed by text.
fn split<'a>(line: &'a str, out: &mut Vec<Cow<'a, str>>) -> Option<()> {
    out.clear();
    if !line.contains('"') {
        out.extend(line.split(',').map(|f| Cow::Borrowed(f.trim())));
        return Some(());
    }
    let mut rest = line;
    loop {
        let start = rest.trim_start();
        if let Some(quoted) = start.strip_prefix('"') {
            let (field, after) = unquote(quoted)?;
            out.push(field);
            let after = after.trim_start();
            match after.strip_prefix(',') {
                Some(next) => rest = next,
                None if after.is_empty() => return Some(()),
                None => return None,
            }
        } else {
            let comma = start.find(',');
            out.push(Cow::Borrowed(start[..comma.unwrap_or(start.len())].trim()));
            match comma {
                Some(at) => rest = &start[at + 1..],
                None => return Some(()),
            }
        }
    }
}

/// The field after an opening quote, and the text after its closing quote.
fn unquote(s: &str) -> Option<(Cow<'_, str>, &str)> {
    let close = s.find('"')?;
    if s[close + 1..].starts_with('"') {
        // An escaped quote: build the field.
        let mut field = String::new();
        let mut rest = s;
        loop {
            let close = rest.find('"')?;
            field.push_str(&rest[..close]);
            if rest[close + 1..].starts_with('"') {
                field.push('"');
                rest = &rest[close + 2..];
            } else {
                return Some((Cow::Owned(field), &rest[close + 1..]));
            }
        }
    }
    Some((Cow::Borrowed(&s[..close]), &s[close + 1..]))
}

/// A time in ms since the Unix epoch (or since whatever origin a trace's
/// plain seconds count from): seconds, or a timestamp.
fn parse_time(s: &str) -> Option<i64> {
    parse_seconds(s).or_else(|| parse_timestamp(s))
}

/// A duration in ms: seconds, or Slurm's `[D-]HH:MM:SS`, `D-HH[:MM]`, `MM:SS`.
fn parse_duration(s: &str) -> Result<Millis, &'static str> {
    match parse_seconds(s) {
        Some(ms) if ms < 0 => Err(NEGATIVE),
        Some(ms) => Ok(ms.unsigned_abs()),
        None if s.starts_with('-') => Err(NEGATIVE),
        None => parse_clock(s).ok_or(NOT_DURATION),
    }
}

/// A time limit: a duration, or none when empty or `UNLIMITED`.
fn parse_limit(s: &str) -> Result<Option<Millis>, &'static str> {
    if s.is_empty() || s.eq_ignore_ascii_case("unlimited") {
        return Ok(None);
    }
    parse_duration(s).map(Some)
}

/// Seconds (optionally signed, with decimals or an exponent) as ms, rounded.
fn parse_seconds(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    let (negative, digits) = match b.first() {
        Some(b'-') => (true, &b[1..]),
        Some(b'+') => (false, &b[1..]),
        _ => (false, b),
    };
    if let Some(ms) = fixed_ms(digits) {
        return Some(if negative { -ms } else { ms });
    }
    // Rare forms (`1e3`) through f64; NaN and infinities are not times.
    let x: f64 = s.parse().ok()?;
    let ms = (x * 1000.0).round();
    (ms.is_finite() && ms.abs() < 9.0e18).then_some(ms as i64)
}

/// `DIGITS[.DIGITS]` as ms, the fraction rounded at the fourth digit.
fn fixed_ms(b: &[u8]) -> Option<i64> {
    let (whole, frac) = b.split_at(b.iter().position(|c| *c == b'.').unwrap_or(b.len()));
    let frac = frac.get(1..).unwrap_or_default();
    if (whole.is_empty() && frac.is_empty()) || !whole.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let ms = whole.iter().try_fold(0i64, |v, c| {
        v.checked_mul(10)?.checked_add(i64::from(c - b'0'))
    })?;
    ms.checked_mul(1000)?.checked_add(fraction_ms(frac)?)
}

/// The digits after a decimal point as ms, rounded at the fourth digit.
fn fraction_ms(frac: &[u8]) -> Option<i64> {
    if !frac.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let digit = |i: usize| frac.get(i).map_or(0, |c| i64::from(c - b'0'));
    Some(digit(0) * 100 + digit(1) * 10 + digit(2) + i64::from(digit(3) >= 5))
}

/// Slurm's clock forms as ms; the seconds may have decimals.
fn parse_clock(s: &str) -> Option<Millis> {
    let (days, clock) = match s.split_once('-') {
        Some((d, rest)) => (Some(whole(d)?), rest),
        None => (None, s),
    };
    let parts: Vec<&str> = clock.split(':').collect();
    let (h, m, sec) = match (days, parts.as_slice()) {
        (Some(_), [h]) => (whole(h)?, 0, 0),
        (Some(_), [h, m]) => (whole(h)?, whole(m)?, 0),
        (None, [m, s]) => (0, whole(m)?, fixed_ms(s.as_bytes())?.unsigned_abs()),
        (_, [h, m, s]) => (whole(h)?, whole(m)?, fixed_ms(s.as_bytes())?.unsigned_abs()),
        _ => return None,
    };
    let minutes = days.unwrap_or(0).checked_mul(24)?.checked_add(h)?;
    let minutes = minutes.checked_mul(60)?.checked_add(m)?;
    minutes.checked_mul(60_000)?.checked_add(sec)
}

/// Digits only, as a number.
fn whole(s: &str) -> Option<u64> {
    let digits = !s.is_empty() && s.bytes().all(|c| c.is_ascii_digit());
    digits.then(|| s.parse().ok())?
}

/// `YYYY-MM-DD[( |T)HH:MM[:SS[.fff]]][ ][Z|±HH[:MM]]` as ms since the Unix
/// epoch, UTC (no zone: taken as UTC).
fn parse_timestamp(s: &str) -> Option<i64> {
    let mut c = Cursor {
        b: s.as_bytes(),
        i: 0,
    };
    let year = i64::from(c.num(4)?);
    let month = c.eat(b"-").then(|| c.num(2))??;
    let day = c.eat(b"-").then(|| c.num(2))??;
    if !(1..=12).contains(&month) || day == 0 || day > days_in_month(year, month) {
        return None;
    }
    let (mut secs, mut frac_ms) = (0, 0);
    if c.b.get(c.i + 1).is_some_and(u8::is_ascii_digit) && c.eat(b" Tt") {
        let h = c.num(2)?;
        let m = c.eat(b":").then(|| c.num(2))??;
        let mut sec = 0;
        if c.eat(b":") {
            sec = c.num(2)?;
            if c.eat(b".") {
                let start = c.i;
                while c.b.get(c.i).is_some_and(u8::is_ascii_digit) {
                    c.i += 1;
                }
                frac_ms = fraction_ms(&c.b[start..c.i])?;
            }
        }
        if h > 23 || m > 59 || sec > 59 {
            return None;
        }
        secs = i64::from(h * 3600 + m * 60 + sec);
    }
    c.eat(b" ");
    let mut offset = 0;
    if !c.eat(b"Zz") && c.b.get(c.i).is_some_and(|s| b"+-".contains(s)) {
        let sign = if c.eat(b"-") {
            -1
        } else {
            i64::from(c.eat(b"+"))
        };
        let h = c.num(2)?;
        c.eat(b":");
        let m = if c.i < c.b.len() { c.num(2)? } else { 0 };
        if h > 23 || m > 59 {
            return None;
        }
        offset = sign * i64::from(h * 3600 + m * 60);
    }
    let days = days_from_civil(year, month, day);
    (c.i == c.b.len()).then(|| (days * 86_400 + secs - offset) * 1000 + frac_ms)
}

/// A place in a timestamp being parsed.
struct Cursor<'a> {
    b: &'a [u8],
    i: usize,
}

impl Cursor<'_> {
    /// Exactly `n` digits, as a number.
    fn num(&mut self, n: usize) -> Option<u32> {
        let part = self.b.get(self.i..self.i + n)?;
        self.i += n;
        part.iter().try_fold(0, |v, c| {
            c.is_ascii_digit().then(|| v * 10 + u32::from(c - b'0'))
        })
    }

    /// Whether the next byte is one of `any`, stepping over it if so.
    fn eat(&mut self, any: &[u8]) -> bool {
        let hit = self.b.get(self.i).is_some_and(|c| any.contains(c));
        self.i += usize::from(hit);
        hit
    }
}

fn days_in_month(year: i64, month: u32) -> u32 {
    match month {
        2 if year % 4 == 0 && (year % 100 != 0 || year % 400 == 0) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's
/// `days_from_civil`).
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = i64::from((month + 9) % 12);
    let doy = (153 * mp + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests;
