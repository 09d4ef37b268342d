//! The context suite: counted (pinned tokenizer) tokens of the parts of each request that the
//! gate's findings flag as removable. [`count_request`] runs when the evidence is recorded
//! (`tokensaver economics run`), over the bodies the treatment's clients sent and the finding
//! codes of the gate's receipts on them; [`suite`] reads the counts back.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use serde_json::Value;

use super::model::*;
use tokensaver_tokenizer as tokenizer;

/// The gate's finding codes this suite knows how to locate in a request.
pub const OLD_TURNS: &str = "carrying_old_turns";
pub const UNUSED_TOOLS: &str = "unused_tool_definitions";
pub const DUPLICATE_TURNS: &str = "duplicate_turns_in_context";

/// Counted tokens of one request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestCount {
    /// System prompt, every turn and every tool definition.
    pub counted: u64,
    /// The union of the parts the given findings flag as removable.
    pub removable: u64,
    /// Removable tokens by finding code.
    pub by_finding: BTreeMap<String, u64>,
}

fn count(text: &str) -> Option<u64> {
    tokenizer::count(text)
}

/// The text of a message as the model reads it: string content, or every string inside an
/// array content (text parts, tool results), plus tool-call names and arguments.
fn message_text(msg: &Value) -> String {
    let mut out = String::new();
    if let Some(c) = msg.get("content") {
        collect_strings(c, &mut out);
    }
    if let Some(calls) = msg.get("tool_calls") {
        out.push_str(&calls.to_string());
    }
    out
}

fn collect_strings(v: &Value, out: &mut String) {
    match v {
        Value::String(s) => out.push_str(s),
        Value::Array(a) => a.iter().for_each(|x| collect_strings(x, out)),
        Value::Object(o) => {
            for (k, x) in o {
                if k == "type" || k == "id" || k == "tool_use_id" || k == "cache_control" {
                    continue;
                }
                if k == "input" {
                    out.push_str(&x.to_string());
                } else {
                    collect_strings(x, out);
                }
            }
        }
        _ => {}
    }
}

fn is_system(msg: &Value) -> bool {
    matches!(
        msg.get("role").and_then(Value::as_str),
        Some("system") | Some("developer")
    )
}

/// The text of a Responses input item as the model reads it: a message's content, a
/// function call's name and arguments, a tool output.
fn item_text(item: &Value) -> String {
    let mut out = String::new();
    match item.get("type").and_then(Value::as_str) {
        None | Some("message") => {
            if let Some(c) = item.get("content") {
                collect_strings(c, &mut out);
            }
        }
        Some("function_call" | "custom_tool_call") => {
            for k in ["name", "arguments", "input"] {
                if let Some(x) = item.get(k).and_then(Value::as_str) {
                    out.push_str(x);
                }
            }
        }
        Some("local_shell_call") => {
            if let Some(a) = item.get("action") {
                out.push_str(&a.to_string());
            }
        }
        Some(_) => {
            if let Some(o) = item.get("output") {
                collect_strings(o, &mut out);
            }
        }
    }
    out
}

fn tool_name(tool: &Value) -> Option<&str> {
    tool.get("function")
        .and_then(|f| f.get("name"))
        .or_else(|| tool.get("name"))
        .and_then(Value::as_str)
}

fn called_names(turn: &Value, into: &mut HashSet<String>) {
    if let Some(calls) = turn.get("tool_calls").and_then(Value::as_array) {
        for c in calls {
            if let Some(n) = c.pointer("/function/name").and_then(Value::as_str) {
                into.insert(n.to_string());
            }
        }
    }
    if turn.get("type").and_then(Value::as_str) == Some("function_call") {
        if let Some(n) = turn.get("name").and_then(Value::as_str) {
            into.insert(n.to_string());
        }
    }
    if let Some(parts) = turn.get("content").and_then(Value::as_array) {
        for p in parts {
            if p.get("type").and_then(Value::as_str) == Some("tool_use") {
                if let Some(n) = p.get("name").and_then(Value::as_str) {
                    into.insert(n.to_string());
                }
            }
        }
    }
}

