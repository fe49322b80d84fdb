"""Datasets beyond ImageFolder, compiled and side by side with torch's DataLoader over the same
object: ImageList (file lists, multi-label), and torchvision's file-backed datasets passed
unchanged, each on the on-disk layout its class expects, written here with real photos (the way
torchvision's own test suite fakes them; md5 checks of the fakes are patched to existence)."""
import json
import os
import warnings

import numpy as np
import pytest
import torch
import torch.utils.data as tud
import torchvision
from PIL import Image

from gputransforms import DataLoader, FallbackWarning, datasets, sampledata
from gputransforms import transforms as T

from conftest import DEVICES, abs_diff_stats

TF = T.Compose([T.Resize((48, 48)), T.PILToTensor()])
# decoder and resize rounding (test_parity's chains; GPU: nvJPEG's chroma upsampling)
TOL = {"cpu": 0.5, "gpu": 2.0}


def write_photos(paths, seed=0):
    rng = np.random.default_rng(seed)
    for p in paths:
        p = str(p)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        sampledata.photo(rng, long_side=int(rng.integers(120, 220))).save(p, "JPEG", quality=90)


def food101(root):
    meta = {"apple_pie": [f"apple_pie/{i}" for i in (101, 7, 33)], "bibimbap": [f"bibimbap/{i}" for i in (5, 12)]}
    (root / "food-101" / "meta").mkdir(parents=True)
    (root / "food-101" / "meta" / "train.json").write_text(json.dumps(meta))
    write_photos([root / "food-101" / "images" / f"{p}.jpg" for ps in meta.values() for p in ps])
    return torchvision.datasets.Food101(str(root), split="train", transform=TF)


def dtd(root):
    names = ["banded/banded_0001.jpg", "banded/banded_0002.jpg", "zigzagged/zigzagged_0003.jpg",
             "dotted/dotted_0004.jpg"]
    labels = root / "dtd" / "dtd" / "labels"
    labels.mkdir(parents=True)
    (labels / "train1.txt").write_text("\n".join(names) + "\n")
    write_photos([root / "dtd" / "dtd" / "images" / n for n in names], seed=1)
    return torchvision.datasets.DTD(str(root), split="train", partition=1, transform=TF)


def oxford_pet(root):
    rows = ["Abyssinian_1 1 1 1", "Abyssinian_2 1 1 1", "basset_hound_3 3 2 2", "Bengal_4 2 1 2", "beagle_5 4 2 3"]
    anns = root / "oxford-iiit-pet" / "annotations"
    anns.mkdir(parents=True)
    (anns / "trainval.txt").write_text("\n".join(rows) + "\n")
    write_photos([root / "oxford-iiit-pet" / "images" / f"{r.split()[0]}.jpg" for r in rows], seed=2)
    return torchvision.datasets.OxfordIIITPet(str(root), split="trainval",
                                              target_types=("category", "binary-category"), transform=TF)


def celeba(root, monkeypatch):
    monkeypatch.setattr(torchvision.datasets.celeba, "check_integrity", lambda fpath, md5=None: os.path.exists(fpath))
    base = root / "celeba"
    base.mkdir()
    rng = np.random.default_rng(3)
    files = [f"{i:06d}.jpg" for i in range(1, 8)]
    split = [0, 0, 1, 0, 2, 0, 0]
    attr_names = [f"attr_{k}" for k in range(40)]
    (base / "list_eval_partition.txt").write_text("".join(f"{f} {s}\n" for f, s in zip(files, split)))
    (base / "identity_CelebA.txt").write_text("".join(f"{f} {rng.integers(1, 50)}\n" for f in files))
    (base / "list_attr_celeba.txt").write_text(
        f"{len(files)}\n" + " ".join(attr_names) + "\n"
        + "".join(f"{f} " + " ".join(str(v) for v in rng.choice([-1, 1], 40)) + "\n" for f in files))
    (base / "list_bbox_celeba.txt").write_text(
        f"{len(files)}\nimage_id x_1 y_1 width height\n"
        + "".join(f"{f} " + " ".join(str(v) for v in rng.integers(0, 200, 4)) + "\n" for f in files))
    (base / "list_landmarks_align_celeba.txt").write_text(
        f"{len(files)}\n" + " ".join(f"p{k}" for k in range(10)) + "\n"
        + "".join(f"{f} " + " ".join(str(v) for v in rng.integers(0, 200, 10)) + "\n" for f in files))
    write_photos([base / "img_align_celeba" / f for f in files], seed=3)
    return torchvision.datasets.CelebA(str(root), split="train", target_type=["attr", "identity", "bbox"],
                                       transform=TF)


