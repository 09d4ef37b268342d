//! The embedded home's state (memory rebuilt from SQLite at start): windows, budgets,
//! reservations, holds and leases, recorded usage, and what the gate keeps of sessions and
//! prompt prefixes for cache placement. Read and written under the gatekeeper's one state lock.

use super::*;
use tokensaver_core::gate::keyed_memory::KeyedMemory;
use tokensaver_core::gate::GateConfig;

pub(super) struct KeyBudget {
    pub(super) ceiling_nano: Option<u64>,
    pub(super) period: BudgetPeriod,
    /// Spend per UTC day index, so any period's spend is a range sum.
    pub(super) spend_by_day: BTreeMap<u64, u64>,
}

impl KeyBudget {
    pub(super) fn spend_in_period(&self, now_ms: u64) -> u64 {
        let from = period_start(self.period, now_ms) / DAY_MS;
        self.spend_by_day
            .range(from..)
            .fold(0u64, |sum, (_, v)| sum.saturating_add(*v))
    }
}

/// What the gate remembers of one key's prompt prefixes, for placing cache breakpoints: the
/// newest [`CacheMemory::CAP`] prefixes (an LRU), each with when it was last sent and last
/// given a breakpoint. Entries older than the cache's lifetime are read as absent.
pub(super) struct CacheMemory {
    pub(super) points: lru::LruCache<Hash, PointMemory>,
}

impl Default for CacheMemory {
    fn default() -> Self {
        CacheMemory {
            points: lru::LruCache::unbounded(),
        }
    }
}

impl CacheMemory {
    /// Prefixes kept per key: an agent's calls bring at most a few dozen new ones each.
    const CAP: usize = 4096;

    pub(super) fn recall(&self, points: &[CachePoint]) -> Vec<PointMemory> {
        points
            .iter()
            .map(|p| self.points.peek(&p.prefix).copied().unwrap_or_default())
            .collect()
    }

    /// Every prefix of this request was sent now; the chosen ones got a breakpoint now (a
    /// read through a breakpoint refreshes its entry, as the provider's does).
    pub(super) fn remember(&mut self, points: &[CachePoint], chosen: &[u16], now_ms: u64) {
        for (i, point) in points.iter().enumerate() {
            let placed = chosen.contains(&u16::try_from(i).unwrap_or(u16::MAX));
            let entry = self
                .points
                .get_or_insert_mut(point.prefix, PointMemory::default);
            entry.seen_ms = Some(now_ms);
            if placed {
                entry.placed_ms = Some(now_ms);
            }
        }
        while self.points.len() > Self::CAP {
            self.points.pop_lru();
        }
    }
}

/// A pending or approved hold in memory.
pub(super) struct OpenHold {
    pub(super) row: HoldRow,
    /// The CHALLENGE that opened it: what a re-send gets while the hold is pending. `None` for
    /// a hold written by a build that did not keep it (or blanked by `/forget`).
    pub(super) opened: Option<Arc<GateOutcome>>,
}

/// What a SERVE of each key's answers would not buy: the usage recorded per (fingerprint, wire
/// form), read for as long as an answer may be held ([`RecordedUsage::TTL_MS`], a day, as a
/// fleet keeps its answers), the newest [`RecordedUsage::CAP`] of a key kept, and the newest
/// `limits.remembered_entries` of all keys together. Without the bounds, a proxy that settles
/// every reproducible call keeps one entry per call for as long as it runs: in proxy mode the
/// answer store drops answers by its byte cap, but their usage stayed.
pub(super) struct RecordedUsage {
    entries: KeyedMemory<(Hash, WireForm), Usage>,
}

impl RecordedUsage {
    pub(super) const TTL_MS: u64 = 86_400_000;
    /// Like the windows' 24-hour fingerprint memory: about 15 MB at most per key.
    pub(super) const CAP: usize = 100_000;

    /// At most `total` records of all keys together.
    pub(super) fn new(total: usize) -> Self {
        RecordedUsage {
            entries: KeyedMemory::new(Self::TTL_MS, Self::CAP, total),
        }
    }

