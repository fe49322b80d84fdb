"""A joint step's pixels after the graph (compiler/joint_kernels.py) against torchvision's own kernels.

Each image of its own size goes through RandomPhotometricDistort's steps as a row of parameters has them
(brightness, contrast early or late, saturation, hue, channel order; each on or off), then a window that
may reach past the image on any side (the zoom-out's fill) or lie inside it (the IoU crop), then its flips.
The reference runs torchvision's v2 functionals on the image, pads with the fill, crops and flips. On the
GPU the compiled kernels run; without one the same device functions, built by the host's C++ compiler (as
tests/test_color_kernels.py builds ColorJitter's), run in a loop that does what the two kernels do.
Tolerance as for ColorJitter's kernels: a uint8 value may differ by 1 (torch sums the greys in float32 in
its own order, the kernels exactly; torch's CPU divides where CUDA multiplies by the reciprocal).
"""
import ctypes
import importlib

import numpy as np
import pytest
import torch
import torchvision
from torchvision.transforms.v2 import functional as F

from gputransforms.compiler import joint, joint_kernels

from conftest import has_gpu, host_kernel_library

# what gt_joint_means and gt_joint_pixels do, one image and one pixel after another
_ENTRY = """
extern "C" void joint(int n, const long long* meta, const float* colour, unsigned long long* sums,
                      const float* fill) {
  for (int pass = 1; pass <= 2; ++pass) {
    for (int i = 0; i < n; ++i) {
      const long long* m = meta + i * GT_META;
      const float* c = colour + i * GT_COLOUR;
      if ((pass == 1 ? c[1] : c[5]) == 1.0f) continue;
      const unsigned char* img = (const unsigned char*)m[0];
      const long long hw = m[1] * m[2];
      const float mean1 = pass == 2 && c[1] != 1.0f ? gt_joint_mean(sums[i], hw) : 0.0f;
      for (long long p = 0; p < hw; ++p) {
        float x[3] = {(float)img[3 * p], (float)img[3 * p + 1], (float)img[3 * p + 2]};
        gt_joint_colour(x, c, mean1, 0.0f, pass);
        sums[(pass - 1) * n + i] += (unsigned int)gt_jitter_gray<float>(x[0], x[1], x[2]);
      }
    }
  }
  for (int i = 0; i < n; ++i) {
    const long long* m = meta + i * GT_META;
    const float* c = colour + i * GT_COLOUR;
    const long long plane = m[4] * m[5], hw = m[1] * m[2];
    const float mean1 = c[1] != 1.0f ? gt_joint_mean(sums[i], hw) : 0.0f;
    const float mean2 = c[5] != 1.0f ? gt_joint_mean(sums[n + i], hw) : 0.0f;
    for (long long p = 0; p < plane; ++p) {
      float v[3];
      if (gt_joint_source(m, p, v)) gt_joint_colour(v, c, mean1, mean2, 3);
      else { v[0] = fill[0]; v[1] = fill[1]; v[2] = fill[2]; }
      for (int k = 0; k < 3; ++k) ((float*)m[3])[k * plane + p] = v[k];
    }
  }
}
"""


def _cpu_run(tmp_path, images: list, rows: np.ndarray, fill) -> list:
    so = host_kernel_library(tmp_path / "joint", joint_kernels.source() + _ENTRY)
    hwc = [np.ascontiguousarray(t.permute(1, 2, 0).numpy()) for t in images]
    meta, colour, sizes = joint_kernels.layout(rows, [a.shape[:2] for a in hwc])
    meta[:, 0] = [a.ctypes.data for a in hwc]
    total = int(meta[-1, 3] + 3 * meta[-1, 4] * meta[-1, 5])
    out = np.zeros(total, dtype=np.float32)
    meta[:, 3] = out.ctypes.data + 4 * meta[:, 3]  # (offsets in elements -> pointers)
    sums = np.zeros(2 * len(images), dtype=np.uint64)
    fill_ = np.asarray(fill, dtype=np.float32)

    def ptr(a):
        return a.ctypes.data_as(ctypes.c_void_p)

    so.joint(ctypes.c_int(len(images)), ptr(meta), ptr(colour), ptr(sums), ptr(fill_))
    pieces = np.split(out, np.cumsum([3 * h * w for h, w in sizes])[:-1])
    return [torch.from_numpy(p.reshape(3, h, w)) for p, (h, w) in zip(pieces, sizes)]


