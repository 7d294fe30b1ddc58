//! `gpuq exec` (and `srun --overlap`, `srun --pty` beside a task) into a
//! task that runs in a container: the exec's shim runs the task's OCI
//! runtime as `RUNTIME --root <task dir>/runtime exec --process FILE
//! gpuq-<task key>` in the foreground, in the task's cgroup, with the exec's
//! pipes or terminal as its stdio. The runtime enters the container's
//! namespaces and root and runs the command there as the task's own
//! process would run (`process.json`: the task's user, groups,
//! environment, working directory and capabilities, from the bundle the
//! task's shim wrote), passes its stdio through, and exits with the
//! command's status, so the exec's output, stdin and exit code stream back
//! as a bare exec's do. A command killed by a signal comes back as the
//! runtime reports it: exit code 128 + the signal.
//!
//! The runtime writes its errors (a command not found in the image, a
//! container that has just ended) to the exec's stderr, where the client
//! sees them.

use std::fs;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use serde_json::{json, Value};

use super::container::Launch;
use super::task::{Beside, Identity, TaskContainer, TaskSpec};

/// The process file the exec hands the runtime: the exec's directory's name
/// and this, in the task's runtime state directory.
const PROCESS_FILE: &str = "process.json";
/// Where the runtime writes the pid of an exec on a terminal: the exec's
/// directory's name and this, in the task's runtime state directory.
const EXEC_PID_FILE: &str = "exec.pid";
/// The most of a bundle's `config.json` read.
const CONFIG_LIMIT: u64 = 16 << 20;

/// Prepares the runtime's `exec` of `argv` in the container of the task
/// `beside` names (the exec's `spec` is that task's, with the exec's
/// command, environment and streams). Errors are sentences for the user.
pub(super) fn prepare_exec(
    dir: &Path,
    spec: &TaskSpec,
    c: &TaskContainer,
    beside: &Beside,
    identity: &Identity,
    argv: &[String],
) -> Result<Launch, String> {
    let config_file = beside.dir.join("bundle").join("config.json");
    // The user's own file where the runtime is rootless: read as such.
    let config: Value = super::task::read_untrusted(&config_file, CONFIG_LIMIT)
        .ok()
        .and_then(|text| serde_json::from_str(&text).ok())
        .ok_or_else(|| {
            format!(
                "task {} has no container to run the command in (its {} is unreadable): it \
                 has not started its container yet, or it has ended",
                spec.key,
                config_file.display()
            )
        })?;
    let tty = spec.io == crate::model::TaskIo::Pty;
    let term = spec
        .env
        .iter()
        .rev()
        .find(|(k, _)| k == "TERM")
        .map(|(_, v)| v.clone())
        .filter(|_| spec.io.is_interactive());
    let process = exec_process(&config["process"], argv, tty, term);
    // A rootless container's runtime runs as its user here too: as the
    // task's own shim decided (`task.json`, root's), never as the bundle or
    // the state, which are the user's then, would say.
    let rootless = c.rootless && identity.uid != 0;
    // The files go in the runtime's state directory, the user's own where
    // it is rootless: made new (no file or link the user put there is
    // followed), and handed to the user.
    let state = super::container::state_dir(&beside.dir);
    let exec_name = dir
        .file_name()
        .map_or("exec".into(), |n| n.to_string_lossy());
    let file = state.join(format!("{exec_name}.{PROCESS_FILE}"));
    let pid_file = state.join(format!("{exec_name}.{EXEC_PID_FILE}"));
    let text = serde_json::to_vec_pretty(&process).map_err(|e| e.to_string())?;
    let written = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&file)
        .and_then(|mut f| {
            use std::io::Write;
            f.write_all(&text)?;
            match rootless {
                true => std::os::unix::fs::fchown(&f, Some(identity.uid), Some(identity.gid)),
                false => Ok(()),
            }
        });
    written.map_err(|e| format!("cannot write {}: {e}", file.display()))?;
    let show = |p: &Path| p.to_string_lossy().into_owned();
    let mut runtime_argv = vec![show(&c.runtime), "--root".into(), show(&state)];
    if super::container::is_crun(&c.runtime) {
        runtime_argv.push("--cgroup-manager=disabled".into());
    }
    runtime_argv.extend(["exec".into(), "--process".into(), show(&file)]);
    if tty {
        // Where the shim finds the command, to pass resizes to its terminal.
        runtime_argv.extend(["--pid-file".into(), show(&pid_file)]);
    }
    runtime_argv.push(format!("gpuq-{}", spec.key));
    Ok(Launch::exec(runtime_argv, pid_file, rootless))
}

/// The task's process (from its bundle) running `argv` instead, with the
/// exec's `TERM` where it is interactive. On a terminal (`tty`) the runtime
/// makes a terminal of its own in the container and relays it to the
/// exec's (as crun does for an exec in the foreground), so the
/// command leads a session there: job control works and Ctrl-C reaches it.
/// The runtime takes the size of the exec's terminal when it starts; later
/// resizes reach it from the shim (`Streams::follow_terminal`), since crun
/// passes none on. On pipes, the pipes pass through.
fn exec_process(task: &Value, argv: &[String], tty: bool, term: Option<String>) -> Value {
    let mut p = match task {
        Value::Object(_) => task.clone(),
        _ => json!({}),
    };
    // An apptainer image's task started through its exec action; so do
    // its execs, to get the image's environment.
    let sif = super::image_sif::SIF_EXEC;
    p["args"] = match task["args"][0].as_str() == Some(sif) {
        true => json!(std::iter::once(sif)
            .chain(argv.iter().map(String::as_str))
            .collect::<Vec<_>>()),
        false => json!(argv),
    };
    p["terminal"] = json!(tty);
    if let Some(map) = p.as_object_mut() {
        map.remove("consoleSize");
    }
    if let Some(term) = term {
        let mut env: Vec<Value> = p["env"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|v| !v.as_str().is_some_and(|s| s.starts_with("TERM=")))
            .collect();
        env.push(json!(format!("TERM={term}")));
        p["env"] = json!(env);
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exec_runs_as_the_task_with_its_own_command_and_term() {
        let task = json!({
            "args": ["sh", "-c", "sleep 600"],
            "terminal": false,
            "user": {"uid": 1234, "gid": 1234, "additionalGids": [1234, 27]},
            "env": ["PATH=/bin", "TERM=dumb", "RANK=1"],
            "cwd": "/work",
            "noNewPrivileges": true,
        });
        let argv = vec!["cat".to_string(), "/etc/os-release".to_string()];
        let p = exec_process(&task, &argv, true, Some("xterm-256color".into()));
        assert_eq!(p["args"], json!(["cat", "/etc/os-release"]));
        assert_eq!(p["user"], task["user"]);
        assert_eq!(p["cwd"], "/work");
        assert_eq!(p["noNewPrivileges"], true);
        assert_eq!(
            p["env"],
            json!(["PATH=/bin", "RANK=1", "TERM=xterm-256color"])
        );
        // Pipes: the task's environment as it is.
        let p = exec_process(&task, &argv, false, None);
        assert_eq!(p["env"], task["env"]);
        assert_eq!(p["terminal"], false);
        // An apptainer image's task starts through its exec action; so
        // does an exec beside it.
        let sif = json!({"args": ["/.singularity.d/actions/exec", "sh", "-c", "x"]});
        let p = exec_process(&sif, &argv, false, None);
        assert_eq!(
            p["args"],
            json!(["/.singularity.d/actions/exec", "cat", "/etc/os-release"])
        );
    }
}
