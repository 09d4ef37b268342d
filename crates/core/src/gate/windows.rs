//! Exact sliding windows per key, driven by a clock passed in (unix milliseconds).
//!
//! Windows are half-open: an entry exactly `len` old is outside. Each list keeps at most
//! `CAP_*` newest entries: every count the gate reads saturates (or fires its hard rule) well
//! below those caps, so capping bounds memory without changing any decision.

use std::collections::{HashMap, VecDeque};

use serde::{Deserialize, Serialize};

use super::keyed_memory::KeyedMemory;
use super::StepLimits;
use crate::request::Hash;

/// The SPEC's windows (`[gate.windows]` may shorten them: [`super::WindowLengths`]).
pub const LOOP_WINDOW_MS: u64 = 120_000;
pub const BURST_WINDOW_MS: u64 = 60_000;
pub const GRIND_WINDOW_MS: u64 = 3_600_000;
pub const NOVELTY_WINDOW_MS: u64 = 86_400_000;
pub const REPEAT_WINDOW_MS: u64 = 86_400_000;

/// Counts kept exact up to here; the largest threshold read is the grind saturation (200).
const CAP_KEY_REQUESTS: usize = 1024;
const CAP_IDENTICAL: usize = 64;
/// The largest `runaway_repeats` the step lists count exactly.
pub const STEP_CAP: u64 = CAP_IDENTICAL as u64;
/// Distinct fingerprints remembered per key for the 24 h repeat findings.
const CAP_SEEN_FINGERPRINTS: usize = 100_000;
/// ... and across every key, unless the config says otherwise
/// ([`Windows::set_remembered_total`]): about 75 bytes each.
pub const REMEMBERED_TOTAL: usize = 250_000;
const CAP_MODELS: usize = 1024;
/// Sessions whose latest step is remembered per key (an agent fleet of one key runs far
/// fewer at once).
const CAP_SESSIONS: usize = 4096;

/// What the windows say about a request, before it is counted. "Earlier" never includes the
/// request being decided.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WindowCounts {
    /// Earlier identical requests in the last 120 s: same key, and the same fingerprint or
    /// the same step fingerprint (SPEC §2.3).
    pub earlier_identical: u64,
    /// Earlier requests from the key in the last 60 s.
    pub earlier_key_minute: u64,
    /// Earlier requests from the key in the last hour.
    pub earlier_key_hour: u64,
    /// The key used this model in the last 24 h.
    pub model_seen: bool,
    /// The key sent this fingerprint in the last 24 h.
    pub fingerprint_seen: bool,
    /// The key sent a request with this step fingerprint in the last 24 h (SPEC §2.3: the
    /// repeat findings count identical steps as the loop signal does). Absent in a serialised
    /// count from before: not seen.
    #[serde(default)]
    pub step_seen: bool,
    /// Of `earlier_identical`, those that share only the step fingerprint (a different
    /// fingerprint: a growing history repeating a step). The rest are literal repeats (the same
    /// fingerprint: a retry storm), which the hard rules stop absolutely; a repeated step is the
    /// gate's to pace (SPEC §2.3). SERVEs are not among the steps: a SERVE buys nothing.
    /// Absent (0): every identical request counts as literal.
    #[serde(default)]
    pub earlier_step_only: u64,
    /// Earlier decisions with this step fingerprint (SERVEs excepted) in the pace window
    /// (`[gate.steps] pace_window_secs`), exact up to the step lists' cap.
    #[serde(default)]
    pub step_paced: u64,
    /// Their times, newest first (0 past `step_paced`): when the window admits a step again.
    #[serde(default)]
    pub step_newest_ms: [u64; STEP_NEWEST],
    /// The key's run of this step so far ([`Run`]): steps decided in it
    /// (0: none), when its first and latest were decided. Whether the request continues it is
    /// the schedule's to judge, from its arrival.
    #[serde(default)]
    pub run_steps: u64,
    #[serde(default)]
    pub run_first_ms: u64,
    #[serde(default)]
    pub run_last_ms: u64,
    /// The request's session made another step since the run's latest (progress): the run
    /// ends.
    #[serde(default)]
    pub run_broken: bool,
}

/// How many of a step's newest times the counts carry: enough for the attended pace (7).
pub const STEP_NEWEST: usize = 7;

