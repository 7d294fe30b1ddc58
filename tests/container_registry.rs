//! Registry images (`--container-image docker://...`) end to end: a real
//! registry (Debian's docker-registry, the CNCF distribution) on loopback
//! that asks for a password, the test image pushed to it with skopeo, and
//! agents whose `[agent.containers]` name it insecure (plain HTTP) and give
//! one of them the credentials; a user's own credentials on the other.
//! CI runs as root with docker-registry,
//! skopeo and crun installed (`.ci/run`).

mod common;
mod images;

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use base64::Engine;
use common::{cli_as, ensure_user, require_root, shared_tempdir, stderr, Agent, Server};
use images::{layout, read, rootfs, IMAGE_NAME, LONG};

const USER: &str = "gpuq";
const PASSWORD: &str = "s3cret";

/// A registry on loopback; stopped when dropped.
struct Registry {
    child: Child,
    /// `127.0.0.1:PORT`, as image references name it.
    addr: String,
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `name` on PATH, or a failure saying what to install.
fn tool(name: &str) -> PathBuf {
    std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "{name} is missing: install it (apt-get install -y docker-registry skopeo), as \
                 .ci/run does"
            )
        })
}

/// Starts a registry in `dir` whose one user is USER with PASSWORD
/// (htpasswd's bcrypt, made by the C library's crypt(3) through Python).
fn start_registry(dir: &Path) -> Registry {
    let bin = tool("docker-registry");
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let hash = Command::new("python3")
        .args([
            "-W",
            "ignore",
            "-c",
            "import crypt, sys; print(crypt.crypt(sys.argv[1], '$2b$05$gpuqtestsaltgpuqtestsu'))",
            PASSWORD,
        ])
        .output()
        .unwrap();
    let hash = String::from_utf8_lossy(&hash.stdout).trim().to_string();
    assert!(
        hash.starts_with("$2b$"),
        "no bcrypt from crypt(3): {hash:?}"
    );
    std::fs::write(dir.join("htpasswd"), format!("{USER}:{hash}\n")).unwrap();
    let config = dir.join("registry.yml");
    std::fs::write(
        &config,
        format!(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {d}/blobs\n\
             http:\n  addr: {addr}\n  secret: gpuq-test\nauth:\n  htpasswd:\n    realm: gpuq-test\n    \
             path: {d}/htpasswd\n",
            d = dir.display()
        ),
    )
    .unwrap();
    let log = std::fs::File::create(dir.join("registry.log")).unwrap();
    let child = Command::new(bin)
        .args(["serve", config.to_str().unwrap()])
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    let registry = Registry { child, addr };
    common::wait_for("the registry to listen", LONG, || {
        TcpStream::connect(&registry.addr).is_ok()
    });
    registry
}

