"""Deterministic chains through the compiled graph against torchvision on the same real photos.

Tolerances, in 0-255 units: on the CPU DALI decodes with libjpeg-turbo like PIL, and the graph
reproduces torchvision's output-size and crop-offset arithmetic, so what remains is resampling
rounding (measured 0.14 mean / 1.0 p99 on this data): mean <= 0.3, p99 <= 2. On the GPU, nvJPEG's
IDCT and chroma upsampling differ from libjpeg-turbo by ~0.5 mean: mean <= 1.0, p99 <= 8.
"""
import pytest
import torch
import torchvision
from torchvision.transforms import v2

from gputransforms import transforms as T

import sidebyside
from conftest import DEVICES, abs_diff_stats
from sidebyside import IMAGENET_MEAN as MEAN, IMAGENET_STD as STD, ours_with_labels, theirs_with_labels

TOL = {"cpu": dict(mean=0.3, p99=2.0), "gpu": dict(mean=1.0, p99=8.0)}


def run_ours(root, tf, device, batch_size=7, **kwargs):
    return ours_with_labels(root, tf, device, batch_size=batch_size, **kwargs)


def to_255(x: torch.Tensor, normalized: bool) -> torch.Tensor:
    return sidebyside.to_255(x, MEAN, STD) if normalized else sidebyside.to_255(x)


EVAL_CHAINS = {
    "v1 Resize256+CenterCrop224+ToTensor+Normalize": (
        lambda: T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(), T.Normalize(MEAN, STD)]), True),
    "v2 Resize256+CenterCrop224+ToImage+ToDtype+Normalize": (
        lambda: v2.Compose([v2.Resize(256), v2.CenterCrop(224), v2.ToImage(), v2.ToDtype(torch.float32, scale=True),
                            v2.Normalize(MEAN, STD)]), True),
    "v2 ToImage+ToDtype+Resize(96)+CenterCrop(80)+Normalize: resize of float values, then a fill after Normalize": (
        lambda: v2.Compose([v2.ToImage(), v2.ToDtype(torch.float32, scale=True), v2.Resize(96), v2.CenterCrop(80),
                            v2.Normalize(MEAN, STD)]), True),
    "Resize((200,300))+PILToTensor": (lambda: T.Compose([T.Resize((200, 300)), T.PILToTensor()]), False),
    "Resize(160,max_size=200)+CenterCrop(190) pads": (
        lambda: T.Compose([T.Resize(160, max_size=200), T.CenterCrop(190), T.PILToTensor()]), False),
    "CenterCrop(601x457) larger than most images": (
        lambda: T.Compose([T.CenterCrop((601, 457)), T.ToTensor()]), False),
    "Resize(224,bicubic)+CenterCrop": (
        lambda: T.Compose([T.Resize(224, T.InterpolationMode.BICUBIC), T.CenterCrop(224), T.PILToTensor()]), False),
    "Resize(224,nearest)+CenterCrop": (
        lambda: T.Compose([T.Resize(224, T.InterpolationMode.NEAREST), T.CenterCrop(224), T.PILToTensor()]), False),
    "Resize(224,lanczos)+CenterCrop": (
        lambda: T.Compose([T.Resize(224, T.InterpolationMode.LANCZOS), T.CenterCrop(224), T.PILToTensor()]), False),
    "Resize((120,160))+VerticalFlip+HorizontalFlip(p=1)+CenterCrop(100): the flips are the resize's (ROI reversed)": (
        lambda: T.Compose([T.Resize((120, 160)), T.RandomVerticalFlip(p=1.0), T.RandomHorizontalFlip(p=1.0),
                           T.CenterCrop(100), T.PILToTensor()]), False),
    "torchvision.transforms.Compose object reused unchanged": (
        lambda: torchvision.transforms.Compose([torchvision.transforms.Resize(256), torchvision.transforms.CenterCrop(224),
                                                torchvision.transforms.ToTensor()]), False),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(EVAL_CHAINS))
