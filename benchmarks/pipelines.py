"""The loaders the benchmarks put side by side, each a ``make()`` that builds an iterable of batches on
the device: torchvision's DataLoader (all cores as workers), the DALI pipeline a user writes by hand,
DALI's experimental torchvision API, and gputransforms (ImageFolder, ImageList, a user's Dataset).
``pipeline(name)`` resolves a name with its variant suffixes (``-hwNN``, ``-qN``, ...)."""
from __future__ import annotations

import os

import torch
import torchvision

from benchmarks.common import CHAINS, MEAN, STD, Moved, collate_for, mixup_cutmix, on_gpu, torch_device


def run_torchvision(root, chain, batch_size, workers):
    import torchvision.transforms as T

    dev = torch_device()

    def make():
        ds = torchvision.datasets.ImageFolder(root, transform=CHAINS[chain](T))
        dl = torch.utils.data.DataLoader(ds, batch_size=batch_size, shuffle=chain != "eval", num_workers=workers,
                                         pin_memory=on_gpu(), persistent_workers=workers > 0,
                                         prefetch_factor=4 if workers else None, collate_fn=collate_for(chain, root))
        return Moved(dl, dev)

    return make


def run_dali_handwritten(root, chain, batch_size, threads, hw_decoder_load=0.9, prefetch_queue_depth=2,
                         cpu_decode_share=0.0):
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

    gpu = on_gpu()

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

    dev = "gpu" if on_gpu() else "cpu"
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
            read = samples.reader(gpu=on_gpu(), check_jpeg_scan=False)
            cache = {i: read(i) for i in range(len(ds))}
            samples.reader = lambda **_: cache.__getitem__
        if switch_interval is not None:  # a probe: the GIL handed between threads more often
            import sys

            sys.setswitchinterval(switch_interval)
        return dl

    return make


def _item_collate(examples):  # the Hugging Face example's collate_fn, on (image, label) pairs
    return torch.stack([image for image, _ in examples]), torch.tensor([label for _, label in examples])


def run_gputransforms_itemcollate(root, chain, batch_size, threads):
    """Ours over ImageFolder with a per-item collate_fn like the Hugging Face example's (a stack of the
    images and a tensor of the labels): the collate's share of the ``gputransforms-hf`` row."""
    from gputransforms import DataLoader, datasets
    from gputransforms import transforms as T

    return lambda: DataLoader(datasets.ImageFolder(root, transform=CHAINS[chain](T)), batch_size=batch_size,
                              shuffle=chain != "eval", num_workers=threads, collate_fn=_item_collate)


def run_gputransforms_prepared(root, chain, batch_size, threads, max_side=256, quality=90):
    """Ours with ``prepared=PreparedCopy`` (longest side ``max_side``). The copies are written by one
    untimed epoch here, before the timed loader is built: what is timed is a later epoch's speed."""
    import tempfile

    from gputransforms import DataLoader, PreparedCopy, datasets
    from gputransforms import transforms as T

    cache = os.path.join(tempfile.gettempdir(), f"gputransforms-prepared-{max_side}-{quality}")
    copy = PreparedCopy(cache, max_side=max_side, quality=quality)
    ds = datasets.ImageFolder(root, transform=CHAINS[chain](T))
    for _ in DataLoader(ds, batch_size=batch_size, num_workers=threads, prepared=copy):
        pass
    return run_gputransforms(root, chain, batch_size, threads, prepared=copy)


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

    dev = torch_device()

    def make():
        dl = torch.utils.data.DataLoader(UserDataset(_two_labels(root), CHAINS[chain](T)), batch_size=batch_size,
                                         shuffle=chain != "eval", num_workers=workers, pin_memory=on_gpu(),
                                         persistent_workers=workers > 0, prefetch_factor=4 if workers else None)
        return Moved(dl, dev)

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


# --- streamed data: webdataset shards and a Hugging Face table of the same photos ---------------------

def shards_of(root: str, per_shard: int = 160) -> str:
    """ROOT's photos as webdataset shards beside it (written once, shuffled: a shard holds every
    class), as a brace pattern."""
    import glob
    import os

    from gputransforms import sampledata

    out = os.path.abspath(root).rstrip("/") + "-shards"
    if not glob.glob(os.path.join(out, "shard-*.tar")):
        sampledata.write_shards(root, out, per_shard=per_shard, seed=0)
    n = len(glob.glob(os.path.join(out, "shard-*.tar")))
    return os.path.join(out, f"shard-{{000000..{n - 1:06d}}}.tar")


