"""Hugging Face ``datasets`` tables with an Image() column, side by side with torch's DataLoader over
the same dataset object (#36): transformers' image-classification shape compiles, batches and labels
are the same, and other shapes fall back with a reason that fits."""
from __future__ import annotations

import functools
import io

import pytest
import torch
import torch.utils.data as tud
from PIL import Image
from torchvision import tv_tensors
from torchvision.transforms import v2

from gputransforms import DataLoader, FallbackWarning
from gputransforms import transforms as T
from gputransforms.errors import BadSampleError

datasets = pytest.importorskip("datasets")
DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("gpu", id="gpu", marks=pytest.mark.gpu)]
TRAIN = T.Compose([T.RandomResizedCrop(64), T.RandomHorizontalFlip(), T.ToTensor(),
                   T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
EVAL = T.Compose([T.Resize(72), T.CenterCrop(64), T.ToTensor(), T.Normalize([0.5] * 3, [0.25] * 3)])


def _files(folder):
    classes = sorted(d.name for d in folder.iterdir() if d.is_dir())
    pairs = [(str(p), y) for y, c in enumerate(classes) for p in sorted((folder / c).iterdir())]
    return [p for p, _ in pairs], [y for _, y in pairs], classes


@pytest.fixture(scope="module")
def table(photo_folder):
    """photo_folder as a datasets.Dataset whose Image() column holds the encoded bytes (as a
    dataset from the Hub or save_to_disk does), and a ClassLabel column."""
    paths, labels, classes = _files(photo_folder)
    feats = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=classes)})
    return datasets.Dataset.from_dict(
        {"image": [{"bytes": open(p, "rb").read(), "path": None} for p in paths], "label": labels}, features=feats)


def preprocess_eval(batch):  # transformers' examples/pytorch/image-classification shape
    batch["pixel_values"] = [EVAL(image.convert("RGB")) for image in batch["image"]]
    return batch


def preprocess_train(batch):
    batch["pixel_values"] = [TRAIN(image.convert("RGB")) for image in batch["image"]]
    return batch


def collate_fn(examples):  # the example's own
    pixel_values = torch.stack([example["pixel_values"] for example in examples])
    labels = torch.tensor([example["label"] for example in examples])
    return {"pixel_values": pixel_values, "labels": labels}


@pytest.mark.parametrize("device", DEVICES)
def test_the_examples_shape_compiles_and_matches(table, device):
    ds = table.with_transform(preprocess_eval)
    kw = dict(batch_size=8, shuffle=True, collate_fn=collate_fn)
    ours = DataLoader(ds, device=device, generator=torch.Generator().manual_seed(1), **kw)
    assert ours.backend == "dali", ours.reason
    theirs = tud.DataLoader(ds, generator=torch.Generator().manual_seed(1), **kw)
    for a, b in zip(ours, theirs):  # the same sampler draws: the same rows, batch by batch
        assert a["labels"].tolist() == b["labels"].tolist()
        d = (a["pixel_values"].cpu() - b["pixel_values"]).abs() * 0.25 * 255
        assert d.mean() < (0.5 if device == "cpu" else 1.5), d.mean()
    assert "Hugging Face dataset" in ours.explain()


def test_set_transform_renamed_columns_and_default_collate(table):
    def preprocess(batch):
        return {"pixel_values": [EVAL(im.convert("RGB")) for im in batch["image"]], "labels": batch["label"]}

    ds = table.shuffle(seed=4).select(range(20))  # an indices mapping over the table
    ds.set_transform(preprocess)
    ours, theirs = DataLoader(ds, batch_size=6, device="cpu"), tud.DataLoader(ds, batch_size=6)
    assert ours.backend == "dali", ours.reason
    for a, b in zip(ours, theirs):
        assert list(a) == list(b) == ["pixel_values", "labels"]
        assert torch.equal(a["labels"], b["labels"])
        assert ((a["pixel_values"] - b["pixel_values"]).abs() * 0.25 * 255).mean() < 0.5


