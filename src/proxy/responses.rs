//! The response registry: which key created each stored Responses object, and the context
//! the provider billed for it (issue 20.7, 20.4c).
//!
//! Every key shares the provider's credential, so the provider would let any key read, delete
//! or cancel any stored response, or continue it with `previous_response_id`. The gate sees
//! each id in the answer it relays (a JSON answer's top-level `id`; a stream's
//! `response.created` … `response.completed` events; a background response's first answer)
//! and binds it to the caller's key; every pass-through route and every chained call is then
//! refused to any other key with one closed-form 404 that never says whether the id exists.
//! An id bound to nobody (created before this build, or through another gate) is refused to
//! every key: the registry fails closed.
//!
//! Bindings are written through the durable store, and the write is awaited before the id
//! reaches the client: the embedded SQLite store (`responses`, migration 8, group-committed
//! like a decision), or, in a fleet, PostgreSQL (`fleet_responses`, pg migration 5) so that
//! every instance knows it. The recent ones are kept in memory too (two generations of bounded size), so a
//! caller that reads its response at once never waits for a commit.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use super::usage::{response_seen, AnswerEnd, SseTap};
use crate::error::GateError;
use crate::gatekeeper::Gatekeeper;
use crate::store::ResponseBinding;
use tokensaver_core::request::Hash;

/// Bindings per memory generation; the older generation is dropped when the newer fills up
/// (by then its bindings have long been committed and are read from the store).
const GENERATION: usize = 50_000;

/// A response id the gate binds and looks up: what providers issue (`resp_…`), bounded.
pub fn valid_response_id(id: &str) -> bool {
    (1..=128).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// The one refusal for a response id the caller's key did not create: the same whether the
/// id exists, belongs to another key, or was never seen (closed form: the id is not echoed).
pub fn not_found() -> GateError {
    GateError::UnknownResponse
}

/// What a relayed `POST /v1/responses` answer says of the stored object.
pub(super) struct AnswerSeen {
    pub id: Option<String>,
    pub context_tokens: Option<u64>,
    /// The JSON text of its output items, when the answer finished.
    pub output: Option<String>,
}

/// What a relayed `POST /v1/responses` answer, read to its end, says of the stored object:
/// its id (a stream's first event that carries one, or the JSON answer's top-level `id`), the
/// context the provider billed for it (input plus output tokens of the terminal event or of
/// the JSON answer; `None` for a background response still queued, or a stream that broke off
/// before its terminal event), and its output items.
pub(super) fn seen_in_answer(tap: Option<&SseTap>, json_body: &[u8], end: AnswerEnd) -> AnswerSeen {
    match tap {
        Some(t) => {
            let finished = matches!(end, AnswerEnd::Finished | AnswerEnd::Failed);
            AnswerSeen {
                id: t.response_id().map(str::to_string),
                context_tokens: t
                    .usage()
                    .filter(|_| finished)
                    .map(|billed| billed.usage.total()),
                output: t.response_output().map(str::to_string),
            }
        }
        None => match response_seen(json_body) {
            Some(seen) => AnswerSeen {
                id: Some(seen.id),
                context_tokens: seen.context_tokens,
                output: seen.output,
            },
            None => AnswerSeen {
                id: None,
                context_tokens: None,
                output: None,
            },
        },
    }
}

/// A chained call whose predecessor's context the gate has not seen (a background response
/// not yet read back complete, or an answer that broke off): the worst case has no bound.
pub fn context_unknown() -> GateError {
    GateError::ChainedContextUnknown
}

/// A Responses call naming a `conversation`: refused (the gate binds no conversation to a key).
pub fn conversation_not_gated() -> GateError {
    GateError::ConversationNotGated
}

/// The registry lookup could not be made (the fleet's database is unreachable): fail closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unavailable;

/// What the registry knows of a stored response: who created it, through which upstream, the
/// context billed for it and its answer's identity (the last two once known).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Owned {
    pub key_id: String,
    pub context_tokens: Option<u64>,
    /// The named upstream it was created on (`None`: the shape's default).
    pub upstream: Option<String>,
    /// Its answer's identity (`request::answer_identity_of`), keyed with its key's secret.
    pub answer: Option<Hash>,
}

#[derive(Default)]
struct Generations {
    current: HashMap<String, Owned>,
    previous: HashMap<String, Owned>,
}

impl Generations {
    fn get(&self, id: &str) -> Option<&Owned> {
        self.current.get(id).or_else(|| self.previous.get(id))
    }

