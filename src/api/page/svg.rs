//! Plain SVG, rendered on the server (no charting library, no script): the verdicts over
//! time as stacked bars, a key's spend against its budget, and an interval on a number line.
//! Written as maud templates, like the page around them: every text and attribute value is
//! escaped by construction, and each plot is returned as [`Markup`] so the page splices it in
//! without escaping it twice. Colours are presentation attributes (the page's CSP forbids
//! inline styles). Shapes are closed with an end tag (`<rect …></rect>`), not maud's void
//! `<rect …>`: inside `<svg>` an HTML parser would nest unclosed shapes in one another.

use std::collections::BTreeMap;

use maud::{html, Markup};

use crate::store::VerdictCount;
use tokensaver_core::gate::Verdict;

/// The colour of a verdict; its rules take lighter shades of it.
pub fn verdict_colour(v: Verdict) -> (u8, u8, u8) {
    match v {
        Verdict::Serve => (0x2e, 0x7d, 0x32),
        Verdict::Allow => (0x15, 0x65, 0xc0),
        Verdict::Downgrade => (0x6a, 0x1b, 0x9a),
        Verdict::Challenge => (0xe0, 0x82, 0x00),
        Verdict::Block => (0xc6, 0x28, 0x28),
    }
}

/// `(r, g, b)` mixed with white: shade 0 is the colour itself, each further shade lighter.
fn shade((r, g, b): (u8, u8, u8), n: usize) -> String {
    let t = [0.0, 0.35, 0.6, 0.2, 0.5][n % 5];
    let mix = |c: u8| (f64::from(c) + (255.0 - f64::from(c)) * t).round() as u8;
    format!("#{:02x}{:02x}{:02x}", mix(r), mix(g), mix(b))
}

/// One stacked series: a verdict and the rule (or band, or what earned it) behind it.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub verdict: Verdict,
    pub reason: String,
    pub colour: String,
    /// One count per bucket.
    pub values: Vec<u64>,
}

impl Series {
    pub fn total(&self) -> u64 {
        self.values.iter().sum()
    }
}

/// Counts laid on `buckets` consecutive buckets of `bucket_ms` from `first_ms`.
#[derive(Debug, Clone, PartialEq)]
pub struct Chart {
    pub first_ms: u64,
    pub bucket_ms: u64,
    pub buckets: usize,
    /// Ordered by verdict (SERVE … BLOCK), then rule.
    pub series: Vec<Series>,
}

impl Chart {
    /// Lay the store's counts on the buckets; counts outside them are left out.
    pub fn build(counts: &[VerdictCount], first_ms: u64, bucket_ms: u64, buckets: usize) -> Chart {
        let bucket_ms = bucket_ms.max(1);
        let mut by_series: BTreeMap<(Verdict, &str), Vec<u64>> = BTreeMap::new();
        for c in counts {
            let Some(offset) = c.bucket_start_ms.checked_sub(first_ms) else {
                continue;
            };
            let i = usize::try_from(offset / bucket_ms).unwrap_or(usize::MAX);
            if i >= buckets {
                continue;
            }
            by_series
                .entry((c.verdict, c.reason.as_str()))
                .or_insert_with(|| vec![0; buckets])[i] += c.count;
        }
        let mut series = Vec::new();
        let mut nth_of_verdict: BTreeMap<Verdict, usize> = BTreeMap::new();
        for ((verdict, reason), values) in by_series {
            let n = nth_of_verdict.entry(verdict).or_default();
            series.push(Series {
                verdict,
                reason: reason.to_string(),
                colour: shade(verdict_colour(verdict), *n),
                values,
            });
            *n += 1;
        }
        Chart {
            first_ms,
            bucket_ms,
            buckets,
            series,
        }
    }

    /// The stacked height of bucket `i`.
    pub fn bucket_total(&self, i: usize) -> u64 {
        self.series.iter().filter_map(|s| s.values.get(i)).sum()
    }

    pub fn total(&self) -> u64 {
        self.series.iter().map(Series::total).sum()
    }
}

/// The smallest 1, 2 or 5 × 10ⁿ at or above `v` (at least 1): the y axis' top.
pub fn nice_ceiling(v: u64) -> u64 {
    let mut step = 1u64;
    loop {
        for m in [1, 2, 5] {
            let c = step.saturating_mul(m);
            if c >= v || c == u64::MAX {
                return c;
            }
        }
        step = step.saturating_mul(10);
    }
}