def test_kept_image_column_reaches_the_collate_fn_and_default_collate_raises_as_torch(table):
    ds = table.with_transform(preprocess_train)
    seen = []

    def collate(examples):
        seen.extend(examples)
        return collate_fn(examples)

    batch = next(iter(DataLoader(ds, batch_size=4, collate_fn=collate, device="cpu")))
    assert [list(item) for item in seen] == [["image", "label", "pixel_values"]] * 4
    for i, item in enumerate(seen):  # each item is its own row's
        ref = ds[i]
        assert isinstance(item["image"], Image.Image) and item["label"] == ref["label"]
        assert item["image"].size == ref["image"].size and item["image"].tobytes() == ref["image"].tobytes()
    assert batch["pixel_values"].shape == (4, 3, 64, 64)
    with pytest.raises(TypeError, match="default_collate") as ours:
        next(iter(DataLoader(ds, batch_size=4, device="cpu")))
    with pytest.raises(TypeError, match="default_collate") as theirs:
        next(iter(tud.DataLoader(ds, batch_size=4)))
    assert str(ours.value) == str(theirs.value)


def test_random_crops_by_distribution(table):
    """RandomResizedCrop and the flip in the compiled graph: per-image means of our outputs and
    torchvision's over 20 epochs of the same 16 rows have one distribution (two-sample
    Kolmogorov-Smirnov at 0.1%), and the crops differ between epochs."""
    ds = table.select(range(16)).with_transform(preprocess_train)
    ours = torch.stack([torch.cat([b["pixel_values"].mean((1, 2, 3)) for b in
                                   DataLoader(ds, batch_size=16, collate_fn=collate_fn, device="cpu", seed=e)])
                        for e in range(20)])
    torch.manual_seed(0)
    theirs = torch.stack([torch.cat([b["pixel_values"].mean((1, 2, 3))
                                     for b in tud.DataLoader(ds, batch_size=16, collate_fn=collate_fn)])
                          for _ in range(20)])
    assert (ours.std(0) > 0.01).all()  # each row's crop changes from epoch to epoch
    a, b = ours.flatten().sort().values, theirs.flatten().sort().values
    grid = torch.cat([a, b])
    ks = (torch.searchsorted(a, grid, right=True) / len(a) - torch.searchsorted(b, grid, right=True) / len(b)).abs().max()
    assert ks < 1.95 * (2 / len(a)) ** 0.5, ks.item()


