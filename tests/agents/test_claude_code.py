"""Claude Code (`claude -p`) through the gate, against the built-in provider."""

import pytest

from conftest import assert_polled_job_completed, HOLD_ID, assert_paced, assert_run_stopped, loop_rules, score_verdicts


def test_a_tool_using_session_is_allowed_and_its_usage_recorded(gate):
    run = gate.claude("agent", "Run the checks. tokensaver-mock:steps=2", gate.tmp / "home")
    assert run.code == 0, run.output
    assert "tokensaver-done after 2 steps" in run.stdout
    calls = gate.provider_calls()
    # The first call, then one per tool result the client ran and sent back.
    assert len(calls) == 3
    assert all(c["path"] == "/v1/messages" and "beta=true" in c["target"] for c in calls)
    assert gate.verdicts() == {("ALLOW", "allowed"): 3}
    gate.assert_ledger_matches_provider("agent")


def test_a_runaway_is_paced_then_stopped_and_shown_not_retried(gate):
    run = gate.claude("agent", "Wait for the job. tokensaver-mock:loop", gate.tmp / "home", 30)
    assert run.code != 0
    # The first call, then identical steps, at most 3 per pace window (unattended), then
    # growing gaps until the run's bound refuses one. After a hold Claude Code appends a system
    # turn ("The user hasn't heard from you in a while"): not progress, the same step.
    calls = gate.provider_calls()
    assert_run_stopped(calls)
    assert loop_rules(gate.verdicts()) == {"runaway_step": 1}
    assert not score_verdicts(gate.verdicts())
    assert "429" in run.stdout and "runaway" in run.stdout, run.output
    gate.assert_ledger_matches_provider("agent")


def test_a_runaway_whose_tool_prints_a_clock_is_stopped_too(gate):
    # `date` in every result: the normaliser reads the clock as its kind, one repeated step.
    run = gate.claude("agent", "Wait. tokensaver-mock:clockloop", gate.tmp / "home", 30)
    assert run.code != 0
    assert_run_stopped(gate.provider_calls())
    assert loop_rules(gate.verdicts()) == {"runaway_step": 1}
    assert not score_verdicts(gate.verdicts())


def test_an_attended_runaway_is_stopped_by_runaway_step(gate):
    run = gate.claude("attended", "Wait for the job. tokensaver-mock:loop", gate.tmp / "home", 30)
    assert run.code != 0
    assert_run_stopped(gate.provider_calls(), attended=True)
    assert loop_rules(gate.verdicts()) == {"runaway_step": 1}
    assert not score_verdicts(gate.verdicts())
    assert "429" in run.stdout, run.output


@pytest.mark.parametrize("key", ["agent", "attended"])
def test_a_job_polled_past_the_loop_limit_completes(gate, key):
    run = gate.claude(key, "Wait for the job. tokensaver-mock:poll=4", gate.tmp / "home", 30)
    assert_polled_job_completed(gate, run, key)


def test_a_session_that_makes_progress_is_not_stopped(gate):
    run = gate.claude("agent", "Build it. tokensaver-mock:steps=9", gate.tmp / "home", 30)
    assert run.code == 0, run.output
    assert "tokensaver-done after 9 steps" in run.stdout
    assert len(gate.provider_calls()) == 10
    assert not loop_rules(gate.verdicts())
    assert gate.verdicts() == {("ALLOW", "allowed"): 10}


def test_a_hold_is_released_by_a_person_and_the_rerun_passes(gate):
    home = gate.tmp / "home"
    held = gate.claude("tight", "Say hello.", home)
    assert held.code != 0
    assert "409" in held.stdout and "tokensaver holds approve" in held.stdout, held.output
    hold_id = HOLD_ID.search(held.stdout).group(0)
    assert hold_id in gate.holds("tight")
    assert gate.provider_calls() == []

    gate.cli("holds", "approve", hold_id)
    # A new session of the same prompt: same request (the session id in metadata is not
    # part of its identity), so the approval releases it without any header.
    rerun = gate.claude("tight", "Say hello.", home)
    assert rerun.code == 0, rerun.output
    assert len(gate.provider_calls()) == 1
    assert gate.provider_calls()[0]["path"] == "/v1/messages"
    gate.assert_ledger_matches_provider("tight")

    # Once: the same prompt again is held afresh.
    again = gate.claude("tight", "Say hello.", home)
    assert again.code != 0 and "409" in again.stdout
    assert HOLD_ID.search(again.stdout).group(0) != hold_id


def test_an_unpriced_model_is_refused_by_name_with_the_fix(gate):
    run = gate.claude("agent", "Say hi.", gate.tmp / "home", model="claude-unpriced-9")
    assert run.code != 0
    assert "402" in run.stdout, run.output
    assert "claude-unpriced-9 has no price" in run.stdout and "[prices." in run.stdout, run.output
    assert gate.provider_calls() == []
