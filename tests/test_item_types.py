"""What a collate_fn of the user's receives, item by item, is of torchvision's types: a v2 chain after
``ToImage`` hands ``tv_tensors.Image`` (tuples of them from FiveCrop), a chain without a conversion hands PIL
images, a v1 chain plain tensors. Side by side with torch's DataLoader over ImageFolder, a Hugging Face table,
webdataset shards and in-memory datasets; and the in-memory grayscale and Normalize cases whose channels
torchvision's PIL path and v2 kernels decide."""
import numpy as np
import PIL.Image
import pytest
import torch
import torch.utils.data as tud
import torchvision
import torchvision.transforms as T1
from torchvision import tv_tensors
from torchvision.transforms import v2 as T2

from gputransforms import DataLoader, sampledata
from gputransforms.compiler.chain import output_kind

from conftest import DEVICES
from test_inmemory import fake

N = [0.5] * 3
CHAINS = {
    "v2 ToImage": T2.Compose([T2.ToImage(), T2.Resize(40), T2.CenterCrop(32), T2.ToDtype(torch.float32, scale=True),
                              T2.Normalize(N, N)]),
    "v2 uint8": T2.Compose([T2.ToImage(), T2.Resize((32, 32))]),
    "v2 FiveCrop": T2.Compose([T2.ToImage(), T2.Resize((32, 32)), T2.FiveCrop(16)]),
    "v2 ToPureTensor": T2.Compose([T2.ToImage(), T2.Resize((32, 32)), T2.ToPureTensor()]),
    "v2 PILToTensor": T2.Compose([T2.Resize((32, 32)), T2.PILToTensor()]),
    "v1 ToTensor": T1.Compose([T1.Resize((32, 32)), T1.ToTensor()]),
    "PIL out, v1": T1.Compose([T1.Resize((32, 32))]),
    "PIL out, v2": T2.Compose([T2.Resize((32, 32))]),
    # on PIL images after the graph (FiveCrop before the conversion), and a function of the user's before ToImage
    "FiveCrop, then ToImage": T2.Compose([T2.Resize((32, 32)), T2.FiveCrop(16), T2.ToImage()]),
    "Lambda, then ToImage": T2.Compose([T2.Resize((32, 32)), T1.Lambda(lambda im: T1.functional.crop(im, 2, 3, 10, 12)),
                                        T2.ToImage()]),
    # torch.nn.Sequential as the chain or a part of it (torchvision's docs chain scriptable transforms so), and
    # RandomApply's documented nn.ModuleList
    "nn.Sequential": torch.nn.Sequential(T2.ToImage(), T2.Resize((32, 32)), T2.ToDtype(torch.float32, scale=True)),
    "nn.Sequential in Compose": T2.Compose([T2.ToImage(), torch.nn.Sequential(T2.Resize((32, 32)), T2.CenterCrop(24))]),
    "RandomApply of a ModuleList": T2.Compose([T2.ToImage(), T2.Resize((32, 32)), T2.RandomApply(
        torch.nn.ModuleList([T2.CenterCrop(24), T2.Resize((32, 32))]), p=1.0)]),
}
KINDS = {"v2 ToImage": "tv_image", "v2 uint8": "tv_image", "v2 FiveCrop": "tv_image", "v2 ToPureTensor": "tensor",
         "v2 PILToTensor": "tensor", "v1 ToTensor": "tensor", "PIL out, v1": "pil", "PIL out, v2": "pil",
         "FiveCrop, then ToImage": "tv_image", "Lambda, then ToImage": "tv_image", "nn.Sequential": "tv_image",
         "nn.Sequential in Compose": "tv_image", "RandomApply of a ModuleList": "tv_image"}


def as_list(batch):
    return batch


def _leaves(x):
    if isinstance(x, (list, tuple)):
        return [leaf for c in x for leaf in _leaves(c)]
    if isinstance(x, dict):
        return [leaf for c in x.values() for leaf in _leaves(c)]
    return [x]


def same_items(ours, theirs, tol: float):
    """Batch by batch, item by item: the same nesting, the same types, pixels within ``tol`` (0-255 units)."""
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        la, lb = _leaves(a), _leaves(b)
        assert len(la) == len(lb)
        for x, y in zip(la, lb):
            assert type(x) is type(y), (type(x), type(y))
            if isinstance(y, PIL.Image.Image):
                assert (x.size, x.mode) == (y.size, y.mode)
                x, y = torch.from_numpy(np.asarray(x)).double(), torch.from_numpy(np.asarray(y)).double()
            elif isinstance(y, torch.Tensor):
                assert x.shape == y.shape and x.dtype == y.dtype
                scale = 255 if y.is_floating_point() else 1
                x, y = x.cpu().double() * scale, y.double() * scale
            else:
                assert x == y
                continue
            assert (x - y).abs().mean() < tol


