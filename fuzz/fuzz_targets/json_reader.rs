//! The gate's JSON reader (`request::json`) against serde_json: the same verdict on every
//! input, and when both accept, the same canonical bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tokensaver::request::json;

fuzz_target!(|data: &[u8]| {
    let ours = json::parse(data);
    let theirs = serde_json::from_slice::<serde_json::Value>(data)
        .ok()
        .and_then(|v| serde_json::to_vec(&v).ok());
    match (ours, theirs) {
        (Ok(value), Some(expected)) => {
            let mut canonical = Vec::new();
            json::write_compact(&mut canonical, &value);
            assert_eq!(
                String::from_utf8_lossy(&canonical),
                String::from_utf8_lossy(&expected),
                "canonical form differs from serde_json's"
            );
        }
        (Err(_), None) => {}
        (ours, theirs) => panic!(
            "acceptance differs: ours {}, serde_json {}",
            ours.is_ok(),
            theirs.is_some()
        ),
    }
});
