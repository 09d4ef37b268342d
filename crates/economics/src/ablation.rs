//! Ablation arms: every saving attributed to the mechanism that made it (issue "evidence").
//!
//! An ablation arm runs the gate with one mechanism off (`[[keys]] without`), on the pairs of a
//! suite's evidence where that mechanism acted. Where it acted is found without a run: the
//! recorded treatment calls are replayed through the gate with and without the mechanism, and
//! a pair whose calls are all decided and edited alike is one where, without it, the gate
//! forwards every call as it did — an ablation run of that pair would be the same run again,
//! so the mechanism's saving there is 0 by construction. The pairs where it acted are recorded
//! again (both arms, as every pair), with the treatment's key going without it.
//!
//! A mechanism's saving on a pair is what the ablated treatment bought over what the full
//! gate's treatment bought (of the suite's evidence), in cost and in tokens; over the suite,
//! the sum of those over the sum of the control arm's spend: the share of the straight-to-the-
//! provider bill that this mechanism alone took off. The interval is a bootstrap over tasks.
//! The mechanisms' savings need not add up to the gate's: two mechanisms can save the same
//! dollars (stopping a stuck loop also ends its cache reads), and the difference is stated.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use tokensaver_core::gate::Mechanism;

use crate::model::{
    BootstrapDecl, EconomicsInterval, EconomicsMechanism, EconomicsPair, EconomicsPairStatus,
    EvidenceFile,
};
use crate::stats::cluster_bootstrap;

/// `ablations.json`: the ablation arms a suite's evidence may be taken apart with. Versioned
/// and hashed like the methodology, apart from it: an ablation arm added later leaves the
/// suites' evidence as it is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AblationDecl {
    pub version: u32,
    pub title: String,
    pub arms: Vec<AblationArm>,
}

/// One ablation arm: the treatment's key goes without one mechanism.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AblationArm {
    pub id: String,
    pub without: Mechanism,
    pub title: String,
}

/// An ablation arm's recording (`ablation/<suite>/<UTC time>-<id>.json`): the pairs where the
/// mechanism acted in one evidence file, recorded again with the treatment going without it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AblationFile {
    /// 1 (this layout).
    pub format: u32,
    pub arm: String,
    pub without: Mechanism,
    /// BLAKE3 of `ablations.json` as it was when recorded.
    pub ablations_blake3: String,
    /// The evidence file (relative to `evidence/`) whose full-gate pairs it is paired with.
    pub against: String,
    pub against_recorded_at_unix_ms: u64,
    /// Pair id → the treatment calls decided or edited otherwise without the mechanism (its
    /// replay): the pairs recorded again. Every other pair saved nothing by it.
    pub acted: BTreeMap<String, usize>,
    /// The runs, as `tokensaver economics run` records a suite's.
    pub evidence: EvidenceFile,
}

/// The ablation layout this build writes and reads.
pub const ABLATION_FORMAT: u32 = 1;

/// One pair's figures: `(task, control, full treatment, ablated treatment)` in one unit.
type Cell = (String, f64, f64, f64);

fn share(cells: &[Cell]) -> Option<f64> {
    let control: f64 = cells.iter().map(|c| c.1).sum();
    (control > 0.0).then(|| cells.iter().map(|c| c.3 - c.2).sum::<f64>() / control)
}

fn gate_share(cells: &[Cell]) -> Option<f64> {
    let control: f64 = cells.iter().map(|c| c.1).sum();
    (control > 0.0).then(|| cells.iter().map(|c| c.1 - c.2).sum::<f64>() / control)
}

fn interval(cells: &[Cell], boot: &BootstrapDecl) -> Option<EconomicsInterval> {
    let mut by_task: BTreeMap<&str, Vec<Cell>> = BTreeMap::new();
    for c in cells {
        by_task.entry(&c.0).or_default().push(c.clone());
    }
    let clusters: Vec<Vec<Cell>> = by_task.into_values().collect();
    let (low, high) =
        cluster_bootstrap(&clusters, share, boot.resamples, boot.seed, boot.level_bp)?;
    Some(EconomicsInterval {
        level_bp: boot.level_bp,
        low,
        high,
        method: "percentile bootstrap over tasks (a task's pairs resampled together)".into(),
        resamples: boot.resamples,
        seed: boot.seed,
    })
}

/// Whether a pair counts: valid for healthy work; both arms recorded for stuck agents (whose
/// runs fail by design).
fn counts(p: &EconomicsPair, stuck: bool) -> bool {
    match p.status {
        EconomicsPairStatus::Valid => true,
        EconomicsPairStatus::BothFailed => stuck,
        _ => false,
    }
}

