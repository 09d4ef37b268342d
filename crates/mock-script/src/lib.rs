//! The mock provider's pure, deterministic parts that the gate needs too, apart from the mock's
//! HTTP server (`tokensaver-mock-provider`), which the production binary does not link:
//!
//! * the **canonical body** ([`canonical_text`], [`canonical_digest`]): compact JSON, object
//!   keys sorted, without the top-level `stream` / `stream_options` and without what only
//!   bills caching — `cache_control` at any depth, the top-level `prompt_cache_key`,
//!   `prompt_cache_retention` and `prompt_cache_options`: a cache marker or a routing key
//!   changes what a call is billed, never its answer or its prompt's tokens. The mock derives
//!   its replies from it; the economics suite hashes its gate policy with it.
//! * the **task scripts** ([`TaskScript`], the `script` of
//!   `corpus/economics/tasks/<id>/task.json`): the economics suite validates them, the mock
//!   plays them.
//! * the **scripted agent behaviour**: the marker in a user turn, the tool results already in
//!   the request, and the tool call the mock asks for. The rules are in the mock provider's
//!   docs ("Scripted agents", "Task scripts").
//!
//! Everything here is a pure function of its arguments: no I/O.

use serde_json::{json, Map, Value};

/// The reply vocabulary: word `i` of a reply is `WORDS[digest[1 + i] % 64]`.
pub const WORDS: [&str; 64] = [
    "alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet",
    "kilo", "lima", "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra", "tango",
    "uniform", "victor", "whiskey", "xray", "yankee", "zulu", "amber", "basalt", "cedar", "dune",
    "ember", "fjord", "granite", "harbor", "iris", "jade", "kelp", "lagoon", "meadow", "nectar",
    "onyx", "pebble", "quartz", "river", "saffron", "tundra", "umber", "valley", "willow", "xenon",
    "yarrow", "zephyr", "anchor", "beacon", "canyon", "drift", "estuary", "fern", "glacier",
    "heron", "island", "juniper", "kestrel", "lantern",
];

/// Top-level members that change an answer's wire form or its billing, not its content.
const NOT_CONTENT_AT_TOP: &[&str] = &[
    "stream",
    "stream_options",
    "prompt_cache_key",
    "prompt_cache_retention",
    "prompt_cache_options",
];
/// A member that bills caching wherever it is (Anthropic's markers).
const NOT_CONTENT: &str = "cache_control";

fn is_content(key: &str, top: bool) -> bool {
    key != NOT_CONTENT && !(top && NOT_CONTENT_AT_TOP.contains(&key))
}

/// BLAKE3 of the canonical form of `body` ([`canonical_text`]'s).
pub fn canonical_digest(body: &Value) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    match body {
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> =
                map.iter().filter(|(k, _)| is_content(k, true)).collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            hash_object(&mut h, entries);
        }
        other => hash_value(&mut h, other),
    }
    *h.finalize().as_bytes()
}

fn hash_str(h: &mut blake3::Hasher, s: &str) {
    match serde_json::to_string(s) {
        Ok(quoted) => h.update(quoted.as_bytes()),
        Err(_) => h.update(s.as_bytes()),
    };
}

fn hash_object(h: &mut blake3::Hasher, entries: Vec<(&String, &Value)>) {
    h.update(b"{");
    for (i, (k, v)) in entries.into_iter().enumerate() {
        if i > 0 {
            h.update(b",");
        }
        hash_str(h, k);
        h.update(b":");
        hash_value(h, v);
    }
    h.update(b"}");
}

fn hash_value(h: &mut blake3::Hasher, v: &Value) {
    match v {
        Value::Null => {
            h.update(b"null");
        }
        Value::Bool(b) => {
            h.update(if *b { b"true" } else { b"false" });
        }
        Value::Number(n) => {
            h.update(n.to_string().as_bytes());
        }
        Value::String(s) => hash_str(h, s),
        Value::Array(a) => {
            h.update(b"[");
            for (i, item) in a.iter().enumerate() {
                if i > 0 {
                    h.update(b",");
                }
                hash_value(h, item);
            }
            h.update(b"]");
        }
        Value::Object(m) => {
            let mut entries: Vec<(&String, &Value)> =
                m.iter().filter(|(k, _)| is_content(k, false)).collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            hash_object(h, entries);
        }
    }
}

