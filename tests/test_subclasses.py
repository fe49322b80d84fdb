"""A user's subclass of a stock transform runs as the user wrote it, on every path: the DALI graph,
the batched stage, in-memory data (drawn ahead, CUDA graphs) and timm's classes; v1 and v2. Each
chain is compared with torchvision on the same files: the stock lowering in the subclass's place
would crop the wrong region or flip the wrong axis (max |diff| > 100 in 0-255 units)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.utils.data as tud
import torchvision
from torchvision.transforms import functional as F
from torchvision.transforms import v2

from gputransforms import DataLoader, FallbackWarning, datasets, plan
from gputransforms import transforms as T
from gputransforms.compiler import graphed, registry, stages

from conftest import DEVICES, abs_diff_stats

API = {"v1": T, "v2": v2}


def user_classes(api):
    """A user's RandomResizedCrop that always takes the top-left quarter, a RandomHorizontalFlip that
    flips vertically, a ColorJitter that brightens by 1.5, a RandomCrop whose get_params picks the
    corner, and a flip that only changes a default (provably stock)."""
    m = API[api]

    class TopLeftCrop(m.RandomResizedCrop):
        def forward(self, img):
            w, h = F.get_image_size(img)
            return F.resized_crop(img, 0, 0, h // 2, w // 2, list(self.size), antialias=True)

    class FlipsVertically(m.RandomHorizontalFlip):
        def forward(self, img):
            return F.vflip(img)

    class Brighter(m.ColorJitter):
        def forward(self, img):
            return F.adjust_brightness(img, 1.5)

    class CornerCrop(m.RandomCrop):
        def forward(self, img):
            return F.crop(img, 0, 0, *self.size)

    class AlwaysFlip(m.RandomHorizontalFlip):
        def __init__(self):
            super().__init__(p=1.0)

    return TopLeftCrop, FlipsVertically, Brighter, CornerCrop, AlwaysFlip


def to_tensor(api):
    return T.ToTensor() if api == "v1" else v2.Compose([v2.ToImage(), v2.ToDtype(torch.float32, scale=True)])


def side_by_side(root, tf, device):
    with pytest.warns(FallbackWarning) as caught:
        ours = DataLoader(datasets.ImageFolder(str(root), transform=tf), batch_size=8, device=device)
    images = torch.cat([x.cpu() for x, _ in ours])
    ref = torchvision.datasets.ImageFolder(str(root), transform=tf)
    theirs = torch.stack([ref[i][0] for i in range(len(ref))])
    return ours, images, theirs, " ".join(str(w.message) for w in caught)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("api", ["v1", "v2"])
def test_graph_path_runs_the_users_crop_and_flip(photo_folder, device, api):
    TopLeftCrop, FlipsVertically, *_ = user_classes(api)
    tf = T.Compose([T.Resize(96), TopLeftCrop(40), FlipsVertically(), to_tensor(api)])
    loader, ours, theirs, said = side_by_side(photo_folder, tf, device)
    assert "TopLeftCrop" in said and "FlipsVertically" in said, said
    assert loader.backend == "dali" and [type(t).__name__ for t in loader.plan.tail][:2] == \
        ["TopLeftCrop", "FlipsVertically"], loader.explain()
    assert loader.plan.tail_mode == "pil"  # they get the PIL images they were written for
    d = abs_diff_stats(ours * 255, theirs * 255)
    tol = 0.5 if device == "cpu" else 1.5  # the graph's Resize against PIL's (test_parity.py)
    assert d["mean"] <= tol and d["p99"] <= 8, d


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("api", ["v1", "v2"])
def test_batched_stage_runs_the_users_jitter(photo_folder, device, api):
    *_, Brighter, _, _ = user_classes(api)
    tf = T.Compose([T.Resize(64), T.CenterCrop(48), to_tensor(api), Brighter(0.4), T.Normalize([0.5] * 3, [0.25] * 3)])
    loader, ours, theirs, said = side_by_side(photo_folder, tf, device)
    assert "Brighter" in said
    assert ("Brighter", "per sample") in [(type(t).__name__, s) for t, _, s in stages.after_graph(loader.plan)]
    d = abs_diff_stats(ours * 0.25 * 255, theirs * 0.25 * 255)
    assert d["mean"] <= (0.5 if device == "cpu" else 1.5), d


def cifar(transform, n=24):
    """torchvision's CIFAR10 object as its constructor leaves it, with random pixels."""
    ds = torchvision.datasets.CIFAR10.__new__(torchvision.datasets.CIFAR10)
    rng = np.random.default_rng(0)
    ds.root, ds.transform, ds.target_transform, ds.transforms = "unused", transform, None, None
    ds.data = rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
    ds.targets = [int(t) for t in rng.integers(0, 10, n)]
    return ds


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("api", ["v1", "v2"])
def test_in_memory_path_runs_the_users_crop(device, api):
    """The drawn-ahead RandomCrop would pick random corners; the user's crop falls back to torch's
    DataLoader, equal to it; a subclass that only sets a default keeps the device path."""
    *_, CornerCrop, AlwaysFlip = user_classes(api)
    ds = cifar(T.Compose([CornerCrop(24), to_tensor(api)]))
    with pytest.warns(FallbackWarning, match="CornerCrop"):
        loader = DataLoader(ds, batch_size=8, device=device)
    ours = torch.cat([x.cpu() for x, _ in loader])
    theirs = torch.cat([x for x, _ in tud.DataLoader(ds, batch_size=8)])
    assert torch.equal(ours, theirs)
    kept = cifar(T.Compose([AlwaysFlip(), to_tensor(api)]))
    loader = DataLoader(kept, batch_size=8, device=device)
    assert loader.backend == "arrays", loader.explain()
    expected = torch.from_numpy(kept.data).permute(0, 3, 1, 2).flip(-1).float() / 255
    torch.testing.assert_close(torch.cat([x.cpu() for x, _ in loader]), expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("api", ["v1", "v2"])
def test_cuda_graph_takes_no_user_stage(api):
    class MyNormalize(API[api].Normalize):
        def forward(self, x):
            return (x - 0.5) / 0.25

    convert = T.ConvertImageDtype(torch.float32) if api == "v1" else v2.ToDtype(torch.float32, scale=True)
    stock = stages.in_memory(T.Compose([v2.ToImage(), convert, API[api].Normalize([0.5] * 3, [0.25] * 3)]))
    mine = stages.in_memory(T.Compose([v2.ToImage(), convert, MyNormalize([0.5] * 3, [0.25] * 3)]))
    assert graphed.capturable(stock) and not graphed.capturable(mine)
    assert [s for _, _, s in mine][-1] == "per sample"


def test_timm_subclasses_run_as_written():
    timm = pytest.importorskip("timm")
    from timm.data.auto_augment import rand_augment_transform
    from timm.data.random_erasing import RandomErasing

    class MyErasing(RandomErasing):
        def __call__(self, x):
            return x

    from PIL import Image

    ra = rand_augment_transform("rand-m9-mstd0.5", dict(img_mean=(124, 116, 104),
                                                        interpolation=Image.Resampling.BILINEAR))

    class MyRA(type(ra)):
        def __call__(self, img):
            return img

    mine = MyRA(ra.ops, ra.num_layers, ra.choice_weights)
    assert registry.batched_of(RandomErasing(device="cpu")) is not None
    assert registry.batched_of(MyErasing(device="cpu")) is None
    assert [s.op for s in plan(T.Compose([ra, T.ToTensor()])).steps][1] == "timm_augment"
    p = plan(T.Compose([mine, T.ToTensor()]))
    assert type(p.tail[0]).__name__ == "MyRA" and "MyRA overrides RandAugment.__call__" in p.tail_reason, p.explain()
    assert timm.__version__