impl WindowCounts {
    /// These counts without the step pacing columns: what a gate that does not pace reads (the
    /// fleet's windows).
    pub fn unpaced(self) -> Self {
        WindowCounts {
            step_paced: 0,
            step_newest_ms: [0; STEP_NEWEST],
            ..self.with_run(None, false)
        }
    }

    /// The key's run of this step, if it has one.
    pub fn run(&self) -> Option<Run> {
        (self.run_steps > 0).then_some(Run {
            steps: self.run_steps,
            first_ms: self.run_first_ms,
            last_ms: self.run_last_ms,
        })
    }

    /// These counts with this run (and whether the session's progress broke it).
    pub fn with_run(self, run: Option<Run>, broken: bool) -> Self {
        let r = run.unwrap_or_default();
        WindowCounts {
            run_steps: r.steps,
            run_first_ms: r.first_ms,
            run_last_ms: r.last_ms,
            run_broken: broken && run.is_some(),
            ..self
        }
    }
}

struct KeyWindows {
    requests: VecDeque<u64>,
    /// By fingerprint, by step fingerprint, and by both: a request matches when either is
    /// equal, so the count is |fp| + |step| − |both|.
    identical: HashMap<Hash, VecDeque<u64>>,
    steps: HashMap<Hash, VecDeque<u64>>,
    both: HashMap<(Hash, Hash), VecDeque<u64>>,
    models: HashMap<String, u64>,
    /// The run of each step ([`super::schedule`]), while it may continue.
    runs: HashMap<Hash, Run>,
    /// When the maps above were last swept of what no window sees ([`Windows::evict`]).
    swept_ms: u64,
}

impl KeyWindows {
    fn new() -> Self {
        Self {
            requests: VecDeque::new(),
            identical: HashMap::new(),
            steps: HashMap::new(),
            both: HashMap::new(),
            models: HashMap::new(),
            runs: HashMap::new(),
            swept_ms: 0,
        }
    }
}

fn within(now: u64, at: u64, len: u64) -> bool {
    now.saturating_sub(at) < len
}

fn count_within(times: &VecDeque<u64>, now: u64, len: u64) -> u64 {
    // Sorted, newest last, so the entries inside the window are a suffix: found by binary
    // search. A clock that jumped back leaves later entries, which still count as recent.
    let first_inside = times.partition_point(|&t| !within(now, t, len));
    (times.len() - first_inside) as u64
}

fn push_capped(times: &mut VecDeque<u64>, now: u64, cap: usize) {
    // Concurrent requests read their clocks independently, so a time can arrive slightly out
    // of order: keep the list sorted (the insertion point is almost always the end).
    let at = times.iter().rposition(|&t| t <= now).map_or(0, |i| i + 1);
    times.insert(at, now);
    while times.len() > cap {
        times.pop_front();
    }
}

pub struct Windows {
    keys: HashMap<String, KeyWindows>,
    /// Fingerprints and step fingerprints sent in the last 24 h (the repeat findings), per key
    /// and in total.
    seen: KeyedMemory<Hash, ()>,
    seen_steps: KeyedMemory<Hash, ()>,
    /// Session → the steps it made last: a session that makes another step ends that run.
    session_steps: KeyedMemory<Hash, SessionSteps>,
    spans: Spans,
    /// What a step's run is judged by ([`super::schedule`]).
    steps: StepLimits,
}

/// Every window's length, in milliseconds.
#[derive(Debug, Clone, Copy)]
struct Spans {
    loop_ms: u64,
    burst_ms: u64,
    grind_ms: u64,
    /// The step pacing window, and how long a run is kept after its latest step
    /// (`[gate.steps]`).
    pace_ms: u64,
    hold_ms: u64,
}

impl Default for Windows {
    fn default() -> Self {
        Self::configured(&super::GateConfig::default())
    }
}

impl Windows {
    pub fn new() -> Self {
        Self::default()
    }

