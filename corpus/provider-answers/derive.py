#!/usr/bin/env python3
"""Expected usage and spend of every corpus answer, derived from the providers' documented
accounting rules, independently of tokensaver (nothing here reads or runs its code).

    python3 derive.py           # write each case's `expected` block
    python3 derive.py --check   # exit 1 if a case file differs from the derivation

The rules, each from the provider's own documentation or official SDK:

OpenAI chat completions (platform docs, "Chat Completions" usage object; "Prompt caching";
"Reasoning models"): `prompt_tokens` counts every input token, the `cached_tokens` of
`prompt_tokens_details` among them (billed at the cached rate); `completion_tokens` counts
every output token, the `reasoning_tokens` of `completion_tokens_details` among them. So
uncached input = prompt - cached - cache writes (`cache_write_tokens`, OpenRouter and
OpenAI-compatible gateways, also inside prompt_tokens), output = completion_tokens; reasoning
is not added again. Streaming: with `stream_options.include_usage` one extra chunk before
`data: [DONE]` carries the whole request's usage with an empty `choices`; OpenAI-compatible
providers (Groq, OpenRouter) put the same object on the final chunk that still has choices.
The stream ends at `data: [DONE]`; an SSE `error` event (or a data object with `error`) means
the answer failed.

Anthropic messages (docs "Messages API" usage; "Streaming messages": "the token counts in the
usage field of the message_delta event are cumulative"; "Prompt caching": 1-hour writes in
`cache_creation.ephemeral_1h_input_tokens` at 2x the input price; "Web search tool": $10 per
1,000 searches, `server_tool_use.web_search_requests`; "Compaction": the top-level usage leaves
the compaction step out, the bill is the sum over `usage.iterations`). The official SDKs
accumulate a stream as: `message_start.message.usage`, then for each `message_delta` its
`output_tokens`, and each of `input_tokens`, `cache_creation_input_tokens`,
`cache_read_input_tokens`, `server_tool_use`, `iterations` that the event carries. The stream
ends at `message_stop`.

OpenAI Responses (docs "Responses" usage object; streaming events): the usage arrives on the
terminal event (`response.completed`); `input_tokens` includes `cached_tokens`,
`output_tokens` includes `reasoning_tokens`. OpenAI web search tool calls are billed per call
but are not reported in `usage` (they are output items): not counted here either.

An answer without the provider's final usage is charged, per tokensaver's README ("never
understated"), its worst case: ceil(prompt characters / 3) input tokens at the input price
plus max_tokens at the output price (SPEC 2.3), or the reported figures with output at
max_tokens if that is more.

Spend: every part at its price (micro-USD per million tokens), ceil(tokens x price / 1000)
nano-USD per part; web searches at price-per-1,000 nano-USD each.
"""
import json
import math
import sys
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent
PRICES = tomllib.loads((HERE / "prices.toml").read_text())


def events(text):
    """SSE events as (event name, data text), split on blank lines."""
    out = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        name, data = None, []
        for line in block.split("\n"):
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                v = line[5:]
                data.append(v[1:] if v.startswith(" ") else v)
        if name is not None or data:
            out.append((name, "\n".join(data)))
    return out


def zero():
    return {"input": 0, "cache_write": 0, "cache_write_1h": 0, "cache_read": 0, "output": 0,
            "web_search_requests": 0}


# --- OpenAI chat -----------------------------------------------------------------------------