def flowers102(root, monkeypatch):
    from scipy.io import savemat

    monkeypatch.setattr(torchvision.datasets.flowers102, "check_integrity",
                        lambda fpath, md5=None: os.path.exists(fpath))
    base = root / "flowers-102"
    base.mkdir()
    savemat(base / "imagelabels.mat", {"labels": np.array([3, 1, 2, 3, 1, 2, 2])})
    savemat(base / "setid.mat", {"trnid": np.array([1, 3, 4, 6]), "valid": np.array([2, 5]), "tstid": np.array([7])})
    write_photos([base / "jpg" / f"image_{i:05d}.jpg" for i in range(1, 8)], seed=4)
    return torchvision.datasets.Flowers102(str(root), split="train", transform=TF)


def stanford_cars(root):
    from scipy.io import savemat

    base = root / "stanford_cars"
    (base / "devkit").mkdir(parents=True)
    names = [f"{i:05d}.jpg" for i in range(1, 6)]
    annotations = np.array([(n, c) for n, c in zip(names, [2, 1, 3, 2, 1])], dtype=[("fname", object), ("class", object)])
    savemat(base / "devkit" / "cars_train_annos.mat", {"annotations": annotations})
    savemat(base / "devkit" / "cars_meta.mat", {"class_names": np.array(["Audi A4", "BMW M3", "Volvo XC90"],
                                                                       dtype=object)})
    write_photos([base / "cars_train" / n for n in names], seed=5)
    return torchvision.datasets.StanfordCars(str(root), split="train", transform=TF)


def fgvc_aircraft(root):
    data = root / "fgvc-aircraft-2013b" / "data"
    data.mkdir(parents=True)
    (data / "variants.txt").write_text("707-320\nBoeing 717\nA340-500\n")
    rows = ["1025794 707-320", "0034309 A340-500", "2044455 Boeing 717", "1100112 707-320"]
    (data / "images_variant_trainval.txt").write_text("\n".join(rows) + "\n")
    write_photos([data / "images" / f"{r.split()[0]}.jpg" for r in rows], seed=7)
    return torchvision.datasets.FGVCAircraft(str(root), split="trainval", annotation_level="variant", transform=TF)


def sun397(root):
    base = root / "SUN397"
    base.mkdir()
    (base / "ClassName.txt").write_text("/a/abbey\n/b/bakery/shop\n/c/canyon\n")
    write_photos([base / "a" / "abbey" / "sun_aaa.jpg", base / "b" / "bakery" / "shop" / "sun_bbb.jpg",
                  base / "c" / "canyon" / "sun_ccc.jpg", base / "a" / "abbey" / "sun_ddd.jpg"], seed=8)
    return torchvision.datasets.SUN397(str(root), transform=TF)


def imagenette(root):
    train = root / "imagenette2-160" / "train"
    write_photos([train / "n01440764" / "ILSVRC2012_val_00000293.JPEG", train / "n01440764" / "n01440764_1.JPEG",
                  train / "n02979186" / "n02979186_7.JPEG", train / "n02102040" / "n02102040_3.JPEG"], seed=9)
    return torchvision.datasets.Imagenette(str(root), split="train", size="160px", transform=TF)


def places365(root, monkeypatch):
    monkeypatch.setattr(torchvision.datasets.places365, "check_integrity",
                        lambda fpath, md5=None: os.path.exists(fpath))
    (root / "categories_places365.txt").write_text("/a/airfield 0\n/b/bakery/shop 1\n/c/canyon 2\n")
    rows = ["/a/airfield/00000001.jpg 0", "/c/canyon/00000002.jpg 2", "/b/bakery/shop/00000003.jpg 1",
            "/a/airfield/00000004.jpg 0"]
    (root / "places365_train_standard.txt").write_text("\n".join(rows) + "\n")
    write_photos([root / "data_large_standard" / r.split()[0].lstrip("/") for r in rows], seed=10)
    return torchvision.datasets.Places365(str(root), split="train-standard", transform=TF)


def caltech101(root):
    base = root / "caltech101" / "101_ObjectCategories"
    write_photos([base / "BACKGROUND_Google" / "image_0001.jpg", base / "accordion" / "image_0001.jpg",
                  base / "accordion" / "image_0002.jpg", base / "airplanes" / "image_0001.jpg",
                  base / "Faces" / "image_0001.jpg", base / "Faces" / "image_0002.jpg"], seed=11)
    return torchvision.datasets.Caltech101(str(root), target_type="category", transform=TF)


def caltech256(root):
    base = root / "caltech256" / "256_ObjectCategories"
    write_photos([base / "001.ak47" / "001_0001.jpg", base / "001.ak47" / "001_0002.jpg",
                  base / "002.american-flag" / "002_0001.jpg", base / "003.backpack" / "003_0001.jpg"], seed=12)
    return torchvision.datasets.Caltech256(str(root), transform=TF)


