//! The score: Σ weight × signal over nine signals in [0, 1], plus the unattended weight when
//! no human is declared (so the score can exceed 1).

use serde::{Deserialize, Serialize};

use super::rules::{BudgetState, WorstCase};
use super::windows::WindowCounts;
use super::{GateConfig, Saturation};
use crate::request::RequestShape;

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Signals {
    pub exposure: f64,
    pub size: f64,
    pub ask: f64,
    pub depth: f64,
    pub tools: f64,
    #[serde(rename = "loop")]
    pub loop_: f64,
    pub burst: f64,
    pub grind: f64,
    pub novelty: f64,
    /// 1 when no human is declared, else 0; weighted outside the base sum.
    pub unattended: f64,
}

fn ratio(count: u64, saturation: u64) -> f64 {
    (count as f64 / saturation as f64).min(1.0)
}

pub fn signals(
    s: &Saturation,
    shape: &RequestShape,
    counts: &WindowCounts,
    budget: Option<&BudgetState>,
    worst: &WorstCase,
    human: bool,
) -> Signals {
    let exposure = match budget {
        None => 0.0,
        Some(b) => {
            let left = b.left_nano();
            match worst.cost_nano {
                _ if left <= 0 => 1.0,
                None => 1.0,
                Some(cost) => (cost as f64 / left as f64).min(1.0),
            }
        }
    };
    let size = ((1.0 + shape.prompt_chars() as f64).ln() / (1.0 + s.size as f64).ln()).min(1.0);
    Signals {
        exposure,
        size,
        ask: shape.max_tokens.map_or(1.0, |m| ratio(m, s.ask)),
        depth: ratio(shape.turns.len() as u64, s.depth),
        tools: ratio(shape.tools.len() as u64, s.tools),
        loop_: ratio(counts.earlier_identical, s.loop_),
        burst: ratio(counts.earlier_key_minute, s.burst),
        grind: ratio(counts.earlier_key_hour, s.grind),
        novelty: if counts.model_seen { 0.0 } else { 1.0 },
        unattended: if human { 0.0 } else { 1.0 },
    }
}

/// The weighted sum, rounded to 9 decimals so that floating-point noise in the sum
/// (0.5499999999999999 for an exact 0.55) never decides a band.
pub fn score(cfg: &GateConfig, s: &Signals) -> f64 {
    let w = &cfg.weights;
    let raw = w.exposure * s.exposure
        + w.size * s.size
        + w.ask * s.ask
        + w.depth * s.depth
        + w.tools * s.tools
        + w.loop_ * s.loop_
        + w.burst * s.burst
        + w.grind * s.grind
        + w.novelty * s.novelty
        + w.unattended * s.unattended;
    (raw * 1e9).round() / 1e9
}
