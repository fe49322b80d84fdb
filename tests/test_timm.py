"""timm's create_transform outputs, passed unchanged: what has a lowering is compiled, the rest runs
per sample with timm's own code; results against timm's transforms applied by torchvision's
ImageFolder."""
import pytest
import torch
import torchvision
from scipy.stats import ks_2samp

from gputransforms import DataLoader, datasets, plan

from conftest import DEVICES, erased_boxes

import timm.data as timm_data  # a test extra: missing, the tests fail rather than skip
STD = torch.tensor([0.229, 0.224, 0.225])[:, None, None]


@pytest.mark.parametrize("device", DEVICES)
def test_timm_eval_transform_fully_compiled(photo_folder, device):
    tf = timm_data.create_transform(224, is_training=False)
    p = plan(tf)
    assert not p.tail and [s.op for s in p.steps] == ["decode", "resize", "crop_mirror_normalize"]
    got = torch.cat([x.cpu() for x, _ in DataLoader(datasets.ImageFolder(str(photo_folder), transform=tf),
                                                    batch_size=16, device=device)])
    ref_ds = torchvision.datasets.ImageFolder(str(photo_folder), transform=tf)
    ref = torch.stack([ref_ds[i][0] for i in range(len(ref_ds))])
    assert ((got - ref).abs() * STD * 255).mean() < (0.3 if device == "cpu" else 1.0)


@pytest.mark.filterwarnings("ignore::gputransforms.FallbackWarning")
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kw", [dict(), dict(auto_augment="rand-m9-mstd0.5", re_prob=0.25),
                                dict(auto_augment="rand-m9-mstd0.5", interpolation="random")],
                         ids=["default", "rand-m9-mstd0.5+re", "random-interpolation"])
def test_timm_train_transforms_compile_and_run(photo_folder, device, kw):
    tf = timm_data.create_transform(96, is_training=True, **kw)
    p = plan(tf)
    loader = DataLoader(datasets.ImageFolder(str(photo_folder), transform=tf), batch_size=16, shuffle=True,
                        device=device)
    assert p.steps[0].args.get("random_crop") is not None, p.explain()  # fused into decode
    assert loader.backend == "dali"
    if kw.get("interpolation") == "random":
        # the crop's filter is drawn per sample in the graph; RandAugment's warps would need a
        # bicubic DALI lacks, so from there on timm's own code runs per sample (on PIL images)
        assert [s.args["interp"] for s in p.steps if s.op == "resize"] == [("INTERP_LINEAR", "INTERP_CUBIC")]
        assert type(p.tail[0]).__name__ == "RandAugment" and "random interpolation" in p.tail_reason
    elif "auto_augment" in kw:
        # timm's RandAugment is lowered into the graph (tests/test_timm_augment.py): only its
        # RandomErasing is left, batched
        assert "timm_augment" in [s.op for s in p.steps] and [type(t).__name__ for t in p.tail] == ["RandomErasing"]
    x, y = next(iter(loader))
    assert x.shape == (16, 3, 96, 96) and x.dtype == torch.float32 and y.dtype == torch.int64


@pytest.mark.parametrize("device", DEVICES)
def test_timm_random_erasing_chain_runs_batched(photo_folder, device):
    tf = timm_data.create_transform(96, is_training=True, re_prob=0.5)
    p = plan(tf)
    from gputransforms.compiler.stages import after_graph as stages

    # timm's default colour jitter (torchvision's ColorJitter), Normalize and its RandomErasing: batched
    assert [(type(t).__name__, s) for t, _, s in stages(p) if s != "conversion"] == [
        ("ColorJitter", "batched"), ("Normalize", "batched"), ("RandomErasing", "batched")], p.explain()
    x, _ = next(iter(DataLoader(datasets.ImageFolder(str(photo_folder), transform=tf), batch_size=32, device=device)))
    erased = (x == 0).all(1).flatten(1).any(1).float().mean().item()  # timm's const mode writes zeros
    assert x.shape == (32, 3, 96, 96) and 0.1 < erased < 0.9


def _timm_erasing_stats(out: torch.Tensor) -> dict:
    """Of a batch of ones after erasing: the erased share of each sample's pixels, and the box of
    each sample with one box (its erased pixels form one rectangle)."""
    s = erased_boxes(out, 0)
    mask = (out != 1).any(1)
    s["share"] = mask.flatten(1).double().mean(1).cpu().numpy()
    return s


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kw", [dict(probability=0.6), dict(probability=0.4, mode="rand", min_aspect=0.5),
                                dict(probability=0.5, mode="pixel", max_count=3, max_area=0.25)],
                         ids=["const", "rand", "pixel-3-boxes"])
