"""The official `openai` SDK through the proxy, with only base_url and api_key changed."""

from __future__ import annotations

import base64
import json

try:
    import httpx2 as httpx  # the SDK versions pinned here use httpx2
except ImportError:  # pragma: no cover
    import httpx
import openai
import pytest
from openai import OpenAI

PATH = "/v1/chat/completions"
MODEL = "gpt-4o-mini"


def client(proxy: str, key: str, **kw) -> OpenAI:
    return OpenAI(base_url=f"http://{proxy}/v1", api_key=key, **kw)


def counted_client(proxy: str, key: str, counter, **kw) -> OpenAI:
    http = httpx.Client(event_hooks={"request": [counter]})
    return client(proxy, key, http_client=http, **kw)


def msgs(text: str) -> list:
    return [{"role": "user", "content": text}]


def receipt_body(headers) -> dict:
    envelope = json.loads(base64.b64decode(headers["x-tokensaver-receipt"]))
    return json.loads(base64.b64decode(envelope["body"]))


def assert_completion(c) -> None:
    assert c.object == "chat.completion"
    assert c.choices and c.choices[0].message.role == "assistant"
    assert c.choices[0].message.content and c.choices[0].message.content.strip()
    assert c.usage is not None
    assert c.usage.prompt_tokens > 0 and c.usage.completion_tokens > 0
    assert c.usage.total_tokens == c.usage.prompt_tokens + c.usage.completion_tokens


def test_plain_call_parses_with_usage(proxy, demo_key, mock):
    before = mock.calls(PATH)
    raw = client(proxy, demo_key, max_retries=0).chat.completions.with_raw_response.create(
        model=MODEL, messages=msgs("openai plain: name three rivers"), max_tokens=32,
    )
    assert raw.status_code == 200
    assert raw.headers["x-tokensaver-verdict"] in ("ALLOW", "DOWNGRADE")
    assert "x-tokensaver-receipt" in raw.headers
    c = raw.parse()
    assert_completion(c)
    assert mock.calls(PATH) == before + 1


def test_stream_without_stream_options_has_no_usage_chunk(proxy, demo_key):
    stream = client(proxy, demo_key, max_retries=0).chat.completions.create(
        model=MODEL, messages=msgs("openai stream: no usage please"), max_tokens=32, stream=True,
    )
    chunks = list(stream)
    assert chunks, "no chunks"
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text.strip()
    assert all(ch.choices for ch in chunks), "a usage-only chunk (choices: []) reached a client that did not ask"
    assert all(getattr(ch, "usage", None) is None for ch in chunks)
    assert any(ch.choices[0].finish_reason for ch in chunks)


