//! The answers the proxy is relaying now, whose reservations stay live until their usage
//! settles them (SPEC §4: "a reservation stays live while its answer is still streaming").
//!
//! A relay registers its decision for as long as it runs ([`Gatekeeper::relaying`]); the
//! background tick, every second, renews the reservation of each relay whose last renewal is
//! a third of the TTL old (two renewals may be late or fail before one expires), in whichever
//! home the reservation lives (memory, or the fleet's database). This used to be a timer per
//! forwarded request beside its exchange: a timer registered and cancelled on every call,
//! under the runtime's timer lock and now and then waking the other worker, for a renewal that
//! almost no answer lives long enough to need.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::receipt::DecisionId;

use super::{lock, Gatekeeper};

/// Where a reservation lives that is not this gatekeeper's: a digest-mode instance relays
/// answers the central gate decided, and renews their reservations there (`POST /renew`).
pub trait RemoteRenewal: Send + Sync {
    /// The remote reservation's TTL, when the remote gate stated it (else this gate's is
    /// assumed).
    fn ttl_ms(&self) -> Option<u64>;
    fn renew<'a>(
        &'a self,
        decision_id: &'a DecisionId,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'a>>;
}

/// One relay in flight: when its reservation was last renewed (or the relay began), and where
/// it lives (`None`: this gatekeeper's home).
struct Relay {
    renewed_ms: u64,
    remote: Option<Arc<dyn RemoteRenewal>>,
}

/// Relays in flight, by decision.
#[derive(Default)]
pub(super) struct Relays(Mutex<HashMap<DecisionId, Relay>>);

type Due = (DecisionId, Option<Arc<dyn RemoteRenewal>>);

impl Relays {
    /// The relays whose renewal is due at `now_ms` — a third of their reservation's TTL
    /// (`ttl_ms` here, or the remote gate's) after the last — marked renewed now.
    fn due(&self, now_ms: u64, ttl_ms: u64) -> Vec<Due> {
        let mut relays = lock(&self.0);
        relays
            .iter_mut()
            .filter(|(_, r)| {
                let ttl = r.remote.as_ref().and_then(|g| g.ttl_ms()).unwrap_or(ttl_ms);
                now_ms.saturating_sub(r.renewed_ms) >= (ttl / 3).max(1)
            })
            .map(|(id, r)| {
                r.renewed_ms = now_ms;
                (*id, r.remote.clone())
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
    pub fn relaying(
        &self,
        decision_id: DecisionId,
        now_ms: u64,
        remote: Option<Arc<dyn RemoteRenewal>>,
    ) -> Relaying<'_> {
        let relay = Relay {
            renewed_ms: now_ms,
            remote,
        };
        lock(&self.relays.0).insert(decision_id, relay);
        Relaying {
            gatekeeper: self,
            decision_id,
        }
    }

    /// Renew the reservations of the relays that are due (a third of the TTL since the last),
    /// wherever they live. Run by the background tick before expiry.
    pub(super) async fn renew_relays(&self, now_ms: u64) {
        for (id, remote) in self.relays.due(now_ms, self.core.config.reservation_ttl_ms) {
            match remote {
                Some(remote) => remote.renew(&id).await,
                None => self.renew(&id, now_ms).await,
            }
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
        let at = |renewed_ms| Relay {
            renewed_ms,
            remote: None,
        };
        lock(&relays.0).insert(a, at(1_000));
        lock(&relays.0).insert(b, at(1_500));
        let due = |now| -> Vec<DecisionId> {
            relays
                .due(now, 3_000)
                .into_iter()
                .map(|(id, _)| id)
                .collect()
        };
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
