"""A caching-naive tool-use agent on the official `anthropic` SDK, run as its own process.

    python anthropic_agent.py BASE_URL API_KEY PROMPT [--model M] [--max-steps N]

The loop most scripts and many agents are: one system prompt, two tools, and the whole history
sent again on every step, with no `cache_control` anywhere. It runs each tool the model asks
for, appends the call and its result, and calls again until the model answers in text.

Prints one JSON line per model call (`{"usage": {...}}`, the provider's usage as the SDK parsed
it), then `{"final": TEXT}`; on a refusal prints the SDK's error class and message and exits 1.
"""

import argparse
import json
import subprocess
import sys

from anthropic import Anthropic, APIStatusError

parser = argparse.ArgumentParser()
parser.add_argument("base_url")
parser.add_argument("api_key")
parser.add_argument("prompt")
parser.add_argument("--model", default="claude-sonnet-4-5")
parser.add_argument("--max-steps", type=int, default=40)
args = parser.parse_args()

# A coding agent's standing instructions: long and the same on every step (what prompt caching
# is for). About 14,000 characters.
SYSTEM = "You are a careful coding agent working in a repository.\n" + "".join(
    f"Rule {i}: before you change module {i}, read it, keep its style, run the tests of "
    f"package {i * 7 % 13}, and report in one line what changed and why. "
    for i in range(100)
)

TOOLS = [
    {
        "name": "run_command",
        "description": "Run a shell command in the repository and return what it printed.",
        "input_schema": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    },
    {
        "name": "read_file",
        "description": "Read a file of the repository.",
        "input_schema": {
            "type": "object",
            "properties": {"path": {"type": "string"}},
            "required": ["path"],
        },
    },
]


def run_tool(name: str, tool_input: dict) -> str:
    if name == "run_command":
        done = subprocess.run(
            ["bash", "-lc", tool_input.get("command", "")], capture_output=True, text=True
        )
        return done.stdout + done.stderr
    try:
        with open(tool_input.get("path", ""), encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        return f"error: {e.strerror}"


client = Anthropic(base_url=args.base_url, api_key=args.api_key, max_retries=0)
messages = [{"role": "user", "content": args.prompt}]
try:
    for _ in range(args.max_steps):
        reply = client.messages.create(
            model=args.model, max_tokens=1024, system=SYSTEM, tools=TOOLS, messages=messages
        )
        u = reply.usage
        print(json.dumps({"usage": {
            "input_tokens": u.input_tokens,
            "cache_creation_input_tokens": u.cache_creation_input_tokens or 0,
            "cache_read_input_tokens": u.cache_read_input_tokens or 0,
            "output_tokens": u.output_tokens,
        }}), flush=True)
        calls = [b for b in reply.content if b.type == "tool_use"]
        if not calls:
            text = "".join(b.text for b in reply.content if b.type == "text")
            print(json.dumps({"final": text}))
            break
        messages.append({
            "role": "assistant",
            "content": [b.model_dump(exclude_none=True) for b in reply.content],
        })
        messages.append({
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": c.id, "content": run_tool(c.name, c.input)}
                for c in calls
            ],
        })
except APIStatusError as e:
    print(f"{type(e).__name__}: {e}")
    sys.exit(1)
