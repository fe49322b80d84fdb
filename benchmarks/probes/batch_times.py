"""A classification loader batch by batch in a fresh process, as one row of ``benchmarks.loader --isolate`` runs:
each batch's wait, the batches far slower than the median (a compile, a stall) with their place, and the rate
with and without them.

    python -m benchmarks.probes.batch_times ROOT [--chain simclr] [--pipeline gputransforms] [--batches 60]

ROOT: an ImageFolder (as for benchmarks.loader). The rate counts from the fourth batch, as ``benchmarks.loader``
does; "without stalls" leaves out the batches over 5x the median.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from benchmarks.common import cuda_sync
from benchmarks.pipelines import pipeline


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root")
    ap.add_argument("--chain", default="simclr")
    ap.add_argument("--pipeline", default="gputransforms")
    ap.add_argument("--batches", type=int, default=60)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--threads", type=int, default=8)
    a = ap.parse_args(argv)
    make = pipeline(a.pipeline)(a.root, a.chain, a.batch_size, a.threads)
    t0 = time.perf_counter()
    loader = make()
    waits, sizes = [], []
    while len(waits) < a.batches:
        for batch in loader:
            cuda_sync()
            t1 = time.perf_counter()
            waits.append(t1 - t0)
            sizes.append(len(batch[0]))
            t0 = t1
            del batch
            if len(waits) >= a.batches:
                break
    timed = list(zip(waits, sizes))[3:]
    median = statistics.median(w for w, _ in timed)
    slow = [(k + 3, w) for k, (w, _) in enumerate(timed) if w > 5 * median]
    rate = sum(n for _, n in timed) / sum(w for w, _ in timed)
    calm = [(w, n) for w, n in timed if w <= 5 * median]
    print(f"{a.chain} {a.pipeline}: first batch {waits[0]:.2f} s; batches 4-{len(waits)}: {rate:,.0f} img/s, "
          f"median wait {median * 1e3:.1f} ms; without the {len(slow)} over 5x the median "
          f"{sum(n for _, n in calm) / sum(w for w, _ in calm):,.0f} img/s")
    print("  slow batches (place: ms): " + (", ".join(f"{k}: {w * 1e3:.0f}" for k, w in slow) or "none"))
    del loader
    torch.cuda.empty_cache() if torch.cuda.is_available() else None


if __name__ == "__main__":
    main()
