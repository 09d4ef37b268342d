//! The config loader (`Config::parse`): any text is a config or an error naming a field,
//! never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tokensaver::config::Config;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Err(e) = Config::parse(text) {
            assert!(!e.to_string().is_empty());
        }
    }
});