/// A mechanism's saving over a suite: `full` the pairs of the suite's evidence, `ablated` the
/// pairs of the ablation file's runs.
pub fn mechanism(
    suite: &str,
    stuck: bool,
    (name, file): (&str, &AblationFile),
    full: &[EconomicsPair],
    ablated: &[EconomicsPair],
    boot: &BootstrapDecl,
) -> EconomicsMechanism {
    let id = |p: &EconomicsPair| crate::pair_id(&p.task, &p.client, p.repetition);
    let ablated: BTreeMap<String, &EconomicsPair> = ablated.iter().map(|p| (id(p), p)).collect();
    let (mut cost, mut tokens) = (Vec::new(), Vec::new());
    let (mut pairs, mut acted, mut measured, mut not_recorded) = (0, 0, 0, 0);
    for p in full.iter().filter(|p| counts(p, stuck)) {
        let (Some(c), Some(t)) = (&p.control_usage, &p.treatment_usage) else {
            continue;
        };
        pairs += 1;
        let cost_of = |u: &crate::model::EconomicsUsage| u.cost_nano_usd.map(|n| n as f64);
        let without = if file.acted.contains_key(&id(p)) {
            acted += 1;
            let recorded = ablated.get(&id(p)).filter(|a| a.treatment.is_some());
            not_recorded += usize::from(recorded.is_none());
            match recorded.filter(|a| counts(a, stuck)) {
                Some(a) => match &a.treatment_usage {
                    Some(u) => {
                        measured += 1;
                        Some((cost_of(u), u.total as f64))
                    }
                    None => None,
                },
                None => None,
            }
        } else {
            // Not acted on: without the mechanism the run is this one.
            Some((cost_of(t), t.total as f64))
        };
        let Some((ablated_cost, ablated_tokens)) = without else {
            continue;
        };
        tokens.push((
            p.task.clone(),
            c.total as f64,
            t.total as f64,
            ablated_tokens,
        ));
        if let (Some(cc), Some(tc), Some(ac)) = (cost_of(c), cost_of(t), ablated_cost) {
            cost.push((p.task.clone(), cc, tc, ac));
        }
    }
    let mut warnings = Vec::new();
    if not_recorded > 0 {
        warnings.push(format!(
            "{not_recorded} of the {acted} pairs it acted on were not recorded without it (fewer repetitions): left out"
        ));
    }
    if measured + not_recorded < acted {
        warnings.push(format!(
            "{} of the {acted} pairs it acted on did not count without it (a run failed or bought nothing priced): left out",
            acted - measured - not_recorded
        ));
    }
    EconomicsMechanism {
        suite: suite.to_string(),
        mechanism: file.without,
        arm: file.arm.clone(),
        ablation_file: name.to_string(),
        pairs,
        acted,
        measured,
        cost_saving: share(&cost),
        cost_interval: interval(&cost, boot),
        token_saving: share(&tokens),
        token_interval: interval(&tokens, boot),
        gate_cost_saving: gate_share(&cost),
        gate_token_saving: gate_share(&tokens),
        warnings,
    }
}

/// The gate's whole saving over every pair of the suite that counts (cost): what the
/// mechanisms' savings are read beside.
pub fn gate_cost_saving(full: &[EconomicsPair], stuck: bool) -> Option<f64> {
    let cells: Vec<Cell> = full
        .iter()
        .filter(|p| counts(p, stuck))
        .filter_map(|p| {
            let c = p.control_usage.as_ref()?.cost_nano_usd? as f64;
            let t = p.treatment_usage.as_ref()?.cost_nano_usd? as f64;
            Some((p.task.clone(), c, t, t))
        })
        .collect();
    gate_share(&cells)
}