const W: f64 = 760.0;
const H: f64 = 220.0;
const LEFT: f64 = 44.0;
const RIGHT: f64 = 8.0;
const TOP: f64 = 10.0;
const BOTTOM: f64 = 26.0;
const PLOT_W: f64 = W - LEFT - RIGHT;
const PLOT_H: f64 = H - TOP - BOTTOM;
const XMLNS: &str = "http://www.w3.org/2000/svg";

/// A coordinate or a length, to a tenth of a unit.
fn at(v: f64) -> String {
    format!("{v:.1}")
}

/// The stacked bars. `label(bucket_start_ms)` names a bucket on the x axis and in tooltips;
/// about eight buckets are labelled.
pub fn stacked_bars(chart: &Chart, title: &str, label: impl Fn(u64) -> String) -> Markup {
    let max = (0..chart.buckets)
        .map(|i| chart.bucket_total(i))
        .max()
        .unwrap_or(0);
    let top = nice_ceiling(max);
    let n = chart.buckets.max(1);
    let slot = PLOT_W / n as f64;
    let every = n.div_ceil(8).max(1);
    html! {
        svg.chart viewBox=(format!("0 0 {W} {H}")) role="img" aria-label=(title) xmlns=(XMLNS) {
            title { (title) }
            (grid(top))
            @for i in 0..chart.buckets {
                @let name = label(chart.first_ms + chart.bucket_ms * i as u64);
                (bucket_bars(chart, i, top, slot, &name))
                @if i % every == 0 {
                    @let x = LEFT + slot * (i as f64 + 0.5);
                    text.axis x=(at(x)) y=(at(H - 8.0)) text-anchor="middle" { (name) }
                }
            }
            @if chart.total() == 0 {
                text.empty x=(at(LEFT + PLOT_W / 2.0)) y=(at(TOP + PLOT_H / 2.0))
                    text-anchor="middle" {
                    "no decisions in this range"
                }
            }
        }
    }
}

/// The grid lines and y labels: 0, half (when `top` halves evenly), top.
fn grid(top: u64) -> Markup {
    let half = top.is_multiple_of(2).then_some((0.5, top / 2));
    let ticks = [Some((0.0, 0)), half, Some((1.0, top))]
        .into_iter()
        .flatten();
    html! {
        @for (frac, value) in ticks {
            @let y = TOP + PLOT_H * (1.0 - frac);
            line.grid x1=(LEFT) y1=(at(y)) x2=(at(W - RIGHT)) y2=(at(y))
                stroke="#d0d4da" stroke-width="1" {}
            text.axis x=(at(LEFT - 6.0)) y=(at(y + 4.0)) text-anchor="end" { (value) }
        }
    }
}

/// Bucket `i`'s bar: one rect per series with a count there, stacked from the x axis up in
/// the series' order, each with its tooltip.
fn bucket_bars(chart: &Chart, i: usize, top: u64, slot: f64, label: &str) -> Markup {
    let bar_w = (slot * 0.8).max(1.0);
    let x = LEFT + slot * i as f64 + (slot - bar_w) / 2.0;
    let mut y = TOP + PLOT_H;
    let mut parts = Vec::new();
    for s in &chart.series {
        let v = s.values.get(i).copied().unwrap_or(0);
        if v == 0 {
            continue;
        }
        let h = PLOT_H * v as f64 / top as f64;
        y -= h;
        parts.push((s, v, y, h));
    }
    html! {
        @for (s, v, y, h) in parts {
            rect.bar x=(at(x)) y=(at(y)) width=(at(bar_w)) height=(at(h)) fill=(s.colour)
                data-verdict=(s.verdict.as_str()) data-reason=(s.reason) data-count=(v) {
                title { (label) " · " (s.verdict.as_str()) " " (s.reason) ": " (v) }
            }
        }
    }
}

/// A verdict's colour as a legend swatch (decorative: the legend names it in text).
pub fn swatch(colour: &str) -> Markup {
    html! {
        svg width="10" height="10" aria-hidden="true" {
            rect width="10" height="10" fill=(colour) {}
        }
    }
}

