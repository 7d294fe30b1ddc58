//! `sinfo`: partitions and their nodes grouped by Slurm's node states
//! (idle, mix, alloc, drain, drng, down; `*` for a node whose agent is not
//! connected), from the same `Nodes` and `PolicyShow` requests as
//! `gpuq nodes` and `gpuq admin partition list`; `-N` lists node by node.

use std::collections::BTreeMap;
use std::process::ExitCode;

use clap::{ArgAction, FromArgMatches, Parser};

use super::format::{Format, Piece};
use crate::cli::table::Table;
use crate::cli::{call, unexpected, CliError};
use crate::model::hostlist::compress_hostlist;
use crate::model::{Partition, PartitionState};
use crate::net::proto::{ApiRequest, ApiResponse, NodeInfo};

#[derive(Parser, Debug, Clone, Default)]
#[command(
    name = "sinfo",
    no_binary_name = true,
    disable_help_flag = true,
    disable_version_flag = true,
    max_term_width = 100,
    about = "gpuq's partitions and nodes, as Slurm's sinfo",
    after_help = "Format codes: %P partition (* default), %R partition name, %a avail, %l time \
                  limit, %D node count, %t state, %T long state, %N node list, %n host names, \
                  %c CPUs per node, %m memory (MB), %G gres, %f features, %E reason, %C CPUs \
                  allocated/idle/other/total, %F nodes A/I/O/T. Nodes with the same values are \
                  one line. -O fields: PartitionName, Partition, Available, Time, Nodes, \
                  StateCompact, StateLong, NodeList, NodeHost, CPUs, Memory, Gres, Features, \
                  Reason, CPUsState, NodeAIOT (Field:N sets a width, 20 by default); %u \
                  and %H (who set the reason, and when) as -O User and Timestamp."
)]
pub struct SinfoArgs {
    /// Print no header line
    #[arg(short = 'h', long)]
    pub noheader: bool,
    /// One line per node (and partition)
    #[arg(short = 'N', long = "Node")]
    pub node_oriented: bool,
    /// Only these partitions (comma list)
    #[arg(
        short = 'p',
        long = "partition",
        value_name = "PART[,...]",
        value_delimiter = ','
    )]
    pub partitions: Vec<String>,
    /// Output format, e.g. "%P %.6D %t %N" (see below)
    #[arg(
        short = 'o',
        long = "format",
        value_name = "FORMAT",
        conflicts_with = "field_format"
    )]
    pub format: Option<String>,
    /// Output fields, e.g. "NodeList:20,StateLong,Gres" (see below)
    #[arg(short = 'O', long = "Format", value_name = "FIELD[:[.]N][,...]")]
    pub field_format: Option<String>,
    /// Why nodes are down or drained: reason, who set it, when, nodes
    #[arg(short = 'R', long = "list-reasons", conflicts_with = "summarize")]
    pub list_reasons: bool,
    /// One line a partition, nodes counted allocated/idle/other/total
    #[arg(short = 's', long = "summarize", conflicts_with = "node_oriented")]
    pub summarize: bool,
    /// Print help
    #[arg(long, action = ArgAction::Help)]
    pub help: Option<bool>,
}

/// Slurm's word for a node's state.
pub fn node_state(n: &NodeInfo) -> String {
    let gpus = n.inventory.gpus.len() as u32;
    let busy = n.gpus_used > 0 || n.cpus_used > 0 || n.running_jobs > 0;
    let full = (gpus > 0 && n.gpus_used >= gpus)
        || (n.inventory.cpus > 0 && n.cpus_used >= n.inventory.cpus);
    let word = match n.state.as_str() {
        "down" => "down",
        "drained" if busy => "drng",
        "drained" => "drain",
        "maint" => "maint",
        _ if full => "alloc",
        _ if busy => "mix",
        _ => "idle",
    };
    if n.connected || n.state == "down" {
        word.to_string()
    } else {
        format!("{word}*")
    }
}

/// The partition's name as sinfo shows it (`*` marks the default).
fn shown_name(p: &Partition) -> String {
    if p.default {
        format!("{}*", p.name)
    } else {
        p.name.clone()
    }
}

fn time_limit(p: &Partition) -> String {
    p.max_time_secs
        .map(super::format::duration)
        .unwrap_or_else(|| "infinite".into())
}

/// The partition's nodes among `nodes`, in their order.
pub(crate) fn members<'n>(p: &Partition, nodes: &'n [NodeInfo]) -> Vec<&'n NodeInfo> {
    let set = p.node_set();
    nodes
        .iter()
        .filter(|n| set.as_ref().is_none_or(|s| s.contains(&n.name)))
        .collect()
}