/// The canonical body as text (the form [`canonical_digest`] hashes): compact JSON, object
/// keys sorted, without the top-level `stream` and `stream_options` and without the members
/// that bill caching. A streamed request and the same request unstreamed count the same
/// tokens; so do a request and the same request with cache markers or a routing key.
pub fn canonical_text(body: &Value) -> String {
    fn write(out: &mut String, v: &Value, top: bool) {
        match v {
            Value::Object(m) => {
                let mut entries: Vec<(&String, &Value)> =
                    m.iter().filter(|(k, _)| is_content(k, top)).collect();
                entries.sort_by(|a, b| a.0.cmp(b.0));
                out.push('{');
                for (i, (k, v)) in entries.into_iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&serde_json::to_string(k).unwrap_or_default());
                    out.push(':');
                    write(out, v, false);
                }
                out.push('}');
            }
            Value::Array(a) => {
                out.push('[');
                for (i, x) in a.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    write(out, x, false);
                }
                out.push(']');
            }
            other => out.push_str(&other.to_string()),
        }
    }
    let mut out = String::new();
    write(&mut out, body, true);
    out
}

/// The text that introduces a script marker in a user turn.
pub const MARKER: &str = "tokensaver-mock:";
/// The `description` argument given to a `Bash` tool call.
pub const STEP_DESCRIPTION: &str = "tokensaver mock step";
/// The command of every `tokensaver-mock:loop` tool call.
pub const LOOP_COMMAND: &str = "echo tokensaver-loop";

/// A script marker found in a user turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Marker {
    /// `tokensaver-mock:loop`: the same tool call, forever.
    Loop,
    /// `tokensaver-mock:steps=N` (N ≥ 1): N tool calls, then a final answer.
    Steps(u64),
    /// `tokensaver-mock:clockloop`: the same tool call forever, its output a clock reading.
    ClockLoop,
    /// `tokensaver-mock:poll=N` (N ≥ 1): the same status call N times (a job polled until it
    /// is done: one repeated step), then the final answer.
    Poll(u64),
}

/// The command of every `tokensaver-mock:clockloop` tool call: the same call forever, whose
/// output carries the clock (a stuck agent whose tool prints a timestamp).
pub const CLOCK_LOOP_COMMAND: &str = "echo tokensaver-loop; date -u +%Y-%m-%dT%H:%M:%S.%NZ";

/// The command of every `tokensaver-mock:poll=N` tool call.
pub const POLL_COMMAND: &str = "echo tokensaver-poll";

/// What a scripted request gets instead of the word reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scripted {
    /// One tool call.
    ToolCall(MockToolCall),
    /// The final text answer `tokensaver-done after <steps> steps`.
    Done {
        /// The tool results the request carried.
        steps: u64,
    },
    /// A task script's final answer (see [`TaskScript`]).
    Answer {
        /// The answer text.
        text: String,
    },
}

/// The tool call of a scripted answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MockToolCall {
    /// The called tool's name (`local_shell` for the Responses built-in).
    pub name: String,
    /// Whether this is the Responses built-in `local_shell` (answered as a `local_shell_call`).
    pub local_shell: bool,
    /// The shell command the call asks the client to run.
    pub command: String,
    /// The arguments object (for `local_shell`: the `action` object).
    pub input: Value,
    /// `input` serialised compactly (object keys sorted): the `arguments` string.
    pub arguments: String,
    /// Text the answer carries before the call, as real models write (task scripts only;
    /// empty for the other markers, whose answers carry the call alone).
    pub preamble: String,
}

impl MockToolCall {
    /// Output tokens of the call: characters of [`MockToolCall::arguments`] ÷ 4, rounded up,
    /// at least 1.
    pub fn output_tokens(&self) -> u64 {
        (self.arguments.chars().count() as u64).div_ceil(4).max(1)
    }
}

/// The script a request asks for: the first valid marker in its user turns, if it defines a
/// usable tool (see the module docs); `None` means the ordinary word reply.
pub fn scripted(body: &Value) -> Option<Scripted> {
    let marker = marker(body)?;
    let tools = tool_defs(body);
    let tool = pick(&tools)?;
    let k = tool_results(body);
    let command = match marker {
        Marker::Loop => LOOP_COMMAND.to_owned(),
        Marker::ClockLoop => CLOCK_LOOP_COMMAND.to_owned(),
        Marker::Steps(n) if k < n => format!("echo tokensaver-step-{}", k + 1),
        Marker::Steps(_) => return Some(Scripted::Done { steps: k }),
        Marker::Poll(n) if k < n => POLL_COMMAND.to_owned(),
        Marker::Poll(_) => return Some(Scripted::Done { steps: k }),
    };
    let input = arguments_for(tool, &command, k);
    let arguments = serde_json::to_string(&input).unwrap_or_default();
    Some(Scripted::ToolCall(MockToolCall {
        name: tool.name.to_owned(),
        local_shell: tool.local_shell,
        command,
        input,
        arguments,
        preamble: String::new(),
    }))
}

