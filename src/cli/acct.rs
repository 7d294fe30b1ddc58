//! `gpuq acct`: finished jobs from the active set and the history archive,
//! with Slurm `sacct`-style filters, or totals per account and user.

use clap::Args;

use super::table::{fmt_duration, fmt_time, opt_time, Table};
use super::{call, parse_state, print_json, unexpected, CliError, JsonFlag};
use crate::model::acct::{AcctFilter, AcctRecord, AcctSummary, ACCT_PAGE};
// The one nodelist compressor (`node[001-064]`), shared with the task env.
use crate::model::hostlist::compress_hostlist;
use crate::model::{JobState, Millis};
use crate::net::proto::{ApiRequest, ApiResponse};

// The flags of `gpuq acct`.
#[derive(Args, Debug, Clone)]
pub struct AcctArgs {
    /// Only this user's jobs.
    #[arg(short, long)]
    pub user: Option<String>,
    /// Only jobs charged to this account.
    #[arg(short = 'A', long)]
    pub account: Option<String>,
    /// Only jobs that ended in these states (comma list, e.g. FAILED,TIMEOUT).
    #[arg(short = 's', long, value_delimiter = ',', value_parser = parse_state)]
    pub state: Vec<JobState>,
    /// Only jobs that ended at or after this time (sacct -S): YYYY-MM-DD,
    /// YYYY-MM-DDTHH:MM[:SS] (UTC), `now`, or `now-2h` (s, m, h, d).
    #[arg(short = 'S', long, value_parser = parse_when)]
    pub since: Option<Millis>,
    /// Only jobs submitted at or before this time (sacct -E); same forms.
    #[arg(short = 'E', long, value_parser = parse_when)]
    pub until: Option<Millis>,
    /// Totals per account and per user: jobs, GPU-hours, jobs by state.
    #[arg(long)]
    pub summary: bool,
    #[command(flatten)]
    pub json: JsonFlag,
}

/// Runs `gpuq acct`.
pub async fn run(args: AcctArgs) -> Result<(), CliError> {
    let filter = AcctFilter {
        user: args.user,
        account: args.account,
        states: args.state,
        since: args.since,
        until: args.until,
        ..AcctFilter::default()
    };
    if !args.summary {
        let records = fetch_records(filter).await?;
        if args.json.json {
            return print_json(&records);
        }
        print!("{}", records_table(&records));
        return Ok(());
    }
    match call(ApiRequest::Acct {
        filter,
        summary: true,
    })
    .await?
    {
        ApiResponse::Acct { records, .. } => {
            if args.json.json {
                return print_json(&records);
            }
            print!("{}", records_table(&records));
            Ok(())
        }
        ApiResponse::AcctSummary { rows } => {
            if args.json.json {
                return print_json(&rows);
            }
            print!("{}", summary_table(&rows));
            Ok(())
        }
        other => Err(unexpected(other)),
    }
}

/// Every record `filter` selects, fetched a page at a time (a frame holds
/// 16 MiB; a 100,000-job history is more).
pub async fn fetch_records(mut filter: AcctFilter) -> Result<Vec<AcctRecord>, CliError> {
    filter.limit = Some(ACCT_PAGE);
    let mut all: Vec<AcctRecord> = Vec::new();
    loop {
        let (page, next) = match call(ApiRequest::Acct {
            filter: filter.clone(),
            summary: false,
        })
        .await?
        {
            ApiResponse::Acct { records, next } => (records, next),
            other => return Err(unexpected(other)),
        };
        // A server from before `next` pages by count only: a full page may
        // have more after it.
        let full = page.len() >= ACCT_PAGE as usize;
        let last = page.last().map(|r| r.id);
        let next = next.or(last.filter(|_| full));
        // A server from before pages answers everything at once, every time.
        let paged = filter.after.is_none_or(|a| last.is_some_and(|l| l > a));
        if !paged {
            break;
        }
        all.extend(page);
        match next {
            Some(id) => filter.after = Some(id),
            None => break,
        }
    }
    Ok(all)
}

fn records_table(records: &[AcctRecord]) -> String {
    let mut t = Table::new(&[
        "JOBID",
        "NAME",
        "USER",
        "ACCOUNT",
        "STATE",
        "EXIT",
        "NODES",
        "GPUS",
        "SUBMIT",
        "START",
        "END",
        "ELAPSED",
        "GPU_HOURS",
        "GPU_UTIL",
        "GPU_MEM",
    ]);
    for r in records {
        let pct = |f: fn(&crate::model::GpuUse) -> u32| {
            r.gpu_use
                .as_ref()
                .map_or_else(|| "-".into(), |u| format!("{}%", f(u)))
        };
        t.row(vec![
            r.id.to_string(),
            r.name.clone(),
            r.user.clone(),
            r.account.clone(),
            r.state.to_string(),
            r.exit_code
                .map(|c| c.to_string())
                .unwrap_or_else(|| "-".into()),
            if r.nodes.is_empty() {
                "-".into()
            } else {
                compress_hostlist(&r.nodes)
            },
            r.gpus.to_string(),
            fmt_time(r.submit_time),
            opt_time(r.start_time),
            opt_time(r.end_time),
            fmt_duration(r.elapsed_secs),
            format!("{:.2}", r.gpu_hours),
            pct(|u| u.mean_util_pct),
            pct(|u| u.mean_memory_pct),
        ]);
    }
    t.render()
}