def inaturalist(root):
    base = root / "2021_train"
    dirs = ["00000_Animalia_Arthropoda_Insecta_Lepidoptera_Nymphalidae_Danaus_plexippus",
            "00001_Animalia_Chordata_Aves_Passeriformes_Corvidae_Corvus_corax",
            "00002_Plantae_Tracheophyta_Magnoliopsida_Rosales_Rosaceae_Rosa_canina"]
    write_photos([base / d / f"{k}{d[:5]}.jpg" for d in dirs for k in "ab"], seed=13)
    return torchvision.datasets.INaturalist(str(root), version="2021_train", target_type=["full", "kingdom", "order"],
                                            transform=TF)


MAKERS = {"FGVCAircraft": fgvc_aircraft, "SUN397": sun397, "Imagenette": imagenette, "Food101": food101, "DTD": dtd,
          "OxfordIIITPet": oxford_pet, "CelebA": celeba, "Flowers102": flowers102, "StanfordCars": stanford_cars,
          "Places365": places365, "Caltech101": caltech101, "Caltech256": caltech256, "INaturalist": inaturalist}


def same_targets(a, b):
    if isinstance(a, torch.Tensor):
        return torch.equal(a.cpu(), b.cpu())
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same_targets(x, y) for x, y in zip(a, b))
    return a == b


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(MAKERS))
def test_torchvision_file_dataset_compiles_with_torchs_targets_and_pixels(tmp_path, monkeypatch, name, device):
    make = MAKERS[name]
    ds = make(tmp_path, monkeypatch) if "monkeypatch" in make.__code__.co_varnames else make(tmp_path)
    assert len(ds) >= 4
    ours = DataLoader(ds, batch_size=3, shuffle=True, generator=torch.Generator().manual_seed(1), device=device)
    theirs = tud.DataLoader(ds, batch_size=3, shuffle=True, generator=torch.Generator().manual_seed(1))
    assert ours.backend == "dali", ours.explain()
    n = 0
    for (xo, yo), (xt, yt) in zip(ours, theirs):
        assert same_targets(yo, yt), f"{name}: targets differ: {yo} vs {yt}"
        assert abs_diff_stats(xo, xt)["mean"] < TOL[device]
        n += len(xo)
    assert n == len(ds)


def test_dataset_with_a_joint_transforms_or_a_segmentation_target_is_not_compiled(tmp_path):
    ds = oxford_pet(tmp_path)
    seg = torchvision.datasets.OxfordIIITPet(str(tmp_path), target_types="segmentation", transform=TF)
    with pytest.warns(FallbackWarning, match="segmentation"):
        assert DataLoader(seg, batch_size=2, device="cpu").backend == "torchvision"
    assert DataLoader(ds, batch_size=2, device="cpu").backend == "dali"
    caltech101(tmp_path)
    ann = torchvision.datasets.Caltech101(str(tmp_path), target_type=["category", "annotation"], transform=TF)
    with pytest.warns(FallbackWarning, match="'annotation' is read from a .mat file"):
        assert DataLoader(ann, batch_size=2, device="cpu").backend == "torchvision"


def test_reexported_from_gputransforms_datasets():
    for name in datasets.FILE_BACKED:
        assert getattr(datasets, name) is getattr(torchvision.datasets, name)


# --- ImageList ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def flat_folder(tmp_path_factory):
    """A flat folder of photos and a space-separated list with two labels per image, as DALI's
    tutorials describe a multi-label data set (``image_05973.jpg 0 3``)."""
    root = tmp_path_factory.mktemp("flat")
    names = [f"image_{i:05d}.jpg" for i in range(1, 12)]
    write_photos([root / "images" / n for n in names], seed=6)
    rng = np.random.default_rng(6)
    lines = [f"{n} {rng.integers(0, 5)} {rng.integers(0, 5)}" for n in names]
    (root / "labels.txt").write_text("\n".join(lines) + "\n")
    return root


class TutorialDataset(tud.Dataset):
    """What a user writes by hand (the DALI tutorials' seed case): PIL in __getitem__."""

    def __init__(self, root, list_file, transform):
        self.root, self.transform = root, transform
        with open(list_file) as f:
            self.rows = [line.split() for line in f if line.strip()]

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        name, *labels = self.rows[i]
        img = Image.open(os.path.join(self.root, name)).convert("RGB")
        return self.transform(img), torch.tensor([int(v) for v in labels])


@pytest.mark.parametrize("device", DEVICES)
def test_image_list_multilabel_equals_the_users_own_dataset(flat_folder, device):
    mine = TutorialDataset(flat_folder / "images", flat_folder / "labels.txt", TF)
    ours_ds = datasets.ImageList(flat_folder / "labels.txt", root=flat_folder / "images", transform=TF)
    assert len(ours_ds) == len(mine) and all(isinstance(t, torch.Tensor) and t.shape == (2,) for t in ours_ds.targets)
    ours = DataLoader(ours_ds, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(2), device=device)
    theirs = tud.DataLoader(mine, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(2))
    assert ours.backend == "dali"
    for (xo, yo), (xt, yt) in zip(ours, theirs):
        assert yo.shape == (len(xo), 2) and torch.equal(yo.cpu(), yt)
        assert abs_diff_stats(xo, xt)["mean"] < TOL[device]


