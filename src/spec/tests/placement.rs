//! Tests of the placement flags: `--gpus`, `--gpu-type`, `--constraint`,
//! `--nodelist`, `--exclude`, `--topology`, from argv and directives to the
//! spec, and the mistakes they refuse.

use clap::error::ErrorKind;
use tempfile::TempDir;

use super::{parse_err, spec_err, spec_ok, write};
use crate::model::{Placement, TopologyRequirement};

fn names(list: &[&str]) -> Vec<String> {
    list.iter().map(|n| n.to_string()).collect()
}

#[test]
fn placement_flags_reach_the_spec() {
    let dir = TempDir::new().unwrap();
    let s = spec_ok(
        &[
            "--gpus-per-node",
            "8",
            "-N",
            "2",
            "--gpu-type",
            "H100",
            "-C",
            "ib,nvme",
            "-w",
            "n[1-4]",
            "-x",
            "gpu[07-08]",
            "--topology",
            "leaf",
            "--",
            "true",
        ],
        dir.path(),
    );
    assert_eq!(
        s.placement,
        Placement {
            gpu_type: Some("H100".into()),
            features: names(&["ib", "nvme"]),
            nodelist: names(&["n1", "n2", "n3", "n4"]),
            exclude: names(&["gpu07", "gpu08"]),
            topology: Some(TopologyRequirement::Leaf),
            reservation: None,
            gpu_slice: None,
            elastic: None,
        }
    );
    assert_eq!((s.nodes, s.gpus_per_node, s.total_gpus), (2, 8, None));

    let s = spec_ok(
        &["--constraint", "ib&nvme", "--topology", "Spine", "true"],
        dir.path(),
    );
    assert_eq!(s.placement.features, names(&["ib", "nvme"]));
    assert_eq!(s.placement.topology, Some(TopologyRequirement::Spine));
    assert!(spec_ok(&["true"], dir.path()).placement.is_anywhere());
}

#[test]
fn the_gpu_type_comes_from_any_gpu_flag() {
    let dir = TempDir::new().unwrap();
    let gpu_type = |argv: &[&str]| spec_ok(argv, dir.path()).placement.gpu_type;
    assert_eq!(
        gpu_type(&["--gres", "gpu:h100:8", "true"]),
        Some("h100".into())
    );
    assert_eq!(
        gpu_type(&["--gpus-per-node", "a100:2", "true"]),
        Some("a100".into())
    );
    assert_eq!(gpu_type(&["-G", "l40s:4", "true"]), Some("l40s".into()));
    assert_eq!(
        gpu_type(&["--gres", "gpu:h100:8", "--gpu-type", "H100", "true"]),
        Some("H100".into()),
        "the same type twice, in any case, is fine"
    );
    assert_eq!(gpu_type(&["--gres", "gpu:8", "true"]), None);
}

#[test]
fn gpus_in_total_leave_the_shape_to_the_scheduler() {
    let dir = TempDir::new().unwrap();
    let s = spec_ok(&["--gpus", "16", "true"], dir.path());
    assert_eq!((s.total_gpus, s.nodes, s.gpus_per_node), (Some(16), 1, 16));
    assert_eq!(s.total_gpus(), 16);
    assert_eq!(s.check_invariants(), Ok(()));
    // With --nodes, the shape is fixed here.
    let s = spec_ok(&["--gpus", "16", "-N", "4", "true"], dir.path());
    assert_eq!((s.total_gpus, s.nodes, s.gpus_per_node), (None, 4, 4));
    assert_eq!(
        spec_err(&["--gpus", "12", "-N", "5", "true"], dir.path()),
        "--gpus 12 does not split evenly over --nodes 5; ask for a multiple of 5 GPUs, or \
         leave --nodes out and let the scheduler choose the shape"
    );
    for conflicting in [["--gpus-per-node", "8"], ["--gres", "gpu:8"]] {
        let mut argv = vec!["--gpus", "8"];
        argv.extend(conflicting);
        argv.push("true");
        assert_eq!(
            parse_err(&argv).kind(),
            ErrorKind::ArgumentConflict,
            "{argv:?}"
        );
    }
    let err = parse_err(&["--gpus", "0", "true"]).to_string();
    assert!(err.contains("asks for no GPUs"), "{err}");
    let err = parse_err(&["--gpus", "lots", "true"]).to_string();
    assert!(err.contains("16 or h100:16"), "{err}");
}

