//! Submitting jobs: one (`Submit`) or many in one call and one log entry
//! (`SubmitMany`, all or none). The checks that need no log entry run here
//! (the spec's invariants, who may lower `--nice`, whether any node set could
//! ever hold the job); apply re-checks the spec and resolves the policy.

use crate::clock::now_ms;
use crate::model::{BatchEntryError, JobSpec, NodeInventory};
use crate::net::proto::{ApiResponse, Caller, ErrorKind, MAX_SUBMIT_MANY};
use crate::state::{Command, CommandResult};

use super::Api;

impl Api {
    pub(super) async fn submit(&self, caller: Caller, spec: Box<JobSpec>) -> ApiResponse {
        // Checked against the registered nodes where they are, under the
        // state's read lock: a copy of every inventory per submit cost more
        // than the check, and grew with the fleet.
        let checked = {
            let s = self.state();
            check(&caller, &spec, s.nodes.values().map(|n| &n.inventory))
        };
        if let Err((kind, why)) = checked {
            return ApiResponse::error(kind, why);
        }
        let cmd = Command::Submit {
            user: caller.user,
            spec,
            now: now_ms(),
        };
        match self.write(cmd).await {
            Ok(CommandResult::Submitted { id }) => ApiResponse::Submitted { id },
            Ok(other) => self.unexpected(other),
            Err(resp) => resp,
        }
    }

    pub(super) async fn submit_many(&self, caller: Caller, specs: Vec<JobSpec>) -> ApiResponse {
        if specs.is_empty() {
            return ApiResponse::error(ErrorKind::BadInput, "nothing to submit: no jobs given");
        }
        if specs.len() > MAX_SUBMIT_MANY {
            return ApiResponse::error(
                ErrorKind::BadInput,
                format!(
                    "{} jobs in one bulk submit; at most {MAX_SUBMIT_MANY} fit one call: \
                     split the input, or use --array for many runs of one script",
                    specs.len()
                ),
            );
        }
        if let Some(why) = crate::net::proto::bulk_too_big(&specs) {
            return ApiResponse::error(ErrorKind::BadInput, why);
        }
        // A copy, checked outside the lock: a bulk submit checks up to
        // 10,000 specs, and apply must not wait for them.
        let inventories = self.inventories();
        for (i, spec) in specs.iter().enumerate() {
            if let Err((kind, why)) = check(&caller, spec, &inventories) {
                return ApiResponse::batch_entry_error(kind, BatchEntryError { index: i, why });
            }
        }
        let n = specs.len();
        let cmd = Command::SubmitMany {
            user: caller.user,
            specs,
            now: now_ms(),
        };
        match self.write_alone(cmd).await {
            Ok(CommandResult::SubmittedMany { ids }) if ids.len() == n => {
                ApiResponse::SubmittedMany { ids }
            }
            Ok(other) => self.unexpected(other),
            Err(resp) => resp,
        }
    }

    /// The registered nodes' inventories, for the feasibility check.
    fn inventories(&self) -> Vec<NodeInventory> {
        let s = self.state();
        s.nodes.values().map(|n| n.inventory.clone()).collect()
    }
}