/// The sentence that reads the mechanisms' savings beside the gate's whole saving `gate`
/// (cost). A mechanism measured on part of the pairs it acted on counts with its share over
/// those.
pub fn overlap(rows: &[&EconomicsMechanism], gate: Option<f64>) -> Option<String> {
    rows.first()?;
    let gate = gate?;
    let sum: f64 = rows.iter().filter_map(|r| r.cost_saving).sum();
    let pct = |x: f64| format!("{:.1}%", 100.0 * x);
    Some(if (sum - gate).abs() < 0.005 {
        format!(
            "the mechanisms' savings add up to the gate's ({} against {})",
            pct(sum),
            pct(gate)
        )
    } else if sum > gate {
        format!(
            "the mechanisms' savings add up to {} against the gate's {}: {} is saved by more than one of them (each alone would take it off)",
            pct(sum),
            pct(gate),
            pct(sum - gate)
        )
    } else {
        format!(
            "the mechanisms' savings add up to {} against the gate's {}: {} is not attributed to any one of them (only together, or by a mechanism not ablated)",
            pct(sum),
            pct(gate),
            pct(gate - sum)
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::EconomicsUsage;

    fn pair(task: &str, rep: u32, control: u64, treatment: u64) -> EconomicsPair {
        let usage = |n: u64| EconomicsUsage {
            total: n,
            cost_nano_usd: Some(10 * n),
            ..EconomicsUsage::default()
        };
        EconomicsPair {
            suite: "healthy-work".into(),
            task: task.into(),
            category: "c".into(),
            client: "codex".into(),
            sessions: 1,
            repetition: rep,
            seed: 1,
            model: "m".into(),
            control: Some(format!("{task}--codex--r{rep}--direct")),
            treatment: Some(format!("{task}--codex--r{rep}--gate")),
            status: EconomicsPairStatus::Valid,
            reasons: vec![],
            control_usage: Some(usage(control)),
            treatment_usage: Some(usage(treatment)),
            token_reduction: None,
            request_reduction: None,
            cost_reduction: None,
            tool_call_reduction: None,
            continuation_reduction: None,
            first_request_overhead: None,
            succeeded: Some([true, true]),
            refusals: vec![],
            tokens_not_bought: None,
            seconds: None,
            paced_ms: None,
            repeat_runs: None,
        }
    }

    fn file(acted: &[&str]) -> AblationFile {
        let ev: EvidenceFile = serde_json::from_value(serde_json::json!({
            "format": 2, "suite": "healthy-work", "methodology": 4, "methodology_blake3": "",
            "recorded_at_unix_ms": 0,
            "build": {"source_blake3": "", "version": ""}, "gate_config_blake3": "",
            "provider": {"kind": "simulated", "name": "", "upstream": "", "usage_counting": ""},
            "clients": [], "harness": {"path": "", "version": "", "blake3": ""},
            "tasks": {}, "repetitions": 1,
            "tokenizer": {"encoding": "", "implementation": ""}, "runs": []
        }))
        .unwrap();
        AblationFile {
            format: ABLATION_FORMAT,
            arm: "gate-without-serve".into(),
            without: Mechanism::Serve,
            ablations_blake3: String::new(),
            against: "healthy-work/x.json".into(),
            against_recorded_at_unix_ms: 0,
            acted: acted.iter().map(|p| (p.to_string(), 3)).collect(),
            evidence: ev,
        }
    }

    fn boot() -> BootstrapDecl {
        BootstrapDecl {
            seed: 7,
            resamples: 200,
            level_bp: 9500,
        }
    }

    #[test]
    fn a_mechanism_saves_what_its_ablated_runs_bought_more_and_nothing_where_it_did_not_act() {
        // Three tasks; the mechanism acted on two pairs of task a.
        let full = vec![
            pair("a", 1, 1000, 600),
            pair("a", 2, 1000, 700),
            pair("b", 1, 1000, 1000),
            pair("c", 1, 2000, 1800),
        ];
        let ablated = vec![pair("a", 1, 1000, 950), pair("a", 2, 1000, 1000)];
        let f = file(&["a--codex--r1", "a--codex--r2"]);
        let m = mechanism("healthy-work", false, ("x", &f), &full, &ablated, &boot());
        assert_eq!((m.pairs, m.acted, m.measured), (4, 2, 2));
        // (350 + 300) / 5000 of the control's spend; the gate's own: (400 + 300 + 0 + 200) / 5000.
        assert!((m.token_saving.unwrap() - 650.0 / 5000.0).abs() < 1e-12);
        assert!((m.cost_saving.unwrap() - 650.0 / 5000.0).abs() < 1e-12);
        assert!((m.gate_cost_saving.unwrap() - 900.0 / 5000.0).abs() < 1e-12);
        let i = m.cost_interval.clone().unwrap();
        assert!(i.low <= m.cost_saving.unwrap() && m.cost_saving.unwrap() <= i.high);
        assert!(i.low >= 0.0, "no resample of these pairs loses money");
        assert!(m.warnings.is_empty());
        let text = overlap(&[&m], m.gate_cost_saving).unwrap();
        assert!(
            text.contains("13.0%") && text.contains("18.0%") && text.contains("5.0%"),
            "{text}"
        );

        // A pair it acted on without a run to measure is left out, and said so.
        let m = mechanism(
            "healthy-work",
            false,
            ("x", &f),
            &full,
            &ablated[..1],
            &boot(),
        );
        assert_eq!((m.acted, m.measured), (2, 1));
        assert!((m.token_saving.unwrap() - 350.0 / 4000.0).abs() < 1e-12);
        assert_eq!(m.warnings.len(), 1);
    }
}
