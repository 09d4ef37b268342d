//! A deterministic local **mock model provider**: an HTTP/1.1 server (hyper) that speaks the
//! OpenAI chat-completions, OpenAI Responses and Anthropic messages wire formats.
//!
//! It is used by the integration tests (in-process, [`MockProvider`]), and as the
//! `tokensaver-mock-provider` binary by `tokensaver demo`, the Python SDK tests, the agent
//! client tests (Claude Code, Codex CLI, OpenAI Agents SDK), the economics harness, the soak
//! and the load benchmark (`tokensaver mock-provider ARGS` runs that binary). It is a crate of
//! its own so that the production `tokensaver` binary does not carry it. Everything
//! it answers is a pure function of the request (and, for `GET /v1/responses/{id}`, of the
//! earlier requests; for the cache figures of the usage, of the earlier requests of the same
//! credential and model and of the clock, see "Prompt caching"), so a test can predict every
//! byte; [`reply_for`] / [`reply_for_api`] / [`expected_usage`] compute the same figures
//! in-process, as the mock answers on an empty prompt cache.
//!
//! # Routes
//!
//! | method & path                | answer                                                   |
//! |------------------------------|----------------------------------------------------------|
//! | `POST /v1/chat/completions`  | OpenAI `chat.completion` (or SSE `chat.completion.chunk`s) |
//! | `POST /v1/messages`          | Anthropic `message` (or SSE message events)               |
//! | `POST /v1/responses`         | OpenAI `response` (or SSE `response.*` events), see "The Responses API" |
//! | `GET /v1/responses/{id}`     | the kept `response` object                                |
//! | `DELETE /v1/responses/{id}`  | forgets it: `{"deleted":true,"id":id,"object":"response"}` |
//! | `GET /v1/responses/{id}/input_items` | `{"data":[items],"first_id","has_more":false,"last_id","object":"list"}` |
//! | `POST /v1/responses/{id}/cancel` | the kept `response` object, unchanged                 |
//! | `POST /v1/messages/count_tokens` | `{"input_tokens": P}`, `P` as `/v1/messages` would report it (no fault modes) |
//! | `GET /v1/models`             | OpenAI-style list of the [`MODELS`]                       |
//! | other method on those paths  | 405 JSON error with `allow` (OpenAI shape; Anthropic shape on `/v1/messages*`) |
//! | any other path               | 404 JSON error, OpenAI shape                              |
//! | `GET /__mock/calls`          | `{"/v1/chat/completions": n, "/v1/messages": m, ...}`: requests received per path since the last reset (any method, query string stripped, `/__mock/*` not counted) |
//! | `POST /__mock/reset`         | clears counters, records, kept Responses answers and prompt-cache entries (not the clock), answers `{"ok":true}` |
//! | `GET /__mock/requests`       | the retained records, oldest first: `[{"seq","method","path","target","headers":[[name,value]..],"body_len","body","body_truncated","at_unix_ms","reported_usage"}]` (`reported_usage`: for a model call, the usage figures the mock answered with, prompt cache included — `prompt_tokens`, `completion_tokens`, `cached_tokens`, `input_tokens`, `cache_read_input_tokens`, `cache_creation_input_tokens`, `cache_creation: {ephemeral_5m_input_tokens, ephemeral_1h_input_tokens}`, `cache_write_tokens` (OpenAI models that bill cache writes; else 0); for a call answered without usage (a 400, 401, `fault-500`, `fault-429`) the figures computed from its body as on an empty cache, uncached if its markers were refused; else null); `?limit=N` (default 50, newest N) and `?path=/v1/messages` filter; `body` is lossy UTF-8, at most 64 KiB (`?max_body=N`: at most N bytes) |
//! | `GET /__mock/clock`          | `{"now_ms": N, "fixed": bool}`: the clock the prompt cache reads when a request has no `x-mock-now-ms` header (see "Prompt caching") |
//! | `POST /__mock/clock`         | `{"now_ms": N}` fixes that clock at N (Unix ms), `{"now_ms": null}` returns to the real clock, `{"advance_ms": N}` moves it N ms forward from its reading (it is then fixed; with both keys: set, then advance); answers as `GET`; any other body → 400 |
//! | `GET /__mock/cache`          | `{"enabled": bool, "entries": n}`: whether prompt caching is billed, and the entries held (expired ones are dropped lazily) |
//! | `POST /__mock/cache/reset`   | drops every prompt-cache entry (all credentials, models, keys): `{"ok":true,"dropped":n}` |
//! | `GET /__mock/health`         | `{"ok":true}`                                             |
//!
//! The query string never takes part in routing (Claude Code sends
//! `POST /v1/messages?beta=true`); it is kept in the record's `target`. An unknown id under
//! `/v1/responses/` answers 404 `{"error":{"code":null,"message":"Response with id '<id>' not
//! found.","param":null,"type":"invalid_request_error"}}`. `/__mock/*` routes never require a
//! credential and are not recorded.
//!
//! # The reply
//!
//! * **Canonical body**: the request body parsed as a JSON object, without the top-level keys
//!   `stream` and `stream_options`, serialised compactly with object keys sorted (bytewise,
//!   recursively), strings escaped and numbers printed as `serde_json` does. Key order and
//!   whitespace of the request therefore do not matter.
//! * **Digest** `d` = BLAKE3 of the canonical body (32 bytes).
//! * **Words**: `n = 3 + d[0] % 6` words (3..=8); word `i` is `WORDS[d[1 + i] % 64]` (see
//!   [`WORDS`]). The reply text is the words joined by single spaces (all lowercase ASCII, no
//!   punctuation).
//! * **Cap**: `max_completion_tokens` if it is a non-negative integer, otherwise `max_tokens`
//!   if it is one (Responses: `max_output_tokens`). If the cap is below `n`, the reply is the
//!   first `cap` words and the answer is marked truncated (`finish_reason: "length"` /
//!   `stop_reason: "max_tokens"` / `status: "incomplete"`); otherwise `"stop"` / `"end_turn"` /
//!   `"completed"`.
//! * **Ids**: `chatcmpl-<hex(d[0..12])>` (OpenAI chat), `msg_<hex(d[0..12])>` (Anthropic) and
//!   `resp_<hex(d[0..12])>` (Responses), i.e. 24 lowercase hex digits; a Responses message item
//!   is `msg_<hex(d[12..24])>`. `created` (Responses: `created_at`) is always [`CREATED`]
//!   (1700000000), `system_fingerprint` is [`SYSTEM_FINGERPRINT`]. `model` echoes the
//!   request's `model` (`""` if absent).
//!
//! Identical requests therefore get byte-identical JSON answers (but for the cache figures of
//! the usage, which depend on what the same credential sent before: see "Prompt caching"), and
//! a streamed request gets the same text, id and usage as the same request without `stream`.
//!
//! # Usage
//!
//! * **Prompt characters** `C`: the number of Unicode scalar values in the top-level `system`
//!   (if present) plus every `messages[].content`, where a content (or `system`) that is a
//!   string counts whole, and one that is an array counts the `text` string field of each
//!   element that has one (other parts count 0). Tool definitions, tool-call arguments and
//!   Anthropic `tool_result` blocks (no top-level `text`) count 0; chat `role: "tool"`
//!   messages count by their `content` like any message.
//! * **Responses prompt characters**: `instructions` (if a string), plus `input` if it is a
//!   string, else for each `input[]` item: a message (`type: "message"`, or no `type`) counts
//!   its `content` as above; a `function_call_output`, `local_shell_call_output` or
//!   `custom_tool_call_output` counts its `output` (a string whole, an array by its parts'
//!   `text`); a `function_call` counts its `arguments` string; other items count 0. Tools
//!   count 0.
//! * **Prompt tokens** `P = ceil(C / 4) + 8` (the 8 is [`PROMPT_OVERHEAD_TOKENS`]).
//! * **Output tokens** `O` = number of words in the returned reply (≤ the cap); for a
//!   scripted tool call, the characters of its `arguments` JSON ÷ 4 rounded up, at least 1
//!   (see "Scripted agents").
//! * Models whose name contains `cached` (case-sensitive) report a cache hit:
//!   `R = P / 2` (integer division) cached/read tokens and `W = P / 4` cache-creation tokens,
//!   on every call: this fixed rule takes precedence over prompt caching. Other models report
//!   the cache read `R` and write `W` that prompt caching bills (see "Prompt caching"; both 0
//!   for a request that neither marks a breakpoint nor, on OpenAI, repeats a prefix of at
//!   least 1024 tokens; always 0 with `--no-prompt-cache`).
//! * OpenAI: `{"prompt_tokens": P, "completion_tokens": O, "total_tokens": P + O,
//!   "prompt_tokens_details": {"cached_tokens": R}}`.
//! * Anthropic: `{"input_tokens": P - R - W, "output_tokens": O,
//!   "cache_creation_input_tokens": W, "cache_read_input_tokens": R}` (as in the real API,
//!   `input_tokens` excludes cached tokens, so `input + creation + read = P`); a request that
//!   carries a `cache_control` (prompt caching on) also gets `"cache_creation":
//!   {"ephemeral_5m_input_tokens": W5, "ephemeral_1h_input_tokens": W1}` with `W5 + W1 = W`
//!   (a `cached` model: `W5 = W`).
//! * Responses: `{"input_tokens": P, "input_tokens_details": {"cached_tokens": R},
//!   "output_tokens": O, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens":
//!   P + O}`.
//!
//! Example: one user message `"Hello there, mock!"` (18 chars): `P = ceil(18/4) + 8 = 13`;
//! with model `gpt-cached`: `cached_tokens = 6`; Anthropic `input_tokens = 13 - 6 - 3 = 4`.
//!
//! # Prompt caching
//!
//! On by default ([`ProviderOptions::prompt_cache`]); `--no-prompt-cache` (or the
//! environment `TOKENSAVER_MOCK_NO_PROMPT_CACHE=1`) turns it off and restores the earlier
//! answers byte for byte (no cache, no `cache_control` checks, only the `cached` models' fixed
//! rule). The mock bills caching as the providers' public pages describe it — Anthropic
//! "Prompt caching" (<https://platform.claude.com/docs/en/build-with-claude/prompt-caching>)
//! and OpenAI "Prompt caching" (<https://platform.openai.com/docs/guides/prompt-caching>) —
//! in the deterministic reading below. It only splits `P` (counted as in "Usage", the
//! whole prompt); it never changes `P`, `O`, the reply or the ids.
//!
//! **Precedence.** A model whose name contains `cached` keeps the fixed rule (`R = P/2`,
//! `W = P/4`, every call) and never reads or writes the cache; its `cache_control` markers
//! are still checked.
//!
//! **Partitions.** Entries belong to one route family (messages, chat completions or
//! Responses), one credential — the `x-api-key` value on `/v1/messages`, else the
//! `Authorization: Bearer` token (OpenAI routes: the bearer first, then `x-api-key`; a request
//! with neither has the empty credential's partition) — one `model` (the exact string) and, for
//! OpenAI, one `prompt_cache_key`. Nothing is ever shared across partitions.
//!
//! **Clock.** A request's time is its `x-mock-now-ms` header ([`NOW_HEADER`]: Unix
//! milliseconds as a decimal integer; any other value is ignored), else the clock set by
//! `POST /__mock/clock` ([`MockProvider::set_clock_ms`]), else the real clock. A lifetime is
//! half-open: an entry that expires at `t` is gone for a request at `t`.
//!
//! **Blocks, prefixes and their tokens.** A prompt is a list of blocks (listed per API below);
//! a *prefix* is its blocks up to and including one of them. A prefix is identified by a
//! BLAKE3 chain over its blocks, each taken with where it sits (the part — tools, system,
//! messages, instructions, input — and, for Anthropic messages, the message index and role),
//! so two prefixes match only when every block up to there is the same JSON in the same
//! place. `cache_control` never takes part: moving or dropping a marker does not change a
//! prefix. The tokens of a prefix:
//! * under `--usage cl100k`: the sum over its blocks of the cl100k tokens of the block's
//!   canonical JSON ([`canonical`]: compact, object keys sorted bytewise at every level,
//!   strings and numbers as `serde_json` prints them), `cache_control` removed from the block
//!   and from the elements of its `content` array;
//! * under the character rule: `ceil(c / 4)`, `c` being the prompt characters of its blocks
//!   counted as for `C` (tools 0, a text block its `text`, an OpenAI message its `content`, a
//!   Responses item as in "Usage"), so a prefix never has more tokens than `P - 8`.
//!
//! **Anthropic** (`POST /v1/messages`):
//! * Blocks, in the cache order tools → system → messages: each `tools[]` element; `system`
//!   (a string is one block `{"text": s, "type": "text"}`, an array one block per element);
//!   each message's `content` (a string is one such text block, an array one block per
//!   element).
//! * Breakpoints: a block with `cache_control` `{"type": "ephemeral"}` and `ttl` `"5m"` (the
//!   default) or `"1h"`, or whose `content` array (a `tool_result`'s) has an element with one.
//!   The **automatic form** — a top-level `cache_control` — puts a breakpoint with its TTL on
//!   the last block that is not `thinking` / `redacted_thinking` ("the last cacheable block",
//!   which moves forward as the conversation grows), unless that block already has its own
//!   marker (then it adds nothing and the block's TTL stands); otherwise it takes one of the 4
//!   slots.
//! * Refused with 400 `invalid_request_error` (Anthropic error shape), before any fault mode,
//!   as the API does: more than [`MAX_BREAKPOINTS`] (4) markers (each nested one counts, the
//!   automatic one too), a `cache_control` whose `type` is not `ephemeral`, a `ttl` other than
//!   `5m` / `1h`, a `1h` breakpoint after a `5m` one (in cache order).
//! * Minimum cacheable length ([`anthropic_min_tokens`]): a breakpoint whose prefix has fewer
//!   tokens is ignored — neither written nor read. 4096 for a model whose name (lowercased,
//!   `.` read as `-`) contains `opus-4-5`, `opus-4-6` or `haiku-4-5`; 2048 for `sonnet-4-6` and
//!   any other `haiku` (Haiku 3, 3.5); 1024 for every other model (Sonnet 4.5, 4, 3.7, Opus 4.1,
//!   4, 3, and the mock's own names).
//! * **Read**: for each remaining breakpoint, the mock looks for a live entry at the prefix
//!   ending at the breakpoint's block and at each of the 19 blocks before it
//!   ([`LOOKBACK_BLOCKS`] = 20 positions, the breakpoint's own counted: the docs' lookback);
//!   the longest found over all breakpoints is read: `cache_read_input_tokens` = its tokens.
//!   Every live entry at a prefix of the read one is refreshed.
//! * **Write**: each remaining breakpoint past the read point becomes an entry with its TTL
//!   (entries exist only where a breakpoint was; writes happen only at breakpoints).
//!   `cache_creation_input_tokens` = the tokens of the last such breakpoint's prefix minus the
//!   read ones; split as the docs split mixed TTLs: `ephemeral_1h_input_tokens` = the tokens
//!   up to the last `1h` breakpoint past the read point minus the read ones,
//!   `ephemeral_5m_input_tokens` = the rest.
//! * **Lifetime**: an entry lives its TTL — 5 minutes ([`FIVE_MINUTES_MS`]) or 1 hour
//!   ([`ONE_HOUR_MS`]) — after it was written or last read (a read refreshes it, as the docs
//!   say, at no cost).
//! * `input_tokens = P − read − written`. The bill never exceeds `P` (read, then the 1h, then
//!   the 5m part are cut to fit; only a body whose blocks, counted apart, have more tokens than
//!   the whole body can reach that). `message_start` carries the same figures as the JSON
//!   answer. `count_tokens` is unchanged (`P`).
//!
//! **OpenAI** (`POST /v1/chat/completions`, `POST /v1/responses`): automatic, no markers.
//! * Blocks (segments): chat — each `tools[]` element, then each `messages[]` element (the
//!   whole message object); Responses — each `tools[]` element, `instructions` (if a string:
//!   the block is that JSON string), then `input` (a string is the block `{"content": s,
//!   "role": "user"}`, an array one block per item). Other parameters take no part.
//! * A prompt with `P <` [`OPENAI_MIN_TOKENS`] (1024) is neither read nor written. Otherwise
//!   the hit is the longest live prefix of this prompt that an earlier request of the
//!   partition wrote, rounded down to the docs' 128-token steps ([`openai_cached`]: 0 below
//!   1024, else `1024 + 128·⌊(n − 1024)/128⌋`), and every prefix of at least 1024 tokens is
//!   written (or, if live, refreshed). Chat reports it as `prompt_tokens_details.cached_tokens`,
//!   Responses as `input_tokens_details.cached_tokens` (also in the streamed usage chunk, in
//!   `response.completed` and in the kept response); `prompt_tokens` / `input_tokens` stay
//!   `P`. Writes are free and not reported (as on the models before GPT-5.6).
//! * Lifetime (`prompt_cache_retention`): `"in_memory"` (the default, and any other value) —
//!   5 minutes after the last use, and never more than 1 hour after the write (the docs:
//!   cleared after 5–10 minutes of inactivity, always within an hour); `"24h"` — 24 hours
//!   after the write ([`ONE_DAY_MS`]), whatever the use.
//! * **Routing** (`prompt_cache_key`): the docs route a request to a cache machine by a hash of
//!   the prompt's first ~256 tokens combined with `prompt_cache_key`, and past about 15
//!   requests a minute for one prefix and key, requests overflow to other machines. The mock:
//!   a request's *route* is the hash of its first boundary of at least
//!   [`cache::OPENAI_ROUTE_TOKENS`] (256) tokens (else its whole prompt) with its key (no key is
//!   a route of its own); a route that took [`cache::OPENAI_OVERFLOW_PER_MINUTE`] (15) requests
//!   in the last minute sends each further one, in turn, to one of
//!   [`cache::OPENAI_OVERFLOW_MACHINES`] (7) other machines. Each machine is a partition with
//!   its own entries: a request that overflows reads only what that machine holds.
//! * **Writes**: a model that bills cache writes ([`cache::openai_bills_writes`]: GPT-5.6 and
//!   later families) reports `cache_write_tokens` in `prompt_tokens_details` /
//!   `input_tokens_details` — the longest prefix written now beyond the one read — and
//!   `input_tokens` / uncached input excludes them; every other model's writes are free and not
//!   reported.
//! * Not modelled: GPT-5.6 explicit `prompt_cache_breakpoint`s and `prompt_cache_options`,
//!   `previous_response_id` context (only the request's own input is a prompt).
//!
//! **Time scale** ([`ProviderOptions::time_scale`], `--time-scale N`): the cache's clock runs N
//! times faster than the request's, so every lifetime and the routing window are divided by N,
//! as `[gate.windows]` shortens the gate's for a time-compressed run.
//!
//! **Billing parameters are not prompt text.** `cache_control` (anywhere) and the top-level
//! `prompt_cache_key`, `prompt_cache_retention` and `prompt_cache_options` take no part in `P`
//! nor in the reply (its words, ids and scripted steps): a marker or a routing key changes what
//! a call is billed, never what it answers.
//!
//! **Which calls take part**: normal answers and `fault-slow`, `fault-reset` and
//! `fault-truncated` (the prompt was processed) read and write; `fault-500`, `fault-429`,
//! refused and unauthenticated requests neither read nor write. The in-process predictions
//! ([`reply_for`], [`MockReply::for_api_with`], …) bill against an empty cache: an Anthropic
//! breakpoint is written, nothing is read.
//!
//! Example (character rule, `claude-sonnet-4-5`, credential `k`): `system` is one text block
//! of 5000 characters with `cache_control`, then one user message `"Hello!"`: `P =
//! ceil(5006/4) + 8 = 1260`; the prefix at the breakpoint has `ceil(5000/4) = 1250 ≥ 1024`
//! tokens. First call: `cache_creation_input_tokens: 1250` (all 5m), `input_tokens: 10`; the
//! same call within 5 minutes: `cache_read_input_tokens: 1250`, `input_tokens: 10`. OpenAI
//! (`gpt-4o`): a system message of 6000 characters then `"hi"` (`P = 1509`), then the same
//! system message and `"ho"`: the match is the system message, `ceil(6000/4) = 1500` tokens,
//! so `cached_tokens = 1024 + 128·⌊476/128⌋ = 1408`.
//!
//! # Streaming (`"stream": true`)
//!
//! Content-Type `text/event-stream`, `Transfer-Encoding: chunked` (close-delimited for
//! HTTP/1.0 clients), one HTTP chunk per SSE event.
//!
//! OpenAI, each event `data: <json>\n\n`, every chunk carrying `id`, `object:
//! "chat.completion.chunk"`, `created`, `model`, `system_fingerprint`:
//! 1. `choices[0].delta = {"role":"assistant","content":""}`;
//! 2. one chunk per word, `delta.content` = the word (words after the first are prefixed by
//!    one space, so the deltas concatenate to the reply text);
//! 3. `choices[0].delta = {}` with `finish_reason` `"stop"` (or `"length"`);
//! 4. only if `stream_options.include_usage` is `true`: `"choices": []` with the usage above
//!    (and, as the real API does, every earlier chunk then carries `"usage": null`);
//! 5. `data: [DONE]\n\n`.
//!
//! Anthropic, each event `event: <type>\ndata: <json>\n\n`: `message_start` (message with
//! empty content, `stop_reason: null`, usage with `input_tokens`, both cache fields and
//! `output_tokens: 1`), `content_block_start` (index 0, empty text block), `ping`, one
//! `content_block_delta` (`text_delta`) per word (same spacing rule), `content_block_stop`,
//! `message_delta` (`stop_reason`, `stop_sequence: null`, `usage: {"output_tokens": O}`),
//! `message_stop`.
//!
//! Responses, each event `event: <type>\ndata: <json>\n\n`, the JSON carrying `type` and
//! `sequence_number` (0, 1, 2, …): `response.created` and `response.in_progress` (the
//! `response` object with `status: "in_progress"`, `output: []`, `usage: null`,
//! `incomplete_details: null`), `response.output_item.added` (`output_index` 0, the message
//! item with `status: "in_progress"` and `content: []`), `response.content_part.added`
//! (`item_id`, `output_index` 0, `content_index` 0, an empty `output_text` part), one
//! `response.output_text.delta` per word (`delta`, same spacing rule, `logprobs: []`),
//! `response.output_text.done` (`text`), `response.content_part.done` (the full part),
//! `response.output_item.done` (the finished item), then `response.completed` — or
//! `response.incomplete` when the cap cut the reply — with the finished `response` object
//! (usage included). There is no `[DONE]`.
//!
//! By default the whole stream is written at once; [`ProviderOptions::stream_delay_ms`] > 0
//! writes the first event immediately and each following event after that pause.
//!
//! # Fault modes (by model name)
//!
//! Checked in this order, the first match wins; the model name must *contain* the token:
//! * `fault-500` → 500 with an error body (OpenAI: `{"error":{"message","type":"server_error",
//!   "param":null,"code":null}}`; Anthropic: `{"type":"error","error":{"type":"api_error",
//!   "message"}}`), also for streamed requests. The connection stays open.
//! * `fault-429` → 429 with header `retry-after: 1` (OpenAI type `"requests"`, code
//!   `"rate_limit_exceeded"`; Anthropic type `"rate_limit_error"`).
//! * `fault-reset` → streamed: the response head and the first two SSE events (OpenAI: role
//!   chunk and first word; Anthropic: `message_start` and `content_block_start`; Responses:
//!   `response.created` and `response.in_progress`) are sent,
//!   then after [`RESET_PAUSE_MS`] the socket is closed with `SO_LINGER` 0 (TCP RST).
//!   Not streamed: RST right after the request is read, nothing is sent.
//! * `fault-slow` → waits [`ProviderOptions::slow_ms`] (default 3000) before sending anything,
//!   then answers normally (streamed or not).
//! * `fault-truncated` → streamed: head plus every event up to and including the last word
//!   delta (no finish chunk/usage/`[DONE]`; no `content_block_stop`/`message_delta`/
//!   `message_stop`; Responses: every event but the final `response.completed`/`.incomplete`),
//!   no terminating zero-length chunk, then a normal close (FIN).
//!   Not streamed: `Content-Length` of the full JSON answer but only its first
//!   `len / 2` bytes, then FIN.
//!
//! Any other model gets a normal answer. The `fault-*` models still require the credential
//! (authentication is checked first) and the body must still be a JSON object. Fault modes
//! apply to the three answering routes (scripted answers included), not to `count_tokens`
//! or the `/v1/responses/{id}` routes.
//!
//! # The Responses API
//!
//! The `response` object (non-streamed body, and the `response` of the stream's events) has
//! exactly these keys: `id`, `object: "response"`, `created_at`, `status` (`"completed"`, or
//! `"incomplete"` when the cap cut the reply), `background` (echoed, default `false`),
//! `error: null`, `incomplete_details` (`{"reason":"max_output_tokens"}` when cut, else
//! `null`), `instructions`, `max_output_tokens`, `max_tool_calls`, `previous_response_id`,
//! `prompt_cache_key`, `safety_identifier`, `user` (each echoed, default `null`), `model`,
//! `output` (one item, below), `parallel_tool_calls` (echoed, default `true`), `reasoning`
//! (echoed, default `{"effort":null,"summary":null}`), `service_tier: "default"`, `store`
//! (`false` only if the request says so), `temperature` and `top_p` (echoed, default `1.0`),
//! `text` (echoed, default `{"format":{"type":"text"}}`), `tool_choice` (echoed, default
//! `"auto"`), `tools` (echoed, default `[]`), `top_logprobs` (echoed, default 0),
//! `truncation` (echoed, default `"disabled"`), `usage`, `metadata` (echoed, default `{}`).
//! The output item of a word reply is `{"type":"message","id":"msg_…","status":"completed"
//! (or "incomplete"),"role":"assistant","content":[{"type":"output_text","text":…,
//! "annotations":[],"logprobs":[]}]}`. JSON objects the mock builds have their keys sorted.
//!
//! **Kept answers.** A normal (or `fault-slow`) answer to a request whose `store` is not
//! `false` is kept under its id with its input items, at most
//! [`ProviderOptions::max_stored_responses`] (default 1000; the oldest go first; an identical
//! request replaces the earlier copy). `GET /v1/responses/{id}` and `POST …/cancel` answer the
//! kept `response` object, `DELETE` forgets it, `GET …/input_items` lists its input items in
//! request order (`?order=desc`: reversed): a string `input` is one user message; an item with
//! a `role` and no `type` gets `type: "message"`; a message's string `content` becomes
//! `[{"type":"input_text","text":…}]` (assistant: `output_text` with `annotations: []`); an
//! item without an `id` gets `msg_<24 hex>` (messages) or `item_<24 hex>` (others), the hex
//! being the first 12 bytes of BLAKE3(response id ‖ item position as u64 little-endian).
//!
//! # Scripted agents
//!
//! Real agent clients can be driven in a closed loop. A request is **scripted** when
//! 1. the text of one of its user turns contains a marker: `tokensaver-mock:loop`,
//!    `tokensaver-mock:clockloop`, `tokensaver-mock:steps=N` or `tokensaver-mock:poll=N` with N ≥
//!    1 (decimal), followed by the end of the text or a
//!    character other than an ASCII letter, digit or `=`. User turns are `messages[]` with
//!    `role: "user"` and, for Responses, a string `input` or `input[]` items with
//!    `role: "user"`; their text is a string `content` or the `text` of each content part
//!    (tool results are not searched). The first marker found, turns in order, counts — so
//!    the marker in the first user turn that carries one governs the whole session (Codex
//!    sends its `<environment_context>` as an earlier user turn of its own); and
//! 2. the request defines a callable tool: chat `{"type":"function","function":{name,
//!    parameters}}`, Responses `{"type":"function",name,parameters}` or `{"type":"local_shell"}`,
//!    Anthropic `{name,input_schema}` (no `type`, or `"custom"`). Server tools, namespaces and
//!    free-form custom tools are not callable.
//!
//! Otherwise the request gets the normal word reply. With `k` = the tool results already in
//! the request (chat `role: "tool"` messages, Anthropic `tool_result` blocks, Responses
//! `function_call_output` / `local_shell_call_output` / `custom_tool_call_output` items):
//! * `steps=N`, `k < N`: one tool call running `CMD = echo tokensaver-step-<k+1>`;
//! * `steps=N`, `k ≥ N`: the final text `tokensaver-done after <k> steps` (no word rules, no
//!   cap; `O` = its 4 words; streamed word by word like a reply);
//! * `loop`: always one tool call running `CMD = echo tokensaver-loop`;
//! * `clockloop`: always one tool call running `CMD = echo tokensaver-loop; date -u
//!   +%Y-%m-%dT%H:%M:%S.%NZ` (its output a different clock reading each time);
//! * `poll=N` (N ≥ 1), `k < N`: one tool call running `CMD = echo tokensaver-poll` (a job
//!   polled: the same step each time); `k ≥ N`: the final text `tokensaver-done after <k>
//!   steps`.
//!
//! **The tool** is the one named `Bash`, else `shell`, else `exec_command`, else the Responses
//! built-in `local_shell`, else the first callable tool; its arguments:
//! * `Bash` (Claude Code): `{"command": CMD, "description": "tokensaver mock step"}`;
//! * `shell`: `{"command": ["bash","-lc",CMD]}` when its schema's `properties.command.type`
//!   is `"array"`, else `{"command": CMD}`;
//! * `exec_command` (Codex CLI): `{"cmd": CMD}`;
//! * `local_shell`: the action `{"type":"exec","command":["bash","-lc",CMD],"env":{},
//!   "timeout_ms":null,"user":null,"working_directory":null}`;
//! * any other: each `required` property whose schema `type` (or first non-`null` type of a
//!   type list) is `"string"` is CMD, `"integer"`/`"number"` is `k + 1`; other required
//!   properties are left out.
//!
//! The arguments JSON is serialised compactly with keys sorted; `O = ceil(chars / 4)`, at
//! least 1 (for `local_shell`, of the action's JSON). Ids use `h = hex(d[12..24])`, so they
//! change from step to step as the history grows:
//! * chat: `message: {"role":"assistant","content":null,"tool_calls":[{"id":"call_h",
//!   "type":"function","function":{"name","arguments"}}],"refusal":null}`, `finish_reason:
//!   "tool_calls"`. Streamed: a first chunk with `delta: {"role":"assistant","content":null,
//!   "tool_calls":[{"index":0,"id","type":"function","function":{"name","arguments":""}}]}`,
//!   one chunk per argument piece `{"tool_calls":[{"index":0,"function":{"arguments":piece}}]}`,
//!   then the finish chunk, usage chunk and `[DONE]` as for text;
//! * Anthropic: content `[{"type":"tool_use","id":"toolu_h","name","input"}]`, `stop_reason:
//!   "tool_use"`. Streamed: `message_start`, `content_block_start` with the `tool_use` block
//!   and `input: {}`, `ping`, one `content_block_delta` `{"type":"input_json_delta",
//!   "partial_json":piece}` per piece, then `content_block_stop`, `message_delta`,
//!   `message_stop`;
//! * Responses: the output item `{"type":"function_call","id":"fc_h","call_id":"call_h",
//!   "name","arguments","status":"completed"}` (`local_shell`: `{"type":"local_shell_call",
//!   "id":"lsh_h","call_id":"call_h","status":"completed","action"}`). Streamed:
//!   `response.created`, `response.in_progress`, `response.output_item.added` (the item with
//!   `status: "in_progress"` and, for a function call, `arguments: ""`), one
//!   `response.function_call_arguments.delta` (`item_id`, `output_index`, `delta`) per piece
//!   and `response.function_call_arguments.done` (`arguments`) — none for `local_shell` —,
//!   `response.output_item.done`, `response.completed`.
//!
//! The argument pieces are consecutive runs of [`ARGUMENT_PIECE_CHARS`] (16) characters of
//! the arguments string (see [`argument_pieces`]).
//!
//! # Task scripts (the economics suite's scripted provider)
//!
//! With [`ProviderOptions::tasks`] (`tokensaver-mock-provider --tasks corpus/economics/tasks`)
//! a user turn may carry `tokensaver-mock:task=<id>,seed=<n>` (checked before the markers
//! above). The named [`TaskScript`] is expanded for the seed ([`TaskScript::plan`]: every
//! `times` / `words` range drawn from BLAKE3 of task, seed and step) and walked against the
//! tool results already in the request, in order ([`Plan::next`]): a plain step advances on
//! any result, an `until` step when its result contains the text (polling), a `while` step
//! when it no longer does (retrying a failing tool), each at most `max` calls. The next
//! command is one call of the tool chosen as above (same arguments); when the plan is done
//! the answer is the script's final text plus the drawn words of prose
//! ([`Scripted::Answer`]; `O` = its words under the default counting). The provider thus
//! reacts to what the client's tools really returned: a closed loop. An unknown task id gets
//! the word reply.
//!
//! # Usage counting
//!
//! [`ProviderOptions::usage`] = [`UsageCounting::Cl100k`] (`--usage cl100k`) replaces the
//! character rule: `P` = cl100k_base tokens (this crate's pinned tokenizer) of the canonical
//! body as text — compact JSON, keys sorted, without `stream` / `stream_options` and the caching
//! parameters (above) — so tool
//! definitions, calls, results and parameters all count; `O` = cl100k_base tokens of the answer
//! text, or of a tool call's name followed by its arguments JSON (at least 1). The `cached`
//! model rule applies to `P` as before. The default stays the character rule.
//!
//! # Authentication
//!
//! Every request's `authorization` and `x-api-key` headers are recorded like all headers. If
//! [`ProviderOptions::expected_credential`] is `Some(k)`, the `/v1/*` routes answer 401
//! (OpenAI code `invalid_api_key`; Anthropic type `authentication_error`) unless
//! `authorization: Bearer k` (scheme case-insensitive), `x-api-key: k` or `api-key: k` (Azure) is present.
//!
//! # Other errors
//!
//! A body that is not a JSON object → 400 `invalid_request_error` (connection kept); so is an
//! Anthropic request whose `cache_control` markers are refused (see "Prompt caching").
//! Protocol errors answer with `connection: close`, then close: a body above
//! [`ProviderOptions::max_body_bytes`] → 413 (refused on its declared length before it is
//! read; chunked, once it grows past the limit) and broken chunked framing → 400, both with an
//! OpenAI-shaped error body; hyper's own answers, with an empty body: malformed HTTP (request
//! line, header, `Content-Length`, a `Transfer-Encoding` other than `chunked`, a version other
//! than HTTP/1.0 or 1.1) → 400, a head above 64 KiB or more than 256 header fields → 431.
//! Such requests are neither counted nor recorded. `Expect: 100-continue` is honoured.
//! `HEAD` gets the head of the answer without its body.
//!
//! # Recording
//!
//! Every well-formed request outside `/__mock/*` (any path, any method, whatever the answer:
//! 401, 404, faults included) is counted per path and recorded as a [`ReceivedRequest`] as
//! soon as its body has been read (so a pending `fault-slow` request is already counted); the last [`ProviderOptions::max_records`] (default 1000) are retained,
//! and older records are also dropped while retained bodies exceed
//! [`ProviderOptions::max_recorded_bytes`] (default 64 MiB). Counters are never capped. A
//! model call's record gets the usage it was answered with ([`ReceivedRequest::usage`]) once
//! the answer is decided: what `reported_usage` shows.
//!
//! # Connections
//!
//! hyper's HTTP/1 server: HTTP/1.1 keep-alive (any number of requests, pipelining works, no
//! idle timeout), HTTP/1.0 (answered in HTTP/1.0; `Connection: keep-alive` honoured, else the
//! answer carries `connection: close`), `Connection: close` honoured (answer carries
//! `connection: close`, then FIN), request bodies by `Content-Length` or `Transfer-Encoding:
//! chunked` (extensions and trailers ignored), case-insensitive header names (recorded
//! lowercased, a repeated name's values together), `TCP_NODELAY` on, one task per connection
//! on the tokio runtime. No `date` header, so answers stay byte-identical.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use serde::Serialize;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::watch;

