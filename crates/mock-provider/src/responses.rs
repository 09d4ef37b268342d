//! The OpenAI Responses API of the mock: prompt characters, the `response` object, its SSE
//! events, input items and the store behind `GET /v1/responses/{id}`. The rules are in the
//! parent module's docs ("The Responses API").

use std::collections::{HashMap, VecDeque};

use serde_json::{json, Map, Value};

use super::{content_chars, MockReply, Scripted, CREATED};

/// Prompt characters `C` of a Responses body: `instructions` (a string), plus `input` when it is
/// a string, else per item: a message's `content` (a string, or each part's `text`), the
/// `output` of `function_call_output` / `local_shell_call_output` / `custom_tool_call_output`
/// (a string, or each part's `text`), and the `arguments` of `function_call`.
pub fn prompt_chars(body: &Value) -> u64 {
    let count = |s: &str| s.chars().count() as u64;
    let instructions = body
        .get("instructions")
        .and_then(Value::as_str)
        .map_or(0, count);
    let input = match body.get("input") {
        Some(Value::String(s)) => count(s),
        Some(Value::Array(items)) => items.iter().map(item_chars).sum(),
        _ => 0,
    };
    instructions + input
}

pub(crate) fn item_chars(item: &Value) -> u64 {
    match item.get("type").and_then(Value::as_str) {
        None | Some("message") => item.get("content").map_or(0, content_chars),
        Some("function_call_output" | "local_shell_call_output" | "custom_tool_call_output") => {
            item.get("output").map_or(0, content_chars)
        }
        Some("function_call") => item
            .get("arguments")
            .and_then(Value::as_str)
            .map_or(0, |s| s.chars().count() as u64),
        _ => 0,
    }
}

/// Whether the request asked for the answer to be kept (`store` is not `false`).
pub fn stored(body: &Value) -> bool {
    body.get("store") != Some(&Value::Bool(false))
}

fn echo(body: &Value, key: &str, default: Value) -> Value {
    body.get(key).cloned().unwrap_or(default)
}

impl MockReply {
    /// `resp_<24 hex>`: the id of a Responses answer.
    pub fn response_id(&self) -> String {
        format!("resp_{}", self.id_hex())
    }

    /// `msg_<hex(d[12..24])>`: the id of a Responses message output item.
    pub fn response_message_id(&self) -> String {
        format!("msg_{}", self.call_hex())
    }

