"""Class masks decoded without PIL (``gputransforms.png``, ``datasets.mask_targets``): exactly PIL's values for
every 8-bit palette or grey PNG it takes, None for every other file (which PIL then opens, as torchvision
does), and torchvision's wrapped VOCSegmentation target for every mask of the project's VOC layout."""
from __future__ import annotations

import io
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision
from PIL import Image
from torchvision import tv_tensors

from gputransforms import png, sampledata
from gputransforms.datasets import mask_targets


def _chunk(cid: bytes, data: bytes, crc: int = None) -> bytes:
    return struct.pack(">I", len(data)) + cid + data + struct.pack(">I", zlib.crc32(cid + data) if crc is None else crc)


def encoded(img: np.ndarray, filters, *, colour: int = 3, depth: int = 8, interlace: int = 0, splits: int = 2,
            extra: bytes = b"", plte_crc: int = None, before_idat: bytes = b"") -> bytes:
    """A PNG of ``img`` (HxW uint8) with each row's filter chosen (0 None, 1 Sub, 2 Up, 3 Average, 4 Paeth),
    its image data split over ``splits`` IDAT chunks."""
    h, w = img.shape
    rows, prev = [], np.zeros(w, np.int64)
    for y in range(h):
        row = img[y].astype(np.int64)
        left = np.concatenate([[0], row[:-1]])
        upleft = np.concatenate([[0], prev[:-1]])
        f = int(filters[y])
        if f == 0:
            pred = np.zeros(w, np.int64)
        elif f == 1:
            pred = left
        elif f == 2:
            pred = prev
        elif f == 3:
            pred = (left + prev) // 2
        else:
            p = left + prev - upleft
            pa, pb, pc = np.abs(p - left), np.abs(p - prev), np.abs(p - upleft)
            pred = np.where((pa <= pb) & (pa <= pc), left, np.where(pb <= pc, prev, upleft))
        rows.append(bytes([f]) + ((row - pred) % 256).astype(np.uint8).tobytes())
        prev = row
    z = zlib.compress(b"".join(rows) + extra)
    cut = np.linspace(0, len(z), splits + 1).astype(int)
    out = png.SIGNATURE + _chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, depth, colour, 0, 0, interlace))
    if colour == 3:
        out += _chunk(b"PLTE", bytes(range(256)) * 3, plte_crc)
    out += before_idat
    out += b"".join(_chunk(b"IDAT", z[a:b]) for a, b in zip(cut[:-1], cut[1:]))
    return out + _chunk(b"IEND", b"")


def pils(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as img:
        return np.asarray(img)


@pytest.fixture(params=["zlib-ng", "zlib"])
def inflate(request, monkeypatch):
    """Both inflates: zlib-ng's where installed, and the standard library's."""
    if request.param == "zlib-ng":
        zlib_ng = pytest.importorskip("zlib_ng.zlib_ng")
        monkeypatch.setattr(png, "inflate", zlib_ng.decompress)
    else:
        monkeypatch.setattr(png, "inflate", zlib.decompress)
    return request.param


def test_rows_of_every_filter_png_takes_are_pils(inflate):
    """Random images, grey and palette, every row's filter None, Sub or Up at random (runs of Up rows from the
    first row and after others): the values are the image's and PIL's. A wrong undoing of Sub or of a run of
    Up rows fails it."""
    rng = np.random.default_rng(0)
    for trial in range(300):
        h, w = (int(v) for v in rng.integers(1, 24, 2))
        img = rng.integers(0, 256, (h, w)).astype(np.uint8)
        filters = rng.choice(3, h, p=[0.2, 0.3, 0.5]) if trial % 3 else np.full(h, trial % 2 * 2)
        data = encoded(img, filters, colour=int(rng.choice([0, 3])), splits=int(rng.integers(1, 4)))
        ours = png.values(data)
        assert ours is not None and ours.dtype == np.uint8, (trial, filters)
        assert np.array_equal(ours, img) and np.array_equal(ours, pils(data)), (trial, filters)


def test_pils_own_palette_pngs_and_the_voc_layouts_masks_are_pils(photo_folder, tmp_path, inflate):
    """Every class mask of the project's VOC layout (palette PNGs written by PIL), and PIL's palette PNGs of
    other content: PIL's values."""
    root = sampledata.write_voc(photo_folder, tmp_path, seed=4)
    masks = sorted((root / "VOCdevkit" / "VOC2012" / "SegmentationClass").glob("*.png"))
    assert len(masks) >= 40
    for m in masks:
        data = m.read_bytes()
        ours = png.values(data)
        assert ours is not None and np.array_equal(ours, pils(data)), m
    rng = np.random.default_rng(1)
    for shape in ((1, 1), (3, 500), (375, 500)):
        b = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, shape).astype(np.uint8), mode="L").convert("P").save(b, "PNG")
        assert np.array_equal(png.values(b.getvalue()), pils(b.getvalue()))


