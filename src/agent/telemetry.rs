//! The agent's HTTP page: its GPUs' readings from the backend, each
//! labelled with the job and user holding the GPU, and the same mapping
//! written where dcgm-exporter reads it.
//!
//! Who holds a GPU comes from the desired set the leader last sent (a task
//! names its job, user and the node's GPUs it runs on); it is kept across a
//! lost connection, when the tasks keep running. dcgm-exporter's HPC job
//! mapping (`--hpc-job-mapping-dir`) is a directory with one file per GPU
//! index holding the ids of the jobs on it, one per line; it labels its
//! metrics `hpc_job` from them. A file is rewritten only when its job
//! changes, by a rename so the exporter never reads half of one, and
//! removed when its GPU is free.
//!
//! Each job's use of its GPUs is sampled every [`SAMPLE_EVERY`] (mean
//! utilisation and memory, time since a GPU of it was last busy) and sent
//! to the leader with the heartbeat, for `gpuq show` and the idle flag.
//!
//! Simulated GPUs take their load from the tasks: a job whose environment
//! has `GPUQ_FAKE_GPU_UTIL=N` (0-100) shows its GPUs N% busy, any other job
//! (a `sleep` holding GPUs) shows them idle, so the idle-GPU view can be
//! tried on `gpuq dev`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::gpu::GpuBackend;
use crate::http::exposition::{Exposition, Kind};
use crate::model::{GpuInfo, GpuUse, JobId};
use crate::net::agent_proto::DesiredTask;

/// The job variable that sets a simulated GPU's utilisation (percent).
pub const FAKE_UTIL_VAR: &str = "GPUQ_FAKE_GPU_UTIL";

/// How often the jobs' GPUs are sampled.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(2);

/// A GPU above this utilisation (percent) counts as busy.
const BUSY_PCT: f64 = 5.0;

/// One job's samples on this node.
#[derive(Clone, Debug)]
struct JobSamples {
    samples: u64,
    util_sum: f64,
    memory_sum: f64,
    first: Instant,
    last_busy: Option<Instant>,
}

/// The job and user holding one GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    pub job: JobId,
    pub user: String,
    /// `GPUQ_FAKE_GPU_UTIL` of the job, when set and valid.
    pub fake_util: Option<u8>,
}

/// Which job holds each GPU of this node, by GPU index.
#[derive(Debug, Default)]
pub struct GpuHolders {
    by_gpu: Mutex<BTreeMap<u32, Holder>>,
    /// Where dcgm-exporter's job-mapping files go, and what they hold now.
    dcgm_dir: Option<PathBuf>,
    written: Mutex<BTreeMap<u32, JobId>>,
    /// Each held job's samples, while it holds GPUs here.
    samples: Mutex<BTreeMap<JobId, JobSamples>>,
}

impl GpuHolders {
    /// Holders that also write dcgm-exporter's mapping into `dir`.
    pub fn with_dcgm_dir(dir: Option<PathBuf>) -> GpuHolders {
        GpuHolders {
            dcgm_dir: dir,
            ..Default::default()
        }
    }

