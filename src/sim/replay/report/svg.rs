//! Charts as inline SVG text: line charts on a linear or log axis and
//! horizontal grouped bars, each with tick labels, axis titles and a legend
//! (one colour per run), so the report page needs no script and no network.
//! Coordinates are written to 0.1 px to keep a large run's page small.

use std::fmt::Write;

/// One colour per run, in run order.
const COLOURS: [&str; 6] = [
    "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b",
];

/// The colour of the `i`-th run.
pub(super) fn colour(i: usize) -> &'static str {
    COLOURS[i % COLOURS.len()]
}

/// The dash pattern of the `i`-th run's curves: the first solid, the
/// others dashed, so a curve drawn over an equal one leaves both visible.
fn dash(i: usize) -> &'static str {
    if i == 0 {
        ""
    } else {
        r#" stroke-dasharray="7 4""#
    }
}

/// A curve: the run it belongs to (its colour and dash) and its points in
/// axis units.
pub(super) struct Series {
    pub run: usize,
    pub points: Vec<(f64, f64)>,
}

#[derive(Clone, Copy, PartialEq)]
pub(super) enum Scale {
    Linear,
    /// Log10; values at or below `min` sit on the axis.
    Log,
}

/// An axis: its title (with the unit), range and labelled ticks.
pub(super) struct Axis {
    pub title: String,
    pub min: f64,
    pub max: f64,
    pub scale: Scale,
    pub ticks: Vec<(f64, String)>,
}

impl Axis {
    /// A linear axis from 0 to a round number at or above `max`, with
    /// about five ticks labelled by `label`.
    pub fn linear(title: &str, max: f64, label: impl Fn(f64) -> String) -> Axis {
        let step = nice_step(if max > 0.0 { max } else { 1.0 } / 5.0);
        let top = (max / step).ceil().max(1.0) * step;
        let ticks = (0..)
            .map(|i| i as f64 * step)
            .take_while(|v| *v <= top + step / 2.0)
            .map(|v| (v, label(v)))
            .collect();
        Axis {
            title: title.into(),
            min: 0.0,
            max: top,
            scale: Scale::Linear,
            ticks,
        }
    }

    /// Ends the axis at `max` (when above 0), dropping the ticks beyond:
    /// for time, where the data's end is the chart's end.
    pub fn end_at(&mut self, max: f64) {
        if max > self.min {
            self.max = max;
            self.ticks.retain(|(v, _)| *v <= max * (1.0 + 1e-9));
        }
    }

    /// A log axis of seconds from 1 s to the first of 1 min, 10 min, 1 h,
    /// ... at or above `max_s`.
    pub fn log_seconds(title: &str, max_s: f64) -> Axis {
        const TICKS: [(f64, &str); 9] = [
            (1.0, "≤1 s"),
            (10.0, "10 s"),
            (60.0, "1 min"),
            (600.0, "10 min"),
            (3600.0, "1 h"),
            (36_000.0, "10 h"),
            (86_400.0, "1 d"),
            (604_800.0, "1 w"),
            (2_592_000.0, "30 d"),
        ];
        let last = TICKS
            .iter()
            .position(|(v, _)| *v >= max_s)
            .unwrap_or(TICKS.len() - 1)
            .max(2);
        // 10 h crowds 1 d on a narrow chart: it goes once the axis has 1 d.
        let mut ticks: Vec<(f64, String)> = TICKS[..=last]
            .iter()
            .filter(|(v, _)| *v != 36_000.0 || TICKS[last].0 < 86_400.0)
            .map(|(v, l)| (*v, l.to_string()))
            .collect();
        let mut max = TICKS[last].0;
        // Beyond 30 days: one more tick at the longest value, in days.
        if max_s > max {
            max = max_s;
            ticks.push((max_s, format!("{:.0} d", max_s / 86_400.0)));
        }
        Axis {
            title: title.into(),
            min: 1.0,
            max,
            scale: Scale::Log,
            ticks,
        }
    }

    /// Where `v` falls, 0 (min) to 1 (max), clamped.
    fn frac(&self, v: f64) -> f64 {
        let f = match self.scale {
            Scale::Linear => (v - self.min) / (self.max - self.min),
            Scale::Log => {
                let (lo, hi) = (self.min.log10(), self.max.log10());
                (v.max(self.min).log10() - lo) / (hi - lo)
            }
        };
        if f.is_finite() {
            f.clamp(0.0, 1.0)
        } else {
            0.0
        }
    }
}

