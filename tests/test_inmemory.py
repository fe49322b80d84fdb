"""In-memory datasets (CIFAR10/100, the MNIST family, SVHN, STL10, TensorDataset) passed unchanged to
gputransforms.DataLoader, side by side with torch's DataLoader over the same object. Their arrays
hold real photos (scaled down) written into torchvision's own classes, attribute for attribute, as
the datasets' loaders leave them."""
import numpy as np
import pytest
import torch
import torch.utils.data as tud
import torchvision
from PIL import Image
from scipy import stats

from gputransforms import DataLoader, FallbackWarning, sampledata
from gputransforms import transforms as T

from conftest import DEVICES

CIFAR_MEAN, CIFAR_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)


def photos(n: int, size: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.stack([np.asarray(sampledata.photo(rng, long_side=160).resize((size, size), Image.BILINEAR))
                     for _ in range(n)])


def fake(cls, n=60, transform=None, seed=0):
    """A torchvision in-memory dataset object as its constructor leaves it, with photo pixels."""
    ds = cls.__new__(cls)
    rng = np.random.default_rng(seed)
    ds.root, ds.transform, ds.target_transform, ds.transforms = "unused", transform, None, None
    if issubclass(cls, torchvision.datasets.CIFAR10):
        ds.data = photos(n, 32, seed)
        ds.targets = [int(t) for t in rng.integers(0, 10, n)]
    elif issubclass(cls, torchvision.datasets.MNIST):
        ds.data = torch.from_numpy(photos(n, 28, seed).mean(-1).astype(np.uint8))
        ds.targets = torch.from_numpy(rng.integers(0, 10, n))
    elif cls is torchvision.datasets.SVHN:
        ds.data = photos(n, 32, seed).transpose(0, 3, 1, 2).copy()
        ds.labels = rng.integers(0, 10, n)
    elif cls is torchvision.datasets.STL10:
        ds.data = photos(n, 96, seed).transpose(0, 3, 1, 2).copy()
        ds.labels = rng.integers(0, 10, n).astype(np.uint8)
    return ds


CLASSES = [torchvision.datasets.CIFAR10, torchvision.datasets.CIFAR100, torchvision.datasets.MNIST,
           torchvision.datasets.FashionMNIST, torchvision.datasets.KMNIST, torchvision.datasets.SVHN,
           torchvision.datasets.STL10]


def side_by_side(ds, device, **kw):
    ours = list(DataLoader(ds, device=device, generator=torch.Generator().manual_seed(3), **kw))
    theirs = list(tud.DataLoader(ds, generator=torch.Generator().manual_seed(3), **kw))
    return ours, theirs


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_deterministic_chain_equals_torchvision(cls, device):
    channels = 1 if issubclass(cls, torchvision.datasets.MNIST) else 3
    tf = T.Compose([T.ToTensor(), T.Normalize(CIFAR_MEAN[:channels], CIFAR_STD[:channels])])
    ds = fake(cls, transform=tf)
    loader = DataLoader(ds, batch_size=16, shuffle=True, device=device)
    assert loader.backend == "arrays", loader.explain()
    ours, theirs = side_by_side(ds, device, batch_size=16, shuffle=True, drop_last=False)
    assert len(ours) == len(theirs) == 4
    for (x, y), (tx, ty) in zip(ours, theirs):
        assert x.device.type == ("cuda" if device == "gpu" else "cpu") and x.shape == tx.shape
        assert torch.equal(y.cpu(), ty)
        torch.testing.assert_close(x.cpu(), tx, rtol=0, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("api", ["v1", "v2"])
def test_standard_cifar_chain_by_distribution(device, api):
    """RandomCrop(32, padding=4) + RandomHorizontalFlip: each output is one window of its own padded
    image, flipped or not; offsets uniform over 0..8, flips p=0.5; every image once per epoch."""
    from torchvision.transforms import v2

    if api == "v1":
        tf = T.Compose([T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), T.PILToTensor()])
    else:
        tf = v2.Compose([v2.PILToTensor(), v2.RandomCrop(32, padding=4), v2.RandomHorizontalFlip()])
    ds = fake(torchvision.datasets.CIFAR10, n=200, transform=tf)
    ref = torch.nn.functional.pad(torch.from_numpy(ds.data).permute(0, 3, 1, 2), (4, 4, 4, 4))  # (N, 3, 40, 40)
    ys, xs, flips = [], [], []
    for epoch in range(3):
        g = torch.Generator().manual_seed(epoch)
        order = [i for b in tud.DataLoader(range(len(ds)), batch_size=64, shuffle=True, generator=g) for i in b.tolist()]
        torch.manual_seed(7 + epoch)  # the augmentations' draws: not whatever the tests before left
        out = torch.cat([x.cpu() for x, _ in DataLoader(ds, batch_size=64, shuffle=True, device=device,
                                                        generator=torch.Generator().manual_seed(epoch))])
        assert len(out) == len(ds)
        for img, i in zip(out, order):
            cands = torch.stack([ref[i], ref[i].flip(-1)]).unfold(2, 32, 1).unfold(3, 32, 1)  # (2, 3, 9, 9, 32, 32)
            err = (cands.float() - img.float()[None, :, None, None]).abs().sum(dim=(1, 4, 5))  # (2, 9, 9)
            f, y, x = np.unravel_index(int(err.argmin()), tuple(err.shape))
            assert err[f, y, x] == 0  # exactly that window of that image (the sampler's)
            # a flip of the padded image moves the window: read the offset in the unflipped frame
            flips.append(f)
            ys.append(y)
            xs.append(8 - x if f else x)
    assert stats.binomtest(sum(flips), len(flips), 0.5).pvalue > 1e-3
    for vals in (ys, xs):
        assert stats.chisquare(np.bincount(vals, minlength=9)).pvalue > 1e-3


@pytest.mark.parametrize("device", DEVICES)
def test_random_crop_pad_if_needed(device):
    """pad_if_needed pads by the shortfall on both sides, as torchvision does: a 40x40 crop of a
    32x32 image is one window of the image padded by 8 on each side, at offsets 0..8."""
    tf = T.Compose([T.RandomCrop(40, pad_if_needed=True), T.PILToTensor()])
    ds = fake(torchvision.datasets.CIFAR10, n=100, transform=tf)
    ref = torch.nn.functional.pad(torch.from_numpy(ds.data).permute(0, 3, 1, 2), (8, 8, 8, 8))  # (N, 3, 48, 48)
    offsets = []
    for _ in range(3):
        out = torch.cat([x.cpu() for x, _ in DataLoader(ds, batch_size=50, device=device)])
        for img, r in zip(out, ref):
            err = (r.unfold(1, 40, 1).unfold(2, 40, 1).float() - img.float()[:, None, None]).abs().sum((0, 3, 4))
            assert err.min() == 0
            offsets.append(int(err.argmin()))
    assert stats.chisquare(np.bincount(offsets, minlength=81)).pvalue > 1e-3


@pytest.mark.parametrize("api", ["v1", "v2"])
def test_which_chains_are_captured_as_a_cuda_graph(api):
    """The standard chains qualify for the CUDA graph (gather, crop, flip, conversion, Normalize);
    a chain with a transform whose parameters are drawn per sample in Python does not."""
    from torchvision.transforms import v2

    from gputransforms.compiler import graphed, stages

    if api == "v1":
        std = [T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(CIFAR_MEAN, CIFAR_STD)]
    else:
        std = [v2.PILToTensor(), v2.RandomCrop(32, padding=4, padding_mode="reflect"), v2.RandomHorizontalFlip(),
               v2.ToDtype(torch.float32, scale=True), v2.Normalize(CIFAR_MEAN, CIFAR_STD)]
    assert graphed.capturable(stages.in_memory(T.Compose(std)))
    assert not graphed.capturable(stages.in_memory(T.Compose(std + [T.RandomErasing()])))
    assert not graphed.capturable(stages.in_memory(T.Compose([T.ColorJitter(0.4)] + std)))


@pytest.mark.gpu
@pytest.mark.parametrize("api", ["v1", "v2"])
def test_cuda_graph_gives_the_op_by_op_images(monkeypatch, api):
    """Replayed as a CUDA graph, the standard chain gives exactly the images and targets of the
    op-by-op path from the same seeds (the same parameter draws), the short last batch included."""
    from torchvision.transforms import v2

    from gputransforms.compiler import graphed

    if api == "v1":
        tf = T.Compose([T.RandomCrop(32, padding=4, padding_mode="reflect"), T.RandomHorizontalFlip(), T.ToTensor(),
                        T.Normalize(CIFAR_MEAN, CIFAR_STD)])
    else:
        tf = v2.Compose([v2.ToImage(), v2.RandomCrop(32, padding=4), v2.RandomVerticalFlip(),
                         v2.ToDtype(torch.float32, scale=True), v2.Normalize(CIFAR_MEAN, CIFAR_STD)])
    ds = fake(torchvision.datasets.CIFAR10, n=200, transform=tf)

    def run():
        torch.manual_seed(11)
        loader = DataLoader(ds, batch_size=64, shuffle=True, device="gpu", generator=torch.Generator().manual_seed(2))
        out = [(x.cpu(), y.cpu()) for _ in range(2) for x, y in loader]
        return loader, out

    loader, got = run()
    assert "one CUDA graph" in loader.explain() and loader._backend.arrays._graphed[1] is not None
    assert sorted(loader._backend.arrays._graphed[1].graphs) == [8, 64]
    monkeypatch.setattr(graphed, "build", lambda *a: None)
    loader, ref = run()
    assert loader._backend.arrays._graphed[1] is None
    assert [len(x) for x, _ in got] == [64, 64, 64, 8] * 2
    for (x, y), (rx, ry) in zip(got, ref):
        assert torch.equal(y, ry) and torch.equal(x, rx)


@pytest.mark.parametrize("device", DEVICES)
def test_recipe_variants_run_on_the_batch(device):
    """TrivialAugment / AutoAugment (cifar10 policy) run per sample on the device with torchvision's
    own tensor kernels; RandomErasing in the batched stage; the result is in range and labelled."""
    for extra in ([T.TrivialAugmentWide()], [T.AutoAugment(T.AutoAugmentPolicy.CIFAR10)]):
        tf = T.Compose([T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), *extra, T.ToTensor(),
                        T.Normalize(CIFAR_MEAN, CIFAR_STD), T.RandomErasing(p=0.5)])
        ds = fake(torchvision.datasets.CIFAR10, transform=tf)
        with pytest.warns(FallbackWarning, match=type(extra[0]).__name__):
            loader = DataLoader(ds, batch_size=32, device=device)
        assert "per sample" in loader.explain() and "batched     RandomErasing" in loader.explain()
        x, y = next(iter(loader))
        assert x.shape == (32, 3, 32, 32) and x.dtype == torch.float32
        assert torch.equal(y.cpu(), torch.tensor(ds.targets[:32]))