def test_output_kind_is_what_torchvision_hands_out(photo_folder):
    ds = torchvision.datasets.ImageFolder(str(photo_folder))
    img = ds[0][0]
    for name, tf in CHAINS.items():
        out = tf(img)
        out = out[0] if isinstance(out, tuple) else out
        real = "pil" if isinstance(out, PIL.Image.Image) else \
            "tv_image" if isinstance(out, tv_tensors.Image) else "tensor"
        assert output_kind(tf) == KINDS[name] == real, name
    # where code of the user's decides: not claimed
    assert output_kind(T2.Compose([T2.ToImage(), T2.Lambda(lambda x: x * 2)])) is None
    assert output_kind(T2.Compose([T2.ToImage(), T1.RandomHorizontalFlip()])) is None  # v1 on a tv_tensor


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(CHAINS))
def test_imagefolder_items_have_torchvisions_types(photo_folder, device, name):
    tf = CHAINS[name]
    for kw in (dict(batch_size=4, collate_fn=as_list), dict(batch_size=4)):
        try:
            theirs = list(tud.DataLoader(torchvision.datasets.ImageFolder(str(photo_folder), transform=tf), **kw))
        except TypeError:  # (default_collate of PIL images: ours raises it as the loader is built)
            with pytest.raises(TypeError):
                list(DataLoader(torchvision.datasets.ImageFolder(str(photo_folder), transform=tf), device=device, **kw))
            continue
        dl = DataLoader(torchvision.datasets.ImageFolder(str(photo_folder), transform=tf), device=device,
                        num_workers=0, **kw)
        assert dl.backend == "dali", dl.reason
        same_items(list(dl), theirs, tol=1.5 if device == "cpu" else 3.0)