def test_imagefolder_from_load_dataset(photo_folder, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    ds = datasets.load_dataset("imagefolder", data_dir=str(photo_folder), split="train", cache_dir=str(tmp_path))
    ds = ds.with_transform(preprocess_eval)
    ours = DataLoader(ds, batch_size=8, collate_fn=collate_fn, device="cpu")
    assert ours.backend == "dali", ours.reason
    for a, b in zip(ours, tud.DataLoader(ds, batch_size=8, collate_fn=collate_fn)):
        assert torch.equal(a["labels"], b["labels"])
        assert ((a["pixel_values"] - b["pixel_values"]).abs() * 0.25 * 255).mean() < 0.5


def test_exif_orientation_as_datasets_decodes_it(photo_folder):
    """datasets transposes a decoded image by its EXIF orientation; the graph's copy is the same."""
    src = Image.open(sorted(photo_folder.glob("*/*.jpg"))[0]).convert("RGB").resize((96, 64))
    blobs = []
    for orientation in (1, 6, 3):
        exif = Image.Exif()
        exif[0x0112] = orientation
        buf = io.BytesIO()
        src.save(buf, "JPEG", quality=95, exif=exif.tobytes())
        blobs.append(buf.getvalue())
    tf = T.Compose([T.ToTensor()])
    ds = datasets.Dataset.from_dict({"image": [{"bytes": b, "path": None} for b in blobs], "label": [0, 1, 2]},
                                    features=datasets.Features({"image": datasets.Image(),
                                                                "label": datasets.Value("int64")}))
    ds = ds.with_transform(lambda b: {"x": [tf(i.convert("RGB")) for i in b["image"]], "label": b["label"]})
    ours = list(DataLoader(ds, batch_size=1, device="cpu"))
    theirs = list(tud.DataLoader(ds, batch_size=1))
    assert [o["x"].shape for o in ours] == [t["x"].shape for t in theirs] == \
        [(1, 3, 64, 96), (1, 3, 96, 64), (1, 3, 64, 96)]
    for o, t in zip(ours, theirs):
        assert ((o["x"] - t["x"]).abs() * 255).mean() < 1.0


PLAIN = T.Compose([T.Resize(72), T.CenterCrop(64), T.ToTensor()])


def preprocess_as_decoded(batch):  # no .convert("RGB"): each image in the mode datasets decodes it in
    batch["pixel_values"] = [PLAIN(image) for image in batch["image"]]
    return batch


@pytest.mark.parametrize("grey", [False, True])
def test_images_handed_over_without_convert_compile_only_where_they_are_rgb(photo_folder, grey):
    """Without .convert("RGB") torchvision's transform gets each image in the mode datasets decodes it in: a
    table of RGB photos compiles; one with a grey JPEG runs on torch's DataLoader, naming the row (the graph
    decodes RGB: it gave three channels where torchvision's transform gives one); the batches are
    torchvision's either way, and with the conversion the grey table compiles."""
    paths, labels, classes = _files(photo_folder)
    blobs = [open(p, "rb").read() for p in paths[:6]]
    if grey:
        buf = io.BytesIO()
        Image.open(io.BytesIO(blobs[4])).convert("L").save(buf, "JPEG")
        blobs[4] = buf.getvalue()
    feats = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=classes)})
    table = datasets.Dataset.from_dict({"image": [{"bytes": b, "path": None} for b in blobs], "label": labels[:6]},
                                       features=feats)
    ds = table.with_transform(preprocess_as_decoded)
    if grey:
        with pytest.warns(FallbackWarning, match="row 4 is in mode L.*convert each image to RGB"):
            loader = DataLoader(ds, batch_size=1, collate_fn=collate_fn, device="cpu")
    else:
        loader = DataLoader(ds, batch_size=1, collate_fn=collate_fn, device="cpu")
    assert loader.backend == ("torchvision" if grey else "dali"), loader.reason
    ours, theirs = list(loader), list(tud.DataLoader(ds, batch_size=1, collate_fn=collate_fn))
    assert [b["pixel_values"].shape[1] for b in ours] == [b["pixel_values"].shape[1] for b in theirs] == \
        [3, 3, 3, 3, 1 if grey else 3, 3]
    for a, b in zip(ours, theirs):
        assert (a["pixel_values"] - b["pixel_values"]).abs().mean() < 0.02
    assert DataLoader(table.with_transform(preprocess_eval), batch_size=1, collate_fn=collate_fn,
                      device="cpu").backend == "dali"


def test_a_bad_image_is_named(table):
    bad = table.select(range(8)).to_dict()
    bad["image"][5] = {"bytes": b"\xff\xd8 not a jpeg at all", "path": None}
    ds = datasets.Dataset.from_dict(bad, features=table.features).with_transform(preprocess_eval)
    with pytest.raises(BadSampleError, match="row 5"):
        list(DataLoader(ds, batch_size=4, collate_fn=collate_fn, device="cpu"))
    loader = DataLoader(ds, batch_size=4, collate_fn=collate_fn, device="cpu", on_error="skip")
    with pytest.warns(UserWarning, match="skipped 1"):
        assert sum(len(b["labels"]) for b in loader) == 7


def two_transforms(batch):
    batch["pixel_values"] = [(TRAIN if len(batch) > 9 else EVAL)(im.convert("RGB")) for im in batch["image"]]
    return batch


def rotates(batch):
    batch["pixel_values"] = [EVAL(im.convert("RGB").rotate(90)) for im in batch["image"]]
    return batch