    /// Windows of the lengths a gate config names (`[gate.windows]`, `[gate.steps]`).
    pub fn configured(config: &super::GateConfig) -> Self {
        let secs = |s: u64| s.saturating_mul(1_000);
        Self {
            keys: HashMap::new(),
            seen: KeyedMemory::new(REPEAT_WINDOW_MS, CAP_SEEN_FINGERPRINTS, REMEMBERED_TOTAL),
            seen_steps: KeyedMemory::new(REPEAT_WINDOW_MS, CAP_SEEN_FINGERPRINTS, REMEMBERED_TOTAL),
            session_steps: KeyedMemory::new(u64::MAX, CAP_SESSIONS, REMEMBERED_TOTAL),
            spans: Spans {
                loop_ms: secs(config.windows.loop_secs),
                burst_ms: secs(config.windows.burst_secs),
                grind_ms: secs(config.windows.grind_secs),
                pace_ms: config.steps.pace_window_ms(),
                hold_ms: config.steps.max_hold_ms(),
            },
            steps: config.steps,
        }
    }

    /// [`Windows::observe_step`] for a request whose step fingerprint is its fingerprint.
    pub fn observe(&self, key: &str, fingerprint: &Hash, model: &str, now: u64) -> WindowCounts {
        self.observe_step(key, fingerprint, fingerprint, model, now)
    }

    /// [`Windows::observe_session`] for a request whose session is not known.
    pub fn observe_step(
        &self,
        key: &str,
        fingerprint: &Hash,
        step: &Hash,
        model: &str,
        now: u64,
    ) -> WindowCounts {
        self.observe_session(key, fingerprint, step, None, None, model, now)
    }

    /// Read the counts for a request without moving any window (`POST /estimate`); `session`:
    /// the agent session it belongs to (its progress ends a run: [`super::schedule`]).
    #[allow(clippy::too_many_arguments)]
    pub fn observe_session(
        &self,
        key: &str,
        fingerprint: &Hash,
        step: &Hash,
        action: Option<&Hash>,
        session: Option<&Hash>,
        model: &str,
        now: u64,
    ) -> WindowCounts {
        let Some(w) = self.keys.get(key) else {
            return WindowCounts::default();
        };
        let sp = self.spans;
        let loop_count =
            |times: Option<&VecDeque<u64>>| times.map_or(0, |t| count_within(t, now, sp.loop_ms));
        let same_fingerprint = loop_count(w.identical.get(fingerprint));
        let same_step = loop_count(w.steps.get(step));
        let same_both = loop_count(w.both.get(&(*fingerprint, *step)));
        let steps = w.steps.get(step);
        let step_paced = steps.map_or(0, |t| count_within(t, now, sp.pace_ms));
        let mut step_newest_ms = [0; STEP_NEWEST];
        if let Some(times) = steps {
            let inside = times.iter().rev().take(step_paced as usize);
            for (slot, &t) in step_newest_ms.iter_mut().zip(inside) {
                *slot = t;
            }
        }
        let (run, broken) = SessionSteps::run_of(
            session.and_then(|s| self.session_steps.get(key, s, now)),
            step,
            action,
            w.runs.get(step).copied(),
        );
        let counts = WindowCounts {
            step_paced,
            step_newest_ms,
            // Each list is capped alike and `both` is a subset of either, so this never
            // undercounts below the smaller cap.
            earlier_identical: same_fingerprint + same_step.saturating_sub(same_both),
            earlier_step_only: same_step.saturating_sub(same_both),
            earlier_key_minute: count_within(&w.requests, now, sp.burst_ms),
            earlier_key_hour: count_within(&w.requests, now, sp.grind_ms),
            model_seen: w
                .models
                .get(model)
                .is_some_and(|&t| within(now, t, NOVELTY_WINDOW_MS)),
            fingerprint_seen: self.seen.get(key, fingerprint, now).is_some(),
            step_seen: self.seen_steps.get(key, step, now).is_some(),
            ..WindowCounts::default()
        };
        counts.with_run(run, broken)
    }

    /// [`Windows::record_step`] for a request whose step fingerprint is its fingerprint.
    pub fn record(&mut self, key: &str, fingerprint: &Hash, model: &str, now: u64) {
        self.record_step(key, fingerprint, fingerprint, model, now)
    }

    /// [`Windows::record_session`] for a request of no known session, decided as it arrived.
    pub fn record_step(
        &mut self,
        key: &str,
        fingerprint: &Hash,
        step: &Hash,
        model: &str,
        now: u64,
    ) {
        self.record_entry(key, fingerprint, step, model, now, Some((None, None, now)))
    }

