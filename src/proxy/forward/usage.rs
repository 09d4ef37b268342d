//! Usage capture from provider answers: JSON bodies and SSE streams on the three routes,
//! normalised to what the provider bills ([`Billed`]: the four parts, 1-hour cache writes,
//! web search requests). Also the SSE event splitter that lets the proxy strip the usage chunk
//! it asked for on a client's behalf.
//!
//! Each route follows its provider's own accounting (docs/usage-accounting.md):
//! - **OpenAI chat** (JSON and stream): `prompt_tokens` includes `cached_tokens` (cache read)
//!   and `cache_write_tokens` (cache write); the rest is uncached input. `completion_tokens`
//!   includes `reasoning_tokens`, unless the provider's own `total_tokens` shows them reported
//!   apart (`total = prompt + completion + reasoning`). In a stream the last `usage` seen wins
//!   (figures are cumulative), on a usage-only chunk or on one that still has choices.
//! - **Anthropic messages**: with `usage.iterations` the bill is the sum over iterations
//!   (compaction and server-tool loops); without, the top-level figures. In a stream
//!   `message_start` opens the figures and each `message_delta` replaces the fields it carries
//!   (`output_tokens` always; input, cache, server-tool and iteration figures when present),
//!   as the official SDKs accumulate them.
//! - **OpenAI Responses**: the terminal event's (or the answer's) `usage`; `input_tokens`
//!   includes cached and cache-write tokens, `output_tokens` includes reasoning.
//!
//! The readers are typed serde structs that name only the fields the accounting reads; every
//! other member (the answer text included) is skipped without being copied or kept.

use std::borrow::Cow;

use serde::de::IgnoredAny;
use serde::Deserialize;

use tokensaver_core::gate::{Billed, Usage};
use tokensaver_core::request::Route;

// ---------------------------------------------------------------------------------------------
// OpenAI chat completions.

#[derive(Debug, Clone, Default, Deserialize)]
struct ChatUsage {
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
    total_tokens: Option<u64>,
    prompt_tokens_details: Option<PromptDetails>,
    completion_tokens_details: Option<OutputDetails>,
    /// DeepSeek reports cache hits here (and may leave `prompt_tokens_details` out).
    prompt_cache_hit_tokens: Option<u64>,
}

#[derive(Debug, Clone, Copy, Default, Deserialize)]
struct PromptDetails {
    cached_tokens: Option<u64>,
    cache_write_tokens: Option<u64>,
}

#[derive(Debug, Clone, Copy, Default, Deserialize)]
struct OutputDetails {
    reasoning_tokens: Option<u64>,
}

/// Split an input count that includes its cache reads and writes; output that includes its
/// reasoning unless the provider's total shows it reported apart.
fn openai_billed(
    input_total: u64,
    cached: u64,
    cache_write: u64,
    output: u64,
    reasoning: u64,
    total: Option<u64>,
) -> Billed {
    let cache_read = cached.min(input_total);
    let cache_write = cache_write.min(input_total - cache_read);
    let apart = reasoning > 0
        && total == Some(input_total.saturating_add(output).saturating_add(reasoning));
    Billed::from(Usage {
        input: input_total - cache_read - cache_write,
        cache_write,
        cache_read,
        output: if apart {
            output.saturating_add(reasoning)
        } else {
            output
        },
    })
}

impl ChatUsage {
    fn billed(&self) -> Option<Billed> {
        if self.prompt_tokens.is_none() && self.completion_tokens.is_none() {
            return None;
        }
        let details = self.prompt_tokens_details.unwrap_or_default();
        Some(openai_billed(
            self.prompt_tokens.unwrap_or(0),
            details
                .cached_tokens
                .or(self.prompt_cache_hit_tokens)
                .unwrap_or(0),
            details.cache_write_tokens.unwrap_or(0),
            self.completion_tokens.unwrap_or(0),
            self.completion_tokens_details
                .and_then(|d| d.reasoning_tokens)
                .unwrap_or(0),
            self.total_tokens,
        ))
    }
}

