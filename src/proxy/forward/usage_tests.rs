//! One test per accounting rule of `usage.rs` (docs/usage-accounting.md).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::*;

fn parts(input: u64, cache_write: u64, cache_read: u64, output: u64) -> Billed {
    Billed::from(Usage {
        input,
        cache_write,
        cache_read,
        output,
    })
}

fn sse(events: &[&str]) -> Vec<u8> {
    events
        .iter()
        .map(|e| format!("{e}\n\n"))
        .collect::<String>()
        .into_bytes()
}

fn tap_all(route: Route, strip: bool, stream: &[u8]) -> (SseTap, Vec<u8>) {
    let mut tap = SseTap::new(route, strip);
    // Fed in small pieces, as a network delivers it.
    let mut out = Vec::new();
    for piece in stream.chunks(7) {
        out.extend(tap.feed(piece));
    }
    out.extend(tap.finish());
    (tap, out)
}

// --- OpenAI chat ------------------------------------------------------------------------------

#[test]
fn chat_usage_only_chunk_is_captured_and_stripped_for_a_client_that_did_not_ask() {
    let stream = b"data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":3,\"prompt_tokens_details\":{\"cached_tokens\":4}}}\n\ndata: [DONE]\n\n";
    let (tap, out) = tap_all(Route::OpenAiChat, true, stream);
    assert_eq!(tap.end(), AnswerEnd::Finished);
    assert_eq!(tap.usage(), Some(parts(6, 0, 4, 3)));
    let text = String::from_utf8(out).unwrap();
    assert!(!text.contains("usage"));
    assert!(text.ends_with("data: [DONE]\n\n"));
}

#[test]
fn chat_usage_on_a_chunk_that_still_has_choices_reaches_the_client_unchanged() {
    // Groq, Mistral, OpenRouter: usage rides on the last content chunk. A client that did not
    // ask for usage gets that chunk as the provider sent it: it carries the answer's end.
    let stream = sse(&[
        r#"data: {"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}"#,
        r#"data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":{"prompt_tokens":343,"completion_tokens":180,"total_tokens":523,"completion_tokens_details":{"reasoning_tokens":153}}}"#,
        "data: [DONE]",
    ]);
    let (tap, out) = tap_all(Route::OpenAiChat, true, &stream);
    assert_eq!(out, stream, "not one byte changed");
    assert_eq!(tap.end(), AnswerEnd::Finished);
    // Reasoning is part of completion_tokens here (343 + 180 = 523): not counted twice.
    assert_eq!(tap.usage(), Some(parts(343, 0, 0, 180)));
}

#[test]
fn chat_reasoning_tokens_are_part_of_output_unless_the_total_shows_them_apart() {
    let included = br#"{"usage":{"prompt_tokens":11,"completion_tokens":203,"total_tokens":214,"completion_tokens_details":{"reasoning_tokens":192}}}"#;
    assert_eq!(
        json_usage(Route::OpenAiChat, included),
        (Some(parts(11, 0, 0, 203)), AnswerEnd::Finished)
    );
    // A provider that reports reasoning apart: its total is prompt + completion + reasoning.
    let apart = br#"{"usage":{"prompt_tokens":11,"completion_tokens":11,"total_tokens":214,"completion_tokens_details":{"reasoning_tokens":192}}}"#;
    assert_eq!(
        json_usage(Route::OpenAiChat, apart).0,
        Some(parts(11, 0, 0, 203))
    );
    // No total: the documented rule (reasoning inside completion) holds.
    let no_total = br#"{"usage":{"prompt_tokens":11,"completion_tokens":203,"completion_tokens_details":{"reasoning_tokens":192}}}"#;
    assert_eq!(
        json_usage(Route::OpenAiChat, no_total).0,
        Some(parts(11, 0, 0, 203))
    );
}

#[test]
fn chat_cache_reads_and_writes_are_inside_prompt_tokens() {
    let body = br#"{"usage":{"prompt_tokens":8174,"completion_tokens":30,"total_tokens":8204,"prompt_tokens_details":{"cached_tokens":4000,"cache_write_tokens":1000}}}"#;
    assert_eq!(
        json_usage(Route::OpenAiChat, body).0,
        Some(parts(3174, 1000, 4000, 30))
    );
    // DeepSeek's own field when the details are absent.
    let deepseek = br#"{"usage":{"prompt_tokens":100,"completion_tokens":5,"prompt_cache_hit_tokens":64,"prompt_cache_miss_tokens":36}}"#;
    assert_eq!(
        json_usage(Route::OpenAiChat, deepseek).0,
        Some(parts(36, 0, 64, 5))
    );
    // A cached figure beyond the prompt is clamped, never a negative input.
    let odd = br#"{"usage":{"prompt_tokens":10,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":50}}}"#;
    assert_eq!(
        json_usage(Route::OpenAiChat, odd).0,
        Some(parts(0, 0, 10, 1))
    );
}

