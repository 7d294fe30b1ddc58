//! GPUs in container jobs, on a real OCI runtime (crun): through the CDI
//! spec files of a node (`[agent.containers] cdi_spec_dirs`; here specs
//! naming fake device files and a fake driver directory), a job's container
//! gets its own GPUs' device nodes, mounts and variables and nothing of the
//! others'; MIG slice jobs see their instances' `MIG-` UUIDs in
//! `CUDA_VISIBLE_DEVICES` and `NVIDIA_VISIBLE_DEVICES`, as bare jobs do.
//! CI runs as root with crun and busybox-static (`.ci/run`).

mod common;
mod images;

use std::path::Path;

use common::{
    cli_as, ensure_user, require_root, shared_tempdir, stderr, Agent, AgentHw, Server, TestUser,
};
use images::{read, rootfs, vars, IMAGE_NAME, LONG};

/// A CDI spec (YAML, as `nvidia-ctk cdi generate` writes it) naming each of
/// `names` as a device whose node is a plain file holding the name, plus a
/// driver directory mounted for all and a variable; with `hook`, a
/// createContainer hook as nvidia-ctk's (here `true`).
fn write_spec(dir: &Path, names: &[String], hook: bool) {
    let devs = dir.join("devs");
    std::fs::create_dir_all(&devs).unwrap();
    let driver = dir.join("driver");
    std::fs::create_dir_all(&driver).unwrap();
    std::fs::write(driver.join("version"), "fake-driver-535\n").unwrap();
    let mut text = String::from("---\ncdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n");
    for (i, name) in names.iter().enumerate() {
        let file = devs.join(format!("dev{i}"));
        std::fs::write(&file, format!("{name}\n")).unwrap();
        text.push_str(&format!(
            "- name: \"{name}\"\n  containerEdits:\n    deviceNodes:\n    - path: /dev/cdi-gpu{i}\n      hostPath: {}\n",
            file.display()
        ));
    }
    text.push_str(&format!(
        "containerEdits:\n  env:\n  - CDI_DRIVER=yes\n  mounts:\n  - hostPath: {}\n    containerPath: /usr/lib/fake-driver\n    options: [ro, nosuid, nodev, bind]\n",
        driver.display()
    ));
    if hook {
        text.push_str(
            "  hooks:\n  - hookName: createContainer\n    path: /bin/true\n    args: [\"true\"]\n",
        );
    }
    let specs = dir.join("cdi");
    std::fs::create_dir_all(&specs).unwrap();
    std::fs::write(specs.join("nvidia.yaml"), text).unwrap();
}

/// What the container sees of its GPUs, as `NAME=value` lines.
const PROBE: &str = "grep ^NAME= /etc/os-release; echo CVD=$CUDA_VISIBLE_DEVICES; \
                     echo NVD=$NVIDIA_VISIBLE_DEVICES; echo CDI=$CDI_DRIVER; \
                     echo DRIVER=$(cat /usr/lib/fake-driver/version); \
                     echo DEVS=$(cat /dev/cdi-gpu* | sort | tr '\\n' ' '); \
                     echo MAP=$(cat /proc/self/uid_map)";

/// The probe's answers, from a job `user` submitted.
fn run_probe(
    server: &Server,
    user: &TestUser,
    out: &Path,
    image: &Path,
    gpus: &str,
) -> Vec<(String, String)> {
    let args = [
        "submit",
        "--parsable",
        "--gpus-per-node",
        gpus,
        "--container-image",
        image.to_str().unwrap(),
        "-D",
        out.to_str().unwrap(),
        "--",
        "sh",
        "-c",
        PROBE,
    ];
    let submitted = cli_as(user, &server.socket, &args);
    assert!(submitted.status.success(), "{}", stderr(&submitted));
    let id = String::from_utf8_lossy(&submitted.stdout)
        .trim()
        .to_string();
    let job = server.wait_job(&id, "COMPLETED", LONG);
    assert_eq!(job["exit_code"], 0, "{job}");
    let text = read(&out.join(format!("gpuq-{id}.out")));
    vars(&text).into_iter().collect()
}

fn get<'a>(v: &'a [(String, String)], key: &str) -> &'a str {
    v.iter()
        .find(|(k, _)| k == key)
        .map_or("", |(_, x)| x.as_str())
}

