//! Edits of a request's bytes as the caller sent them: each replaces one byte range (an empty
//! range inserts) at offsets the gate's reading recorded, and every other byte is copied
//! unchanged. The proxy's only changes to a forwarded body — DOWNGRADE's model, the usage
//! option of an OpenAI stream, the prompt-cache breakpoints the gate placed (SPEC §2.11b) —
//! are edits, applied together in one pass in offset order.

use std::ops::Range;

/// Replace `range` of the original bytes with `with` (an empty range inserts before it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Edit {
    pub range: Range<usize>,
    pub with: Vec<u8>,
}

/// The caller's bytes with `edits` applied. Edits are taken in offset order (insertions at
/// one offset in the order given); `None` when two overlap or one lies outside the bytes.
pub fn apply(bytes: &[u8], mut edits: Vec<Edit>) -> Option<Vec<u8>> {
    edits.sort_by_key(|e| (e.range.start, e.range.end));
    let grown: usize = edits.iter().map(|e| e.with.len()).sum();
    let mut out = Vec::with_capacity(bytes.len() + grown);
    let mut at = 0;
    for edit in &edits {
        if edit.range.start < at || edit.range.end < edit.range.start {
            return None;
        }
        out.extend_from_slice(bytes.get(at..edit.range.start)?);
        out.extend_from_slice(&edit.with);
        at = edit.range.end;
    }
    out.extend_from_slice(bytes.get(at..)?);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn edit(range: Range<usize>, with: &str) -> Edit {
        Edit {
            range,
            with: with.as_bytes().to_vec(),
        }
    }

    #[test]
    fn edits_apply_in_offset_order_and_keep_every_other_byte() {
        let edits = vec![edit(8..8, "X"), edit(1..3, "ab"), edit(5..6, "")];
        assert_eq!(apply(b"0123456789", edits).unwrap(), b"0ab3467X89");
        // Two insertions at one offset keep the order given.
        let edits = vec![edit(2..2, "a"), edit(2..2, "b")];
        assert_eq!(apply(b"0123", edits).unwrap(), b"01ab23");
        assert_eq!(apply(b"0123", Vec::new()).unwrap(), b"0123");
    }

    #[test]
    fn overlapping_or_outside_edits_are_refused() {
        assert!(apply(b"0123456789", vec![edit(1..4, "a"), edit(3..5, "b")]).is_none());
        assert!(apply(b"0123", vec![edit(3..9, "a")]).is_none());
        assert!(apply(b"0123", vec![edit(7..7, "a")]).is_none());
    }
}