use server::{accept_loop, bind_listener};

pub mod cache;
mod responses;
mod server;

pub use cache::{
    anthropic_min_tokens, canonical, openai_cached, CacheControlError, Retention, Ttl,
    FIVE_MINUTES_MS, LOOKBACK_BLOCKS, MAX_BREAKPOINTS, ONE_DAY_MS, ONE_HOUR_MS, OPENAI_MIN_TOKENS,
    OPENAI_STEP_TOKENS,
};

use tokensaver_mock_script as script;
pub use tokensaver_mock_script::{
    canonical_digest, canonical_text, Marker, MockToolCall, Plan, ScriptStep, Scripted, Slot,
    TaskScript, WORDS,
};

/// The fixed `created` timestamp of every OpenAI answer.
pub const CREATED: u64 = 1_700_000_000;
/// Tokens added to `ceil(chars / 4)` to give the prompt tokens.
pub const PROMPT_OVERHEAD_TOKENS: u64 = 8;
/// The `system_fingerprint` of every OpenAI answer.
pub const SYSTEM_FINGERPRINT: &str = "fp_tokensaver_mock";
/// Pause between the partial stream and the reset of `fault-reset`.
pub const RESET_PAUSE_MS: u64 = 50;
/// Smallest reply, in words.
pub const MIN_REPLY_WORDS: usize = 3;
/// Largest reply, in words.
pub const MAX_REPLY_WORDS: usize = 8;
/// The header on every answer that says the answer is the built-in provider's (SPEC §6: what
/// was recorded against it is a simulation), and its value.
pub const IDENTITY_HEADER: &str = "x-mock-provider";
pub const IDENTITY: &str = concat!("tokensaver-mock-provider/", env!("CARGO_PKG_VERSION"));