def chat_parts(u, notes):
    prompt = u.get("prompt_tokens") or 0
    details = u.get("prompt_tokens_details") or {}
    cached = details.get("cached_tokens") or 0
    write = details.get("cache_write_tokens") or 0
    completion = u.get("completion_tokens") or 0
    reasoning = (u.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0
    p = zero()
    p.update(input=prompt - cached - write, cache_write=write, cache_read=cached, output=completion)
    notes.append(f"prompt_tokens {prompt} = uncached {p['input']} + cached {cached} + cache writes {write}")
    notes.append(f"completion_tokens {completion} is the output; its {reasoning} reasoning tokens are inside it"
                 f" (total_tokens {u.get('total_tokens')} = {prompt} + {completion})")
    return p


def chat(case, body, notes):
    if not case["content_type"].startswith("text/event-stream"):
        return "complete", chat_parts(json.loads(body)["usage"], notes)
    last, done, error = None, False, False
    for name, data in events(body):
        if name == "error":
            error = True
        if not data:
            continue
        if data == "[DONE]":
            done = True
            continue
        obj = json.loads(data)
        if "error" in obj and "choices" not in obj:
            error = True
        u = obj.get("usage") or (obj.get("x_groq") or {}).get("usage")
        if u:
            last = (u, obj.get("choices"))
    if error:
        notes.append("an error event arrived before [DONE]; no usage was reported")
        return "error_event", None
    if last is None or not done:
        return ("no_usage" if done else "truncated"), None
    u, choices = last
    where = "a usage-only chunk (choices: [])" if choices == [] else "the final chunk, which still has choices"
    notes.append(f"usage from {where}, the last usage in the stream, before data: [DONE]")
    return "complete", chat_parts(u, notes)


# --- Anthropic messages ----------------------------------------------------------------------

def anthropic_parts(u, notes):
    p = zero()
    its = u.get("iterations") or []
    rows = its if its else [u]
    for it in rows:
        p["input"] += it.get("input_tokens") or 0
        p["cache_write"] += it.get("cache_creation_input_tokens") or 0
        p["cache_read"] += it.get("cache_read_input_tokens") or 0
        p["output"] += it.get("output_tokens") or 0
        p["cache_write_1h"] += (it.get("cache_creation") or {}).get("ephemeral_1h_input_tokens") or 0
    if its:
        notes.append("usage.iterations present: the bill is the sum over "
                     + " + ".join(f"{it.get('type')} (in {it.get('input_tokens')}, write {it.get('cache_creation_input_tokens')},"
                                  f" read {it.get('cache_read_input_tokens')}, out {it.get('output_tokens')})" for it in its)
                     + f"; the top level (in {u.get('input_tokens')}, out {u.get('output_tokens')}) leaves the compaction step out")
    p["web_search_requests"] = (u.get("server_tool_use") or {}).get("web_search_requests") or 0
    notes.append(f"input {p['input']}, cache writes {p['cache_write']} (of which 1-hour {p['cache_write_1h']}),"
                 f" cache reads {p['cache_read']}, output {p['output']} (thinking included), web searches {p['web_search_requests']}")
    return p


def anthropic(case, body, notes):
    if not case["content_type"].startswith("text/event-stream"):
        return "complete", anthropic_parts(json.loads(body)["usage"], notes)
    snap, stopped, error = None, False, False
    for name, data in events(body):
        if name == "error":
            error = True
        if not data:
            continue
        obj = json.loads(data)
        kind = obj.get("type")
        if kind == "message_start":
            snap = dict(obj["message"]["usage"])
            notes.append(f"message_start usage: {json.dumps(snap, separators=(',', ':'))}")
        elif kind == "message_delta" and obj.get("usage"):
            d = obj["usage"]
            snap = snap or {}
            snap["output_tokens"] = d["output_tokens"]
            for k in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens",
                      "server_tool_use", "iterations"):
                if d.get(k) is not None:
                    snap[k] = d[k]
            notes.append(f"message_delta usage (cumulative, replaces what it carries): {json.dumps(d, separators=(',', ':'))}")
        elif kind == "message_stop":
            stopped = True
        elif kind == "error":
            error = True
    if error:
        return "error_event", None
    if not stopped:
        return "truncated", None
    return "complete", anthropic_parts(snap, notes)


# --- OpenAI Responses ------------------------------------------------------------------------

def responses_parts(u, notes):
    inp = u.get("input_tokens") or 0
    d = u.get("input_tokens_details") or {}
    cached = d.get("cached_tokens") or 0
    write = d.get("cache_write_tokens") or 0
    out = u.get("output_tokens") or 0
    reasoning = (u.get("output_tokens_details") or {}).get("reasoning_tokens") or 0
    p = zero()
    p.update(input=inp - cached - write, cache_write=write, cache_read=cached, output=out)
    notes.append(f"input_tokens {inp} = uncached {p['input']} + cached {cached}; output_tokens {out}"
                 f" includes {reasoning} reasoning tokens")
    return p