    /// Count a request in every window, whatever its verdict (a SERVE: [`Windows::record_serve`]),
    /// and its step in its run ([`Run`]): `action` is the step's (its calls without their
    /// results), `arrival` when the request came (before any hold), `session` the agent session
    /// it belongs to.
    #[allow(clippy::too_many_arguments)]
    pub fn record_session(
        &mut self,
        key: &str,
        fingerprint: &Hash,
        step: &Hash,
        action: Option<&Hash>,
        session: Option<&Hash>,
        model: &str,
        now: u64,
        arrival: u64,
    ) {
        self.record_entry(
            key,
            fingerprint,
            step,
            model,
            now,
            Some((action, session, arrival)),
        )
    }

    /// Count a SERVE: in every window but the step windows. A SERVE buys nothing, so a
    /// temperature-0 rerun of a session, SERVEd step by step, is no repeated step (SPEC §2.3);
    /// it still counts by its fingerprint, so a literal retry storm of it is still stopped.
    pub fn record_serve(
        &mut self,
        key: &str,
        fingerprint: &Hash,
        step: &Hash,
        model: &str,
        now: u64,
    ) {
        self.record_entry(key, fingerprint, step, model, now, None)
    }

    /// `as_step`: counted as a step (not a SERVE), with this action, of this session, arrived
    /// then.
    fn record_entry(
        &mut self,
        key: &str,
        fingerprint: &Hash,
        step: &Hash,
        model: &str,
        now: u64,
        as_step: Option<(Option<&Hash>, Option<&Hash>, u64)>,
    ) {
        // Allocate the key's name only the first time it is seen.
        if !self.keys.contains_key(key) {
            self.keys.insert(key.to_string(), KeyWindows::new());
        }
        let Some(w) = self.keys.get_mut(key) else {
            return;
        };
        push_capped(&mut w.requests, now, CAP_KEY_REQUESTS);
        push_capped(
            w.identical.entry(*fingerprint).or_default(),
            now,
            CAP_IDENTICAL,
        );
        if let Some((action, session, arrival)) = as_step {
            push_capped(w.steps.entry(*step).or_default(), now, CAP_IDENTICAL);
            push_capped(
                w.both.entry((*fingerprint, *step)).or_default(),
                now,
                CAP_IDENTICAL,
            );
            let last = session.and_then(|s| self.session_steps.get(key, s, now).copied());
            let (run, broken) =
                SessionSteps::run_of(last.as_ref(), step, action, w.runs.get(step).copied());
            let continued = Run::continued(run, broken, arrival, &self.steps);
            w.runs.insert(*step, Run::after(continued, now));
            if let Some(s) = session {
                self.session_steps.put(
                    key,
                    *s,
                    SessionSteps::after(last, *step, action.copied(), now),
                    now,
                );
            }
        }
        if w.models.len() >= CAP_MODELS && !w.models.contains_key(model) {
            w.models.retain(|_, t| within(now, *t, NOVELTY_WINDOW_MS));
        }
        if w.models.len() < CAP_MODELS || w.models.contains_key(model) {
            w.models.insert(model.to_string(), now);
        }
        Self::evict(w, now, self.spans);
        self.seen.put(key, *fingerprint, (), now);
        self.seen_steps.put(key, *step, (), now);
    }

