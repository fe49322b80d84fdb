"""Detection datasets of torchvision v2 (#34, first part): a wrapped CocoDetection, side by side with
torch's DataLoader over the same dataset object on the project's own COCO layout of real photos.
The graph decodes; targets are torchvision's; the joint transform runs per sample with torchvision's
kernels, so with the same random draws boxes, labels and masks are exactly torchvision's."""
from __future__ import annotations

import dataclasses
import functools
import os
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.utils.data as tud
import torchvision
from presets import (DetectionPresetTrain, SegmentationPresetEval, SegmentationPresetTrain, detection_collate,
                     segmentation_collate)
from PIL import Image
from torchvision import tv_tensors
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

from gputransforms import DataLoader, FallbackWarning, sampledata

pytest.importorskip("pycocotools")
DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("gpu", id="gpu", marks=pytest.mark.gpu)]
KEYS = ["boxes", "labels", "masks", "image_id", "iscrowd", "area"]


@pytest.fixture(scope="module")
def coco(photo_folder, tmp_path_factory):
    return sampledata.write_coco(photo_folder, tmp_path_factory.mktemp("coco"), seed=2)


def wrapped(coco, transforms, keys=KEYS, annotated_only=True):
    """The dataset as torchvision's detection reference builds it: wrapped for v2, and (by default)
    without the images that have no annotations (its Subset; SanitizeBoundingBoxes raises on them)."""
    ds = torchvision.datasets.CocoDetection(str(coco[0]), str(coco[1]), transforms=transforms)
    ds = torchvision.datasets.wrap_dataset_for_transforms_v2(ds, target_keys=keys)
    if not annotated_only:
        return ds
    return tud.Subset(ds, [i for i, img_id in enumerate(ds.ids) if ds.coco.getAnnIds(imgIds=img_id)])


def same_targets(ours: dict, theirs: dict):
    assert list(ours) == list(theirs)
    for k, v in theirs.items():
        o = ours[k]
        if isinstance(v, torch.Tensor):
            assert type(o) is type(v) and o.dtype == v.dtype and torch.equal(o.cpu(), v), k
        else:
            assert o == v, k


def side_by_side(ds, device, seed=0, batch_size=4, **kw):
    """Both loaders over ``ds`` from the same global seed (torch's with no workers draws the joint
    transforms' randomness in the main thread, sample after sample, as ours does)."""
    torch.manual_seed(seed)
    ours = list(DataLoader(ds, batch_size=batch_size, collate_fn=detection_collate, device=device, **kw))
    torch.manual_seed(seed)
    theirs = list(tud.DataLoader(ds, batch_size=batch_size, collate_fn=detection_collate, **kw))
    assert len(ours) == len(theirs)
    return ours, theirs


@pytest.mark.parametrize("device", DEVICES)
def test_deterministic_chain_gives_torchvisions_targets(coco, device):
    chain = v2.Compose([v2.ToImage(), v2.RandomHorizontalFlip(p=1), v2.Resize((96, 128)),
                        v2.ToDtype(torch.float32, scale=True),
                        v2.ConvertBoundingBoxFormat(tv_tensors.BoundingBoxFormat.CXCYWH), v2.SanitizeBoundingBoxes()])
    ds = wrapped(coco, chain)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)  # compiled: nothing runs per sample after the graph
        loader = DataLoader(ds, batch_size=4, collate_fn=detection_collate, device=device)
    assert loader.backend == "dali", loader.reason
    ours, theirs = side_by_side(ds, device)
    for (oi, ot), (ti, tt) in zip(ours, theirs):
        for a, b, ta, tb in zip(oi, ti, ot, tt):
            assert type(a) is tv_tensors.Image and a.shape == b.shape
            assert (a.device.type == "cuda") == (device == "gpu")
            assert (a.cpu() - b).abs().mean() * 255 < (0.5 if device == "cpu" else 1.5)
            same_targets(ta, tb)
    assert "CocoDetection decoded in the graph" in loader.explain()
    assert "recorded per sample" in loader.explain()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("aug", ["hflip", "ssdlite", "ssd", "multiscale"])
@pytest.mark.parametrize("backend", ["tv_tensor", "tensor", "pil"])
def test_reference_presets_same_draws_same_targets(coco, device, aug, backend):
    """torchvision's detection presets (--use-v2, --backend tv_tensor/tensor/pil): recorded, and with the
    same random draws the same crops, flips and zooms: boxes, labels and masks exactly torchvision's, images
    within the decoders' difference. With --backend pil (the reference's default) torchvision augments PIL
    images with PIL's kernels, the graph with the tensor kernels' arithmetic: each image is as far from
    torchvision's as torchvision's own tensor kernels are from its PIL ones (the same preset with --backend
    tensor, from the same seed), plus that parity."""
    keys = ["boxes", "labels", "masks", "image_id"]
    ds = wrapped(coco, DetectionPresetTrain(data_augmentation=aug, backend=backend), keys=keys)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)  # recorded: nothing runs per sample after the graph
        loader = DataLoader(ds, batch_size=4, collate_fn=detection_collate, device=device, shuffle=True)
    assert loader.backend == "dali" and "recorded per sample" in loader.explain(), loader.reason
    assert ("on PIL images, as the dataset hands them" in loader.explain()) == (backend == "pil")
    torch.manual_seed(3)
    ours = list(loader)
    torch.manual_seed(3)
    theirs = list(tud.DataLoader(ds, batch_size=4, collate_fn=detection_collate, shuffle=True))
    torch.manual_seed(3)
    as_tensors = list(tud.DataLoader(wrapped(coco, DetectionPresetTrain(data_augmentation=aug, backend="tensor"),
                                             keys=keys), batch_size=4, collate_fn=detection_collate, shuffle=True))
    parity = 1.0 if device == "cpu" else 3.0
    ids = []
    for (oi, ot), (ti, tt), (ki, _) in zip(ours, theirs, as_tensors):
        for a, b, ta, tb, k in zip(oi, ti, ot, tt, ki):
            assert a.shape == b.shape and type(a) is type(b) is torch.Tensor
            own = (k - b).abs().mean() * 255 if backend == "pil" else 0.0  # torchvision's tensor-vs-PIL
            assert (a.cpu() - b).abs().mean() * 255 < own + parity
            same_targets(ta, tb)
            ids.append(ta["image_id"])
    assert sorted(ids) == [i + 1 for i in range(48) if i % 7 != 6]  # every annotated image once


def _count_passes(monkeypatch) -> list:
    """[how many samples joint_chain recorded in one pass], counted from now on."""
    from gputransforms.compiler import joint_chain

    passes = [0]
    output = joint_chain._output

    def counted(rec, s):
        passes[0] += 1
        return output(rec, s)

    monkeypatch.setattr(joint_chain, "_output", counted)
    return passes


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("aug", ["lsj", "ssd"])
def test_presets_recorded_in_one_pass_side_by_side(coco, device, aug, monkeypatch):
    """Without masks in the target, the reference's ssd preset and the lsj augmentation (spelt with v2
    classes) are recorded in one pass (compiler/joint_chain.py), and side by side with torch's DataLoader
    from the same seed give torchvision's boxes, labels and image ids exactly, its images within the
    decoders' difference, every annotated image once."""
    if aug == "lsj":
        chain = v2.Compose([v2.ToImage(), v2.ScaleJitter((320, 320)), v2.RandomCrop(
            320, pad_if_needed=True, fill={tv_tensors.Mask: 0, "others": (123.0, 117.0, 104.0)}),
            v2.RandomHorizontalFlip(), v2.ToDtype(torch.float32, scale=True),
            v2.ConvertBoundingBoxFormat("XYXY"), v2.SanitizeBoundingBoxes(), v2.ToPureTensor()])
    else:
        chain = DetectionPresetTrain(data_augmentation="ssd", backend="tv_tensor")
    ds = wrapped(coco, chain, keys=["boxes", "labels", "image_id"])
    passes = _count_passes(monkeypatch)
    assert "in one pass" in DataLoader(ds, batch_size=4, collate_fn=detection_collate, device=device).explain()
    ours, theirs = side_by_side(ds, device, seed=5, shuffle=True)
    ids = []
    for (oi, ot), (ti, tt) in zip(ours, theirs):
        for a, b, ta, tb in zip(oi, ti, ot, tt):
            assert a.shape == b.shape and (a.cpu() - b).abs().mean() * 255 < (1.0 if device == "cpu" else 3.0)
            same_targets(ta, tb)
            ids.append(ta["image_id"])
    assert sorted(ids) == [i + 1 for i in range(48) if i % 7 != 6]  # every annotated image once
    assert passes[0] >= len(ids)  # each sample recorded in the pass (the probes at the start too)