def responses(case, body, notes):
    if not case["content_type"].startswith("text/event-stream"):
        obj = json.loads(body)
        web = sum(1 for o in obj.get("output", []) if o.get("type") == "web_search_call")
        if web:
            notes.append(f"{web} web_search_call item(s): billed per call by OpenAI, not in usage, not priced")
        return "complete", responses_parts(obj["usage"], notes)
    for name, data in events(body):
        if not data:
            continue
        obj = json.loads(data)
        if obj.get("type") == "response.completed":
            resp = obj["response"]
            web = sum(1 for o in resp.get("output", []) if o.get("type") == "web_search_call")
            notes.append("usage from the terminal response.completed event")
            if web:
                notes.append(f"{web} web_search_call item(s): billed per call by OpenAI, not in usage, not priced")
            return "complete", responses_parts(resp["usage"], notes)
        if obj.get("type") in ("error", "response.failed") or name == "error":
            return "error_event", None
    return "truncated", None


# --- Spend -----------------------------------------------------------------------------------

def part_cost(tokens, price):
    return math.ceil(tokens * price / 1000)


def spend(p, notes):
    five = p["cache_write"] - p["cache_write_1h"]
    items = [
        ("input", p["input"], PRICES["input"]),
        ("5-minute cache writes", five, PRICES["cache_write"]),
        ("1-hour cache writes", p["cache_write_1h"], PRICES["cache_write_1h"]),
        ("cache reads", p["cache_read"], PRICES["cache_read"]),
        ("output", p["output"], PRICES["output"]),
    ]
    total = 0
    terms = []
    for name, n, price in items:
        c = part_cost(n, price)
        total += c
        if n:
            terms.append(f"{name} {n} x {price} / 1000 = {c}")
    web = p["web_search_requests"] * PRICES["web_search_per_1k"]
    if web:
        terms.append(f"web searches {p['web_search_requests']} x {PRICES['web_search_per_1k']} = {web}")
    total += web
    notes.append("spend (nano-USD): " + "; ".join(terms) + f"; total {total}")
    return total


def prompt_chars(request):
    if "messages" in request:
        return sum(len(m["content"]) for m in request["messages"])
    return len(request["input"])


def worst_case(request, notes):
    chars = prompt_chars(request)
    inp = math.ceil(chars / 3)
    out = request.get("max_tokens", request.get("max_output_tokens"))
    total = part_cost(inp, PRICES["input"]) + part_cost(out, PRICES["output"])
    notes.append(f"worst case (SPEC 2.3): ceil({chars} characters / 3) = {inp} input tokens x {PRICES['input']} / 1000"
                 f" + max_tokens {out} x {PRICES['output']} / 1000 = {total} nano-USD; nothing was reported, so nothing"
                 " larger bounds it")
    return total


READERS = {"openai_chat": chat, "anthropic_messages": anthropic, "openai_responses": responses}


def derive(case):
    body = (HERE / case["answer"]).read_bytes().decode("utf-8")
    notes = []
    ending, parts = READERS[case["route"]](case, body, notes)
    if ending == "complete":
        return {"ending": "complete", "status": "complete", "basis": "reported",
                "usage": parts, "spend_nano": spend(parts, notes), "derivation": notes}
    notes.append(f"the answer ended without the provider's final usage ({ending}): charged its worst case")
    return {"ending": ending, "status": "incomplete", "basis": "worst_case", "usage": zero(),
            "spend_nano": worst_case(case["request"], notes), "derivation": notes}


def main():
    check = "--check" in sys.argv[1:]
    bad = 0
    for path in sorted((HERE / "cases").glob("*.json")):
        case = json.loads(path.read_text())
        expected = derive(case)
        if check:
            if case.get("expected") != expected:
                print(f"{path.name}: differs from the derivation", file=sys.stderr)
                bad += 1
            continue
        case["expected"] = expected
        path.write_text(json.dumps(case, indent=2, ensure_ascii=False) + "\n")
        u = expected["usage"]
        print(f"{case['id']:45} {expected['ending']:12} in {u['input']:>6} w {u['cache_write']:>6} (1h {u['cache_write_1h']:>5})"
              f" r {u['cache_read']:>6} out {u['output']:>5} ws {u['web_search_requests']} spend {expected['spend_nano']}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
