//! Value parsers for the submit flags that are more than a number: GPU
//! requests (`--gpus-per-node`, `--gres`), `--export` and output patterns.
//! Each is used by clap, so a bad value in a flag or a directive gets the same
//! message.

use crate::model::ExportMode;

/// A GPU request per node, from `--gpus-per-node [TYPE:]N` or `--gres gpu[:TYPE][:N]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuRequest {
    /// The GPU type asked for (`h100` in `gpu:h100:8`); not yet scheduled on.
    pub gpu_type: Option<String>,
    pub count: u32,
}

/// Why a GPU request was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GpuError {
    #[error("GPU count {input:?} is not a number; use N or TYPE:N per node, e.g. 8 or h100:8")]
    BadCount { input: String },
    #[error("GPU request {input:?} has an empty type; use N or TYPE:N, e.g. h100:8")]
    EmptyType { input: String },
    #[error("--gres {input:?} asks for {name:?}; only GPUs are supported: use gpu:N or gpu:TYPE:N, e.g. gpu:8")]
    NotGpu { input: String, name: String },
    #[error("--gres {input:?} names GPUs more than once; give one gpu:N or gpu:TYPE:N")]
    Several { input: String },
}

/// Parses `--gpus-per-node`: `N` or `TYPE:N`.
pub fn parse_gpus_per_node(input: &str) -> Result<GpuRequest, GpuError> {
    let (gpu_type, count) = match input.rsplit_once(':') {
        Some((t, n)) => (Some(t), n),
        None => (None, input),
    };
    request(input, gpu_type, count)
}

/// Parses Slurm's `--gres`: `gpu`, `gpu:N` or `gpu:TYPE:N` (per node).
pub fn parse_gres(input: &str) -> Result<GpuRequest, GpuError> {
    let names = input
        .split(',')
        .map(|item| item.split(':').next().unwrap_or(""));
    if let Some(name) = names.clone().find(|n| *n != "gpu") {
        return Err(GpuError::NotGpu {
            input: input.to_string(),
            name: name.to_string(),
        });
    }
    if names.count() > 1 {
        return Err(GpuError::Several {
            input: input.to_string(),
        });
    }
    let parts: Vec<&str> = input.split(':').collect();
    match parts.as_slice() {
        ["gpu"] => request(input, None, "1"),
        ["gpu", n] if n.bytes().all(|b| b.is_ascii_digit()) => request(input, None, n),
        // Slurm reads `gpu:h100` as one GPU of that type.
        ["gpu", t] => request(input, Some(t), "1"),
        ["gpu", t, n] => request(input, Some(t), n),
        _ => Err(GpuError::BadCount {
            input: input.to_string(),
        }),
    }
}

fn request(input: &str, gpu_type: Option<&str>, count: &str) -> Result<GpuRequest, GpuError> {
    if gpu_type.is_some_and(|t| t.trim().is_empty()) {
        return Err(GpuError::EmptyType {
            input: input.to_string(),
        });
    }
    let count = count
        .trim()
        .parse::<u32>()
        .map_err(|_| GpuError::BadCount {
            input: input.to_string(),
        })?;
    Ok(GpuRequest {
        gpu_type: gpu_type.map(|t| t.trim().to_string()),
        count,
    })
}

/// A parsed `--export`: the base mode and the variables it names, with a value
/// where one was given (`VAR=value`) or `None` to copy the submitter's.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Export {
    pub mode: ExportMode,
    pub vars: Vec<(String, Option<String>)>,
}

/// Why an `--export` value was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("--export {input:?}: {problem}; use ALL, NONE, or VAR,VAR=value,... (ALL,VAR=value adds to ALL)")]
pub struct ExportError {
    pub input: String,
    pub problem: String,
}

