"""The corpus calculator: applies the SPEC §2 readings listed in ../README.md to a case's
inputs and writes the working out as text (the `arithmetic` field). Written from the SPEC,
independently of the Rust engine, which it never runs or imports."""
import copy, json, math, os

NOW = 1_700_000_000_000
_DEFAULTS = json.load(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "defaults.json")))
DEFAULT_PRICES = _DEFAULTS["prices"]
DEFAULT_DOWNGRADE = _DEFAULTS["downgrade"]
W = _DEFAULTS["gate"]["weights"]
SAT = _DEFAULTS["gate"]["saturation"]
BANDS = _DEFAULTS["gate"]["bands"]
DG = _DEFAULTS["gate"]["downgrade"]
FT = _DEFAULTS["gate"]["findings"]
SIG = ["exposure", "size", "ask", "depth", "tools", "loop", "burst", "grind", "novelty", "unattended"]

def cj(v):
    return json.dumps(v, separators=(",", ":"), sort_keys=True, ensure_ascii=False)

def L(s):
    return len(s)  # code points = Unicode scalar values for valid text

def short(s, n=24):
    s = s.replace("\n", " ")
    return repr(s if len(s) <= n else s[:n] + "…")

def ceil_div(a, b):
    return -(-a // b)

def r4(x):
    return float(f"{x:.4f}")

# ---------------------------------------------------------------- shape (SPEC §2.1)
def shape(route, body):
    out = dict(route=route, model=body["model"], notes=[], system_chars=0, turns=[], tools=[], calls=[])
    notes = out["notes"]
    if route == "openai_chat":
        mt = body.get("max_completion_tokens", body.get("max_tokens"))
        for i, m in enumerate(body["messages"]):
            role = m["role"]
            c = m.get("content")
            parts = []
            if c is None:
                parts.append(("content null", 0))
            elif isinstance(c, str):
                parts.append((f"text {short(c)}", L(c)))
            else:
                for p in c:
                    if p.get("type") == "text":
                        parts.append((f"text part {short(p['text'])}", L(p["text"])))
                    else:
                        parts.append((f"{p.get('type')} part (media)", 0))
            called = []
            for tc in m.get("tool_calls", []) or []:
                a = tc["function"]["arguments"]
                parts.append((f"tool_call {tc['function']['name']} arguments {short(a)}", L(a)))
                called.append(tc["function"]["name"])
            chars = sum(p[1] for p in parts)
            desc = " + ".join(f"{d} = {n}" for d, n in parts) if len(parts) > 1 else f"{parts[0][0]} = {parts[0][1]}"
            if role in ("system", "developer"):
                out["system_chars"] += chars
                notes.append(f"messages[{i}] {role} (not a turn; system): {desc}")
                continue
            out["turns"].append(dict(role=role, chars=chars, ident=cj({k: v for k, v in m.items()}), called=called))
            notes.append(f"messages[{i}] {role} turn {len(out['turns'])}: {desc}" + (f" → {chars}" if len(parts) > 1 else ""))
        for j, t in enumerate(body.get("tools", []) or []):
            name = t["function"]["name"]
            out["tools"].append(dict(name=name, chars=L(cj(t))))
            notes.append(f"tools[{j}] {name}: compact JSON = {L(cj(t))} chars")
    else:
        mt = body.get("max_tokens")
        s = body.get("system")
        if isinstance(s, str):
            out["system_chars"] = L(s)
            notes.append(f"system string {short(s)} = {L(s)}")
        elif isinstance(s, list):
            for k, b in enumerate(s):
                out["system_chars"] += L(b["text"])
                notes.append(f"system[{k}] text block {short(b['text'])} = {L(b['text'])}" + (" (cache_control)" if "cache_control" in b else ""))
        for i, m in enumerate(body["messages"]):
            c = m["content"]
            parts, called = [], []
            if isinstance(c, str):
                parts.append((f"text {short(c)}", L(c)))
            else:
                for b in c:
                    t = b["type"]
                    if t == "text":
                        parts.append((f"text block {short(b['text'])}", L(b["text"])))
                    elif t == "tool_use":
                        parts.append((f"tool_use {b['name']} input {cj(b['input'])}", L(cj(b["input"]))))
                        called.append(b["name"])
                    elif t == "tool_result":
                        rc = b.get("content")
                        if isinstance(rc, str):
                            parts.append((f"tool_result {short(rc)}", L(rc)))
                        else:
                            parts.append((f"tool_result text blocks", sum(L(x["text"]) for x in rc if x.get("type") == "text")))
                    else:
                        parts.append((f"{t} block (media)", 0))
            chars = sum(p[1] for p in parts)
            desc = " + ".join(f"{d} = {n}" for d, n in parts)
            out["turns"].append(dict(role=m["role"], chars=chars, ident=cj(m), called=called))
            notes.append(f"messages[{i}] {m['role']} turn {len(out['turns'])}: {desc}" + (f" → {chars}" if len(parts) > 1 else ""))
        for j, t in enumerate(body.get("tools", []) or []):
            out["tools"].append(dict(name=t["name"], chars=L(cj(t))))
            notes.append(f"tools[{j}] {t['name']}: compact JSON = {L(cj(t))} chars")
    out["max_tokens"] = mt
    out["temperature"] = body.get("temperature")
    out["seed"] = body.get("seed")
    out["n"] = body.get("n")
    out["stream"] = bool(body.get("stream", False))
    out["cache_marked"] = "cache_control" in json.dumps(body)  # key anywhere (our bodies never carry the word in text)
    hist = out["turns"][:-1]
    out["called_in_history"] = sorted({c for t in hist for c in t["called"]})
    tc = sum(t["chars"] for t in out["turns"])
    td = sum(t["chars"] for t in out["tools"])
    out["prompt_chars"] = out["system_chars"] + tc + td
    notes.append(f"prompt_chars = system {out['system_chars']} + turns {tc} + tools {td} = {out['prompt_chars']}; turns = {len(out['turns'])}; tool definitions = {len(out['tools'])}")
    out["reproducible"] = ((out["temperature"] is not None and out["temperature"] == 0) or out["seed"] is not None) and out["n"] in (None, 1)
    out["content_id"] = route + "|" + cj({k: v for k, v in body.items() if k not in ("stream", "stream_options")})
    return out

def resolve_body(ref, request):
    if isinstance(ref, str):
        assert ref == "$request"
        return copy.deepcopy(request)
    return copy.deepcopy(ref)

def apply_merge(body, merge):
    for k, v in (merge or {}).items():
        if v is None:
            body.pop(k, None)
        else:
            body[k] = v
    return body

# ---------------------------------------------------------------- the case
def extra_bytes(value):
    """UTF-8 bytes beyond one per character, over every string of the body (keys too)."""
    if isinstance(value, str):
        return len(value.encode("utf-8")) - len(value)
    if isinstance(value, list):
        return sum(extra_bytes(v) for v in value)
    if isinstance(value, dict):
        return sum(extra_bytes(k) + extra_bytes(v) for k, v in value.items())
    return 0


def media_parts(body):
    """(images, documents, audio): typed parts anywhere under messages, input and system."""
    kinds = {"image": 0, "image_url": 0, "input_image": 0, "document": 1, "file": 1,
             "input_file": 1, "input_audio": 2, "audio": 2}
    counts = [0, 0, 0]
    def walk(v):
        if isinstance(v, list):
            for x in v:
                walk(x)
        elif isinstance(v, dict):
            t = v.get("type")
            if isinstance(t, str) and t in kinds:
                counts[kinds[t]] += 1
            for x in v.values():
                walk(x)
    for field in ("messages", "input", "system"):
        if field in body:
            walk(body[field])
    return tuple(counts)


def derive(case):
    pol = case.get("policy", {})
    if set(pol.get("gate", {})) - {"weights"}:
        raise NotImplementedError("the calculator supports gate weight overrides only")
    w = dict(W); w.update(pol.get("gate", {}).get("weights", {}))
    prices = copy.deepcopy(DEFAULT_PRICES); prices.update(pol.get("prices", {}))
    down = dict(DEFAULT_DOWNGRADE); down.update(pol.get("downgrade", {}))
    route = case["route"]
    req = case["request"]
    key = case["key"]
    now = case["now_ms"]
    sh = shape(route, req)
    A = []  # arithmetic
    A.append("-- shape (SPEC §2.1) --")
    A += sh["notes"]
    if sh["cache_marked"]:
        A.append("cache_marked: a cache_control key occurs in the request")
    # human
    hh = case.get("human_header")
    human = {"1": True, "0": False, None: key["human_default"]}[hh]
    A.append(f"human: header {hh!r} → {'declared' if human else 'not declared'}" + (f" (key default {key['human_default']})" if hh is None else ""))
    # windows
    A.append(f"-- windows at now = {now} (half-open: an entry exactly 120 s / 60 s / 1 h / 24 h old is outside) --")
    ents = []
    for h in case.get("history", []):
        b = apply_merge(resolve_body(h["body"], req), h.get("merge"))
        hk = h.get("key", {"id": key["id"], "secret": key["secret"]})
        hr = h.get("route", route)
        hs = shape(hr, b)
        rep = h.get("repeat", 1); step = h.get("step_ms", 0)
        for i in range(rep):
            ents.append(dict(key=hk["id"], secret=hk["secret"], cid=hs["content_id"], model=hs["model"], at=h["at_ms"] + i * step, label=h.get("label", "?")))
    mine = [e for e in ents if e["key"] == key["id"]]
    def same(e):
        return e["secret"] == key["secret"] and e["cid"] == sh["content_id"]
    ident = [e for e in mine if same(e) and now - e["at"] < 120_000]
    minute = [e for e in mine if now - e["at"] < 60_000]
    hour = [e for e in mine if now - e["at"] < 3_600_000]
    model_seen = any(e["model"] == sh["model"] and now - e["at"] < 86_400_000 for e in mine)
    fp_seen = any(same(e) and now - e["at"] < 86_400_000 for e in mine)
    for h in case.get("history", []):
        rep = h.get("repeat", 1)
        ages = [now - (h["at_ms"] + i * h.get("step_ms", 0)) for i in range(rep)]
        who = "" if "key" not in h else f" [key {h['key']['id']}]"
        A.append(f"history {h.get('label','?')}{who}: {rep} request(s) aged {min(ages)}..{max(ages)} ms" if rep > 1 else f"history {h.get('label','?')}{who}: 1 request aged {ages[0]} ms")
    others = len(ents) - len(mine)
    A.append(f"earlier identical (same key+fingerprint) < 120 s: {len(ident)}; key requests < 60 s: {len(minute)}; < 1 h: {len(hour)}; model {sh['model']} seen < 24 h: {'yes' if model_seen else 'no'}; fingerprint seen < 24 h: {'yes' if fp_seen else 'no'}" + (f" ({others} entries of other keys ignored)" if others else ""))
    # worst case
    p = prices.get(sh["model"])
    n = sh["n"] if sh["n"] is not None else 1
    n_eff = max(n, 1)
    # SPEC §2.3 / /spec worst_case_input_bound: characters at one token per 3, plus the UTF-8
    # bytes text takes beyond one per character, plus a bound per media part.
    extra = extra_bytes(req)
    images, documents, audio = media_parts(req)
    per_image = 5_000 if route == "anthropic_messages" else (48_200 if sh["model"].startswith("gpt-4o-mini") else 10_000)
    media = images * per_image + documents * 100 * (3_000 + 10_000) + audio * 100_000
    inp = ceil_div(sh["prompt_chars"], 3) + extra + media
    if sh["max_tokens"] is not None:
        out = sh["max_tokens"] * n_eff
        otxt = f"max_tokens {sh['max_tokens']} × n {n_eff} = {out}"
    elif p is not None:
        out = p["max_output"] * n_eff
        otxt = f"max_tokens absent → model max_output {p['max_output']} × n {n_eff} = {out}"
    else:
        out = None
        otxt = "max_tokens absent and no price entry → unbounded (null)"
    if p is not None and out is not None:
        ci = ceil_div(inp * p["input"], 1000); co = ceil_div(out * p["output"], 1000)
        cost = ci + co
        ctxt = f"cost = ceil({inp}×{p['input']}/1000) + ceil({out}×{p['output']}/1000) = {ci} + {co} = {cost} nano-USD"
    else:
        cost = None
        ctxt = f"cost: model {sh['model']!r} has no price → unbounded (null)"
    A.append("-- worst case (SPEC §2.3, §2.12) --")
    A.append(f"input = ceil({sh['prompt_chars']}/3) + {extra} bytes beyond one per character + media {images} image(s) × {per_image} + {documents} document(s) + {audio} audio = {inp} tokens (estimated); output = {otxt}; {ctxt}")
    # signals
    A.append("-- signals (SPEC §2.4) --")
    b = case.get("budget")
    s = {}
    if b is None:
        s["exposure"] = 0.0; A.append("exposure = 0 (key has no ceiling)")
    else:
        left = b["ceiling_nano"] - b["spend_nano"] - b["reserved_nano"]
        lt = f"left = {b['ceiling_nano']} − {b['spend_nano']} − {b['reserved_nano']} = {left}"
        if left <= 0:
            s["exposure"] = 1.0; A.append(f"exposure: {lt} ≤ 0 → 1")
        elif cost is None:
            s["exposure"] = 1.0; A.append(f"exposure: {lt}; worst case unbounded → 1")
        else:
            s["exposure"] = min(cost / left, 1.0); A.append(f"exposure = min({cost}/{left}, 1) = {s['exposure']:.6f}")
    s["size"] = min(math.log(1 + sh["prompt_chars"]) / math.log(100_001), 1.0)
    A.append(f"size = ln(1+{sh['prompt_chars']})/ln(100001) = {math.log(1+sh['prompt_chars']):.4f}/11.5129 = {s['size']:.6f}")
    if sh["max_tokens"] is None:
        s["ask"] = 1.0; A.append("ask = 1 (max_tokens absent)")
    else:
        s["ask"] = min(sh["max_tokens"] / 8000, 1.0); A.append(f"ask = min({sh['max_tokens']}/8000, 1) = {s['ask']:.6f}")
    nt = len(sh["turns"]); ntl = len(sh["tools"])
    s["depth"] = min(nt / 40, 1.0); A.append(f"depth = min({nt}/40, 1) = {s['depth']:.6f}")
    s["tools"] = min(ntl / 24, 1.0); A.append(f"tools = min({ntl}/24, 1) = {s['tools']:.6f}")
    s["loop"] = min(len(ident) / 5, 1.0); A.append(f"loop = min({len(ident)}/5, 1) = {s['loop']:.6f}")
    s["burst"] = min(len(minute) / 20, 1.0); A.append(f"burst = min({len(minute)}/20, 1) = {s['burst']:.6f}")
    s["grind"] = min(len(hour) / 200, 1.0); A.append(f"grind = min({len(hour)}/200, 1) = {s['grind']:.6f}")
    s["novelty"] = 0.0 if model_seen else 1.0; A.append(f"novelty = {int(s['novelty'])} (model {'seen' if model_seen else 'not seen'} in 24 h)")
    s["unattended"] = 0.0 if human else 1.0; A.append(f"unattended = {int(s['unattended'])}")
    terms = [(k, w[k] * s[k]) for k in SIG]
    raw = sum(t for _, t in terms)
    score = round(raw, 9)
    A.append("score = " + " + ".join(f"{w[k]}×{s[k]:.4f}" for k in SIG if s[k] != 0 and w[k] != 0) + " = " + " + ".join(f"{t:.4f}" for k, t in terms if t != 0) + f" = {score:.6f}")
    # decision
    A.append("-- order of decision (SPEC §2.2) --")
    held = {h["form"]: h.get("usage") for h in case.get("held", [])}
    form = "sse" if sh["stream"] else "json"
    is_held = form in held
    held_usage = held.get(form) if is_held else None
    approved = case.get("approved_hold", False)
    servable = is_held and held_usage is not None and sh["reproducible"]
    rep_txt = f"reproducible: temperature {sh['temperature']}, seed {sh['seed']}, n {sh['n']} → {'yes' if sh['reproducible'] else 'no'}"
    verdict = rule = band = None
    ident_n = len(ident) + 1
    burst_n = len(minute) + 1
    if ident_n >= 8:
        verdict, rule = "BLOCK", "runaway_loop"
    elif ident_n >= 4 and not human:
        verdict, rule = "BLOCK", "runaway_loop_unattended"
    elif burst_n >= 120:
        verdict, rule = "BLOCK", "runaway_burst"
    A.append(f"1. runaway: this is identical request #{ident_n} in 120 s (8 → runaway_loop; 4 with no human → runaway_loop_unattended), request #{burst_n} in 60 s (120 → runaway_burst) → {rule or 'none'}")
    if verdict is None:
        A.append(f"2. SERVE? wire form {form}; held forms {sorted(held) or 'none'}; usage recorded {'yes' if held_usage else 'no'}; {rep_txt} → {'SERVE' if servable else 'no'}")
        if servable:
            verdict = "SERVE"
    if verdict is None:
        if b is None:
            A.append("3. budget: key has no ceiling → no budget rule")
        else:
            left = b["ceiling_nano"] - b["spend_nano"] - b["reserved_nano"]
            if b["spend_nano"] >= b["ceiling_nano"]:
                verdict, rule = "BLOCK", "budget_exhausted"
                A.append(f"3. budget_exhausted: spend {b['spend_nano']} ≥ ceiling {b['ceiling_nano']} → BLOCK")
            else:
                exc = cost is None or cost > left
                if approved:
                    A.append(f"3. spend {b['spend_nano']} < ceiling {b['ceiling_nano']}; exceeds_remaining_budget skipped (approved hold; would be {exc})")
                elif exc:
                    verdict, rule = ("CHALLENGE" if human else "BLOCK"), "exceeds_remaining_budget"
                    A.append(f"3. spend < ceiling; worst case {cost if cost is not None else 'unbounded'} > left {left} → exceeds_remaining_budget → {verdict} ({'human' if human else 'no human'})")
                else:
                    A.append(f"3. spend {b['spend_nano']} < ceiling {b['ceiling_nano']}; worst case {cost} ≤ left {left} → no budget rule")
    if verdict is None:
        if approved:
            A.append(f"4. score band skipped (approved hold); score {score:.6f}")
        elif score >= BANDS["block"]:
            verdict, band = "BLOCK", "score_block"; A.append(f"4. score {score:.6f} ≥ 0.80 → BLOCK (score_block)")
        elif score >= BANDS["challenge"]:
            verdict, band = "CHALLENGE", "score_challenge"; A.append(f"4. score {score:.6f} ≥ 0.55 → CHALLENGE (score_challenge)")
        else:
            A.append(f"4. score {score:.6f} < 0.55")
    model_served = None
    if verdict is None:
        conds = [
            (f"score {score:.6f} ≤ 0.30", score <= DG["max_score"]),
            (f"prompt_chars {sh['prompt_chars']} ≤ 4000", sh["prompt_chars"] <= DG["max_prompt_chars"]),
            (f"turns {nt} ≤ 6", nt <= DG["max_turns"]),
            (f"max_tokens {sh['max_tokens']} set and ≤ 1000", sh["max_tokens"] is not None and sh["max_tokens"] <= DG["max_output_tokens"]),
            (f"tools {ntl} = 0", ntl <= DG["tools_allowed"]),
            (f"downgrade map has {sh['model']}", sh["model"] in down),
        ]
        ok = all(c for _, c in conds)
        A.append("5. downgrade: " + "; ".join(f"{t} {'✓' if c else '✗'}" for t, c in conds) + (f" → DOWNGRADE to {down[sh['model']]}" if ok else " → not earned"))
        if ok:
            verdict, model_served = "DOWNGRADE", down[sh["model"]]
        else:
            verdict, model_served = "ALLOW", sh["model"]
            A.append("6. ALLOW")
    wtok = None if out is None else inp + out
    avoided = None
    if verdict == "BLOCK":
        avoided = 0 if is_held else wtok
        A.append(f"worst_case_tokens_avoided = " + ("0 (an answer is held in this wire form)" if is_held else (f"{inp} + {out} = {wtok}" if wtok is not None else "null (unbounded)")))
    tnb = held_usage if verdict == "SERVE" else None
    if tnb:
        A.append(f"tokens_not_bought = recorded usage {tnb}")
    # findings
    A.append("-- findings (SPEC §2.8) --")
    F = []
    if fp_seen:
        if not sh["reproducible"]:
            F.append(("varied_output_blocks_reuse", ceil_div(sh["prompt_chars"], 4)))
            A.append(f"varied_output_blocks_reuse: fingerprint seen in 24 h, {rep_txt}; figure ceil({sh['prompt_chars']}/4) = {F[-1][1]}")
        elif not servable:
            F.append(("repeating_without_recording", ceil_div(sh["prompt_chars"], 4)))
            A.append(f"repeating_without_recording: fingerprint seen in 24 h, reproducible, not servable (held {form}: {'yes' if is_held else 'no'}, usage {'yes' if held_usage else 'no'}); figure ceil({sh['prompt_chars']}/4) = {F[-1][1]}")
    if nt > 12:
        old = sh["turns"][: nt - 12]
        oc = sum(t["chars"] for t in old)
        F.append(("carrying_old_turns", ceil_div(oc, 4)))
        A.append(f"carrying_old_turns: {nt} turns > 12; the {nt-12} oldest carry " + " + ".join(str(t["chars"]) for t in old) + f" = {oc} chars → ceil({oc}/4) = {F[-1][1]}")
    hist = nt - 1 if nt > 0 else 0
    if hist >= 4 and ntl > 0:
        unused = [t for t in sh["tools"] if t["name"] not in sh["called_in_history"]]
        if unused:
            uc = sum(t["chars"] for t in unused)
            F.append(("unused_tool_definitions", ceil_div(uc, 4)))
            A.append(f"unused_tool_definitions: history {hist} turns ≥ 4; called {sh['called_in_history']}; unused " + ", ".join(f"{t['name']} ({t['chars']})" for t in unused) + f" = {uc} chars → ceil({uc}/4) = {F[-1][1]}")
    if route == "anthropic_messages" and sh["system_chars"] >= 4000 and not sh["cache_marked"] and any(t["role"] == "assistant" for t in sh["turns"]):
        F.append(("large_system_prompt_resent", ceil_div(sh["system_chars"], 4)))
        A.append(f"large_system_prompt_resent: Anthropic, system {sh['system_chars']} ≥ 4000, an assistant turn, no cache_control; figure ceil({sh['system_chars']}/4) = {F[-1][1]}")
    if sh["max_tokens"] is None or sh["max_tokens"] >= 4096:
        F.append(("output_ceiling_authorised", None))
        A.append(f"output_ceiling_authorised: max_tokens {sh['max_tokens']} (absent or ≥ 4096); no figure")
    seen = set(); dup = []
    for t in sh["turns"]:
        if t["ident"] in seen:
            dup.append(t)
        seen.add(t["ident"])
    if dup:
        dc = sum(t["chars"] for t in dup)
        F.append(("duplicate_turns_in_context", ceil_div(dc, 4)))
        A.append(f"duplicate_turns_in_context: {len(dup)} repeated message(s) of " + " + ".join(str(t["chars"]) for t in dup) + f" = {dc} chars → ceil({dc}/4) = {F[-1][1]}")
    if b is not None and (b["spend_nano"] + b["reserved_nano"]) * 100 >= b["ceiling_nano"] * 90:
        F.append(("budget_nearly_gone", None))
        A.append(f"budget_nearly_gone: spend + reserved = {b['spend_nano'] + b['reserved_nano']} ≥ 90% of {b['ceiling_nano']} = {b['ceiling_nano']*0.9:g}; no figure")
    if not F:
        A.append("none")
    expected = dict(
        verdict=verdict, rule=rule, band=band, score=r4(score),
        signals={k: r4(s[k]) for k in SIG},
        findings=[dict(code=c, tokens=t) for c, t in F],
        model_served=model_served,
        hold_id=verdict == "CHALLENGE",
        worst_case=dict(input_tokens_estimated=inp, output_tokens=out, cost_nano=cost),
        tokens_not_bought=tnb,
        worst_case_tokens_avoided=avoided,
    )
    return expected, A, dict(score=score, raw=raw, s=s, sh=sh)