    /// Keep `entry` for `id` unless another key holds it; returns what is kept. The upstream
    /// is the first one seen; a figure, once known, is kept.
    fn put(&mut self, id: &str, entry: Owned) -> Owned {
        let kept = match self.get(id) {
            Some(known) if known.key_id != entry.key_id => known.clone(),
            Some(known) => Owned {
                key_id: entry.key_id,
                context_tokens: entry.context_tokens.or(known.context_tokens),
                upstream: known.upstream.clone().or(entry.upstream),
                answer: entry.answer.or(known.answer),
            },
            None => entry,
        };
        if !self.current.contains_key(id) && self.current.len() >= GENERATION {
            self.previous = std::mem::take(&mut self.current);
        }
        self.current.insert(id.to_string(), kept.clone());
        kept
    }
}

#[derive(Default)]
pub struct Registry {
    recent: Mutex<Generations>,
}

fn lock(m: &Mutex<Generations>) -> MutexGuard<'_, Generations> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Registry {
    /// Bind `id` to its creator (the first key keeps it), with what is known of it. In a fleet
    /// this returns once PostgreSQL has the binding (or could not take it: the id then fails
    /// closed on the other instances, and after a restart).
    pub async fn bind(&self, gatekeeper: &Gatekeeper, id: &str, created: Owned, now_ms: u64) {
        if !valid_response_id(id) {
            return;
        }
        let key_id = created.key_id.clone();
        let kept = lock(&self.recent).put(id, created);
        if kept.key_id != key_id {
            return;
        }
        let binding = ResponseBinding {
            response_id: id.to_string(),
            key_id,
            created_ms: now_ms,
            context_tokens: kept.context_tokens,
            upstream: kept.upstream,
            answer: kept.answer,
        };
        // Awaited: the id reaches the client only once the binding is committed, so a crash
        // after it cannot leave the caller a response its key no longer owns.
        if gatekeeper.bind_response(binding).await.is_err() {
            tracing::warn!("a response binding was not written");
        }
    }

    /// What the gate knows of `id`: `Ok(None)` when it never saw it created (or the id is not
    /// one it would bind).
    pub async fn owner(
        &self,
        gatekeeper: &Gatekeeper,
        id: &str,
    ) -> Result<Option<Owned>, Unavailable> {
        if !valid_response_id(id) {
            return Ok(None);
        }
        let cached = lock(&self.recent).get(id).cloned();
        match &cached {
            // An owner never changes; a context figure, once known, neither. A state no other
            // process writes holds no binding this process has not seen, so memory is current.
            Some(e) if e.context_tokens.is_some() || !gatekeeper.shared() => {
                return Ok(Some(e.clone()));
            }
            _ => {}
        }
        let read = gatekeeper
            .response_binding(id)
            .await
            .map_err(|_| Unavailable)?;
        let Some(b) = read else {
            return Ok(cached);
        };
        let kept = lock(&self.recent).put(
            id,
            Owned {
                key_id: b.key_id,
                context_tokens: b.context_tokens,
                upstream: b.upstream,
                answer: b.answer,
            },
        );
        Ok(Some(kept))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(key: &str, context: Option<u64>) -> Owned {
        Owned {
            key_id: key.into(),
            context_tokens: context,
            ..Owned::default()
        }
    }

    #[test]
    fn the_first_key_keeps_an_id_and_only_it_fills_in_the_context() {
        let mut g = Generations::default();
        assert_eq!(g.put("resp_1", entry("alpha", None)), entry("alpha", None));
        assert_eq!(
            g.put("resp_1", entry("beta", Some(9))),
            entry("alpha", None)
        );
        assert_eq!(
            g.put("resp_1", entry("alpha", Some(7))),
            entry("alpha", Some(7))
        );
        // A later binding without a figure keeps the known one.
        assert_eq!(
            g.put("resp_1", entry("alpha", None)),
            entry("alpha", Some(7))
        );
    }

    #[test]
    fn memory_holds_two_generations() {
        let mut g = Generations::default();
        for i in 0..GENERATION {
            g.put(&format!("resp_{i}"), entry("alpha", Some(1)));
        }
        g.put("resp_next", entry("alpha", Some(1)));
        assert!(
            g.get("resp_0").is_some(),
            "the older generation is still read"
        );
        assert!(g.get("resp_next").is_some());
        assert_eq!(g.current.len(), 1);
    }

    #[test]
    fn only_provider_shaped_ids_are_bound() {
        assert!(valid_response_id("resp_0123456789abcdef01234567"));
        assert!(valid_response_id("resp-A_b"));
        for bad in ["", "resp_1/../x", "résp", "resp 1", &"r".repeat(129)] {
            assert!(!valid_response_id(bad), "{bad}");
        }
    }
}
