//! Shares on the 0.5 grid and the derivability self-check (criteria revision 1.2.0).
//!
//! Everything here is exact integer arithmetic on the unrounded values: the floored share of
//! a sub-count `x` of a total `t > 0` is `1` when `x == t`, `0.5` when `2x >= t`, else `0`.
//!
//! # The candidate box
//! For each part (name, description, schema) the criteria take the counts `d` whose measured
//! minimum byte length β(d) does not exceed the part's actual byte length `L`
//! (string parts: β(0)=0, β(1)=2, β(2)=3, β(c)=c for c ≥ 3; schema parts: β(0)=0, β(c)=c for
//! c ≥ 1), with an absent part fixed at 0 and a present part at 1 or more. Each present
//! part's candidate set is therefore an interval `[1, M]`:
//! string `L = 2 → M = 1`, string `L ≥ 3 → M = L`, schema `M = L`.
//! (A present string part is at least `""`, 2 bytes; a present schema at least 1 byte.)
//!
//! # Why the check is O(1)
//! A candidate's floored share vector (its *class*) depends only on which part, if any,
//! carries at least half of the total. With `x` a part and `y` the sum of the other two:
//! share 1 ⇔ `y = 0`; share 0.5 ⇔ `x ≥ y > 0`; share 0 ⇔ `x < y`. So the non-empty classes
//! of a box of intervals `[1, M]` (or `{0}`) are, with their sizes capped at two:
//!
//! | class | members | size |
//! |---|---|---|
//! | one part is the whole (`1,0,0`) | only that part present | `M_i` |
//! | two halves (`.5,.5,0`) | `x_i = x_j`, third absent | `min(M_i, M_j)`; unique member `(1,1)` |
//! | one half (`.5,0,0`), one other part present | `x_i > x_j ≥ 1` | 0 if `M_i ≤ 1`, 1 if `M_i = 2` (member `(2,1)`), else ≥ 2 |
//! | one half, both others present | `x_i ≥ x_j + x_k`, `x_j, x_k ≥ 1` | 0 if `M_i ≤ 1`, 1 if `M_i = 2` (member `(2,1,1)`), else ≥ 2 |
//! | all zero (`0,0,0`) | strict triangle, all present | `(1,1,1)`; ≥ 2 iff two of the `M` are ≥ 2 (`(2,2,1)`) |
//!
//! [`withheld`] uses this table; the unit tests compare it against a brute-force enumeration
//! of every box with per-part byte lengths up to 40 (all presence patterns), and check the
//! criteria's claim that only seven triples can ever be box-unique in a box of two or more
//! candidates.

/// A published share on the 0.5 grid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Share {
    Zero,
    Half,
    One,
}

impl Share {
    /// The floored share of `x` out of `t` (t > 0), decided on the unrounded value.
    pub fn floor_of(x: u64, t: u64) -> Share {
        if x >= t {
            Share::One
        } else if x.saturating_mul(2) >= t {
            Share::Half
        } else {
            Share::Zero
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Share::Zero => "0",
            Share::Half => "0.5",
            Share::One => "1",
        }
    }
}

/// The kind of a part, which selects its β table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PartKind {
    /// name, description: `JSON.stringify` of a string, at least `""`.
    String,
    /// inputSchema: `JSON.stringify` of any JSON value.
    Schema,
}

/// The kinds of (name, description, schema).
pub const PART_KINDS: [PartKind; 3] = [PartKind::String, PartKind::String, PartKind::Schema];

/// The measured minimum byte length β(d) of a part holding `d` tokens.
pub fn beta(kind: PartKind, d: u64) -> u64 {
    match (kind, d) {
        (PartKind::String, 1) => 2,
        (PartKind::String, 2) => 3,
        _ => d,
    }
}

/// One part's candidate counts: `{0}` when absent, `[1, max]` when present (empty if max = 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartRange {
    pub present: bool,
    pub max: u64,
}

impl PartRange {
    /// The candidate counts of a part of `kind` with UTF-8 byte length `bytes`.
    pub fn from_bytes(kind: PartKind, present: bool, bytes: u64) -> Self {
        if !present {
            return Self {
                present: false,
                max: 0,
            };
        }
        let max = match kind {
            PartKind::Schema => bytes,
            PartKind::String => {
                if bytes >= 3 {
                    bytes
                } else if bytes == 2 {
                    1
                } else {
                    0
                }
            }
        };
        Self { present, max }
    }

