"""Codex CLI (`codex exec`, Responses API) through the gate, against the built-in provider."""

import pytest

from conftest import assert_polled_job_completed, CODEX_MODEL, HOLD_ID, assert_paced, assert_run_stopped, loop_rules, score_verdicts


def test_codex_default_model_gets_an_answer(gate):
    run = gate.codex("agent", "Say hello.", gate.tmp / "codex", model=CODEX_MODEL)
    assert run.code == 0, run.output
    calls = gate.provider_calls()
    assert len(calls) == 1 and calls[0]["path"] == "/v1/responses"
    assert run.stdout.strip(), run.output
    gate.assert_ledger_matches_provider("agent")


def test_a_tool_using_session_is_allowed_and_its_usage_recorded(gate):
    run = gate.codex("agent", "Run the checks. tokensaver-mock:steps=2", gate.tmp / "codex")
    assert run.code == 0, run.output
    assert "tokensaver-done after 2 steps" in run.stdout
    calls = gate.provider_calls()
    assert len(calls) == 3
    assert all(c["path"] == "/v1/responses" for c in calls)
    assert gate.verdicts() == {("ALLOW", "allowed"): 3}
    gate.assert_ledger_matches_provider("agent")


def test_a_session_that_makes_progress_is_not_stopped(gate):
    run = gate.codex("agent", "Build it. tokensaver-mock:steps=9", gate.tmp / "codex")
    assert run.code == 0, run.output
    assert "tokensaver-done after 9 steps" in run.stdout
    assert len(gate.provider_calls()) == 10
    assert gate.verdicts() == {("ALLOW", "allowed"): 10}


def test_a_runaway_is_paced_then_stopped_by_a_runaway_rule_not_the_score(gate):
    # Codex wraps every command's output in a random "Chunk ID" and a "Wall time"; the step
    # normaliser (SPEC §2.1) takes them out, so its stuck `echo` is one repeated step: paced
    # at 3 per window (unattended), then slower, stopped by the run's bound. Codex gives up on
    # 429.
    run = gate.codex("agent", "Wait for the job. tokensaver-mock:loop", gate.tmp / "codex")
    assert run.code != 0
    assert "429" in run.output, run.output
    calls = gate.provider_calls()
    assert_run_stopped(calls)
    assert_paced(calls[1:], 3)
    assert loop_rules(gate.verdicts()) == {"runaway_step": 1}
    assert not score_verdicts(gate.verdicts())
    gate.assert_ledger_matches_provider("agent")


def test_a_runaway_whose_tool_prints_a_clock_is_stopped_too(gate):
    run = gate.codex("agent", "Wait. tokensaver-mock:clockloop", gate.tmp / "codex")
    assert run.code != 0
    calls = gate.provider_calls()
    assert_run_stopped(calls)
    assert_paced(calls[1:], 3)
    assert loop_rules(gate.verdicts()) == {"runaway_step": 1}
    assert not score_verdicts(gate.verdicts())


@pytest.mark.parametrize("key", ["agent", "attended"])
def test_a_job_polled_past_the_loop_limit_completes(gate, key):
    run = gate.codex(key, "Wait for the job. tokensaver-mock:poll=4", gate.tmp / "codex")
    assert_polled_job_completed(gate, run, key)


def test_a_hold_is_released_by_a_person_and_the_rerun_passes(gate):
    home = gate.tmp / "codex"
    held = gate.codex("tight", "Say hello.", home, model=CODEX_MODEL)
    assert held.code != 0
    assert "409" in held.output and "tokensaver holds approve" in held.output, held.output
    hold_id = HOLD_ID.search(held.output).group(0)
    # Codex re-sends a refused request five times, whatever x-should-retry says: each re-send
    # of a pending hold gets the same hold and is not counted again.
    assert set(HOLD_ID.findall(held.output)) == {hold_id}
    assert gate.verdicts() == {("CHALLENGE", "exceeds_remaining_budget"): 1}
    assert gate.provider_calls() == []

    gate.cli("holds", "approve", hold_id)
    # A new session of the same prompt: its session ids (prompt_cache_key, client_metadata,
    # input item ids) are not part of the request's identity, so the approval releases it.
    rerun = gate.codex("tight", "Say hello.", home, model=CODEX_MODEL)
    assert rerun.code == 0, rerun.output
    assert len(gate.provider_calls()) == 1
    gate.assert_ledger_matches_provider("tight")
