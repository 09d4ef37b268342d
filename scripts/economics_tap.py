"""A recording pass-through for the economics harness: what a client sent, what it got back.

    tap = Tap("http://127.0.0.1:9999")     # forwards every request there, byte for byte
    tap.url                                 # point a client (or the gate's upstream) here
    tap.take()                              # the records since the last take(), then forgets them

It sits in the same place in both arms, so both are measured by the same code: control
`client → tap → provider`; treatment `client → tap → gate → tap → provider` (the first tap
records the gate's verdict and receipt, the second what the provider billed). Bodies pass
unchanged both ways; only hop-by-hop headers are dropped and `accept-encoding` is removed, so
that an answer arrives uncompressed and its usage can be read. Streams are forwarded as they
arrive. For each exchange it records the route, status, the usage the answer reports
(normalised to four parts: uncached input, cache write, cache read, output), the tool calls it
asks for, the model, and — behind the gate — the verdict, reason and finding codes of the
signed receipt. Nothing here is an estimate: a figure the answer does not carry is absent.
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
       "transfer-encoding", "upgrade", "host", "accept-encoding", "content-length"}
UPSTREAM_TIMEOUT = 600


def _json(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return None


def _usage_parts(u: dict | None, route: str) -> dict | None:
    """Provider usage → the four parts (OpenAI counts cached tokens inside the prompt)."""
    if not isinstance(u, dict):
        return None
    n = lambda k: int(u.get(k) or 0)  # noqa: E731
    if route == "/v1/messages":
        if "input_tokens" not in u and "output_tokens" not in u:
            return None
        parts = {"input_uncached": n("input_tokens"), "cache_write": n("cache_creation_input_tokens"),
                 "cache_read": n("cache_read_input_tokens"), "output": n("output_tokens")}
        # One-hour entries are priced apart (2x input, not 1.25x): keep their share of the write.
        one_hour = int((u.get("cache_creation") or {}).get("ephemeral_1h_input_tokens") or 0)
        if one_hour:
            parts["cache_write_1h"] = one_hour
        return parts
    if "prompt_tokens" in u:  # chat completions
        cached = int((u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
        return {"input_uncached": n("prompt_tokens") - cached, "cache_write": 0,
                "cache_read": cached, "output": n("completion_tokens")}
    if "input_tokens" in u:  # responses
        cached = int((u.get("input_tokens_details") or {}).get("cached_tokens") or 0)
        return {"input_uncached": n("input_tokens") - cached, "cache_write": 0,
                "cache_read": cached, "output": n("output_tokens")}
    return None


TOOL_ITEMS = {"function_call", "local_shell_call", "custom_tool_call"}


def read_answer(route: str, body: bytes, sse: bool) -> dict:
    """Usage, tool calls and model of one answer (JSON or SSE)."""
    text = body.decode("utf-8", "replace")
    usage, tools, model = None, 0, None
    if not sse:
        v = _json(text)
        if not isinstance(v, dict):
            return {"usage": None, "tool_calls": 0, "model": None}
        model = v.get("model")
        usage = _usage_parts(v.get("usage"), route)
        if route == "/v1/messages":
            tools = sum(1 for b in v.get("content") or [] if b.get("type") == "tool_use")
        elif "choices" in v:
            for c in v.get("choices") or []:
                tools += len(((c.get("message") or {}).get("tool_calls")) or [])
        else:
            tools = sum(1 for i in v.get("output") or [] if i.get("type") in TOOL_ITEMS)
        return {"usage": usage, "tool_calls": tools, "model": model}
    anthropic = {}
    for line in text.splitlines():
        if not line.startswith("data:"):
            continue
        ev = _json(line[5:].strip())
        if not isinstance(ev, dict):
            continue
        kind = ev.get("type")
        if route == "/v1/messages":
            if kind == "message_start":
                msg = ev.get("message") or {}
                model = msg.get("model")
                anthropic.update(msg.get("usage") or {})
            elif kind == "message_delta":
                anthropic.update(ev.get("usage") or {})
            elif kind == "content_block_start" and (ev.get("content_block") or {}).get("type") == "tool_use":
                tools += 1
        elif kind in ("response.completed", "response.incomplete", "response.failed"):
            r = ev.get("response") or {}
            model = r.get("model")
            usage = _usage_parts(r.get("usage"), route)
            tools = sum(1 for i in r.get("output") or [] if i.get("type") in TOOL_ITEMS)
        elif "choices" in ev:  # chat completions chunk
            model = ev.get("model") or model
            if ev.get("usage"):
                usage = _usage_parts(ev["usage"], route)
            for c in ev.get("choices") or []:
                for tc in ((c.get("delta") or {}).get("tool_calls")) or []:
                    if tc.get("id"):
                        tools += 1
    if route == "/v1/messages" and anthropic:
        usage = _usage_parts(anthropic, route)
    return {"usage": usage, "tool_calls": tools, "model": model}


def read_receipt(header: str | None) -> dict:
    """Verdict details from the gate's `x-tokensaver-receipt` (base64 of the signed envelope)."""
    if not header:
        return {}
    try:
        envelope = json.loads(base64.b64decode(header))
        body = json.loads(base64.b64decode(envelope["body"]))
    except (ValueError, KeyError, TypeError):
        return {}
    return {"reason": body.get("reason"), "findings": list(body.get("findings") or []),
            "score": body.get("score"), "paced_ms": body.get("paced_ms"),
            "worst_case_tokens_avoided": body.get("worst_case_tokens_avoided")}


