//! split-profile: the catalogue parser and the whole profile of a submission
//! (`split_profile::profile`) never panic; the JS-compatible JSON reader's stringify is a
//! fixed point (stringify ∘ parse ∘ stringify = stringify), as `JSON.stringify` of
//! `JSON.parse` is.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tokensaver::split_profile::{self, json};

fuzz_target!(|data: &[u8]| {
    if let Ok(value) = json::parse(data) {
        let once = json::stringify(&value);
        let again = json::parse(once.as_bytes()).expect("stringify output parses");
        assert_eq!(
            json::stringify(&again),
            once,
            "stringify is not a fixed point"
        );
    }
    let _ = split_profile::profile(data, 1_795_991_949_000);
});
