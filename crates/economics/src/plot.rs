//! The cost of each task run, control against treatment, as an SVG (the README's plot,
//! `tokensaver economics summary --svg FILE`). Drawn from the summary's pairs: the mean cost
//! per run over the pairs whose arms both ran and were priced, on a logarithmic axis (a stuck
//! agent's run costs a thousand times a short task's, and both must read), with each row's
//! change and the task's outcome in both arms.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use tokensaver_core::html::esc;

use super::model::{EconomicsPair, EconomicsPairStatus, EconomicsSummary};

const W: f64 = 1000.0;
const ROW: f64 = 22.0;
const LABEL: f64 = 250.0;
const RIGHT: f64 = 290.0;
const TOP: f64 = 54.0;
const BOTTOM: f64 = 40.0;
const CONTROL: &str = "#9aa3ad";
const TREATMENT: &str = "#2f7d4f";

/// One row: a task on one client (the map key of [`rows`]).
struct Row {
    control_nano: Vec<u64>,
    treatment_nano: Vec<u64>,
    both_failed: usize,
    treatment_failed: usize,
}

fn mean(v: &[u64]) -> f64 {
    v.iter().map(|&x| x as f64).sum::<f64>() / v.len().max(1) as f64
}

fn dollars(nano: f64) -> String {
    let usd = nano / 1e9;
    if usd >= 0.1 {
        format!("${usd:.2}")
    } else {
        format!("${usd:.4}")
    }
}

/// `$10^(d − 9)`, written out: a tick's label, never a float's rounding.
fn decade_label(nano_decade: i32) -> String {
    let usd = nano_decade - 9;
    if usd >= 0 {
        format!("${}", 10u64.saturating_pow(usd.unsigned_abs()))
    } else {
        format!("$0.{}1", "0".repeat(usd.unsigned_abs() as usize - 1))
    }
}

fn rows(pairs: &[EconomicsPair]) -> Vec<((String, String), Row)> {
    let mut by: BTreeMap<(String, String), Row> = BTreeMap::new();
    for p in pairs {
        let cost = |u: &Option<super::model::EconomicsUsage>| u.as_ref()?.cost_nano_usd;
        let (Some(c), Some(t)) = (cost(&p.control_usage), cost(&p.treatment_usage)) else {
            continue;
        };
        let row = by
            .entry((p.task.clone(), p.client.clone()))
            .or_insert_with(|| Row {
                control_nano: Vec::new(),
                treatment_nano: Vec::new(),
                both_failed: 0,
                treatment_failed: 0,
            });
        row.control_nano.push(c);
        row.treatment_nano.push(t);
        match p.status {
            EconomicsPairStatus::BothFailed => row.both_failed += 1,
            EconomicsPairStatus::TreatmentFailed => row.treatment_failed += 1,
            _ => {}
        }
    }
    by.into_iter().collect()
}

