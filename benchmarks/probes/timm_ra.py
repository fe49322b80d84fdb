"""What timm's RandAugment costs in the compiled graph, against DALI's own ``auto_aug.rand_augment``:
DALI pipelines alone (``pipeline.run()``, no torch hand-off), fed by ``readers.file`` so Python is out
of the measurement, each variant changing one thing.

    python -m benchmarks.probes.timm_ra ROOT [--threads 8] [--batch-size 256] [--images 15000]
                                        [--variants dali,ours,...] [--repeat 2]

Variants (``--variants``, comma-separated; all by default):

- ``dali-crop``: DALI's random-crop decode, resize to 224 and crop_mirror_normalize, by hand;
- ``dali-ra``: the same with DALI's own ``rand_augment(n=2, m=9, fill_value=0)`` (benchmarks/pipelines.py);
- ``dali-ra-dynamic``: ``dali-ra`` on DALI's dynamic executor (what our graphs use);
- ``ours-crop``: our graph of ``create_transform(224, is_training=True)`` without colour jitter;
- ``ours``: our graph of ``rand-m9-mstd0.5-inc1`` (the loader benchmark's ``timm_ra`` chain, without
  its RandomErasing, which runs after the graph);
- ``ours-fill0``: the same with timm's fill black (DALI's warps fill with one number; timm's mean fill
  is warped in float around it);
- ``ours-nostd``: ``rand-m9-inc1`` (no magnitude noise);
- ``ours-static``: ``ours`` with DALI's default executor instead of the dynamic one;
- ``ours-threads4``, ``ours-threads16``: ``ours`` with half or twice the threads;
- ``ours-pq4``: ``ours`` with a prefetch queue of 4 batches;
- ``ours-only-G``, ``dali-only-G``: RandAugment over one kind of op only (G: ``warps``, ``blends``,
  ``point``; ``GROUPS``) or one op (G: its timm or DALI name). timm applies each op with probability
  0.5, DALI's always; ``ours-only-G-fill0``, ``ours-only-G-static`` as above;
- ``ours-n1``, ``ours-n3``, ``dali-ra-n1``, ``dali-ra-n3``: one or three layers instead of two (what a
  layer costs each graph);
- ``chain-C``, ``chain-C-static``: our graph of the loader benchmark's chain C (``train``, ``ta_wide``,
  ``simclr``) on the dynamic or the default executor.

Per variant: img/s, and the process's CPU time over wall time (cores kept busy).
"""
from __future__ import annotations

import argparse
import time

import torch
from nvidia.dali import fn, pipeline_def, types

from benchmarks.common import MEAN, STD, cpu_seconds