    /// `"incomplete"` if the cap cut the reply, else `"completed"`.
    pub fn response_status(&self) -> &'static str {
        if self.truncated {
            "incomplete"
        } else {
            "completed"
        }
    }

    /// The Responses `usage` object.
    pub fn responses_usage_json(&self) -> Value {
        json!({
            "input_tokens": self.usage.prompt_tokens,
            "input_tokens_details": self.usage.openai_details("cached_tokens"),
            "output_tokens": self.usage.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": self.usage.total_tokens(),
        })
    }

    /// The one output item of the answer, finished.
    pub fn response_output_item(&self) -> Value {
        self.output_item(true)
    }

    /// The text a task script's tool call carries before it, as a message item.
    fn preamble_item(&self, done: bool) -> Option<Value> {
        let text = match &self.script {
            Some(Scripted::ToolCall(c)) if !c.preamble.is_empty() => c.preamble.as_str(),
            _ => return None,
        };
        Some(json!({
            "type": "message",
            "id": self.response_message_id(),
            "status": if done { "completed" } else { "in_progress" },
            "role": "assistant",
            "content": if done { json!([self.output_text_part(text)]) } else { json!([]) },
        }))
    }

    /// Every output item of the finished answer (the preamble's message first, if any).
    fn output_items(&self) -> Value {
        match self.preamble_item(true) {
            Some(p) => json!([p, self.response_output_item()]),
            None => json!([self.response_output_item()]),
        }
    }

    fn output_item(&self, done: bool) -> Value {
        let hex = self.call_hex();
        match &self.script {
            Some(Scripted::ToolCall(c)) if c.local_shell => json!({
                "type": "local_shell_call",
                "id": format!("lsh_{hex}"),
                "call_id": format!("call_{hex}"),
                "status": if done { "completed" } else { "in_progress" },
                "action": c.input,
            }),
            Some(Scripted::ToolCall(c)) => json!({
                "type": "function_call",
                "id": format!("fc_{hex}"),
                "call_id": format!("call_{hex}"),
                "name": c.name,
                "arguments": if done { c.arguments.as_str() } else { "" },
                "status": if done { "completed" } else { "in_progress" },
            }),
            _ => {
                let status = match (done, self.truncated) {
                    (false, _) => "in_progress",
                    (true, true) => "incomplete",
                    (true, false) => "completed",
                };
                let content = if done {
                    json!([self.output_text_part(&self.text)])
                } else {
                    json!([])
                };
                json!({
                    "type": "message",
                    "id": self.response_message_id(),
                    "status": status,
                    "role": "assistant",
                    "content": content,
                })
            }
        }
    }

    fn output_text_part(&self, text: &str) -> Value {
        json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
    }

    /// The `response` object: finished (`done`) or as announced by `response.created`.
    fn response_object(&self, request: &Value, done: bool) -> Value {
        let mut o = Map::new();
        let mut put = |k: &str, v: Value| {
            o.insert(k.to_owned(), v);
        };
        put("id", json!(self.response_id()));
        put("object", json!("response"));
        put("created_at", json!(CREATED));
        put(
            "status",
            json!(if done {
                self.response_status()
            } else {
                "in_progress"
            }),
        );
        put("background", echo(request, "background", json!(false)));
        put("error", Value::Null);
        put(
            "incomplete_details",
            if done && self.truncated {
                json!({"reason": "max_output_tokens"})
            } else {
                Value::Null
            },
        );
        put("instructions", echo(request, "instructions", Value::Null));
        put(
            "max_output_tokens",
            echo(request, "max_output_tokens", Value::Null),
        );
        put(
            "max_tool_calls",
            echo(request, "max_tool_calls", Value::Null),
        );
        put("model", json!(self.model));
        put("output", if done { self.output_items() } else { json!([]) });
        put(
            "parallel_tool_calls",
            echo(request, "parallel_tool_calls", json!(true)),
        );
        put(
            "previous_response_id",
            echo(request, "previous_response_id", Value::Null),
        );
        put(
            "prompt_cache_key",
            echo(request, "prompt_cache_key", Value::Null),
        );
        put(
            "reasoning",
            echo(
                request,
                "reasoning",
                json!({"effort": null, "summary": null}),
            ),
        );
        put(
            "safety_identifier",
            echo(request, "safety_identifier", Value::Null),
        );
        put("service_tier", json!("default"));
        put("store", json!(stored(request)));
        put("temperature", echo(request, "temperature", json!(1.0)));
        put(
            "text",
            echo(request, "text", json!({"format": {"type": "text"}})),
        );
        put("tool_choice", echo(request, "tool_choice", json!("auto")));
        put("tools", echo(request, "tools", json!([])));
        put("top_logprobs", echo(request, "top_logprobs", json!(0)));
        put("top_p", echo(request, "top_p", json!(1.0)));
        put("truncation", echo(request, "truncation", json!("disabled")));
        put(
            "usage",
            if done {
                self.responses_usage_json()
            } else {
                Value::Null
            },
        );
        put("user", echo(request, "user", Value::Null));
        put("metadata", echo(request, "metadata", json!({})));
        Value::Object(o)
    }

    /// The finished `response` object for `request` (the non-streamed answer's body, and the
    /// `response` of the final stream event).
    pub fn responses_value(&self, request: &Value) -> Value {
        self.response_object(request, true)
    }

    /// The exact body of the non-streamed Responses answer to `request`.
    pub fn responses_json(&self, request: &Value) -> Vec<u8> {
        serde_json::to_vec(&self.responses_value(request)).unwrap_or_default()
    }

    /// The exact SSE events (`event: <type>\ndata: <json>\n\n` each) of the streamed Responses
    /// answer to `request`. The last one is `response.completed` (or `response.incomplete`).
    /// The events of one output text part: added, its deltas, the text done, the part done.
    fn text_part_events(
        &self,
        ev: &mut impl FnMut(&str, Value),
        item_id: &str,
        text: &str,
        deltas: Vec<String>,
    ) {
        let at = |extra: Value| {
            let mut m = json!({"item_id": item_id, "output_index": 0, "content_index": 0});
            if let (Value::Object(m), Value::Object(extra)) = (&mut m, extra) {
                m.extend(extra);
            }
            m
        };
        ev(
            "response.content_part.added",
            at(json!({"part": self.output_text_part("")})),
        );
        for d in deltas {
            ev(
                "response.output_text.delta",
                at(json!({"delta": d, "logprobs": []})),
            );
        }
        ev(
            "response.output_text.done",
            at(json!({"text": text, "logprobs": []})),
        );
        ev(
            "response.content_part.done",
            at(json!({"part": self.output_text_part(text)})),
        );
    }

    pub fn responses_sse_events(&self, request: &Value) -> Vec<String> {
        let mut seq = 0u64;
        let mut events = Vec::new();
        let mut ev = |kind: &str, mut v: Value| {
            if let Value::Object(m) = &mut v {
                m.insert("type".to_owned(), json!(kind));
                m.insert("sequence_number".to_owned(), json!(seq));
            }
            seq += 1;
            events.push(format!(
                "event: {kind}\ndata: {}\n\n",
                serde_json::to_string(&v).unwrap_or_default()
            ));
        };
        let announced = self.response_object(request, false);
        ev("response.created", json!({"response": announced}));
        ev("response.in_progress", json!({"response": announced}));
        let mut index = 0;
        if let (Some(added), Some(done), Some(Scripted::ToolCall(c))) = (
            self.preamble_item(false),
            self.preamble_item(true),
            &self.script,
        ) {
            let item_id = self.response_message_id();
            ev(
                "response.output_item.added",
                json!({"output_index": 0, "item": added}),
            );
            self.text_part_events(
                &mut ev,
                &item_id,
                &c.preamble,
                super::word_deltas(&c.preamble),
            );
            ev(
                "response.output_item.done",
                json!({"output_index": 0, "item": done}),
            );
            index = 1;
        }
        ev(
            "response.output_item.added",
            json!({"output_index": index, "item": self.output_item(false)}),
        );
        match &self.script {
            Some(Scripted::ToolCall(c)) if c.local_shell => {}
            Some(Scripted::ToolCall(c)) => {
                let item_id = format!("fc_{}", self.call_hex());
                for piece in super::argument_pieces(&c.arguments) {
                    ev(
                        "response.function_call_arguments.delta",
                        json!({"item_id": item_id, "output_index": index, "delta": piece}),
                    );
                }
                ev(
                    "response.function_call_arguments.done",
                    json!({"item_id": item_id, "output_index": index, "arguments": c.arguments}),
                );
            }
            _ => {
                let item_id = self.response_message_id();
                self.text_part_events(&mut ev, &item_id, &self.text, self.deltas());
            }
        }
        ev(
            "response.output_item.done",
            json!({"output_index": index, "item": self.response_output_item()}),
        );
        let last = if self.truncated {
            "response.incomplete"
        } else {
            "response.completed"
        };
        ev(last, json!({"response": self.responses_value(request)}));
        events
    }
}