#[test]
fn cdi_gives_a_container_its_own_gpus_and_mig_jobs_see_their_instances() {
    if !require_root("cdi_gives_a_container_its_own_gpus") {
        return;
    }
    let dir = shared_tempdir();
    let image = rootfs(dir.path());
    let server = Server::bootstrap(&dir.path().join("server"));
    let token = server.ok(&["token", "create"]).trim().to_string();
    let out = dir.path().join("out");
    std::fs::create_dir_all(&out).unwrap();
    let alice = ensure_user("gpuqt-alice");
    nix::unistd::chown(&out, Some(alice.uid.into()), Some(alice.gid.into())).unwrap();
    let words = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");

    // n1: four whole GPUs, a CDI spec naming them by index.
    let n1 = dir.path().join("n1");
    write_spec(
        &n1,
        &(0..4).map(|i| i.to_string()).collect::<Vec<_>>(),
        false,
    );
    let extra = |node: &Path| {
        format!(
            "[agent.containers]\ncdi_spec_dirs = [\"{}\"]\npull_tool = \"\"\n",
            node.join("cdi").display()
        )
    };
    let _a1 = Agent::start_with(&server, &n1, "n1", 4, &token, &extra(&n1));
    let table = server.ok(&["nodes"]);
    let at = table.lines().next().unwrap().find("CONTAINERS").unwrap();
    let row = table.lines().find(|l| l.starts_with("n1 ")).unwrap();
    assert_eq!(
        row[at..].split_whitespace().next(),
        Some("crun+rootless+cdi"),
        "{table}"
    );
    // Alice's job: crun runs rootless, and binds the GPUs' nodes and the
    // driver's files in as well.
    let v = run_probe(&server, &alice, &out, &image, "2");
    assert_eq!(
        words(get(&v, "MAP")),
        format!("{0} {0} 1", alice.uid),
        "{v:?}"
    );
    assert_eq!(get(&v, "NAME"), format!("\"{IMAGE_NAME}\""), "{v:?}");
    let cvd = get(&v, "CVD").to_string();
    assert_eq!(cvd.split(',').count(), 2, "{v:?}");
    // Its two GPUs' device files, named as CUDA_VISIBLE_DEVICES names them,
    // and none of the other two; the spec's mount and variable.
    let mut want: Vec<&str> = cvd.split(',').collect();
    want.sort();
    assert_eq!(get(&v, "DEVS").trim(), want.join(" "), "{v:?}");
    assert_eq!(get(&v, "NVD"), cvd, "{v:?}");
    assert_eq!(get(&v, "CDI"), "yes", "{v:?}");
    assert_eq!(get(&v, "DRIVER"), "fake-driver-535", "{v:?}");

    // n2: GPU 0 in seven MIG instances, GPU 1 whole; the spec names the
    // instances by their MIG UUIDs (as the node reports them).
    let n2 = dir.path().join("n2");
    std::fs::create_dir_all(n2.join("cdi")).unwrap();
    let hw = AgentHw {
        gpus: 2,
        mig: r#"mig_per_gpu = ["1g.10gb:7"]"#,
        ..AgentHw::default()
    };
    let _a2 = Agent::start_hw(&server, &n2, "n2", hw, &token, &extra(&n2), None);
    let nodes: serde_json::Value = serde_json::from_str(&server.ok(&["nodes", "--json"])).unwrap();
    let node = nodes
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["name"] == "n2")
        .unwrap();
    let uuids: Vec<String> = node
        .to_string()
        .split('"')
        .filter(|s| s.starts_with("MIG-"))
        .map(str::to_string)
        .collect();
    assert_eq!(uuids.len(), 7, "{node}");
    // The whole GPU by index too, as CUDA_VISIBLE_DEVICES names it.
    let mut names = uuids.clone();
    names.extend((0..8).map(|i| i.to_string()));
    write_spec(&n2, &names, true);
    // Its spec has a hook (nvidia-ctk's write into the image's files): the
    // runtime runs as root for it.
    let v = run_probe(&server, &alice, &out, &image, "1g.10gb:1");
    assert_eq!(words(get(&v, "MAP")), format!("0 0 {}", u32::MAX), "{v:?}");
    let cvd = get(&v, "CVD");
    assert!(uuids.iter().any(|u| u == cvd), "{v:?} {uuids:?}");
    assert_eq!(get(&v, "NVD"), cvd, "{v:?}");
    assert_eq!(get(&v, "DEVS").trim(), cvd, "only its instance: {v:?}");
}
