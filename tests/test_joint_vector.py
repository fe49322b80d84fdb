"""A worker's chunk of detection samples recorded at once (compiler/joint_vector.py, #34): each sample's record,
target and output type exactly what torchvision's own forward records with the chunk's parameters; the parameters
distributed as torchvision draws them; and through the loader, with workers, every sample once and the same
epoch from the same seed whatever the chunks."""
from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest
import torch
import torch.utils.data as tud
import torchvision
from presets import DetectionPresetTrain, detection_collate
from torchvision import tv_tensors
from torchvision.transforms import v2

from gputransforms import DataLoader, FallbackWarning, sampledata
from gputransforms.backends import arena, feed
from gputransforms.compiler import joint, joint_vector
from gputransforms.compiler.registry import vector_of
from gputransforms.datasets import pickled

FILL = {tv_tensors.Mask: 0, "others": (123.0, 117.0, 104.0)}
TAIL = [v2.ToDtype(torch.float32, scale=True), v2.ConvertBoundingBoxFormat(tv_tensors.BoundingBoxFormat.XYXY),
        v2.SanitizeBoundingBoxes(), v2.ToPureTensor()]
HEADS = {"image": [v2.ToImage()], "tensor": [v2.PILToTensor()], "pil": []}


def chains(head: list, kind: str) -> dict:
    """The detection references' random geometry (lsj as torchvision's classes spell it, multiscale, hflip)
    and crops that pad or raise, each after ``head`` and before the references' tail."""
    to_image = [v2.ToImage()] if kind == "pil" else []
    return {
        "lsj": v2.Compose(head + [v2.ScaleJitter(target_size=(160, 200), antialias=True),
                                  v2.RandomCrop(160, pad_if_needed=True, fill=FILL), v2.RandomHorizontalFlip(0.5)]
                          + to_image + TAIL),
        "multiscale": v2.Compose(head + [v2.RandomShortestSize([60, 90, 120], max_size=200),
                                         v2.RandomHorizontalFlip(0.5)] + to_image + TAIL),
        "crop": v2.Compose(head + [v2.RandomCrop((90, 120), padding=[3, 5]), v2.RandomVerticalFlip(0.7),
                                   v2.RandomHorizontalFlip(0.3)] + to_image + TAIL),
        "untouched": v2.Compose(head + [v2.RandomHorizontalFlip(0.5)] + to_image + [
            v2.ToDtype(torch.float32, scale=True), v2.ToPureTensor()]),
        "boxes kept": v2.Compose(head + [v2.RandomShortestSize([80, 100]), v2.RandomCrop(90, pad_if_needed=True),
                                         v2.RandomHorizontalFlip(0.5)] + to_image + [v2.ToDtype(torch.float32)]),
    }


def sample(rng: np.random.Generator, fmt) -> tuple:
    """A canvas and a target of boxes (some outside the canvas, some degenerate) as the COCO wrapper makes them."""
    h, w = int(rng.integers(40, 400)), int(rng.integers(40, 400))
    n = int(rng.integers(0, 7))
    xy = rng.uniform(-20, [w, h], size=(n, 2))
    wh = rng.uniform(0, [w * 0.7, h * 0.7], size=(n, 2)) * (rng.random((n, 1)) > 0.1)
    b = np.concatenate([xy, xy + wh if fmt == "XYXY" else wh], axis=1).astype(np.float32)
    target = {"boxes": tv_tensors.BoundingBoxes(torch.from_numpy(b), format=fmt, canvas_size=(h, w)),
              "labels": torch.from_numpy(rng.integers(1, 5, n)), "image_id": int(rng.integers(1, 1000)),
              "iscrowd": torch.zeros(n, dtype=torch.int64)}
    return (h, w), target


