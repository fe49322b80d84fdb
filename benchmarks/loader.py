"""Side-by-side loader throughput, one process, one run.

    python -m benchmarks.loader ROOT [--make-data N] [--batch-size 256] [--chains train,eval] [--out DIR]

For each chain (train: RandomResizedCrop(224)+flip+ToTensor+Normalize; eval: Resize(256)+
CenterCrop(224)+ToTensor+Normalize) it times, on the same folder:

- ``torchvision``: ImageFolder + torch DataLoader with every core as a worker (pin_memory on GPU),
  batches moved to the device;
- ``dali-handwritten``: the pipeline a DALI user writes by hand (readers.file -> decode (mixed,
  hw_decoder_load=0.9) -> resize -> crop_mirror_normalize, 8 threads, DALIGenericIterator);
- ``dali-experimental-tv``: DALI's own ``nvidia.dali.experimental.torchvision`` Compose used as the
  ImageFolder transform (per sample, main process; train chain only, on a slice of the data);
- ``gputransforms``: ImageFolder + DataLoader from this package, the user's Compose unchanged.

It prints a table (img/s, ratio to torchvision and to hand-written DALI, time to first batch, GPU
memory in use on the device, peak host RSS), writes JSON and a PNG bar chart. Without a GPU the
same pipelines run on the CPU (DALI's CPU operators). ``--scaling`` adds throughput and memory
against batch size.
"""
from __future__ import annotations

import argparse
import json
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


def _gpu() -> bool:
    return torch.cuda.is_available()


def _device() -> torch.device:
    return torch.device("cuda" if _gpu() else "cpu")


def _device_mem_used() -> int:
    if not _gpu():
        return 0
    free, total = torch.cuda.mem_get_info()
    return total - free


def _rss_peak_mb() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return (own + kids) / 1024


def _sync():
    if _gpu():
        torch.cuda.synchronize()


class _PeakGpuMemory:
    """Device-wide GPU memory in use, sampled every 20 ms (DALI's allocations are not torch's, so
    torch.cuda.max_memory_allocated would miss them); reported as peak minus the level before."""

    def __init__(self):
        import threading

        self.base = self.peak = _device_mem_used()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        if _gpu():
            self._thread.start()

    def _run(self):
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, _device_mem_used())

    def stop_mb(self) -> float:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        return (max(self.peak, _device_mem_used()) - self.base) / 2**20


def timed(make_iterable, n_images: int, warmup_batches: int = 3) -> dict:
    """Time-to-first-batch from construction, then img/s over at least ``n_images`` after warm-up
    (epochs are restarted as needed, as a training loop would)."""
    gc_collect()
    mem = _PeakGpuMemory()
    t0 = time.perf_counter()
    loader = make_iterable()
    it = iter(loader)
    first = next(it)
    _sync()
    ttfb = time.perf_counter() - t0
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
                _sync()
                t_start = time.perf_counter()
                continue
            counted += x.shape[0]
            if counted >= n_images:
                break
        if counted >= n_images:
            break
        it = iter(loader)
    _sync()
    elapsed = time.perf_counter() - t_start
    out = dict(img_s=counted / elapsed, ttfb_s=ttfb, images=counted, gpu_mem_mb=mem.stop_mb(),
               shape=list(first[0].shape), dtype=str(first[0].dtype), device=str(first[0].device))
    del loader, it, first
    gc_collect()
    return out


def gc_collect():
    import gc

    gc.collect()
    if _gpu():
        torch.cuda.empty_cache()


# --- pipelines ---------------------------------------------------------------------------------

def run_torchvision(root, chain, batch_size, workers):
    import torchvision.transforms as T

    dev = _device()

    def make():
        ds = torchvision.datasets.ImageFolder(root, transform=CHAINS[chain](T))
        dl = torch.utils.data.DataLoader(ds, batch_size=batch_size, shuffle=chain != "eval", num_workers=workers,
                                         pin_memory=_gpu(), persistent_workers=workers > 0,
                                         prefetch_factor=4 if workers else None, collate_fn=collate_for(chain, root))
        return _Moved(dl, dev)

    return make


class _Moved:
    """torch's DataLoader with each batch's tensors moved to ``dev`` (what a training loop does)."""

    def __init__(self, dl, dev):
        self.dl, self.dev = dl, dev

    def __iter__(self):
        for batch in self.dl:
            yield tuple(b.to(self.dev, non_blocking=True) if isinstance(b, torch.Tensor) else b for b in batch)