    pub(super) fn get(
        &self,
        key_id: &str,
        fingerprint: &Hash,
        wire: WireForm,
        now_ms: u64,
    ) -> Option<Usage> {
        self.entries
            .get(key_id, &(*fingerprint, wire), now_ms)
            .copied()
    }

    pub(super) fn put(
        &mut self,
        key_id: &str,
        fingerprint: Hash,
        wire: WireForm,
        usage: Usage,
        at_ms: u64,
    ) {
        self.entries.put(key_id, (fingerprint, wire), usage, at_ms);
    }

    pub(super) fn forget(&mut self, key_id: &str) {
        self.entries.forget(key_id);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.len()
    }
}

pub(super) struct State {
    pub(super) windows: Windows,
    /// Key → the prompt prefixes it sent and where breakpoints went (SPEC §2.11b): keyed
    /// hashes and times only.
    pub(super) cache_memory: HashMap<String, CacheMemory>,
    pub(super) budgets: HashMap<String, KeyBudget>,
    pub(super) reservations: Reservations,
    /// Pending and approved holds by id (used, expired and denied ones leave memory).
    pub(super) holds: HashMap<String, OpenHold>,
    /// Key → fingerprint → the open hold for that request: how a re-send of a pending hold is
    /// recognised and how an approval releases the next identical request without a header.
    pub(super) hold_index: HashMap<String, HashMap<Hash, String>>,
    /// Key → its attending lease that ends last.
    pub(super) leases: HashMap<String, LeaseRow>,
    /// Recorded usage of every key ([`RecordedUsage`]).
    pub(super) recorded: RecordedUsage,
    /// What the gate keeps of each key's sessions for cache lifetimes (SPEC §2.11b): the
    /// newest [`SESSIONS_KEPT`] of a key, the newest `limits.remembered_entries` of all keys.
    pub(super) session_cache: KeyedMemory<Hash, SessionCache>,
    /// Key → route prefix → when its forwarded calls were decided in the last minute, and
    /// their sessions (OpenAI routing).
    pub(super) route_times: HashMap<String, HashMap<Hash, std::collections::VecDeque<(u64, Hash)>>>,
    /// Key → the time of its latest committed decision and how many it made in that
    /// millisecond before (the decision clock, see [`State::decision_clock`]).
    pub(super) last_decided: HashMap<String, (u64, u32)>,
}

impl State {
    /// Empty, with windows of the config's lengths and `remembered` entries at most in each
    /// table kept per key, all keys together (`limits.remembered_entries`).
    pub(super) fn new(gate: &GateConfig, remembered: usize) -> State {
        let mut windows = Windows::configured(gate);
        windows.set_remembered_total(remembered);
        State {
            windows,
            cache_memory: HashMap::new(),
            budgets: HashMap::new(),
            reservations: Reservations::default(),
            holds: HashMap::new(),
            hold_index: HashMap::new(),
            leases: HashMap::new(),
            recorded: RecordedUsage::new(remembered),
            session_cache: KeyedMemory::new(u64::MAX, SESSIONS_KEPT, remembered),
            route_times: HashMap::new(),
            last_decided: HashMap::new(),
        }
    }

    /// SPEC §2.3: a re-send of a request whose hold is still pending gets the same CHALLENGE
    /// and hold id and is not counted again. It gets the *original* answer: the same
    /// decision, the same signed receipt (same decision id), and no new ledger row. The
    /// request is the one already held, not a new decision: a new row would count the held
    /// call twice in the ledger and the metrics, and a receipt decided afresh would carry
    /// another decision time (and so, by `hold_id_for`, another hold id) for the same pending
    /// hold. An agent retrying while the person has not answered yet therefore moves no window
    /// and can never turn into a loop.
    pub(super) fn pending_resend(&self, req: &GateRequest) -> Option<Arc<GateOutcome>> {
        self.hold_for(&req.key.id, &req.shape.fingerprint, req.now_ms)
            .filter(|h| h.row.state == HoldState::Pending)
            .and_then(|h| h.opened.clone())
    }

