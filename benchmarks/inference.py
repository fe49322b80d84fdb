"""Batched inference on bytes: ``gputransforms.compile(eval chain)`` against torchvision (PIL decode +
transform per image + stack + ``.cuda()``), p50/p99 latency per batch, bytes in, device tensor out.

    python -m benchmarks.inference ROOT [--batches 1,8,64] [--reps 50]
"""
from __future__ import annotations

import argparse
import io
import json
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def eval_tf(T):
    return T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(), T.Normalize(MEAN, STD)])


def latencies(fn, batches, reps):
    out = []
    for k in range(reps + 3):
        blobs = batches[k % len(batches)]
        t0 = time.perf_counter()
        x = fn(blobs)
        if x.is_cuda:
            torch.cuda.synchronize()
        if k >= 3:  # warm-up
            out.append((time.perf_counter() - t0) * 1e3)
    return dict(p50_ms=float(np.percentile(out, 50)), p99_ms=float(np.percentile(out, 99)))


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("--batches", default="1,8,64")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--out", default="bench-out")
    a = ap.parse_args(argv)
    import torchvision.transforms as tvT

    import gputransforms
    from gputransforms import transforms as T

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    files = sorted(Path(a.root).rglob("*.jpg"))
    blobs = [f.read_bytes() for f in files[:512]]
    tv = eval_tf(tvT)

    def torchvision_side(batch):
        return torch.stack([tv(Image.open(io.BytesIO(b)).convert("RGB")) for b in batch]).to(dev)

    ours = gputransforms.compile(eval_tf(T), max_batch_size=max(int(b) for b in a.batches.split(",")))
    rows = []
    for n in (int(b) for b in a.batches.split(",")):
        batches = [blobs[i:i + n] for i in range(0, len(blobs) - n + 1, n)][:64]
        for name, fn in (("torchvision", torchvision_side), ("gputransforms.compile", ours)):
            r = dict(batch=n, pipeline=name, **latencies(fn, batches, a.reps))
            rows.append(r)
            print(f"batch {n:3d}  {name:22} p50 {r['p50_ms']:8.2f} ms  p99 {r['p99_ms']:8.2f} ms", flush=True)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "inference.json").write_text(json.dumps(dict(device=str(dev), rows=rows), indent=1))


if __name__ == "__main__":
    main()
