"""The batched stage alone: each transform on one (N,3,224,224) batch already on the device, through
gputransforms' batched lowering and through torchvision applied per sample on the same device (what
the per-sample stage does). Milliseconds per batch, in one run.

    python -m benchmarks.batched_stage [--batch-size 256] [--repeats 5] [--out DIR]
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torchvision.transforms as T

from gputransforms.compiler import registry

CASES = {
    # name: (transform, input dtype)
    "ColorJitter(0.4,0.4,0.4,0.1)": (lambda: T.ColorJitter(0.4, 0.4, 0.4, 0.1), torch.uint8),
    "RandomApply(ColorJitter, p=0.8)": (lambda: T.RandomApply([T.ColorJitter(0.4, 0.4, 0.4, 0.1)], p=0.8), torch.uint8),
    "RandomGrayscale(0.2)": (lambda: T.RandomGrayscale(0.2), torch.uint8),
    "GaussianBlur(23, (0.1, 2))": (lambda: T.GaussianBlur(23, (0.1, 2.0)), torch.uint8),
    "RandomRotation(30)": (lambda: T.RandomRotation(30), torch.uint8),
    "RandomAffine(15, t, s, shear)": (lambda: T.RandomAffine(15, (0.1, 0.1), (0.8, 1.2), 10), torch.uint8),
    "RandomPerspective(0.5)": (lambda: T.RandomPerspective(0.5), torch.uint8),
    "RandomSolarize(128)": (lambda: T.RandomSolarize(128), torch.uint8),
    "RandomEqualize": (lambda: T.RandomEqualize(), torch.uint8),
    "RandomErasing(p=0.25) float": (lambda: T.RandomErasing(p=0.25), torch.float32),
}


def _time(fn, x, repeats):
    fn(x)  # warm-up (cuDNN plans, kernels)
    sync = torch.cuda.synchronize if x.is_cuda else (lambda: None)
    sync()
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn(x)
    sync()
    return (time.perf_counter() - t0) / repeats * 1000


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default="bench-out")
    a = ap.parse_args(argv)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    g = torch.Generator().manual_seed(0)
    base = (torch.rand(a.batch_size, 3, 224, 224, generator=g) * 255).to(torch.uint8).to(dev)
    rows = []
    print(f"device {torch.cuda.get_device_name() if dev.type == 'cuda' else 'cpu'}, batch {a.batch_size}x3x224x224")
    print(f"{'transform':34s} {'batched ms':>10s} {'per-sample ms':>13s} {'speed-up':>8s}")
    for name, (make, dtype) in CASES.items():
        t = make()
        x = base if dtype == torch.uint8 else base.float() / 255
        fn = registry.batched_of(t)
        ms_b = _time(fn, x, a.repeats)
        ms_p = _time(lambda y: torch.stack([t(img) for img in y]), x, max(1, a.repeats // 2))
        rows.append(dict(transform=name, batched_ms=ms_b, per_sample_ms=ms_p, batch_size=a.batch_size,
                         device=str(dev)))
        print(f"{name:34s} {ms_b:10.1f} {ms_p:13.1f} {ms_p / ms_b:8.1f}x", flush=True)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "batched_stage.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