/// A key's spend and reservations against its ceiling: spend solid, reserved lighter, the
/// rest empty; past the ceiling the bar is full and marked.
pub fn budget_bar(spend_nano: u64, reserved_nano: u64, ceiling_nano: u64) -> Markup {
    const BW: f64 = 220.0;
    const BH: f64 = 14.0;
    let frac = |v: u64| {
        if ceiling_nano == 0 {
            1.0
        } else {
            (v as f64 / ceiling_nano as f64).min(1.0)
        }
    };
    let spend_w = BW * frac(spend_nano);
    let reserved_w = (BW * frac(spend_nano.saturating_add(reserved_nano)) - spend_w).max(0.0);
    let used = spend_nano.saturating_add(reserved_nano);
    let pct = if ceiling_nano == 0 {
        100.0
    } else {
        used as f64 * 100.0 / ceiling_nano as f64
    };
    let colour = if pct >= 90.0 { "#c62828" } else { "#1565c0" };
    let said = format!("{pct:.1}% of the ceiling spent or reserved");
    html! {
        svg.budget viewBox=(format!("0 0 {BW} {BH}")) width=(BW) height=(BH) role="img"
            aria-label=(said) xmlns=(XMLNS) {
            title { (said) }
            rect x="0" y="0" width=(BW) height=(BH) fill="#eceff3" rx="3" {}
            rect x="0" y="0" width=(at(spend_w)) height=(BH) fill=(colour) rx="3"
                data-part="spend" {}
            rect x=(at(spend_w)) y="0" width=(at(reserved_w)) height=(BH) fill=(colour)
                fill-opacity="0.35" data-part="reserved" {}
        }
    }
}

