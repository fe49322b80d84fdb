"""What a DALI operator on per-sample numbers costs beside the image work: the random-crop decode and
resize of ``ablate``, plus a chain of ``--ops`` arithmetic operators on one number per sample that
ends in the image's brightness, on the CPU (an argument input, as the graph's random parameters are
computed today) or on the GPU (numbers moved once, the image multiplied on the GPU); the same number
of operators side by side (none waiting for another: what a chain's length costs apart from the
count); and a chain of a quarter as many operators on the image itself (float, on the GPU).

    python -m benchmarks.probes.scalar_ops ROOT [--ops 100] [--threads 8] [--batch-size 256]

Per variant: img/s and the cores the process kept busy.
"""
from __future__ import annotations

import argparse

import torch
from nvidia.dali import fn, pipeline_def, types

from benchmarks.probes.timm_ra import rate


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("--ops", type=int, default=100)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--images", type=int, default=10240)
    ap.add_argument("--repeat", type=int, default=1)
    a = ap.parse_args(argv)
    gpu = torch.cuda.is_available()

    def make(where: str, n: int, threads: int, width: int = 1, side=False):
        @pipeline_def(batch_size=a.batch_size, num_threads=threads, device_id=0 if gpu else None, seed=1,
                      prefetch_queue_depth=2, exec_dynamic=True)
        def pipe():
            enc = fn.readers.file(file_root=a.root, random_shuffle=True, name="r")[0]
            kw = dict(hw_decoder_load=0.9) if gpu else {}
            img = fn.decoders.image_random_crop(enc, device="mixed" if gpu else "cpu", output_type=types.RGB, **kw)
            img = fn.resize(img, resize_x=224, resize_y=224)
            if where == "none":
                return img
            if where == "image":  # a chain of n arithmetic operators on the image itself, in float
                x = fn.cast(img, dtype=types.FLOAT)
                for i in range(n):
                    x = x * 1.0001 if i % 2 else x + (-0.0001)
                return fn.cast(x, dtype=types.UINT8)
            x = fn.random.uniform(range=[0.9, 1.1], shape=[width] if width > 1 else None)
            if where == "gpu":
                x = x.gpu()
            if side:  # n operators on the same input, none waiting for another, gathered by one
                x = fn.stack(*[x + (0.0001 * i) for i in range(n)])
                x = fn.reductions.mean(x) if where == "gpu" else x[0]
            for i in range(0 if side else n):
                x = x * 1.0001 if i % 2 else x + (-0.0001)
            if width > 1:
                x = fn.reductions.mean(x) if where == "gpu" else x[0]
            if where == "gpu":
                return fn.cast(fn.cast(img, dtype=types.FLOAT) * x, dtype=types.UINT8)
            return fn.brightness(img, brightness=x)

        p = pipe()
        p.build()
        return p

    n, t = a.ops, a.threads
    variants = [("no numbers", "none", 0, t, 1), (f"{n} ops on the CPU", "cpu", n, t, 1),
                (f"{n} ops on the CPU, 8 numbers a sample", "cpu", n, t, 8),
                (f"{n} ops on the CPU, {t // 2} threads", "cpu", n, t // 2, 1),
                (f"{n} ops on the CPU, {t * 2} threads", "cpu", n, t * 2, 1),
                (f"{n // 4} ops on the CPU", "cpu", n // 4, t, 1),
                (f"{n} ops on the GPU", "gpu", n, t, 1), ("2 ops on the GPU", "gpu", 2, t, 1),
                (f"{n} ops on the CPU, side by side", "cpu", n, t, 1, True),
                (f"{n} ops on the GPU, side by side", "gpu", n, t, 1, True),
                (f"{n // 4} ops on the image (GPU, float)", "image", n // 4, t, 1)]
    for r in range(a.repeat):
        for name, where, k, threads, width, *side in variants:
            if where in ("gpu", "image") and not gpu:
                continue
            img_s, cores = rate(make(where, k, threads, width, *side), a.images, a.batch_size)
            print(f"{r} {name:40} {img_s:8.0f} img/s  {cores:5.2f} cores", flush=True)


if __name__ == "__main__":
    main()
