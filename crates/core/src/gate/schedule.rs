//! The schedule of repeated steps (SPEC §2.3; issue "fair over hours"): waits that grow, spend
//! that does not.
//!
//! A *run* is a key's consecutive decided steps with one step fingerprint (SERVEs excepted: a
//! SERVE buys nothing). It ends when the session that sent it makes another step (progress;
//! one other result of the same call between two of its steps is not: `SessionSteps`), or
//! when the step comes back after a silence of `max_hold_secs` or more (a patient caller the
//! schedule never needed to hold). Within a run:
//!
//! 1. **The window.** At most 3 unattended / 7 attended identical steps are decided in any
//!    `pace_window_secs` (the loop rules' 120 s), as before the schedule: a step past them waits
//!    until the window admits it.
//! 2. **The growing gap.** Past those first ones, the run's next step waits after the one
//!    before for a gap that doubles at each step: a quarter of `max_hold_secs` (60 s), half
//!    (120 s), then `max_hold_secs` (240 s) from there on. So a stuck agent's calls fall to one
//!    per `max_hold_secs` — 15 an hour — within its first ten minutes, and a poll every 10–30 s
//!    of a job of an hour reaches the provider about 18 times.
//! 3. **The bound.** A run that has gone on for `runaway_after_secs` (90 minutes) is stopped:
//!    BLOCK `runaway_step`. A stuck agent buys at most about 27 calls in all, unattended; a poll
//!    of a job shorter than the bound completes.
//!
//! Each single wait is at most `max_hold_secs`, below what the clients tolerate before they
//! give up (the tightest measured: 300 s). Everything here is a pure function of the run, the
//! window's times and the clock.

use super::rules::{STEP_PACE_ATTENDED, STEP_PACE_UNATTENDED};
use super::windows::{Run, WindowCounts};
use super::StepLimits;

/// How many identical steps the window admits.
pub fn admits(human: bool) -> u64 {
    if human {
        STEP_PACE_ATTENDED
    } else {
        STEP_PACE_UNATTENDED
    }
}

/// The gap the run's next step waits after its latest one, when the run already has `steps`:
/// none within the window's first admitted steps, then a quarter of `max_hold`, half of it,
/// and `max_hold` from there on (60 s, 120 s, 240 s by default). Whole fractions of the hold,
/// so a time-compressed gate (every window divided alike) schedules exactly alike.
pub fn gap_ms(limits: &StepLimits, steps: u64, human: bool) -> u64 {
    let admits = admits(human);
    if steps < admits {
        return 0;
    }
    let growth = (steps - admits).min(2);
    limits.max_hold_ms() >> (2 - growth)
}

/// What a repeated step meets when the caller can hold it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepCheck {
    Clear,
    /// The run has gone on past `runaway_after_secs`.
    Runaway,
    /// Decide it at this time, not before.
    PaceUntil(u64),
}

/// The schedule for a step that arrived at `arrival_ms`, decided now (`now_ms`).
pub fn check(
    limits: &StepLimits,
    counts: &WindowCounts,
    human: bool,
    arrival_ms: u64,
    now_ms: u64,
) -> StepCheck {
    let run = Run::continued(counts.run(), counts.run_broken, arrival_ms, limits);
    let admits = admits(human);
    // The window: the `admits`th newest must have left it (half-open: then outside).
    let window_until = if counts.step_paced >= admits {
        counts
            .step_newest_ms
            .get((admits - 1) as usize)
            .copied()
            .unwrap_or(0)
            .saturating_add(limits.pace_window_ms())
    } else {
        0
    };
    let gap_until = run.map_or(0, |r| {
        r.last_ms.saturating_add(gap_ms(limits, r.steps, human))
    });
    let until = window_until.max(gap_until);
    // Judged at the time it would be decided: a step the bound would stop is not held first.
    let decided_at = until.max(now_ms);
    if run.is_some_and(|r| decided_at.saturating_sub(r.first_ms) >= limits.runaway_after_ms()) {
        return StepCheck::Runaway;
    }
    if until > now_ms {
        StepCheck::PaceUntil(until)
    } else {
        StepCheck::Clear
    }
}

