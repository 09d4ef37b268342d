//! The answers the proxy is relaying now, whose reservations stay live until their usage
//! settles them (SPEC §4: "a reservation stays live while its answer is still streaming").
//!
//! A relay registers its decision for as long as it runs ([`Gatekeeper::relaying`]); the
//! background tick, every second, renews the reservation of each relay whose last renewal is
//! a third of the TTL old (two renewals may be late or fail before one expires), in whichever
//! home the reservation lives (memory, the fleet's database, or a digest client's central
//! gate). This used to be a timer per
//! forwarded request beside its exchange: a timer registered and cancelled on every call,
//! under the runtime's timer lock and now and then waking the other worker, for a renewal that
//! almost no answer lives long enough to need.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::receipt::DecisionId;

use super::{lock, Gatekeeper};

/// One relay in flight: when its reservation was last renewed (or the relay began).
struct Relay {
    renewed_ms: u64,
}

/// Relays in flight, by decision.
#[derive(Default)]
pub(super) struct Relays(Mutex<HashMap<DecisionId, Relay>>);

impl Relays {
    /// The relays whose renewal is due at `now_ms` — a third of their reservation's TTL
    /// after the last — marked renewed now.
    fn due(&self, now_ms: u64, ttl_ms: u64) -> Vec<DecisionId> {
        let mut relays = lock(&self.0);
        relays
            .iter_mut()
            .filter(|(_, r)| now_ms.saturating_sub(r.renewed_ms) >= (ttl_ms / 3).max(1))
            .map(|(id, r)| {
                r.renewed_ms = now_ms;
                *id
            })
            .collect()
    }
}

/// A relay in flight: registered while it lives.
pub struct Relaying<'g> {
    gatekeeper: &'g Gatekeeper,
    decision_id: DecisionId,
}

impl Drop for Relaying<'_> {
    fn drop(&mut self) {
        lock(&self.gatekeeper.relays.0).remove(&self.decision_id);
    }
}

impl Gatekeeper {
    /// Keep this decision's reservation live while the returned guard lives: the answer is
    /// being relayed, and its usage will settle it.
    pub fn relaying(&self, decision_id: DecisionId, now_ms: u64) -> Relaying<'_> {
        let relay = Relay { renewed_ms: now_ms };
        lock(&self.relays.0).insert(decision_id, relay);
        Relaying {
            gatekeeper: self,
            decision_id,
        }
    }

    /// Renew the reservations of the relays that are due (a third of the TTL since the last),
    /// in the home that holds them (memory, a fleet's database, or a central gate). Run by the
    /// background tick before expiry.
    pub(super) async fn renew_relays(&self, now_ms: u64) {
        for id in self.relays.due(now_ms, self.reservation_ttl_ms()) {
            self.renew(&id, now_ms).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_relay_is_due_a_third_of_a_ttl_after_its_last_renewal() {
        let relays = Relays::default();
        let (a, b) = (DecisionId([1; 32]), DecisionId([2; 32]));
        let at = |renewed_ms| Relay { renewed_ms };
        lock(&relays.0).insert(a, at(1_000));
        lock(&relays.0).insert(b, at(1_500));
        let due = |now| -> Vec<DecisionId> { relays.due(now, 3_000) };
        assert!(due(1_999).is_empty());
        assert_eq!(due(2_000), vec![a]);
        // Renewed at 2,000: due again at 3,000; b at 2,500.
        assert_eq!(due(2_600), vec![b]);
        assert_eq!(due(2_999), Vec::<DecisionId>::new());
        let mut both = due(3_600);
        both.sort();
        assert_eq!(both, vec![a, b]);
    }
}