#[test]
fn placement_mistakes_are_refused_with_the_fix() {
    let dir = TempDir::new().unwrap();
    let rows: [(&[&str], &str); 5] = [
        (
            &["--gres", "gpu:a100:8", "--gpu-type", "h100", "true"],
            "--gpu-type h100 and the GPU request's type a100 differ; give the type once",
        ),
        (
            &["--gpu-type", "h100", "true"],
            "--gpu-type h100 is set but no GPUs are asked for; add --gpus-per-node N or --gpus N",
        ),
        (
            &["-w", "n[1-3]", "-x", "n2", "true"],
            "node n2 is both in --nodelist and in --exclude; name it in one of them",
        ),
        (
            &["-w", "n[1-2]", "-N", "3", "true"],
            "--nodelist names 2 nodes but the job asks for 3 nodes; list at least as many \
             nodes as --nodes",
        ),
        (
            &["-w", "n1", "-N", "2", "true"],
            "--nodelist names 1 node but the job asks for 2 nodes",
        ),
    ];
    for (argv, want) in rows {
        let got = spec_err(argv, dir.path());
        assert!(got.starts_with(want), "{argv:?}: {got}");
    }
}

#[test]
fn bad_values_are_refused_by_the_parser() {
    let rows: [(&[&str], &str); 9] = [
        (&["--nodelist", "n[1-4", "true"], "'[' without its ']'"),
        (
            &["--nodelist", "n[4-1]", "true"],
            "range \"4-1\" runs backwards",
        ),
        (&["--exclude", "n1,,n2", "true"], "empty name"),
        (
            &["--exclude", "n[x]", "true"],
            "range \"x\" is not a number",
        ),
        (
            &["--topology", "rack", "true"],
            "unknown topology level \"rack\"; use leaf (all nodes under one leaf switch) or \
             spine (all under one spine)",
        ),
        (
            &["--constraint", "ib|nvme", "true"],
            "uses '|'; only features that are all required",
        ),
        (
            &["--constraint", "ib,,nvme", "true"],
            "has an empty feature",
        ),
        (&["--constraint", "[ib*2]", "true"], "uses '['"),
        (&["--gpu-type", "h 100", "true"], "is not one word"),
    ];
    for (argv, want) in rows {
        let err = parse_err(argv);
        assert_eq!(err.kind(), ErrorKind::ValueValidation, "{argv:?}");
        assert!(err.to_string().contains(want), "{argv:?}: {err}");
    }
}

#[test]
fn placement_directives_merge_like_the_other_flags() {
    let dir = TempDir::new().unwrap();
    let script = write(
        &dir,
        "job.sh",
        "#!/bin/sh\n\
         #SBATCH --nodelist=n[1-8] --constraint=ib\n\
         #GPUQ --gpus-per-node 8 --topology spine\n\
         #GPUQ --topology leaf\n\
         hostname\n",
    );
    let s = spec_ok(&[&script], dir.path());
    assert_eq!(s.placement.nodelist.len(), 8);
    assert_eq!(s.placement.features, names(&["ib"]));
    assert_eq!(s.placement.topology, Some(TopologyRequirement::Leaf));
    assert_eq!(s.gpus_per_node, 8);

    // Flags win; --gpus on the command line replaces the directive's GPUs.
    let s = spec_ok(&["--gpus", "32", "-x", "n9", &script], dir.path());
    assert_eq!((s.total_gpus, s.gpus_per_node), (Some(32), 32));
    assert_eq!(s.placement.exclude, names(&["n9"]));

    let bad = write(&dir, "bad.sh", "#!/bin/sh\n#SBATCH -w n[1-\n");
    let msg = spec_err(&[&bad], dir.path());
    assert!(
        msg.starts_with("script bad.sh line 2:") && msg.contains("'[' without its ']'"),
        "{msg}"
    );

    let script = write(&dir, "x.sh", "#!/bin/sh\n#SBATCH --exclude=n[1-2]\n");
    let s = spec_ok(&["-w", "n[3-4]", &script], dir.path());
    assert_eq!(
        (s.placement.nodelist.len(), s.placement.exclude.len()),
        (2, 2)
    );
}
