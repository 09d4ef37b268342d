//! Usage capture from provider answers: JSON bodies and SSE streams (OpenAI and Anthropic),
//! normalised to the four parts. Also the SSE event splitter that lets the proxy strip the
//! usage chunk it asked for on a client's behalf.

use crate::gate::Usage;
use crate::request::json::{self, Json};
use crate::request::Route;

// Answers and stream events are read with the gate's borrowed JSON reader: only `usage` and
// a few tags are looked at, so the answer text is never copied out.

fn num(v: &Json, path: &[&str]) -> u64 {
    let mut cur = v;
    for p in path {
        match cur.get(p) {
            Some(next) => cur = next,
            None => return 0,
        }
    }
    cur.as_u64().unwrap_or(0)
}

/// Usage from an OpenAI `usage` object. `cached_tokens` is cache read; the rest of the prompt
/// is uncached input.
pub fn openai_usage(usage: &Json) -> Option<Usage> {
    if !matches!(usage, Json::Object(_)) {
        return None;
    }
    let prompt = num(usage, &["prompt_tokens"]);
    let cached = num(usage, &["prompt_tokens_details", "cached_tokens"]);
    Some(Usage {
        input: prompt.saturating_sub(cached),
        cache_write: 0,
        cache_read: cached,
        output: num(usage, &["completion_tokens"]),
    })
}

/// Usage from an Anthropic `usage` object.
pub fn anthropic_usage(usage: &Json) -> Option<Usage> {
    if !matches!(usage, Json::Object(_)) {
        return None;
    }
    Some(Usage {
        input: num(usage, &["input_tokens"]),
        cache_write: num(usage, &["cache_creation_input_tokens"]),
        cache_read: num(usage, &["cache_read_input_tokens"]),
        output: num(usage, &["output_tokens"]),
    })
}

/// Usage from a Responses `usage` object: `input_tokens` includes the cached ones
/// (`input_tokens_details.cached_tokens`, cache read); `output_tokens` includes reasoning.
pub fn responses_usage(usage: &Json) -> Option<Usage> {
    if !matches!(usage, Json::Object(_)) {
        return None;
    }
    let input = num(usage, &["input_tokens"]);
    let cached = num(usage, &["input_tokens_details", "cached_tokens"]);
    Some(Usage {
        input: input.saturating_sub(cached),
        cache_write: 0,
        cache_read: cached,
        output: num(usage, &["output_tokens"]),
    })
}

/// Usage from a complete JSON answer.
pub fn json_usage(route: Route, body: &[u8]) -> Option<Usage> {
    let value = json::parse(body).ok()?;
    let usage = value.get("usage")?;
    match route {
        Route::OpenAiChat => openai_usage(usage),
        Route::AnthropicMessages => anthropic_usage(usage),
        Route::OpenAiResponses => responses_usage(usage),
    }
}

/// Reads an SSE stream event by event: captures usage, knows when the stream ended properly,
/// and decides which events reach the client.
pub struct SseTap {
    route: Route,
    strip_usage_chunk: bool,
    pending: Vec<u8>,
    /// How much of `pending` has been searched for an event's end: a long event that arrives
    /// in many reads is searched once, not again from its start at every read.
    searched: usize,
    pub usage: Option<Usage>,
    pub finished: bool,
}

impl SseTap {
    pub fn new(route: Route, strip_usage_chunk: bool) -> Self {
        Self {
            route,
            strip_usage_chunk,
            pending: Vec::new(),
            searched: 0,
            usage: None,
            finished: false,
        }
    }

    /// Feed bytes; returns the bytes to pass on (whole events only; a partial event waits).
    pub fn feed(&mut self, chunk: &[u8]) -> Vec<u8> {
        self.pending.extend_from_slice(chunk);
        let mut out = Vec::new();
        let mut start = 0;
        // An event's end (at most 3 bytes) may straddle the previous read.
        let mut from = self.searched.saturating_sub(2);
        while let Some(end) = find_event_end(&self.pending[from..]) {
            let event_end = from + end;
            let keep = self.observe(start, event_end);
            if keep {
                out.extend_from_slice(&self.pending[start..event_end]);
            }
            start = event_end;
            from = event_end;
        }
        self.pending.drain(..start);
        self.searched = self.pending.len();
        out
    }

    /// What is left when the stream ends (a partial event is passed on as it is).
    pub fn finish(&mut self) -> Vec<u8> {
        self.searched = 0;
        std::mem::take(&mut self.pending)
    }

