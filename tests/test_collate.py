"""collate_fn as torchvision's reference recipe and timm pass it: the graph stays compiled and the
collate function sees what torch would give it; side by side with torch's DataLoader."""
import numpy as np
import pytest
import torch
import torch.utils.data as tud
from scipy.stats import ks_2samp
from torch.utils.data import default_collate
from torch.utils.data._utils.collate import default_collate as default_collate_private
from torchvision.transforms import v2

from gputransforms import DataLoader, datasets
from gputransforms import transforms as T

from conftest import DEVICES, decode_index
from presets import ClassificationPresetTrain

INDEX_TF = T.Compose([T.Resize((8, 8)), T.PILToTensor()])


def recipe_mixup_cutmix(num_classes):
    """references/classification/transforms.py get_mixup_cutmix(mixup_alpha=0.2, cutmix_alpha=1.0, use_v2=True)."""
    return v2.RandomChoice([v2.MixUp(alpha=0.2, num_classes=num_classes), v2.CutMix(alpha=1.0, num_classes=num_classes)])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("collate", [default_collate, default_collate_private], ids=["public", "private"])
def test_default_collate_is_the_compiled_default(indexed_folder, device, collate):
    ds = datasets.ImageFolder(str(indexed_folder), transform=INDEX_TF)
    g = lambda: torch.Generator().manual_seed(2)  # noqa: E731
    explicit = DataLoader(ds, batch_size=8, shuffle=True, collate_fn=collate, generator=g(), device=device)
    implicit = DataLoader(ds, batch_size=8, shuffle=True, generator=g(), device=device)
    assert explicit.backend == "dali" and "collate_fn" not in explicit.explain()
    for (xa, ya), (xb, yb) in zip(explicit, implicit):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("sampler", ["random", "distributed"])
@pytest.mark.parametrize("mix", [False, True], ids=["default_collate", "mixup_cutmix"])
def test_reference_recipe_loader_is_compiled_and_exact(photo_folder, device, sampler, mix):
    """train.py's construction, argument for argument: preset train chain with --auto-augment ta_wide
    --random-erase 0.1, RandomSampler (or DistributedSampler), pin_memory=True, and its collate_fn."""
    dataset = datasets.ImageFolder(str(photo_folder), ClassificationPresetTrain(
        crop_size=64, auto_augment_policy="ta_wide", random_erase_prob=0.1))
    num_classes = len(dataset.classes)
    if sampler == "distributed":
        train_sampler = tud.distributed.DistributedSampler(dataset, num_replicas=2, rank=1, shuffle=True)
    else:
        train_sampler = tud.RandomSampler(dataset)
    mixup_cutmix = recipe_mixup_cutmix(num_classes) if mix else None
    seen_labels = []
    if mixup_cutmix is not None:
        def collate_fn(batch):
            images, labels = default_collate(batch)
            seen_labels.append(labels.clone())
            return mixup_cutmix(images, labels)
    else:
        collate_fn = default_collate
    data_loader = DataLoader(dataset, batch_size=8, sampler=train_sampler, num_workers=2, pin_memory=True,
                             collate_fn=collate_fn, device=device)
    assert data_loader.backend == "dali", data_loader.explain()
    dev = "cuda" if device == "gpu" else "cpu"
    n = 0
    for k, (image, target) in enumerate(data_loader):
        assert image.shape[1:] == (3, 64, 64) and image.dtype == torch.float32 and image.device.type == dev
        assert target.device.type == dev
        n += len(image)
        if mix:
            labels = seen_labels[k].to(target.device)
            assert target.shape == (len(image), num_classes)
            torch.testing.assert_close(target.sum(1), torch.ones(len(image), device=target.device))
            # each row mixes its own label with its neighbour's (v2 MixUp/CutMix pair i with i-1)
            own = target.gather(1, labels[:, None])[:, 0]
            rolled = target.gather(1, labels.roll(1)[:, None])[:, 0]
            both = torch.where(labels == labels.roll(1), own, own + rolled)
            torch.testing.assert_close(both, torch.ones_like(both))
        else:
            assert target.dtype == torch.int64
    assert n == len(train_sampler)


def lam_of(target, labels):
    """MixUp/CutMix's lambda, read back from the mixed one-hot targets of a batch."""
    differ = labels != labels.roll(1)
    if not differ.any():
        return None
    i = int(differ.nonzero()[0, 0])
    return float(target[i, labels[i]])


