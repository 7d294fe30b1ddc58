//! Registry credentials for pulls: the node's auth file
//! (`[agent.containers] registry_auth_file`) with the user's own over it
//! per registry, read as the user (the job's `REGISTRY_AUTH_FILE`, else
//! what `podman login` or `docker login` wrote in their home), and, where
//! the user's file names a credential helper for the image's registry
//! (docker's `credHelpers`, `credsStore`), that helper's answer, asked as
//! the user. The merged file is root's, in the task's directory, for the
//! pull tool only (`image_tools::pull`).

use std::fs::{self, File};
use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::image_tools::find_tool;
use super::task::{hostname, Pull};

/// The most bytes of an auth file read.
const AUTH_FILE_LIMIT: u64 = 1 << 20;

/// Where a user's registry credentials are: the job's `REGISTRY_AUTH_FILE`
/// (podman's and skopeo's variable), else what `podman login` and `docker
/// login` write in the home directory. `true`: named by the user, so it
/// must be there.
pub fn user_auth_files(env: &[(String, String)], home: Option<&Path>) -> Vec<(PathBuf, bool)> {
    if let Some((_, f)) = env.iter().rev().find(|(k, _)| k == "REGISTRY_AUTH_FILE") {
        return vec![(PathBuf::from(f), true)];
    }
    home.map(|h| {
        vec![
            (h.join(".config/containers/auth.json"), false),
            (h.join(".docker/config.json"), false),
        ]
    })
    .unwrap_or_default()
}

/// Runs a docker credential helper for a registry: given the helper's
/// name (`pass` for `docker-credential-pass`), the registry's entry of an
/// auth file, or `None` where it has no credentials for it.
pub type Helper<'a> = &'a dyn Fn(&str) -> Result<Option<serde_json::Value>, String>;

impl Pull {
    /// These settings with the user's credentials (the first of `files`
    /// that `open`, as the user, finds) over the node's, per registry, in
    /// a file of their own at `to` (root's, 0600) for the pull tool.
    /// Where the user's file has no entry for `registry` but names a
    /// credential helper for it (`credHelpers`, else `credsStore`, as
    /// docker's config does), `helper` asks it. Unchanged when the user has
    /// none. Errors name the file and the fix.
    pub fn with_user_auth(
        &self,
        files: &[(PathBuf, bool)],
        open: &dyn Fn(&Path) -> io::Result<File>,
        registry: &str,
        helper: Helper<'_>,
        to: &Path,
    ) -> Result<Pull, String> {
        let mut user = None;
        for (path, named) in files {
            match open(path) {
                Ok(f) => {
                    let mut file = read_auth_file(f, path)?;
                    if !file.auths.contains_key(registry) {
                        if let Some(name) = file.helper_for(registry) {
                            let found = helper(&name).map_err(|e| {
                                format!(
                                    "{e} (the credential helper {path} names)",
                                    path = path.display()
                                )
                            })?;
                            if let Some(entry) = found {
                                file.auths.insert(registry.to_string(), entry);
                            }
                        }
                    }
                    user = Some((path, file.auths));
                    break;
                }
                Err(e) if *named => {
                    return Err(format!(
                        "REGISTRY_AUTH_FILE {}: {e}; give a file you can read, as `podman \
                         login --authfile FILE REGISTRY` writes it",
                        path.display()
                    ))
                }
                Err(_) => {}
            }
        }
        let Some((path, user)) = user else {
            return Ok(self.clone());
        };
        let node = match &self.auth_file {
            Some(node) => File::open(node)
                .map_err(|e| format!("cannot read [agent.containers] registry_auth_file: {e}"))
                .and_then(|f| read_auth_file(f, node))?,
            None => AuthFile::default(),
        };
        let mut auths = node.auths;
        // The node's helpers stay (the pull tool runs them, as root) for the
        // registries the user gives nothing for: a helper goes before an
        // entry for the same registry.
        let mut helpers = node.helpers;
        helpers.retain(|r, _| !user.contains_key(r));
        auths.extend(user);
        let text =
            serde_json::to_vec(&serde_json::json!({ "auths": auths, "credHelpers": helpers }))
                .map_err(|e| e.to_string())?;
        let written = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(to)
            .and_then(|mut f| io::Write::write_all(&mut f, &text));
        written.map_err(|e| format!("cannot write {}: {e}", to.display()))?;
        tracing::debug!(from = %path.display(), "the user's registry credentials are used");
        Ok(Pull {
            auth_file: Some(to.to_path_buf()),
            ..self.clone()
        })
    }
}