    /// The decision clock: the time passed in (never behind the key's latest decision, when a
    /// clock steps back), and the decision's place among the key's decisions in that
    /// millisecond. Two decisions of one key never share a receipt — an agent hammering one
    /// request, every signal saturated, once got two byte-identical BLOCK receipts in one
    /// millisecond — yet the time stays the wall clock's: a key that floods never moves its
    /// own budget day, windows or expiries ahead of the time its spend is booked at.
    pub(super) fn decision_clock(&mut self, key_id: &str, now_ms: u64) -> (u64, u32) {
        match self.last_decided.get_mut(key_id) {
            Some(last) => {
                *last = if now_ms > last.0 {
                    (now_ms, 0)
                } else {
                    (last.0, last.1.saturating_add(1))
                };
                *last
            }
            None => {
                self.last_decided.insert(key_id.to_string(), (now_ms, 0));
                (now_ms, 0)
            }
        }
    }

    /// The usage recorded for the request's answer in its wire form (what a SERVE does not buy).
    pub(super) fn recorded_usage(&self, req: &GateRequest) -> Option<Usage> {
        let wire = req.shape.wire_form();
        self.recorded
            .get(&req.key.id, &req.shape.fingerprint, wire, req.now_ms)
    }

    /// Record the usage of a complete, reproducible answer of `key_id`'s, settled at `at_ms`.
    pub(super) fn record_usage(
        &mut self,
        key_id: &str,
        fingerprint: Hash,
        wire: WireForm,
        usage: Usage,
        at_ms: u64,
    ) {
        // The key's name is allocated only the first time it records (this runs per settle).
        self.recorded.put(key_id, fingerprint, wire, usage, at_ms);
    }

    /// What the gate keeps of the request's session (nothing yet: the default).
    pub(super) fn session_cache(&self, key_id: &str, session: &Hash) -> SessionCache {
        self.session_cache
            .get(key_id, session, 0)
            .copied()
            .unwrap_or_default()
    }

    /// The key's forwarded calls with this route prefix in the `window_ms` before `now_ms`,
    /// and whether a session other than `session` made any of them.
    pub(super) fn route_rate(
        &self,
        key_id: &str,
        prefix: Option<&Hash>,
        session: &Hash,
        now_ms: u64,
        window_ms: u64,
    ) -> (u64, bool) {
        let Some(times) = prefix.and_then(|p| self.route_times.get(key_id)?.get(p)) else {
            return (0, false);
        };
        times
            .iter()
            .filter(|(t, _)| now_ms.saturating_sub(*t) < window_ms)
            .fold((0, false), |(n, shared), (_, s)| {
                (n + 1, shared || s != session)
            })
    }

    /// A forwarded call: its session's figures and its prefix's rate move.
    pub(super) fn note_forwarded(
        &mut self,
        key_id: &str,
        shape: &RequestShape,
        now_ms: u64,
        after_pause: bool,
    ) {
        let next = self
            .session_cache(key_id, &shape.session)
            .forwarded(now_ms, after_pause);
        self.session_cache.put(key_id, shape.session, next, now_ms);
        if let Some(prefix) = shape.route_prefix {
            let prefixes = self.route_times.entry(key_id.to_string()).or_default();
            // Swept when the map has doubled past the bound, not at every call over it: with
            // more distinct prefixes than that in one minute, a sweep at every call would walk
            // them all each time. A prefix's own times are filtered by the window when read.
            if prefixes.len() > ROUTE_PREFIXES_KEPT && prefixes.len().is_power_of_two() {
                prefixes.retain(|_, t| {
                    t.back()
                        .is_some_and(|&(b, _)| now_ms.saturating_sub(b) < ROUTE_WINDOW_MS)
                });
            }
            let times = prefixes.entry(prefix).or_default();
            while times
                .front()
                .is_some_and(|&(t, _)| now_ms.saturating_sub(t) >= ROUTE_WINDOW_MS)
            {
                times.pop_front();
            }
            times.push_back((now_ms, shape.session));
            if times.len() > ROUTE_TIMES_KEPT {
                times.pop_front();
            }
        }
    }

