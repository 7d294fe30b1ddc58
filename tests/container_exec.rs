//! `gpuq exec` (and `srun --overlap`) into a job that runs in a container
//! image, on a real OCI runtime (crun): the command runs in the running
//! container (the image's files, the job's user and environment), its
//! output, stdin and exit code come back as a bare exec's, on pipes or a
//! terminal; an exec into a container that has ended is refused. CI runs
//! as root with crun and busybox-static (`.ci/run`).

mod common;
mod images;

use common::{
    cli_as, cli_with_input, ensure_user, gpuq_command, require_root, shared_tempdir, stderr,
    stdout, Cluster,
};
use images::{layout, read, rootfs, vars, IMAGE_NAME, LONG};

#[test]
fn exec_runs_in_the_jobs_container_as_its_user_and_returns_its_status() {
    if !require_root("exec_runs_in_the_jobs_container") {
        return;
    }
    let dir = shared_tempdir();
    let root = rootfs(dir.path());
    let image = layout(dir.path(), &root);
    let c = Cluster::start(dir.path(), 1, 8);
    let sock = &c.server.socket;
    let alice = ensure_user("gpuqt-alice");
    let work = dir.path().join("alice");
    std::fs::create_dir_all(&work).unwrap();
    nix::unistd::chown(&work, Some(alice.uid.into()), Some(alice.gid.into())).unwrap();
    let w = work.to_str().unwrap();
    let out = cli_as(
        &alice,
        sock,
        &[
            "submit",
            "--parsable",
            "--gpus-per-node",
            "2",
            "--container-image",
            image.to_str().unwrap(),
            "-D",
            w,
            "--",
            "sh",
            "-c",
            "echo in-the-task > mark; env > task.env; touch ready; exec sleep 300",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let id = stdout(&out).trim().to_string();
    common::wait_for("the job's container to run", LONG, || {
        work.join("ready").exists()
    });

    // Alice's exec sees the image, her uid, the job's environment and
    // working directory, and the container's own writable layer.
    let probe = "cat /etc/os-release; echo UID=$(id -u); echo GID=$(id -g); \
                 echo CVD=$CUDA_VISIBLE_DEVICES; echo JOB=$GPUQ_JOB_ID; echo PWD=$(pwd); \
                 echo MARK=$(cat mark); echo PATH=$PATH; \
                 test -e /usr/bin/crun && echo HOST=visible; echo to-stderr >&2";
    let out = cli_as(&alice, sock, &["exec", &id, "--", "sh", "-c", probe]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v = vars(&stdout(&out));
    assert_eq!(v["NAME"], format!("\"{IMAGE_NAME}\""), "{v:?}");
    assert_eq!(v["UID"], alice.uid.to_string(), "{v:?}");
    assert_eq!(v["GID"], alice.gid.to_string(), "{v:?}");
    assert_eq!(v["CVD"], "0,1", "{v:?}");
    assert_eq!(v["JOB"], id, "{v:?}");
    assert_eq!(v["PWD"], w, "{v:?}");
    assert_eq!(v["MARK"], "in-the-task", "{v:?}");
    let task_env = vars(&read(&work.join("task.env")));
    assert_eq!(v["PATH"], task_env["PATH"], "the task's PATH (the image's)");
    assert!(!v.contains_key("HOST"), "the host's files are out of sight");
    assert_eq!(stderr(&out), "to-stderr\n");

    // Its exit code, its stdin, and a command the image does not have.
    let failed = cli_as(&alice, sock, &["exec", &id, "--", "sh", "-c", "exit 7"]);
    assert_eq!(failed.status.code(), Some(7), "{}", stderr(&failed));
    let echoed = cli_with_input(sock, &["exec", &id, "--", "cat"], "typed in\n");
    assert_eq!(stdout(&echoed), "typed in\n", "{}", stderr(&echoed));
    let missing = cli_as(&alice, sock, &["exec", &id, "--", "no-such-command-here"]);
    assert!(!missing.status.success());
    assert!(
        stderr(&missing).contains("no-such-command-here"),
        "{}",
        stderr(&missing)
    );

    // srun --overlap inside the allocation routes to the same exec.
    let out = cli_as(
        &alice,
        sock,
        &[
            "slurm",
            "srun",
            "--jobid",
            &id,
            "--overlap",
            "sh",
            "-c",
            "grep ^NAME= /etc/os-release; id -u",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains(IMAGE_NAME) && text.contains(&alice.uid.to_string()),
        "{text}"
    );

    // On a terminal: a shell in the container, whose exit is the exec's.
    let mut cmd = gpuq_command();
    cmd.args(["exec", &id, "--pty", "--", "sh", "-i"])
        .env("GPUQ_SOCKET", sock)
        .env("TERM", "xterm")
        .env("PS1", "in-container$ ");
    let mut t = common::pty::Terminal::spawn(cmd, 30, 100);
    t.send("[ -t 0 ] && echo tty-$((20+1)) $TERM; grep -c gpuq-test /etc/os-release\n");
    let shown = t.expect("tty-21 xterm", LONG);
    assert!(shown.contains("tty-21 xterm"), "{shown}");
    // The container's terminal (the runtime's own, so that the shell leads
    // its session and Ctrl-C reaches what it runs) has the client's size.
    t.send("echo size-$(stty size | tr ' ' x)\n");
    t.expect("size-30x100", LONG);
    // A resize reaches it too (the shim passes it on to the runtime's).
    t.resize(40, 120);
    std::thread::sleep(std::time::Duration::from_millis(300));
    t.send("echo size-$(stty size | tr ' ' x)\n");
    t.expect("size-40x120", LONG);
    // Ctrl-C reaches the command in the container; the shell lives on.
    t.send("sleep 600\n");
    std::thread::sleep(std::time::Duration::from_millis(300));
    t.send("\x03");
    t.send("echo interrupted-$((40+2))\n");
    t.expect("interrupted-42", LONG);
    t.send("exit 3\n");
    assert_eq!(t.wait(LONG).code(), Some(3), "{}", t.screen());

    // The job ran on, untouched; once it has ended, an exec is refused.
    assert_eq!(c.job(&id)["state"], "RUNNING");
    c.server.ok(&["cancel", &id]);
    c.wait_state(&id, "CANCELLED", LONG);
    let out = cli_as(&alice, sock, &["exec", &id, "--", "true"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let said = stderr(&out);
    assert!(said.contains(&id) && said.contains("CANCELLED"), "{said}");
}