/// An auth file as docker and podman write it: entries per registry, and
/// credential helpers per registry (`credHelpers`) and for all of them
/// (`credsStore`, docker's).
#[derive(Default)]
struct AuthFile {
    auths: serde_json::Map<String, serde_json::Value>,
    helpers: serde_json::Map<String, serde_json::Value>,
    store: Option<String>,
}

impl AuthFile {
    /// The helper this file names for `registry`.
    fn helper_for(&self, registry: &str) -> Option<String> {
        let named = self.helpers.get(registry).and_then(|h| h.as_str());
        named
            .map(str::to_string)
            .or_else(|| self.store.clone())
            .filter(|h| !h.is_empty())
    }
}

/// Reads an auth file (`{"auths": {"REGISTRY": {...}}, "credHelpers":
/// {...}, "credsStore": "..."}`).
fn read_auth_file(f: File, path: &Path) -> Result<AuthFile, String> {
    let mut text = String::new();
    f.take(AUTH_FILE_LIMIT)
        .read_to_string(&mut text)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let bad = |why: String| {
        format!(
            "{} is not a registry auth file ({why}); it holds {{\"auths\": {{\"REGISTRY\": \
             {{\"auth\": \"BASE64(USER:PASSWORD)\"}}}}}}, as `podman login` writes it",
            path.display()
        )
    };
    let value: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    let map = |key: &str| match value.get(key) {
        Some(serde_json::Value::Object(m)) => Ok(m.clone()),
        None => Ok(serde_json::Map::new()),
        Some(_) => Err(bad(format!("\"{key}\" is not an object"))),
    };
    let store = match value.get("credsStore") {
        None => None,
        Some(serde_json::Value::String(s)) => Some(s.clone()),
        Some(_) => return Err(bad("\"credsStore\" is not a string".into())),
    };
    Ok(AuthFile {
        auths: map("auths")?,
        helpers: map("credHelpers")?,
        store,
    })
}

/// How long a credential helper may take.
const HELPER_LIMIT: std::time::Duration = std::time::Duration::from_secs(30);

/// A credential helper's answer to `get` (its stdout), as the registry's
/// entry of an auth file; `None` where it has no credentials for it.
fn helper_entry(out: &[u8]) -> Result<serde_json::Value, String> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "PascalCase")]
    struct Answer {
        username: String,
        secret: String,
    }
    let a: Answer = serde_json::from_slice(out)
        .map_err(|e| format!("its answer is not {{\"Username\": ..., \"Secret\": ...}} ({e})"))?;
    use base64::Engine as _;
    // Docker's convention: a user named `<token>` is an identity token.
    Ok(match a.username.as_str() {
        "<token>" => serde_json::json!({ "identitytoken": a.secret }),
        _ => serde_json::json!({
            "auth": base64::engine::general_purpose::STANDARD
                .encode(format!("{}:{}", a.username, a.secret)),
        }),
    })
}

