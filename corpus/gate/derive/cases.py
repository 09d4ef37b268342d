import copy
from calc import NOW

def filler(n, tag="lorem"):
    words = [tag, "ipsum", "dolor", "sit", "amet", "consectetur", "adipiscing", "elit", "sed", "do", "eiusmod", "tempor"]
    out, i = "", 0
    while len(out) < n:
        out += words[i % len(words)] + " "
        i += 1
    return out[:n]

KA = {"id": "k-alpha", "secret": "alpha-secret-0001", "human_default": False}
KH = {"id": "k-human", "secret": "human-secret-0002", "human_default": True}
KB = {"id": "k-bravo", "secret": "bravo-secret-0003"}

OTHER_OA = {"model": "gpt-4o", "messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 50}
OTHER_OA2 = {"model": "gpt-4o", "messages": [{"role": "user", "content": "Ping"}], "max_tokens": 10}
OTHER_AN = {"model": "claude-haiku-4-5", "max_tokens": 64, "messages": [{"role": "user", "content": "Status?"}]}

def oa(msgs, **kw):
    b = {"model": kw.pop("model", "gpt-4o"), "messages": msgs}
    b.update(kw)
    return b

def an(msgs, **kw):
    b = {"model": kw.pop("model", "claude-sonnet-4-5"), "messages": msgs}
    b.update(kw)
    return b

def u(t): return {"role": "user", "content": t}
def a(t): return {"role": "assistant", "content": t}
def sysm(t): return {"role": "system", "content": t}

CASES = []
def case(name, tests, request, expect, route="openai_chat", key=KA, human_header="1", history=(), budget=None, held=(), approved_hold=False, now=NOW, policy=None):
    c = dict(name=name, tests=tests, route=route, key=key, human_header=human_header, history=list(history), budget=budget, held=list(held), approved_hold=approved_hold, now_ms=now, request=request)
    if policy:
        c["policy"] = policy
    c["_expect"] = expect
    CASES.append(c)

seen_gpt4o = dict(label="earlier other request", body=OTHER_OA, at_ms=NOW - 600_000)

from calc import shape as _shape, DEFAULT_PRICES, ceil_div

def wc_cost(route, body, prices=DEFAULT_PRICES):
    s = _shape(route, body)
    p = prices[s["model"]]
    inp = ceil_div(s["prompt_chars"], 3)
    out = (s["max_tokens"] if s["max_tokens"] is not None else p["max_output"]) * max(s["n"] or 1, 1)
    return ceil_div(inp * p["input"], 1000) + ceil_div(out * p["output"], 1000)

# ------------------------------------------------------------------ A. ALLOW / DOWNGRADE
case("openai_allow_basic", "A plain OpenAI request from an attended key: ALLOW to the requested model; no findings.",
     oa([sysm("You are a concise assistant."), u("Summarise the attached release notes in three bullet points.")], max_tokens=2000, temperature=0.2),
     dict(verdict="ALLOW"), history=[seen_gpt4o])

case("openai_downgrade_earned", "A small, simple, attended request with max_tokens set and a mapped model earns DOWNGRADE to the cheaper model.",
     oa([u("What is the capital of Portugal? Answer in one word.")], max_tokens=20, temperature=0),
     dict(verdict="DOWNGRADE"), history=[seen_gpt4o])

def six_turns(total_turn_chars, n_turns=6, sys_chars=1000):
    per = total_turn_chars // n_turns
    rest = total_turn_chars - per * n_turns
    msgs = [sysm(filler(sys_chars, "system"))]
    for i in range(n_turns):
        n = per + (rest if i == n_turns - 1 else 0)
        if i == n_turns - 1:
            msgs.append({"role": "user", "content": [{"type": "text", "text": filler(n // 2, "partone")}, {"type": "text", "text": filler(n - n // 2, "parttwo")}]})
        else:
            msgs.append((u if i % 2 == 0 else a)(filler(n, f"turn{i}")))
    return msgs

case("downgrade_at_every_limit", "DOWNGRADE with every limit met exactly: prompt_chars 4000, 6 turns, max_tokens 1000, no tools (limits are inclusive).",
     oa(six_turns(3000), max_tokens=1000), dict(verdict="DOWNGRADE"), history=[seen_gpt4o])
case("downgrade_past_prompt_chars", "One character past the prompt limit (4001): not earned, ALLOW.",
     oa(six_turns(3001), max_tokens=1000), dict(verdict="ALLOW"), history=[seen_gpt4o])
case("downgrade_past_turns", "Seven turns (limit 6) with 4000 chars: not earned, ALLOW.",
     oa(six_turns(3000, n_turns=7), max_tokens=1000), dict(verdict="ALLOW"), history=[seen_gpt4o])
case("downgrade_past_max_tokens", "max_tokens 1001 (limit 1000): not earned, ALLOW.",
     oa(six_turns(3000), max_tokens=1001), dict(verdict="ALLOW"), history=[seen_gpt4o])
case("downgrade_denied_without_max_tokens", "max_tokens absent: DOWNGRADE needs it set; ALLOW and output_ceiling_authorised.",
     oa([u("What is the capital of Portugal? Answer in one word.")], temperature=0),
     dict(verdict="ALLOW"), history=[seen_gpt4o])

WEATHER_TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Current weather for a city", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
case("downgrade_denied_with_tools", "Otherwise small enough to downgrade, but a tool is defined: never downgraded, ALLOW.",
     oa([u("Is it raining in Lisbon right now?")], max_tokens=200, tools=[WEATHER_TOOL]),
     dict(verdict="ALLOW"), history=[seen_gpt4o])

ZERO_W = dict(exposure=0, size=0, ask=0, depth=0, tools=0, loop=0, burst=0, grind=0, novelty=0, unattended=0.10)
burst20 = dict(label="20 other requests in the last minute", body=OTHER_OA2, at_ms=NOW - 40_000, repeat=20, step_ms=1_000)
case("downgrade_score_exactly_at_limit", "Weights overridden so the score is 0.2×burst + 0.1×novelty = 0.2 + 0.1, which is 0.30000000000000004 in binary floating point; rounded to 9 decimals it is 0.30 ≤ 0.30, so DOWNGRADE is earned.",
     oa([u("Translate 'good morning' to French.")], model="claude-sonnet-4-5", max_tokens=30),
     dict(verdict="DOWNGRADE"), history=[burst20],
     policy={"gate": {"weights": dict(ZERO_W, burst=0.2, novelty=0.1)}})
case("downgrade_score_just_past_limit", "Same as downgrade_score_exactly_at_limit with the novelty weight 0.1001: score 0.3001 > 0.30, not earned, ALLOW.",
     oa([u("Translate 'good morning' to French.")], model="claude-sonnet-4-5", max_tokens=30),
     dict(verdict="ALLOW"), history=[burst20],
     policy={"gate": {"weights": dict(ZERO_W, burst=0.2, novelty=0.1001)}})
case("downgrade_unmapped_model", "Anthropic request small enough to downgrade, but its model (claude-haiku-4-5) is not mapped to a cheaper one: ALLOW; key default human (header absent).",
     an([u("Give me a two-word greeting.")], model="claude-haiku-4-5", max_tokens=16, temperature=0),
     dict(verdict="ALLOW"), route="anthropic_messages", key=KH, human_header=None,
     history=[dict(label="earlier haiku request", body=OTHER_AN, at_ms=NOW - 900_000, route="anthropic_messages")])

# ------------------------------------------------------------------ B. score bands and the unattended weight
def long_convo(n_turns, chars_each, tag):
    msgs = [sysm("You are a careful research assistant.")]
    for i in range(n_turns):
        msgs.append((u if i % 2 == 0 else a)(filler(chars_each, f"{tag}{i}")))
    return msgs

U_REQ = oa(long_convo(21, 800, "u"), temperature=0.5)
u_hist = [
    dict(label="10 other requests in the last minute", body=OTHER_OA2, at_ms=NOW - 50_000, repeat=10, step_ms=2_000),
    dict(label="30 other requests earlier in the hour", body=OTHER_OA, at_ms=NOW - 3_000_000, repeat=30, step_ms=10_000),
]
U_LEFT = 2 * wc_cost("openai_chat", U_REQ)
U_BUDGET = {"ceiling_nano": 10_000_000_000, "spend_nano": 10_000_000_000 - U_LEFT - 250_000_000, "reserved_nano": 250_000_000}
case("unattended_below_challenge_attended", "Attended twin of unattended_crosses_challenge: score just under 0.55, ALLOW.",
     U_REQ, dict(verdict="ALLOW"), history=u_hist, human_header="1", budget=U_BUDGET)
case("unattended_crosses_challenge", "The same request and state with x-tokensaver-human: 0: the unattended +0.10 lifts the score across 0.55, CHALLENGE by the score band (hold id issued).",
     U_REQ, dict(verdict="CHALLENGE", band="score_challenge"), history=u_hist, human_header="0", budget=U_BUDGET)

V_REQ = oa(long_convo(25, 900, "v"), temperature=0.9)
v_hist = [
    dict(label="180 other requests 23-50 min ago", body=OTHER_OA, at_ms=NOW - 3_000_000, repeat=180, step_ms=9_000),
    dict(label="two identical earlier requests", body="$request", at_ms=NOW - 100_000, repeat=2, step_ms=30_000),
    dict(label="18 other requests in the last minute", body=OTHER_OA2, at_ms=NOW - 36_000, repeat=18, step_ms=2_000),
]
V_LEFT = wc_cost("openai_chat", V_REQ) * 20 // 19
V_BUDGET = {"ceiling_nano": 2_000_000_000, "spend_nano": 2_000_000_000 - V_LEFT - 600_000_000, "reserved_nano": 600_000_000}
case("unattended_below_block_attended", "Attended twin of unattended_crosses_block: score in [0.55, 0.80): CHALLENGE by the score band.",
     V_REQ, dict(verdict="CHALLENGE", band="score_challenge"), history=v_hist, budget=V_BUDGET, human_header="1")
case("unattended_crosses_block", "The same request and state with no human declared (key default, header absent): +0.10 crosses 0.80, BLOCK by the score band; worst case reported as avoided.",
     V_REQ, dict(verdict="BLOCK", band="score_block"), history=v_hist, budget=V_BUDGET, human_header=None)

# ------------------------------------------------------------------ C. runaway rules
LOOP_REQ = oa([sysm("You are a build bot."), u("Run the test suite again and report failures.")], max_tokens=600, temperature=0)
def ident(k, first_age=70_000, step=10_000):
    return dict(label=f"{k} identical earlier requests", body="$request", at_ms=NOW - first_age, repeat=k, step_ms=step)

case("runaway_loop_8th", "The 8th identical request within 120 s (seven earlier, human declared): BLOCK runaway_loop, HTTP 429.",
     LOOP_REQ, dict(verdict="BLOCK", rule="runaway_loop"), history=[ident(7)])
case("runaway_loop_7th_not_blocked", "The 7th identical request (six earlier, human declared): no runaway rule; loop signal saturated; decided by the score.",
     LOOP_REQ, dict(verdict="DOWNGRADE"), history=[ident(6)])
case("runaway_loop_9th", "A hard rule keeps firing past its threshold: the 9th identical request is BLOCKed runaway_loop too.",
     LOOP_REQ, dict(verdict="BLOCK", rule="runaway_loop"), history=[ident(8, first_age=90_000)])
case("runaway_loop_unattended_4th", "The 4th identical request within 120 s with no human declared (header 0): BLOCK runaway_loop_unattended.",
     LOOP_REQ, dict(verdict="BLOCK", rule="runaway_loop_unattended"), history=[ident(3)], human_header="0")
case("runaway_loop_unattended_3rd", "The 3rd identical request with no human: no rule; the score decides (unattended +0.10 included).",
     LOOP_REQ, dict(verdict="DOWNGRADE"), history=[ident(2)], human_header="0")
case("loop_4th_with_human", "The 4th identical request with a human declared: runaway_loop_unattended does not apply.",
     LOOP_REQ, dict(verdict="DOWNGRADE"), history=[ident(3)], human_header="1")

BURST_REQ = oa([u("Classify this ticket: printer offline.")], max_tokens=300, temperature=0)
case("runaway_burst_120th", "The 120th request from the key within 60 s (119 earlier, all different from this one): BLOCK runaway_burst.",
     BURST_REQ, dict(verdict="BLOCK", rule="runaway_burst"),
     history=[dict(label="119 other requests in the last minute", body=OTHER_OA2, at_ms=NOW - 59_000, repeat=119, step_ms=100)])
case("runaway_burst_119th", "The 119th request within 60 s: no rule; burst signal saturated at 1.",
     BURST_REQ, dict(verdict="DOWNGRADE"),
     history=[dict(label="118 other requests in the last minute", body=OTHER_OA2, at_ms=NOW - 59_000, repeat=118, step_ms=100)])
case("rule_order_loop_named_first", "All three runaway rules hold (8th identical, no human, 120th in 60 s): the receipt names runaway_loop.",
     LOOP_REQ, dict(verdict="BLOCK", rule="runaway_loop"), human_header="0",
     history=[dict(label="112 other requests in the last minute", body=OTHER_OA2, at_ms=NOW - 58_000, repeat=112, step_ms=100), ident(7, first_age=50_000, step=5_000)])
case("rule_order_unattended_before_burst", "4th identical with no human and 120th in 60 s: runaway_loop_unattended is named before runaway_burst.",
     LOOP_REQ, dict(verdict="BLOCK", rule="runaway_loop_unattended"), human_header="0",
     history=[dict(label="116 other requests in the last minute", body=OTHER_OA2, at_ms=NOW - 58_000, repeat=116, step_ms=100), ident(3, first_age=30_000, step=5_000)])

# ------------------------------------------------------------------ D. budget rules
BUD_REQ = oa([sysm("You write unit tests."), u("Write tests for the parser module.")], max_tokens=800, temperature=0)
# BUD_REQ: prompt chars computed by calc; cost used below after a first run
case("budget_exhausted_at_ceiling", "Recorded spend equals the ceiling: BLOCK budget_exhausted (HTTP 402); budget_nearly_gone too.",
     BUD_REQ, dict(verdict="BLOCK", rule="budget_exhausted"), history=[seen_gpt4o],
     budget={"ceiling_nano": 5_000_000_000, "spend_nano": 5_000_000_000, "reserved_nano": 0})
FREE = {"free-local": {"input": 0, "cache_write": 0, "cache_read": 0, "output": 0, "max_output": 4096}}
case("budget_one_nano_below_ceiling", "Spend one nano-USD below the ceiling: not exhausted; a zero-priced model's worst case (0) fits in the 1 nano left, so no budget rule; budget_nearly_gone.",
     oa([u("Write tests for the parser module.")], model="free-local", max_tokens=800),
     dict(verdict="ALLOW"), policy={"prices": FREE},
     history=[dict(label="earlier free-local request", body={"model": "free-local", "messages": [{"role": "user", "content": "hi"}]}, at_ms=NOW - 5_000)],
     budget={"ceiling_nano": 5_000_000_000, "spend_nano": 4_999_999_999, "reserved_nano": 0})
C = wc_cost("openai_chat", BUD_REQ)
case("exceeds_remaining_equal_is_fine", f"Budget left equals the worst case ({C} nano-USD): equal is fine, no budget rule; exposure 1.",
     BUD_REQ, dict(verdict="DOWNGRADE"), history=[seen_gpt4o],
     budget={"ceiling_nano": 5_000_000_000, "spend_nano": 5_000_000_000 - C - 1_000_000, "reserved_nano": 1_000_000})
case("exceeds_remaining_human_challenge", "Budget left is one nano-USD below the worst case, human declared: CHALLENGE exceeds_remaining_budget (HTTP 409, hold id).",
     BUD_REQ, dict(verdict="CHALLENGE", rule="exceeds_remaining_budget"), history=[seen_gpt4o],
     budget={"ceiling_nano": 5_000_000_000, "spend_nano": 5_000_000_000 - C - 1_000_000 + 1, "reserved_nano": 1_000_000})
case("exceeds_remaining_unattended_block", "Budget left is one nano-USD below the worst case, no human: BLOCK exceeds_remaining_budget (HTTP 402), worst case reported as avoided.",
     BUD_REQ, dict(verdict="BLOCK", rule="exceeds_remaining_budget"), history=[seen_gpt4o], human_header="0",
     budget={"ceiling_nano": 5_000_000_000, "spend_nano": 5_000_000_000 - C - 1_000_000 + 1, "reserved_nano": 1_000_000})
case("unpriced_model_on_budgeted_key", "A model with no price on a budgeted key: the worst case cost is unbounded, exposure 1 and exceeds_remaining_budget; no human → BLOCK; the token worst case (input estimate + max_tokens) is still known.",
     oa([u("Draft a haiku about rain.")], model="local-llama-70b", max_tokens=500), dict(verdict="BLOCK", rule="exceeds_remaining_budget"),
     human_header="0", history=[dict(label="earlier request, same model", body={"model": "local-llama-70b", "messages": [{"role": "user", "content": "hi"}]}, at_ms=NOW - 20_000)],
     budget={"ceiling_nano": 100_000_000_000, "spend_nano": 0, "reserved_nano": 0})
case("unpriced_model_no_budget", "A model with no price, no max_tokens, on a key without a ceiling: output and cost unbounded (null), exposure 0, no budget rule; ALLOW; worst case tokens unknown.",
     oa([u("Draft a haiku about rain.")], model="local-llama-70b"), dict(verdict="ALLOW"),
     history=[dict(label="earlier request, same model", body={"model": "local-llama-70b", "messages": [{"role": "user", "content": "hi"}]}, at_ms=NOW - 20_000)])
ODD = {"gpt-4o": {"input": 1, "cache_write": 0, "cache_read": 0, "output": 3, "max_output": 16_384}}
ODD_REQ = oa([u("Estimate this cheaply.")], max_tokens=700)
case("cost_rounds_up_per_part", "Prices of 1 and 3 micro-USD per million tokens: each part's nano-USD cost is rounded up separately (ceil(8×1/1000) = 1, ceil(700×3/1000) = 3); exposure is 4 ÷ left.",
     ODD_REQ, dict(verdict="DOWNGRADE"), policy={"prices": ODD}, history=[seen_gpt4o],
     budget={"ceiling_nano": 1_000, "spend_nano": 600, "reserved_nano": 392})

# ------------------------------------------------------------------ E. SERVE and reuse
SERVE_REQ = oa([sysm("You are a SQL expert."), u("Explain what a LEFT JOIN returns, in two sentences.")], max_tokens=200, temperature=0)
USAGE = {"input": 812, "cache_write": 0, "cache_read": 256, "output": 164}
prev = dict(label="the same request 30 min ago", body="$request", at_ms=NOW - 1_800_000)
case("serve_with_recorded_usage", "A reproducible (temperature 0) repeat with a JSON answer held and its usage recorded: SERVE; tokens_not_bought is the recorded usage.",
     SERVE_REQ, dict(verdict="SERVE"), history=[prev], held=[{"form": "json", "usage": USAGE}])
case("held_without_recorded_usage", "An answer is held but no usage was recorded: no SERVE (the request goes on to the score and earns DOWNGRADE) and repeating_without_recording.",
     SERVE_REQ, dict(verdict="DOWNGRADE"), history=[prev], held=[{"form": "json", "usage": None}])
SAMPLED = dict(SERVE_REQ, temperature=0.7)
case("sampled_output_refuses_reuse", "temperature 0.7 repeated with an answer and usage held: reuse is not allowed (sampled output), no SERVE; varied_output_blocks_reuse.",
     SAMPLED, dict(verdict="DOWNGRADE"), history=[prev], held=[{"form": "json", "usage": USAGE}])
case("explicit_seed_allows_reuse", "temperature 0.7 but an explicit seed: reproducible, the held answer is SERVEd.",
     dict(SERVE_REQ, temperature=0.7, seed=1234), dict(verdict="SERVE"), history=[prev], held=[{"form": "json", "usage": USAGE}])
case("streamed_request_json_held", "The streamed twin of an earlier non-streamed request: same fingerprint (the history counts as identical: loop 1, seen) but only a JSON answer is held, never converted to SSE: no SERVE, repeating_without_recording.",
     dict(SERVE_REQ, stream=True, stream_options={"include_usage": True}), dict(verdict="DOWNGRADE"),
     history=[dict(label="the non-streamed request 90 s ago", body="$request", merge={"stream": None, "stream_options": None}, at_ms=NOW - 90_000)],
     held=[{"form": "json", "usage": USAGE}])
case("streamed_request_sse_held", "A streamed request with an SSE answer held and usage recorded: SERVE.",
     dict(SERVE_REQ, stream=True), dict(verdict="SERVE"),
     history=[dict(label="the non-streamed request 90 s ago", body="$request", merge={"stream": None}, at_ms=NOW - 90_000)],
     held=[{"form": "json", "usage": None}, {"form": "sse", "usage": USAGE}])
case("serve_beats_budget_exhausted", "SERVE comes before the budget rules: spend has reached the ceiling but the answer is held with usage → SERVE (nothing is bought); budget_nearly_gone.",
     SERVE_REQ, dict(verdict="SERVE"), history=[prev], held=[{"form": "json", "usage": USAGE}],
     budget={"ceiling_nano": 1_000_000_000, "spend_nano": 1_000_000_000, "reserved_nano": 0})
case("runaway_beats_serve", "The runaway rules come before SERVE: 8th identical request with a servable answer held → BLOCK runaway_loop; worst_case_tokens_avoided 0 because an answer was held.",
     SERVE_REQ, dict(verdict="BLOCK", rule="runaway_loop"), history=[ident(7)], held=[{"form": "json", "usage": USAGE}])

# ------------------------------------------------------------------ F. approved holds
case("approved_hold_skips_score_band", "The unattended_crosses_block request retried with an approved hold: the score band is skipped → ALLOW (score and signals still reported).",
     V_REQ, dict(verdict="ALLOW"), history=v_hist, budget=V_BUDGET, human_header=None, approved_hold=True)
case("approved_hold_skips_exceeds_remaining", "exceeds_remaining_unattended_block retried with an approved hold: exceeds_remaining_budget (and the band) skipped; score 0.35 > 0.30 so not downgraded: ALLOW.",
     BUD_REQ, dict(verdict="ALLOW"), history=[seen_gpt4o], human_header="0", approved_hold=True,
     budget={"ceiling_nano": 5_000_000_000, "spend_nano": 5_000_000_000 - C - 1_000_000 + 1, "reserved_nano": 1_000_000})
case("approved_hold_not_budget_exhausted", "An approved hold never skips budget_exhausted: spend at the ceiling → BLOCK budget_exhausted.",
     BUD_REQ, dict(verdict="BLOCK", rule="budget_exhausted"), history=[seen_gpt4o], approved_hold=True,
     budget={"ceiling_nano": 5_000_000_000, "spend_nano": 5_000_000_001, "reserved_nano": 0})
case("approved_hold_not_runaway", "An approved hold never skips the runaway rules: 4th identical with no human → BLOCK runaway_loop_unattended.",
     LOOP_REQ, dict(verdict="BLOCK", rule="runaway_loop_unattended"), history=[ident(3)], human_header="0", approved_hold=True)

# ------------------------------------------------------------------ G. windows and the clock
W_REQ = oa([u("Reconcile the March invoices against the ledger.")], max_tokens=1500, temperature=0)
case("clock_jump_forgets_old_history", "The clock jumped a day ahead: seven identical requests exactly 24 h old and 100 others 25 h old count in no window (loop, burst, grind 0; novelty 1; fingerprint not seen).",
     W_REQ, dict(verdict="ALLOW"),
     history=[dict(label="100 other requests 25 h ago", body=OTHER_OA, at_ms=NOW - 90_000_000, repeat=100, step_ms=1_000), ident(7, first_age=86_400_000 + 6 * 1_000, step=1_000)])
edges = lambda d: [
    dict(label=f"the same request {120_000 - d} ms ago", body="$request", at_ms=NOW - 120_000 + d),
    dict(label=f"another request {60_000 - d} ms ago", body=OTHER_OA2, at_ms=NOW - 60_000 + d),
    dict(label=f"another request {3_600_000 - d} ms ago", body=OTHER_OA, at_ms=NOW - 3_600_000 + d),
    dict(label=f"another model {86_400_000 - d} ms ago", body=OTHER_AN, route="anthropic_messages", at_ms=NOW - 86_400_000 + d),
]
case("window_edges_exactly_outside", "Half-open windows: the identical request exactly 120 s old is not in the loop window, a request exactly 60 s old not in the burst window, one exactly 1 h old not in the grind window.",
     W_REQ, dict(verdict="ALLOW"), history=edges(0))
case("window_edges_just_inside", "The same history 1 ms younger: each entry is inside its window (loop 1, burst 1, grind 3).",
     W_REQ, dict(verdict="ALLOW"), history=edges(1))
case("novelty_edge_24h_outside", "The key used this model (and this fingerprint) exactly 24 h ago only: outside the 24 h windows → novelty 1, no repeat finding.",
     W_REQ, dict(verdict="ALLOW"), history=[dict(label="the same request 24 h ago", body="$request", at_ms=NOW - 86_400_000)])
case("novelty_edge_24h_inside", "The same request 1 ms under 24 h ago: model seen (novelty 0), fingerprint seen → repeating_without_recording (reproducible, nothing held).",
     W_REQ, dict(verdict="ALLOW"), history=[dict(label="the same request 86 399 999 ms ago", body="$request", at_ms=NOW - 86_399_999)])
case("other_key_history_ignored", "Seven identical bodies sent by another key in the last minute count nothing for this key (windows and fingerprints are per key).",
     W_REQ, dict(verdict="ALLOW"),
     history=[dict(label="7 identical bodies from k-bravo", key=KB, body="$request", at_ms=NOW - 30_000, repeat=7, step_ms=1_000)])
case("model_switch_is_novel", "The key has used claude-haiku-4-5 in the last hour; this request switches to claude-sonnet-4-5: novelty 1 (other model's requests still count in burst and grind).",
     an([u("Summarise the incident timeline.")], max_tokens=900), dict(verdict="DOWNGRADE"), route="anthropic_messages",
     history=[dict(label="12 haiku requests 10-65 min ago", body=OTHER_AN, at_ms=NOW - 3_900_000, repeat=12, step_ms=300_000), dict(label="3 haiku requests in the last minute", body=OTHER_AN, at_ms=NOW - 30_000, repeat=3, step_ms=10_000)])

# ------------------------------------------------------------------ H. findings
def convo(n, size, tag):
    return [(u if i % 2 == 0 else a)(filler(size + i, f"{tag}{i}")) for i in range(n)]
case("carrying_old_turns_13", "13 turns (> 12): carrying_old_turns with the oldest turn as its figure.",
     oa(convo(13, 100, "c"), max_tokens=1200), dict(verdict="ALLOW"), history=[seen_gpt4o])
dupmsgs = convo(10, 60, "d")
dupmsgs = dupmsgs[:4] + [u("Please retry the last step."), a("Retrying now.")] + dupmsgs[4:8] + [u("Please retry the last step."), a("Retrying now.")]
case("twelve_turns_with_duplicates", "Exactly 12 turns: no carrying_old_turns; two messages repeated verbatim: duplicate_turns_in_context with the repeats as its figure.",
     oa(dupmsgs, max_tokens=1200), dict(verdict="ALLOW"), history=[seen_gpt4o])
SEARCH_TOOL = {"type": "function", "function": {"name": "search_docs", "description": "Full-text search over the handbook", "parameters": {"type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}}, "required": ["query"]}}}
EMAIL_TOOL = {"type": "function", "function": {"name": "send_email", "description": "Send an email", "parameters": {"type": "object", "properties": {"to": {"type": "string"}, "body": {"type": "string"}}, "required": ["to", "body"]}}}
tool_hist = [
    u("What's the weather in Lisbon?"),
    {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Lisbon\"}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp_c\":21,\"sky\":\"clear\"}"},
    a("It is 21 °C and clear in Lisbon."),
    u("And in Porto?"),
]
case("unused_tool_definitions_openai", "Four turns of history called get_weather only; search_docs and send_email were never called: unused_tool_definitions with those two definitions as its figure. Also tool_calls arguments and a tool result count as characters.",
     oa(tool_hist, tools=[WEATHER_TOOL, SEARCH_TOOL, EMAIL_TOOL], max_tokens=300), dict(verdict="ALLOW"), history=[seen_gpt4o])
case("unused_tools_needs_four_history_turns", "Only three turns of history before the newest: unused_tool_definitions does not apply.",
     oa(tool_hist[:4], tools=[WEATHER_TOOL, SEARCH_TOOL, EMAIL_TOOL], max_tokens=300), dict(verdict="ALLOW"), history=[seen_gpt4o])
BIG_SYS = filler(4000, "policy")
case("anthropic_large_system_resent", "Anthropic, a 4000-character system prompt (the threshold) re-sent with an assistant turn and no cache_control: large_system_prompt_resent (figure 1000).",
     an([u("Check clause 4."), a("Clause 4 is fine."), u("Now clause 5.")], system=BIG_SYS, max_tokens=4095, temperature=0),
     dict(verdict="ALLOW"), route="anthropic_messages", history=[dict(label="earlier sonnet request", body=an([u("Check clause 4.")], system=BIG_SYS, max_tokens=512), route="anthropic_messages", at_ms=NOW - 200_000)])
case("anthropic_system_3999_not_large", "The same with a 3999-character system prompt: below the threshold, no finding.",
     an([u("Check clause 4."), a("Clause 4 is fine."), u("Now clause 5.")], system=BIG_SYS[:3999], max_tokens=4095, temperature=0),
     dict(verdict="ALLOW"), route="anthropic_messages", history=[dict(label="earlier sonnet request", body=an([u("Check clause 4.")], system=BIG_SYS, max_tokens=512), route="anthropic_messages", at_ms=NOW - 200_000)])
AN_TOOLS = [
    {"name": "read_file", "description": "Read a file from the repository", "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}},
    {"name": "run_tests", "description": "Run the test suite", "input_schema": {"type": "object", "properties": {}}},
]
an_cached = an([
    {"role": "user", "content": [{"type": "text", "text": "Why does the build fail?"}, {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]},
    {"role": "assistant", "content": [{"type": "text", "text": "Let me read the config."}, {"type": "tool_use", "id": "toolu_01", "name": "read_file", "input": {"path": "Cargo.toml"}}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01", "content": "[package]\nname = \"demo\""}]},
    {"role": "assistant", "content": "The manifest names the package “demo” — fine."},
    {"role": "user", "content": [{"type": "text", "text": "Then check the lockfile 🔒 please.", "cache_control": {"type": "ephemeral"}}]},
], system=[{"type": "text", "text": BIG_SYS[:3000]}, {"type": "text", "text": filler(1500, "house"), "cache_control": {"type": "ephemeral"}}], tools=AN_TOOLS, max_tokens=2048)
case("anthropic_cached_system_tools_image", "Anthropic with system blocks (4500 chars) carrying cache_control, a tool_use/tool_result exchange, an image block (0 chars), non-ASCII text: no large_system_prompt_resent (cache_marked); run_tests never called in 4 history turns → unused_tool_definitions.",
     an_cached, dict(verdict="ALLOW"), route="anthropic_messages", history=[dict(label="earlier sonnet request", body=an([u("hi")], max_tokens=10), route="anthropic_messages", at_ms=NOW - 1_000_000)])
case("openai_large_system_not_flagged", "OpenAI with a 5000-character system prompt and an assistant turn: OpenAI caches prompts automatically, so no large_system_prompt_resent; developer message counts as system.",
     oa([{"role": "developer", "content": filler(5000, "dev")}, u("Lint this."), a("Done."), u("Again with strict mode.")], max_tokens=4096),
     dict(verdict="ALLOW"), history=[seen_gpt4o])
NG_REQ = oa([u("Draft the weekly report.")], max_tokens=400)
case("budget_nearly_gone_at_90_percent", "spend + reserved exactly 90 % of the ceiling (read before this call): budget_nearly_gone.",
     NG_REQ, dict(verdict="DOWNGRADE"), history=[seen_gpt4o], budget={"ceiling_nano": 1_000_000_000, "spend_nano": 800_000_000, "reserved_nano": 100_000_000})
case("budget_nearly_gone_just_below", "spend + reserved one nano-USD below 90 %: no budget_nearly_gone.",
     NG_REQ, dict(verdict="DOWNGRADE"), history=[seen_gpt4o], budget={"ceiling_nano": 1_000_000_000, "spend_nano": 800_000_000, "reserved_nano": 99_999_999})

# ------------------------------------------------------------------ I. OpenAI shapes
N_REQ = oa([u("Suggest a name for a cat.")], max_tokens=500, temperature=0, n=3)
case("openai_n3_worst_case_and_no_reuse", "n = 3: the output worst case is max_tokens × 3; n > 1 is not reproducible, so the repeat is varied_output_blocks_reuse even at temperature 0 with an answer held.",
     N_REQ, dict(verdict="DOWNGRADE"), history=[dict(label="the same request 5 min ago", body="$request", at_ms=NOW - 300_000)],
     held=[{"form": "json", "usage": USAGE}], budget={"ceiling_nano": 100_000_000, "spend_nano": 10_000_000, "reserved_nano": 0})
oa_rich = oa([
    sysm("You describe images."),
    {"role": "user", "content": [{"type": "text", "text": "What is in this picture?"}, {"type": "image_url", "image_url": {"url": "https://example.com/cat.png", "detail": "low"}}]},
    {"role": "assistant", "content": "A cat on a windowsill — très mignon."},
    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}, {"type": "text", "text": "And this one? 🐈"}]},
], max_completion_tokens=4096, temperature=1)
case("openai_array_content_images", "OpenAI array content: text parts count, image parts count 0 characters but still make turns; max_completion_tokens is the ceiling (4096 → output_ceiling_authorised); non-ASCII counted as scalar values.",
     oa_rich, dict(verdict="ALLOW"), history=[seen_gpt4o], key=KH, human_header=None)
case("human_header_zero_overrides_default", "Key default is human, but x-tokensaver-human: 0 declares none: unattended 1.",
     oa_rich, dict(verdict="ALLOW"), history=[seen_gpt4o], key=KH, human_header="0")

# ------------------------------------------------------------------ J. more edges
EDGE_REQ = oa([u("Tag this photo caption: sunset over the harbour.")], model="gpt-4o-mini", max_tokens=40)
case("score_at_challenge_band_after_rounding", "Weights overridden: 0.47×burst + 0.08×novelty sums to 0.5499999999999999 in binary floating point; rounded to 9 decimals it is 0.55 ≥ 0.55 → CHALLENGE by the band.",
     EDGE_REQ, dict(verdict="CHALLENGE", band="score_challenge"), history=[burst20],
     policy={"gate": {"weights": dict(ZERO_W, burst=0.47, novelty=0.08)}})
case("score_just_below_challenge_band", "0.47×burst + 0.0799×novelty = 0.5499 < 0.55: no band; above 0.30 so no downgrade → ALLOW.",
     EDGE_REQ, dict(verdict="ALLOW"), history=[burst20],
     policy={"gate": {"weights": dict(ZERO_W, burst=0.47, novelty=0.0799)}})
case("score_at_block_band_after_rounding", "0.72×burst + 0.08×novelty sums to 0.7999999999999999; rounded to 9 decimals it is 0.80 ≥ 0.80 → BLOCK by the band (HTTP 403).",
     EDGE_REQ, dict(verdict="BLOCK", band="score_block"), history=[burst20],
     policy={"gate": {"weights": dict(ZERO_W, burst=0.72, novelty=0.08)}})
case("zero_ceiling_is_exhausted", "A key whose ceiling is 0 with no spend: spend 0 has reached the ceiling 0 → BLOCK budget_exhausted; exposure 1 (nothing left); budget_nearly_gone.",
     NG_REQ, dict(verdict="BLOCK", rule="budget_exhausted"), history=[seen_gpt4o],
     budget={"ceiling_nano": 0, "spend_nano": 0, "reserved_nano": 0})
case("reservations_overshoot_the_ceiling", "spend below the ceiling but spend + reserved above it: not exhausted; budget left is negative → exposure 1, exceeds_remaining_budget; human → CHALLENGE.",
     NG_REQ, dict(verdict="CHALLENGE", rule="exceeds_remaining_budget"), history=[seen_gpt4o],
     budget={"ceiling_nano": 1_000_000_000, "spend_nano": 500_000_000, "reserved_nano": 600_000_000})
case("same_text_different_roles_not_duplicate", "A user and an assistant message with the same text are not identical messages (role differs): no duplicate_turns_in_context.",
     oa([u("OK"), a("OK"), u("Continue.")], max_tokens=100), dict(verdict="DOWNGRADE"), history=[seen_gpt4o])
case("anthropic_large_system_first_call", "A 5000-character Anthropic system prompt on a first call (no assistant turn): nothing re-sent yet, no large_system_prompt_resent.",
     an([u("Review clause 1.")], system=filler(5000, "terms"), max_tokens=1000), dict(verdict="ALLOW"), route="anthropic_messages",
     history=[dict(label="earlier sonnet request", body=an([u("hi")], max_tokens=10), route="anthropic_messages", at_ms=NOW - 50_000)])
case("anthropic_cache_control_on_a_tool", "A large system prompt (string, no cache_control on it) re-sent, but a tool definition carries cache_control: cache_marked (anywhere in the request), so no large_system_prompt_resent.",
     an([u("Check clause 4."), a("Clause 4 is fine."), u("Now clause 5.")], system=BIG_SYS,
        tools=[dict(AN_TOOLS[0], cache_control={"type": "ephemeral"})], max_tokens=600), dict(verdict="ALLOW"), route="anthropic_messages",
     history=[dict(label="earlier sonnet request", body=an([u("hi")], max_tokens=10), route="anthropic_messages", at_ms=NOW - 50_000)])
an_tool_blocks = an([
    {"role": "user", "content": "List the failing tests."},
    {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_a", "name": "run_tests", "input": {}}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_a", "content": [{"type": "text", "text": "2 failed: parse_dates, parse_money"}, {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}]},
    {"role": "assistant", "content": [{"type": "text", "text": "Two tests fail."}, {"type": "tool_use", "id": "toolu_b", "name": "read_file", "input": {"path": "src/parse.rs", "lines": [10, 40]}}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_b", "content": "fn parse_dates() {}"}]},
], tools=AN_TOOLS, max_tokens=1000, temperature=0)
case("anthropic_all_tools_called", "Anthropic tool_use/tool_result history calling both defined tools: no unused_tool_definitions; tool_use inputs count as compact JSON, a tool_result's text blocks count and its image counts 0.",
     an_tool_blocks, dict(verdict="ALLOW"), route="anthropic_messages", key=KH, human_header=None,
     history=[dict(label="the same request 10 min ago, sampled differently", body="$request", merge={"temperature": 0.5}, at_ms=NOW - 600_000, route="anthropic_messages")])
