//! The summary as text, for the command line: everything the JSON says that a reader needs
//! before using a number — the provider and clients, the arms, each metric's class, status,
//! what it is not and its warnings, the freshness reasons, every pair.

use std::fmt::Write as _;

use super::model::*;

fn pct(x: f64) -> String {
    format!("{:.1}%", x * 100.0)
}

fn word<T: serde::Serialize>(x: &T) -> String {
    serde_json::to_value(x)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// A plain-text rendering of a summary.
pub fn render_text(s: &EconomicsSummary) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "tokensaver economics summary");
    if !s.present {
        let _ = writeln!(o, "verdict: {}", s.verdict.statement);
        for d in &s.diagnostics {
            let _ = writeln!(o, "diagnostic: {d}");
        }
        return o;
    }
    header(&mut o, s);
    let _ = writeln!(
        o,
        "\nverdict ({}{}): {}",
        if s.verdict.publishable {
            "publishable"
        } else {
            "not publishable"
        },
        if s.simulated { ", simulation" } else { "" },
        s.verdict.statement
    );
    for u in &s.verdict.unmet {
        let _ = writeln!(o, "  unmet: {u}");
    }
    variants(&mut o, s);
    suites(&mut o, s);
    metrics(&mut o, s);
    context(&mut o, s);
    stuck(&mut o, s);
    mechanisms(&mut o, s);
    hypotheses(&mut o, s);
    segments(&mut o, s);
    pairs(&mut o, s);
    if !s.history.is_empty() {
        let _ = writeln!(o, "\nhistory (one line per evidence file and metric):");
        for h in &s.history {
            let _ = writeln!(
                o,
                "  {} {} methodology v{} build {} {}: {} = {} (n {})",
                h.at,
                h.file,
                h.methodology,
                h.revision,
                h.provider,
                h.metric,
                pct(h.value),
                h.n
            );
        }
    }
    for d in &s.diagnostics {
        let _ = writeln!(o, "diagnostic: {d}");
    }
    o
}

fn header(o: &mut String, s: &EconomicsSummary) {
    if let Some(v) = s.methodology {
        let _ = writeln!(
            o,
            "methodology: v{v}{}",
            s.methodology_blake3
                .as_ref()
                .map(|h| format!(" (blake3 {})", h.get(..12).unwrap_or(h)))
                .unwrap_or_default()
        );
    }
    if let Some(q) = &s.question {
        let _ = writeln!(o, "question: {q}");
    }
    if s.query.is_narrowed() {
        let _ = writeln!(
            o,
            "query: {} (metrics and pairs narrowed; the verdict is over all the evidence)",
            serde_json::to_string(&s.query).unwrap_or_default()
        );
    }
}

fn variants(o: &mut String, s: &EconomicsSummary) {
    if s.variants.is_empty() {
        return;
    }
    let _ = writeln!(o, "\narms:");
    for v in &s.variants {
        let _ = writeln!(
            o,
            "  {} ({}): {} — {}",
            v.id, v.role, v.title, v.description
        );
        if !v.excludes.is_empty() {
            let _ = writeln!(o, "    excludes: {}", v.excludes.join("; "));
        }
    }
}

