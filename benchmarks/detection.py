"""Detection and segmentation loaders side by side, one process, one run (#34):

    python -m benchmarks.detection ROOT [--make-data 5000] [--presets ssd,ssdlite,hflip,seg] [--batch-size 32]
                                        [--backend tv_tensor|tensor|pil]

ROOT is a folder of photos (``--make-data N`` writes N ImageNet-like ones first); its COCO layout
(boxes, polygons, crowd RLE; ``sampledata.write_coco``) and for ``seg`` its VOC layout (class masks;
``sampledata.write_voc``) are written beside it once. For each of torchvision's detection presets
(references/detection/presets.py with ``--use-v2 --backend tv_tensor``; ``--backend pil``: the
references' default, whose augmentations work on PIL images), on the same wrapped
``CocoDetection`` minus images without annotations (the reference's Subset), with the reference's
``collate_fn`` (``lsj-v2``: ``lsj_v2`` below; ``ssd-nocolour``: ``ssd`` without its
RandomPhotometricDistort, ``ssd-colouronly``: without its zoom-out and IoU crop); ``seg``: the segmentation reference's train preset
(``--use-v2``, base size 520, crop 480, its own ``PadIfSmaller``) on a wrapped ``VOCSegmentation``, with
its ``collate_fn``; ``seg-coco``: the same preset on the segmentation reference's own ``--use-v2`` data (COCO as
segmentation: ``segmentation_of_coco``; no hand-written DALI row); ``weights-eval``: the detection reference's
``--test-only --weights`` evaluation (its joint transform a function around ``weights.transforms()``: float images
of their own sizes):

- ``torchvision``: torch's DataLoader with every core as a worker; images moved to the device;
- ``gputransforms``: our DataLoader over the same dataset object, with the same arguments
  (``gputransforms-pf2``: and ``prefetch_factor=2``; any ``-pfN`` likewise);
- ``dali-handwritten`` (GPU only, ``ssd``): DALI's SSD example pipeline: ``readers.coco`` +
  ``random_bbox_crop`` + ``decoders.image_slice`` + ``bb_flip`` + ``resize`` to 300 +
  ``crop_mirror_normalize`` (not the same augmentation as torchvision's preset: a reference point);
- ``dali-preset`` (GPU only; ``ssd``, ``lsj-v2``, ``seg``): the preset's own augmentation written by hand in
  DALI, the same work as ours. ``ssd``: ``paste`` + ``bbox_paste`` zoom-out, ``random_bbox_crop``,
  ``bb_flip``, ``hsv`` and ``brightness_contrast``, each image at its own size, as the preset leaves it
  (``dali_preset``). ``lsj-v2``: ``resize`` by the scale jitter, ``crop_mirror_normalize`` to 1024 x 1024 with
  the fill, the boxes by arithmetic and ``bb_flip`` (``dali_lsj``). ``seg``: two ``readers.file`` shuffled
  alike, ``resize_shorter`` (the mask nearest), ``crop_mirror_normalize`` / ``crop`` to 480 x 480 with the
  fills, ``flip`` (``dali_seg``; the masks as grey PNGs, written once: ``voc_gray_masks``).

Prints img/s, time to the first batch and device memory; writes ``detection.json``. Device memory is
device-wide (DALI's pool is not torch's), and DALI keeps its pool for the process: a pipeline measured
after another in one process reuses what the first one left. ``--isolate`` runs each row in a process
of its own (the memory figures to quote). ``--sample`` then runs each gputransforms row a second time
and says where its main thread is (sampled every millisecond), what share of the time it is on a CPU,
and how many cores the process's threads and its workers keep busy.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
import torch.utils.data as tud

from benchmarks.common import make_data, on_gpu, rss_peak_mb, timed, torch_device


#: the presets each hand-written DALI pipeline has
DALI_PRESETS = {"dali-handwritten": ("ssd",), "dali-preset": ("ssd", "lsj-v2", "seg")}


def coco_of(root: str) -> tuple:
    from gputransforms import sampledata

    out = Path(os.path.abspath(root).rstrip("/") + "-coco")
    if not (out / "annotations.json").exists():
        sampledata.write_coco(root, out, seed=0)
    return str(out / "images"), str(out / "annotations.json")


def dataset(coco: tuple, preset: str, backend: str = "tv_tensor"):
    import torchvision

    from tests.presets import DetectionPresetTrain  # the reference's presets, as the tests rebuild them

    base, _, part = preset.partition("-")
    if base == "ssd" and part in ("nocolour", "colouronly"):  # what the ssd preset's colour block costs
        chain = DetectionPresetTrain(data_augmentation="ssd", backend=backend)
        from torchvision.transforms import v2 as T

        dropped = (T.RandomPhotometricDistort,) if part == "nocolour" else (T.RandomZoomOut, T.RandomIoUCrop)
        chain.transforms.transforms = [t for t in chain.transforms.transforms if not isinstance(t, dropped)]
    elif preset == "weights-eval":  # the reference's --test-only --weights: its lambda around weights.transforms()
        trans = torchvision.models.detection.FasterRCNN_ResNet50_FPN_Weights.DEFAULT.transforms()

        def chain(img, target):
            return trans(img), target
    else:
        chain = lsj_v2(backend) if preset == "lsj-v2" else DetectionPresetTrain(data_augmentation=preset,
                                                                                  backend=backend)
    ds = torchvision.datasets.CocoDetection(coco[0], coco[1], transforms=chain)
    ds = torchvision.datasets.wrap_dataset_for_transforms_v2(ds, target_keys=["boxes", "labels", "image_id"])
    return tud.Subset(ds, [i for i, img_id in enumerate(ds.ids) if ds.coco.getAnnIds(imgIds=img_id)])


def lsj_v2(backend: str):
    """The reference's ``lsj`` augmentation spelt with torchvision's own v2 classes (the reference's own
    ``FixedSizeCrop`` raises with ``--use-v2``: docs/datasets.md): ``ScaleJitter`` to 1024 x 1024, then
    ``RandomCrop(1024, pad_if_needed=True)`` with the mean fill (it pads both sides, where FixedSizeCrop pads
    the right and the bottom), the flip, and the preset's tail."""
    from torchvision import tv_tensors
    from torchvision.transforms import v2 as T

    head = {"tv_tensor": [T.ToImage()], "tensor": [T.PILToTensor()], "pil": []}[backend]
    return T.Compose(head + [
        T.ScaleJitter(target_size=(1024, 1024), antialias=True),
        T.RandomCrop(1024, pad_if_needed=True, fill={tv_tensors.Mask: 0, "others": (123.0, 117.0, 104.0)}),
        T.RandomHorizontalFlip(0.5)] + ([T.ToImage()] if backend == "pil" else []) + [
        T.ToDtype(torch.float, scale=True), T.ConvertBoundingBoxFormat(tv_tensors.BoundingBoxFormat.XYXY),
        T.SanitizeBoundingBoxes(), T.ToPureTensor()])


