//! Provider request bodies → [`RequestShape`]: the counts and keyed hashes the gate decides on.
//!
//! The gate never looks at content beyond what it needs to count and hash. A [`Digest`] is the
//! shape serialised; it holds no text, so the privacy path can send it instead of the prompt.

mod anthropic;
mod canonical;
pub mod digest;
pub mod edit;
pub mod json;
pub mod normalise;
mod openai;
mod responses;
mod routing;
pub mod session;
mod step;

use serde::{Deserialize, Serialize};

use json::{Json, Object};

pub use anthropic::CACHE_POINT_MESSAGES;
pub use canonical::{ignored_fields, Hash};
pub use digest::{Digest, DigestError, WireForm};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Route {
    #[serde(rename = "openai_chat")]
    OpenAiChat,
    #[serde(rename = "anthropic_messages")]
    AnthropicMessages,
    #[serde(rename = "openai_responses")]
    OpenAiResponses,
}

impl Route {
    pub fn as_str(self) -> &'static str {
        match self {
            Route::OpenAiChat => "openai_chat",
            Route::AnthropicMessages => "anthropic_messages",
            Route::OpenAiResponses => "openai_responses",
        }
    }

    pub fn path(self) -> &'static str {
        match self {
            Route::OpenAiChat => "/v1/chat/completions",
            Route::AnthropicMessages => "/v1/messages",
            Route::OpenAiResponses => "/v1/responses",
        }
    }

    /// Which provider serves the route.
    pub fn provider(self) -> Provider {
        match self {
            Route::OpenAiChat | Route::OpenAiResponses => Provider::OpenAi,
            Route::AnthropicMessages => Provider::Anthropic,
        }
    }

    pub fn from_path(path: &str) -> Option<Route> {
        match path {
            "/v1/chat/completions" | "/chat/completions" => Some(Route::OpenAiChat),
            "/v1/messages" => Some(Route::AnthropicMessages),
            "/v1/responses" | "/responses" => Some(Route::OpenAiResponses),
            _ => None,
        }
    }
}

/// The two provider families: where credentials go and which error shape a caller expects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Provider {
    OpenAi,
    Anthropic,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    User,
    Assistant,
    Tool,
    Function,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Turn {
    pub role: Role,
    pub chars: u64,
    /// Keyed hash of the whole message (role and content): equal hashes, identical messages.
    /// `None` only in a shape read for this gate's own decision ([`parse_for_decision`]), for
    /// a turn whose role and size no other turn of the request has: it can repeat none, so
    /// its hash is never compared and is not computed. A digest carries every hash (one read
    /// without is refused, and a shape with a `None` does not serialise).
    #[serde(with = "required_hash")]
    pub hash: Option<Hash>,
}

/// Which turn hashes a parse computes (see [`Turn::hash`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TurnHashes {
    /// Every turn's: what a digest carries.
    All,
    /// Only those of turns that share their role and size with another turn, the only ones
    /// that can be identical. `duplicate_turns_in_context` is the one reader of turn hashes in
    /// a decision, so the decision is the same as with [`TurnHashes::All`]; the keyed hashing
    /// of every message (the larger part of reading an agent's request) is saved.
    WhereTheyCanRepeat,
}