#[test]
fn a_registry_image_is_pulled_with_the_nodes_credentials_and_cached_by_digest() {
    if !require_root("a_registry_image_is_pulled_with_the_nodes_credentials") {
        return;
    }
    let dir = shared_tempdir();
    let root = rootfs(dir.path());
    let image = layout(dir.path(), &root);
    let skopeo = tool("skopeo");
    let reg_dir = dir.path().join("registry");
    std::fs::create_dir_all(&reg_dir).unwrap();
    let registry = start_registry(&reg_dir);
    let reference = format!("{}/gpuq/busybox:1", registry.addr);
    let push = Command::new(&skopeo)
        .args(["copy", "--quiet", "--dest-tls-verify=false"])
        .arg(format!("--dest-creds={USER}:{PASSWORD}"))
        .arg(format!("oci:{}", image.display()))
        .arg(format!("docker://{reference}"))
        .output()
        .unwrap();
    assert!(push.status.success(), "push: {}", stderr(&push));

    // n1 has the credentials; n2 only knows the registry is plain HTTP.
    let auth = dir.path().join("auth.json");
    let basic = base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{PASSWORD}"));
    std::fs::write(
        &auth,
        format!(
            "{{\"auths\": {{\"{}\": {{\"auth\": \"{basic}\"}}}}}}",
            registry.addr
        ),
    )
    .unwrap();
    let insecure = format!(
        "[agent.containers]\ninsecure_registries = [\"{}\"]\n",
        registry.addr
    );
    let server = Server::bootstrap(&dir.path().join("server"));
    let token = server.ok(&["token", "create"]).trim().to_string();
    let with_creds = format!("{insecure}registry_auth_file = \"{}\"\n", auth.display());
    let n1 = dir.path().join("n1");
    let _a1 = Agent::start_with(&server, &n1, "n1", 8, &token, &with_creds);
    let _a2 = Agent::start_with(&server, &dir.path().join("n2"), "n2", 8, &token, &insecure);
    // Both nodes can pull (skopeo is there): `gpuq nodes` says so.
    let table = server.ok(&["nodes"]);
    assert_eq!(table.matches("crun+rootless+pull").count(), 2, "{table}");

    let out = dir.path().join("out");
    std::fs::create_dir_all(&out).unwrap();
    let submit = |node: &str| {
        server
            .ok(&[
                "submit",
                "--parsable",
                "--nodelist",
                node,
                "--container-image",
                &format!("docker://{reference}"),
                "-o",
                &format!("{}/%j.out", out.display()),
                "--",
                "sh",
                "-c",
                "grep ^NAME= /etc/os-release",
            ])
            .trim()
            .to_string()
    };
    // Two jobs of the image on n1: pulled with n1's credentials, unpacked
    // once (keyed by the manifest's digest), run in the image.
    for _ in 0..2 {
        let id = submit("n1");
        let job = server.wait_job(&id, "COMPLETED", LONG);
        assert_eq!(job["exit_code"], 0, "{job}");
        let said = read(&out.join(format!("{id}.out")));
        assert!(said.contains(IMAGE_NAME), "{said}");
    }
    let unpacks = read(&n1.join("data/images/unpacks.log"));
    assert_eq!(unpacks.lines().count(), 1, "{unpacks}");
    assert!(unpacks.contains(&reference), "{unpacks}");

    // n2 has no credentials: the registry says no, and the job fails with
    // the pull's reason.
    let id = submit("n2");
    let job = server.wait_job(&id, "FAILED", LONG);
    let reason = job["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains(&format!("cannot pull container image docker://{reference}"))
            && (reason.contains("unauthorized") || reason.contains("authentication required")),
        "{reason}"
    );

    // Alice brings her own credentials (podman's REGISTRY_AUTH_FILE), read
    // as her: her job on n2 pulls; a file she cannot read is refused.
    let alice = ensure_user("gpuqt-alice");
    let own = |p: &Path| {
        nix::unistd::chown(p, Some(alice.uid.into()), Some(alice.gid.into())).unwrap();
    };
    own(&out);
    let hers = dir.path().join("alice-auth.json");
    std::fs::copy(&auth, &hers).unwrap();
    own(&hers);
    std::fs::set_permissions(&hers, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    std::fs::set_permissions(&auth, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let as_alice = |file: &Path, more: &str| {
        let o = cli_as(
            &alice,
            &server.socket,
            &[
                "submit",
                "--parsable",
                "--nodelist",
                "n2",
                "--export",
                &format!("ALL,REGISTRY_AUTH_FILE={}{more}", file.display()),
                "--container-image",
                &format!("docker://{reference}"),
                "-o",
                &format!("{}/%j.out", out.display()),
                "--",
                "sh",
                "-c",
                "grep ^NAME= /etc/os-release; id -u",
            ],
        );
        assert!(o.status.success(), "{}", stderr(&o));
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    };
    let id = as_alice(&hers, "");
    let job = server.wait_job(&id, "COMPLETED", LONG);
    assert_eq!(job["exit_code"], 0, "{job}");
    let said = read(&out.join(format!("{id}.out")));
    assert!(
        said.contains(IMAGE_NAME) && said.contains(&alice.uid.to_string()),
        "{said}"
    );
    // The node's file is root's own: naming it gets her nothing.
    let id = as_alice(&auth, "");
    let job = server.wait_job(&id, "FAILED", LONG);
    let reason = job["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("REGISTRY_AUTH_FILE") && reason.contains("denied"),
        "{reason}"
    );

    // Her file may name a credential helper instead (docker's credsStore):
    // it runs as her, from her job's PATH, and its answer is used.
    let bin = dir.path().join("alice-bin");
    std::fs::create_dir_all(&bin).unwrap();
    let helper = bin.join("docker-credential-gpuqtest");
    std::fs::write(
        &helper,
        format!(
            "#!/bin/sh\nread server\n[ \"$server\" = {} ] && [ \"$(id -u)\" = {} ] || \
             {{ echo 'credentials not found in native keychain'; exit 1; }}\n\
             echo '{{\"ServerURL\": \"'$server'\", \"Username\": \"{USER}\", \"Secret\": \"{PASSWORD}\"}}'\n",
            registry.addr, alice.uid
        ),
    )
    .unwrap();
    std::fs::set_permissions(&helper, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let store = dir.path().join("alice-store.json");
    std::fs::write(&store, r#"{"auths": {}, "credsStore": "gpuqtest"}"#).unwrap();
    own(&store);
    let path = format!(",PATH={}:/usr/bin:/bin", bin.display());
    let id = as_alice(&store, &path);
    let job = server.wait_job(&id, "COMPLETED", LONG);
    assert_eq!(job["exit_code"], 0, "{job}");
    // A helper that is nowhere fails the job naming it and the fix.
    std::fs::write(&store, r#"{"auths": {}, "credsStore": "nowhere"}"#).unwrap();
    let id = as_alice(&store, &path);
    let job = server.wait_job(&id, "FAILED", LONG);
    let reason = job["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("docker-credential-nowhere") && reason.contains("podman login"),
        "{reason}"
    );
}