/// Parses `--export`: `ALL`, `NONE`, `VAR,VAR=value,...`, `ALL,VAR=value`, `NONE,VAR`.
pub fn parse_export(input: &str) -> Result<Export, ExportError> {
    let fail = |problem: String| ExportError {
        input: input.to_string(),
        problem,
    };
    if input.trim().is_empty() {
        return Err(fail("it is empty".into()));
    }
    let mut export = Export {
        mode: ExportMode::Listed,
        vars: Vec::new(),
    };
    for (i, item) in input.split(',').enumerate() {
        let item = item.trim();
        let keyword = item.to_ascii_uppercase();
        if keyword == "ALL" || keyword == "NONE" {
            if i > 0 {
                return Err(fail(format!("{item} must come first")));
            }
            if keyword == "ALL" {
                export.mode = ExportMode::All;
            }
            continue;
        }
        let (name, value) = match item.split_once('=') {
            Some((n, v)) => (n, Some(v.to_string())),
            None => (item, None),
        };
        if !is_env_name(name) {
            return Err(fail(format!(
                "{name:?} is not a variable name (letters, digits and _, not starting with a digit)"
            )));
        }
        export.vars.push((name.to_string(), value));
    }
    Ok(export)
}

/// The job's environment under `export`, from the submitter's `env`. A listed
/// variable that the submitter does not have is left out, as in Slurm.
pub fn export_env(export: &Export, env: &[(String, String)]) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = match export.mode {
        ExportMode::All => env.to_vec(),
        ExportMode::Listed => Vec::new(),
    };
    for (name, value) in &export.vars {
        let value = match value {
            Some(v) => v.clone(),
            None => match env.iter().rev().find(|(k, _)| k == name) {
                Some((_, v)) => v.clone(),
                None => continue,
            },
        };
        match out.iter_mut().find(|(k, _)| k == name) {
            Some(slot) => slot.1 = value,
            None => out.push((name.clone(), value)),
        }
    }
    out
}

fn is_env_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Why an `--output`/`--error` pattern was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PatternError {
    #[error("file pattern is empty; give a file name such as gpuq-%j.out")]
    Empty,
    #[error("file pattern {pattern:?} has unknown escape %{escape}; {PATTERN_ESCAPES}")]
    UnknownEscape { pattern: String, escape: char },
    #[error(
        "file pattern {pattern:?} ends in a lone %; write %% for a literal %, or {PATTERN_ESCAPES}"
    )]
    Trailing { pattern: String },
}

const PATTERN_ESCAPES: &str =
    "use %j (job id), %t (task rank), %n (node rank), %x (job name), %u (user), %A (array master id), %a (array index), %N (host), %s (step), %J (job.step) or %% (a literal %)";