#[derive(Deserialize)]
struct ChatAnswer {
    usage: Option<ChatUsage>,
}

#[derive(Deserialize)]
struct ChatChunk {
    usage: Option<ChatUsage>,
    /// Groq reports a stream's usage here (older streams: only here).
    x_groq: Option<XGroq>,
    choices: Option<Vec<IgnoredAny>>,
    /// An OpenAI-compatible error sent as a data event.
    error: Option<IgnoredAny>,
}

#[derive(Deserialize)]
struct XGroq {
    usage: Option<ChatUsage>,
}

// ---------------------------------------------------------------------------------------------
// Anthropic messages.

#[derive(Debug, Clone, Default, Deserialize)]
struct AnthropicUsage {
    input_tokens: Option<u64>,
    cache_creation_input_tokens: Option<u64>,
    cache_read_input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    cache_creation: Option<CacheCreation>,
    server_tool_use: Option<ServerToolUse>,
    iterations: Option<Vec<Iteration>>,
}

#[derive(Debug, Clone, Copy, Default, Deserialize)]
struct CacheCreation {
    ephemeral_5m_input_tokens: Option<u64>,
    ephemeral_1h_input_tokens: Option<u64>,
}

#[derive(Debug, Clone, Copy, Default, Deserialize)]
struct ServerToolUse {
    web_search_requests: Option<u64>,
}

/// One sampling iteration (`message`, `compaction`, ...): its own figures.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
struct Iteration {
    input_tokens: Option<u64>,
    cache_creation_input_tokens: Option<u64>,
    cache_read_input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    cache_creation: Option<CacheCreation>,
}

/// Of `written` cache-write tokens, those written for one hour. The breakdown says how the
/// writes it covers split; no breakdown means 5-minute writes (the API reports the split
/// whenever it bills 1-hour writes). Writes the breakdown does not cover (a later total than
/// its split) are priced at the dearer 1-hour rate, unless the breakdown shows 5-minute
/// writes only: never understated.
fn one_hour(written: u64, split: Option<CacheCreation>) -> u64 {
    let Some(split) = split else {
        return 0;
    };
    let five = split.ephemeral_5m_input_tokens.unwrap_or(0);
    let hour = split.ephemeral_1h_input_tokens.unwrap_or(0);
    if hour == 0 && five > 0 {
        0
    } else {
        written - five.min(written)
    }
}

impl AnthropicUsage {
    fn billed(&self) -> Option<Billed> {
        let iterations = self.iterations.as_deref().filter(|i| !i.is_empty());
        if self.input_tokens.is_none() && self.output_tokens.is_none() && iterations.is_none() {
            return None;
        }
        let mut billed = Billed::default();
        match iterations {
            // The bill is the sum over iterations; the top-level figures leave compaction out.
            Some(iterations) => {
                for it in iterations {
                    let written = it.cache_creation_input_tokens.unwrap_or(0);
                    billed.usage.add(&Usage {
                        input: it.input_tokens.unwrap_or(0),
                        cache_write: written,
                        cache_read: it.cache_read_input_tokens.unwrap_or(0),
                        output: it.output_tokens.unwrap_or(0),
                    });
                    billed.cache_write_1h = billed
                        .cache_write_1h
                        .saturating_add(one_hour(written, it.cache_creation));
                }
            }
            None => {
                let written = self.cache_creation_input_tokens.unwrap_or(0);
                billed.usage = Usage {
                    input: self.input_tokens.unwrap_or(0),
                    cache_write: written,
                    cache_read: self.cache_read_input_tokens.unwrap_or(0),
                    output: self.output_tokens.unwrap_or(0),
                };
                billed.cache_write_1h = one_hour(written, self.cache_creation);
            }
        }
        billed.web_search_requests = self
            .server_tool_use
            .and_then(|s| s.web_search_requests)
            .unwrap_or(0);
        Some(billed)
    }

