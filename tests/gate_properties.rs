//! Properties of the request path, the digest path and the pure decision (SPEC §2.1, §2.2,
//! §2.10, §8): both modes decide identically and sign byte-identical receipts; the digest
//! carries no text; fingerprints ignore streaming and nothing else; malformed input gives typed
//! errors that echo nothing; `decide` is total and keeps its ordering invariants.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config, TestCaseError};
use serde_json::{json, Map, Value};

use tokensaver::auth::fingerprint_key;
use tokensaver::config::Prices;
use tokensaver::gate::{
    decide, BudgetState, Decision, GateInput, KeyState, Policy, Usage, Verdict, WindowCounts,
    Windows,
};
use tokensaver::receipt::ReceiptSigner;
use tokensaver::request::{self, Digest, Hash, RequestShape, Role, Route, ToolDef, Turn, WireForm};

fn config() -> Config {
    // 256 cases per property keeps the file at a few seconds in debug; PROPTEST_CASES raises
    // it for a longer hunt.
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256);
    Config {
        cases,
        // Regressions are not persisted to files: this suite owns no files besides itself.
        failure_persistence: None,
        ..Config::default()
    }
}

// ------------------------------------------------------------------------------ policy

fn policy() -> Policy {
    let mut p = Policy::default();
    let price = |input, output, max_output| Prices {
        input,
        cache_write: input / 4 * 5,
        cache_read: input / 10,
        output,
        max_output,
        cache_write_1h: None,
        web_search_per_1k: None,
    };
    p.prices
        .insert("gpt-4o".into(), price(2_500_000, 10_000_000, 16_384));
    p.prices
        .insert("gpt-4o-mini".into(), price(150_000, 600_000, 16_384));
    p.prices.insert(
        "claude-sonnet-4-5".into(),
        price(3_000_000, 15_000_000, 64_000),
    );
    p.prices.insert(
        "claude-haiku-4-5".into(),
        price(1_000_000, 5_000_000, 64_000),
    );
    p.prices.insert("free-local".into(), price(0, 0, 4_096));
    p.downgrade.insert("gpt-4o".into(), "gpt-4o-mini".into());
    p.downgrade
        .insert("claude-sonnet-4-5".into(), "claude-haiku-4-5".into());
    p
}

const OPENAI_MODELS: &[&str] = &["gpt-4o", "gpt-4o-mini", "free-local", "no-price-model"];
const ANTHROPIC_MODELS: &[&str] = &["claude-sonnet-4-5", "claude-haiku-4-5", "no-price-model"];

// ------------------------------------------------------------------------------ text with markers

/// Marker strings: "MK" and 12-16 random alphanumerics. Uppercase "MK" never occurs in hex,
/// in field names or in the snippets, so finding one in an output means text leaked.
fn marker() -> impl Strategy<Value = String> {
    "MK[A-Za-z0-9]{12,16}"
}

const SNIPPETS: &[&str] = &[
    "",
    "hello ",
    "héllo wörld ",
    "🚀🐈 ",
    "日本語のテキスト ",
    "tab\tand\nnewline ",
    "quote \" backslash \\ ",
    "\u{0}nul ",
    "e\u{301} combining ",
    "\u{feff}bom ",
    "a very long repeated piece of ordinary prose, ",
];

fn text() -> impl Strategy<Value = String> {
    (
        prop::sample::select(SNIPPETS),
        marker(),
        prop::sample::select(SNIPPETS),
        0usize..3,
    )
        .prop_map(|(a, m, b, rep)| format!("{a}{m}{}", b.repeat(rep)))
}

/// Every marker in a string (the "MK" prefix and the alphanumerics after it).
fn markers_in(s: &str, out: &mut Vec<String>) {
    let mut rest = s;
    while let Some(i) = rest.find("MK") {
        let tail = &rest[i..];
        let len = tail
            .char_indices()
            .skip(2)
            .find(|(_, c)| !c.is_ascii_alphanumeric())
            .map_or(tail.len(), |(j, _)| j);
        if len >= 14 {
            out.push(tail[..len].to_string());
        }
        rest = &tail[2..];
    }
}

fn markers_of(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::String(s) => markers_in(s, out),
        Value::Array(a) => a.iter().for_each(|x| markers_of(x, out)),
        Value::Object(m) => {
            for (k, x) in m {
                markers_in(k, out);
                markers_of(x, out);
            }
        }
        _ => {}
    }
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

// ------------------------------------------------------------------------------ request bodies

#[derive(Debug, Clone)]
struct Params {
    model: Index,
    max_tokens: Option<u64>,
    completion_tokens_field: bool,
    temperature: Option<f64>,
    seed: Option<i64>,
    n: Option<u64>,
    stream: Option<bool>,
    stream_options: bool,
}

fn params() -> impl Strategy<Value = Params> {
    (
        any::<Index>(),
        prop_oneof![
            Just(None),
            (0u64..2_000).prop_map(Some),
            prop_oneof![
                Just(1_000u64),
                Just(1_001),
                Just(4_095),
                Just(4_096),
                Just(8_000),
                Just(u64::MAX)
            ]
            .prop_map(Some),
            any::<u32>().prop_map(|x| Some(u64::from(x))),
        ],
        any::<bool>(),
        prop_oneof![
            Just(None),
            Just(Some(0.0)),
            Just(Some(0.7)),
            Just(Some(1.0)),
            (0.0f64..2.0).prop_map(Some),
            (-1e300f64..1e300).prop_map(Some),
        ],
        prop_oneof![Just(None), any::<i64>().prop_map(Some)],
        prop_oneof![Just(None), (0u64..5).prop_map(Some)],
        prop_oneof![Just(None), any::<bool>().prop_map(Some)],
        any::<bool>(),
    )
        .prop_map(
            |(
                model,
                max_tokens,
                completion_tokens_field,
                temperature,
                seed,
                n,
                stream,
                stream_options,
            )| Params {
                model,
                max_tokens,
                completion_tokens_field,
                temperature,
                seed,
                n,
                stream,
                stream_options,
            },
        )
}