fn suites(o: &mut String, s: &EconomicsSummary) {
    let _ = writeln!(o, "\nsuites:");
    for v in &s.suites {
        if v.kind == SuiteKind::Context {
            let _ = writeln!(
                o,
                "  {} (context, v{}): {} — reads the treatment requests of {}",
                v.id,
                v.version,
                word(&v.freshness),
                v.evidence_file.as_deref().unwrap_or("no evidence")
            );
            continue;
        }
        let _ = writeln!(
            o,
            "  {} ({}, v{}): {} — runs {}, pairs declared {} attempted {} valid {} control_failed {} treatment_failed {} both_failed {} other {}",
            v.id,
            v.kind.as_str(),
            v.version,
            word(&v.freshness),
            v.runs,
            v.pairs.declared,
            v.pairs.attempted,
            v.pairs.valid,
            v.pairs.control_failed,
            v.pairs.treatment_failed,
            v.pairs.both_failed,
            v.pairs.other
        );
        // Stale: every reason; current: how, when another build recorded it (replayed).
        if let Some(d) = &v.freshness_detail {
            let _ = writeln!(o, "    {}: {d}", word(&v.freshness));
        }
        if let Some(f) = &v.evidence_file {
            let _ = writeln!(o, "    evidence: {f}");
        }
        if let Some(p) = &v.provider {
            let _ = writeln!(
                o,
                "    provider: {} — {} at {}; usage {}",
                word(&p.kind),
                p.name,
                p.upstream,
                p.usage_counting
            );
        }
        for c in &v.clients {
            let _ = writeln!(
                o,
                "    client: {} ({}) {}, model {}",
                c.id, c.program, c.version, c.model
            );
        }
        for r in &v.revisions {
            let _ = writeln!(o, "    build: {r}");
        }
        for h in &v.harnesses {
            let _ = writeln!(o, "    harness: {h}");
        }
    }
}

fn metrics(o: &mut String, s: &EconomicsSummary) {
    let _ = writeln!(o, "\nmetrics:");
    for m in &s.metrics {
        let value = match (m.value, m.unit.as_str()) {
            (None, _) => "—".to_string(),
            (Some(v), "ratio") => pct(v),
            (Some(v), _) => format!("{v:.0}"),
        };
        let interval = m
            .interval
            .as_ref()
            .map(|i| {
                format!(
                    " [{}% interval {} to {}, {} resamples, seed {}]",
                    f64::from(i.level_bp) / 100.0,
                    pct(i.low),
                    pct(i.high),
                    i.resamples,
                    i.seed
                )
            })
            .unwrap_or_default();
        let _ = writeln!(
            o,
            "  {} = {value}{interval} — {}, class {}{}, unit {}, n {}, suite {}",
            m.id,
            word(&m.status),
            word(&m.class),
            m.inputs
                .map(|c| format!(" from {}", word(&c)))
                .unwrap_or_default(),
            m.unit,
            m.n,
            m.suite
        );
        let _ = writeln!(o, "    formula: {}", m.formula);
        if let Some(n) = &m.not {
            let _ = writeln!(o, "    not: {n}");
        }
        for w in &m.warnings {
            let _ = writeln!(o, "    warning: {w}");
        }
        if m.unit == "pairs" && !m.evidence.is_empty() {
            for e in &m.evidence {
                let _ = writeln!(o, "    pair: {e}");
            }
        }
    }
}

fn context(o: &mut String, s: &EconomicsSummary) {
    if let Some(c) = &s.context {
        let _ = writeln!(
            o,
            "\ncontext: {} removable of {} counted tokens ({} {}), {} runs, {} requests",
            c.removable_tokens,
            c.counted_tokens,
            c.tokenizer.encoding,
            c.tokenizer.implementation,
            c.sessions,
            c.requests
        );
        for (k, v) in &c.removable_by_finding {
            let _ = writeln!(o, "  {k}: {v}");
        }
    }
}

fn segments(o: &mut String, s: &EconomicsSummary) {
    if s.segments.is_empty() {
        return;
    }
    let _ = writeln!(
        o,
        "\nsegments (median token and cost reduction over valid pairs):"
    );
    for g in &s.segments {
        let med = |d: &Option<EconomicsDistribution>| {
            d.as_ref()
                .map(|d| pct(d.median))
                .unwrap_or_else(|| "—".into())
        };
        let _ = writeln!(
            o,
            "  {}={}: tokens {}, cost {} (n {})",
            g.dimension,
            g.value,
            med(&g.token_reduction),
            med(&g.cost_reduction),
            g.n
        );
    }
}