/// Runs `docker-credential-NAME get` for `registry` as the user `uid`/`gid`
/// (groups dropped), found in the job's PATH (`env`) then the node's, with
/// the job's environment and `home`, as docker runs it on a login node.
pub fn run_helper(
    name: &str,
    registry: &str,
    env: &[(String, String)],
    home: &Path,
    (uid, gid): (u32, u32),
) -> Result<Option<serde_json::Value>, String> {
    use std::os::unix::process::CommandExt;
    let exe_name = format!("docker-credential-{name}");
    let job_path = env
        .iter()
        .rev()
        .find(|(k, _)| k == "PATH")
        .map_or("", |(_, v)| v.as_str());
    let node_path = std::env::var("PATH").unwrap_or_default();
    let exe = find_tool(&exe_name, &format!("{job_path}:{node_path}")).ok_or_else(|| {
        format!(
            "the registry credential helper {exe_name} is not on the job's PATH or node {}'s: \
             install it there, or log in to {registry} with an auth file (`podman login \
             --authfile FILE {registry}`, then REGISTRY_AUTH_FILE=FILE)",
            hostname()
        )
    })?;
    // Docker Hub's credentials are kept under its old address.
    let server = match registry {
        "docker.io" => "https://index.docker.io/v1/",
        other => other,
    };
    let mut child = Command::new(&exe)
        .arg("get")
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .env("HOME", home)
        .current_dir("/")
        .uid(uid)
        .gid(gid)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", exe.display()))?;
    if let Some(mut stdin) = child.stdin.take() {
        let _ = io::Write::write_all(&mut stdin, server.as_bytes());
    }
    let deadline = std::time::Instant::now() + HELPER_LIMIT;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(10))
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "the registry credential helper {} gave no answer for {registry} within {} s",
                    exe.display(),
                    HELPER_LIMIT.as_secs()
                ));
            }
        }
    };
    let read = |r: Option<&mut dyn Read>| {
        let mut bytes = Vec::new();
        if let Some(r) = r {
            let _ = r.take(AUTH_FILE_LIMIT).read_to_end(&mut bytes);
        }
        bytes
    };
    let out = read(child.stdout.as_mut().map(|s| s as &mut dyn Read));
    let err = read(child.stderr.as_mut().map(|s| s as &mut dyn Read));
    let said = String::from_utf8_lossy(if out.is_empty() { &err } else { &out })
        .trim()
        .to_string();
    if !status.success() {
        // What docker's helpers say for a registry they hold nothing for.
        if said.to_lowercase().contains("credentials not found") {
            return Ok(None);
        }
        return Err(format!(
            "the registry credential helper {} failed for {registry}: {said}",
            exe.display()
        ));
    }
    helper_entry(&out)
        .map(Some)
        .map_err(|e| format!("the registry credential helper {}: {e}", exe.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn the_users_credentials_go_over_the_nodes_per_registry() {
        let dir = tempfile::tempdir().unwrap();
        let node = dir.path().join("node.json");
        fs::write(
            &node,
            r#"{"auths": {"a.lan": {"auth": "bm9kZTphYQ=="}, "b.lan": {"auth": "bm9kZTpiYg=="}}}"#,
        )
        .unwrap();
        let mine = dir.path().join("mine.json");
        fs::write(&mine, r#"{"auths": {"b.lan": {"auth": "bWU6Yg=="}}}"#).unwrap();
        let how = Pull {
            tool: Some("/usr/bin/skopeo".into()),
            insecure: Vec::new(),
            auth_file: Some(node.clone()),
        };
        let open = |p: &Path| File::open(p);
        let none =
            |_: &str| -> Result<Option<serde_json::Value>, String> { panic!("no helper is named") };
        let to = dir.path().join("merged.json");
        // The variable wins over the home directory's files.
        let env = [("REGISTRY_AUTH_FILE".to_string(), mine.display().to_string())];
        let files = user_auth_files(&env, Some(Path::new("/home/x")));
        assert_eq!(files, [(mine.clone(), true)]);
        let merged = how
            .with_user_auth(&files, &open, "b.lan", &none, &to)
            .unwrap();
        assert_eq!(merged.auth_file.as_deref(), Some(to.as_path()));
        let v: serde_json::Value = serde_json::from_slice(&fs::read(&to).unwrap()).unwrap();
        assert_eq!(v["auths"]["a.lan"]["auth"], "bm9kZTphYQ==");
        assert_eq!(v["auths"]["b.lan"]["auth"], "bWU6Yg==");
        assert_eq!(fs::metadata(&to).unwrap().mode() & 0o777, 0o600);
        // No file of the user's: the node's settings as they are.
        let home = user_auth_files(&[], Some(dir.path()));
        assert_eq!(home.len(), 2);
        assert_eq!(
            how.with_user_auth(&home, &open, "b.lan", &none, &to)
                .unwrap(),
            how
        );
        // A named file that is missing, or not an auth file, is refused.
        let gone = [(dir.path().join("gone.json"), true)];
        let err = how
            .with_user_auth(&gone, &open, "b.lan", &none, &to)
            .unwrap_err();
        assert!(
            err.contains("REGISTRY_AUTH_FILE") && err.contains("gone.json"),
            "{err}"
        );
        fs::write(&mine, "auths: nope").unwrap();
        let err = how
            .with_user_auth(&files, &open, "b.lan", &none, &to)
            .unwrap_err();
        assert!(err.contains("is not a registry auth file"), "{err}");
    }

    #[test]
    fn a_credential_helper_the_users_file_names_answers_for_its_registry() {
        let dir = tempfile::tempdir().unwrap();
        let node = dir.path().join("node.json");
        fs::write(
            &node,
            r#"{"auths": {"a.lan": {"auth": "bm9kZTphYQ=="}},
                "credHelpers": {"b.lan": "node-helper", "c.lan": "ecr-login"}}"#,
        )
        .unwrap();
        let mine = dir.path().join("mine.json");
        fs::write(
            &mine,
            r#"{"auths": {"a.lan": {}}, "credsStore": "pass",
                "credHelpers": {"b.lan": "gcloud"}}"#,
        )
        .unwrap();
        let how = Pull {
            tool: Some("/usr/bin/skopeo".into()),
            insecure: Vec::new(),
            auth_file: Some(node.clone()),
        };
        let open = |p: &Path| File::open(p);
        let files = [(mine.clone(), true)];
        let to = dir.path().join("merged.json");
        let asked = std::cell::RefCell::new(Vec::new());
        let helper = |name: &str| -> Result<Option<serde_json::Value>, String> {
            asked.borrow_mut().push(name.to_string());
            Ok(Some(helper_entry(
                br#"{"ServerURL": "b.lan", "Username": "me", "Secret": "s"}"#,
            )?))
        };
        // credHelpers names b.lan's helper; its answer is b.lan's entry, and
        // the node's helper for b.lan goes (the user's credentials win).
        how.with_user_auth(&files, &open, "b.lan", &helper, &to)
            .unwrap();
        assert_eq!(*asked.borrow(), ["gcloud"]);
        let v: serde_json::Value = serde_json::from_slice(&fs::read(&to).unwrap()).unwrap();
        assert_eq!(v["auths"]["b.lan"]["auth"], "bWU6cw==");
        assert_eq!(v["credHelpers"], serde_json::json!({"c.lan": "ecr-login"}));
        // Another registry: credsStore's helper.
        how.with_user_auth(&files, &open, "d.lan", &helper, &to)
            .unwrap();
        assert_eq!(asked.borrow().last().map(String::as_str), Some("pass"));
        // An entry in the file goes before any helper.
        asked.borrow_mut().clear();
        how.with_user_auth(&files, &open, "a.lan", &helper, &to)
            .unwrap();
        assert!(asked.borrow().is_empty());
        // A helper that fails fails the pull, naming the file.
        let failing = |_: &str| -> Result<Option<serde_json::Value>, String> {
            Err("the registry credential helper x failed".into())
        };
        let err = how
            .with_user_auth(&files, &open, "b.lan", &failing, &to)
            .unwrap_err();
        assert!(err.contains("failed") && err.contains("mine.json"), "{err}");
        // Identity tokens, and answers that are not one.
        assert_eq!(
            helper_entry(br#"{"Username": "<token>", "Secret": "tok"}"#).unwrap(),
            serde_json::json!({"identitytoken": "tok"})
        );
        assert!(helper_entry(b"credentials not found").is_err());
    }

    #[test]
    fn a_helper_runs_as_the_user_from_the_jobs_path_and_not_found_is_no_credentials() {
        if !nix::unistd::geteuid().is_root() {
            // Switching users needs root; CI runs the tests as root.
            assert!(std::env::var_os("CI").is_none(), "CI runs as root");
            eprintln!("NOT RUN: the credential helper test needs root");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        fs::create_dir_all(&bin).unwrap();
        let script = bin.join("docker-credential-gpuqtest");
        fs::write(
            &script,
            "#!/bin/sh\nread server\ncase $server in\n\
             reg.lan) echo \"{\\\"Username\\\": \\\"u$(id -u)\\\", \\\"Secret\\\": \\\"$HOME\\\"}\";;\n\
             *) echo 'credentials not found in native keychain'; exit 1;;\nesac\n",
        )
        .unwrap();
        fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        let env = [(
            "PATH".to_string(),
            format!("{}:/usr/bin:/bin", bin.display()),
        )];
        let home = Path::new("/");
        let got = run_helper("gpuqtest", "reg.lan", &env, home, (65534, 65534)).unwrap();
        use base64::Engine as _;
        let basic = base64::engine::general_purpose::STANDARD.encode("u65534:/");
        assert_eq!(got, Some(serde_json::json!({ "auth": basic })));
        assert_eq!(
            run_helper("gpuqtest", "other.lan", &env, home, (65534, 65534)).unwrap(),
            None
        );
        let err = run_helper("missing", "reg.lan", &env, home, (65534, 65534)).unwrap_err();
        assert!(err.contains("docker-credential-missing"), "{err}");
    }
}