def _rows(images: list, seed: int) -> np.ndarray:
    """A row of parameters per image (``JointProgram.row``'s layout, colour block first): RandomPhotometricDistort's
    draws (each step on with p=0.5, the contrast early or late, hue up to +-0.5 to reach every sextant), a
    window past the image on some side or inside it, and flips."""
    rng = np.random.default_rng(seed)
    rows = []
    for k, img in enumerate(images):
        h, w = img.shape[-2:]
        on = rng.random(5) < 0.5
        contrast = float(rng.uniform(0.5, 1.5))
        early = rng.random() < 0.5
        colour = [rng.uniform(0.875, 1.125) if on[0] else 1.0,
                  contrast if on[1] and early else 1.0,
                  rng.uniform(0.5, 1.5) if on[2] else 1.0,
                  1.0 if on[3] else 0.0, rng.uniform(-0.5, 0.5) if on[3] else 0.0,
                  contrast if on[1] and not early else 1.0]
        perm = rng.permutation(3) if on[4] else np.arange(3)
        if k == 0:  # every step, both contrasts
            colour = [1.1, 0.7, 1.3, 1.0, 0.27, 1.4]
        if k % 2:  # zoomed out: a canvas up to 2x the image, the image somewhere on it, cropped
            oh, ow = int(rng.integers(h, 2 * h)), int(rng.integers(w, 2 * w))
            top, left = int(rng.integers(-(oh - h), 1)), int(rng.integers(-(ow - w), 1))
        else:
            oh, ow = int(rng.integers(1, h + 1)), int(rng.integers(1, w + 1))
            top, left = int(rng.integers(0, h - oh + 1)), int(rng.integers(0, w - ow + 1))
        rows.append(colour + list(np.eye(3)[perm].ravel()) + [top, left, oh, ow, rng.random() < 0.5,
                                                            rng.random() < 0.5])
    out = np.asarray(rows, dtype=np.float32)
    assert out.shape[1] == joint.COLOUR_WIDTH + joint.STAGE_WIDTH
    return out


def _reference(img: torch.Tensor, row: np.ndarray, fill) -> torch.Tensor:
    """torchvision's functionals, in RandomPhotometricDistort's order, then the window and the flips."""
    b, c1, s, hue_on, hue, c2 = (float(v) for v in row[:6])
    if b != 1:
        img = F.adjust_brightness(img, b)
    if c1 != 1:
        img = F.adjust_contrast(img, c1)
    if s != 1:
        img = F.adjust_saturation(img, s)
    if hue_on:
        img = F.adjust_hue(img, hue)
    if c2 != 1:
        img = F.adjust_contrast(img, c2)
    img = img[row[6:15].reshape(3, 3).argmax(1)]
    top, left, oh, ow, hf, vf = (int(v) for v in row[15:21])
    h, w = img.shape[-2:]
    pad = [max(0, -left), max(0, -top), max(0, left + ow - w), max(0, top + oh - h)]
    img = F.pad(img, pad, fill=list(fill))
    img = img[:, top + pad[1]:top + pad[1] + oh, left + pad[0]:left + pad[0] + ow]
    if hf:
        img = img.flip(-1)
    if vf:
        img = img.flip(-2)
    return img


@pytest.fixture(scope="module")
def sized_photos(photo_folder):
    """Twelve photos, each at its own size."""
    ds = torchvision.datasets.ImageFolder(str(photo_folder))
    out = []
    for k in range(12):
        img = F.pil_to_tensor(ds[k][0])
        out.append(F.resize(img, [37 + 5 * k, 61 - 2 * k], antialias=True))
    return out