def forced(chain: v2.Compose, params: list) -> v2.Compose:
    """A copy of ``chain`` whose random classes take ``params`` (one dict per random class, in order) instead
    of drawing: the draws' classes return them from make_params, a flip has p 1 or 0, and a class of the user's
    runs from the seed the chunk gave its sample."""
    out = copy.deepcopy(chain)
    drawn = iter(params)
    for t in out.transforms:
        if isinstance(t, (v2.ScaleJitter, v2.RandomShortestSize, v2.RandomResize)):
            size = next(drawn)["size"]
            size = [size] if isinstance(t, v2.RandomResize) else size
            t.make_params = lambda flat, size=size: {"size": size}
        elif _users(type(t)):
            seed, forward = next(drawn)["seed"], t.forward

            def seeded(*inputs, seed=seed, forward=forward):
                torch.default_generator.manual_seed(seed)
                return forward(*inputs)
            t.forward = seeded
        elif isinstance(t, v2.RandomCrop):
            p = dict(next(drawn))
            t.make_params = lambda flat, p=p: p
        elif isinstance(t, (v2.RandomHorizontalFlip, v2.RandomVerticalFlip)):
            t.p = 1.0 if next(drawn)["flipped"] else 0.0
    assert next(drawn, None) is None
    return out


def _users(cls) -> bool:
    from gputransforms.datasets.detection import _users_class

    return _users_class(cls)


@pytest.mark.parametrize("kind", ["image", "tensor", "pil"])
@pytest.mark.parametrize("name", ["lsj", "multiscale", "crop", "untouched", "boxes kept"])
@pytest.mark.parametrize("fmt", ["XYXY", "XYWH"])
def test_a_chunk_is_what_torchvision_records_with_its_parameters(kind, name, fmt):
    chain = chains(HEADS[kind], kind)[name]
    steps = joint_vector.plan(chain, vector_of)
    assert steps is not None
    rng = np.random.default_rng(hash((kind, name, fmt)) % 2 ** 32)
    samples = [sample(rng, fmt) for _ in range(40)]
    u = joint_vector.uniforms(list(range(100, 140)), sum(v.draws for _, v in steps))
    params: list = []
    got = joint_vector.record(steps, kind, [s for s, _ in samples], [copy.deepcopy(t) for _, t in samples], u, params)
    drawn = iter(params)
    left = 0
    for (size, target), ours in zip(samples, got):
        if ours is None:  # only a sample torchvision raises for (the crop larger than the padded image) is left
            left += 1
            assert name == "crop" and (size[0] + 10 < 90 or size[1] + 6 < 120)
            with pytest.raises(ValueError):
                joint.record(chain, size, copy.deepcopy(target), kind)
            continue
        theirs = joint.record(forced(chain, next(drawn)), size, copy.deepcopy(target), kind)
        assert joint.same(ours[0], theirs[0]), (ours[0], theirs[0])
        assert joint.same(ours[1], theirs[1]), (ours[1], theirs[1])
        assert ours[2] == theirs[2]
    assert next(drawn, None) is None
    assert left == 0 or name == "crop"


def test_a_chunks_records_do_not_depend_on_the_chunk():
    """A sample's draws come from its own seed: recorded alone, or in another chunk, it is the same."""
    chain = chains(HEADS["image"], "image")["lsj"]
    steps = joint_vector.plan(chain, vector_of)
    rng = np.random.default_rng(3)
    samples = [sample(rng, "XYWH") for _ in range(12)]
    draws = sum(v.draws for _, v in steps)

    def run(part):
        return joint_vector.record(steps, "image", [samples[k][0] for k in part],
                                   [copy.deepcopy(samples[k][1]) for k in part],
                                   joint_vector.uniforms([50 + k for k in part], draws))

    whole = run(range(12))
    parts = run(range(7, 12)) + run(range(7))
    for k, a in enumerate(whole):
        b = parts[(k - 7) % 12] if k >= 7 else parts[5 + k]
        assert joint.same(a[0], b[0]) and joint.same(a[1], b[1])
    assert len({str(r[0]) for r in whole}) > 6  # (the samples drew differently)


def _ks(a: np.ndarray, b: np.ndarray) -> float:
    """The two-sample Kolmogorov-Smirnov statistic."""
    values = np.sort(np.concatenate([a, b]))
    return float(np.abs(np.searchsorted(np.sort(a), values, side="right") / len(a) -
                        np.searchsorted(np.sort(b), values, side="right") / len(b)).max())


