#!/usr/bin/env python3
"""Regenerates corpus/economics/sessions/*.json: the recorded agent sessions the economics
live suite replays. Deterministic: run it again and the files are byte-identical.

Each session is the sequence of provider requests one coding agent sent for one task, with
the waste real agents show: the tool catalogue re-sent on every call, temperature-0 lookups
repeated, a retry loop, a context that keeps every old turn, a file pasted twice."""
import json, os

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "sessions")

def rust_file(name, n):
    lines = [f"//! {name}: part of the invoicing service.", "use crate::money::{Amount, Currency};", ""]
    for i in range(n):
        lines += [
            f"/// Step {i} of the {name} pipeline.",
            f"pub fn {name}_step_{i}(amount: Amount, rate_bp: u32) -> Amount {{",
            f"    let scaled = amount.minor_units() * i64::from(rate_bp) / 10_000;",
            f"    Amount::from_minor(scaled + {i}, Currency::Eur)",
            "}", "",
        ]
    return "\n".join(lines)

TOOLS = [
    ("read_file", "Read a file of the repository.", {"path": "string"}),
    ("write_file", "Replace a file's contents.", {"path": "string", "contents": "string"}),
    ("grep", "Search the repository for a regular expression.", {"pattern": "string", "glob": "string"}),
    ("run_tests", "Run the test suite, or one test.", {"filter": "string"}),
    ("list_dir", "List a directory.", {"path": "string"}),
    ("git_diff", "Show the working tree diff.", {}),
    ("git_log", "Show recent commits touching a path.", {"path": "string", "limit": "integer"}),
    ("open_issue", "Read an issue of the tracker.", {"number": "integer"}),
    ("web_search", "Search the web.", {"query": "string"}),
    ("fetch_url", "Fetch a web page as text.", {"url": "string"}),
]

def openai_tools():
    return [{"type": "function", "function": {"name": n, "description": d, "parameters": {
        "type": "object", "properties": {k: {"type": t} for k, t in p.items()},
        "required": list(p.keys())}}} for n, d, p in TOOLS]

def anthropic_tools():
    return [{"name": n, "description": d, "input_schema": {
        "type": "object", "properties": {k: {"type": t} for k, t in p.items()},
        "required": list(p.keys())}} for n, d, p in TOOLS]

SYSTEM = ("You are a careful senior engineer working in a Rust repository. Use the tools to read "
          "code before changing it, keep changes minimal, run the tests after every change and "
          "explain what you changed and why. Never invent file contents.")

LONG_SYSTEM = SYSTEM + "\n\n# House style\n" + "\n".join(
    f"{i}. Rule {i}: prefer explicit types at public boundaries, keep functions under forty lines, "
    f"document every public item, and never use unwrap outside tests (house rule {i})."
    for i in range(1, 31))

def call_id(i):
    return f"call_{i:04d}"

def oa_session(task, category, title, user, plan, lookups=(), retries=0, dup_paste=None,
               poll=None, max_tokens=1024, model="gpt-4o"):
    """An OpenAI agent loop. `plan` is a list of (tool, args, result) steps."""
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]
    steps = []
    def main(note, needed=True, temperature=0.2):
        steps.append({"needed": needed, "note": note, "body": {
            "model": model, "max_tokens": max_tokens, "temperature": temperature,
            "tools": openai_tools(), "messages": json.loads(json.dumps(msgs))}})
    for i, (tool, args, result) in enumerate(plan):
        main(f"agent turn {i + 1}: decide the next tool call")
        for (at, q) in lookups:
            if at == i:
                steps.append({"needed": True, "note": "side lookup at temperature 0", "body": {
                    "model": model, "max_tokens": 256, "temperature": 0,
                    "messages": [{"role": "user", "content": q}]}})
        msgs.append({"role": "assistant", "content": None, "tool_calls": [{
            "id": call_id(i), "type": "function",
            "function": {"name": tool, "arguments": json.dumps(args, sort_keys=True)}}]})
        msgs.append({"role": "tool", "tool_call_id": call_id(i), "content": result})
        if dup_paste is not None and i == dup_paste:
            msgs.append({"role": "user", "content": "For reference, here is the file again:\n" + plan[0][2]})
            msgs.append({"role": "assistant", "content": "Noted, I have the file."})
            msgs.append({"role": "user", "content": "For reference, here is the file again:\n" + plan[0][2]})
    main("final answer")
    for r in range(retries):
        # The agent's output parser rejected the answer; it re-sends the same request.
        steps.append({"needed": False, "note": f"retry {r + 1}: output parser rejected the answer",
                      "body": dict(steps[-1]["body"], temperature=0.7)})
    if poll:
        q, times = poll
        for r in range(times):
            steps.append({"needed": True, "note": f"status poll {r + 1} at temperature 0", "body": {
                "model": model, "max_tokens": 128, "temperature": 0,
                "messages": [{"role": "system", "content": "Answer with one word."},
                             {"role": "user", "content": q}]}})
    return {"task": task, "category": category, "title": title, "provider": "openai",
            "model": model, "steps": steps}