/// Models listed by `GET /v1/models` (any model name is accepted).
pub const MODELS: [&str; 8] = [
    "mock-small",
    "mock-large",
    "mock-cached",
    "fault-500",
    "fault-429",
    "fault-reset",
    "fault-slow",
    "fault-truncated",
];

const INTROSPECT_BODY_CAP: usize = 64 * 1024;
/// Largest piece of a streamed tool-call `arguments` string, in characters.
pub const ARGUMENT_PIECE_CHARS: usize = 16;

// ---------------------------------------------------------------------------------------------
// Options and records
// ---------------------------------------------------------------------------------------------

/// How a [`MockProvider`] behaves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProviderOptions {
    /// Delay of the `fault-slow` model, in milliseconds (default 3000).
    pub slow_ms: u64,
    /// If set, `/v1/*` answers 401 unless `Authorization: Bearer <it>` or `x-api-key: <it>`.
    pub expected_credential: Option<String>,
    /// Pause between SSE events in milliseconds; 0 (default) writes a stream in one go.
    pub stream_delay_ms: u64,
    /// Request records retained in memory (default 1000); counters are never capped.
    pub max_records: usize,
    /// Total body bytes retained over all records (default 64 MiB); oldest records go first.
    pub max_recorded_bytes: usize,
    /// Largest accepted request body (default 64 MiB); bigger → 413.
    pub max_body_bytes: usize,
    /// Responses API answers kept for `GET /v1/responses/{id}` (default 1000); the oldest go
    /// first.
    pub max_stored_responses: usize,
    /// How usage is counted (default [`UsageCounting::Chars`], the rule in the module docs).
    pub usage: UsageCounting,
    /// Task scripts by task id, for `tokensaver-mock:task=<id>,seed=<n>` markers (default
    /// none; see "Task scripts" in the module docs).
    pub tasks: Arc<BTreeMap<String, TaskScript>>,
    /// Prompt caching billed as the providers do (default `true`; see "Prompt caching" in the
    /// module docs). `false` (`--no-prompt-cache`) restores the earlier behaviour: no cache
    /// but the fixed rule of the `cached` models.
    pub prompt_cache: bool,
    /// Cache entries kept over all partitions (default 200 000); past it the soonest to
    /// expire are dropped, down to 90 % of it.
    pub max_cache_entries: usize,
    /// The prompt cache's clock runs this many times faster than the request's (default 1):
    /// every lifetime (5 minutes, 1 hour, 24 hours, OpenAI's in-memory eviction) and OpenAI's
    /// routing rate window are divided by it, as `[gate.windows]` divides the gate's, so a
    /// time-compressed recording exercises expiry (`--time-scale N`).
    pub time_scale: u64,
}