fn summary_table(rows: &[AcctSummary]) -> String {
    let mut t = Table::new(&["ACCOUNT", "USER", "JOBS", "GPU_HOURS", "BY_STATE"]);
    for r in rows {
        t.row(vec![
            r.account.clone(),
            r.user.clone().unwrap_or_else(|| "(all)".into()),
            r.jobs.to_string(),
            format!("{:.2}", r.gpu_hours),
            r.by_state
                .iter()
                .map(|(s, n)| format!("{s}={n}"))
                .collect::<Vec<_>>()
                .join(","),
        ]);
    }
    t.render()
}

/// Parses a point in time for `--since`/`--until` into Unix milliseconds.
pub fn parse_when(input: &str) -> Result<Millis, String> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    parse_when_at(input, now)
}

fn parse_when_at(input: &str, now: Millis) -> Result<Millis, String> {
    let bad = || {
        format!(
            "{input:?} is not a time; use YYYY-MM-DD, YYYY-MM-DDTHH:MM[:SS] (UTC), now, or now-2h"
        )
    };
    let s = input.trim();
    if s == "now" {
        return Ok(now);
    }
    if let Some(ago) = s.strip_prefix("now-") {
        let (num, unit) =
            ago.split_at(ago.find(|c: char| !c.is_ascii_digit()).unwrap_or(ago.len()));
        let n: u64 = num.parse().map_err(|_| bad())?;
        let secs = match unit {
            "s" | "" => 1,
            "m" => 60,
            "h" => 3600,
            "d" => 86_400,
            _ => return Err(bad()),
        };
        return Ok(now.saturating_sub(n.saturating_mul(secs * 1000)));
    }
    let (date, time) = match s.split_once('T') {
        Some((d, t)) => (d, Some(t)),
        None => (s, None),
    };
    let ymd: Vec<&str> = date.split('-').collect();
    let [y, m, d] = ymd.as_slice() else {
        return Err(bad());
    };
    let (y, m, d): (i64, u32, u32) = (
        y.parse().map_err(|_| bad())?,
        m.parse().map_err(|_| bad())?,
        d.parse().map_err(|_| bad())?,
    );
    if !(1..=12).contains(&m) || !(1..=31).contains(&d) || y < 1970 {
        return Err(bad());
    }
    let mut secs = days_from_civil(y, m, d) * 86_400;
    if let Some(t) = time {
        let hms: Vec<&str> = t.split(':').collect();
        if !(2..=3).contains(&hms.len()) {
            return Err(bad());
        }
        let parts: Vec<i64> = hms
            .iter()
            .map(|p| p.parse::<i64>().map_err(|_| bad()))
            .collect::<Result<_, _>>()?;
        if parts[0] > 23 || parts[1] > 59 || parts.get(2).is_some_and(|s| *s > 59) {
            return Err(bad());
        }
        secs += parts[0] * 3600 + parts[1] * 60 + parts.get(2).copied().unwrap_or(0);
    }
    Ok(secs as u64 * 1000)
}

/// Days since 1970-01-01 of a civil date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (i64::from(m) + 9) % 12;
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_parse_in_utc_and_relative_to_now() {
        assert_eq!(parse_when_at("1970-01-01", 0).unwrap(), 0);
        assert_eq!(
            parse_when_at("2026-12-01T09:59:59", 0).unwrap(),
            1_796_119_199_000
        );
        assert_eq!(parse_when_at("2000-02-29", 0).unwrap(), 951_782_400_000);
        assert_eq!(parse_when_at("now", 5_000).unwrap(), 5_000);
        assert_eq!(parse_when_at("now-2h", 10_000_000).unwrap(), 2_800_000);
        assert_eq!(parse_when_at("now-1d", 1).unwrap(), 0);
        for bad in [
            "yesterday",
            "2026-13-01",
            "2026-12-01T25:00",
            "now-3w",
            "12/01/2026",
        ] {
            let e = parse_when_at(bad, 0).unwrap_err();
            assert!(e.contains("YYYY-MM-DD"), "{bad}: {e}");
        }
    }
}
