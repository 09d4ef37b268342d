#!/usr/bin/env python3
"""Soak: drive mixed traffic through a real `tokensaver serve` for a set time and report, every
interval, the server's RSS, open file descriptors, ledger size, request and error counts.

Traffic (all to 127.0.0.1, bounded in rate and time): ALLOW calls, SERVE repeats, streams (OpenAI
and Anthropic), BLOCKs (a budget too small, a loop), digest-mode calls (POST /gate then
/record), and reads (/ledger, /stats, /budget, /metrics, /readyz). Prompts are drawn from fixed
pools, so the gate's bounded caches (per-key fingerprints of the last 24 h, the answer store)
fill during the warm-up; after it, memory must stay flat. Run by scripts/soak.sh.
"""

import argparse
import collections
import json
import os
import random
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import http.client

PROVIDER_CREDENTIAL = "sk-soak-provider"
ADMIN_KEY = "tsa_demo-admin-key-not-for-production"
ADMIN_HASH = "ca9b790a34f739223b65bdd9124d2c340ee7ff59bc0140af9576813fb4cf82a8"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, timeout=30):
    end = time.time() + timeout
    while time.time() < end:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return True
        except OSError:
            time.sleep(0.05)
    return False


def new_key(binary, key_id):
    out = subprocess.run(
        [binary, "key", "new", "--id", key_id, "--profile", "none"],
        check=True, capture_output=True, text=True,
    ).stdout
    key = next(l.split(": ", 1)[1] for l in out.splitlines() if l.startswith("key "))
    secret_hash = next(l.split('"')[1] for l in out.splitlines() if l.startswith("secret_hash"))
    return key.strip(), secret_hash


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.counts = collections.Counter()
        self.errors = collections.Counter()
        self.latencies = []

    def add(self, kind, outcome, ms, error=None):
        with self.lock:
            self.counts[kind] += 1
            self.counts["verdict:" + outcome] += 1
            self.latencies.append(ms)
            if error:
                self.errors[error] += 1

    def take_latencies(self):
        with self.lock:
            l, self.latencies = self.latencies, []
        return sorted(l)


def request(port, method, path, body=None, headers=None, timeout=30):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        h = {"content-type": "application/json"}
        h.update(headers or {})
        conn.request(method, path, body=data, headers=h)
        resp = conn.getresponse()
        payload = resp.read()
        return resp.status, dict(resp.getheaders()), payload
    finally:
        conn.close()