fn apply_params(body: &mut Map<String, Value>, p: &Params, models: &[&str], openai: bool) {
    body.insert("model".into(), json!(models[p.model.index(models.len())]));
    if let Some(m) = p.max_tokens {
        let field = if openai && p.completion_tokens_field {
            "max_completion_tokens"
        } else {
            "max_tokens"
        };
        body.insert(field.into(), json!(m));
    }
    if let Some(t) = p.temperature {
        body.insert("temperature".into(), json!(t));
    }
    if openai {
        if let Some(s) = p.seed {
            body.insert("seed".into(), json!(s));
        }
        if let Some(n) = p.n {
            body.insert("n".into(), json!(n));
        }
    }
    if let Some(s) = p.stream {
        body.insert("stream".into(), json!(s));
        if s && p.stream_options && openai {
            body.insert("stream_options".into(), json!({"include_usage": true}));
        }
    }
}

#[derive(Debug, Clone)]
enum OaContent {
    Null,
    Text(String),
    Parts(Vec<(bool, String)>),
}

fn oa_content() -> impl Strategy<Value = OaContent> {
    prop_oneof![
        1 => Just(OaContent::Null),
        4 => text().prop_map(OaContent::Text),
        3 => vec((any::<bool>(), text()), 1..4).prop_map(OaContent::Parts),
    ]
}

fn oa_content_json(c: &OaContent) -> Value {
    match c {
        OaContent::Null => Value::Null,
        OaContent::Text(t) => json!(t),
        OaContent::Parts(parts) => Value::Array(
            parts
                .iter()
                .map(|(is_text, t)| {
                    if *is_text {
                        json!({"type": "text", "text": t})
                    } else {
                        json!({"type": "image_url", "image_url": {"url": format!("https://img.example/{t}.png"), "detail": "low"}})
                    }
                })
                .collect(),
        ),
    }
}

#[derive(Debug, Clone)]
struct OaMessage {
    role: usize,
    content: OaContent,
    calls: Vec<(Index, String)>,
    name: Option<String>,
}

fn oa_message() -> impl Strategy<Value = OaMessage> {
    (
        0usize..6,
        oa_content(),
        vec((any::<Index>(), text()), 0..3),
        prop::option::weighted(0.1, marker()),
    )
        .prop_map(|(role, content, calls, name)| OaMessage {
            role,
            content,
            calls,
            name,
        })
}

/// An OpenAI chat/completions body and the tool names it may call.
fn openai_body() -> impl Strategy<Value = Value> {
    (vec(marker(), 1..5), 0usize..5, vec(oa_message(), 1..9), vec(text(), 5), params(), any::<bool>()).prop_map(
        |(names, ntools, msgs, descriptions, p, cache_control)| {
            let mut body = Map::new();
            let messages: Vec<Value> = msgs
                .iter()
                .enumerate()
                .map(|(i, m)| {
                    let role = ["system", "developer", "user", "assistant", "tool", "user"][m.role];
                    let mut msg = Map::new();
                    msg.insert("role".into(), json!(role));
                    msg.insert("content".into(), oa_content_json(&m.content));
                    if role == "assistant" && !m.calls.is_empty() {
                        let calls: Vec<Value> = m
                            .calls
                            .iter()
                            .enumerate()
                            .map(|(j, (idx, args))| {
                                json!({"id": format!("call_{i}_{j}"), "type": "function",
                                       "function": {"name": names[idx.index(names.len())], "arguments": args}})
                            })
                            .collect();
                        msg.insert("tool_calls".into(), Value::Array(calls));
                    }
                    if role == "tool" {
                        msg.insert("tool_call_id".into(), json!(format!("call_{i}")));
                    }
                    if let Some(n) = &m.name {
                        msg.insert("name".into(), json!(n));
                    }
                    if cache_control && i == 0 {
                        msg.insert("cache_control".into(), json!({"type": "ephemeral"}));
                    }
                    Value::Object(msg)
                })
                .collect();
            body.insert("messages".into(), Value::Array(messages));
            let tools: Vec<Value> = names
                .iter()
                .take(ntools)
                .zip(&descriptions)
                .map(|(n, d)| {
                    json!({"type": "function", "function": {"name": n, "description": d,
                        "parameters": {"type": "object", "properties": {"q": {"type": "string", "description": d}}}}})
                })
                .collect();
            if !tools.is_empty() {
                body.insert("tools".into(), Value::Array(tools));
            }
            apply_params(&mut body, &p, OPENAI_MODELS, true);
            Value::Object(body)
        },
    )
}

#[derive(Debug, Clone)]
enum AnBlock {
    Text(String, bool),
    Image(String),
    ToolUse(Index, String),
    ToolResult(String, bool),
}

fn an_block() -> impl Strategy<Value = AnBlock> {
    prop_oneof![
        4 => (text(), prop::bool::weighted(0.2)).prop_map(|(t, c)| AnBlock::Text(t, c)),
        1 => marker().prop_map(AnBlock::Image),
        2 => (any::<Index>(), text()).prop_map(|(i, t)| AnBlock::ToolUse(i, t)),
        2 => (text(), any::<bool>()).prop_map(|(t, blocks)| AnBlock::ToolResult(t, blocks)),
    ]
}

fn an_block_json(b: &AnBlock, names: &[String], k: usize) -> Value {
    match b {
        AnBlock::Text(t, true) => {
            json!({"type": "text", "text": t, "cache_control": {"type": "ephemeral"}})
        }
        AnBlock::Text(t, false) => json!({"type": "text", "text": t}),
        AnBlock::Image(m) => {
            json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": format!("iVBOR{m}")}})
        }
        AnBlock::ToolUse(i, t) => json!({"type": "tool_use", "id": format!("toolu_{k}"),
            "name": names[i.index(names.len())], "input": {"query": t, "limit": 3}}),
        AnBlock::ToolResult(t, false) => {
            json!({"type": "tool_result", "tool_use_id": format!("toolu_{k}"), "content": t})
        }
        AnBlock::ToolResult(t, true) => {
            json!({"type": "tool_result", "tool_use_id": format!("toolu_{k}"),
            "content": [{"type": "text", "text": t}]})
        }
    }
}

#[derive(Debug, Clone)]
enum AnContent {
    Text(String),
    Blocks(Vec<AnBlock>),
}

#[derive(Debug, Clone)]
enum AnSystem {
    None,
    Text(String),
    Blocks(Vec<(String, bool)>),
}

