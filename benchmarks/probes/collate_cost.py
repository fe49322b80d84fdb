"""What a custom collate_fn costs on the compiled batch: the reference recipe's
``mixup_cutmix(*default_collate(batch))`` against the same MixUp/CutMix applied to the batch directly
(what a hand-written pipeline does), ms per batch, on the GPU when there is one.

    python -m benchmarks.probes.collate_cost [--batch-size 256] [--size 224]
"""
from __future__ import annotations

import argparse
import time

import torch
from torch.utils.data import default_collate

from benchmarks.common import mixup_cutmix


def bench(fn, reps=50):
    for _ in range(5):
        fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / reps * 1e3


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--size", type=int, default=224)
    a = ap.parse_args(argv)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    x = torch.rand(a.batch_size, 3, a.size, a.size, device=dev)
    targets = torch.randint(0, 20, (a.batch_size,)).tolist()
    mix = mixup_cutmix(20)
    y_dev = torch.tensor(targets, device=dev)
    rows = {
        "MixUp/CutMix on the batch (hand-written)": lambda: mix(x, y_dev),
        "unbind into (image, target) pairs": lambda: list(zip(x.unbind(0), targets)),
        "default_collate of the pairs": lambda: default_collate(list(zip(x.unbind(0), targets))),
        "recipe collate: mix(*default_collate(pairs))": lambda: mix(*default_collate(list(zip(x.unbind(0), targets)))),
    }
    if dev.type == "cuda":
        recipe = rows["recipe collate: mix(*default_collate(pairs))"]
        rows["recipe collate + targets to the device (pinned)"] = lambda: recipe()[1].pin_memory().to(dev, non_blocking=True)
        rows["recipe collate + targets to the device (pageable)"] = lambda: recipe()[1].to(dev, non_blocking=True)
    print(f"{a.batch_size}x3x{a.size}x{a.size} float32 on {dev}, ms per batch")
    for name, fn in rows.items():
        print(f"  {name:52} {bench(fn):7.2f}")


if __name__ == "__main__":
    main()