class _GroupedBatches(tud.Sampler):
    """A batch sampler as the detection reference's GroupedBatchSampler: batches of images of one aspect
    group (here: two groups of indices), drawn from a shuffled sampler."""

    def __init__(self, sampler, groups: list, batch_size: int):
        self.sampler, self.groups, self.batch_size = sampler, groups, batch_size

    def __iter__(self):
        buffers: dict = {}
        for i in self.sampler:
            b = buffers.setdefault(self.groups[i], [])
            b.append(i)
            if len(b) == self.batch_size:
                yield list(b)
                b.clear()
        for b in buffers.values():
            if b:
                yield list(b)

    def __len__(self):
        return sum(-(-sum(g == k for g in self.groups) // self.batch_size) for k in set(self.groups))


def test_the_detection_references_grouped_batch_sampler(coco):
    """The detection reference's loader: a batch sampler of its own (images grouped by aspect ratio) over
    the shuffled dataset, its collate_fn, the ssd preset on PIL images: the same batches, targets exactly
    torchvision's."""
    ds = wrapped(coco, DetectionPresetTrain(data_augmentation="ssd", backend="pil"))
    groups = [i % 3 == 0 for i in range(len(ds))]

    def batches(cls):
        torch.manual_seed(5)
        loader = cls(ds, batch_sampler=_GroupedBatches(tud.RandomSampler(ds), groups, 4), collate_fn=detection_collate)
        assert getattr(loader, "backend", "dali") == "dali", loader.reason
        return list(loader)

    ours, theirs = batches(functools.partial(DataLoader, device="cpu")), batches(tud.DataLoader)
    assert len(ours) == len(theirs) == len(_GroupedBatches(None, groups, 4))
    for (oi, ot), (ti, tt) in zip(ours, theirs):
        assert len(oi) == len(ti)
        for a, b, ta, tb in zip(oi, ti, ot, tt):
            assert a.shape == b.shape
            same_targets(ta, tb)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", ["pil", "tensor", "tv_tensor"])
def test_the_segmentation_references_v2_data_compiles_with_torchvisions_masks(coco, device, backend):
    """The segmentation reference with --use-v2 reads COCO only: a wrapped CocoDetection whose joint transform is
    the reference's own Compose of its own class (instance masks merged into a class mask) and the preset, whose
    steps are a v2 Compose in turn. It compiles (the containers nested two deep, the class recorded after the
    probe on stand-ins; the class mask it makes recorded from its first functional on), and gives torch's
    DataLoader's batches from the same seed: masks exactly, images within the decoders' difference. Before, it ran
    on torch's DataLoader ("augments PIL images and cannot be recorded")."""
    from presets import SegmentationPresetEval, segmentation_coco

    for train, preset in ((True, SegmentationPresetTrain(base_size=120, crop_size=96, backend=backend)),
                          (False, SegmentationPresetEval(base_size=120, backend=backend))):
        ds = segmentation_coco(*coco, preset, train=train)

        def batches(cls, **kw):
            torch.manual_seed(4)
            loader = cls(ds, batch_size=4, shuffle=train, collate_fn=segmentation_collate, **kw)
            return loader, [(x.cpu(), y.cpu()) for x, y in loader]

        loader, ours = batches(DataLoader, device=device)
        assert loader.backend == "dali", loader.reason
        # the class mask the reference's class makes is recorded from its first functional on (not resized
        # whole by torchvision's kernel before the crop keeps a part of it)
        assert "made in one gather" in loader.explain()
        _, theirs = batches(tud.DataLoader)
        assert len(ours) == len(theirs) > 2
        for (oi, om), (ti, tm) in zip(ours, theirs):
            assert om.dtype == tm.dtype == (torch.int64 if train else torch.uint8) and torch.equal(om, tm)
            assert oi.shape == ti.shape and (oi - ti).abs().mean() < 0.02  # normalized units (~1/255 of a pixel)
        assert any((m > 0).any() and (m < 255).any() for _, m in ours)  # classes and fill among the masks


class _V1Coco(torchvision.datasets.CocoDetection):
    """The detection reference without --use-v2 (coco_utils.py, restated): a CocoDetection subclass that hands
    (image, {"image_id", "annotations"}) to joint transforms of its own, which draw from torch's generator."""

    def __init__(self, root, ann):
        super().__init__(root, ann)
        self._transforms = self._flip

    @staticmethod
    def _flip(image, target):
        image = F.pil_to_tensor(image)
        if torch.rand(1) < 0.5:
            image = image.flip(-1)
        return image, dict(image_id=target["image_id"], n=len(target["annotations"]))

    def __getitem__(self, idx):
        img, target = super().__getitem__(idx)
        return self._transforms(img, dict(image_id=self.ids[idx], annotations=target))


@pytest.mark.parametrize("workers", [0, 2])
def test_the_detection_reference_without_v2_runs_as_torchs_loader(coco, workers):
    """Without --use-v2 the reference's dataset does not compile: it runs on torch's DataLoader, with the advice
    that compiles it, and gives torch's batches from the same seed (building the loader ran its __getitem__,
    which drew from torch's generator: backends.choose keeps it)."""
    ds = tud.Subset(_V1Coco(*coco), list(range(0, 12)))

    def batches(cls, **kw):
        torch.manual_seed(11)
        loader = cls(ds, batch_size=4, shuffle=True, num_workers=workers, collate_fn=detection_collate, **kw)
        return loader, [b for _ in range(2) for b in loader]

    with pytest.warns(FallbackWarning, match="wrap_dataset_for_transforms_v2"):
        loader, ours = batches(DataLoader, device="cpu")
    assert loader.backend == "torchvision" and "--use-v2" in loader.reason
    _, theirs = batches(tud.DataLoader)
    assert len(ours) == len(theirs) == 6
    for (oi, ot), (ti, tt) in zip(ours, theirs):
        assert ot == tt and all(torch.equal(a, b) for a, b in zip(oi, ti))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("workers", [0, 2])
def test_the_detection_references_eval_with_weights_is_recorded(coco, device, workers):
    """The detection reference's ``--test-only --weights`` eval: its joint transform is ``lambda img, target:
    (trans(img), target)`` with ``trans = weights.transforms()`` (ObjectDetection, whose forward calls v1
    functionals on the PIL image). The function is recorded as a user's class is (the pixel-blind probe), the
    preset as the steps its forward calls: the graph decodes and makes the float images, every sample once,
    torchvision's targets. It ran on torch's DataLoader before ("augments PIL images and cannot be recorded")."""
    trans = torchvision.models.detection.FasterRCNN_ResNet50_FPN_Weights.DEFAULT.transforms()
    ds = wrapped(coco, lambda img, target: (trans(img), target), keys=["boxes", "labels", "image_id"])
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        ours, theirs = side_by_side(ds, device, seed=3, shuffle=True, num_workers=workers)
    loader = DataLoader(ds, batch_size=4, collate_fn=detection_collate, device=device)
    text = loader.explain()
    assert loader.backend == "dali" and "<lambda>: your own class(es) or function(s), recorded" in text, text
    assert "<lambda>  yours: run as written on the stand-ins" in text, text
    seen = []
    for (oi, ot), (ti, tt) in zip(ours, theirs):
        for a, b, ta, tb in zip(oi, ti, ot, tt):
            assert type(a) is torch.Tensor and a.dtype == torch.float32 and a.shape == b.shape
            # (on the GPU: nvJPEG's full-size decode, no resize to smooth it: 1.94 of 255 for the worst photo, H100)
            assert (a.cpu() - b).abs().mean() * 255 < (0.01 if device == "cpu" else 3.0)
            same_targets(ta, tb)
            seen.append(tb["image_id"])
    assert sorted(seen) == sorted(ds.dataset.ids[i] for i in ds.indices)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("aug", ["hflip", "ssd"])
def test_a_function_around_a_preset_is_recorded(coco, device, aug):
    """A joint transform that is a function of the user's calling a reference preset (on PIL images, the
    references' default backend) is recorded as the preset is: the same targets as torch's DataLoader from one
    seed, the images within the preset's own parity. It ran on torch's DataLoader before."""
    preset = DetectionPresetTrain(data_augmentation=aug, backend="pil")
    ds = wrapped(coco, lambda img, target: preset(img, target), keys=["boxes", "labels", "image_id"])
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        ours, theirs = side_by_side(ds, device, seed=4, shuffle=True)
    for (oi, ot), (ti, tt) in zip(ours, theirs):
        for a, b, ta, tb in zip(oi, ti, ot, tt):
            assert a.dtype == b.dtype == torch.float32 and a.shape == b.shape
            # (0-255 units; ssd's colour steps on PIL images against the graph's tensor arithmetic: 1.6 on the CPU)
            assert (a.cpu() - b).abs().mean() * 255 < (3.0 if device == "cpu" else 6.0)
            same_targets(ta, tb)


@pytest.mark.parametrize("first", ["pil", "tensor"])
def test_a_joint_resize_with_pils_box_filter(coco, first):
    """A joint chain that resizes with PIL's box filter (which DALI lacks): on PIL images it runs as torchvision
    runs it, the same targets; on tensors both loaders raise torchvision's NotImplementedError (before: DALI's
    AttributeError for the filter '?BOX' as the graph was built)."""
    box = v2.Resize(64, interpolation=v2.InterpolationMode.BOX)
    steps = [box, v2.ToImage()] if first == "pil" else [v2.ToImage(), box]
    ds = wrapped(coco, v2.Compose(steps + [v2.ToDtype(torch.float32, scale=True)]), keys=["boxes", "labels", "image_id"])
    if first == "tensor":
        for cls in (DataLoader, tud.DataLoader):
            with pytest.raises(NotImplementedError):
                list(cls(ds, batch_size=4, collate_fn=detection_collate))
        return
    with pytest.warns(FallbackWarning):
        ours, theirs = side_by_side(ds, "cpu")
    for (oi, ot), (ti, tt) in zip(ours, theirs):
        for a, b, ta, tb in zip(oi, ti, ot, tt):
            assert a.shape == b.shape and torch.equal(a.cpu(), b)
            same_targets(ta, tb)


def test_images_without_annotations_as_torchvision_treats_them(coco):
    """Without the reference's Subset: an image without annotations gets {"image_id"} only, and
    SanitizeBoundingBoxes then raises torchvision's own error, on both loaders (ours names the sample and
    its file after torchvision's message); without it, it passes."""
    plain = wrapped(coco, v2.Compose([v2.ToImage(), v2.Resize((64, 64))]), annotated_only=False)
    ours, theirs = side_by_side(plain, "cpu", batch_size=7)
    assert [t for _, ts in ours for t in ts if len(t) == 1] == [t for _, ts in theirs for t in ts if len(t) == 1] \
        and sum(len(t) == 1 for _, ts in ours for t in ts) == 6
    strict = wrapped(coco, v2.Compose([v2.ToImage(), v2.SanitizeBoundingBoxes()]), annotated_only=False)
    with pytest.raises(ValueError, match="Could not infer where the labels are") as info:
        list(DataLoader(strict, batch_size=7, collate_fn=detection_collate, device="cpu"))
    with pytest.raises(ValueError) as ref:
        list(tud.DataLoader(strict, batch_size=7, collate_fn=detection_collate))
    assert str(info.value) == f"{ref.value} (sample 6: {Path(coco[0]) / '000006.jpg'})"



@pytest.mark.parametrize("keys", [None, ["boxes", "labels", "image_id"], ["boxes"], ["labels", "image_id"]])
def test_coco_targets_restated_are_torchvisions(coco, keys):
    """The workers' restatement of torchvision's CocoDetection wrapper (datasets/coco_targets.py) gives its
    target for every image of the fake COCO, annotated or not, and for annotations of other number types; where
    the annotations are not lists of four Python numbers it makes none (the wrapper then makes it), and for keys
    beyond the default's (masks) or a wrapper that is not torchvision's it is not used."""
    from gputransforms.datasets import coco_targets

    ds = wrapped(coco, None, keys=keys, annotated_only=False)
    make = coco_targets.maker(ds)
    assert make is not None
    inner = ds._dataset

    def theirs(k, raw, img):
        return ds._wrapper(k, (img, raw))[1]

    def same(k, raw, img):
        ours, ref = make(k, raw, (img.height, img.width)), theirs(k, raw, img)
        assert ours is not None
        same_targets(ours, ref)
        for key, v in ref.items():
            if isinstance(v, torch.Tensor):
                assert ours[key].__dict__ == v.__dict__, key

    made = 0
    for k, image_id in enumerate(inner.ids):
        with Image.open(Path(coco[0]) / inner.coco.loadImgs(image_id)[0]["file_name"]) as img:
            raw = inner._load_target(image_id)
            same(k, raw, img)
            made += bool(raw)
    assert made == 42  # (48 images, every seventh without annotations)
    img = Image.new("RGB", (50, 40))
    ann = {"bbox": [1, 2, 3, 4], "category_id": 3}
    for raw in ([ann], [dict(ann, bbox=[1.5, 2, 3, 4.25])], [ann, dict(ann, bbox=[0.1, 0.2, 1e-9, 7.0])], [],
                [dict(ann, category_id=2.0)]):
        same(0, raw, img)
    # boxes of numbers beyond float32's exact integers, of bools, of three numbers: the wrapper makes them
    for raw in ([dict(ann, bbox=[10**9, 2, 3, 4])], [dict(ann, bbox=[True, 2, 3, 4])], [dict(ann, bbox=[1, 2, 3])]):
        if keys is None or "boxes" in keys:
            assert make(0, raw, (40, 50)) is None
        else:
            same(0, raw, img)
    assert make(0, [{"category_id": 1}], (40, 50)) is None  # (an annotation without a box)
    assert coco_targets.maker(wrapped(coco, None, keys=["boxes", "masks"], annotated_only=False)) is None
    assert coco_targets.maker(wrapped(coco, None, keys=["boxes", "area"], annotated_only=False)) is None

@pytest.mark.parametrize("device", DEVICES)
def test_a_chain_on_pil_images_pads_with_pils_fill(coco, device):
    """A joint transform on PIL images, its fill a float colour (PIL's kernel truncates it to integers):
    recorded, boxes exactly torchvision's, the image equal to torchvision's (on the CPU: the same decoder)
    and its padded border PIL's colour."""
    chain = v2.Compose([v2.Pad([16, 8, 24, 4], fill=(123.7, 117.2, 104.9)), v2.RandomHorizontalFlip(p=1),
                        v2.ToImage(), v2.ToDtype(torch.float32, scale=True), v2.SanitizeBoundingBoxes()])
    ds = wrapped(coco, chain, keys=["boxes", "labels"])
    loader = DataLoader(ds, batch_size=4, collate_fn=detection_collate, device=device)
    assert loader.backend == "dali" and "recorded per sample" in loader.explain(), loader.reason
    ours, theirs = side_by_side(ds, device)
    for (oi, ot), (ti, tt) in zip(ours, theirs):
        for a, b, ta, tb in zip(oi, ti, ot, tt):
            assert torch.equal((a[:, :4, :] * 255).round().cpu(), (b[:, :4, :] * 255).round())  # the fill
            assert torch.equal((b[:, 0, 0] * 255).round(), torch.tensor([123.0, 117.0, 104.0]))
            assert (a.cpu() - b).abs().max() * 255 < (0.01 if device == "cpu" else 255)
            assert (a.cpu() - b).abs().mean() * 255 < (0.01 if device == "cpu" else 3.0)
            same_targets(ta, tb)


class _ReadsPil(v2.Transform):
    """A user's class that looks at a PIL image's pixels (its mean brightness)."""

    def transform(self, inpt, params):
        if isinstance(inpt, Image.Image):
            return inpt if np.asarray(inpt).mean() > 100 else v2.functional.horizontal_flip(inpt)
        return inpt


def test_a_pil_chain_that_reads_the_pixels_runs_as_written(coco):
    """A joint transform on PIL images is recorded on a PIL image without pixels: one that reads them (here
    a user's class, before the PIL-backend ssd preset) stays on torch's DataLoader, with PIL's kernels, and
    says why; its batches are torchvision's."""
    chain = v2.Compose([_ReadsPil(), DetectionPresetTrain(data_augmentation="hflip", backend="pil").transforms])
    ds = wrapped(coco, chain)
    with pytest.warns(FallbackWarning, match="augments PIL images and cannot be recorded"):
        loader = DataLoader(ds, batch_size=4, collate_fn=detection_collate, device="cpu")
    assert loader.backend == "torchvision"
    torch.manual_seed(0)
    ours = list(loader)
    torch.manual_seed(0)
    theirs = list(tud.DataLoader(ds, batch_size=4, collate_fn=detection_collate))
    for (oi, ot), (ti, tt) in zip(ours, theirs):
        assert all(torch.equal(a, b) for a, b in zip(oi, ti))
        for a, b in zip(ot, tt):
            same_targets(a, b)


@pytest.fixture(scope="module")
def voc(photo_folder, tmp_path_factory):
    return sampledata.write_voc(photo_folder, tmp_path_factory.mktemp("voc"), seed=4)


@pytest.mark.parametrize("device", DEVICES)
def test_voc_detection_as_torchvision(voc, device):
    ds = torchvision.datasets.wrap_dataset_for_transforms_v2(torchvision.datasets.VOCDetection(
        str(voc), year="2012", image_set="train", transforms=DetectionPresetTrain(data_augmentation="ssdlite",
                                                                                   backend="tv_tensor")))
    ours, theirs = side_by_side(ds, device, seed=5, shuffle=True)
    for (oi, ot), (ti, tt) in zip(ours, theirs):
        for a, b, ta, tb in zip(oi, ti, ot, tt):
            assert a.shape == b.shape and (a.cpu() - b).abs().mean() * 255 < (1.0 if device == "cpu" else 3.0)
            same_targets(ta, tb)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_mask_of_another_shape_raises_torchvisions_error_naming_the_file(photo_folder, tmp_path, workers):
    """A VOC mask whose shape is not its image's (half as wide): torchvision's v2 RandomCrop raises
    ValueError ("Found multiple HxW dimensions in the sample") without saying where; ours raises the same
    type and message, with the sample and its image file named, from the main thread or a worker, after the
    batches before its own, as torch's DataLoader delivers them (its workers' chunks come back in any order)."""
    root = sampledata.write_voc(photo_folder, tmp_path, seed=4)
    seg = root / "VOCdevkit" / "VOC2012" / "SegmentationClass"
    bad = sorted(seg.glob("*.png"))[37]  # (in the fifth batch of 8)
    with Image.open(bad) as m:
        m.resize((m.width // 2, m.height), Image.NEAREST).save(bad)

    def dataset():
        return torchvision.datasets.wrap_dataset_for_transforms_v2(torchvision.datasets.VOCSegmentation(
            str(root), year="2012", image_set="train", transforms=SegmentationPresetTrain(base_size=160, crop_size=144)))

    def delivered(loader) -> tuple:
        n = 0
        with pytest.raises(ValueError, match="Found multiple HxW dimensions") as e:
            for _ in loader:
                n += 1
        return n, e

    theirs, _ = delivered(tud.DataLoader(dataset(), batch_size=8, collate_fn=segmentation_collate, num_workers=workers))
    loader = DataLoader(dataset(), batch_size=8, collate_fn=segmentation_collate, num_workers=workers)
    assert "recorded per sample" in loader.explain()
    ours, e = delivered(loader)
    assert ours == theirs == 4
    assert f"{bad.stem}.jpg" in str(e.value), str(e.value)


@pytest.mark.parametrize("device", DEVICES)
def test_voc_segmentation_masks_follow_the_pixels(voc, device):
    """A segmentation train chain of public v2 classes (the reference's shape: random resize, flip,
    a crop padded with 255 on the mask, normalize) batched by default_collate: masks exactly
    torchvision's, nearest-neighbour as it does."""
    chain = v2.Compose([v2.ToImage(), v2.RandomResize(min_size=40, max_size=120), v2.RandomHorizontalFlip(),
                        v2.RandomCrop(64, pad_if_needed=True, fill={tv_tensors.Mask: 255, "others": 0}),
                        v2.ToDtype(torch.float, scale=True), v2.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
                        v2.ToPureTensor()])
    ds = torchvision.datasets.wrap_dataset_for_transforms_v2(
        torchvision.datasets.VOCSegmentation(str(voc), year="2012", image_set="train", transforms=chain))
    torch.manual_seed(7)
    ours = list(DataLoader(ds, batch_size=8, device=device))
    torch.manual_seed(7)
    theirs = list(tud.DataLoader(ds, batch_size=8))
    assert len(ours) == len(theirs) == 6
    for (x, m), (xt, mt) in zip(ours, theirs):
        assert x.shape == xt.shape == (8, 3, 64, 64) and m.dtype == mt.dtype
        assert torch.equal(m.cpu(), mt)
        assert (x.cpu() - xt).abs().mean() * 0.229 * 255 < (1.0 if device == "cpu" else 3.0)


def test_explain_says_what_each_step_does_to_each_tv_tensor(coco, voc):
    """explain() lists the joint transform's steps with what torchvision's kernels do to each tv_tensor
    type the target holds: colour steps leave boxes and masks alone, geometric ones move them (masks
    nearest-neighbour), the box-only ones touch only boxes."""
    ds = wrapped(coco, DetectionPresetTrain(data_augmentation="ssd", backend="tv_tensor"))
    text = DataLoader(ds, batch_size=4, collate_fn=detection_collate, device="cpu").explain()
    assert "on Image, BoundingBoxes, Mask:" in text, text
    assert "joint(" in text and "colour (brightness, contrast, saturation, hue, contrast, channel order)" in text
    lines = {ln.split()[0]: ln for ln in text.splitlines()[text.splitlines().index(
        next(ln for ln in text.splitlines() if "joint transform, recorded per sample" in ln)) + 1:]}
    assert "Image: changed; BoundingBoxes, Mask: unchanged" in lines["RandomPhotometricDistort"]
    assert "Mask: moved (nearest-neighbour)" in lines["RandomIoUCrop"]
    assert "BoundingBoxes: moved by the same parameters" in lines["RandomZoomOut"]
    assert "BoundingBoxes: format converted" in lines["ConvertBoundingBoxFormat"]
    assert "with their labels and masks" in lines["SanitizeBoundingBoxes"]
    seg = torchvision.datasets.wrap_dataset_for_transforms_v2(torchvision.datasets.VOCSegmentation(
        str(voc), year="2012", image_set="train",
        transforms=v2.Compose([v2.ToImage(), v2.RandomHorizontalFlip(), v2.RandomRotation(10),
                               v2.ToDtype(torch.float32, scale=True)])))
    with pytest.warns(FallbackWarning):  # RandomRotation is not recorded: the joint transform runs per sample
        text = DataLoader(seg, batch_size=2, device="cpu").explain()
    assert "joint transform, per sample" in text
    assert "on Image, Mask:" in text and "Mask: moved (nearest-neighbour)" in text, text


@pytest.mark.parametrize("aug", ["hflip", "ssdlite", "ssd"])
def test_recorded_presets_compile_with_torchs_workers(coco, aug):
    """With worker processes the presets are recorded there (each worker seeded as torch seeds its own)
    and stay compiled however many there are: every annotated image once per epoch, its boxes inside
    its own image, and the same epoch again from the same seed."""
    ds = wrapped(coco, DetectionPresetTrain(data_augmentation=aug, backend="tv_tensor"), keys=["boxes", "labels",
                                                                                                "image_id"])
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        loader = DataLoader(ds, batch_size=4, collate_fn=detection_collate, device="cpu", num_workers=2,
                            shuffle=True)
    assert loader.backend == "dali", loader.reason

    def epoch():
        torch.manual_seed(5)
        out = []
        for images, targets in loader:
            for img, t in zip(images, targets):
                boxes = t["boxes"]
                assert img.dtype == torch.float32 and img.shape[0] == 3
                assert (boxes[:, 2] <= img.shape[-1]).all() and (boxes[:, 3] <= img.shape[-2]).all()
                out.append((int(t["image_id"]), tuple(img.shape), boxes.sum().item()))
        return out

    first = epoch()
    assert sorted(i for i, _, _ in first) == [i + 1 for i in range(48) if i % 7 != 6]
    assert epoch() == first


def test_a_sample_the_graph_cannot_express_is_replayed_with_torchvisions_kernels(coco):
    """Two fills in one window (Pad's 50, then CenterCrop's zeros where the image is smaller than 640)
    are no window of the graph (one fill per graph): those samples' recorded steps run with torchvision's
    kernels on PIL's pixels, and the graph takes the result; the others stay in the graph. Both exactly
    torchvision's."""
    chain = v2.Compose([v2.ToImage(), v2.Pad(6, fill=50), v2.RandomHorizontalFlip(p=1), v2.CenterCrop(640),
                        v2.ToDtype(torch.float32, scale=True)])
    ds = wrapped(coco, chain, keys=["boxes", "labels", "image_id"])
    ours, theirs = side_by_side(ds, "cpu")
    for (oi, ot), (ti, tt) in zip(ours, theirs):
        for a, b, ta, tb in zip(oi, ti, ot, tt):
            assert a.shape == b.shape and torch.equal(a, b)
            same_targets(ta, tb)


@pytest.mark.parametrize("device", DEVICES)
def test_a_chain_that_resizes_first_has_no_window_before_the_resize(coco, device):
    """Where a chain resizes before any other geometry (the lsj and multiscale presets, the segmentation preset),
    the graph leaves out the window and flips before the resize (JointProgram.first_window); a chain with anything
    that may move the geometry first keeps them. Side by side with torch's DataLoader the images are torchvision's
    within the decoders' difference (exactly on the CPU where the resize is the only step), the targets exactly;
    a record with geometry before the resize gets no row there (the sample would be replayed)."""
    from gputransforms.compiler import joint

    def program(chain):
        dl = DataLoader(wrapped(coco, chain, keys=["boxes", "labels", "image_id"]), batch_size=4,
                        collate_fn=detection_collate, device=device)
        return dl, dl._backend.files.program

    first = v2.Compose([v2.ToImage(), v2.RandomShortestSize([200, 260, 320], max_size=400),
                        v2.RandomCrop(180, pad_if_needed=True), v2.RandomHorizontalFlip(),
                        v2.ToDtype(torch.float32, scale=True)])
    dl, p = program(first)
    assert p.resizes and not p.first_window
    assert "recorded from torchvision's own draws: resize (linear) -> window+flip" in dl.explain(), dl.explain()
    torch.manual_seed(3)
    ours = list(dl)
    torch.manual_seed(3)
    theirs = list(tud.DataLoader(dl.dataset, batch_size=4, collate_fn=detection_collate))
    assert len(ours) == len(theirs) == 11
    for (oi, ot), (ti, tt) in zip(ours, theirs):
        for a, b, ta, tb in zip(oi, ti, ot, tt):
            assert a.shape == b.shape and (a.cpu() - b).abs().mean() * 255 < (1.0 if device == "cpu" else 3.0)
            same_targets(ta, tb)
    for chain in (v2.Compose([v2.ToImage(), v2.RandomHorizontalFlip(), v2.RandomShortestSize([200])]),
                  v2.Compose([v2.ToImage(), v2.RandomZoomOut(), v2.Resize(300)]),
                  v2.Compose([v2.ToImage(), v2.RandomCrop(100), v2.Resize(300)])):
        dl, p = program(chain)
        assert p.first_window and "window+flip, resize" in dl.explain()
    ops = [("resize", dict(size=[50, 60], interpolation=v2.InterpolationMode.BILINEAR, antialias=True), (100, 120)),
           ("crop", dict(top=1, left=2, height=40, width=40), (50, 60))]
    p = joint.JointProgram(colour=False, resizes=(("INTERP_LINEAR", True),), fill=(0, 0, 0), tail=(),
                           first_window=False)
    assert p.row(ops, (100, 120)) is not None
    assert p.row([("horizontal_flip", {}, (100, 120))] + ops, (100, 120)) is None
    assert p.row([("crop", dict(top=0, left=0, height=90, width=120), (100, 120)),
                  ("resize", dict(size=[50, 60], interpolation=v2.InterpolationMode.BILINEAR, antialias=True),
                   (90, 120))], (100, 120)) is None
    assert dataclasses.replace(p, first_window=True).row([("horizontal_flip", {}, (100, 120))] + ops,
                                                         (100, 120)) is not None


def _random_boxes(gen, case: int, sides=(40, 900)):
    h, w = (int(v) for v in torch.randint(*sides, (2,), generator=gen))
    k = int(torch.randint(0, 12, (1,), generator=gen))
    xy = torch.rand(k, 2, generator=gen) * torch.tensor([w, h])
    wh = torch.rand(k, 2, generator=gen) * torch.tensor([w, h]) * 0.6
    if case % 7 == 0:
        wh[:1] = 0  # a degenerate box (an IoU of 0/0)
    fmt = ("XYXY", "XYWH", "CXCYWH")[case % 3]
    raw = torch.cat([xy, xy + wh], 1) if fmt == "XYXY" else torch.cat([xy, wh], 1)
    boxes = tv_tensors.BoundingBoxes(raw.to(torch.float64 if case % 5 == 0 else torch.float32), format=fmt,
                                     canvas_size=(h, w))
    return [tv_tensors.Image(torch.empty((), dtype=torch.uint8).expand(3, h, w)), boxes]


@pytest.mark.parametrize("kwargs", [{}, dict(min_scale=0.1, max_scale=0.9, sampler_options=[0.5, 0.9, 2.0], trials=7)])
def test_iou_crop_draws_while_recorded_are_torchvisions(kwargs):
    """The registry's faster RandomIoUCrop.make_params (used while recorded) returns torchvision's
    parameters and leaves torch's RNG where torchvision's leaves it, over a thousand random canvases and
    box sets (formats, float32/float64, degenerate and no boxes)."""
    from gputransforms.compiler import joint, joint_draws

    t = v2.RandomIoUCrop(**kwargs)
    theirs, ours = v2.RandomIoUCrop.make_params, joint_draws.random_iou_crop(v2.RandomIoUCrop.make_params)
    gen = torch.Generator().manual_seed(0)
    crops = 0
    for case in range(1000):
        flat = _random_boxes(gen, case)
        if not len(flat[1]) and case % 50:
            continue  # no boxes: only the 1.0 option ends the draw (a few cases suffice)
        torch.manual_seed(case)
        a = theirs(t, flat)
        state = torch.get_rng_state()
        torch.manual_seed(case)
        b = ours(t, flat)
        assert torch.equal(torch.get_rng_state(), state), case
        assert a.keys() == b.keys(), case
        for key in a:
            assert (torch.equal(a[key], b[key]) if key == "is_within_crop_area" else a[key] == b[key]), (case, key)
        crops += bool(a)
    assert crops > 40  # the crop path is exercised (about 56 and 700 of the cases)
    # swapped in only while recording, for the class itself and a sample being recorded in this thread
    with joint.recording():
        assert v2.RandomIoUCrop.make_params is not theirs
        assert v2.RandomIoUCrop.make_params(t, flat) is not None  # no record here: torchvision's own runs
    assert v2.RandomIoUCrop.make_params is theirs


def test_iou_crop_draws_on_tiny_canvases_are_torchvisions():
    """On canvases of 1-4 px a trial's crop can be 0 px high, where torchvision raises ZeroDivisionError (unless a
    crop is accepted first): the registry's draw then lets torchvision's own run from the call's first draw, so
    it raises where torchvision raises, or gives its crop, and leaves torch's RNG where torchvision's leaves it."""
    from gputransforms.compiler import joint_draws

    t = v2.RandomIoUCrop()
    theirs, ours = v2.RandomIoUCrop.make_params, joint_draws.random_iou_crop(v2.RandomIoUCrop.make_params)
    gen = torch.Generator().manual_seed(1)
    raised = crops = 0
    for case in range(400):
        flat = _random_boxes(gen, case, sides=(1, 5))
        results = []
        for fn in (theirs, ours):
            torch.manual_seed(case)
            try:
                results.append((fn(t, flat), torch.get_rng_state()))
            except ZeroDivisionError:
                results.append(("ZeroDivisionError", torch.get_rng_state()))
        (a, state_a), (b, state_b) = results
        assert torch.equal(state_a, state_b), case
        if isinstance(a, str) or isinstance(b, str):
            assert a == b, case
            raised += 1
            continue
        assert a.keys() == b.keys(), case
        for key in a:
            assert (torch.equal(a[key], b[key]) if key == "is_within_crop_area" else a[key] == b[key]), (case, key)
        crops += bool(a)
    assert raised > 20 and crops > 5, (raised, crops)  # both ways are exercised


def test_scale_jitter_draws_while_recorded_are_torchvisions():
    """The registry's faster ScaleJitter.make_params (float32 NumPy scalars for its tensor of one number) gives
    torchvision's size and leaves torch's RNG where torchvision's leaves it, over 20,000 random canvases,
    target sizes and scale ranges."""
    import random

    from gputransforms.compiler import joint, joint_draws

    theirs, ours = v2.ScaleJitter.make_params, joint_draws.scale_jitter(v2.ScaleJitter.make_params)
    rng = random.Random(0)
    sizes = set()
    for case in range(20000):
        lo = rng.choice([0.1, 0.5, 1, rng.random()])
        t = v2.ScaleJitter((rng.randint(16, 2000), rng.randint(16, 2000)), scale_range=(lo, lo + rng.random() * 3))
        flat = [torch.empty((), dtype=torch.uint8).expand(3, rng.randint(1, 3000), rng.randint(1, 3000))]
        torch.manual_seed(case)
        a = theirs(t, flat)
        state = torch.get_rng_state()
        torch.manual_seed(case)
        assert ours(t, flat) == a, case
        assert torch.equal(torch.get_rng_state(), state), case
        sizes.add(a["size"])
    assert len(sizes) > 19000
    with joint.recording():
        assert v2.ScaleJitter.make_params is not theirs
    assert v2.ScaleJitter.make_params is theirs


def _forward_chains() -> dict:
    """The reference presets on every backend, and a chain of every other class with a ``forward`` entry."""
    fill = {tv_tensors.Mask: 0, "others": (123.0, 117.0, 104.0)}
    chains = {f"{aug}-{backend}": DetectionPresetTrain(data_augmentation=aug, backend=backend)
              for aug in ("hflip", "multiscale", "ssd", "ssdlite") for backend in ("pil", "tensor", "tv_tensor")}
    chains["others"] = v2.Compose([
        v2.ToImage(), v2.ScaleJitter((640, 640)), v2.RandomCrop(500, pad_if_needed=True, fill=fill),
        v2.RandomResize(300, 700), v2.Resize(400, max_size=600), v2.RandomShortestSize((350, 420)),
        v2.CenterCrop(380), v2.Pad(4, fill=9), v2.RandomVerticalFlip(), v2.ClampBoundingBoxes(),
        v2.ConvertBoundingBoxFormat("CXCYWH"), v2.ConvertImageDtype(torch.float32),
        v2.Normalize((0.5, 0.4, 0.3), (0.2, 0.2, 0.2)), v2.SanitizeBoundingBoxes(min_size=3, min_area=10),
        v2.ToPureTensor()])
    chains["labels-getter"] = v2.Compose([v2.PILToTensor(), v2.RandomIoUCrop(), v2.SanitizeBoundingBoxes(
        labels_getter=lambda inputs: (inputs[1]["labels"], inputs[1]["iscrowd"]))])
    for backend, head in (("pil", []), ("tensor", [v2.PILToTensor()]), ("tv_tensor", [v2.ToImage()])):
        # every class with a ``chain`` entry, in one Compose (recorded in one pass: joint_chain), one nested
        chains[f"chain-{backend}"] = v2.Compose(head + [
            v2.ScaleJitter((640, 640)), v2.RandomCrop(500, pad_if_needed=True, fill=fill), v2.RandomHorizontalFlip(),
            v2.Compose([v2.RandomVerticalFlip(), v2.ConvertBoundingBoxFormat("XYWH")]),
            v2.RandomCrop(300, padding=[3, 0, 7, 5], pad_if_needed=True), v2.RandomShortestSize((200, 260), 400),
            v2.ToImage(), v2.ToDtype(torch.float32, scale=True), v2.ConvertBoundingBoxFormat("XYXY"),
            v2.SanitizeBoundingBoxes(min_size=2), v2.ToPureTensor()])
    for backend in ("pil", "tv_tensor"):  # a mask for target (its own PadIfSmaller runs as written)
        chains[f"seg-{backend}"] = SegmentationPresetTrain(base_size=120, crop_size=100, backend=backend)
        chains[f"seg-{backend}-lazy"] = chains[f"seg-{backend}"]
    return chains


def test_sized_draws_of_the_one_pass_are_torchvisions():
    """The one pass's draws on a known size (joint_draws: RandomCrop's, RandomShortestSize's, ScaleJitter's)
    give what the classes' own make_params give and leave torch's RNG where they leave it, over random canvases
    and settings; where RandomCrop's raises (a crop larger than the padded image), the pass's gives None."""
    import random

    from gputransforms.compiler import joint_draws

    rng = random.Random(1)
    raised = 0
    for case in range(6000):
        h, w = rng.randint(1, 900), rng.randint(1, 900)
        flat = [torch.empty((), dtype=torch.uint8).expand(3, h, w)]
        kind = case % 3
        if kind == 0:
            t = v2.RandomCrop((rng.randint(1, 700), rng.randint(1, 700)), pad_if_needed=rng.random() < 0.7,
                              padding=rng.choice([None, rng.randint(1, 40), [rng.randint(0, 9), rng.randint(0, 9)],
                                                  [rng.randint(0, 9) for _ in range(4)]]))
            ours = functools.partial(joint_draws.random_crop_params, t)
        elif kind == 1:
            t = v2.RandomShortestSize([rng.randint(8, 1200) for _ in range(rng.randint(1, 5))],
                                      max_size=rng.choice([None, rng.randint(100, 2000)]))
            ours = functools.partial(joint_draws.random_shortest_size, t)
        else:
            t = v2.ScaleJitter((rng.randint(16, 2000), rng.randint(16, 2000)), scale_range=(0.1, 2.0))
            ours = functools.partial(joint_draws.scale_jitter_size, t)
        torch.manual_seed(case)
        try:
            theirs = t.make_params(flat)
        except ValueError:
            theirs = None
            raised += 1
        state = torch.get_rng_state()
        torch.manual_seed(case)
        got = ours(h, w)
        assert got == (theirs if kind == 0 or theirs is None else theirs["size"]), (case, got, theirs)
        assert torch.equal(torch.get_rng_state(), state), case
    assert 100 < raised < 1900


@pytest.mark.parametrize("name", list(_forward_chains()))
def test_forwards_while_recorded_are_torchvisions(name, monkeypatch):
    """The registry's faster forwards (used while recorded: the (image, target) pair without torch's pytree,
    SanitizeBoundingBoxes' mask in NumPy; a Compose of classes with a ``chain`` entry in one pass, its boxes
    as NumPy) give torchvision's record, target and RNG state, sample by
    sample from the same seeds: boxes of three formats, float32 and float64, empty, degenerate, outside
    the canvas; labels, crowd flags and an image id beside them; the segmentation preset's mask, moved by
    torchvision's kernels or recorded (``lazy_masks``)."""
    from gputransforms.compiler import joint

    chain = _forward_chains()[name]
    kind = "image" if "tv_tensor" in name or name == "others" else "pil" if "pil" in name else "tensor"
    gen = torch.Generator().manual_seed(1)
    cropped = 0
    passes = _count_passes(monkeypatch)  # samples recorded in one pass: the rest were recorded step by step
    for case in range(150):
        image, boxes = _random_boxes(gen, case)
        if case % 11 == 0:
            boxes = tv_tensors.wrap(boxes - 30, like=boxes)  # partly outside the canvas
        if case % 4 == 1 and len(boxes) and boxes.format == tv_tensors.BoundingBoxFormat.XYXY:
            # whole pixels, one box exactly 1 wide (SanitizeBoundingBoxes' min_size: kept) and one 0.5 high
            boxes = tv_tensors.wrap(boxes.round(), like=boxes)
            boxes[0, 2] = boxes[0, 0] + 1
            boxes[-1, 3] = boxes[-1, 1] + 0.5
        k = len(boxes)

        def target():
            if name.startswith("seg"):
                return tv_tensors.Mask(torch.randint(0, 21, tuple(image.shape[-2:]), dtype=torch.uint8,
                                                     generator=torch.Generator().manual_seed(case)))
            return {"boxes": boxes.clone(), "labels": torch.arange(k), "iscrowd": torch.zeros(k, dtype=torch.int64),
                    "image_id": case}

        runs = []
        for fast in (False, True):
            joint.FAST_FORWARD[0] = fast
            torch.manual_seed(case)
            try:
                runs.append((joint.record(chain, tuple(image.shape[-2:]), target(), kind,
                                          lazy_masks=name.endswith("lazy")), torch.get_rng_state()))
            except Exception as e:  # noqa: BLE001 - both must raise the same
                runs.append(((type(e), str(e)), None))
            finally:
                joint.FAST_FORWARD[0] = True
        (theirs, theirs_rng), (ours, ours_rng) = runs
        assert joint.same(ours, theirs), (name, case)
        assert theirs_rng is None or torch.equal(ours_rng, theirs_rng), (name, case)
        cropped += theirs_rng is not None and any(op == "crop" for op, _, _ in theirs[0])
    if "ssd" in name or name.startswith(("seg", "chain")) or name in ("others", "labels-getter"):
        assert cropped > 20
    # the one pass takes the chains of its classes alone, on float32 XYXY / XYWH boxes (not CXCYWH, float64)
    one_pass = name.startswith(("chain", "hflip", "multiscale", "ssd"))
    assert (40 < passes[0] < 150) if one_pass else passes[0] == 0, (name, passes[0])


@pytest.mark.parametrize("extra", ["array", "mask", "two-boxes", "hook", "late-nested-hook", "subclass"])
def test_the_one_pass_leaves_what_it_does_not_carry(extra, monkeypatch):
    """A target value no step of the one pass carries (an array, which ToImage makes an Image; a mask; a second
    set of boxes), a hook on a step (or on a nested Compose, registered after the pass was taken once), or a
    user's subclass among the steps: the Compose's own forward runs, and the record and target are
    torchvision's."""
    from gputransforms.compiler import joint

    class Flip(v2.RandomHorizontalFlip):
        pass

    flip = Flip() if extra == "subclass" else v2.RandomHorizontalFlip()
    if extra == "hook":
        flip.register_forward_hook(lambda module, args, out: None)
    nested = v2.Compose([flip, v2.RandomCrop(40, pad_if_needed=True)])
    chain = v2.Compose([v2.PILToTensor(), v2.ToImage(), nested, v2.SanitizeBoundingBoxes()])
    passes = _count_passes(monkeypatch)

    def target():
        boxes = tv_tensors.BoundingBoxes(torch.tensor([[1.0, 2.0, 30.0, 40.0], [50.0, 3.0, 58.0, 9.0]]),
                                         format="XYXY", canvas_size=(50, 60))
        out = {"boxes": boxes, "labels": torch.tensor([3, 4])}
        out.update({"array": {"extra": np.full((50, 60, 3), 7, np.uint8)}, "mask": {"masks": tv_tensors.Mask(
            torch.zeros(2, 50, 60, dtype=torch.uint8))}, "two-boxes": {"more": boxes.clone()}}.get(extra, {}))
        return out

    calls: list = []
    if extra == "late-nested-hook":
        joint.record(chain, (50, 60), target(), "pil")
        assert passes[0] == 1  # taken, and its plan kept
        nested.register_forward_hook(lambda module, args, out: calls.append(1))
    for case in range(20):
        runs = []
        for fast in (False, True):
            joint.FAST_FORWARD[0] = fast
            torch.manual_seed(case)
            try:
                runs.append(joint.record(chain, (50, 60), target(), "pil"))
            finally:
                joint.FAST_FORWARD[0] = True
        assert joint.same(runs[1], runs[0]), (extra, case)
    if extra == "late-nested-hook":
        assert len(calls) == 40  # the hook ran for every sample (the nested Compose's own steps may take the pass)
    else:
        assert passes[0] == 0
    if extra == "array":
        assert isinstance(runs[1][1]["extra"], tv_tensors.Image) and runs[1][1]["extra"].shape == (3, 40, 40)


def test_kernel_arguments_are_bound_as_inspect_binds_them():
    """A recorded functional's arguments by name (``joint._bound``'s fast path) are what inspect's bind and
    apply_defaults give, in the same order, and it raises TypeError where bind does, over every kernel
    torchvision registers and random calls (too many, duplicated and unknown arguments included)."""
    import inspect
    import random

    from torchvision.transforms.v2.functional import _utils as futils

    from gputransforms.compiler import joint

    rng = random.Random(0)
    kernels = {getattr(r[c], "__wrapped__", r[c]) for r in futils._KERNEL_REGISTRY.values() for c in r}
    checked = 0
    for kernel in sorted(kernels, key=lambda k: k.__qualname__):
        params = list(inspect.signature(kernel).parameters.values())[1:]
        names = [p.name for p in params]
        for _ in range(30):
            args = tuple(object() for _ in range(rng.randint(0, len(params) + 1)))
            kwargs = {n: object() for n in rng.sample(names + ["bogus"], rng.randint(0, min(3, len(names) + 1)))}
            try:
                b = inspect.signature(kernel).bind(None, *args, **kwargs)
                b.apply_defaults()
                want = dict(b.arguments)
                want.pop(next(iter(want)))
            except TypeError:
                want = TypeError
            try:
                got = joint._bound(kernel, None, args, kwargs)
            except TypeError:
                got = TypeError
            assert want == got and (want is TypeError or list(want) == list(got)), (kernel, args, kwargs)
            checked += want is not TypeError
    assert checked > 500  # (861 here)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_jpeg_whose_header_pil_cannot_read_raises_naming_it(coco, tmp_path, workers):
    """A recorded sample's image whose header PIL refuses (an unknown marker where its first segment was; the
    frame header after it is intact, and DALI's decoders may well read it) raises naming the file, where
    torchvision's dataset raises PIL's error: its canvas size is asked of PIL, not read from the SOF marker."""
    import re
    import shutil

    from gputransforms import BadSampleError

    images = tmp_path / "images"
    shutil.copytree(coco[0], images)
    ds = wrapped((images, coco[1]), DetectionPresetTrain(data_augmentation="hflip"), keys=["boxes", "labels"])
    bad = images / ds.dataset.coco.loadImgs(ds.dataset.ids[ds.indices[3]])[0]["file_name"]
    data = bytearray(bad.read_bytes())
    assert data[2] == 0xFF and data[3] != 0x02
    data[3] = 0x02  # not a marker PIL knows ("no marker found")
    bad.write_bytes(bytes(data))
    with pytest.raises(Exception):
        Image.open(bad)
    with pytest.raises(Exception):
        list(tud.DataLoader(ds, batch_size=4, collate_fn=detection_collate))
    with pytest.raises(BadSampleError, match=re.escape(str(bad))):
        list(DataLoader(ds, batch_size=4, collate_fn=detection_collate, device="cpu", num_workers=workers))


def _voc_segmentation(voc, transforms, indices=None):
    ds = torchvision.datasets.wrap_dataset_for_transforms_v2(
        torchvision.datasets.VOCSegmentation(str(voc), year="2012", image_set="train", transforms=transforms))
    return ds if indices is None else tud.Subset(ds, indices)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", ["tv_tensor", "pil"])
def test_segmentation_reference_preset_is_recorded_with_its_own_pad_class(voc, device, backend):
    """references/segmentation's v2 train preset (--backend tv_tensor, and its default pil: PIL images
    augmented), PadIfSmaller (its own class) included, with its collate_fn: recorded (the user's class
    after a pixel-blind probe), masks exactly torchvision's, images within the image path's parity; with
    2 workers every image once."""
    ds = _voc_segmentation(voc, SegmentationPresetTrain(base_size=160, crop_size=144, backend=backend))
    loader = DataLoader(ds, batch_size=8, collate_fn=segmentation_collate, device=device)
    plan = loader.explain()
    assert "recorded per sample" in plan and "PadIfSmaller: your own class" in plan, plan
    assert not loader._backend.files.program.first_window  # (RandomResize first: no window before it)
    _segmentation_side_by_side(loader, ds, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", ["tv_tensor", "pil"])
def test_segmentation_reference_eval_preset_is_recorded(voc, device, backend):
    """references/segmentation's v2 eval preset (a square resize of image and mask, on PIL images by
    default): recorded, masks exactly torchvision's, images within the image path's parity."""
    ds = _voc_segmentation(voc, SegmentationPresetEval(base_size=144, backend=backend))
    loader = DataLoader(ds, batch_size=8, collate_fn=segmentation_collate, device=device)
    assert "recorded per sample" in loader.explain(), loader.reason
    _segmentation_side_by_side(loader, ds, device, mask_dtype=torch.uint8)  # (the preset leaves masks as they are)


def _segmentation_side_by_side(loader, ds, device, mask_dtype=torch.int64):
    """The loader's batches against torch's DataLoader's from the same seed (masks exactly, images within the
    image path's parity), and with 2 workers every sample once."""
    torch.manual_seed(3)
    ours = list(loader)
    torch.manual_seed(3)
    theirs = list(tud.DataLoader(ds, batch_size=8, collate_fn=segmentation_collate))
    assert len(ours) == len(theirs) == 6
    for (x, m), (xt, mt) in zip(ours, theirs):
        assert x.shape == xt.shape == (8, 3, 144, 144) and m.dtype == mt.dtype == mask_dtype
        assert torch.equal(m.cpu(), mt) and (mt != 0).any()
        assert (x.cpu() - xt).abs().mean() * 0.229 * 255 < (1.0 if device == "cpu" else 3.0)
    masks = [m for _, m in DataLoader(ds, batch_size=8, collate_fn=segmentation_collate, device=device,
                                      num_workers=2, shuffle=True)]
    assert sum(len(m) for m in masks) == len(ds)


def test_masks_made_in_one_gather_are_torchvisions():
    """joint_masks.realize: random sequences of crops (out of bounds too), pads, flips, nearest resizes
    (with max_size), center crops and a ToDtype, against torchvision's own mask kernels, to the value."""
    import random

    from gputransforms.compiler import joint_masks

    rng = random.Random(0)
    for _ in range(400):
        h0, w0 = rng.randint(1, 70), rng.randint(1, 70)
        real = tv_tensors.Mask(torch.randint(0, 256, rng.choice([(), (1,), (3,)]) + (h0, w0), dtype=torch.uint8))
        ops, cur = [(joint_masks.SOURCE, {"source": real}, (h0, w0))], real
        for _ in range(rng.randint(1, 5)):
            h, w = cur.shape[-2:]
            name = rng.choice(["crop", "pad", "horizontal_flip", "vertical_flip", "resize", "center_crop"])
            a = dict(crop=dict(top=rng.randint(-8, h), left=rng.randint(-8, w), height=rng.randint(1, h + 8),
                               width=rng.randint(1, w + 8)),
                     pad=dict(padding=[rng.randint(0, 5) for _ in range(rng.choice([1, 2, 4]))],
                              fill=rng.choice([None, 0, 255, 7]), padding_mode="constant"),
                     resize=rng.choice([dict(size=[rng.randint(1, 150)], max_size=rng.choice([None, 160])),
                                        dict(size=[rng.randint(1, 150), rng.randint(1, 150)], max_size=None)]),
                     center_crop=dict(output_size=[rng.randint(1, h + 9), rng.randint(1, w + 9)])).get(name, {})
            cur = getattr(v2.functional, name)(cur, **a)
            ops.append((name, a, (h, w)))
        ops.append(("to_dtype", dict(dtype=torch.int64, scale=False), tuple(cur.shape[-2:])))
        made = joint_masks.widened(joint_masks.realize(ops))
        assert made.dtype == torch.int64 and torch.equal(made, cur.as_subclass(torch.Tensor).to(torch.int64)), ops


class _MaskTo255(v2.Transform):
    """A user's class that reads the masks' values (their 0 made 255): masks cannot be recorded."""

    def transform(self, inpt, params):
        if isinstance(inpt, tv_tensors.Mask):
            return tv_tensors.wrap(torch.where(inpt == 0, 255, inpt).to(inpt.dtype), like=inpt)
        return inpt


def test_masks_recorded_where_the_chain_moves_them_only_through_their_functionals(voc):
    """The segmentation preset's masks are recorded and made in one gather (explain() says so); a chain
    with a class that reads the masks' values keeps torchvision's kernels on the real masks. Both give
    torchvision's masks exactly."""
    chains = {True: SegmentationPresetTrain(base_size=160, crop_size=144),
              False: v2.Compose([v2.ToImage(), v2.RandomResize(80, 200), _MaskTo255(), v2.RandomHorizontalFlip(),
                                 v2.RandomCrop(144, pad_if_needed=True, fill={tv_tensors.Mask: 255, "others": 0}),
                                 v2.ToDtype({tv_tensors.Image: torch.float32, tv_tensors.Mask: torch.int64,
                                             "others": None}, scale=True), v2.ToPureTensor()])}
    for recorded_masks, chain in chains.items():
        ds = _voc_segmentation(voc, chain)
        loader = DataLoader(ds, batch_size=8, collate_fn=segmentation_collate, device="cpu")
        plan = loader.explain()
        assert "recorded per sample" in plan and ("masks: recorded with the image" in plan) == recorded_masks, plan
        torch.manual_seed(11)
        ours = [m for _, m in loader]
        torch.manual_seed(11)
        theirs = [m for _, m in tud.DataLoader(ds, batch_size=8, collate_fn=segmentation_collate)]
        assert len(ours) == len(theirs) == 6
        for m, mt in zip(ours, theirs):
            assert m.dtype == mt.dtype == torch.int64 and torch.equal(m, mt)


def test_instance_masks_recorded_without_a_sanitize_step(coco):
    """COCO's instance masks (one per object) through random flips, resizes and padded crops, no
    SanitizeBoundingBoxes: recorded and gathered, boxes, labels and masks exactly torchvision's (images
    without annotations, whose masks are empty, keep torchvision's kernels)."""
    chain = v2.Compose([v2.ToImage(), v2.RandomHorizontalFlip(), v2.RandomResize(40, 90),
                        v2.RandomCrop(64, pad_if_needed=True, fill={tv_tensors.Mask: 255, "others": 0}),
                        v2.ToDtype({tv_tensors.Image: torch.float32, tv_tensors.Mask: torch.int64, "others": None},
                                   scale=True)])
    ds = wrapped(coco, chain, keys=["boxes", "labels", "masks", "image_id"], annotated_only=False)
    assert "masks: recorded with the image" in DataLoader(ds, batch_size=4, collate_fn=detection_collate,
                                                          device="cpu").explain()
    ours, theirs = side_by_side(ds, "cpu", seed=5, shuffle=True)
    seen = 0
    for (_, ot), (_, tt) in zip(ours, theirs):
        for ta, tb in zip(ot, tt):
            same_targets(ta, tb)
            seen += 1
    assert seen == len(ds)


@pytest.mark.parametrize("device", DEVICES)
def test_a_mask_stand_in_indexed_is_recorded_again_with_the_real_masks(coco, device, monkeypatch):
    """Lazy masks on although a sample's instance masks meet SanitizeBoundingBoxes' indexing after a flip: the
    probe made with the loader (``masks_blind``) follows one draw, and where its flip was not drawn it found the
    masks untouched (forced here). The indexing of a mask stand-in raises MaskUnrecordable and the sample is
    recorded again with its real masks: boxes, labels and masks exactly torchvision's. Before, such a sample's
    masks were the stand-in's undefined values, and the hflip preset's test failed about half its runs. The
    segmentation preset, whose masks meet only their functionals, stays gathered."""
    from gputransforms.compiler import joint, joint_masks

    keys = ["boxes", "labels", "masks", "image_id"]
    ds = wrapped(coco, DetectionPresetTrain(data_augmentation="hflip", backend="tv_tensor"), keys=keys)
    monkeypatch.setattr(joint, "masks_blind", lambda *a, **k: True)
    loader = DataLoader(ds, batch_size=4, collate_fn=detection_collate, device=device, shuffle=True)
    assert "masks: recorded with the image" in loader.explain()
    ours, theirs = side_by_side(ds, device, seed=3, shuffle=True)
    assert len(ours) == len(theirs) > 5
    for (_, ot), (_, tt) in zip(ours, theirs):
        for ta, tb in zip(ot, tt):
            same_targets(ta, tb)
    flip = v2.Compose([v2.ToImage(), v2.RandomHorizontalFlip(p=1.0), v2.SanitizeBoundingBoxes(), v2.ToPureTensor()])
    boxes = tv_tensors.BoundingBoxes([[2.0, 3.0, 20.0, 30.0], [10.0, 10.0, 60.0, 50.0]], format="XYXY",
                                     canvas_size=(64, 80))
    masks = tv_tensors.Mask(torch.randint(0, 2, (2, 64, 80), dtype=torch.uint8, generator=torch.Generator().manual_seed(0)))
    made = {"boxes": boxes, "labels": torch.tensor([1, 2]), "masks": masks}
    with pytest.raises(joint_masks.MaskUnrecordable):
        joint.record(flip, (64, 80), made, "image", lazy_masks=True)
    kept = v2.Compose([v2.ToImage(), v2.RandomHorizontalFlip(p=1.0), v2.ToPureTensor()])
    ops, out, _ = joint.record(kept, (64, 80), dict(made), "image", lazy_masks=True)
    assert [op for op, _, _ in ops] == ["horizontal_flip"] and torch.equal(out["masks"], masks.flip(-1))


class _FlipIfBright(v2.Transform):
    """A user's class that reads the pixels (not recordable: it must run as written)."""

    def transform(self, inpt, params):
        if isinstance(inpt, tv_tensors.Image) and inpt.float().mean() > 110:
            return v2.functional.horizontal_flip(inpt)
        return inpt


class _BlurSomeWidths(v2.Transform):
    """A user's class that calls a functional the graph lacks, on images whose width has parity ``odd``."""

    def __init__(self, odd: int):
        super().__init__()
        self.odd = odd

    def transform(self, inpt, params):
        if isinstance(inpt, tv_tensors.Image) and inpt.shape[-1] % 2 == self.odd or \
                isinstance(inpt, Image.Image) and inpt.width % 2 == self.odd:
            return v2.functional.gaussian_blur(inpt, [3, 3])
        return inpt


def test_a_users_class_that_reads_the_pixels_runs_as_written(voc):
    chain = v2.Compose([v2.ToImage(), _FlipIfBright(), v2.Resize((64, 64)), v2.ToDtype(torch.float32, scale=True)])
    ds = _voc_segmentation(voc, chain)
    loader = DataLoader(ds, batch_size=8, device="cpu")
    assert "recorded per sample" not in loader.explain()
    for (x, m), (xt, mt) in zip(loader, tud.DataLoader(ds, batch_size=8)):
        assert torch.equal(m, mt)
        assert (x - xt).abs().mean() < 1 / 255


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("on", ["tensors", "pil"])
def test_a_sample_the_recording_cannot_take_runs_as_written(voc, device, on):
    """The probe's sample records; the others call gaussian_blur (which the graph lacks) where their width
    after a random resize has the other parity: each of those runs as written (on the PIL image where the
    chain works on PIL images), from the random state before its recording (the resize's draw made again)."""
    torch.manual_seed(0)  # the probe's random state: its sample's width after the resize
    first = v2.RandomResize(40, 80)(tv_tensors.Image(torch.from_numpy(np.asarray(Image.open(
        torchvision.datasets.VOCSegmentation(str(voc), year="2012", image_set="train").images[0]))).permute(2, 0, 1)))
    widths = [first.shape[-1]]
    steps = [v2.RandomResize(40, 80), _BlurSomeWidths(1 - widths[0] % 2), v2.RandomHorizontalFlip(), v2.CenterCrop(48)]
    chain = v2.Compose([v2.ToImage()] + steps + [v2.ToDtype(torch.float32, scale=True)] if on == "tensors" else
                       steps + [v2.PILToTensor(), v2.ToDtype(torch.float32, scale=True)])
    _recorded_as_torchvision_runs_it(_voc_segmentation(voc, chain), device)


def _recorded_as_torchvision_runs_it(ds, device: str) -> None:
    """The loader made from torch's seed 0 (its probe's draws) records the chain; from seed 5 its six batches are
    torch's DataLoader's: masks exact, images within the decoders' parity."""
    torch.manual_seed(0)
    loader = DataLoader(ds, batch_size=8, device=device)
    assert "recorded per sample" in loader.explain()
    torch.manual_seed(5)
    ours = list(loader)
    torch.manual_seed(5)
    theirs = list(tud.DataLoader(ds, batch_size=8))
    assert len(ours) == len(theirs) == 6
    for (x, m), (xt, mt) in zip(ours, theirs):
        assert torch.equal(m.cpu(), mt)
        assert (x.cpu() - xt).abs().mean() < (1 if device == "cpu" else 3) / 255  # nvJPEG's rounding on the GPU


class _FlipBrightSomeWidths(v2.Transform):
    """A user's class that reads the pixels (flips a bright image) only on images whose width has parity ``odd``."""

    def __init__(self, odd: int):
        super().__init__()
        self.odd = odd

    def transform(self, inpt, params):
        image = isinstance(inpt, tv_tensors.Image) or (type(inpt) is torch.Tensor and inpt.ndim == 3)
        if image and inpt.shape[-1] % 2 == self.odd and inpt.float().mean() > 110:
            return v2.functional.horizontal_flip(inpt)
        return inpt


@pytest.mark.parametrize("kind,workers", [("image", 0), ("tensor", 0), ("tensor", 2)])
def test_a_class_that_reads_the_pixels_off_the_probes_draw_runs_as_written(voc, kind, workers):
    """The probe's sample does not lead the user's class to read the pixels (its width after a resize has the
    other parity), so the chain is recorded; each sample whose width leads it to read them runs as written (a
    torch operation on the image's stand-in raises Unrecordable: a tv_tensors.Image's by its class, a plain
    tensor's by a mode while it is recorded), with torchvision's result. Before, the class read the stand-in's
    undefined values and flipped all or none of those samples. With workers the resize is not random (their
    chunks draw RandomResize's size from each sample's seed, not torch's generator)."""
    to = v2.ToImage() if kind == "image" else v2.PILToTensor()
    resize = v2.RandomResize(40, 80) if workers == 0 else v2.Resize(40)
    torch.manual_seed(0)  # the probe's random state: its sample's width after the resize
    first = resize(to(Image.open(torchvision.datasets.VOCSegmentation(str(voc), year="2012",
                                                                      image_set="train").images[0])))
    chain = v2.Compose([to, resize, _FlipBrightSomeWidths(1 - first.shape[-1] % 2), v2.CenterCrop(48),
                        v2.ToDtype(torch.float32, scale=True)])
    ds = _voc_segmentation(voc, chain)
    torch.manual_seed(0)
    loader = DataLoader(ds, batch_size=8, device="cpu", num_workers=workers)
    assert "recorded per sample" in loader.explain()
    torch.manual_seed(5)
    ours = list(loader)
    torch.manual_seed(5)
    theirs = list(tud.DataLoader(ds, batch_size=8, num_workers=workers))
    assert len(ours) == len(theirs) == 6
    for (x, m), (xt, mt) in zip(ours, theirs):
        assert torch.equal(m, mt)
        assert (x - xt).abs().mean() < 1 / 255


def test_targets_travel_from_the_workers_as_they_were():
    """What a worker hands the main process for a target: tensors as NumPy bytes, integer tensors whose
    values fit in uint8 narrowed (an int64 mask: an eighth of the bytes) and made int64 again; each comes
    back with its values, dtype, type and tv_tensor attributes."""
    from gputransforms.compiler.joint_masks import widened
    from gputransforms.datasets import pickled
    from gputransforms.datasets.detection import _pickled

    gen = torch.Generator().manual_seed(0)
    target = {"masks": tv_tensors.Mask(torch.randint(0, 256, (300, 300), generator=gen)),
              "wide": torch.randint(0, 1000, (300, 300), generator=gen),
              "bools": tv_tensors.Mask(torch.rand(2, 300, 300, generator=gen) > 0.5),
              "boxes": tv_tensors.BoundingBoxes(torch.rand(3, 4, generator=gen), format="XYWH", canvas_size=(30, 40)),
              "labels": torch.arange(3), "image_id": 7,
              # a strided mask (what a gather or a flip leaves): it arrives C-ordered, for one flat copy
              "strided": tv_tensors.Mask(torch.randint(0, 256, (1, 300, 400), dtype=torch.uint8,
                                                       generator=gen).transpose(1, 2))}
    data = _pickled(target)
    assert len(data) < 300 * 300 * (1 + 8 + 2) + 400 * 300 + 4096  # the int64 mask as one byte a value
    back = widened(pickled.load(data))
    assert list(back) == list(target) and back["image_id"] == 7
    for key in ("masks", "wide", "bools", "boxes", "labels", "strided"):
        assert type(back[key]) is type(target[key]) and back[key].dtype == target[key].dtype, key
        assert torch.equal(back[key], target[key]) and back[key].is_contiguous(), key
        assert not back[key].__dict__.keys() - target[key].__dict__.keys(), key
    assert back["boxes"].format == target["boxes"].format and back["boxes"].canvas_size == (30, 40)


@pytest.mark.parametrize("device", DEVICES)
def test_a_batch_of_targets_loads_straight_to_the_device(device):
    """pickled.load_to_device: several workers' pickled targets (every array beside its pickle), their arrays
    views of one buffer on the device; each comes back as load gives it: values, dtype, shape, type, tv_tensor
    attributes, empty boxes, a narrowed mask made wide again, a sample without tensors."""
    from gputransforms.compiler.joint_masks import widened
    from gputransforms.datasets import pickled
    from gputransforms.datasets.detection import _pickled

    dev = torch.device("cuda" if device == "gpu" else "cpu")
    gen = torch.Generator().manual_seed(2)
    targets = [{"boxes": tv_tensors.BoundingBoxes(torch.rand(k, 4, generator=gen) * 90, format="XYXY",
                                                  canvas_size=(90 + k, 100)),
                "labels": torch.randint(0, 80, (k,), generator=gen), "image_id": k,
                "scores": torch.rand(k, generator=gen, dtype=torch.float64).to(torch.float16)} for k in range(5)]
    targets.append({"masks": tv_tensors.Mask(torch.randint(0, 21, (1, 190, 200), generator=gen)), "id": "x"})
    targets.append({"image_id": 9})
    data = [_pickled(t) for t in targets]
    # every array is beside its pickle (aligned for a view as its dtype), none in it
    assert all(int.from_bytes(d[:8], "little") < 600 for d in data)
    back = widened(pickled.load_to_device(data, dev))
    if dev.type == "cuda":
        torch.cuda.synchronize()
    for t, b in zip(targets, back):
        assert list(b) == list(t)
        for key, v in t.items():
            if not isinstance(v, torch.Tensor):
                assert b[key] == v
                continue
            assert type(b[key]) is type(v) and b[key].dtype == v.dtype and b[key].device.type == dev.type, key
            assert torch.equal(b[key].cpu(), v) and b[key].__dict__ == v.__dict__, key
    assert pickled.load_to_device([], dev) == []


class UserDetection(tud.Dataset):
    """A detection Dataset as users write one (torchvision's finetuning tutorial's shape): its own list of
    files and boxes from the COCO json, PIL's open, a target of tv_tensors, ``self.transforms(img, target)``."""

    def __init__(self, coco, transforms=None, from_pixels=False):
        import json

        data = json.loads(Path(coco[1]).read_text())
        anns: dict = {}
        for a in data["annotations"]:
            if not a.get("iscrowd"):
                anns.setdefault(a["image_id"], []).append(a)
        self.items = [(str(Path(coco[0]) / im["file_name"]), [a["bbox"] for a in anns[im["id"]]],
                       [a["category_id"] for a in anns[im["id"]]]) for im in data["images"] if im["id"] in anns]
        self.transforms, self.from_pixels = transforms, from_pixels

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        path, boxes, labels = self.items[i]
        img = Image.open(path).convert("RGB")
        target = {"boxes": tv_tensors.BoundingBoxes(boxes, format="XYWH", canvas_size=(img.height, img.width)),
                  "labels": torch.tensor(labels)}
        if self.from_pixels:  # a target made from the pixels: cannot be found on a black image
            target["brightness"] = torch.tensor(np.asarray(img).mean())
        if self.transforms is not None:
            img, target = self.transforms(img, target)
        return img, target


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("aug,backend", [("hflip", "tv_tensor"), ("ssd", "tv_tensor"), ("hflip", "pil")])
def test_a_users_detection_dataset_is_compiled_as_torchvision_runs_it(coco, device, aug, backend):
    """A user's own Dataset whose __getitem__ opens an image and returns transforms(image, target) (the
    transform on tensors, or on the PIL image): the files and targets found once (black images of each
    file's size), the joint transform recorded; side by side with torch's DataLoader, the same targets
    exactly and the images within the image path's parity; with 2 workers every sample once."""
    ds = UserDetection(coco, DetectionPresetTrain(data_augmentation=aug, backend=backend))
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        loader = DataLoader(ds, batch_size=4, collate_fn=detection_collate, device=device)
    assert loader.backend == "dali", loader.reason
    assert "images of UserDetection decoded in the graph" in loader.explain()
    assert "recorded per sample" in loader.explain()
    ours, theirs = side_by_side(ds, device)
    n = 0
    for (oi, ot), (ti, tt) in zip(ours, theirs):
        for a, b, ta, tb in zip(oi, ti, ot, tt):
            assert a.shape == b.shape and (a.device.type == "cuda") == (device == "gpu")
            same_targets(ta, tb)
            # full-size images: nvJPEG's rounding on the GPU (the image path's parity, as for VOC above)
            assert (a.cpu() - b).abs().mean() * 255 < (0.5 if device == "cpu" else 3.0)
            n += 1
    assert n == len(ds) > 30
    boxes = [len(t["boxes"]) for _, targets in DataLoader(ds, batch_size=4, collate_fn=detection_collate, device=device,
                                                          num_workers=2, shuffle=True) for t in targets]
    assert len(boxes) == len(ds) and sum(boxes) > 0


class UserKeypoints(UserDetection):
    """The same, its target also holding each box's corners as ``KeyPoints`` (torchvision >= 0.23)."""

    def __getitem__(self, i):
        path, boxes, labels = self.items[i]
        img = Image.open(path).convert("RGB")
        xyxy = torch.tensor(boxes, dtype=torch.float32)
        xyxy[:, 2:] += xyxy[:, :2]
        size = (img.height, img.width)
        target = {"boxes": tv_tensors.BoundingBoxes(xyxy, format="XYXY", canvas_size=size),
                  "keypoints": tv_tensors.KeyPoints(xyxy.reshape(-1, 2), canvas_size=size),
                  "labels": torch.tensor(labels)}
        return self.transforms(img, target)


@pytest.mark.skipif(not hasattr(tv_tensors, "KeyPoints"), reason="this torchvision has no KeyPoints")
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", ["tv_tensor", "pil"])
def test_keypoints_follow_the_pixels_as_in_torchvision(coco, device, backend):
    """KeyPoints in a user's detection target go through the ssd preset's zoom-out, IoU crop and flip with
    the boxes: recorded, each sample's keypoints exactly torchvision's, with 2 workers every sample once."""
    ds = UserKeypoints(coco, DetectionPresetTrain(data_augmentation="ssd", backend=backend))
    loader = DataLoader(ds, batch_size=4, collate_fn=detection_collate, device=device)
    assert loader.backend == "dali" and "recorded per sample" in loader.explain(), loader.reason
    assert "KeyPoints: moved" in loader.explain()
    ours, theirs = side_by_side(ds, device)
    moved = 0
    for (oi, ot), (ti, tt) in zip(ours, theirs):
        for a, b, ta, tb in zip(oi, ti, ot, tt):
            assert a.shape == b.shape
            k, kt = ta["keypoints"], tb["keypoints"]
            assert type(k) is type(kt) and k.dtype == kt.dtype  # (the preset ends with ToPureTensor)
            assert torch.equal(k.cpu(), kt)
            moved += int(kt.shape[0] > 0)
    assert moved > 30
    n = sum(len(t) for _, t in DataLoader(ds, batch_size=4, collate_fn=detection_collate, device=device,
                                          num_workers=2))
    assert n == len(ds)


class UserDetectionAsOpened(UserDetection):
    """The same, its image handed over as PIL opens it (no convert("RGB"))."""

    def __getitem__(self, i):
        path, boxes, labels = self.items[i]
        img = Image.open(path)
        target = {"boxes": tv_tensors.BoundingBoxes(boxes, format="XYWH", canvas_size=(img.height, img.width)),
                  "labels": torch.tensor(labels)}
        return self.transforms(img, target)


@pytest.mark.parametrize("backend", ["tv_tensor", "pil"])
def test_a_users_detection_dataset_with_a_grey_file_it_does_not_convert_runs_as_written(coco, tmp_path, backend):
    """Without convert("RGB") torchvision's transform gets a grey JPEG in mode L (one channel): such a Dataset
    runs on torch's DataLoader, naming the file, and gives torchvision's batches (the graph decodes RGB); with
    RGB files only it compiles."""
    import shutil

    ds = UserDetectionAsOpened(coco, DetectionPresetTrain(data_augmentation="hflip", backend=backend))
    assert DataLoader(ds, batch_size=4, collate_fn=detection_collate, device="cpu").backend == "dali"
    grey = tmp_path / "grey.jpg"
    Image.open(ds.items[2][0]).convert("L").save(grey)
    shutil.copy(ds.items[0][0], tmp_path / "rgb.jpg")
    ds.items = [(str(grey),) + ds.items[2][1:], (str(tmp_path / "rgb.jpg"),) + ds.items[0][1:]]
    with pytest.warns(FallbackWarning, match="in mode L, as PIL opens .*grey.jpg"):
        loader = DataLoader(ds, batch_size=1, collate_fn=detection_collate, device="cpu")
    assert loader.backend == "torchvision"
    ours, theirs = side_by_side(ds, "cpu", batch_size=1)
    assert [b[0][0].shape[0] for b in ours] == [b[0][0].shape[0] for b in theirs] == [1, 3]


def test_a_users_detection_dataset_that_reads_pixels_or_opens_its_mask_first_runs_as_written(coco, voc):
    """What the discovery cannot stand a black image in for falls back with a reason that says why."""
    chain = DetectionPresetTrain(data_augmentation="hflip", backend="tv_tensor")
    with pytest.warns(FallbackWarning, match="makes its target from the image's pixels"):
        loader = DataLoader(UserDetection(coco, chain, from_pixels=True), batch_size=4, collate_fn=detection_collate)
    assert loader.backend == "torchvision"

    class MaskFirst(UserSegmentation):
        def __getitem__(self, i):
            mask = tv_tensors.Mask(torch.from_numpy(np.array(Image.open(self.masks[i]))))
            return self.transforms(Image.open(self.images[i]).convert("RGB"), mask)

    with pytest.warns(FallbackWarning, match="opens another file before its image"):
        loader = DataLoader(MaskFirst(voc, SegmentationPresetTrain(base_size=160, crop_size=144)), batch_size=4,
                            collate_fn=segmentation_collate)
    assert loader.backend == "torchvision"

    class MaskAsImage(UserSegmentation):  # the mask handed over as a PIL image: v2 would transform it as one
        def __getitem__(self, i):
            return self.transforms(Image.open(self.images[i]).convert("RGB"), {"mask": Image.open(self.masks[i])})

    with pytest.warns(FallbackWarning, match="passes a second image in its target"):
        DataLoader(MaskAsImage(voc, v2.Compose([v2.ToImage(), v2.RandomHorizontalFlip()])), batch_size=4)


class UserSegmentation(tud.Dataset):
    """A segmentation Dataset as users write one: its image and its mask, each opened with PIL, the mask a
    tv_tensors.Mask of the PNG's class indices, ``self.transforms(img, mask)``."""

    def __init__(self, voc, transforms, label_of_pixels=False):
        base = Path(voc) / "VOCdevkit" / "VOC2012"
        names = (base / "ImageSets" / "Segmentation" / "train.txt").read_text().split()
        self.images = [base / "JPEGImages" / f"{n}.jpg" for n in names]
        self.masks = [base / "SegmentationClass" / f"{n}.png" for n in names]
        self.transforms = transforms

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        img = Image.open(self.images[i]).convert("RGB")
        mask = tv_tensors.Mask(torch.from_numpy(np.array(Image.open(self.masks[i]))))
        return self.transforms(img, mask)


@pytest.mark.parametrize("device", DEVICES)
def test_a_users_segmentation_dataset_that_opens_its_mask_is_compiled(voc, device):
    """Image and mask each opened with PIL: the image found black of its file's size, the mask read for real
    in the workers per sample (not once for every index); the reference's train preset recorded; side by
    side with torch's DataLoader the masks exactly torchvision's, the images within the image path's parity;
    with 2 workers every sample once."""
    ds = UserSegmentation(voc, SegmentationPresetTrain(base_size=160, crop_size=144))
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        loader = DataLoader(ds, batch_size=8, collate_fn=segmentation_collate, device=device)
    assert loader.backend == "dali", loader.reason
    plan = loader.explain()
    assert "its other files (masks) read" in plan and "recorded per sample" in plan, plan
    _segmentation_side_by_side(loader, ds, device)


def test_a_users_dataset_whose_files_changed_since_the_loader_was_made_says_which(voc):
    """A sample made again in a worker (discover.joint_target) that now opens another image than the one
    found when the loader was made is an error naming both, not a sample of another file."""
    from gputransforms.datasets import discover

    ds = UserSegmentation(voc, SegmentationPresetTrain(base_size=160, crop_size=144))
    paths, targets, _, shape = discover.discover_joint(ds)
    assert targets is None and paths[:2] == [str(ds.images[0]), str(ds.images[1])]
    mask = discover.joint_target(ds, 1, paths[1], shape)
    assert isinstance(mask, tv_tensors.Mask) and torch.equal(mask, torch.from_numpy(np.array(Image.open(ds.masks[1]))))
    ds.images[1] = ds.images[2]
    with pytest.raises(RuntimeError, match=f"sample 1 of UserSegmentation opened {ds.images[2]} now, {paths[1]}"):
        discover.joint_target(ds, 1, paths[1], shape)


def test_a_classification_dataset_whose_transform_is_named_transforms_still_compiles(photo_folder):
    """``self.transforms(img)`` with one argument: not a detection Dataset; the classification discovery
    takes it, as before."""

    class Named(tud.Dataset):
        def __init__(self, transforms):
            self.files = sorted(Path(photo_folder).rglob("*.jpg"))
            self.transforms = transforms

        def __len__(self):
            return len(self.files)

        def __getitem__(self, i):
            return self.transforms(Image.open(self.files[i]).convert("RGB")), i % 3

    ds = Named(v2.Compose([v2.Resize((32, 32)), v2.ToImage(), v2.ToDtype(torch.float32, scale=True)]))  # PIL first
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        loader = DataLoader(ds, batch_size=8, device="cpu")
    assert loader.backend == "dali", loader.reason
    images, labels = next(iter(loader))
    assert images.shape == (8, 3, 32, 32) and labels.tolist() == [i % 3 for i in range(8)]


def test_the_graphs_colour_steps_are_torchvisions_arithmetic():
    """compiler/joint_dali: hue, contrast and saturation on uint8 images (random pixels, greys, every mix of
    extreme and middle values; hue factors 0, +-0.5 and a tiny one) against torchvision's adjust_* kernels,
    in a DALI graph on the CPU: hue and contrast to the value; saturation's grey is a weighted sum whose
    rounding differs from torch's fused one, off by one in at most 0.2% of values."""
    import itertools

    import nvidia.dali.fn as fn
    import nvidia.dali.types as types
    from nvidia.dali import pipeline_def
    from torchvision.transforms.v2 import functional as F

    from gputransforms.compiler import joint_dali

    rng = np.random.default_rng(0)
    imgs = [rng.integers(0, 256, (37 + k, 53 + 2 * k, 3), dtype=np.uint8) for k in range(8)]
    imgs[0][:, :, :] = imgs[0][:, :, :1]  # greys: max == min
    v = [0, 1, 2, 127, 128, 200, 254, 255]
    imgs[1] = np.array(list(itertools.product(v, v, v)), dtype=np.uint8).reshape(8, 64, 3)
    hue = [float(f) for f in rng.uniform(-0.5, 0.5, 8)]
    hue[2:6] = [0.0, -0.5, 0.5, 1e-7]
    factor = [float(f) for f in rng.uniform(0.5, 1.5, 8)]

    @pipeline_def(batch_size=8, num_threads=1, device_id=None)
    def graph():
        x = fn.cast(fn.external_source(source=lambda: imgs, batch=True, layout="HWC"), dtype=types.FLOAT)
        h = fn.external_source(source=lambda: [np.float32(f) for f in hue], batch=True)
        c = fn.external_source(source=lambda: [np.float32(f) for f in factor], batch=True)
        return joint_dali._hue(x, h), joint_dali._contrast(x, c), joint_dali._saturation(x, c)

    pipe = graph()
    pipe.build()
    outs = pipe.run()
    refs = (lambda t, k: F.adjust_hue(t, hue[k]), lambda t, k: F.adjust_contrast(t, factor[k]),
            lambda t, k: F.adjust_saturation(t, factor[k]))
    for name, out, ref, allowed in zip(("hue", "contrast", "saturation"), outs, refs, (0, 0, 0.002)):
        differ = total = 0
        for k in range(8):
            theirs = ref(torch.from_numpy(imgs[k]).permute(2, 0, 1), k).permute(1, 2, 0).numpy().astype(np.int32)
            ours = np.asarray(out.at(k)).astype(np.int32)
            assert ours.shape == theirs.shape and np.abs(ours - theirs).max() <= 1, name
            differ += int((ours != theirs).sum())
            total += ours.size
        assert differ <= allowed * total, (name, differ, total)


def test_the_graphs_hue_is_torchvisions_on_a_grid_of_every_colour():
    """compiler/joint_dali._hue, which computes only each pixel's middle value and places the largest and
    smallest as they came: equal to torchvision's adjust_hue for every RGB triple on a grid of every third
    value (and 1, 2, 254, 255: channels one and two apart), at eight hue factors including 0, +-0.5 and a tiny one. (The whole RGB cube at ten
    factors, once on the CPU: equal everywhere.)"""
    import nvidia.dali.fn as fn
    import nvidia.dali.types as types
    from nvidia.dali import pipeline_def
    from torchvision.transforms.v2 import functional as F

    from gputransforms.compiler import joint_dali

    v = np.array(sorted(set(range(0, 256, 3)) | {1, 2, 254, 255}), dtype=np.uint8)  # (differences of 1 and 2)
    grid = np.stack(np.meshgrid(v, v, v, indexing="ij"), -1).reshape(len(v) ** 2, len(v), 3)
    hue = [0.0, -0.5, 0.5, 1e-7, 0.1234, -0.377, 1 / 3, -1 / 6]

    @pipeline_def(batch_size=8, num_threads=1, device_id=None)
    def graph():
        x = fn.cast(fn.external_source(source=lambda: [grid] * 8, batch=True, layout="HWC"), dtype=types.FLOAT)
        return joint_dali._hue(x, fn.external_source(source=lambda: [np.float32(f) for f in hue], batch=True))

    pipe = graph()
    pipe.build()
    out, = pipe.run()
    for k, f in enumerate(hue):
        theirs = F.adjust_hue(torch.from_numpy(grid).permute(2, 0, 1), f).permute(1, 2, 0).numpy()
        assert np.array_equal(np.asarray(out.at(k)).astype(np.uint8), theirs), f


def test_a_joint_graph_asks_for_dalis_operator_concurrency_where_dali_has_it(monkeypatch):
    """compiler.dali._concurrency: full concurrency and a stream per operator for a plan with a joint step,
    DALI's defaults for any other plan and under a DALI release without those settings."""
    import types as pytypes

    import nvidia.dali as dali

    from gputransforms.compiler import dali as lowering

    joint, other = pytypes.SimpleNamespace(steps=[pytypes.SimpleNamespace(op="joint")]), \
        pytypes.SimpleNamespace(steps=[pytypes.SimpleNamespace(op="resize")])
    assert lowering._concurrency(joint) == dict(concurrency=dali.OperatorConcurrency.FULL,
                                               stream_policy=dali.StreamPolicy.PER_OPERATOR)
    assert lowering._concurrency(other) == {}
    monkeypatch.delattr(dali, "OperatorConcurrency")
    assert lowering._concurrency(joint) == {}


def test_workers_chunks_in_any_order_give_the_same_epoch(coco, monkeypatch):
    """With workers each sample draws from a seed of its own and the workers' chunks come back as they are
    done (feed.ProcessDecoders): three workers, one worker and a second run of three give the same batches,
    sample by sample, for a random preset (ssd), batches of two chunks each."""
    from presets import DetectionPresetTrain

    from gputransforms.backends import feed

    monkeypatch.setattr(feed.ProcessDecoders, "CHUNK", 8)  # (batches of 16: two chunks each)
    ds = wrapped(coco, DetectionPresetTrain(data_augmentation="ssd"), keys=["boxes", "labels", "image_id"])

    def epoch(workers: int) -> list:
        torch.manual_seed(0)  # (the sampler's shuffle draws from torch's RNG, as torch's does)
        loader = DataLoader(ds, batch_size=16, collate_fn=detection_collate, device="cpu", num_workers=workers,
                            shuffle=True, seed=11)
        return [(images, targets) for images, targets in loader]

    runs = [epoch(3), epoch(1), epoch(3)]
    assert len(runs[0]) == -(-len(ds) // 16) >= 2
    ids = [t["image_id"] for _, targets in runs[0] for t in targets]
    assert sorted(ids) == sorted(set(ids)) and len(ids) == len(ds)
    for other in runs[1:]:
        for (images, targets), (images2, targets2) in zip(runs[0], other):
            for a, b, ta, tb in zip(images, images2, targets, targets2):
                assert torch.equal(a, b)
                same_targets(ta, tb)


class _HeatDetection(UserDetection):
    """A user's detection Dataset whose target also holds a large plain tensor (a 200 x 200 float32 map)."""

    def __getitem__(self, i):
        path, boxes, labels = self.items[i]
        img = Image.open(path).convert("RGB")
        target = {"boxes": tv_tensors.BoundingBoxes(boxes, format="XYWH", canvas_size=(img.height, img.width)),
                  "labels": torch.tensor(labels), "heat": torch.full((200, 200), float(i))}
        return self.transforms(img, target)


def test_a_sample_whose_target_has_masks_travels_in_smaller_worker_items(coco, voc, monkeypatch):
    """feed.ProcessDecoders: a recorded sample's worker item holds ``CHUNK`` samples (at most a batch), and
    ``CHUNK_LARGE`` where the target has masks (COCO's instance masks, VOCSegmentation's), or anything else
    as large (a user's 160 KB map), whose pieces go through the worker's ring of shared memory; the batches
    are those of items of one sample each."""
    from presets import DetectionPresetTrain

    from gputransforms.backends import feed

    chain = v2.Compose([v2.ToImage(), v2.RandomHorizontalFlip(), v2.ToDtype(torch.float32, scale=True)])
    cases = [(wrapped(coco, DetectionPresetTrain(data_augmentation="hflip"), keys=["boxes", "labels", "image_id"]),
              detection_collate, 40, feed.ProcessDecoders.CHUNK),
             (wrapped(coco, chain, keys=["boxes", "labels", "masks", "image_id"]), detection_collate, 40,
              feed.ProcessDecoders.CHUNK_LARGE),
             (_voc_segmentation(voc, chain), detection_collate, 40, feed.ProcessDecoders.CHUNK_LARGE),
             (_voc_segmentation(voc, chain), detection_collate, 5, 5),
             (_HeatDetection(coco, v2.Compose([v2.ToImage(), v2.RandomHorizontalFlip()])), detection_collate, 40,
              feed.ProcessDecoders.CHUNK_LARGE)]
    assert feed.ProcessDecoders.CHUNK_LARGE < feed.ProcessDecoders.CHUNK
    for ds, collate, batch_size, chunk in cases:
        # (the workers' samples draw from the epoch's base seed, which torch's generator gives)
        torch.manual_seed(3)
        loader = DataLoader(ds, batch_size=batch_size, collate_fn=collate, device="cpu", num_workers=1, seed=3)
        it = iter(loader)
        first = next(it)
        assert min(it.slot.decoders.flat.chunk, batch_size) == chunk
        flat = feed._Flat(it.slot.decoders.flat.chunk)
        flat.batches = iter([list(range(batch_size))])
        assert max(len(c[2]) for c in flat) == chunk  # (a chunk never spans two batches)
        del it
        # the same first batch from items of one sample each
        with monkeypatch.context() as m:
            m.setattr(feed.ProcessDecoders, "CHUNK", 1)
            m.setattr(feed.ProcessDecoders, "CHUNK_LARGE", 1)
            torch.manual_seed(3)
            again = next(iter(DataLoader(ds, batch_size=batch_size, collate_fn=collate, device="cpu", num_workers=1,
                                         seed=3)))
        assert all(torch.equal(a, b) for a, b in zip(first[0], again[0]))
        for a, b in zip(first[1], again[1]):
            same_targets(a, b) if isinstance(a, dict) else torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("workers", [0, 2])
def test_every_file_pil_reads_as_torchvisions_detection_dataset(tmp_path, device, workers):
    """A COCO layout of the odd files (grayscale, CMYK and progressive JPEGs, an EXIF rotation, RGBA, palette,
    8- and 16-bit PNGs, BMP, TIFF, WebP, 1x1, 7x5, 4000x50 and 6000x4000 images) under two joint chains (a
    flip and a resize; a flip at full size): every image and its boxes as torchvision's dataset gives them,
    the images within the decoders' parity, the boxes exact."""
    odd = sampledata.make_odd_files(tmp_path / "odd")
    coco = sampledata.write_coco(odd, tmp_path / "coco", seed=1,
                                 suffixes=(".jpg", ".jpeg", ".png", ".bmp", ".tiff", ".webp"))
    chains = [v2.Compose([v2.ToImage(), v2.RandomHorizontalFlip(p=1), v2.Resize((48, 64)),
                          v2.ToDtype(torch.float32, scale=True), v2.SanitizeBoundingBoxes()]),
              v2.Compose([v2.ToImage(), v2.RandomHorizontalFlip(p=1), v2.ToDtype(torch.float32, scale=True)])]
    for chain in chains:
        ds = wrapped(coco, chain, keys=["boxes", "labels", "image_id"])
        loader = DataLoader(ds, batch_size=4, num_workers=workers, collate_fn=detection_collate, device=device)
        ours = [(image, target) for images, targets in loader for image, target in zip(images, targets)]
        assert loader.backend == "dali" and len(ours) == len(ds) == 15
        for k, (image, target) in enumerate(ours):
            want, want_target = ds[k]
            name = ds.dataset.coco.loadImgs(ds.dataset.ids[ds.indices[k]])[0]["file_name"]
            assert image.shape == want.shape and image.dtype == want.dtype, name
            assert (image.cpu() - want).abs().mean() * 255 <= (0.3 if device == "cpu" else 1.0), name
            same_targets(target, want_target)


@pytest.mark.parametrize("device", DEVICES)
def test_ssd_preset_on_a_1x1_image_raises_as_torchvision(tmp_path, device):
    """The ssd preset over the odd files, a 1x1 image among them (RandomIoUCrop's crop of it is 0 px high):
    from the same seed, ours raises torchvision's ZeroDivisionError where its DataLoader does, naming the file,
    or gives its boxes where it does not."""
    odd = sampledata.make_odd_files(tmp_path / "odd")
    coco = sampledata.write_coco(odd, tmp_path / "coco", seed=1)
    ds = wrapped(coco, DetectionPresetTrain(data_augmentation="ssd"))
    outcomes = []
    for cls, kw in ((tud.DataLoader, {}), (DataLoader, dict(device=device))):
        torch.manual_seed(0)
        try:
            outcomes.append([t["boxes"].cpu() for _, targets in cls(ds, batch_size=4, collate_fn=detection_collate, **kw)
                             for t in targets])
        except ZeroDivisionError as e:
            outcomes.append(str(e))
    theirs, ours = outcomes
    if isinstance(theirs, str):
        assert isinstance(ours, str) and "division by zero" in ours and "000007.jpg" in ours  # (the 1x1 image)
    else:
        assert not isinstance(ours, str) and all(torch.equal(a, b) for a, b in zip(ours, theirs))


@pytest.mark.parametrize("device", DEVICES)
def test_a_pil_crop_of_too_many_pixels_raises_as_pil_does(coco, device, monkeypatch):
    """A joint transform on PIL images (the references' default) whose crop is larger than PIL allows: PIL's
    ``Image.crop`` raises DecompressionBombError over twice ``Image.MAX_IMAGE_PIXELS``, as ``open`` does. Ours,
    which crops no PIL image, raises PIL's error where torch's DataLoader does, naming the file."""
    from PIL import Image as PILImage

    chain = v2.Compose([v2.RandomZoomOut(fill=0, side_range=(4.0, 4.0), p=1.0), v2.CenterCrop((1, 1)),
                        v2.PILToTensor(), v2.ToDtype(torch.float32, scale=True)])
    full = wrapped(coco, chain, keys=["boxes", "labels"])
    size = {k: PILImage.open(Path(coco[0]) / full.dataset.coco.loadImgs(full.dataset.ids[i])[0]["file_name"]).size
            for k, i in enumerate(full.indices)}
    small = sorted(size, key=lambda k: size[k][0] * size[k][1])[:8]  # (photos of similar sizes)
    ch, cw = min(4 * size[k][1] for k in small) - 1, min(4 * size[k][0] for k in small) - 1  # (in every canvas)
    chain.transforms[1].size = [ch, cw]
    ds = tud.Subset(full.dataset, [full.indices[k] for k in small])
    loader = DataLoader(ds, batch_size=4, collate_fn=detection_collate, device=device)
    assert "recorded per sample" in loader.explain()
    limit = ch * cw // 2 - 1  # every crop over twice the limit; every photo opens (under twice it)
    assert max(size[k][0] * size[k][1] for k in small) < 2 * limit
    monkeypatch.setattr(PILImage, "MAX_IMAGE_PIXELS", limit)
    errors = []
    for make in (lambda: tud.DataLoader(ds, batch_size=4, collate_fn=detection_collate), lambda: loader):
        with warnings.catch_warnings(), pytest.raises(PILImage.DecompressionBombError) as e:
            warnings.simplefilter("ignore", PILImage.DecompressionBombWarning)  # (opening: over the limit, under twice)
            list(make())
        errors.append(str(e.value))
    theirs, ours = errors
    assert ours.startswith(theirs) and "(sample 0: " in ours
    # a centre crop larger than the image in both sides: torchvision's PIL kernel pads it and crops nothing
    chain.transforms[:2] = [v2.CenterCrop((ch, cw))]
    loader = DataLoader(ds, batch_size=4, collate_fn=detection_collate, device=device)
    assert "recorded per sample" in loader.explain()
    for make in (lambda: tud.DataLoader(ds, batch_size=4, collate_fn=detection_collate), lambda: loader):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", PILImage.DecompressionBombWarning)
            assert [tuple(image.shape) for images, _ in make() for image in images] == [(3, ch, cw)] * len(ds)


@pytest.mark.parametrize("device", DEVICES)
def test_random_split_of_the_references_subset_is_compiled(coco, device):
    """The detection reference's Subset (images with annotations), then ``random_split`` of it into a train and
    a val part (a Subset of a Subset): each part is compiled and gives torchvision's targets, in its order."""
    chain = v2.Compose([v2.ToImage(), v2.RandomHorizontalFlip(p=1), v2.Resize((48, 64)),
                        v2.ToDtype(torch.float32, scale=True), v2.SanitizeBoundingBoxes()])
    train, val = tud.random_split(wrapped(coco, chain), [0.75, 0.25], generator=torch.Generator().manual_seed(1))
    for part in (train, val):
        loader = DataLoader(part, batch_size=4, collate_fn=detection_collate, device=device)
        assert loader.backend == "dali", loader.reason
        ours = [t for _, targets in loader for t in targets]
        assert len(ours) == len(part)
        for k, t in enumerate(ours):
            same_targets(t, part[k][1])


class _TutorialDataset(tud.Dataset):
    """torchvision's object detection finetuning tutorial's PennFudanDataset, restated: the image and its
    instance mask read with torchvision.io.read_image, the masks split by colour, boxes from the masks, the image
    wrapped as a tv_tensors.Image, the target a dict of tv_tensors."""

    def __init__(self, root, transforms):
        self.root, self.transforms = root, transforms
        self.imgs = sorted(os.listdir(os.path.join(root, "PNGImages")))
        self.masks = sorted(os.listdir(os.path.join(root, "PedMasks")))

    def __getitem__(self, idx):
        from torchvision.io import read_image
        from torchvision.ops.boxes import masks_to_boxes

        img = read_image(os.path.join(self.root, "PNGImages", self.imgs[idx]))
        mask = read_image(os.path.join(self.root, "PedMasks", self.masks[idx]))
        obj_ids = torch.unique(mask)[1:]
        masks = (mask == obj_ids[:, None, None]).to(dtype=torch.uint8)
        boxes = masks_to_boxes(masks)
        img = tv_tensors.Image(img)
        target = {"boxes": tv_tensors.BoundingBoxes(boxes, format="XYXY", canvas_size=F.get_size(img)),
                  "masks": tv_tensors.Mask(masks), "labels": torch.ones((len(obj_ids),), dtype=torch.int64),
                  "image_id": idx, "area": (boxes[:, 3] - boxes[:, 1]) * (boxes[:, 2] - boxes[:, 0]),
                  "iscrowd": torch.zeros((len(obj_ids),), dtype=torch.int64)}
        if self.transforms is not None:
            img, target = self.transforms(img, target)
        return img, target

    def __len__(self):
        return len(self.imgs)


def _tutorial_layout(photo_folder, root) -> str:
    """PNG images (the photos, shrunk) and their instance masks (1-3 pedestrians, 1, 2, 3 on 0) as the tutorial
    finds them."""
    rng = np.random.default_rng(0)
    (root / "PNGImages").mkdir(parents=True)
    (root / "PedMasks").mkdir()
    for k, f in enumerate(sorted(Path(photo_folder).rglob("*.jpg"))[:10]):
        with Image.open(f) as im:
            im = im.convert("RGB")
            im.thumbnail((160, 160))
        im.save(root / "PNGImages" / f"FudanPed{k:05d}.png")
        w, h = im.size
        m = np.zeros((h, w), np.uint8)
        for j in range(1, int(rng.integers(1, 4)) + 1):
            x, y = int(rng.integers(0, w - 20)), int(rng.integers(0, h - 30))
            m[y:y + 30, x:x + 20] = j
        Image.fromarray(m).save(root / "PedMasks" / f"FudanPed{k:05d}_mask.png")
    return str(root)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("train,workers", [(True, 0), (False, 2)])
def test_the_detection_tutorials_dataset_compiles(photo_folder, tmp_path, device, train, workers):
    """The object detection finetuning tutorial's Dataset reads its files with torchvision.io.read_image (not
    PIL): it compiles (the image read is found as PIL's opens are; the mask read for real as each sample is
    made), and gives torch's DataLoader's batches from one seed: boxes, masks, labels and ids exactly, the PNG
    images exactly. Before, it ran on torch's DataLoader ("opens no image with PIL.Image.open")."""
    root = _tutorial_layout(photo_folder, tmp_path / "PennFudanPed")
    tf = v2.Compose(([v2.RandomHorizontalFlip(0.5)] if train else []) +
                    [v2.ToDtype(torch.float, scale=True), v2.ToPureTensor()])
    ds = _TutorialDataset(root, tf)

    def batches(cls, **kw):
        torch.manual_seed(2)
        loader = cls(ds, batch_size=2, shuffle=True, num_workers=workers, collate_fn=detection_collate, **kw)
        return loader, [(list(i), list(t)) for _ in range(2) for i, t in loader]

    loader, ours = batches(DataLoader, device=device)
    assert loader.backend == "dali", loader.reason
    _, theirs = batches(tud.DataLoader)
    assert len(ours) == len(theirs) == 10
    for (oi, ot), (ti, tt) in zip(ours, theirs):
        for a, b, ta, tb in zip(oi, ti, ot, tt):
            assert a.shape == b.shape and (a.cpu() - b).abs().max() <= (0 if device == "cpu" else 1 / 255)
            same_targets(ta, tb)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("first", ["tensor", "pil"])
def test_random_containers_inside_a_joint_chain_are_recorded(coco, device, first):
    """RandomChoice, RandomApply and RandomOrder inside the joint Compose are looked into (38838f8): recorded as
    written (they draw which to run), compiled, and torch's boxes and image sizes from one seed. Before, such a
    chain on PIL images ran on torch's DataLoader and one on tensors per sample after the graph."""
    head = [v2.ToImage()] if first == "tensor" else []
    tail = [] if first == "tensor" else [v2.ToImage()]
    chain = v2.Compose(head + [
        v2.RandomChoice([v2.Resize((64, 80)), v2.Resize((96, 72))]),
        v2.RandomApply([v2.RandomHorizontalFlip(1.0), v2.CenterCrop(60)], p=0.5),
        v2.RandomOrder([v2.Resize((70, 70)), v2.CenterCrop(56)])] + tail + [v2.ToDtype(torch.float32, scale=True)])
    ds = wrapped(coco, chain)
    loader = DataLoader(ds, batch_size=4, collate_fn=detection_collate, device=device)
    assert loader.backend == "dali" and "recorded per sample" in loader.explain(), loader.explain()
    ours, theirs = side_by_side(ds, device)
    for (oi, ot), (ti, tt) in zip(ours, theirs):
        for a, b, ta, tb in zip(oi, ti, ot, tt):
            assert a.shape == b.shape and (a.cpu() - b).abs().mean() < (0.01 if device == "cpu" else 0.02)
            same_targets(ta, tb)


def test_a_concat_of_detection_datasets_runs_on_torch_and_says_so(coco):
    tf = v2.Compose([v2.ToImage(), v2.Resize((32, 32))])
    ds = tud.ConcatDataset([wrapped(coco, tf), wrapped(coco, tf)])
    kw = dict(batch_size=4, collate_fn=lambda b: tuple(zip(*b)))
    with pytest.warns(FallbackWarning, match="ConcatDataset of detection or segmentation datasets"):
        loader = DataLoader(ds, device="cpu", **kw)
    assert loader.backend == "torchvision"
    for (ia, ta), (ib, tb) in zip(loader, tud.DataLoader(ds, **kw)):
        assert all(torch.equal(x, y) for x, y in zip(ia, ib))
        for x, y in zip(ta, tb):
            same_targets(x, y)