/// The task scripts of every `<dir>/<id>/task.json` (its `script` field; the other fields are
/// the economics harness's), by directory name.
pub fn load_task_scripts(
    dir: &std::path::Path,
) -> Result<BTreeMap<String, TaskScript>, OptionsError> {
    let mut out = BTreeMap::new();
    let unreadable = |path: &std::path::Path| {
        let path = path.to_path_buf();
        move |source| OptionsError::Unreadable { path, source }
    };
    let entries = std::fs::read_dir(dir).map_err(unreadable(dir))?;
    for entry in entries.filter_map(Result::ok) {
        let path = entry.path().join("task.json");
        if !path.is_file() {
            continue;
        }
        let bytes = std::fs::read(&path).map_err(unreadable(&path))?;
        let invalid = |source| OptionsError::Invalid {
            path: path.clone(),
            source,
        };
        let v: Value = serde_json::from_slice(&bytes).map_err(invalid)?;
        let script: TaskScript = serde_json::from_value(
            v.get("script").cloned().unwrap_or(Value::Null),
        )
        .map_err(|source| OptionsError::InvalidScript {
            path: path.clone(),
            source,
        })?;
        out.insert(entry.file_name().to_string_lossy().into_owned(), script);
    }
    Ok(out)
}

/// Why the mock's options could not be made (its binary's flags, its task scripts).
#[derive(Debug, thiserror::Error)]
pub enum OptionsError {
    #[error("--usage {0}: expected chars or cl100k")]
    UnknownUsage(String),
    #[error("{}: {source}", path.display())]
    Unreadable {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("{}: {source}", path.display())]
    Invalid {
        path: std::path::PathBuf,
        source: serde_json::Error,
    },
    #[error("{}: script: {source}", path.display())]
    InvalidScript {
        path: std::path::PathBuf,
        source: serde_json::Error,
    },
}

/// How the mock counts the usage it reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum UsageCounting {
    /// `P = ceil(prompt chars / 4) + 8` over message text only; `O` = words (module docs).
    #[default]
    Chars,
    /// cl100k_base tokens: `P` over the whole canonical request body (system, messages, tool
    /// definitions, tool calls and results, every parameter), `O` over the answer's text, or
    /// the tool call's name and arguments.
    Cl100k,
}

impl ProviderOptions {
    /// The default options with usage counting `usage` (`chars` or `cl100k`) and the task
    /// scripts under `tasks` (the `tokensaver-mock-provider` binary's flags).
    pub fn scripted(usage: &str, tasks: Option<&std::path::Path>) -> Result<Self, OptionsError> {
        let usage = match usage {
            "chars" => UsageCounting::Chars,
            "cl100k" => UsageCounting::Cl100k,
            other => return Err(OptionsError::UnknownUsage(other.to_string())),
        };
        let tasks = match tasks {
            Some(dir) => load_task_scripts(dir)?,
            None => BTreeMap::new(),
        };
        Ok(ProviderOptions {
            usage,
            tasks: Arc::new(tasks),
            ..Default::default()
        })
    }
}

impl Default for ProviderOptions {
    fn default() -> Self {
        ProviderOptions {
            slow_ms: 3000,
            expected_credential: None,
            stream_delay_ms: 0,
            max_records: 1000,
            max_recorded_bytes: 64 * 1024 * 1024,
            max_body_bytes: 64 * 1024 * 1024,
            max_stored_responses: 1000,
            usage: UsageCounting::Chars,
            tasks: Arc::new(BTreeMap::new()),
            prompt_cache: true,
            max_cache_entries: cache::DEFAULT_MAX_ENTRIES,
            time_scale: 1,
        }
    }
}

/// One request as the mock received it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReceivedRequest {
    /// Position among all requests since start (never reset).
    pub seq: u64,
    /// Request method, as sent.
    pub method: String,
    /// Path without the query string.
    pub path: String,
    /// The raw request target (path and query).
    pub target: String,
    /// Headers in arrival order (a repeated name's values together), names lowercased, values
    /// trimmed.
    pub headers: Vec<(String, String)>,
    /// The (de-chunked) body; cut to `max_recorded_bytes` if larger.
    pub body: Bytes,
    /// Full length of the body as received.
    pub body_len: usize,
    /// When the request was fully read.
    pub at: SystemTime,
    /// For a model call the mock answered (a normal answer, `fault-slow`, `fault-reset`,
    /// `fault-truncated`), the usage it answered with, cache figures included; `None` until
    /// then, and for every other request.
    pub usage: Option<MockUsage>,
}

impl ReceivedRequest {
    /// First value of the header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The body parsed as JSON, if it is JSON (and was retained whole).
    pub fn body_json(&self) -> Option<Value> {
        serde_json::from_slice(&self.body).ok()
    }

    /// The body as (lossy) UTF-8.
    pub fn body_text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

#[derive(Default)]
struct Recorder {
    seq: u64,
    counts: HashMap<String, usize>,
    records: VecDeque<ReceivedRequest>,
    retained: usize,
}

struct Shared {
    opts: ProviderOptions,
    rec: Mutex<Recorder>,
    stored: Mutex<responses::Store>,
    cache: Mutex<cache::PromptCache>,
    /// The clock set by `POST /__mock/clock` (Unix ms); `None`: the real clock.
    clock: Mutex<Option<u64>>,
}

/// The header a test sets to give one request its own clock (Unix milliseconds).
pub const NOW_HEADER: &str = "x-mock-now-ms";

impl Shared {
    fn new(opts: ProviderOptions) -> Shared {
        let cap = opts.max_cache_entries;
        Shared {
            opts,
            rec: Mutex::new(Recorder::default()),
            stored: Mutex::new(responses::Store::default()),
            cache: Mutex::new(cache::PromptCache::new(cap)),
            clock: Mutex::new(None),
        }
    }

    fn cache(&self) -> MutexGuard<'_, cache::PromptCache> {
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn fixed_clock(&self) -> MutexGuard<'_, Option<u64>> {
        self.clock.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The clock's reading: the fixed clock if one is set, else the real one (Unix ms).
    fn clock_ms(&self) -> u64 {
        (*self.fixed_clock()).unwrap_or_else(real_now_ms)
    }

    /// A request's clock: its `x-mock-now-ms` header (a decimal integer), else
    /// [`Shared::clock_ms`].
    fn now_ms(&self, headers: &[(String, String)]) -> u64 {
        headers
            .iter()
            .find(|(n, _)| n == NOW_HEADER)
            .and_then(|(_, v)| v.trim().parse::<u64>().ok())
            .unwrap_or_else(|| self.clock_ms())
    }

    /// Sets the usage a recorded request was answered with.
    fn set_usage(&self, seq: u64, usage: MockUsage) {
        let mut r = self.lock();
        if let Some(rec) = r.records.iter_mut().rev().find(|rec| rec.seq == seq) {
            rec.usage = Some(usage);
        }
    }

    fn lock(&self) -> MutexGuard<'_, Recorder> {
        self.rec.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn store(&self) -> MutexGuard<'_, responses::Store> {
        self.stored.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn record(
        &self,
        method: String,
        path: &str,
        target: String,
        headers: Vec<(String, String)>,
        body: &Bytes,
    ) -> u64 {
        let body_len = body.len();
        let kept = if body_len > self.opts.max_recorded_bytes {
            body.slice(..self.opts.max_recorded_bytes)
        } else {
            body.clone()
        };
        let at = SystemTime::now();
        let max_records = self.opts.max_records;
        let max_bytes = self.opts.max_recorded_bytes;
        let mut r = self.lock();
        r.seq += 1;
        let seq = r.seq;
        if let Some(c) = r.counts.get_mut(path) {
            *c += 1;
        } else {
            r.counts.insert(path.to_owned(), 1);
        }
        if max_records == 0 {
            return seq;
        }
        while r.records.len() >= max_records
            || (!r.records.is_empty() && r.retained + kept.len() > max_bytes)
        {
            match r.records.pop_front() {
                Some(old) => r.retained -= old.body.len(),
                None => break,
            }
        }
        r.retained += kept.len();
        r.records.push_back(ReceivedRequest {
            seq,
            method,
            path: path.to_owned(),
            target,
            headers,
            body: kept,
            body_len,
            at,
            usage: None,
        });
        seq
    }

    fn counts(&self) -> BTreeMap<String, usize> {
        self.lock()
            .counts
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect()
    }

    fn reset(&self) {
        let mut r = self.lock();
        r.counts.clear();
        r.records.clear();
        r.retained = 0;
        drop(r);
        self.store().clear();
        self.cache().clear();
    }
}

fn real_now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

// ---------------------------------------------------------------------------------------------
// The server handle
// ---------------------------------------------------------------------------------------------

/// A running mock provider. Dropping it stops the server (and, for
/// [`MockProvider::start_background`], joins its thread).
pub struct MockProvider {
    addr: SocketAddr,
    shared: Arc<Shared>,
    shutdown: watch::Sender<bool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for MockProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MockProvider")
            .field("addr", &self.addr)
            .field("opts", &self.shared.opts)
            .finish()
    }
}

impl MockProvider {
    /// Binds `addr` (port 0 → a free port) and serves on the current tokio runtime.
    ///
    /// Do not drive it with a blocking client from the same current-thread runtime; use
    /// [`MockProvider::start_background`] for synchronous tests.
    pub async fn start(addr: SocketAddr, opts: ProviderOptions) -> io::Result<MockProvider> {
        let listener = bind_listener(addr)?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared::new(opts));
        let (tx, rx) = watch::channel(false);
        tokio::spawn(accept_loop(listener, Arc::clone(&shared), rx));
        Ok(MockProvider {
            addr,
            shared,
            shutdown: tx,
            thread: None,
        })
    }

    /// Starts on `127.0.0.1:0` on its own 2-worker tokio runtime in a new thread. Usable from
    /// synchronous and asynchronous code alike.
    pub fn start_background(opts: ProviderOptions) -> io::Result<MockProvider> {
        Self::start_background_on(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0), opts)
    }

    /// [`MockProvider::start_background`] on a chosen address.
    pub fn start_background_on(
        addr: SocketAddr,
        opts: ProviderOptions,
    ) -> io::Result<MockProvider> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("mock-provider")
            .enable_all()
            .build()?;
        let bound = {
            let _guard = rt.enter();
            bind_listener(addr).and_then(|l| l.local_addr().map(|a| (l, a)))
        };
        let (listener, addr) = match bound {
            Ok(v) => v,
            Err(e) => {
                rt.shutdown_background();
                return Err(e);
            }
        };
        let shared = Arc::new(Shared::new(opts));
        let (tx, rx) = watch::channel(false);
        let task_shared = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("mock-provider".into())
            .spawn(move || {
                rt.block_on(accept_loop(listener, task_shared, rx));
                rt.shutdown_timeout(Duration::from_millis(200));
            })?;
        Ok(MockProvider {
            addr,
            shared,
            shutdown: tx,
            thread: Some(thread),
        })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://IP:PORT` (an unspecified bind address is given as the loopback address).
    pub fn base_url(&self) -> String {
        let ip = match self.addr.ip() {
            IpAddr::V4(v4) if v4.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(v6) if v6.is_unspecified() => IpAddr::V6(std::net::Ipv6Addr::LOCALHOST),
            ip => ip,
        };
        format!("http://{}", SocketAddr::new(ip, self.addr.port()))
    }

    /// The options in force.
    pub fn options(&self) -> &ProviderOptions {
        &self.shared.opts
    }

    /// Requests (any method) received on `path` since the last reset.
    pub fn calls(&self, path: &str) -> usize {
        self.shared.lock().counts.get(path).copied().unwrap_or(0)
    }

    /// Requests received per path since the last reset.
    pub fn call_counts(&self) -> BTreeMap<String, usize> {
        self.shared.counts()
    }

    /// All requests received since the last reset, on every path.
    pub fn total_calls(&self) -> usize {
        self.shared.lock().counts.values().sum()
    }

    /// The retained records, oldest first.
    pub fn requests(&self) -> Vec<ReceivedRequest> {
        self.shared.lock().records.iter().cloned().collect()
    }

    /// The retained records of one path, oldest first.
    pub fn requests_to(&self, path: &str) -> Vec<ReceivedRequest> {
        self.shared
            .lock()
            .records
            .iter()
            .filter(|r| r.path == path)
            .cloned()
            .collect()
    }

    /// The most recent record.
    pub fn last_request(&self) -> Option<ReceivedRequest> {
        self.shared.lock().records.back().cloned()
    }

    /// The Responses API answer kept under `id` (see the module docs), if any.
    pub fn stored_response(&self, id: &str) -> Option<Value> {
        self.shared.store().get(id).map(|r| r.response.clone())
    }

    /// Forgets counters, records, kept Responses API answers and prompt-cache entries (the
    /// clock stays as set).
    pub fn reset(&self) {
        self.shared.reset();
    }

    /// Sets the clock the prompt cache reads when a request has no `x-mock-now-ms` header:
    /// `Some(unix_ms)` fixes it, `None` returns to the real clock.
    pub fn set_clock_ms(&self, now: Option<u64>) {
        *self.shared.fixed_clock() = now;
    }

    /// Moves the clock `ms` forward from its current reading (the clock is then fixed);
    /// returns the new reading.
    pub fn advance_clock_ms(&self, ms: u64) -> u64 {
        let mut clock = self.shared.fixed_clock();
        let now = clock.unwrap_or_else(real_now_ms).saturating_add(ms);
        *clock = Some(now);
        now
    }

    /// The clock's reading (Unix ms): the fixed clock, else the real one.
    pub fn clock_ms(&self) -> u64 {
        self.shared.clock_ms()
    }

    /// Drops every prompt-cache entry (every credential, model and key); returns how many
    /// there were.
    pub fn reset_prompt_cache(&self) -> usize {
        self.shared.cache().clear()
    }

    /// Prompt-cache entries held (expired ones are dropped lazily).
    pub fn prompt_cache_entries(&self) -> usize {
        self.shared.cache().len()
    }

    /// Stops the server (same as dropping it).
    pub fn shutdown(self) {}
}

