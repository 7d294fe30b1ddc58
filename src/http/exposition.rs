//! Prometheus's text exposition format (version 0.0.4), written by hand: a
//! family is its `# HELP` and `# TYPE` lines followed by its samples, label
//! values escaped, histograms as cumulative `_bucket{le=...}` lines with
//! `_sum` and `_count`. A crate would add a registry and global state for
//! what is a page of string formatting; the daemons build the page afresh
//! from their own state at each scrape instead.

use std::fmt::Write;

use crate::metric::Snapshot;

/// The content type scrapers expect for this format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// What a family's samples mean to Prometheus.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// A page of metrics being written.
#[derive(Debug, Default)]
pub struct Exposition {
    out: String,
}

/// One family's samples, written under its HELP and TYPE lines.
pub struct Family<'a> {
    out: &'a mut String,
    name: &'a str,
}

impl Exposition {
    pub fn new() -> Exposition {
        Exposition::default()
    }

    /// Starts the family `name` (a counter's name ends in `_total`); its
    /// samples follow through the returned [`Family`].
    pub fn family<'a>(&'a mut self, name: &'a str, help: &str, kind: Kind) -> Family<'a> {
        let _ = writeln!(self.out, "# HELP {name} {}", escape_help(help));
        let _ = writeln!(self.out, "# TYPE {name} {}", kind.as_str());
        Family {
            out: &mut self.out,
            name,
        }
    }

    /// A family with one unlabelled sample.
    pub fn single(&mut self, name: &str, help: &str, kind: Kind, value: f64) {
        self.family(name, help, kind).sample(&[], value);
    }

    /// A histogram family with one unlabelled histogram.
    pub fn single_histogram(&mut self, name: &str, help: &str, snapshot: &Snapshot) {
        self.family(name, help, Kind::Histogram)
            .histogram(&[], snapshot);
    }

    /// The page.
    pub fn finish(self) -> String {
        self.out
    }
}

impl Family<'_> {
    /// One sample of a counter or gauge.
    pub fn sample(&mut self, labels: &[(&str, &str)], value: f64) -> &mut Self {
        self.out.push_str(self.name);
        write_labels(self.out, labels, None);
        let _ = writeln!(self.out, " {}", number(value));
        self
    }

    /// One labelled histogram of a histogram family.
    pub fn histogram(&mut self, labels: &[(&str, &str)], s: &Snapshot) -> &mut Self {
        for (bound, count) in &s.buckets {
            let _ = write!(self.out, "{}_bucket", self.name);
            write_labels(self.out, labels, Some(&number(*bound)));
            let _ = writeln!(self.out, " {count}");
        }
        let _ = write!(self.out, "{}_bucket", self.name);
        write_labels(self.out, labels, Some("+Inf"));
        let _ = writeln!(self.out, " {}", s.count);
        let _ = write!(self.out, "{}_sum", self.name);
        write_labels(self.out, labels, None);
        let _ = writeln!(self.out, " {}", number(s.sum));
        let _ = write!(self.out, "{}_count", self.name);
        write_labels(self.out, labels, None);
        let _ = writeln!(self.out, " {}", s.count);
        self
    }
}

fn write_labels(out: &mut String, labels: &[(&str, &str)], le: Option<&str>) {
    if labels.is_empty() && le.is_none() {
        return;
    }
    out.push('{');
    let mut first = true;
    let le = le.map(|v| ("le", v));
    for (key, value) in labels.iter().copied().chain(le) {
        if !first {
            out.push(',');
        }
        first = false;
        out.push_str(key);
        out.push_str("=\"");
        escape_label_into(out, value);
        out.push('"');
    }
    out.push('}');
}

/// A label value: backslash, double quote and line feed escaped.
fn escape_label_into(out: &mut String, value: &str) {
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// HELP text: backslash and line feed escaped.
fn escape_help(help: &str) -> String {
    help.replace('\\', "\\\\").replace('\n', "\\n")
}

/// A sample value as the format writes it (`+Inf`, `NaN`, integers bare).
fn number(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else {
        format!("{v}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metric::Histogram;

    #[test]
    fn families_samples_and_escapes() {
        let mut e = Exposition::new();
        e.family("gpuq_nodes", "Nodes by state.\nSecond line", Kind::Gauge)
            .sample(&[("state", "up")], 3.0)
            .sample(&[("state", "we\"ird\\\n")], 0.5);
        e.single("gpuq_jobs_submitted_total", "Jobs.", Kind::Counter, 7.0);
        let text = e.finish();
        assert_eq!(
            text,
            "# HELP gpuq_nodes Nodes by state.\\nSecond line\n# TYPE gpuq_nodes gauge\n\
             gpuq_nodes{state=\"up\"} 3\ngpuq_nodes{state=\"we\\\"ird\\\\\\n\"} 0.5\n\
             # HELP gpuq_jobs_submitted_total Jobs.\n# TYPE gpuq_jobs_submitted_total counter\n\
             gpuq_jobs_submitted_total 7\n"
        );
    }

    #[test]
    fn histograms_are_cumulative_with_inf_sum_and_count() {
        let h = Histogram::new(&[0.5, 1.0]);
        h.observe(0.25);
        h.observe(3.0);
        let mut e = Exposition::new();
        e.family("gpuq_x_seconds", "X.", Kind::Histogram)
            .histogram(&[("node", "a")], &h.snapshot());
        let text = e.finish();
        assert!(text.contains("gpuq_x_seconds_bucket{node=\"a\",le=\"0.5\"} 1\n"));
        assert!(text.contains("gpuq_x_seconds_bucket{node=\"a\",le=\"1\"} 1\n"));
        assert!(text.contains("gpuq_x_seconds_bucket{node=\"a\",le=\"+Inf\"} 2\n"));
        assert!(text.contains("gpuq_x_seconds_sum{node=\"a\"} 3.25\n"));
        assert!(text.contains("gpuq_x_seconds_count{node=\"a\"} 2\n"));
    }
}