@pytest.mark.parametrize("device", DEVICES)
def test_tensor_dataset_and_random_split(device):
    images = torch.from_numpy(photos(50, 24).transpose(0, 3, 1, 2).copy())
    labels = torch.arange(50) % 7
    td = tud.TensorDataset(images, labels)
    ours, theirs = side_by_side(td, device, batch_size=8, shuffle=True)
    assert len(ours) == len(theirs) == 7
    for (x, y), (tx, ty) in zip(ours, theirs):
        assert torch.equal(x.cpu(), tx) and torch.equal(y.cpu(), ty)
    ds = fake(torchvision.datasets.CIFAR10, transform=T.PILToTensor())
    part, _ = tud.random_split(ds, [40, 20], generator=torch.Generator().manual_seed(1))
    assert DataLoader(part, batch_size=8).backend == "arrays"
    ours, theirs = side_by_side(part, device, batch_size=8, shuffle=True)
    for (x, y), (tx, ty) in zip(ours, theirs):
        assert torch.equal(x.cpu(), tx) and torch.equal(y.cpu(), ty)


@pytest.mark.parametrize("device", DEVICES)
def test_user_collate_fn(device):
    """A collate_fn gets (image, target) pairs as torch would hand them, images transformed."""
    def collate(batch):
        return torch.stack([img.float().mean() for img, _ in batch]), [t for _, t in batch]

    ds = fake(torchvision.datasets.CIFAR10, transform=T.PILToTensor())
    ours, theirs = side_by_side(ds, device, batch_size=8, shuffle=True, collate_fn=collate)
    for (m, t), (tm, tt) in zip(ours, theirs):
        assert t == tt
        torch.testing.assert_close(m.cpu(), tm)
    td = tud.TensorDataset(torch.from_numpy(photos(20, 16).transpose(0, 3, 1, 2).copy()), torch.arange(20))
    ours, theirs = side_by_side(td, device, batch_size=8, collate_fn=collate)
    for (m, t), (tm, tt) in zip(ours, theirs):
        assert [int(x) for x in t] == [int(x) for x in tt]
        torch.testing.assert_close(m.cpu(), tm)


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_and_seeded_runs(workers):
    tf = T.Compose([T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), T.ToTensor(), T.RandomErasing(p=0.5)])
    ds = fake(torchvision.datasets.CIFAR10, n=100, transform=tf)

    def run(seed=0):
        torch.manual_seed(seed)
        return [x for x, _ in DataLoader(ds, batch_size=16, shuffle=True, num_workers=workers)]

    a, b = run(), run()
    assert all(torch.equal(p, q) for p, q in zip(a, b))
    torch.manual_seed(0)
    loader = DataLoader(ds, batch_size=16, shuffle=True, num_workers=workers)
    it = iter(loader)
    first = [next(it)[0] for _ in range(3)]
    sd = loader.state_dict()
    torch.manual_seed(123)  # another process's RNG
    resumed = DataLoader(ds, batch_size=16, shuffle=True, num_workers=workers)
    resumed.load_state_dict(sd)
    rest = [x for x, _ in resumed]
    assert all(torch.equal(p, q) for p, q in zip(first + rest, a)) and len(first + rest) == len(a)


