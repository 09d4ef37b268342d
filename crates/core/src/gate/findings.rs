//! Findings: the waste inside a request, named so the caller sends less next time. Token
//! figures here are estimates (characters ÷ 4, rounded up), marked as such, and never enter
//! any total.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};

use super::rules::BudgetState;
use super::windows::WindowCounts;
use super::GateConfig;
use crate::request::{saturating_sum, RequestShape, Role, Route};

const CHARS_PER_ESTIMATED_TOKEN: u64 = 4;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FindingCode {
    RepeatingWithoutRecording,
    VariedOutputBlocksReuse,
    CarryingOldTurns,
    UnusedToolDefinitions,
    LargeSystemPromptResent,
    OutputCeilingAuthorised,
    DuplicateTurnsInContext,
    BudgetNearlyGone,
}

impl FindingCode {
    pub const ALL: [FindingCode; 8] = [
        FindingCode::RepeatingWithoutRecording,
        FindingCode::VariedOutputBlocksReuse,
        FindingCode::CarryingOldTurns,
        FindingCode::UnusedToolDefinitions,
        FindingCode::LargeSystemPromptResent,
        FindingCode::OutputCeilingAuthorised,
        FindingCode::DuplicateTurnsInContext,
        FindingCode::BudgetNearlyGone,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            FindingCode::RepeatingWithoutRecording => "repeating_without_recording",
            FindingCode::VariedOutputBlocksReuse => "varied_output_blocks_reuse",
            FindingCode::CarryingOldTurns => "carrying_old_turns",
            FindingCode::UnusedToolDefinitions => "unused_tool_definitions",
            FindingCode::LargeSystemPromptResent => "large_system_prompt_resent",
            FindingCode::OutputCeilingAuthorised => "output_ceiling_authorised",
            FindingCode::DuplicateTurnsInContext => "duplicate_turns_in_context",
            FindingCode::BudgetNearlyGone => "budget_nearly_gone",
        }
    }

    pub fn explanation(self) -> &'static str {
        match self {
            FindingCode::RepeatingWithoutRecording => "this reproducible request (or the same step of it) was sent in the last 24 h but no answer with recorded usage is held for it in this wire form, so it could not be served from store",
            FindingCode::VariedOutputBlocksReuse => "this request repeats one from the last 24 h but asks for sampled output (no temperature 0, no seed, or n > 1), so it cannot be served from store",
            FindingCode::CarryingOldTurns => "the context re-sends turns older than the most recent ones on every call",
            FindingCode::UnusedToolDefinitions => "tools are defined that were never called in the conversation's history",
            FindingCode::LargeSystemPromptResent => "a large system prompt is re-sent on every call to a provider that does not cache prompts automatically, without cache_control",
            FindingCode::OutputCeilingAuthorised => "max_tokens is absent or large: the call authorises a large output ceiling",
            FindingCode::DuplicateTurnsInContext => "identical messages appear more than once in one context",
            FindingCode::BudgetNearlyGone => "spend and reservations have reached 90 % of the key's ceiling",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Finding {
    pub code: FindingCode,
    pub explanation: String,
    /// Estimated tokens (characters ÷ 4), where the finding has a basis for a figure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u64>,
    pub estimated: bool,
    /// What the gate did about it on this call, when it did something (the prompt-cache
    /// breakpoints it placed, SPEC §2.11b); the finding itself is the caller's request's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acted: Option<String>,
}

/// [`Finding::acted`] when the gate placed prompt-cache breakpoints over a resent prefix.
pub const ACTED_CACHE_PLACED: &str =
    "the gate placed prompt-cache breakpoints on this call (cache = auto): the prefix it has seen before is billed at the cache-read price";

fn finding(code: FindingCode, chars: Option<u64>) -> Finding {
    Finding {
        code,
        explanation: code.explanation().to_string(),
        tokens: chars.map(|c| c.div_ceil(CHARS_PER_ESTIMATED_TOKEN)),
        estimated: chars.is_some(),
        acted: None,
    }
}

/// Every finding that holds for this request, in the seed card's order.
pub fn findings(
    cfg: &GateConfig,
    shape: &RequestShape,
    counts: &WindowCounts,
    servable: bool,
    budget: Option<&BudgetState>,
) -> Vec<Finding> {
    let t = &cfg.findings;
    let mut out = Vec::new();
    let prompt_chars = shape.prompt_chars();

    // SPEC §2.3: `repeating_without_recording` counts identical requests as the loop signal
    // does — the same fingerprint or the same step. `varied_output_blocks_reuse` is about
    // reusing this very request's answer, so only its fingerprint counts (§2.8).
    if counts.fingerprint_seen && !shape.reproducible() {
        out.push(finding(
            FindingCode::VariedOutputBlocksReuse,
            Some(prompt_chars),
        ));
    } else if (counts.fingerprint_seen || counts.step_seen) && shape.reproducible() && !servable {
        out.push(finding(
            FindingCode::RepeatingWithoutRecording,
            Some(prompt_chars),
        ));
    }
    let turns = shape.turns.len() as u64;
    if turns > t.old_turns {
        let keep = t.old_turns as usize;
        let old = saturating_sum(
            shape.turns[..shape.turns.len() - keep]
                .iter()
                .map(|x| x.chars),
        );
        out.push(finding(FindingCode::CarryingOldTurns, Some(old)));
    }
    let history = turns.saturating_sub(1);
    if history >= t.unused_tools_min_history && !shape.tools.is_empty() {
        let called: HashSet<_> = shape.called_tool_hashes.iter().collect();
        let unused: Vec<_> = shape
            .tools
            .iter()
            .filter(|d| !called.contains(&d.name_hash))
            .collect();
        if !unused.is_empty() {
            let chars = saturating_sum(unused.iter().map(|d| d.chars));
            out.push(finding(FindingCode::UnusedToolDefinitions, Some(chars)));
        }
    }
    if shape.route == Route::AnthropicMessages
        && shape.system_chars >= t.large_system_chars
        && !shape.cache_marked
        && shape.turns.iter().any(|x| x.role == Role::Assistant)
    {
        out.push(finding(
            FindingCode::LargeSystemPromptResent,
            Some(shape.system_chars),
        ));
    }
    if shape.max_tokens.is_none_or(|m| m >= t.output_ceiling) {
        out.push(finding(FindingCode::OutputCeilingAuthorised, None));
    }
    let mut seen = HashSet::with_capacity(shape.turns.len());
    let duplicate_chars: Option<u64> = shape
        .turns
        .iter()
        // A turn without a hash shares its role and size with no other (`Turn::hash`).
        .filter(|x| x.hash.is_some_and(|hash| !seen.insert(hash)))
        .map(|x| x.chars)
        .reduce(u64::saturating_add);
    if let Some(chars) = duplicate_chars {
        out.push(finding(FindingCode::DuplicateTurnsInContext, Some(chars)));
    }
    if let Some(b) = budget {
        let committed = u128::from(b.spend_nano) + u128::from(b.reserved_nano);
        if committed * 100 >= u128::from(b.ceiling_nano) * u128::from(t.budget_nearly_gone_percent)
        {
            out.push(finding(FindingCode::BudgetNearlyGone, None));
        }
    }
    out
}
