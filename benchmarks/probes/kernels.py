"""Where a DALI pipeline's GPU time goes, kernel by kernel: the pipelines of ``timm_ra.py`` run alone
(``pipeline.run()``) under torch's profiler, whose CUDA activity (CUPTI) records every kernel and copy
of the process, DALI's included.

    python -m benchmarks.probes.kernels ROOT [--variants ours,dali-ra] [--batches 30] [--top 25]
                                         [--json FILE] [--trace PREFIX] [--window]

Per variant: wall time per batch; the GPU's busy time per batch (the union of all kernels' and
copies' intervals, whatever stream), the sum of their durations (above the busy time where streams
overlap), kernels launched per batch; then the kernels grouped by name (templates dropped), each with
its time and launches per batch. Busy time near the wall time: the GPU's work bounds the pipeline,
and the groups say which. Busy time well below it: the GPU waits on the host (operators' CPU work,
the executor, launches).
"""
from __future__ import annotations

import argparse
import json
import re
import time
from collections import defaultdict

import torch

from benchmarks.common import cpu_seconds, interval_union
from benchmarks.probes.timm_ra import variants


def group_name(name: str) -> str:
    """A kernel's name without ``void``, template arguments and parameters: ``dali::kernels::X``."""
    name = re.sub(r"^void ", "", name)
    out, depth = [], 0
    for ch in name:
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth -= 1
        elif depth == 0:
            out.append(ch)
    return "".join(out).strip() or name[:80]


def window(pipe, batches: int, warmup: int = 4) -> dict:
    """Run ``batches`` without the profiler: wall time per batch and the window's CLOCK_MONOTONIC bounds
    (for the NVTX ranges of nvtx_ranges.c, which uses that clock)."""
    for _ in range(warmup):
        pipe.run()
    t0, c = time.monotonic_ns(), cpu_seconds()
    for _ in range(batches):
        pipe.run()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    t1 = time.monotonic_ns()
    return dict(wall_ms=(t1 - t0) * 1e-6 / batches, cores=(cpu_seconds() - c) / ((t1 - t0) * 1e-9), start_ns=t0, end_ns=t1)


def profile(pipe, batches: int, warmup: int = 4, trace: str = None) -> dict:
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity

    for _ in range(warmup):
        pipe.run()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    acts = [ProfilerActivity.CUDA] if torch.cuda.is_available() else [ProfilerActivity.CPU]
    with torch.profiler.profile(activities=acts) as prof:
        t, c = time.perf_counter(), cpu_seconds()
        for _ in range(batches):
            pipe.run()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        wall, cpu = time.perf_counter() - t, cpu_seconds() - c
    if trace:  # the whole timeline (kernels by stream, CUDA calls by thread), gzipped, for a look afterwards
        import gzip
        import os
        import shutil

        prof.export_chrome_trace(trace + ".json")
        with open(trace + ".json", "rb") as f, gzip.open(trace + ".json.gz", "wb") as z:
            shutil.copyfileobj(f, z)
        os.remove(trace + ".json")
    kernels = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    groups = defaultdict(lambda: [0.0, 0])
    for e in kernels:
        g = groups[group_name(e.name)]
        g[0] += e.time_range.elapsed_us()
        g[1] += 1
    per = 1.0 / batches
    return dict(
        wall_ms=wall * 1e3 * per, cores=cpu / wall,
        busy_ms=interval_union([(e.time_range.start, e.time_range.end) for e in kernels]) * 1e-3 * per,
        sum_ms=sum(g[0] for g in groups.values()) * 1e-3 * per, launches=len(kernels) * per,
        groups={k: (v[0] * 1e-3 * per, v[1] * per) for k, v in sorted(groups.items(), key=lambda kv: -kv[1][0])})


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--batches", type=int, default=30)
    ap.add_argument("--variants", default="ours,dali-ra")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--json", help="write every variant's figures here")
    ap.add_argument("--trace", help="write each variant's chrome trace to TRACE-VARIANT.json.gz")
    ap.add_argument("--window", action="store_true",
                    help="no profiler: print each variant's wall time and its CLOCK_MONOTONIC window (nvtx_ranges.c)")
    a = ap.parse_args(argv)
    make = variants(a.root, a.batch_size, a.threads, torch.cuda.is_available())
    results = {}
    for name in a.variants.split(","):
        pipe = make[name]()
        if a.window:
            r = window(pipe, a.batches)
            print(f"{name:16} wall {r['wall_ms']:6.2f} ms/batch, {r['cores']:4.2f} cores, window {r['start_ns']} {r['end_ns']}",
                  flush=True)
            del pipe
            continue
        r = profile(pipe, a.batches, trace=f"{a.trace}-{name}" if a.trace else None)
        del pipe
        results[name] = r
        print(f"{name:16} wall {r['wall_ms']:6.2f} ms/batch ({a.batch_size / r['wall_ms'] * 1e3:7.0f} img/s), "
              f"GPU busy {r['busy_ms']:6.2f}, kernel sum {r['sum_ms']:6.2f} ms/batch, "
              f"{r['launches']:6.0f} launches/batch, {r['cores']:4.2f} cores", flush=True)
        for k, (ms, n) in list(r["groups"].items())[:a.top]:
            print(f"    {ms:7.3f} ms {n:6.1f}x  {k[:110]}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