def test_every_other_png_is_pils_to_open(tmp_path, monkeypatch):
    """What ``png`` leaves to PIL (None): Average and Paeth rows, other bit depths and colour types, interlacing,
    an animated PNG, a broken checksum before the image data (PIL raises), a stream truncated, one that inflates
    to more or fewer bytes than the rows, a filter byte beyond 4, an image above PIL's pixel limit, a file that
    is no PNG, and PIL's own grey PNGs (written with Paeth rows)."""
    rng = np.random.default_rng(2)
    img = rng.integers(0, 256, (9, 7)).astype(np.uint8)
    zero = np.zeros(9, int)
    assert png.values(encoded(img, zero)) is not None
    for f in (3, 4):
        assert png.values(encoded(img, np.where(np.arange(9) == 4, f, 0))) is None
    for colour, depth in ((3, 4), (0, 16), (2, 8), (4, 8), (6, 8), (0, 1)):
        assert png.values(encoded(img, zero, colour=colour, depth=depth)) is None
    assert png.values(encoded(img, zero, interlace=1)) is None
    assert png.values(encoded(img, zero, before_idat=_chunk(b"acTL", struct.pack(">II", 1, 0)))) is None
    broken = encoded(img, zero, plte_crc=1)
    assert png.values(broken) is None
    with pytest.raises(Image.UnidentifiedImageError):  # (PIL: a broken PNG file)
        pils(broken)
    whole = encoded(img, zero, splits=1)
    cut = whole.index(b"IDAT") + 4 + 20
    assert png.values(whole[:cut] + whole[-12:]) is None
    assert png.values(encoded(img, zero, extra=b"\0" * 8)) is None
    two = encoded(img, zero, splits=2)  # another chunk between the two IDATs: PIL reads no further, and raises
    second = two.index(b"IDAT", two.index(b"IDAT") + 4) - 4
    between = two[:second] + _chunk(b"tEXt", b"a\0b") + two[second:]
    assert png.values(between) is None
    with pytest.raises(OSError):
        pils(between)
    narrower = _chunk(b"IHDR", struct.pack(">IIBBBBB", 6, 9, 8, 3, 0, 0, 0))  # (the rows are 7 wide)
    assert png.values(png.SIGNATURE + narrower + encoded(img, zero)[8 + len(narrower):]) is None
    whole = encoded(img, zero, splits=1)  # a row whose filter byte is 5 (PIL raises)
    raw = b"".join(bytes([5 if y == 3 else 0]) + img[y].tobytes() for y in range(9))
    bad_filter = whole[:whole.index(b"IDAT") - 4] + _chunk(b"IDAT", zlib.compress(raw)) + _chunk(b"IEND", b"")
    assert png.values(bad_filter) is None
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 62)  # (9 x 7 = 63 pixels)
    assert png.values(encoded(img, zero)) is None
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 63)
    assert png.values(encoded(img, zero)) is not None
    assert png.values(b"GIF89a" + bytes(40)) is None and png.values(b"") is None
    b = io.BytesIO()
    Image.fromarray(np.cumsum(rng.integers(0, 3, (40, 50)), axis=1).astype(np.uint8), mode="L").save(b, "PNG")
    assert png.values(b.getvalue()) is None


