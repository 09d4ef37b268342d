//! Replaying recorded evidence through this build's gate (issue "evidence": fresh without a
//! re-record). Every treatment call of an evidence file keeps its digest (fingerprints and
//! counts, no content) and when it reached the gate; this feeds them, run by run and in the
//! order they arrived, to a fresh gate with the config in force, on the recording's own clock
//! (a paced step is held by moving the clock, not by waiting), settles each forwarded call with
//! the usage the recording saw bought, and compares what the gate decides — the verdict, and the
//! reason and findings its receipt states — with what was recorded. Identical: the evidence
//! still describes this build's gate. Different: the first differing call is named.
//!
//! What the replay does not repeat is outside the gate's decision: the clients (they answered
//! what the recorded gate answered) and the provider (its usage is the recorded one).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use serde_json::Value;

use super::model::{EvidenceFile, RunRecord, StepRecord, TreatmentKeyDecl};
use crate::config::{Config, KeyConfig};
use crate::gatekeeper::{GateRequest, Gatekeeper, RecordSource, UsageReport};
use crate::receipt::ReceiptSigner;
use crate::request::Digest;
use crate::store::sqlite::SqliteStore;
use crate::store::Ending;
use tokensaver_core::gate::cache::CacheEdits;
use tokensaver_core::gate::{Mechanism, Mechanisms, Verdict};

/// The routes whose calls the gate decides on a digest (what the recording kept one for).
const MODEL_ROUTES: [&str; 3] = ["/v1/messages", "/v1/chat/completions", "/v1/responses"];

/// Replays already made in this process, by evidence file and gate policy: the summary is
/// read on every `GET /economics`, and an evidence file never changes.
type Memo = HashMap<(String, u64, String), Result<usize, String>>;
static REPLAYED: Mutex<Option<Memo>> = Mutex::new(None);

/// Whether this build's gate, with `config`, decides every recorded treatment call of `ev`
/// as it was decided: `Ok(calls replayed)`, or `Err` naming the first call decided otherwise
/// (or why the evidence cannot be replayed).
pub fn decides_alike(
    config: &Config,
    ev: &EvidenceFile,
    key: &TreatmentKeyDecl,
    policy_blake3: &str,
) -> Result<usize, String> {
    let memo_key = (
        ev.suite.clone(),
        ev.recorded_at_unix_ms,
        policy_blake3.to_string(),
    );
    if let Some(done) = REPLAYED
        .lock()
        .ok()
        .and_then(|m| m.as_ref()?.get(&memo_key).cloned())
    {
        return done;
    }
    let outcome = replay(config, ev, key);
    if let Ok(mut m) = REPLAYED.lock() {
        m.get_or_insert_with(HashMap::new)
            .insert(memo_key, outcome.clone());
    }
    outcome
}

fn replay(config: &Config, ev: &EvidenceFile, decl: &TreatmentKeyDecl) -> Result<usize, String> {
    let mut calls = 0;
    for (run, step, now) in replayed(config, ev, decl, Mechanisms::default())? {
        let then = (
            step.verdict.clone().unwrap_or_default(),
            step.reason.clone().unwrap_or_default(),
            Value::from(step.findings.clone()),
        );
        let now_decided = (
            now.verdict.clone(),
            now.reason.clone(),
            now.findings.clone(),
        );
        if now_decided != then {
            return Err(format!(
                "call {} of {} (recorded {} ({}, findings {}), this build decides {} ({}, findings {}))",
                step.index + 1,
                run.id,
                then.0,
                then.1,
                then.2,
                now.verdict,
                now.reason,
                now.findings
            ));
        }
        calls += 1;
    }
    Ok(calls)
}

/// Where each of `mechanisms` acted in recorded evidence: the treatment calls that this
/// build's gate decides or edits otherwise when the key goes without it (each replay on the
/// recording's clock, against one replay of the full gate), counted by pair, in the order
/// asked. A pair absent from an answer is one on which the mechanism did nothing: without it,
/// the gate forwards every call of that run as it did, so an ablation arm of that pair would
/// be the same run again.
pub fn acted_on(
    config: &Config,
    ev: &EvidenceFile,
    decl: &TreatmentKeyDecl,
    mechanisms: &[Mechanism],
) -> Result<Vec<BTreeMap<String, usize>>, String> {
    let full = replayed(config, ev, decl, Mechanisms::default())?;
    let mut out = Vec::with_capacity(mechanisms.len());
    for &mechanism in mechanisms {
        let without = replayed(config, ev, decl, [mechanism].into_iter().collect())?;
        let mut acted = BTreeMap::new();
        for ((run, _, a), (_, _, b)) in full.iter().zip(&without) {
            if a != b {
                *acted.entry(run.pair.clone()).or_insert(0) += 1;
            }
        }
        out.push(acted);
    }
    Ok(out)
}

/// What the gate decided on one replayed call: the receipt's decision fields and the edits
/// it makes to the forwarded body.
#[derive(Debug, Clone, PartialEq)]
struct Decided {
    verdict: String,
    reason: String,
    findings: Value,
    model_served: Option<String>,
    paced: bool,
    cache: CacheEdits,
    breakpoints: Vec<u16>,
}

/// Every recorded treatment call of `ev` decided again, in the order the recording saw them,
/// by a fresh gate whose keys go `without` those mechanisms.
fn replayed<'e>(
    config: &Config,
    ev: &'e EvidenceFile,
    decl: &TreatmentKeyDecl,
    without: Mechanisms,
) -> Result<Vec<(&'e RunRecord, &'e StepRecord, Decided)>, String> {
    // The replay's own gate and store are scratch: their start-up logs would only be noise
    // in a summary.
    let quiet = tracing::subscriber::NoSubscriber::default();
    tracing::subscriber::with_default(quiet, || replayed_quietly(config, ev, decl, without))
}