    fn lo(self) -> u64 {
        u64::from(self.present)
    }

    fn hi(self) -> u64 {
        if self.present {
            self.max
        } else {
            0
        }
    }

    fn is_empty(self) -> bool {
        self.present && self.max == 0
    }

    fn contains(self, d: u64) -> bool {
        d >= self.lo() && d <= self.hi()
    }

    fn size_is_one(self) -> bool {
        !self.present || self.max == 1
    }
}

/// A share class: the floored share vector of a candidate with a positive total.
pub type Class = [Share; 3];

/// The class of a triple, or `None` when its total is 0.
pub fn class_of(x: [u64; 3]) -> Option<Class> {
    let t = x[0].checked_add(x[1])?.checked_add(x[2])?;
    if t == 0 {
        return None;
    }
    Some([
        Share::floor_of(x[0], t),
        Share::floor_of(x[1], t),
        Share::floor_of(x[2], t),
    ])
}

/// How many candidates of `box_` lie in `class`, capped at 2; with the member when exactly one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Count {
    None,
    One([u64; 3]),
    Many,
}

fn cap(n: u64, member: [u64; 3]) -> Count {
    match n {
        0 => Count::None,
        1 => Count::One(member),
        _ => Count::Many,
    }
}

/// Count the members of `class` in a non-empty box (see the module table).
fn count_class(b: &[PartRange; 3], class: Class) -> Count {
    let mut ones = [0usize; 3];
    let mut n_ones = 0;
    let mut halves = [0usize; 3];
    let mut n_halves = 0;
    for (i, s) in class.iter().enumerate() {
        match s {
            Share::One => {
                ones[n_ones] = i;
                n_ones += 1;
            }
            Share::Half => {
                halves[n_halves] = i;
                n_halves += 1;
            }
            Share::Zero => {}
        }
    }
    match (n_ones, n_halves) {
        // One part is the whole: the others must be absent.
        (1, 0) => {
            let i = ones[0];
            if (0..3).all(|j| j == i || !b[j].present) && b[i].present {
                let mut m = [0; 3];
                m[i] = 1;
                cap(b[i].max, m)
            } else {
                Count::None
            }
        }
        // Two halves: equal parts, the third absent.
        (0, 2) => {
            let (i, j) = (halves[0], halves[1]);
            let k = 3 - i - j;
            if b[i].present && b[j].present && !b[k].present {
                let mut m = [0; 3];
                m[i] = 1;
                m[j] = 1;
                cap(b[i].max.min(b[j].max), m)
            } else {
                Count::None
            }
        }
        // One part at least half, strictly less than the whole.
        (0, 1) => {
            let i = halves[0];
            if !b[i].present || (0..3).all(|j| j == i || !b[j].present) {
                return Count::None;
            }
            let mut m = [0; 3];
            for j in 0..3 {
                m[j] = if j == i { 2 } else { u64::from(b[j].present) };
            }
            match b[i].max {
                0 | 1 => Count::None,
                2 => Count::One(m),
                _ => Count::Many,
            }
        }
        // Every part below half: a strict triangle, all three present.
        (0, 0) => {
            if b.iter().all(|r| r.present) {
                let at_least_two = b.iter().filter(|r| r.max >= 2).count();
                if at_least_two >= 2 {
                    Count::Many
                } else {
                    Count::One([1, 1, 1])
                }
            } else {
                Count::None
            }
        }
        _ => Count::None,
    }
}

/// The ten share vectors a positive-total triple can have (a test checks no other occurs):
/// one part the whole, two equal halves, one part at least half, or every part below half.
const CLASSES: [Class; 10] = {
    use Share::{Half as H, One as O, Zero as Z};
    [
        [O, Z, Z],
        [Z, O, Z],
        [Z, Z, O],
        [H, H, Z],
        [H, Z, H],
        [Z, H, H],
        [H, Z, Z],
        [Z, H, Z],
        [Z, Z, H],
        [Z, Z, Z],
    ]
};

/// The lexicographically smallest candidate of the box other than `u` (box of ≥ 2 candidates).
fn lex_min_except(b: &[PartRange; 3], u: [u64; 3]) -> [u64; 3] {
    let min = [b[0].lo(), b[1].lo(), b[2].lo()];
    if min != u {
        return min;
    }
    for i in (0..3).rev() {
        if b[i].hi() > b[i].lo() {
            let mut next = min;
            next[i] += 1;
            return next;
        }
    }
    min
}

