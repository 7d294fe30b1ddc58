//! `#GPUQ` and `#SBATCH` directive lines in job scripts.
//!
//! As sbatch does, directives are read only from the script's header: after an
//! optional `#!` line, the leading run of comment and blank lines. The first
//! command ends it, so a `#SBATCH` further down (or a directive disabled as
//! `# SBATCH`/`##SBATCH`) is an ordinary comment. Arguments are split with
//! shell-like quoting but never expanded: `$HOME` stays `$HOME`, since the
//! directive is read on the login node and no shell is involved.

/// Which prefix a directive line used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DirectivePrefix {
    Gpuq,
    Sbatch,
}

impl DirectivePrefix {
    pub fn as_str(self) -> &'static str {
        match self {
            DirectivePrefix::Gpuq => "#GPUQ",
            DirectivePrefix::Sbatch => "#SBATCH",
        }
    }
}

/// One directive line, split into argv tokens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Directive {
    /// 1-based line number in the script.
    pub line: usize,
    pub prefix: DirectivePrefix,
    pub args: Vec<String>,
}

/// A directive line whose quoting is broken.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {problem}")]
pub struct DirectiveError {
    pub line: usize,
    pub problem: SplitError,
}

/// Why a line could not be split into words.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SplitError {
    #[error("unterminated {quote} quote; close it or escape it with a backslash")]
    UnterminatedQuote { quote: char },
    #[error("the line ends in a backslash; directives cannot continue onto the next line")]
    TrailingBackslash,
}

/// Reads the directives from a script's header, in file order.
pub fn read_directives(script: &str) -> Result<Vec<Directive>, DirectiveError> {
    let mut directives = Vec::new();
    for (index, line) in script.lines().enumerate() {
        let number = index + 1;
        if number == 1 && line.starts_with("#!") {
            continue;
        }
        let text = line.trim_start();
        if text.is_empty() {
            continue;
        }
        if !text.starts_with('#') {
            break;
        }
        let Some((prefix, rest)) = directive_prefix(text) else {
            continue;
        };
        let args = split_words(rest).map_err(|problem| DirectiveError {
            line: number,
            problem,
        })?;
        if !args.is_empty() {
            directives.push(Directive {
                line: number,
                prefix,
                args,
            });
        }
    }
    Ok(directives)
}

fn directive_prefix(text: &str) -> Option<(DirectivePrefix, &str)> {
    for prefix in [DirectivePrefix::Gpuq, DirectivePrefix::Sbatch] {
        if let Some(rest) = text.strip_prefix(prefix.as_str()) {
            if rest.is_empty() || rest.starts_with(char::is_whitespace) {
                return Some((prefix, rest));
            }
        }
    }
    None
}