def test_the_chunks_parameters_are_distributed_as_torchvisions_draws():
    """Over 4,000 samples of one size, the scale jitter's sizes, the crop's offsets and the flip's coin against
    torchvision's own make_params and coin (two-sample KS at p = 0.001, the coin within 4 standard deviations)."""
    n, size = 4000, (300, 420)
    jitter = v2.ScaleJitter(target_size=(160, 200), scale_range=(0.3, 1.7))
    crop = v2.RandomCrop((150, 150), pad_if_needed=True)
    flip = v2.RandomHorizontalFlip(0.3)
    chain = v2.Compose([v2.ToImage(), jitter, crop, flip])
    steps = joint_vector.plan(chain, vector_of)
    target = {"boxes": tv_tensors.BoundingBoxes(torch.zeros(0, 4), format="XYXY", canvas_size=size),
              "labels": torch.zeros(0, dtype=torch.int64)}
    params: list = []
    joint_vector.record(steps, "image", [size] * n, [target] * n, joint_vector.uniforms(list(range(n)), 4), params)
    ours_h = np.asarray([p[0]["size"][0] for p in params])
    ours_top = np.asarray([p[1]["top"] for p in params], dtype=np.float64)
    ours_left = np.asarray([p[1]["left"] for p in params], dtype=np.float64)
    ours_flip = np.asarray([p[2]["flipped"] for p in params])
    torch.manual_seed(0)
    probe = torch.empty(3, *size)
    theirs_h, theirs_top, theirs_left = [], [], []
    for _ in range(n):
        h, w = jitter.make_params([probe])["size"]
        theirs_h.append(h)
        p = crop.make_params([torch.empty(3, h, w)])
        theirs_top.append(p["top"])
        theirs_left.append(p["left"])
    bound = 1.95 * np.sqrt(2 / n)
    assert _ks(ours_h, np.asarray(theirs_h)) < bound
    assert _ks(ours_top, np.asarray(theirs_top, dtype=np.float64)) < bound
    assert _ks(ours_left, np.asarray(theirs_left, dtype=np.float64)) < bound
    assert abs(ours_flip.mean() - 0.3) < 4 * np.sqrt(0.3 * 0.7 / n)
    # the offsets together: drawn independently given the size (one uniform for both would correlate them more)
    theirs_corr = np.corrcoef(np.asarray(theirs_top, dtype=np.float64), np.asarray(theirs_left, dtype=np.float64))
    assert abs(np.corrcoef(ours_top, ours_left)[0, 1] - theirs_corr[0, 1]) < 0.1


def test_what_calls_its_transforms_is_planned_and_nothing_else():
    """The detection reference's preset (``return self.transforms(img, target)``) is planned as its Compose; a
    call that does anything else, a subclass of a class, or a hook is not."""
    class Swapped:
        def __init__(self, t):
            self.transforms = t

        def __call__(self, img, target):
            return self.transforms(target, img)

    class More(Swapped):
        def __call__(self, img, target):
            return self.transforms(img, dict(target))

    class MyFlip(v2.RandomHorizontalFlip):
        pass

    preset = DetectionPresetTrain(data_augmentation="hflip", backend="tv_tensor")
    assert joint_vector.plan(preset, vector_of) is not None
    assert joint_vector.plan(Swapped(preset.transforms), vector_of) is None
    assert joint_vector.plan(More(preset.transforms), vector_of) is None
    assert joint_vector.plan(v2.Compose([v2.ToImage(), MyFlip()]), vector_of) is None
    assert joint_vector.plan(DetectionPresetTrain(data_augmentation="ssd", backend="tv_tensor"), vector_of) is None
    hooked = v2.Compose([v2.ToImage(), v2.RandomHorizontalFlip()])
    hooked.transforms[1].register_forward_hook(lambda *a: None)
    assert joint_vector.plan(hooked, vector_of) is None


@pytest.fixture(scope="module")
def coco(photo_folder, tmp_path_factory):
    return sampledata.write_coco(photo_folder, tmp_path_factory.mktemp("coco"), seed=4)


def _lsj(coco):
    chain = v2.Compose([v2.ToImage(), v2.ScaleJitter(target_size=(256, 256), antialias=True),
                        v2.RandomCrop(256, pad_if_needed=True, fill=FILL), v2.RandomHorizontalFlip(0.5)] + TAIL)
    ds = torchvision.datasets.CocoDetection(str(coco[0]), str(coco[1]), transforms=chain)
    ds = torchvision.datasets.wrap_dataset_for_transforms_v2(ds, target_keys=["boxes", "labels", "image_id"])
    return tud.Subset(ds, [i for i, img_id in enumerate(ds.ids) if ds.coco.getAnnIds(imgIds=img_id)])