def run_dali_handwritten(root, chain, batch_size, threads, hw_decoder_load=0.9, prefetch_queue_depth=2,
                         cpu_decode_share=0.0):
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

    gpu = _gpu()

    @pipeline_def(batch_size=batch_size, num_threads=threads, device_id=0 if gpu else None, seed=1,
                  prefetch_queue_depth=prefetch_queue_depth,
                  enable_conditionals=bool(cpu_decode_share) or chain in ("ta_wide", "ta_wide_mixup", "simclr", "timm_ra"))
    def pipe():
        jpegs, labels = fn.readers.file(file_root=root, random_shuffle=chain != "eval", name="reader")
        dev = "mixed" if gpu else "cpu"
        kw = dict(hw_decoder_load=hw_decoder_load) if gpu else {}
        if chain != "eval":
            if cpu_decode_share and fn.random.coin_flip(probability=cpu_decode_share, dtype=types.BOOL):
                # a share of the images decoded and resized by the CPU threads (-cpuNN)
                images = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB)
                images = fn.resize(images, resize_x=224, resize_y=224)
                images = images.gpu() if gpu else images
            else:
                images = fn.decoders.image_random_crop(jpegs, device=dev, output_type=types.RGB, **kw)
                images = fn.resize(images, resize_x=224, resize_y=224)
            mirror = fn.random.coin_flip()
            crop = {}
            if chain.startswith("ta_wide"):  # DALI's own TrivialAugmentWide (its ops, not torchvision's)
                from nvidia.dali.auto_aug.trivial_augment import trivial_augment_wide

                images = trivial_augment_wide(images, fill_value=0)
            if chain == "timm_ra":  # DALI's own RandAugment n=2 m=9 (its ops, no magnitude noise)
                from nvidia.dali.auto_aug.rand_augment import rand_augment

                images = rand_augment(images, n=2, m=9, fill_value=0)
            if chain == "timm_default":  # DALI's colour_twist for ColorJitter(0.4, 0.4, 0.4), fixed order
                images = fn.color_twist(images, brightness=fn.random.uniform(range=[0.6, 1.4]),
                                        contrast=fn.random.uniform(range=[0.6, 1.4]),
                                        saturation=fn.random.uniform(range=[0.6, 1.4]))
            if chain == "simclr":  # DALI's colour and blur ops (fixed jitter order, not torchvision's random one)
                if fn.random.coin_flip(probability=0.8):
                    images = fn.color_twist(images, brightness=fn.random.uniform(range=[0.6, 1.4]),
                                            contrast=fn.random.uniform(range=[0.6, 1.4]),
                                            saturation=fn.random.uniform(range=[0.6, 1.4]),
                                            hue=fn.random.uniform(range=[-36.0, 36.0]))
                if fn.random.coin_flip(probability=0.2):
                    images = fn.color_twist(images, saturation=0.0)
                if fn.random.coin_flip(probability=0.5):
                    images = fn.gaussian_blur(images, window_size=23, sigma=fn.random.uniform(range=[0.1, 2.0]))
        else:
            images = fn.decoders.image(jpegs, device=dev, output_type=types.RGB, **kw)
            images = fn.resize(images, resize_shorter=256)
            mirror = 0
            crop = dict(crop=(224, 224))
        images = fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="CHW",
                                          mean=[m * 255 for m in MEAN], std=[s * 255 for s in STD], mirror=mirror,
                                          **crop)
        return images, labels.gpu() if gpu else labels

    def make():
        p = pipe()
        p.build()
        it = DALIGenericIterator(p, ["x", "y"], reader_name="reader", last_batch_policy=LastBatchPolicy.PARTIAL,
                                 auto_reset=True)
        # by hand, MixUp/CutMix go on the output batch (labels as int64 class indices)
        mix = mixup_cutmix(len(torchvision.datasets.folder.find_classes(root)[0])) if chain.endswith("_mixup") else None
        return _DaliIt(it, mix)

    return make


class _DaliIt:
    def __init__(self, it, mix=None):
        self.it, self.mix = it, mix

    def __iter__(self):
        for out in self.it:
            x, y = out[0]["x"], out[0]["y"]
            if self.mix is not None:
                x, y = self.mix(x, y.flatten().long())
            yield x, y