# --- a user's own Dataset -------------------------------------------------------------------------

class LoaderDataset(tud.Dataset):
    """Another usual hand-written shape: torchvision's default_loader (open(path, "rb") handed to
    PIL), a transform kept under another name, a multi-hot float target, a guarded transform."""

    def __init__(self, rows, tfms, num_classes=5):
        self.rows, self.tfms, self.num_classes = rows, tfms, num_classes

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        path, labels = self.rows[i]
        img = torchvision.datasets.folder.default_loader(path)
        if self.tfms is not None:
            img = self.tfms(img)
        target = torch.zeros(self.num_classes)
        target[labels] = 1.0
        return img, target


def loader_rows(folder):
    rows = [line.split() for line in (folder / "labels.txt").read_text().splitlines()]
    return [(str(folder / "images" / name), [int(v) for v in labels]) for name, *labels in rows]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["tutorial", "default_loader", "random_split"])
def test_users_own_dataset_compiles_with_torchs_targets_and_pixels(flat_folder, device, kind):
    if kind == "tutorial":
        mine = TutorialDataset(flat_folder / "images", flat_folder / "labels.txt", TF)
    else:
        mine = LoaderDataset(loader_rows(flat_folder), TF)
    if kind == "random_split":
        mine = tud.random_split(mine, [7, 4], generator=torch.Generator().manual_seed(5))[0]
    ours = DataLoader(mine, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(2), device=device)
    theirs = tud.DataLoader(mine, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(2))
    assert ours.backend == "dali", ours.explain()
    assert "__getitem__ on a placeholder image" in ours.explain()
    n = 0
    for (xo, yo), (xt, yt) in zip(ours, theirs):
        assert yo.dtype == yt.dtype and torch.equal(yo.cpu(), yt)
        assert abs_diff_stats(xo, xt)["mean"] < TOL[device]
        n += len(xo)
    assert n == len(mine)


class Cropping(TutorialDataset):
    def __getitem__(self, i):
        name, *labels = self.rows[i]
        img = Image.open(os.path.join(self.root, name)).convert("RGB").crop((0, 0, 10, 10))
        return self.transform(img), int(labels[0])


class FromBytes(TutorialDataset):
    def __getitem__(self, i):
        import io

        with open(os.path.join(self.root, self.rows[i][0]), "rb") as f:
            img = Image.open(io.BytesIO(f.read())).convert("RGB")
        return self.transform(img), 0


class NoTransformAttr(TutorialDataset):
    def __init__(self, *a):
        super().__init__(*a)
        self.pipeline = lambda img: TF(img)
        del self.transform

    def __getitem__(self, i):
        return self.pipeline(Image.open(os.path.join(self.root, self.rows[i][0]))), 0


class AsDictWithTheOpenedImage(TutorialDataset):
    def __getitem__(self, i):
        img = Image.open(os.path.join(self.root, self.rows[i][0])).convert("RGB")
        return {"image": self.transform(img), "mean": T.functional.pil_to_tensor(img).float().mean()}


class WithTheImagesSize(TutorialDataset):
    def __getitem__(self, i):
        img = Image.open(os.path.join(self.root, self.rows[i][0])).convert("RGB")
        return self.transform(img), torch.tensor(img.size)


class TwoViews(TutorialDataset):
    def __getitem__(self, i):
        img = Image.open(os.path.join(self.root, self.rows[i][0])).convert("RGB")
        return (self.transform(img), self.transform(img)), 0


@pytest.mark.parametrize("cls, why", [(Cropping, "changes the image between opening it and self.transform"),
                                      (FromBytes, "opens an image from a BytesIO, not from a file"),
                                      (NoTransformAttr, "has no `transform` attribute"),
                                      (AsDictWithTheOpenedImage, "makes part of what it returns beside "
                                                                 "self.transform from the image or at random"),
                                      (WithTheImagesSize, "makes part of what it returns beside self.transform "
                                                          "from the image or at random (index 0"),
                                      (TwoViews, "calls self.transform 2 times for index 0")])