@pytest.mark.parametrize("device", [pytest.param("cpu", id="cpu"), pytest.param("gpu", id="gpu", marks=pytest.mark.gpu)])
def test_the_loaders_workers_record_chunks_every_sample_once(coco, monkeypatch, device):
    """With workers the chunks are recorded at once (explain() says so): every annotated image once an epoch, each
    256 x 256 with its boxes inside it, the same epoch again from the same seed, and the same with chunks of 3;
    recorded one by one instead, the samples draw otherwise."""
    ds = _lsj(coco)
    _, theirs = ds[0]  # (torchvision's own sample: what each target holds, of which types)
    kinds = {k: (type(v), getattr(v, "dtype", None)) for k, v in theirs.items()}

    def epoch(chunk=None):
        if chunk:
            monkeypatch.setattr(feed.ProcessDecoders, "CHUNK", chunk)
        with warnings.catch_warnings():
            warnings.simplefilter("error", FallbackWarning)
            loader = DataLoader(ds, batch_size=6, collate_fn=detection_collate, device=device, num_workers=2,
                                shuffle=True, generator=torch.Generator().manual_seed(3))
        assert loader.backend == "dali", loader.reason
        out = []
        for images, targets in loader:
            for img, t in zip(images, targets):
                assert img.shape == (3, 256, 256) and img.dtype == torch.float32 and img.device.type == ("cuda" if device == "gpu" else "cpu")
                assert {k: (type(v), getattr(v, "dtype", None)) for k, v in t.items()} == kinds
                assert all(v.device == img.device for v in t.values() if isinstance(v, torch.Tensor))
                b = t["boxes"].cpu()
                assert type(b) is torch.Tensor and ((b >= 0) & (b <= 256)).all() and len(b) == len(t["labels"])
                out.append((t["image_id"], round(img.sum().item(), 2), b.sum().item(), t["labels"].tolist()))
        return loader, out

    loader, first = epoch()
    assert "chunk" in loader.explain()
    assert sorted(i for i, *_ in first) == sorted(ds.dataset.ids[k] for k in ds.indices)
    assert epoch()[1] == first
    assert epoch(3)[1] == first
    monkeypatch.setattr(joint_vector, "ENABLED", [False])
    one_by_one = epoch()[1]
    assert sorted(one_by_one) != sorted(first) and sorted(i for i, *_ in one_by_one) == sorted(i for i, *_ in first)


def test_a_sample_whose_target_the_chunk_does_not_carry_is_left_to_be_read_one_by_one():
    """Masks, float64 boxes, a nested value, boxes on another canvas, two BoundingBoxes, a target that is not a
    dict: those samples are left out (None), the chunk's others recorded as if alone."""
    chain = chains(HEADS["image"], "image")["lsj"]
    steps = joint_vector.plan(chain, vector_of)
    rng = np.random.default_rng(9)
    samples = [sample(rng, "XYXY") for _ in range(8)]
    odd = [copy.deepcopy(samples[k][1]) for k in range(6)]
    size = samples[0][0]
    odd[0]["masks"] = tv_tensors.Mask(torch.zeros(len(odd[0]["labels"]), *size, dtype=torch.uint8))
    odd[1]["boxes"] = tv_tensors.wrap(odd[1]["boxes"].double(), like=odd[1]["boxes"])
    odd[2]["extra"] = [1, 2]
    odd[3]["boxes"] = tv_tensors.BoundingBoxes(odd[3]["boxes"], format="XYXY", canvas_size=(size[0] + 1, size[1]))
    odd[4]["more"] = odd[4]["boxes"].clone()
    odd[5] = (odd[5]["boxes"], odd[5]["labels"])
    sizes = [size] * 6 + [s for s, _ in samples[6:]]
    targets = odd + [copy.deepcopy(t) for _, t in samples[6:]]
    draws = sum(v.draws for _, v in steps)
    got = joint_vector.record(steps, "image", sizes, targets, joint_vector.uniforms(list(range(8)), draws))
    assert got[:6] == [None] * 6
    alone = joint_vector.record(steps, "image", sizes[6:], [copy.deepcopy(t) for _, t in samples[6:]],
                                joint_vector.uniforms([6, 7], draws))
    for a, b in zip(got[6:], alone):
        assert joint.same(a[0], b[0]) and joint.same(a[1], b[1])


