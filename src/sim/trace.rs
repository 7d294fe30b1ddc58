//! The ITP job trace (Microsoft's ITP GPU clusters, in
//! `traces/itp/itp_all_clusters.csv`): reading it, and the job shape each
//! trace job gets on 8-GPU nodes.
//!
//! The trace records GPUs per job, not nodes: up to 8 GPUs is one node with
//! that many; more is whole nodes, `ceil(g / 8)` of them with 8 GPUs each (a
//! 12-GPU job holds 16, as it would on a real 8-GPU fleet).

use std::io::BufRead;
use std::path::Path;

/// GPUs of one simulated node, the unit trace jobs are packed into.
pub const NODE_GPUS: u32 = 8;

/// One job of the trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceJob {
    pub job_id: String,
    /// `cluster01`..`cluster10` (stands in for a tenant).
    pub cluster: String,
    /// Seconds since the trace began.
    pub submit_s: u64,
    pub gpus: u32,
    pub runtime_s: u64,
}

/// How many nodes and GPUs per node a job of `gpus` GPUs asks for.
pub fn shape_for(gpus: u32) -> (u32, u32) {
    if gpus <= NODE_GPUS {
        (1, gpus)
    } else {
        (gpus.div_ceil(NODE_GPUS), NODE_GPUS)
    }
}

/// Why the trace could not be read.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("cannot read the trace {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path} line {line}: {reason}")]
    Bad {
        path: String,
        line: usize,
        reason: String,
    },
}

/// Reads the trace at `path`, keeping jobs of `cluster` (all when `None`),
/// at most `limit` of them, in submit order.
pub fn read_itp(
    path: &Path,
    cluster: Option<&str>,
    limit: Option<usize>,
) -> Result<Vec<TraceJob>, TraceError> {
    let shown = path.display().to_string();
    let file = std::fs::File::open(path).map_err(|source| TraceError::Io {
        path: shown.clone(),
        source,
    })?;
    let mut jobs = Vec::new();
    let mut columns: Option<Columns> = None;
    for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.map_err(|source| TraceError::Io {
            path: shown.clone(),
            source,
        })?;
        let bad = |reason: String| TraceError::Bad {
            path: shown.clone(),
            line: i + 1,
            reason,
        };
        if line.trim().is_empty() {
            continue;
        }
        let Some(cols) = &columns else {
            columns = Some(Columns::from_header(&line).map_err(bad)?);
            continue;
        };
        let job = cols.parse(&line).map_err(bad)?;
        if cluster.is_some_and(|c| c != job.cluster) {
            continue;
        }
        jobs.push(job);
        if limit.is_some_and(|l| jobs.len() >= l) {
            break;
        }
    }
    jobs.sort_by_key(|j| j.submit_s);
    Ok(jobs)
}

/// Positions of the columns we read, from the header.
struct Columns {
    job_id: usize,
    cluster: usize,
    submit: usize,
    gpus: usize,
    runtime: usize,
    count: usize,
}

impl Columns {
    fn from_header(line: &str) -> Result<Columns, String> {
        let names: Vec<&str> = line.split(',').map(str::trim).collect();
        let find = |name: &str| {
            names
                .iter()
                .position(|n| *n == name)
                .ok_or_else(|| format!("the header has no `{name}` column (is this the ITP CSV?)"))
        };
        Ok(Columns {
            job_id: find("job_id")?,
            cluster: find("cluster")?,
            submit: find("submit_time_s")?,
            gpus: find("num_gpus")?,
            runtime: find("runtime_s")?,
            count: names.len(),
        })
    }

    fn parse(&self, line: &str) -> Result<TraceJob, String> {
        let f: Vec<&str> = line.split(',').map(str::trim).collect();
        if f.len() != self.count {
            return Err(format!("{} fields, the header has {}", f.len(), self.count));
        }
        let num = |i: usize, what: &str| {
            f[i].parse::<u64>()
                .map_err(|_| format!("{what} {:?} is not a whole number", f[i]))
        };
        let gpus = num(self.gpus, "num_gpus")?;
        Ok(TraceJob {
            job_id: f[self.job_id].to_string(),
            cluster: f[self.cluster].to_string(),
            submit_s: num(self.submit, "submit_time_s")?,
            gpus: u32::try_from(gpus).map_err(|_| format!("num_gpus {gpus} is too large"))?,
            runtime_s: num(self.runtime, "runtime_s")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_pack_gpus_into_whole_8_gpu_nodes() {
        assert_eq!(shape_for(0), (1, 0));
        assert_eq!(shape_for(1), (1, 1));
        assert_eq!(shape_for(8), (1, 8));
        assert_eq!(shape_for(12), (2, 8));
        assert_eq!(shape_for(16), (2, 8));
        assert_eq!(shape_for(64), (8, 8));
    }

    #[test]
    fn reads_filters_limits_and_sorts() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.csv");
        std::fs::write(
            &path,
            "job_id,cluster,submit_time_s,num_gpus,runtime_s,min_nodes_8gpu\n\
             a,cluster04,20,8,100,1\n\
             b,cluster01,5,1,10,1\n\
             c,cluster04,10,16,3600,2\n\n\
             d,cluster04,30,1,1,1\n",
        )
        .unwrap();
        let all = read_itp(&path, None, None).unwrap();
        let ids: Vec<&str> = all.iter().map(|j| j.job_id.as_str()).collect();
        assert_eq!(ids, ["b", "c", "a", "d"]);
        let c4 = read_itp(&path, Some("cluster04"), Some(2)).unwrap();
        assert_eq!(c4.len(), 2);
        assert_eq!(
            c4[0],
            TraceJob {
                job_id: "c".into(),
                cluster: "cluster04".into(),
                submit_s: 10,
                gpus: 16,
                runtime_s: 3600
            }
        );
    }

    #[test]
    fn bad_lines_name_the_line_and_field() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.csv");
        std::fs::write(
            &path,
            "job_id,cluster,submit_time_s,num_gpus,runtime_s\na,c,1,x,2\n",
        )
        .unwrap();
        let err = read_itp(&path, None, None).unwrap_err().to_string();
        assert!(err.contains("line 2") && err.contains("num_gpus"), "{err}");
        std::fs::write(&path, "id,when\n").unwrap();
        let err = read_itp(&path, None, None).unwrap_err().to_string();
        assert!(err.contains("job_id"), "{err}");
        let err = read_itp(&dir.path().join("none"), None, None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("cannot read"), "{err}");
    }

    #[test]
    fn the_shipped_trace_parses() {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/traces/itp/itp_all_clusters.csv");
        if !path.exists() {
            eprintln!("NOT RUN: {} is not here", path.display());
            return;
        }
        let jobs = read_itp(&path, Some("cluster04"), None).unwrap();
        assert_eq!(jobs.len(), 15_802, "the README's count for cluster04");
        assert_eq!(jobs.iter().filter(|j| j.gpus > 8).count(), 442);
    }
}