    /// Look at one event; returns whether it is passed to the client.
    fn observe(&mut self, start: usize, end: usize) -> bool {
        let event = &self.pending[start..end];
        let Ok(text) = std::str::from_utf8(event) else {
            return true;
        };
        let data: String = text
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .map(str::trim_start)
            .collect::<Vec<_>>()
            .join("\n");
        if data.is_empty() {
            return true;
        }
        if data == "[DONE]" {
            self.finished = true;
            return true;
        }
        let Ok(value) = json::parse(data.as_bytes()) else {
            return true;
        };
        match self.route {
            Route::OpenAiChat => {
                if let Some(u) = value.get("usage").and_then(openai_usage) {
                    self.usage = Some(u);
                    let only_usage =
                        matches!(value.get("choices"), Some(Json::Array(c)) if c.is_empty());
                    if self.strip_usage_chunk && only_usage {
                        return false;
                    }
                }
                true
            }
            Route::AnthropicMessages => {
                let kind = value
                    .get("type")
                    .and_then(Json::as_string)
                    .map(|t| t.to_cow());
                match kind.as_deref() {
                    Some("message_start") => {
                        if let Some(u) = value
                            .get("message")
                            .and_then(|m| m.get("usage"))
                            .and_then(anthropic_usage)
                        {
                            self.usage = Some(u);
                        }
                    }
                    Some("message_delta") => {
                        if let Some(delta) = value.get("usage") {
                            let mut u = self.usage.unwrap_or_default();
                            // message_delta's counts are cumulative: take the latest.
                            if let Some(out) = delta.get("output_tokens").and_then(Json::as_u64) {
                                u.output = out;
                            }
                            if let Some(inp) = delta.get("input_tokens").and_then(Json::as_u64) {
                                u.input = inp;
                            }
                            // Late cache figures win too, as the official SDK reads them.
                            if let Some(w) = delta
                                .get("cache_creation_input_tokens")
                                .and_then(Json::as_u64)
                            {
                                u.cache_write = w;
                            }
                            if let Some(r) =
                                delta.get("cache_read_input_tokens").and_then(Json::as_u64)
                            {
                                u.cache_read = r;
                            }
                            self.usage = Some(u);
                        }
                    }
                    Some("message_stop") => self.finished = true,
                    _ => {}
                }
                true
            }
            Route::OpenAiResponses => {
                // The stream ends with one terminal event that carries the whole response and
                // its usage; there is no `[DONE]`. `response.incomplete` is a finished answer
                // cut by its ceiling; `response.failed` and `error` are not answers.
                let kind = value.get("type").and_then(Json::as_string);
                let terminal = kind.is_some_and(|k| {
                    k.is("response.completed")
                        || k.is("response.incomplete")
                        || k.is("response.failed")
                });
                if terminal {
                    if let Some(u) = value
                        .get("response")
                        .and_then(|r| r.get("usage"))
                        .and_then(responses_usage)
                    {
                        self.usage = Some(u);
                    }
                    self.finished = !kind.is_some_and(|k| k.is("response.failed"));
                }
                true
            }
        }
    }
}

/// End (exclusive) of the first complete event: after a blank line (`\n\n` or `\r\n\r\n`).
fn find_event_end(buf: &[u8]) -> Option<usize> {
    let mut i = 0;
    while i + 1 < buf.len() {
        if buf[i] == b'\n' && buf[i + 1] == b'\n' {
            return Some(i + 2);
        }
        if buf[i] == b'\n' && buf[i + 1] == b'\r' && buf.get(i + 2) == Some(&b'\n') {
            return Some(i + 3);
        }
        i += 1;
    }
    None
}

