"""python -m gputransforms.demo [--out gputransforms-demo] [--images 600]

Makes a small sample ImageFolder (synthetic scenes, ImageNet-like sizes, real JPEG encoding),
runs the standard train chain through gputransforms and through torchvision's DataLoader on this
machine, prints images/s for both and writes a PNG grid of augmented samples.
"""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Optional

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFilter

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def _scene(rng: np.random.Generator, long_side: Optional[int] = None) -> Image.Image:
    long_side = long_side or int(rng.choice([500, 500, 500, rng.integers(300, 1000)]))
    short_side = int(long_side / rng.choice([4 / 3, 4 / 3, 1.0, 3 / 2]))
    w, h = (long_side, short_side) if rng.random() < 0.75 else (short_side, long_side)
    top, bottom = rng.integers(0, 256, 3), rng.integers(0, 256, 3)
    t = np.linspace(0, 1, h)[:, None, None]
    img = Image.fromarray(((1 - t) * top + t * bottom).repeat(w, 1).astype(np.uint8))
    d = ImageDraw.Draw(img)
    for _ in range(int(rng.integers(4, 12))):
        x0, y0 = int(rng.integers(-w // 4, w)), int(rng.integers(-h // 4, h))
        x1, y1 = x0 + int(rng.integers(w // 10, w // 2)), y0 + int(rng.integers(h // 10, h // 2))
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        (d.ellipse if rng.random() < 0.5 else d.rectangle)([x0, y0, x1, y1], fill=colour)
    img = img.filter(ImageFilter.GaussianBlur(float(rng.uniform(0.3, 1.5))))
    a = np.asarray(img, dtype=np.float32) + rng.normal(0, rng.uniform(2, 6), (h, w, 1))
    return Image.fromarray(np.clip(a, 0, 255).astype(np.uint8))


def _write_one(job):
    root, i, classes, seed, long_side = job
    rng = np.random.default_rng([seed, i])  # the same files whatever the number of processes
    d = Path(root) / f"class_{i % classes:02d}"
    d.mkdir(parents=True, exist_ok=True)
    _scene(rng, long_side).save(d / f"img_{i:05d}.jpg", quality=int(rng.integers(75, 96)),
                                subsampling=0 if rng.random() < 0.15 else 2)


def make_sample_folder(root, n: int = 600, classes: int = 4, seed: int = 0, long_side: Optional[int] = None,
                       jobs: int = 1) -> Path:
    """Write ``n`` JPEGs in ``classes`` class folders under ``root`` (deterministic for a seed);
    ``long_side`` fixes the longer side (e.g. 2000 for camera-sized photos)."""
    work = [(str(root), i, classes, seed, long_side) for i in range(n)]
    if jobs > 1:
        import multiprocessing as mp

        with mp.Pool(jobs) as pool:
            pool.map(_write_one, work, chunksize=16)
    else:
        for job in work:
            _write_one(job)
    return Path(root)


def _throughput(loader, epochs: int = 2) -> float:
    it = iter(loader)
    next(it)  # warm-up: workers / pipeline start
    count, t0 = 0, time.perf_counter()
    for e in range(epochs):
        for x, _ in (it if e == 0 else loader):
            count += x.shape[0]
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return count / (time.perf_counter() - t0)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="gputransforms-demo")
    ap.add_argument("--images", type=int, default=600)
    ap.add_argument("--batch-size", type=int, default=64)
    a = ap.parse_args(argv)

    import torchvision
    import torchvision.utils

    from gputransforms import DataLoader, datasets, transforms

    out = Path(a.out)
    data = out / "data"
    if not data.exists():
        print(f"writing {a.images} sample JPEGs to {data} ...", flush=True)
        make_sample_folder(data, a.images)
    train_tf = transforms.Compose([transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(),
                                   transforms.ToTensor(), transforms.Normalize(MEAN, STD)])
    cores = os.cpu_count() or 1
    train = datasets.ImageFolder(str(data), transform=train_tf)
    ours = DataLoader(train, batch_size=a.batch_size, shuffle=True, num_workers=cores)
    print(ours.explain())
    ours_ips = _throughput(ours)
    tv = torch.utils.data.DataLoader(torchvision.datasets.ImageFolder(str(data), transform=train_tf),
                                     batch_size=a.batch_size, shuffle=True, num_workers=cores)
    tv_ips = _throughput(tv)
    print(f"\n{'pipeline':44} images/s")
    print(f"{'torchvision DataLoader, ' + str(cores) + ' workers':44} {tv_ips:8.0f}")
    print(f"{'gputransforms (' + ours.backend + ', ' + ours.device + ')':44} {ours_ips:8.0f}   "
          f"({ours_ips / tv_ips:.1f}x)")
    images, labels = next(iter(ours))
    images = images[:32].cpu() * torch.tensor(STD)[:, None, None] + torch.tensor(MEAN)[:, None, None]
    grid = out / "augmented_samples.png"
    torchvision.utils.save_image(images.clamp(0, 1), grid, nrow=8, padding=2)
    print(f"wrote {grid} (32 augmented training samples; labels {labels[:8].tolist()} ...)")


if __name__ == "__main__":
    main()