    /// Takes the holders from a desired set, passes the simulated load to
    /// `gpus`, and updates the dcgm-exporter files.
    pub fn update<'a>(
        &self,
        tasks: impl IntoIterator<Item = &'a DesiredTask>,
        gpus: Option<&dyn GpuBackend>,
    ) {
        let mut by_gpu = BTreeMap::new();
        for t in tasks {
            let fake_util = t
                .env
                .iter()
                .rev()
                .find(|(k, _)| k == FAKE_UTIL_VAR)
                .and_then(|(_, v)| v.trim().parse::<u8>().ok())
                .map(|v| v.min(100));
            for gpu in &t.gpus {
                by_gpu.entry(*gpu).or_insert_with(|| Holder {
                    job: t.key.job,
                    user: t.user.clone(),
                    fake_util,
                });
            }
        }
        if let Some(backend) = gpus {
            let load = by_gpu
                .iter()
                .filter_map(|(gpu, h)| h.fake_util.map(|u| (*gpu, u)))
                .collect();
            backend.simulate_load(&load);
        }
        if let Some(dir) = &self.dcgm_dir {
            let jobs: BTreeMap<u32, JobId> = by_gpu.iter().map(|(g, h)| (*g, h.job)).collect();
            let mut written = self.written.lock().unwrap_or_else(|e| e.into_inner());
            if let Err(e) = write_dcgm_map(dir, &written, &jobs) {
                tracing::warn!(dir = %dir.display(), "cannot write dcgm-exporter's job mapping: {e}");
            }
            *written = jobs;
        }
        *self.by_gpu.lock().unwrap_or_else(|e| e.into_inner()) = by_gpu;
    }

    /// Adds one sample of each held GPU to its job's figures.
    pub fn sample(&self, readings: &[super::gpu::GpuTelemetry]) {
        let by_gpu = self.by_gpu.lock().unwrap_or_else(|e| e.into_inner());
        let mut samples = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        samples.retain(|job, _| by_gpu.values().any(|h| h.job == *job));
        let now = Instant::now();
        for t in readings {
            let Some(h) = by_gpu.get(&t.index) else {
                continue;
            };
            let s = samples.entry(h.job).or_insert(JobSamples {
                samples: 0,
                util_sum: 0.0,
                memory_sum: 0.0,
                first: now,
                last_busy: None,
            });
            s.samples += 1;
            s.util_sum += t.utilization_pct;
            if t.memory_total_mb > 0 {
                s.memory_sum += 100.0 * t.memory_used_mb as f64 / t.memory_total_mb as f64;
            }
            if t.utilization_pct > BUSY_PCT {
                s.last_busy = Some(now);
            }
        }
    }

    /// Each held job's use so far, for the leader.
    pub fn use_report(&self) -> Vec<(JobId, GpuUse)> {
        let samples = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        samples
            .iter()
            .filter(|(_, s)| s.samples > 0)
            .map(|(job, s)| {
                let n = s.samples as f64;
                let use_ = GpuUse {
                    samples: s.samples,
                    mean_util_pct: (s.util_sum / n).round() as u32,
                    mean_memory_pct: (s.memory_sum / n).round() as u32,
                    idle_secs: s.last_busy.unwrap_or(s.first).elapsed().as_secs(),
                    idle: false,
                };
                (*job, use_)
            })
            .collect()
    }

    /// The holder of `gpu`, if any.
    pub fn holder(&self, gpu: u32) -> Option<Holder> {
        self.by_gpu
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&gpu)
            .cloned()
    }
}

/// Makes the files in `dir` say `now`, given that they said `before`.
fn write_dcgm_map(
    dir: &Path,
    before: &BTreeMap<u32, JobId>,
    now: &BTreeMap<u32, JobId>,
) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    for (gpu, job) in now {
        if before.get(gpu) == Some(job) && dir.join(gpu.to_string()).exists() {
            continue;
        }
        let tmp = dir.join(format!(".{gpu}.tmp"));
        std::fs::write(&tmp, format!("{job}\n"))?;
        std::fs::rename(&tmp, dir.join(gpu.to_string()))?;
    }
    for gpu in before.keys().filter(|g| !now.contains_key(g)) {
        match std::fs::remove_file(dir.join(gpu.to_string())) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    Ok(())
}

/// Samples the GPUs into `holders` every [`SAMPLE_EVERY`] until `shutdown`.
pub async fn sample_loop(
    gpus: Arc<dyn GpuBackend>,
    holders: Arc<GpuHolders>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(SAMPLE_EVERY);
    loop {
        tokio::select! {
            _ = tick.tick() => holders.sample(&gpus.telemetry()),
            _ = shutdown.changed() => return,
        }
    }
}

/// The agent's HTTP site: its node's GPUs.
pub struct AgentSite {
    pub node: String,
    pub gpus: Option<Arc<dyn GpuBackend>>,
    pub holders: Arc<GpuHolders>,
}

#[async_trait::async_trait]
impl crate::http::Site for AgentSite {
    fn metrics(&self) -> String {
        let (infos, readings) = match &self.gpus {
            Some(b) => (b.gpus().unwrap_or_default(), b.telemetry()),
            None => (Vec::new(), Vec::new()),
        };
        render(&self.node, &infos, &readings, &self.holders)
    }
}