def _wrapped(root, transforms=None):
    return torchvision.datasets.wrap_dataset_for_transforms_v2(torchvision.datasets.VOCSegmentation(
        str(root), year="2012", image_set="train", transforms=transforms))


def test_the_wrapped_voc_segmentations_mask_is_torchvisions(photo_folder, tmp_path):
    """``mask_targets``' mask for every sample of the project's VOC layout is the wrapper's own target: a
    ``tv_tensors.Mask`` of the same shape, dtype and values. A mask ``png`` does not take (saved by PIL as a grey
    PNG, Paeth rows) or that cannot be read is left to the wrapper (None); a wrapper that is not torchvision's
    VOCSegmentation one gets no maker."""
    root = sampledata.write_voc(photo_folder, tmp_path, seed=4)
    ds = _wrapped(root)
    make = mask_targets.maker(ds)
    assert make is not None
    for k in range(len(ds)):
        ours, theirs = make(k), ds[k][1]
        assert type(ours) is type(theirs) is tv_tensors.Mask
        assert ours.shape == theirs.shape and ours.dtype == theirs.dtype == torch.uint8 and ours.ndim == 3
        assert torch.equal(ours, theirs), k
    masks = ds._dataset.masks
    with Image.open(masks[1]) as m:
        m.convert("L").save(masks[1])
    assert make(1) is None and make(0) is not None
    with open(masks[2], "r+b") as f:
        f.truncate(0)
    assert make(2) is None
    assert mask_targets.maker(ds._dataset) is None
    voc_detection = torchvision.datasets.wrap_dataset_for_transforms_v2(torchvision.datasets.VOCDetection(
        str(root), year="2012", image_set="train"))
    assert mask_targets.maker(voc_detection) is None


@pytest.mark.parametrize("types", ["segmentation", ["category", "segmentation"], ["segmentation", "binary-category"]])
def test_the_wrapped_oxford_pets_target_is_torchvisions(tmp_path, types):
    """``mask_targets``' target for the wrapped OxfordIIITPet with its trimaps among its target types is the
    wrapper's own, for each sample: the trimap alone, or a tuple with the labels in the types' order. Trimaps
    ``png`` does not take (grey PNGs with Paeth rows, as PIL writes them) are left to the wrapper; without
    trimaps there is no maker."""
    rows = ["Abyssinian_1 1 1 1", "basset_hound_3 3 2 2", "Bengal_4 2 1 2", "beagle_5 4 2 3"]
    base = tmp_path / "oxford-iiit-pet"
    (base / "annotations" / "trimaps").mkdir(parents=True)
    (base / "annotations" / "trainval.txt").write_text("\n".join(rows) + "\n")
    (base / "images").mkdir()
    rng = np.random.default_rng(3)
    for k, r in enumerate(rows):
        name = r.split()[0]
        h, w = (int(v) for v in rng.integers(20, 60, 2))
        Image.fromarray(rng.integers(0, 256, (h, w, 3)).astype(np.uint8)).save(base / "images" / f"{name}.jpg")
        trimap = Image.fromarray(rng.integers(1, 4, (h, w)).astype(np.uint8))
        (trimap.convert("P") if k != 2 else trimap).save(base / "annotations" / "trimaps" / f"{name}.png")
    ds = torchvision.datasets.wrap_dataset_for_transforms_v2(torchvision.datasets.OxfordIIITPet(
        str(tmp_path), split="trainval", target_types=types))
    make = mask_targets.maker(ds)
    assert make is not None
    made = 0
    for k in range(len(ds)):
        ours, theirs = make(k), ds[k][1]
        if ours is None:
            assert k == 2
            continue
        made += 1
        ours, theirs = (ours, theirs) if isinstance(theirs, tuple) else ((ours,), (theirs,))
        assert type(ours) is tuple and len(ours) == len(theirs)
        for a, b in zip(ours, theirs):
            assert type(a) is type(b)
            assert torch.equal(a, b) and a.dtype == b.dtype if isinstance(b, torch.Tensor) else a == b
    assert made == 3
    assert mask_targets.maker(torchvision.datasets.wrap_dataset_for_transforms_v2(torchvision.datasets.OxfordIIITPet(
        str(tmp_path), split="trainval", target_types="category"))) is None