/// A turn hash is always present on the wire.
mod required_hash {
    use super::Hash;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(hash: &Option<Hash>, s: S) -> Result<S::Ok, S::Error> {
        match hash {
            Some(hash) => hash.serialize(s),
            None => Err(serde::ser::Error::custom(
                "a turn hash was not computed (a shape read for a decision is not a digest)",
            )),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Hash>, D::Error> {
        Hash::deserialize(d).map(Some)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolDef {
    pub name_hash: Hash,
    /// Characters of the definition's compact JSON.
    pub chars: u64,
}

/// Everything the gate needs to know about a request: counts and keyed hashes, never text.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestShape {
    pub route: Route,
    pub fingerprint: Hash,
    /// Keyed hash of the request without its growing middle (SPEC §2.1): route, model,
    /// system, tools, and the tail from the newest assistant turn on. Equals `fingerprint`
    /// when there is no assistant turn. Required in a digest (`#[serde(default)]` lets a
    /// digest without it be refused by name rather than by serde).
    #[serde(default)]
    pub step_fingerprint: Hash,
    /// The step's action (`Step::action`, `step.rs`): its tool calls without their results. A
    /// run of a step survives one other result of the same action between two of its steps
    /// (`gate::windows::SessionSteps`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_action: Option<Hash>,
    /// The agent session this request belongs to ([`session`]): a keyed hash of the client's
    /// session header where it sends one (set by the proxy), else of the route, system, tools
    /// and first user turn. Absent in a digest from an older client: the decision then has no
    /// session.
    #[serde(default)]
    pub session: Hash,
    /// The answer depends on state the provider keeps (Responses `previous_response_id`,
    /// `conversation`, `background`): never served from the store.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub provider_state: bool,
    pub model: String,
    pub max_tokens: Option<u64>,
    pub temperature: Option<f64>,
    pub seed: Option<i64>,
    pub n: Option<u64>,
    pub stream: bool,
    pub cache_marked: bool,
    pub system_chars: u64,
    pub turns: Vec<Turn>,
    pub tools: Vec<ToolDef>,
    /// Hashes of tool names called in the history (the turns before the newest one).
    pub called_tool_hashes: Vec<Hash>,
    /// UTF-8 bytes the body's text takes beyond one per character: a byte-level tokenizer
    /// can bill each one (3,000 emoji are 3,000 characters and up to 12,000 tokens), so the
    /// worst case counts them whole (SPEC §2.3).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub text_extra_bytes: u64,
    /// Media parts by kind: they add no characters, but each is billed.
    #[serde(default, skip_serializing_if = "MediaParts::is_empty")]
    pub media: MediaParts,
    /// A Responses call that continues a stored response (`previous_response_id`): the
    /// context the provider billed for that response (its input and output tokens, as the
    /// gate saw them in the answer it relayed), which the provider bills again as this call's
    /// input. Never read from the body: the proxy sets it from its response registry (its
    /// own, in digest mode) after reading the body; 0 for every other request.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub chained_input_tokens: u64,
    /// Where the gate may place prompt-cache breakpoints (Anthropic, when the caller placed
    /// none): keyed prefix hashes, never content.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cache_points: Vec<CachePoint>,
    /// Anthropic: how many of the caller's own `cache_control` markers name no `ttl` — whose
    /// lifetime the gate may set (SPEC §2.11b, lifetimes).
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub cache_ttl_marks: u32,
    /// Anthropic: a caller's marker names a `ttl`: the caller chose its lifetimes.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cache_ttl_set: bool,
    /// OpenAI, without the caller's `prompt_cache_key`: the keyed hash of the prompt's
    /// beginning that the provider routes by (SPEC §2.11b, routing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route_prefix: Option<Hash>,
    /// OpenAI: the caller set the cache retention itself.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub retention_set: bool,
}

fn is_zero_u32(n: &u32) -> bool {
    *n == 0
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A place in an Anthropic request where a prompt-cache breakpoint can go (SPEC §2.11b): the
/// end of a prefix in the provider's cache order (tools, system, messages).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CachePoint {
    /// Keyed hash of the prefix up to and including this unit (its `cache_control` left out).
    pub prefix: Hash,
    /// Characters the prefix holds: what keeps a breakpoint clear of the model's minimum.
    pub chars: u64,
    pub unit: CacheUnit,
}

impl CachePoint {
    fn new(hasher: &blake3::Hasher, chars: u64, unit: CacheUnit) -> CachePoint {
        CachePoint {
            prefix: Hash(*hasher.clone().finalize().as_bytes()),
            chars,
            unit,
        }
    }
}

/// Which unit of the request a cache point ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CacheUnit {
    /// The last tool definition.
    Tools,
    /// The system prompt's last block.
    System,
    /// Message `i`'s last content block.
    Message(usize),
}

/// The marker the gate adds: Anthropic's default 5-minute entry.
pub const CACHE_MARK: &[u8] = br#""cache_control":{"type":"ephemeral"}"#;
/// The marker with a one-hour lifetime (SPEC §2.11b, lifetimes).
pub const CACHE_MARK_1H: &[u8] = br#""cache_control":{"type":"ephemeral","ttl":"1h"}"#;
/// What the gate writes into a caller's own marker that names no `ttl`, before its `}`.
pub const TTL_1H: &[u8] = br#","ttl":"1h""#;

/// Where in the caller's bytes a cache point's breakpoint goes ([`ParsedRequest::cache_sites`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CacheSite {
    /// The last block's closing `}` at this offset: `,` and [`CACHE_MARK`] go before it.
    Block(usize),
    /// A string (these bytes, quotes included) that becomes one text block carrying the mark:
    /// `[{"type":"text","text":` the string as sent `,` [`CACHE_MARK`] `}]`.
    Text(std::ops::Range<usize>),
}

impl CacheSite {
    /// The edit that puts the breakpoint here; the string's bytes are copied as sent.
    pub fn edit(&self, bytes: &[u8]) -> Option<edit::Edit> {
        self.edit_with(bytes, false)
    }