def test_eval_chain_matches_torchvision(photo_folder, device, name):
    make, normalized = EVAL_CHAINS[name]
    ours, labels = run_ours(photo_folder, make(), device)
    ref, ref_labels = theirs_with_labels(photo_folder, make())
    assert ours.shape == ref.shape and ours.dtype == ref.dtype
    assert ours.device.type == ("cuda" if device == "gpu" else "cpu")
    assert labels.dtype == torch.int64 and torch.equal(labels.cpu(), ref_labels)
    stats = abs_diff_stats(to_255(ours, normalized), to_255(ref, normalized))
    print(f"\nparity[{device}] {name}: mean {stats['mean']:.3f} p99 {stats['p99']:.2f} max {stats['max']:.1f}")
    tol = TOL[device]
    assert stats["mean"] <= tol["mean"] and stats["p99"] <= tol["p99"], stats


@pytest.mark.parametrize("device", DEVICES)
def test_ignores_exif_orientation_like_torchvision(tmp_path, device):
    from PIL import Image

    (tmp_path / "c").mkdir()
    img = Image.new("RGB", (120, 60), (200, 30, 30))
    img.paste((30, 30, 200), (0, 0, 60, 60))  # left half blue
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 on display": torchvision's PIL loader does not apply it
    img.save(tmp_path / "c" / "rot.jpg", quality=95, exif=exif)
    tf = T.Compose([T.PILToTensor()])
    ours, _ = run_ours(tmp_path, tf, device, batch_size=1)
    ref, _ = theirs_with_labels(tmp_path, tf)
    assert ours.shape == ref.shape == (1, 3, 60, 120)
    assert abs_diff_stats(ours, ref)["mean"] < 2


@pytest.mark.parametrize("device", DEVICES)
def test_normalize_and_dtype_exact_on_same_pixels(photo_folder, device):
    """ToTensor+Normalize fold into crop_mirror_normalize: the same decoded pixels must normalise to
    torchvision's values up to float32 rounding."""
    base = [T.Resize((64, 64)), T.PILToTensor()]
    raw, _ = run_ours(photo_folder, T.Compose(base), device)
    normed, _ = run_ours(photo_folder, T.Compose(base[:1] + [T.ToTensor(), T.Normalize(MEAN, STD)]), device)
    expected = T.Normalize(MEAN, STD)(raw.float().cpu() / 255)
    torch.testing.assert_close(normed.cpu(), expected, atol=1e-5, rtol=1e-5)
    half, _ = run_ours(photo_folder, v2.Compose(base + [v2.ToDtype(torch.float16, scale=True)]), device)
    assert half.dtype == torch.float16
    torch.testing.assert_close(half.cpu(), (raw.float().cpu() / 255).half(), atol=1e-3, rtol=0)


@pytest.mark.gpu
def test_gpu_fancy_upsampling_is_closer_to_pil(photo_folder):
    """jpeg_fancy_upsampling=True decodes chroma like libjpeg-turbo: the eval chain lands at CPU
    parity (mean <= 0.3, p99 <= 2) instead of nvJPEG's default ~0.5 mean."""
    make = lambda: T.Compose([T.Resize(256), T.CenterCrop(224), T.PILToTensor()])
    ref, _ = theirs_with_labels(photo_folder, make())
    fancy, _ = run_ours(photo_folder, make(), "gpu", jpeg_fancy_upsampling=True)
    plain, _ = run_ours(photo_folder, make(), "gpu")
    s_fancy, s_plain = abs_diff_stats(fancy, ref), abs_diff_stats(plain, ref)
    print(f"\nparity[gpu] fancy upsampling {s_fancy}, default {s_plain}")
    assert s_fancy["mean"] <= 0.3 and s_fancy["p99"] <= 2.0
    assert s_fancy["mean"] < s_plain["mean"]
