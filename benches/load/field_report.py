#!/usr/bin/env python3
"""The field method's figures from field.sh's runs (results.jsonl), and their table.

usage: field_report.py RESULTS.jsonl "BOUNDS_MS"  > field.json
       field_report.py --table field.json

Everything is computed from the runs themselves: added = lane - the mock directly, in the same
run; the frontier at a bound is the highest throughput among the sweep's rungs whose p99 is
within it (no errors, no non-2xx); a stream rung is sustained when no frame came later than
the stall threshold and none failed; memory growth is the least-squares slope of RSS over the
fixed-load run after its first minute.
"""
import json, sys


def summarise(rows, bounds):
    by = lambda kind: [r for r in rows if r["kind"] == kind]
    meta = by("meta")[0]
    c1 = {r["lane"]: r["result"] for r in by("c1")}
    direct = c1.get("direct")
    s = {"meta": meta, "c1": {}, "frontier": {}, "streams": {}, "memory": {}}
    for lane, r in c1.items():
        lat = r["latency_us"]
        s["c1"][lane] = {
            "rps": r["rps"], "p50_us": lat["p50"], "p99_us": lat["p99"], "p999_us": lat["p999"],
            "max_us": lat["max"], "errors": r["errors"], "non2xx": r["non2xx"],
            "added_p50_us": lat["p50"] - direct["latency_us"]["p50"] if direct else None,
            "added_p99_us": lat["p99"] - direct["latency_us"]["p99"] if direct else None,
        }
    sweep = by("sweep")
    for lane in sorted({r["lane"] for r in sweep}):
        rungs = sorted((r for r in sweep if r["lane"] == lane), key=lambda r: r["conns"])
        s["frontier"][lane] = {
            "rungs": [{"conns": r["conns"], "rps": r["result"]["rps"], "p99_us": r["result"]["latency_us"]["p99"],
                       "clean": r["result"]["errors"] == 0 and r["result"]["non2xx"] == 0} for r in rungs],
            "at_bound": {},
        }
        for b in bounds:
            ok = [x for x in s["frontier"][lane]["rungs"] if x["clean"] and x["p99_us"] <= b * 1000]
            best = max(ok, key=lambda x: x["rps"]) if ok else None
            s["frontier"][lane]["at_bound"][f"{b}ms"] = (
                {"rps": best["rps"], "conns": best["conns"]} if best else None)
    sc1 = {r["lane"]: r["result"] for r in by("stream_c1")}
    sd = sc1.get("stream_direct")
    streams = by("stream")
    for lane, r in sc1.items():
        rungs = sorted((x for x in streams if x["lane"] == lane), key=lambda x: x["conns"])
        clean = [x for x in rungs if x["result"]["stalled"] == 0 and x["result"]["errors"] == 0
                 and x["result"]["non2xx"] == 0 and x["result"]["requests"] > 0]
        s["streams"][lane] = {
            "first_frame_p50_us": r["first_frame_us"]["p50"], "first_frame_p99_us": r["first_frame_us"]["p99"],
            "gap_p99_us": r["gap_us"]["p99"], "gap_max_us": r["gap_us"]["max"], "stalled_c1": r["stalled"],
            "added_first_frame_p50_us": r["first_frame_us"]["p50"] - sd["first_frame_us"]["p50"] if sd else None,
            "added_first_frame_p99_us": r["first_frame_us"]["p99"] - sd["first_frame_us"]["p99"] if sd else None,
            "added_gap_p99_us": r["gap_us"]["p99"] - sd["gap_us"]["p99"] if sd else None,
            "rungs": [{"conns": x["conns"], "streams": x["result"]["requests"], "stalled": x["result"]["stalled"],
                       "gap_p99_us": x["result"]["gap_us"]["p99"], "gap_max_us": x["result"]["gap_us"]["max"],
                       "errors": x["result"]["errors"] + x["result"]["non2xx"]} for x in rungs],
            # the largest rung with every rung up to it clean: a stall at 64 is not undone by luck at 256
            "sustained": 0,
        }
        for x in rungs:
            if x not in clean:
                break
            s["streams"][lane]["sustained"] = x["conns"]
    idle = {r["lane"]: r["kib"] for r in by("idle_rss")}
    fresh = {r["lane"]: r["kib"] for r in by("fresh_rss")}
    for r in by("memory"):
        warm = meta.get("mem_warm_secs", 60)
        pts = [(t, kib) for t, kib in r["samples"] if t >= warm]
        slope = None
        if len(pts) >= 3:
            n = len(pts); mt = sum(t for t, _ in pts) / n; mk = sum(k for _, k in pts) / n
            den = sum((t - mt) ** 2 for t, _ in pts)
            slope = sum((t - mt) * (k - mk) for t, k in pts) / den * 60 if den else None
        steady = sorted(k for _, k in pts)[len(pts) // 2] if pts else None
        s["memory"][r["lane"]] = {
            "idle_kib": fresh.get(r["lane"], idle.get(r["lane"])), "steady_kib": steady, "first_kib": r["samples"][0][1] if r["samples"] else None,
            "last_kib": r["samples"][-1][1] if r["samples"] else None,
            "growth_kib_per_min": round(slope, 1) if slope is not None else None, "warm_secs": warm,
            "rate": r["rate"], "secs": r["secs"], "paced": r["paced"], "samples": r["samples"],
        }
    s["targets"] = targets(s)
    return s


def targets(s):
    t = {}
    c1 = s["c1"]
    if {"passthrough", "allow"} <= c1.keys():
        pt = c1["passthrough"]["added_p99_us"]
        t["allow_added_p99_within_pt_plus_150us"] = {"allow": c1["allow"]["added_p99_us"], "passthrough": pt,
                                                     "met": c1["allow"]["added_p99_us"] <= pt + 150}
        if "serve" in c1:
            t["serve_added_p99_within_pt"] = {"serve": c1["serve"]["added_p99_us"], "passthrough": pt,
                                              "met": c1["serve"]["added_p99_us"] <= pt}
    f = s["frontier"]
    if {"passthrough", "allow"} <= f.keys():
        a, p = f["allow"]["at_bound"].get("5ms"), f["passthrough"]["at_bound"].get("5ms")
        if a and p:
            t["allow_frontier_5ms_at_least_60pct_pt"] = {"ratio": round(a["rps"] / p["rps"], 3), "met": a["rps"] >= 0.6 * p["rps"]}
    st = s["streams"]
    if {"stream_passthrough", "stream_allow"} <= st.keys():
        a, p = st["stream_allow"], st["stream_passthrough"]
        t["stream_added_first_frame_within_pt_plus_200us"] = {
            "allow": a["added_first_frame_p50_us"], "passthrough": p["added_first_frame_p50_us"],
            "met": a["added_first_frame_p50_us"] <= p["added_first_frame_p50_us"] + 200}
        t["streams_sustained_at_least_80pct_pt"] = {
            "allow": a["sustained"], "passthrough": p["sustained"],
            "met": p["sustained"] > 0 and a["sustained"] >= 0.8 * p["sustained"]}
    m = s["memory"].get("tokensaver")
    if m and m["growth_kib_per_min"] is not None:
        t["memory_growth_below_1MiB_per_min"] = {"kib_per_min": m["growth_kib_per_min"], "met": m["growth_kib_per_min"] < 1024}
    return t


def table(s):
    out = [f"field method, commit {s['meta']['commit']}: gateway on CPU {s['meta']['gate_cpus']}, "
           f"mock and generator on CPU {s['meta']['load_cpus']} (of {s['meta']['nproc']}); load average {s['meta']['loadavg']}", "",
           "| concurrency 1 | req/s | p50 µs | p99 µs | p99.9 µs | added p50 | added p99 |", "|---|---|---|---|---|---|---|"]
    for lane, r in s["c1"].items():
        out.append(f"| {lane} | {r['rps']:.0f} | {r['p50_us']} | {r['p99_us']} | {r['p999_us']} | "
                   f"{r['added_p50_us']:+} | {r['added_p99_us']:+} |")
    bounds = list(next(iter(s["frontier"].values()))["at_bound"].keys()) if s["frontier"] else []
    out += ["", "| throughput at p99 ≤ | " + " | ".join(bounds) + " |", "|---|" + "---|" * len(bounds)]
    for lane, f in s["frontier"].items():
        cells = [f"{v['rps']:.0f} (c={v['conns']})" if v else "—" for v in f["at_bound"].values()]
        out.append(f"| {lane} | " + " | ".join(cells) + " |")
    out += ["", "rungs (connections: req/s, p99 µs):"]
    for lane, f in s["frontier"].items():
        out.append(f"  {lane}: " + ", ".join(f"{x['conns']}: {x['rps']:.0f}/{x['p99_us']}" + ("" if x["clean"] else "!") for x in f["rungs"]))
    if s["streams"]:
        out += ["", "| streams | first frame p50 µs | added | first frame p99 | inter-frame p99 µs | added | sustained streams |",
                "|---|---|---|---|---|---|---|"]
        for lane, r in s["streams"].items():
            out.append(f"| {lane} | {r['first_frame_p50_us']} | {r['added_first_frame_p50_us']:+} | {r['first_frame_p99_us']} | "
                       f"{r['gap_p99_us']} | {r['added_gap_p99_us']:+} | {r['sustained']} |")
        out += ["", "stream rungs (connections: streams, stalled, inter-frame p99 µs, max µs):"]
        for lane, r in s["streams"].items():
            out.append(f"  {lane}: " + ", ".join(f"{x['conns']}: {x['streams']}/{x['stalled']}/{x['gap_p99_us']}/{x['gap_max_us']}" for x in r["rungs"]))
    if s["memory"]:
        out += ["", "| memory | idle KiB | steady KiB | growth KiB/min (after the warm-up) |", "|---|---|---|---|"]
        for lane, m in s["memory"].items():
            out.append(f"| {lane} | {m['idle_kib']} | {m['steady_kib']} | {m['growth_kib_per_min']} |")
    out += ["", "targets:"]
    for name, t in s["targets"].items():
        out.append(f"  {'met    ' if t['met'] else 'NOT met'} {name}: {json.dumps({k: v for k, v in t.items() if k != 'met'})}")
    return "\n".join(out)


if __name__ == "__main__":
    if sys.argv[1] == "--table":
        print(table(json.load(open(sys.argv[2]))))
    else:
        rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
        bounds = [float(b) if "." in b else int(b) for b in sys.argv[2].split()]
        print(json.dumps(summarise(rows, bounds), indent=1))
