//! The one place that formats human output: aligned tables and times.

use crate::model::Millis;

/// A plain aligned text table.
pub struct Table {
    headers: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(headers: &[&str]) -> Table {
        Table {
            headers: headers.iter().map(|h| h.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// Renders the table; the last column is not padded.
    pub fn render(&self) -> String {
        let n = self.headers.len();
        let mut width = vec![0; n];
        for r in std::iter::once(&self.headers).chain(&self.rows) {
            for (i, c) in r.iter().enumerate().take(n) {
                width[i] = width[i].max(c.chars().count());
            }
        }
        let mut out = String::new();
        for r in std::iter::once(&self.headers).chain(&self.rows) {
            let mut line = String::new();
            for (i, c) in r.iter().enumerate().take(n) {
                if i + 1 == n {
                    line.push_str(c);
                } else {
                    line.push_str(&format!("{c:<w$}  ", w = width[i]));
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

/// [`fmt_time`], or `-` for a time that has not come.
pub fn opt_time(t: Option<Millis>) -> String {
    t.map(fmt_time).unwrap_or_else(|| "-".into())
}

pub use crate::clock::fmt_time;

/// Formats seconds as Slurm does: `D-HH:MM:SS`, or `HH:MM:SS` under a day.
pub fn fmt_duration(secs: u64) -> String {
    let (d, h, m, s) = (
        secs / 86_400,
        secs % 86_400 / 3600,
        secs % 3600 / 60,
        secs % 60,
    );
    if d > 0 {
        format!("{d}-{h:02}:{m:02}:{s:02}")
    } else {
        format!("{h:02}:{m:02}:{s:02}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_format_in_utc() {
        assert_eq!(fmt_time(0), "1970-01-01T00:00:00");
        assert_eq!(fmt_time(1_796_119_199_000), "2026-12-01T09:59:59");
        assert_eq!(fmt_time(951_782_400_000), "2000-02-29T00:00:00");
    }

    #[test]
    fn durations_format_like_slurm() {
        assert_eq!(fmt_duration(59), "00:00:59");
        assert_eq!(fmt_duration(3 * 86_400 + 3661), "3-01:01:01");
    }

    #[test]
    fn table_aligns_columns() {
        let mut t = Table::new(&["ID", "NAME"]);
        t.row(vec!["1".into(), "a".into()]);
        t.row(vec!["100".into(), "bb".into()]);
        assert_eq!(t.render(), "ID   NAME\n1    a\n100  bb\n");
    }
}
