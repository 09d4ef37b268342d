//! What the gate remembers of each key (the fingerprints behind the 24-hour repeat findings,
//! the usage a SERVE would not buy, each session's cache figures), bounded three ways: by age
//! (`ttl_ms`), per key (`per_key`) and in total (`total`, across every key).
//!
//! The per-key bound alone let the whole grow with the number of keys: 4,000 keys × 100,000
//! fingerprints is a bound no process reaches, so a gate fed distinct requests grew for a day.
//! Past the total, the entry evicted is the oldest of all keys', found in O(log keys) through
//! an ordered set of each key's oldest entry; each key's own entries stay an LRU, so `/forget`
//! deletes a key's entries without walking anyone else's.

use std::collections::{BTreeSet, HashMap};
use std::hash::Hash as StdHash;

use lru::LruCache;

pub struct KeyedMemory<K: StdHash + Eq, V> {
    /// Each key's slot in `keys`: a key's name is allocated once, the first time it records.
    index: HashMap<String, usize>,
    /// Newest at the front; each entry with the time it was put.
    keys: Vec<LruCache<K, (V, u64)>>,
    /// (time of the slot's oldest entry, slot), for every slot that holds one.
    oldest: BTreeSet<(u64, usize)>,
    len: usize,
    ttl_ms: u64,
    per_key: usize,
    total: usize,
}

impl<K: StdHash + Eq, V> KeyedMemory<K, V> {
    pub fn new(ttl_ms: u64, per_key: usize, total: usize) -> Self {
        KeyedMemory {
            index: HashMap::new(),
            keys: Vec::new(),
            oldest: BTreeSet::new(),
            len: 0,
            ttl_ms,
            per_key: per_key.max(1),
            total: total.max(1),
        }
    }

    /// A new total bound; entries past it go at once, the oldest first.
    pub fn set_total(&mut self, total: usize) {
        self.total = total.max(1);
        self.evict_past_total();
    }

    /// The value `key` put under `k` less than `ttl_ms` before `now`, without refreshing it.
    pub fn get(&self, key: &str, k: &K, now: u64) -> Option<&V> {
        let slot = *self.index.get(key)?;
        self.keys[slot]
            .peek(k)
            .filter(|(_, at)| now.saturating_sub(*at) < self.ttl_ms)
            .map(|(v, _)| v)
    }

    /// The value under `k` for `key`, to change in place: its age and place stay.
    pub fn get_mut(&mut self, key: &str, k: &K) -> Option<&mut V> {
        let slot = *self.index.get(key)?;
        self.keys[slot].peek_mut(k).map(|(v, _)| v)
    }

    /// Remember `v` under `k` for `key`, put at `now` (an entry already there moves to the
    /// front with its new time); then drop what the three bounds no longer allow.
    pub fn put(&mut self, key: &str, k: K, v: V, now: u64) {
        let slot = match self.index.get(key) {
            Some(&slot) => slot,
            None => {
                self.keys.push(LruCache::unbounded());
                self.index.insert(key.to_string(), self.keys.len() - 1);
                self.keys.len() - 1
            }
        };
        let before = self.oldest_of(slot);
        let lru = &mut self.keys[slot];
        if lru.put(k, (v, now)).is_none() {
            self.len += 1;
        }
        while lru.len() > self.per_key
            || lru
                .peek_lru()
                .is_some_and(|(_, (_, at))| now.saturating_sub(*at) >= self.ttl_ms)
        {
            lru.pop_lru();
            self.len -= 1;
        }
        self.reindex(slot, before);
        self.evict_past_total();
    }

    /// Delete every entry of `key`'s.
    pub fn forget(&mut self, key: &str) {
        let Some(&slot) = self.index.get(key) else {
            return;
        };
        let before = self.oldest_of(slot);
        self.len -= self.keys[slot].len();
        self.keys[slot].clear();
        self.reindex(slot, before);
    }

    /// Entries held, across every key.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Entries held for `key`.
    pub fn len_of(&self, key: &str) -> usize {
        self.index.get(key).map_or(0, |&slot| self.keys[slot].len())
    }

    fn oldest_of(&self, slot: usize) -> Option<u64> {
        self.keys[slot].peek_lru().map(|(_, (_, at))| *at)
    }

    fn reindex(&mut self, slot: usize, before: Option<u64>) {
        let after = self.oldest_of(slot);
        if before != after {
            if let Some(t) = before {
                self.oldest.remove(&(t, slot));
            }
            if let Some(t) = after {
                self.oldest.insert((t, slot));
            }
        }
    }