/// The first valid marker in the text of the request's user turns, in order.
///
/// User turns: `messages[]` with `role: "user"` (chat and Anthropic), a string `input`, and
/// `input[]` items with `role: "user"` (Responses). Their text: a string content, or the `text`
/// of each content part (so Anthropic `tool_result` blocks are not searched).
pub fn marker(body: &Value) -> Option<Marker> {
    first_in_user_text(body, parse_marker)
}

/// The first text of the request's user turns (see [`marker`]) that `parse` accepts, parsed.
fn first_in_user_text<T>(body: &Value, parse: impl Fn(&str) -> Option<T>) -> Option<T> {
    let mut found = None;
    let mut visit = |text: &str| {
        if found.is_none() {
            found = parse(text);
        }
    };
    if let Some(Value::Array(msgs)) = body.get("messages") {
        for m in msgs.iter().filter(|m| is_user(m)) {
            for_each_text(m.get("content"), &mut visit);
        }
    }
    match body.get("input") {
        Some(Value::String(s)) => visit(s),
        Some(Value::Array(items)) => {
            for item in items.iter().filter(|m| is_user(m)) {
                for_each_text(item.get("content"), &mut visit);
            }
        }
        _ => {}
    }
    found
}

fn is_user(m: &Value) -> bool {
    m.get("role").and_then(Value::as_str) == Some("user")
        && m.get("type")
            .and_then(Value::as_str)
            .is_none_or(|t| t == "message")
}

fn for_each_text(content: Option<&Value>, f: &mut impl FnMut(&str)) {
    match content {
        Some(Value::String(s)) => f(s),
        Some(Value::Array(parts)) => {
            for t in parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
            {
                f(t);
            }
        }
        _ => {}
    }
}

/// The first valid marker in `text`: `tokensaver-mock:loop` or `tokensaver-mock:steps=N` with
/// N ≥ 1, each followed by the end of the text or a character that is not a letter or digit.
pub fn parse_marker(text: &str) -> Option<Marker> {
    let mut rest = text;
    while let Some(i) = rest.find(MARKER) {
        let after = &rest[i + MARKER.len()..];
        let word_end = after
            .find(|c: char| !c.is_ascii_alphanumeric() && c != '=')
            .unwrap_or(after.len());
        let word = &after[..word_end];
        if word == "loop" {
            return Some(Marker::Loop);
        }
        if word == "clockloop" {
            return Some(Marker::ClockLoop);
        }
        let count = |prefix: &str| {
            word.strip_prefix(prefix)
                .filter(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|d| d.parse::<u64>().ok())
                .filter(|&n| n >= 1)
        };
        if let Some(n) = count("steps=") {
            return Some(Marker::Steps(n));
        }
        if let Some(n) = count("poll=") {
            return Some(Marker::Poll(n));
        }
        rest = after;
    }
    None
}

/// Tool results already in the request: chat `role: "tool"` messages, Anthropic `tool_result`
/// content blocks, Responses `function_call_output`, `local_shell_call_output` and
/// `custom_tool_call_output` input items.
pub fn tool_results(body: &Value) -> u64 {
    let mut k = 0u64;
    if let Some(Value::Array(msgs)) = body.get("messages") {
        for m in msgs {
            if m.get("role").and_then(Value::as_str) == Some("tool") {
                k += 1;
            }
            if let Some(Value::Array(parts)) = m.get("content") {
                k += parts
                    .iter()
                    .filter(|p| p.get("type").and_then(Value::as_str) == Some("tool_result"))
                    .count() as u64;
            }
        }
    }
    if let Some(Value::Array(items)) = body.get("input") {
        k += items
            .iter()
            .filter(|i| {
                matches!(
                    i.get("type").and_then(Value::as_str),
                    Some(
                        "function_call_output"
                            | "local_shell_call_output"
                            | "custom_tool_call_output"
                    )
                )
            })
            .count() as u64;
    }
    k
}