#[test]
fn chat_last_usage_wins_and_groq_x_groq_is_read() {
    // Cumulative usage on every chunk (vLLM continuous usage stats): the last one counts.
    let stream = sse(&[
        r#"data: {"choices":[{"delta":{"content":"a"}}],"usage":{"prompt_tokens":9,"completion_tokens":1}}"#,
        r#"data: {"choices":[{"delta":{"content":"b"}}],"usage":{"prompt_tokens":9,"completion_tokens":2}}"#,
        "data: [DONE]",
    ]);
    assert_eq!(
        tap_all(Route::OpenAiChat, true, &stream).0.usage(),
        Some(parts(9, 0, 0, 2))
    );
    let groq = sse(&[
        r#"data: {"choices":[{"delta":{},"finish_reason":"stop"}],"x_groq":{"usage":{"prompt_tokens":20,"completion_tokens":7}}}"#,
        "data: [DONE]",
    ]);
    assert_eq!(
        tap_all(Route::OpenAiChat, true, &groq).0.usage(),
        Some(parts(20, 0, 0, 7))
    );
}

#[test]
fn chat_error_event_mid_stream_leaves_the_answer_incomplete_without_usage() {
    let mut events: Vec<String> = (0..90)
        .map(|i| format!(r#"data: {{"choices":[{{"index":0,"delta":{{"content":"w{i}"}}}}]}}"#))
        .collect();
    events.push(
        "event: error\ndata: {\"error\":{\"message\":\"Tool choice is required\",\"type\":\"invalid_request_error\"}}".into(),
    );
    let refs: Vec<&str> = events.iter().map(String::as_str).collect();
    let stream = sse(&refs);
    let (tap, out) = tap_all(Route::OpenAiChat, true, &stream);
    assert_eq!(out, stream);
    assert_eq!(tap.end(), AnswerEnd::ErrorEvent);
    assert_eq!(tap.usage(), None);

    // An error sent as a plain data event, then a [DONE]: still not complete.
    let plain = sse(&[
        r#"data: {"choices":[{"delta":{"content":"a"}}]}"#,
        r#"data: {"error":{"message":"overloaded"}}"#,
        "data: [DONE]",
    ]);
    assert_eq!(
        tap_all(Route::OpenAiChat, false, &plain).0.end(),
        AnswerEnd::ErrorEvent
    );
}

#[test]
fn chat_stream_without_done_is_open() {
    let stream = sse(&[r#"data: {"choices":[{"delta":{"content":"a"}}]}"#]);
    let (tap, _) = tap_all(Route::OpenAiChat, false, &stream);
    assert_eq!(tap.end(), AnswerEnd::Open);
}

// --- Anthropic messages -----------------------------------------------------------------------

#[test]
fn anthropic_stream_usage_and_truncation() {
    let stream = b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":12,\"cache_read_input_tokens\":2,\"output_tokens\":1}}}\n\nevent: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":7}}\n\n";
    let mut tap = SseTap::new(Route::AnthropicMessages, false);
    let out = tap.feed(stream);
    assert_eq!(out.len(), stream.len());
    assert_eq!(tap.end(), AnswerEnd::Open);
    assert_eq!(tap.usage(), Some(parts(12, 0, 2, 7)));
    tap.feed(b"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n");
    assert_eq!(tap.end(), AnswerEnd::Finished);
}

#[test]
fn anthropic_late_message_delta_cache_figures_win() {
    let mut tap = SseTap::new(Route::AnthropicMessages, false);
    tap.feed(b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":10,\"cache_creation_input_tokens\":3068,\"cache_read_input_tokens\":0,\"output_tokens\":1}}}\n\n");
    tap.feed(b"event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"input_tokens\":10,\"cache_creation_input_tokens\":3337,\"cache_read_input_tokens\":6289,\"output_tokens\":50}}\n\n");
    assert_eq!(tap.usage(), Some(parts(10, 3337, 6289, 50)));
}

#[test]
fn anthropic_late_message_delta_input_and_server_tool_use_win() {
    // A web search loop: message_start states the first iteration's input; the delta states
    // the whole request's, and the searches it ran.
    let stream = sse(&[
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":2068,\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":0,\"cache_creation\":{\"ephemeral_5m_input_tokens\":0,\"ephemeral_1h_input_tokens\":0},\"output_tokens\":8}}}",
        "event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"input_tokens\":22397,\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":0,\"output_tokens\":637,\"server_tool_use\":{\"web_search_requests\":2,\"web_fetch_requests\":0}}}",
        "event: message_stop\ndata: {\"type\":\"message_stop\"}",
    ]);
    let (tap, _) = tap_all(Route::AnthropicMessages, false, &stream);
    let mut expected = parts(22397, 0, 0, 637);
    expected.web_search_requests = 2;
    assert_eq!(tap.usage(), Some(expected));
    assert_eq!(tap.end(), AnswerEnd::Finished);
}

#[test]
fn anthropic_compaction_iterations_sum_in_json_and_stream() {
    // Top level: the message iteration only (181 in, 8 out); the bill is both iterations.
    let usage = r#"{"input_tokens":181,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":8,"iterations":[{"input_tokens":100,"output_tokens":83,"cache_read_input_tokens":55096,"cache_creation_input_tokens":0,"cache_creation":{"ephemeral_5m_input_tokens":0,"ephemeral_1h_input_tokens":0},"type":"compaction"},{"input_tokens":181,"output_tokens":8,"cache_read_input_tokens":0,"cache_creation_input_tokens":0,"cache_creation":{"ephemeral_5m_input_tokens":0,"ephemeral_1h_input_tokens":0},"type":"message"}]}"#;
    let body = format!(r#"{{"type":"message","usage":{usage}}}"#);
    assert_eq!(
        json_usage(Route::AnthropicMessages, body.as_bytes()).0,
        Some(parts(281, 0, 55096, 91))
    );
    let start = r#"event: message_start
data: {"type":"message_start","message":{"usage":{"input_tokens":100,"cache_creation_input_tokens":0,"cache_read_input_tokens":55096,"output_tokens":7}}}"#;
    let delta = format!(
        "event: message_delta\ndata: {{\"type\":\"message_delta\",\"delta\":{{\"stop_reason\":\"end_turn\"}},\"usage\":{usage}}}"
    );
    let stream = sse(&[
        start,
        &delta,
        "event: message_stop\ndata: {\"type\":\"message_stop\"}",
    ]);
    let (tap, _) = tap_all(Route::AnthropicMessages, false, &stream);
    assert_eq!(tap.usage(), Some(parts(281, 0, 55096, 91)));
}

#[test]
fn anthropic_one_hour_writes_are_counted_apart() {
    let body = br#"{"usage":{"input_tokens":13,"cache_creation_input_tokens":3913,"cache_read_input_tokens":0,"cache_creation":{"ephemeral_5m_input_tokens":0,"ephemeral_1h_input_tokens":3913},"output_tokens":4}}"#;
    let mut expected = parts(13, 3913, 0, 4);
    expected.cache_write_1h = 3913;
    assert_eq!(json_usage(Route::AnthropicMessages, body).0, Some(expected));

    // Mixed writes split as the breakdown says.
    assert_eq!(one_hour(30, Some(split(10, 20))), 20);
    // No breakdown (older API): 5-minute writes.
    assert_eq!(one_hour(30, None), 0);
    // A later total than the breakdown covers: the dearer rate for the rest...
    assert_eq!(one_hour(40, Some(split(10, 20))), 30);
    assert_eq!(one_hour(40, Some(split(0, 0))), 40);
    // ...unless the breakdown shows 5-minute writes only.
    assert_eq!(one_hour(3337, Some(split(3068, 0))), 0);
}

fn split(five: u64, hour: u64) -> CacheCreation {
    CacheCreation {
        ephemeral_5m_input_tokens: Some(five),
        ephemeral_1h_input_tokens: Some(hour),
    }
}

#[test]
fn anthropic_error_event_mid_stream() {
    let stream = sse(&[
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":40,\"output_tokens\":1}}}",
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hel\"}}",
        "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}",
    ]);
    let (tap, _) = tap_all(Route::AnthropicMessages, false, &stream);
    assert_eq!(tap.end(), AnswerEnd::ErrorEvent);
    // What was reported stays readable (it bounds the charge), but the answer is incomplete.
    assert_eq!(tap.usage(), Some(parts(40, 0, 0, 1)));
}

#[test]
fn json_usage_both_providers_and_nothing_invented() {
    let o = br#"{"usage":{"prompt_tokens":5,"completion_tokens":2}}"#;
    assert_eq!(json_usage(Route::OpenAiChat, o).0, Some(parts(5, 0, 0, 2)));
    let a = br#"{"usage":{"input_tokens":5,"output_tokens":2,"cache_creation_input_tokens":3}}"#;
    assert_eq!(
        json_usage(Route::AnthropicMessages, a).0,
        Some(parts(5, 3, 0, 2))
    );
    assert_eq!(
        json_usage(Route::OpenAiChat, b"{}"),
        (None, AnswerEnd::Finished)
    );
    assert_eq!(json_usage(Route::OpenAiChat, br#"{"usage":{}}"#).0, None);
    assert_eq!(json_usage(Route::OpenAiChat, br#"{"usage":null}"#).0, None);
    assert_eq!(
        json_usage(Route::OpenAiChat, b"{\"usage\":{\"prompt"),
        (None, AnswerEnd::Open)
    );
    assert_eq!(
        json_usage(Route::AnthropicMessages, b"not json").1,
        AnswerEnd::Open
    );
}

// --- OpenAI Responses -------------------------------------------------------------------------

#[test]
fn responses_usage_from_json_and_the_terminal_event() {
    let body = br#"{"id":"resp_1","status":"completed","usage":{"input_tokens":100,"input_tokens_details":{"cached_tokens":40},"output_tokens":30,"output_tokens_details":{"reasoning_tokens":12},"total_tokens":130}}"#;
    let expected = parts(60, 0, 40, 30);
    assert_eq!(
        json_usage(Route::OpenAiResponses, body),
        (Some(expected), AnswerEnd::Finished)
    );

    let mut tap = SseTap::new(Route::OpenAiResponses, false);
    let events = b"event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"usage\":null}}\n\nevent: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"hi\"}\n\n";
    assert_eq!(tap.feed(events), events.to_vec());
    assert_eq!(tap.end(), AnswerEnd::Open);
    assert_eq!(tap.usage(), None);
    let done = b"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":100,\"input_tokens_details\":{\"cached_tokens\":40},\"output_tokens\":30}}}\n\n";
    tap.feed(done);
    assert_eq!(tap.end(), AnswerEnd::Finished);
    assert_eq!(tap.usage(), Some(expected));
}

#[test]
fn responses_failed_and_error_are_not_complete() {
    // A failed response carries the provider's final usage but is no answer.
    let mut failed = SseTap::new(Route::OpenAiResponses, false);
    failed.feed(b"data: {\"type\":\"response.failed\",\"response\":{\"usage\":{\"input_tokens\":5,\"output_tokens\":1}}}\n\n");
    assert_eq!(failed.end(), AnswerEnd::Failed);
    assert_eq!(failed.usage().map(|u| u.usage.total()), Some(6));

    let mut error = SseTap::new(Route::OpenAiResponses, false);
    error.feed(
        b"event: error\ndata: {\"type\":\"error\",\"code\":\"server_error\",\"message\":\"x\"}\n\n",
    );
    assert_eq!(error.end(), AnswerEnd::ErrorEvent);
    assert_eq!(error.usage(), None);

    let json = br#"{"status":"failed","usage":{"input_tokens":5,"output_tokens":0}}"#;
    assert_eq!(
        json_usage(Route::OpenAiResponses, json).1,
        AnswerEnd::Failed
    );
}

#[test]
fn responses_incomplete_is_a_finished_answer() {
    let mut tap = SseTap::new(Route::OpenAiResponses, false);
    tap.feed(b"event: response.incomplete\ndata: {\"type\":\"response.incomplete\",\"response\":{\"status\":\"incomplete\",\"usage\":{\"input_tokens\":9,\"output_tokens\":16}}}\n\n");
    assert_eq!(tap.end(), AnswerEnd::Finished);
    assert_eq!(tap.usage(), Some(parts(9, 0, 0, 16)));
}

#[test]
fn stored_stream_replay_strips_only_the_usage_only_chunk() {
    let stream = sse(&[
        r#"data: {"choices":[{"delta":{"content":"hi"}}]}"#,
        r#"data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1}}"#,
        "data: [DONE]",
    ]);
    let out = strip_openai_usage_chunk(&stream);
    assert_eq!(
        out,
        sse(&[
            r#"data: {"choices":[{"delta":{"content":"hi"}}]}"#,
            "data: [DONE]"
        ])
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
            tap.end() == whole.end() && tap.usage() == whole.usage(),
            "reads of {size} bytes"
        );
        assert!(tap.finish().is_empty());
    }
    assert_eq!(whole.end(), AnswerEnd::Finished);
    // A 1 MiB event in 1 KiB reads is relayed whole when it ends.
    let mut tap = SseTap::new(Route::OpenAiChat, false);
    let big = format!("data: \"{}\"\n\n", "x".repeat(1 << 20));
    let mut relayed = 0;
    for chunk in big.as_bytes().chunks(1024) {
        relayed += tap.feed(chunk).len();
    }
    assert_eq!(relayed, big.len());
}