def voc_of(root: str) -> str:
    from gputransforms import sampledata

    out = Path(os.path.abspath(root).rstrip("/") + "-voc")
    if not (out / "VOCdevkit" / "VOC2012" / "ImageSets" / "Segmentation" / "train.txt").exists():
        sampledata.write_voc(root, out, seed=0)
    return str(out)


def segmentation(voc: str, backend: str = "tv_tensor"):
    import torchvision

    from tests.presets import SegmentationPresetTrain  # the reference's preset, as the tests rebuild it

    ds = torchvision.datasets.VOCSegmentation(voc, year="2012", image_set="train", transforms=SegmentationPresetTrain(
        base_size=520, crop_size=480, backend=backend))
    return torchvision.datasets.wrap_dataset_for_transforms_v2(ds)


def segmentation_of_coco(coco: tuple, backend: str = "tv_tensor"):
    """The segmentation reference's own --use-v2 data: COCO as segmentation (``tests.presets.segmentation_coco``:
    its Compose of CocoDetectionToVOCSegmentation and the train preset, base 520, crop 480)."""
    from tests.presets import SegmentationPresetTrain, segmentation_coco

    return segmentation_coco(*coco, SegmentationPresetTrain(base_size=520, crop_size=480, backend=backend))


class MovedPair:
    """torch's segmentation batches moved as the reference's loop moves them."""

    def __init__(self, dl, dev):
        self.dl, self.dev = dl, dev

    def __iter__(self):
        for images, targets in self.dl:
            yield images.to(self.dev, non_blocking=True), targets.to(self.dev, non_blocking=True)


