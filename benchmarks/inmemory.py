"""In-memory datasets side by side: CIFAR-10's standard chain (RandomCrop(32, padding=4) + flip +
ToTensor + Normalize) over a CIFAR-10-shaped torchvision CIFAR10 object (50,000 32x32 windows of
real photos, 10 classes), torchvision's DataLoader with every core as a worker against
gputransforms.DataLoader (images on the device once, each batch gathered and augmented there).

    python -m benchmarks.inmemory [--images 50000] [--batch-size 512] [--epochs 3] [--out DIR]
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np
import torch
import torchvision

from benchmarks.common import Moved, torch_device, on_gpu, rss_peak_mb, bar_chart, timed

MEAN, STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)


def cifar_like(n: int, seed: int = 0):
    """A torchvision CIFAR10 object as its constructor leaves it, holding n windows of real photos."""
    from PIL import Image

    from gputransforms import sampledata

    rng = np.random.default_rng(seed)
    small = [np.asarray(Image.fromarray(p).resize((p.shape[1] // 6, p.shape[0] // 6), Image.BILINEAR))
             for p in sampledata.source_photos()]
    data = np.empty((n, 32, 32, 3), np.uint8)
    for k in range(n):
        src = small[k % len(small)]
        y, x = rng.integers(0, src.shape[0] - 32), rng.integers(0, src.shape[1] - 32)
        data[k] = src[y:y + 32, x:x + 32]
    ds = torchvision.datasets.CIFAR10.__new__(torchvision.datasets.CIFAR10)
    ds.root, ds.train, ds.target_transform, ds.transforms = "in-memory", True, None, None
    ds.data, ds.targets = data, [int(t) for t in rng.integers(0, 10, n)]
    return ds


def chain(T):
    return T.Compose([T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)])


def main(argv=None):
    ap = argparse.ArgumentParser(description="in-memory datasets benchmark")
    ap.add_argument("--images", type=int, default=50000)
    ap.add_argument("--batch-size", type=int, default=512)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    ap.add_argument("--out", default="bench-out")
    a = ap.parse_args(argv)
    import torchvision.transforms as tv

    from gputransforms import DataLoader
    from gputransforms import transforms as T

    ds = cifar_like(a.images)
    rows = []
    for name in ("torchvision", "gputransforms"):
        def make():
            if name == "torchvision":
                ds.transform = chain(tv)
                return Moved(torch.utils.data.DataLoader(ds, batch_size=a.batch_size, shuffle=True,
                                                          num_workers=a.workers, pin_memory=on_gpu(),
                                                          persistent_workers=True), torch_device())
            ds.transform = chain(T)
            return DataLoader(ds, batch_size=a.batch_size, shuffle=True)
        n = a.images * (1 if name == "torchvision" else a.epochs)
        row = dict(chain="cifar10", pipeline=name, **timed(make, n))
        row["rss_mb"] = rss_peak_mb()
        rows.append(row)
        print(f"  {name}: {row['img_s']:.0f} img/s", flush=True)
    rows[1]["x_torchvision"] = rows[1]["img_s"] / rows[0]["img_s"]
    info = dict(device=torch.cuda.get_device_name() if on_gpu() else "cpu", cores=os.cpu_count(), images=a.images,
                batch_size=a.batch_size, torch=torch.__version__, torchvision=torchvision.__version__)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "inmemory.json").write_text(json.dumps(dict(info=info, rows=rows), indent=2))
    bar_chart(rows, out / "inmemory.png")
    print(json.dumps(info))
    for r in rows:
        print(f"{r['pipeline']:14} {r['img_s']:12.0f} img/s  first batch {r['ttfb_s']:.2f} s")
    return rows


if __name__ == "__main__":
    main()