    /// [`Self::edit`], the entry's lifetime one hour when `one_hour`.
    pub fn edit_with(&self, bytes: &[u8], one_hour: bool) -> Option<edit::Edit> {
        let mark = if one_hour { CACHE_MARK_1H } else { CACHE_MARK };
        match self {
            CacheSite::Block(close) => {
                let mut with = Vec::with_capacity(mark.len() + 1);
                with.push(b',');
                with.extend_from_slice(mark);
                Some(edit::Edit {
                    range: *close..*close,
                    with,
                })
            }
            CacheSite::Text(quoted) => {
                let string = bytes.get(quoted.clone())?;
                let mut with = Vec::with_capacity(string.len() + mark.len() + 28);
                with.extend_from_slice(br#"[{"type":"text","text":"#);
                with.extend_from_slice(string);
                with.push(b',');
                with.extend_from_slice(mark);
                with.extend_from_slice(b"}]");
                Some(edit::Edit {
                    range: quoted.clone(),
                    with,
                })
            }
        }
    }
}

/// A request's media parts by kind (images, documents/files, audio), counted wherever they
/// appear in the messages, the input or the system prompt (tool results included).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MediaParts {
    #[serde(default)]
    pub images: u64,
    #[serde(default)]
    pub documents: u64,
    #[serde(default)]
    pub audio: u64,
}

impl MediaParts {
    pub fn is_empty(&self) -> bool {
        *self == MediaParts::default()
    }

    /// Count the typed parts under `body`'s `messages`, `input` and `system` (an explicit
    /// stack: a body's nesting is bounded only by its size cap).
    pub fn of(body: &Object) -> MediaParts {
        let mut media = MediaParts::default();
        let mut stack: Vec<&Json> = ["messages", "input", "system"]
            .iter()
            .filter_map(|field| body.get(field))
            .collect();
        while let Some(value) = stack.pop() {
            match value {
                Json::Array(items) => stack.extend(items.iter()),
                Json::Object(object) => {
                    if let Some(Json::String(kind)) = object.get("type") {
                        match kind.to_cow().as_ref() {
                            "image" | "image_url" | "input_image" => media.images += 1,
                            "document" | "file" | "input_file" => media.documents += 1,
                            "input_audio" | "audio" => media.audio += 1,
                            _ => {}
                        }
                    }
                    stack.extend(object.iter().map(|(_, v)| v));
                }
                _ => {}
            }
        }
        media
    }
}

impl RequestShape {
    /// System + all turns + all tool definitions.
    pub fn prompt_chars(&self) -> u64 {
        // A digest's counts are the caller's word: saturate rather than overflow.
        let turns = saturating_sum(self.turns.iter().map(|t| t.chars));
        let tools = saturating_sum(self.tools.iter().map(|t| t.chars));
        self.system_chars
            .saturating_add(turns)
            .saturating_add(tools)
    }

    /// Reuse is allowed when the request asks for reproducible output (SPEC §2.6).
    pub fn reproducible(&self) -> bool {
        let deterministic = self.temperature == Some(0.0) || self.seed.is_some();
        deterministic && matches!(self.n, None | Some(1)) && !self.provider_state
    }

    /// The wire form an answer to this request takes.
    pub fn wire_form(&self) -> WireForm {
        if self.stream {
            WireForm::Sse
        } else {
            WireForm::Json
        }
    }