def test_mixup_cutmix_draws_as_torchvision(indexed_folder):
    """The same collate function on our compiled batches and on torch's: the same distribution of
    lambda (MixUp's Beta(0.2, 0.2), CutMix's area-corrected Beta(1, 1)), KS test."""
    ds = datasets.ImageFolder(str(indexed_folder), transform=INDEX_TF)
    mix = recipe_mixup_cutmix(3)
    lams = {}
    for name, make in (("ours", lambda **kw: DataLoader(ds, device="cpu", **kw)), ("torch", lambda **kw: tud.DataLoader(ds, **kw))):
        labels_seen, out = [], []

        def collate_fn(batch):
            images, labels = default_collate(batch)
            labels_seen.append(labels)
            return mix(images.float(), labels)

        torch.manual_seed(0 if name == "ours" else 1)
        loader = make(batch_size=6, shuffle=True, collate_fn=collate_fn)
        for _ in range(40):
            for _, target in loader:
                lam = lam_of(target.cpu(), labels_seen[len(out)])
                out.append(lam)
        lams[name] = [v for v in out if v is not None]
    assert min(len(v) for v in lams.values()) > 200
    p = ks_2samp(lams["ours"], lams["torch"]).pvalue
    print(f"\nMixUp/CutMix lambda KS p = {p:.3f}")
    assert p > 0.01


@pytest.mark.parametrize("device", DEVICES)
def test_timm_mixup_in_a_collate_fn_equals_timms(indexed_folder, device):
    from timm.data import Mixup

    ds = datasets.ImageFolder(str(indexed_folder), transform=T.Compose([T.Resize((8, 8)), T.ToTensor()]))
    mixup = Mixup(mixup_alpha=0.8, cutmix_alpha=1.0, num_classes=3, label_smoothing=0.1)
    collate = lambda b: mixup(*default_collate(b))  # noqa: E731
    results = []
    for make in (lambda: DataLoader(ds, batch_size=6, collate_fn=collate, device=device, drop_last=True),
                 lambda: tud.DataLoader(ds, batch_size=6, collate_fn=collate, drop_last=True)):
        np.random.seed(3)  # timm draws lambda with numpy
        results.append([(x.cpu(), y.cpu()) for x, y in make()])
    ours, theirs = results
    assert len(ours) == len(theirs) == len(ds) // 6
    for (xo, yo), (xt, yt) in zip(ours, theirs):
        torch.testing.assert_close(yo, yt)  # same lambda and labels
        assert (xo - xt).abs().mean() < (0.02 if device == "gpu" else 0.005)  # the decoders' difference


def test_timm_fast_collate_mixup_on_the_cpu_equals_timms(indexed_folder):
    from timm.data import FastCollateMixup

    ds = datasets.ImageFolder(str(indexed_folder), transform=INDEX_TF)
    results = []
    for cls in (DataLoader, tud.DataLoader):
        fast = FastCollateMixup(mixup_alpha=0.8, cutmix_alpha=1.0, num_classes=3)
        kw = dict(device="cpu") if cls is DataLoader else {}
        np.random.seed(4)
        results.append([(x, y) for x, y in cls(ds, batch_size=6, collate_fn=fast, drop_last=True, **kw)])
    for (xo, yo), (xt, yt) in zip(*results):
        torch.testing.assert_close(yo, yt)
        assert xo.dtype == torch.uint8 and (xo.float() - xt.float()).abs().max() <= 2


def test_collate_fn_that_needs_pil_images_gets_a_clear_error(indexed_folder):
    ds = datasets.ImageFolder(str(indexed_folder), transform=INDEX_TF)
    loader = DataLoader(ds, batch_size=4, collate_fn=lambda b: [img.convert("L") for img, _ in b], device="cpu")
    with pytest.raises(AttributeError, match="convert") as info:
        next(iter(loader))
    text = str(info.value)
    assert "collate_fn" in text and "already transformed" in text and "torch.Size" not in text
    assert "torch.utils.data.DataLoader" in text


@pytest.mark.gpu
def test_timm_fast_collate_mixup_on_the_gpu_is_told_what_to_do(indexed_folder):
    from timm.data import FastCollateMixup

    ds = datasets.ImageFolder(str(indexed_folder), transform=INDEX_TF)
    loader = DataLoader(ds, batch_size=6, collate_fn=FastCollateMixup(mixup_alpha=0.8, num_classes=3), device="gpu")
    with pytest.raises(RuntimeError, match="on cuda") as info:
        next(iter(loader))
    assert "collate_fn FastCollateMixup failed on the first compiled batch" in str(info.value)


@pytest.mark.parametrize("device", DEVICES)
def test_collate_sees_views_of_the_batch_and_python_targets(indexed_folder, device):
    ds = datasets.ImageFolder(str(indexed_folder), transform=INDEX_TF, target_transform=lambda t: {"cls": t})
    seen = []

    def collate_fn(batch):
        seen.append([(type(img).__name__, str(img.device), type(tgt).__name__) for img, tgt in batch])
        return default_collate(batch)

    ours = list(DataLoader(ds, batch_size=10, collate_fn=collate_fn, device=device))
    theirs = list(tud.DataLoader(ds, batch_size=10, collate_fn=default_collate))
    dev = "cuda:0" if device == "gpu" else "cpu"
    assert all(s == ("Tensor", dev, "dict") for batch in seen for s in batch)
    for (xo, yo), (xt, yt) in zip(ours, theirs):
        assert decode_index(xo)[0] == decode_index(xt)[0]
        assert yo["cls"].tolist() == yt["cls"].tolist()