def _wds(root, tf, shuffle):
    import webdataset as wds

    ds = wds.WebDataset(shards_of(root), shardshuffle=100 if shuffle else False, empty_check=False)
    return (ds.shuffle(1000) if shuffle else ds).decode("pil").to_tuple("jpg;png", "cls").map_tuple(tf, int)


def run_torchvision_wds(root, chain, batch_size, workers):
    """webdataset's own pipeline with torchvision's transforms on torch's DataLoader (split by worker)."""
    import torchvision.transforms as T

    dev = torch_device()
    return lambda: Moved(torch.utils.data.DataLoader(
        _wds(root, CHAINS[chain](T), chain != "eval"), batch_size=batch_size, num_workers=workers,
        pin_memory=on_gpu(), persistent_workers=workers > 0, prefetch_factor=4 if workers else None), dev)


def run_gputransforms_wds(root, chain, batch_size, threads):
    from gputransforms import DataLoader
    from gputransforms import transforms as T

    return lambda: DataLoader(_wds(root, CHAINS[chain](T), chain != "eval"), batch_size=batch_size,
                              num_workers=threads)


def _hf(root, tf):
    """ROOT as transformers' example loads it: load_dataset("imagefolder") and with_transform."""
    import os

    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # a local folder: no Hub lookups
    import datasets

    ds = datasets.load_dataset("imagefolder", data_dir=root, split="train")

    def preprocess(batch):
        batch["pixel_values"] = [tf(img.convert("RGB")) for img in batch["image"]]
        return batch

    return ds.with_transform(preprocess)


def _hf_collate(examples):  # the example's collate_fn
    return {"pixel_values": torch.stack([e["pixel_values"] for e in examples]),
            "labels": torch.tensor([e["label"] for e in examples])}


class Tupled:
    """Dict batches as (pixel_values, labels) tuples on the device (what ``timed`` reads)."""

    def __init__(self, dl, dev):
        self.dl, self.dev = dl, dev

    def __iter__(self):
        for b in self.dl:
            yield b["pixel_values"].to(self.dev, non_blocking=True), b["labels"].to(self.dev, non_blocking=True)


def run_torchvision_hf(root, chain, batch_size, workers):
    import torchvision.transforms as T

    return lambda: Tupled(torch.utils.data.DataLoader(
        _hf(root, CHAINS[chain](T)), batch_size=batch_size, shuffle=chain != "eval", num_workers=workers,
        collate_fn=_hf_collate, pin_memory=on_gpu(), persistent_workers=workers > 0,
        prefetch_factor=4 if workers else None), torch_device())


def run_gputransforms_hf(root, chain, batch_size, threads):
    from gputransforms import DataLoader
    from gputransforms import transforms as T

    return lambda: Tupled(DataLoader(_hf(root, CHAINS[chain](T)), batch_size=batch_size, shuffle=chain != "eval",
                                     num_workers=threads, collate_fn=_hf_collate), torch_device())


# --- report -------------------------------------------------------------------------------------

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
             "gputransforms-userdataset": run_gputransforms_userdataset,
             # the same photos streamed: webdataset shards (written beside ROOT) and a Hugging Face table
             "torchvision-wds": run_torchvision_wds, "gputransforms-wds": run_gputransforms_wds,
             "torchvision-hf": run_torchvision_hf, "gputransforms-hf": run_gputransforms_hf,
             # ImageFolder with the Hugging Face example's kind of collate_fn: what that collate costs
             "gputransforms-itemcollate": run_gputransforms_itemcollate}


def pipeline(name: str):
    """``PIPELINES[name]``, or a variant of gputransforms/dali-handwritten by suffix: ``-hwNN``, the
    hardware JPEG decoder's share at NN% (default 90; less of it leaves more to nvJPEG's CUDA decoder
    and the CPU threads that parse for it); ``-qN``, N batches prepared ahead (gputransforms'
    prefetch_factor, default 4; hand-written DALI's prefetch_queue_depth, default 2); for gputransforms
    ``-prepNNN``, a prepared copy of longest side NNN (written by an untimed first epoch); and for
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
        if var.startswith("prep") and var[4:].isdigit() and base == "gputransforms":
            return lambda *a: run_gputransforms_prepared(*a, max_side=int(var[4:]))
        if var.startswith("q") and var[1:].isdigit():
            kw = "prefetch_factor" if base == "gputransforms" else "prefetch_queue_depth"
            return lambda *a: PIPELINES[base](*a, **{kw: int(var[1:])})
    raise KeyError(f"no pipeline {name!r}: {', '.join(PIPELINES)}, or gputransforms/dali-handwritten-hwNN/-qN, "
                   "dali-handwritten-cpuNN, gputransforms-prepNNN")


