//! The digest reader (`Digest::parse`, what `POST /gate` and `/estimate` read): never a
//! panic; an accepted digest written again reads back the same.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tokensaver::request::Digest;

fuzz_target!(|data: &[u8]| {
    let Ok(digest) = Digest::parse(data) else {
        return;
    };
    let bytes = serde_json::to_vec(&digest).expect("a digest serialises");
    let back = Digest::parse(&bytes).expect("an accepted digest written again parses");
    assert_eq!(back, digest, "the digest does not round-trip");
});