fn as_refs<'a>(l: &'a [(&'static str, String); 6]) -> [(&'static str, &'a str); 6] {
    l.each_ref().map(|(k, v)| (*k, v.as_str()))
}

/// The page: one family per reading, one sample per GPU.
pub fn render(
    node: &str,
    infos: &[GpuInfo],
    readings: &[super::gpu::GpuTelemetry],
    holders: &GpuHolders,
) -> String {
    let labels: Vec<[(&'static str, String); 6]> = infos
        .iter()
        .map(|g| {
            let h = holders.holder(g.index);
            [
                ("node", node.to_string()),
                ("gpu", g.index.to_string()),
                ("uuid", g.uuid.clone()),
                ("model", g.model.clone()),
                (
                    "job",
                    h.as_ref().map(|h| h.job.to_string()).unwrap_or_default(),
                ),
                ("user", h.map(|h| h.user).unwrap_or_default()),
            ]
        })
        .collect();
    let mut e = Exposition::new();
    let mut f = e.family(
        "gpuq_gpu_healthy",
        "1 while the GPU is healthy, 0 once a critical fault (XID, ECC, off the bus) was seen.",
        Kind::Gauge,
    );
    for (g, l) in infos.iter().zip(&labels) {
        f.sample(&as_refs(l), f64::from(u8::from(g.healthy)));
    }
    type Pick = fn(&super::gpu::GpuTelemetry) -> Option<f64>;
    let families: [(&str, &str, Kind, Pick); 7] = [
        (
            "gpuq_gpu_utilization_ratio",
            "Share of the last sample period a kernel ran on the GPU (0-1).",
            Kind::Gauge,
            |t| Some(t.utilization_pct / 100.0),
        ),
        (
            "gpuq_gpu_memory_used_bytes",
            "GPU memory in use.",
            Kind::Gauge,
            |t| Some((t.memory_used_mb << 20) as f64),
        ),
        (
            "gpuq_gpu_memory_total_bytes",
            "GPU memory in all.",
            Kind::Gauge,
            |t| Some((t.memory_total_mb << 20) as f64),
        ),
        (
            "gpuq_gpu_temperature_celsius",
            "GPU core temperature.",
            Kind::Gauge,
            |t| t.temperature_c,
        ),
        (
            "gpuq_gpu_power_watts",
            "GPU power draw.",
            Kind::Gauge,
            |t| t.power_w,
        ),
        (
            "gpuq_gpu_xid_errors_total",
            "XID errors the agent saw on the GPU since it started.",
            Kind::Counter,
            |t| Some(t.xid_errors as f64),
        ),
        (
            "gpuq_gpu_ecc_uncorrectable_errors_total",
            "Uncorrectable ECC errors the agent saw on the GPU since it started.",
            Kind::Counter,
            |t| Some(t.ecc_uncorrectable_errors as f64),
        ),
    ];
    for (name, help, kind, pick) in families {
        let mut f = e.family(name, help, kind);
        for t in readings {
            let Some(pos) = infos.iter().position(|g| g.index == t.index) else {
                continue;
            };
            if let Some(v) = pick(t) {
                f.sample(&as_refs(&labels[pos]), v);
            }
        }
    }
    e.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dcgm_map_follows_the_holders() {
        let dir = tempfile::tempdir().unwrap();
        let map = dir.path().join("map");
        let one: BTreeMap<u32, JobId> = [(0, JobId(7)), (3, JobId(9))].into();
        write_dcgm_map(&map, &BTreeMap::new(), &one).unwrap();
        assert_eq!(std::fs::read_to_string(map.join("0")).unwrap(), "7\n");
        assert_eq!(std::fs::read_to_string(map.join("3")).unwrap(), "9\n");
        let two: BTreeMap<u32, JobId> = [(3, JobId(11))].into();
        write_dcgm_map(&map, &one, &two).unwrap();
        assert!(!map.join("0").exists());
        assert_eq!(std::fs::read_to_string(map.join("3")).unwrap(), "11\n");
    }
}
