//! The open reservations of this process (SPEC §4): the worst case each forwarded decision
//! holds until the provider's usage settles it, or its TTL charges it.
//!
//! Each key's reserved total is kept as reservations open and close, so a budgeted decision
//! reads it in one lookup. It used to be a scan of every open reservation of every key, under
//! the state lock, on each budgeted request — and a digest client that asks `POST /gate` and
//! never records leaves its reservations open for the whole TTL, so one key could slow every
//! other key's decisions at will.

use std::collections::HashMap;
use std::sync::Arc;

use crate::receipt::DecisionId;
use tokensaver_core::request::{Hash, WireForm};

use super::RecordSource;

pub(super) struct Reservation {
    pub key_id: Arc<str>,
    pub fingerprint: Hash,
    /// The model the decision sent the call to: usage is priced at this model, whatever a
    /// digest client claims.
    pub served_model: String,
    pub wire: WireForm,
    pub nano: u64,
    /// The decision's output ceiling (tokens): bounds the charge of an incomplete answer.
    pub output_ceiling: Option<u64>,
    /// The decision's input worst case (tokens): with the output ceiling, what a digest
    /// client's record may report at most (`RecordBound`).
    pub input_tokens: u64,
    pub expires_ms: u64,
    pub reusable: bool,
    /// The one party that may settle it.
    pub recorded_by: RecordSource,
    /// What the gate did to the call's caching: its usage row carries the derived savings of
    /// those mechanisms.
    pub cache_edits: tokensaver_core::gate::cache::CacheEdits,
    /// The call's agent session: its settled usage feeds the session's cache figures.
    pub session: Hash,
}

#[derive(Default)]
pub(super) struct Reservations {
    by_id: HashMap<DecisionId, Reservation>,
    /// Key → its open reservations' total; a key with none has no entry.
    by_key: HashMap<Arc<str>, KeyTotal>,
}

/// Exact (`u128`: no sum of `u64`s overflows it), so closing a reservation subtracts exactly
/// what opening it added.
#[derive(Default)]
struct KeyTotal {
    nano: u128,
    open: usize,
}

impl Reservations {
    /// Open a decision's reservation (replacing one under the same id, which never happens:
    /// ids are unique, but the sums stay right if it did).
    pub fn open(&mut self, id: DecisionId, r: Reservation) {
        let total = self.by_key.entry(r.key_id.clone()).or_default();
        total.nano += u128::from(r.nano);
        total.open += 1;
        if let Some(old) = self.by_id.insert(id, r) {
            self.subtract(&old);
        }
    }

    /// Close a reservation (settled, charged, or taken out to be checked): it no longer counts.
    pub fn close(&mut self, id: &DecisionId) -> Option<Reservation> {
        let r = self.by_id.remove(id)?;
        self.subtract(&r);
        Some(r)
    }

    pub fn get(&self, id: &DecisionId) -> Option<&Reservation> {
        self.by_id.get(id)
    }

    /// Keep a reservation open until at least `until_ms`.
    pub fn renew(&mut self, id: &DecisionId, until_ms: u64) {
        if let Some(r) = self.by_id.get_mut(id) {
            r.expires_ms = r.expires_ms.max(until_ms);
        }
    }

    /// What the key's open reservations hold in all (saturating, as a budget reads it).
    pub fn reserved(&self, key_id: &str) -> u64 {
        self.by_key
            .get(key_id)
            .map_or(0, |t| u64::try_from(t.nano).unwrap_or(u64::MAX))
    }

    /// The reservations whose TTL has run out at `now_ms`.
    pub fn expired(&self, now_ms: u64) -> Vec<DecisionId> {
        self.by_id
            .iter()
            .filter(|(_, r)| r.expires_ms <= now_ms)
            .map(|(id, _)| *id)
            .collect()
    }

    fn subtract(&mut self, r: &Reservation) {
        if let Some(total) = self.by_key.get_mut(&*r.key_id) {
            total.nano -= u128::from(r.nano);
            total.open -= 1;
            if total.open == 0 {
                self.by_key.remove(&*r.key_id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reservation(key: &str, nano: u64) -> Reservation {
        Reservation {
            key_id: Arc::from(key),
            fingerprint: Hash([0; 32]),
            served_model: "m".to_owned(),
            wire: WireForm::Json,
            nano,
            output_ceiling: None,
            input_tokens: 0,
            expires_ms: 1_000,
            reusable: false,
            recorded_by: RecordSource::Proxy,
            cache_edits: Default::default(),
            session: Hash::default(),
        }
    }

    fn id(n: u8) -> DecisionId {
        DecisionId([n; 32])
    }

    /// The kept totals equal a scan of every open reservation, as reservations open, are
    /// replaced, renewed and close, and a sum past `u64::MAX` reads saturated, as the scan's
    /// saturating fold did.
    #[test]
    fn each_keys_total_is_the_sum_of_its_open_reservations() {
        let mut rs = Reservations::default();
        let scan = |rs: &Reservations, key: &str| {
            rs.by_id
                .values()
                .filter(|r| &*r.key_id == key)
                .fold(0u64, |sum, r| sum.saturating_add(r.nano))
        };
        rs.open(id(1), reservation("a", 5));
        rs.open(id(2), reservation("a", 7));
        rs.open(id(3), reservation("b", 11));
        assert_eq!((rs.reserved("a"), rs.reserved("b")), (12, 11));
        rs.open(id(2), reservation("b", 1));
        assert_eq!((rs.reserved("a"), rs.reserved("b")), (5, 12));
        rs.renew(&id(1), 9_000);
        assert_eq!(rs.get(&id(1)).map(|r| r.expires_ms), Some(9_000));
        let mut expired = rs.expired(1_000);
        expired.sort();
        assert_eq!(expired, vec![id(2), id(3)]);
        assert_eq!(rs.close(&id(1)).map(|r| r.nano), Some(5));
        assert!(rs.close(&id(1)).is_none());
        assert_eq!(rs.reserved("a"), 0);
        assert!(
            !rs.by_key.contains_key("a"),
            "a key with nothing open leaves no entry"
        );
        rs.open(id(4), reservation("b", u64::MAX));
        assert_eq!(rs.reserved("b"), u64::MAX);
        assert_eq!(rs.reserved("b"), scan(&rs, "b"));
        rs.close(&id(4));
        assert_eq!(rs.reserved("b"), 12);
        assert_eq!(rs.reserved("b"), scan(&rs, "b"));
    }
}