fn anthropic_body() -> impl Strategy<Value = Value> {
    let content = prop_oneof![
        text().prop_map(AnContent::Text),
        vec(an_block(), 1..4).prop_map(AnContent::Blocks),
    ];
    let system = prop_oneof![
        Just(AnSystem::None),
        text().prop_map(AnSystem::Text),
        vec((text(), prop::bool::weighted(0.3)), 1..3).prop_map(AnSystem::Blocks),
    ];
    (vec(marker(), 1..5), 0usize..5, vec(content, 1..9), system, vec(text(), 5), params()).prop_map(
        |(names, ntools, msgs, system, descriptions, p)| {
            let mut body = Map::new();
            let messages: Vec<Value> = msgs
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    let role = if i % 2 == 0 { "user" } else { "assistant" };
                    let content = match c {
                        AnContent::Text(t) => json!(t),
                        AnContent::Blocks(bs) => Value::Array(bs.iter().map(|b| an_block_json(b, &names, i)).collect()),
                    };
                    json!({"role": role, "content": content})
                })
                .collect();
            body.insert("messages".into(), Value::Array(messages));
            match system {
                AnSystem::None => {}
                AnSystem::Text(t) => {
                    body.insert("system".into(), json!(t));
                }
                AnSystem::Blocks(bs) => {
                    let blocks: Vec<Value> = bs
                        .iter()
                        .map(|(t, c)| {
                            if *c {
                                json!({"type": "text", "text": t, "cache_control": {"type": "ephemeral"}})
                            } else {
                                json!({"type": "text", "text": t})
                            }
                        })
                        .collect();
                    body.insert("system".into(), Value::Array(blocks));
                }
            }
            let tools: Vec<Value> = names
                .iter()
                .take(ntools)
                .zip(&descriptions)
                .map(|(n, d)| {
                    json!({"name": n, "description": d,
                        "input_schema": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}})
                })
                .collect();
            if !tools.is_empty() {
                body.insert("tools".into(), Value::Array(tools));
            }
            apply_params(&mut body, &p, ANTHROPIC_MODELS, false);
            Value::Object(body)
        },
    )
}

fn any_request() -> impl Strategy<Value = (Route, Value)> {
    prop_oneof![
        openai_body().prop_map(|b| (Route::OpenAiChat, b)),
        anthropic_body().prop_map(|b| (Route::AnthropicMessages, b)),
    ]
}

// ------------------------------------------------------------------------------ key state

#[derive(Debug, Clone)]
struct State {
    secret: String,
    key_id: String,
    counts: WindowCounts,
    budget: Option<BudgetState>,
    human_header: Option<bool>,
    human_default: bool,
    /// Held answers by wire form, with the usage recorded for each (if any).
    held_json: Option<Option<Usage>>,
    held_sse: Option<Option<Usage>>,
    approved_hold: bool,
    now_ms: u64,
    /// The chained context the proxy (or the digest client) found for the request's
    /// `previous_response_id` in its registry (`RequestShape::chained_input_tokens`).
    chained: u64,
}

fn usage() -> impl Strategy<Value = Usage> {
    (0u64..100_000, 0u64..10_000, 0u64..10_000, 0u64..10_000).prop_map(
        |(input, cache_write, cache_read, output)| Usage {
            input,
            cache_write,
            cache_read,
            output,
        },
    )
}

fn budget() -> impl Strategy<Value = Option<BudgetState>> {
    prop_oneof![
        1 => Just(None),
        1 => Just(Some(BudgetState { ceiling_nano: 0, spend_nano: 0, reserved_nano: 0 })),
        3 => (0u64..10_000_000_000, 0u64..10_000_000_000, 0u64..1_000_000_000).prop_map(|(c, s, r)| Some(BudgetState {
            ceiling_nano: c,
            spend_nano: s,
            reserved_nano: r,
        })),
        1 => (any::<u64>(), any::<u64>(), any::<u64>()).prop_map(|(c, s, r)| Some(BudgetState {
            ceiling_nano: c,
            spend_nano: s,
            reserved_nano: r,
        })),
    ]
}

fn counts() -> impl Strategy<Value = WindowCounts> {
    (0u64..12, 0u64..140, 0u64..400, any::<bool>(), any::<bool>()).prop_map(
        |(i, m, h, model_seen, fingerprint_seen)| WindowCounts {
            earlier_identical: i,
            earlier_key_minute: m.max(i),
            earlier_key_hour: h.max(m).max(i),
            model_seen,
            fingerprint_seen,
            ..WindowCounts::default()
        },
    )
}

fn state() -> impl Strategy<Value = State> {
    (
        "[A-Za-z0-9]{8,40}",
        "[a-z0-9-]{1,20}",
        counts(),
        budget(),
        prop::option::of(any::<bool>()),
        any::<bool>(),
        prop::option::of(prop::option::of(usage())),
        prop::option::of(prop::option::of(usage())),
        any::<bool>(),
        any::<u64>(),
        prop_oneof![Just(0u64), 0u64..200_000, any::<u64>()],
    )
        .prop_map(
            |(
                secret,
                key_id,
                counts,
                budget,
                human_header,
                human_default,
                held_json,
                held_sse,
                approved_hold,
                now_ms,
                chained,
            )| State {
                secret,
                key_id,
                counts,
                budget,
                human_header,
                human_default,
                held_json,
                held_sse,
                approved_hold,
                now_ms,
                chained,
            },
        )
}

impl State {
    fn held_forms(&self) -> Vec<WireForm> {
        let mut forms = Vec::new();
        if self.held_json.is_some() {
            forms.push(WireForm::Json);
        }
        if self.held_sse.is_some() {
            forms.push(WireForm::Sse);
        }
        forms
    }

    /// The usage recorded at the gate for the answer held in this form.
    fn usage_for(&self, form: WireForm) -> Option<Usage> {
        match form {
            WireForm::Json => self.held_json.flatten(),
            WireForm::Sse => self.held_sse.flatten(),
        }
    }
}

fn signer() -> ReceiptSigner {
    ReceiptSigner::from_seed([7u8; 32])
}

/// Proxy mode: the request body, the `x-tokensaver-human` header, the answer store. The proxy
/// reads the body for its own decision (only the turn hashes a decision compares).
fn decide_from_request(route: Route, body: &[u8], st: &State) -> Result<Decision, String> {
    let parsed = request::parse_for_decision(route, body, &fingerprint_key(&st.secret))
        .map_err(|e| e.to_string())?;
    let mut shape = parsed.shape;
    shape.chained_input_tokens = st.chained;
    let form = shape.wire_form();
    let input = GateInput {
        key_id: &st.key_id,
        shape: &shape,
        human: st.human_header.unwrap_or(st.human_default),
        held: st.held_forms().contains(&form),
        held_usage: st.usage_for(form),
        approved_hold: st.approved_hold,
    };
    let state = KeyState {
        counts: st.counts,
        budget: st.budget,
    };
    Ok(decide(&policy(), &input, &state, st.now_ms))
}

