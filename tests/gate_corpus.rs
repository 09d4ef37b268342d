//! The gate decision corpus (`corpus/gate/`): decisions derived from the SPEC, checked against
//! the engine.
//!
//! Each case in `corpus/gate/cases/*.json` states the policy overrides, the key, its history,
//! budget and held answers, the clock and the request body, and the EXPECTED decision worked
//! out from SPEC §2 without the engine (the `arithmetic` field shows the working). This runner builds the
//! inputs through the public API only — `request::parse`, `Windows::record`/`observe`,
//! `decide` — and compares every expected field. All mismatches of all cases are reported
//! before the test fails.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::{Map, Value};

use tokensaver::auth::fingerprint_key;
use tokensaver::config::Prices;
use tokensaver::gate::{
    decide, BudgetState, Decision, FindingCode, GateConfig, GateInput, KeyState, Policy, Rule,
    Usage, Verdict, Windows,
};
use tokensaver::request::{self, Route, WireForm};

/// Scores and signals are compared to 4 decimals: the expected value must be the got value
/// rounded to 4 places (|got − expected| < 0.00005, plus a hair for binary representation).
const TOLERANCE: f64 = 0.000_05 + 1e-12;

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join("gate")
}

// ------------------------------------------------------------------------------ case format

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Defaults {
    #[allow(dead_code)]
    about: Value,
    gate: Value,
    prices: BTreeMap<String, Prices>,
    downgrade: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    name: String,
    tests: String,
    route: Route,
    #[serde(default)]
    policy: PolicyOverride,
    key: KeySpec,
    /// The `x-tokensaver-human` header value, or absent (null) for the key's default.
    human_header: Option<String>,
    #[serde(default)]
    history: Vec<HistoryEntry>,
    budget: Option<BudgetState>,
    #[serde(default)]
    held: Vec<Held>,
    #[serde(default)]
    approved_hold: bool,
    now_ms: u64,
    request: Value,
    expected: Expected,
    arithmetic: Value,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyOverride {
    /// Merged (object by object) over the defaults' gate configuration.
    #[serde(default)]
    gate: Option<Value>,
    /// Entries added to (or replacing those of) the default price table.
    #[serde(default)]
    prices: BTreeMap<String, Prices>,
    /// Entries added to (or replacing those of) the default downgrade map.
    #[serde(default)]
    downgrade: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct KeySpec {
    id: String,
    secret: String,
    human_default: bool,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct OtherKey {
    id: String,
    secret: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct HistoryEntry {
    #[allow(dead_code)]
    label: String,
    /// A request body, or the string `"$request"` for the case's own body.
    body: Value,
    /// Top-level fields set on the body (null removes the field).
    #[serde(default)]
    merge: Option<Map<String, Value>>,
    at_ms: u64,
    #[serde(default = "one")]
    repeat: u64,
    #[serde(default)]
    step_ms: u64,
    /// Another key's traffic (default: the case's key).
    #[serde(default)]
    key: Option<OtherKey>,
    /// Another route (default: the case's route).
    #[serde(default)]
    route: Option<Route>,
}

fn one() -> u64 {
    1
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Held {
    form: WireForm,
    usage: Option<Usage>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Expected {
    verdict: String,
    rule: Option<String>,
    band: Option<String>,
    score: f64,
    signals: BTreeMap<String, f64>,
    findings: Vec<ExpectedFinding>,
    model_served: Option<String>,
    hold_id: bool,
    worst_case: ExpectedWorstCase,
    tokens_not_bought: Option<Usage>,
    worst_case_tokens_avoided: Option<u64>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct ExpectedFinding {
    code: String,
    tokens: Option<u64>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct ExpectedWorstCase {
    input_tokens_estimated: u64,
    output_tokens: Option<u64>,
    cost_nano: Option<u64>,
}

// ------------------------------------------------------------------------------ loading

fn load_defaults() -> Defaults {
    let path = corpus_dir().join("defaults.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn load_cases() -> Vec<(String, Case)> {
    let dir = corpus_dir().join("cases");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let file = p.file_name().unwrap().to_string_lossy().into_owned();
            let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{file}: {e}"));
            let case: Case = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("{file}: not a valid case: {e}"));
            (file, case)
        })
        .collect()
}

/// Object-by-object merge: `patch`'s leaves replace `base`'s.
fn merge_json(base: &mut Value, patch: &Value) {
    match (base, patch) {
        (Value::Object(b), Value::Object(p)) => {
            for (k, v) in p {
                merge_json(b.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
        (b, p) => *b = p.clone(),
    }
}

fn policy_for(defaults: &Defaults, case: &Case) -> Result<Policy, String> {
    let mut gate = defaults.gate.clone();
    if let Some(patch) = &case.policy.gate {
        merge_json(&mut gate, patch);
    }
    let gate: GateConfig = serde_json::from_value(gate).map_err(|e| format!("policy.gate: {e}"))?;
    let mut prices = defaults.prices.clone();
    prices.extend(case.policy.prices.clone());
    let mut downgrade = defaults.downgrade.clone();
    downgrade.extend(case.policy.downgrade.clone());
    Ok(Policy {
        gate,
        prices,
        downgrade,
        ..Policy::default()
    })
}

fn body_bytes(value: &Value) -> Vec<u8> {
    serde_json::to_vec(value).expect("a JSON value serialises")
}

// ------------------------------------------------------------------------------ running a case

/// Build the inputs exactly as a caller of the public API would, and decide.
fn run_case(defaults: &Defaults, case: &Case) -> Result<Decision, String> {
    let policy = policy_for(defaults, case)?;
    let fkey = fingerprint_key(&case.key.secret);

    // Replay the history into the windows, oldest first.
    let mut events: Vec<(u64, String, tokensaver::request::Hash, String)> = Vec::new();
    for (i, h) in case.history.iter().enumerate() {
        let mut body = match &h.body {
            Value::String(s) if s == "$request" => case.request.clone(),
            Value::Object(_) => h.body.clone(),
            other => {
                return Err(format!(
                    "history[{i}].body must be an object or \"$request\", not {other}"
                ))
            }
        };
        if let (Some(merge), Value::Object(map)) = (&h.merge, &mut body) {
            for (k, v) in merge {
                if v.is_null() {
                    map.remove(k);
                } else {
                    map.insert(k.clone(), v.clone());
                }
            }
        }
        let (key_id, secret) = match &h.key {
            Some(k) => (k.id.clone(), k.secret.clone()),
            None => (case.key.id.clone(), case.key.secret.clone()),
        };
        let route = h.route.unwrap_or(case.route);
        let parsed = request::parse(route, &body_bytes(&body), &fingerprint_key(&secret))
            .map_err(|e| format!("history[{i}] body does not parse: {e}"))?;
        for r in 0..h.repeat {
            events.push((
                h.at_ms + r * h.step_ms,
                key_id.clone(),
                parsed.shape.fingerprint,
                parsed.shape.model.clone(),
            ));
        }
    }
    events.sort_by_key(|e| e.0);
    let mut windows = Windows::new();
    for (at, key_id, fingerprint, model) in &events {
        windows.record(key_id, fingerprint, model, *at);
    }

    let parsed = request::parse(case.route, &body_bytes(&case.request), &fkey)
        .map_err(|e| format!("request does not parse: {e}"))?;
    // The proxy reads a body for its own decision with only the turn hashes it compares; it
    // must decide as on the full shape (checked below).
    let for_decision = request::parse_for_decision(case.route, &body_bytes(&case.request), &fkey)
        .map_err(|e| format!("request does not parse for a decision: {e}"))?
        .shape;
    let shape = parsed.shape;
    let human = match case.human_header.as_deref() {
        Some("1") => true,
        Some("0") => false,
        None => case.key.human_default,
        Some(other) => {
            return Err(format!(
                "human_header must be \"1\", \"0\" or null, not {other:?}"
            ))
        }
    };
    let held_entry = case.held.iter().find(|h| h.form == shape.wire_form());
    let input = GateInput {
        key_id: &case.key.id,
        shape: &shape,
        human,
        held: held_entry.is_some(),
        held_usage: held_entry.and_then(|h| h.usage),
        approved_hold: case.approved_hold,
    };
    let state = KeyState {
        counts: windows.observe(&case.key.id, &shape.fingerprint, &shape.model, case.now_ms),
        budget: case.budget,
    };
    let decision = decide(&policy, &input, &state, case.now_ms);
    let as_the_proxy_reads_it = GateInput {
        shape: &for_decision,
        ..input
    };
    if decide(&policy, &as_the_proxy_reads_it, &state, case.now_ms) != decision {
        return Err("the shape read for a decision decides otherwise than the full one".into());
    }
    Ok(decision)
}

fn diff(out: &mut Vec<String>, field: &str, want: String, got: String) {
    if want != got {
        out.push(format!("{field}: expected {want}, engine {got}"));
    }
}

fn near(got: f64, want: f64) -> bool {
    got.is_finite() && (got - want).abs() < TOLERANCE
}

/// Every difference between the decision and the case's expectation, as readable lines.
fn compare(case: &Case, d: &Decision) -> Vec<String> {
    let e = &case.expected;
    let mut out = Vec::new();
    diff(
        &mut out,
        "verdict",
        e.verdict.clone(),
        d.verdict.as_str().to_string(),
    );
    diff(
        &mut out,
        "rule",
        format!("{:?}", e.rule),
        format!("{:?}", d.rule.map(|r| r.as_str().to_string())),
    );
    diff(
        &mut out,
        "band",
        format!("{:?}", e.band),
        format!("{:?}", d.band.map(|b| b.as_str().to_string())),
    );
    diff(
        &mut out,
        "model_served",
        format!("{:?}", e.model_served),
        format!("{:?}", d.model_served),
    );
    diff(
        &mut out,
        "hold_id present",
        e.hold_id.to_string(),
        d.hold_id.is_some().to_string(),
    );
    diff(
        &mut out,
        "worst_case.input_tokens_estimated",
        e.worst_case.input_tokens_estimated.to_string(),
        d.worst_case.input_tokens_estimated.to_string(),
    );
    diff(
        &mut out,
        "worst_case.output_tokens",
        format!("{:?}", e.worst_case.output_tokens),
        format!("{:?}", d.worst_case.output_tokens),
    );
    diff(
        &mut out,
        "worst_case.cost_nano",
        format!("{:?}", e.worst_case.cost_nano),
        format!("{:?}", d.worst_case.cost_nano),
    );
    diff(
        &mut out,
        "tokens_not_bought",
        format!("{:?}", e.tokens_not_bought),
        format!("{:?}", d.tokens_not_bought),
    );
    diff(
        &mut out,
        "worst_case_tokens_avoided",
        format!("{:?}", e.worst_case_tokens_avoided),
        format!("{:?}", d.worst_case_tokens_avoided),
    );
    diff(
        &mut out,
        "model_requested",
        format!("{:?}", case.request.get("model").and_then(Value::as_str)),
        format!("{:?}", Some(d.model_requested.as_str())),
    );
    diff(&mut out, "key_id", case.key.id.clone(), d.key_id.clone());
    diff(
        &mut out,
        "decided_at_ms",
        case.now_ms.to_string(),
        d.decided_at_ms.to_string(),
    );

    if !near(d.score, e.score) {
        out.push(format!(
            "score: expected {:.4}, engine {:.9}",
            e.score, d.score
        ));
    }
    let got_signals = match serde_json::to_value(d.signals) {
        Ok(Value::Object(map)) => map,
        _ => Map::new(),
    };
    let names: BTreeSet<&String> = got_signals.keys().chain(e.signals.keys()).collect();
    for name in names {
        match (
            e.signals.get(name),
            got_signals.get(name).and_then(Value::as_f64),
        ) {
            (Some(want), Some(got)) if near(got, *want) => {}
            (Some(want), Some(got)) => out.push(format!(
                "signal {name}: expected {want:.4}, engine {got:.9}"
            )),
            (want, got) => out.push(format!("signal {name}: expected {want:?}, engine {got:?}")),
        }
    }

    // Findings: compared as a set of codes, each with its estimated figure (or none).
    let want: BTreeMap<&str, Option<u64>> = e
        .findings
        .iter()
        .map(|f| (f.code.as_str(), f.tokens))
        .collect();
    let got: BTreeMap<&str, Option<u64>> = d
        .findings
        .iter()
        .map(|f| (f.code.as_str(), f.tokens))
        .collect();
    if want.len() != e.findings.len() || got.len() != d.findings.len() {
        out.push("findings: a code is listed twice".to_string());
    }
    for (code, w) in &want {
        match got.get(code) {
            None => out.push(format!(
                "finding {code}: expected (tokens {w:?}), engine has none"
            )),
            Some(g) if g != w => out.push(format!(
                "finding {code}: expected tokens {w:?}, engine {g:?}"
            )),
            Some(_) => {}
        }
    }
    for (code, g) in &got {
        if !want.contains_key(code) {
            out.push(format!(
                "finding {code}: not expected, engine has it (tokens {g:?})"
            ));
        }
    }
    for f in &d.findings {
        if f.estimated != f.tokens.is_some() {
            out.push(format!(
                "finding {}: estimated must be true exactly when it has a figure",
                f.code.as_str()
            ));
        }
    }

    // The receipt carries the same facts (SPEC §2.10).
    match serde_json::from_slice::<Value>(&d.receipt_body()) {
        Err(e) => out.push(format!("receipt body is not JSON: {e}")),
        Ok(r) => {
            let s = |v: &Value| v.as_str().map(str::to_string);
            diff(
                &mut out,
                "receipt.verdict",
                e.verdict.clone(),
                s(&r["verdict"]).unwrap_or_default(),
            );
            diff(
                &mut out,
                "receipt.rule",
                format!("{:?}", e.rule),
                format!("{:?}", s(&r["rule"])),
            );
            diff(
                &mut out,
                "receipt.band",
                format!("{:?}", e.band),
                format!("{:?}", s(&r["band"])),
            );
            diff(
                &mut out,
                "receipt.key_id",
                case.key.id.clone(),
                s(&r["key_id"]).unwrap_or_default(),
            );
            diff(
                &mut out,
                "receipt.decided_at_ms",
                case.now_ms.to_string(),
                r["decided_at_ms"].to_string(),
            );
            let codes: BTreeSet<String> = r["findings"]
                .as_array()
                .map(|a| a.iter().filter_map(s).collect())
                .unwrap_or_default();
            let want_codes: BTreeSet<String> = e.findings.iter().map(|f| f.code.clone()).collect();
            diff(
                &mut out,
                "receipt.findings",
                format!("{want_codes:?}"),
                format!("{codes:?}"),
            );
            diff(
                &mut out,
                "receipt.tokens_not_bought",
                format!("{:?}", e.tokens_not_bought.map(|u| u.total())),
                format!("{:?}", r["tokens_not_bought"].as_u64()),
            );
            diff(
                &mut out,
                "receipt.worst_case_tokens_avoided",
                format!("{:?}", e.worst_case_tokens_avoided),
                format!("{:?}", r["worst_case_tokens_avoided"].as_u64()),
            );
            match r["score"].as_f64() {
                Some(x) if near(x, e.score) => {}
                other => out.push(format!(
                    "receipt.score: expected {:.4}, receipt {other:?}",
                    e.score
                )),
            }
            let text = String::from_utf8_lossy(&d.receipt_body()).into_owned();
            if text.contains(&case.key.secret) {
                out.push("receipt names the key secret".to_string());
            }
        }
    }
    out
}

fn check_case_form(case: &Case) -> Vec<String> {
    let mut out = Vec::new();
    if case.name.trim().is_empty() || case.tests.trim().is_empty() {
        out.push("case needs a name and a description of what it tests".to_string());
    }
    let has_working = match &case.arithmetic {
        Value::String(s) => !s.trim().is_empty(),
        Value::Array(a) => !a.is_empty() && a.iter().all(Value::is_string),
        _ => false,
    };
    if !has_working {
        out.push("`arithmetic` must show the working (a string or a list of strings)".to_string());
    }
    const SIGNALS: [&str; 10] = [
        "exposure",
        "size",
        "ask",
        "depth",
        "tools",
        "loop",
        "burst",
        "grind",
        "novelty",
        "unattended",
    ];
    for name in SIGNALS {
        if !case.expected.signals.contains_key(name) {
            out.push(format!("expected.signals lacks {name}"));
        }
    }
    out
}

// ------------------------------------------------------------------------------ tests

#[test]
fn the_defaults_are_the_seed_cards() {
    // defaults.json restates seed 003's weights, saturations, bands, downgrade limits and the
    // SPEC's finding thresholds; the engine's defaults must be exactly those.
    let defaults = load_defaults();
    let from_file: GateConfig =
        serde_json::from_value(defaults.gate.clone()).expect("defaults.gate is a GateConfig");
    assert_eq!(
        from_file,
        GateConfig::default(),
        "engine defaults differ from seed 003 / SPEC §2.4-2.8"
    );
}

#[test]
fn gate_corpus() {
    let defaults = load_defaults();
    let cases = load_cases();
    assert!(
        cases.len() >= 30,
        "the corpus needs at least 30 cases, has {}",
        cases.len()
    );

    let mut report = String::new();
    let mut failed = 0;
    let mut names = BTreeSet::new();
    for (file, case) in &cases {
        let mut problems = check_case_form(case);
        if !names.insert(case.name.clone()) {
            problems.push(format!("duplicate case name {}", case.name));
        }
        match run_case(&defaults, case) {
            Ok(decision) => problems.extend(compare(case, &decision)),
            Err(e) => problems.push(e),
        }
        if !problems.is_empty() {
            failed += 1;
            let _ = writeln!(report, "\n{file} ({}):", case.name);
            for p in problems {
                let _ = writeln!(report, "    {p}");
            }
        }
    }
    assert!(
        failed == 0,
        "{failed} of {} gate corpus cases disagree with the engine:{report}",
        cases.len()
    );
}

#[test]
fn corpus_covers_every_verdict_rule_band_and_finding() {
    let cases = load_cases();
    let verdicts: BTreeSet<String> = cases
        .iter()
        .map(|(_, c)| c.expected.verdict.clone())
        .collect();
    for v in Verdict::ALL {
        assert!(
            verdicts.contains(v.as_str()),
            "no case expects verdict {}",
            v.as_str()
        );
    }
    let rules: BTreeSet<String> = cases
        .iter()
        .filter_map(|(_, c)| c.expected.rule.clone())
        .collect();
    // `runaway_step` is met only by a caller that can hold a request (`decide_paced`: the
    // proxy and `POST /gate` pace a repeated step and stop it past the long bound); this
    // corpus decides as one that cannot (`decide`). It is checked by the pacing tests in
    // `crates/core/src/gate/decide.rs` and against the real binary in `tests/sessions.rs`.
    for r in Rule::ALL.into_iter().filter(|r| *r != Rule::RunawayStep) {
        assert!(
            rules.contains(r.as_str()),
            "no case expects rule {}",
            r.as_str()
        );
    }
    let bands: BTreeSet<String> = cases
        .iter()
        .filter_map(|(_, c)| c.expected.band.clone())
        .collect();
    for b in ["score_challenge", "score_block"] {
        assert!(bands.contains(b), "no case expects band {b}");
    }
    let codes: BTreeSet<String> = cases
        .iter()
        .flat_map(|(_, c)| c.expected.findings.iter().map(|f| f.code.clone()))
        .collect();
    for f in FindingCode::ALL {
        assert!(
            codes.contains(f.as_str()),
            "no case expects finding {}",
            f.as_str()
        );
    }
    let routes: BTreeSet<&str> = cases.iter().map(|(_, c)| c.route.as_str()).collect();
    assert_eq!(routes.len(), 2, "both routes must be covered");
}

#[test]
fn the_checker_reports_a_wrong_expectation() {
    // Guard against a runner that compares nothing: break each kind of expected value in a
    // copy of a case and check that a mismatch is reported.
    let defaults = load_defaults();
    let cases = load_cases();
    let (_, base) = cases
        .iter()
        .find(|(_, c)| {
            c.expected.rule.is_some()
                && c.expected.verdict == "BLOCK"
                && !c.expected.findings.is_empty()
        })
        .expect("a BLOCK case by a rule, with findings");
    let decision = run_case(&defaults, base).expect("the case runs");
    assert!(
        compare(base, &decision).is_empty(),
        "base case must pass: {:?}",
        compare(base, &decision)
    );

    type Breaker = fn(&mut Expected);
    let breakers: [(&str, Breaker); 11] = [
        ("score", |e| e.score += 0.0001),
        ("signal", |e| {
            *e.signals.get_mut("size").expect("size") += 0.0001
        }),
        ("verdict", |e| e.verdict = "ALLOW".to_string()),
        ("rule", |e| {
            e.rule = Some("budget_exhausted_or_not".to_string())
        }),
        ("band", |e| e.band = Some("score_block".to_string())),
        ("finding figure", |e| {
            if let Some(f) = e.findings.iter_mut().find(|f| f.tokens.is_some()) {
                f.tokens = f.tokens.map(|t| t + 1);
            } else {
                e.findings[0].tokens = Some(1);
            }
        }),
        ("finding code", |e| {
            e.findings.pop();
        }),
        ("worst case", |e| e.worst_case.input_tokens_estimated += 1),
        ("cost", |e| {
            e.worst_case.cost_nano = e.worst_case.cost_nano.map(|c| c + 1).or(Some(1))
        }),
        ("avoided", |e| {
            e.worst_case_tokens_avoided = Some(e.worst_case_tokens_avoided.unwrap_or(0) + 1)
        }),
        ("model served", |e| {
            e.model_served = Some("nope".to_string())
        }),
    ];
    for (what, brk) in breakers {
        let mut broken = base.clone();
        brk(&mut broken.expected);
        assert!(
            !compare(&broken, &decision).is_empty(),
            "a wrong {what} went unnoticed"
        );
    }
}