/// The most calls a run can buy before it is stopped, from a caller that sends the next step
/// at once: the schedule's own arithmetic (`/spec` states it).
pub fn most_calls(limits: &StepLimits, human: bool) -> u64 {
    let mut t = 0u64;
    let mut steps = 0u64;
    let mut window: Vec<u64> = Vec::new();
    let admits = admits(human) as usize;
    loop {
        let gap_until = if steps == 0 {
            0
        } else {
            t + gap_ms(limits, steps, human)
        };
        let window_until = if window.len() >= admits {
            window[window.len() - admits] + limits.pace_window_ms()
        } else {
            0
        };
        let at = gap_until.max(window_until).max(t);
        if steps > 0 && at >= limits.runaway_after_ms() {
            return steps;
        }
        window.push(at);
        steps += 1;
        t = at;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client that asks again `think_ms` after each answer, for `want` answers or until it is
    /// stopped: the decision times, and whether it was stopped. Each wait is bounded by the
    /// hold (a wait past it would be refused: none happens).
    fn run(limits: &StepLimits, human: bool, think_ms: u64, want: usize) -> (Vec<u64>, bool) {
        let mut times: Vec<u64> = Vec::new();
        let mut run: Option<Run> = None;
        let mut now = 1_000_000u64;
        let mut arrival = now;
        while times.len() < want {
            let pace = limits.pace_window_ms();
            let in_window: Vec<u64> = times
                .iter()
                .rev()
                .copied()
                .filter(|&t| now - t < pace)
                .collect();
            let mut newest = [0; super::super::windows::STEP_NEWEST];
            for (slot, t) in newest.iter_mut().zip(&in_window) {
                *slot = *t;
            }
            let counts = WindowCounts {
                step_paced: in_window.len() as u64,
                step_newest_ms: newest,
                ..WindowCounts::default()
            }
            .with_run(run, false);
            match check(limits, &counts, human, arrival, now) {
                StepCheck::Runaway => return (times, true),
                StepCheck::PaceUntil(until) => {
                    assert!(
                        until - arrival <= limits.max_hold_ms(),
                        "held past the bound"
                    );
                    now = until;
                    continue;
                }
                StepCheck::Clear => {}
            }
            let continued = Run::continued(run, false, arrival, limits);
            run = Some(Run::after(continued, now));
            times.push(now);
            now += think_ms;
            arrival = now;
        }
        (times, false)
    }

    fn most_in_any(times: &[u64], span: u64, from: u64) -> usize {
        times
            .iter()
            .filter(|&&t| t >= from)
            .map(|&start| {
                times
                    .iter()
                    .filter(|&&t| t >= start && t < start + span)
                    .count()
            })
            .max()
            .unwrap_or(0)
    }

    #[test]
    fn the_defaults_meet_the_targets_of_fair_over_hours() {
        let limits = StepLimits::default();
        // A stuck agent (asks again 1 s after each answer), unattended: stopped, at most 30
        // calls in all, at most 15 in any hour after its first ten minutes.
        let (calls, stopped) = run(&limits, false, 1_000, 1_000);
        assert!(stopped);
        assert!(calls.len() <= 30, "{}", calls.len());
        assert_eq!(calls.len() as u64, most_calls(&limits, false));
        let first = calls[0];
        assert!(most_in_any(&calls, 3_600_000, first + 600_000) <= 15);
        // A poll every 10 to 30 s of a job of an hour completes, within 20 calls.
        for think in [10_000, 20_000, 30_000] {
            let (polls, stopped) = run(&limits, false, think, 10_000);
            let within_hour = polls.iter().filter(|&&t| t - polls[0] <= 3_600_000).count();
            assert!(stopped, "a poll never ending is stopped in the end");
            assert!(
                polls.iter().any(|&t| t - polls[0] >= 3_600_000),
                "a poll of an hour was stopped before the hour: {think}"
            );
            assert!(within_hour <= 20, "{think}: {within_hour}");
        }
        // Attended: more room, the same bound.
        let (attended, stopped) = run(&limits, true, 1_000, 1_000);
        assert!(stopped);
        assert!(attended.len() as u64 == most_calls(&limits, true));
        assert!(attended.len() > 27);
        let polls: Vec<usize> = [10_000, 20_000, 30_000]
            .iter()
            .map(|&think| {
                let (polls, _) = run(&limits, false, think, 10_000);
                polls.iter().filter(|&&t| t - polls[0] <= 3_600_000).count()
            })
            .collect();
        eprintln!(
            "defaults, unattended: a stuck agent buys {} calls in all (attended {}), at most {} \
             in any hour after its first ten minutes, stopped {} min into its run; a poll every \
             10 / 20 / 30 s of a job of an hour reaches the provider {:?} times",
            calls.len(),
            attended.len(),
            most_in_any(&calls, 3_600_000, first + 600_000),
            (calls[calls.len() - 1] - first) / 60_000,
            polls
        );
    }

    proptest::proptest! {
        /// A poll of a job shorter than the bound (less the longest hold and the client's own
        /// pause, which the last poll may still take) completes, whatever the client's pause;
        /// and no caller, however it paces itself, buys more than the schedule's count.
        #[test]
        fn a_poll_under_the_bound_completes_and_no_run_buys_more_than_its_count(
            think in 0u64..240_000,
            job_fraction in 0.0f64..1.0,
            human: bool,
        ) {
            let limits = StepLimits::default();
            let longest = limits.runaway_after_ms() - limits.max_hold_ms() - think;
            let job_ms = (longest as f64 * job_fraction) as u64;
            let (polls, _) = run(&limits, human, think, 100_000);
            proptest::prop_assert!(
                polls.iter().any(|&t| t - polls[0] >= job_ms),
                "a job of {} ms polled every {} ms was stopped first", job_ms, think
            );
            proptest::prop_assert!(polls.len() as u64 <= most_calls(&limits, human));
        }
    }

    #[test]
    fn the_gap_doubles_up_to_the_hold() {
        let l = StepLimits::default();
        let gaps: Vec<u64> = (0..8).map(|s| gap_ms(&l, s, false)).collect();
        assert_eq!(gaps, [0, 0, 0, 60_000, 120_000, 240_000, 240_000, 240_000]);
        assert_eq!(gap_ms(&l, 6, true), 0);
        assert_eq!(gap_ms(&l, 7, true), 60_000);
        assert_eq!(gap_ms(&l, 1_000, true), 240_000);
    }

    #[test]
    fn progress_and_silence_end_a_run() {
        let l = StepLimits::default();
        let r = Run {
            steps: 9,
            first_ms: 0,
            last_ms: 1_000_000,
        };
        assert_eq!(Run::continued(Some(r), false, 1_100_000, &l), Some(r));
        assert_eq!(Run::continued(Some(r), true, 1_100_000, &l), None);
        assert_eq!(Run::continued(Some(r), false, 1_240_000, &l), None);
        assert_eq!(
            Run::after(None, 5),
            Run {
                steps: 1,
                first_ms: 5,
                last_ms: 5
            }
        );
    }
}