/// Digest mode: the client computes the shape, sends the digest bytes; the gate parses them.
fn digest_bytes(route: Route, body: &[u8], st: &State) -> Result<Vec<u8>, String> {
    let parsed =
        request::parse(route, body, &fingerprint_key(&st.secret)).map_err(|e| e.to_string())?;
    let mut shape = parsed.shape;
    shape.chained_input_tokens = st.chained;
    let mut digest = Digest::new(shape);
    digest.human = st.human_header;
    digest.held = st.held_forms();
    digest.hold_id = st
        .approved_hold
        .then(|| "hold_0123456789abcdef0123456789abcdef".to_string());
    serde_json::to_vec(&digest).map_err(|e| e.to_string())
}

fn decide_from_digest(bytes: &[u8], st: &State) -> Result<Decision, String> {
    let digest = Digest::parse(bytes).map_err(|e| e.to_string())?;
    let shape = &digest.request;
    let form = shape.wire_form();
    let input = GateInput {
        key_id: &st.key_id,
        shape,
        human: digest.human.unwrap_or(st.human_default),
        held: digest.holds(form),
        held_usage: st.usage_for(form),
        approved_hold: digest.hold_id.is_some(),
    };
    let state = KeyState {
        counts: st.counts,
        budget: st.budget,
    };
    Ok(decide(&policy(), &input, &state, st.now_ms))
}

// ------------------------------------------------------------------------------ 1. both modes agree

proptest! {
    #![proptest_config(config())]

    #[test]
    fn request_and_digest_paths_decide_and_sign_identically((route, body) in any_request(), st in state()) {
        let bytes = serde_json::to_vec(&body).unwrap();
        let by_request = decide_from_request(route, &bytes, &st).map_err(TestCaseError::fail)?;
        let digest = digest_bytes(route, &bytes, &st).map_err(TestCaseError::fail)?;
        let by_digest = decide_from_digest(&digest, &st).map_err(TestCaseError::fail)?;
        prop_assert_eq!(&by_request, &by_digest);

        let signer = signer();
        let a = signer.sign(&by_request.receipt_body());
        let b = signer.sign(&by_digest.receipt_body());
        prop_assert_eq!(&a, &b);
        prop_assert_eq!(a.body_bytes().unwrap(), b.body_bytes().unwrap());

        // No text leaves the building: none of the generated texts is in the digest (nor in
        // the receipt, which both modes sign).
        let mut markers = Vec::new();
        markers_of(&body, &mut markers);
        let receipt = by_request.receipt_body();
        for m in &markers {
            prop_assert!(!contains(&digest, m), "digest contains the text marker {}", m);
            prop_assert!(!contains(&receipt, m), "receipt contains the text marker {}", m);
        }
        prop_assert!(!contains(&digest, &st.secret), "digest contains the key secret");
    }
}

// ------------------------------------------------------------------------------ 2. fingerprints

fn fingerprint(route: Route, body: &Value, secret: &str) -> Option<Hash> {
    let bytes = serde_json::to_vec(body).ok()?;
    request::parse(route, &bytes, &fingerprint_key(secret))
        .ok()
        .map(|p| p.shape.fingerprint)
}

/// Paths to every string and number leaf (not keys) of a JSON value.
fn leaves(v: &Value, path: &mut Vec<Value>, out: &mut Vec<Vec<Value>>) {
    match v {
        Value::String(_) | Value::Number(_) | Value::Bool(_) => out.push(path.clone()),
        Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                path.push(json!(i));
                leaves(x, path, out);
                path.pop();
            }
        }
        Value::Object(m) => {
            for (k, x) in m {
                path.push(json!(k));
                leaves(x, path, out);
                path.pop();
            }
        }
        Value::Null => {}
    }
}

fn leaf_mut<'a>(v: &'a mut Value, path: &[Value]) -> Option<&'a mut Value> {
    let mut cur = v;
    for step in path {
        cur = match step {
            Value::Number(i) => cur.get_mut(usize::try_from(i.as_u64()?).ok()?)?,
            Value::String(k) => cur.get_mut(k.as_str())?,
            _ => return None,
        };
    }
    Some(cur)
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn streaming_does_not_change_the_fingerprint((route, body) in any_request(), secret in "[A-Za-z0-9]{8,32}") {
        let base = fingerprint(route, &body, &secret).unwrap();
        for (stream, options) in [(None, false), (Some(false), false), (Some(true), false), (Some(true), true)] {
            let mut v = body.clone();
            let map = v.as_object_mut().unwrap();
            map.remove("stream");
            map.remove("stream_options");
            if let Some(s) = stream {
                map.insert("stream".into(), json!(s));
            }
            if options {
                map.insert("stream_options".into(), json!({"include_usage": true}));
            }
            let fp = fingerprint(route, &v, &secret).unwrap();
            prop_assert_eq!(fp, base, "stream {:?} / stream_options {} changed the fingerprint", stream, options);
        }
    }

    #[test]
    fn any_content_change_changes_the_fingerprint(
        (route, body) in any_request(),
        secret in "[A-Za-z0-9]{8,32}",
        pick in any::<Index>(),
    ) {
        let base = fingerprint(route, &body, &secret).unwrap();
        let mut paths = Vec::new();
        leaves(&body, &mut Vec::new(), &mut paths);
        paths.retain(|p| !matches!(p.first(), Some(Value::String(k)) if k == "stream" || k == "stream_options"));
        prop_assume!(!paths.is_empty());
        let path = &paths[pick.index(paths.len())];
        let mut changed = body.clone();
        let leaf = leaf_mut(&mut changed, path).unwrap();
        *leaf = match leaf.take() {
            Value::String(s) => json!(format!("{s}x")),
            Value::Bool(b) => json!(!b),
            Value::Number(n) => match (n.as_u64(), n.as_i64()) {
                (Some(u), _) => json!(u ^ 1),
                (None, Some(i)) => json!(i ^ 1),
                _ => json!(n.as_f64().unwrap_or(0.0) + 1.0),
            },
            other => other,
        };
        prop_assume!(changed != body);
        // A change may make the body invalid (e.g. a role); every valid variant must differ.
        if let Some(fp) = fingerprint(route, &changed, &secret) {
            prop_assert_ne!(fp, base, "changing {:?} kept the fingerprint", path);
        }
    }

    #[test]
    fn different_secrets_give_different_fingerprints(
        (route, body) in any_request(),
        a in "[A-Za-z0-9]{8,32}",
        b in "[A-Za-z0-9]{8,32}",
    ) {
        prop_assume!(a != b);
        let fa = fingerprint(route, &body, &a).unwrap();
        let fb = fingerprint(route, &body, &b).unwrap();
        prop_assert_ne!(fa, fb);
        // The turn hashes are keyed too: no turn hash is shared across the two keys.
        let pa = request::parse(route, &serde_json::to_vec(&body).unwrap(), &fingerprint_key(&a)).unwrap().shape;
        let pb = request::parse(route, &serde_json::to_vec(&body).unwrap(), &fingerprint_key(&b)).unwrap().shape;
        for (x, y) in pa.turns.iter().zip(&pb.turns) {
            prop_assert_ne!(x.hash, y.hash);
        }
    }
}