@pytest.mark.parametrize("device", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_joint_pixels_are_torchvisions(sized_photos, tmp_path, device):
    fill = (123, 117, 104)
    rows = _rows(sized_photos, seed=4)
    if device == "gpu":
        if not has_gpu():
            pytest.skip("no GPU")
        assert joint_kernels.ready(), joint_kernels._BROKEN
        program = joint.JointProgram(colour=True, resizes=(), fill=fill, tail=())
        images = [t.permute(1, 2, 0).contiguous().cuda() for t in sized_photos]
        got = [t.float().cpu() for t in joint_kernels.run(images, rows, program, None)]
        scaled = joint_kernels.run(images, rows, program, ((1 / 255,) * 3, (-0.5, 0.0, 0.5)))
        for a, s in zip(got, scaled):  # the hand-off's float map in the same pass
            assert s.dtype == torch.float32
            torch.testing.assert_close(s.cpu(), a * (1 / 255) + torch.tensor([-0.5, 0.0, 0.5]).view(3, 1, 1))
    else:
        got = _cpu_run(tmp_path, sized_photos, rows, fill)
    differ = total = 0
    for k, (img, row, ours) in enumerate(zip(sized_photos, rows, got)):
        theirs = _reference(img, row, fill).float()
        assert ours.shape == theirs.shape, k
        d = (ours - theirs).abs()
        assert d.max() <= 1, (k, row)
        differ += int((d > 0).sum())
        total += d.numel()
    assert differ <= 0.01 * total, (differ, total)
    # the rows drew every kind of step and window
    assert (rows[:, 1] != 1).any() and (rows[:, 5] != 1).any() and (rows[:, 3] == 1).any()
    assert (rows[:, 15] < 0).any() and (rows[:, 19] == 1).any() and (rows[:, 20] == 1).any()


def test_layout_offsets_and_colour():
    """The table the kernels read: outputs one after another, each window and its flips, the colour block as
    the row has it."""
    colour_rows = np.zeros((2, joint.COLOUR_WIDTH), dtype=np.float32)
    colour_rows[0, :6] = [1.1, 0.7, 1.3, 1.0, 0.27, 1.4]
    colour_rows[:, 6:15] = np.eye(3)[[2, 0, 1]].ravel()
    stage = np.asarray([[0, 0, 5, 7, 1, 0], [-2, 3, 4, 4, 0, 1]], dtype=np.float32)
    meta, colour, sizes = joint_kernels.layout(np.concatenate([colour_rows, stage], axis=1), [(5, 7), (9, 9)])
    assert sizes == [(5, 7), (4, 4)]
    assert meta[:, 3].tolist() == [0, 3 * 5 * 7] and meta[1, 6:10].tolist() == [-2, 3, 0, 1]
    assert meta[0, 6:10].tolist() == [0, 0, 1, 0] and meta[:, 1:3].tolist() == [[5, 7], [9, 9]]
    assert colour[:, :joint.COLOUR_WIDTH].tolist() == colour_rows.tolist() and not colour[:, joint.COLOUR_WIDTH:].any()


def test_explain_says_where_the_joint_pixels_run():
    """On the GPU a joint step with the colour block and no resize runs after the graph (the float map in the
    same pass); without the colour block, with a resize, or on the CPU, the graph does it."""
    plan_module = importlib.import_module("gputransforms.compiler.plan")
    ssd = joint.JointProgram(colour=True, resizes=(), fill=(123, 117, 104),
                             tail=(("to_dtype", torch.float32, True),))
    text = plan_module._plan_joint(ssd).explain("gpu")
    assert "CUDA kernels over the batch" in text and "written as float32" in text and "hand-off:" not in text
    assert "CUDA kernels" not in plan_module._plan_joint(ssd).explain("cpu")
    lsj = joint.JointProgram(colour=False, resizes=(("INTERP_LINEAR", True),), fill=(0, 0, 0), tail=ssd.tail)
    assert not joint_kernels.takes(lsj) and "CUDA kernels" not in plan_module._plan_joint(lsj).explain("gpu")
    ssdlite = joint.JointProgram(colour=False, resizes=(), fill=(0, 0, 0), tail=ssd.tail)  # (and hflip)
    assert not joint_kernels.takes(ssdlite) and "hand-off:" in plan_module._plan_joint(ssdlite).explain("gpu")


def test_a_launch_falls_back_to_torchs_call_without_the_driver_library(monkeypatch):
    """joint_kernels._launcher: where libcuda or the kernel's handle is missing, torch's own call launches."""
    calls = []

    class Kernel:  # a compiled kernel without the ``func`` handle (another torch)
        def __call__(self, **kw):
            calls.append(kw)

    launch = joint_kernels._launcher(Kernel())
    launch((2, 3, 1), (256, 1, 1), [4, 1.5])
    assert calls == [dict(grid=(2, 3, 1), block=(256, 1, 1), args=[4, 1.5])]
