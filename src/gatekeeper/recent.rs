//! The signed receipts of the latest decisions, kept in memory for the ledger page: the
//! store keeps a decision's figures but not its receipt (signals, finding codes, signature),
//! and the page lets a person verify the receipt of a decision it lists. Bounded; lost on
//! restart (the page says so for older rows).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use crate::receipt::{DecisionId, Envelope};

/// How many receipts are kept (a receipt envelope is about 2 KB).
pub const RECENT_RECEIPTS: usize = 1024;

#[derive(Default)]
pub struct RecentReceipts {
    order: VecDeque<DecisionId>,
    /// The envelope is the one the decision's answer carries, shared, not copied.
    by_id: HashMap<DecisionId, (Arc<str>, Arc<Envelope>)>,
}

impl RecentReceipts {
    /// Keep a committed decision's receipt; the oldest leaves when the ring is full.
    pub fn push(&mut self, decision_id: DecisionId, key_id: Arc<str>, envelope: Arc<Envelope>) {
        if self.by_id.contains_key(&decision_id) {
            return;
        }
        while self.order.len() >= RECENT_RECEIPTS {
            if let Some(old) = self.order.pop_front() {
                self.by_id.remove(&old);
            }
        }
        self.order.push_back(decision_id);
        self.by_id.insert(decision_id, (key_id, envelope));
    }

    /// The receipt of `decision_id`, if it is still kept and belongs to `key_id` (`None`:
    /// any key, the admin).
    pub fn get(&self, decision_id: &DecisionId, key_id: Option<&str>) -> Option<Envelope> {
        let (owner, envelope) = self.by_id.get(decision_id)?;
        key_id
            .is_none_or(|k| k == &**owner)
            .then(|| Envelope::clone(envelope))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(n: usize) -> Envelope {
        Envelope {
            body: format!("b{n}"),
            sig: "s".into(),
            kid: "k".into(),
            kind: None,
        }
    }

    /// The decision id named `d{n}` in this test.
    fn id(n: usize) -> DecisionId {
        crate::receipt::decision_id(format!("d{n}").as_bytes())
    }

    #[test]
    fn bounded_and_scoped_by_key() {
        let mut r = RecentReceipts::default();
        for n in 0..RECENT_RECEIPTS + 3 {
            let key = Arc::from(if n % 2 == 0 { "a" } else { "b" });
            r.push(id(n), key, Arc::new(env(n)));
        }
        assert_eq!(r.order.len(), RECENT_RECEIPTS);
        assert!(r.get(&id(0), None).is_none(), "the oldest left");
        let last = id(RECENT_RECEIPTS + 2);
        assert!(r.get(&last, Some("a")).is_some());
        assert!(
            r.get(&last, Some("b")).is_none(),
            "another key's receipt is unknown"
        );
        assert!(r.get(&last, None).is_some());
    }
}