/// Count one request body, with `findings` (the codes the gate raised on it) deciding which
/// parts are removable. `None` only if the tokenizer is unavailable.
pub fn count_request(
    body: &Value,
    findings: &[String],
    keep_recent_turns: usize,
    removable_codes: &[String],
) -> Option<RequestCount> {
    let empty = Vec::new();
    let messages = body
        .get("messages")
        .and_then(Value::as_array)
        .unwrap_or(&empty);
    let tools = body
        .get("tools")
        .and_then(Value::as_array)
        .unwrap_or(&empty);
    let mut counted = 0u64;
    for key in ["system", "instructions"] {
        if let Some(sys) = body.get(key) {
            let mut s = String::new();
            collect_strings(sys, &mut s);
            counted += count(&s)?;
        }
    }
    let mut turns: Vec<(&Value, u64)> = Vec::new();
    for m in messages {
        let n = count(&message_text(m))?;
        counted += n;
        if !is_system(m) {
            turns.push((m, n));
        }
    }
    match body.get("input") {
        Some(Value::String(s)) => counted += count(s)?,
        Some(Value::Array(items)) => {
            for item in items {
                let n = count(&item_text(item))?;
                counted += n;
                if !is_system(item) {
                    turns.push((item, n));
                }
            }
        }
        _ => {}
    }
    let mut tool_counts = Vec::new();
    for t in tools {
        let n = count(&t.to_string())?;
        counted += n;
        tool_counts.push(n);
    }
    let raised = |code: &str| {
        findings.iter().any(|f| f == code) && removable_codes.iter().any(|c| c == code)
    };
    let mut removable_turns: BTreeSet<usize> = BTreeSet::new();
    let mut by_finding = BTreeMap::new();
    if raised(OLD_TURNS) && turns.len() > keep_recent_turns {
        let old = turns.len() - keep_recent_turns;
        by_finding.insert(
            OLD_TURNS.to_string(),
            turns[..old].iter().map(|t| t.1).sum(),
        );
        removable_turns.extend(0..old);
    }
    if raised(DUPLICATE_TURNS) {
        let mut seen = HashSet::new();
        let mut dup = 0u64;
        for (i, (m, n)) in turns.iter().enumerate() {
            let key = ["role", "content", "name", "arguments", "output"]
                .map(|k| m.get(k).map(Value::to_string));
            if !seen.insert(key) {
                dup += n;
                removable_turns.insert(i);
            }
        }
        by_finding.insert(DUPLICATE_TURNS.to_string(), dup);
    }
    let mut removable: u64 = removable_turns.iter().map(|&i| turns[i].1).sum();
    if raised(UNUSED_TOOLS) && turns.len() > 1 {
        let mut called = HashSet::new();
        for (m, _) in &turns[..turns.len() - 1] {
            called_names(m, &mut called);
        }
        let unused: u64 = tools
            .iter()
            .zip(&tool_counts)
            .filter(|(t, _)| tool_name(t).is_some_and(|n| !called.contains(n)))
            .map(|(_, n)| *n)
            .sum();
        by_finding.insert(UNUSED_TOOLS.to_string(), unused);
        removable += unused;
    }
    Some(RequestCount {
        counted,
        removable,
        by_finding,
    })
}

