//! The three provider request shapes (`request::parse`: OpenAI chat, OpenAI Responses,
//! Anthropic messages): never a panic; an accepted request reads the same twice, and its
//! digest (what digest mode sends) parses back to itself.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tokensaver::request::{self, Digest, Route};

const KEY: [u8; 32] = [7; 32];

fuzz_target!(|data: &[u8]| {
    let Some((&selector, body)) = data.split_first() else {
        return;
    };
    let route = match selector % 3 {
        0 => Route::OpenAiChat,
        1 => Route::OpenAiResponses,
        _ => Route::AnthropicMessages,
    };
    let Ok(parsed) = request::parse(route, body, &KEY) else {
        return;
    };
    let again = request::parse(route, body, &KEY).expect("accepted once, accepted twice");
    assert_eq!(parsed.shape, again.shape, "the shape is not deterministic");
    let digest = Digest::new(parsed.shape);
    let bytes = serde_json::to_vec(&digest).expect("a digest serialises");
    let back = Digest::parse(&bytes).expect("a digest the gate wrote parses back");
    assert_eq!(back, digest, "the digest does not round-trip");
});