/// 1, 2 or 5 times a power of ten, at or above `raw`.
pub(super) fn nice_step(raw: f64) -> f64 {
    let raw = if raw > 0.0 && raw.is_finite() {
        raw
    } else {
        1.0
    };
    let power = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * power)
        .find(|s| *s >= raw * (1.0 - 1e-9))
        .unwrap_or(10.0 * power)
}

/// A tick label: integers plainly, others to as few decimals as needed.
pub(super) fn tick_number(v: f64) -> String {
    if (v - v.round()).abs() < 1e-9 {
        format!("{v:.0}")
    } else {
        let s = format!("{v:.3}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

/// The plot area within the SVG.
struct Frame {
    width: f64,
    height: f64,
    left: f64,
    right: f64,
    top: f64,
    bottom: f64,
}

impl Frame {
    fn new(width: f64, height: f64, left: f64) -> Frame {
        Frame {
            width,
            height,
            left,
            right: 32.0,
            top: 40.0,
            bottom: 44.0,
        }
    }

    fn x(&self, axis: &Axis, v: f64) -> f64 {
        self.left + axis.frac(v) * (self.width - self.left - self.right)
    }

    fn y(&self, axis: &Axis, v: f64) -> f64 {
        self.height - self.bottom - axis.frac(v) * (self.height - self.top - self.bottom)
    }

    /// The opening tag, the title and the legend: a swatch per run named
    /// in `legend`, a line in its dash (`lines`) or a bar.
    fn open(&self, out: &mut String, title: &str, legend: &[&str], lines: bool) {
        let _ = write!(
            out,
            r##"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" role="img"><title>{t}</title><rect width="{w}" height="{h}" fill="#fff"/><text x="{l}" y="16" class="title">{t}</text>"##,
            w = self.width,
            h = self.height,
            l = self.left,
            t = escape(title),
        );
        // The legend on its own line under the title, left to right.
        let mut x = self.left;
        for (i, name) in legend.iter().enumerate() {
            let c = colour(i);
            if lines {
                let _ = write!(
                    out,
                    r#"<line x1="{x}" y1="27" x2="{x2}" y2="27" stroke="{c}" stroke-width="2.5"{d}/>"#,
                    x2 = x + 22.0,
                    d = dash(i),
                );
            } else {
                let _ = write!(
                    out,
                    r#"<rect x="{x}" y="22" width="22" height="10" fill="{c}"/>"#
                );
            }
            let _ = write!(
                out,
                r#"<text x="{tx}" y="31" class="legend">{n}</text>"#,
                tx = x + 27.0,
                n = escape(name),
            );
            x += 44.0 + 6.5 * name.chars().count() as f64;
        }
    }

    /// The x axis's vertical gridlines and tick labels.
    fn x_ticks(&self, out: &mut String, x: &Axis) {
        let (y0, y1) = (self.height - self.bottom, self.top);
        for (v, label) in &x.ticks {
            let px = self.x(x, *v);
            let _ = write!(
                out,
                r#"<line x1="{px:.1}" y1="{y1}" x2="{px:.1}" y2="{y0}" class="grid"/><text x="{px:.1}" y="{ty}" text-anchor="middle">{l}</text>"#,
                ty = y0 + 16.0,
                l = escape(label),
            );
        }
    }

    /// Gridlines, tick labels and axis titles.
    fn axes(&self, out: &mut String, x: &Axis, y: &Axis) {
        let (x0, x1) = (self.left, self.width - self.right);
        let (y0, y1) = (self.height - self.bottom, self.top);
        for (v, label) in &y.ticks {
            let py = self.y(y, *v);
            let _ = write!(
                out,
                r#"<line x1="{x0}" y1="{py:.1}" x2="{x1}" y2="{py:.1}" class="grid"/><text x="{tx}" y="{ty:.1}" text-anchor="end">{l}</text>"#,
                tx = x0 - 6.0,
                ty = py + 4.0,
                l = escape(label),
            );
        }
        self.x_ticks(out, x);
        let _ = write!(
            out,
            r#"<line x1="{x0}" y1="{y0}" x2="{x1}" y2="{y0}" class="axis"/><line x1="{x0}" y1="{y0}" x2="{x0}" y2="{y1}" class="axis"/><text x="{cx:.1}" y="{ty}" text-anchor="middle" class="label">{xt}</text><text transform="translate(14 {cy:.1}) rotate(-90)" text-anchor="middle" class="label">{yt}</text>"#,
            cx = (x0 + x1) / 2.0,
            ty = self.height - 6.0,
            cy = (y0 + y1) / 2.0,
            xt = escape(&x.title),
            yt = escape(&y.title),
        );
    }
}

/// A line chart of `series` on `x` and `y`, `width` x `height` px, with a
/// legend of the runs' names; a note in place of the curves when none has
/// a point.
pub(super) fn line_chart(
    title: &str,
    width: f64,
    height: f64,
    x: &Axis,
    y: &Axis,
    legend: &[&str],
    series: &[Series],
) -> String {
    let frame = Frame::new(width, height, 64.0);
    let mut out = String::new();
    frame.open(&mut out, title, legend, true);
    frame.axes(&mut out, x, y);
    if series.iter().all(|s| s.points.is_empty()) {
        let _ = write!(
            out,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" class="note">no data</text>"#,
            width / 2.0,
            height / 2.0
        );
    }
    for s in series.iter().filter(|s| !s.points.is_empty()) {
        let _ = write!(
            out,
            r#"<polyline fill="none" stroke="{}" stroke-width="1.6" stroke-linejoin="round"{} points=""#,
            colour(s.run),
            dash(s.run),
        );
        for (i, (px, py)) in s.points.iter().enumerate() {
            let sep = if i == 0 { "" } else { " " };
            let _ = write!(out, "{sep}{:.1},{:.1}", frame.x(x, *px), frame.y(y, *py));
        }
        out.push_str(r#""/>"#);
    }
    out.push_str("</svg>");
    out
}

/// Horizontal grouped bars: a row per group (its label, then one bar per
/// run in `runs` order), values on `x`.
pub(super) fn bar_chart(
    title: &str,
    width: f64,
    x: &Axis,
    runs: &[&str],
    groups: &[(String, Vec<f64>)],
) -> String {
    const BAR: f64 = 12.0;
    const GAP: f64 = 8.0;
    let row = BAR * runs.len() as f64 + GAP;
    let plot = (row * groups.len() as f64).max(row);
    let mut frame = Frame::new(width, 0.0, 150.0);
    frame.height = frame.top + plot + frame.bottom;
    let mut out = String::new();
    frame.open(&mut out, title, runs, false);
    let (x0, x1) = (frame.left, frame.width - frame.right);
    let (y0, y1) = (frame.height - frame.bottom, frame.top);
    frame.x_ticks(&mut out, x);
    for (g, (label, values)) in groups.iter().enumerate() {
        let top = y1 + g as f64 * row + GAP / 2.0;
        let short: String = label.chars().take(22).collect();
        let _ = write!(
            out,
            r#"<text x="{tx}" y="{ty:.1}" text-anchor="end"><title>{full}</title>{short}</text>"#,
            tx = x0 - 6.0,
            ty = top + BAR * runs.len() as f64 / 2.0 + 4.0,
            full = escape(label),
            short = escape(&short),
        );
        for (r, v) in values.iter().enumerate() {
            let w = frame.x(x, *v) - x0;
            let _ = write!(
                out,
                r#"<rect x="{x0}" y="{by:.1}" width="{w:.1}" height="{h}" fill="{c}"/>"#,
                by = top + r as f64 * BAR,
                h = BAR - 1.0,
                c = colour(r),
            );
        }
    }
    let _ = write!(
        out,
        r#"<line x1="{x0}" y1="{y0}" x2="{x1}" y2="{y0}" class="axis"/><line x1="{x0}" y1="{y0}" x2="{x0}" y2="{y1}" class="axis"/><text x="{cx:.1}" y="{ty}" text-anchor="middle" class="label">{xt}</text></svg>"#,
        cx = (x0 + x1) / 2.0,
        ty = frame.height - 6.0,
        xt = escape(&x.title),
    );
    out
}

/// `text` safe inside HTML and SVG text and attribute values.
pub(super) fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}