    /// A settled call of a session: its prompt and its cache writes.
    pub(super) fn note_settled(&mut self, key_id: &str, session: &Hash, usage: &Usage) {
        if let Some(s) = self.session_cache.get_mut(key_id, session) {
            let prompt = usage
                .input
                .saturating_add(usage.cache_write)
                .saturating_add(usage.cache_read);
            *s = s.settled(prompt);
        }
    }

    /// What this key's memory holds of the request's prompt prefixes.
    pub(super) fn cache_recall(&self, key: &KeyConfig, points: &[CachePoint]) -> Vec<PointMemory> {
        self.cache_memory
            .get(&*key.id)
            .map(|m| m.recall(points))
            .unwrap_or_default()
    }

    pub(super) fn budget_state(&self, key_id: &str, now_ms: u64) -> Option<BudgetState> {
        let b = self.budgets.get(key_id)?;
        let ceiling = b.ceiling_nano?;
        Some(BudgetState {
            ceiling_nano: ceiling,
            spend_nano: b.spend_in_period(now_ms),
            reserved_nano: self.reservations.reserved(key_id),
        })
    }

    pub(super) fn add_spend(&mut self, key_id: &str, at_ms: u64, nano: u64) {
        if let Some(b) = self.budgets.get_mut(key_id) {
            let day = b.spend_by_day.entry(at_ms / DAY_MS).or_default();
            *day = day.saturating_add(nano);
        }
    }

    /// Put a pending or approved hold in memory, indexed by its key and fingerprint (a later
    /// hold for the same request replaces an earlier one in the index).
    pub(super) fn open_hold(&mut self, row: HoldRow, opened: Option<Arc<GateOutcome>>) {
        if let Some(fp) = row.fingerprint {
            self.hold_index
                .entry(row.key_id.clone())
                .or_default()
                .insert(fp, row.hold_id.clone());
        }
        self.holds
            .insert(row.hold_id.clone(), OpenHold { row, opened });
    }

    /// Take a hold out of memory once it is used, expired or denied.
    pub(super) fn close_hold(&mut self, hold_id: &str) -> Option<OpenHold> {
        let hold = self.holds.remove(hold_id)?;
        if let Some(fp) = hold.row.fingerprint {
            if let Some(by_fp) = self.hold_index.get_mut(&hold.row.key_id) {
                if by_fp.get(&fp).is_some_and(|id| id == hold_id) {
                    by_fp.remove(&fp);
                }
                if by_fp.is_empty() {
                    self.hold_index.remove(&hold.row.key_id);
                }
            }
        }
        Some(hold)
    }

    /// The open, unexpired hold for this key and request, if any.
    pub(super) fn hold_for(
        &self,
        key_id: &str,
        fingerprint: &Hash,
        now_ms: u64,
    ) -> Option<&OpenHold> {
        let id = self.hold_index.get(key_id)?.get(fingerprint)?;
        self.holds
            .get(id)
            .filter(|h| now_ms < h.row.expires_ms && h.row.key_id == key_id)
    }

    /// The approved hold that releases this request: the one it names (`x-tokensaver-hold`,
    /// the digest's `hold_id`) if that is approved and bound to this key and fingerprint,
    /// else the key's approved hold for this fingerprint (SPEC §2.7: off-the-shelf clients
    /// cannot add a header).
    pub(super) fn approval_for(
        &self,
        named: Option<&str>,
        key_id: &str,
        fingerprint: &Hash,
        now_ms: u64,
    ) -> Option<String> {
        let usable = |h: &OpenHold| {
            h.row.state == HoldState::Approved
                && h.row.key_id == key_id
                && now_ms < h.row.expires_ms
                && h.row.fingerprint.as_ref() == Some(fingerprint)
        };
        if let Some(h) = named
            .and_then(|id| self.holds.get(id))
            .filter(|h| usable(h))
        {
            return Some(h.row.hold_id.clone());
        }
        self.hold_for(key_id, fingerprint, now_ms)
            .filter(|h| usable(h))
            .map(|h| h.row.hold_id.clone())
    }