def test_users_dataset_that_cannot_be_read_without_decoding_runs_on_torch_and_says_why(flat_folder, cls, why):
    import re

    mine = cls(flat_folder / "images", flat_folder / "labels.txt", TF)
    advice = "gputransforms.compile" if cls is FromBytes else "gputransforms.datasets.ImageList"
    with pytest.warns(FallbackWarning, match=re.escape(why) + ".*" + re.escape(advice)):
        loader = DataLoader(mine, batch_size=4, device="cpu")
    assert loader.backend == "torchvision" and why in loader.explain()
    ref = list(tud.DataLoader(mine, batch_size=4))
    got = list(loader)  # and it still runs, as torch's does
    assert len(got) == len(ref)
    for a, b in zip(got, ref):
        a, b = (list(a.values()), list(b.values())) if isinstance(a, dict) else (a, b)
        if isinstance(b[0], list):  # (two views)
            assert all(torch.equal(x, y) for x, y in zip(a[0], b[0])) and same_targets(a[1], b[1])
        else:
            assert torch.equal(a[0], b[0]) and same_targets(a[1], b[1])


class Shaped(TutorialDataset):
    """Other shapes of a sample than (image, target), as hand-written datasets return them."""

    def __init__(self, *a, shape):
        super().__init__(*a)
        self.shape = shape

    def __getitem__(self, i):
        name, *labels = self.rows[i]
        with Image.open(os.path.join(self.root, name)) as im:
            x = self.transform(im.convert("RGB"))
        y = int(labels[0])
        return {"dict": lambda: {"image": x, "label": y, "path": name},
                "triple": lambda: (x, torch.tensor(y), i),
                "alone": lambda: x,
                "nested": lambda: {"inputs": {"pixels": x, "meta": [name, i]}, "targets": [y, float(y) / 2]},
                "moves": lambda: (x, y) if i else (y, x),
                "pair": lambda: (x, {"label": y, "tags": [name]})}[self.shape]()


def as_list(batch):
    return batch


@pytest.mark.parametrize("shape", ["dict", "triple", "alone", "nested"])
def test_users_dataset_returning_another_shape_compiles_as_torch_batches_it(flat_folder, shape):
    """A dict, a longer tuple, the image alone, nested containers: compiled, and batch by batch what torch's
    DataLoader gives (default_collate's batch, a collate_fn's items, a shuffle), with the image's pixels."""
    mine = Shaped(flat_folder / "images", flat_folder / "labels.txt", TF, shape=shape)
    for kw in (dict(), dict(collate_fn=as_list), dict(shuffle=True)):
        g = lambda: torch.Generator().manual_seed(3)  # noqa: E731
        ours = DataLoader(mine, batch_size=4, device="cpu", generator=g(), **kw)
        assert ours.backend == "dali", ours.reason
        theirs = list(tud.DataLoader(mine, batch_size=4, generator=g(), **kw))
        got = list(ours)
        assert len(got) == len(theirs)
        for a, b in zip(got, theirs):
            pa, pb = torch.utils._pytree.tree_flatten(a), torch.utils._pytree.tree_flatten(b)
            assert pa[1] == pb[1]  # the same containers, keys and lengths
            for x, y in zip(pa[0], pb[0]):
                assert type(x) is type(y)
                if isinstance(y, torch.Tensor) and y.ndim >= 3:  # the images (decoders differ by rounding)
                    assert abs_diff_stats(x, y)["mean"] < TOL["cpu"]
                elif isinstance(y, torch.Tensor):
                    assert torch.equal(x, y)
                else:
                    assert x == y
    # a ConcatDataset of two such parts of one shape is one compiled dataset; parts of two shapes are not
    concat = tud.ConcatDataset([tud.Subset(mine, [4, 1, 2]), mine])
    ours, theirs = DataLoader(concat, batch_size=4, device="cpu"), list(tud.DataLoader(concat, batch_size=4))
    assert ours.backend == "dali", ours.reason
    for a, b in zip(ours, theirs):
        assert torch.utils._pytree.tree_flatten(a)[1] == torch.utils._pytree.tree_flatten(b)[1]
    other = TutorialDataset(flat_folder / "images", flat_folder / "labels.txt", TF)
    with pytest.warns(FallbackWarning, match="ConcatDataset of datasets whose samples differ in shape"):
        assert DataLoader(tud.ConcatDataset([mine, other]), batch_size=4, device="cpu").backend == "torchvision"
    # a collate_fn that changes the samples it is given in place changes nothing for the next epoch
    def marks(batch):
        for sample in batch:
            sample["inputs"]["meta"].append("seen")
        return batch
    nested = Shaped(flat_folder / "images", flat_folder / "labels.txt", TF, shape="nested")
    loader = DataLoader(nested, batch_size=4, device="cpu", collate_fn=marks)
    for _ in range(2):
        assert all(len(s["inputs"]["meta"]) == 3 for b in loader for s in b)

    def tags(batch):  # (the (image, target) shape: its targets' containers too)
        for _, target in batch:
            target["tags"].append("seen")
        return batch
    pair = DataLoader(Shaped(flat_folder / "images", flat_folder / "labels.txt", TF, shape="pair"), batch_size=4,
                      device="cpu", collate_fn=tags)
    for _ in range(2):
        assert all(len(t["tags"]) == 2 for b in pair for _, t in b)
    moves = Shaped(flat_folder / "images", flat_folder / "labels.txt", TF, shape="moves")
    with pytest.warns(FallbackWarning, match="returns its image at another place for index 1"):
        assert DataLoader(moves, batch_size=4, device="cpu").backend == "torchvision"


