//! Scripted agent behaviour: the marker in a user turn, the tool results already in the
//! request, and the tool call the mock asks for. The rules are in the parent module's docs
//! ("Scripted agents").

use serde_json::{json, Map, Value};

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
}

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
        Marker::Steps(n) if k < n => format!("echo tokensaver-step-{}", k + 1),
        Marker::Steps(_) => return Some(Scripted::Done { steps: k }),
    };
    let input = arguments_for(tool, &command, k);
    let arguments = serde_json::to_string(&input).unwrap_or_default();
    Some(Scripted::ToolCall(MockToolCall {
        name: tool.name.to_owned(),
        local_shell: tool.local_shell,
        command,
        input,
        arguments,
    }))
}

/// The first valid marker in the text of the request's user turns, in order.
///
/// User turns: `messages[]` with `role: "user"` (chat and Anthropic), a string `input`, and
/// `input[]` items with `role: "user"` (Responses). Their text: a string content, or the `text`
/// of each content part (so Anthropic `tool_result` blocks are not searched).
pub fn marker(body: &Value) -> Option<Marker> {
    let mut found = None;
    let mut visit = |text: &str| {
        if found.is_none() {
            found = parse_marker(text);
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
        if let Some(n) = word
            .strip_prefix("steps=")
            .filter(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|d| d.parse::<u64>().ok())
            .filter(|&n| n >= 1)
        {
            return Some(Marker::Steps(n));
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
}
