"""What DALI's threads did inside a window, from nvtx_ranges.c's ranges: per backend, the time its
operators' Setup and Run took (DALI's executor runs one operator of a backend at a time: a lane whose
time fills the window bounds the pipeline); per kind of range (an operator's Setup and Run by backend,
the executor's steps), the time per batch and how many per batch; per thread, the time inside any range.

    python -m benchmarks.probes.nvtx_summary RANGES.tsv START_NS END_NS BATCHES [--top 40]
    python -m benchmarks.probes.nvtx_summary RANGES.tsv 0 0 0 --tail SECONDS

(START_NS END_NS: a window ``kernels.py --window`` prints; or, for a process that prints none (a loader
benchmark), the last ``--tail`` seconds of the ranges, with the batches counted as the executor's
``PopOutputs`` in them.) Per-sample ranges (a decoder's "decode #12")
are grouped without their numbers.
"""
from __future__ import annotations

import argparse
import re
from collections import defaultdict

from benchmarks.common import interval_union as union


def load(path: str, start: int, end: int, tail: float = 0.0) -> list:
    if tail:
        end = max(int(line.split("\t")[2]) for line in open(path) if not line.startswith("#"))
        start = end - int(tail * 1e9)
    out = []
    with open(path) as f:
        for line in f:
            if line.startswith("#"):
                continue
            parts = line.rstrip("\n").split("\t")
            if len(parts) != 4:
                continue
            tid, s, e, name = int(parts[0]), int(parts[1]), int(parts[2]), parts[3]
            if s >= start and e <= end:
                out.append((tid, s, e, name))
    return out


def kind(name: str) -> str:
    return re.sub(r"\s*#?\d+$", "", name).strip() or "(no name)"


def summary(ranges: list, batches: int, window_ns: int, top: int = 40) -> str:
    per_kind = defaultdict(lambda: [0, 0])
    per_thread = defaultdict(list)
    for tid, s, e, name in ranges:
        k = per_kind[kind(name)]
        k[0] += e - s
        k[1] += 1
        per_thread[tid].append((s, e))
    lines = [f"window {window_ns / 1e6 / batches:.2f} ms per batch, {len(ranges) / batches:.0f} ranges per batch"]
    lines.append("lanes (each kind of operator's Run and Setup: their sum and their union over the window; equal "
                 "sums and unions: one at a time):")
    for lane in ("[DALI][CPU op]", "[DALI][GPU op]", "[DALI][Mixed op]"):
        iv = [(s, e) for _, s, e, name in ranges if name.startswith(lane)]
        lines.append(f"    {lane:18} sum {sum(e - s for s, e in iv) / window_ns:6.1%}, union {union(iv) / window_ns:6.1%}"
                     f" of the window, {sum(e - s for s, e in iv) / 1e6 / batches:6.2f} ms per batch")
    lines.append("threads (time inside any range, ms per batch):")
    for tid, iv in sorted(per_thread.items(), key=lambda kv: -union(kv[1])):
        lines.append(f"    {tid:8d} {union(iv) / 1e6 / batches:7.2f}   ({len(iv) / batches:.0f} ranges)")
    lines.append("kinds (ms per batch, count per batch, us each):")
    for name, (ns, n) in sorted(per_kind.items(), key=lambda kv: -kv[1][0])[:top]:
        lines.append(f"    {ns / 1e6 / batches:7.3f} {n / batches:7.1f} {ns / n / 1e3:8.1f}  {name[:90]}")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("ranges")
    ap.add_argument("start", type=int)
    ap.add_argument("end", type=int)
    ap.add_argument("batches", type=int)
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--tail", type=float, default=0.0, help="the last SECONDS of the ranges as the window")
    a = ap.parse_args(argv)
    ranges = load(a.ranges, a.start, a.end, a.tail)
    window = int(a.tail * 1e9) if a.tail else a.end - a.start
    batches = a.batches or max(1, sum(1 for r in ranges if r[3] == "[DALI][Executor] PopOutputs"))
    print(summary(ranges, batches, window, a.top))


if __name__ == "__main__":
    main()