class OpensInAnotherThreadToo(TutorialDataset):
    """While its __getitem__ is probed, another thread opens a real file."""

    def __getitem__(self, i):
        import threading

        sizes = []
        other = threading.Thread(target=lambda: sizes.append(Image.open(self.other).size))
        other.start()
        other.join()
        self.sizes.append(sizes[0])
        return super().__getitem__(i)


def test_discovery_intercepts_only_its_own_thread_and_restores_pil(flat_folder):
    real_open = Image.open
    mine = OpensInAnotherThreadToo(flat_folder / "images", flat_folder / "labels.txt", TF)
    mine.other = sorted((flat_folder / "images").glob("*.jpg"))[0]
    mine.sizes = []
    assert DataLoader(mine, batch_size=4, device="cpu").backend == "dali"
    assert Image.open is real_open
    # (each index probed once, the first and last once more: discover._made_without_the_image)
    assert len(mine.sizes) == len(mine) + 2 and set(mine.sizes) == {Image.open(mine.other).size}


class WithoutConvert(TutorialDataset):
    """Hands its transform the image as PIL opens it (no convert("RGB"))."""

    def __getitem__(self, i):
        name, *labels = self.rows[i]
        return self.transform(Image.open(os.path.join(self.root, name))), torch.tensor([int(v) for v in labels])


@pytest.mark.parametrize("grey", [False, True])
def test_a_dataset_without_convert_compiles_only_where_its_files_open_as_rgb(flat_folder, tmp_path, grey):
    """Without convert("RGB") torchvision's transform gets each file in the mode PIL opens it in: a folder of
    RGB photos compiles; one with a grey JPEG among them runs on torch's DataLoader, naming that file (the
    graph decodes RGB: its batches had three channels where torchvision's have one). Either way the batches
    are torchvision's, and PIL's open and convert are PIL's again after the probe."""
    import shutil

    root = tmp_path / "images"
    shutil.copytree(flat_folder / "images", root)
    if grey:
        Image.open(root / "image_00003.jpg").convert("L").save(root / "image_00003.jpg")
    mine = WithoutConvert(root, flat_folder / "labels.txt", T.Compose([T.Resize(24), T.CenterCrop(24), T.ToTensor()]))
    real = Image.open, Image.Image.convert
    if grey:
        with pytest.warns(FallbackWarning, match="image_00003.jpg opens in mode L.*convert the image to RGB"):
            loader = DataLoader(mine, batch_size=1, device="cpu")
    else:
        loader = DataLoader(mine, batch_size=1, device="cpu")
    assert (Image.open, Image.Image.convert) == real
    assert loader.backend == ("torchvision" if grey else "dali"), loader.reason
    shapes = []
    for (x, y), (xt, yt) in zip(loader, tud.DataLoader(mine, batch_size=1)):  # (one a batch: the grey one has
        assert x.shape == xt.shape and torch.equal(y, yt)                   # one channel, the others three)
        assert (x - xt).abs().mean() < 1 / 255
        shapes.append(x.shape[1])
    assert len(shapes) == len(mine) and shapes.count(1) == int(grey)


def test_image_list_formats(tmp_path, flat_folder):
    src = sorted((flat_folder / "images").glob("*.jpg"))[:3]
    csv = tmp_path / "list.csv"
    csv.write_text("path,label\n" + "".join(f"{p},{k}\n" for k, p in enumerate(src)))
    ds = datasets.ImageList(csv, classes=["a", "b", "c"])
    assert ds.targets == [0, 1, 2] and ds.classes == ["a", "b", "c"] and ds.samples[0][0] == str(src[0])
    tsv = tmp_path / "sub" / "list.tsv"
    tsv.parent.mkdir()
    tsv.write_text("# comment\n\n" + "".join(f"{os.path.relpath(p, tsv.parent)}\t{k}\t{k + 1}\n" for k, p in enumerate(src)))
    ds = datasets.ImageList(tsv)
    assert [t.tolist() for t in ds.targets] == [[0, 1], [1, 2], [2, 3]]
    assert os.path.samefile(ds.samples[1][0], src[1])
    pairs = datasets.ImageList([(str(p), 7) for p in src], transform=TF)
    x, y = pairs[0]
    assert y == 7 and x.shape == (3, 48, 48)
    bad = tmp_path / "bad.txt"
    bad.write_text("a.jpg 1\nb.jpg x\n")
    with pytest.raises(ValueError, match="line 2: labels must be integers"):
        datasets.ImageList(bad)
    labels = next(iter(DataLoader(datasets.ImageList(csv, transform=TF), batch_size=3, device="cpu")))[1]
    assert labels.tolist() == [0, 1, 2] and labels.dtype == torch.int64