    /// Drop everything that no window can see any more.
    fn evict(w: &mut KeyWindows, now: u64, sp: Spans) {
        while w
            .requests
            .front()
            .is_some_and(|&t| !within(now, t, sp.grind_ms.max(sp.burst_ms)))
        {
            w.requests.pop_front();
        }
        // Sweeping every fingerprint on every request would cost O(n); sweep a map when it has
        // doubled since the last sweep, which keeps the amortised cost constant, and all of
        // them once a loop window: a key that sends a few distinct requests a minute never
        // doubles a map, and its stale entries were kept for as long as the process ran.
        let due = now.saturating_sub(w.swept_ms) >= sp.loop_ms;
        if due {
            w.swept_ms = now;
        }
        let doubled = |len: usize| len > 64 && len.is_power_of_two();
        let sweep = |len: usize| due || doubled(len);
        let recent =
            |times: &VecDeque<u64>| times.back().is_some_and(|&t| within(now, t, sp.loop_ms));
        if sweep(w.identical.len()) {
            w.identical.retain(|_, times| recent(times));
        }
        if sweep(w.steps.len()) {
            // The step lists serve the pace window too (never longer than the loop's).
            let len = sp.pace_ms.max(sp.loop_ms);
            w.steps
                .retain(|_, times| times.back().is_some_and(|&t| within(now, t, len)));
        }
        // Runs only when their map doubles: a key's latest run of a step is part of what it
        // observes (`run_steps`, in the receipt) however old, so sweeping it on a timer would
        // change what a quiet key's receipts say; the doubling rule keeps a key's runs under
        // 128 all the same.
        if doubled(w.runs.len()) {
            // A run silent for the longest hold has ended.
            w.runs.retain(|_, r| within(now, r.last_ms, sp.hold_ms));
        }
        if sweep(w.both.len()) {
            w.both.retain(|_, times| recent(times));
        }
    }

    /// Forget the key's fingerprint records (POST /forget). The loop and burst windows stay:
    /// forgetting is no way around the runaway rules.
    pub fn forget_fingerprints(&mut self, key: &str) {
        self.seen.forget(key);
        self.seen_steps.forget(key);
    }

    /// Bound what is kept per key across all keys (`limits.remembered_entries`, each table):
    /// past it the oldest entries go, whichever key sent them. The 24-hour fingerprints feed
    /// only the advisory repeat findings; a session whose latest steps went is read as new,
    /// as one past the per-key bound always was.
    pub fn set_remembered_total(&mut self, total: usize) {
        self.seen.set_total(total);
        self.seen_steps.set_total(total);
        self.session_steps.set_total(total);
    }

    /// Entries held in memory (for the store-size metric and the eviction tests).
    pub fn entries(&self) -> usize {
        self.keys
            .values()
            .map(|w| {
                w.requests.len()
                    + w.identical.values().map(VecDeque::len).sum::<usize>()
                    + w.steps.values().map(VecDeque::len).sum::<usize>()
                    + w.both.values().map(VecDeque::len).sum::<usize>()
                    + w.models.len()
                    + w.runs.len()
            })
            .sum::<usize>()
            + self.seen.len()
            + self.seen_steps.len()
            + self.session_steps.len()
    }
}

/// What a session's latest steps were: enough to tell its progress from a stray result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionSteps {
    /// The step it made last, that step's action (its calls without their results) and when
    /// it was decided.
    pub last: Hash,
    pub last_action: Option<Hash>,
    pub last_ms: u64,
    /// The step it made before that one.
    pub before: Option<Hash>,
}

impl SessionSteps {
    /// The session's steps once it has made `step` (with `action`), decided at `now_ms`.
    pub fn after(
        prev: Option<SessionSteps>,
        step: Hash,
        action: Option<Hash>,
        now_ms: u64,
    ) -> SessionSteps {
        SessionSteps {
            last: step,
            last_action: action,
            last_ms: now_ms,
            before: prev.map(|p| p.last),
        }
    }

    /// `step`'s run (`run`, as kept) as the latest steps of its session (if known) leave it,
    /// and whether they ended it. The session made another step since the run's latest:
    /// progress, the run ends — unless that other step was one other result of this very
    /// action between two of `step` (`A A B A`: B is A's call answered once with, say, a fresh
    /// id that happened to be all digits and so read as a number, noise the normalisation
    /// cannot tell from a count). Then the run goes on, and the stray counts in it as a step
    /// decided when it was (it was bought like one: the run's next waits after it). Two other
    /// results in a row, or another call, are progress.
    pub fn run_of(
        session: Option<&SessionSteps>,
        step: &Hash,
        action: Option<&Hash>,
        run: Option<Run>,
    ) -> (Option<Run>, bool) {
        let Some(s) = session.filter(|s| s.last != *step) else {
            return (run, false);
        };
        let stray =
            s.before.as_ref() == Some(step) && action.is_some() && s.last_action.as_ref() == action;
        if !stray {
            return (run, true);
        }
        let run = run.map(|r| Run {
            steps: r.steps.saturating_add(1),
            first_ms: r.first_ms,
            last_ms: r.last_ms.max(s.last_ms),
        });
        (run, false)
    }
}