impl Drop for MockProvider {
    fn drop(&mut self) {
        self.shutdown.send_replace(true);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Binds `addr` (with `SO_REUSEADDR`, backlog 1024) for [`serve_listener`]; call it inside a
/// tokio runtime.
pub fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    bind_listener(addr)
}

/// Binds `addr` and serves until the process ends.
pub async fn serve_forever(addr: SocketAddr, opts: ProviderOptions) -> io::Result<()> {
    let listener = bind_listener(addr)?;
    serve_listener(listener, opts).await
}

/// Serves on an already bound listener until the process ends (lets the caller print the
/// port of a `:0` bind before serving).
pub async fn serve_listener(listener: TcpListener, opts: ProviderOptions) -> io::Result<()> {
    let local = listener.local_addr()?;
    tracing::info!(%local, "mock provider listening");
    let (_keep, rx) = watch::channel(false);
    accept_loop(listener, Arc::new(Shared::new(opts)), rx).await;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// What the server sends
// ---------------------------------------------------------------------------------------------

/// One request as the server hands it to [`handle`].
struct RequestHead {
    method: String,
    /// The request target as sent (origin-form path and query, or absolute-form).
    target: String,
    /// Names lowercased, in arrival order.
    headers: Vec<(String, String)>,
}

/// What to send back for one request.
enum Reply {
    Full {
        status: u16,
        headers: Vec<(&'static str, String)>,
        body: Vec<u8>,
    },
    Sse(Vec<String>),
    ResetNow,
    ResetAfter(Vec<String>),
    TruncatedFull(Vec<u8>),
    TruncatedSse(Vec<String>),
}

struct Outcome {
    delay: Option<Duration>,
    reply: Reply,
}

impl From<Reply> for Outcome {
    fn from(reply: Reply) -> Self {
        Outcome { delay: None, reply }
    }
}

// ---------------------------------------------------------------------------------------------
// Routing
// ---------------------------------------------------------------------------------------------

/// Which API's error and answer shapes apply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Flavor {
    OpenAi,
    Anthropic,
}

/// The wire format of a model request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    /// OpenAI chat completions (`POST /v1/chat/completions`).
    ChatCompletions,
    /// Anthropic messages (`POST /v1/messages`).
    Messages,
    /// OpenAI Responses (`POST /v1/responses`).
    Responses,
}

impl Api {
    fn flavor(self) -> Flavor {
        match self {
            Api::Messages => Flavor::Anthropic,
            Api::ChatCompletions | Api::Responses => Flavor::OpenAi,
        }
    }
}

/// An operation on a kept Responses API answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum StoredOp {
    Get,
    Delete,
    InputItems,
    Cancel,
}

enum Route {
    Answer(Api),
    CountTokens,
    Stored(StoredOp, String),
    Models,
    WrongMethod(Flavor, &'static str),
    NotFound,
}

fn route(method: &str, path: &str) -> Route {
    match (path, method) {
        ("/v1/chat/completions", "POST") => Route::Answer(Api::ChatCompletions),
        ("/v1/messages", "POST") => Route::Answer(Api::Messages),
        ("/v1/responses", "POST") => Route::Answer(Api::Responses),
        ("/v1/messages/count_tokens", "POST") => Route::CountTokens,
        ("/v1/models", "GET") => Route::Models,
        ("/v1/chat/completions" | "/v1/responses", _) => Route::WrongMethod(Flavor::OpenAi, "POST"),
        ("/v1/messages" | "/v1/messages/count_tokens", _) => {
            Route::WrongMethod(Flavor::Anthropic, "POST")
        }
        ("/v1/models", _) => Route::WrongMethod(Flavor::OpenAi, "GET"),
        _ => stored_route(method, path),
    }
}

/// `/v1/responses/{id}`, `/v1/responses/{id}/input_items`, `/v1/responses/{id}/cancel`.
fn stored_route(method: &str, path: &str) -> Route {
    let Some(rest) = path.strip_prefix("/v1/responses/") else {
        return Route::NotFound;
    };
    let (id, tail) = match rest.split_once('/') {
        Some((id, tail)) => (id, Some(tail)),
        None => (rest, None),
    };
    if id.is_empty() {
        return Route::NotFound;
    }
    let op = |op| Route::Stored(op, id.to_owned());
    match (tail, method) {
        (None, "GET") => op(StoredOp::Get),
        (None, "DELETE") => op(StoredOp::Delete),
        (None, _) => Route::WrongMethod(Flavor::OpenAi, "GET, DELETE"),
        (Some("input_items"), "GET") => op(StoredOp::InputItems),
        (Some("input_items"), _) => Route::WrongMethod(Flavor::OpenAi, "GET"),
        (Some("cancel"), "POST") => op(StoredOp::Cancel),
        (Some("cancel"), _) => Route::WrongMethod(Flavor::OpenAi, "POST"),
        _ => Route::NotFound,
    }
}

/// The OpenAI API is also served under the base paths OpenAI-compatible providers use, so a
/// gate's named upstreams can be tested against one mock: `/openai/v1/…` (Groq, Azure's v1
/// API), `/api/v1/…` (OpenRouter), and Azure OpenAI's `/openai/deployments/{name}/chat/
/// completions`, `/openai/responses` and `/openai/models` (each with its `?api-version=`).
/// Records and counters show the request under `/v1/…`; `target` keeps what was sent.
fn provider_path(path: &str) -> String {
    for base in ["/openai/v1/", "/api/v1/"] {
        if let Some(rest) = path.strip_prefix(base) {
            return format!("/v1/{rest}");
        }
    }
    if let Some(rest) = path.strip_prefix("/openai/deployments/") {
        if rest
            .split_once('/')
            .is_some_and(|(name, tail)| !name.is_empty() && tail == "chat/completions")
        {
            return "/v1/chat/completions".to_string();
        }
    }
    match path {
        "/openai/responses" => "/v1/responses".to_string(),
        "/openai/models" => "/v1/models".to_string(),
        _ => path.to_string(),
    }
}

/// Splits a request target into its path (origin-form; absolute-form is reduced) and query.
fn split_target(target: &str) -> (&str, Option<&str>) {
    let mut t = target;
    for scheme in ["http://", "https://"] {
        if let Some(rest) = t.strip_prefix(scheme) {
            t = rest.find('/').map_or("/", |i| &rest[i..]);
        }
    }
    match t.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (t, None),
    }
}

/// What a model call's prompt cache depends on besides its body.
struct CallContext {
    /// The call's record.
    seq: u64,
    /// The credential it carried (see [`request_credential`]).
    credential: String,
    /// Its clock (Unix ms).
    now_ms: u64,
}

/// The credential a request carries, whose prompt cache it uses: Anthropic routes take
/// `x-api-key`, else the `Authorization: Bearer` token; OpenAI routes the reverse; `""` when
/// it carries neither.
fn request_credential(headers: &[(String, String)], flavor: Flavor) -> String {
    let api_key = || {
        headers
            .iter()
            .find(|(n, _)| n == "x-api-key" || n == "api-key")
            .map(|(_, v)| v.clone())
    };
    let bearer = || {
        headers.iter().find_map(|(n, v)| {
            (n == "authorization")
                .then(|| v.split_once(' '))
                .flatten()
                .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
                .map(|(_, cred)| cred.trim().to_owned())
        })
    };
    match flavor {
        Flavor::Anthropic => api_key().or_else(bearer),
        Flavor::OpenAi => bearer().or_else(api_key),
    }
    .unwrap_or_default()
}

fn credential_ok(headers: &[(String, String)], expected: &str) -> bool {
    headers.iter().any(|(n, v)| match n.as_str() {
        // `api-key`: Azure OpenAI's header.
        "x-api-key" | "api-key" => v == expected,
        "authorization" => v.split_once(' ').is_some_and(|(scheme, cred)| {
            scheme.eq_ignore_ascii_case("bearer") && cred.trim() == expected
        }),
        _ => false,
    })
}

fn json_reply(status: u16, value: &Value) -> Reply {
    Reply::Full {
        status,
        headers: Vec::new(),
        body: serde_json::to_vec(value).unwrap_or_default(),
    }
}

fn error_reply(flavor: Flavor, status: u16, message: &str) -> Reply {
    let mut headers = Vec::new();
    if status == 429 {
        headers.push(("retry-after", "1".to_owned()));
    }
    Reply::Full {
        status,
        headers,
        body: error_body(flavor, status, message),
    }
}

fn error_body(flavor: Flavor, status: u16, message: &str) -> Vec<u8> {
    let v = match flavor {
        Flavor::OpenAi => {
            let (kind, code) = match status {
                401 => ("invalid_request_error", Some("invalid_api_key")),
                404 => ("invalid_request_error", Some("unknown_url")),
                405 => ("invalid_request_error", Some("method_not_allowed")),
                429 => ("requests", Some("rate_limit_exceeded")),
                s if s >= 500 => ("server_error", None),
                _ => ("invalid_request_error", None),
            };
            json!({"error": {"message": message, "type": kind, "param": null, "code": code}})
        }
        Flavor::Anthropic => {
            let kind = match status {
                401 => "authentication_error",
                404 => "not_found_error",
                413 => "request_too_large",
                429 => "rate_limit_error",
                s if s >= 500 => "api_error",
                _ => "invalid_request_error",
            };
            json!({"type": "error", "error": {"type": kind, "message": message}})
        }
    };
    serde_json::to_vec(&v).unwrap_or_default()
}

fn handle(shared: &Shared, head: RequestHead, body: Bytes) -> Outcome {
    let RequestHead {
        method,
        target,
        headers,
        ..
    } = head;
    let (path, query) = split_target(&target);
    if path.starts_with("/__mock/") {
        return introspect(shared, &method, path, query, &body).into();
    }
    let path = provider_path(path);
    let path = path.as_str();
    let route = route(&method, path);
    let auth_ok = shared
        .opts
        .expected_credential
        .as_deref()
        .is_none_or(|k| credential_ok(&headers, k));
    let path = path.to_owned();
    let query = query.map(str::to_owned);
    let flavor = match route {
        Route::Answer(api) => api.flavor(),
        _ => Flavor::OpenAi,
    };
    let credential = request_credential(&headers, flavor);
    let now_ms = shared.now_ms(&headers);
    let seq = shared.record(method, &path, target, headers, &body);
    let ctx = CallContext {
        seq,
        credential,
        now_ms,
    };
    match route {
        Route::NotFound => {
            error_reply(Flavor::OpenAi, 404, &format!("Unknown request URL: {path}")).into()
        }
        Route::WrongMethod(flavor, allow) => {
            let mut r = error_reply(
                flavor,
                405,
                &format!("method not allowed on {path}; use {allow}"),
            );
            if let Reply::Full { headers, .. } = &mut r {
                headers.push(("allow", allow.to_owned()));
            }
            r.into()
        }
        Route::Answer(api) if !auth_ok => unauthorized(api.flavor()).into(),
        Route::CountTokens if !auth_ok => unauthorized(Flavor::Anthropic).into(),
        Route::Models | Route::Stored(..) if !auth_ok => unauthorized(Flavor::OpenAi).into(),
        Route::Models => json_reply(200, &models_json()).into(),
        Route::Answer(api) => answer(shared, api, &body, &ctx),
        Route::CountTokens => count_tokens(&body, &shared.opts).into(),
        Route::Stored(op, id) => stored_op(shared, op, &id, query.as_deref()).into(),
    }
}

fn unauthorized(flavor: Flavor) -> Reply {
    match flavor {
        Flavor::OpenAi => error_reply(Flavor::OpenAi, 401, "Incorrect API key provided."),
        Flavor::Anthropic => error_reply(Flavor::Anthropic, 401, "invalid x-api-key"),
    }
}

/// The request body as a JSON object, or the 400 answer.
fn json_object(flavor: Flavor, body: &[u8]) -> Result<Value, Reply> {
    match serde_json::from_slice(body) {
        Ok(v @ Value::Object(_)) => Ok(v),
        Ok(_) => Err(error_reply(
            flavor,
            400,
            "request body must be a JSON object",
        )),
        Err(e) => Err(error_reply(
            flavor,
            400,
            &format!("request body is not valid JSON: {e}"),
        )),
    }
}

fn count_tokens(body: &[u8], opts: &ProviderOptions) -> Reply {
    match json_object(Flavor::Anthropic, body) {
        Ok(value) => json_reply(
            200,
            &json!({"input_tokens": MockReply::for_api_with(Api::Messages, &value, opts).usage.prompt_tokens}),
        ),
        Err(r) => r,
    }
}

fn stored_op(shared: &Shared, op: StoredOp, id: &str, query: Option<&str>) -> Reply {
    let mut store = shared.store();
    let found = match op {
        StoredOp::Delete => store
            .remove(id)
            .then(|| json!({"id": id, "object": "response", "deleted": true})),
        StoredOp::Get | StoredOp::Cancel => store.get(id).map(|r| r.response.clone()),
        StoredOp::InputItems => store.get(id).map(|r| {
            let desc = form_urlencoded::parse(query.unwrap_or("").as_bytes())
                .any(|(k, v)| k == "order" && v == "desc");
            let mut data = r.input_items.clone();
            if desc {
                data.reverse();
            }
            let first = data.first().and_then(|i| i.get("id")).cloned();
            let last = data.last().and_then(|i| i.get("id")).cloned();
            json!({"object": "list", "data": data, "first_id": first, "last_id": last, "has_more": false})
        }),
    };
    drop(store);
    match found {
        Some(v) => json_reply(200, &v),
        None => json_reply(
            404,
            &json!({"error": {
                "message": format!("Response with id '{id}' not found."),
                "type": "invalid_request_error",
                "param": null,
                "code": null,
            }}),
        ),
    }
}