/// Whether a whole whose true counts are `truth` and whose candidate box is `b` has its shares
/// withheld: `truth` lies in the box's withholding class, or the box holds one candidate.
///
/// Callers apply the empty rules first (a zero total never reaches this check). Defensive,
/// unreachable for real parts: an empty box, or true counts outside the box, withhold too.
pub fn withheld(b: &[PartRange; 3], truth: [u64; 3]) -> bool {
    if b.iter().any(|r| r.is_empty()) || !(0..3).all(|i| b[i].contains(truth[i])) {
        return true;
    }
    if b.iter().all(|r| r.size_is_one()) {
        return true; // a one-candidate box
    }
    let Some(own) = class_of(truth) else {
        return true;
    };
    let mut n_unique = 0;
    let mut last_unique = [0u64; 3];
    let mut own_count = Count::None;
    for class in CLASSES {
        let c = count_class(b, class);
        if let Count::One(m) = c {
            n_unique += 1;
            last_unique = m;
        }
        if class == own {
            own_count = c;
        }
    }
    if matches!(own_count, Count::One(_)) {
        return true; // box-unique
    }
    if n_unique == 1 {
        let y = lex_min_except(b, last_unique);
        if class_of(y) == Some(own) {
            return true; // the class of the smallest candidate outside the unique set
        }
    }
    false
}

