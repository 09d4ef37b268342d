//! `GET /spec`: the module card in the seed-003 form, generated from the running config, with
//! the receipt public keys. Nothing here is typed twice: weights, bands and limits are read
//! from the policy the gate decides with.

use serde_json::{json, Value};

use crate::config::Config;
use crate::receipt::PublicKeyInfo;
use tokensaver_core::gate::{rules, schedule, FindingCode, Policy, Verdict};

pub const CARD_VERSION: &str = "2.3.0";

pub fn render(config: &Config, policy: &Policy, keys: &[PublicKeyInfo]) -> Value {
    let w = &policy.gate.weights;
    let st = policy.gate.steps;
    let s = &policy.gate.saturation;
    let b = &policy.gate.bands;
    let d = &policy.gate.downgrade;
    let spend_total = w.exposure + w.size + w.ask + w.depth + w.tools;
    let waste_total = w.loop_ + w.burst + w.grind + w.novelty;
    let round = |x: f64| (x * 1e6).round() / 1e6;
    let verdicts: serde_json::Map<String, Value> = Verdict::ALL
        .iter()
        .map(|v| (v.as_str().to_string(), json!(verdict_meaning(*v))))
        .collect();
    json!({
        "module": "tokensaver",
        "version": CARD_VERSION,
        "build": env!("CARGO_PKG_VERSION"),
        "what_it_is": "A deterministic gate in front of a model. It decides whether a request is answered from store, sent to the model, sent to a cheaper model, held for a person, or refused. It also names the waste inside every request it sees.",
        "model_calls_made_to_reach_a_decision": 0,
        "layers": {
            "1_hard_rules": {
                "why": "A cost gate that depends only on tuned weights is a cost gate nobody can defend. These are absolute.",
                "rules": {
                    "budget_exhausted": "spend has reached the key's ceiling",
                    "exceeds_remaining_budget": format!("this one call could cost more than the budget left. Output uses the exact ceiling you set (x n); input is estimated at one token per {} characters, plus every byte text takes beyond one per character (a tokenizer over bytes can bill each), plus a bound per media part, so this rule is deliberately cautious. Held for a person when a human is declared, refused when one is not; a person's approval never passes a worst case that has no bound (a model without a price).", rules::CHARS_PER_INPUT_TOKEN),
                    "runaway_loop": format!("the same request {} times in {} seconds (the same fingerprint, or the same step fingerprint: an agent repeating the same tool call and getting the same result)", rules::LOOP_LIMIT, policy.gate.windows.loop_secs),
                    "runaway_loop_unattended": format!("the same request {} times in {} seconds with no human declared", rules::LOOP_UNATTENDED_LIMIT, policy.gate.windows.loop_secs),
                    "runaway_burst": format!("{} requests from one key in {} seconds", rules::BURST_LIMIT, policy.gate.windows.burst_secs),
                    "runaway_step": format!("a run of one step (the same step fingerprint, another history, no other step of its session between) that has gone on for {} seconds ([gate.steps] runaway_after_secs): a stuck agent, however it is paced", st.runaway_after_secs),
                },
                "literal_repeats_and_repeated_steps": {
                    "literal": "the same fingerprint: the loop rules above, absolute (a retry storm is BLOCKed at once)",
                    "repeated_step": format!("the same step fingerprint with another history (an agent polling, or stuck): where the loop rules would refuse it, the proxy and POST /gate hold it instead — no bytes are sent to the client, no worker thread is used — on a schedule: at most {} unattended / {} attended identical steps decided in any {} s; past those, each further step of the run waits after the one before {} s, then {} s, then {} s (max_hold_secs) each time; a run ends when its session makes another step — not one other result of the same tool calls between two of the run's steps (an id that reads as a number: noise the normalisation cannot tell from a count; not held itself, it counts in the run as a step bought), but two in a row or another call — or after a silence of {} s; no single hold exceeds {} s, and a wait that would is BLOCKed as a loop; a run {} s old is stopped (runaway_step). Unattended, a caller that asks again at once buys at most {} calls before it is stopped ({} attended), one per {} s after its first minutes; a caller that leaves while held is never decided. The receipt and the ledger row carry paced_ms. A fleet paces exactly as one node: the runs live in its database.", rules::STEP_PACE_UNATTENDED, rules::STEP_PACE_ATTENDED, st.pace_window_secs, schedule::gap_ms(&st, rules::STEP_PACE_UNATTENDED, false) / 1_000, schedule::gap_ms(&st, rules::STEP_PACE_UNATTENDED + 1, false) / 1_000, st.max_hold_secs, st.max_hold_secs, st.max_hold_secs, st.runaway_after_secs, schedule::most_calls(&st, false), schedule::most_calls(&st, true), st.max_hold_secs),
                    "serve": "a SERVE buys nothing: it counts by its fingerprint but not as a step, so a temperature-0 rerun of a session is answered from store, not stopped",
                },
            },
            "2_the_score": {
                "spend_signals": {
                    "exposure": {"weight": w.exposure, "measures": "worst case cost of this call against the budget left"},
                    "size": {"weight": w.size, "saturates_at": s.size, "measures": "prompt characters, log scaled"},
                    "ask": {"weight": w.ask, "saturates_at": s.ask, "measures": "the max_tokens ceiling the caller set"},
                    "depth": {"weight": w.depth, "saturates_at": s.depth, "measures": "turns re-sent on every call"},
                    "tools": {"weight": w.tools, "saturates_at": s.tools, "measures": "tool definitions re-sent on every call"},
                },
                "waste_signals": {
                    "loop": {"weight": w.loop_, "saturates_at": s.loop_},
                    "burst": {"weight": w.burst, "saturates_at": s.burst},
                    "grind": {"weight": w.grind, "saturates_at": s.grind},
                    "novelty": {"weight": w.novelty},
                },
                "profiles": profiles(config),
                "spend_weight_total": round(spend_total),
                "waste_weight_total": round(waste_total),
                "base_weights_sum_to": round(spend_total + waste_total),
                "outside_the_base_sum": {"unattended": w.unattended},
                "bands": {"CHALLENGE": format!(">= {}", b.challenge), "BLOCK": format!(">= {}", b.block)},
                "downgrade_is_earned_not_suspected": {
                    "max_score": d.max_score,
                    "max_prompt_characters": d.max_prompt_chars,
                    "max_turns": d.max_turns,
                    "max_output_tokens": d.max_output_tokens,
                    "tools_allowed": d.tools_allowed,
                    "why": "a suspicious request is never sent to a weaker model. Only a genuinely small one is.",
                    "map": policy.downgrade,
                },
            },
            "3_findings": {
                "why": "The verdict saves money on this call. The findings change what the caller sends next time, which saves far more.",
                "codes": FindingCode::ALL.iter().map(|c| c.as_str()).collect::<Vec<_>>(),
            },
        },
        "verdict_vocabulary": verdicts,
        "certainty_tiers": {
            "tokens_not_bought": "exact, provider reported, the only figure that enters a savings total",
            "worst_case_tokens_avoided": "a ceiling on what a refused request could have cost, reported separately",
            "findings_tokens": "estimated from characters where marked, never entering any total",
            "cache_saving": "derived and counterfactual (nano-USD), only where the gate placed the prompt-cache breakpoints: what the cached tokens would have cost uncached minus what they did cost (read price plus write premium, at the served model's prices, from the cache parts the provider reported); negative when a write was never read; never added to spend, tokens_not_bought or any total",
        },
        "prompt_caching": prompt_caching(),
        "two_ways_to_call_it": {
            "request": "send the provider request body. This platform sees your prompt.",
            "digest": "send only a fingerprint and counts. Your prompts and answers never leave your building, the decision is identical, and the receipt is the same. The downloaded client uses this path by default.",
        },
        "identity": {
            "fingerprint": "keyed BLAKE3 over the route and the body's canonical JSON (keys sorted, no whitespace), without the fields below; an input longer than 1 KiB is padded (one 0x01 byte, then zeros) to a multiple of 4 KiB so that every BLAKE3 chunk of it is hashed in parallel (hashes v2)",
            "step_fingerprint": "keyed BLAKE3 (step domain v4) over route, model, system, tools and the tail from the newest assistant turn on: its tool calls (names and arguments, not its text or thinking) — or, when it called no tool, its text (a person answering different texts with the same word takes different steps) — and the turns after it, without per-call ids, item status and cache_control, the tool results normalised (step_normalisation); a Responses call that continues a stored response (previous_response_id, no model item in its input) names that response's answer (a keyed hash of its tool calls, or of its text, kept by the gate when it relayed the answer), never the response id; equals the fingerprint when there is no assistant turn",
            "step_action": "keyed BLAKE3 (action domain v1) over the route and the newest assistant turn's tool calls (names and arguments, as in the step) without anything after them; absent for a turn without a tool call and for a chained Responses call: two steps with one action are one call that answered twice, and one such other result between two steps of a run does not end the run (repeated_step)",
            "session": "the agent session a decision is grouped in (GET /ledger/sessions): a keyed BLAKE3 of the client's own session header where it sends one (x-tokensaver-session, then Claude Code's x-claude-code-session-id, then Codex's session-id), else of the route, system, tools and first user turn (not the model); a hash, never content, blanked by POST /forget",
            "step_normalisation": {
                "version": tokensaver_core::request::normalise::NORMALISATION_VERSION,
                "applies_to": "the tool results in the step fingerprint's tail only (chat tool messages' content, Anthropic tool_result content, Responses *_output output; text parts only): never the fingerprint, never the bytes forwarded",
                "replaced_by_their_kind": tokensaver_core::request::normalise::RULES
                    .iter()
                    .map(|(kind, replaces)| json!({"kind": kind, "replaces": replaces}))
                    .collect::<Vec<_>>(),
                "kept": tokensaver_core::request::normalise::KEPT,
            },
            "fields_that_never_change_the_answer": {
                "openai_chat": tokensaver_core::request::ignored_fields(tokensaver_core::request::Route::OpenAiChat),
                "openai_responses": tokensaver_core::request::ignored_fields(tokensaver_core::request::Route::OpenAiResponses),
                "anthropic_messages": tokensaver_core::request::ignored_fields(tokensaver_core::request::Route::AnthropicMessages),
            },
            "never_served_from_store": "Responses requests that depend on provider-side state: previous_response_id, conversation, background",
        },
        "honest_limits": [
            "Matching is exact. A reworded prompt is a different request and goes to the model.",
            "Savings totals use only token counts the provider itself reported. Nothing in a total is estimated.",
            "A refused request has a worst case cost, not a known cost. It is reported separately and never added to the savings total.",
            "Token figures inside findings are estimated from character counts and are marked as estimates. They never enter a total.",
            "A stored answer is returned unchanged. This module does not judge whether it is still correct.",
            "No model is called to reach any decision here.",
            "Media parts (images, audio, files) count as turns but add no characters; encrypted reasoning items count none either.",
            "The identity leaves out fields that name the caller or its session (user, metadata, safety_identifier, prompt_cache_key): two sessions that send the same request share a stored answer within one key.",
            "In digest mode, counts and usage are reported by the client; lengths and parameters (model, max_tokens, ...) still leave the building, content does not.",
            "Spend is kept in integer nano-USD; each usage part is priced per million tokens and rounded up per call.",
            "An answer that ends without the provider's final usage (an error event, a truncated stream, a reset, a timeout, a client that went away) is charged its worst case, never less: its spend is an upper bound, marked worst_case, and it is never stored or counted as tokens_not_bought.",
            "Usage the price table cannot express is not priced: long-context surcharges, OpenAI web search calls (not reported in usage), and Anthropic iterations run on another model (advisor, fallback), which are priced at the served model's prices.",
        ],
        "worst_case_input_bound": {
            "text": format!("ceil(characters / {}) + UTF-8 bytes beyond one per character", rules::CHARS_PER_INPUT_TOKEN),
            "per_image_part_tokens": {
                "anthropic": rules::IMAGE_TOKENS_ANTHROPIC,
                "openai": rules::IMAGE_TOKENS_OPENAI,
                "openai gpt-4o-mini*": rules::IMAGE_TOKENS_GPT_4O_MINI,
            },
            "per_document_or_file_part_tokens": rules::DOCUMENT_TOKENS,
            "per_audio_part_tokens": rules::AUDIO_TOKENS,
            "chained_context": "a Responses call with previous_response_id adds the input plus output tokens the provider reported for the response it names, as the gate saw them in the answer it relayed; that response must have been created with the same key, and one whose usage the gate has not seen (a background response not yet read back complete, a stream cut short) is refused (409 chained_context_unknown); in digest mode the local client fills the digest's chained_input_tokens from its own bindings",
            "holds_for": "any text whose ASCII part tokenizes at 3 or more characters per token (prose, code, JSON) and any non-ASCII text; dense ASCII (runs of digits and punctuation) can tokenize denser and exceed it",
        },
        "digest_record_bound": {
            "input_tokens_at_most": format!("3 x the decision's input estimate + {}", crate::gatekeeper::settlement::RECORD_INPUT_FRAMING_TOKENS),
            "output_tokens_at_most": "the decision's output ceiling",
            "any_part_at_most": crate::gatekeeper::settlement::MAX_RECORDED_TOKENS,
            "who_may_record": "only the digest client whose POST /gate made the decision; a decision the proxy forwarded is settled by the proxy alone",
        },
        "signed_documents": {
            "why": "one key signs several kinds of document; each kind is signed under its own domain and named in the envelope, so one kind never passes as another",
            "kinds": ["receipt", "split_profile_report", "evidence", "probe"],
            "unscoped": "an envelope without a kind was signed before the domains: /verify proves the key signed it, not which kind it is",
        },
        "decision_id": "64 lowercase hex digits: for a receipt body of version 2, the decision time (decided_at_ms, 6 bytes big-endian) then the first 26 bytes of the BLAKE3 of the exact signed body, so ids sort by time; for a version-1 body, the BLAKE3 of the body. POST /record, GET /ledger/decisions?after= and the ledger take it",
        "pricing": pricing(policy),
        "routes": {
            "gated": ["POST /v1/chat/completions", "POST /v1/responses", "POST /v1/messages"],
            "passed_through_after_the_key_check": ["GET /v1/models", "GET|DELETE /v1/responses/{id}", "GET /v1/responses/{id}/input_items", "POST /v1/responses/{id}/cancel", "POST /v1/messages/count_tokens"],
            "public": ["spec", "stats", "verify"],
            "keyed": ["estimate", "gate", "record", "ledger", "ledger/decisions", "ledger/sessions", "budget", "prices", "forget", "holds"],
            "key_owner": ["holds", "holds/{id}/approve", "holds/{id}/deny"],
            "admin_listener": ["budget/{key_id}", "prices", "holds", "holds/{id}/approve", "holds/{id}/deny", "ledger/decisions", "ledger/sessions", "metrics", "economics", "split-profile/*"],
        },
        "listeners": {
            "proxy": config.proxy_addr.to_string(),
            "api": config.api_addr.to_string(),
            "admin": config.admin_addr.to_string(),
        },
        "receipt_keys": keys,
    })
}

