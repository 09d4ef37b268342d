//! The one decision function, in the order of SPEC §2.2.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::findings::{findings, Finding};
use super::rules::{self, BudgetState, Rule, WorstCase};
use super::schedule;
use super::score::{self, Signals};
use super::windows::WindowCounts;
use super::{Band, GateConfig, Mechanism, Saturation, Usage, Verdict};
use crate::prices::Prices;
use crate::receipt::DecisionId;
use crate::request::{Hash, RequestShape};

/// What the gate decides with besides the request: tunables, prices, the downgrade map.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Policy {
    pub gate: GateConfig,
    pub prices: BTreeMap<String, Prices>,
    pub downgrade: BTreeMap<String, String>,
    /// Key id → the saturation points of its scoring profile, for keys that have one.
    pub key_saturation: BTreeMap<String, Saturation>,
    /// Key id → the mechanisms it goes without (`[[keys]] without`), for keys that name any.
    pub key_without: BTreeMap<String, super::Mechanisms>,
}

impl Policy {
    /// The saturation points a key is scored with: its profile's, else the gate's.
    pub fn saturation_for(&self, key_id: &str) -> &Saturation {
        self.key_saturation
            .get(key_id)
            .unwrap_or(&self.gate.saturation)
    }

    /// The mechanisms a key goes without (none unless its config names them).
    pub fn without_for(&self, key_id: &str) -> super::Mechanisms {
        self.key_without.get(key_id).copied().unwrap_or_default()
    }
}

/// The request and what travels with it.
#[derive(Debug, Clone, Copy)]
pub struct GateInput<'a> {
    pub key_id: &'a str,
    pub shape: &'a RequestShape,
    /// A person is attending (the header or digest field, else the key's default).
    pub human: bool,
    /// An answer is held for this key, fingerprint and the request's wire form.
    pub held: bool,
    /// The provider-reported usage recorded for that held answer.
    pub held_usage: Option<Usage>,
    /// The request carries an approved, unexpired, unused hold bound to this key and
    /// fingerprint.
    pub approved_hold: bool,
}

/// What a person's approval contributes to a decision (SPEC §2.7), kept apart from
/// [`GateInput`] so that every existing caller of [`decide`] decides exactly as before. The
/// live gate (`Gatekeeper::gate`) resolves these from its holds and leases; both modes go
/// through it, so both name the same approvals.
#[derive(Debug, Clone, Copy, Default)]
pub struct Approvals<'a> {
    /// An approved, unexpired, unused hold bound to this key and fingerprint: named by the
    /// request (`x-tokensaver-hold`, the digest's `hold_id`), or the key's approval for this
    /// fingerprint, which releases its next identical request without any header. Acts as
    /// `GateInput::approved_hold`; the receipt names it when it released the request.
    pub hold: Option<&'a str>,
    /// The attending lease (named by the hold whose approval granted it) that makes this
    /// request attended: set only when the request declared nothing and the key's default is
    /// unattended. Acts as `human = true`; every receipt decided under it names it.
    pub lease: Option<&'a str>,
}

/// The key's state before this request.
#[derive(Debug, Clone, Copy, Default)]
pub struct KeyState {
    pub counts: WindowCounts,
    pub budget: Option<BudgetState>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    pub verdict: Verdict,
    pub rule: Option<Rule>,
    pub band: Option<Band>,
    pub score: f64,
    pub signals: Signals,
    pub findings: Vec<Finding>,
    pub model_requested: String,
    pub model_served: Option<String>,
    pub key_id: String,
    pub fingerprint: Hash,
    pub decided_at_ms: u64,
    pub hold_id: Option<String>,
    pub worst_case: WorstCase,
    /// SERVE: the usage the provider reported for the stored answer.
    pub tokens_not_bought: Option<Usage>,
    /// BLOCK: the worst case in tokens (0 when an answer was held); `None` when unbounded.
    pub worst_case_tokens_avoided: Option<u64>,
    /// The approved hold that released this request (forwarded it past the score band and
    /// `exceeds_remaining_budget`). Absent otherwise, and then not serialised.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approved_hold: Option<String>,
    /// The attending lease (its hold id) under which this request was scored as attended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attending_lease: Option<String>,
    /// Prompt-cache breakpoints the gate adds (indices into the shape's `cache_points`):
    /// billing only — the verdict, findings and fingerprint are those of the caller's request
    /// ([`Decision::place_cache`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cache_breakpoints: Vec<u16>,
    /// How long the gate held this request before deciding it (a repeated step paced until
    /// its window admitted it, SPEC §2.3). Absent when it was not held.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paced_ms: Option<u64>,
    /// Anthropic: the gate sets the lifetime of the call's breakpoints — the caller's own
    /// markers without a `ttl` and those it places — to one hour (SPEC §2.11b, lifetimes).
    /// Billing only, like every cache edit.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cache_ttl_1h: bool,
    /// OpenAI: the `prompt_cache_key` the gate adds to a request that names none (routing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_routing_key: Option<String>,
    /// OpenAI: the gate adds `prompt_cache_retention: "24h"` to a request that sets none.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cache_retention: bool,
    /// What the cache terms were decided knowing (not in the receipt): the call comes after a
    /// pause of its session; its routing key spread it off the prefix's one route.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cache_after_pause: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cache_spread: bool,
    /// How many earlier decisions of this key share `decided_at_ms` (0: none). The decision
    /// time is the clock passed in, never pushed ahead of it; this keeps two receipts of one key
    /// in one millisecond apart, and so their decision ids.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub seq: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// What a forwarded call's cache lifetime, routing and retention are decided from (SPEC
/// §2.11b): the key's policy, the session's figures, the prefix's rate and the served model's
/// prices.
#[derive(Debug, Clone, Copy)]
pub struct CacheTerms<'p> {
    /// The key's `cache_ttl` (its `cache = "off"` places nothing: the caller passes
    /// `FiveMinutes` and `routing: false`).
    pub lifetime: super::cache::LifetimePolicy,
    /// The gate may add routing and retention (the key's `cache = "auto"`).
    pub routing: bool,
    pub session: super::cache::SessionCache,
    /// The cache lifetime pauses are judged by (`[gate.windows] cache_secs`).
    pub lifetime_ms: u64,
    /// Requests the key sent with this route prefix in the last minute
    /// (`[gate.windows] route_secs`), and whether another session sent any of them.
    pub prefix_rate: u64,
    pub prefix_shared: bool,
    pub prices: Option<&'p Prices>,
}