def test_every_dataset_fallback_reason_gives_advice_that_fits(flat_folder, indexed_folder, monkeypatch):
    """Each reason a dataset runs on torch's DataLoader says what would compile instead, and the advice
    fits the case (encoded bytes in memory are not pointed at ImageList, which needs files)."""
    import gputransforms.backends as B

    class Stream(tud.IterableDataset):
        def __iter__(self):
            yield from ()

    cases = {
        "bytes in memory": (FromBytes(flat_folder / "images", flat_folder / "labels.txt", TF), "gputransforms.compile"),
        "iterable": (Stream(), "ImageList"),
        "custom loader": (datasets.ImageFolder(str(indexed_folder), transform=TF, loader=lambda p: Image.open(p)),
                          "leave loader= at its default"),
        "joint transforms": (torchvision.datasets.ImageFolder(str(indexed_folder), transform=TF),
                             "pass it as transform="),
    }
    cases["joint transforms"][0].transforms = lambda img, target: (TF(img), target)  # as VisionDataset(transforms=)
    for name, (ds, advice) in cases.items():
        with pytest.warns(FallbackWarning) as caught:
            loader = DataLoader(ds, batch_size=4, device="cpu")
        assert loader.backend == "torchvision", name
        assert advice in str(caught[0].message), (name, str(caught[0].message))
    monkeypatch.setattr(B, "dali_available", lambda: False)
    with pytest.warns(FallbackWarning, match=r"gputransforms\[cu13\]"):
        DataLoader(datasets.ImageFolder(str(indexed_folder), transform=TF), batch_size=4, device="cpu")


class RandomLabel(TutorialDataset):
    def __getitem__(self, i):
        img = Image.open(os.path.join(self.root, self.rows[i][0])).convert("RGB")
        return self.transform(img), float(torch.rand(()))


def test_a_random_value_outside_the_transform_runs_on_torch(flat_folder):
    """torch's DataLoader draws it anew for each sample and epoch; a record of one draw would not."""
    mine = RandomLabel(flat_folder / "images", flat_folder / "labels.txt", TF)
    with pytest.warns(FallbackWarning, match="from the image or at random"):
        assert DataLoader(mine, batch_size=4, device="cpu").backend == "torchvision"


class Empty(TutorialDataset):
    def __len__(self):
        return 0


def test_an_empty_users_dataset_gives_no_batch_as_torch(flat_folder):
    mine = Empty(flat_folder / "images", flat_folder / "labels.txt", TF)
    assert list(DataLoader(mine, batch_size=4, device="cpu")) == list(tud.DataLoader(mine, batch_size=4)) == []


class _Meta:
    """A target object made anew per call, without ``==`` of its own (equal only to itself)."""

    def __init__(self, name):
        self.name = name


class TargetsMadeAnew(TutorialDataset):
    def __getitem__(self, i):
        img = Image.open(os.path.join(self.root, self.rows[i][0])).convert("RGB")
        return self.transform(img), {"score": float("nan") if i % 2 else 1.0,
                                     "v": torch.tensor([float("nan"), float(i)]),
                                     "big": np.arange(3000) * (i + 1), "meta": _Meta(self.rows[i][0])}


def test_targets_made_anew_alike_are_not_taken_for_targets_made_from_the_image(flat_folder):
    """A NaN (not equal to itself), a tensor holding one, a long array (its repr elides the middle) and an object
    with no ``==`` of its own, made anew on each call: the re-run on a black image gives the same target, so
    the dataset compiles (it used to fall back as made from the image); the targets are the dataset's."""
    mine = TargetsMadeAnew(flat_folder / "images", flat_folder / "labels.txt", TF)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        loader = DataLoader(mine, batch_size=4, device="cpu", collate_fn=lambda b: b)
    assert loader.backend == "dali", loader.reason
    for ours, theirs in zip(loader, tud.DataLoader(mine, batch_size=4, collate_fn=lambda b: b)):
        for (x, t), (xt, tt) in zip(ours, theirs):
            assert abs_diff_stats(x, xt)["mean"] < TOL["cpu"]
            assert (t["score"] == tt["score"]) or (t["score"] != t["score"] and tt["score"] != tt["score"])
            assert torch.equal(t["v"].nan_to_num(-1), tt["v"].nan_to_num(-1))
            assert np.array_equal(t["big"], tt["big"]) and t["meta"].name == tt["meta"].name