    /// A `message_delta`'s figures over the snapshot: `output_tokens` always, the others when
    /// the event carries them (the official SDKs' rule, with the breakdown and iterations).
    fn update(&mut self, delta: AnthropicUsage) {
        self.output_tokens = delta.output_tokens.or(self.output_tokens);
        self.input_tokens = delta.input_tokens.or(self.input_tokens);
        self.cache_creation_input_tokens = delta
            .cache_creation_input_tokens
            .or(self.cache_creation_input_tokens);
        self.cache_read_input_tokens = delta
            .cache_read_input_tokens
            .or(self.cache_read_input_tokens);
        self.cache_creation = delta.cache_creation.or(self.cache_creation);
        self.server_tool_use = delta.server_tool_use.or(self.server_tool_use);
        if delta.iterations.is_some() {
            self.iterations = delta.iterations;
        }
    }
}

#[derive(Deserialize)]
struct AnthropicAnswer {
    usage: Option<AnthropicUsage>,
}

#[derive(Deserialize)]
struct AnthropicEvent<'a> {
    #[serde(borrow, rename = "type")]
    kind: Option<Cow<'a, str>>,
    message: Option<AnthropicAnswer>,
    usage: Option<AnthropicUsage>,
}

// ---------------------------------------------------------------------------------------------
// OpenAI Responses.

#[derive(Debug, Clone, Default, Deserialize)]
struct ResponsesUsage {
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    total_tokens: Option<u64>,
    input_tokens_details: Option<PromptDetails>,
    output_tokens_details: Option<OutputDetails>,
}

impl ResponsesUsage {
    fn billed(&self) -> Option<Billed> {
        if self.input_tokens.is_none() && self.output_tokens.is_none() {
            return None;
        }
        let details = self.input_tokens_details.unwrap_or_default();
        Some(openai_billed(
            self.input_tokens.unwrap_or(0),
            details.cached_tokens.unwrap_or(0),
            details.cache_write_tokens.unwrap_or(0),
            self.output_tokens.unwrap_or(0),
            self.output_tokens_details
                .and_then(|d| d.reasoning_tokens)
                .unwrap_or(0),
            self.total_tokens,
        ))
    }
}

#[derive(Deserialize)]
struct ResponsesAnswer<'a> {
    usage: Option<ResponsesUsage>,
    #[serde(borrow)]
    status: Option<Cow<'a, str>>,
    /// The stored object's id (the response registry binds it to the caller's key).
    #[serde(borrow)]
    id: Option<Cow<'a, str>>,
    /// Its output items, unread: the answer's identity is taken over them
    /// (`request::answer_identity_of`).
    #[serde(borrow)]
    output: Option<&'a serde_json::value::RawValue>,
}

impl ResponsesAnswer<'_> {
    /// The context the provider billed for this response (input plus output tokens), once
    /// it reports them: never for a response still queued or in progress.
    fn context_tokens(&self) -> Option<u64> {
        if matches!(self.status.as_deref(), Some("queued" | "in_progress")) {
            return None;
        }
        self.usage
            .as_ref()
            .and_then(ResponsesUsage::billed)
            .map(|b| b.usage.total())
    }
}

/// A Responses object as an answer shows it: its id, and the context the provider billed for
/// it once reported (what a call continuing it with `previous_response_id` is billed again).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseSeen {
    pub id: String,
    pub context_tokens: Option<u64>,
    /// The JSON text of its `output` array, once the response is done (never for one still
    /// queued or in progress).
    pub output: Option<String>,
}

/// The Responses object of a JSON body (an answer to `POST /v1/responses`, `GET` or `cancel`).
pub fn response_seen(body: &[u8]) -> Option<ResponseSeen> {
    let answer = serde_json::from_slice::<ResponsesAnswer>(body).ok()?;
    let done = !matches!(answer.status.as_deref(), Some("queued" | "in_progress"));
    Some(ResponseSeen {
        id: answer.id.as_deref()?.to_string(),
        context_tokens: answer.context_tokens(),
        output: answer
            .output
            .filter(|_| done)
            .map(|raw| raw.get().to_string()),
    })
}

