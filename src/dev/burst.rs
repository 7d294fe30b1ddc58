//! `gpuq dev --burst N`: a node group (`burst`, up to N nodes) whose resume
//! command starts more simulated nodes, so the whole scale-out loop runs on
//! one machine. Each node it is asked for is a separate `gpuq agent`
//! process with fake GPUs that joins the dev server with a token, as a
//! booted cloud machine's agent would; its suspend command stops it. The
//! scripts sit in `DIR/burst/` for anyone who wants to see what a site's
//! would do.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::model::policy_change::{NodeGroupPatch, Op, PolicyChange};
use crate::model::Role;
use crate::net::proto::{ApiRequest, ApiResponse, Caller};
use crate::server::Api;

/// The group's name; its nodes are `burst-001`, `burst-002`, ...
pub const GROUP: &str = "burst";

/// The directory of the group's scripts and nodes.
fn burst_dir(dir: &Path) -> PathBuf {
    dir.join(GROUP)
}

/// Declares the group: writes its scripts, makes a join token for its
/// nodes, and adds it to the policy.
pub async fn declare(
    api: &Api,
    admin: Caller,
    dir: &Path,
    join: SocketAddr,
    gpus: u32,
    max: u32,
) -> anyhow::Result<()> {
    if !nix::unistd::Uid::effective().is_root() {
        anyhow::bail!(
            "--burst starts each burst node as its own `gpuq agent` process, which runs jobs \
             as their users and so needs root; run gpuq dev as root, or leave out --burst"
        );
    }
    let token = match api
        .handle(
            admin.clone(),
            ApiRequest::TokenCreate {
                role: Role::Agent,
                ttl_secs: 7 * 24 * 3600,
                uses: None,
            },
        )
        .await
    {
        ApiResponse::Token { token, .. } => token,
        other => anyhow::bail!("no join token for the burst nodes: {other:?}"),
    };
    let d = burst_dir(dir);
    crate::owner_only::ensure_dir(&d, crate::owner_only::DirMode::Traverse)?;
    let exe = std::env::current_exe().context("cannot find the gpuq binary")?;
    let resume = d.join("resume.sh");
    let suspend = d.join("suspend.sh");
    write_script(&resume, &resume_script(&d, &exe, join, &token, gpus))?;
    write_script(&suspend, &suspend_script(&d))?;
    let change = PolicyChange::NodeGroup {
        op: Op::Add,
        name: GROUP.into(),
        patch: NodeGroupPatch {
            gpus: Some(gpus),
            cpus: Some(64),
            memory_mb: Some(512 * 1024),
            max: Some(max),
            resume_command: Some(format!("sh {}", resume.display())),
            suspend_command: Some(format!("sh {}", suspend.display())),
            idle_secs: Some(60),
            resume_timeout_secs: Some(60),
            demand_secs: Some(5),
            ..Default::default()
        },
    };
    match api.handle(admin, ApiRequest::Admin { change }).await {
        ApiResponse::PolicyUpdated { .. } => Ok(()),
        other => anyhow::bail!("could not declare the burst group: {other:?}"),
    }
}

/// Stops every burst node still running (when `gpuq dev` stops).
pub fn stop_all(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(burst_dir(dir)) else {
        return;
    };
    for e in entries.flatten() {
        let Ok(text) = std::fs::read_to_string(e.path().join("pid")) else {
            continue;
        };
        if let Ok(pid) = text.trim().parse::<i32>() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
    }
}

fn write_script(path: &Path, text: &str) -> anyhow::Result<()> {
    std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))
}

/// Starts one agent per name in `GPUQ_NODE_NAMES`, each in `d/NAME/`.
fn resume_script(d: &Path, exe: &Path, join: SocketAddr, token: &str, gpus: u32) -> String {
    let d = d.display();
    let exe = exe.display();
    format!(
        r#"# gpuq dev's resume command: one simulated node per name asked for.
for n in $GPUQ_NODE_NAMES; do
  mkdir -p "{d}/$n"
  cat > "{d}/$n/agent.toml" <<EOT
[agent]
node_name = "$n"
data_dir = "{d}/$n/data"
socket = "{d}/$n/agent.sock"
http_listen = "127.0.0.1:0"
allow_root = true
kill_grace_secs = 2
cpus = 64
memory_mb = 524288
gpus = {{ fake = {{ count = {gpus} }} }}
EOT
  setsid "{exe}" agent --config "{d}/$n/agent.toml" --join {join} --token {token} \
    </dev/null >/dev/null 2>>"{d}/$n/agent.log" &
  echo $! > "{d}/$n/pid"
done
"#
    )
}

/// Stops the agents of the names in `GPUQ_NODE_NAMES`.
fn suspend_script(d: &Path) -> String {
    let d = d.display();
    format!(
        r#"# gpuq dev's suspend command: stop the simulated nodes named.
for n in $GPUQ_NODE_NAMES; do
  [ -f "{d}/$n/pid" ] && kill "$(cat "{d}/$n/pid")" 2>/dev/null
  rm -f "{d}/$n/pid"
done
exit 0
"#
    )
}