def rate(pipe, n_images: int, batch_size: int, warmup: int = 4) -> tuple:
    """(img/s, cores kept busy) of ``pipe.run()`` over ``n_images`` after ``warmup`` runs: a DALI
    pipeline alone (this probe, scalar_ops and ablate)."""
    for _ in range(warmup):
        pipe.run()
    t, c = time.perf_counter(), cpu_seconds()
    runs = max(1, n_images // batch_size)
    for _ in range(runs):
        out = pipe.run()
    out[0].as_tensor() if hasattr(out[0], "as_tensor") else None
    wall = time.perf_counter() - t
    return runs * batch_size / wall, (cpu_seconds() - c) / wall


GROUPS = {  # (timm's ops, DALI's ops) by kind, for the ``ours-only-`` and ``dali-only-`` variants
    "warps": (["Rotate", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel"],
              ["rotate", "shear_x", "shear_y", "translate_x", "translate_y"]),
    "blends": (["ColorIncreasing", "ContrastIncreasing", "BrightnessIncreasing", "SharpnessIncreasing"],
               ["color", "contrast", "brightness", "sharpness"]),
    "point": (["AutoContrast", "Equalize", "Invert", "PosterizeIncreasing", "SolarizeIncreasing", "SolarizeAdd"],
              ["auto_contrast", "equalize", "posterize", "solarize"]),
}


def timm_tf(aa=None, fill0=False, only=None):
    from benchmarks.common import timm_ra_tf
    from timm.data import create_transform

    if aa == "rand-m9-mstd0.5-inc1" and not fill0:
        tf = timm_ra_tf(None)  # the benchmark's chain (its Pillow note), RandomErasing dropped below
    else:
        kw = dict(mean=(0.0, 0.0, 0.0)) if fill0 else {}
        tf = create_transform(224, is_training=True, auto_augment=aa, color_jitter=None if aa is None else 0.4,
                              interpolation="bilinear", **kw)
    from timm.data.random_erasing import RandomErasing
    tf.transforms = [t for t in tf.transforms if not isinstance(t, RandomErasing)]
    if only is not None:
        from timm.data.auto_augment import RandAugment

        ra = next(t for t in tf.transforms if isinstance(t, RandAugment))
        ra.ops = [op for op in ra.ops if op.name in only]
        assert len(ra.ops) == len(only), (only, ra.ops)
    return tf


def variants(root: str, bs: int, t: int, gpu: bool) -> dict:
    """Each variant's name and a function building its pipeline (this probe's and kernels.py's)."""
    mean, std = [m * 255 for m in MEAN], [s * 255 for s in STD]

    def reader():
        return fn.readers.file(file_root=root, random_shuffle=True, name="r")[0]

    def dali(ra: bool, threads: int, only=None, n=2, **pipeline_kw):
        @pipeline_def(batch_size=bs, num_threads=threads, device_id=0 if gpu else None, seed=1,
                      prefetch_queue_depth=2, enable_conditionals=ra, **pipeline_kw)
        def pipe():
            kw = dict(hw_decoder_load=0.9) if gpu else {}
            img = fn.decoders.image_random_crop(reader(), device="mixed" if gpu else "cpu", output_type=types.RGB,
                                                **kw)
            img = fn.resize(img, resize_x=224, resize_y=224)
            if ra:
                from nvidia.dali.auto_aug.rand_augment import apply_rand_augment, get_rand_augment_suite, rand_augment

                if only is None:
                    img = rand_augment(img, n=n, m=9, fill_value=0)
                else:  # (rand_augment passes the warps' arguments, which apply_rand_augment refuses without warps)
                    augs = [aug for aug in get_rand_augment_suite() if aug.name in only]
                    kw = dict(fill_value=0) if set(only) & set(GROUPS["warps"][1]) else {}
                    img = apply_rand_augment(augs, img, n=n, m=9, **kw)
            return fn.crop_mirror_normalize(img, dtype=types.FLOAT, output_layout="CHW", mean=mean, std=std,
                                            mirror=fn.random.coin_flip())

        p = pipe()
        p.build()
        return p

    def ours(tf, threads: int, **pipeline_kw):
        import gputransforms.compiler.dali as gd
        from gputransforms import plan

        real = gd.pipeline_def
        if pipeline_kw:
            gd.pipeline_def = lambda **kw: real(**{**kw, **pipeline_kw})
        try:
            return gd.build_pipeline(plan(tf), None, device="gpu" if gpu else "cpu", batch_size=bs,
                                     num_threads=threads, seed=1, reader=reader)
        finally:
            gd.pipeline_def = real

    make = {
        "dali-crop": lambda: dali(False, t),
        "dali-ra": lambda: dali(True, t),
        "dali-ra-dynamic": lambda: dali(True, t, exec_dynamic=True),
        "ours-crop": lambda: ours(timm_tf(None), t),
        "ours": lambda: ours(timm_tf("rand-m9-mstd0.5-inc1"), t),
        "ours-fill0": lambda: ours(timm_tf("rand-m9-mstd0.5-inc1", fill0=True), t),
        "ours-nostd": lambda: ours(timm_tf("rand-m9-inc1"), t),
        "ours-static": lambda: ours(timm_tf("rand-m9-mstd0.5-inc1"), t, exec_dynamic=False),
        "ours-threads4": lambda: ours(timm_tf("rand-m9-mstd0.5-inc1"), max(1, t // 2)),
        "ours-threads16": lambda: ours(timm_tf("rand-m9-mstd0.5-inc1"), t * 2),
        "ours-pq4": lambda: ours(timm_tf("rand-m9-mstd0.5-inc1"), t, prefetch_queue_depth=4),
        "ours-n1": lambda: ours(timm_tf("rand-m9-n1-mstd0.5-inc1"), t),
        "ours-n3": lambda: ours(timm_tf("rand-m9-n3-mstd0.5-inc1"), t),
        "dali-ra-n1": lambda: dali(True, t, n=1),
        "dali-ra-n3": lambda: dali(True, t, n=3),
    }
    from benchmarks.common import CHAINS
    from gputransforms import transforms as T

    for chain in ("train", "ta_wide", "simclr"):  # the executors on the other chains' graphs
        make[f"chain-{chain}"] = lambda c=chain: ours(CHAINS[c](T), t)
        make[f"chain-{chain}-static"] = lambda c=chain: ours(CHAINS[c](T), t, exec_dynamic=False)
    for group, (timm_ops, dali_ops) in GROUPS.items():
        make[f"ours-only-{group}"] = lambda o=timm_ops: ours(timm_tf("rand-m9-mstd0.5-inc1", only=o), t)
        make[f"dali-only-{group}"] = lambda o=dali_ops: dali(True, t, only=o)
        make[f"ours-only-{group}-fill0"] = lambda o=timm_ops: ours(timm_tf("rand-m9-mstd0.5-inc1", fill0=True, only=o), t)
        make[f"ours-only-{group}-static"] = lambda o=timm_ops: ours(timm_tf("rand-m9-mstd0.5-inc1", only=o), t,
                                                                    exec_dynamic=False)
        for name in timm_ops:
            make[f"ours-only-{name}"] = lambda o=[name]: ours(timm_tf("rand-m9-mstd0.5-inc1", only=o), t)
        for name in dali_ops:
            make[f"dali-only-{name}"] = lambda o=[name]: dali(True, t, only=o)
    return make


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--images", type=int, default=15000)
    ap.add_argument("--variants", default="dali-crop,dali-ra,ours-crop,ours,ours-fill0,ours-nostd,ours-static,"
                                          "ours-threads4,ours-threads16,ours-pq4,dali-ra-dynamic")
    ap.add_argument("--repeat", type=int, default=1)
    a = ap.parse_args(argv)
    bs = a.batch_size
    make = variants(a.root, bs, a.threads, torch.cuda.is_available())
    for r in range(a.repeat):
        for name in a.variants.split(","):
            pipe = make[name]()
            ops = len(getattr(pipe, "_ops", None) or [])
            img_s, cores = rate(pipe, a.images, bs)
            print(f"{r} {name:16} {img_s:8.0f} img/s  {cores:5.2f} cores  {ops} operators", flush=True)
            del pipe


if __name__ == "__main__":
    main()
