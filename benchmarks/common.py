"""What the benchmarks share: the chains they time (``CHAINS``, built from a transforms module so the
same chain is torchvision's or ours), the reference recipe's MixUp/CutMix collate, and the measuring
tools (``timed``: time to first batch and img/s after warm-up; ``PeakGpuMemory``: device-wide memory,
DALI's included; ``bar_chart``, ``table``; ``make_data``: ImageNet-like JPEGs from the project's own
generator)."""
from __future__ import annotations

import os
import resource
import time
from pathlib import Path

import torch
import torchvision

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def train_tf(T):
    return T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)])


def eval_tf(T):
    return T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(), T.Normalize(MEAN, STD)])


def ta_wide_tf(T):
    """torchvision's classification reference train preset with TrivialAugmentWide and RandomErasing
    (references/classification/presets.py: auto_augment_policy="ta_wide", random_erase_prob=0.1)."""
    import torchvision.transforms as tv

    return T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), tv.TrivialAugmentWide(), T.PILToTensor(),
                      T.ConvertImageDtype(torch.float), T.Normalize(MEAN, STD), tv.RandomErasing(p=0.1)])


def simclr_tf(T):
    """A SimCLR/BYOL-style contrastive view: colour jitter with probability 0.8, random grayscale,
    a random Gaussian blur (kernel 23, ~10% of the crop) with probability 0.5. Everything after the
    crop and flip runs in gputransforms' batched stage."""
    return T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(),
                      T.RandomApply([T.ColorJitter(0.4, 0.4, 0.4, 0.1)], p=0.8), T.RandomGrayscale(p=0.2),
                      T.RandomApply([T.GaussianBlur(23, sigma=(0.1, 2.0))], p=0.5), T.ToTensor(),
                      T.Normalize(MEAN, STD)])


def timm_ra_tf(T):
    """timm's training recipe of DeiT, ConvNeXt and most ViTs, ``create_transform(224, is_training=True,
    auto_augment="rand-m9-mstd0.5-inc1", re_prob=0.25)``: gputransforms lowers timm's RandAugment into
    the graph (``compiler/timm_augment.py``) and runs timm's RandomErasing batched.

    Pillow 13 raises for ``ImageOps.posterize(img, 0)``, which timm's PosterizeIncreasing asks for at
    magnitude 10 (about one image in 650 with mstd 0.5): torchvision's side would stop with a
    ValueError, so under Pillow 13 the benchmark gives timm Pillow 12's posterize (0 bits: black)."""
    import PIL
    from timm.data import auto_augment, create_transform

    if int(PIL.__version__.split(".")[0]) >= 13:
        def posterize(image, bits):
            mask = ~(2 ** (8 - bits) - 1) & 0xFF
            return image.point([i & mask for i in range(256)] * len(image.getbands()))

        auto_augment.ImageOps.posterize = posterize
    return create_transform(224, is_training=True, auto_augment="rand-m9-mstd0.5-inc1", re_prob=0.25)


def timm_default_tf(T):
    """What timm's train.py builds with its defaults (no --aa, --train-interpolation random,
    --color-jitter 0.4): ``create_transform(224, is_training=True, interpolation="random")``, a
    RandomResizedCropAndInterpolation drawing bilinear or bicubic per image (in the graph), flip,
    ColorJitter(0.4, 0.4, 0.4) (batched), ToTensor, Normalize."""
    from timm.data import create_transform

    return create_transform(224, is_training=True, interpolation="random")


CHAINS = {"train": train_tf, "eval": eval_tf, "ta_wide": ta_wide_tf, "simclr": simclr_tf, "timm_ra": timm_ra_tf,
          "timm_default": timm_default_tf,
          "ta_wide_mixup": ta_wide_tf}


def mixup_cutmix(num_classes: int):
    """The reference recipe's batch transform with MixUp and CutMix on (references/classification/
    transforms.py get_mixup_cutmix, use_v2: the ViT/Swin/ConvNeXt recipes' --mixup-alpha 0.2
    --cutmix-alpha 1.0)."""
    from torchvision.transforms import v2

    return v2.RandomChoice([v2.MixUp(alpha=0.2, num_classes=num_classes), v2.CutMix(alpha=1.0, num_classes=num_classes)])


def collate_for(chain: str, root: str):
    """The recipe's collate_fn for chains that have one (train.py: ``mixup_cutmix(*default_collate(batch))``)."""
    if not chain.endswith("_mixup"):
        return None
    from torch.utils.data import default_collate

    mix = mixup_cutmix(len(torchvision.datasets.folder.find_classes(root)[0]))

    def collate_fn(batch):
        return mix(*default_collate(batch))

    return collate_fn


def on_gpu() -> bool:
    return torch.cuda.is_available()


def torch_device() -> torch.device:
    return torch.device("cuda" if on_gpu() else "cpu")


def gpu_mem_used() -> int:
    if not on_gpu():
        return 0
    free, total = torch.cuda.mem_get_info()
    return total - free


def rss_peak_mb() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return (own + kids) / 1024


def cuda_sync():
    if on_gpu():
        torch.cuda.synchronize()