fn stuck(o: &mut String, s: &EconomicsSummary) {
    if s.stuck.is_empty() {
        return;
    }
    let _ = writeln!(
        o,
        "\nstuck agents (mean per run: provider calls, cost, seconds; straight → through the gate):"
    );
    for r in &s.stuck {
        let usd = |n: f64| format!("${:.4}", n / 1e9);
        let _ = writeln!(
            o,
            "  {} on {}: {:.1} calls, {}, {:.0} s → {:.1} calls (at most {}), {}, {:.0} s ({:.0} s held); {} of {} stopped; at most {} run(s) of the repeated step; cost {}",
            r.client,
            r.task,
            r.control.calls,
            usd(r.control.cost_nano_usd),
            r.control.seconds,
            r.treatment.calls,
            r.treatment.max_calls,
            usd(r.treatment.cost_nano_usd),
            r.treatment.seconds,
            r.paced_seconds,
            r.stopped,
            r.treatment.runs,
            r.most_repeat_runs,
            r.cost_reduction
                .map(|c| match c < 0.0 {
                    true => format!("{} more", pct(-c)),
                    false => format!("{} less", pct(c)),
                })
                .unwrap_or_else(|| "—".into())
        );
    }
}

fn mechanisms(o: &mut String, s: &EconomicsSummary) {
    if s.mechanisms.is_empty() {
        return;
    }
    let _ = writeln!(
        o,
        "\nmechanisms (ablation arms: the gate without one, on the pairs where it acted; saving as a share of the control arm's spend):"
    );
    let share = |v: Option<f64>, i: &Option<EconomicsInterval>| match (v, i) {
        (Some(v), Some(i)) => format!("{} [{}, {}]", pct(v), pct(i.low), pct(i.high)),
        (Some(v), None) => pct(v),
        _ => "—".into(),
    };
    for m in &s.mechanisms {
        let _ = writeln!(
            o,
            "  {} {}: cost {}, tokens {} — acted on {} of {} pairs, {} measured (ablation/{}; the gate's whole saving over them: cost {})",
            m.suite,
            m.mechanism.as_str(),
            share(m.cost_saving, &m.cost_interval),
            share(m.token_saving, &m.token_interval),
            m.acted,
            m.pairs,
            m.measured,
            m.ablation_file,
            m.gate_cost_saving.map(pct).unwrap_or_else(|| "—".into())
        );
        for w in &m.warnings {
            let _ = writeln!(o, "    warning: {w}");
        }
    }
    for n in &s.mechanism_notes {
        let _ = writeln!(o, "  {n}");
    }
}

fn hypotheses(o: &mut String, s: &EconomicsSummary) {
    if s.hypotheses.is_empty() {
        return;
    }
    let _ = writeln!(o, "\nhypotheses:");
    for h in &s.hypotheses {
        let _ = writeln!(o, "  {} ({}): {}", h.id, h.status, h.statement);
        for f in &h.figures {
            let _ = writeln!(o, "    {f}");
        }
    }
}

fn pairs(o: &mut String, s: &EconomicsSummary) {
    let _ = writeln!(o, "\npairs:");
    for p in &s.pairs {
        if p.control.is_none() && p.treatment.is_none() {
            continue;
        }
        let tokens = match (&p.control_usage, &p.treatment_usage) {
            (Some(c), Some(t)) => format!(" tokens {} → {}", c.total, t.total),
            _ => String::new(),
        };
        let _ = writeln!(
            o,
            "  {} {} r{} [{}]: {}{tokens}{}{}{}",
            p.task,
            p.client,
            p.repetition,
            p.category,
            word(&p.status),
            p.token_reduction
                .map(|r| format!(" token_reduction {}", pct(r)))
                .unwrap_or_default(),
            if p.refusals.is_empty() {
                String::new()
            } else {
                format!(" gate: {}", p.refusals.join(", "))
            },
            if p.reasons.is_empty() {
                String::new()
            } else {
                format!(" ({})", p.reasons.join("; "))
            }
        );
    }
    let missing = s
        .pairs
        .iter()
        .filter(|p| p.control.is_none() && p.treatment.is_none())
        .count();
    if missing > 0 {
        let _ = writeln!(o, "  ({missing} declared pairs have no run recorded)");
    }
}
