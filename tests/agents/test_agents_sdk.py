"""The OpenAI Agents SDK (openai-agents) through the gate, on the Responses API (its default)
and on chat completions, against the built-in provider."""

import pytest

from conftest import assert_polled_job_completed, assert_paced, assert_run_stopped, loop_rules, score_verdicts

APIS = ["responses", "chat"]
PATHS = {"responses": "/v1/responses", "chat": "/v1/chat/completions"}


@pytest.mark.parametrize("api", APIS)
def test_a_tool_using_run_is_allowed_and_its_usage_recorded(gate, api):
    run = gate.sdk("agent", api, "Run the checks. tokensaver-mock:steps=2")
    assert run.code == 0, run.output
    assert "tokensaver-done after 2 steps" in run.stdout
    calls = gate.provider_calls()
    assert [c["path"] for c in calls] == [PATHS[api]] * 3
    assert gate.verdicts() == {("ALLOW", "allowed"): 3}
    gate.assert_ledger_matches_provider("agent")


@pytest.mark.parametrize("api", APIS)
def test_a_rerun_at_temperature_zero_is_served_and_accepted(gate, api):
    prompt = "Run the checks. tokensaver-mock:steps=2"
    first = gate.sdk("agent", api, prompt, "--temperature", "0")
    assert first.code == 0, first.output
    rerun = gate.sdk("agent", api, prompt, "--temperature", "0")
    assert rerun.code == 0, rerun.output
    # The same answers, in the SDK's own wire form, from the store: the provider saw the
    # first run only, and the SDK ran the same tools on the served tool calls.
    assert rerun.stdout == first.stdout
    assert len(gate.provider_calls()) == 3
    assert gate.verdicts() == {("ALLOW", "allowed"): 3, ("SERVE", "answer_held"): 3}
    gate.assert_ledger_matches_provider("agent")


def test_a_rerun_of_a_polling_session_is_served_to_the_end(gate):
    # A SERVE buys nothing and is no step: the rerun's polls are not a loop (issue 24).
    prompt = "Wait for the job. tokensaver-mock:poll=4"
    first = gate.sdk("agent", "chat", prompt, "--temperature", "0")
    assert first.code == 0, first.output
    rerun = gate.sdk("agent", "chat", prompt, "--temperature", "0")
    assert rerun.code == 0, rerun.output
    assert rerun.stdout == first.stdout
    assert len(gate.provider_calls()) == 5
    verdicts = gate.verdicts()
    assert verdicts[("SERVE", "answer_held")] == 5, verdicts
    assert not loop_rules(verdicts) and not score_verdicts(verdicts)


@pytest.mark.parametrize("api", APIS)
def test_a_runaway_is_paced_then_stopped_and_shown_not_retried(gate, api):
    run = gate.sdk("agent", api, "Wait for the job. tokensaver-mock:loop", "--max-turns", "40")
    assert run.code == 1
    assert run.stdout.startswith("RateLimitError"), run.output
    assert "runaway" in run.stdout
    calls = gate.provider_calls()
    assert_run_stopped(calls)
    assert_paced(calls[1:], 3)
    assert loop_rules(gate.verdicts()) == {"runaway_step": 1}
    assert not score_verdicts(gate.verdicts())


def test_a_runaway_whose_tool_prints_a_clock_is_stopped_too(gate):
    run = gate.sdk("agent", "responses", "Wait. tokensaver-mock:clockloop", "--max-turns", "40")
    assert run.code == 1, run.output
    calls = gate.provider_calls()
    assert_run_stopped(calls)
    assert_paced(calls[1:], 3)
    assert loop_rules(gate.verdicts()) == {"runaway_step": 1}
    assert not score_verdicts(gate.verdicts())


def test_an_attended_runaway_is_stopped_by_runaway_step(gate):
    run = gate.sdk("attended", "responses", "Wait. tokensaver-mock:loop", "--max-turns", "40")
    assert run.code == 1, run.output
    assert_run_stopped(gate.provider_calls(), attended=True)
    assert loop_rules(gate.verdicts()) == {"runaway_step": 1}


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("key", ["agent", "attended"])
def test_a_job_polled_past_the_loop_limit_completes(gate, api, key):
    run = gate.sdk(key, api, "Wait for the job. tokensaver-mock:poll=4", "--max-turns", "12")
    assert_polled_job_completed(gate, run, key)


@pytest.mark.parametrize("api", APIS)
def test_a_run_that_makes_progress_is_not_stopped(gate, api):
    run = gate.sdk("agent", api, "Build it. tokensaver-mock:steps=9", "--max-turns", "12")
    assert run.code == 0, run.output
    assert "tokensaver-done after 9 steps" in run.stdout
    assert len(gate.provider_calls()) == 10
    assert gate.verdicts() == {("ALLOW", "allowed"): 10}
