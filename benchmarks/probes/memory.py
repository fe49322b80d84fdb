"""Where a loader's device memory goes (#35 item 5): in this fresh process, the device memory in use
once CUDA started, then at the peak over N batches (sampled every 20 ms), split into torch's caching
allocator (reserved; of it the peak actually allocated) and the rest (DALI's pools, nvJPEG's buffers).
``--snapshot FILE`` also records torch's allocator history (Python stacks) and writes its snapshot, which
``benchmarks.probes.memory_peak`` reads: what is alive at torch's peak, and by which line it was made.
``--chunk N``: the batched stage's rows at once (``compiler.batched.CHUNK``, 64).

    python -m benchmarks.probes.memory ROOT [--chain simclr] [--pipeline gputransforms] [--batches 80]
        [--snapshot FILE] [--chunk N]
"""
from __future__ import annotations

import argparse
import json

import torch

from benchmarks.common import PeakGpuMemory, cuda_sync
from benchmarks.pipelines import pipeline


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("--chain", default="simclr")
    ap.add_argument("--pipeline", default="gputransforms")
    ap.add_argument("--batches", type=int, default=80)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--snapshot", default="")
    ap.add_argument("--chunk", type=int, default=0)
    a = ap.parse_args(argv)
    torch.zeros(1, device="cuda")
    if a.chunk:
        from gputransforms.compiler import batched

        batched.CHUNK = a.chunk
    if a.snapshot:
        torch.cuda.memory._record_memory_history(max_entries=2_000_000, stacks="python")
    mem = PeakGpuMemory()
    loader = pipeline(a.pipeline)(a.root, a.chain, a.batch_size, a.threads)()
    n = 0
    while n < a.batches:
        for _ in loader:
            n += 1
            if n >= a.batches:
                break
    cuda_sync()
    peak = mem.stop_mb()
    if a.snapshot:
        torch.cuda.memory._dump_snapshot(a.snapshot)
    reserved = torch.cuda.max_memory_reserved() / 2**20
    allocated = torch.cuda.max_memory_allocated() / 2**20
    print(json.dumps(dict(chain=a.chain, pipeline=a.pipeline, device_peak_mb=round(peak), torch_reserved_mb=round(reserved),
                          torch_allocated_mb=round(allocated), other_mb=round(peak - reserved))))


if __name__ == "__main__":
    main()