@pytest.mark.parametrize("device", [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="gpu", marks=pytest.mark.gpu)])
def test_a_chunks_targets_travel_as_one_table_and_load_as_each_pickled(device):
    """pickled.Targets: a chunk's targets as one table (through a pickle, as torch's queue sends it), loaded at
    once, equal each target pickled alone and loaded (types, dtypes, values, BoundingBoxes' format and canvas, key
    order), on the device; targets of other structures are not tabled."""
    import pickle

    from gputransforms.datasets import detection, pickled

    rng = np.random.default_rng(5)
    targets = []
    for k in range(9):
        (h, w), t = sample(rng, "XYWH" if k % 2 else "XYXY")
        t = {"boxes": t["boxes"] if k % 3 else t["boxes"].as_subclass(torch.Tensor), "labels": t["labels"],
             "image_id": t["image_id"], "scores": torch.rand(len(t["labels"]), 2, dtype=torch.float64)}
        targets.append(t)
    assert pickled.Targets.of(targets) is None  # (boxes plain in some samples, BoundingBoxes in others)
    for t in targets:
        t["boxes"] = tv_tensors.BoundingBoxes(t["boxes"], format="XYWH", canvas_size=(50 + len(t["labels"]), 80))
    table = pickled.Targets.of(targets)
    parts = pickle.loads(pickle.dumps([pickled.Part(table, j) for j in range(len(targets))]))
    assert len({id(p.table) for p in parts}) == 1
    dev = torch.device(device)
    got = pickled.resolve(parts, dev)
    for ours, t in zip(got, targets):
        theirs = detection.to_device(pickled.load(detection._pickled(t)), dev)
        assert list(ours) == list(theirs)
        for k in t:
            assert type(ours[k]) is type(theirs[k]), k
            if isinstance(t[k], torch.Tensor):
                assert ours[k].dtype == theirs[k].dtype and ours[k].device == theirs[k].device
                assert torch.equal(ours[k].as_subclass(torch.Tensor), theirs[k].as_subclass(torch.Tensor))
            else:
                assert ours[k] == theirs[k]
        assert ours["boxes"].format == t["boxes"].format and ours["boxes"].canvas_size == t["boxes"].canvas_size
    assert pickled.Targets.of([{"a": 1}, {"b": 1}]) is None
    assert pickled.Targets.of([{"a": torch.zeros(2)}, {"a": torch.zeros(2, dtype=torch.int64)}]) is None
    assert pickled.Targets.of([{"a": [1]}, {"a": [2]}]) is None
    assert pickled.Targets.of([{"a": torch.tensor(1)}, {"a": torch.tensor(2)}]) is None


# --- chunks of segmentation samples (each target one mask) ----------------------------------------------------

class _MaybeVFlip(v2.Transform):
    """A user's class that draws (from torch's generator) and moves image and mask through a functional."""

    def make_params(self, flat_inputs):
        return dict(flip=bool(torch.rand(1) < 0.5))

    def transform(self, inpt, params):
        return v2.functional.vertical_flip(inpt) if params["flip"] else inpt


def seg_chains(head: list, kind: str) -> dict:
    """The segmentation reference's train preset (its own PadIfSmaller, a user's class), and chains of the classes
    a chunk of masks carries, with per-type fills and dtypes, a user's class that draws, masks kept as Masks."""
    from presets import PadIfSmaller, SegmentationPresetTrain

    image = tv_tensors.Image if head and isinstance(head[0], v2.ToImage) or kind == "image" else torch.Tensor
    return {
        "reference": v2.Compose(head + SegmentationPresetTrain(base_size=120, crop_size=96, backend="pil")
                                .transforms.transforms[:-3] + [v2.ToDtype(
                                    {image: torch.float32, tv_tensors.Mask: torch.int64, "others": None}, scale=True),
                                    v2.Normalize(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)),
                                    v2.ToPureTensor()]),
        "crop": v2.Compose(head + [v2.RandomResize(60, 200), v2.RandomHorizontalFlip(0.5), _MaybeVFlip(),
                                   v2.RandomCrop(96, pad_if_needed=True, fill={tv_tensors.Mask: 255, "others": 0}),
                                   v2.ToDtype({image: torch.float32, tv_tensors.Mask: torch.int64, "others": None},
                                              scale=True), v2.Normalize(mean=[0.5] * 3, std=[0.2] * 3),
                                   v2.ToPureTensor()]),
        "masks kept": v2.Compose(head + [v2.RandomResize(50, 150), PadIfSmaller(120, fill={tv_tensors.Mask: 7,
                                                                                           "others": 0}),
                                         v2.RandomCrop((100, 110)), v2.RandomVerticalFlip(0.4)]),
    }