/// Prompt caching placed by the gate (SPEC §2.11b): the rule, its limits and its constants.
fn prompt_caching() -> Value {
    use tokensaver_core::gate::cache;
    json!({
        "policy": "per key, cache = \"auto\" (the default) | \"off\"",
        "why_auto_is_the_default": "a breakpoint goes only where the key has already sent the same prefix within the cache's lifetime, so a one-off request never pays the write premium; what it can cost is one write premium on a prefix seen twice and never again",
        "applies_to": "Anthropic /v1/messages requests that carry no cache_control of their own; a caller's own breakpoints are left exactly as sent",
        "rule": {
            "write": "at the longest prefix of this request (after the tools, after the system prompt, or after one of the last messages) that the key sent within the lifetime and that holds at least the model's minimum cacheable tokens at a cautious characters-per-token rate",
            "read": "at up to three shorter prefixes where the gate placed a breakpoint within the lifetime",
            "lifetime_ms": cache::CACHE_TTL_MS,
            "max_breakpoints": cache::MAX_BREAKPOINTS,
            "characters_per_token_for_the_minimum": cache::CHARS_PER_TOKEN_FOR_MINIMUM,
            "minimum_cacheable_tokens": {"opus-4-5, opus-4-6, haiku-4-5": 4096, "sonnet-4-6, other haiku": 2048, "others": 1024},
            "messages_with_a_cache_point": tokensaver_core::request::CACHE_POINT_MESSAGES,
            "never_on": "thinking or redacted_thinking blocks, empty text",
            "remembered": "keyed hashes of the prefixes and two times each, per key, in memory (no content)",
        },
        "edit": "billing only: the fingerprint, the decision and the findings are those of the caller's request; the marker {\"type\":\"ephemeral\"} is inserted after the unit's last block (a string becomes one text block), every other byte reaches the provider as sent; the receipt says cache_breakpoints_added",
        "digest_mode": "the central gate says where (indices into the digest's cache_points, keyed prefix hashes and character counts only); the local instance applies them",
        "openai": "nothing added: OpenAI caches every prompt of 1,024 tokens or more by prefix without markers, and prompt_cache_key only routes requests to one cache partition; within one key and model the built-in provider's model of it (and the providers' pages) show no saving from adding one",
    })
}

