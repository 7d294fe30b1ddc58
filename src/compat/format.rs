//! Slurm's `%`-format strings (`squeue -o "%.18i %.9P %.8j"`) and Slurm's
//! ways of writing times, shared by the commands that print them.
//!
//! A format is literal text and fields `%[.][WIDTH]CODE`: WIDTH pads the
//! value to that many characters (left-justified, or right with `.`) and,
//! as Slurm does, cuts a longer value to fit; `%%` is a literal `%`. Which
//! codes exist is each command's business: the engine only asks the
//! command for a field's value, so an unknown code is refused when the
//! format is parsed, naming it.

/// One piece of a parsed format.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Piece {
    Text(String),
    Field {
        code: char,
        width: Option<usize>,
        right: bool,
    },
}

/// A parsed `%`-format string.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Format(pub Vec<Piece>);

impl Format {
    /// Parses `input`; `known` lists the codes the command can fill in.
    pub fn parse(input: &str, known: &str) -> Result<Format, String> {
        let mut pieces = Vec::new();
        let mut text = String::new();
        let mut chars = input.chars().peekable();
        while let Some(c) = chars.next() {
            if c != '%' {
                text.push(c);
                continue;
            }
            if chars.peek() == Some(&'%') {
                chars.next();
                text.push('%');
                continue;
            }
            let right = chars.next_if_eq(&'.').is_some();
            let mut digits = String::new();
            while let Some(d) = chars.next_if(|d| d.is_ascii_digit()) {
                digits.push(d);
            }
            let Some(code) = chars.next() else {
                return Err(format!(
                    "format {input:?} ends inside a field; finish it with a code such as %i, \
                     or write %% for a literal %"
                ));
            };
            if !known.contains(code) {
                let list: Vec<String> = known.chars().map(|k| format!("%{k}")).collect();
                return Err(format!(
                    "format {input:?}: unknown field %{code}; use {}",
                    list.join(" ")
                ));
            }
            if !text.is_empty() {
                pieces.push(Piece::Text(std::mem::take(&mut text)));
            }
            pieces.push(Piece::Field {
                code,
                width: digits.parse().ok(),
                right,
            });
        }
        if !text.is_empty() {
            pieces.push(Piece::Text(text));
        }
        Ok(Format(pieces))
    }

    /// Parses a `-O/--Format` list: `Field[:[.]WIDTH]` words, comma
    /// separated, names (any case) from `names` with the code each is; 20
    /// characters wide unless given, `.` right-justifies, as Slurm's.
    pub fn parse_fields(input: &str, names: &[(&str, char)]) -> Result<Format, String> {
        let mut pieces = Vec::new();
        for word in input.split(',').map(str::trim).filter(|w| !w.is_empty()) {
            let (name, size) = word
                .split_once(':')
                .map_or((word, None), |(n, s)| (n, Some(s)));
            let code = names
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(name))
                .map(|(_, c)| *c)
                .ok_or_else(|| {
                    let all: Vec<&str> = names.iter().map(|(n, _)| *n).collect();
                    let hint =
                        crate::suggest::nearest(&name.to_ascii_lowercase(), all.iter().copied())
                            .map(|n| format!("did you mean {n}? "))
                            .unwrap_or_default();
                    format!(
                        "invalid --Format field: {name}; {hint}use {}",
                        all.join(", ")
                    )
                })?;
            let (right, digits) = match size {
                None | Some("") => (false, "20"),
                Some(s) => s.strip_prefix('.').map_or((false, s), |d| (true, d)),
            };
            let width = digits.parse().map_err(|_| {
                format!(
                    "invalid --Format width in {word:?}: give Field:N or Field:.N, e.g. Name:30"
                )
            })?;
            pieces.push(Piece::Field {
                code,
                width: Some(width),
                right,
            });
        }
        if pieces.is_empty() {
            return Err("--Format names no field; e.g. -O JobID,Name:30,State".into());
        }
        Ok(Format(pieces))
    }

    /// The header line: each field's `title(code)`, padded like its values.
    pub fn header(&self, title: impl Fn(char) -> &'static str) -> String {
        self.render(|code| title(code).to_string())
    }

    /// One line, each field's value from `value(code)`.
    pub fn render(&self, mut value: impl FnMut(char) -> String) -> String {
        let mut out = String::new();
        for piece in &self.0 {
            match piece {
                Piece::Text(t) => out.push_str(t),
                Piece::Field { code, width, right } => {
                    let v = value(*code);
                    match width {
                        None => out.push_str(&v),
                        Some(w) => {
                            let cut: String = v.chars().take(*w).collect();
                            if *right {
                                out.push_str(&format!("{cut:>w$}"));
                            } else {
                                out.push_str(&format!("{cut:<w$}"));
                            }
                        }
                    }
                }
            }
        }
        out.trim_end().to_string()
    }
}

/// A duration as squeue and sinfo write it: `M:SS`, `H:MM:SS` or
/// `D-HH:MM:SS`.
pub fn duration(secs: u64) -> String {
    let (d, h, m, s) = (
        secs / 86_400,
        secs % 86_400 / 3600,
        secs % 3600 / 60,
        secs % 60,
    );
    if d > 0 {
        format!("{d}-{h:02}:{m:02}:{s:02}")
    } else if h > 0 {
        format!("{h}:{m:02}:{s:02}")
    } else {
        format!("{m}:{s:02}")
    }
}

/// A time limit: [`duration`], or `UNLIMITED` for none.
pub fn time_limit(secs: Option<u64>) -> String {
    secs.map(duration).unwrap_or_else(|| "UNLIMITED".into())
}

/// Unix milliseconds as Slurm prints times: `2026-03-01T12:00:00` (UTC
/// here), or `Unknown` for a time that has not come.
pub fn time(ms: Option<crate::model::Millis>) -> String {
    ms.map(crate::cli::table::fmt_time)
        .unwrap_or_else(|| "Unknown".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn widths_pad_and_cut_dots_justify_right() {
        let f = Format::parse("%.5i|%3j|%4j|%t,%%", "ijt").unwrap();
        let line = f.render(|c| match c {
            'i' => "12".into(),
            'j' => "training".into(),
            _ => "R".into(),
        });
        assert_eq!(line, "   12|tra|trai|R,%");
    }

    #[test]
    fn header_uses_the_titles() {
        let f = Format::parse("%.6i %j", "ij").unwrap();
        assert_eq!(
            f.header(|c| if c == 'i' { "JOBID" } else { "NAME" }),
            " JOBID NAME"
        );
    }

    #[test]
    fn unknown_codes_and_a_dangling_percent_are_refused() {
        let e = Format::parse("%i %Q", "ij").unwrap_err();
        assert!(e.contains("%Q") && e.contains("%i %j"), "{e}");
        let e = Format::parse("%i %.1", "ij").unwrap_err();
        assert!(e.contains("ends inside a field"), "{e}");
    }

    #[test]
    fn durations_as_slurm_writes_them() {
        assert_eq!(duration(0), "0:00");
        assert_eq!(duration(65), "1:05");
        assert_eq!(duration(3600), "1:00:00");
        assert_eq!(duration(90_061), "1-01:01:01");
        assert_eq!(time_limit(None), "UNLIMITED");
    }
}
