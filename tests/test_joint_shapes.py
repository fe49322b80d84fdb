"""A user's own detection or segmentation Dataset that calls its v2 joint transform on one structure (a dict
sample, an ``(image, target)`` tuple as one argument) or returns its output in another shape (a longer tuple,
parts of a dict): compiled, and side by side with torch's DataLoader the same samples."""
from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.utils.data as tud
from PIL import Image
from torchvision import tv_tensors
from torchvision.io import read_image
from torchvision.transforms import v2

from gputransforms import BadSampleError, DataLoader, FallbackWarning, SkippedSamplesWarning, sampledata

from test_detection import UserSegmentation

pytest.importorskip("pycocotools")

DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("gpu", id="gpu", marks=pytest.mark.gpu)]


@pytest.fixture(scope="module")
def coco(photo_folder, tmp_path_factory):
    return sampledata.write_coco(photo_folder, tmp_path_factory.mktemp("coco"), seed=2)


@pytest.fixture(scope="module")
def voc(photo_folder, tmp_path_factory):
    return sampledata.write_voc(photo_folder, tmp_path_factory.mktemp("voc"), seed=4)


class _Detection(tud.Dataset):
    """Files and XYWH boxes from the COCO json, as a user's Dataset reads them; ``__getitem__`` per subclass."""

    def __init__(self, coco, transforms):
        data = json.loads(Path(coco[1]).read_text())
        anns: dict = {}
        for a in data["annotations"]:
            anns.setdefault(a["image_id"], []).append(a)
        self.items = [(str(Path(coco[0]) / im["file_name"]), [a["bbox"] for a in anns[im["id"]]],
                       [a["category_id"] for a in anns[im["id"]]]) for im in data["images"] if im["id"] in anns]
        self.transforms = transforms

    def __len__(self):
        return len(self.items)

    def boxes(self, i, size):
        return tv_tensors.BoundingBoxes(self.items[i][1], format="XYWH", canvas_size=size)


class DictSample(_Detection):
    """torchvision's v2 "getting started" shape: one dict of the image and its targets through the transform."""

    def __getitem__(self, i):
        img = Image.open(self.items[i][0]).convert("RGB")
        sample = {"image": img, "boxes": self.boxes(i, (img.height, img.width)),
                  "labels": torch.tensor(self.items[i][2])}
        return self.transforms(sample)


class TupleArgument(_Detection):
    """The image read by torchvision.io as a tv_tensors.Image, ``(image, target)`` handed over as one tuple."""

    def __getitem__(self, i):
        img = tv_tensors.Image(read_image(self.items[i][0]))
        target = {"boxes": self.boxes(i, tuple(img.shape[-2:])), "labels": torch.tensor(self.items[i][2]),
                  "image_id": i}
        return self.transforms((img, target))


class WithIndex(_Detection):
    """``transforms(image, target)`` unpacked, the target given another key, returned with the index."""

    def __getitem__(self, i):
        img = Image.open(self.items[i][0]).convert("RGB")
        img, target = self.transforms(img, {"boxes": self.boxes(i, (img.height, img.width)),
                                            "labels": torch.tensor(self.items[i][2])})
        target["path"] = self.items[i][0]
        return img, target, i


class ReadsTheBoxes(DictSample):
    """Does arithmetic on what the transform returned: it cannot be found without running the transform."""

    def __getitem__(self, i):
        out = super().__getitem__(i)
        return out["image"], {"boxes": out["boxes"], "n": len(out["boxes"])}


class _Seg(UserSegmentation):
    """The VOC layout's images and masks, as test_detection's user Dataset finds them; ``__getitem__`` per
    subclass."""


class SegDict(_Seg):
    """Image and mask in a dict through the transform, the pair picked out of its output."""

    def __getitem__(self, i):
        img = Image.open(self.images[i]).convert("RGB")
        mask = tv_tensors.Mask(torch.from_numpy(np.array(Image.open(self.masks[i]))))
        out = self.transforms({"image": img, "mask": mask})
        return out["image"], out["mask"]


def _tzip(batch):
    return tuple(zip(*batch))


def _as_list(batch):
    return batch


DETECTION = v2.Compose([v2.ToImage(), v2.RandomHorizontalFlip(), v2.RandomIoUCrop(), v2.Resize((96, 128)),
                        v2.ClampBoundingBoxes(), v2.SanitizeBoundingBoxes(), v2.ToDtype(torch.float32, scale=True)])


