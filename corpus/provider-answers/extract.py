#!/usr/bin/env python3
"""Take the corpus answers out of public test cassettes, byte for byte.

Each answer is the body of one recorded HTTP response in a vcrpy-style cassette of a public
repository (the table below: repository, path, interaction). Run against local clones
(`--mirror owner/name=PATH`); it writes `answers/<id>.<ext>` and the `source` block of
`cases/<id>.json` (creating the case file if needed, keeping what else it holds). The
expected figures are filled in by `derive.py`, never by tokensaver.

Body forms, recorded in each case's `source.body_form`:
- `string`: the cassette holds the body as text: the answer is that text, UTF-8.
- `gzip`: the cassette holds the gzip bytes the provider sent: the answer is them inflated.
- `parsed_body`: the cassette (pydantic-ai's serializer) holds the decoded JSON only: the
  answer is that JSON written back compactly, keys in the cassette's order. The figures are
  the provider's; the whitespace and key order are the cassette's.
"""
import argparse, gzip, json, subprocess, sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent

OPENLLMETRY = "traceloop/openllmetry"
PYDANTIC_AI = "pydantic/pydantic-ai"
AO = "packages/opentelemetry-instrumentation-anthropic/tests/cassettes"
OO = "packages/opentelemetry-instrumentation-openai/tests/traces/cassettes"
PA = "tests/models/cassettes"

# id, route, repository, path, interaction
SOURCES = [
    ("a01_messages_stream_cache_write", "anthropic_messages", OPENLLMETRY, f"{AO}/test_prompt_caching/test_anthropic_prompt_caching_stream_legacy.yaml", 0),
    ("a02_messages_stream_cache_read", "anthropic_messages", OPENLLMETRY, f"{AO}/test_prompt_caching/test_anthropic_prompt_caching_stream_legacy.yaml", 1),
    ("a03_messages_json_cache_write", "anthropic_messages", OPENLLMETRY, f"{AO}/test_prompt_caching/test_anthropic_prompt_caching_legacy.yaml", 0),
    ("a04_messages_json_cache_read", "anthropic_messages", OPENLLMETRY, f"{AO}/test_prompt_caching/test_anthropic_prompt_caching_legacy.yaml", 1),
    ("a05_messages_stream_tool_use", "anthropic_messages", OPENLLMETRY, f"{AO}/test_messages/test_anthropic_tools_streaming_legacy.yaml", 0),
    ("a06_messages_stream_thinking", "anthropic_messages", OPENLLMETRY, f"{AO}/test_thinking/test_anthropic_thinking_streaming_legacy.yaml", 0),
    ("a07_messages_stream_web_search", "anthropic_messages", PYDANTIC_AI, f"{PA}/test_anthropic/test_anthropic_model_web_search_tool_stream.yaml", 0),
    ("a08_messages_json_web_search", "anthropic_messages", PYDANTIC_AI, f"{PA}/test_anthropic/test_anthropic_web_search_tool.yaml", 0),
    ("a09_messages_stream_compaction", "anthropic_messages", PYDANTIC_AI, f"{PA}/test_anthropic/test_anthropic_compaction_usage_with_cache_streaming.yaml", 0),
    ("a10_messages_json_compaction", "anthropic_messages", PYDANTIC_AI, f"{PA}/test_anthropic/test_anthropic_compaction_usage_with_cache.yaml", 0),
    # a11 (1-hour cache writes) is transcribed: see its case file.
    ("c01_chat_stream_error_mid_stream", "openai_chat", PYDANTIC_AI, f"{PA}/test_groq/test_tool_use_failed_error_streaming.yaml", 0),
    ("c02_chat_stream_usage_on_choices_chunk", "openai_chat", PYDANTIC_AI, f"{PA}/test_groq/test_tool_use_failed_error_streaming_with_text.yaml", 1),
    ("c03_chat_stream_openrouter_comments", "openai_chat", PYDANTIC_AI, f"{PA}/test_openrouter/test_openrouter_web_search_tool_usage_stream.yaml", 0),
    ("c04_chat_stream_usage_only_chunk", "openai_chat", PYDANTIC_AI, f"{PA}/test_openai/test_run_stream_sync_streams_real_model.yaml", 1),
    ("c05_chat_json_cached_tokens", "openai_chat", OPENLLMETRY, f"{OO}/test_prompt_caching/test_openai_prompt_caching.yaml", 1),
    ("c06_chat_json_reasoning", "openai_chat", OPENLLMETRY, f"{OO}/test_chat/test_chat_reasoning.yaml", 0),
    ("c07_chat_json_reasoning_azure", "openai_chat", OPENLLMETRY, f"{OO}/test_azure/test_chat_reasoning.yaml", 0),
    ("r01_responses_stream_reasoning", "openai_responses", PYDANTIC_AI, f"{PA}/test_openai_responses/test_openai_responses_streaming_usage.yaml", 0),
    ("r02_responses_stream_cached_web_search", "openai_responses", PYDANTIC_AI, f"{PA}/test_openai_responses/test_openai_responses_model_web_search_tool_stream.yaml", 0),
    ("r03_responses_json_web_search", "openai_responses", OPENLLMETRY, "packages/opentelemetry-instrumentation-openai-agents/tests/cassettes/test_openai_agents/test_agent_with_web_search_tool_spans.yaml", 1),
]