def an_session(task, category, title, user, plan, lookups=(), retries=0, system=SYSTEM,
               model="claude-sonnet-4-5"):
    msgs = [{"role": "user", "content": user}]
    steps = []
    def main(note, needed=True, temperature=0.2):
        steps.append({"needed": needed, "note": note, "body": {
            "model": model, "max_tokens": 1024, "temperature": temperature, "system": system,
            "tools": anthropic_tools(), "messages": json.loads(json.dumps(msgs))}})
    for i, (tool, args, result) in enumerate(plan):
        main(f"agent turn {i + 1}: decide the next tool call")
        for (at, q) in lookups:
            if at == i:
                steps.append({"needed": True, "note": "side lookup at temperature 0", "body": {
                    "model": model, "max_tokens": 256, "temperature": 0,
                    "messages": [{"role": "user", "content": q}]}})
        msgs.append({"role": "assistant", "content": [
            {"type": "text", "text": f"I will call {tool}."},
            {"type": "tool_use", "id": f"toolu_{i:04d}", "name": tool, "input": args}]})
        msgs.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": f"toolu_{i:04d}", "content": result}]})
    main("final answer")
    for r in range(retries):
        steps.append({"needed": False, "note": f"retry {r + 1}: output parser rejected the answer",
                      "body": dict(steps[-1]["body"], temperature=1.0)})
    return {"task": task, "category": category, "title": title, "provider": "anthropic",
            "model": model, "steps": steps}

def test_output(name, ok):
    return f"running 14 tests\n" + "".join(f"test {name}::case_{i} ... ok\n" for i in range(13)) + \
        (f"test {name}::case_13 ... ok\n\ntest result: ok. 14 passed" if ok else
         f"test {name}::case_13 ... FAILED\n\nassertion failed: left == right (1.05 vs 1.04)\ntest result: FAILED. 13 passed; 1 failed")