/// What the gate does with a request when it can hold one: decide it, or hold it until
/// `until_ms` and decide it afresh then ([`decide_paced`]).
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Decided(Box<Decision>),
    Pace { until_ms: u64 },
}

/// The signed receipt body. Field order is fixed by this struct, so the bytes are canonical.
#[derive(Serialize)]
struct ReceiptBody<'a> {
    v: u32,
    verdict: Verdict,
    reason: &'static str,
    rule: Option<Rule>,
    band: Option<Band>,
    score: f64,
    signals: &'a Signals,
    findings: Vec<&'static str>,
    model_requested: &'a str,
    model_served: Option<&'a str>,
    key_id: &'a str,
    fingerprint: &'a Hash,
    decided_at_ms: u64,
    hold_id: Option<&'a str>,
    worst_case: &'a WorstCase,
    tokens_not_bought: Option<u64>,
    worst_case_tokens_avoided: Option<u64>,
    // Serialised only when present, so that every receipt decided without an approval keeps
    // exactly the bytes it had before approvals were named.
    #[serde(skip_serializing_if = "Option::is_none")]
    approved_hold: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    attending_lease: Option<&'a str>,
    /// How many prompt-cache breakpoints the gate added (absent: none).
    #[serde(skip_serializing_if = "Option::is_none")]
    cache_breakpoints_added: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    paced_ms: Option<u64>,
    /// Absent for the first decision of a key in its millisecond.
    #[serde(skip_serializing_if = "Option::is_none")]
    seq: Option<u32>,
    /// The cache edits the gate makes to the forwarded body (absent: none).
    #[serde(skip_serializing_if = "Option::is_none")]
    cache_lifetime: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cache_routing_key: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cache_retention: Option<&'static str>,
}

impl Decision {
    /// A static reason for the verdict: the rule, the band, or what earned it.
    pub fn reason(&self) -> &'static str {
        match (self.rule, self.band, self.verdict) {
            (Some(rule), _, _) => rule.as_str(),
            (None, Some(band), _) => band.as_str(),
            (None, None, Verdict::Serve) => "answer_held",
            (None, None, Verdict::Downgrade) => "downgrade_earned",
            (None, None, _) => "allowed",
        }
    }

    /// The canonical receipt body bytes (what gets signed), and the decision's id, which the
    /// body's version decides (`receipt::decision_id`). Names no mode.
    pub fn receipt(&self) -> (Vec<u8>, DecisionId) {
        let body = self.receipt_body();
        let id = DecisionId::of(self.decided_at_ms, &body);
        (body, id)
    }

    /// The canonical receipt body bytes (what gets signed). Names no mode.
    pub fn receipt_body(&self) -> Vec<u8> {
        let body = ReceiptBody {
            v: crate::receipt::TIME_ORDERED_RECEIPT_V,
            verdict: self.verdict,
            reason: self.reason(),
            rule: self.rule,
            band: self.band,
            score: self.score,
            signals: &self.signals,
            findings: self.findings.iter().map(|f| f.code.as_str()).collect(),
            model_requested: &self.model_requested,
            model_served: self.model_served.as_deref(),
            key_id: &self.key_id,
            fingerprint: &self.fingerprint,
            decided_at_ms: self.decided_at_ms,
            hold_id: self.hold_id.as_deref(),
            worst_case: &self.worst_case,
            tokens_not_bought: self.tokens_not_bought.map(|u| u.total()),
            worst_case_tokens_avoided: self.worst_case_tokens_avoided,
            approved_hold: self.approved_hold.as_deref(),
            attending_lease: self.attending_lease.as_deref(),
            cache_breakpoints_added: Some(self.cache_breakpoints.len()).filter(|n| *n > 0),
            paced_ms: self.paced_ms,
            seq: Some(self.seq).filter(|n| *n > 0),
            cache_lifetime: self.cache_ttl_1h.then_some("1h"),
            cache_routing_key: self.cache_routing_key.as_deref(),
            cache_retention: self.cache_retention.then_some("24h"),
        };
        serde_json::to_vec(&body).unwrap_or_default()
    }

    /// Place prompt-cache breakpoints on a forwarded call the caller did not mark (SPEC
    /// §2.11b; the shape has cache points only then), where the key has sent the prefix before
    /// ([`super::cache::place`]). Pure, like the decision: both modes place alike.
    pub fn place_cache(
        &mut self,
        shape: &RequestShape,
        memory: &[super::cache::PointMemory],
        now_ms: u64,
    ) {
        if !self.verdict.forwards() || shape.cache_points.is_empty() {
            return;
        }
        let model = self.model_served.as_deref().unwrap_or(&shape.model);
        self.cache_breakpoints = super::cache::place(&shape.cache_points, memory, model, now_ms);
        if !self.cache_breakpoints.is_empty() {
            // Every breakpoint ends a prefix that begins with the tools and the system prompt.
            for f in &mut self.findings {
                if f.code == super::FindingCode::LargeSystemPromptResent {
                    f.acted = Some(super::findings::ACTED_CACHE_PLACED.to_string());
                }
            }
        }
    }

    /// The cache lifetime, routing and retention edits of a forwarded call (SPEC §2.11b),
    /// from what the gate keeps of the call's session and of its prefix's rate. Pure: both
    /// modes place alike. Billing only: the verdict, findings and fingerprint are those of the
    /// caller's request.
    pub fn place_cache_terms(&mut self, shape: &RequestShape, terms: &CacheTerms<'_>) {
        if !self.verdict.forwards() {
            return;
        }
        self.cache_after_pause = terms
            .session
            .paused_at(self.decided_at_ms, terms.lifetime_ms);
        let model = self.model_served.as_deref().unwrap_or(&shape.model);
        let has_breakpoints = shape.cache_ttl_marks > 0 || !self.cache_breakpoints.is_empty();
        if shape.route == crate::request::Route::AnthropicMessages
            && !shape.cache_ttl_set
            && has_breakpoints
        {
            self.cache_ttl_1h = match terms.lifetime {
                super::cache::LifetimePolicy::FiveMinutes => false,
                super::cache::LifetimePolicy::OneHour => true,
                super::cache::LifetimePolicy::Auto => terms.prices.is_some_and(|p| {
                    super::cache::one_hour_pays(
                        &terms.session,
                        self.decided_at_ms,
                        terms.lifetime_ms,
                        p,
                    )
                }),
            };
        }
        // OpenAI caches no prompt under 1,024 tokens: below it a key or a retention buys
        // nothing, and the caller's bytes go as sent.
        let cacheable = shape.prompt_chars() / super::cache::CHARS_PER_TOKEN_FOR_MINIMUM
            >= super::cache::OPENAI_MIN_CACHEABLE_TOKENS;
        let routing = terms.routing && cacheable;
        if let Some(prefix) = shape.route_prefix.as_ref().filter(|_| routing) {
            let (bucket, spread) = super::cache::routing_bucket(
                terms.prefix_rate,
                terms.prefix_shared,
                &shape.session,
            );
            self.cache_routing_key = Some(super::cache::routing_key(prefix, bucket));
            self.cache_spread = spread;
        }
        if shape.route != crate::request::Route::AnthropicMessages
            && routing
            && !shape.retention_set
        {
            self.cache_retention = terms
                .prices
                .is_some_and(|p| super::cache::extended_retention(model, p));
        }
    }

    /// What the gate did to the call's caching, and what it knew then.
    pub fn cache_edits(&self) -> super::cache::CacheEdits {
        use super::cache::CacheEdits as E;
        E::default()
            .with(E::BREAKPOINTS, !self.cache_breakpoints.is_empty())
            .with(E::LIFETIME, self.cache_ttl_1h)
            .with(E::ROUTING, self.cache_routing_key.is_some())
            .with(E::RETENTION, self.cache_retention)
            .with(E::AFTER_PAUSE, self.cache_after_pause)
            .with(E::SPREAD, self.cache_spread)
    }

    /// Whether the gate edits the forwarded body for caching at all.
    pub fn edits_cache(&self) -> bool {
        !self.cache_breakpoints.is_empty()
            || self.cache_ttl_1h
            || self.cache_routing_key.is_some()
            || self.cache_retention
    }

    /// The HTTP status the gate itself answers with (forwarded verdicts: the provider's).
    pub fn status(&self) -> u16 {
        match (self.verdict, self.rule) {
            (Verdict::Challenge, _) => 409,
            (Verdict::Block, Some(r)) if r.is_runaway() => 429,
            (Verdict::Block, Some(_)) => 402,
            (Verdict::Block, None) => 403,
            _ => 200,
        }
    }
}