def git(mirror, *args):
    return subprocess.run(["git", "-C", mirror, *args], capture_output=True, check=True).stdout


def response_body(interaction):
    """(status, content type, bytes, body form) of one recorded response."""
    r = interaction["response"]
    headers = {k.lower(): v for k, v in (r.get("headers") or {}).items()}
    status = r.get("status")
    status = status.get("code") if isinstance(status, dict) else status
    ctype = headers.get("content-type", ["application/json"])
    ctype = ctype[0] if isinstance(ctype, list) else ctype
    body = r.get("body")
    if isinstance(body, dict) and "string" in body:
        raw = body["string"]
        if isinstance(raw, bytes):
            if raw[:2] != b"\x1f\x8b":
                raise SystemExit("binary body that is not gzip")
            return status, ctype, gzip.decompress(raw), "gzip"
        return status, ctype, raw.encode("utf-8"), "string"
    if "parsed_body" in r:
        text = json.dumps(r["parsed_body"], ensure_ascii=False, separators=(",", ":"))
        return status, ctype, text.encode("utf-8"), "parsed_body"
    raise SystemExit("no body")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mirror", action="append", default=[], help="owner/name=PATH of a local clone")
    args = ap.parse_args()
    mirrors = dict(m.split("=", 1) for m in args.mirror)
    for cid, route, repo, path, n in SOURCES:
        mirror = mirrors.get(repo)
        if mirror is None:
            print(f"skip {cid}: no mirror of {repo}", file=sys.stderr)
            continue
        commit = git(mirror, "log", "-1", "--format=%H", "--", path).decode().strip()
        doc = yaml.safe_load(git(mirror, "show", f"{commit}:{path}"))
        status, ctype, data, form = response_body(doc["interactions"][n])
        ext = "sse" if ctype.startswith("text/event-stream") else "json"
        answer = f"answers/{cid}.{ext}"
        (HERE / answer).write_bytes(data)
        case_path = HERE / "cases" / f"{cid}.json"
        case = json.loads(case_path.read_text()) if case_path.exists() else {"id": cid}
        case.update({
            "route": route,
            "answer": answer,
            "status": status,
            "content_type": ctype,
            "source": {
                "repository": repo,
                "path": path,
                "commit": commit,
                "interaction": n,
                "body_form": form,
                "url": f"https://github.com/{repo}/blob/{commit}/{path}",
            },
        })
        case_path.write_text(json.dumps(case, indent=2, ensure_ascii=False) + "\n")
        print(cid, status, ctype, form, len(data))


if __name__ == "__main__":
    main()