/// The `%` codes sinfo fills in.
pub const CODES: &str = "PRalDtTNncmGfECFuH";

/// `-R`'s lines, as Slurm prints them.
const REASONS_FORMAT: &str = "%50E %9u %19H %N";
/// `-s`'s lines, as Slurm prints them.
const SUMMARY_FORMAT: &str = "%9P %.5a %.10l %.16F  %N";

/// `-O` field names and the code each is.
const FIELD_NAMES: [(&str, char); 18] = [
    ("partitionname", 'R'),
    ("partition", 'P'),
    ("available", 'a'),
    ("time", 'l'),
    ("nodes", 'D'),
    ("statecompact", 't'),
    ("statelong", 'T'),
    ("nodelist", 'N'),
    ("nodehost", 'n'),
    ("cpus", 'c'),
    ("memory", 'm'),
    ("gres", 'G'),
    ("features", 'f'),
    ("reason", 'E'),
    ("cpusstate", 'C'),
    ("nodeaiot", 'F'),
    ("user", 'u'),
    ("timestamp", 'H'),
];

fn title(code: char) -> &'static str {
    match code {
        'P' | 'R' => "PARTITION",
        'a' => "AVAIL",
        'l' => "TIMELIMIT",
        'D' => "NODES",
        't' | 'T' => "STATE",
        'N' => "NODELIST",
        'n' => "HOSTNAMES",
        'c' => "CPUS",
        'm' => "MEMORY",
        'G' => "GRES",
        'f' => "AVAIL_FEATURES",
        'E' => "REASON",
        'C' => "CPUS(A/I/O/T)",
        'F' => "NODES(A/I/O/T)",
        'u' => "USER",
        'H' => "TIMESTAMP",
        _ => "?",
    }
}

/// The format `-o` or `-O` asks for, or `-R`'s or `-s`'s, if any.
pub fn chosen_format(args: &SinfoArgs) -> Result<Option<Format>, String> {
    if let Some(f) = &args.format {
        return Format::parse(f, CODES).map(Some);
    }
    if let Some(fields) = &args.field_format {
        return Format::parse_fields(fields, &FIELD_NAMES).map(Some);
    }
    let fixed = match (args.list_reasons, args.summarize) {
        (true, _) => REASONS_FORMAT,
        (_, true) => SUMMARY_FORMAT,
        _ => return Ok(None),
    };
    Format::parse(fixed, CODES).map(Some)
}

/// The value of `code` for a group of `nodes` (all alike in the codes
/// that are not counts or lists) of partition `p`.
fn field(code: char, p: &Partition, nodes: &[&NodeInfo]) -> String {
    let first = nodes.first();
    let names: Vec<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
    let count = |f: &dyn Fn(&NodeInfo) -> bool| nodes.iter().filter(|n| f(n)).count();
    match code {
        'P' => shown_name(p),
        'R' => p.name.clone(),
        'a' => match p.state {
            PartitionState::Up => "up".into(),
            _ => "down".into(),
        },
        'l' => time_limit(p),
        'D' => nodes.len().to_string(),
        't' => first.map_or_else(|| "n/a".into(), |n| node_state(n)),
        'T' => first.map_or_else(
            || "n/a".into(),
            |n| match node_state(n).trim_end_matches('*') {
                "idle" => "idle".into(),
                "mix" => "mixed".into(),
                "alloc" => "allocated".into(),
                "drng" => "draining".into(),
                "drain" => "drained".into(),
                other => other.into(),
            },
        ),
        'N' => compress_hostlist(&names),
        'n' => names.join(","),
        'c' => first.map_or_else(String::new, |n| n.inventory.cpus.to_string()),
        'm' => first.map_or_else(String::new, |n| n.inventory.memory_mb.to_string()),
        'G' => first.map_or_else(String::new, |n| match n.inventory.gpus.len() {
            0 => "(null)".into(),
            g => format!("gpu:{g}"),
        }),
        'f' => first.map_or_else(String::new, |n| match n.inventory.features.join(",") {
            f if f.is_empty() => "(null)".into(),
            f => f,
        }),
        'E' => first
            .and_then(|n| n.reason.as_deref())
            .map(|r| shown_reason(r, first.and_then(|n| n.reason_user.as_deref())))
            .unwrap_or_else(|| "none".into()),
        // Who set the reason: the admin, or gpuq itself (a health check, a
        // GPU fault, a lost agent), as Slurm shows `slurm`.
        'u' => match first {
            Some(n) if n.reason.is_some() => n.reason_user.clone().unwrap_or_else(|| "gpuq".into()),
            _ => "Unknown".into(),
        },
        'H' => super::format::time(first.and_then(|n| n.reason_since)),
        'C' => {
            let total: u32 = nodes.iter().map(|n| n.inventory.cpus).sum();
            let used: u32 = nodes
                .iter()
                .map(|n| n.cpus_used.min(n.inventory.cpus))
                .sum();
            let other: u32 = nodes
                .iter()
                .filter(|n| n.state != "up")
                .map(|n| n.inventory.cpus - n.cpus_used.min(n.inventory.cpus))
                .sum();
            format!("{used}/{}/{other}/{total}", total - used - other)
        }
        'F' => {
            let other = count(&|n| n.state != "up");
            let alloc = count(&|n| n.state == "up" && n.running_jobs > 0);
            let idle = nodes.len() - other - alloc;
            format!("{alloc}/{idle}/{other}/{}", nodes.len())
        }
        _ => String::new(),
    }
}