/// A hold id is derived from the decision, so both modes derive the same one.
pub fn hold_id_for(key_id: &str, fingerprint: &Hash, decided_at_ms: u64) -> String {
    let mut hasher = blake3::Hasher::new();
    hasher.update(b"tokensaver hold v1\0");
    hasher.update(key_id.as_bytes());
    hasher.update(b"\0");
    hasher.update(&fingerprint.0);
    hasher.update(&decided_at_ms.to_be_bytes());
    let hex = hasher.finalize().to_hex();
    format!("hold_{}", &hex.as_str()[..32])
}

/// Decide a request. Pure: the same inputs and clock give the same decision.
pub fn decide(policy: &Policy, input: &GateInput, state: &KeyState, now_ms: u64) -> Decision {
    decide_with(policy, input, Approvals::default(), state, now_ms)
}

/// [`decide`] with a person's approvals, which the decision and its receipt name. Pure too.
/// The caller cannot hold the request: a repeated step past the loop thresholds is BLOCKed
/// by the loop rules, as every identical request.
pub fn decide_with(
    policy: &Policy,
    input: &GateInput,
    approvals: Approvals<'_>,
    state: &KeyState,
    now_ms: u64,
) -> Decision {
    match decide_approved(policy, input, approvals, state, None, now_ms) {
        Ok(decision) => decision,
        Err(_) => unreachable!("without `paced_ms` the gate never paces"),
    }
}

/// [`decide_with`] for a caller that can hold a request (SPEC §2.3, "Literal repeats and
/// repeated steps"), which has held this one `paced_ms` so far. A repeated step its pace window
/// does not admit yet gets [`Outcome::Pace`]: hold it (not counted anywhere) until `until_ms`,
/// then decide it afresh with the time held. A wait that would take the hold past
/// `[gate.steps]`'s cap is not offered: the step is BLOCKed as a loop. Pure too.
pub fn decide_paced(
    policy: &Policy,
    input: &GateInput,
    approvals: Approvals<'_>,
    state: &KeyState,
    paced_ms: u64,
    now_ms: u64,
) -> Outcome {
    match decide_approved(policy, input, approvals, state, Some(paced_ms), now_ms) {
        Err(until_ms) => Outcome::Pace { until_ms },
        Ok(mut decision) => {
            decision.paced_ms = Some(paced_ms).filter(|&p| p > 0);
            Outcome::Decided(Box::new(decision))
        }
    }
}

fn decide_approved(
    policy: &Policy,
    input: &GateInput,
    approvals: Approvals<'_>,
    state: &KeyState,
    paced_ms: Option<u64>,
    now_ms: u64,
) -> Result<Decision, u64> {
    let lease = approvals.lease.filter(|_| !input.human);
    let input = &GateInput {
        human: input.human || lease.is_some(),
        approved_hold: input.approved_hold || approvals.hold.is_some(),
        ..*input
    };
    let mut decision = decide_inner(policy, input, state, paced_ms, now_ms)?;
    decision.attending_lease = lease.map(str::to_string);
    if decision.verdict.forwards() {
        decision.approved_hold = approvals.hold.map(str::to_string);
    }
    Ok(decision)
}