    /// The key's attending lease, if one runs at `now_ms`.
    pub(super) fn lease_for(&self, key_id: &str, now_ms: u64) -> Option<&LeaseRow> {
        self.leases.get(key_id).filter(|l| now_ms < l.until_ms)
    }

    /// Keep the lease that ends last for its key.
    pub(super) fn add_lease(&mut self, lease: LeaseRow) {
        match self.leases.get(&lease.key_id) {
            Some(current) if current.until_ms >= lease.until_ms => {}
            _ => {
                self.leases.insert(lease.key_id.clone(), lease);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokensaver_core::gate::windows::REMEMBERED_TOTAL;

    fn usage(output: u64) -> Usage {
        Usage {
            output,
            ..Usage::default()
        }
    }

    /// ... and across keys: past `limits.remembered_entries` the oldest record of any key goes,
    /// so many keys each under their own cap cannot add up past the total.
    #[test]
    fn recorded_usage_is_bounded_across_keys() {
        let mut r = RecordedUsage::new(3);
        for (i, key) in ["a", "b", "c", "d"].into_iter().enumerate() {
            r.put(
                key,
                Hash([1; 32]),
                WireForm::Json,
                usage(i as u64),
                1_000 + i as u64,
            );
        }
        assert_eq!(r.len(), 3);
        assert_eq!(r.get("a", &Hash([1; 32]), WireForm::Json, 2_000), None);
        assert_eq!(
            r.get("d", &Hash([1; 32]), WireForm::Json, 2_000),
            Some(usage(3))
        );
        r.forget("d");
        assert_eq!(r.len(), 2);
    }

    /// Recorded usage is bounded by age and by count: a proxy that settles a reproducible call
    /// of its own fingerprint every time keeps at most the cap, and a day-old record serves
    /// nothing.
    #[test]
    fn recorded_usage_is_kept_a_day_and_at_most_the_cap() {
        let mut r = RecordedUsage::new(REMEMBERED_TOTAL);
        let day = RecordedUsage::TTL_MS;
        r.put("k", Hash([1; 32]), WireForm::Json, usage(7), 1_000);
        assert_eq!(
            r.get("k", &Hash([1; 32]), WireForm::Json, 1_000 + day - 1),
            Some(usage(7))
        );
        assert_eq!(
            r.get("k", &Hash([1; 32]), WireForm::Json, 1_000 + day),
            None
        );
        assert_eq!(r.get("k", &Hash([1; 32]), WireForm::Sse, 1_000), None);
        // A record a day later drops the day-old one.
        r.put("k", Hash([2; 32]), WireForm::Json, usage(8), 1_000 + day);
        assert_eq!(r.len(), 1);
        for i in 0..RecordedUsage::CAP as u64 + 10 {
            let mut fp = [0u8; 32];
            fp[..8].copy_from_slice(&i.to_le_bytes());
            r.put("k", Hash(fp), WireForm::Json, usage(i), 2_000 + day + i);
        }
        assert_eq!(r.len(), RecordedUsage::CAP);
        // The oldest went first; the newest is kept.
        let newest = RecordedUsage::CAP as u64 + 9;
        let mut fp = [0u8; 32];
        fp[..8].copy_from_slice(&newest.to_le_bytes());
        assert_eq!(
            r.get("k", &Hash(fp), WireForm::Json, 2_000 + day + newest),
            Some(usage(newest))
        );
        assert_eq!(
            r.get("k", &Hash([0; 32]), WireForm::Json, 2_000 + day + newest),
            None
        );
    }
}
