"""Whole epochs of a detection loader, batch by batch: each epoch's rate from the end of the one before (its boundary
included), how long after that its first batch came, and the median gap between batches (batches that come in bursts
show a median gap well below the epoch's average).

    python -m benchmarks.probes.epochs ROOT [--preset lsj-v2] [--epochs 5] [--workers 16] [--dali]

ROOT: photos as for benchmarks.detection (its COCO layout is written beside them once). ``--dali``: the preset's
hand-written DALI pipeline instead (lsj-v2, ssd; ``--workers`` DALI threads; its reader never stops between epochs). The first epoch (start-up)
is reported apart from the mean.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from benchmarks.detection import coco_of, collate, dali_lsj, dali_preset, dataset


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root")
    ap.add_argument("--preset", default="lsj-v2")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--backend", default="pil")
    ap.add_argument("--dali", action="store_true")
    a = ap.parse_args(argv)
    coco = coco_of(a.root)
    if a.dali:
        loader = {"lsj-v2": dali_lsj, "ssd": dali_preset}[a.preset](coco, a.batch_size, a.workers)
    else:
        from gputransforms import DataLoader

        loader = DataLoader(dataset(coco, a.preset, a.backend), batch_size=a.batch_size, shuffle=True,
                            num_workers=a.workers, collate_fn=collate, persistent_workers=a.workers > 0)
    rows, last = [], None
    for _ in range(a.epochs):
        start = last if last is not None else time.perf_counter()
        stamps, n = [], 0
        for batch in loader:
            stamps.append(time.perf_counter())
            n += len(batch[0])
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        last = time.perf_counter()
        gaps = [b - s for s, b in zip(stamps, stamps[1:])] or [0.0]
        rows.append((n, last - start, stamps[0] - start, statistics.median(gaps)))
    for k, (n, wall, first, gap) in enumerate(rows):
        print(f"epoch {k}: {n} images, {n / wall:.0f} img/s from the end of the one before; first batch after "
              f"{1e3 * first:.1f} ms; median gap {1e3 * gap:.2f} ms")
    later = rows[1:] or rows
    print(f"epochs 1-{len(rows) - 1}: {sum(r[0] for r in later) / sum(r[1] for r in later):.0f} img/s; first batch "
          f"{1e3 * statistics.mean(r[2] for r in later):.0f} ms on average")


if __name__ == "__main__":
    main()
