//! Hard rules: absolute, never tuned. Runaway rules read the windows; budget rules read spend.

use serde::{Deserialize, Serialize};

use super::windows::WindowCounts;
use crate::prices::Prices;
use crate::request::RequestShape;

/// The 8th identical request in 120 s (seven earlier ones).
pub const LOOP_LIMIT: u64 = 8;
/// The 4th identical request in 120 s with no human declared.
pub const LOOP_UNATTENDED_LIMIT: u64 = 4;
/// A repeated step is paced so that at most this many identical steps are decided in the pace
/// window (one below the loop limits: the 4th unattended / 8th attended waits instead).
pub const STEP_PACE_UNATTENDED: u64 = LOOP_UNATTENDED_LIMIT - 1;
pub const STEP_PACE_ATTENDED: u64 = LOOP_LIMIT - 1;
/// The 120th request from one key in 60 s.
pub const BURST_LIMIT: u64 = 120;
/// Input is estimated cautiously at one token per this many characters.
pub const CHARS_PER_INPUT_TOKEN: u64 = 3;

/// The most one image part can be billed as input, by provider family (the providers'
/// published image rules at their largest accepted size): Anthropic ≈ w×h/750 on images of
/// up to ~3.7 MP (≤ 4,784); OpenAI tile models 85 + 170 × 8 tiles = 1,445, patch models
/// 1,536 patches × ≤ 2.46, "original" detail larger still — 10,000 bounds them all, except
/// `gpt-4o-mini`, which bills 2,833 + 5,667 × 8 tiles = 48,169.
pub const IMAGE_TOKENS_ANTHROPIC: u64 = 5_000;
pub const IMAGE_TOKENS_OPENAI: u64 = 10_000;
pub const IMAGE_TOKENS_GPT_4O_MINI: u64 = 48_200;
/// A document or file part (PDF): at most 100 pages, each its text and its page image.
pub const DOCUMENT_TOKENS: u64 = 100 * (3_000 + IMAGE_TOKENS_OPENAI);
/// An audio part.
pub const AUDIO_TOKENS: u64 = 100_000;

/// The input tokens a request's media parts can be billed at most.
pub fn media_tokens_bound(shape: &RequestShape) -> u64 {
    let media = &shape.media;
    let image = match shape.route {
        crate::request::Route::AnthropicMessages => IMAGE_TOKENS_ANTHROPIC,
        _ if shape.model.starts_with("gpt-4o-mini") => IMAGE_TOKENS_GPT_4O_MINI,
        _ => IMAGE_TOKENS_OPENAI,
    };
    media
        .images
        .saturating_mul(image)
        .saturating_add(media.documents.saturating_mul(DOCUMENT_TOKENS))
        .saturating_add(media.audio.saturating_mul(AUDIO_TOKENS))
}

/// The input part of the worst case: the characters at the seed's cautious rate, plus every
/// byte the text takes beyond one per character (a byte-level tokenizer can bill each), plus
/// the media parts' bound.
pub fn input_tokens_bound(shape: &RequestShape) -> u64 {
    shape
        .prompt_chars()
        .div_ceil(CHARS_PER_INPUT_TOKEN)
        .saturating_add(shape.text_extra_bytes)
        .saturating_add(media_tokens_bound(shape))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Rule {
    RunawayLoop,
    RunawayLoopUnattended,
    RunawayBurst,
    BudgetExhausted,
    ExceedsRemainingBudget,
    /// A run of one step (same step fingerprint) that has gone on past `[gate.steps]
    /// runaway_after_secs` ([`super::schedule`]): a stuck agent, however it is paced.
    RunawayStep,
}

impl Rule {
    pub const ALL: [Rule; 6] = [
        Rule::RunawayLoop,
        Rule::RunawayLoopUnattended,
        Rule::RunawayBurst,
        Rule::BudgetExhausted,
        Rule::ExceedsRemainingBudget,
        Rule::RunawayStep,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Rule::RunawayLoop => "runaway_loop",
            Rule::RunawayLoopUnattended => "runaway_loop_unattended",
            Rule::RunawayBurst => "runaway_burst",
            Rule::BudgetExhausted => "budget_exhausted",
            Rule::ExceedsRemainingBudget => "exceeds_remaining_budget",
            Rule::RunawayStep => "runaway_step",
        }
    }

    pub fn is_runaway(self) -> bool {
        matches!(
            self,
            Rule::RunawayLoop
                | Rule::RunawayLoopUnattended
                | Rule::RunawayBurst
                | Rule::RunawayStep
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

/// The runaway rules for a literal repeat (SPEC §2.3): [`runaway_rule`] over the requests
/// with this very fingerprint; a repeated step alone is left to [`step_loop_rule`].
pub fn literal_runaway_rule(counts: &WindowCounts, human: bool) -> Option<Rule> {
    let literal = WindowCounts {
        earlier_identical: counts
            .earlier_identical
            .saturating_sub(counts.earlier_step_only),
        ..*counts
    };
    runaway_rule(&literal, human)
}

/// The loop rules over every identical request, the repeated steps included: what a repeated
/// step gets when it is not SERVEd and the gate does not pace it.
pub fn step_loop_rule(counts: &WindowCounts, human: bool) -> Option<Rule> {
    match runaway_rule(counts, human)? {
        Rule::RunawayBurst => None,
        rule => Some(rule),
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
    /// ⌈prompt_chars ÷ 3⌉ + the text's bytes beyond one per character + the media parts'
    /// bound ([`input_tokens_bound`]): an estimate, labelled as such.
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
    let input = input_tokens_bound(shape).saturating_add(shape.chained_input_tokens);
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
    fn the_input_worst_case_counts_extra_bytes_and_media() {
        use crate::request::{parse, Route};
        let shape = |body: &str, route| parse(route, body.as_bytes(), &[0; 32]).unwrap().shape;
        let emoji = format!(
            r#"{{"model":"claude","max_tokens":1,"messages":[{{"role":"user","content":"{}"}}]}}"#,
            "😀".repeat(3000)
        );
        // 3,000 characters at one token per 3, and 9,000 bytes beyond one per character.
        let s = shape(&emoji, Route::AnthropicMessages);
        assert_eq!(worst_case(&s, None).input_tokens_estimated, 1_000 + 9_000);
        // Fifty images and one character: 1 + 50 × the family's image bound.
        let parts = vec![r#"{"type":"image_url","image_url":{"url":"x","detail":"high"}}"#; 50];
        let images = format!(
            r#"{{"model":"gpt-4o","messages":[{{"role":"user","content":[{{"type":"text","text":"a"}},{}]}}]}}"#,
            parts.join(",")
        );
        let s = shape(&images, Route::OpenAiChat);
        assert_eq!(
            worst_case(&s, None).input_tokens_estimated,
            1 + 50 * IMAGE_TOKENS_OPENAI
        );
        let s = shape(&images.replace("gpt-4o", "gpt-4o-mini"), Route::OpenAiChat);
        assert_eq!(
            worst_case(&s, None).input_tokens_estimated,
            1 + 50 * IMAGE_TOKENS_GPT_4O_MINI
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