@pytest.mark.parametrize("name", ["v2 ToImage", "v2 FiveCrop", "PIL out, v1"])
def test_hf_and_webdataset_items_have_torchvisions_types(photo_folder, tmp_path, name):
    datasets = pytest.importorskip("datasets")
    wds = pytest.importorskip("webdataset")
    tf = CHAINS[name]
    kw = dict(batch_size=4, collate_fn=as_list)
    shards = sampledata.write_shards(photo_folder, tmp_path / "shards", per_shard=8)

    def web():
        return wds.WebDataset(shards, shardshuffle=False).decode("pil").to_tuple("jpg;png", "cls").map_tuple(
            tf, lambda y: y)

    classes = sorted(d.name for d in photo_folder.iterdir() if d.is_dir())
    paths = [p for c in classes for p in sorted((photo_folder / c).iterdir())]
    feats = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=classes)})
    table = datasets.Dataset.from_dict({"image": [{"bytes": p.read_bytes(), "path": None} for p in paths],
                                        "label": [classes.index(p.parent.name) for p in paths]}, features=feats)
    global TF
    TF = tf

    def preprocess(batch):
        batch["pixel_values"] = [TF(img.convert("RGB")) for img in batch["image"]]
        del batch["image"]
        return batch

    for make in (web, lambda: table.with_transform(preprocess)):
        theirs = list(tud.DataLoader(make(), **kw))
        dl = DataLoader(make(), device="cpu", **kw)
        assert dl.backend == "dali", dl.reason
        same_items(list(dl), theirs, tol=1.5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cls", [torchvision.datasets.CIFAR10, torchvision.datasets.MNIST])
@pytest.mark.parametrize("name", ["v2 ToImage", "v2 FiveCrop", "v1 ToTensor", "PIL out, v1", "grey 3", "v2 grey 3"])
def test_in_memory_items_and_channels_as_torchvision(device, cls, name):
    """MNIST's "L" images: Grayscale(3) makes three channels of them (PIL's, and v2's kernel), v2's Normalize with
    three means broadcasts them to three (v1's raises, in place); the PIL-out chain runs on torch's DataLoader."""
    tf = {"grey 3": T1.Compose([T1.Grayscale(3), T1.ToTensor()]),
          "v2 grey 3": T2.Compose([T2.ToImage(), T2.Grayscale(3), T2.ToDtype(torch.float32, scale=True)])
          }.get(name) or CHAINS[name]
    for collate in (as_list, None):
        kw = dict(batch_size=4) if collate is None else dict(batch_size=4, collate_fn=collate)
        try:
            theirs = list(tud.DataLoader(fake(cls, n=12, transform=tf), **kw))
        except TypeError:  # (default_collate of PIL images)
            with pytest.raises(TypeError):
                list(DataLoader(fake(cls, n=12, transform=tf), device=device, **kw))
            continue
        dl = DataLoader(fake(cls, n=12, transform=tf), device=device, **kw)
        assert dl.backend == ("torchvision" if name.startswith("PIL") else "arrays"), dl.reason
        same_items(list(dl), theirs, tol=1.0)  # (PIL's grey against the tensor kernel's: up to one level)


def test_v1_normalize_with_more_means_than_channels_raises_as_torchvision():
    tf = T1.Compose([T1.ToTensor(), T1.Normalize(N, N)])
    with pytest.raises(RuntimeError):
        list(tud.DataLoader(fake(torchvision.datasets.MNIST, n=8, transform=tf), batch_size=4))
    with pytest.raises(RuntimeError):
        list(DataLoader(fake(torchvision.datasets.MNIST, n=8, transform=tf), batch_size=4, device="cpu"))


@pytest.mark.parametrize("kind", ["files", "in memory"])
def test_string_targets_batch_as_default_collate_makes_them(photo_folder, kind):
    """default_collate keeps a batch of strings as the tuple its transposition makes (targets through a
    target_transform that names the class)."""
    tf = T1.Compose([T1.Resize((16, 16)), T1.ToTensor()])

    def make():
        if kind == "files":
            return torchvision.datasets.ImageFolder(str(photo_folder), transform=tf, target_transform=lambda y: f"c{y}")
        ds = fake(torchvision.datasets.CIFAR10, n=12, transform=tf)
        ds.target_transform = lambda y: f"c{y}"
        return ds

    theirs = list(tud.DataLoader(make(), batch_size=4))
    ours = list(DataLoader(make(), batch_size=4, device="cpu"))
    assert [type(b[1]) for b in ours] == [type(b[1]) for b in theirs] == [tuple] * len(theirs)
    assert [b[1] for b in ours] == [b[1] for b in theirs]


def _types_seen(loader_of, tf, photo_folder) -> set:
    seen = []

    def spy(x):
        seen.append(type(x))
        return x
    chain = T2.Compose([t if t != "spy" else T2.Lambda(spy) for t in tf])
    list(loader_of(torchvision.datasets.ImageFolder(str(photo_folder), transform=chain)))
    return set(seen)


@pytest.mark.parametrize("device", DEVICES)
def test_steps_after_the_graph_are_handed_torchvisions_types(photo_folder, device):
    """A function of the user's run after the graph gets a tv_tensors.Image where torchvision's chain hands it
    one (after v2's ToImage), a plain tensor after ToPureTensor or PILToTensor; v2's UniformTemporalSubsample
    passes an image through, as torchvision's does."""
    ours = lambda ds: DataLoader(ds, batch_size=4, device=device)  # noqa: E731
    theirs = lambda ds: tud.DataLoader(ds, batch_size=4)  # noqa: E731
    for tf in ([T2.ToImage(), T2.Resize((32, 32)), "spy", T2.ToDtype(torch.float32, scale=True)],
               [T2.ToImage(), T2.Resize((32, 32)), T2.ToPureTensor(), "spy"],
               [T2.PILToTensor(), T2.Resize((32, 32)), "spy"]):
        assert _types_seen(ours, tf, photo_folder) == _types_seen(theirs, tf, photo_folder)
    tf = T2.Compose([T2.ToImage(), T2.Resize((32, 32)), T2.UniformTemporalSubsample(2)])
    a = torch.cat([x for x, _ in ours(torchvision.datasets.ImageFolder(str(photo_folder), transform=tf))])
    b = torch.cat([x for x, _ in theirs(torchvision.datasets.ImageFolder(str(photo_folder), transform=tf))])
    assert a.shape == b.shape and (a.cpu().double() - b.double()).abs().mean() < (1.5 if device == "cpu" else 3.0)


def test_a_sequential_with_a_hook_runs_as_written(photo_folder):
    """A hook on the Sequential is the user's code around it: the Sequential is not opened into the graph's
    steps, it runs per sample as written, and the hook sees every sample (as in torch's DataLoader)."""
    seen = []
    seq = torch.nn.Sequential(T2.Resize((32, 32)), T2.CenterCrop(24))
    seq.register_forward_hook(lambda module, args, out: seen.append(tuple(out.shape)))
    tf = T2.Compose([T2.ToImage(), seq, T2.ToDtype(torch.float32, scale=True)])
    ds = torchvision.datasets.ImageFolder(str(photo_folder), transform=tf)
    theirs = list(tud.DataLoader(ds, batch_size=4))
    n = len(seen)
    ours = list(DataLoader(ds, batch_size=4, device="cpu"))
    assert n == len(ds) and len(seen) == 2 * n and set(seen) == {(3, 24, 24)}
    same_items(ours, theirs, tol=1.5)
