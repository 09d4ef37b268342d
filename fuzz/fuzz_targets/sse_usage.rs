//! Usage capture from provider answers (`proxy::usage`): `json_usage` on any body, and
//! `SseTap` on any stream — never a panic, and the same bytes out, usage and end-of-stream
//! verdict however the stream is cut into chunks (the network decides the chunks).
#![no_main]

use libfuzzer_sys::fuzz_target;
use tokensaver::proxy::usage::{json_usage, strip_openai_usage_chunk, SseTap};
use tokensaver::request::Route;

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let Some((&cut_seed, stream)) = rest.split_first() else {
        return;
    };
    let route = match selector % 3 {
        0 => Route::OpenAiChat,
        1 => Route::OpenAiResponses,
        _ => Route::AnthropicMessages,
    };
    let strip = selector & 0x80 != 0 && route == Route::OpenAiChat;
    let _ = json_usage(route, stream);
    let _ = strip_openai_usage_chunk(stream);

    let mut whole = SseTap::new(route, strip);
    let mut out_whole = whole.feed(stream);
    out_whole.extend(whole.finish());

    // Chunks of 1..=16 bytes, the sizes drawn from the seed.
    let mut chunked = SseTap::new(route, strip);
    let mut out_chunked = Vec::new();
    let (mut at, mut seed) = (0usize, u32::from(cut_seed) | 1);
    while at < stream.len() {
        seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12_345);
        let len = 1 + (seed >> 16) as usize % 16;
        let end = (at + len).min(stream.len());
        out_chunked.extend(chunked.feed(&stream[at..end]));
        at = end;
    }
    out_chunked.extend(chunked.finish());

    assert_eq!(out_whole, out_chunked, "chunking changed the bytes relayed");
    assert_eq!(whole.usage(), chunked.usage(), "chunking changed the usage");
    assert_eq!(whole.end(), chunked.end(), "chunking changed the end");
});