/// Splits a line into words as a POSIX shell would, without any expansion:
/// blanks separate words, `'...'` is literal, `"..."` honours `\"`, `\\`, `\$`
/// and `` \` ``, a backslash outside quotes escapes the next character, and an
/// unquoted `#` starting a word begins a comment.
pub fn split_words(line: &str) -> Result<Vec<String>, SplitError> {
    let mut words = Vec::new();
    let mut word = String::new();
    // Whether a word is in progress; `''` is an (empty) word, blanks are not.
    let mut in_word = false;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            c if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            '#' if !in_word => break,
            '\\' => {
                word.push(chars.next().ok_or(SplitError::TrailingBackslash)?);
                in_word = true;
            }
            '\'' => {
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(c) => word.push(c),
                        None => return Err(SplitError::UnterminatedQuote { quote: '\'' }),
                    }
                }
                in_word = true;
            }
            '"' => {
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(c @ ('"' | '\\' | '$' | '`')) => word.push(c),
                            Some(c) => {
                                word.push('\\');
                                word.push(c);
                            }
                            None => return Err(SplitError::UnterminatedQuote { quote: '"' }),
                        },
                        Some(c) => word.push(c),
                        None => return Err(SplitError::UnterminatedQuote { quote: '"' }),
                    }
                }
                in_word = true;
            }
            c => {
                word.push(c);
                in_word = true;
            }
        }
    }
    if in_word {
        words.push(word);
    }
    Ok(words)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(line: &str) -> Vec<String> {
        split_words(line).unwrap_or_else(|e| panic!("{line}: {e}"))
    }

    #[test]
    fn splits_like_a_shell() {
        assert_eq!(
            words("  --nodes 2   --time=1:00:00 "),
            ["--nodes", "2", "--time=1:00:00"]
        );
        assert_eq!(words("--job-name 'my job'"), ["--job-name", "my job"]);
        assert_eq!(words("--job-name=\"my job\""), ["--job-name=my job"]);
        assert_eq!(
            words(r#"-J "say \"hi\" \$HOME \n""#),
            [r#"-J"#, r#"say "hi" $HOME \n"#]
        );
        assert_eq!(words(r"a\ b c\'d"), ["a b", "c'd"]);
        assert_eq!(words("'it''s' x"), ["its", "x"]);
        assert_eq!(words("-J '' x"), ["-J", "", "x"]);
        assert_eq!(words("'$HOME'"), ["$HOME"]);
        assert_eq!(words("--mem 16G # sixteen gigs"), ["--mem", "16G"]);
        assert_eq!(words("-J a#b"), ["-J", "a#b"], "# inside a word is literal");
        assert_eq!(words("-J '#x'"), ["-J", "#x"]);
        assert!(words("   ").is_empty());
    }

    #[test]
    fn broken_quoting_is_an_error() {
        assert_eq!(
            split_words("-J 'oops"),
            Err(SplitError::UnterminatedQuote { quote: '\'' })
        );
        assert_eq!(
            split_words("-J \"oops\\\""),
            Err(SplitError::UnterminatedQuote { quote: '"' })
        );
        assert_eq!(split_words("-J x\\"), Err(SplitError::TrailingBackslash));
    }

    #[test]
    fn reads_the_header_and_stops_at_the_first_command() {
        let script = "#!/bin/bash\n\
                      # a comment\n\
                      #GPUQ --nodes 2\n\
                      \n\
                      #SBATCH --time=1:00:00 -J 'my job'\n\
                      # SBATCH --mem 1G\n\
                      ##SBATCH --mem 2G\n\
                      #SBATCHX --mem 3G\n\
                      #GPUQ\n\
                      \x20 #GPUQ --gpus-per-node 8\n\
                      echo hello\n\
                      #GPUQ --nodes 4\n";
        let found = read_directives(script).unwrap();
        let summary: Vec<(usize, DirectivePrefix, Vec<&str>)> = found
            .iter()
            .map(|d| {
                (
                    d.line,
                    d.prefix,
                    d.args.iter().map(String::as_str).collect(),
                )
            })
            .collect();
        assert_eq!(
            summary,
            vec![
                (3, DirectivePrefix::Gpuq, vec!["--nodes", "2"]),
                (
                    5,
                    DirectivePrefix::Sbatch,
                    vec!["--time=1:00:00", "-J", "my job"]
                ),
                (10, DirectivePrefix::Gpuq, vec!["--gpus-per-node", "8"]),
            ]
        );
    }

    #[test]
    fn a_shebang_is_only_skipped_on_line_one() {
        let found = read_directives("#GPUQ -N 1\n#!/bin/sh\n#GPUQ -N 2\n").unwrap();
        assert_eq!(found.len(), 2);
        assert!(read_directives("true\n#GPUQ -N 2\n").unwrap().is_empty());
        assert!(read_directives("").unwrap().is_empty());
    }

    #[test]
    fn crlf_scripts_work() {
        let found = read_directives("#!/bin/sh\r\n#GPUQ -N 2\r\nhostname\r\n").unwrap();
        assert_eq!(found[0].args, ["-N", "2"]);
    }

    #[test]
    fn quoting_errors_carry_the_line() {
        let err = read_directives("#!/bin/sh\n\n#GPUQ -J 'x\n").unwrap_err();
        assert_eq!(err.line, 3);
        assert!(
            err.to_string().starts_with("line 3: unterminated ' quote"),
            "{err}"
        );
    }
}