@pytest.mark.parametrize("kind,head", [("pil", "image"), ("pil", "tensor"), ("image", "image")])
@pytest.mark.parametrize("name", ["reference", "crop", "masks kept"])
def test_a_chunk_of_masks_is_what_torchvision_makes_with_its_parameters(kind, head, name):
    """Each sample's record, mask and output type equal torchvision's own forward with the chunk's parameters
    (and the user's classes run from the sample's seed), its masks moved by torchvision's kernels on the real
    masks: 1xHxW and HxW uint8 masks, sizes below and above the crop, per-type fills and dtypes."""
    from gputransforms.compiler import joint_masks

    with joint.recording():
        chain = seg_chains(HEADS[head] if kind == "pil" else [v2.ToImage()], kind)[name]
        steps = joint_vector.plan(chain, vector_of, _users)
        assert steps is not None and joint_vector.plan(chain, vector_of) is None
        rng = np.random.default_rng(hash((kind, head, name)) % 2 ** 32)
        sizes = [(int(rng.integers(30, 260)), int(rng.integers(30, 260))) for _ in range(30)]
        masks = [tv_tensors.Mask(torch.from_numpy(rng.integers(0, 21, ((1,) if k % 3 else ()) + s, dtype=np.uint8)))
                 for k, s in enumerate(sizes)]
        u = joint_vector.uniforms(list(range(200, 230)), sum(v.draws for _, v in steps))
        assert joint_vector.record(steps, kind, sizes, masks, u) == [None] * 30  # (masks not asked for: none)
        params: list = []
        got = joint_vector.record(steps, kind, sizes, [m.clone() for m in masks], u, params, masks=True)
        assert all(g is not None for g in got)
        drawn = iter(params)
        for size, mask, ours in zip(sizes, masks, got):
            theirs = joint.record(forced(chain, next(drawn)), size, mask.clone(), kind)
            assert joint.same(ours[0], theirs[0]), (ours[0], theirs[0])
            mine = joint_masks.widened(ours[1])
            assert type(mine) is type(theirs[1]) and mine.dtype == theirs[1].dtype, (type(mine), mine.dtype)
            assert torch.equal(mine, theirs[1]) and ours[2] == theirs[2]


def test_a_users_class_is_planned_in_a_chunk_only_where_it_meets_a_tensor():
    """The segmentation reference's preset with --backend pil hands its PadIfSmaller a PIL image: no chunk is
    planned (its samples are recorded one by one, their files read once); with tv_tensor or tensor it is. A
    worker's chunk whose first target is not one mask is left before the others' files are read."""
    from presets import SegmentationPresetTrain

    plans = {b: joint_vector.plan(SegmentationPresetTrain(base_size=120, crop_size=96, backend=b), vector_of, _users,
                                  "pil") for b in ("pil", "tensor", "tv_tensor")}
    assert plans["pil"] is None and plans["tensor"] is not None and plans["tv_tensor"] is not None
    assert joint_vector.plan(SegmentationPresetTrain(base_size=120, crop_size=96, backend="pil"), vector_of, None,
                             "pil") is None  # (no class of the user's: none planned at all)


def test_a_chunk_of_masks_resizes_as_torchvisions_random_resize_draws():
    """RandomResize's sizes over 4,000 samples against torchvision's own make_params (two-sample KS, p = 0.001),
    every size within [min_size, max_size)."""
    n = 4000
    with joint.recording():
        chain = v2.Compose([v2.ToImage(), v2.RandomResize(60, 200)])
        steps = joint_vector.plan(chain, vector_of, _users)
        mask = tv_tensors.Mask(torch.zeros(1, 80, 90, dtype=torch.uint8))
        params: list = []
        joint_vector.record(steps, "pil", [(80, 90)] * n, [mask] * n, joint_vector.uniforms(list(range(n)), 1), params,
                            masks=True)
    ours = np.asarray([p[0]["size"] for p in params])
    torch.manual_seed(0)
    theirs = np.asarray([v2.RandomResize(60, 200).make_params([])["size"][0] for _ in range(n)])
    assert ours.min() >= 60 and ours.max() < 200
    assert _ks(ours.astype(np.float64), theirs.astype(np.float64)) < 1.95 * np.sqrt(2 / n)