fn models_json() -> Value {
    let data: Vec<Value> = MODELS
        .iter()
        .map(|m| json!({"id": m, "object": "model", "created": CREATED, "owned_by": "tokensaver-mock"}))
        .collect();
    json!({"object": "list", "data": data})
}

fn answer(shared: &Shared, api: Api, body: &[u8], ctx: &CallContext) -> Outcome {
    let flavor = api.flavor();
    let value = match json_object(flavor, body) {
        Ok(v) => v,
        Err(r) => return r.into(),
    };
    let mut reply = MockReply::build(
        api,
        &value,
        Some(&shared.opts.tasks),
        shared.opts.usage,
        false,
    );
    // The prompt's layout is worked out (tokens counted) outside the cache's lock; refused
    // markers are answered before any fault mode.
    let layout = if shared.opts.prompt_cache {
        match reply.cache_layout(api, &value) {
            Ok(layout) => Some(layout),
            Err(e) => return error_reply(flavor, 400, &e.message()).into(),
        }
    } else {
        None
    };
    let model = value.get("model").and_then(Value::as_str).unwrap_or("");
    let fault = Fault::for_model(model);
    match fault {
        Some(Fault::Status500) => {
            return error_reply(
                flavor,
                500,
                "The server had an error while processing your request. (mock fault-500)",
            )
            .into()
        }
        Some(Fault::Status429) => {
            return error_reply(flavor, 429, "Rate limit reached. (mock fault-429)").into()
        }
        _ => {}
    }
    let stream = value.get("stream") == Some(&Value::Bool(true));
    let include_usage = value
        .get("stream_options")
        .and_then(|o| o.get("include_usage"))
        == Some(&Value::Bool(true));
    if let Some(layout) = &layout {
        let mut cache = shared.cache();
        let cache_now = ctx.now_ms.saturating_mul(shared.opts.time_scale.max(1));
        reply.bill_cache(layout, &value, &mut cache, &ctx.credential, cache_now);
    }
    shared.set_usage(ctx.seq, reply.usage);
    let full = |reply: &MockReply| match api {
        Api::ChatCompletions => reply.openai_json(),
        Api::Messages => reply.anthropic_json(),
        Api::Responses => reply.responses_json(&value),
    };
    let events = |reply: &MockReply| match api {
        Api::ChatCompletions => reply.openai_sse_events(include_usage),
        Api::Messages => reply.anthropic_sse_events(),
        Api::Responses => reply.responses_sse_events(&value),
    };
    match (fault, stream) {
        (Some(Fault::Reset), false) => Reply::ResetNow.into(),
        (Some(Fault::Reset), true) => {
            let mut ev = events(&reply);
            ev.truncate(2);
            Reply::ResetAfter(ev).into()
        }
        (Some(Fault::Truncated), false) => Reply::TruncatedFull(full(&reply)).into(),
        (Some(Fault::Truncated), true) => {
            let mut ev = events(&reply);
            let keep = match api {
                Api::ChatCompletions => 1 + reply.content_delta_count(),
                Api::Messages => 3 + reply.content_delta_count(),
                Api::Responses => ev.len().saturating_sub(1),
            };
            ev.truncate(keep);
            Reply::TruncatedSse(ev).into()
        }
        (slow, stream) => {
            if api == Api::Responses && responses::stored(&value) {
                let id = reply.response_id();
                let kept = responses::StoredResponse {
                    response: reply.responses_value(&value),
                    input_items: responses::input_items(&value, &id),
                };
                shared
                    .store()
                    .insert(id, kept, shared.opts.max_stored_responses);
            }
            let reply = if stream {
                Reply::Sse(events(&reply))
            } else {
                Reply::Full {
                    status: 200,
                    headers: Vec::new(),
                    body: full(&reply),
                }
            };
            Outcome {
                delay: (slow == Some(Fault::Slow))
                    .then(|| Duration::from_millis(shared.opts.slow_ms)),
                reply,
            }
        }
    }
}

/// The usage the mock reported for a recorded model call (as answered, prompt cache
/// included; for a call it did not answer with usage, as it would answer it on an empty
/// cache), so a test can check a ledger against what the provider said without restating
/// the rules.
fn reported_usage(rec: &ReceivedRequest, opts: &ProviderOptions) -> Value {
    let api = match (rec.method.as_str(), rec.path.as_str()) {
        ("POST", "/v1/chat/completions") => Api::ChatCompletions,
        ("POST", "/v1/messages") => Api::Messages,
        ("POST", "/v1/responses") => Api::Responses,
        _ => return Value::Null,
    };
    let u = match (rec.usage, serde_json::from_slice::<Value>(&rec.body)) {
        (Some(u), _) => u,
        (None, Ok(body @ Value::Object(_))) if rec.body.len() == rec.body_len => {
            MockReply::for_api_with(api, &body, opts).usage
        }
        _ => return Value::Null,
    };
    json!({
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "cached_tokens": u.cached_tokens,
        "input_tokens": u.input_tokens,
        "cache_read_input_tokens": u.cache_read_input_tokens,
        "cache_creation_input_tokens": u.cache_creation_input_tokens,
        "cache_creation": u.cache_creation_json(),
        "cache_write_tokens": u.openai_cache_write_tokens,
    })
}

fn clock_json(shared: &Shared) -> Value {
    json!({"now_ms": shared.clock_ms(), "fixed": shared.fixed_clock().is_some()})
}

/// `POST /__mock/clock`: `{"now_ms": N}` fixes the clock at N, `{"now_ms": null}` returns to
/// the real clock, `{"advance_ms": N}` moves it N forward from its reading (then fixed); both
/// keys may be given (set, then advance).
fn set_clock(shared: &Shared, body: &[u8]) -> Reply {
    let v: Value = match serde_json::from_slice(body) {
        Ok(v @ Value::Object(_)) => v,
        _ => return error_reply(Flavor::OpenAi, 400, "expected a JSON object"),
    };
    let now = match v.get("now_ms") {
        None => None,
        Some(Value::Null) => Some(None),
        Some(n) => match n.as_u64() {
            Some(n) => Some(Some(n)),
            None => return error_reply(Flavor::OpenAi, 400, "now_ms: expected an integer or null"),
        },
    };
    let advance = match v.get("advance_ms") {
        None => None,
        Some(n) => match n.as_u64() {
            Some(n) => Some(n),
            None => return error_reply(Flavor::OpenAi, 400, "advance_ms: expected an integer"),
        },
    };
    if now.is_none() && advance.is_none() {
        return error_reply(Flavor::OpenAi, 400, "expected now_ms or advance_ms");
    }
    let mut clock = shared.fixed_clock();
    if let Some(now) = now {
        *clock = now;
    }
    if let Some(ms) = advance {
        *clock = Some(clock.unwrap_or_else(real_now_ms).saturating_add(ms));
    }
    drop(clock);
    json_reply(200, &clock_json(shared))
}

fn introspect(
    shared: &Shared,
    method: &str,
    path: &str,
    query: Option<&str>,
    body: &[u8],
) -> Reply {
    match (path, method) {
        ("/__mock/clock", "GET") => json_reply(200, &clock_json(shared)),
        ("/__mock/clock", "POST") => set_clock(shared, body),
        ("/__mock/cache", "GET") => json_reply(
            200,
            &json!({"enabled": shared.opts.prompt_cache, "entries": shared.cache().len()}),
        ),
        ("/__mock/cache/reset", "POST") => {
            let dropped = shared.cache().clear();
            json_reply(200, &json!({"ok": true, "dropped": dropped}))
        }
        ("/__mock/clock", _) => {
            error_reply(Flavor::OpenAi, 405, "method not allowed; use GET or POST")
        }
        ("/__mock/cache/reset", _) => {
            error_reply(Flavor::OpenAi, 405, "method not allowed; use POST")
        }
        ("/__mock/calls", "GET") => json_reply(200, &json!(shared.counts())),
        ("/__mock/reset", "POST") => {
            shared.reset();
            json_reply(200, &json!({"ok": true}))
        }
        ("/__mock/health", "GET") => json_reply(200, &json!({"ok": true})),
        ("/__mock/requests", "GET") => {
            let mut limit = 50usize;
            let mut only: Option<String> = None;
            let mut body_cap = INTROSPECT_BODY_CAP;
            for (key, value) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
                match key.as_ref() {
                    "limit" => limit = value.parse().unwrap_or(limit),
                    "path" => only = Some(value.into_owned()),
                    "max_body" => body_cap = value.parse().unwrap_or(body_cap),
                    _ => {}
                }
            }
            let r = shared.lock();
            let selected: Vec<&ReceivedRequest> = r
                .records
                .iter()
                .rev()
                .filter(|rec| only.as_deref().is_none_or(|p| rec.path == p))
                .take(limit)
                .collect();
            let list: Vec<Value> = selected
                .into_iter()
                .rev()
                .map(|rec| {
                    let shown = &rec.body[..rec.body.len().min(body_cap)];
                    let at_ms = rec
                        .at
                        .duration_since(UNIX_EPOCH)
                        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
                    json!({
                        "seq": rec.seq,
                        "method": rec.method,
                        "path": rec.path,
                        "target": rec.target,
                        "headers": rec.headers.iter().map(|(n, v)| [n, v]).collect::<Vec<_>>(),
                        "body_len": rec.body_len,
                        "body": String::from_utf8_lossy(shown),
                        "body_truncated": shown.len() < rec.body_len,
                        "at_unix_ms": at_ms,
                        "reported_usage": reported_usage(rec, &shared.opts),
                    })
                })
                .collect();
            drop(r);
            json_reply(200, &Value::Array(list))
        }
        ("/__mock/calls" | "/__mock/health" | "/__mock/requests" | "/__mock/cache", _) => {
            error_reply(Flavor::OpenAi, 405, "method not allowed; use GET")
        }
        ("/__mock/reset", _) => error_reply(Flavor::OpenAi, 405, "method not allowed; use POST"),
        _ => error_reply(Flavor::OpenAi, 404, &format!("Unknown mock route: {path}")),
    }
}

// ---------------------------------------------------------------------------------------------
// The deterministic reply
// ---------------------------------------------------------------------------------------------

/// A fault mode, chosen by the model name (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// `fault-500`: HTTP 500 with an error body.
    Status500,
    /// `fault-429`: HTTP 429 with `retry-after: 1`.
    Status429,
    /// `fault-reset`: TCP reset (after two SSE events when streamed).
    Reset,
    /// `fault-slow`: answer after `slow_ms`.
    Slow,
    /// `fault-truncated`: answer cut short, then FIN.
    Truncated,
}

impl Fault {
    /// The fault a model name selects: the first of `fault-500`, `fault-429`, `fault-reset`,
    /// `fault-slow`, `fault-truncated` that the name contains.
    pub fn for_model(model: &str) -> Option<Fault> {
        [
            ("fault-500", Fault::Status500),
            ("fault-429", Fault::Status429),
            ("fault-reset", Fault::Reset),
            ("fault-slow", Fault::Slow),
            ("fault-truncated", Fault::Truncated),
        ]
        .into_iter()
        .find(|(token, _)| model.contains(token))
        .map(|(_, f)| f)
    }
}

/// Token figures of an answer (see the module docs for the rules).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MockUsage {
    /// `P` (module docs, "Usage"): OpenAI `prompt_tokens`, Responses `input_tokens`.
    pub prompt_tokens: u64,
    /// `O` = words in the reply: OpenAI `completion_tokens`, Anthropic `output_tokens`.
    pub completion_tokens: u64,
    /// Cache read: OpenAI `prompt_tokens_details.cached_tokens` / Responses
    /// `input_tokens_details.cached_tokens` (`P / 2` for `cached` models; else what the
    /// prompt cache read, also on the Anthropic routes).
    pub cached_tokens: u64,
    /// Anthropic `input_tokens` = `P - cache_read - cache_creation` (OpenAI routes:
    /// `P - cached`).
    pub input_tokens: u64,
    /// Anthropic `cache_read_input_tokens` (`P / 2` for `cached` models; else what the
    /// prompt cache read).
    pub cache_read_input_tokens: u64,
    /// Anthropic `cache_creation_input_tokens` (`P / 4` for `cached` models; else what the
    /// prompt cache wrote): the sum of the two TTL parts below.
    pub cache_creation_input_tokens: u64,
    /// Anthropic `cache_creation.ephemeral_5m_input_tokens`.
    pub cache_creation_5m_input_tokens: u64,
    /// Anthropic `cache_creation.ephemeral_1h_input_tokens`.
    pub cache_creation_1h_input_tokens: u64,
    /// Whether the Anthropic `usage` carries the `cache_creation` object: when the request
    /// has a `cache_control` (top level or on a block) and prompt caching is on.
    pub cache_breakdown: bool,
    /// OpenAI `cache_write_tokens`: the cache writes of a model that bills them (GPT-5.6 on,
    /// [`cache::openai_bills_writes`]); 0, and not reported, for every other model.
    pub openai_cache_write_tokens: u64,
}

impl MockUsage {
    /// `P + O`.
    pub fn total_tokens(&self) -> u64 {
        self.prompt_tokens + self.completion_tokens
    }