def run_dali_experimental(root, chain, batch_size, _threads, limit=512):
    import nvidia.dali.experimental.torchvision as dtv
    import torchvision.transforms.functional as F

    dev = "gpu" if _gpu() else "cpu"
    comp = dtv.Compose([dtv.RandomResizedCrop(224, device=dev), dtv.RandomHorizontalFlip(device=dev)])

    def tf(img):
        out = comp(img)
        out = out if isinstance(out, torch.Tensor) else F.pil_to_tensor(out)
        if out.shape[-1] == 3:
            out = out.permute(2, 0, 1)
        return F.normalize(out.float().div(255), MEAN, STD)

    def make():
        ds = torchvision.datasets.ImageFolder(root, transform=tf)
        ds = torch.utils.data.Subset(ds, torch.randperm(len(ds))[:limit].tolist())
        return torch.utils.data.DataLoader(ds, batch_size=min(batch_size, 64), num_workers=0)

    return make


def run_gputransforms(root, chain, batch_size, threads, graph_normalizes=False, files_in_memory=False,
                      switch_interval=None, **loader_kwargs):
    from gputransforms import DataLoader, datasets
    from gputransforms import transforms as T

    def make():
        ds = datasets.ImageFolder(root, transform=CHAINS[chain](T))
        dl = DataLoader(ds, batch_size=batch_size, shuffle=chain != "eval", num_workers=threads,
                        collate_fn=collate_for(chain, root), **loader_kwargs)
        if graph_normalizes and dl.plan is not None:  # the A/B of compiler/handoff.py: float32 out of DALI
            dl.plan.affine = None
        if files_in_memory:  # a probe: every file read and checked once, the reader threads only look up
            samples = dl._backend.files
            read = samples.reader(gpu=_gpu(), check_jpeg_scan=False)
            cache = {i: read(i) for i in range(len(ds))}
            samples.reader = lambda **_: cache.__getitem__
        if switch_interval is not None:  # a probe: the GIL handed between threads more often
            import sys

            sys.setswitchinterval(switch_interval)
        return dl

    return make


def _two_labels(root):
    """The folder's files with two labels each (class, and a second one derived from the index):
    the multi-label list file of a flat folder, without writing one."""
    samples = torchvision.datasets.ImageFolder(root).samples
    k = max(t for _, t in samples) + 1
    return [(p, [t, (7 * i + t) % k]) for i, (p, t) in enumerate(samples)]


class UserDataset(torch.utils.data.Dataset):
    """The hand-written multi-label dataset of DALI's tutorials: PIL in __getitem__."""

    def __init__(self, rows, transform):
        self.rows, self.transform = rows, transform

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        from PIL import Image

        path, labels = self.rows[i]
        return self.transform(Image.open(path).convert("RGB")), torch.tensor(labels)


def run_torchvision_userdataset(root, chain, batch_size, workers):
    import torchvision.transforms as T

    dev = _device()

    def make():
        dl = torch.utils.data.DataLoader(UserDataset(_two_labels(root), CHAINS[chain](T)), batch_size=batch_size,
                                         shuffle=chain != "eval", num_workers=workers, pin_memory=_gpu(),
                                         persistent_workers=workers > 0, prefetch_factor=4 if workers else None)
        return _Moved(dl, dev)

    return make


def run_gputransforms_imagelist(root, chain, batch_size, threads):
    from gputransforms import DataLoader, datasets
    from gputransforms import transforms as T

    def make():
        import torch as _t

        rows = [(p, _t.tensor(labels)) for p, labels in _two_labels(root)]
        ds = datasets.ImageList(rows, transform=CHAINS[chain](T))
        return DataLoader(ds, batch_size=batch_size, shuffle=chain != "eval", num_workers=threads)

    return make


def run_gputransforms_userdataset(root, chain, batch_size, threads):
    """The hand-written Dataset itself, passed to gputransforms.DataLoader: its files and targets are
    found by running its __getitem__ on a placeholder (datasets/discover.py; in the time to first batch)."""
    from gputransforms import DataLoader
    from gputransforms import transforms as T

    def make():
        return DataLoader(UserDataset(_two_labels(root), CHAINS[chain](T)), batch_size=batch_size,
                          shuffle=chain != "eval", num_workers=threads)

    return make


# --- report -------------------------------------------------------------------------------------

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
    d.text((10, 10), f"{unit}, batch of {ok[0]['shape'][0]} ({'GPU' if _gpu() else 'CPU'})", fill="black")
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


