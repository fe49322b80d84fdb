"""Where a loader's batch goes: wall time per batch against the GPU's busy time, for gputransforms
and the hand-written DALI pipeline on the same chain, one after the other in one process.

    python -m benchmarks.gpu_time DATA [--chains timm_ra,simclr,train] [--batches 12] [--out bench-out/gpu-time]

For each (chain, pipeline), torch.profiler records ``--batches`` batches after a warm-up (CUDA
activity is process-wide: DALI's and nvJPEG's kernels, launched from DALI's threads, are in it).
Per batch it reports:

- ``wall_ms``: the loop's time, batch after batch (the loader's pace, as benchmarks/loader.py times it);
- ``gpu_busy_ms``: the union of the intervals in which any kernel or copy ran (how long the GPU
  worked for the batch), and the kernels' summed time by who launched them: DALI, nvJPEG, torch
  (gputransforms' batched stage), copies;
- ``kernels``: kernel launches per batch (DALI launches about one per operator and batch);
- ``cpu_cores``: the process's CPU time (all its threads: DALI's workers, the feed, the main thread)
  over the wall time, the number of cores it kept busy;
- ``tail_ms`` (gputransforms): the main thread's time in the batched stage.

When ``gpu_busy_ms`` is well below ``wall_ms`` the GPU waits: the bound is on the host (DALI's
executor, its CPU operators, the feed, the main thread), and ``cpu_cores`` and ``kernels`` say which.
The profiler slows both pipelines; compare them with each other, not with benchmarks/loader.py.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from benchmarks.common import cpu_seconds, cuda_sync, gc_collect, interval_union, make_data, on_gpu
from benchmarks.pipelines import pipeline

SOURCES = ("dali", "nvjpeg", "torch", "copy", "other")


def _source(name: str) -> str:
    n = name.lower()
    if "memcpy" in n or "memset" in n:
        return "copy"
    if "nvjpeg" in n or "jpeg" in n:
        return "nvjpeg"
    if "dali" in n:
        return "dali"
    if "at::" in n or "void at_" in n or "cudnn" in n or "cutlass" in n or "sm90" in n or "gemm" in n:
        return "torch"
    return "other"


def _batches(make):
    """Endless batches, epoch after epoch."""
    loader = make()
    while True:
        for b in loader:
            yield b


def profile_pipeline(make, n_batches: int, warmup: int = 5) -> dict:
    from torch.profiler import ProfilerActivity, profile

    from gputransforms.compiler import tail

    spent = dict(s=0.0)
    run_tail = tail.run_tail

    def timed_tail(*a, **k):
        t0 = time.perf_counter()
        try:
            return run_tail(*a, **k)
        finally:
            spent["s"] += time.perf_counter() - t0

    gc_collect()
    source = _batches(make)
    for _ in range(warmup):
        next(source)
    cuda_sync()
    tail.run_tail = timed_tail
    try:  # (without a GPU: no kernels, only the wall and CPU times)
        with profile(activities=[ProfilerActivity.CUDA if on_gpu() else ProfilerActivity.CPU]) as prof:
            c0, t0 = cpu_seconds(), time.perf_counter()
            for _ in range(n_batches):
                next(source)
            cuda_sync()
            wall, cpu = time.perf_counter() - t0, cpu_seconds() - c0
    finally:
        tail.run_tail = run_tail
        source.close()
    by_source = dict.fromkeys(SOURCES, 0.0)
    intervals, kernels = [], 0
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        s, t = e.time_range.start, e.time_range.end  # microseconds
        intervals.append((s, t))
        kind = _source(e.name)
        by_source[kind] += (t - s) / 1e3
        kernels += kind != "copy"
    out = dict(wall_ms=wall / n_batches * 1e3, gpu_busy_ms=interval_union(intervals) / 1e3 / n_batches,
               kernels=kernels / n_batches, cpu_cores=cpu / wall, tail_ms=spent["s"] / n_batches * 1e3,
               batches=n_batches)
    out.update({f"{k}_ms": v / n_batches for k, v in by_source.items()})
    gc_collect()
    return out


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("--chains", default="timm_ra,simclr,train")
    ap.add_argument("--pipelines", default="dali-handwritten,gputransforms")
    ap.add_argument("--batches", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--make-data", type=int, default=0, help="first make this many images in ROOT")
    ap.add_argument("--out", default="bench-out/gpu-time")
    a = ap.parse_args(argv)
    if a.make_data:
        make_data(a.root, a.make_data)
    rows = []
    print(f"{'chain':10s} {'pipeline':17s} {'wall ms':>8s} {'GPU busy':>8s} {'dali':>6s} {'nvjpeg':>6s} "
          f"{'torch':>6s} {'copy':>6s} {'kernels':>7s} {'cores':>5s} {'tail ms':>7s}")
    for chain in a.chains.split(","):
        for name in a.pipelines.split(","):
            r = profile_pipeline(pipeline(name)(a.root, chain, a.batch_size, a.threads), a.batches, a.warmup)
            rows.append(dict(chain=chain, pipeline=name, batch_size=a.batch_size, **r))
            print(f"{chain:10s} {name:17s} {r['wall_ms']:8.1f} {r['gpu_busy_ms']:8.1f} {r['dali_ms']:6.1f} "
                  f"{r['nvjpeg_ms']:6.1f} {r['torch_ms']:6.1f} {r['copy_ms']:6.1f} {r['kernels']:7.0f} "
                  f"{r['cpu_cores']:5.1f} {r['tail_ms']:7.1f}", flush=True)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    dev = torch.cuda.get_device_name() if on_gpu() else "cpu"
    (out / "gpu_time.json").write_text(json.dumps(dict(device=dev, rows=rows), indent=1))


if __name__ == "__main__":
    main()