/// The input items of a Responses request as `GET /v1/responses/{id}/input_items` lists them:
/// a string `input` is one user message; an item without `type` but with a `role` is a
/// `message`; a message's string `content` becomes one `input_text` part (`output_text` for
/// the assistant); an item without an `id` gets `msg_<24 hex>` (messages) or `item_<24 hex>`,
/// from BLAKE3 of the response id and the item's position.
pub fn input_items(request: &Value, response_id: &str) -> Vec<Value> {
    let items: Vec<Value> = match request.get("input") {
        Some(Value::String(s)) => vec![json!({"role": "user", "content": s})],
        Some(Value::Array(items)) => items.clone(),
        _ => Vec::new(),
    };
    items
        .into_iter()
        .enumerate()
        .map(|(i, item)| normalize_item(item, response_id, i))
        .collect()
}

fn normalize_item(item: Value, response_id: &str, index: usize) -> Value {
    let Value::Object(mut m) = item else {
        return item;
    };
    if !m.contains_key("type") && m.contains_key("role") {
        m.insert("type".to_owned(), json!("message"));
    }
    let is_message = m.get("type").and_then(Value::as_str) == Some("message");
    if is_message {
        if let Some(Value::String(s)) = m.get("content") {
            let part = if m.get("role").and_then(Value::as_str) == Some("assistant") {
                json!({"type": "output_text", "text": s, "annotations": []})
            } else {
                json!({"type": "input_text", "text": s})
            };
            m.insert("content".to_owned(), json!([part]));
        }
    }
    if !m.contains_key("id") {
        let mut h = blake3::Hasher::new();
        h.update(response_id.as_bytes());
        h.update(&(index as u64).to_le_bytes());
        let hex = hex::encode(&h.finalize().as_bytes()[..12]);
        let prefix = if is_message { "msg" } else { "item" };
        m.insert("id".to_owned(), json!(format!("{prefix}_{hex}")));
    }
    Value::Object(m)
}

/// One kept answer.
pub struct StoredResponse {
    /// The finished `response` object.
    pub response: Value,
    /// Its input items (see [`input_items`]).
    pub input_items: Vec<Value>,
}

/// The kept answers by id, at most `cap`, the oldest dropped first.
#[derive(Default)]
pub struct Store {
    map: HashMap<String, StoredResponse>,
    order: VecDeque<String>,
}

impl Store {
    /// Keeps `r` under `id` (replacing an earlier answer with the same id).
    pub fn insert(&mut self, id: String, r: StoredResponse, cap: usize) {
        if cap == 0 {
            return;
        }
        if self.map.insert(id.clone(), r).is_some() {
            self.order.retain(|k| k != &id);
        }
        self.order.push_back(id);
        while self.order.len() > cap {
            if let Some(old) = self.order.pop_front() {
                self.map.remove(&old);
            }
        }
    }

    /// The answer kept under `id`.
    pub fn get(&self, id: &str) -> Option<&StoredResponse> {
        self.map.get(id)
    }

    /// Forgets the answer kept under `id`; whether there was one.
    pub fn remove(&mut self, id: &str) -> bool {
        let found = self.map.remove(id).is_some();
        if found {
            self.order.retain(|k| k != id);
        }
        found
    }

    /// Forgets everything.
    pub fn clear(&mut self) {
        self.map.clear();
        self.order.clear();
    }
}