/// The candidate box of a whole from its parts' presence and UTF-8 byte lengths.
pub fn candidate_box(present: [bool; 3], bytes: [u64; 3]) -> [PartRange; 3] {
    [
        PartRange::from_bytes(PART_KINDS[0], present[0], bytes[0]),
        PartRange::from_bytes(PART_KINDS[1], present[1], bytes[1]),
        PartRange::from_bytes(PART_KINDS[2], present[2], bytes[2]),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// The seven triples the criteria publish as the only possible box-unique candidates.
    const SEVEN: [[u64; 3]; 7] = [
        [0, 1, 1],
        [0, 1, 2],
        [1, 0, 1],
        [1, 0, 2],
        [1, 1, 0],
        [1, 1, 1],
        [1, 1, 2],
    ];

    /// Brute force, straight from the criteria text: candidates per part by the β table.
    fn candidates(kind: PartKind, present: bool, bytes: u64) -> Vec<u64> {
        if !present {
            return vec![0];
        }
        (1..=bytes).filter(|&d| beta(kind, d) <= bytes).collect()
    }

    fn floored(x: [u64; 3]) -> [u8; 3] {
        // independent of Share::floor_of: each share in halves, the largest k in 0..=2 with
        // k/2 <= v/t, i.e. k*t <= 2v
        let t = x[0] + x[1] + x[2];
        let f = |v: u64| -> u8 {
            if 2 * t <= 2 * v {
                2
            } else if t <= 2 * v {
                1
            } else {
                0
            }
        };
        [f(x[0]), f(x[1]), f(x[2])]
    }

    /// The brute-force class structure of an enumerated box.
    struct Brute {
        /// class (indexed by its shares in halves, base 3) → (count, first and last member added)
        classes: [(u64, [u64; 3], [u64; 3]); 27],
        size: u64,
    }

    impl Brute {
        fn new() -> Self {
            Self {
                classes: [(0, [0; 3], [0; 3]); 27],
                size: 0,
            }
        }
        fn add(&mut self, x: [u64; 3]) {
            self.size += 1;
            let f = floored(x);
            let e = &mut self.classes[usize::from(f[0] * 9 + f[1] * 3 + f[2])];
            if e.0 == 0 {
                e.1 = x;
            }
            e.0 += 1;
            e.2 = x;
        }
        /// Box-unique candidates.
        fn unique(&self) -> BTreeSet<[u64; 3]> {
            self.classes
                .iter()
                .filter(|(n, _, _)| *n == 1)
                .map(|(_, m, _)| *m)
                .collect()
        }
        /// The withholding class as a set of share classes, per the criteria's definition.
        fn withheld_classes(
            &self,
            lex_sorted_box: impl Iterator<Item = [u64; 3]>,
        ) -> BTreeSet<[u8; 3]> {
            let unique = self.unique();
            let mut out: BTreeSet<[u8; 3]> = unique.iter().map(|u| floored(*u)).collect();
            if unique.len() == 1 && self.size >= 2 {
                let y = lex_sorted_box
                    .into_iter()
                    .find(|c| !unique.contains(c))
                    .unwrap();
                out.insert(floored(y));
            }
            out
        }
    }

    fn brute_withheld(b: &Brute, withheld_classes: &BTreeSet<[u8; 3]>, x: [u64; 3]) -> bool {
        b.size == 1 || withheld_classes.contains(&floored(x))
    }

    fn lex_box(d: &[Vec<u64>; 3]) -> impl Iterator<Item = [u64; 3]> + '_ {
        d[0].iter().flat_map(move |&a| {
            d[1].iter()
                .flat_map(move |&b| d[2].iter().map(move |&c| [a, b, c]))
        })
    }

    /// Per-part byte lengths to try: absent (0) and every present length up to `n`
    /// (a present string part is at least 2 bytes, a present schema at least 1).
    fn lengths(kind: PartKind, n: u64) -> Vec<(bool, u64)> {
        let min = if kind == PartKind::String { 2 } else { 1 };
        std::iter::once((false, 0))
            .chain((min..=n).map(|l| (true, l)))
            .collect()
    }

    /// Run `check` on every box with per-part byte lengths up to `n`, building each box's
    /// brute-force class table incrementally over the schema length (boxes are nested).
    fn for_every_box(n: u64, mut check: impl FnMut([(bool, u64); 3], &[Vec<u64>; 3], &Brute)) {
        for &pa in &lengths(PART_KINDS[0], n) {
            for &pb in &lengths(PART_KINDS[1], n) {
                let da = candidates(PART_KINDS[0], pa.0, pa.1);
                let db = candidates(PART_KINDS[1], pb.0, pb.1);
                // schema absent: its own box
                {
                    let d = [da.clone(), db.clone(), vec![0]];
                    let mut brute = Brute::new();
                    lex_box(&d).for_each(|x| brute.add(x));
                    check([pa, pb, (false, 0)], &d, &brute);
                }
                // schema present: grow the box one slab at a time
                let mut brute = Brute::new();
                let mut in_dc = vec![false; n as usize + 1];
                let mut d = [da.clone(), db.clone(), Vec::new()];
                for lc in 1..=n {
                    let new = candidates(PartKind::Schema, true, lc);
                    for &c in &new {
                        if in_dc[c as usize] {
                            continue;
                        }
                        in_dc[c as usize] = true;
                        for &a in &da {
                            for &b in &db {
                                brute.add([a, b, c]);
                            }
                        }
                    }
                    d[2] = new;
                    check([pa, pb, (true, lc)], &d, &brute);
                }
            }
        }
    }

    fn fast_box(parts: [(bool, u64); 3]) -> [PartRange; 3] {
        candidate_box(
            [parts[0].0, parts[1].0, parts[2].0],
            [parts[0].1, parts[1].1, parts[2].1],
        )
    }

    #[test]
    fn floor_grid_is_exact_on_unrounded_values() {
        assert_eq!(Share::floor_of(0, 5), Share::Zero);
        assert_eq!(Share::floor_of(2, 5), Share::Zero);
        assert_eq!(Share::floor_of(3, 5), Share::Half);
        assert_eq!(Share::floor_of(1, 2), Share::Half);
        assert_eq!(Share::floor_of(4, 5), Share::Half);
        assert_eq!(Share::floor_of(5, 5), Share::One);
        assert_eq!(Share::floor_of(999_999, 1_000_000), Share::Half);
        assert_eq!(Share::floor_of(499_999, 999_999), Share::Zero);
        assert_eq!(Share::floor_of(500_000, 999_999), Share::Half);
    }

    #[test]
    fn only_ten_share_vectors_occur() {
        let mut seen = BTreeSet::new();
        for a in 0..=30 {
            for b in 0..=30 {
                for c in 0..=30 {
                    if let Some(class) = class_of([a, b, c]) {
                        assert!(CLASSES.contains(&class), "{a} {b} {c}");
                        seen.insert(class);
                    }
                }
            }
        }
        assert_eq!(seen.len(), CLASSES.len());
    }

    #[test]
    fn beta_table_gives_interval_boxes() {
        for kind in [PartKind::String, PartKind::Schema] {
            for bytes in 0..=60 {
                let brute = candidates(kind, true, bytes);
                let r = PartRange::from_bytes(kind, true, bytes);
                let fast: Vec<u64> = (1..=r.max).collect();
                assert_eq!(brute, fast, "{kind:?} {bytes}");
            }
        }
    }

    /// The self-check against brute force: every candidate of every box up to 16 bytes per part.
    #[test]
    fn self_check_matches_brute_force_for_every_candidate_up_to_16() {
        let mut boxes = 0u64;
        let mut candidates_checked = 0u64;
        for_every_box(16, |parts, d, brute| {
            let b = fast_box(parts);
            let wc = brute.withheld_classes(lex_box(d));
            for x in lex_box(d) {
                if x == [0, 0, 0] {
                    continue; // empty rules take precedence; never self-checked
                }
                assert_eq!(
                    withheld(&b, x),
                    brute_withheld(brute, &wc, x),
                    "parts {parts:?} x {x:?}"
                );
                candidates_checked += 1;
            }
            boxes += 1;
        });
        assert!(boxes > 4000 && candidates_checked > 1_000_000);
    }

    /// Every box up to 40 bytes per part (all presence patterns): every non-empty class of the
    /// box, tested at the first and the last member the enumeration met.
    #[test]
    fn self_check_matches_brute_force_for_every_box_up_to_40() {
        let mut boxes = 0u64;
        for_every_box(40, |parts, d, brute| {
            if brute.size == 1 && d.iter().all(|v| v == &[0]) {
                return; // the all-absent box: the empty rules apply
            }
            let b = fast_box(parts);
            let wc = brute.withheld_classes(lex_box(d));
            for (_, first, last) in brute.classes.iter().filter(|c| c.0 > 0) {
                for x in [*first, *last] {
                    assert_eq!(
                        withheld(&b, x),
                        brute_withheld(brute, &wc, x),
                        "parts {parts:?} x {x:?}"
                    );
                }
            }
            boxes += 1;
        });
        assert_eq!(boxes, 40 * 40 * 41 - 1);
    }

    /// The criteria: "The only triples that can ever be box-unique are the seven published".
    /// Read literally this holds for boxes of two or more candidates; a one-candidate box's
    /// single candidate is box-unique too and is withheld by the one-candidate rule.
    #[test]
    fn only_the_seven_triples_are_ever_box_unique() {
        let mut seen: BTreeSet<[u64; 3]> = BTreeSet::new();
        let mut one_candidate_boxes = 0;
        for_every_box(40, |parts, d, brute| {
            let unique = brute.unique();
            if brute.size >= 2 {
                for u in &unique {
                    assert!(SEVEN.contains(u), "{u:?} box-unique in {parts:?}");
                    seen.insert(*u);
                }
            } else {
                let only = lex_box(d).next().unwrap();
                assert!(only.iter().all(|&v| v <= 1));
                if only != [0, 0, 0] {
                    assert!(withheld(&fast_box(parts), only));
                    one_candidate_boxes += 1;
                }
            }
        });
        assert_eq!(seen, SEVEN.iter().copied().collect::<BTreeSet<_>>());
        assert_eq!(one_candidate_boxes, 7); // [1,0,0] … [1,1,1] with every present part at its minimum
    }

    /// A withholding class in a box of two or more candidates is never a single triple.
    #[test]
    fn withholding_class_is_never_a_single_triple() {
        for_every_box(16, |_, d, brute| {
            if brute.size < 2 {
                return;
            }
            let wc = brute.withheld_classes(lex_box(d));
            let members = lex_box(d).filter(|x| wc.contains(&floored(*x))).count();
            assert!(members != 1, "{d:?}");
        });
    }

    #[test]
    fn large_boxes_are_instant_and_sensible() {
        let b = candidate_box([true, true, true], [262_144, 262_144, 262_144]);
        assert!(!withheld(&b, [100, 200, 300]));
        assert!(!withheld(&b, [1, 1, 1]));
        let b = candidate_box([true, true, true], [2, 2, 2]);
        assert!(withheld(&b, [1, 1, 2])); // [1,1,2] is box-unique when the schema is 2 bytes
        let b = candidate_box([true, false, true], [2, 0, 2]);
        assert!(withheld(&b, [1, 0, 2]));
        assert!(withheld(&b, [1, 0, 1]));
        let b = candidate_box([true, false, false], [9, 0, 0]);
        assert!(!withheld(&b, [3, 0, 0]));
        let b = candidate_box([true, false, false], [2, 0, 0]);
        assert!(withheld(&b, [1, 0, 0])); // one-candidate box
    }
}