/// A reason as the admin gave it: the server adds `(by NAME)` for tools
/// that show only the reason; sinfo has a USER column for it.
pub(crate) fn shown_reason(reason: &str, user: Option<&str>) -> String {
    user.and_then(|u| reason.strip_suffix(&format!(" (by {u})")))
        .unwrap_or(reason)
        .to_string()
}

/// sinfo with `-o`/`-O` (or `-R`, `-s`): per partition, nodes alike in
/// every field that is not a count or list share a line (`-N`: a line per
/// node). `-R` lists each node that is down or drained once, whatever its
/// partitions.
pub fn render_format(
    args: &SinfoArgs,
    fmt: &Format,
    partitions: &[Partition],
    nodes: &[NodeInfo],
) -> String {
    let mut out = String::new();
    if !args.noheader {
        out.push_str(&fmt.header(title));
        out.push('\n');
    }
    let grouping: Vec<char> = fmt
        .0
        .iter()
        .filter_map(|p| match p {
            Piece::Field { code, .. } if !"DNnCF".contains(*code) => Some(*code),
            _ => None,
        })
        .collect();
    let chosen: Vec<&Partition> = partitions
        .iter()
        .filter(|p| args.partitions.is_empty() || args.partitions.contains(&p.name))
        .collect();
    let sections: Vec<(&Partition, Vec<&NodeInfo>)> = if args.list_reasons {
        let listed =
            |n: &&NodeInfo| n.state != "up" && chosen.iter().any(|p| members(p, nodes).contains(n));
        let with_reasons: Vec<&NodeInfo> = nodes.iter().filter(listed).collect();
        match chosen.first() {
            Some(p) if !with_reasons.is_empty() => vec![(*p, with_reasons)],
            _ => Vec::new(),
        }
    } else {
        chosen.iter().map(|p| (*p, members(p, nodes))).collect()
    };
    for (p, listed) in sections {
        let mut groups: Vec<(Vec<String>, Vec<&NodeInfo>)> = Vec::new();
        for n in listed {
            let key: Vec<String> = if args.node_oriented {
                vec![n.name.clone()]
            } else {
                grouping.iter().map(|c| field(*c, p, &[n])).collect()
            };
            match groups.iter_mut().find(|(k, _)| *k == key) {
                Some((_, members)) => members.push(n),
                None => groups.push((key, vec![n])),
            }
        }
        if groups.is_empty() {
            groups.push((Vec::new(), Vec::new()));
        }
        for (_, members) in groups {
            out.push_str(&fmt.render(|code| field(code, p, &members)));
            out.push('\n');
        }
    }
    out
}

/// The table sinfo prints.
pub fn render(args: &SinfoArgs, partitions: &[Partition], nodes: &[NodeInfo]) -> String {
    let parts: Vec<&Partition> = partitions
        .iter()
        .filter(|p| args.partitions.is_empty() || args.partitions.contains(&p.name))
        .collect();
    let mut t = if args.node_oriented {
        Table::new(&["NODELIST", "NODES", "PARTITION", "STATE"])
    } else {
        Table::new(&[
            "PARTITION",
            "AVAIL",
            "TIMELIMIT",
            "NODES",
            "STATE",
            "NODELIST",
        ])
    };
    if args.node_oriented {
        let mut rows = Vec::new();
        for p in &parts {
            for n in members(p, nodes) {
                rows.push((n.name.clone(), shown_name(p), node_state(n)));
            }
        }
        rows.sort();
        for (node, part, state) in rows {
            t.row(vec![node, "1".into(), part, state]);
        }
    } else {
        for p in &parts {
            let avail = match p.state {
                PartitionState::Up => "up",
                _ => "down",
            };
            let mut by_state: BTreeMap<String, Vec<&str>> = BTreeMap::new();
            for n in members(p, nodes) {
                by_state.entry(node_state(n)).or_default().push(&n.name);
            }
            if by_state.is_empty() {
                t.row(vec![
                    shown_name(p),
                    avail.into(),
                    time_limit(p),
                    "0".into(),
                    "n/a".into(),
                    String::new(),
                ]);
            }
            for (state, names) in by_state {
                t.row(vec![
                    shown_name(p),
                    avail.into(),
                    time_limit(p),
                    names.len().to_string(),
                    state,
                    compress_hostlist(&names),
                ]);
            }
        }
    }
    let text = t.render();
    if args.noheader {
        text.lines().skip(1).map(|l| format!("{l}\n")).collect()
    } else {
        text
    }
}

