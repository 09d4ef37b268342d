"""Prompt caching placed by the gate (issue 25), on a real client: a caching-naive tool-use loop
written on the official `anthropic` SDK (`anthropic_agent.py`), and Claude Code, which marks its
own breakpoints. Both run straight to the built-in provider and through the gate; the cost of
each run is the provider-reported usage of its calls at Anthropic's list prices for Claude
Sonnet 4.5 (below), summed here: nothing reads the gate's own figures to decide it saved.
"""

from __future__ import annotations

import json

import clients
from conftest import CLAUDE_MODEL, PROVIDER_CREDENTIAL

# Anthropic's published prices for Claude Sonnet 4.5, nano-USD per token: $3 input, $3.75 a
# 5-minute cache write, $0.30 a cache read, $15 output per million tokens.
INPUT, WRITE_5M, READ, OUTPUT = 3_000, 3_750, 300, 15_000
STEPS = 20


def usages(run) -> list[dict]:
    return [json.loads(line)["usage"] for line in run.stdout.splitlines() if '"usage"' in line]


def cost_nano(u: dict) -> int:
    return (u["input_tokens"] * INPUT + u["cache_creation_input_tokens"] * WRITE_5M
            + u["cache_read_input_tokens"] * READ + u["output_tokens"] * OUTPUT)


def provider_cost_nano(reported: dict) -> int:
    """The cost of a call as the built-in provider reported it (`/__mock/requests`), 1-hour
    writes at their own price ($6 per million)."""
    one_hour = reported.get("cache_creation", {}).get("ephemeral_1h_input_tokens", 0)
    return (reported["input_tokens"] * INPUT
            + (reported["cache_creation_input_tokens"] - one_hour) * WRITE_5M + one_hour * 6_000
            + reported["cache_read_input_tokens"] * READ
            + reported["completion_tokens"] * OUTPUT)


def cache_saving_nano(u: dict) -> int:
    """What the cached tokens would have cost uncached minus what they did (SPEC §2.11b)."""
    return (u["cache_read_input_tokens"] * (INPUT - READ)
            - u["cache_creation_input_tokens"] * (WRITE_5M - INPUT))


def test_a_caching_naive_sdk_loop_costs_at_least_half_less_through_the_gate(gate):
    prompt = f"Fix the failing tests. tokensaver-mock:steps={STEPS - 1}"
    straight = gate.anthropic_agent(None, prompt)
    assert straight.code == 0, straight.output
    before = len(gate.provider_calls())
    through = gate.anthropic_agent("agent", prompt)
    assert through.code == 0, through.output
    direct, gated = usages(straight), usages(through)
    assert len(direct) == len(gated) == STEPS
    assert f"tokensaver-done after {STEPS - 1} steps" in through.stdout
    assert all(u["cache_creation_input_tokens"] == u["cache_read_input_tokens"] == 0
               for u in direct), "an unmarked call is never cached"
    assert gated[0]["cache_creation_input_tokens"] == 0, "a first call pays no write premium"
    assert all(u["cache_read_input_tokens"] > 0 for u in gated[2:]), gated
    direct_nano = sum(map(cost_nano, direct))
    gated_nano = sum(map(cost_nano, gated))
    cut = 1 - gated_nano / direct_nano
    saving = sum(map(cache_saving_nano, gated))
    print(f"anthropic SDK naive {STEPS}-step loop: straight ${direct_nano / 1e9:.4f}, through "
          f"the gate ${gated_nano / 1e9:.4f}: {cut * 100:.1f} % less; cache saving "
          f"${saving / 1e9:.4f}")
    assert cut >= 0.5, f"only {cut * 100:.1f} % less"
    # The gate's ledger: the provider's parts exactly, and the saving derived from them, apart.
    gate.assert_ledger_matches_provider("agent", since=before)
    total = gate.ledger("agent")["total"]
    assert total["cache_saving"] == saving, total
    assert total["tokens_not_bought"] == 0


def test_a_one_off_sdk_call_costs_exactly_the_same(gate):
    prompt = "Say what the rules are."
    straight = gate.anthropic_agent(None, prompt)
    through = gate.anthropic_agent("agent", prompt)
    assert straight.code == 0 and through.code == 0, straight.output + through.output
    assert usages(through) == usages(straight)
    assert usages(through)[0]["cache_creation_input_tokens"] == 0
    assert gate.ledger("agent")["total"]["cache_saving"] == 0


def test_claude_code_marks_its_own_and_costs_the_same(gate, tmp_path):
    prompt = "Run the checks. tokensaver-mock:steps=3"
    base = f"http://127.0.0.1:{gate.mock_port}"
    straight = clients.claude(base, PROVIDER_CREDENTIAL, prompt, tmp_path / "home-straight",
                              gate.work, CLAUDE_MODEL)
    assert straight.code == 0, straight.output
    direct = [c for c in gate.provider_calls() if c["path"] == "/v1/messages"]
    through = gate.claude("agent", prompt, tmp_path / "home-gated")
    assert through.code == 0, through.output
    gated = [c for c in gate.provider_calls() if c["path"] == "/v1/messages"][len(direct):]
    assert direct and gated
    # Claude Code marks its own breakpoints: the provider cached for it both ways.
    assert any(c["reported_usage"]["cache_read_input_tokens"] > 0 for c in direct)
    d = sum(provider_cost_nano(c["reported_usage"]) for c in direct)
    g = sum(provider_cost_nano(c["reported_usage"]) for c in gated)
    print(f"Claude Code: straight ${d / 1e9:.6f} ({len(direct)} calls), through the gate "
          f"${g / 1e9:.6f} ({len(gated)} calls): {(g / d - 1) * 100:+.2f} %")
    assert abs(g / d - 1) <= 0.02, (d, g)
    # The gate placed nothing for a client that marks its own.
    assert gate.ledger("agent")["total"]["cache_saving"] == 0
