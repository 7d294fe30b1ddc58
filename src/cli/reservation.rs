//! `gpuq admin reservation create|modify|delete|list`: advance reservations
//! (Slurm's `scontrol create reservation`), whole nodes set aside over a
//! window. Times are resolved here, against this machine's clock, so the
//! change in the log carries absolute times.

use clap::{Args, Subcommand};

use super::table::{fmt_time, Table};
use super::{policy_change, print_json, CliError, JsonFlag};
use crate::clock::now_ms;
use crate::model::policy_change::{Op, PolicyChange, ReservationPatch};
use crate::model::{AdvanceReservation, Millis};
use crate::spec::queue::{parse_begin, Begin};

// `gpuq admin reservation ...`
#[derive(Subcommand, Debug)]
#[command(defer = true)]
pub enum ReservationCommand {
    /// Set whole nodes aside over a window of time.
    ///
    /// No job whose time limit would overlap the window is placed on those
    /// nodes, unless it names the reservation (`--reservation NAME`) and its
    /// user or account may use it; shorter jobs still run there before the
    /// window starts. Jobs in the reservation start once it has started, on
    /// its nodes only. With --maint the nodes are drained while the window
    /// is open (`gpuq nodes` shows `maint`).
    Create(ReservationArgs),
    /// Change a reservation (only the options given; a new --start keeps its length).
    Modify(ReservationArgs),
    /// Delete a reservation; jobs that named it stay pending with the reason.
    Delete { name: String },
    /// List reservations with their nodes, window and who may use them.
    List {
        #[command(flatten)]
        json: JsonFlag,
    },
}

// The settings of a reservation.
#[derive(Args, Debug)]
pub struct ReservationArgs {
    /// The reservation's name (letters, digits, '-', '_', '.').
    name: String,
    /// The nodes it holds, as a host list (n[1-4],gpu7).
    #[arg(long, value_name = "HOSTLIST", conflicts_with = "gpus")]
    nodes: Option<String>,
    /// Instead of --nodes: whole nodes with at least N GPUs in all, picked among those free of other reservations.
    #[arg(long, value_name = "N")]
    gpus: Option<u32>,
    /// When it starts: now, now+10min, 2026-12-24T08:00 (UTC).
    #[arg(long, value_name = "TIME", value_parser = parse_begin)]
    start: Option<Begin>,
    /// How long it lasts: 30m, 4h, 2d.
    #[arg(long, value_name = "D", value_parser = super::policy_change::parse_secs, conflicts_with = "end")]
    duration: Option<u64>,
    /// Instead of --duration: when it ends (same forms as --start).
    #[arg(long, value_name = "TIME", value_parser = parse_begin)]
    end: Option<Begin>,
    /// Users who may run jobs in it (comma list; with --accounts, "" for none; neither: anyone who names it).
    #[arg(long, value_delimiter = ',', num_args = 0..)]
    users: Option<Vec<String>>,
    /// Accounts whose jobs may run in it (comma list).
    #[arg(long, value_delimiter = ',', num_args = 0..)]
    accounts: Option<Vec<String>>,
    /// A maintenance window: drain its nodes while it is open (--maint=false to undo).
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    maint: Option<bool>,
}

fn change(op: Op, a: ReservationArgs, now: Millis) -> PolicyChange {
    let list =
        |v: Option<Vec<String>>| v.map(|v| v.into_iter().filter(|s| !s.is_empty()).collect());
    PolicyChange::Reservation {
        op,
        name: a.name,
        patch: ReservationPatch {
            nodes: a.nodes,
            gpus: a.gpus,
            start: a.start.map(|b| b.resolve(now)),
            end: a.end.map(|b| b.resolve(now)),
            duration_secs: a.duration,
            users: list(a.users),
            accounts: list(a.accounts),
            maint: a.maint,
        },
    }
}

/// `planned`, `active` or `over` at `now`.
pub(super) fn phase(r: &AdvanceReservation, now: Millis) -> &'static str {
    if r.end <= now {
        "over"
    } else if r.active(now) {
        "active"
    } else {
        "planned"
    }
}

fn who(r: &AdvanceReservation) -> String {
    let mut parts: Vec<String> = Vec::new();
    if !r.users.is_empty() {
        parts.push(format!("users={}", join(&r.users)));
    }
    if !r.accounts.is_empty() {
        parts.push(format!("accounts={}", join(&r.accounts)));
    }
    if parts.is_empty() {
        "anyone".into()
    } else {
        parts.join(" ")
    }
}

fn join(set: &std::collections::BTreeSet<String>) -> String {
    set.iter().cloned().collect::<Vec<_>>().join(",")
}

/// Runs `gpuq admin reservation ...`.
pub async fn run(cmd: ReservationCommand) -> Result<(), CliError> {
    let now = now_ms();
    match cmd {
        ReservationCommand::Create(a) => policy_change::send(change(Op::Add, a, now)).await,
        ReservationCommand::Modify(a) => policy_change::send(change(Op::Modify, a, now)).await,
        ReservationCommand::Delete { name } => {
            policy_change::send(PolicyChange::Reservation {
                op: Op::Remove,
                name,
                patch: ReservationPatch::default(),
            })
            .await
        }
        ReservationCommand::List { json } => {
            let policy = policy_change::current().await?;
            if json.json {
                return print_json(&policy.reservations);
            }
            let mut t = Table::new(&["NAME", "STATE", "START", "END", "NODES", "FLAGS", "USERS"]);
            for r in policy.reservations.values() {
                t.row(vec![
                    r.name.clone(),
                    phase(r, now).into(),
                    fmt_time(r.start),
                    fmt_time(r.end),
                    crate::model::hostlist::compress_hostlist(&r.nodes),
                    r.flags().into(),
                    who(r),
                ]);
            }
            print!("{}", t.render());
            Ok(())
        }
    }
}