@pytest.fixture(scope="module")
def voc(photo_folder, tmp_path_factory):
    return sampledata.write_voc(photo_folder, tmp_path_factory.mktemp("voc"), seed=4)


@pytest.mark.parametrize("device", [pytest.param("cpu", id="cpu"), pytest.param("gpu", id="gpu", marks=pytest.mark.gpu)])
def test_the_loaders_workers_record_chunks_of_masks(voc, monkeypatch, device):
    """The segmentation reference's preset on a wrapped VOCSegmentation with workers: recorded a chunk at a time
    (explain() says so, its PadIfSmaller sample by sample); every sample once an epoch, each image 96 x 96 with a
    96 x 96 int64 mask of VOC's classes and PadIfSmaller's 255, the same epoch again from the same seed and with
    chunks of 3; recorded one by one instead, the samples draw otherwise."""
    from presets import SegmentationPresetTrain

    ds = torchvision.datasets.wrap_dataset_for_transforms_v2(torchvision.datasets.VOCSegmentation(
        str(voc), year="2012", image_set="train", transforms=SegmentationPresetTrain(base_size=120, crop_size=96)))

    def epoch(chunk=None):
        if chunk:
            monkeypatch.setattr(feed.ProcessDecoders, "CHUNK_LARGE", chunk)
        with warnings.catch_warnings():
            warnings.simplefilter("error", FallbackWarning)
            loader = DataLoader(ds, batch_size=6, collate_fn=lambda b: tuple(zip(*b)), device=device, num_workers=2,
                                shuffle=True, generator=torch.Generator().manual_seed(3))
        assert loader.backend == "dali", loader.reason
        out = []
        for images, masks in loader:
            for img, m in zip(images, masks):
                assert img.shape == (3, 96, 96) and img.dtype == torch.float32 and type(m) is torch.Tensor
                assert m.shape == (1, 96, 96) and m.dtype == torch.int64 and m.device == img.device
                assert set(m.unique().tolist()) <= set(range(21)) | {255}
                out.append((round(img.sum().item(), 2), m.sum().item()))
        return loader, out

    loader, first = epoch()
    assert "sample by sample from a seed" in loader.explain()
    assert len(first) == len(ds)
    assert epoch()[1] == first
    assert epoch(3)[1] == first
    monkeypatch.setattr(joint_vector, "ENABLED", [False])
    assert sorted(epoch()[1]) != sorted(first)


def test_a_chunks_uint8_masks_are_not_left_viewing_the_workers_ring(voc, monkeypatch):
    """A chunk's masks travel as one array through the worker's ring of shared memory (``pickled.Targets`` of bare
    targets). On the CPU, masks left uint8 (nothing to widen them) were views of the ring itself, which the worker
    overwrites once its space is marked read: masks kept past a few chunks changed under the user. Held across two
    epochs with a ring a few chunks long, each equals the mask of the same draw handed over one by one."""
    ds = torchvision.datasets.wrap_dataset_for_transforms_v2(torchvision.datasets.VOCSegmentation(
        str(voc), year="2012", image_set="train", transforms=v2.Compose([
            v2.ToImage(), v2.RandomResize(100, 140), v2.RandomCrop(96, pad_if_needed=True,
                                                                   fill={tv_tensors.Mask: 255, "others": 0}),
            v2.RandomHorizontalFlip(), v2.ToDtype(torch.float32, scale=True)])))
    monkeypatch.setattr(arena, "RING", 8 * arena.LARGE)

    def two_epochs():
        loader = DataLoader(ds, batch_size=6, collate_fn=lambda b: tuple(zip(*b)), device="cpu", num_workers=2,
                            shuffle=True, generator=torch.Generator().manual_seed(3), persistent_workers=True)
        assert loader.backend == "dali", loader.reason
        held = [m for _ in range(2) for _, masks in loader for m in masks]
        assert all(type(m) is tv_tensors.Mask and m.dtype == torch.uint8 and m.shape == (1, 96, 96) for m in held)
        return held

    ours = two_epochs()
    assert len(ours) == 2 * len(ds)
    monkeypatch.setattr(pickled, "TABLES", [False])
    theirs = two_epochs()
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs))