class PeakGpuMemory:
    """Device-wide GPU memory in use, sampled every 100 ms (DALI's allocations are not torch's, so
    torch.cuda.max_memory_allocated would miss them); reported as peak minus the level before."""

    def __init__(self):
        import threading

        self.base = self.peak = gpu_mem_used()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        if on_gpu():
            self._thread.start()

    def _run(self):
        while not self._stop.wait(0.1):
            self.peak = max(self.peak, gpu_mem_used())

    def stop_mb(self) -> float:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        return (max(self.peak, gpu_mem_used()) - self.base) / 2**20


def timed(make_iterable, n_images: int, warmup_batches: int = 3) -> dict:
    """Time-to-first-batch from construction, then img/s over at least ``n_images`` after warm-up
    (epochs are restarted as needed, as a training loop would). A batch's first element is its images:
    a tensor, or a sequence of per-image tensors (detection)."""
    gc_collect()
    mem = PeakGpuMemory()
    t0 = time.perf_counter()
    loader = make_iterable()
    it = iter(loader)
    first = next(it)
    cuda_sync()
    ttfb = time.perf_counter() - t0
    x0 = first[0] if isinstance(first[0], torch.Tensor) else first[0][0]  # (detection: the first image)
    about = dict(shape=list(x0.shape), dtype=str(x0.dtype), device=str(x0.device))
    # a training loop holds one batch at a time: the first one kept alive through the measurement would
    # count a batch of device memory against loaders whose batches are their own (torch's), and none
    # against one whose batches live in DALI's pool until the next
    del first, x0
    seen_warm = 1
    counted = 0
    t_start = None
    while True:
        for batch in it:
            x = batch[0]
            if seen_warm < warmup_batches:
                seen_warm += 1
                continue
            if t_start is None:
                cuda_sync()
                t_start = time.perf_counter()
                continue
            counted += len(x)
            if counted >= n_images:
                break
        if counted >= n_images:
            break
        it = iter(loader)
    cuda_sync()
    elapsed = time.perf_counter() - t_start
    out = dict(img_s=counted / elapsed, ttfb_s=ttfb, images=counted, gpu_mem_mb=mem.stop_mb(), **about)
    del loader, it
    gc_collect()
    return out


def gc_collect():
    import gc

    gc.collect()
    if on_gpu():
        torch.cuda.empty_cache()


class Moved:
    """torch's DataLoader with each batch's tensors moved to ``dev`` (what a training loop does)."""

    def __init__(self, dl, dev):
        self.dl, self.dev = dl, dev

    def __iter__(self):
        for batch in self.dl:
            yield tuple(b.to(self.dev, non_blocking=True) if isinstance(b, torch.Tensor) else b for b in batch)


def table(rows) -> str:
    head = f"{'chain':12} {'pipeline':24} {'img/s':>9} {'x tv':>6} {'x dali':>7} {'1st batch s':>11} {'GPU MiB':>8} " \
           f"{'RSS MiB':>8}"  # GPU MiB: peak device-wide use above the level before; RSS: process peak
    lines = [head, "-" * len(head)]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['chain']:12} {r['pipeline']:24} {'n/a':>9}  ({r['error'][:70]})")
            continue
        lines.append(f"{r['chain']:12} {r['pipeline']:24} {r['img_s']:9.0f} {r.get('x_torchvision', 0):6.2f} "
                     f"{r.get('x_dali', 0):7.2f} {r['ttfb_s']:11.2f} {r['gpu_mem_mb']:8.0f} {r['rss_mb']:8.0f}")
    return "\n".join(lines)


def bar_chart(rows, path: Path, unit: str = "images/s"):
    from PIL import Image, ImageDraw

    ok = [r for r in rows if "error" not in r]
    if not ok:
        return
    w, bar_h, pad = 900, 26, 8
    img = Image.new("RGB", (w, 40 + len(ok) * (bar_h + pad)), "white")
    d = ImageDraw.Draw(img)
    d.text((10, 10), f"{unit}, batch of {ok[0]['shape'][0]} ({'GPU' if on_gpu() else 'CPU'})", fill="black")
    top = max(r["img_s"] for r in ok)
    colours = {"torchvision": (120, 120, 120), "dali-handwritten": (118, 185, 0), "gputransforms": (30, 100, 200),
               "dali-experimental-tv": (200, 120, 40)}
    for k, r in enumerate(ok):
        y = 34 + k * (bar_h + pad)
        label = f"{r['chain']}: {r['pipeline']}"
        d.text((10, y + 7), label, fill="black")
        length = int((w - 330) * r["img_s"] / top)
        d.rectangle([240, y, 240 + length, y + bar_h], fill=colours.get(r["pipeline"], (90, 90, 90)))
        d.text((246 + length, y + 7), f"{r['img_s']:.0f}", fill="black")
    img.save(path)


def make_data(root: str, n: int):
    """An ImageNet-like folder of ``n`` real-photo JPEGs (gputransforms.sampledata), in up to 20 classes."""
    from gputransforms import sampledata

    classes = max(1, min(20, n // 50))
    sampledata.make_photo_folder(root, classes=classes, per_class=max(1, n // classes), seed=1,
                                 jobs=os.cpu_count() or 1)


def interval_union(intervals: list) -> float:
    """Length of the union of (start, end) intervals: how long any of them ran (gpu_time.py, the probes)."""
    total, end = 0.0, None
    for s, e in sorted(intervals):
        if end is None or s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def cpu_seconds() -> float:
    """This process's CPU time so far, user and system (all its threads)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