    /// The OpenAI `usage` object.
    pub fn openai_json(&self) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.total_tokens(),
            "prompt_tokens_details": self.openai_details("cached_tokens"),
        })
    }

    /// `prompt_tokens_details` / `input_tokens_details`: the read, and the writes where the
    /// model bills them (`cache_write_tokens`).
    pub fn openai_details(&self, cached: &str) -> Value {
        let mut d = json!({ cached: self.cached_tokens });
        if self.openai_cache_write_tokens > 0 {
            d["cache_write_tokens"] = json!(self.openai_cache_write_tokens);
        }
        d
    }

    /// The Anthropic `usage` object.
    pub fn anthropic_json(&self) -> Value {
        let mut v = json!({
            "input_tokens": self.input_tokens,
            "output_tokens": self.completion_tokens,
            "cache_creation_input_tokens": self.cache_creation_input_tokens,
            "cache_read_input_tokens": self.cache_read_input_tokens,
        });
        if self.cache_breakdown {
            v["cache_creation"] = self.cache_creation_json();
        }
        v
    }

    /// `{"ephemeral_5m_input_tokens", "ephemeral_1h_input_tokens"}`.
    pub fn cache_creation_json(&self) -> Value {
        json!({
            "ephemeral_5m_input_tokens": self.cache_creation_5m_input_tokens,
            "ephemeral_1h_input_tokens": self.cache_creation_1h_input_tokens,
        })
    }
}

/// What prompt caching needs of one request, worked out before the cache is locked.
enum CacheLayout {
    /// A `cached` model: the fixed rule; `breakdown` when an Anthropic request is marked.
    Fixed { breakdown: bool },
    /// An OpenAI prompt under 1024 tokens: neither read nor written.
    Short,
    /// An Anthropic request's blocks and breakpoints.
    Anthropic(cache::AnthropicPrompt),
    /// An OpenAI request's partition family (`chat` / `responses`) and prefix boundaries.
    OpenAi(&'static str, Vec<cache::Boundary>),
}

/// Everything the mock answers for one request body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MockReply {
    /// The request's `model` (`""` if absent).
    pub model: String,
    /// BLAKE3 of the canonical body.
    pub digest: [u8; 32],
    /// The returned words (after the cap).
    pub words: Vec<&'static str>,
    /// The words joined by single spaces.
    pub text: String,
    /// Whether the cap cut the reply (`length` / `max_tokens`).
    pub truncated: bool,
    /// Unicode scalar values of the prompt text.
    pub prompt_chars: u64,
    /// Token figures.
    pub usage: MockUsage,
    /// The scripted agent answer, when the request asked for one (module docs, "Scripted
    /// agents"); `words` is then empty and `text` is the final answer (or empty for a tool
    /// call).
    pub script: Option<Scripted>,
    /// How `P` was counted (the options' rule; characters if cl100k was unavailable): the
    /// prompt cache counts its prefixes the same way.
    pub counting: UsageCounting,
}

/// The reply to a chat-completions or messages request body (JSON object); errors if the
/// body is not JSON.
pub fn reply_for(body: &[u8]) -> Result<MockReply, serde_json::Error> {
    let v: Value = serde_json::from_slice(body)?;
    Ok(MockReply::from_value(&v))
}

/// The reply to a request body of the given wire format; errors if the body is not JSON.
pub fn reply_for_api(api: Api, body: &[u8]) -> Result<MockReply, serde_json::Error> {
    let v: Value = serde_json::from_slice(body)?;
    Ok(MockReply::for_api(api, &v))
}

/// The prompt characters `C` of a Responses API request body (see the module docs).
pub fn responses_prompt_chars(body: &Value) -> u64 {
    responses::prompt_chars(body)
}

/// Splits a tool call's `arguments` into the pieces the streams carry: consecutive runs of at
/// most [`ARGUMENT_PIECE_CHARS`] characters (none for an empty string).
pub fn argument_pieces(arguments: &str) -> Vec<&str> {
    let mut pieces = Vec::new();
    let mut start = 0;
    for (n, (i, _)) in arguments.char_indices().enumerate() {
        if n > 0 && n % ARGUMENT_PIECE_CHARS == 0 {
            pieces.push(&arguments[start..i]);
            start = i;
        }
    }
    if start < arguments.len() {
        pieces.push(&arguments[start..]);
    }
    pieces
}

/// The usage the mock reports for a request body.
pub fn expected_usage(body: &[u8]) -> Result<MockUsage, serde_json::Error> {
    reply_for(body).map(|r| r.usage)
}

fn cl100k(text: &str) -> Option<u64> {
    tokensaver_tokenizer::count(text)
}

pub(crate) fn content_chars(c: &Value) -> u64 {
    let count = |s: &str| s.chars().count() as u64;
    match c {
        Value::String(s) => count(s),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .map(count)
            .sum(),
        _ => 0,
    }
}

/// The prompt characters `C` of a chat-completions or messages request body (see the module
/// docs).
pub fn prompt_chars(body: &Value) -> u64 {
    let system = body.get("system").map_or(0, content_chars);
    let messages = match body.get("messages") {
        Some(Value::Array(msgs)) => msgs
            .iter()
            .filter_map(|m| m.get("content"))
            .map(content_chars)
            .sum(),
        _ => 0,
    };
    system + messages
}

impl MockReply {
    /// The reply to a parsed chat-completions or messages request body (the two follow the
    /// same rules).
    pub fn from_value(body: &Value) -> MockReply {
        Self::for_api(Api::ChatCompletions, body)
    }

    /// The reply to a parsed request body of the given wire format, under the default options
    /// (usage by characters, no task scripts, prompt caching on), as the mock answers it when
    /// its prompt cache is empty (module docs, "Prompt caching").
    pub fn for_api(api: Api, body: &Value) -> MockReply {
        Self::build(api, body, None, UsageCounting::Chars, true)
    }

    /// The reply to a parsed request body of the given wire format under `opts` (its task
    /// scripts, usage counting and prompt caching), as the mock answers it when its prompt
    /// cache is empty.
    pub fn for_api_with(api: Api, body: &Value, opts: &ProviderOptions) -> MockReply {
        Self::build(api, body, Some(&opts.tasks), opts.usage, opts.prompt_cache)
    }

    /// The reply; with `cold_cache`, its usage billed against an empty prompt cache.
    fn build(
        api: Api,
        body: &Value,
        tasks: Option<&BTreeMap<String, TaskScript>>,
        counting: UsageCounting,
        cold_cache: bool,
    ) -> MockReply {
        let model = body
            .get("model")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        let digest = canonical_digest(body);
        let chars = match api {
            Api::Responses => responses::prompt_chars(body),
            Api::ChatCompletions | Api::Messages => prompt_chars(body),
        };
        let script = tasks
            .and_then(|t| script::task_scripted(body, t))
            .or_else(|| script::scripted(body));
        let (words, text, truncated, output_tokens) = match &script {
            None => {
                let n = MIN_REPLY_WORDS
                    + usize::from(digest[0]) % (MAX_REPLY_WORDS - MIN_REPLY_WORDS + 1);
                let cap = match api {
                    Api::Responses => body.get("max_output_tokens").and_then(Value::as_u64),
                    Api::ChatCompletions | Api::Messages => body
                        .get("max_completion_tokens")
                        .and_then(Value::as_u64)
                        .or_else(|| body.get("max_tokens").and_then(Value::as_u64)),
                };
                let kept = cap.map_or(n, |c| n.min(usize::try_from(c).unwrap_or(usize::MAX)));
                let words: Vec<&'static str> = (0..kept)
                    .map(|i| WORDS[usize::from(digest[1 + i]) % WORDS.len()])
                    .collect();
                let text = words.join(" ");
                let o = words.len() as u64;
                (words, text, kept < n, o)
            }
            Some(Scripted::Done { steps }) => {
                let text = format!("tokensaver-done after {steps} steps");
                let o = text.split(' ').count() as u64;
                (Vec::new(), text, false, o)
            }
            Some(Scripted::Answer { text }) => {
                let o = text.split_whitespace().count() as u64;
                (Vec::new(), text.clone(), false, o)
            }
            Some(Scripted::ToolCall(call)) => {
                let words = call.preamble.split_whitespace().count() as u64;
                (
                    Vec::new(),
                    String::new(),
                    false,
                    call.output_tokens() + words,
                )
            }
        };
        let by_chars = chars.div_ceil(4) + PROMPT_OVERHEAD_TOKENS;
        let (p, output_tokens, counted) = match counting {
            UsageCounting::Chars => (by_chars, output_tokens, UsageCounting::Chars),
            UsageCounting::Cl100k => {
                let out = match &script {
                    Some(Scripted::ToolCall(c)) => {
                        format!("{}{}{}", c.preamble, c.name, c.arguments)
                    }
                    _ => text.clone(),
                };
                match (cl100k(&canonical_text(body)), cl100k(&out)) {
                    (Some(p), Some(o)) => (p, o.max(1), UsageCounting::Cl100k),
                    _ => (by_chars, output_tokens, UsageCounting::Chars),
                }
            }
        };
        let cached = model.contains("cached");
        let (read, creation) = if cached { (p / 2, p / 4) } else { (0, 0) };
        let usage = MockUsage {
            prompt_tokens: p,
            completion_tokens: output_tokens,
            cached_tokens: read,
            input_tokens: p - read - creation,
            cache_read_input_tokens: read,
            cache_creation_input_tokens: creation,
            ..MockUsage::default()
        };
        let mut reply = MockReply {
            model,
            digest,
            truncated,
            words,
            text,
            prompt_chars: chars,
            usage,
            script,
            counting: counted,
        };
        if cold_cache {
            // A refused marker is answered with a 400: the figures stay uncached.
            if let Ok(layout) = reply.cache_layout(api, body) {
                let mut empty = cache::PromptCache::new(usize::MAX);
                reply.bill_cache(&layout, body, &mut empty, "", 0);
            }
        }
        reply
    }

    /// What prompt caching needs of this request (module docs, "Prompt caching"), its
    /// tokens counted as `P` was; errors when an Anthropic request's `cache_control` markers
    /// are refused.
    fn cache_layout(&self, api: Api, body: &Value) -> Result<CacheLayout, CacheControlError> {
        if self.model.contains("cached") {
            let breakdown = api == Api::Messages && cache::check_anthropic(body)?;
            return Ok(CacheLayout::Fixed { breakdown });
        }
        Ok(match api {
            Api::Messages => CacheLayout::Anthropic(cache::anthropic_prompt(body, self.counting)?),
            _ if self.usage.prompt_tokens < OPENAI_MIN_TOKENS => CacheLayout::Short,
            Api::ChatCompletions => {
                CacheLayout::OpenAi("chat", cache::chat_prompt(body, self.counting))
            }
            Api::Responses => {
                CacheLayout::OpenAi("responses", cache::responses_prompt(body, self.counting))
            }
        })
    }

    /// Bills prompt caching (module docs, "Prompt caching") of the request laid out as
    /// `layout` against `cache`, for `credential` at `now_ms`: replaces the cache figures of
    /// the usage. Models whose name contains `cached` keep their fixed figures.
    fn bill_cache(
        &mut self,
        layout: &CacheLayout,
        body: &Value,
        cache: &mut cache::PromptCache,
        credential: &str,
        now_ms: u64,
    ) {
        let p = self.usage.prompt_tokens;
        let u = &mut self.usage;
        match layout {
            CacheLayout::Fixed { breakdown } => {
                u.cache_breakdown = *breakdown;
                u.cache_creation_5m_input_tokens = u.cache_creation_input_tokens;
            }
            CacheLayout::Short => {}
            CacheLayout::Anthropic(prompt) => {
                let key = cache::PartitionKey::new("messages", credential, &self.model, None);
                let min = anthropic_min_tokens(&self.model);
                let bill = cache.bill_anthropic(&key, prompt, min, p, now_ms);
                u.cache_breakdown = prompt.marked;
                u.cache_read_input_tokens = bill.read;
                u.cache_creation_input_tokens = bill.written();
                u.cache_creation_5m_input_tokens = bill.write_5m;
                u.cache_creation_1h_input_tokens = bill.write_1h;
                u.cached_tokens = bill.read;
                u.input_tokens = p - bill.read - bill.written();
            }
            CacheLayout::OpenAi(name, boundaries) => {
                let cache_key = body.get("prompt_cache_key").and_then(Value::as_str);
                let family = cache::PartitionKey::new(name, credential, &self.model, None);
                let machine = cache.route_openai(&family, boundaries, cache_key, now_ms);
                let key = cache::PartitionKey::new(name, credential, &self.model, Some(machine));
                let retention = Retention::of(body);
                let (cached, written) =
                    cache.bill_openai_writes(&key, boundaries, retention, p, now_ms);
                let written = if cache::openai_bills_writes(&self.model) {
                    written
                } else {
                    0
                };
                u.cached_tokens = cached;
                u.cache_read_input_tokens = cached;
                u.cache_creation_input_tokens = 0;
                u.openai_cache_write_tokens = written;
                u.input_tokens = p - cached - written;
            }
        }
    }

    /// The scripted tool call, if this reply is one.
    pub fn tool_call(&self) -> Option<&MockToolCall> {
        match &self.script {
            Some(Scripted::ToolCall(c)) => Some(c),
            _ => None,
        }
    }

    fn id_hex(&self) -> String {
        hex::encode(&self.digest[..12])
    }

    /// `hex(d[12..24])`: the part of the tool-call and Responses item ids after the prefix.
    fn call_hex(&self) -> String {
        hex::encode(&self.digest[12..24])
    }