/// The decision, or — only when the caller can hold the request (`paced_ms`) — `Err(until)`:
/// hold it until then and decide it afresh.
fn decide_inner(
    policy: &Policy,
    input: &GateInput,
    state: &KeyState,
    paced_ms: Option<u64>,
    now_ms: u64,
) -> Result<Decision, u64> {
    let cfg = &policy.gate;
    let shape = input.shape;
    let prices = policy.prices.get(&shape.model);
    let budget = state.budget.as_ref();
    let worst = rules::worst_case(shape, prices);
    let saturation = policy.saturation_for(input.key_id);
    let without = policy.without_for(input.key_id);
    let stops = !without.has(Mechanism::Stop);
    let mut signals = score::signals(
        saturation,
        shape,
        &state.counts,
        budget,
        &worst,
        input.human,
    );
    if !stops {
        // Without the stop the score weighs no waste: a repeated or bursting agent is neither
        // paced, nor stopped, nor held by the score's loop, burst and grind.
        signals.loop_ = 0.0;
        signals.burst = 0.0;
        signals.grind = 0.0;
    }
    let score = score::score(cfg, &signals);
    let servable = input.held
        && input.held_usage.is_some()
        && shape.reproducible()
        && !without.has(Mechanism::Serve);
    let findings = findings(cfg, shape, &state.counts, servable, budget);

    let mut decision = Decision {
        verdict: Verdict::Allow,
        rule: None,
        band: None,
        score,
        signals,
        findings,
        model_requested: shape.model.clone(),
        model_served: None,
        key_id: input.key_id.to_string(),
        fingerprint: shape.fingerprint,
        decided_at_ms: now_ms,
        hold_id: None,
        worst_case: worst,
        tokens_not_bought: None,
        worst_case_tokens_avoided: None,
        approved_hold: None,
        attending_lease: None,
        cache_breakpoints: Vec::new(),
        paced_ms: None,
        seq: 0,
        cache_ttl_1h: false,
        cache_routing_key: None,
        cache_retention: false,
        cache_after_pause: false,
        cache_spread: false,
    };
    let avoided = if input.held { Some(0) } else { worst.tokens() };

    // 1. Hard rules that stop runaway automation: absolute for literal repeats (SPEC §2.3).
    if let Some(rule) = rules::literal_runaway_rule(&state.counts, input.human).filter(|_| stops) {
        return Ok(block(decision, Some(rule), None, avoided));
    }
    // 2. An answer held, with its usage recorded, where reuse is allowed. A SERVE buys
    // nothing: a repeated step that can be SERVEd (a temperature-0 rerun) is SERVEd.
    if servable {
        decision.verdict = Verdict::Serve;
        decision.tokens_not_bought = input.held_usage;
        return Ok(decision);
    }
    // 2a. A repeated step (the same step fingerprint, another history) counts as identical.
    // A caller that can hold it paces it until its window admits it, and a step repeated past
    // the long bound is stopped; one that cannot hold it stops it as a loop.
    match paced_ms.filter(|_| stops) {
        Some(paced) => match schedule::check(
            &cfg.steps,
            &state.counts,
            input.human,
            now_ms.saturating_sub(paced),
            now_ms,
        ) {
            schedule::StepCheck::Clear => {}
            schedule::StepCheck::Runaway => {
                return Ok(block(decision, Some(Rule::RunawayStep), None, avoided));
            }
            schedule::StepCheck::PaceUntil(until) => {
                // A call the budget refuses now is refused now: holding it would only park a
                // request (and its body) that the same rules refuse when the wait ends.
                if let Some(refusal) = budget_refusal(budget, &worst, input) {
                    return Ok(refusal.apply(decision, avoided));
                }
                let rule = if input.human {
                    Rule::RunawayLoop
                } else {
                    Rule::RunawayLoopUnattended
                };
                let stop = block(decision, Some(rule), None, avoided);
                let held = paced.saturating_add(until.saturating_sub(now_ms));
                return if until > now_ms && held <= cfg.steps.max_hold_ms() {
                    Err(until)
                } else {
                    Ok(stop)
                };
            }
        },
        None if stops => {
            if let Some(rule) = rules::step_loop_rule(&state.counts, input.human) {
                return Ok(block(decision, Some(rule), None, avoided));
            }
        }
        None => {}
    }
    // 3. Budget rules.
    if let Some(refusal) = budget_refusal(budget, &worst, input) {
        return Ok(refusal.apply(decision, avoided));
    }
    // 4. The score bands.
    if !input.approved_hold {
        if score >= cfg.bands.block {
            return Ok(block(decision, None, Some(Band::ScoreBlock), avoided));
        }
        if score >= cfg.bands.challenge {
            return Ok(challenge(decision, None, Some(Band::ScoreChallenge)));
        }
    }
    // 5. DOWNGRADE when earned; 6. ALLOW.
    let downgrade =
        earned_downgrade(policy, shape, score).filter(|_| !without.has(Mechanism::Downgrade));
    if let Some(cheaper) = downgrade {
        decision.verdict = Verdict::Downgrade;
        decision.model_served = Some(cheaper.to_string());
    } else {
        decision.model_served = Some(shape.model.clone());
    }
    Ok(decision)
}

/// What the budget rules say of a call (SPEC §2.2, step 3): `budget_exhausted` BLOCKs;
/// `exceeds_remaining_budget` CHALLENGEs when a person attends and BLOCKs when not.
struct BudgetRefusal {
    rule: Rule,
    hold_for_a_person: bool,
}

impl BudgetRefusal {
    fn apply(self, decision: Decision, avoided: Option<u64>) -> Decision {
        if self.hold_for_a_person {
            challenge(decision, Some(self.rule), None)
        } else {
            block(decision, Some(self.rule), None, avoided)
        }
    }
}

fn budget_refusal(
    budget: Option<&BudgetState>,
    worst: &WorstCase,
    input: &GateInput,
) -> Option<BudgetRefusal> {
    let b = budget?;
    if b.exhausted() {
        return Some(BudgetRefusal {
            rule: Rule::BudgetExhausted,
            hold_for_a_person: false,
        });
    }
    // A person's approval lets a bounded worst case past the budget left; an unbounded one (a
    // model with no price) it cannot: nobody can approve a spend nobody can bound.
    let approved_past_budget = input.approved_hold && worst.cost_nano.is_some();
    (!approved_past_budget && rules::exceeds_remaining(b, worst)).then_some(BudgetRefusal {
        rule: Rule::ExceedsRemainingBudget,
        hold_for_a_person: input.human,
    })
}

fn block(
    mut d: Decision,
    rule: Option<Rule>,
    band: Option<Band>,
    avoided: Option<u64>,
) -> Decision {
    d.verdict = Verdict::Block;
    d.rule = rule;
    d.band = band;
    d.worst_case_tokens_avoided = avoided;
    d
}

fn challenge(mut d: Decision, rule: Option<Rule>, band: Option<Band>) -> Decision {
    d.verdict = Verdict::Challenge;
    d.rule = rule;
    d.band = band;
    d.hold_id = Some(hold_id_for(&d.key_id, &d.fingerprint, d.decided_at_ms));
    d
}