/// Strip the usage-only chunk from a stored OpenAI stream, for a client that did not ask for it.
pub fn strip_openai_usage_chunk(stream: &[u8]) -> Vec<u8> {
    let mut tap = SseTap::new(Route::OpenAiChat, true);
    let mut out = tap.feed(stream);
    out.extend(tap.finish());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openai_stream_usage_is_captured_and_stripped() {
        let stream = b"data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":3,\"prompt_tokens_details\":{\"cached_tokens\":4}}}\n\ndata: [DONE]\n\n";
        let mut tap = SseTap::new(Route::OpenAiChat, true);
        let mut out = tap.feed(&stream[..30]);
        out.extend(tap.feed(&stream[30..]));
        assert!(tap.finished);
        assert_eq!(
            tap.usage,
            Some(Usage {
                input: 6,
                cache_write: 0,
                cache_read: 4,
                output: 3
            })
        );
        let text = String::from_utf8(out).unwrap();
        assert!(!text.contains("usage"));
        assert!(text.ends_with("data: [DONE]\n\n"));
    }

    #[test]
    fn anthropic_stream_usage_and_truncation() {
        let stream = b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":12,\"cache_read_input_tokens\":2,\"output_tokens\":1}}}\n\nevent: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":7}}\n\n";
        let mut tap = SseTap::new(Route::AnthropicMessages, false);
        let out = tap.feed(stream);
        assert_eq!(out.len(), stream.len());
        assert!(!tap.finished);
        assert_eq!(
            tap.usage,
            Some(Usage {
                input: 12,
                cache_write: 0,
                cache_read: 2,
                output: 7
            })
        );
        tap.feed(b"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n");
        assert!(tap.finished);
    }

    #[test]
    fn json_usage_both_providers() {
        let o = br#"{"usage":{"prompt_tokens":5,"completion_tokens":2}}"#;
        assert_eq!(
            json_usage(Route::OpenAiChat, o),
            Some(Usage {
                input: 5,
                cache_write: 0,
                cache_read: 0,
                output: 2
            })
        );
        let a =
            br#"{"usage":{"input_tokens":5,"output_tokens":2,"cache_creation_input_tokens":3}}"#;
        assert_eq!(
            json_usage(Route::AnthropicMessages, a),
            Some(Usage {
                input: 5,
                cache_write: 3,
                cache_read: 0,
                output: 2
            })
        );
        assert_eq!(json_usage(Route::OpenAiChat, b"{}"), None);
    }

    #[test]
    fn responses_usage_from_json_and_the_terminal_event() {
        let body = br#"{"id":"resp_1","usage":{"input_tokens":100,"input_tokens_details":{"cached_tokens":40},"output_tokens":30,"output_tokens_details":{"reasoning_tokens":12},"total_tokens":130}}"#;
        let expected = Usage {
            input: 60,
            cache_write: 0,
            cache_read: 40,
            output: 30,
        };
        assert_eq!(json_usage(Route::OpenAiResponses, body), Some(expected));

        let mut tap = SseTap::new(Route::OpenAiResponses, false);
        let events = b"event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"usage\":null}}\n\nevent: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"hi\"}\n\n";
        assert_eq!(tap.feed(events), events.to_vec());
        assert!(!tap.finished);
        assert_eq!(tap.usage, None);
        let done = b"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":100,\"input_tokens_details\":{\"cached_tokens\":40},\"output_tokens\":30}}}\n\n";
        tap.feed(done);
        assert!(tap.finished);
        assert_eq!(tap.usage, Some(expected));

        // A failed response carries usage but is no answer: never complete.
        let mut failed = SseTap::new(Route::OpenAiResponses, false);
        failed.feed(b"data: {\"type\":\"response.failed\",\"response\":{\"usage\":{\"input_tokens\":5,\"output_tokens\":1}}}\n\n");
        assert!(!failed.finished);
        assert_eq!(failed.usage.map(|u| u.total()), Some(6));
    }

    #[test]
    fn anthropic_late_message_delta_cache_figures_win() {
        let mut tap = SseTap::new(Route::AnthropicMessages, false);
        tap.feed(b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":10,\"cache_creation_input_tokens\":3068,\"cache_read_input_tokens\":0,\"output_tokens\":1}}}\n\n");
        tap.feed(b"event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"input_tokens\":10,\"cache_creation_input_tokens\":3337,\"cache_read_input_tokens\":6289,\"output_tokens\":50}}\n\n");
        assert_eq!(
            tap.usage,
            Some(Usage {
                input: 10,
                cache_write: 3337,
                cache_read: 6289,
                output: 50
            })
        );
    }

    /// Found by fuzzing (`fuzz/fuzz_targets/sse_usage.rs`): a long event fed in small reads
    /// was searched again from its start at every read (quadratic). The search now resumes;
    /// an event's end split across reads in every way must still be found, and the bytes
    /// relayed must not depend on the reads.
    #[test]
    fn an_event_end_split_across_reads_is_found_once() {
        let stream = b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2}}\n\ndata: {\"choices\":[{\"delta\":{}}]}\n\r\ndata: [DONE]\n\n";
        let mut whole = SseTap::new(Route::OpenAiChat, false);
        let expected = whole.feed(stream);
        for size in 1..=stream.len() {
            let mut tap = SseTap::new(Route::OpenAiChat, false);
            let mut out = Vec::new();
            for chunk in stream.chunks(size) {
                out.extend(tap.feed(chunk));
            }
            assert_eq!(out, expected, "reads of {size} bytes");
            assert!(
                tap.finished && tap.usage == whole.usage,
                "reads of {size} bytes"
            );
            assert!(tap.finish().is_empty());
        }
        // A 1 MiB event in 1 KiB reads is relayed whole when it ends.
        let mut tap = SseTap::new(Route::OpenAiChat, false);
        let big = format!("data: \"{}\"\n\n", "x".repeat(1 << 20));
        let mut relayed = 0;
        for chunk in big.as_bytes().chunks(1024) {
            relayed += tap.feed(chunk).len();
        }
        assert_eq!(relayed, big.len());
    }
}
