#!/usr/bin/env python3
"""Generate the load test's inputs in OUT_DIR:

  config.toml   the example config with ports, data dir and upstreams rewritten, and many keys
                (human = true, no budget) so no key reaches the runaway rules during a run
  keys_allow.txt / keys_serve.txt   one full key per line (tsk_<id>_<secret>)
  body_prefix.txt / body_suffix.txt a realistic ~8 KB OpenAI chat request (system ~2 KB,
                8 turns, 2 tools) split around the point where the Lua script inserts a
                per-request marker (so every ALLOW request has its own fingerprint)

usage: gen.py SRC_CONFIG OUT_DIR PROXY_PORT API_PORT ADMIN_PORT MOCK_PORT N_ALLOW N_SERVE BIN

The keys' hashes come from `BIN key hash` (the server's own code), never re-implemented here.
"""
import json, os, re, secrets, subprocess, sys

src, out, proxy, api, admin, mock, n_allow, n_serve, bin_ = sys.argv[1:10]
n_allow, n_serve = int(n_allow), int(n_serve)
os.makedirs(out, exist_ok=True)

WORDS = ["the", "request", "function", "returns", "a", "value", "when", "error", "user", "should",
         "config", "handler", '"quoted"', "path/to/file.rs", "line", "build", "test", "cache",
         "async", "token", "budget", "model", "answer", "because", "then", "check", "é", "→"]

def prose(seed, n):
    s, i = [], seed * 2654435761 % (1 << 64)
    total = 0
    while total < n:
        i = (i * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        w = WORDS[(i >> 33) % len(WORDS)] + ("\n" if (i >> 20) % 23 == 0 else "." if (i >> 20) % 23 == 1 else " ")
        s.append(w); total += len(w.encode())
    return "".join(s)

tools = [
    {"type": "function", "function": {"name": "read_file",
        "description": "Read a file from the workspace and return its contents.",
        "parameters": {"type": "object", "properties": {
            "path": {"type": "string", "description": "Path relative to the workspace root"},
            "max_bytes": {"type": "integer", "minimum": 1}}, "required": ["path"]}}},
    {"type": "function", "function": {"name": "run_tests",
        "description": "Run the test suite, optionally filtered, and return the summary.",
        "parameters": {"type": "object", "properties": {
            "filter": {"type": "string"},
            "timeout_secs": {"type": "integer", "minimum": 1, "maximum": 600}}}}},
]
messages = [{"role": "system", "content": prose(0, 2000)}]
for t in range(8):
    text = prose(t + 1, 640)
    m = [{"role": "user", "content": text},
         {"role": "assistant", "content": None, "tool_calls": [{"id": f"call_{t}", "type": "function",
            "function": {"name": "read_file", "arguments": json.dumps({"path": f"src/mod{t}.rs"})}}]},
         {"role": "tool", "tool_call_id": f"call_{t-1}", "content": text},
         {"role": "assistant", "content": text}][t % 4]
    messages.append(m)
messages.append({"role": "user", "content": "@@MARK@@ " + prose(999, 900)})
body = json.dumps({"model": "gpt-4o", "messages": messages, "tools": tools,
                   "temperature": 0, "max_tokens": 1024}, ensure_ascii=False, separators=(",", ":"))
pre, suf = body.split("@@MARK@@")
open(f"{out}/body_prefix.txt", "w").write(pre)
open(f"{out}/body_suffix.txt", "w").write(suf)

cfg = open(src).read()
cfg = re.sub(r'(?m)^proxy = .*$', f'proxy = "127.0.0.1:{proxy}"', cfg)
cfg = re.sub(r'(?m)^api = .*$', f'api = "127.0.0.1:{api}"', cfg)
cfg = re.sub(r'(?m)^admin = .*$', f'admin = "127.0.0.1:{admin}"', cfg)
cfg = re.sub(r'(?m)^dir = .*$', f'dir = "{out}/data"', cfg)
cfg = re.sub(r'(?m)^base_url = .*$', f'base_url = "http://127.0.0.1:{mock}"', cfg)
assert cfg.count(f"127.0.0.1:{mock}") == 2, "upstream base_url not rewritten"
keys = []
for name, n in (("a", n_allow), ("s", n_serve)):
    with open(f"{out}/keys_{'allow' if name == 'a' else 'serve'}.txt", "w") as f:
        for i in range(n):
            key = f"tsk_{name}{i}_{secrets.token_hex(24)}"
            keys.append(key)
            f.write(key + "\n")
hashed = subprocess.run([bin_, "key", "hash"], input="\n".join(keys) + "\n", text=True,
                        capture_output=True, check=True).stdout.split("\n")
lines = []
for row in filter(None, hashed):
    kid, h = row.split(" ")
    lines.append(f'[[keys]]\nid = "{kid}"\nsecret_hash = "{h}"\nhuman = true\n')
assert len(lines) == len(keys), "every key hashed"
# keys go before the first table that follows the demo key
idx = cfg.index("[prices.")
cfg = cfg[:idx] + "\n".join(lines) + "\n" + cfg[idx:]
open(f"{out}/config.toml", "w").write(cfg)
print(f"body {len(body.encode())} bytes; {n_allow} ALLOW keys, {n_serve} SERVE keys")