/// One callable tool definition of a request.
struct ToolDef<'a> {
    name: &'a str,
    schema: Option<&'a Value>,
    local_shell: bool,
}

/// The request's callable tools, in order: chat `{"type":"function","function":{name,
/// parameters}}`, Responses `{"type":"function",name,parameters}` and `{"type":"local_shell"}`,
/// Anthropic `{name,input_schema}` (no `type`, or `"custom"`). Other tools (server tools,
/// namespaces, free-form custom tools) are not callable here.
fn tool_defs(body: &Value) -> Vec<ToolDef<'_>> {
    let Some(Value::Array(tools)) = body.get("tools") else {
        return Vec::new();
    };
    tools
        .iter()
        .filter_map(|t| {
            let kind = t.get("type").and_then(Value::as_str);
            match kind {
                Some("local_shell") => Some(ToolDef {
                    name: "local_shell",
                    schema: None,
                    local_shell: true,
                }),
                Some("function") => {
                    let f = match t.get("function") {
                        Some(f @ Value::Object(_)) => f,
                        _ => t,
                    };
                    Some(ToolDef {
                        name: f.get("name").and_then(Value::as_str)?,
                        schema: f.get("parameters"),
                        local_shell: false,
                    })
                }
                None | Some("custom") if t.get("input_schema").is_some() => Some(ToolDef {
                    name: t.get("name").and_then(Value::as_str)?,
                    schema: t.get("input_schema"),
                    local_shell: false,
                }),
                _ => None,
            }
        })
        .collect()
}

/// `Bash`, else `shell`, else `exec_command`, else the `local_shell` built-in, else the first
/// function tool.
fn pick<'a, 'b>(tools: &'b [ToolDef<'a>]) -> Option<&'b ToolDef<'a>> {
    let named = |n: &str| tools.iter().find(|t| !t.local_shell && t.name == n);
    named("Bash")
        .or_else(|| named("shell"))
        .or_else(|| named("exec_command"))
        .or_else(|| tools.iter().find(|t| t.local_shell))
        .or_else(|| tools.iter().find(|t| !t.local_shell))
}

fn property_type<'a>(schema: Option<&'a Value>, prop: &str) -> Option<&'a str> {
    let ty = schema?.get("properties")?.get(prop)?.get("type")?;
    match ty {
        Value::String(s) => Some(s.as_str()),
        Value::Array(types) => types
            .iter()
            .filter_map(Value::as_str)
            .find(|t| *t != "null"),
        _ => None,
    }
}

fn bash_lc(command: &str) -> Value {
    json!(["bash", "-lc", command])
}