PIPELINES = {"torchvision": run_torchvision, "dali-handwritten": run_dali_handwritten,
             "dali-experimental-tv": run_dali_experimental, "gputransforms": run_gputransforms,
             # libjpeg-turbo's chroma upsampling on the GPU: closer to PIL, slower
             "gputransforms-fancy-ups": lambda *a: run_gputransforms(*a, jpeg_fancy_upsampling=True),
             # DALI's graph normalises and hands over float32 (before compiler/handoff.py): the A/B
             "gputransforms-graphnorm": lambda *a: run_gputransforms(*a, graph_normalizes=True),
             # probes of the reader threads' share of the GIL beside a training loop (benchmarks/train.py)
             "gputransforms-inmemory": lambda *a: run_gputransforms(*a, files_in_memory=True),
             "gputransforms-switch1ms": lambda *a: run_gputransforms(*a, switch_interval=0.001),
             # the same files as a multi-label list: ImageList vs a hand-written Dataset on torch's workers
             "torchvision-userdataset": run_torchvision_userdataset, "gputransforms-imagelist": run_gputransforms_imagelist,
             "gputransforms-userdataset": run_gputransforms_userdataset}


def pipeline(name: str):
    """``PIPELINES[name]``, or a variant of gputransforms/dali-handwritten by suffix: ``-hwNN``, the
    hardware JPEG decoder's share at NN% (default 90; less of it leaves more to nvJPEG's CUDA decoder
    and the CPU threads that parse for it); ``-qN``, N batches prepared ahead (gputransforms'
    prefetch_factor, default 4; hand-written DALI's prefetch_queue_depth, default 2); and for
    dali-handwritten ``-cpuNN``, NN% of the images (a coin per image) decoded and resized by DALI's CPU
    operators in a conditional (a probe of CPU decoders beside the GPU's, README "Training end to
    end": it loses; a batch whose coins all send it to the CPU would crash DALI 2.4, whose GPU
    resize refuses the empty other branch, which batches of 256 at NN <= 70 never meet)."""
    if name in PIPELINES:
        return PIPELINES[name]
    base, _, var = name.rpartition("-")
    if base in ("gputransforms", "dali-handwritten"):
        if var.startswith("hw") and var[2:].isdigit():
            return lambda *a: PIPELINES[base](*a, hw_decoder_load=int(var[2:]) / 100)
        if var.startswith("cpu") and var[3:].isdigit() and base == "dali-handwritten":
            return lambda *a: PIPELINES[base](*a, cpu_decode_share=int(var[3:]) / 100)
        if var.startswith("q") and var[1:].isdigit():
            kw = "prefetch_factor" if base == "gputransforms" else "prefetch_queue_depth"
            return lambda *a: PIPELINES[base](*a, **{kw: int(var[1:])})
    raise KeyError(f"no pipeline {name!r}: {', '.join(PIPELINES)}, or gputransforms/dali-handwritten-hwNN/-qN, "
                   "dali-handwritten-cpuNN")