#[derive(Deserialize)]
struct ResponsesEvent<'a> {
    #[serde(borrow, rename = "type")]
    kind: Option<Cow<'a, str>>,
    #[serde(borrow)]
    response: Option<ResponsesAnswer<'a>>,
}

// ---------------------------------------------------------------------------------------------
// Readings.

/// How a read answer ended, as far as its own bytes tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnswerEnd {
    /// The route's terminal marker arrived (`[DONE]`, `message_stop`, `response.completed` or
    /// `response.incomplete`; a JSON answer that parsed).
    Finished,
    /// The provider sent an error event mid-stream: the answer is not complete.
    ErrorEvent,
    /// The Responses stream ended with `response.failed` (its usage is the provider's final
    /// figure for the failed response).
    Failed,
    /// Neither yet: the bytes stopped before the terminal marker.
    Open,
}

/// Usage from a complete JSON answer, and whether it reads as a finished answer.
pub fn json_usage(route: Route, body: &[u8]) -> (Option<Billed>, AnswerEnd) {
    let read = match route {
        Route::OpenAiChat => serde_json::from_slice::<ChatAnswer>(body)
            .map(|a| (a.usage.and_then(|u| u.billed()), AnswerEnd::Finished)),
        Route::AnthropicMessages => serde_json::from_slice::<AnthropicAnswer>(body)
            .map(|a| (a.usage.and_then(|u| u.billed()), AnswerEnd::Finished)),
        Route::OpenAiResponses => serde_json::from_slice::<ResponsesAnswer>(body).map(|a| {
            let end = match a.status.as_deref() {
                Some("failed") => AnswerEnd::Failed,
                _ => AnswerEnd::Finished,
            };
            (a.usage.and_then(|u| u.billed()), end)
        }),
    };
    read.unwrap_or((None, AnswerEnd::Open))
}

/// Reads an SSE stream event by event: captures usage, knows how the stream ended, and
/// decides which events reach the client.
pub struct SseTap {
    route: Route,
    strip_usage_chunk: bool,
    pending: Vec<u8>,
    /// How much of `pending` has been searched for an event's end: a long event that arrives
    /// in many reads is searched once, not again from its start at every read.
    searched: usize,
    /// The usage figures so far (chat, Responses: the last report).
    usage: Option<Billed>,
    /// Anthropic: the accumulated `usage` snapshot (`message_start`, then each delta).
    snapshot: Option<AnthropicUsage>,
    end: AnswerEnd,
    /// Responses: the id of the stored object, from the first event that carries it.
    response_id: Option<String>,
    /// Responses: the terminal event's `output` array, as its JSON text.
    response_output: Option<String>,
}

impl SseTap {
    pub fn new(route: Route, strip_usage_chunk: bool) -> Self {
        Self {
            route,
            strip_usage_chunk,
            pending: Vec::new(),
            searched: 0,
            usage: None,
            snapshot: None,
            end: AnswerEnd::Open,
            response_id: None,
            response_output: None,
        }
    }

    /// Responses: the output items of the terminal event, as their JSON text.
    pub fn response_output(&self) -> Option<&str> {
        self.response_output.as_deref()
    }

    /// Responses: the stored object's id, once an event has carried it (`response.created`).
    pub fn response_id(&self) -> Option<&str> {
        self.response_id.as_deref()
    }

    /// What the provider has reported so far (final once [`SseTap::end`] is `Finished`).
    pub fn usage(&self) -> Option<Billed> {
        match self.route {
            Route::AnthropicMessages => self.snapshot.as_ref().and_then(AnthropicUsage::billed),
            Route::OpenAiChat | Route::OpenAiResponses => self.usage,
        }
    }

