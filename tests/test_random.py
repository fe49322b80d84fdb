"""Random transforms: the distribution of their parameters against torchvision's.

The input is a lossless gradient (red = x, green = y), so each output tells which window of the
source it shows and whether it was mirrored. The same estimator reads torchvision's outputs and
ours, so its own quantisation cancels; distributions are compared with a two-sample
Kolmogorov-Smirnov test (p > 1e-3: a wrong range or a wrong sampling rule fails it by far, see
``test_ks_detects_a_wrong_scale_range``) and rates with a 4-sigma binomial bound.
"""
import shutil

import numpy as np
import pytest
import torch
from PIL import Image
from scipy.stats import ks_2samp

from gputransforms import DataLoader, datasets
from gputransforms import transforms as T

from conftest import DEVICES, erased_boxes

N = 400
W, H = 500, 375


@pytest.fixture(scope="module")
def gradient_copies(gradient_folder, tmp_path_factory):
    root = tmp_path_factory.mktemp("gradient_copies")
    (root / "a").mkdir()
    src = gradient_folder / "a" / "g0.png"  # 500x375
    for i in range(N // 2):
        shutil.copy(src, root / "a" / f"{i:04d}.png")
    return root


def windows(images: torch.Tensor) -> dict:
    """Estimated crop window (source pixels) and mirroring of each output image (N,3,h,w) in 0..255."""
    x = images.double().cpu()
    r, g = x[:, 0], x[:, 1]
    left, right = r[:, :, 0].mean(1), r[:, :, -1].mean(1)
    top, bottom = g[:, 0, :].mean(1), g[:, -1, :].mean(1)
    mirrored = (left > right).numpy()
    vflipped = (top > bottom).numpy()
    left, right = torch.minimum(left, right), torch.maximum(left, right)
    top, bottom = torch.minimum(top, bottom), torch.maximum(top, bottom)
    w = (right - left) * (W - 1) / 255
    h = (bottom - top) * (H - 1) / 255
    return dict(area=(w * h / (W * H)).numpy(), log_ratio=torch.log(w / h.clamp(min=1e-6)).numpy(),
                x0=(left * (W - 1) / 255).numpy(), y0=(top * (H - 1) / 255).numpy(),
                mirrored=mirrored, vflipped=vflipped)


def ours(root, tf, device, epochs=2):
    loader = DataLoader(datasets.ImageFolder(str(root), transform=tf), batch_size=N // 2, shuffle=True,
                        num_workers=2, device=device, generator=torch.Generator().manual_seed(0))
    assert loader.backend == "dali"
    return torch.cat([images for _ in range(epochs) for images, _ in loader])


def reference(tf, n=N):
    img = Image.open(_source_png()).convert("RGB")
    torch.manual_seed(0)
    return torch.stack([tf(img) for _ in range(n)])


_SRC = {}


def _source_png():
    return _SRC["path"]


@pytest.fixture(autouse=True)
def _remember_source(gradient_folder):
    _SRC["path"] = gradient_folder / "a" / "g0.png"


def assert_same_distribution(a, b, what):
    p = ks_2samp(a, b).pvalue
    assert p > 1e-3, f"{what}: KS p={p:.2e} (ours mean {np.mean(a):.4f}, torchvision {np.mean(b):.4f})"


def assert_rate(flags, p, what):
    n = len(flags)
    sigma = (p * (1 - p) / n) ** 0.5
    assert abs(flags.mean() - p) <= 4 * sigma + 1e-9, f"{what}: rate {flags.mean():.3f}, expected {p}"


RRC_CASES = {
    "default": dict(),
    "scale(0.3,0.6) ratio(0.5,2)": dict(scale=(0.3, 0.6), ratio=(0.5, 2.0)),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", list(RRC_CASES))
def test_random_resized_crop_and_flip_distribution(gradient_copies, device, case):
    kw = RRC_CASES[case]
    make = lambda: T.Compose([T.RandomResizedCrop(112, **kw), T.RandomHorizontalFlip(), T.PILToTensor()])
    got, ref = windows(ours(gradient_copies, make(), device)), windows(reference(make()))
    assert_same_distribution(got["area"], ref["area"], "area fraction")
    assert_same_distribution(got["log_ratio"], ref["log_ratio"], "log aspect ratio")
    assert_same_distribution(got["x0"], ref["x0"], "left edge")
    assert_same_distribution(got["y0"], ref["y0"], "top edge")
    assert_rate(got["mirrored"], 0.5, "horizontal flip")


def test_ks_detects_a_wrong_scale_range(gradient_copies):
    """The statistical test above has teeth: a scale range of (0.25, 1) instead of (0.08, 1) is rejected."""
    got = windows(ours(gradient_copies, T.Compose([T.RandomResizedCrop(112, scale=(0.25, 1.0)), T.PILToTensor()]),
                       "cpu"))
    ref = windows(reference(T.Compose([T.RandomResizedCrop(112), T.PILToTensor()])))
    assert ks_2samp(got["area"], ref["area"]).pvalue < 1e-3


@pytest.mark.parametrize("device", DEVICES)
def test_flip_probabilities(gradient_copies, device):
    tf = T.Compose([T.Resize((40, 50)), T.RandomHorizontalFlip(p=0.2), T.RandomVerticalFlip(p=0.7), T.PILToTensor()])
    got = windows(ours(gradient_copies, tf, device))
    assert_rate(got["mirrored"], 0.2, "horizontal flip p=0.2")
    assert_rate(got["vflipped"], 0.7, "vertical flip p=0.7")
    # the two flips are drawn independently
    both = got["mirrored"] & got["vflipped"]
    assert_rate(both, 0.14, "both flips")


@pytest.mark.parametrize("device", DEVICES)
def test_random_crop_offsets_distribution(gradient_copies, device):
    make = lambda: T.Compose([T.RandomCrop((300, 200)), T.PILToTensor()])
    got, ref = windows(ours(gradient_copies, make(), device)), windows(reference(make()))
    assert_same_distribution(got["x0"], ref["x0"], "RandomCrop left")
    assert_same_distribution(got["y0"], ref["y0"], "RandomCrop top")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kw", [dict(size=(400, 560), pad_if_needed=True, fill=(0, 0, 255)),
                                dict(size=(300, 300), padding=(40, 10, 0, 30), fill=(0, 0, 255)),
                                dict(size=(380, 500), padding=3, pad_if_needed=True, fill=(0, 0, 255))],
                         ids=["pad_if_needed", "padding-ltrb", "padding+pad_if_needed"])