def make_data(root: str, n: int):
    """An ImageNet-like folder of ``n`` real-photo JPEGs (gputransforms.sampledata), in up to 20 classes."""
    from gputransforms import sampledata

    classes = max(1, min(20, n // 50))
    sampledata.make_photo_folder(root, classes=classes, per_class=max(1, n // classes), seed=1,
                                 jobs=os.cpu_count() or 1)


def main(argv=None):
    ap = argparse.ArgumentParser(description="gputransforms loader benchmark")
    ap.add_argument("root")
    ap.add_argument("--make-data", type=int, default=0, metavar="N", help="first write N ImageNet-like JPEGs to ROOT")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--chains", default="train,eval")
    ap.add_argument("--pipelines", default="torchvision,dali-handwritten,dali-experimental-tv,gputransforms")
    ap.add_argument("--workers", type=int, default=os.cpu_count(), help="torchvision DataLoader workers")
    ap.add_argument("--threads", type=int, default=8, help="DALI threads (hand-written and gputransforms)")
    ap.add_argument("--images", type=int, default=0, help="images timed per pipeline (default: 2 epochs, "
                                                           "1 for torchvision)")
    ap.add_argument("--scaling", action="store_true", help="also gputransforms throughput vs batch size")
    ap.add_argument("--large", type=int, default=0, metavar="N",
                    help="also time the train chain on N 2000-px photos (written next to ROOT)")
    ap.add_argument("--out", default="bench-out")
    a = ap.parse_args(argv)
    if a.make_data:
        make_data(a.root, a.make_data)
    n_files = len(torchvision.datasets.ImageFolder(a.root).samples)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for chain in a.chains.split(","):
        for name in a.pipelines.split(","):
            if name == "dali-experimental-tv" and chain != "train":
                continue
            threads = a.workers if name.startswith("torchvision") else a.threads
            n = a.images or (n_files if name == "torchvision" else 2 * n_files)
            if name == "dali-experimental-tv":
                n = min(n, 384)
            row = dict(chain=chain, pipeline=name)
            try:
                row.update(timed(pipeline(name)(a.root, chain, a.batch_size, threads), n))
            except Exception as e:  # noqa: BLE001 - one failing pipeline must not hide the others
                row["error"] = f"{type(e).__name__}: {e}".splitlines()[0]
            row["rss_mb"] = _rss_peak_mb()
            rows.append(row)
            print(f"  {chain} {name}: {row.get('img_s', float('nan')):.0f} img/s {row.get('error', '')}", flush=True)
        base = {r["pipeline"]: r.get("img_s") for r in rows if r["chain"] == chain}
        for r in rows:
            if r["chain"] == chain and "img_s" in r:
                if base.get("torchvision"):
                    r["x_torchvision"] = r["img_s"] / base["torchvision"]
                if base.get("dali-handwritten"):
                    r["x_dali"] = r["img_s"] / base["dali-handwritten"]
    scaling = []
    if a.scaling:
        for bs in (32, 64, 128, 256, 512, 1024):
            try:
                torch.cuda.empty_cache() if _gpu() else None
                r = timed(run_gputransforms(a.root, "train", bs, a.threads), 2 * n_files)
                scaling.append(dict(batch_size=bs, img_s=r["img_s"], gpu_mem_mb=r["gpu_mem_mb"]))
                print(f"  scaling batch {bs}: {r['img_s']:.0f} img/s, GPU {r['gpu_mem_mb']:.0f} MiB", flush=True)
            except Exception as e:  # noqa: BLE001
                scaling.append(dict(batch_size=bs, error=str(e).splitlines()[0]))
    large = []
    if a.large:
        from gputransforms import sampledata

        big_root = a.root.rstrip("/") + "-2000px"
        if not Path(big_root).exists():
            sampledata.make_photo_folder(big_root, classes=4, per_class=max(1, a.large // 4), seed=2, long_side=2000,
                                         jobs=os.cpu_count() or 1)
        for name in ("torchvision", "dali-handwritten", "gputransforms"):
            threads = a.workers if name == "torchvision" else a.threads
            row = dict(chain="train-2000px", pipeline=name)
            try:
                row.update(timed(pipeline(name)(big_root, "train", a.batch_size, threads), 2 * a.large))
            except Exception as e:  # noqa: BLE001
                row["error"] = f"{type(e).__name__}: {e}".splitlines()[0]
            row["rss_mb"] = _rss_peak_mb()
            large.append(row)
            print(f"  2000px {name}: {row.get('img_s', float('nan')):.0f} img/s", flush=True)
        base = {r["pipeline"]: r.get("img_s") for r in large}
        for r in large:
            if "img_s" in r and base.get("torchvision"):
                r["x_torchvision"] = r["img_s"] / base["torchvision"]
            if "img_s" in r and base.get("dali-handwritten"):
                r["x_dali"] = r["img_s"] / base["dali-handwritten"]
        rows += large
    info = dict(device=torch.cuda.get_device_name() if _gpu() else "cpu", cores=os.cpu_count(), files=n_files,
                torch=torch.__version__, torchvision=torchvision.__version__, batch_size=a.batch_size,
                torchvision_workers=a.workers, dali_threads=a.threads)
    try:
        import nvidia.dali

        info["dali"] = nvidia.dali.__version__
    except ImportError:
        pass
    (out / "loader.json").write_text(json.dumps(dict(info=info, rows=rows, scaling=scaling), indent=2))
    bar_chart(rows, out / "loader.png")
    print(json.dumps(info))
    print(table(rows))
    if scaling:
        print("gputransforms train chain vs batch size: " + ", ".join(
            f"{r['batch_size']}: {r['img_s']:.0f} img/s {r['gpu_mem_mb']:.0f} MiB" if "img_s" in r
            else f"{r['batch_size']}: {r['error']}" for r in scaling))
    return rows


if __name__ == "__main__":
    main()