class Driver:
    def __init__(self, args, ports, keys, digests):
        self.args, self.ports, self.keys, self.digests = args, ports, keys, digests
        self.stats = Stats()
        self.stop = threading.Event()
        self.counter_lock = threading.Lock()
        self.counters = collections.Counter()
        # The loop's requests go one at a time, 2 ms apart: identical BLOCKs decided in the same
        # millisecond collide in the ledger (tests/ops_soak_findings.rs, a known bug this soak
        # found); the soak measures everything else.
        self.loop_lock = threading.Lock()

    def next(self, what):
        """A per-kind counter: keys are taken in turn and each key cycles through its prompt
        pools, so every (key, prompt) is seen within the warm-up and no prompt repeats within
        the 120 s loop window unless it is meant to."""
        with self.counter_lock:
            self.counters[what] += 1
            return self.counters[what]

    def pick(self, kind, pool):
        n = self.next(kind)
        keys = self.keys["traffic"]
        return keys[n % len(keys)], (n // len(keys)) % pool

    def proxy(self, path, key, body, anthropic=False, human="1"):
        auth = {"x-api-key": key} if anthropic else {"authorization": "Bearer " + key}
        auth["x-tokensaver-human"] = human
        return request(self.ports["proxy"], "POST", path, body, auth)

    def one(self, rng):
        """One request of the mix; returns (kind, verdict-or-status, error-or-None)."""
        roll = rng.random()
        key = rng.choice(self.keys["traffic"])
        if roll < 0.40:  # ALLOW: sampled output
            key, i = self.pick("allow", 150)
            body = {"model": "gpt-4o-mini", "temperature": 0.7, "max_tokens": 64,
                    "messages": [{"role": "user", "content": "question %d" % i}]}
            st, h, _ = self.proxy("/v1/chat/completions", key, body)
            return "allow", h.get("x-tokensaver-verdict", str(st)), None if st == 200 else "allow:%d" % st
        if roll < 0.50:  # streams, OpenAI and Anthropic
            key, i = self.pick("stream", 80)
            if i % 2 == 0:
                body = {"model": "gpt-4o-mini", "temperature": 0.7, "stream": True,
                        "messages": [{"role": "user", "content": "stream %d" % i}]}
                st, h, payload = self.proxy("/v1/chat/completions", key, body)
                ok = st == 200 and payload.endswith(b"data: [DONE]\n\n")
            else:
                body = {"model": "claude-haiku-4-5", "max_tokens": 64, "stream": True,
                        "temperature": 0.7,
                        "messages": [{"role": "user", "content": "stream %d" % i}]}
                st, h, payload = self.proxy("/v1/messages", key, body, anthropic=True)
                ok = st == 200 and b"message_stop" in payload
            return "stream", h.get("x-tokensaver-verdict", str(st)), None if ok else "stream:%d" % st
        if roll < 0.65:  # SERVE: reproducible prompts, repeated, JSON or SSE
            key, i = self.pick("serve", 8)
            body = {"model": "gpt-4o-mini", "temperature": 0, "max_tokens": 64, "stream": i % 3 == 0,
                    "messages": [{"role": "user", "content": "repeatable %d" % i}]}
            st, h, _ = self.proxy("/v1/chat/completions", key, body)
            return "serve", h.get("x-tokensaver-verdict", str(st)), None if st == 200 else "serve:%d" % st
        if roll < 0.75:  # BLOCKs (unattended): a ceiling the budget cannot cover; a loop
            if rng.random() < 0.5:
                body = {"model": "gpt-4o", "max_tokens": 16000,
                        "messages": [{"role": "user", "content": "too big %d" % (self.next("big") % 200)}]}
                st, h, _ = self.proxy("/v1/chat/completions", self.keys["budget"], body, human="0")
                ok = st == 402
            else:
                body = {"model": "gpt-4o-mini", "temperature": 0.7, "max_tokens": 16,
                        "messages": [{"role": "user", "content": "the same thing again"}]}
                with self.loop_lock:
                    st, h, _ = self.proxy("/v1/chat/completions", self.keys["loop"], body, human="0")
                    time.sleep(0.002)
                ok = st in (200, 429)
            return "block", h.get("x-tokensaver-verdict", str(st)), None if ok else "block:%d" % st
        if roll < 0.90:  # digest mode: /gate, then /record for a forwarded decision
            digest = rng.choice(self.digests)
            auth = {"authorization": "Bearer " + self.keys["digest"]}
            st, _, payload = request(self.ports["api"], "POST", "/gate", digest, auth)
            if st != 200:
                return "digest", str(st), "gate:%d" % st
            answer = json.loads(payload)
            verdict = answer["verdict"]
            if verdict in ("ALLOW", "DOWNGRADE"):
                record = {"decision_id": answer["decision_id"], "wire": "json",
                          "served_model": answer["model_served"], "complete": True,
                          "usage": {"input": 20, "cache_write": 0, "cache_read": 0, "output": 8}}
                st, _, _ = request(self.ports["api"], "POST", "/record", record, auth)
                if st != 200:
                    return "digest", verdict, "record:%d" % st
            return "digest", verdict, None
        # reads
        which = rng.randrange(5)
        auth = {"authorization": "Bearer " + key}
        port, path = [("api", "/ledger"), ("api", "/stats"), ("api", "/budget"),
                      ("admin", "/metrics"), ("admin", "/readyz")][which]
        st, _, _ = request(self.ports[port], "GET", path, None, auth if port == "api" else None)
        return "read", str(st), None if st == 200 else "read %s:%d" % (path, st)

    def worker(self, index):
        rng = random.Random(self.args.seed * 1000 + index)
        period = self.args.workers / self.args.rate
        next_at = time.monotonic()
        while not self.stop.is_set():
            started = time.monotonic()
            try:
                kind, outcome, error = self.one(rng)
            except Exception as e:  # transport errors count as errors, never stop the soak
                kind, outcome, error = "transport", "error", "transport:" + type(e).__name__
            self.stats.add(kind, outcome, (time.monotonic() - started) * 1000, error)
            next_at += period
            delay = next_at - time.monotonic()
            if delay > 0:
                self.stop.wait(delay)
            else:
                next_at = time.monotonic()


def proc_figures(pid, data_dir):
    rss_kb = 0
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss_kb = int(line.split()[1])
    fds = len(os.listdir("/proc/%d/fd" % pid))
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    cpu_s = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    threads = int(fields[17])
    wal = os.path.join(data_dir, "tokensaver.db-wal")
    # The ledger's logical size (pages, whether in the file or still in the write-ahead log)
    # and the log itself (checkpointed at 8192 pages, 32 MiB, then reused).
    db = sqlite3.connect("file:%s?mode=ro" % os.path.join(data_dir, "tokensaver.db"), uri=True)
    try:
        pages = db.execute("PRAGMA page_count").fetchone()[0]
        page_size = db.execute("PRAGMA page_size").fetchone()[0]
    finally:
        db.close()
    wal_bytes = os.path.getsize(wal) if os.path.exists(wal) else 0
    return rss_kb / 1024, fds, pages * page_size / 1e6, wal_bytes / 1e6, cpu_s, threads


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bin", required=True)
    p.add_argument("--minutes", type=float, default=30)
    p.add_argument("--interval", type=float, default=60, help="seconds between reports")
    p.add_argument("--rate", type=float, default=25, help="requests per second, all kinds")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--keys", type=int, default=16, help="keys the gated traffic is spread over")
    p.add_argument("--warmup", type=float, default=None, help="minutes (default: a fifth, at least 2)")
    p.add_argument("--max-growth-mb", type=float, default=8.0,
                   help="RSS growth after the warm-up that fails the soak")
    p.add_argument("--csv", default=None)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--keep", action="store_true", help="keep the data dir and the server log")
    args = p.parse_args()
    warmup = args.warmup if args.warmup is not None else max(2.0, args.minutes / 5)
    warmup = min(warmup, args.minutes * 0.8)

    work = tempfile.mkdtemp(prefix="tokensaver-soak-")
    data_dir = os.path.join(work, "data")
    ports = {name: free_port() for name in ("proxy", "api", "admin", "mock")}
    keys = {}
    lines = []
    traffic = []
    # Enough keys that none meets the burst rule (120 requests a minute) at the default rate.
    for i in range(args.keys):
        k, h = new_key(args.bin, "soak-%d" % i)
        traffic.append(k)
        lines.append('[[keys]]\nid = "soak-%d"\nsecret_hash = "%s"\nhuman = true\n' % (i, h))
    keys["traffic"] = traffic
    for name, budget in (("budget", 1000), ("loop", None), ("digest", None)):
        k, h = new_key(args.bin, "soak-" + name)
        keys[name] = k
        lines.append('[[keys]]\nid = "soak-%s"\nsecret_hash = "%s"\nhuman = true\n' % (name, h)
                     + ('budget = { ceiling_micro_usd = %d, period = "lifetime" }\n' % budget if budget else ""))
    config = os.path.join(work, "tokensaver.toml")
    with open(config, "w") as f:
        f.write('[listen]\nproxy = "127.0.0.1:%d"\napi = "127.0.0.1:%d"\nadmin = "127.0.0.1:%d"\n\n'
                % (ports["proxy"], ports["api"], ports["admin"]))
        f.write('[data]\ndir = "%s"\n\n' % data_dir)
        for up, env in (("openai", "OPENAI_API_KEY"), ("anthropic", "ANTHROPIC_API_KEY")):
            f.write('[upstreams.%s]\nbase_url = "http://127.0.0.1:%d"\ncredential_env = "%s"\n\n'
                    % (up, ports["mock"], env))
        f.write('[admin]\nkey_hash = "%s"\n\n' % ADMIN_HASH)
        f.write("\n".join(lines))
        # A small answer store, so that it fills (and evicts) during the warm-up.
        f.write('\n[limits]\nanswer_store_bytes = 4_194_304\ncommit_interval_ms = 20\n')

    env = dict(os.environ, OPENAI_API_KEY=PROVIDER_CREDENTIAL, ANTHROPIC_API_KEY=PROVIDER_CREDENTIAL,
               RUST_LOG="warn")
    log = open(os.path.join(work, "serve.log"), "w")
    mock = subprocess.Popen([args.bin, "mock-provider", "--listen", "127.0.0.1:%d" % ports["mock"],
                             "--expected-credential", PROVIDER_CREDENTIAL],
                            stdout=subprocess.DEVNULL, stderr=log)
    server = subprocess.Popen([args.bin, "serve", "--config", config], env=env,
                              stdout=subprocess.DEVNULL, stderr=log)
    try:
        for name in ("mock", "proxy", "api", "admin"):
            if not wait_port(ports[name]):
                sys.exit("soak: %s did not listen" % name)
        # Digests for /gate: keyed with the digest key's secret, computed by the CLI.
        digests = []
        for i in range(200):
            body = json.dumps({"model": "gpt-4o-mini", "max_tokens": 32, "temperature": 0.7,
                               "messages": [{"role": "user", "content": "digest %d" % i}]})
            out = subprocess.run([args.bin, "digest", "-", "--key", keys["digest"]], input=body,
                                 check=True, capture_output=True, text=True).stdout
            digest = json.loads(out)
            digest["human"] = True
            digests.append(digest)

        driver = Driver(args, ports, keys, digests)
        threads = [threading.Thread(target=driver.worker, args=(i,), daemon=True)
                   for i in range(args.workers)]
        started = time.monotonic()
        for t in threads:
            t.start()
        print("soak: %.1f min at %.0f req/s (%d workers), report every %.0f s, warm-up %.1f min; "
              "server pid %d, data %s" % (args.minutes, args.rate, args.workers, args.interval,
                                          warmup, server.pid, data_dir), flush=True)
        header = ("t_min", "rss_mb", "fds", "threads", "db_mb", "wal_mb", "cpu_s", "requests",
                  "req_s", "errors", "p50_ms", "p99_ms", "verdicts")
        print("%6s %7s %4s %7s %6s %6s %7s %8s %6s %6s %6s %7s  %s" % header, flush=True)
        rows = []
        prev_requests = 0
        end = started + args.minutes * 60
        next_report = started + args.interval
        while True:
            now = time.monotonic()
            if server.poll() is not None:
                sys.exit("soak: the server exited (%s)" % server.returncode)
            if now >= next_report or now >= end:
                rss, fds, db, wal, cpu, nthreads = proc_figures(server.pid, data_dir)
                lat = driver.stats.take_latencies()
                with driver.stats.lock:
                    total = sum(v for k, v in driver.stats.counts.items() if not k.startswith("verdict:"))
                    errors = sum(driver.stats.errors.values())
                    verdicts = {k[8:]: v for k, v in driver.stats.counts.items() if k.startswith("verdict:")}
                pct = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] if lat else 0.0
                t_min = (now - started) / 60
                row = (t_min, rss, fds, nthreads, db, wal, cpu, total,
                       (total - prev_requests) / max(1e-9, args.interval), errors, pct(0.5), pct(0.99))
                prev_requests = total
                rows.append(row)
                short = " ".join("%s=%d" % (k, verdicts[k]) for k in
                                 ("ALLOW", "SERVE", "DOWNGRADE", "CHALLENGE", "BLOCK") if k in verdicts)
                print("%6.1f %7.1f %4d %7d %6.1f %6.1f %7.1f %8d %6.1f %6d %6.1f %7.1f  %s"
                      % (row + (short,)), flush=True)
                next_report += args.interval
                if now >= end:
                    break
            time.sleep(min(1.0, max(0.05, min(next_report, end) - time.monotonic())))
        driver.stop.set()
        for t in threads:
            t.join(timeout=60)

        if args.csv:
            with open(args.csv, "w") as f:
                f.write(",".join(header[:-1]) + "\n")
                for r in rows:
                    f.write(",".join("%.3f" % x if isinstance(x, float) else str(x) for x in r) + "\n")
        T, RSS, FDS, THR, DB, WAL, CPU, REQ, RATE, ERR = range(10)
        after = [r for r in rows if r[T] >= warmup]
        base = after[0] if after else rows[-1]
        last = rows[-1]
        peak = max(r[RSS] for r in after) if after else last[RSS]
        growth = last[RSS] - base[RSS]
        # SQLite's page cache (cache_size 64 MiB on the writer) holds the ledger's pages as the
        # database grows: RSS may follow the database, up to that cap. What is left is ours.
        db_growth = max(0.0, min(last[DB], 64 * 1.048576) - min(base[DB], 64 * 1.048576))
        unexplained = growth - db_growth
        minutes = max(1e-9, last[T] - base[T])
        print("\nsoak summary: %.1f min, %d requests (%.1f/s), %d errors %s" % (
            last[T], last[REQ], last[REQ] / max(1e-9, last[T] * 60), last[ERR],
            dict(driver.stats.errors) or ""))
        print("  kinds: %s" % dict(sorted((k, v) for k, v in driver.stats.counts.items()
                                         if not k.startswith("verdict:"))))
        print("  verdicts: %s" % dict(sorted((k[8:], v) for k, v in driver.stats.counts.items()
                                            if k.startswith("verdict:"))))
        print("  RSS after the warm-up (%.1f min): %.1f MB -> %.1f MB at the end (peak %.1f MB): "
              "%+.1f MB over %.1f min, of which the ledger database grew %.1f MB; unexplained %+.1f MB"
              % (base[T], base[RSS], last[RSS], peak, growth, minutes, db_growth, unexplained))
        print("  open fds %d -> %d; threads %d -> %d; ledger database %.1f MB -> %.1f MB, WAL %.1f MB;"
              " server CPU %.0f s" % (base[FDS], last[FDS], base[THR], last[THR], base[DB], last[DB],
                                      last[WAL], last[CPU]))
        failed = []
        if last[ERR] > 0:
            failed.append("%d errors" % last[ERR])
        if unexplained > args.max_growth_mb:
            failed.append("RSS grew %.1f MB after the warm-up beyond the ledger's page cache" % unexplained)
        if last[FDS] > base[FDS] + 16:
            failed.append("open fds grew %d -> %d" % (base[FDS], last[FDS]))
        # SIGTERM drains; the server must exit 0.
        server.terminate()
        code = server.wait(timeout=90)
        print("  SIGTERM: the server exited %d" % code)
        if code != 0:
            failed.append("exit status %d" % code)
        if failed:
            print("soak FAILED: " + "; ".join(failed))
            sys.exit(1)
        print("soak passed")
    finally:
        for proc in (server, mock):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        log.close()
        if args.keep:
            print("soak: kept %s" % work)
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
