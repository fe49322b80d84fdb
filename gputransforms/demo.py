"""python -m gputransforms.demo [--out gputransforms-demo] [--images 600]

Makes a small sample ImageFolder (real photos from scikit-image/scikit-learn when they are installed,
else drawn scenes; ImageNet-like sizes, real JPEG encoding),
runs the standard train chain through gputransforms and through torchvision's DataLoader on this
machine, prints images/s for both and writes a PNG grid of augmented samples.
"""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


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
        from gputransforms import sampledata

        try:
            sampledata.source_photos()
            synthetic = False
        except sampledata.NoSamplePhotos:
            synthetic = True
        print(f"writing {a.images} sample JPEGs ({'drawn scenes' if synthetic else 'real photos'}) to {data} ...",
              flush=True)
        sampledata.make_photo_folder(data, classes=4, per_class=max(1, a.images // 4), synthetic=synthetic)
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