    /// The id of a scripted tool call: `call_<hex(d[12..24])>` (chat and Responses
    /// `call_id`), `toolu_<hex(d[12..24])>` (Anthropic).
    pub fn tool_call_id(&self, api: Api) -> String {
        match api {
            Api::Messages => format!("toolu_{}", self.call_hex()),
            Api::ChatCompletions | Api::Responses => format!("call_{}", self.call_hex()),
        }
    }

    /// How many content deltas the streams carry: one per word of the text, or one per
    /// [`argument_pieces`] of a tool call's arguments.
    pub fn content_delta_count(&self) -> usize {
        match self.tool_call() {
            Some(c) => argument_pieces(&c.arguments).len(),
            None => self.deltas().len(),
        }
    }

    /// `chatcmpl-<24 hex>`.
    pub fn openai_id(&self) -> String {
        format!("chatcmpl-{}", self.id_hex())
    }

    /// `msg_<24 hex>`.
    pub fn anthropic_id(&self) -> String {
        format!("msg_{}", self.id_hex())
    }

    /// `"tool_calls"` for a tool call, `"length"` if truncated, else `"stop"`.
    pub fn openai_finish_reason(&self) -> &'static str {
        if self.tool_call().is_some() {
            "tool_calls"
        } else if self.truncated {
            "length"
        } else {
            "stop"
        }
    }

    /// `"tool_use"` for a tool call, `"max_tokens"` if truncated, else `"end_turn"`.
    pub fn anthropic_stop_reason(&self) -> &'static str {
        if self.tool_call().is_some() {
            "tool_use"
        } else if self.truncated {
            "max_tokens"
        } else {
            "end_turn"
        }
    }

    /// The text deltas the streams carry: the words of the text (split at single spaces),
    /// each after the first prefixed by a space; none for an empty text.
    pub fn deltas(&self) -> Vec<String> {
        if self.text.is_empty() {
            return Vec::new();
        }
        word_deltas(&self.text)
    }

    fn oa_usage(&self) -> OaUsage {
        OaUsage {
            prompt_tokens: self.usage.prompt_tokens,
            completion_tokens: self.usage.completion_tokens,
            total_tokens: self.usage.total_tokens(),
            prompt_tokens_details: OaPromptDetails {
                cached_tokens: self.usage.cached_tokens,
                cache_write_tokens: Some(self.usage.openai_cache_write_tokens).filter(|&n| n > 0),
            },
        }
    }

    fn an_usage(&self, output_tokens: u64) -> AnUsage {
        AnUsage {
            input_tokens: self.usage.input_tokens,
            cache_creation_input_tokens: self.usage.cache_creation_input_tokens,
            cache_read_input_tokens: self.usage.cache_read_input_tokens,
            output_tokens,
            cache_creation: self.usage.cache_breakdown.then_some(AnCacheCreation {
                ephemeral_5m_input_tokens: self.usage.cache_creation_5m_input_tokens,
                ephemeral_1h_input_tokens: self.usage.cache_creation_1h_input_tokens,
            }),
        }
    }

    /// The exact body of the non-streamed OpenAI answer.
    pub fn openai_json(&self) -> Vec<u8> {
        if let Some(call) = self.tool_call() {
            return serde_json::to_vec(&json!({
                "id": self.openai_id(),
                "object": "chat.completion",
                "created": CREATED,
                "model": self.model,
                "choices": [{
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": if call.preamble.is_empty() {
                            Value::Null
                        } else {
                            json!(call.preamble)
                        },
                        "tool_calls": [self.openai_tool_call(call)],
                        "refusal": null,
                    },
                    "logprobs": null,
                    "finish_reason": self.openai_finish_reason(),
                }],
                "usage": self.usage.openai_json(),
                "system_fingerprint": SYSTEM_FINGERPRINT,
            }))
            .unwrap_or_default();
        }
        let id = self.openai_id();
        let body = OaCompletion {
            id: &id,
            object: "chat.completion",
            created: CREATED,
            model: &self.model,
            choices: [OaChoice {
                index: 0,
                message: OaMessage {
                    role: "assistant",
                    content: &self.text,
                    refusal: None,
                },
                logprobs: None,
                finish_reason: self.openai_finish_reason(),
            }],
            usage: self.oa_usage(),
            system_fingerprint: SYSTEM_FINGERPRINT,
        };
        serde_json::to_vec(&body).unwrap_or_default()
    }

    fn openai_tool_call(&self, call: &MockToolCall) -> Value {
        json!({
            "id": self.tool_call_id(Api::ChatCompletions),
            "type": "function",
            "function": {"name": call.name, "arguments": call.arguments},
        })
    }

    fn anthropic_tool_use(&self, call: &MockToolCall, input: Value) -> Value {
        json!({
            "type": "tool_use",
            "id": self.tool_call_id(Api::Messages),
            "name": call.name,
            "input": input,
        })
    }

    /// The exact body of the non-streamed Anthropic answer.
    pub fn anthropic_json(&self) -> Vec<u8> {
        if let Some(call) = self.tool_call() {
            return serde_json::to_vec(&json!({
                "id": self.anthropic_id(),
                "type": "message",
                "role": "assistant",
                "model": self.model,
                "content": if call.preamble.is_empty() {
                    json!([self.anthropic_tool_use(call, call.input.clone())])
                } else {
                    json!([
                        {"type": "text", "text": call.preamble},
                        self.anthropic_tool_use(call, call.input.clone()),
                    ])
                },
                "stop_reason": self.anthropic_stop_reason(),
                "stop_sequence": null,
                "usage": self.usage.anthropic_json(),
            }))
            .unwrap_or_default();
        }
        let id = self.anthropic_id();
        let body = AnMessage {
            id: &id,
            kind: "message",
            role: "assistant",
            model: &self.model,
            content: vec![AnText {
                kind: "text",
                text: &self.text,
            }],
            stop_reason: Some(self.anthropic_stop_reason()),
            stop_sequence: None,
            usage: self.an_usage(self.usage.completion_tokens),
        };
        serde_json::to_vec(&body).unwrap_or_default()
    }

    /// The exact SSE events (`data: ...\n\n` each) of the streamed OpenAI answer.
    pub fn openai_sse_events(&self, include_usage: bool) -> Vec<String> {
        let id = self.openai_id();
        let null_usage = include_usage.then_some(None);
        let chunk = |choices: Vec<OaChunkChoice<'_>>, usage: Option<Option<OaUsage>>| {
            let c = OaChunk {
                id: &id,
                object: "chat.completion.chunk",
                created: CREATED,
                model: &self.model,
                system_fingerprint: SYSTEM_FINGERPRINT,
                choices,
                usage,
            };
            format!(
                "data: {}\n\n",
                serde_json::to_string(&c).unwrap_or_default()
            )
        };
        let deltas = self.deltas();
        let mut events = Vec::with_capacity(deltas.len() + 4);
        if let Some(call) = self.tool_call() {
            let raw = |delta: Value| {
                let mut c = json!({
                    "id": id,
                    "object": "chat.completion.chunk",
                    "created": CREATED,
                    "model": self.model,
                    "system_fingerprint": SYSTEM_FINGERPRINT,
                    "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": null}],
                });
                if include_usage {
                    c["usage"] = Value::Null;
                }
                format!(
                    "data: {}\n\n",
                    serde_json::to_string(&c).unwrap_or_default()
                )
            };
            let mut first = self.openai_tool_call(call);
            first["index"] = json!(0);
            first["function"]["arguments"] = json!("");
            if call.preamble.is_empty() {
                events.push(raw(
                    json!({"role": "assistant", "content": null, "tool_calls": [first]}),
                ));
            } else {
                events.push(raw(json!({"role": "assistant", "content": ""})));
                for d in word_deltas(&call.preamble) {
                    events.push(raw(json!({"content": d})));
                }
                events.push(raw(json!({"tool_calls": [first]})));
            }
            for piece in argument_pieces(&call.arguments) {
                events.push(raw(
                    json!({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}),
                ));
            }
        } else {
            events.push(chunk(
                oa_choice(Some("assistant"), Some(""), None),
                null_usage,
            ));
            for d in &deltas {
                events.push(chunk(oa_choice(None, Some(d), None), null_usage));
            }
        }
        events.push(chunk(
            oa_choice(None, None, Some(self.openai_finish_reason())),
            null_usage,
        ));
        if include_usage {
            events.push(chunk(Vec::new(), Some(Some(self.oa_usage()))));
        }
        events.push("data: [DONE]\n\n".to_owned());
        events
    }

    /// The exact SSE events (`event: ...\ndata: ...\n\n` each) of the streamed Anthropic answer.
    pub fn anthropic_sse_events(&self) -> Vec<String> {
        let ev = |name: &str, v: &Value| {
            format!(
                "event: {name}\ndata: {}\n\n",
                serde_json::to_string(v).unwrap_or_default()
            )
        };
        let id = self.anthropic_id();
        let start = AnMessage {
            id: &id,
            kind: "message",
            role: "assistant",
            model: &self.model,
            content: Vec::new(),
            stop_reason: None,
            stop_sequence: None,
            usage: self.an_usage(1),
        };
        let mut events = Vec::with_capacity(self.words.len() + 6);
        events.push(ev("message_start", &json!({"type": "message_start", "message": serde_json::to_value(&start).unwrap_or(Value::Null)})));
        let mut last_index = 0;
        if let Some(call) = self.tool_call() {
            let mut index = 0;
            if !call.preamble.is_empty() {
                events.push(ev(
                    "content_block_start",
                    &json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
                ));
                events.push(ev("ping", &json!({"type": "ping"})));
                for d in word_deltas(&call.preamble) {
                    events.push(ev(
                        "content_block_delta",
                        &json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": d}}),
                    ));
                }
                events.push(ev(
                    "content_block_stop",
                    &json!({"type": "content_block_stop", "index": 0}),
                ));
                index = 1;
            }
            events.push(ev(
                "content_block_start",
                &json!({"type": "content_block_start", "index": index, "content_block": self.anthropic_tool_use(call, json!({}))}),
            ));
            if index == 0 {
                events.push(ev("ping", &json!({"type": "ping"})));
            }
            for piece in argument_pieces(&call.arguments) {
                events.push(ev(
                    "content_block_delta",
                    &json!({"type": "content_block_delta", "index": index, "delta": {"type": "input_json_delta", "partial_json": piece}}),
                ));
            }
            last_index = index;
        } else {
            events.push(ev(
                "content_block_start",
                &json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            ));
            events.push(ev("ping", &json!({"type": "ping"})));
            for d in self.deltas() {
                events.push(ev(
                    "content_block_delta",
                    &json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": d}}),
                ));
            }
        }
        events.push(ev(
            "content_block_stop",
            &json!({"type": "content_block_stop", "index": last_index}),
        ));
        events.push(ev(
            "message_delta",
            &json!({
                "type": "message_delta",
                "delta": {"stop_reason": self.anthropic_stop_reason(), "stop_sequence": null},
                "usage": {"output_tokens": self.usage.completion_tokens},
            }),
        ));
        events.push(ev("message_stop", &json!({"type": "message_stop"})));
        events
    }
}

/// A text's stream deltas: its words split at single spaces, each after the first prefixed by
/// a space (what [`MockReply::deltas`] does for a reply).
fn word_deltas(text: &str) -> Vec<String> {
    text.split(' ')
        .enumerate()
        .map(|(i, w)| {
            if i == 0 {
                w.to_owned()
            } else {
                format!(" {w}")
            }
        })
        .collect()
}

fn oa_choice<'a>(
    role: Option<&'static str>,
    content: Option<&'a str>,
    finish_reason: Option<&'static str>,
) -> Vec<OaChunkChoice<'a>> {
    vec![OaChunkChoice {
        index: 0,
        delta: OaDelta { role, content },
        logprobs: None,
        finish_reason,
    }]
}

#[derive(Serialize)]
struct OaCompletion<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: [OaChoice<'a>; 1],
    usage: OaUsage,
    system_fingerprint: &'static str,
}

#[derive(Serialize)]
struct OaChoice<'a> {
    index: u32,
    message: OaMessage<'a>,
    logprobs: Option<()>,
    finish_reason: &'static str,
}

#[derive(Serialize)]
struct OaMessage<'a> {
    role: &'static str,
    content: &'a str,
    refusal: Option<()>,
}

#[derive(Serialize, Clone, Copy)]
struct OaUsage {
    prompt_tokens: u64,
    completion_tokens: u64,
    total_tokens: u64,
    prompt_tokens_details: OaPromptDetails,
}

#[derive(Serialize, Clone, Copy)]
struct OaPromptDetails {
    cached_tokens: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    cache_write_tokens: Option<u64>,
}

#[derive(Serialize)]
struct OaChunk<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    system_fingerprint: &'static str,
    choices: Vec<OaChunkChoice<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<Option<OaUsage>>,
}

#[derive(Serialize)]
struct OaChunkChoice<'a> {
    index: u32,
    delta: OaDelta<'a>,
    logprobs: Option<()>,
    finish_reason: Option<&'static str>,
}

#[derive(Serialize)]
struct OaDelta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    content: Option<&'a str>,
}

#[derive(Serialize)]
struct AnMessage<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    role: &'static str,
    model: &'a str,
    content: Vec<AnText<'a>>,
    stop_reason: Option<&'static str>,
    stop_sequence: Option<()>,
    usage: AnUsage,
}

#[derive(Serialize)]
struct AnText<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    text: &'a str,
}

#[derive(Serialize)]
struct AnUsage {
    input_tokens: u64,
    cache_creation_input_tokens: u64,
    cache_read_input_tokens: u64,
    output_tokens: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    cache_creation: Option<AnCacheCreation>,
}

#[derive(Serialize)]
struct AnCacheCreation {
    ephemeral_5m_input_tokens: u64,
    ephemeral_1h_input_tokens: u64,
}
