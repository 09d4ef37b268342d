"""The official `anthropic` SDK through the proxy, with only base_url and api_key changed."""

from __future__ import annotations

import base64
import json

import anthropic
import pytest
from anthropic import Anthropic

try:
    import httpx2 as httpx  # the SDK versions pinned here use httpx2
except ImportError:  # pragma: no cover
    import httpx

PATH = "/v1/messages"
MODEL = "claude-haiku-4-5"
# anthropic 2.x's `messages.create` has no `temperature` parameter any more (TypeError), so the
# reproducible request that earns reuse (SPEC 2.6) is sent through the SDK's own `extra_body`.
TEMPERATURE_ZERO = {"temperature": 0}


def client(proxy: str, key: str, **kw) -> Anthropic:
    return Anthropic(base_url=f"http://{proxy}", api_key=key, **kw)


def counted_client(proxy: str, key: str, counter, **kw) -> Anthropic:
    http = httpx.Client(event_hooks={"request": [counter]})
    return client(proxy, key, http_client=http, **kw)


def msgs(text: str) -> list:
    return [{"role": "user", "content": text}]


def receipt_body(headers) -> dict:
    envelope = json.loads(base64.b64decode(headers["x-tokensaver-receipt"]))
    return json.loads(base64.b64decode(envelope["body"]))


def text_of(message) -> str:
    return "".join(b.text for b in message.content if b.type == "text")


def assert_message(m) -> None:
    assert m.type == "message" and m.role == "assistant"
    assert text_of(m).strip()
    assert m.stop_reason in ("end_turn", "max_tokens")
    assert m.usage is not None
    assert m.usage.input_tokens > 0 and m.usage.output_tokens > 0


def test_plain_call_parses_with_usage(proxy, demo_key, mock):
    before = mock.calls(PATH)
    raw = client(proxy, demo_key, max_retries=0).messages.with_raw_response.create(
        model=MODEL, messages=msgs("anthropic plain: name three mountains"), max_tokens=32,
    )
    assert raw.status_code == 200
    assert raw.headers["x-tokensaver-verdict"] in ("ALLOW", "DOWNGRADE")
    assert "x-tokensaver-receipt" in raw.headers
    assert_message(raw.parse())
    assert mock.calls(PATH) == before + 1


def test_messages_stream_helper(proxy, demo_key):
    c = client(proxy, demo_key, max_retries=0)
    with c.messages.stream(model=MODEL, messages=msgs("anthropic stream helper: say hi"), max_tokens=32) as stream:
        deltas = list(stream.text_stream)
        final = stream.get_final_message()
    assert deltas and "".join(deltas).strip()
    assert "".join(deltas) == text_of(final)
    assert_message(final)


def test_stream_true_events(proxy, demo_key):
    c = client(proxy, demo_key, max_retries=0)
    events = list(c.messages.create(
        model=MODEL, messages=msgs("anthropic stream raw: count to three"), max_tokens=32, stream=True,
    ))
    types = [e.type for e in events]
    assert types[0] == "message_start" and types[-1] == "message_stop"
    text = "".join(e.delta.text for e in events
                   if e.type == "content_block_delta" and e.delta.type == "text_delta")
    assert text.strip()
    start = events[0].message
    assert start.usage.input_tokens > 0
    deltas = [e for e in events if e.type == "message_delta"]
    assert len(deltas) == 1
    assert deltas[0].usage.output_tokens > 0
    assert deltas[0].delta.stop_reason in ("end_turn", "max_tokens")


def test_repeat_temperature_zero_is_served(proxy, demo_key, mock):
    c = client(proxy, demo_key, max_retries=0)
    args = dict(model=MODEL, messages=msgs("anthropic serve: what is three plus three"),
                max_tokens=32, extra_body=TEMPERATURE_ZERO)
    first = c.messages.with_raw_response.create(**args)
    assert first.headers["x-tokensaver-verdict"] in ("ALLOW", "DOWNGRADE")
    first_m = first.parse()
    assert_message(first_m)
    before = mock.calls(PATH)

    second = c.messages.with_raw_response.create(**args)
    assert second.status_code == 200
    assert second.headers["x-tokensaver-verdict"] == "SERVE"
    second_m = second.parse()
    assert_message(second_m)
    assert text_of(second_m) == text_of(first_m) and second_m.id == first_m.id
    assert mock.calls(PATH) == before
    assert receipt_body(second.headers).get("verdict") in ("SERVE", "serve")


def test_repeat_temperature_zero_stream_is_served(proxy, demo_key, mock):
    c = client(proxy, demo_key, max_retries=0)
    args = dict(model=MODEL, messages=msgs("anthropic serve stream: name a bird"), max_tokens=32, extra_body=TEMPERATURE_ZERO)
    with c.messages.stream(**args) as s:
        first = s.get_final_message()
    assert_message(first)
    before = mock.calls(PATH)

    raw = c.messages.with_raw_response.create(**args, stream=True)
    assert raw.headers["x-tokensaver-verdict"] == "SERVE"
    events = list(raw.parse())
    text = "".join(e.delta.text for e in events
                   if e.type == "content_block_delta" and e.delta.type == "text_delta")
    assert text == text_of(first)
    assert [e for e in events if e.type == "message_delta"][0].usage.output_tokens == first.usage.output_tokens
    assert mock.calls(PATH) == before


def test_block_raises_rate_limit_without_sdk_retry(proxy, demo_key, mock, attempts):
    # Default max_retries (2): the SDK would retry a 429 unless told `x-should-retry: false`.
    c = counted_client(proxy, demo_key, attempts)
    args = dict(model=MODEL, messages=msgs("anthropic block: sampled loop request"), max_tokens=16)  # no temperature: sampled, never reused
    for _ in range(3):
        assert_message(c.messages.create(**args))
    assert attempts.n == 3
    before = mock.calls(PATH)

    with pytest.raises(anthropic.RateLimitError) as info:
        c.messages.create(**args)
    err = info.value
    assert err.status_code == 429
    assert attempts.n == 4, f"the SDK sent {attempts.n - 3} attempts for the blocked call"
    assert mock.calls(PATH) == before, "a BLOCK reached the provider"
    headers = err.response.headers
    assert headers["x-tokensaver-verdict"] == "BLOCK"
    assert headers["x-should-retry"] == "false"
    assert isinstance(err.body, dict) and err.body.get("type") == "error"
    assert "runaway_loop_unattended" in json.dumps(err.body)
    assert receipt_body(headers).get("rule") == "runaway_loop_unattended"


@pytest.mark.filterwarnings("ignore:The model .* is deprecated:DeprecationWarning")
def test_downgrade_answer_parses(proxy, demo_key, mock):
    # A small, bounded request for a mapped model earns DOWNGRADE (SPEC 2.5).
    with client(proxy, demo_key, max_retries=0).messages.stream(
        model="claude-sonnet-4-5", messages=msgs("anthropic downgrade: a short haiku"), max_tokens=32,
        # a declared person drops the +0.10 unattended term, so the score stays <= 0.30 even
        # after the other tests have filled the burst window
        extra_headers={"x-tokensaver-human": "1"},
    ) as s:
        assert s.response.headers["x-tokensaver-verdict"] == "DOWNGRADE"
        final = s.get_final_message()
    assert_message(final)
    assert final.model == "claude-haiku-4-5"