/// What the price table prices, per model: the four parts, 1-hour cache writes (configured,
/// or twice the input price), web search requests (configured, or not priced), and the
/// model's maximum output.
fn pricing(policy: &Policy) -> Value {
    let models: serde_json::Map<String, Value> = policy
        .prices
        .iter()
        .map(|(model, p)| {
            (
                model.clone(),
                json!({
                    "input": p.input,
                    "cache_write_5m": p.cache_write,
                    "cache_write_1h": p.cache_write_1h(),
                    "cache_write_1h_from": if p.cache_write_1h.is_some() { "price table" } else { "2x input (Anthropic's rule)" },
                    "cache_read": p.cache_read,
                    "output": p.output,
                    "web_search_per_1k_requests": p.web_search_per_1k,
                    "max_output": p.max_output,
                }),
            )
        })
        .collect();
    let unpriced_search: Vec<&String> = policy
        .prices
        .iter()
        .filter(|(_, p)| p.web_search_per_1k.is_none())
        .map(|(m, _)| m)
        .collect();
    json!({
        "units": "micro-USD per million tokens; web search in micro-USD per 1,000 requests; spend in integer nano-USD",
        "billed_items": {
            "input": "uncached input tokens",
            "cache_write_5m": "cache writes of the default duration (Anthropic: 5 minutes; OpenAI-compatible cache_write_tokens)",
            "cache_write_1h": "Anthropic 1-hour cache writes, priced apart",
            "cache_read": "cached input tokens read (OpenAI cached_tokens)",
            "output": "output tokens, reasoning included (counted once)",
            "web_search_requests": "Anthropic server-side web searches, per request",
        },
        "tiers_use": "the four parts (input, cache_write, cache_read, output); 1-hour writes and web searches are priced in spend only",
        "web_search_not_priced_for": unpriced_search,
        "models": models,
    })
}

/// The scoring profiles keys use: where their spend signals saturate (no key ids: /spec is
/// public).
fn profiles(config: &Config) -> Value {
    let mut out = serde_json::Map::new();
    for (name, spend) in config.keys.iter().filter_map(|k| k.profile.as_ref()) {
        out.insert(
            name.clone(),
            json!({
                "spend_signals_saturate_at": spend,
                "unchanged": "weights, bands, the waste signals (loop, burst, grind), novelty, unattended and every hard rule",
            }),
        );
    }
    Value::Object(out)
}

fn verdict_meaning(v: Verdict) -> &'static str {
    match v {
        Verdict::Serve => "answered from an identical earlier request; nothing was bought",
        Verdict::Allow => "send it to the model as asked",
        Verdict::Downgrade => "small and simple enough for the cheap model",
        Verdict::Challenge => "hold it for a person before spending",
        Verdict::Block => "refused; it never reaches the model, so no completion is paid for",
    }
}