/// A run of one step, as the key's state keeps it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Run {
    /// Steps decided in it.
    pub steps: u64,
    /// When its first step was decided.
    pub first_ms: u64,
    /// When its latest step was decided.
    pub last_ms: u64,
}

impl Run {
    /// The run a step arriving at `arrival_ms` continues: the key's run of this step, unless
    /// the session made another step since (`broken`) or the step comes after a silence of
    /// `max_hold` or more. `None`: it starts a new run.
    pub fn continued(
        prev: Option<Run>,
        broken: bool,
        arrival_ms: u64,
        limits: &StepLimits,
    ) -> Option<Run> {
        prev.filter(|r| {
            r.steps > 0 && !broken && arrival_ms.saturating_sub(r.last_ms) < limits.max_hold_ms()
        })
    }

    /// The run once this step is decided at `now_ms`.
    pub fn after(continued: Option<Run>, now_ms: u64) -> Run {
        match continued {
            Some(r) => Run {
                steps: r.steps.saturating_add(1),
                first_ms: r.first_ms,
                last_ms: now_ms.max(r.last_ms),
            },
            None => Run {
                steps: 1,
                first_ms: now_ms,
                last_ms: now_ms,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fp(n: u8) -> Hash {
        Hash([n; 32])
    }

    #[test]
    fn a_session_ends_a_run_by_progress_not_by_one_stray_result() {
        let (a, b, c) = (fp(1), fp(2), fp(3));
        let (act, other) = (fp(10), fp(11));
        let run = Run {
            steps: 4,
            first_ms: 1_000,
            last_ms: 4_000,
        };
        // The session's steps, one a second from 3 s, then `step` (with `action`) against `run`.
        let of = |seq: &[(Hash, Option<Hash>)], step: &Hash, action: Option<&Hash>| {
            let session = seq.iter().enumerate().fold(None, |prev, (i, (st, ac))| {
                Some(SessionSteps::after(
                    prev,
                    *st,
                    *ac,
                    3_000 + 1_000 * i as u64,
                ))
            });
            SessionSteps::run_of(session.as_ref(), step, action, Some(run))
        };
        let ended = (Some(run), true);
        // No session known, or A then A: the run goes on as kept.
        assert_eq!(
            SessionSteps::run_of(None, &a, Some(&act), Some(run)),
            (Some(run), false)
        );
        assert_eq!(
            of(&[(a, Some(act)), (a, Some(act))], &a, Some(&act)),
            (Some(run), false)
        );
        // A A B A, B one other result of A's call (decided at 5 s): the run goes on, B in it.
        let through = Run {
            steps: 5,
            first_ms: 1_000,
            last_ms: 5_000,
        };
        assert_eq!(
            of(
                &[(a, Some(act)), (a, Some(act)), (b, Some(act))],
                &a,
                Some(&act)
            ),
            (Some(through), false)
        );
        // A B A, B another call: progress.
        assert_eq!(
            of(&[(a, Some(act)), (b, Some(other))], &a, Some(&act)),
            ended
        );
        // A B C A: two other results in a row are progress.
        assert_eq!(
            of(
                &[(a, Some(act)), (b, Some(act)), (c, Some(act))],
                &a,
                Some(&act)
            ),
            ended
        );
        // Turns without a tool call have no action: another one is progress.
        assert_eq!(of(&[(a, None), (b, None)], &a, None), ended);
        // C B A: the session's step before B is not A.
        assert_eq!(of(&[(c, Some(act)), (b, Some(act))], &a, Some(&act)), ended);
    }

    #[test]
    fn windows_are_half_open() {
        let mut w = Windows::new();
        w.record("k", &fp(1), "m", 1_000);
        assert_eq!(
            w.observe("k", &fp(1), "m", 1_000 + LOOP_WINDOW_MS - 1)
                .earlier_identical,
            1
        );
        assert_eq!(
            w.observe("k", &fp(1), "m", 1_000 + LOOP_WINDOW_MS)
                .earlier_identical,
            0
        );
        assert_eq!(
            w.observe("k", &fp(1), "m", 1_000 + BURST_WINDOW_MS)
                .earlier_key_minute,
            0
        );
        assert_eq!(
            w.observe("k", &fp(1), "m", 1_000 + BURST_WINDOW_MS)
                .earlier_key_hour,
            1
        );
        assert!(
            w.observe("k", &fp(1), "m", 1_000 + NOVELTY_WINDOW_MS - 1)
                .model_seen
        );
        assert!(
            !w.observe("k", &fp(1), "m", 1_000 + NOVELTY_WINDOW_MS)
                .model_seen
        );
        assert!(!w.observe("k", &fp(1), "other", 1_000).model_seen);
        assert_eq!(
            w.observe("other-key", &fp(1), "m", 1_000),
            WindowCounts::default()
        );
    }

    #[test]
    fn a_clock_jump_evicts_everything_old() {
        let mut w = Windows::new();
        for i in 0..50 {
            w.record("k", &fp(i), "m", 10_000 + u64::from(i));
        }
        let before = w.entries();
        // Jump two days ahead: a new request evicts every expired entry.
        let later = 10_000 + 2 * NOVELTY_WINDOW_MS;
        w.record("k", &fp(200), "m2", later);
        let counts = w.observe("k", &fp(1), "m", later);
        assert_eq!(counts.earlier_key_hour, 1);
        assert_eq!(counts.earlier_identical, 0);
        assert!(!counts.fingerprint_seen);
        assert!(w.entries() < before);
        assert_eq!(w.keys["k"].requests.len(), 1);
        assert_eq!(w.seen.len_of("k"), 1);
        assert_eq!(w.seen_steps.len_of("k"), 1);
    }

    /// A key that sends a few distinct requests a minute never doubles a map: its stale
    /// entries are swept once a loop window all the same (they were kept for as long as the
    /// process ran, ~500 bytes a request across 4,000 such keys), and every count is as
    /// before.
    #[test]
    fn a_slow_keys_stale_entries_are_swept_once_a_loop_window() {
        let mut w = Windows::new();
        for i in 0..40u8 {
            w.record_session(
                "k",
                &fp(i),
                &fp(i),
                Some(&fp(i)),
                None,
                "m",
                20_000 * u64::from(i),
                20_000 * u64::from(i),
            );
        }
        let k = &w.keys["k"];
        // What the loop window (120 s) sees, plus at most one window not yet swept.
        let most = 2 * (LOOP_WINDOW_MS / 20_000) as usize + 1;
        assert!(k.identical.len() <= most, "{}", k.identical.len());
        assert!(k.steps.len() <= most && k.both.len() <= most);
        assert_eq!(
            k.runs.len(),
            40,
            "runs are swept only when their map doubles"
        );
        let now = 20_000 * 39 + 1;
        assert_eq!(w.observe("k", &fp(39), "m", now).earlier_identical, 1);
        assert_eq!(w.observe("k", &fp(38), "m", now).earlier_identical, 1);
        assert_eq!(w.observe("k", &fp(30), "m", now).earlier_identical, 0);
        assert!(
            w.observe("k", &fp(0), "m", now).fingerprint_seen,
            "the day's memory stays"
        );
    }

    /// The 24-hour fingerprint memory is bounded across all keys, not only per key: past the
    /// total the oldest entries go, whichever key sent them.
    #[test]
    fn the_day_memory_is_bounded_across_keys() {
        let mut w = Windows::new();
        w.set_remembered_total(100);
        let keys: Vec<String> = (0..50).map(|k| format!("key{k}")).collect();
        let mut now = 1_000;
        for round in 0..4u8 {
            for key in &keys {
                now += 10;
                w.record(key, &fp(round), "m", now);
            }
        }
        assert_eq!(w.seen.len(), 100);
        assert_eq!(w.seen_steps.len(), 100);
        // The two newest rounds are remembered; the two oldest are not.
        assert!(w.observe("key0", &fp(3), "m", now).fingerprint_seen);
        assert!(w.observe("key49", &fp(2), "m", now).fingerprint_seen);
        assert!(!w.observe("key49", &fp(1), "m", now).fingerprint_seen);
        assert!(!w.observe("key0", &fp(0), "m", now).fingerprint_seen);
    }

    #[test]
    fn counts_stay_exact_up_to_the_caps() {
        let mut w = Windows::new();
        for i in 0..300 {
            w.record("k", &fp(1), "m", 100_000 + i);
        }
        let c = w.observe("k", &fp(1), "m", 100_300);
        assert_eq!(c.earlier_key_minute, 300);
        assert_eq!(c.earlier_identical, CAP_IDENTICAL as u64);
        assert!(c.fingerprint_seen);
    }

    #[test]
    fn out_of_order_times_still_count_exactly() {
        let mut w = Windows::new();
        w.record("k", &fp(1), "m", 1_000);
        w.record("k", &fp(1), "m", 999);
        // 999 is 120 s old (outside), 1 000 is not.
        assert_eq!(w.observe("k", &fp(1), "m", 120_999).earlier_identical, 1);
        assert_eq!(
            w.observe("k", &fp(1), "m", 61_000 - 1).earlier_key_minute,
            1
        );
    }

    #[test]
    fn a_request_is_identical_by_fingerprint_or_by_step_and_counted_once() {
        let mut w = Windows::new();
        // A stuck agent: every request has a new fingerprint and the same step.
        for i in 0..5 {
            w.record_step("k", &fp(10 + i), &fp(1), "m", 1_000 + u64::from(i));
        }
        assert_eq!(
            w.observe_step("k", &fp(99), &fp(1), "m", 2_000)
                .earlier_identical,
            5
        );
        // A retry storm of one body: same fingerprint, same step.
        for _ in 0..3 {
            w.record_step("k", &fp(50), &fp(51), "m", 1_500);
        }
        assert_eq!(
            w.observe_step("k", &fp(50), &fp(51), "m", 2_000)
                .earlier_identical,
            3
        );
        // Matching by both is not counted twice; matching by either adds up.
        assert_eq!(
            w.observe_step("k", &fp(50), &fp(1), "m", 2_000)
                .earlier_identical,
            8
        );
        // A session that makes progress: nothing earlier matches.
        assert_eq!(
            w.observe_step("k", &fp(60), &fp(61), "m", 2_000)
                .earlier_identical,
            0
        );
    }

    #[test]
    fn forget_keeps_the_loop_windows() {
        let mut w = Windows::new();
        w.record("k", &fp(1), "m", 5_000);
        w.forget_fingerprints("k");
        let c = w.observe("k", &fp(1), "m", 5_001);
        assert!(!c.fingerprint_seen);
        assert!(!c.step_seen);
        assert_eq!(c.earlier_identical, 1);
    }

    #[test]
    fn a_step_is_seen_for_24_hours_whatever_the_fingerprint() {
        let mut w = Windows::new();
        w.record_step("k", &fp(10), &fp(1), "m", 1_000);
        let c = w.observe_step("k", &fp(11), &fp(1), "m", 1_000 + REPEAT_WINDOW_MS - 1);
        assert!(c.step_seen);
        assert!(!c.fingerprint_seen);
        let c = w.observe_step("k", &fp(11), &fp(1), "m", 1_000 + REPEAT_WINDOW_MS);
        assert!(!c.step_seen);
        assert!(!w.observe_step("k", &fp(10), &fp(2), "m", 2_000).step_seen);
        assert!(
            !w.observe_step("other", &fp(11), &fp(1), "m", 2_000)
                .step_seen
        );
    }

    #[test]
    fn a_serve_counts_by_its_fingerprint_and_not_as_a_step() {
        let mut w = Windows::new();
        // A finished session's step, then its rerun SERVEd twice.
        w.record_step("k", &fp(10), &fp(1), "m", 1_000);
        w.record_serve("k", &fp(10), &fp(1), "m", 2_000);
        w.record_serve("k", &fp(10), &fp(1), "m", 3_000);
        // The same body again: three literal repeats, none by step alone.
        let c = w.observe_step("k", &fp(10), &fp(1), "m", 4_000);
        assert_eq!((c.earlier_identical, c.earlier_step_only), (3, 0));
        // The same step with another history: one step (the live one), the SERVEs not.
        let c = w.observe_step("k", &fp(11), &fp(1), "m", 4_000);
        assert_eq!((c.earlier_identical, c.earlier_step_only), (1, 1));
        assert!(c.step_seen);
        assert_eq!(c.earlier_key_minute, 3);
    }
}
