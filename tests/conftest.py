from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from gputransforms import sampledata

ROOT = Path(__file__).resolve().parents[1]

#: CUDA's correctly rounded float intrinsics as plain float operations, for kernel source built on the host
_HOST_INTRINSICS = """
#include <cmath>
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
"""


def host_kernel_library(path: Path, code: str):
    """CUDA device code (and host entry points) built by the host's C++ compiler as a shared library, with
    the rounding intrinsics as plain float operations and no contraction: how the CPU tests run the kernels'
    source. Skips where there is no compiler."""
    import ctypes
    import shutil
    import subprocess

    if shutil.which("g++") is None:
        pytest.skip("no C++ compiler on this machine")
    src, lib = path.with_suffix(".cpp"), path.with_suffix(".so")
    src.write_text(_HOST_INTRINSICS + code)
    subprocess.run(["g++", "-O1", "-std=c++17", "-ffp-contract=off", "-shared", "-fPIC", str(src), "-o", str(lib)],
                   check=True, capture_output=True)
    return ctypes.CDLL(str(lib))


def make_photo_folder(out: Path, *, classes: int, per_class: int, seed: int, odd: bool = False) -> Path:
    """Real-photo JPEGs made by the project's own generator (photos from scikit-image's and
    scikit-learn's wheels, a test extra); ``odd`` adds a ``zz_odd/`` class of odd files. Without the
    photos this raises: parity on drawn shapes would prove little, so the tests fail, never skip."""
    sampledata.make_photo_folder(out, classes=classes, per_class=per_class, seed=seed)
    if odd:
        sampledata.make_odd_files(out / "zz_odd", seed=seed)
    return out


@pytest.fixture(scope="session")
def photo_folder(tmp_path_factory):
    """48 real-photo JPEGs (ImageNet-like sizes, mixed subsampling/quality) in 3 classes."""
    return make_photo_folder(tmp_path_factory.mktemp("photos"), classes=3, per_class=16, seed=1)


@pytest.fixture(scope="module")
def photos(photo_folder):
    """24 of the photos at 72 x 88 as a uint8 (N, 3, H, W) batch: what the batched stage works on."""
    import torchvision
    import torchvision.transforms as T

    ds = torchvision.datasets.ImageFolder(str(photo_folder), transform=T.Compose([T.Resize((72, 88)),
                                                                                   T.PILToTensor()]))
    return torch.stack([ds[i][0] for i in range(24)])


def torchvision_jitter_params(t, images) -> list:
    """ColorJitter ``t``'s own per-sample draws for ``images``, in forward's order: [fn_idx, brightness,
    contrast, saturation, hue] each (v1's ``get_params``, v2's ``make_params``)."""
    from torchvision.transforms import v2

    if isinstance(t, v2.Transform):
        return [[p[k] for k in ("fn_idx", "brightness_factor", "contrast_factor", "saturation_factor", "hue_factor")]
                for p in (t.make_params([img]) for img in images)]
    return [list(t.get_params(t.brightness, t.contrast, t.saturation, t.hue)) for _ in range(len(images))]


@pytest.fixture(scope="session")
def gradient_folder(tmp_path_factory):
    """Lossless PNGs whose red channel is x and green channel is y (scaled to 0..255), so the crop
    window a random transform chose can be read back from its output, for ours and torchvision's."""
    root = tmp_path_factory.mktemp("gradient")
    (root / "a").mkdir()
    for k, (w, h) in enumerate([(500, 375), (375, 500), (640, 480)]):
        x = np.linspace(0, 255, w)[None, :].repeat(h, 0)
        y = np.linspace(0, 255, h)[:, None].repeat(w, 1)
        img = np.stack([x, y, np.full_like(x, 128)], -1).round().astype(np.uint8)
        Image.fromarray(img).save(root / "a" / f"g{k}.png")
    return root


@pytest.fixture(scope="session")
def indexed_folder(tmp_path_factory):
    """37 small flat-colour JPEGs in 3 classes: red encodes the sample's index in sorted order and
    blue its class, so every output pixel says which file it came from."""
    return sampledata.make_indexed_folder(tmp_path_factory.mktemp("indexed"))


def decode_index(images: torch.Tensor) -> tuple[list, list]:
    """(index, class) encoded by ``indexed_folder`` in a uint8 NCHW batch."""
    px = images[:, :, images.shape[2] // 2, images.shape[3] // 2].float().cpu()
    return [int(round(r / 6)) for r in px[:, 0].tolist()], [int(round(b / 100)) for b in px[:, 2].tolist()]


def has_gpu():
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` are skipped without a CUDA device, and only they: any other skip is a defect."""
    if has_gpu():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("gpu", id="gpu", marks=pytest.mark.gpu)]


def abs_diff_stats(ours: torch.Tensor, ref: torch.Tensor) -> dict:
    d = (ours.double().cpu() - ref.double().cpu()).abs().flatten()
    return dict(mean=d.mean().item(), p99=torch.quantile(d[torch.randperm(len(d))[:1_000_000]], 0.99).item(),
                max=d.max().item())


def erased_boxes(out: torch.Tensor, fill: float) -> dict:
    """Box (top, left, h, w) of the erased pixels of each sample of a (N,C,H,W) batch of ones, or
    nothing for a sample left unchanged."""
    mask = (out != 1).any(1)  # (N, H, W)
    rows, cols = mask.any(2), mask.any(1)
    erased = rows.any(1)
    h, w = rows.sum(1), cols.sum(1)
    top, left = rows.float().argmax(1), cols.float().argmax(1)
    e = erased.cpu()
    return dict(rate=e.double().mean().item(), h=h.cpu()[e].numpy(), w=w.cpu()[e].numpy(),
                top=top.cpu()[e].numpy(), left=left.cpu()[e].numpy(), full=(mask.sum((1, 2)) == h * w).all().item(),
                values=out.permute(1, 0, 2, 3)[:, mask].cpu())