class Tap:
    """A pass-through on a free loopback port that records every exchange."""

    def __init__(self, upstream: str, bodies: Path | None = None):
        u = urlsplit(upstream)
        self.scheme, self.host = u.scheme, u.hostname
        self.port = u.port or (443 if u.scheme == "https" else 80)
        self.prefix = u.path.rstrip("/")
        self.bodies = bodies
        self.records: list[dict] = []
        self.lock = threading.Lock()
        self.seq = 0
        tap = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def _any(self):
                tap._exchange(self)

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = _any

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def take(self) -> list[dict]:
        with self.lock:
            out, self.records = self.records, []
        return sorted(out, key=lambda r: r["seq"])

    def _connection(self):
        if self.scheme == "https":
            return http.client.HTTPSConnection(self.host, self.port, timeout=UPSTREAM_TIMEOUT)
        return http.client.HTTPConnection(self.host, self.port, timeout=UPSTREAM_TIMEOUT)

    def _exchange(self, h: BaseHTTPRequestHandler) -> None:
        started = time.time()
        with self.lock:
            self.seq += 1
            seq = self.seq
        body = self._read_body(h)
        path = h.path.split("?", 1)[0]
        headers = {k: v for k, v in h.headers.items() if k.lower() not in HOP}
        conn = self._connection()
        try:
            conn.request(h.command, self.prefix + h.path, body=body or None, headers=headers)
            resp = conn.getresponse()
        except OSError as e:
            conn.close()
            msg = json.dumps({"error": {"message": f"tap: upstream unreachable: {e}"}}).encode()
            h.send_response(502)
            h.send_header("content-type", "application/json")
            h.send_header("content-length", str(len(msg)))
            h.end_headers()
            h.wfile.write(msg)
            self._record(seq, h, path, body, 502, {}, b"", started)
            return
        h.send_response(resp.status)
        kept = {}
        for k, v in resp.getheaders():
            if k.lower() in HOP:
                continue
            kept[k.lower()] = v
            h.send_header(k, v)
        received = bytearray()
        length = resp.getheader("content-length")
        try:
            if h.command == "HEAD" or resp.status in (204, 304):
                h.send_header("content-length", length or "0")
                h.end_headers()
            elif length is not None:
                data = resp.read()
                received += data
                h.send_header("content-length", str(len(data)))
                h.end_headers()
                h.wfile.write(data)
            else:
                h.send_header("transfer-encoding", "chunked")
                h.end_headers()
                while True:
                    chunk = resp.read1(65536)
                    if not chunk:
                        break
                    received += chunk
                    h.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    h.wfile.flush()
                h.wfile.write(b"0\r\n\r\n")
            h.wfile.flush()
        except OSError:
            h.close_connection = True
        finally:
            conn.close()
        self._record(seq, h, path, body, resp.status, kept, bytes(received), started)

    def _read_body(self, h: BaseHTTPRequestHandler) -> bytes:
        if h.headers.get("transfer-encoding", "").lower() == "chunked":
            out = bytearray()
            while True:
                size = int(h.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while h.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return bytes(out)
                out += h.rfile.read(size)
                h.rfile.readline()
        n = int(h.headers.get("content-length") or 0)
        return h.rfile.read(n) if n else b""

    def _record(self, seq, h, path, body, status, headers, received, started) -> None:
        request = _json(body.decode("utf-8", "replace")) if body else None
        request = request if isinstance(request, dict) else {}
        sse = "text/event-stream" in headers.get("content-type", "")
        answer = read_answer(path, received, sse) if 200 <= status < 300 else \
            {"usage": None, "tool_calls": 0, "model": None}
        rec = {
            "seq": seq,
            "at_unix_ms": int(started * 1000),
            "ms": int((time.time() - started) * 1000),
            "method": h.command,
            "path": path,
            "status": status,
            "stream": bool(request.get("stream")),
            "model_requested": request.get("model"),
            "model_reported": answer["model"],
            "usage": answer["usage"],
            "tool_calls": answer["tool_calls"],
            "request_bytes": len(body),
            "request_digest": None,
            "verdict": headers.get("x-tokensaver-verdict"),
            # The built-in provider names itself on every answer (`x-mock-provider`).
            "provider_identity": headers.get("x-mock-provider"),
        }
        rec.update(read_receipt(headers.get("x-tokensaver-receipt")))
        if body:
            rec["request_digest"] = hashlib.blake2b(body, digest_size=16).hexdigest()
        if self.bodies is not None and body and path in ("/v1/messages", "/v1/chat/completions",
                                                         "/v1/responses"):
            self.bodies.mkdir(parents=True, exist_ok=True)
            f = self.bodies / f"{int(started * 1000)}-{seq}.json"
            f.write_bytes(body)
            rec["body_file"] = str(f)
        with self.lock:
            self.records.append(rec)
