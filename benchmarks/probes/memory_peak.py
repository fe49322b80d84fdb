"""What torch's caching allocator held at its peak, from a snapshot written by ``benchmarks.probes.memory
--snapshot FILE`` (torch's allocator history with Python stacks): the history replayed, the blocks alive
when the most was allocated grouped by the line of ours (or of torch's) that made them, and the segments
torch had reserved by the end with how much of each was in use at that peak.

    python -m benchmarks.probes.memory_peak FILE [--frames 2]

Reads the pickle only: no GPU needed.
"""
from __future__ import annotations

import argparse
import collections
import pickle

MiB = 2 ** 20


def _where(frames: list, depth: int) -> str:
    ours = [f for f in frames if any(k in f["filename"] for k in ("gputransforms", "benchmarks"))]
    picked = (ours or frames)[:depth]
    return " < ".join(f"{f['filename'].rsplit('/', 1)[-1]}:{f['line']} {f['name']}" for f in picked) or "?"


def replay(events: list) -> tuple:
    """(peak allocated bytes, blocks alive then {addr: (size, frames)}, peak reserved bytes)."""
    live: dict = {}
    total = reserved = peak = peak_reserved = 0
    at_peak: dict = {}
    for e in events:
        act = e["action"]
        if act == "alloc":
            live[e["addr"]] = (e["size"], e.get("frames", []))
            total += e["size"]
            if total > peak:
                peak, at_peak = total, dict(live)
        elif act == "free_requested" and e["addr"] in live:
            total -= live.pop(e["addr"])[0]
        elif act in ("segment_alloc", "segment_map"):
            reserved += e["size"]
            peak_reserved = max(peak_reserved, reserved)
        elif act in ("segment_free", "segment_unmap"):
            reserved -= e["size"]
    return peak, at_peak, peak_reserved


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("snapshot")
    ap.add_argument("--frames", type=int, default=2)
    a = ap.parse_args(argv)
    with open(a.snapshot, "rb") as f:
        snap = pickle.load(f)
    for dev, events in enumerate(snap.get("device_traces", [])):
        if not events:
            continue
        peak, at_peak, peak_reserved = replay(events)
        print(f"device {dev}: {len(events)} events; peak allocated {peak / MiB:.0f} MiB, peak reserved "
              f"{peak_reserved / MiB:.0f} MiB")
        groups: dict = collections.defaultdict(list)
        for size, frames in at_peak.values():
            groups[_where(frames, a.frames)].append(size)
        print("  alive at the allocated peak, by where it was made:")
        for where, sizes in sorted(groups.items(), key=lambda kv: -sum(kv[1])):
            shown = collections.Counter(round(s / MiB, 1) for s in sizes).most_common(4)
            print(f"    {sum(sizes) / MiB:8.1f} MiB  {len(sizes):4d} blocks {shown}  {where}")
        peak_addrs = {addr for addr in at_peak}
        segs = [s for s in snap.get("segments", []) if s.get("device", dev) == dev]
        print(f"  segments reserved at the end: {len(segs)}, {sum(s['total_size'] for s in segs) / MiB:.0f} MiB")
        for s in sorted(segs, key=lambda s: -s["total_size"])[:24]:
            addr, used = s["address"], 0
            for b in s["blocks"]:  # (a block's address: the segment's plus the sizes before it)
                used += b["size"] if addr in peak_addrs else 0
                addr += b["size"]
            print(f"    {s['total_size'] / MiB:8.1f} MiB ({s.get('segment_type', '?')} pool), "
                  f"{used / MiB:8.1f} MiB of it alive at the peak, {len(s['blocks'])} blocks")


if __name__ == "__main__":
    main()