// ------------------------------------------------------------------------------ 3. malformed input

/// Raw JSON fragments spliced in place of one field: out-of-range numbers, wrong types,
/// invalid UTF-8, lone surrogates, deep nesting.
fn raw_fragment() -> impl Strategy<Value = Vec<u8>> {
    let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n)).into_bytes();
    prop_oneof![
        Just(b"1e400".to_vec()),
        Just(b"-1e400".to_vec()),
        Just(b"18446744073709551616".to_vec()),
        Just(b"18446744073709551615".to_vec()),
        Just(b"-9223372036854775809".to_vec()),
        Just(b"1.5".to_vec()),
        Just(b"-1".to_vec()),
        Just(b"-0".to_vec()),
        Just(b"true".to_vec()),
        Just(b"null".to_vec()),
        Just(b"[]".to_vec()),
        Just(b"{}".to_vec()),
        Just(b"\"\\ud800\"".to_vec()),
        Just(b"\"\\udc00x\\ud800\"".to_vec()),
        Just(deep(127)),
        Just(deep(129)),
        Just(deep(100_000)),
        Just(format!("{}1{}", "{\"a\":".repeat(5_000), "}".repeat(5_000)).into_bytes()),
        marker().prop_map(|m| format!("\"{m}\"").into_bytes()),
        marker().prop_map(|m| {
            let mut v = b"\"".to_vec();
            v.extend_from_slice(m.as_bytes());
            v.extend_from_slice(&[0xff, 0xfe, 0xc3, b'"']);
            v
        }),
        marker().prop_map(|m| format!("{{\"{m}\": [1, \"{m}\"]}}").into_bytes()),
        marker().prop_map(|m| format!("\"{m}").into_bytes()),
    ]
}

/// Replace one node of the body (any depth) by a placeholder, and splice the raw fragment in.
fn corrupt(body: &Value, pick: Index, fragment: &[u8]) -> Vec<u8> {
    let mut nodes = Vec::new();
    fn all_nodes(v: &Value, path: &mut Vec<Value>, out: &mut Vec<Vec<Value>>) {
        out.push(path.clone());
        match v {
            Value::Array(a) => {
                for (i, x) in a.iter().enumerate() {
                    path.push(json!(i));
                    all_nodes(x, path, out);
                    path.pop();
                }
            }
            Value::Object(m) => {
                for (k, x) in m {
                    path.push(json!(k));
                    all_nodes(x, path, out);
                    path.pop();
                }
            }
            _ => {}
        }
    }
    all_nodes(body, &mut Vec::new(), &mut nodes);
    let nodes: Vec<_> = nodes.into_iter().filter(|p| !p.is_empty()).collect();
    let mut v = body.clone();
    if !nodes.is_empty() {
        if let Some(node) = leaf_mut(&mut v, &nodes[pick.index(nodes.len())]) {
            *node = json!("@@PLACEHOLDER@@");
        }
    }
    let text = serde_json::to_vec(&v).unwrap();
    let needle = b"\"@@PLACEHOLDER@@\"";
    match text.windows(needle.len()).position(|w| w == needle) {
        Some(at) => {
            let mut out = text[..at].to_vec();
            out.extend_from_slice(fragment);
            out.extend_from_slice(&text[at + needle.len()..]);
            out
        }
        None => text,
    }
}

fn check_no_echo(bytes: &[u8], shown: &str) -> Result<(), TestCaseError> {
    let mut markers = Vec::new();
    markers_in(&String::from_utf8_lossy(bytes), &mut markers);
    for m in markers {
        prop_assert!(!shown.contains(&m), "error text echoes input: {}", shown);
    }
    Ok(())
}