def computes(batch):
    batch["pixel_values"] = [EVAL(im.convert("RGB")) for im in batch["image"]]
    batch["label"] = [y + 1 for y in batch["label"]]
    return batch


JOINT = v2.Compose([v2.ToImage(), v2.RandomHorizontalFlip(1.0), v2.Resize((32, 32))])


def joint(batch):
    """The detection tutorials' shape: the image and its boxes through one v2 transform."""
    out = [JOINT(im.convert("RGB"), {"boxes": tv_tensors.BoundingBoxes([[1, 2, 5, 6]], format="XYXY",
                                                                        canvas_size=(im.height, im.width))})
           for im in batch["image"]]
    batch["pixel_values"], batch["target"] = [o[0] for o in out], [o[1] for o in out]
    return batch


@pytest.mark.parametrize("shape, why", [
    (lambda t: t.with_transform(joint), "calls its transform with the image and a target"),
    (lambda t: t.with_format("torch"), "format 'torch'"),
    (lambda t: t, "format None"),
    (lambda t: t.with_transform(two_transforms), "names 2 torchvision/timm transforms"),
    (lambda t: t.with_transform(rotates), "changes the image before its transform"),
    (lambda t: t.with_transform(computes), "computes 'label' from the row"),
])
def test_other_shapes_fall_back_with_a_reason_that_fits(table, shape, why):
    with pytest.warns(FallbackWarning) as caught:
        loader = DataLoader(shape(table), batch_size=4, device="cpu")
    assert loader.backend == "torchvision"
    assert why in str(caught[0].message) and "to compile it" in str(caught[0].message), str(caught[0].message)


def _keyword(batch, transform=None):
    batch["pixel_values"] = [transform(image.convert("RGB")) for image in batch["image"]]
    del batch["image"]
    return batch


def _positional(transform, batch):
    return _keyword(batch, transform)


def _default(batch, transform=EVAL):
    return _keyword(batch, transform)


def _keyword_only(batch, *, transform=EVAL):
    return _keyword(batch, transform)


@pytest.mark.parametrize("fn", [functools.partial(_keyword, transform=EVAL), functools.partial(_positional, EVAL),
                                _default, _keyword_only], ids=["partial-keyword", "partial-positional", "default",
                                                               "keyword-only-default"])
def test_transform_bound_by_partial_or_default_compiles(table, fn):
    """The transform reached through functools.partial's arguments or the function's defaults, not a global or a
    closure: compiled, the same batches, and the function's own transform put back after the probe."""
    ours = DataLoader(table.with_transform(fn), batch_size=8, device="cpu")
    assert ours.backend == "dali", ours.reason
    theirs = tud.DataLoader(table.with_transform(fn), batch_size=8)
    for a, b in zip(ours, theirs):
        assert a["label"].tolist() == b["label"].tolist()
        assert (a["pixel_values"] - b["pixel_values"]).abs().mean() * 0.25 * 255 < 0.5
    held = fn.keywords.get("transform") if isinstance(fn, functools.partial) else None
    held = held or (fn.args[0] if isinstance(fn, functools.partial) and fn.args else None)
    held = held or (fn.__defaults__ or [None])[0] or (fn.__kwdefaults__ or {}).get("transform")
    assert held is EVAL


def test_a_collate_fn_that_changes_a_list_cell_changes_nothing_for_the_next_epoch(table):
    ds = table.add_column("tags", [["a"] for _ in range(len(table))])

    def preprocess(batch):
        batch["pixel_values"] = [EVAL(image.convert("RGB")) for image in batch["image"]]
        del batch["image"]
        return batch

    def tag(examples):
        for e in examples:
            e["tags"].append("seen")
        return examples

    loader = DataLoader(ds.with_transform(preprocess), batch_size=8, collate_fn=tag, device="cpu")
    assert loader.backend == "dali", loader.reason
    for _ in range(2):
        assert all(e["tags"] == ["a", "seen"] for b in loader for e in b)