/// The context suite's metrics and view, from the counts recorded with the treatment runs of
/// the live suite's evidence (`ev`).
pub(super) fn suite(
    decl: &SuiteDecl,
    ev: Option<&EvidenceFile>,
    query: &EconomicsQuery,
    boot: &super::measure::Boot,
) -> (Vec<EconomicsMetric>, Option<EconomicsContextView>) {
    let metric = |id, title, class, inputs, unit, formula| {
        super::measure::metric(id, title, class, inputs, unit, formula, &decl.id)
    };
    let mut cr = metric(
        "context_reduction",
        "Context reduction",
        // Nothing was removed: it is what removing the flagged parts would have saved.
        EconomicsClass::Counterfactual,
        Some(EconomicsClass::Counted),
        "ratio",
        "counted tokens of the parts the gate's findings flag as removable / counted context tokens, over every request the treatment's clients sent",
    );
    cr.not = Some("not a total-token reduction: nothing here was billed or avoided; it is what the context carried that the findings call removable, which the gate reports and does not remove".into());
    let mut ct = metric(
        "context_tokens",
        "Context tokens counted",
        EconomicsClass::Counted,
        None,
        "tokens",
        "cl100k_base tokens of system prompt, turns and tool definitions of every request",
    );
    let mut rt = metric(
        "removable_context_tokens",
        "Removable context tokens",
        EconomicsClass::Counted,
        None,
        "tokens",
        "cl100k_base tokens of the turns and tool definitions the findings flag (each part once)",
    );
    let Some(ev) = ev else {
        return (vec![cr, ct, rt], None);
    };
    let mut per_task: BTreeMap<&str, Vec<(u64, u64)>> = BTreeMap::new();
    let mut by_finding: BTreeMap<String, u64> = BTreeMap::new();
    let (mut requests, mut runs, mut uncounted) = (0usize, Vec::new(), 0usize);
    for run in ev.runs.iter().filter(|r| r.arm == "treatment") {
        if !(query.suite.as_deref().is_none_or(|s| s == decl.id)
            && query.category.as_deref().is_none_or(|s| s == run.category)
            && query.model.as_deref().is_none_or(|s| s == run.model)
            && query.task.as_deref().is_none_or(|s| s == run.task))
        {
            continue;
        }
        let (mut removable, mut counted) = (0u64, 0u64);
        for st in &run.steps {
            match &st.context {
                Some(c) => {
                    counted += c.counted;
                    removable += c.removable;
                    for (k, v) in &c.by_finding {
                        *by_finding.entry(k.clone()).or_insert(0) += v;
                    }
                    requests += 1;
                }
                None => uncounted += 1,
            }
        }
        per_task
            .entry(run.task.as_str())
            .or_default()
            .push((removable, counted));
        runs.push(run.id.clone());
    }
    let clusters: Vec<Vec<(u64, u64)>> = per_task.into_values().collect();
    let pooled: Vec<(u64, u64)> = clusters.iter().flatten().copied().collect();
    let counted: u64 = pooled.iter().map(|x| x.1).sum();
    let removable: u64 = pooled.iter().map(|x| x.0).sum();
    if uncounted > 0 {
        cr.warnings.push(format!(
            "{uncounted} requests carry no counts (a body the harness could not keep or count)"
        ));
    }
    if counted > 0 {
        let per: Vec<f64> = pooled
            .iter()
            .filter(|x| x.1 > 0)
            .map(|x| x.0 as f64 / x.1 as f64)
            .collect();
        cr.n = pooled.len();
        cr.value = super::measure::ratio(&pooled);
        cr.distribution = super::stats::distribution(&per);
        cr.interval = boot.interval(
            &clusters,
            super::measure::ratio,
            "cluster bootstrap over tasks (a task's treatment runs resampled together), percentile interval",
        );
        cr.status = EconomicsMetricStatus::Measured;
        cr.evidence = runs.clone();
        for (mm, v) in [(&mut ct, counted), (&mut rt, removable)] {
            mm.n = pooled.len();
            mm.value = Some(v as f64);
            mm.status = EconomicsMetricStatus::Measured;
            mm.evidence = runs.clone();
        }
    }
    let view = EconomicsContextView {
        suite: decl.id.clone(),
        measured_at: super::format_utc(ev.recorded_at_unix_ms),
        tokenizer: ev.tokenizer.clone(),
        sessions: pooled.len(),
        requests,
        counted_tokens: counted,
        removable_tokens: removable,
        removable_by_finding: by_finding,
    };
    (vec![cr, ct, rt], Some(view))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn codes(c: &[&str]) -> Vec<String> {
        c.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn nothing_flagged_nothing_removable() {
        let body = json!({"model": "m", "messages": [{"role": "user", "content": "hello world"}]});
        let all = codes(&[OLD_TURNS, UNUSED_TOOLS, DUPLICATE_TURNS]);
        let c = count_request(&body, &[], 12, &all).unwrap();
        assert_eq!(c.counted, 2);
        assert_eq!(c.removable, 0);
    }

    #[test]
    fn duplicates_and_unused_tools_are_counted_once() {
        let body = json!({"model": "m", "tools": [
            {"type": "function", "function": {"name": "grep", "parameters": {}}},
            {"type": "function", "function": {"name": "unused", "parameters": {}}}],
          "messages": [
            {"role": "user", "content": "fix it"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "1", "type": "function", "function": {"name": "grep", "arguments": "{}"}}]},
            {"role": "user", "content": "fix it"},
            {"role": "user", "content": "now"}]});
        let all = codes(&[OLD_TURNS, UNUSED_TOOLS, DUPLICATE_TURNS]);
        let c = count_request(&body, &codes(&[DUPLICATE_TURNS, UNUSED_TOOLS]), 12, &all).unwrap();
        let dup = c.by_finding[DUPLICATE_TURNS];
        let unused = c.by_finding[UNUSED_TOOLS];
        assert_eq!(dup, count("fix it").unwrap());
        assert!(unused > 0);
        assert_eq!(c.removable, dup + unused);
        // A code the methodology does not count removes nothing.
        let none = count_request(&body, &codes(&[DUPLICATE_TURNS]), 12, &[]).unwrap();
        assert_eq!(none.removable, 0);
    }
}