def test_random_crop_padding_distribution(gradient_copies, device, kw):
    """Padding is where the fill colour (blue 255; the image's blue is 128) shows: compare how many
    padded columns/rows land left and top, and the fill itself."""
    make = lambda: T.Compose([T.RandomCrop(**kw), T.PILToTensor()])
    got, ref = ours(gradient_copies, make(), device).cpu(), reference(make())
    assert got.shape == ref.shape
    for images, name in ((got, "ours"), (ref, "torchvision")):
        assert set(images[:, 2].unique().tolist()) <= {128, 255}, name

    def pads(x):
        blue = x[:, 2] == 255
        left = (blue.all(1)).int().cumprod(1).sum(1)  # fully blue columns from the left
        top = (blue.all(2)).int().cumprod(1).sum(1)
        return left.numpy(), top.numpy()

    (gl, gt), (rl, rt) = pads(got), pads(ref)
    if rl.std() > 0:
        assert_same_distribution(gl, rl, "left padding")
    else:
        assert (gl == rl[0]).all()
    if rt.std() > 0:
        assert_same_distribution(gt, rt, "top padding")
    else:
        assert (gt == rt[0]).all()


@pytest.mark.parametrize("device", DEVICES)
def test_seeded_runs_repeat(photo_folder, device):
    tf = T.Compose([T.RandomResizedCrop(64), T.RandomHorizontalFlip(), T.ToTensor()])

    def run():
        loader = DataLoader(datasets.ImageFolder(str(photo_folder), transform=tf), batch_size=16, shuffle=True,
                            generator=torch.Generator().manual_seed(7), num_workers=2, device=device)
        return [(x.cpu(), y.cpu()) for _ in range(2) for x, y in loader]

    a, b = run(), run()
    for (xa, ya), (xb, yb) in zip(a, b):
        assert torch.equal(ya, yb) and torch.equal(xa, xb)
    assert not torch.equal(a[0][1], a[3][1]), "a new shuffle every epoch"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("api", ["v1", "v2"])
@pytest.mark.parametrize("kw", [dict(p=0.7), dict(p=0.3, value=(0.1, 0.5, 0.9), scale=(0.1, 0.5), ratio=(0.5, 2.0)),
                                dict(p=0.5, value="random")], ids=["zero", "colour", "random"])
def test_batched_random_erasing_distribution(device, api, kw):
    """The batched stage draws RandomErasing's parameters for the whole batch: the same rate, box
    sizes, offsets and values as torchvision's per-sample draws (KS on each, 4-sigma on the rate)."""
    from torchvision.transforms import v2

    from gputransforms.compiler import registry

    t = (T if api == "v1" else v2).RandomErasing(**kw)
    n, c, h, w = 3000, 3, 40, 56
    x = torch.ones(n, c, h, w, device="cuda" if device == "gpu" else "cpu")
    torch.manual_seed(0)
    got = erased_boxes(registry.batched_of(t)(x.clone()), 0)  # the batched stage erases in place
    torch.manual_seed(1)
    ref = erased_boxes(torch.stack([t(img) for img in x.cpu()]), 0)
    sigma = (kw["p"] * (1 - kw["p"]) / n) ** 0.5
    assert abs(got["rate"] - kw["p"]) < 4 * sigma and abs(ref["rate"] - kw["p"]) < 4 * sigma
    assert got["full"] and ref["full"], "each erasure is one rectangle"
    for key in ("h", "w", "top", "left"):
        assert ks_2samp(got[key], ref[key]).pvalue > 1e-3, key
    if kw.get("value") == "random":
        v = got["values"].flatten().double()
        assert abs(v.mean()) < 0.02 and abs(v.std() - 1) < 0.02, "standard normal pixels"
    else:
        want = torch.tensor(kw.get("value", (0.0,)), dtype=torch.float32).expand(c)
        assert torch.equal(got["values"].unique(dim=1), want[:, None].to(got["values"]))