def _same(ours, theirs, device, at=""):
    """Samples as torch's: the same nesting and types, targets exactly, images within the image path's parity."""
    assert type(ours) is type(theirs), (at, type(ours), type(theirs))
    if isinstance(theirs, dict):
        assert list(ours) == list(theirs), at
        for k in theirs:
            _same(ours[k], theirs[k], device, f"{at}[{k!r}]")
    elif isinstance(theirs, (tuple, list)):
        assert len(ours) == len(theirs), at
        for k, (a, b) in enumerate(zip(ours, theirs)):
            _same(a, b, device, f"{at}[{k}]")
    elif isinstance(theirs, tv_tensors.Image) or (isinstance(theirs, torch.Tensor) and theirs.is_floating_point()
                                                   and theirs.ndim == 3):
        assert ours.shape == theirs.shape and (ours.device.type == "cuda") == (device == "gpu"), at
        assert (ours.cpu().float() - theirs.float()).abs().mean() < (0.5 if device == "cpu" else 3.0) / 255, at
    elif isinstance(theirs, torch.Tensor):
        assert ours.dtype == theirs.dtype and torch.equal(ours.cpu(), theirs), at
    else:
        assert ours == theirs, at


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cls", [DictSample, TupleArgument, WithIndex])
def test_a_joint_call_of_another_shape_is_compiled_as_torchvision_runs_it(coco, device, cls):
    """The transform's random draws (flip, IoU crop) are torchvision's, taken in the same order: from one seed
    the same boxes, labels and keys as torch's DataLoader, sample by sample; with 2 workers every sample once,
    in the dataset's own shape."""
    ds = cls(coco, DETECTION)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        loader = DataLoader(ds, batch_size=4, collate_fn=_as_list, device=device)
    assert loader.backend == "dali", loader.reason
    plan = loader.explain()
    assert "recorded per sample" in plan and "each sample is made as it returns it" in plan, plan
    assert ("on one dict holding the image at ['image']" in plan) == (cls is DictSample)
    torch.manual_seed(5)
    ours = [s for b in loader for s in b]
    torch.manual_seed(5)
    theirs = [s for b in tud.DataLoader(ds, batch_size=4, collate_fn=_as_list) for s in b]
    assert len(ours) == len(theirs) == len(ds) > 30
    for k, (a, b) in enumerate(zip(ours, theirs)):
        _same(a, b, device, f"sample {k}")
    # the flip and the crop drew differently across samples (not an identity chain)
    assert len({tuple(s["boxes"].shape) if isinstance(s, dict) else tuple(s[1]["boxes"].shape) for s in theirs}) > 3
    seen = [s for b in DataLoader(ds, batch_size=4, collate_fn=_as_list, device=device, num_workers=2, shuffle=True)
            for s in b]
    assert len(seen) == len(ds) and all(type(s) is type(theirs[0]) for s in seen)
    if cls is WithIndex:
        assert sorted(s[2] for s in seen) == list(range(len(ds)))


@pytest.mark.parametrize("device", DEVICES)
def test_a_segmentation_dict_picked_apart_is_compiled_with_default_collate(voc, device):
    chain = v2.Compose([v2.RandomResize(100, 200), v2.RandomCrop(96, pad_if_needed=True,
                                                                  fill={tv_tensors.Mask: 255, "others": 0}),
                        v2.RandomHorizontalFlip(), v2.ToImage(), v2.ToDtype(torch.float32, scale=True)])
    ds = SegDict(voc, chain)
    loader = DataLoader(ds, batch_size=8, device=device)
    assert loader.backend == "dali", loader.reason
    torch.manual_seed(2)
    ours = list(loader)
    torch.manual_seed(2)
    theirs = list(tud.DataLoader(ds, batch_size=8))
    assert len(ours) == len(theirs) > 2
    for (x, m), (xt, mt) in zip(ours, theirs):
        assert type(x) is type(xt) and type(m) is type(mt) and m.dtype == mt.dtype
        assert torch.equal(m.cpu(), mt) and (mt == 255).any()
        assert (x.cpu() - xt).abs().mean() < (0.5 if device == "cpu" else 3.0) / 255


def test_a_joint_call_that_reads_the_output_or_has_steps_of_its_own_runs_as_written(coco):
    """Arithmetic on what the transform returned, and one structure through a step of the user's own (what it
    returns for it is its own): torch's DataLoader, with the reason, and the same samples."""

    class Mine(v2.Transform):
        def transform(self, inpt, params):
            return inpt

    for ds, reason in ((ReadsTheBoxes(coco, DETECTION), "does something to the image or the target"),
                       (DictSample(coco, v2.Compose([v2.ToImage(), Mine()])), "not every step of it")):
        with pytest.warns(FallbackWarning):
            loader = DataLoader(ds, batch_size=4, collate_fn=_tzip)
        assert loader.backend == "torchvision" and reason in loader.reason, loader.reason
        torch.manual_seed(1)
        ours = list(loader)
        torch.manual_seed(1)
        theirs = list(tud.DataLoader(ds, batch_size=4, collate_fn=_tzip))
        _same(ours, theirs, "cpu")