def test_same_tells_values_apart_where_reprs_agree():
    """The comparison behind the re-run: a long array that differs in its middle is not the same (its repr
    elides it), nor objects whose attributes differ; NaN is NaN."""
    from gputransforms.compiler.joint import same

    a = np.arange(3000)
    b = a.copy()
    b[1500] = -1
    assert repr(a) == repr(b) and not same(a, b) and same(a, a.copy())
    assert not same(_Meta("x"), _Meta("y")) and same(_Meta("x"), _Meta("x"))
    assert same(float("nan"), float("nan")) and not same(float("nan"), 1.0)
    assert same(torch.tensor([float("nan"), 1.0]), torch.tensor([float("nan"), 1.0]))
    assert not same(torch.tensor([float("nan"), 1.0]), torch.tensor([1.0, float("nan")]))


@pytest.mark.parametrize("where", [0, -1])
def test_a_bad_first_or_last_file_of_a_users_dataset_is_named_not_a_fallback(flat_folder, tmp_path, where):
    """The first and last indices run again on black images of their files' sizes (the check that the target
    is not made from the image): a file whose header PIL cannot read there sent the whole Dataset to torch's
    DataLoader, as 'made from the image or at random'. It is passed over for its neighbour; the loop names
    it (torch's raises PIL's OSError), or skips it."""
    from gputransforms import BadSampleError, SkippedSamplesWarning

    mine = TutorialDataset(flat_folder / "images", flat_folder / "labels.txt", TF)
    bad = tmp_path / "garbage.jpg"
    bad.write_bytes(b"\xff\xd8\xff\xe0" + b"not a jpeg" * 20)
    mine.rows[where] = [str(bad)] + mine.rows[where][1:]
    with pytest.raises(OSError):
        list(tud.DataLoader(mine, batch_size=4))
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        loader = DataLoader(mine, batch_size=4, device="cpu")
    assert loader.backend == "dali", loader.reason
    with pytest.raises(BadSampleError, match="garbage.jpg"):
        list(loader)
    with pytest.warns(SkippedSamplesWarning):
        assert sum(len(y) for _, y in DataLoader(mine, batch_size=4, device="cpu", on_error="skip")) == len(mine) - 1


@pytest.mark.parametrize("device", DEVICES)
def test_oxford_pet_wrapped_for_v2_moves_its_trimaps_with_the_image(tmp_path, device):
    """OxfordIIITPet with its trimaps, wrapped for torchvision's v2 transforms (the trimap a tv_tensors.Mask, the
    label beside it), a random joint chain: compiled as VOCSegmentation is (it ran on torch's DataLoader); from
    one seed the same labels and masks as torch's DataLoader, exactly, images within the image path's parity;
    with 2 workers every sample once."""
    from torchvision import tv_tensors
    from torchvision.transforms import v2

    oxford_pet(tmp_path)
    base = tmp_path / "oxford-iiit-pet"
    rng = np.random.default_rng(7)
    for name in [r.split()[0] for r in (base / "annotations" / "trainval.txt").read_text().split("\n") if r]:
        with Image.open(base / "images" / f"{name}.jpg") as im:
            w, h = im.size
        (base / "annotations" / "trimaps").mkdir(exist_ok=True)
        Image.fromarray(rng.integers(1, 4, (h, w)).astype(np.uint8)).save(base / "annotations" / "trimaps" / f"{name}.png")
    chain = v2.Compose([v2.ToImage(), v2.RandomResize(40, 80), v2.RandomCrop(48, pad_if_needed=True, fill={
                            tv_tensors.Mask: 255, "others": 0}), v2.RandomHorizontalFlip(),
                        v2.ToDtype({tv_tensors.Image: torch.float32, "others": None}, scale=True)])
    ds = torchvision.datasets.wrap_dataset_for_transforms_v2(torchvision.datasets.OxfordIIITPet(
        str(tmp_path), split="trainval", target_types=["category", "segmentation"], transforms=chain))
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        loader = DataLoader(ds, batch_size=2, device=device)
    assert loader.backend == "dali", loader.reason
    torch.manual_seed(4)
    ours = list(loader)
    torch.manual_seed(4)
    theirs = list(tud.DataLoader(ds, batch_size=2))
    assert len(ours) == len(theirs) == 3
    for (x, (label, mask)), (xt, (label_t, mask_t)) in zip(ours, theirs):
        assert torch.equal(label.cpu(), label_t) and type(mask) is type(mask_t)
        assert torch.equal(mask.cpu(), mask_t) and mask.shape[-2:] == (48, 48)
        assert abs_diff_stats(x, xt)["mean"] < TOL[device] / 255
    labels = [y for _, (ys, _) in DataLoader(ds, batch_size=2, device=device, num_workers=2, shuffle=True) for y in ys]
    assert len(labels) == len(ds)