    /// Output worst case multiplier: `n` choices each up to the ceiling.
    pub fn choices(&self) -> u64 {
        self.n.unwrap_or(1).max(1)
    }
}

/// Why a body could not be shaped. Closed-form: field names are ours, never the caller's text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShapeError {
    #[error("request body is empty")]
    Empty,
    #[error("request body is not valid UTF-8")]
    NotUtf8,
    #[error("request body is not valid JSON (line {line}, column {column})")]
    NotJson { line: usize, column: usize },
    #[error("request body must be a JSON object")]
    NotObject,
    #[error("field `{0}` is required")]
    Missing(&'static str),
    #[error("field `{field}` must be {expected}")]
    WrongType {
        field: &'static str,
        expected: &'static str,
    },
    #[error("messages[{index}]: {problem}")]
    Message { index: usize, problem: &'static str },
    #[error("input[{index}]: {problem}")]
    Item { index: usize, problem: &'static str },
    #[error("tools[{index}]: {problem}")]
    Tool { index: usize, problem: &'static str },
    #[error("field `{0}` is written more than once at the top level of the body")]
    RepeatedField(&'static str),
    #[error("field `{field}` is longer than {max} bytes")]
    TooLong { field: &'static str, max: usize },
}

impl ShapeError {
    /// A stable id for the error's kind, for provider-shaped error bodies and metrics.
    pub fn code(&self) -> &'static str {
        match self {
            ShapeError::Empty => "empty_body",
            ShapeError::NotUtf8 => "invalid_utf8",
            ShapeError::NotJson { .. } => "invalid_json",
            ShapeError::NotObject => "not_an_object",
            ShapeError::Missing(_) => "missing_field",
            ShapeError::WrongType { .. } => "wrong_type",
            ShapeError::Message { .. } => "invalid_message",
            ShapeError::Item { .. } => "invalid_input_item",
            ShapeError::Tool { .. } => "invalid_tool",
            ShapeError::RepeatedField(_) => "repeated_field",
            ShapeError::TooLong { .. } => "field_too_long",
        }
    }
}

/// A parsed request: the shape, and what the proxy needs to know of the body beside it.
#[derive(Debug, Clone)]
pub struct ParsedRequest {
    pub shape: RequestShape,
    /// OpenAI `stream_options.include_usage`: the client asked for the usage chunk.
    pub include_usage: bool,
    /// The body has a top-level `stream_options`.
    pub has_stream_options: bool,
    /// Where the model's JSON string (quotes included) lies in the body, when it is the only
    /// `model` the body has: a DOWNGRADE rewrites these bytes and nothing else. `None` when a
    /// key is written twice at the top level (readers keeping the first value would see
    /// another model): the rewrite then re-serialises the body.
    pub model_span: Option<std::ops::Range<usize>>,
    /// OpenAI Responses `previous_response_id`, when it is a string: the stored response
    /// this call continues (the proxy checks that the caller's key created it).
    pub previous_response_id: Option<String>,
    /// OpenAI Responses: the body names a `conversation` (not `null`).
    pub names_conversation: bool,
    /// Anthropic: where the caller's markers without a `ttl` close (body offsets): the gate
    /// writes `,"ttl":"1h"` before each when it sets their lifetime.
    pub cache_mark_sites: Vec<usize>,
    /// The body object's closing brace: where the gate adds `prompt_cache_key` and
    /// `prompt_cache_retention` (OpenAI).
    pub body_close: usize,
    /// Where each of the shape's `cache_points` puts its breakpoint in the body, index for
    /// index: the offsets the proxy edits when the gate places caching (SPEC §2.11b). Body
    /// layout, not shape: it never enters a digest.
    pub cache_sites: Vec<CacheSite>,
}

/// Parse a provider request body and derive its shape, every turn hash included (what a
/// digest needs). `key` is the caller's fingerprint key.
pub fn parse(route: Route, bytes: &[u8], key: &[u8; 32]) -> Result<ParsedRequest, ShapeError> {
    parse_with(route, bytes, key, TurnHashes::All)
}

/// [`parse`] for this gate's own decision: only the turn hashes a decision compares
/// ([`TurnHashes::WhereTheyCanRepeat`]). Decides exactly as [`parse`] does.
pub fn parse_for_decision(
    route: Route,
    bytes: &[u8],
    key: &[u8; 32],
) -> Result<ParsedRequest, ShapeError> {
    parse_with(route, bytes, key, TurnHashes::WhereTheyCanRepeat)
}

fn parse_with(
    route: Route,
    bytes: &[u8],
    key: &[u8; 32],
    hashes: TurnHashes,
) -> Result<ParsedRequest, ShapeError> {
    let body = parse_object(bytes)?;
    let (mut shape, cache_mark_sites) =
        shape_and_mark_sites(route, &body, key, bytes.len(), hashes)?;
    // A point without its site could not be placed: then no point is offered.
    let cache_sites = anthropic::cache_sites(&body, bytes, &shape.cache_points).unwrap_or_default();
    if cache_sites.len() != shape.cache_points.len() {
        shape.cache_points.clear();
    }
    let stream_options = body.get("stream_options");
    Ok(ParsedRequest {
        shape,
        include_usage: stream_options
            .and_then(|o| o.get("include_usage"))
            .and_then(Json::as_bool)
            .unwrap_or(false),
        has_stream_options: stream_options.is_some(),
        model_span: model_span(&body, bytes),
        previous_response_id: previous_response_id(route, &body)?,
        names_conversation: route == Route::OpenAiResponses
            && !matches!(body.get("conversation"), None | Some(Json::Null)),
        cache_mark_sites,
        body_close: body.close(),
        cache_sites,
    })
}

/// A Responses call's `previous_response_id`: a string, or absent (`null` reads as absent). Any
/// other type is refused: a provider that reads an object's or array's id would otherwise
/// continue a response whose owner the gate never checked.
fn previous_response_id(route: Route, body: &Object) -> Result<Option<String>, ShapeError> {
    if route != Route::OpenAiResponses {
        return Ok(None);
    }
    match body.get("previous_response_id") {
        Some(Json::String(id)) => Ok(Some(id.to_cow().into_owned())),
        None | Some(Json::Null) => Ok(None),
        Some(_) => Err(ShapeError::WrongType {
            field: "previous_response_id",
            expected: "a string",
        }),
    }
}

/// The step of a Responses call that continues a stored response whose answer identity is
/// `previous` ([`answer_identity_of`]); `None` when the body is no such call (its step is the
/// one [`parse`] gave).
pub fn chained_step(bytes: &[u8], key: &[u8; 32], previous: &Hash) -> Option<Hash> {
    let body = parse_object(bytes).ok()?;
    step::chained_step(&body, key, previous)
}

/// The identity of a Responses answer (the JSON text of its `output` array), as the step of a
/// call that continues it names it: its tool calls, or its text ([`step`]).
pub fn answer_identity_of(output: &[u8], key: &[u8; 32]) -> Option<Hash> {
    let output = json::parse(output).ok()?;
    Some(step::answer_identity(&output, key))
}

/// The byte range of the top-level `model` string in `bytes`, quotes included (see
/// [`ParsedRequest::model_span`]).
fn model_span(body: &Object, bytes: &[u8]) -> Option<std::ops::Range<usize>> {
    if body.has_repeated_keys() {
        return None;
    }
    let raw = body.get("model")?.as_string()?.raw();
    // The tree borrows from `bytes`: the string's offset is its distance from their start.
    let start = (raw.as_ptr() as usize).checked_sub(bytes.as_ptr() as usize)?;
    let range = start.checked_sub(1)?..start + raw.len() + 1;
    let quoted = bytes.get(range.clone())?;
    (quoted.first() == Some(&b'"') && quoted.last() == Some(&b'"')).then_some(range)
}

/// Parse a body that must be a JSON object, into the borrowed tree the shape is read from.
pub fn parse_object(bytes: &[u8]) -> Result<Object<'_>, ShapeError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ShapeError::Empty);
    }
    match json::parse_measured(bytes) {
        Ok((Json::Object(mut object), extra)) => {
            object.set_text_extra_bytes(extra);
            Ok(object)
        }
        Ok(_) => Err(ShapeError::NotObject),
        Err(json::JsonError::NotUtf8) => Err(ShapeError::NotUtf8),
        Err(json::JsonError::Syntax { line, column }) => Err(ShapeError::NotJson { line, column }),
    }
}

/// The shape of a parsed body; `size_hint` is the body's length (the canonical form is no
/// longer, give or take escapes).
pub fn shape_of(
    route: Route,
    body: &Object,
    key: &[u8; 32],
    size_hint: usize,
    hashes: TurnHashes,
) -> Result<RequestShape, ShapeError> {
    shape_and_mark_sites(route, body, key, size_hint, hashes).map(|(shape, _)| shape)
}

/// [`shape_of`], and where the caller's markers without a `ttl` close (Anthropic): one walk
/// of the markers for both.
fn shape_and_mark_sites(
    route: Route,
    body: &Object,
    key: &[u8; 32],
    size_hint: usize,
    hashes: TurnHashes,
) -> Result<(RequestShape, Vec<usize>), ShapeError> {
    if let Some(field) = body.first_repeated_key() {
        // Readers that keep the first value and readers that keep the last would see two
        // different requests: the one priced and the one billed could differ.
        return Err(ShapeError::RepeatedField(named_field(field)));
    }
    let canonical = canonical::Canonical::of(route, body, key, size_hint);
    let common = common_fields(body)?;
    let mut parts = match route {
        Route::OpenAiChat => openai::parts(body, &canonical)?,
        Route::AnthropicMessages => anthropic::parts(body, &canonical)?,
        Route::OpenAiResponses => responses::parts(body, &canonical)?,
    };
    let cache_points = if route == Route::AnthropicMessages && !canonical.cache_marked {
        let tools_chars = saturating_sum(parts.tools.iter().map(|t| t.chars));
        anthropic::cache_points(body, key, tools_chars)
    } else {
        Vec::new()
    };
    hash_turns(&canonical, &mut parts, hashes);
    let (mark_sites, cache_ttl_set) = match route {
        Route::AnthropicMessages => anthropic::ttl_marks(body),
        _ => (Vec::new(), false),
    };
    let cache_ttl_marks = u32::try_from(mark_sites.len()).unwrap_or(u32::MAX);
    let step = step::step_fingerprint(route, body, key);
    let shape = RequestShape {
        route,
        fingerprint: canonical.fingerprint,
        step_fingerprint: step.map_or(canonical.fingerprint, |s| s.fingerprint),
        step_action: step.and_then(|s| s.action),
        session: session::session_fingerprint(route, body, key),
        provider_state: route == Route::OpenAiResponses && responses::provider_state(body),
        model: common.model,
        max_tokens: match route {
            Route::OpenAiChat => {
                opt_u64(body, "max_completion_tokens")?.or(opt_u64(body, "max_tokens")?)
            }
            Route::AnthropicMessages => opt_u64(body, "max_tokens")?,
            Route::OpenAiResponses => opt_u64(body, "max_output_tokens")?,
        },
        temperature: common.temperature,
        seed: common.seed,
        n: common.n,
        stream: common.stream,
        cache_marked: canonical.cache_marked,
        system_chars: parts.system_chars,
        turns: parts.turns,
        tools: parts.tools,
        called_tool_hashes: parts.called_tool_hashes,
        text_extra_bytes: body.text_extra_bytes(),
        media: MediaParts::of(body),
        chained_input_tokens: 0,
        cache_points,
        cache_ttl_marks,
        cache_ttl_set,
        route_prefix: routing::route_prefix(route, body, key),
        retention_set: route != Route::AnthropicMessages && routing::retention_set(body),
    };
    Ok((shape, mark_sites))
}

/// A top-level field's name as an error may say it: the provider APIs' own field names, never
/// a caller's arbitrary key.
fn named_field(field: &str) -> &'static str {
    const KNOWN: &[&str] = &[
        "model",
        "messages",
        "input",
        "instructions",
        "system",
        "tools",
        "tool_choice",
        "max_tokens",
        "max_completion_tokens",
        "max_output_tokens",
        "n",
        "temperature",
        "top_p",
        "seed",
        "stream",
        "stream_options",
        "stop",
        "metadata",
        "user",
        "store",
        "background",
        "previous_response_id",
        "conversation",
        "reasoning",
        "thinking",
        "response_format",
        "text",
        "prompt_cache_key",
        "cache_control",
    ];
    KNOWN
        .iter()
        .find(|known| **known == field)
        .copied()
        .unwrap_or("(a top-level field)")
}

fn model_too_long() -> ShapeError {
    ShapeError::TooLong {
        field: "model",
        max: MAX_MODEL_BYTES,
    }
}

struct Common {
    model: String,
    temperature: Option<f64>,
    seed: Option<i64>,
    n: Option<u64>,
    stream: bool,
}

/// The longest model name the gate takes, in bytes. Provider model ids, Azure deployment names
/// and OpenRouter-style `vendor/model:variant` names are far shorter; a name is kept in the
/// key's model window, the recent receipts and every ledger row, so it has a bound.
pub const MAX_MODEL_BYTES: usize = 256;

fn common_fields(body: &Object) -> Result<Common, ShapeError> {
    let model = match body.get("model") {
        Some(Json::String(m)) if m.raw().len() > MAX_MODEL_BYTES * 6 => {
            // Even fully escaped, no name within the bound is this long: refused unread.
            return Err(model_too_long());
        }
        Some(Json::String(m)) if m.chars() > 0 => {
            let model = m.to_cow().into_owned();
            if model.len() > MAX_MODEL_BYTES {
                return Err(model_too_long());
            }
            model
        }
        Some(Json::String(_)) | None => return Err(ShapeError::Missing("model")),
        Some(_) => {
            return Err(ShapeError::WrongType {
                field: "model",
                expected: "a string",
            })
        }
    };
    let temperature = match body.get("temperature") {
        None | Some(Json::Null) => None,
        Some(Json::Number(n)) => n.as_f64(),
        Some(_) => {
            return Err(ShapeError::WrongType {
                field: "temperature",
                expected: "a number",
            })
        }
    };
    let seed = match body.get("seed") {
        None | Some(Json::Null) => None,
        Some(Json::Number(n)) => Some(n.as_i64().ok_or(ShapeError::WrongType {
            field: "seed",
            expected: "an integer within 64 bits",
        })?),
        Some(_) => {
            return Err(ShapeError::WrongType {
                field: "seed",
                expected: "an integer within 64 bits",
            })
        }
    };
    let stream = match body.get("stream") {
        None | Some(Json::Null) => false,
        Some(Json::Bool(b)) => *b,
        Some(_) => {
            return Err(ShapeError::WrongType {
                field: "stream",
                expected: "a boolean",
            })
        }
    };
    Ok(Common {
        model,
        temperature,
        seed,
        n: opt_u64(body, "n")?,
        stream,
    })
}

fn opt_u64(body: &Object, field: &'static str) -> Result<Option<u64>, ShapeError> {
    match body.get(field) {
        None | Some(Json::Null) => Ok(None),
        Some(Json::Number(n)) => n.as_u64().map(Some).ok_or(ShapeError::WrongType {
            field,
            expected: "a non-negative integer within 64 bits",
        }),
        Some(_) => Err(ShapeError::WrongType {
            field,
            expected: "a non-negative integer within 64 bits",
        }),
    }
}

/// The parts of a shape that depend on the provider's message format.
pub(crate) struct Parts {
    pub system_chars: u64,
    /// The turns, their hashes not yet computed ([`hash_turns`]).
    pub turns: Vec<Turn>,
    /// What each turn's hash is over, beside `turns`.
    pub turn_bytes: Vec<canonical::TurnBytes>,
    pub tools: Vec<ToolDef>,
    pub called_tool_hashes: Vec<Hash>,
}

/// Fill in the turn hashes `hashes` asks for.
fn hash_turns(canonical: &canonical::Canonical, parts: &mut Parts, hashes: TurnHashes) {
    let turns = &mut parts.turns;
    let wanted: Vec<bool> = match hashes {
        TurnHashes::All => vec![true; turns.len()],
        TurnHashes::WhereTheyCanRepeat => {
            // Sorted by role and size, the turns that can be identical are neighbours.
            let size = |i: usize| (turns[i].role, turns[i].chars);
            let mut order: Vec<usize> = (0..turns.len()).collect();
            order.sort_unstable_by_key(|&i| size(i));
            let mut wanted = vec![false; turns.len()];
            for pair in order.windows(2) {
                if size(pair[0]) == size(pair[1]) {
                    wanted[pair[0]] = true;
                    wanted[pair[1]] = true;
                }
            }
            wanted
        }
    };
    for ((turn, bytes), wanted) in turns.iter_mut().zip(&parts.turn_bytes).zip(wanted) {
        if wanted {
            turn.hash = Some(canonical.turn_hash(bytes));
        }
    }
}

/// Tool names called in the history: every turn but the newest.
pub(crate) fn history_calls(mut calls_per_turn: Vec<Vec<Hash>>) -> Vec<Hash> {
    calls_per_turn.pop();
    let mut called: Vec<Hash> = calls_per_turn.into_iter().flatten().collect();
    called.sort_unstable();
    called.dedup();
    called
}

pub(crate) fn saturating_sum(values: impl Iterator<Item = u64>) -> u64 {
    values.fold(0, u64::saturating_add)
}

/// The request's tool definitions: each needs a name (found by `name_of`, which differs by
/// provider); its size is the characters of its compact JSON.
pub(crate) fn tool_defs<'b>(
    body: &'b Object,
    canonical: &canonical::Canonical,
    name_of: impl Fn(&'b Json<'b>) -> Option<&'b Json<'b>>,
) -> Result<Vec<ToolDef>, ShapeError> {
    let items = match body.get("tools") {
        None | Some(Json::Null) => return Ok(Vec::new()),
        Some(Json::Array(items)) => items,
        Some(_) => {
            return Err(ShapeError::WrongType {
                field: "tools",
                expected: "an array",
            })
        }
    };
    items
        .iter()
        .enumerate()
        .map(|(index, tool)| match name_of(tool) {
            Some(Json::String(name)) => Ok(ToolDef {
                name_hash: canonical::tool_name_hash(canonical.key, &name.to_cow()),
                chars: canonical.tool_chars[index],
            }),
            _ => Err(ShapeError::Tool {
                index,
                problem: "a tool definition needs a name",
            }),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(body: &str) -> Option<String> {
        let parsed = parse(Route::OpenAiChat, body.as_bytes(), &[0; 32]).ok()?;
        Some(body.get(parsed.model_span?)?.to_string())
    }

    #[test]
    fn the_model_span_is_the_quoted_string_the_gate_read() {
        let messages = r#""messages":[{"role":"user","content":"hi \"model\":\"x\""}]"#;
        assert_eq!(
            span(&format!(r#"{{{messages}, "model" :  "gpt-4o" }}"#)).as_deref(),
            Some(r#""gpt-4o""#)
        );
        // An escaped model, and a model key written with an escape, are still the one model.
        assert_eq!(
            span(&format!(r#"{{"mod\u0065l":"gpt\u002d4o",{messages}}}"#)).as_deref(),
            Some(r#""gpt\u002d4o""#)
        );
        // A key written twice: the span is withheld (first-value readers see another model).
        assert_eq!(
            span(&format!(r#"{{"model":"a",{messages},"model":"b"}}"#)),
            None
        );
        assert_eq!(
            span(&format!(r#"{{"model":"a",{messages},"n":1,"n":2}}"#)),
            None
        );
    }

    fn shape(route: Route, body: &str) -> Result<RequestShape, ShapeError> {
        parse(route, body.as_bytes(), &[0; 32]).map(|p| p.shape)
    }

    #[test]
    fn a_field_written_twice_at_the_top_level_is_refused_by_name() {
        let messages = r#""messages":[{"role":"user","content":"hi"}]"#;
        let twice = format!(r#"{{"model":"gpt-4o",{messages},"model":"gpt-4o-mini"}}"#);
        assert_eq!(
            shape(Route::OpenAiChat, &twice),
            Err(ShapeError::RepeatedField("model"))
        );
        // A caller's own key is never echoed.
        let own = format!(r#"{{"model":"m",{messages},"secret plan":1,"secret plan":2}}"#);
        let err = shape(Route::OpenAiChat, &own).unwrap_err();
        assert_eq!(err, ShapeError::RepeatedField("(a top-level field)"));
        assert!(!err.to_string().contains("secret"));
        assert_eq!(err.code(), "repeated_field");
        // Inside a message, the last value is read, as the providers' JSON readers do.
        let inner = r#"{"model":"m","messages":[{"role":"user","content":"a","content":"b"}]}"#;
        assert!(shape(Route::OpenAiChat, inner).is_ok());
    }

    #[test]
    fn text_beyond_one_byte_per_character_is_counted_raw_or_escaped() {
        let body = |content: &str| {
            format!(r#"{{"model":"m","messages":[{{"role":"user","content":"{content}"}}]}}"#)
        };
        let of = |content: &str| shape(Route::OpenAiChat, &body(content)).unwrap();
        assert_eq!(of("plain ascii").text_extra_bytes, 0);
        // é is 2 bytes, 😀 is 4, 中 is 3: 1 + 3 + 2 beyond one byte each.
        assert_eq!(of("é😀中").text_extra_bytes, 6);
        // The same characters written as escapes count the same.
        assert_eq!(of(r"\u00e9\ud83d\ude00\u4e2d").text_extra_bytes, 6);
        assert_eq!(of(r"\n\u0041").text_extra_bytes, 0);
        // 3,000 emoji: 3,000 characters, 12,000 bytes.
        let emoji = of(&"😀".repeat(3000));
        assert_eq!((emoji.turns[0].chars, emoji.text_extra_bytes), (3000, 9000));
    }

    #[test]
    fn media_parts_are_counted_by_kind_on_every_route() {
        let chat = r#"{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"data:"}},{"type":"image_url","image_url":{"url":"x"}},{"type":"input_audio","input_audio":{"data":"x"}},{"type":"file","file":{}}]}]}"#;
        let m = shape(Route::OpenAiChat, chat).unwrap().media;
        assert_eq!((m.images, m.documents, m.audio), (2, 1, 1));
        let anthropic = r#"{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"type":"image","source":{}},{"type":"tool_result","tool_use_id":"t","content":[{"type":"image","source":{}}]},{"type":"document","source":{}}]}]}"#;
        let m = shape(Route::AnthropicMessages, anthropic).unwrap().media;
        assert_eq!((m.images, m.documents, m.audio), (2, 1, 0));
        let responses = r#"{"model":"m","input":[{"role":"user","content":[{"type":"input_image","image_url":"x"},{"type":"input_file","file_id":"f"}]}]}"#;
        let m = shape(Route::OpenAiResponses, responses).unwrap().media;
        assert_eq!((m.images, m.documents, m.audio), (1, 1, 0));
        let none = r#"{"model":"m","messages":[{"role":"user","content":"an image_url"}]}"#;
        assert!(shape(Route::OpenAiChat, none).unwrap().media.is_empty());
    }

    /// For a decision only the turns that share a role and a size with another are hashed, and
    /// with the hashes a full parse gives; every route, duplicates and same-size look-alikes
    /// included. (That the decision is unchanged is `gate_properties`' proxy/digest test.)
    #[test]
    fn a_decision_hashes_exactly_the_turns_that_can_repeat() {
        use proptest::prelude::*;
        use proptest::test_runner::{Config, TestRunner};
        // Texts of two sizes, two of each, so that equal sizes with other content occur.
        let texts = ["abc", "xyz", "abcdef", "uvwxyz"];
        let turns = proptest::collection::vec((0..3usize, 0..texts.len()), 0..9);
        let mut runner = TestRunner::new(Config::with_cases(400));
        let result = runner.run(&(turns, 0..3usize), |(turns, route)| {
            let role = |r: usize| ["user", "assistant", "user"][r];
            let body = match route {
                0 | 1 => {
                    let messages: Vec<String> = turns
                        .iter()
                        .map(|&(r, t)| {
                            format!(r#"{{"role":"{}","content":"{}"}}"#, role(r), texts[t])
                        })
                        .collect();
                    format!(
                        r#"{{"model":"m","max_tokens":5,"messages":[{}]}}"#,
                        messages.join(",")
                    )
                }
                _ => match turns.first() {
                    // A Responses `input` string is a turn of its own.
                    Some(&(_, t)) if turns.len() == 1 => {
                        format!(r#"{{"model":"m","input":"{}"}}"#, texts[t])
                    }
                    _ => {
                        let items: Vec<String> = turns
                            .iter()
                            .map(|&(r, t)| {
                                format!(
                                    r#"{{"type":"message","role":"{}","content":"{}"}}"#,
                                    role(r),
                                    texts[t]
                                )
                            })
                            .collect();
                        format!(r#"{{"model":"m","input":[{}]}}"#, items.join(","))
                    }
                },
            };
            let route = [
                Route::OpenAiChat,
                Route::AnthropicMessages,
                Route::OpenAiResponses,
            ][route];
            let full = parse(route, body.as_bytes(), &[9; 32]).unwrap().shape;
            let lazy = parse_for_decision(route, body.as_bytes(), &[9; 32])
                .unwrap()
                .shape;
            prop_assert_eq!(full.fingerprint, lazy.fingerprint);
            prop_assert_eq!(full.turns.len(), lazy.turns.len());
            for (i, (f, l)) in full.turns.iter().zip(&lazy.turns).enumerate() {
                prop_assert!(f.hash.is_some());
                let shares = lazy
                    .turns
                    .iter()
                    .enumerate()
                    .any(|(j, o)| j != i && (o.role, o.chars) == (l.role, l.chars));
                prop_assert_eq!(l.hash.is_some(), shares, "turn {} of {}", i, body);
                if l.hash.is_some() {
                    prop_assert_eq!(l.hash, f.hash);
                }
            }
            // A shape with a hash left out is no digest: it does not serialise.
            if lazy.turns.iter().any(|t| t.hash.is_none()) {
                prop_assert!(serde_json::to_vec(&Digest::new(lazy)).is_err());
            } else {
                prop_assert!(serde_json::to_vec(&Digest::new(lazy)).is_ok());
            }
            Ok(())
        });
        assert!(result.is_ok(), "{result:?}");
    }
}