/// A value and its interval on a number line that always shows zero; values are ratios,
/// labelled as percentages.
pub fn interval(value: Option<f64>, low: f64, high: f64) -> Markup {
    const IW: f64 = 420.0;
    const IH: f64 = 46.0;
    const PAD: f64 = 24.0;
    let finite = |v: f64| if v.is_finite() { v } else { 0.0 };
    let (low, high) = (finite(low.min(high)), finite(high.max(low)));
    let lo = low.min(value.map(finite).unwrap_or(low)).min(0.0);
    let hi = high.max(value.map(finite).unwrap_or(high)).max(0.0);
    let span = (hi - lo).max(1e-9);
    let (lo, hi) = (lo - span * 0.1, hi + span * 0.1);
    let x = |v: f64| at(PAD + (IW - 2.0 * PAD) * (v - lo) / (hi - lo));
    let pct = |v: f64| format!("{:.1}%", v * 100.0);
    html! {
        svg.interval viewBox=(format!("0 0 {IW} {IH}")) role="img"
            aria-label=(format!("interval {} to {}", pct(low), pct(high))) xmlns=(XMLNS) {
            line x1=(PAD) y1="20" x2=(at(IW - PAD)) y2="20" stroke="#d0d4da" stroke-width="1" {}
            line x1=(x(0.0)) y1="8" x2=(x(0.0)) y2="32" stroke="#6b7280" stroke-width="1"
                stroke-dasharray="3 2" {}
            text.axis x=(x(0.0)) y="43" text-anchor="middle" { "0" }
            line x1=(x(low)) y1="20" x2=(x(high)) y2="20" stroke="#1565c0" stroke-width="4"
                data-part="interval" {}
            text.axis x=(x(low)) y="12" text-anchor="middle" { (pct(low)) }
            text.axis x=(x(high)) y="12" text-anchor="middle" { (pct(high)) }
            @if let Some(v) = value.filter(|v| v.is_finite()) {
                circle cx=(x(v)) cy="20" r="5" fill="#0d47a1" data-part="value" {
                    title { (pct(v)) }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(bucket: u64, verdict: Verdict, reason: &str, n: u64) -> VerdictCount {
        VerdictCount {
            bucket_start_ms: bucket,
            verdict,
            reason: reason.into(),
            count: n,
        }
    }

    fn attr_values(svg: &str, attr: &str) -> Vec<f64> {
        let needle = format!(" {attr}=\"");
        svg.match_indices(&needle)
            .map(|(i, _)| {
                let rest = &svg[i + needle.len()..];
                rest[..rest.find('"').unwrap()].parse().unwrap()
            })
            .collect()
    }

    #[test]
    fn counts_land_in_their_bucket_and_series_follow_the_verdict_order() {
        let counts = [
            count(1_000, Verdict::Block, "runaway_loop", 2),
            count(1_000, Verdict::Allow, "allow", 3),
            count(3_000, Verdict::Block, "runaway_burst", 1),
            count(3_000, Verdict::Allow, "allow", 1),
            count(0, Verdict::Allow, "allow", 9), // before the first bucket
            count(9_000, Verdict::Serve, "serve", 9), // after the last
        ];
        let chart = Chart::build(&counts, 1_000, 1_000, 3);
        let names: Vec<(Verdict, &str)> = chart
            .series
            .iter()
            .map(|s| (s.verdict, s.reason.as_str()))
            .collect();
        assert_eq!(
            names,
            [
                (Verdict::Allow, "allow"),
                (Verdict::Block, "runaway_burst"),
                (Verdict::Block, "runaway_loop"),
            ]
        );
        assert_eq!(chart.series[0].values, [3, 0, 1]);
        assert_eq!(chart.series[2].values, [2, 0, 0]);
        assert_eq!(
            (
                chart.bucket_total(0),
                chart.bucket_total(1),
                chart.bucket_total(2)
            ),
            (5, 0, 2)
        );
        assert_eq!(chart.total(), 7);
        // Two rules of one verdict: one hue, two shades.
        assert_eq!(chart.series[1].colour, "#c62828");
        assert_ne!(chart.series[2].colour, chart.series[1].colour);
    }

    #[test]
    fn bars_are_stacked_to_scale_with_one_rect_per_nonzero_part() {
        let counts = [
            count(0, Verdict::Allow, "allow", 3),
            count(0, Verdict::Block, "runaway_loop", 2),
            count(10, Verdict::Allow, "allow", 10),
        ];
        let chart = Chart::build(&counts, 0, 10, 2);
        let svg = stacked_bars(&chart, "verdicts", |ms| format!("t{ms}")).into_string();
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"));
        assert_eq!(svg.matches("<rect class=\"bar\"").count(), 3);
        let heights = attr_values(&svg, "height");
        let plot_h = H - TOP - BOTTOM;
        // The y axis tops at 10: the tallest bar fills the plot, the others are to scale.
        assert_eq!(nice_ceiling(10), 10);
        let expected = [plot_h * 0.3, plot_h * 0.2, plot_h];
        for (h, e) in heights.iter().zip(expected) {
            assert!((h - e).abs() < 0.11, "{h} vs {e}");
        }
        assert!(svg.contains(r#"data-verdict="BLOCK" data-reason="runaway_loop" data-count="2""#));
        assert!(svg.contains("<title>t0 · BLOCK runaway_loop: 2</title>"));
        assert!(!svg.contains("style="), "the CSP forbids inline styles");
    }

    #[test]
    fn text_is_escaped_and_an_empty_chart_says_so() {
        let counts = [count(0, Verdict::Block, "<script>&\"", 1)];
        let chart = Chart::build(&counts, 0, 10, 1);
        let svg = stacked_bars(&chart, "a <b> & \"c\"", |_| "<x>".into()).into_string();
        assert!(!svg.contains("<script>") && !svg.contains("<b>") && !svg.contains("<x>"));
        assert!(svg.contains("&lt;script&gt;&amp;&quot;"));
        let empty =
            stacked_bars(&Chart::build(&[], 0, 10, 4), "none", |_| String::new()).into_string();
        assert!(empty.contains("no decisions in this range"));
        assert_eq!(empty.matches("<rect").count(), 0);
    }

    #[test]
    fn nice_ceilings() {
        let cases = [
            (0, 1),
            (1, 1),
            (2, 2),
            (3, 5),
            (6, 10),
            (11, 20),
            (49, 50),
            (501, 1000),
        ];
        for (v, c) in cases {
            assert_eq!(nice_ceiling(v), c, "{v}");
        }
        assert_eq!(nice_ceiling(u64::MAX), u64::MAX);
    }

    #[test]
    fn the_budget_bar_shows_spend_then_reserved_and_caps_at_the_ceiling() {
        let svg = budget_bar(50, 25, 100).into_string();
        let widths = attr_values(&svg, "width");
        // The svg, the background, spend, reserved.
        assert_eq!(widths[2], 110.0);
        assert_eq!(widths[3], 55.0);
        assert!(svg.contains("75.0% of the ceiling"));
        let over = budget_bar(150, 10, 100).into_string();
        let widths = attr_values(&over, "width");
        assert_eq!((widths[2], widths[3]), (220.0, 0.0));
        assert!(over.contains("#c62828"), "past 90 % the bar turns red");
        assert!(
            budget_bar(0, 0, 0).into_string().contains("100.0%"),
            "a zero ceiling is all used"
        );
    }

    #[test]
    fn the_interval_always_shows_zero_and_the_value() {
        let svg = interval(Some(0.3), 0.2, 0.4).into_string();
        assert!(svg.contains(">20.0%<") && svg.contains(">40.0%<") && svg.contains(">0<"));
        assert!(svg.contains("data-part=\"value\""));
        let xs = attr_values(&svg, "x1");
        // The zero line lies left of the interval.
        assert!(xs[1] < xs[2], "{xs:?}");
        let none = interval(None, f64::NAN, f64::INFINITY).into_string();
        assert!(!none.contains("data-part=\"value\""));
        assert!(!none.contains("NaN") && !none.contains("inf"));
    }
}