/// The nodes and the partitions, as `sinfo` and `scontrol show` read them.
pub(crate) async fn nodes_and_partitions() -> Result<(Vec<NodeInfo>, Vec<Partition>), CliError> {
    let nodes = match call(ApiRequest::Nodes).await? {
        ApiResponse::Nodes { nodes } => nodes,
        other => return Err(unexpected(other)),
    };
    let policy = match call(ApiRequest::PolicyShow).await? {
        ApiResponse::Policy { policy, .. } => policy,
        other => return Err(unexpected(other)),
    };
    Ok((nodes, policy.all_partitions().into_values().collect()))
}

/// `sinfo ARGS`.
pub async fn run(args: Vec<String>) -> Result<ExitCode, CliError> {
    let Some(m) = super::parse_with(<SinfoArgs as clap::CommandFactory>::command(), &args)? else {
        return Ok(ExitCode::SUCCESS);
    };
    let args =
        SinfoArgs::from_arg_matches(&m).map_err(|e| CliError::input(super::clap_line(&e)))?;
    let fmt = chosen_format(&args).map_err(CliError::input)?;
    let (nodes, partitions) = nodes_and_partitions().await?;
    if let Some(p) = args
        .partitions
        .iter()
        .find(|p| !partitions.iter().any(|q| &q.name == *p))
    {
        return Err(CliError::input(format!(
            "no partition {p}; `sinfo` lists them"
        )));
    }
    match fmt {
        Some(fmt) => print!("{}", render_format(&args, &fmt, &partitions, &nodes)),
        None => print!("{}", render(&args, &partitions, &nodes)),
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::NodeInventory;

    fn node(name: &str, state: &str, cpus_used: u32, connected: bool) -> NodeInfo {
        NodeInfo {
            name: name.into(),
            state: state.into(),
            reason: None,
            reason_user: None,
            reason_since: None,
            addr: String::new(),
            connected,
            gpus_used: 0,
            cpus_used,
            memory_used_mb: 0,
            running_jobs: u32::from(cpus_used > 0),
            inventory: NodeInventory {
                name: name.into(),
                gpus: Vec::new(),
                gpu_links: Vec::new(),
                numa: Vec::new(),
                cpus: 8,
                memory_mb: 1024,
                topology: String::new(),
                features: Vec::new(),
            },
        }
    }

    #[test]
    fn node_states_in_slurms_words() {
        let cases = [
            (node("a", "up", 0, true), "idle"),
            (node("a", "up", 2, true), "mix"),
            (node("a", "up", 8, true), "alloc"),
            (node("a", "drained", 2, true), "drng"),
            (node("a", "drained", 0, true), "drain"),
            (node("a", "down", 0, false), "down"),
            (node("a", "up", 0, false), "idle*"),
        ];
        for (n, want) in cases {
            assert_eq!(node_state(&n), want, "{n:?}");
        }
    }

    #[test]
    fn partitions_group_nodes_by_state_and_n_lists_each() {
        let mut p = Partition::new("default");
        p.default = true;
        let mut short = Partition::new("short");
        short.nodes = Some("n3".into());
        short.max_time_secs = Some(4 * 3600);
        let nodes = [
            node("n1", "up", 0, true),
            node("n2", "up", 0, true),
            node("n3", "up", 2, true),
        ];
        let text = render(&SinfoArgs::default(), &[p.clone(), short.clone()], &nodes);
        let rows: Vec<Vec<&str>> = text
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(
            rows,
            [
                vec![
                    "PARTITION",
                    "AVAIL",
                    "TIMELIMIT",
                    "NODES",
                    "STATE",
                    "NODELIST"
                ],
                vec!["default*", "up", "infinite", "2", "idle", "n[1-2]"],
                vec!["default*", "up", "infinite", "1", "mix", "n3"],
                vec!["short", "up", "4:00:00", "1", "mix", "n3"],
            ]
        );
        let args = SinfoArgs {
            node_oriented: true,
            noheader: true,
            ..Default::default()
        };
        let text = render(&args, &[p, short], &nodes);
        let rows: Vec<Vec<&str>> = text
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(rows.len(), 4, "{text}");
        assert_eq!(rows[0], ["n1", "1", "default*", "idle"]);
        assert_eq!(rows[3], ["n3", "1", "short", "mix"]);
    }

    #[test]
    fn formats_group_alike_nodes_and_n_lists_each() {
        let p = Partition::new("gpu");
        let mut nodes = vec![
            node("n1", "up", 0, true),
            node("n2", "up", 0, true),
            node("n3", "up", 2, true),
        ];
        nodes[2].inventory.features = vec!["ib".into()];
        let args = |words: &[&str]| SinfoArgs::try_parse_from(words).unwrap();
        let out = |a: &SinfoArgs| {
            let fmt = chosen_format(a).unwrap().unwrap();
            render_format(a, &fmt, std::slice::from_ref(&p), &nodes)
        };
        let a = args(&["-o", "%P|%D|%t|%N|%c|%f|%C|%F"]);
        assert_eq!(
            out(&a),
            "PARTITION|NODES|STATE|NODELIST|CPUS|AVAIL_FEATURES|CPUS(A/I/O/T)|NODES(A/I/O/T)\n\
             gpu|2|idle|n[1-2]|8|(null)|0/16/0/16|0/2/0/2\n\
             gpu|1|mix|n3|8|ib|2/6/0/8|1/0/0/1\n"
        );
        let a = args(&["-h", "-N", "-O", "NodeList:5,StateLong:.10"]);
        assert_eq!(
            out(&a),
            "n1         idle\nn2         idle\nn3        mixed\n"
        );
        let bad = chosen_format(&args(&["-o", "%P %Q"])).unwrap_err();
        assert!(bad.contains("%Q"), "{bad}");
        let bad = chosen_format(&args(&["-O", "Nodelst"])).unwrap_err();
        assert!(bad.contains("Nodelst") && bad.contains("nodelist"), "{bad}");
    }

    #[test]
    fn r_lists_down_and_drained_nodes_once_by_reason_and_s_one_line_a_partition() {
        let p = Partition::new("gpu");
        let mut short = Partition::new("short");
        short.nodes = Some("n[1-2]".into());
        let mut nodes = vec![
            node("n1", "drained", 0, true),
            node("n2", "drained", 2, true),
            node("n3", "down", 0, false),
            node("n4", "up", 0, true),
        ];
        for n in &mut nodes[..2] {
            n.reason = Some("replace PSU (by alice)".into());
            n.reason_user = Some("alice".into());
            n.reason_since = Some(1_767_225_600_000); // 2026-01-01T00:00:00Z
        }
        nodes[2].reason = Some("no heartbeat for 30 s".into());
        let parts = [p, short];
        let args = |words: &[&str]| SinfoArgs::try_parse_from(words).unwrap();
        let out = |a: &SinfoArgs| {
            let fmt = chosen_format(a).unwrap().unwrap();
            render_format(a, &fmt, &parts, &nodes)
        };
        let text = out(&args(&["-R"]));
        let rows: Vec<Vec<&str>> = text
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(
            rows.len(),
            3,
            "a header and two reasons, each node once:\n{text}"
        );
        assert_eq!(rows[0], ["REASON", "USER", "TIMESTAMP", "NODELIST"]);
        assert_eq!(
            rows[1],
            ["replace", "PSU", "alice", "2026-01-01T00:00:00", "n[1-2]"]
        );
        assert_eq!(
            rows[2],
            ["no", "heartbeat", "for", "30", "s", "gpuq", "Unknown", "n3"]
        );
        // -p narrows -R to that partition's nodes.
        let text = out(&args(&["-R", "-h", "-p", "short"]));
        assert_eq!(text.lines().count(), 1, "{text}");
        let text = out(&args(&["-s"]));
        let rows: Vec<Vec<&str>> = text
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(
            rows,
            [
                vec![
                    "PARTITION",
                    "AVAIL",
                    "TIMELIMIT",
                    "NODES(A/I/O/T)",
                    "NODELIST"
                ],
                vec!["gpu", "up", "infinite", "0/1/3/4", "n[1-4]"],
                vec!["short", "up", "infinite", "0/0/2/2", "n[1-2]"],
            ]
        );
        assert!(SinfoArgs::try_parse_from(["-R", "-s"]).is_err());
    }
}