def test_timm_random_erasing_batched_distribution(device, kw):
    """timm's RandomErasing in the batched stage draws for the whole batch at once: the same rate,
    box sizes, offsets, erased shares and fill values as timm's own per-sample calls (KS on each,
    4-sigma on the rate); a narrower area range fails the same comparison."""
    import random

    from timm.data.random_erasing import RandomErasing

    from gputransforms.compiler import registry

    t = RandomErasing(device="cpu", **kw)
    n, c, h, w = 3000, 3, 40, 56
    x = torch.ones(n, c, h, w, device="cuda" if device == "gpu" else "cpu")
    torch.manual_seed(0)
    got = _timm_erasing_stats(registry.batched_of(t)(x.clone()))
    random.seed(1)
    torch.manual_seed(1)
    ref = _timm_erasing_stats(torch.stack([t(img) for img in x.cpu().clone()]))
    p = kw["probability"]
    sigma = (p * (1 - p) / n) ** 0.5
    assert abs(got["rate"] - ref["rate"]) < 4 * 2 ** 0.5 * sigma, (got["rate"], ref["rate"])
    assert ks_2samp(got["share"][got["share"] > 0], ref["share"][ref["share"] > 0]).pvalue > 1e-3
    if kw.get("max_count", 1) == 1:
        assert got["full"] and ref["full"], "one box: one rectangle"
        for key in ("h", "w", "top", "left"):
            assert ks_2samp(got[key], ref[key]).pvalue > 1e-3, key
    v = got["values"]
    if kw.get("mode") is None:
        assert torch.equal(v.unique(), torch.zeros(1)), "const: zeros"
    else:
        v = v.flatten().double()
        assert abs(v.mean()) < 0.05 and abs(v.std() - 1) < 0.05, "standard normal fill"
        if kw["mode"] == "rand":  # one colour per box and channel
            assert len(v.unique()) <= 3 * (got["rate"] * n) + 1 < len(ref["values"].flatten()) / 10
    narrow = RandomErasing(device="cpu", **{**kw, "max_area": 0.15})
    wrong = _timm_erasing_stats(registry.batched_of(narrow)(x.clone()))
    assert ks_2samp(wrong["share"][wrong["share"] > 0], ref["share"][ref["share"] > 0]).pvalue < 1e-6


def test_timm_random_erasing_batched_erases_each_sample_as_a_per_sample_call():
    """In create_transform's chain timm's RandomErasing is called per sample, so its ``num_splits``
    (which, on a batch, spares the first samples) never applies: nor does it in the batched stage."""
    from timm.data.random_erasing import RandomErasing

    from gputransforms.compiler import registry

    t = RandomErasing(probability=1.0, num_splits=2, device="cpu")
    x = torch.ones(64, 3, 32, 32)
    assert (t(x.clone()) != 1).flatten(1).any(1).tolist() == [False] * 32 + [True] * 32  # timm on a batch
    assert (registry.batched_of(t)(x.clone()) != 1).flatten(1).any(1).all()


@pytest.mark.parametrize("device", DEVICES)
def test_timm_random_resized_crop_distribution(gradient_folder, device, tmp_path):
    import shutil

    from torchvision.transforms import PILToTensor
    from timm.data.transforms import RandomResizedCropAndInterpolation

    (tmp_path / "a").mkdir()
    for i in range(200):
        shutil.copy(gradient_folder / "a" / "g0.png", tmp_path / "a" / f"{i:03d}.png")
    tf = torchvision.transforms.Compose([RandomResizedCropAndInterpolation(64), PILToTensor()])
    got = torch.cat([x.cpu() for _ in range(2) for x, _ in
                     DataLoader(datasets.ImageFolder(str(tmp_path), transform=tf), batch_size=100, device=device)])
    from PIL import Image

    img = Image.open(gradient_folder / "a" / "g0.png").convert("RGB")
    ref = torch.stack([tf(img) for _ in range(400)])
    width = lambda x: (x[:, 0, :, -1].double().mean(1) - x[:, 0, :, 0].double().mean(1)).numpy()
    height = lambda x: (x[:, 1, -1, :].double().mean(1) - x[:, 1, 0, :].double().mean(1)).numpy()
    assert ks_2samp(width(got), width(ref)).pvalue > 1e-3
    assert ks_2samp(height(got), height(ref)).pvalue > 1e-3


@pytest.mark.parametrize("device", DEVICES)
def test_timm_random_interpolation_draws_a_filter_per_sample(photo_folder, device, tmp_path):
    """timm's train.py default (``interpolation='random'``): each crop is resized bilinear or bicubic,
    at random. With scale (1, 1) and a 4:3 ratio on 4:3 images the window is the whole image, so each
    output can be matched to timm's output with either filter."""
    from PIL import Image
    from timm.data.transforms import RandomResizedCropAndInterpolation

    (tmp_path / "a").mkdir()
    for k, (path, _) in enumerate(torchvision.datasets.ImageFolder(str(photo_folder)).samples[:24]):
        im = Image.open(path).convert("RGB")
        w, h = im.size
        cw = min(w, h * 4 // 3) // 4 * 4
        ch = cw * 3 // 4
        x0, y0 = (w - cw) // 2, (h - ch) // 2
        im.crop((x0, y0, x0 + cw, y0 + ch)).save(tmp_path / "a" / f"{k}.png")  # lossless: same pixels both sides

    def chain(interpolation):
        return torchvision.transforms.Compose([RandomResizedCropAndInterpolation(
            64, scale=(1.0, 1.0), ratio=(4 / 3, 4 / 3), interpolation=interpolation), torchvision.transforms.PILToTensor()])

    epochs = 4
    got = torch.cat([x.cpu() for _ in range(epochs) for x, _ in DataLoader(
        datasets.ImageFolder(str(tmp_path), transform=chain("random")), batch_size=8, device=device)]).double()
    refs = []
    for mode in ("bilinear", "bicubic"):
        ds = torchvision.datasets.ImageFolder(str(tmp_path), transform=chain(mode))
        refs.append(torch.stack([ds[i][0] for _ in range(epochs) for i in range(len(ds))]).double())
    d = torch.stack([(got - r).abs().flatten(1).mean(1) for r in refs])  # (filter, sample)
    best, bicubic = d.min(0)
    other = d.max(0).values
    print(f"\n[{device}] nearer filter: mean |diff| {best.mean():.3f} (worst {best.max():.3f}), the other "
          f"{other.mean():.3f}; bicubic share {bicubic.float().mean():.2f}")
    assert best.mean() < 0.4 and best.max() < 1.0 and other.mean() > 3 * best.mean()
    assert 0.25 < bicubic.float().mean() < 0.75  # 96 fair coins stay inside with p > 0.9999