fn replayed_quietly<'e>(
    config: &Config,
    ev: &'e EvidenceFile,
    decl: &TreatmentKeyDecl,
    without: Mechanisms,
) -> Result<Vec<(&'e RunRecord, &'e StepRecord, Decided)>, String> {
    let mut runs: Vec<&RunRecord> = ev.runs.iter().filter(|r| r.arm == "treatment").collect();
    runs.sort_by_key(|r| (r.started_at_unix_ms, r.id.clone()));
    let decided = |s: &&StepRecord| s.verdict.is_some() && MODEL_ROUTES.contains(&s.path.as_str());
    if runs
        .iter()
        .flat_map(|r| r.steps.iter().filter(decided))
        .any(|s| s.digest.is_none() || s.at_ms.is_none())
    {
        return Err("it was recorded without the calls' digests, which a replay needs".into());
    }
    let mut config = config.clone();
    config.keys = (0..runs.len())
        .map(|n| replay_key(n, decl, without, &config))
        .collect::<Result<_, _>>()?;
    let dir = super::scratch_dir("replay")?;
    let result = (|| {
        let store = SqliteStore::open(&dir, config.commit_interval_ms)
            .map_err(|e| format!("the replay's store: {e}"))?;
        let t0 = runs.first().map_or(0, |r| r.started_at_unix_ms);
        let gk = Gatekeeper::new(
            config.clone(),
            ReceiptSigner::from_seed([0; 32]),
            Arc::new(store),
            t0,
        )
        .map_err(|e| format!("the replay's gate: {e}"))?;
        let mut out = Vec::new();
        for (run, key) in runs.iter().zip(&config.keys) {
            let mut steps: Vec<&StepRecord> = run.steps.iter().filter(decided).collect();
            steps.sort_by_key(|s| (s.at_ms, s.index));
            for s in steps {
                out.push((*run, s, replay_call(&gk, key, run, s)?));
            }
        }
        let _ = gk.close_store();
        Ok(out)
    })();
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// One recorded call decided again and, when forwarded, settled with what was bought.
fn replay_call(
    gk: &Gatekeeper,
    key: &KeyConfig,
    run: &RunRecord,
    s: &StepRecord,
) -> Result<Decided, String> {
    let digest: Digest = s
        .digest
        .as_ref()
        .and_then(|d| serde_json::to_vec(d).ok())
        .and_then(|bytes| Digest::parse(&bytes).ok())
        .ok_or_else(|| {
            format!(
                "call {} of {} (its digest is not one this build reads)",
                s.index + 1,
                run.id
            )
        })?;
    let arrival = run.started_at_unix_ms + s.at_ms.unwrap_or(0);
    let outcome = gk.local().decide_recorded(
        &gk.core,
        &GateRequest {
            key,
            shape: &digest.request,
            human: digest.human,
            held: false,
            hold_id: None,
            now_ms: arrival,
            recorded_by: RecordSource::Proxy,
        },
    );
    let d = &outcome.decision;
    let receipt: Value = outcome
        .envelope
        .body_bytes()
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default();
    // As the recording's tap read the receipt: no findings reads as none.
    let findings = match &receipt["findings"] {
        Value::Null => Value::Array(vec![]),
        f => f.clone(),
    };
    let forwarded = matches!(d.verdict, Verdict::Allow | Verdict::Downgrade);
    if let (true, Some(u)) = (forwarded, &s.usage) {
        let served = d
            .model_served
            .clone()
            .unwrap_or_else(|| d.model_requested.clone());
        let report = UsageReport {
            key_id: key.id.to_string(),
            decision_id: outcome.decision_id,
            usage: Some(super::billed(u)),
            served_model: served,
            wire: digest.request.wire_form(),
            ending: Ending::Complete,
        };
        let ended = arrival + s.round_trip_ms.unwrap_or(0);
        gk.local()
            .settle_recorded(&gk.core, &report, ended.max(arrival));
    }
    Ok(Decided {
        verdict: d.verdict.as_str().to_string(),
        reason: receipt["reason"].as_str().unwrap_or_default().to_string(),
        findings,
        model_served: d.model_served.clone(),
        paced: d.paced_ms.is_some(),
        cache: d.cache_edits(),
        breakpoints: d.cache_breakpoints.clone(),
    })
}

/// The treatment key of the `n`th replayed run, as `economics run` made the recording's:
/// the methodology's profile, attended or not, budget, and every other setting its default.
fn replay_key(
    n: usize,
    decl: &TreatmentKeyDecl,
    without: Mechanisms,
    config: &Config,
) -> Result<KeyConfig, String> {
    let mut text = format!(
        "[[keys]]\nid = \"replay-{n}\"\nsecret_hash = \"{}\"\nhuman = {}\n",
        "0".repeat(64),
        decl.human
    );
    if let Some(b) = decl.budget_micro_usd_per_day {
        text.push_str(&format!(
            "budget = {{ ceiling_micro_usd = {b}, period = \"day\" }}\n"
        ));
    }
    let mut key = Config::parse(&text)
        .map_err(|e| format!("the replay's key: {e}"))?
        .keys
        .remove(0);
    key.without = without;
    key.profile = match &decl.profile {
        None => None,
        Some(p) => Some((
            p.clone(),
            *config
                .profiles
                .get(p)
                .ok_or_else(|| format!("the config in force has no profile {p}"))?,
        )),
    };
    Ok(key)
}