class _BadMask(_Seg):
    """Image and mask opened with PIL, the mask handed over as a tv_tensors.Mask (one mask file is garbage)."""

    def __getitem__(self, i):
        img = Image.open(self.images[i]).convert("RGB")
        mask = tv_tensors.Mask(torch.from_numpy(np.array(Image.open(self.masks[i]))))
        return self.transforms(img, mask)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_file_pil_cannot_open_is_named_or_skipped_not_a_fallback(coco, voc, tmp_path, workers):
    """A bad file among a user's samples (its header unreadable: the probe cannot learn its size) used to send
    the whole Dataset to torch's DataLoader. It stays compiled: the loop raises a BadSampleError naming the
    file, where torch's raises PIL's OSError; with on_error="skip" the other samples come, once each, and
    the file is reported. The same for a mask file, which the loader reads where the sample is made."""
    garbage = b"\xff\xd8\xff\xe0" + b"not a jpeg" * 20
    det = DictSample(coco, DETECTION)
    bad = tmp_path / "bad.jpg"
    bad.write_bytes(garbage)
    det.items[0] = (str(bad),) + det.items[0][1:]
    seg = _BadMask(voc, v2.Compose([v2.ToImage(), v2.Resize((40, 40)), v2.ToDtype(torch.float32, scale=True)]))
    bad_mask = tmp_path / "bad.png"
    bad_mask.write_bytes(b"\x89PNG\r\n\x1a\n" + b"not a png" * 20)
    seg.masks[1] = bad_mask
    for ds, path, collate in ((det, bad, _as_list), (seg, bad_mask, None)):
        kw = dict(batch_size=4, num_workers=workers, **({"collate_fn": collate} if collate else {}))
        with pytest.raises(OSError):
            list(tud.DataLoader(ds, **kw))
        with warnings.catch_warnings():
            warnings.simplefilter("error", FallbackWarning)
            loader = DataLoader(ds, device="cpu", **kw)
        assert loader.backend == "dali", loader.reason
        assert "recorded per sample" in loader.explain()
        with pytest.raises(BadSampleError, match=str(path)):
            list(loader)
        with pytest.warns(SkippedSamplesWarning):
            loader = DataLoader(ds, device="cpu", on_error="skip", **kw)
            n = sum(len(b) if collate else len(b[0]) for b in loader)
        assert n == len(ds) - 1 and [s.path for s in loader.skipped] == [str(path)]


class _MaskFromPixels(_Seg):
    """Opens its mask, then keeps only the pixels where the image is bright: a target made from the image."""

    def __getitem__(self, i):
        img = Image.open(self.images[i]).convert("RGB")
        mask = np.array(Image.open(self.masks[i])) * (np.asarray(img).mean(-1) > 100)
        return self.transforms(img, tv_tensors.Mask(torch.from_numpy(mask.astype(np.uint8))))


def test_a_target_made_from_the_pixels_beside_a_mask_file_is_seen(voc):
    """Where __getitem__ opens a mask too, its targets are made again per sample (the image black): the check
    on the real pixels compared that re-run with itself, and such a Dataset compiled with black-image targets.
    It now runs on torch's DataLoader, with the reason."""
    ds = _MaskFromPixels(voc, v2.Compose([v2.ToImage(), v2.Resize((40, 40))]))
    with pytest.warns(FallbackWarning, match="makes its target from the image's pixels"):
        loader = DataLoader(ds, batch_size=4, device="cpu")
    assert loader.backend == "torchvision"


def test_a_first_file_that_fails_to_decode_is_named_when_read_not_when_the_loader_is_made(coco, tmp_path):
    """The check on the real pixels decodes the first file: a truncated one (its header intact) raised PIL's
    OSError from DataLoader(...), where torch's loader raises only when the sample is read. The check now
    takes the next file; the sample is named when read, or skipped."""
    det = DictSample(coco, DETECTION)
    data = Path(det.items[0][0]).read_bytes()
    bad = tmp_path / "truncated.jpg"
    bad.write_bytes(data[:len(data) // 3])
    det.items[0] = (str(bad),) + det.items[0][1:]
    with pytest.raises(OSError):
        list(tud.DataLoader(det, batch_size=4, collate_fn=_as_list))
    loader = DataLoader(det, batch_size=4, collate_fn=_as_list, device="cpu")
    assert loader.backend == "dali", loader.reason
    with pytest.raises(BadSampleError, match="truncated.jpg"):
        list(loader)
    with pytest.warns(SkippedSamplesWarning):
        assert sum(len(b) for b in DataLoader(det, batch_size=4, collate_fn=_as_list, device="cpu",
                                              on_error="skip")) == len(det) - 1