sessions = [
    oa_session("bugfix-vat-rounding", "bugfix", "VAT is rounded per line instead of per invoice",
        "Invoices with many lines are off by a cent. Issue #412. Find and fix the rounding bug.",
        [("open_issue", {"number": 412}, "Issue #412: totals differ from the accounting export by 0.01 EUR on invoices with more than 20 lines."),
         ("grep", {"pattern": "round", "glob": "src/**/*.rs"}, "src/vat.rs:41: .round_half_even()\nsrc/lines.rs:88: line.vat().round_half_even()"),
         ("read_file", {"path": "src/vat.rs"}, rust_file("vat", 18)),
         ("run_tests", {"filter": "vat"}, test_output("vat", False)),
         ("write_file", {"path": "src/vat.rs", "contents": rust_file("vat", 18) + "\n// rounded once per invoice\n"}, "ok"),
         ("run_tests", {"filter": "vat"}, test_output("vat", True))],
        lookups=[(2, "Under EU VAT rules, may VAT be rounded per invoice line or must it be rounded on the invoice total? Answer briefly."),
                 (4, "Under EU VAT rules, may VAT be rounded per invoice line or must it be rounded on the invoice total? Answer briefly.")]),
    an_session("bugfix-null-deref", "bugfix", "Crash when a customer has no billing address",
        "The worker panics on customers without a billing address (issue #433). Fix it.",
        [("open_issue", {"number": 433}, "Issue #433: thread 'worker' panicked at src/customer.rs:57: called Option::unwrap() on a None value"),
         ("read_file", {"path": "src/customer.rs"}, rust_file("customer", 14)),
         ("write_file", {"path": "src/customer.rs", "contents": "// billing address optional\n" + rust_file("customer", 14)}, "ok"),
         ("run_tests", {"filter": "customer"}, test_output("customer", True))],
        retries=5),
    oa_session("refactor-rename-module", "refactor", "Rename the `lines` module to `invoice_lines`",
        "Rename the module `lines` to `invoice_lines` everywhere, keeping the public API working.",
        [("list_dir", {"path": "src"}, "src/lib.rs\nsrc/lines.rs\nsrc/vat.rs\nsrc/customer.rs\nsrc/money.rs"),
         ("read_file", {"path": "src/lines.rs"}, rust_file("lines", 16)),
         ("grep", {"pattern": "lines::", "glob": "**/*.rs"}, "\n".join(f"src/file_{i}.rs:{i * 7}: use crate::lines::Line;" for i in range(30))),
         ("write_file", {"path": "src/invoice_lines.rs", "contents": rust_file("invoice_lines", 16)}, "ok"),
         ("write_file", {"path": "src/lib.rs", "contents": "pub mod invoice_lines;\npub use invoice_lines as lines;\n"}, "ok"),
         ("run_tests", {"filter": ""}, test_output("all", False)),
         ("read_file", {"path": "src/lib.rs"}, "pub mod invoice_lines;\npub use invoice_lines as lines;\npub mod vat;\npub mod customer;\npub mod money;"),
         ("write_file", {"path": "src/vat.rs", "contents": rust_file("vat", 18)}, "ok"),
         ("run_tests", {"filter": ""}, test_output("all", True))],
        dup_paste=4),
    an_session("refactor-extract-trait", "refactor", "Extract a `TaxRule` trait from the VAT code",
        "Extract a TaxRule trait so that a second tax (eco-contribution) can be added. Follow the house style.",
        [("read_file", {"path": "src/vat.rs"}, rust_file("vat", 18)),
         ("grep", {"pattern": "fn vat_", "glob": "src/**/*.rs"}, "\n".join(f"src/vat.rs:{i * 6 + 4}: pub fn vat_step_{i}" for i in range(18))),
         ("write_file", {"path": "src/tax.rs", "contents": "pub trait TaxRule { fn apply(&self, a: Amount) -> Amount; }"}, "ok"),
         ("run_tests", {"filter": "tax"}, test_output("tax", True)),
         ("git_diff", {}, "diff --git a/src/tax.rs b/src/tax.rs\n+pub trait TaxRule { fn apply(&self, a: Amount) -> Amount; }")],
        lookups=[(1, "In Rust, should a trait with one method taking &self be object safe by default? One sentence."),
                 (3, "In Rust, should a trait with one method taking &self be object safe by default? One sentence.")],
        system=LONG_SYSTEM),
    oa_session("research-rate-limits", "research", "Which rate limits apply to the export API?",
        "Find out which rate limits our export API enforces and summarise them for the README.",
        [("grep", {"pattern": "rate_limit", "glob": "**/*.rs"}, "src/export.rs:12: const RATE_LIMIT_PER_MIN: u32 = 600;\nsrc/export.rs:13: const BURST: u32 = 50;"),
         ("read_file", {"path": "src/export.rs"}, rust_file("export", 12)),
         ("web_search", {"query": "token bucket burst semantics"}, "A token bucket allows bursts up to its capacity and refills at a fixed rate. " * 12)],
        lookups=[(0, "Explain a token bucket rate limiter in two sentences."),
                 (1, "Explain a token bucket rate limiter in two sentences."),
                 (2, "Explain a token bucket rate limiter in two sentences.")]),
    an_session("research-cache-semantics", "research", "How does the HTTP cache treat `no-cache`?",
        "Our CDN serves stale invoices. Research what `Cache-Control: no-cache` means versus `no-store` and which one the invoice route should send.",
        [("fetch_url", {"url": "https://www.rfc-editor.org/rfc/rfc9111#section-5.2.2.4"}, "no-cache: the response must not be used to satisfy a subsequent request without successful validation on the origin server. " * 10),
         ("fetch_url", {"url": "https://www.rfc-editor.org/rfc/rfc9111#section-5.2.2.5"}, "no-store: a cache must not store any part of either the immediate request or the response. " * 10),
         ("grep", {"pattern": "Cache-Control", "glob": "src/**/*.rs"}, "src/routes/invoice.rs:33: headers.insert(CACHE_CONTROL, \"public, max-age=600\")"),
         ("read_file", {"path": "src/routes/invoice.rs"}, rust_file("invoice_route", 10))],
        lookups=[(1, "Does `Cache-Control: private` stop a CDN from caching a response? One sentence."),
                 (3, "Does `Cache-Control: private` stop a CDN from caching a response? One sentence.")]),
    oa_session("research-status-poll", "research", "Wait for the nightly export to finish",
        "Check whether tonight's export job finished and report its row count.",
        [("grep", {"pattern": "export_job", "glob": "**/*.toml"}, "jobs.toml:4: [export_job] schedule = \"0 2 * * *\""),
         ("read_file", {"path": "jobs.toml"}, "[export_job]\nschedule = \"0 2 * * *\"\nrows_expected = 120000\n")],
        poll=("Is the export job 2026-11-29 finished? Answer yes or no.", 5)),
]

os.makedirs(OUT, exist_ok=True)
for s in sessions:
    with open(os.path.join(OUT, s["task"] + ".json"), "w") as f:
        json.dump(s, f, indent=1, sort_keys=True)
        f.write("\n")
    print(s["task"], len(s["steps"]), "steps")