def collate(batch):  # references/detection/utils.py
    return tuple(zip(*batch))


class Moved:
    """torch's batches with the images on the device, as the reference's loop moves them."""

    def __init__(self, dl, dev):
        self.dl, self.dev = dl, dev

    def __iter__(self):
        for images, targets in self.dl:
            yield [im.to(self.dev, non_blocking=True) for im in images], targets


def dali_ssd(coco: tuple, batch_size: int, threads: int):
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali.plugin.pytorch import DALIGenericIterator

    @pipeline_def(batch_size=batch_size, num_threads=threads, device_id=0, seed=1)
    def pipe():
        jpegs, boxes, labels = fn.readers.coco(file_root=coco[0], annotations_file=coco[1], skip_empty=True,
                                               ratio=True, ltrb=True, random_shuffle=True, name="reader")
        begin, size, boxes, labels = fn.random_bbox_crop(boxes, labels, aspect_ratio=[0.5, 2.0],
                                                         thresholds=[0, 0.1, 0.3, 0.5, 0.7, 0.9],
                                                         scaling=[0.3, 1.0], bbox_layout="xyXY", allow_no_crop=True,
                                                         num_attempts=50)
        images = fn.decoders.image_slice(jpegs, begin, size, device="mixed", output_type=types.RGB)
        flip = fn.random.coin_flip(probability=0.5)
        boxes = fn.bb_flip(boxes, ltrb=True, horizontal=flip)
        images = fn.resize(images, resize_x=300, resize_y=300)
        images = fn.crop_mirror_normalize(images, mirror=flip, dtype=types.FLOAT, output_layout="CHW",
                                          mean=[0.0] * 3, std=[255.0] * 3)
        # ragged per-image boxes: padded to the batch's most (DALI's iterator takes dense batches; its
        # SSD example encodes them against anchors instead)
        return images, fn.pad(boxes, fill_value=-1.0).gpu(), fn.pad(labels, fill_value=-1).gpu()

    p = pipe()
    p.build()
    return _Pairs(DALIGenericIterator([p], ["images", "boxes", "labels"], reader_name="reader", auto_reset=True))