/// The plot, or `None` when no pair has a priced cost in both arms.
pub fn cost_per_task_svg(s: &EconomicsSummary) -> Option<String> {
    let rows = rows(&s.pairs);
    if rows.is_empty() {
        return None;
    }
    let means = || {
        rows.iter()
            .flat_map(|(_, r)| [mean(&r.control_nano), mean(&r.treatment_nano)])
    };
    // Whole decades around every mean: the axis's ends are powers of ten, each labelled.
    let positive = || means().filter(|&m| m > 0.0);
    let lo_decade = positive().fold(f64::INFINITY, f64::min).log10().floor();
    let hi_decade = positive().fold(0.0, f64::max).log10().ceil();
    let (lo_decade, hi_decade) = if lo_decade.is_finite() && hi_decade.is_finite() {
        (lo_decade, hi_decade.max(lo_decade + 1.0))
    } else {
        (0.0, 1.0)
    };
    let h = TOP + ROW * rows.len() as f64 + BOTTOM;
    let plot_w = W - LABEL - RIGHT;
    // A zero cost sits at the axis's left end.
    let x = |nano: f64| {
        let d = if nano > 0.0 { nano.log10() } else { lo_decade };
        LABEL + plot_w * ((d - lo_decade) / (hi_decade - lo_decade)).clamp(0.0, 1.0)
    };
    let title = "Mean cost per task run: straight to the provider against through the gate";
    let mut o = String::new();
    let _ = write!(
        o,
        r#"<svg viewBox="0 0 {W} {h}" role="img" aria-label="{title}" xmlns="http://www.w3.org/2000/svg" font-family="sans-serif" font-size="12">"#
    );
    let _ = write!(o, r##"<rect width="{W}" height="{h}" fill="#ffffff"/>"##);
    let _ = write!(
        o,
        r#"<title>{title}</title><text x="8" y="18" font-size="14" font-weight="bold">{title}</text>"#
    );
    let label = if s.simulated {
        "simulation: the built-in provider, billing prompt caching; cost of the provider-reported parts at the price table"
    } else {
        "cost of the provider-reported parts at the price table"
    };
    let _ = write!(
        o,
        r##"<text x="8" y="34" fill="#555">{}</text><rect x="{LABEL}" y="40" width="10" height="10" fill="{CONTROL}"/><text x="{:.0}" y="49">straight to the provider</text><rect x="{:.0}" y="40" width="10" height="10" fill="{TREATMENT}"/><text x="{:.0}" y="49">through the gate</text>"##,
        esc(label),
        LABEL + 14.0,
        LABEL + 170.0,
        LABEL + 184.0
    );
    for (i, ((task, client), r)) in rows.iter().enumerate() {
        let y = TOP + ROW * i as f64;
        let (c, t) = (mean(&r.control_nano), mean(&r.treatment_nano));
        let _ = write!(
            o,
            r#"<text x="{:.0}" y="{:.1}" text-anchor="end">{} · {}</text>"#,
            LABEL - 6.0,
            y + 15.0,
            esc(task),
            esc(client)
        );
        let _ = write!(
            o,
            r#"<rect x="{LABEL}" y="{:.1}" width="{:.1}" height="8" fill="{CONTROL}"><title>straight: {}</title></rect><rect x="{LABEL}" y="{:.1}" width="{:.1}" height="8" fill="{TREATMENT}"><title>through the gate: {}</title></rect>"#,
            y + 3.0,
            x(c) - LABEL,
            dollars(c),
            y + 11.0,
            x(t) - LABEL,
            dollars(t)
        );
        let change = if c > 0.0 {
            format!("{:+.1}%", (t / c - 1.0) * 100.0)
        } else {
            "-".into()
        };
        let outcome = if r.both_failed > 0 {
            format!(", fails in both ×{}", r.both_failed)
        } else if r.treatment_failed > 0 {
            format!(", gate broke ×{}", r.treatment_failed)
        } else {
            String::new()
        };
        let _ = write!(
            o,
            r#"<text x="{:.0}" y="{:.1}">{} → {} ({change}{outcome})</text>"#,
            W - RIGHT + 4.0,
            y + 15.0,
            dollars(c),
            dollars(t)
        );
    }
    let axis_y = h - BOTTOM + 2.0;
    let _ = write!(
        o,
        r##"<line x1="{LABEL}" y1="{axis_y:.1}" x2="{:.1}" y2="{axis_y:.1}" stroke="#888"/>"##,
        W - RIGHT
    );
    let mut decade = lo_decade;
    while decade <= hi_decade {
        let at = x(10f64.powf(decade));
        let _ = write!(
            o,
            r##"<line x1="{at:.1}" y1="{:.1}" x2="{at:.1}" y2="{:.1}" stroke="#888"/><text x="{at:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
            axis_y - 3.0,
            axis_y + 3.0,
            axis_y + 14.0,
            decade_label(decade as i32)
        );
        decade += 1.0;
    }
    let _ = write!(
        o,
        r##"<text x="{:.1}" y="{:.1}" text-anchor="end" fill="#555">log scale</text>"##,
        W - RIGHT,
        axis_y + 26.0
    );
    o.push_str("</svg>\n");
    Some(o)
}

#[cfg(test)]
mod tests {
    use super::decade_label;

    #[test]
    fn decade_labels_are_written_out() {
        assert_eq!(decade_label(9), "$1");
        assert_eq!(decade_label(11), "$100");
        assert_eq!(decade_label(8), "$0.1");
        assert_eq!(decade_label(5), "$0.0001");
    }
}