    /// How the stream ended so far. An error event is final: nothing after it completes the
    /// answer.
    pub fn end(&self) -> AnswerEnd {
        self.end
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

    fn mark(&mut self, end: AnswerEnd) {
        // An error event or a failure is never undone by a later marker.
        if matches!(self.end, AnswerEnd::Open | AnswerEnd::Finished) {
            self.end = end;
        }
    }

    /// Look at one event; returns whether it is passed to the client.
    fn observe(&mut self, start: usize, end: usize) -> bool {
        let Ok(text) = std::str::from_utf8(&self.pending[start..end]) else {
            return true;
        };
        let mut name = None;
        let mut data = String::new();
        for line in text.lines() {
            if let Some(v) = line.strip_prefix("event:") {
                name = Some(v.trim());
            } else if let Some(v) = line.strip_prefix("data:") {
                if !data.is_empty() {
                    data.push('\n');
                }
                data.push_str(v.strip_prefix(' ').unwrap_or(v));
            }
        }
        if name == Some("error") {
            self.mark(AnswerEnd::ErrorEvent);
        }
        let data = data.trim_end();
        if data.is_empty() {
            return true;
        }
        if data == "[DONE]" {
            self.mark(AnswerEnd::Finished);
            return true;
        }
        match self.route {
            Route::OpenAiChat => self.observe_chat(data),
            Route::AnthropicMessages => {
                self.observe_anthropic(data);
                true
            }
            Route::OpenAiResponses => {
                self.observe_responses(data);
                true
            }
        }
    }

    fn observe_chat(&mut self, data: &str) -> bool {
        let Ok(chunk) = serde_json::from_str::<ChatChunk>(data) else {
            return true;
        };
        if chunk.error.is_some() && chunk.choices.is_none() {
            self.mark(AnswerEnd::ErrorEvent);
        }
        let usage = chunk
            .usage
            .and_then(|u| u.billed())
            .or_else(|| chunk.x_groq.and_then(|x| x.usage).and_then(|u| u.billed()));
        let Some(usage) = usage else {
            return true;
        };
        // Figures are cumulative: the last report wins.
        self.usage = Some(usage);
        // Only the usage-only chunk asked for on the client's behalf is removed; usage on a
        // chunk that still has choices reaches the client unchanged (it is the provider's
        // answer, and the SDKs read `usage` on any chunk).
        let usage_only = chunk.choices.as_ref().is_some_and(Vec::is_empty);
        !(self.strip_usage_chunk && usage_only)
    }

    fn observe_anthropic(&mut self, data: &str) {
        let Ok(event) = serde_json::from_str::<AnthropicEvent>(data) else {
            return;
        };
        match event.kind.as_deref() {
            Some("message_start") => {
                if let Some(u) = event.message.and_then(|m| m.usage) {
                    self.snapshot = Some(u);
                }
            }
            Some("message_delta") => {
                if let Some(delta) = event.usage {
                    self.snapshot
                        .get_or_insert_with(Default::default)
                        .update(delta);
                }
            }
            Some("message_stop") => self.mark(AnswerEnd::Finished),
            Some("error") => self.mark(AnswerEnd::ErrorEvent),
            _ => {}
        }
    }

    fn observe_responses(&mut self, data: &str) {
        let Ok(event) = serde_json::from_str::<ResponsesEvent>(data) else {
            return;
        };
        if self.response_id.is_none() {
            if let Some(id) = event.response.as_ref().and_then(|r| r.id.as_deref()) {
                self.response_id = Some(id.to_string());
            }
        }
        // One terminal event carries the whole response and its usage; there is no `[DONE]`.
        let end = match event.kind.as_deref() {
            Some("response.completed") | Some("response.incomplete") => AnswerEnd::Finished,
            Some("response.failed") => AnswerEnd::Failed,
            Some("error") => {
                self.mark(AnswerEnd::ErrorEvent);
                return;
            }
            _ => return,
        };
        if let Some(response) = event.response {
            if end == AnswerEnd::Finished {
                self.response_output = response.output.map(|raw| raw.get().to_string());
            }
            if let Some(u) = response.usage.and_then(|u| u.billed()) {
                self.usage = Some(u);
            }
        }
        self.mark(end);
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
#[path = "usage_tests.rs"]
mod tests;
