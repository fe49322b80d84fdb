"""timm's create_transform outputs, passed unchanged: what has a lowering is compiled, the rest runs
per sample with timm's own code; results against timm's transforms applied by torchvision's
ImageFolder."""
import pytest
import torch
import torchvision
from scipy.stats import ks_2samp

from gputransforms import DataLoader, datasets, plan

from conftest import DEVICES

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
    from gputransforms.compiler.tail import stages

    # timm's default colour jitter (torchvision's ColorJitter), Normalize and its RandomErasing: batched
    assert [(type(t).__name__, s) for t, _, s in stages(p) if s != "conversion"] == [
        ("ColorJitter", "batched"), ("Normalize", "batched"), ("RandomErasing", "batched")], p.explain()
    x, _ = next(iter(DataLoader(datasets.ImageFolder(str(photo_folder), transform=tf), batch_size=32, device=device)))
    erased = (x == 0).all(1).flatten(1).any(1).float().mean().item()  # timm's const mode writes zeros
    assert x.shape == (32, 3, 96, 96) and 0.1 < erased < 0.9


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