def test_pil_only_chain_falls_back():
    tf = T.Compose([T.Lambda(lambda img: img.convert("L")), T.ToTensor()])
    ds = fake(torchvision.datasets.CIFAR10, transform=tf)
    with pytest.warns(FallbackWarning, match="Lambda"):
        loader = DataLoader(ds, batch_size=8)
    assert loader.backend == "torchvision"
    assert next(iter(loader))[0].shape == (8, 1, 32, 32)
    with pytest.raises(TypeError, match="PIL image"):
        DataLoader(fake(torchvision.datasets.CIFAR10), batch_size=8)


@pytest.mark.parametrize("device", DEVICES)
def test_nested_targets_go_where_the_images_are(device):
    """A target_transform that gives a dict: the batch's targets collated as torch's default_collate
    collates them, every tensor of them on the images' device, as the file-backed path hands them."""
    ds = fake(torchvision.datasets.CIFAR10, transform=T.PILToTensor())
    ds.target_transform = lambda y: {"cls": y, "onehot": torch.nn.functional.one_hot(torch.tensor(y), 10)}
    ours, theirs = side_by_side(ds, device, batch_size=8)
    assert len(ours) == len(theirs) == 8
    for (x, t), (tx, tt) in zip(ours, theirs):
        assert set(t) == set(tt) == {"cls", "onehot"}
        for k in tt:
            assert t[k].device == x.device and torch.equal(t[k].cpu(), tt[k])


@pytest.mark.parametrize("device", DEVICES)
def test_random_chain_with_workers_keeps_torchs_order(device):
    """With num_workers > 0 torch draws the transforms in its workers: its global generator keeps the sampler's
    draws only, and the epochs' orders depend on the seed alone. Ours draw the batch's parameters from a
    generator of the iterator's own, seeded from the base seed as torch's workers are: the same orders, epoch
    after epoch (each target is its sample's index here)."""
    tf = T.Compose([T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), T.ToTensor(), T.RandomErasing(p=0.5)])
    ds = fake(torchvision.datasets.CIFAR10, n=40, transform=tf)
    ds.targets = list(range(40))

    def run(cls, **kw):
        torch.manual_seed(3)
        loader = cls(ds, batch_size=8, shuffle=True, num_workers=2, **kw)
        return [[int(t) for _, y in loader for t in y] for _ in range(3)]

    ours = run(DataLoader, device=device)
    assert ours == run(tud.DataLoader) and ours[0] != ours[1]