fn arguments_for(tool: &ToolDef<'_>, command: &str, k: u64) -> Value {
    if tool.local_shell {
        return json!({
            "type": "exec",
            "command": bash_lc(command),
            "env": {},
            "timeout_ms": null,
            "user": null,
            "working_directory": null,
        });
    }
    match tool.name {
        "Bash" => json!({"command": command, "description": STEP_DESCRIPTION}),
        "shell" if property_type(tool.schema, "command") == Some("array") => {
            json!({"command": bash_lc(command)})
        }
        "shell" => json!({"command": command}),
        "exec_command" => json!({"cmd": command}),
        _ => {
            let mut args = Map::new();
            let required = tool
                .schema
                .and_then(|s| s.get("required"))
                .and_then(Value::as_array);
            for prop in required.into_iter().flatten().filter_map(Value::as_str) {
                match property_type(tool.schema, prop) {
                    Some("string") => {
                        args.insert(prop.to_owned(), json!(command));
                    }
                    Some("integer" | "number") => {
                        args.insert(prop.to_owned(), json!(k + 1));
                    }
                    _ => {}
                }
            }
            Value::Object(args)
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Task scripts: the scripted provider of the economics suite
// ---------------------------------------------------------------------------------------------

/// The text that introduces a task marker: `tokensaver-mock:task=<id>,seed=<n>`.
pub const TASK_MARKER: &str = "tokensaver-mock:task=";

/// What a scripted agent does on one fixture task (the `script` of
/// `corpus/economics/tasks/<id>/task.json`): shell commands in order, each a tool call, then a
/// final answer. Behaviours modelled on published agent traces are steps of their own:
/// re-reading a file or repeating a lookup (`times`), polling a job (`until`), retrying a
/// failing tool (`while`), a stuck agent repeating one command (`times` with a large range).
/// The `seed` of the marker picks every range, so the repetitions of a task differ while the
/// control and treatment runs of one repetition (same prompt, same seed) are scripted alike.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskScript {
    /// The steps, in order; the last one is an `answer`.
    pub steps: Vec<ScriptStep>,
}

/// One step of a [`TaskScript`]: exactly one of `run` (a command) or `answer` (the end).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptStep {
    /// A shell command: one tool call of the client's shell tool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<String>,
    /// `run` this many times, drawn from the seed in `[low, high]` (0 skips the step); default
    /// once. Without `until`/`while` each time is a separate call whatever its result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub times: Option<[u32; 2]>,
    /// Poll: repeat `run` until its result contains this text (at most `max` calls).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<String>,
    /// Retry: repeat `run` while its result contains this text (at most `max` calls).
    #[serde(default, rename = "while", skip_serializing_if = "Option::is_none")]
    pub while_: Option<String>,
    /// The cap of `until` / `while` (default 10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<u32>,
    /// The final answer's opening text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer: Option<String>,
    /// Words of explanation after the answer's opening text, drawn from the seed in
    /// `[low, high]` (default none), so that answers have the lengths real ones have.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub words: Option<[u32; 2]>,
    /// The text the answer carries before each call of this step (default: a sentence or two
    /// of prose drawn from the seed, so that every call comes with text, as real models write).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub say: Option<String>,
    /// What the step stands for (documentation; the mock ignores it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// One call (or poll, or retry) of an expanded task script.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Slot {
    /// One call, whatever its result.
    Once(String),
    /// Repeat the command until its result contains `text` (or `max` calls).
    Until {
        command: String,
        text: String,
        max: u32,
    },
    /// Repeat the command while its result contains `text` (or `max` calls).
    While {
        command: String,
        text: String,
        max: u32,
    },
}

/// A task script expanded for one seed: the calls, then the answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    pub slots: Vec<Slot>,
    /// The text before each slot's calls (`None`: drawn per call from the seed).
    pub says: Vec<Option<String>>,
    pub answer: String,
    task: String,
    seed: u64,
}

/// The next call of a plan: its command and the text before it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NextCall<'a> {
    pub command: &'a str,
    pub say: String,
}

/// A number drawn from `[low, high]` for (task, seed, draw index): BLAKE3 of the three, so a
/// plan is a pure function of them.
fn draw(task: &str, seed: u64, index: usize, range: [u32; 2]) -> u32 {
    let [low, high] = if range[0] <= range[1] {
        range
    } else {
        [range[1], range[0]]
    };
    let mut h = blake3::Hasher::new();
    h.update(task.as_bytes());
    h.update(&[0]);
    h.update(&seed.to_le_bytes());
    h.update(&(index as u64).to_le_bytes());
    let b = h.finalize();
    let mut x = [0u8; 8];
    x.copy_from_slice(&b.as_bytes()[..8]);
    let span = u64::from(high - low) + 1;
    low + (u64::from_le_bytes(x) % span) as u32
}

/// Sentences of filler prose, `n` words long, drawn from the mock's word list.
fn prose(task: &str, seed: u64, n: u32) -> String {
    let mut out = String::new();
    let mut in_sentence = 0u32;
    for i in 0..n as usize {
        let w = WORDS[draw(task, seed, 10_000 + i, [0, 63]) as usize];
        if in_sentence == 0 {
            if !out.is_empty() {
                out.push(' ');
            }
            let mut c = w.chars();
            if let Some(f) = c.next() {
                out.extend(f.to_uppercase());
                out.push_str(c.as_str());
            }
        } else {
            out.push(' ');
            out.push_str(w);
        }
        in_sentence += 1;
        if in_sentence >= 6 + draw(task, seed, 20_000 + i, [0, 10]) || i + 1 == n as usize {
            out.push('.');
            in_sentence = 0;
        }
    }
    out
}

