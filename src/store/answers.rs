//! Stored answers: the exact bytes a provider returned, in a bounded LRU keyed by
//! (key, fingerprint, wire form). An answer is never converted between wire forms and never
//! served to another key: both are part of the key of the map.

use std::sync::Arc;

use bytes::Bytes;
use lru::LruCache;

use tokensaver_core::request::{Hash, WireForm};

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AnswerKey {
    pub key_id: Arc<str>,
    pub fingerprint: Hash,
    pub wire: WireForm,
}

#[derive(Debug, Clone)]
pub struct StoredAnswer {
    pub content_type: String,
    pub body: Bytes,
    /// An OpenAI chat stream without the usage chunk the gate asked for on the caller's behalf,
    /// cut once when the answer is stored: what a SERVE gives a client that did not ask for
    /// usage. `None`: not such a stream, or not cut yet (the fleet's answers, read per request).
    pub without_usage: Option<Bytes>,
}

impl StoredAnswer {
    /// The bytes the store keeps for it (both forms of a stream), as the cap counts them.
    pub fn size(&self) -> usize {
        self.body.len() + self.without_usage.as_ref().map_or(0, Bytes::len)
    }
}

pub struct AnswerStore {
    lru: LruCache<AnswerKey, Arc<StoredAnswer>>,
    bytes: usize,
    cap_bytes: usize,
}

impl AnswerStore {
    pub fn new(cap_bytes: usize) -> Self {
        Self {
            lru: LruCache::unbounded(),
            bytes: 0,
            cap_bytes,
        }
    }

    pub fn get(&mut self, key: &AnswerKey) -> Option<Arc<StoredAnswer>> {
        self.lru.get(key).cloned()
    }

    /// Store an answer, evicting least-recently-used ones to stay within the byte cap.
    /// An answer larger than the whole cap is not stored.
    pub fn put(&mut self, key: AnswerKey, answer: StoredAnswer) -> bool {
        let size = answer.size();
        if size > self.cap_bytes {
            return false;
        }
        if let Some(old) = self.lru.pop(&key) {
            self.bytes -= old.size();
        }
        while self.bytes + size > self.cap_bytes {
            match self.lru.pop_lru() {
                Some((_, old)) => self.bytes -= old.size(),
                None => break,
            }
        }
        self.bytes += size;
        self.lru.put(key, Arc::new(answer));
        true
    }

    /// Delete every answer of a key (POST /forget).
    pub fn forget(&mut self, key_id: &str) -> usize {
        let doomed: Vec<AnswerKey> = self
            .lru
            .iter()
            .filter(|(k, _)| &*k.key_id == key_id)
            .map(|(k, _)| k.clone())
            .collect();
        for k in &doomed {
            if let Some(old) = self.lru.pop(k) {
                self.bytes -= old.size();
            }
        }
        doomed.len()
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(id: &str, n: u8, wire: WireForm) -> AnswerKey {
        AnswerKey {
            key_id: id.into(),
            fingerprint: Hash([n; 32]),
            wire,
        }
    }

    fn answer(len: usize) -> StoredAnswer {
        StoredAnswer {
            content_type: "application/json".into(),
            body: Bytes::from(vec![b'x'; len]),
            without_usage: None,
        }
    }

    #[test]
    fn byte_cap_evicts_least_recent_and_scopes_by_key_and_wire() {
        let mut s = AnswerStore::new(100);
        assert!(s.put(key("a", 1, WireForm::Json), answer(60)));
        assert!(s.put(key("a", 2, WireForm::Json), answer(30)));
        assert!(s.get(&key("a", 1, WireForm::Json)).is_some());
        assert!(s.put(key("a", 3, WireForm::Json), answer(30)));
        // 2 was least recently used.
        assert!(s.get(&key("a", 2, WireForm::Json)).is_none());
        assert!(s.bytes() <= 100);
        assert!(s.get(&key("a", 1, WireForm::Sse)).is_none());
        assert!(s.get(&key("b", 1, WireForm::Json)).is_none());
        assert!(!s.put(key("a", 9, WireForm::Json), answer(101)));
        assert_eq!(s.forget("a"), 2);
        assert_eq!(s.bytes(), 0);
    }
}