def dali_preset(coco: tuple, batch_size: int, threads: int):
    """The ``ssd`` preset's augmentation written by hand in DALI (GPU only: ``paste``), as DALI's detection
    example composes it: photometric distortion (brightness, contrast, saturation, hue, each with p=0.5; no
    channel permutation, which DALI has no operator for), zoom-out (``paste`` + ``bbox_paste``: p=0.5, side
    ratio 1-4, the preset's mean fill), ``random_bbox_crop`` with RandomIoUCrop's options, ``bb_flip`` and the
    mirror, float scaled to [0, 1], CHW, each image at its own size (the preset has no resize). Batches are
    per-image tensors, as the detection reference's collate_fn gives them."""
    from nvidia.dali import fn, pipeline_def, types

    def maybe(lo: float, hi: float, neutral: float):
        on = fn.cast(fn.random.coin_flip(probability=0.5), dtype=types.FLOAT)
        return neutral + on * (fn.random.uniform(range=[lo, hi]) - neutral)

    @pipeline_def(batch_size=batch_size, num_threads=threads, device_id=0, seed=1)
    def pipe():
        jpegs, boxes, labels = fn.readers.coco(file_root=coco[0], annotations_file=coco[1], skip_empty=True,
                                               ratio=True, ltrb=True, random_shuffle=True, name="reader")
        images = fn.decoders.image(jpegs, device="mixed", output_type=types.RGB)
        images = fn.brightness_contrast(images, brightness=maybe(0.875, 1.125, 1.0),
                                        contrast=maybe(0.5, 1.5, 1.0))
        images = fn.hsv(images, saturation=maybe(0.5, 1.5, 1.0), hue=maybe(-0.05, 0.05, 0.0) * 360.0)
        zoom = fn.cast(fn.random.coin_flip(probability=0.5), dtype=types.FLOAT)
        ratio = 1.0 + zoom * (fn.random.uniform(range=[1.0, 4.0]) - 1.0)
        px, py = fn.random.uniform(range=[0.0, 1.0]), fn.random.uniform(range=[0.0, 1.0])
        images = fn.paste(images, ratio=ratio, paste_x=px, paste_y=py, fill_value=(123, 117, 104))
        boxes = fn.bbox_paste(boxes, ratio=ratio, paste_x=px, paste_y=py, ltrb=True)
        begin, size, boxes, labels = fn.random_bbox_crop(boxes, labels, aspect_ratio=[0.5, 2.0],
                                                         thresholds=[0, 0.1, 0.3, 0.5, 0.7, 0.9],
                                                         scaling=[0.3, 1.0], bbox_layout="xyXY", allow_no_crop=True,
                                                         num_attempts=40)
        images = fn.slice(images, begin, size, out_of_bounds_policy="trim_to_shape")
        flip = fn.random.coin_flip(probability=0.5)
        boxes = fn.bb_flip(boxes, ltrb=True, horizontal=flip)
        images = fn.crop_mirror_normalize(images, mirror=flip, dtype=types.FLOAT, output_layout="CHW",
                                          mean=[0.0] * 3, std=[255.0] * 3)
        return images, boxes.gpu(), labels.gpu()

    p = pipe()
    p.build()
    return _Ragged(p, p.epoch_size("reader") // batch_size)


def dali_lsj(coco: tuple, batch_size: int, threads: int, device: str = "gpu"):
    """``lsj-v2`` written by hand in DALI: ``ScaleJitter`` to 1024 x 1024 (scale 0.1-2.0 of the size that fits,
    from the file's header: ``peek_image_shape``), then ``crop_mirror_normalize``: a 1024 x 1024 window at a
    uniform position, padded with the preset's mean fill where the image is smaller, the mirror, float scaled to
    [0, 1], CHW; the boxes (``readers.coco``'s, relative) scaled, moved, ``bb_flip``-ed and clamped by the same
    numbers. What it leaves out of the preset: the removal of boxes left empty by the crop
    (``SanitizeBoundingBoxes``; DALI has no operator for it), and RandomCrop's exact padding (both sides by the
    missing size, then a uniform window: here the window's position alone places the image). ``device``
    "cpu": the same graph on DALI's CPU operators (the tests)."""
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali import math as dmath

    gpu = device == "gpu"

    @pipeline_def(batch_size=batch_size, num_threads=threads, device_id=0 if gpu else None, seed=1)
    def pipe():
        jpegs, boxes, labels = fn.readers.coco(file_root=coco[0], annotations_file=coco[1], skip_empty=True,
                                               ratio=True, ltrb=True, random_shuffle=True, name="reader")
        shape = fn.cast(fn.peek_image_shape(jpegs), dtype=types.FLOAT)
        h, w = shape[0], shape[1]
        r = dmath.min(1024.0 / h, 1024.0 / w) * fn.random.uniform(range=[0.1, 2.0])
        nh, nw = dmath.floor(h * r), dmath.floor(w * r)  # (torchvision's int())
        images = fn.decoders.image(jpegs, device="mixed" if gpu else "cpu", output_type=types.RGB)
        images = fn.resize(images, resize_x=nw, resize_y=nh, antialias=True)
        px, py = fn.random.uniform(range=[0.0, 1.0]), fn.random.uniform(range=[0.0, 1.0])
        flip = fn.random.coin_flip(probability=0.5)
        images = fn.crop_mirror_normalize(images, crop=(1024, 1024), crop_pos_x=px, crop_pos_y=py,
                                          out_of_bounds_policy="pad", fill_values=[123 / 255, 117 / 255, 104 / 255],
                                          mirror=flip, dtype=types.FLOAT, output_layout="CHW",
                                          mean=[0.0] * 3, std=[255.0] * 3)
        ax, ay = dmath.floor(px * (nw - 1024.0) + 0.5), dmath.floor(py * (nh - 1024.0) + 0.5)
        size = fn.stack(nw, nh, nw, nh)
        boxes = (boxes * size - fn.stack(ax, ay, ax, ay)) / 1024.0
        boxes = dmath.clamp(fn.bb_flip(boxes, ltrb=True, horizontal=flip), 0.0, 1.0) * 1024.0
        return (images, boxes.gpu(), labels.gpu()) if gpu else (images, boxes, labels)

    p = pipe()
    p.build()
    return _Ragged(p, p.epoch_size("reader") // batch_size)


def voc_gray_masks(voc: str) -> tuple:
    """The VOC layout's images and its class masks as greyscale PNGs (``SegmentationClassGray``, written once):
    DALI's decoders expand a palette PNG to its colours, so a DALI user stores the class indices as grey values
    (the conversion is not timed). Returns (jpeg paths, grey mask paths) in the ``train`` list's order."""
    from PIL import Image

    base = Path(voc) / "VOCdevkit" / "VOC2012"
    names = (base / "ImageSets" / "Segmentation" / "train.txt").read_text().split()
    out = base / "SegmentationClassGray"
    out.mkdir(exist_ok=True)
    masks = []
    for n in names:
        m = out / f"{n}.png"
        if not m.exists():
            with Image.open(base / "SegmentationClass" / f"{n}.png") as img:
                Image.fromarray(np.asarray(img), mode="L").save(m)
        masks.append(str(m))
    return [str(base / "JPEGImages" / f"{n}.jpg") for n in names], masks


def dali_seg(voc: str, batch_size: int, threads: int, device: str = "gpu"):
    """The segmentation train preset (base 520, crop 480) written by hand in DALI: two ``readers.file`` shuffled
    alike (the photos, the grey masks: ``voc_gray_masks``), each decoded (the mask as GRAY), the shorter side
    resized to a uniform integer in [260, 1040] (the image with antialias, the mask nearest), a 480 x 480 window
    at a uniform position padded where the image is smaller (0 for the image, 255 for the mask), the mirror,
    the image float and normalized (``crop_mirror_normalize``), the mask int64 HW. Dense batches: DALI's own
    PyTorch iterator. What it leaves out: PadIfSmaller pads the right and the bottom only (here the window's
    position places the image)."""
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali.plugin.pytorch import DALIGenericIterator

    gpu = device == "gpu"
    jpegs, masks = voc_gray_masks(voc)
    mean, std = np.asarray([0.485, 0.456, 0.406]), np.asarray([0.229, 0.224, 0.225])

    @pipeline_def(batch_size=batch_size, num_threads=threads, device_id=0 if gpu else None, seed=1)
    def pipe():
        image, _ = fn.readers.file(files=jpegs, random_shuffle=True, seed=7, name="reader")
        mask, _ = fn.readers.file(files=masks, random_shuffle=True, seed=7)
        decoder = "mixed" if gpu else "cpu"
        image = fn.decoders.image(image, device=decoder, output_type=types.RGB)
        mask = fn.decoders.image(mask, device=decoder, output_type=types.GRAY)
        short = fn.cast(fn.random.uniform(range=[260, 1041], dtype=types.INT32), dtype=types.FLOAT)
        image = fn.resize(image, resize_shorter=short, antialias=True)
        mask = fn.resize(mask, resize_shorter=short, interp_type=types.INTERP_NN, antialias=False)
        px, py = fn.random.uniform(range=[0.0, 1.0]), fn.random.uniform(range=[0.0, 1.0])
        flip = fn.random.coin_flip(probability=0.5)
        image = fn.crop_mirror_normalize(image, crop=(480, 480), crop_pos_x=px, crop_pos_y=py,
                                         out_of_bounds_policy="pad", fill_values=list(-mean / std), mirror=flip,
                                         dtype=types.FLOAT, output_layout="CHW", mean=list(255 * mean),
                                         std=list(255 * std))
        mask = fn.crop(mask, crop=(480, 480), crop_pos_x=px, crop_pos_y=py, out_of_bounds_policy="pad",
                       fill_values=255)
        mask = fn.cast(fn.squeeze(fn.flip(mask, horizontal=flip), axis_names="C"), dtype=types.INT64)
        return image, mask

    p = pipe()
    p.build()
    return _Pairs(DALIGenericIterator([p], ["images", "boxes"], reader_name="reader", auto_reset=True))


class _Ragged:
    """A DALI pipeline's ragged outputs as (per-image tensors, per-image boxes) batches, one epoch per
    iteration (DALI's iterators take dense batches only)."""

    def __init__(self, pipe, steps: int):
        self.pipe, self.steps = pipe, steps

    def __iter__(self):
        for _ in range(self.steps):
            images, boxes, _ = self.pipe.run()
            yield ([torch.from_dlpack(images[i]) for i in range(len(images))],
                   [torch.from_dlpack(boxes[i]) for i in range(len(boxes))])


class _Pairs:
    """DALI's iterator as (images, boxes) batches, as the other loaders give them (re-iterable)."""

    def __init__(self, it):
        self.it = it

    def __iter__(self):
        return ((b[0]["images"], b[0]["boxes"]) for b in self.it)


def main(argv=None):
    ap = argparse.ArgumentParser(description="detection loader benchmark")
    ap.add_argument("root")
    ap.add_argument("--make-data", type=int, default=0, metavar="N")
    ap.add_argument("--presets", default="ssd,ssdlite,hflip")
    ap.add_argument("--pipelines", default="torchvision,gputransforms,dali-preset,dali-handwritten")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--images", type=int, default=2000)
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--backend", default="tv_tensor", choices=["tv_tensor", "tensor", "pil"],
                    help="the references' --backend: what the presets augment")
    ap.add_argument("--out", default="bench-out/detection")
    ap.add_argument("--isolate", action="store_true", help="each row in a process of its own")
    ap.add_argument("--sample", action="store_true",
                    help="then where gputransforms' main thread is, sampled every ms over as many images, and its CPU "
                         "time (a second loader; not with --isolate)")
    a = ap.parse_args(argv)
    if a.make_data and not Path(a.root).exists():
        make_data(a.root, a.make_data)
    coco = coco_of(a.root)
    voc = voc_of(a.root) if "seg" in a.presets.split(",") else None
    dev = torch_device()
    rows = []
    for preset in a.presets.split(","):
        for name in a.pipelines.split(","):
            if name.startswith("dali-") and (preset not in DALI_PRESETS.get(name, ()) or not on_gpu()):  # (GPU only)
                continue
            row = dict(preset=preset, pipeline=name, backend=a.backend)
            if a.isolate:
                rows.append(_isolated(a, preset, name, row))
                _say(rows[-1])
                continue
            if preset == "seg":
                from tests.presets import segmentation_collate

                data, fn, moved = (lambda: segmentation(voc, a.backend)), segmentation_collate, MovedPair  # noqa: E731
            elif preset == "seg-coco":
                from tests.presets import segmentation_collate

                data, fn, moved = (lambda: segmentation_of_coco(coco, a.backend)), segmentation_collate, MovedPair  # noqa: E731
            else:
                data, fn, moved = (lambda p=preset: dataset(coco, p, a.backend)), collate, Moved  # noqa: E731
            try:
                if name == "torchvision":
                    make = lambda: moved(tud.DataLoader(data(), batch_size=a.batch_size, shuffle=True,  # noqa: E731
                                                        num_workers=a.workers, collate_fn=fn,
                                                        persistent_workers=a.workers > 0), dev)
                elif name.startswith("gputransforms"):
                    from gputransforms import DataLoader

                    # the torchvision row's arguments (only the import changes); -pin: pin_memory=True as well;
                    # -pfN: prefetch_factor=N (DALI prepares N batches ahead instead of 4: less device memory
                    # below 4, more above)
                    extra = dict(pin_memory="-pin" in name, persistent_workers=a.workers > 0)
                    ahead = re.search(r"-pf(\d+)", name)
                    if ahead:
                        extra["prefetch_factor"] = int(ahead.group(1))

                    # num_workers as the user gives it to torch's loader (only the import changes); where the
                    # chain compiles, DALI's threads (a.threads below 8 workers) are set apart
                    make = lambda: DataLoader(data(), batch_size=a.batch_size, shuffle=True,  # noqa: E731
                                              num_workers=a.workers, collate_fn=fn, **extra)
                elif name == "dali-preset":
                    make = {"ssd": lambda: dali_preset(coco, a.batch_size, a.threads),  # noqa: E731
                            "lsj-v2": lambda: dali_lsj(coco, a.batch_size, a.threads),
                            "seg": lambda: dali_seg(voc, a.batch_size, a.threads)}[preset]
                else:
                    make = lambda: dali_ssd(coco, a.batch_size, a.threads)  # noqa: E731
                row.update(timed(make, a.images))
                if a.sample and name.startswith("gputransforms"):
                    row["main_thread"] = _sampled(make, a.images)
                    print(row["main_thread"], flush=True)
            except Exception as e:  # noqa: BLE001 - one failing pipeline must not hide the others
                row["error"] = f"{type(e).__name__}: {e}".splitlines()[0]
            row["rss_mb"] = rss_peak_mb()
            rows.append(row)
            _say(row)
        base = next((r.get("img_s") for r in rows if r["preset"] == preset and r["pipeline"] == "torchvision"), None)
        for r in rows:
            if r["preset"] == preset and base and "img_s" in r:
                r["x_torchvision"] = r["img_s"] / base
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    info = dict(device=torch.cuda.get_device_name() if on_gpu() else "cpu", cores=os.cpu_count(),
                batch_size=a.batch_size, workers=a.workers, threads=a.threads, backend=a.backend)
    (out / "detection.json").write_text(json.dumps(dict(info=info, rows=rows), indent=2))
    print(json.dumps(info))


def _sampled(make, n_images: int) -> str:
    """Where the main thread of a fresh loader is over ``n_images`` after three batches (probes.sources'
    sampler, three frames deep) and what share of the wall time it was on a CPU."""
    import time

    from benchmarks.probes.sources import Sampler

    loader = make()
    it = iter(loader)
    for _ in range(3):  # (warm-up; a new epoch where one is shorter)
        if next(it, None) is None:
            it = iter(loader)
    cpu, wall, seen = time.thread_time(), time.perf_counter(), 0
    process, children = _cpu_seconds()
    sampler = Sampler(depth=3)
    while seen < n_images:
        try:
            seen += len(next(it)[0])
        except StopIteration:  # (a new epoch, as timed() runs them)
            it = iter(loader)
    if on_gpu():
        torch.cuda.synchronize()
    where = sampler.report(16)
    cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
    process, children = (b - a for a, b in zip((process, children), _cpu_seconds()))
    return (f"sampled: {seen / wall:.0f} img/s over {seen} images, main thread on a CPU {100 * cpu / wall:.0f}% "
            f"({1e6 * cpu / max(seen, 1):.0f} us/img); cores busy: this process {process / wall:.1f} (DALI's "
            f"threads with the main one), its workers {children / wall:.1f}, of {os.cpu_count()}\n{where}")


def _cpu_seconds() -> tuple:
    """CPU seconds used so far by this process (all its threads) and by its live child processes."""
    tick = os.sysconf("SC_CLK_TCK")

    def of(pid) -> float:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / tick  # utime, stime

    me = os.getpid()
    kids = 0.0
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == me:
                        kids += of(name)
            except (OSError, ValueError, IndexError):
                pass
    return of(me), kids


def _say(row: dict) -> None:
    print(f"  {row['preset']} {row['pipeline']}: {row.get('img_s', float('nan')):.0f} img/s, first batch "
          f"{row.get('ttfb_s', float('nan')):.2f} s, {row.get('gpu_mem_mb', 0):.0f} MiB {row.get('error', '')}",
          flush=True)


def _isolated(a, preset: str, name: str, row: dict) -> dict:
    """One row measured by this module in a process of its own."""
    sub = Path(a.out) / f"{preset}-{name}"
    cmd = [sys.executable, "-m", "benchmarks.detection", a.root, "--presets", preset, "--pipelines", name,
           "--batch-size", str(a.batch_size), "--images", str(a.images), "--workers", str(a.workers),
           "--threads", str(a.threads), "--backend", a.backend, "--out", str(sub)]
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, check=False)
    try:
        return json.loads((sub / "detection.json").read_text())["rows"][0]
    except (OSError, KeyError, IndexError, ValueError):
        return dict(row, error=f"the row's process exited with {done.returncode}")


if __name__ == "__main__":
    main()