/// Checks an output pattern's `%` escapes; returns the pattern unchanged.
pub fn parse_output_pattern(pattern: &str) -> Result<String, PatternError> {
    if pattern.is_empty() {
        return Err(PatternError::Empty);
    }
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            continue;
        }
        match chars.next() {
            Some('j' | 't' | 'n' | 'x' | 'u' | 'A' | 'a' | 'N' | 's' | 'J' | '%') => {}
            Some(escape) => {
                return Err(PatternError::UnknownEscape {
                    pattern: pattern.to_string(),
                    escape,
                })
            }
            None => {
                return Err(PatternError::Trailing {
                    pattern: pattern.to_string(),
                })
            }
        }
    }
    Ok(pattern.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpus(count: u32, gpu_type: Option<&str>) -> GpuRequest {
        GpuRequest {
            gpu_type: gpu_type.map(str::to_string),
            count,
        }
    }

    #[test]
    fn gpus_per_node_with_and_without_type() {
        assert_eq!(parse_gpus_per_node("8"), Ok(gpus(8, None)));
        assert_eq!(parse_gpus_per_node("0"), Ok(gpus(0, None)));
        assert_eq!(parse_gpus_per_node("h100:4"), Ok(gpus(4, Some("h100"))));
        for bad in ["", "x", "-1", "8.5", ":4", "h100:", "h100:x"] {
            assert!(parse_gpus_per_node(bad).is_err(), "{bad}");
        }
        let msg = parse_gpus_per_node("x").unwrap_err().to_string();
        assert!(msg.contains("\"x\"") && msg.contains("h100:8"), "{msg}");
    }

    #[test]
    fn gres_gpu_forms() {
        assert_eq!(parse_gres("gpu"), Ok(gpus(1, None)));
        assert_eq!(parse_gres("gpu:8"), Ok(gpus(8, None)));
        assert_eq!(parse_gres("gpu:a100:2"), Ok(gpus(2, Some("a100"))));
        assert_eq!(parse_gres("gpu:a100"), Ok(gpus(1, Some("a100"))));
        assert!(matches!(
            parse_gres("gpu:a:b:c"),
            Err(GpuError::BadCount { .. })
        ));
        assert!(matches!(
            parse_gres("gpu:a100:x"),
            Err(GpuError::BadCount { .. })
        ));
        assert!(matches!(
            parse_gres("gpu::2"),
            Err(GpuError::EmptyType { .. })
        ));
        let err = parse_gres("nvme:1").unwrap_err();
        assert!(
            matches!(&err, GpuError::NotGpu { name, .. } if name == "nvme"),
            "{err:?}"
        );
        let err = parse_gres("gpu:2,nvme:1").unwrap_err();
        assert!(err.to_string().contains("\"nvme\"") && err.to_string().contains("gpu:8"));
        assert!(matches!(
            parse_gres("gpu:1,gpu:2"),
            Err(GpuError::Several { .. })
        ));
        assert!(matches!(parse_gres(""), Err(GpuError::NotGpu { .. })));
    }

    fn env() -> Vec<(String, String)> {
        [("HOME", "/home/ada"), ("PATH", "/bin"), ("LR", "3")]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn keys(vars: &[(String, String)]) -> Vec<String> {
        vars.iter().map(|(k, v)| format!("{k}={v}")).collect()
    }

    #[test]
    fn export_modes() {
        let all = parse_export("ALL").unwrap();
        assert_eq!(all.mode, ExportMode::All);
        assert_eq!(
            keys(&export_env(&all, &env())),
            ["HOME=/home/ada", "PATH=/bin", "LR=3"]
        );

        let none = parse_export("NONE").unwrap();
        assert_eq!(none.mode, ExportMode::Listed);
        assert!(export_env(&none, &env()).is_empty());

        let listed = parse_export("PATH,X=1,MISSING").unwrap();
        assert_eq!(listed.mode, ExportMode::Listed);
        assert_eq!(keys(&export_env(&listed, &env())), ["PATH=/bin", "X=1"]);

        let all_plus = parse_export("all,LR=5,NEW=a=b").unwrap();
        assert_eq!(all_plus.mode, ExportMode::All);
        assert_eq!(
            keys(&export_env(&all_plus, &env())),
            ["HOME=/home/ada", "PATH=/bin", "LR=5", "NEW=a=b"]
        );

        let none_plus = parse_export("NONE,HOME,EMPTY=").unwrap();
        assert_eq!(
            keys(&export_env(&none_plus, &env())),
            ["HOME=/home/ada", "EMPTY="]
        );
    }

    #[test]
    fn bad_exports() {
        for bad in ["", "PATH,ALL", "1X", "A-B=1", "PATH,,HOME", "=v"] {
            let err = parse_export(bad).expect_err(bad);
            assert!(err.to_string().contains("VAR,VAR=value"), "{bad}: {err}");
        }
        assert!(parse_export("PATH,ALL")
            .unwrap_err()
            .problem
            .contains("ALL must come first"));
    }

    #[test]
    fn output_patterns() {
        for ok in [
            "gpuq-%j.out",
            "%x-%j-%t-%n-%u.log",
            "100%%.txt",
            "/abs/path/out",
            "plain",
        ] {
            assert_eq!(parse_output_pattern(ok).as_deref(), Ok(ok));
        }
        assert_eq!(parse_output_pattern(""), Err(PatternError::Empty));
        let err = parse_output_pattern("out-%Q.log").unwrap_err();
        assert_eq!(
            err,
            PatternError::UnknownEscape {
                pattern: "out-%Q.log".into(),
                escape: 'Q'
            }
        );
        assert!(err.to_string().contains("%Q") && err.to_string().contains("%j (job id)"));
        assert!(matches!(
            parse_output_pattern("out%"),
            Err(PatternError::Trailing { .. })
        ));
        assert!(matches!(
            parse_output_pattern("%%%"),
            Err(PatternError::Trailing { .. })
        ));
    }
}