    fn evict_past_total(&mut self) {
        while self.len > self.total {
            let Some(&(t, slot)) = self.oldest.first() else {
                return;
            };
            self.keys[slot].pop_lru();
            self.len -= 1;
            self.reindex(slot, Some(t));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: u64 = 86_400_000;

    #[test]
    fn an_entry_is_read_for_its_lifetime_and_not_after() {
        let mut m: KeyedMemory<u32, u32> = KeyedMemory::new(DAY, 10, 100);
        m.put("a", 1, 7, 1_000);
        assert_eq!(m.get("a", &1, 1_000 + DAY - 1), Some(&7));
        assert_eq!(m.get("a", &1, 1_000 + DAY), None);
        assert_eq!(m.get("b", &1, 1_000), None);
        // A later put drops what the day no longer holds.
        m.put("a", 2, 8, 1_000 + DAY);
        assert_eq!((m.len(), m.len_of("a")), (1, 1));
    }

    #[test]
    fn each_key_keeps_its_newest_per_key_entries() {
        let mut m: KeyedMemory<u32, ()> = KeyedMemory::new(DAY, 3, 100);
        for i in 0..5 {
            m.put("a", i, (), 1_000 + u64::from(i));
        }
        assert_eq!(m.len_of("a"), 3);
        assert!(m.get("a", &1, 2_000).is_none());
        assert!(m.get("a", &2, 2_000).is_some());
        // Putting an entry again refreshes it: it is then the newest.
        m.put("a", 2, (), 3_000);
        m.put("a", 9, (), 3_001);
        assert!(m.get("a", &2, 3_002).is_some());
        assert!(m.get("a", &3, 3_002).is_none());
    }

    /// Past the total, the oldest entry of all keys goes, whichever key put it: a key that
    /// records nothing more still loses its old entries to the others' new ones.
    #[test]
    fn past_the_total_the_oldest_of_all_keys_goes_first() {
        let mut m: KeyedMemory<u32, ()> = KeyedMemory::new(DAY, 100, 4);
        m.put("quiet", 1, (), 10);
        m.put("busy", 1, (), 20);
        m.put("quiet", 2, (), 30);
        m.put("busy", 2, (), 40);
        assert_eq!(m.len(), 4);
        m.put("busy", 3, (), 50);
        assert_eq!(m.len(), 4);
        assert!(m.get("quiet", &1, 60).is_none(), "the oldest of all went");
        assert!(m.get("busy", &1, 60).is_some());
        m.put("busy", 4, (), 70);
        m.put("busy", 5, (), 80);
        // Oldest first: busy's 1 (20), then quiet's 2 (30).
        assert!(m.get("busy", &1, 90).is_none());
        assert!(m.get("quiet", &2, 90).is_none());
        assert_eq!((m.len_of("quiet"), m.len_of("busy")), (0, 4));
        // Tightening the total drops the oldest at once.
        m.set_total(2);
        assert_eq!(m.len(), 2);
        assert!(m.get("busy", &4, 90).is_some() && m.get("busy", &5, 90).is_some());
    }

    /// Forgetting a key deletes its entries and no one else's; the total bound then counts
    /// only what is left.
    #[test]
    fn forget_deletes_one_keys_entries() {
        let mut m: KeyedMemory<u32, ()> = KeyedMemory::new(DAY, 100, 3);
        m.put("a", 1, (), 10);
        m.put("b", 1, (), 20);
        m.put("a", 2, (), 30);
        m.forget("a");
        assert_eq!((m.len(), m.len_of("a"), m.len_of("b")), (1, 0, 1));
        assert!(m.get("a", &2, 40).is_none());
        m.put("c", 1, (), 40);
        m.put("c", 2, (), 50);
        assert_eq!(m.len(), 3);
        assert!(m.get("b", &1, 60).is_some(), "room was made by the forget");
        m.put("a", 3, (), 60);
        assert!(m.get("b", &1, 70).is_none(), "then the oldest goes again");
        m.forget("nobody");
        assert_eq!(m.len(), 3);
    }

    /// The bounds hold under any sequence: the total, each key's count and the index of
    /// oldest entries always agree with the entries held.
    #[test]
    fn the_counts_and_the_index_agree_after_any_sequence() {
        let mut m: KeyedMemory<u32, ()> = KeyedMemory::new(1_000, 5, 12);
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut now = 0;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            now += x % 40;
            let key = ["a", "b", "c", "d", "e"][(x >> 8) as usize % 5];
            if (x >> 16).is_multiple_of(50) {
                m.forget(key);
            } else {
                m.put(key, ((x >> 24) % 9) as u32, (), now);
            }
            let held: usize = m.keys.iter().map(LruCache::len).sum();
            assert_eq!(m.len(), held);
            assert!(m.len() <= 12);
            assert!(m.keys.iter().all(|k| k.len() <= 5));
            let oldest: BTreeSet<_> = (0..m.keys.len())
                .filter_map(|s| m.oldest_of(s).map(|t| (t, s)))
                .collect();
            assert_eq!(oldest, m.oldest);
        }
    }
}