impl TaskScript {
    /// The plan for `seed`: every range drawn, steps with 0 times left out.
    pub fn plan(&self, task: &str, seed: u64) -> Plan {
        let mut slots = Vec::new();
        let mut says = Vec::new();
        let mut answer = None;
        for (i, step) in self.steps.iter().enumerate() {
            if let Some(text) = &step.answer {
                let extra = step.words.map_or(0, |w| draw(task, seed, i, w));
                let mut a = text.clone();
                if extra > 0 {
                    a.push_str("\n\n");
                    a.push_str(&prose(task, seed.wrapping_add(i as u64 * 7919), extra));
                }
                answer = Some(a);
                break;
            }
            let Some(command) = &step.run else { continue };
            let times = step.times.map_or(1, |t| draw(task, seed, i, t));
            let max = step.max.unwrap_or(10).max(1);
            for _ in 0..times {
                says.push(step.say.clone());
                slots.push(match (&step.until, &step.while_) {
                    (Some(text), _) => Slot::Until {
                        command: command.clone(),
                        text: text.clone(),
                        max,
                    },
                    (None, Some(text)) => Slot::While {
                        command: command.clone(),
                        text: text.clone(),
                        max,
                    },
                    (None, None) => Slot::Once(command.clone()),
                });
            }
        }
        Plan {
            slots,
            says,
            answer: answer.unwrap_or_else(|| "Done.".to_owned()),
            task: task.to_owned(),
            seed,
        }
    }
}

impl Plan {
    /// The next call given the results of the calls made so far (in order), or `None` when
    /// the plan is done and the answer is due.
    pub fn next_call(&self, results: &[String]) -> Option<NextCall<'_>> {
        let (slot, attempts) = self.position(results)?;
        let command = self.next(results)?;
        let say = match self.says.get(slot).cloned().flatten() {
            Some(s) => s,
            None => {
                let seed = self
                    .seed
                    .wrapping_mul(1_000_003)
                    .wrapping_add(slot as u64 * 101 + u64::from(attempts));
                let n = draw(&self.task, seed, 30_000, [6, 18]);
                prose(&self.task, seed, n)
            }
        };
        Some(NextCall { command, say })
    }

    fn position(&self, results: &[String]) -> Option<(usize, u32)> {
        let mut slot = 0usize;
        let mut attempts = 0u32;
        for r in results {
            let s = self.slots.get(slot)?;
            attempts += 1;
            if Self::done(s, r, attempts) {
                slot += 1;
                attempts = 0;
            }
        }
        (slot < self.slots.len()).then_some((slot, attempts))
    }

    fn done(s: &Slot, r: &str, attempts: u32) -> bool {
        match s {
            Slot::Once(_) => true,
            Slot::Until { text, max, .. } => r.contains(text.as_str()) || attempts >= *max,
            Slot::While { text, max, .. } => !r.contains(text.as_str()) || attempts >= *max,
        }
    }

    /// The next command given the results of the calls made so far (in order), or `None`
    /// when the plan is done and the answer is due.
    pub fn next<'a>(&'a self, results: &[String]) -> Option<&'a str> {
        let mut slot = 0usize;
        let mut attempts = 0u32;
        for r in results {
            let s = self.slots.get(slot)?;
            attempts += 1;
            if Self::done(s, r, attempts) {
                slot += 1;
                attempts = 0;
            }
        }
        self.slots.get(slot).map(|s| match s {
            Slot::Once(c) | Slot::Until { command: c, .. } | Slot::While { command: c, .. } => {
                c.as_str()
            }
        })
    }
}

/// The first task marker in the text of the request's user turns: `(task id, seed)`.
pub fn task_marker(body: &Value) -> Option<(String, u64)> {
    first_in_user_text(body, parse_task_marker)
}

/// `tokensaver-mock:task=<id>,seed=<n>` in `text`: the id is ASCII letters, digits, `-` and
/// `_`; the seed decimal.
pub fn parse_task_marker(text: &str) -> Option<(String, u64)> {
    let mut rest = text;
    while let Some(i) = rest.find(TASK_MARKER) {
        let after = &rest[i + TASK_MARKER.len()..];
        let id_end = after
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_'))
            .unwrap_or(after.len());
        let (id, tail) = after.split_at(id_end);
        if let Some(digits) = tail.strip_prefix(",seed=") {
            let end = digits
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(digits.len());
            if !id.is_empty() && end > 0 {
                if let Ok(seed) = digits[..end].parse::<u64>() {
                    return Some((id.to_owned(), seed));
                }
            }
        }
        rest = after;
    }
    None
}

fn push_text(v: &Value, out: &mut String) {
    match v {
        Value::String(s) => out.push_str(s),
        Value::Array(parts) => {
            for p in parts {
                match p {
                    Value::String(s) => out.push_str(s),
                    _ => {
                        if let Some(t) = p
                            .get("text")
                            .or_else(|| p.get("output"))
                            .and_then(Value::as_str)
                        {
                            out.push_str(t);
                        }
                    }
                }
            }
        }
        _ => {}
    }
}

