//! What a submission runs: its first word classified as a script or a
//! command, and a script's text read and checked.

use std::fs;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use super::{SpecError, MAX_SCRIPT_BYTES};

/// What the first positional word of `gpuq submit` names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProgramKind {
    /// A batch script at this (absolute) path.
    Script(PathBuf),
    /// A command to run as given.
    Command,
}

/// Applies the rule in `gpuq submit --help`: an existing file that starts with
/// `#!` or ends in `.sh` is a script; a `.sh` name that is no readable file is
/// an error (surely a mistyped script, not a command); so is a path to a
/// directory; anything else is a command.
pub fn classify(first: &str, cwd: &Path) -> Result<ProgramKind, SpecError> {
    let path = cwd.join(first);
    let named_script = first.ends_with(".sh");
    let looks_like_path = named_script || first.contains('/');
    let metadata = match fs::metadata(&path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            if named_script {
                return Err(SpecError::ScriptNotFound {
                    path: first.to_string(),
                    cwd: cwd.display().to_string(),
                });
            }
            return Ok(ProgramKind::Command);
        }
        Err(source) if named_script => {
            return Err(SpecError::ScriptUnreadable {
                path: first.to_string(),
                source,
            })
        }
        Err(_) => return Ok(ProgramKind::Command),
    };
    if metadata.is_dir() {
        if looks_like_path {
            return Err(SpecError::ScriptIsDirectory {
                path: first.to_string(),
            });
        }
        return Ok(ProgramKind::Command);
    }
    if named_script {
        return Ok(ProgramKind::Script(path));
    }
    // Only the first two bytes matter; an unreadable binary is a command.
    let mut magic = [0u8; 2];
    let has_shebang = fs::File::open(&path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok()
        && &magic == b"#!";
    Ok(if has_shebang {
        ProgramKind::Script(path)
    } else {
        ProgramKind::Command
    })
}

/// Reads a script file with the size and text checks of [`script_text`].
pub fn read_script(path: &Path) -> Result<String, SpecError> {
    let shown = || path.display().to_string();
    let unreadable = |source| SpecError::ScriptUnreadable {
        path: shown(),
        source,
    };
    let file = fs::File::open(path).map_err(unreadable)?;
    let mut bytes = Vec::new();
    file.take(MAX_SCRIPT_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(unreadable)?;
    script_text(bytes, &shown())
}

/// A script's bytes as text, refused when too large, empty or not UTF-8;
/// `shown` names where they came from (a path, or stdin).
pub fn script_text(bytes: Vec<u8>, shown: &str) -> Result<String, SpecError> {
    let path = || shown.to_string();
    if bytes.len() as u64 > MAX_SCRIPT_BYTES {
        return Err(SpecError::ScriptTooLarge { path: path() });
    }
    if bytes.is_empty() {
        return Err(SpecError::ScriptEmpty { path: path() });
    }
    String::from_utf8(bytes).map_err(|_| SpecError::ScriptNotText { path: path() })
}