/// DOWNGRADE is earned, not suspected: every limit holds and a cheaper model is configured.
fn earned_downgrade<'p>(policy: &'p Policy, shape: &RequestShape, score: f64) -> Option<&'p str> {
    let l = &policy.gate.downgrade;
    let earned = score <= l.max_score
        && shape.prompt_chars() <= l.max_prompt_chars
        && shape.turns.len() as u64 <= l.max_turns
        && shape.max_tokens.is_some_and(|m| m <= l.max_output_tokens)
        && shape.tools.len() as u64 <= l.tools_allowed;
    if earned {
        policy.downgrade.get(&shape.model).map(String::as_str)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::{parse, Route};

    #[test]
    fn a_profile_moves_only_the_spend_saturation_of_its_key() {
        let tools: Vec<String> = (0..24)
            .map(|i| format!(r#"{{"name":"t{i}","input_schema":{{}}}}"#))
            .collect();
        let body = format!(
            r#"{{"model":"m","max_tokens":32000,"tools":[{}],"messages":[{{"role":"user","content":"hi"}}]}}"#,
            tools.join(",")
        );
        let shape = parse(Route::AnthropicMessages, body.as_bytes(), &[1; 32])
            .unwrap()
            .shape;
        let mut policy = Policy::default();
        policy.key_saturation.insert(
            "agent".into(),
            Saturation {
                size: 1_000_000,
                ask: 128_000,
                depth: 400,
                tools: 128,
                ..Saturation::default()
            },
        );
        let decide_for = |key_id| {
            let input = GateInput {
                key_id,
                shape: &shape,
                human: false,
                held: false,
                held_usage: None,
                approved_hold: false,
            };
            decide(&policy, &input, &KeyState::default(), 0)
        };
        let plain = decide_for("plain");
        let agent = decide_for("agent");
        assert_eq!(plain.signals.tools, 1.0);
        assert_eq!(plain.signals.ask, 1.0);
        assert_eq!(agent.signals.tools, 24.0 / 128.0);
        assert_eq!(agent.signals.ask, 0.25);
        assert!(agent.score < plain.score);
        // The waste signals and the unattended term are the seed's for every key.
        assert_eq!(agent.signals.unattended, plain.signals.unattended);
        assert_eq!(agent.signals.novelty, plain.signals.novelty);
    }

    #[test]
    fn a_seen_step_counts_for_repeating_without_recording() {
        use crate::gate::FindingCode;
        let shape_of = |temperature: &str| {
            let body = format!(
                r#"{{"model":"m","max_tokens":100,"temperature":{temperature},"messages":[{{"role":"user","content":"status?"}}]}}"#
            );
            parse(Route::OpenAiChat, body.as_bytes(), &[1; 32])
                .unwrap()
                .shape
        };
        let codes = |shape: &RequestShape, counts: WindowCounts, held: bool| {
            let input = GateInput {
                key_id: "k",
                shape,
                human: true,
                held,
                held_usage: held.then(Usage::default),
                approved_hold: false,
            };
            let state = KeyState {
                counts,
                budget: None,
            };
            decide(&Policy::default(), &input, &state, 0)
                .findings
                .iter()
                .map(|f| f.code)
                .collect::<Vec<_>>()
        };
        let step_only = WindowCounts {
            step_seen: true,
            ..WindowCounts::default()
        };
        let reproducible = shape_of("0");
        assert!(codes(&reproducible, step_only, false)
            .contains(&FindingCode::RepeatingWithoutRecording));
        assert!(!codes(&reproducible, WindowCounts::default(), false)
            .contains(&FindingCode::RepeatingWithoutRecording));
        // Servable: nothing is repeated without recording.
        assert!(!codes(&reproducible, step_only, true)
            .contains(&FindingCode::RepeatingWithoutRecording));
        // Sampled output: a seen step is no reuse that the sampling blocks (the fingerprint
        // differs), and no repeat finding either.
        let sampled = codes(&shape_of("0.7"), step_only, false);
        assert!(!sampled.contains(&FindingCode::RepeatingWithoutRecording));
        assert!(!sampled.contains(&FindingCode::VariedOutputBlocksReuse));
    }

    #[test]
    fn a_serve_is_never_stopped_by_a_repeated_step_only_by_a_literal_storm() {
        let body = r#"{"model":"m","max_tokens":100,"temperature":0,"messages":[{"role":"user","content":"go"}]}"#;
        let shape = parse(Route::OpenAiChat, body.as_bytes(), &[1; 32])
            .unwrap()
            .shape;
        let decide_at = |counts: WindowCounts, held: bool| {
            let input = GateInput {
                key_id: "k",
                shape: &shape,
                human: false,
                held,
                held_usage: held.then(Usage::default),
                approved_hold: false,
            };
            let state = KeyState {
                counts,
                budget: None,
            };
            let d = decide(&Policy::default(), &input, &state, 0);
            (d.verdict, d.rule)
        };
        let counts = |identical, step_only| WindowCounts {
            earlier_identical: identical,
            earlier_step_only: step_only,
            ..WindowCounts::default()
        };
        // A rerun: one literal repeat, five earlier steps of the same kind: SERVEd.
        assert_eq!(decide_at(counts(6, 5), true), (Verdict::Serve, None));
        // Not servable: the repeated step is a loop (the 7th identical, unattended).
        assert_eq!(
            decide_at(counts(6, 5), false),
            (Verdict::Block, Some(Rule::RunawayLoopUnattended))
        );
        // A literal storm of a servable request: the 4th unattended is stopped.
        assert_eq!(
            decide_at(counts(3, 0), true),
            (Verdict::Block, Some(Rule::RunawayLoopUnattended))
        );
        assert_eq!(decide_at(counts(2, 0), true), (Verdict::Serve, None));
    }

    #[test]
    fn a_key_without_serve_or_downgrade_sends_the_request_to_its_own_model() {
        use crate::gate::{Mechanism, Mechanisms};
        let body = r#"{"model":"big","max_tokens":100,"temperature":0,"messages":[{"role":"user","content":"go"}]}"#;
        let shape = parse(Route::OpenAiChat, body.as_bytes(), &[1; 32])
            .unwrap()
            .shape;
        let mut policy = Policy::default();
        policy.downgrade.insert("big".into(), "small".into());
        let without = |m: Mechanism| [m].into_iter().collect::<Mechanisms>();
        policy
            .key_without
            .insert("no-serve".into(), without(Mechanism::Serve));
        policy
            .key_without
            .insert("no-downgrade".into(), without(Mechanism::Downgrade));
        let decide_for = |key_id, held: bool| {
            let input = GateInput {
                key_id,
                shape: &shape,
                human: false,
                held,
                held_usage: held.then(Usage::default),
                approved_hold: false,
            };
            let d = decide(&policy, &input, &KeyState::default(), 0);
            (d.verdict, d.model_served)
        };
        let small = Some("small".to_string());
        let big = Some("big".to_string());
        assert_eq!(decide_for("k", true), (Verdict::Serve, None));
        assert_eq!(decide_for("k", false), (Verdict::Downgrade, small.clone()));
        // Without SERVE: the held answer is not used; the request earns its downgrade.
        assert_eq!(decide_for("no-serve", true), (Verdict::Downgrade, small));
        // Without DOWNGRADE: sent to the model it names; SERVE still answers it.
        assert_eq!(decide_for("no-downgrade", false), (Verdict::Allow, big));
        assert_eq!(decide_for("no-downgrade", true), (Verdict::Serve, None));
    }

    mod pacing {
        use super::*;
        use crate::gate::{StepLimits, Windows};

        const STEP: Hash = Hash([9; 32]);

        /// A small request whose fingerprint is `n` and whose step is [`STEP`].
        fn shape(n: u8) -> RequestShape {
            let body =
                br#"{"model":"m","max_tokens":100,"messages":[{"role":"user","content":"poll"}]}"#;
            let mut shape = parse(Route::OpenAiChat, body, &[1; 32]).unwrap().shape;
            shape.fingerprint = Hash([n; 32]);
            shape.step_fingerprint = STEP;
            shape
        }

        fn policy(steps: StepLimits) -> Policy {
            let mut p = Policy::default();
            p.gate.steps = steps;
            p
        }

        /// Steps 1.. decided at these times (each with another fingerprint).
        fn windows(policy: &Policy, times: &[u64]) -> Windows {
            let mut w = Windows::configured(&policy.gate);
            for (i, &t) in times.iter().enumerate() {
                let s = shape(i as u8 + 1);
                w.record_step("k", &s.fingerprint, &STEP, "m", t);
            }
            w
        }

        fn outcome(
            policy: &Policy,
            w: &Windows,
            shape: &RequestShape,
            human: bool,
            paced_ms: u64,
            now: u64,
        ) -> Outcome {
            let input = GateInput {
                key_id: "k",
                shape,
                human,
                held: false,
                held_usage: None,
                approved_hold: false,
            };
            let state = KeyState {
                counts: w.observe_step("k", &shape.fingerprint, &STEP, "m", now),
                budget: None,
            };
            decide_paced(policy, &input, Approvals::default(), &state, paced_ms, now)
        }

        fn decided(o: Outcome) -> Decision {
            match o {
                Outcome::Decided(d) => *d,
                Outcome::Pace { until_ms } => panic!("paced until {until_ms}"),
            }
        }

        #[test]
        fn the_4th_unattended_step_waits_until_the_1st_is_exactly_120_s_old() {
            let p = policy(StepLimits::default());
            let w = windows(&p, &[1_000, 5_000, 9_000]);
            let next = shape(50);
            // The 3rd was admitted: two earlier.
            let w2 = windows(&p, &[1_000, 5_000]);
            assert!(decided(outcome(&p, &w2, &next, false, 0, 9_000))
                .verdict
                .forwards());
            // The 4th waits until the window holds only two earlier steps.
            assert_eq!(
                outcome(&p, &w, &next, false, 0, 10_000),
                Outcome::Pace { until_ms: 121_000 }
            );
            assert_eq!(
                outcome(&p, &w, &next, false, 110_999, 120_999),
                Outcome::Pace { until_ms: 121_000 }
            );
            // At the edge the first is outside (half-open): decided afresh, the wait named.
            let d = decided(outcome(&p, &w, &next, false, 111_000, 121_000));
            assert!(d.verdict.forwards(), "{d:?}");
            assert_eq!(d.paced_ms, Some(111_000));
            let receipt: serde_json::Value = serde_json::from_slice(&d.receipt_body()).unwrap();
            assert_eq!(receipt["paced_ms"], 111_000);
            // Not paced: no field, the receipt bytes of before.
            let d = decided(outcome(&p, &w2, &next, false, 0, 9_000));
            assert_eq!(d.paced_ms, None);
            assert!(!String::from_utf8(d.receipt_body())
                .unwrap()
                .contains("paced_ms"));
        }

        #[test]
        fn attended_steps_are_paced_at_the_8th() {
            let p = policy(StepLimits::default());
            let times: Vec<u64> = (0..7).map(|i| 1_000 + i * 1_000).collect();
            let next = shape(50);
            let six = windows(&p, &times[..6]);
            assert!(decided(outcome(&p, &six, &next, true, 0, 8_000))
                .verdict
                .forwards());
            let seven = windows(&p, &times);
            assert_eq!(
                outcome(&p, &seven, &next, true, 0, 8_000),
                Outcome::Pace { until_ms: 121_000 }
            );
            // Unattended, the same run is past its window's three: its gap has grown to the
            // longest hold.
            assert_eq!(
                outcome(&p, &seven, &next, false, 0, 8_000),
                Outcome::Pace { until_ms: 247_000 }
            );
        }

        #[test]
        fn a_wait_past_the_cap_is_a_loop_and_a_literal_repeat_is_never_paced() {
            let p = policy(StepLimits::default());
            let w = windows(&p, &[1_000, 5_000, 9_000]);
            let next = shape(50);
            // Held 130 s already; another 111 s would pass the 240 s cap.
            let d = decided(outcome(&p, &w, &next, false, 130_000, 10_000));
            assert_eq!(
                (d.verdict, d.rule),
                (Verdict::Block, Some(Rule::RunawayLoopUnattended))
            );
            assert_eq!(d.status(), 429);
            assert_eq!(d.paced_ms, Some(130_000));
            // Exactly at the cap is still a wait.
            assert_eq!(
                outcome(&p, &w, &next, false, 129_000, 10_000),
                Outcome::Pace { until_ms: 121_000 }
            );
            // A literal retry storm (the same fingerprint): BLOCKed at once, never held.
            let storm = shape(3);
            let w = windows(&p, &[1_000, 5_000, 9_000]);
            let mut w = w;
            w.record_step("k", &storm.fingerprint, &STEP, "m", 9_500);
            w.record_step("k", &storm.fingerprint, &STEP, "m", 9_600);
            let d = decided(outcome(&p, &w, &storm, false, 0, 10_000));
            assert_eq!(
                (d.verdict, d.rule),
                (Verdict::Block, Some(Rule::RunawayLoopUnattended))
            );
            // A caller that cannot hold it BLOCKs the repeated step as before.
            let w = windows(&p, &[1_000, 5_000, 9_000]);
            let input = GateInput {
                key_id: "k",
                shape: &next,
                human: false,
                held: false,
                held_usage: None,
                approved_hold: false,
            };
            let state = KeyState {
                counts: w.observe_step("k", &next.fingerprint, &STEP, "m", 10_000),
                budget: None,
            };
            let d = decide(&p, &input, &state, 10_000);
            assert_eq!(d.rule, Some(Rule::RunawayLoopUnattended));
        }

        #[test]
        fn a_key_without_the_stop_is_neither_paced_nor_stopped_on_repeats() {
            use crate::gate::{Mechanism, Mechanisms};
            let mut p = policy(StepLimits::default());
            p.key_without.insert(
                "k".into(),
                [Mechanism::Stop].into_iter().collect::<Mechanisms>(),
            );
            let w = windows(&p, &[1_000, 5_000, 9_000]);
            // The 4th unattended step would wait until 121 s; without the stop it goes now.
            let d = decided(outcome(&p, &w, &shape(50), false, 0, 10_000));
            assert_eq!((d.verdict, d.paced_ms), (Verdict::Allow, None));
            // A literal storm (the 4th identical, unattended) is not stopped either.
            let input = GateInput {
                key_id: "k",
                shape: &shape(1),
                human: false,
                held: false,
                held_usage: None,
                approved_hold: false,
            };
            let storm = KeyState {
                counts: WindowCounts {
                    earlier_identical: 3,
                    ..WindowCounts::default()
                },
                budget: None,
            };
            let without = decide(&p, &input, &storm, 10_000);
            assert_eq!(without.verdict, Verdict::Allow);
            // Nor does the score weigh the repeats.
            assert_eq!(
                (
                    without.signals.loop_,
                    without.signals.burst,
                    without.signals.grind
                ),
                (0.0, 0.0, 0.0)
            );
            p.key_without.clear();
            let with = decide(&p, &input, &storm, 10_000);
            assert_eq!(with.verdict, Verdict::Block);
            assert!(with.signals.loop_ > 0.0);
        }

        #[test]
        fn a_run_older_than_its_bound_is_a_runaway_step() {
            let p = policy(StepLimits {
                runaway_after_secs: 600,
                ..StepLimits::default()
            });
            // Four steps 130 s apart: one run (each within the longest hold of the one before),
            // never more than one earlier in any 120 s.
            let w = windows(&p, &[0, 130_000, 260_000, 390_000]);
            let next = shape(50);
            // Its 5th, 210 s after the 4th (the gap asked: 120 s): admitted at 599 999 ms.
            let d = decided(outcome(&p, &w, &next, false, 0, 599_999));
            assert!(d.verdict.forwards(), "{d:?}");
            // At 600 s the run is the bound's age: stopped.
            let d = decided(outcome(&p, &w, &next, false, 0, 600_000));
            assert_eq!(
                (d.verdict, d.rule),
                (Verdict::Block, Some(Rule::RunawayStep))
            );
            assert_eq!(d.reason(), "runaway_step");
            assert_eq!(d.status(), 429);
            // After a silence as long as the longest hold, the step starts a new run.
            let d = decided(outcome(&p, &w, &next, false, 0, 630_000));
            assert!(d.verdict.forwards(), "{d:?}");
        }

        /// An agent that sends one repeated step `gap_ms` after each answer, against the
        /// gate with `limits`, until it has had `want` answers or is refused: the times the
        /// provider was called, and the refusal.
        fn run_agent(
            limits: StepLimits,
            human: bool,
            gap_ms: u64,
            want: usize,
        ) -> (Vec<u64>, Option<Decision>) {
            let (forwarded, refused, _) = run_agent_under(&policy(limits), human, gap_ms, want);
            (forwarded, refused)
        }

        /// [`run_agent`] against any policy, with every decision's score.
        fn run_agent_under(
            p: &Policy,
            human: bool,
            gap_ms: u64,
            want: usize,
        ) -> (Vec<u64>, Option<Decision>, Vec<f64>) {
            let mut w = windows(p, &[]);
            let mut scores = Vec::new();
            let (mut forwarded, mut now) = (Vec::new(), 1_000_000);
            for n in 0..want {
                let next = shape(n as u8 + 1);
                let asked = now;
                loop {
                    match outcome(p, &w, &next, human, now - asked, now) {
                        Outcome::Pace { until_ms } => {
                            assert!(until_ms > now);
                            now = until_ms;
                        }
                        Outcome::Decided(d) if d.verdict.forwards() => {
                            scores.push(d.score);
                            w.record_session(
                                "k",
                                &next.fingerprint,
                                &STEP,
                                None,
                                None,
                                "m",
                                now,
                                asked,
                            );
                            forwarded.push(now);
                            break;
                        }
                        Outcome::Decided(d) => {
                            scores.push(d.score);
                            return (forwarded, Some(*d), scores);
                        }
                    }
                }
                now += gap_ms;
            }
            (forwarded, None, scores)
        }

        /// Every window (`[gate.windows]`, `[gate.steps]`) shortened `factor` times: the
        /// time-compressed gate `corpus/economics/record.sh` records with.
        fn compressed(factor: u64) -> Policy {
            let mut p = Policy::default();
            let (w, st) = (&mut p.gate.windows, &mut p.gate.steps);
            w.loop_secs /= factor;
            w.burst_secs /= factor;
            w.grind_secs /= factor;
            st.pace_window_secs /= factor;
            st.max_hold_secs /= factor;
            st.runaway_after_secs /= factor;
            assert!(p.gate.validate().is_ok());
            p
        }

        /// The economics recording compresses every window 60 times (earlier recordings 30):
        /// a session that much faster is decided alike, call for call.
        #[test]
        fn a_gate_compressed_30_times_decides_an_agent_30_times_faster_alike() {
            for factor in [30, 60] {
                let scaled = compressed(factor);
                for human in [false, true] {
                    // A poll every 30 s that finishes after 8 answers; a stuck agent that
                    // would repeat its step 100 times, 3 s after each answer.
                    for (gap_ms, want) in [(30_000, 8), (3_000, 100)] {
                        let (calls, refused, scores) =
                            run_agent_under(&Policy::default(), human, gap_ms, want);
                        let (fast, fast_refused, fast_scores) =
                            run_agent_under(&scaled, human, gap_ms / factor, want);
                        let rel = |t: &[u64]| t.iter().map(|&x| x - t[0]).collect::<Vec<_>>();
                        let stretched: Vec<u64> = rel(&fast).iter().map(|x| x * factor).collect();
                        let case = format!("{factor}x, attended {human}, gap {gap_ms}");
                        assert_eq!(stretched, rel(&calls), "{case}");
                        assert_eq!(
                            fast_refused.map(|d| d.reason()),
                            refused.map(|d| d.reason()),
                            "{case}"
                        );
                        assert_eq!(fast_scores, scores, "{case}");
                    }
                }
            }
        }

        /// At most `admits` calls in any `window_ms`.
        fn assert_at_most(times: &[u64], admits: usize, window_ms: u64) {
            for w in times.windows(admits + 1) {
                assert!(w[admits] - w[0] >= window_ms, "{times:?}");
            }
        }

        #[test]
        fn the_defaults_let_a_job_polled_every_10_s_finish_after_6_polls() {
            for human in [false, true] {
                let (polls, refused) = run_agent(StepLimits::default(), human, 10_000, 6);
                assert_eq!(refused.map(|d| d.reason()), None, "attended: {human}");
                assert_eq!(polls.len(), 6);
                assert_at_most(&polls, if human { 7 } else { 3 }, 120_000);
            }
            // Unattended, the 4th poll waited until the 1st was 120 s old.
            let (polls, _) = run_agent(StepLimits::default(), false, 10_000, 6);
            assert_eq!(polls[3], polls[0] + 120_000);
        }

        #[test]
        fn the_defaults_stop_a_stuck_agent_after_90_minutes_paced_all_along() {
            for human in [false, true] {
                // A fast model: the next call 1 s after each answer.
                let (calls, refused) = run_agent(StepLimits::default(), human, 1_000, 100);
                let refused = refused.expect("stopped");
                assert_eq!(refused.reason(), "runaway_step", "attended: {human}");
                assert_eq!(refused.status(), 429);
                // At most 3 (unattended) / 7 (attended) per 120 s, then one per 240 s, all
                // within the 90-minute bound; unattended, fewer than 30 in all.
                assert_at_most(&calls, if human { 7 } else { 3 }, 120_000);
                let last = calls.len() - 1;
                assert!(calls[last] - calls[0] < 5_400_000);
                for pair in calls[if human { 9 } else { 5 }..].windows(2) {
                    assert!(pair[1] - pair[0] >= 240_000, "{calls:?}");
                }
                if !human {
                    assert!(calls.len() < 30, "{}", calls.len());
                }
            }
        }

        /// A stuck agent whose tool prints a fresh 8-hex id each run (`stuck-noisy-deploy`):
        /// about one run in 43 the id is all digits, reads as a number (a count is never
        /// noise), and the step differs: `A A A B A`. Every 5th call here. When B is another
        /// result of the same call (its action), the run of A goes on through it, and the agent
        /// is stopped at the bound having bought the schedule's calls and one per stray; when B is
        /// another call (progress), each B starts A's schedule over and nothing is stopped.
        #[test]
        fn a_stray_result_of_the_same_call_does_not_start_a_stuck_agents_schedule_over() {
            let p = policy(StepLimits::default());
            let (session, action) = (Hash([5; 32]), Hash([6; 32]));
            let agent = |stray_action: Hash| {
                let mut w = Windows::configured(&p.gate);
                let (mut now, mut calls, mut strays) = (1_000_000u64, 0usize, 0usize);
                for n in 0..400u32 {
                    let stray = n % 5 == 4;
                    let mut s = shape((n % 200) as u8 + 1);
                    (s.step_fingerprint, s.step_action) = if stray {
                        (Hash([(n / 5 % 50) as u8 + 100; 32]), Some(stray_action))
                    } else {
                        (STEP, Some(action))
                    };
                    let asked = now;
                    loop {
                        let input = GateInput {
                            key_id: "k",
                            shape: &s,
                            human: false,
                            held: false,
                            held_usage: None,
                            approved_hold: false,
                        };
                        let counts = w.observe_session(
                            "k",
                            &s.fingerprint,
                            &s.step_fingerprint,
                            s.step_action.as_ref(),
                            Some(&session),
                            "m",
                            now,
                        );
                        let state = KeyState {
                            counts,
                            budget: None,
                        };
                        match decide_paced(
                            &p,
                            &input,
                            Approvals::default(),
                            &state,
                            now - asked,
                            now,
                        ) {
                            Outcome::Pace { until_ms } => now = until_ms,
                            Outcome::Decided(d) if d.verdict.forwards() => {
                                w.record_session(
                                    "k",
                                    &s.fingerprint,
                                    &s.step_fingerprint,
                                    s.step_action.as_ref(),
                                    Some(&session),
                                    "m",
                                    now,
                                    asked,
                                );
                                calls += 1;
                                strays += usize::from(stray);
                                break;
                            }
                            Outcome::Decided(d) => return (calls, strays, Some(d.reason())),
                        }
                    }
                    now += 1_000;
                }
                (calls, strays, None)
            };
            let (calls, strays, stopped) = agent(action);
            assert_eq!(stopped, Some("runaway_step"));
            // A stray counts in the run as a step bought (the run's next waits after it), but
            // it is not held itself: it may be progress (a job done), which must not wait. So
            // each stray is one call more than the schedule's.
            let most = schedule::most_calls(&StepLimits::default(), false) as usize;
            println!(
                "a stuck agent with a stray every 5th call: {calls} calls ({strays} strays), \
                 the schedule's most {most}"
            );
            assert!(
                strays >= 4 && calls <= most + strays,
                "{calls} calls, {strays} strays"
            );
            // Another call between: progress, every time.
            let (calls, _, stopped) = agent(Hash([7; 32]));
            assert_eq!((calls, stopped), (400, None));
        }

        #[test]
        fn step_limits_are_validated() {
            let mut cfg = crate::gate::GateConfig::default();
            assert!(cfg.validate().is_ok());
            cfg.steps.pace_window_secs = 121;
            assert_eq!(cfg.validate().unwrap_err().0, "steps.pace_window_secs");
            cfg.steps.pace_window_secs = 2;
            cfg.steps.max_hold_secs = 281;
            assert_eq!(cfg.validate().unwrap_err().0, "steps.max_hold_secs");
            cfg.steps.max_hold_secs = 1;
            assert_eq!(cfg.validate().unwrap_err().0, "steps.max_hold_secs");
            cfg.steps.max_hold_secs = 4;
            cfg.steps.runaway_after_secs = 3;
            assert_eq!(cfg.validate().unwrap_err().0, "steps.runaway_after_secs");
            cfg.steps.runaway_after_secs = 60;
            assert!(cfg.validate().is_ok());
            // The windows may be shortened, never lengthened; the pace window fits the loop's.
            let mut cfg = crate::gate::GateConfig::default();
            cfg.windows.loop_secs = 121;
            assert_eq!(cfg.validate().unwrap_err().0, "windows.loop_secs");
            cfg.windows.loop_secs = 60;
            assert_eq!(cfg.validate().unwrap_err().0, "steps.pace_window_secs");
            cfg.steps.pace_window_secs = 60;
            assert!(cfg.validate().is_ok());
            cfg.windows.burst_secs = 0;
            assert_eq!(cfg.validate().unwrap_err().0, "windows.burst_secs");
            cfg.windows.burst_secs = 60;
            cfg.windows.grind_secs = 59;
            assert_eq!(cfg.validate().unwrap_err().0, "windows.grind_secs");
        }
    }
}