/// Feed bytes to both request parsers and the digest parser: typed errors, nothing echoed.
fn feed(bytes: &[u8]) -> Result<(), TestCaseError> {
    let key = fingerprint_key("fuzz-secret");
    for route in [Route::OpenAiChat, Route::AnthropicMessages] {
        if let Err(e) = request::parse(route, bytes, &key) {
            check_no_echo(bytes, &e.to_string())?;
            check_no_echo(bytes, &format!("{e:?}"))?;
            prop_assert!(!e.code().is_empty());
        }
    }
    if let Err(e) = Digest::parse(bytes) {
        check_no_echo(bytes, &e.to_string())?;
        check_no_echo(bytes, &format!("{e:?}"))?;
    }
    Ok(())
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        (-1e300f64..1e300).prop_map(Value::from),
        text().prop_map(Value::from),
        prop::sample::select(
            &[
                "user",
                "assistant",
                "system",
                "tool",
                "text",
                "image",
                "tool_use",
                "gpt-4o"
            ][..]
        )
        .prop_map(Value::from),
    ];
    leaf.prop_recursive(6, 64, 8, |inner| {
        let keys = prop::sample::select(
            &[
                "model",
                "messages",
                "role",
                "content",
                "type",
                "text",
                "tools",
                "tool_calls",
                "function",
                "name",
                "arguments",
                "input",
                "system",
                "max_tokens",
                "n",
                "seed",
                "temperature",
                "stream",
                "v",
                "request",
                "turns",
                "chars",
                "hash",
                "held",
                "human",
                "hold_id",
                "route",
                "fingerprint",
            ][..],
        );
        prop_oneof![
            vec(inner.clone(), 0..6).prop_map(Value::Array),
            vec(
                (prop_oneof![keys.prop_map(String::from), marker()], inner),
                0..6
            )
            .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn arbitrary_bytes_never_panic(prefix in vec(any::<u8>(), 0..256), m in marker(), suffix in vec(any::<u8>(), 0..256)) {
        let mut bytes = prefix;
        bytes.extend_from_slice(m.as_bytes());
        bytes.extend_from_slice(&suffix);
        feed(&bytes)?;
    }

    #[test]
    fn arbitrary_json_never_panics(v in json_value()) {
        feed(&serde_json::to_vec(&v).unwrap())?;
        // The same value wrapped as a plausible body and as a plausible digest.
        feed(&serde_json::to_vec(&json!({"model": "gpt-4o", "messages": [v.clone()]})).unwrap())?;
        feed(&serde_json::to_vec(&json!({"v": request::digest::DIGEST_VERSION, "request": v})).unwrap())?;
    }

    #[test]
    fn a_corrupted_field_gives_a_typed_error(
        (_route, body) in any_request(),
        pick in any::<Index>(),
        fragment in raw_fragment(),
    ) {
        feed(&corrupt(&body, pick, &fragment))?;
    }

    #[test]
    fn a_corrupted_digest_gives_a_typed_error(
        (route, body) in any_request(),
        st in state(),
        pick in any::<Index>(),
        fragment in raw_fragment(),
    ) {
        let digest = digest_bytes(route, &serde_json::to_vec(&body).unwrap(), &st).map_err(TestCaseError::fail)?;
        let value: Value = serde_json::from_slice(&digest).unwrap();
        let bytes = corrupt(&value, pick, &fragment);
        feed(&bytes)?;
        if let Ok(d) = Digest::parse(&bytes) {
            // Accepted only as a version this build reads.
            prop_assert!(d.v == request::digest::DIGEST_VERSION, "accepted digest version {}", d.v);
        }
    }
}

#[test]
fn deep_nesting_and_huge_numbers_are_typed_errors() {
    let key = fingerprint_key("deep");
    let deep = |n: usize| {
        format!(
            "{{\"model\":\"gpt-4o\",\"messages\":[{{\"role\":\"user\",\"content\":{}\"x\"{}}}]}}",
            "[".repeat(n),
            "]".repeat(n)
        )
    };
    for n in [10, 126, 127, 128, 129, 1_000, 200_000] {
        let body = deep(n);
        for route in [Route::OpenAiChat, Route::AnthropicMessages] {
            // Ok or a typed error; never a panic or a stack overflow.
            let _ = request::parse(route, body.as_bytes(), &key);
        }
        let _ = Digest::parse(body.as_bytes());
    }
    for (field, raw) in [
        ("max_tokens", "1e400"),
        ("max_tokens", "18446744073709551616"),
        ("max_tokens", "-1"),
        ("max_tokens", "1.5"),
        ("temperature", "1e400"),
        ("seed", "18446744073709551616"),
        ("n", "-3"),
    ] {
        let body = format!("{{\"model\":\"gpt-4o\",\"messages\":[{{\"role\":\"user\",\"content\":\"hi\"}}],\"{field}\":{raw}}}");
        let got = request::parse(Route::OpenAiChat, body.as_bytes(), &key);
        assert!(
            got.is_err(),
            "{field}: {raw} must be refused, got {:?}",
            got.map(|p| p.shape)
        );
    }
    let mut invalid =
        b"{\"model\":\"gpt-4o\",\"messages\":[{\"role\":\"user\",\"content\":\"MKinvalidUtf8abc"
            .to_vec();
    invalid.extend_from_slice(&[0xff, 0xfe]);
    invalid.extend_from_slice(b"\"}]}");
    let err = request::parse(Route::OpenAiChat, &invalid, &key)
        .map(|_| ())
        .unwrap_err();
    assert_eq!(err.code(), "invalid_utf8");
    assert!(!err.to_string().contains("MKinvalidUtf8abc"));
}

// ------------------------------------------------------------------------------ 4. decide is total

fn hash() -> impl Strategy<Value = Hash> {
    any::<[u8; 32]>().prop_map(Hash)
}

fn small_or_extreme() -> impl Strategy<Value = u64> {
    prop_oneof![
        6 => 0u64..5_000,
        1 => Just(u64::MAX),
        1 => Just(u64::MAX / 2 + 1),
        1 => any::<u64>(),
    ]
}

fn role() -> impl Strategy<Value = Role> {
    prop_oneof![
        Just(Role::User),
        Just(Role::Assistant),
        Just(Role::Tool),
        Just(Role::Function)
    ]
}

/// A shape as a digest may carry it: every count chosen by the client. With `extreme`, any
/// u64 (including sums that overflow); otherwise realistic magnitudes.
fn shape(extreme: bool) -> impl Strategy<Value = RequestShape> {
    let count = move || -> BoxedStrategy<u64> {
        if extreme {
            small_or_extreme().boxed()
        } else {
            (0u64..200_000).boxed()
        }
    };
    let pool = vec(hash(), 1..4);
    (
        pool,
        prop_oneof![Just(Route::OpenAiChat), Just(Route::AnthropicMessages)],
        hash(),
        prop::sample::select(
            &[
                "gpt-4o",
                "gpt-4o-mini",
                "claude-sonnet-4-5",
                "free-local",
                "no-price-model",
            ][..],
        ),
        prop::option::of(count()),
        prop_oneof![
            Just(None),
            Just(Some(0.0)),
            Just(Some(f64::NAN)),
            any::<f64>().prop_map(Some)
        ],
        prop::option::of(any::<i64>()),
        prop::option::of(prop_oneof![0u64..4, count()]),
        (any::<bool>(), any::<bool>(), count()),
        vec((role(), count(), any::<Index>(), any::<bool>()), 0..50),
        vec((any::<Index>(), count()), 0..30),
        vec(any::<Index>(), 0..4),
    )
        .prop_map(
            |(
                pool,
                route,
                fingerprint,
                model,
                max_tokens,
                temperature,
                seed,
                n,
                (stream, cache_marked, system_chars),
                turns,
                tools,
                called,
            )| {
                let pick = |i: &Index| pool[i.index(pool.len())];
                RequestShape {
                    route,
                    fingerprint,
                    step_fingerprint: fingerprint,
                    step_action: None,
                    session: Hash::default(),
                    provider_state: false,
                    model: model.to_string(),
                    max_tokens,
                    temperature,
                    seed,
                    n,
                    stream,
                    cache_marked,
                    system_chars,
                    turns: turns
                        .iter()
                        .map(|(role, chars, h, fresh)| Turn {
                            role: *role,
                            chars: *chars,
                            hash: Some(if *fresh {
                                Hash([h.index(255) as u8; 32])
                            } else {
                                pick(h)
                            }),
                        })
                        .collect(),
                    tools: tools
                        .iter()
                        .map(|(h, chars)| ToolDef {
                            name_hash: pick(h),
                            chars: *chars,
                        })
                        .collect(),
                    called_tool_hashes: called.iter().map(pick).collect(),
                    text_extra_bytes: 0,
                    media: Default::default(),
                    chained_input_tokens: 0,
                    cache_points: Vec::new(),
                    cache_ttl_marks: Default::default(),
                    cache_ttl_set: Default::default(),
                    retention_set: Default::default(),
                    route_prefix: Default::default(),
                }
            },
        )
}

fn extreme_counts() -> impl Strategy<Value = WindowCounts> {
    (
        small_or_extreme(),
        small_or_extreme(),
        small_or_extreme(),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(i, m, h, model_seen, fingerprint_seen)| WindowCounts {
            earlier_identical: i,
            earlier_key_minute: m,
            earlier_key_hour: h,
            model_seen,
            fingerprint_seen,
            ..WindowCounts::default()
        })
}

fn extreme_budget() -> impl Strategy<Value = Option<BudgetState>> {
    prop_oneof![
        budget(),
        (small_or_extreme(), small_or_extreme(), small_or_extreme()).prop_map(|(c, s, r)| Some(
            BudgetState {
                ceiling_nano: c,
                spend_nano: s,
                reserved_nano: r,
            }
        )),
    ]
}

#[derive(Debug, Clone)]
struct Flags {
    human: bool,
    held: bool,
    held_usage: Option<Usage>,
    approved_hold: bool,
    now_ms: u64,
}

fn flags() -> impl Strategy<Value = Flags> {
    (
        any::<bool>(),
        any::<bool>(),
        prop::option::of(usage()),
        any::<bool>(),
        any::<u64>(),
    )
        .prop_map(|(human, held, held_usage, approved_hold, now_ms)| Flags {
            human,
            held,
            held_usage,
            approved_hold,
            now_ms,
        })
}

fn reproducible(s: &RequestShape) -> bool {
    (s.temperature == Some(0.0) || s.seed.is_some()) && matches!(s.n, None | Some(1))
}

/// The invariants every decision keeps, whatever the inputs.
fn check_invariants(
    shape: &RequestShape,
    counts: WindowCounts,
    budget: Option<BudgetState>,
    f: &Flags,
) -> Result<(), TestCaseError> {
    let policy = policy();
    let input = GateInput {
        key_id: "k-prop",
        shape,
        human: f.human,
        held: f.held,
        held_usage: f.held_usage,
        approved_hold: f.approved_hold,
    };
    let state = KeyState { counts, budget };
    let d = decide(&policy, &input, &state, f.now_ms);

    prop_assert!(d.score.is_finite() && d.score >= 0.0, "score {}", d.score);
    let s = d.signals;
    for (name, x) in [
        ("exposure", s.exposure),
        ("size", s.size),
        ("ask", s.ask),
        ("depth", s.depth),
        ("tools", s.tools),
        ("loop", s.loop_),
        ("burst", s.burst),
        ("grind", s.grind),
        ("novelty", s.novelty),
        ("unattended", s.unattended),
    ] {
        prop_assert!((0.0..=1.0).contains(&x), "signal {} = {}", name, x);
    }

    // Runaway rules (SPEC §2.3, counted with the request itself) come first, before SERVE.
    let identical = counts.earlier_identical.saturating_add(1);
    let minute = counts.earlier_key_minute.saturating_add(1);
    let runaway = identical >= 8 || (identical >= 4 && !f.human) || minute >= 120;
    if runaway {
        prop_assert_eq!(d.verdict, Verdict::Block);
        prop_assert!(d.rule.is_some_and(|r| r.is_runaway()), "rule {:?}", d.rule);
        prop_assert_eq!(d.status(), 429);
    } else {
        prop_assert!(!d.rule.is_some_and(|r| r.is_runaway()), "rule {:?}", d.rule);
    }
    let servable = f.held && f.held_usage.is_some() && reproducible(shape);
    prop_assert_eq!(d.verdict == Verdict::Serve, !runaway && servable);
    if d.verdict == Verdict::Serve {
        prop_assert_eq!(d.tokens_not_bought, f.held_usage);
    } else {
        prop_assert_eq!(d.tokens_not_bought, None);
    }
    // An approved hold never yields a score-band verdict.
    if f.approved_hold {
        prop_assert!(d.band.is_none(), "band {:?} with an approved hold", d.band);
        // An approval passes a bounded worst case past the budget left, never an unbounded
        // one (issue "hostile" 5: nobody can approve a spend nobody can bound).
        if d.worst_case.cost_nano.is_some() {
            prop_assert_ne!(d.rule.map(|r| r.as_str()), Some("exceeds_remaining_budget"));
        } else if d.rule.map(|r| r.as_str()) == Some("exceeds_remaining_budget") {
            prop_assert!(!d.verdict.forwards());
        }
    }
    prop_assert_eq!(d.band.is_some() && d.rule.is_some(), false);
    prop_assert_eq!(d.hold_id.is_some(), d.verdict == Verdict::Challenge);
    prop_assert_eq!(d.model_served.is_some(), d.verdict.forwards());
    if d.verdict == Verdict::Block {
        let expect = if f.held {
            Some(0)
        } else {
            d.worst_case.tokens()
        };
        prop_assert_eq!(d.worst_case_tokens_avoided, expect);
    } else {
        prop_assert_eq!(d.worst_case_tokens_avoided, None);
    }
    if d.verdict == Verdict::Downgrade {
        prop_assert!(
            d.score <= 0.30
                && shape.tools.is_empty()
                && shape.max_tokens.is_some_and(|m| m <= 1_000)
        );
        prop_assert_eq!(
            d.model_served.as_deref(),
            policy.downgrade.get(&shape.model).map(String::as_str)
        );
    }
    // Pure: the same inputs give the same decision and the same receipt bytes.
    let again = decide(&policy, &input, &state, f.now_ms);
    prop_assert_eq!(&again, &d);
    prop_assert_eq!(again.receipt_body(), d.receipt_body());
    Ok(())
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn decide_keeps_its_invariants(shape in shape(false), counts in counts(), budget in budget(), f in flags()) {
        check_invariants(&shape, counts, budget, &f)?;
    }

    #[test]
    fn decide_keeps_its_invariants_on_parsed_requests((route, body) in any_request(), st in state(), f in flags()) {
        let parsed = request::parse(route, &serde_json::to_vec(&body).unwrap(), &fingerprint_key(&st.secret)).unwrap();
        check_invariants(&parsed.shape, st.counts, st.budget, &f)?;
    }

    /// SPEC §8: never a crash. A digest's counts are the client's word, so any u64 may arrive
    /// (sums that overflow u64 included); window counts at u64::MAX; zero and extreme budgets.
    #[test]
    fn decide_never_panics_on_extreme_values(shape in shape(true), counts in extreme_counts(), budget in extreme_budget(), f in flags()) {
        let result = std::panic::catch_unwind(|| check_invariants(&shape, counts, budget, &f));
        match result {
            Ok(r) => r?,
            Err(p) => {
                let msg = p.downcast_ref::<&str>().map(|s| s.to_string())
                    .or_else(|| p.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                return Err(TestCaseError::fail(format!("decide panicked: {msg}")));
            }
        }
    }

    /// The same through the wire: a digest with extreme counts that `Digest::parse` accepts.
    #[test]
    fn a_parsed_digest_with_extreme_counts_never_panics(shape in shape(true), f in flags()) {
        // Any chained context a client may claim, up to u64::MAX.
        let mut shape = shape;
        shape.chained_input_tokens = f.now_ms;
        let digest = serde_json::to_vec(&Digest::new(shape)).unwrap();
        if let Ok(parsed) = Digest::parse(&digest) {
            let st = State {
                secret: "s".into(),
                key_id: "k".into(),
                counts: WindowCounts::default(),
                budget: Some(BudgetState { ceiling_nano: 1_000_000, spend_nano: 0, reserved_nano: 0 }),
                human_header: Some(f.human),
                human_default: false,
                held_json: None,
                held_sse: None,
                approved_hold: false,
                now_ms: f.now_ms,
                chained: 0,
            };
            let result = std::panic::catch_unwind(|| decide_from_digest(&digest, &st));
            if let Err(p) = result {
                let msg = p
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| p.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                return Err(TestCaseError::fail(format!(
                    "decide panicked on a digest the gate accepted ({} turns, {} tools): {msg}",
                    parsed.request.turns.len(),
                    parsed.request.tools.len()
                )));
            }
        }
    }
}

// ------------------------------------------------------------------------------ 5. windows

/// The run of one step over its decision times (each decided as it arrived, no session), as
/// the schedule defines it: a step within the longest hold (240 s) of the one before continues
/// it, a later one starts a new run.
fn run_of(times: impl Iterator<Item = u64>) -> WindowCounts {
    let mut run: Option<(u64, u64, u64)> = None;
    for t in times {
        run = match run {
            Some((steps, first, last)) if t - last < 240_000 => Some((steps + 1, first, t)),
            _ => Some((1, t, t)),
        };
    }
    let (run_steps, run_first_ms, run_last_ms) = run.unwrap_or((0, 0, 0));
    WindowCounts {
        run_steps,
        run_first_ms,
        run_last_ms,
        ..WindowCounts::default()
    }
}

/// A gap between two requests: often 0 or small, sometimes exactly a window's length.
fn gap() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => 0u64..2_000,
        2 => 0u64..200_000,
        1 => prop::sample::select(&[59_999u64, 60_000, 60_001, 119_999, 120_000, 120_001, 3_599_999, 3_600_000, 3_600_001, 86_399_999, 86_400_000, 86_400_001][..]),
        1 => 0u64..100_000_000,
    ]
}

proptest! {
    #![proptest_config(config())]

    /// With the clock moving forward, the windows count exactly what a brute-force count over
    /// every recorded request gives (SPEC §2.12: half-open windows; §4: exact sliding windows).
    #[test]
    fn windows_count_like_brute_force(
        events in vec((0usize..2, 0u8..4, 0usize..3, gap()), 0..60),
        start in 0u64..1_000_000_000_000,
        last_gap in gap(),
    ) {
        const MODELS: [&str; 3] = ["m-a", "m-b", "m-c"];
        const KEYS: [&str; 2] = ["k-1", "k-2"];
        let mut w = Windows::new();
        let mut now = start;
        let mut log = Vec::new();
        for (k, f, m, g) in &events {
            now += g;
            w.record(KEYS[*k], &Hash([*f; 32]), MODELS[*m], now);
            log.push((*k, *f, *m, now));
        }
        let now = now + last_gap;
        for (k, key) in KEYS.iter().enumerate() {
            for f in 0u8..4 {
                for (m, model) in MODELS.iter().enumerate() {
                    let got = w.observe(key, &Hash([f; 32]), model, now);
                    let within = |t: u64, len: u64| now - t < len;
                    let mine = || log.iter().filter(|e| e.0 == k);
                    let want = WindowCounts {
                        earlier_identical: mine().filter(|e| e.1 == f && within(e.3, 120_000)).count() as u64,
                        earlier_key_minute: mine().filter(|e| within(e.3, 60_000)).count() as u64,
                        earlier_key_hour: mine().filter(|e| within(e.3, 3_600_000)).count() as u64,
                        model_seen: mine().any(|e| e.2 == m && within(e.3, 86_400_000)),
                        fingerprint_seen: mine().any(|e| e.1 == f && within(e.3, 86_400_000)),
                        // Recorded without a step: each request's step is its fingerprint.
                        step_seen: mine().any(|e| e.1 == f && within(e.3, 86_400_000)),
                        earlier_step_only: 0,
                        // The step pacing columns over the default windows (120 s, 1,800 s).
                        step_paced: mine().filter(|e| e.1 == f && within(e.3, 120_000)).count() as u64,
                        step_newest_ms: {
                            let mut times: Vec<u64> = mine()
                                .filter(|e| e.1 == f && within(e.3, 120_000))
                                .map(|e| e.3)
                                .collect();
                            times.sort_unstable_by(|a, b| b.cmp(a));
                            let mut newest = [0; tokensaver::gate::windows::STEP_NEWEST];
                            for (slot, t) in newest.iter_mut().zip(times) {
                                *slot = t;
                            }
                            newest
                        },
                        ..run_of(mine().filter(|e| e.1 == f).map(|e| e.3))
                    };
                    prop_assert_eq!(got, want, "key {} fingerprint {} model {} at {}", k, f, m, now);
                }
            }
        }
    }
}