def test_stream_with_include_usage_yields_usage_chunk(proxy, demo_key):
    stream = client(proxy, demo_key, max_retries=0).chat.completions.create(
        model=MODEL, messages=msgs("openai stream: with usage please"), max_tokens=32, stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text.strip()
    usage_chunks = [ch for ch in chunks if ch.usage is not None]
    assert len(usage_chunks) == 1
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert last.usage.prompt_tokens > 0 and last.usage.completion_tokens > 0


def test_repeat_temperature_zero_is_served(proxy, demo_key, mock):
    c = client(proxy, demo_key, max_retries=0)
    args = dict(model=MODEL, messages=msgs("openai serve: what is two plus two"), max_tokens=32, temperature=0)
    first = c.chat.completions.with_raw_response.create(**args)
    assert first.headers["x-tokensaver-verdict"] in ("ALLOW", "DOWNGRADE")
    first_c = first.parse()
    assert_completion(first_c)
    before = mock.calls(PATH)

    second = c.chat.completions.with_raw_response.create(**args)
    assert second.status_code == 200
    assert second.headers["x-tokensaver-verdict"] == "SERVE"
    second_c = second.parse()
    assert_completion(second_c)
    assert second_c.choices[0].message.content == first_c.choices[0].message.content
    assert second_c.id == first_c.id
    assert mock.calls(PATH) == before
    body = receipt_body(second.headers)
    assert body.get("verdict") in ("SERVE", "serve")


def test_repeat_temperature_zero_stream_is_served(proxy, demo_key, mock):
    c = client(proxy, demo_key, max_retries=0)
    args = dict(model=MODEL, messages=msgs("openai serve stream: name a colour"), max_tokens=32,
                temperature=0, stream=True)
    first = c.chat.completions.with_raw_response.create(**args)
    first_text = "".join(ch.choices[0].delta.content or "" for ch in first.parse() if ch.choices)
    assert first_text.strip()
    before = mock.calls(PATH)

    second = c.chat.completions.with_raw_response.create(**args)
    assert second.headers["x-tokensaver-verdict"] == "SERVE"
    chunks = list(second.parse())
    assert all(ch.choices for ch in chunks), "replay leaked the usage chunk to a client that did not ask"
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == first_text
    assert mock.calls(PATH) == before


def test_block_raises_rate_limit_without_sdk_retry(proxy, demo_key, mock, attempts):
    # Default max_retries (2): the SDK would retry a 429 unless told `x-should-retry: false`.
    c = counted_client(proxy, demo_key, attempts)
    args = dict(model=MODEL, messages=msgs("openai block: sampled loop request"), max_tokens=16, temperature=1)
    for i in range(3):
        assert_completion(c.chat.completions.create(**args))
    assert attempts.n == 3
    before = mock.calls(PATH)

    with pytest.raises(openai.RateLimitError) as info:
        c.chat.completions.create(**args)
    err = info.value
    assert err.status_code == 429
    assert attempts.n == 4, f"the SDK sent {attempts.n - 3} attempts for the blocked call"
    assert mock.calls(PATH) == before, "a BLOCK reached the provider"
    headers = err.response.headers
    assert headers["x-tokensaver-verdict"] == "BLOCK"
    assert headers["x-should-retry"] == "false"
    assert "runaway_loop_unattended" in json.dumps(err.body) or "runaway_loop_unattended" in err.message
    assert receipt_body(headers).get("rule") == "runaway_loop_unattended"


def test_downgrade_answer_parses(proxy, demo_key, mock):
    # A small, bounded request for a mapped model earns DOWNGRADE (SPEC 2.5): the proxy rewrites
    # `model` in the body; the SDK must still parse the (re-sized) answer.
    raw = client(proxy, demo_key, max_retries=0).chat.completions.with_raw_response.create(
        model="gpt-4o", messages=msgs("openai downgrade: a short haiku"), max_tokens=32,
        # a declared person drops the +0.10 unattended term, so the score stays <= 0.30 even
        # after the other tests have filled the burst window
        extra_headers={"x-tokensaver-human": "1"},
    )
    assert raw.headers["x-tokensaver-verdict"] == "DOWNGRADE"
    c = raw.parse()
    assert_completion(c)
    assert c.model == "gpt-4o-mini"
    assert '"model":"gpt-4o-mini"' in mock.requests(PATH, limit=1)[0]["body"]


RESPONSES = "/v1/responses"


def test_responses_create_parses_with_usage(proxy, demo_key, mock):
    before = mock.calls(RESPONSES)
    raw = client(proxy, demo_key, max_retries=0).responses.with_raw_response.create(
        model=MODEL, input="openai responses: name three lakes", max_output_tokens=64,
    )
    assert raw.status_code == 200
    assert raw.headers["x-tokensaver-verdict"] in ("ALLOW", "DOWNGRADE")
    r = raw.parse()
    assert r.object == "response" and r.status == "completed"
    assert r.output_text.strip()
    assert r.usage.input_tokens > 0 and r.usage.output_tokens > 0
    assert mock.calls(RESPONSES) == before + 1


def test_responses_stream_ends_with_completed_and_usage(proxy, demo_key):
    events = list(
        client(proxy, demo_key, max_retries=0).responses.create(
            model=MODEL, input="openai responses stream: a short poem", stream=True,
            max_output_tokens=64,
        )
    )
    types = [e.type for e in events]
    assert types[0] == "response.created"
    assert "response.output_text.delta" in types
    assert types[-1] == "response.completed"
    final = events[-1].response
    assert final.usage.output_tokens > 0
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == final.output_text


def test_responses_repeat_at_temperature_zero_is_served(proxy, demo_key, mock):
    c = client(proxy, demo_key, max_retries=0)
    ask = dict(model=MODEL, input="openai responses: served twice?", temperature=0,
               max_output_tokens=64)
    first = c.responses.with_raw_response.create(**ask)
    before = mock.calls(RESPONSES)
    second = c.responses.with_raw_response.create(**ask)
    assert second.headers["x-tokensaver-verdict"] == "SERVE"
    assert mock.calls(RESPONSES) == before
    assert second.parse().id == first.parse().id
    assert second.parse().output_text == first.parse().output_text
