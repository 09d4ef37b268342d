//! Hard rules: absolute, never tuned. Runaway rules read the windows; budget rules read spend.

use serde::{Deserialize, Serialize};

use super::windows::WindowCounts;
use crate::prices::Prices;
use crate::request::RequestShape;

/// The 8th identical request in 120 s (seven earlier ones).
pub const LOOP_LIMIT: u64 = 8;
/// The 4th identical request in 120 s with no human declared.
pub const LOOP_UNATTENDED_LIMIT: u64 = 4;
/// The 120th request from one key in 60 s.
pub const BURST_LIMIT: u64 = 120;
/// Input is estimated cautiously at one token per this many characters.
pub const CHARS_PER_INPUT_TOKEN: u64 = 3;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Rule {
    RunawayLoop,
    RunawayLoopUnattended,
    RunawayBurst,
    BudgetExhausted,
    ExceedsRemainingBudget,
}

impl Rule {
    pub const ALL: [Rule; 5] = [
        Rule::RunawayLoop,
        Rule::RunawayLoopUnattended,
        Rule::RunawayBurst,
        Rule::BudgetExhausted,
        Rule::ExceedsRemainingBudget,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Rule::RunawayLoop => "runaway_loop",
            Rule::RunawayLoopUnattended => "runaway_loop_unattended",
            Rule::RunawayBurst => "runaway_burst",
            Rule::BudgetExhausted => "budget_exhausted",
            Rule::ExceedsRemainingBudget => "exceeds_remaining_budget",
        }
    }

    pub fn is_runaway(self) -> bool {
        matches!(
            self,
            Rule::RunawayLoop | Rule::RunawayLoopUnattended | Rule::RunawayBurst
        )
    }
}

/// The first runaway rule that holds, in the order the receipt names them. The request being
/// decided counts: the 8th identical request is the one with seven earlier ones.
pub fn runaway_rule(counts: &WindowCounts, human: bool) -> Option<Rule> {
    let identical = counts.earlier_identical.saturating_add(1);
    if identical >= LOOP_LIMIT {
        Some(Rule::RunawayLoop)
    } else if identical >= LOOP_UNATTENDED_LIMIT && !human {
        Some(Rule::RunawayLoopUnattended)
    } else if counts.earlier_key_minute.saturating_add(1) >= BURST_LIMIT {
        Some(Rule::RunawayBurst)
    } else {
        None
    }
}

/// A key's budget as the gate sees it, all in nano-USD.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BudgetState {
    pub ceiling_nano: u64,
    pub spend_nano: u64,
    pub reserved_nano: u64,
}

impl BudgetState {
    /// ceiling − spend − reserved; negative when settled spend overshot the reservations.
    pub fn left_nano(&self) -> i128 {
        i128::from(self.ceiling_nano) - i128::from(self.spend_nano) - i128::from(self.reserved_nano)
    }

    pub fn exhausted(&self) -> bool {
        self.spend_nano >= self.ceiling_nano
    }
}

/// The most this call could cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorstCase {
    /// ⌈prompt_chars ÷ 3⌉: an estimate, labelled as such.
    pub input_tokens_estimated: u64,
    /// The exact `max_tokens` ceiling × `n`, else the model's maximum output × `n`;
    /// `None` when neither is known (unbounded).
    pub output_tokens: Option<u64>,
    /// Cost in nano-USD at the requested model's prices; `None` = unbounded (no price).
    pub cost_nano: Option<u64>,
}

impl WorstCase {
    pub fn tokens(&self) -> Option<u64> {
        self.output_tokens
            .map(|out| out.saturating_add(self.input_tokens_estimated))
    }
}

pub fn worst_case(shape: &RequestShape, prices: Option<&Prices>) -> WorstCase {
    let input = shape.prompt_chars().div_ceil(CHARS_PER_INPUT_TOKEN);
    let ceiling = shape.max_tokens.or(prices.map(|p| p.max_output));
    let output = ceiling.map(|c| c.saturating_mul(shape.choices()));
    let cost = match (prices, output) {
        (Some(p), Some(out)) => Some(
            super::tokens_cost_nano(input, p.input)
                .saturating_add(super::tokens_cost_nano(out, p.output)),
        ),
        _ => None,
    };
    WorstCase {
        input_tokens_estimated: input,
        output_tokens: output,
        cost_nano: cost,
    }
}

/// `exceeds_remaining_budget`: the worst case could cost more than is left (equal is fine).
pub fn exceeds_remaining(budget: &BudgetState, worst: &WorstCase) -> bool {
    match worst.cost_nano {
        None => true,
        Some(cost) => i128::from(cost) > budget.left_nano(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(identical: u64, minute: u64) -> WindowCounts {
        WindowCounts {
            earlier_identical: identical,
            earlier_key_minute: minute,
            ..WindowCounts::default()
        }
    }

    #[test]
    fn runaway_thresholds_and_one_below() {
        assert_eq!(runaway_rule(&counts(7, 7), true), Some(Rule::RunawayLoop));
        assert_eq!(runaway_rule(&counts(6, 6), true), None);
        assert_eq!(runaway_rule(&counts(8, 8), true), Some(Rule::RunawayLoop));
        assert_eq!(
            runaway_rule(&counts(3, 3), false),
            Some(Rule::RunawayLoopUnattended)
        );
        assert_eq!(runaway_rule(&counts(2, 2), false), None);
        assert_eq!(runaway_rule(&counts(3, 3), true), None);
        assert_eq!(
            runaway_rule(&counts(0, 119), true),
            Some(Rule::RunawayBurst)
        );
        assert_eq!(runaway_rule(&counts(0, 118), true), None);
        // Several hold: the loop rule is named first.
        assert_eq!(
            runaway_rule(&counts(7, 200), false),
            Some(Rule::RunawayLoop)
        );
        assert_eq!(
            runaway_rule(&counts(3, 200), false),
            Some(Rule::RunawayLoopUnattended)
        );
    }

    #[test]
    fn budget_left_and_exceeding() {
        let b = BudgetState {
            ceiling_nano: 1_000,
            spend_nano: 400,
            reserved_nano: 100,
        };
        assert_eq!(b.left_nano(), 500);
        let wc = |c| WorstCase {
            input_tokens_estimated: 0,
            output_tokens: Some(0),
            cost_nano: c,
        };
        assert!(!exceeds_remaining(&b, &wc(Some(500))));
        assert!(exceeds_remaining(&b, &wc(Some(501))));
        assert!(exceeds_remaining(&b, &wc(None)));
        assert!(!b.exhausted());
        assert!(BudgetState {
            spend_nano: 1_000,
            ..b
        }
        .exhausted());
    }
}
