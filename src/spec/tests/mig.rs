//! MIG slice requests: the three spellings and `#GPUQ` put the profile in
//! the placement (not the GPU type); an unknown profile or none of it is
//! refused naming the fix.

use tempfile::TempDir;

use super::{spec_err, spec_ok, write};

#[test]
fn slice_requests_put_the_profile_in_the_placement() {
    let dir = TempDir::new().unwrap();
    for (argv, per_node, total) in [
        (&["--gpus-per-node", "1g.10gb:2"][..], 2, None),
        (&["--gres", "gpu:1g.10gb:2"][..], 2, None),
        (&["--gres", "gpu:1g.10gb"][..], 1, None),
        (&["--gpus", "3g.40gb:1"][..], 1, Some(1)),
        (
            &["--gpus-per-node", "7G.80GB:1", "--gpu-type", "h100"][..],
            1,
            None,
        ),
    ] {
        let mut full = argv.to_vec();
        full.extend_from_slice(&["--", "true"]);
        let s = spec_ok(&full, dir.path());
        let want = argv[1]
            .trim_start_matches("gpu:")
            .split(':')
            .next()
            .unwrap();
        assert_eq!(
            s.placement.gpu_slice.as_deref(),
            Some(want.to_ascii_lowercase().as_str()),
            "{argv:?}"
        );
        assert_eq!(
            (s.gpus_per_node, s.total_gpus),
            (per_node, total),
            "{argv:?}"
        );
        let gpu_type = argv.contains(&"--gpu-type").then_some("h100");
        assert_eq!(s.placement.gpu_type.as_deref(), gpu_type, "{argv:?}");
    }
    let script = write(
        &dir,
        "job.sh",
        "#!/bin/sh\n#GPUQ --gpus-per-node 2g.20gb:3\n#SBATCH --nodes=2\nnvidia-smi -L\n",
    );
    let s = spec_ok(&[&script], dir.path());
    assert_eq!(s.placement.gpu_slice.as_deref(), Some("2g.20gb"));
    assert_eq!((s.nodes, s.gpus_per_node), (2, 3));
    // A type that is not profile-shaped stays a type.
    let s = spec_ok(&["--gpus-per-node", "h100:2", "--", "true"], dir.path());
    assert_eq!(
        (s.placement.gpu_type.as_deref(), s.placement.gpu_slice),
        (Some("h100"), None)
    );
}

#[test]
fn unknown_profiles_and_empty_slice_requests_are_refused() {
    let dir = TempDir::new().unwrap();
    let err = spec_err(&["--gres", "gpu:1g.7gb:1", "--", "true"], dir.path());
    assert!(
        err.contains("unknown MIG profile \"1g.7gb\"")
            && err.contains("1g.10gb, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb"),
        "{err}"
    );
    let err = spec_err(&["--gpus-per-node", "1g.10gb:0", "--", "true"], dir.path());
    assert!(err.contains("asks for 0 MIG slices of 1g.10gb"), "{err}");
}

#[test]
fn shared_slot_requests_put_shared_in_the_placement() {
    let dir = TempDir::new().unwrap();
    for (argv, per_node) in [
        (&["--gres", "gpu:shared:2"][..], 2),
        (&["--gpus", "Shared:1"][..], 1),
        (&["--gpus-per-node", "shared:3"][..], 3),
    ] {
        let mut full = argv.to_vec();
        full.extend_from_slice(&["--", "true"]);
        let s = spec_ok(&full, dir.path());
        assert_eq!(s.placement.gpu_slice.as_deref(), Some("shared"), "{argv:?}");
        assert_eq!(s.placement.gpu_type, None, "{argv:?}");
        assert_eq!(s.gpus_per_node, per_node, "{argv:?}");
    }
    let script = write(
        &dir,
        "job.sh",
        "#!/bin/sh\n#SBATCH --gres=gpu:shared:1\nnvidia-smi -L\n",
    );
    let s = spec_ok(&[&script], dir.path());
    assert_eq!(s.placement.gpu_slice.as_deref(), Some("shared"));
    let err = spec_err(&["--gpus-per-node", "shared:0", "--", "true"], dir.path());
    assert!(
        err.contains("asks for 0 shared GPU slots; ask for at least 1, e.g. shared:1"),
        "{err}"
    );
}

#[test]
fn an_elastic_job_asking_for_slices_is_refused() {
    let dir = TempDir::new().unwrap();
    for (gpus, what) in [
        ("1g.10gb:1", "MIG slices of 1g.10gb"),
        ("shared:1", "shared GPU slots"),
    ] {
        let err = spec_err(
            &["--nodes", "2-4", "--gpus-per-node", gpus, "--", "true"],
            dir.path(),
        );
        assert!(
            err.contains(&format!(
                "--nodes 2-4 with {what}: an elastic job takes whole GPUs"
            )),
            "{err}"
        );
    }
}