@pytest.mark.parametrize("workers", [0, 2])
def test_a_broken_mask_raises_torchvisions_error_naming_the_mask(photo_folder, tmp_path, workers):
    """A class mask cut short: ``png`` leaves it to PIL, and the loader raises torchvision's error (its type and
    message, as torch's DataLoader raises it), naming the sample, its image and the mask's file."""
    import torch.utils.data as tud
    from presets import SegmentationPresetTrain, segmentation_collate

    from gputransforms import DataLoader

    root = sampledata.write_voc(photo_folder, tmp_path, seed=4)
    mask = sorted((root / "VOCdevkit" / "VOC2012" / "SegmentationClass").glob("*.png"))[5]
    mask.write_bytes(mask.read_bytes()[:len(mask.read_bytes()) // 2])
    ds = _wrapped(root, SegmentationPresetTrain(base_size=64, crop_size=48))
    with pytest.raises(OSError) as theirs:
        list(tud.DataLoader(ds, batch_size=4, collate_fn=segmentation_collate, num_workers=workers))
    with pytest.raises(OSError) as ours:
        list(DataLoader(ds, batch_size=4, collate_fn=segmentation_collate, num_workers=workers, device="cpu"))
    assert type(ours.value) is type(theirs.value)
    assert "image file is truncated" in str(ours.value) + "".join(getattr(ours.value, "__notes__", []))
    assert f"its target {mask}" in str(ours.value), str(ours.value)


@pytest.mark.parametrize("kind,workers", [("mask", 0), ("mask", 2), ("xml", 2)])
def test_a_broken_mask_or_annotation_is_skipped_when_asked(photo_folder, tmp_path, kind, workers):
    """With ``on_error="skip"`` a sample whose target cannot be made (VOC's class mask cut short, VOCDetection's XML
    annotation cut short) is left out and listed (``loader.skipped``: the sample, its image, the target's file
    named in the reason), as a bad image is; every other sample comes as torch's DataLoader gives it, in two
    epochs. It raised, whatever ``on_error`` said."""
    from torchvision.transforms import v2

    import gputransforms
    from gputransforms import DataLoader

    root = sampledata.write_voc(photo_folder, tmp_path, seed=4)
    base = root / "VOCdevkit" / "VOC2012"
    bad = sorted((base / ("SegmentationClass" if kind == "mask" else "Annotations")).glob("*"))[5]
    bad.write_bytes(bad.read_bytes()[:len(bad.read_bytes()) // 2])
    chain = v2.Compose([v2.ToImage(), v2.Resize(64), v2.CenterCrop(60), v2.RandomHorizontalFlip(1.0),
                        v2.ToDtype(torch.float32, scale=True)])
    inner = torchvision.datasets.VOCSegmentation(str(root), year="2012", image_set="train", transforms=chain) \
        if kind == "mask" else torchvision.datasets.VOCDetection(str(root), year="2012", image_set="train",
                                                                  transforms=chain)
    ds = torchvision.datasets.wrap_dataset_for_transforms_v2(inner)
    k = [p.stem for p in map(Path, inner.masks if kind == "mask" else inner.annotations)].index(bad.stem)
    loader = DataLoader(ds, batch_size=5, num_workers=workers, on_error="skip", collate_fn=lambda b: tuple(zip(*b)),
                        device="cpu")
    theirs = [ds[i] for i in range(len(ds)) if i != k]
    for _ in range(2):
        with pytest.warns(gputransforms.SkippedSamplesWarning):
            ours = [s for images, targets in loader for s in zip(images, targets)]
        assert [(e.index, e.path) for e in loader.skipped] == [(k, inner.images[k])]
        assert str(bad) in loader.skipped[0].reason
        assert len(ours) == len(theirs) == len(ds) - 1
        for (x, t), (xt, tt) in zip(ours, theirs):
            assert (x - xt).abs().mean() < 1 / 255
            if kind == "mask":
                assert type(t) is tv_tensors.Mask and torch.equal(t, tt)
            else:
                assert torch.equal(t["boxes"], tt["boxes"]) and torch.equal(t["labels"], tt["labels"])