/// The checks of one spec before it is proposed.
pub(super) fn check<'a>(
    caller: &Caller,
    spec: &JobSpec,
    inventories: impl IntoIterator<Item = &'a NodeInventory>,
) -> Result<(), (ErrorKind, String)> {
    spec.check_invariants()
        .map_err(|why| (ErrorKind::BadInput, why))?;
    if spec.nice < 0 && !caller.admin {
        return Err((
            ErrorKind::Forbidden,
            format!(
                "--nice {} raises priority, which needs an admin; use 0 or more",
                spec.nice
            ),
        ));
    }
    let inventories: Vec<&NodeInventory> = inventories.into_iter().collect();
    let oci = crate::model::OCI_FEATURE;
    let with_runtime = |n: &&NodeInventory| n.features.iter().any(|f| f == oci);
    if spec.container.is_some() && !inventories.is_empty() && !inventories.iter().any(with_runtime)
    {
        return Err((
            ErrorKind::BadInput,
            format!(
                "--container-image: none of the {} nodes has an OCI runtime (crun or runc; \
                 an agent that finds one gives its node the feature `{oci}`): install one on \
                 the nodes, or run without a container",
                inventories.len()
            ),
        ));
    }
    let pull = crate::model::OCI_PULL_FEATURE;
    let can_pull = |n: &&NodeInventory| n.features.iter().any(|f| f == pull);
    if let Some(c) = spec.container.as_ref().filter(|c| c.is_registry()) {
        if !inventories.is_empty() && !inventories.iter().any(can_pull) {
            return Err((
                ErrorKind::BadInput,
                format!(
                    "--container-image {}: a registry reference, and none of the {} nodes has \
                     a pull tool (skopeo; an agent that finds it gives its node the feature \
                     `{pull}`): install skopeo on the nodes, or copy the image where they can \
                     read it (skopeo copy {} oci-archive:/shared/images/NAME.tar) and give \
                     that absolute path",
                    c.image,
                    inventories.len(),
                    c.image
                ),
            ));
        }
    }
    feasible(inventories, spec).map_err(|why| (ErrorKind::BadInput, why))
}

/// Refuses at submit a job no registered node set could ever hold. With no
/// nodes registered yet, the job waits instead.
fn feasible<'a>(
    inventories: impl IntoIterator<Item = &'a NodeInventory>,
    spec: &JobSpec,
) -> Result<(), String> {
    let mut inventories = inventories.into_iter().peekable();
    if inventories.peek().is_none() {
        return Ok(());
    }
    crate::sched::feasible(inventories, &crate::sched::PendingJob::of_spec(spec))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::SubmitArgs;

    fn node(features: &[&str]) -> NodeInventory {
        NodeInventory {
            name: "n1".into(),
            gpus: vec![],
            gpu_links: vec![],
            numa: vec![],
            cpus: 8,
            memory_mb: 8192,
            topology: String::new(),
            features: features.iter().map(|f| f.to_string()).collect(),
        }
    }

    #[test]
    fn a_container_job_is_refused_where_no_node_has_a_runtime() {
        let args = SubmitArgs {
            container_image: Some("/img".into()),
            script_or_command: vec!["true".into()],
            ..Default::default()
        };
        let spec = crate::spec::build_spec(&args, &[], std::path::Path::new("/tmp")).unwrap();
        let caller = Caller {
            user: "alice".into(),
            uid: 1000,
            admin: false,
        };
        let bare = node(&[]);
        let (kind, why) = check(&caller, &spec, [&bare, &bare]).unwrap_err();
        assert_eq!(kind, ErrorKind::BadInput);
        assert!(
            why.contains("none of the 2 nodes has an OCI runtime"),
            "{why}"
        );
        let able = node(&[crate::model::OCI_FEATURE]);
        assert_eq!(check(&caller, &spec, [&bare, &able]), Ok(()));
        // No nodes yet: the job waits for some.
        assert_eq!(check(&caller, &spec, []), Ok(()));
    }

    #[test]
    fn a_registry_image_is_refused_where_no_node_can_pull() {
        let args = SubmitArgs {
            container_image: Some("docker://ubuntu:22.04".into()),
            script_or_command: vec!["true".into()],
            ..Default::default()
        };
        let spec = crate::spec::build_spec(&args, &[], std::path::Path::new("/tmp")).unwrap();
        let caller = Caller {
            user: "alice".into(),
            uid: 1000,
            admin: false,
        };
        let runs = node(&[crate::model::OCI_FEATURE]);
        let (kind, why) = check(&caller, &spec, [&runs]).unwrap_err();
        assert_eq!(kind, ErrorKind::BadInput);
        assert!(
            why.contains("docker://ubuntu:22.04") && why.contains("install skopeo"),
            "{why}"
        );
        let pulls = node(&[crate::model::OCI_FEATURE, crate::model::OCI_PULL_FEATURE]);
        assert_eq!(check(&caller, &spec, [&runs, &pulls]), Ok(()));
    }
}