/// The text of every tool result in the request, in order (the results [`tool_results`]
/// counts).
pub fn tool_result_texts(body: &Value) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(Value::Array(msgs)) = body.get("messages") {
        for m in msgs {
            if m.get("role").and_then(Value::as_str) == Some("tool") {
                let mut t = String::new();
                if let Some(c) = m.get("content") {
                    push_text(c, &mut t);
                }
                out.push(t);
            }
            if let Some(Value::Array(parts)) = m.get("content") {
                for p in parts
                    .iter()
                    .filter(|p| p.get("type").and_then(Value::as_str) == Some("tool_result"))
                {
                    let mut t = String::new();
                    if let Some(c) = p.get("content") {
                        push_text(c, &mut t);
                    }
                    out.push(t);
                }
            }
        }
    }
    if let Some(Value::Array(items)) = body.get("input") {
        for i in items.iter().filter(|i| {
            matches!(
                i.get("type").and_then(Value::as_str),
                Some(
                    "function_call_output" | "local_shell_call_output" | "custom_tool_call_output"
                )
            )
        }) {
            let mut t = String::new();
            if let Some(o) = i.get("output") {
                push_text(o, &mut t);
            }
            out.push(t);
        }
    }
    out
}

/// The answer a task-scripted request gets: its first task marker names a script in `tasks`
/// and it defines a usable tool (as for the other markers). `None` otherwise.
pub fn task_scripted(
    body: &Value,
    tasks: &std::collections::BTreeMap<String, TaskScript>,
) -> Option<Scripted> {
    if tasks.is_empty() {
        return None;
    }
    let (task, seed) = task_marker(body)?;
    let script = tasks.get(&task)?;
    let tools = tool_defs(body);
    let tool = pick(&tools)?;
    let plan = script.plan(&task, seed);
    let results = tool_result_texts(body);
    let Some(next) = plan.next_call(&results) else {
        return Some(Scripted::Answer { text: plan.answer });
    };
    let input = arguments_for(tool, next.command, results.len() as u64);
    let arguments = serde_json::to_string(&input).unwrap_or_default();
    Some(Scripted::ToolCall(MockToolCall {
        name: tool.name.to_owned(),
        local_shell: tool.local_shell,
        command: next.command.to_owned(),
        input,
        arguments,
        preamble: next.say,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_parse() {
        assert_eq!(parse_marker("x tokensaver-mock:loop"), Some(Marker::Loop));
        assert_eq!(
            parse_marker("tokensaver-mock:steps=3."),
            Some(Marker::Steps(3))
        );
        assert_eq!(parse_marker("tokensaver-mock:steps=0"), None);
        assert_eq!(
            parse_marker("tokensaver-mock:poll=6."),
            Some(Marker::Poll(6))
        );
        assert_eq!(parse_marker("tokensaver-mock:poll=0"), None);
        assert_eq!(
            parse_marker("tokensaver-mock:clockloop"),
            Some(Marker::ClockLoop)
        );
        assert_eq!(parse_marker("tokensaver-mock:steps="), None);
        assert_eq!(parse_marker("tokensaver-mock:loopy"), None);
        assert_eq!(
            parse_marker("tokensaver-mock:nope tokensaver-mock:steps=12"),
            Some(Marker::Steps(12))
        );
        assert_eq!(parse_marker("no marker"), None);
    }

    #[test]
    fn tool_choice_order_and_arguments() {
        let body = json!({
            "messages": [{"role": "user", "content": "tokensaver-mock:steps=2"}],
            "tools": [
                {"type": "function", "function": {"name": "lookup", "parameters": {
                    "type": "object",
                    "properties": {"q": {"type": "string"}, "n": {"type": ["integer", "null"]},
                                   "flag": {"type": "boolean"}},
                    "required": ["q", "n", "flag"]}}},
            ],
        });
        let Some(Scripted::ToolCall(c)) = scripted(&body) else {
            panic!("no tool call")
        };
        assert_eq!(c.name, "lookup");
        assert_eq!(c.input, json!({"q": "echo tokensaver-step-1", "n": 1}));
        assert_eq!(c.arguments, r#"{"n":1,"q":"echo tokensaver-step-1"}"#);
        assert_eq!(c.output_tokens(), 9);

        let shell = json!({
            "input": "tokensaver-mock:loop",
            "tools": [
                {"type": "function", "name": "other", "parameters": {}},
                {"type": "local_shell"},
                {"type": "function", "name": "shell", "parameters": {
                    "properties": {"command": {"type": "array", "items": {"type": "string"}}}}},
            ],
        });
        let Some(Scripted::ToolCall(c)) = scripted(&shell) else {
            panic!("no tool call")
        };
        assert_eq!(c.name, "shell");
        assert_eq!(
            c.input,
            json!({"command": ["bash", "-lc", "echo tokensaver-loop"]})
        );
    }
    fn script(v: Value) -> TaskScript {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn task_markers_parse() {
        assert_eq!(
            parse_task_marker("Fix it. tokensaver-mock:task=bugfix-vat,seed=3."),
            Some(("bugfix-vat".to_owned(), 3))
        );
        assert_eq!(parse_task_marker("tokensaver-mock:task=x"), None);
        assert_eq!(parse_task_marker("tokensaver-mock:task=,seed=1"), None);
        assert_eq!(
            parse_task_marker("tokensaver-mock:task=a tokensaver-mock:task=b_2,seed=12"),
            Some(("b_2".to_owned(), 12))
        );
    }

    #[test]
    fn plans_are_seeded_and_react_to_results() {
        let s = script(json!({"steps": [
            {"run": "cat a.py", "times": [0, 3]},
            {"run": "./job status", "until": "done", "max": 4},
            {"run": "./fetch", "while": "error", "max": 3},
            {"answer": "Finished.", "words": [20, 40]}
        ]}));
        let plans: Vec<Plan> = (1..=8).map(|seed| s.plan("t", seed)).collect();
        assert_eq!(
            s.plan("t", 1),
            plans[0],
            "a plan is a pure function of task and seed"
        );
        assert!(
            plans.iter().any(|p| p.slots.len() != plans[0].slots.len())
                && plans.iter().any(|p| p.answer != plans[0].answer),
            "repetitions differ"
        );
        for p in &plans {
            let words = p.answer.split_whitespace().count();
            assert!(
                p.answer.starts_with("Finished.") && (21..=41).contains(&words),
                "{p:?}"
            );
        }
        let p = &plans[0];
        let reads = p.slots.len() - 2;
        let r = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let mut results = r(&vec!["source"; reads]);
        assert_eq!(p.next(&results), Some("./job status"));
        results.push("running".into());
        assert_eq!(p.next(&results), Some("./job status"), "polls until done");
        results.push("state: done".into());
        assert_eq!(p.next(&results), Some("./fetch"));
        results.push("error: reset".into());
        assert_eq!(p.next(&results), Some("./fetch"), "retries while failing");
        results.push("ok".into());
        assert_eq!(p.next(&results), None, "then answers");
        // The caps hold.
        let mut stuck = r(&vec!["source"; reads]);
        stuck.extend(r(&["running"; 4]));
        assert_eq!(p.next(&stuck), Some("./fetch"));
        stuck.extend(r(&["error"; 3]));
        assert_eq!(p.next(&stuck), None);
    }

    #[test]
    fn task_scripted_uses_the_clients_shell_tool() {
        let mut tasks = std::collections::BTreeMap::new();
        tasks.insert(
            "t".to_owned(),
            script(json!({"steps": [{"run": "ls"}, {"answer": "All done."}]})),
        );
        let body = json!({
            "messages": [{"role": "user", "content": "Do it. tokensaver-mock:task=t,seed=1"}],
            "tools": [{"name": "Bash", "input_schema": {"type": "object"}}],
        });
        let Some(Scripted::ToolCall(c)) = task_scripted(&body, &tasks) else {
            panic!("no tool call")
        };
        assert_eq!(
            c.input,
            json!({"command": "ls", "description": STEP_DESCRIPTION})
        );
        let words = c.preamble.split_whitespace().count();
        assert!(
            (6..=18).contains(&words),
            "text before the call: {:?}",
            c.preamble
        );
        let done = json!({
            "messages": [
                {"role": "user", "content": "Do it. tokensaver-mock:task=t,seed=1"},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "x", "name": "Bash", "input": {}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "x", "content": "a.py"}]},
            ],
            "tools": [{"name": "Bash", "input_schema": {"type": "object"}}],
        });
        assert_eq!(
            task_scripted(&done, &tasks),
            Some(Scripted::Answer {
                text: "All done.".into()
            })
        );
        assert_eq!(task_scripted(&body, &Default::default()), None);
        assert_eq!(tool_result_texts(&done), vec!["a.py".to_owned()]);
    }
}
