#!/usr/bin/env python3
"""What each slow request waited on: a concurrency-1 trace matched with a scheduler profile.

usage: tail_profile.py TRACE T0_NS TIMEHIST [SLOW_SHARE [SAMPLES]]

TRACE     field_load's `TRACE=` file: one line per answer, `start_us latency_us` from its start
T0_NS     the trace's zero on CLOCK_MONOTONIC (field_load prints `t0_monotonic_ns N`)
TIMEHIST  `perf sched timehist -i DATA` of the gateway's CPU(s), recorded with
          `perf sched record -k CLOCK_MONOTONIC -C CPUS` (so both use one clock)

For every request it sums, per thread name, the time each thread ran on the gateway's CPU
while the request was open, and the time the CPU was idle (the request was elsewhere: on the
wire, at the mock, in the generator). Printed for the slowest SLOW_SHARE (default 1 %), the
band around p99 and the median band (45-55 %), so the difference says what the slow ones owe their extra time to.

SAMPLES   optional `perf script -F comm,tid,time,ip,sym` of CPU samples on the same CPU(s) and
          clock: the functions the gateway's threads ran in their long runs (over 500 us) against
          those in all their runs, so a run that is long by its own work is named.
"""
import bisect, collections, re, sys


def intervals(timehist):
    """(start_s, end_s, name) of every run on the CPU, from timehist's switch-out lines."""
    out = []
    line_re = re.compile(r"^\s*(\d+\.\d+)\s+\[(\d+)\]\s+(.+?)\s+(\d+\.\d+)\s+(\d+\.\d+)\s+(\d+\.\d+)\s*$")
    for line in open(timehist, errors="replace"):
        m = line_re.match(line)
        if not m:
            continue
        end, name, run_ms = float(m.group(1)), m.group(3), float(m.group(6))
        # "name[tid/pid]" or "name[tid]": the thread's name is what tells the parts apart.
        name = re.sub(r"\[\d+(/\d+)?\]$", "", name).strip() or "?"
        out.append((end - run_ms / 1000.0, end, name))
    out.sort()
    return out


def attribute(runs, starts, lo, hi):
    """Seconds per thread name that overlap [lo, hi)."""
    per = collections.Counter()
    i = max(0, bisect.bisect_left(starts, lo) - 64)  # a run may start before lo
    while i < len(runs) and runs[i][0] < hi:
        s, e, name = runs[i]
        o = min(e, hi) - max(s, lo)
        if o > 0:
            per[name] += o
        i += 1
    return per


def main():
    trace, t0_ns, timehist = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    share = float(sys.argv[4]) if len(sys.argv) > 4 else 0.01
    runs = intervals(timehist)
    starts = [r[0] for r in runs]
    reqs = []
    for line in open(trace):
        at_us, lat_us = map(int, line.split())
        lo = t0_ns / 1e9 + at_us / 1e6
        reqs.append((lat_us, lo, lo + lat_us / 1e6))
    if not runs or not reqs:
        sys.exit("tail_profile: no runs or no requests (was the profile on the gateway's CPU?)")
    # Only requests inside the profile's span count.
    reqs = [r for r in reqs if r[1] >= runs[0][0] and r[2] <= runs[-1][1]]
    reqs.sort()
    n = len(reqs)
    bands = {"slowest %g %%" % (share * 100): reqs[int(n * (1 - share)):],
             # What sets the p99 itself, without the rare stalls past it.
             "around p99 (98.5-99.5 %)": reqs[int(n * 0.985):int(n * 0.995)],
             "median band (45-55 %)": reqs[int(n * 0.45):int(n * 0.55)]}
    print(f"{n} requests in the profile; latency p50 {reqs[n // 2][0]} us, p99 {reqs[int(n * 0.99)][0]} us")
    for band, rs in bands.items():
        total = collections.Counter()
        for _, lo, hi in rs:
            total.update(attribute(runs, starts, lo, hi))
        mean_lat = sum(r[0] for r in rs) / len(rs)
        print(f"\n{band}: {len(rs)} requests, mean latency {mean_lat:.0f} us; "
              "mean time per request on the gateway's CPU, by thread:")
        for name, secs in total.most_common(12):
            print(f"  {name:<28} {secs / len(rs) * 1e6:9.1f} us")
    # The threads' own run lengths: a long run of anything but the request path is what a
    # ready request waits behind.
    by_name = collections.defaultdict(list)
    for s, e, name in runs:
        by_name[name].append((e - s) * 1e6)
    print("\nruns on the gateway's CPU (us): thread, count, p50, p90, p99, max")
    for name, lens in sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:10]:
        lens.sort()
        q = lambda p: lens[min(len(lens) - 1, int(len(lens) * p))]
        print(f"  {name:<28} {len(lens):7d} {q(.5):8.1f} {q(.9):8.1f} {q(.99):8.1f} {lens[-1]:9.1f}")
    if len(sys.argv) > 5:
        long_run_symbols(runs, sys.argv[5])


def long_run_symbols(runs, path, long_us=500):
    """Per thread with long runs: the sampled functions inside its long runs and in all runs."""
    samples = []
    sample_re = re.compile(r"^\s*(.+?)\s+(\d+)\s+(\d+\.\d+):\s+[0-9a-f]+\s+(.*)$")
    for line in open(path, errors="replace"):
        m = sample_re.match(line)
        if m:
            samples.append((float(m.group(3)), m.group(1).strip(), m.group(4).strip() or "?"))
    samples.sort()
    times = [t for t, _, _ in samples]
    for thread in sorted({n for _, _, n in runs}):
        mine = [(s, e) for s, e, n in runs if n == thread]
        longs = [(s, e) for s, e in mine if (e - s) * 1e6 > long_us]
        if not longs or thread == "<idle>":
            continue
        def tally(spans):
            c = collections.Counter()
            for s, e in spans:
                for i in range(bisect.bisect_left(times, s), bisect.bisect_right(times, e)):
                    c[samples[i][2]] += 1
            return c
        in_long, in_all = tally(longs), tally(mine)
        nl, na = sum(in_long.values()) or 1, sum(in_all.values()) or 1
        print(f"\n{thread}: {len(longs)} runs over {long_us} us ({nl} samples) against all "
              f"{len(mine)} runs ({na} samples); share of samples, long runs / all runs:")
        for sym, k in in_long.most_common(15):
            print(f"  {k / nl * 100:5.1f} % / {in_all[sym] / na * 100:5.1f} %  {sym[:90]}")


if __name__ == "__main__":
    main()
