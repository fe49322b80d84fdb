"""ColorJitter's fused CUDA kernels (compiler/color_kernels.py) against torchvision's per-image kernels.

On the GPU the kernels are compiled by torch's jiterator and compared with torchvision's own kernels
on CUDA tensors. Without a GPU the same kernel source is compiled by the host's C++ compiler (the
CUDA rounding intrinsics as plain float operations, no contraction) and run over the same rows and
chunks, against torchvision's kernels on the CPU. Tolerance as in test_batched.py: a uint8 value may
differ by 1 (torch's CPU divides where its CUDA kernels multiply by the reciprocal; the batched mean
sums in another order), the mean difference stays under 0.01 levels.
"""
import ctypes

import numpy as np
import pytest
import torch
import torchvision
from torchvision.transforms import v2

from gputransforms import transforms as T
from gputransforms.compiler import batched, color_kernels

from conftest import DEVICES, host_kernel_library, torchvision_jitter_params

_ENTRY = """
extern "C" void step(long n, long hw, const float* r, const float* g, const float* b, const float* op,
                     const float* f, const float* mean, float* ro, float* go, float* bo) {
  for (long i = 0; i < n * hw; ++i) {
    long row = i / hw;
    gt_jitter_step<float>(r[i], g[i], b[i], op[row], f[row], mean[row], ro[i], go[i], bo[i]);
  }
}
extern "C" void gray(long n, const float* r, const float* g, const float* b, float* out) {
  for (long i = 0; i < n; ++i) out[i] = gt_jitter_gray<float>(r[i], g[i], b[i]);
}
"""


def _cpu_kernels(tmp_path, integer: bool, v2: bool):
    """The kernels' source built by g++ as a shared library, wrapped as (step, gray) on CPU tensors."""
    so = host_kernel_library(tmp_path / f"k{int(integer)}{int(v2)}", color_kernels.source(color_kernels._STEP, integer, v2)
                             + color_kernels.source(color_kernels._GRAY, integer, v2) + _ENTRY)

    def ptr(a):
        return a.ctypes.data_as(ctypes.c_void_p)

    def planes(*ts):
        return [np.ascontiguousarray(t.float().numpy(), dtype=np.float32) for t in ts]

    def step(r, g, b, op, f, mean):
        r_, g_, b_ = planes(r, g, b)
        op_, f_, m_ = (np.ascontiguousarray(t.reshape(-1).numpy(), dtype=np.float32) for t in (op, f, mean))
        outs = [np.empty_like(r_) for _ in range(3)]
        so.step(ctypes.c_long(r_.shape[0]), ctypes.c_long(r_[0].size), ptr(r_), ptr(g_), ptr(b_), ptr(op_), ptr(f_),
                ptr(m_), *(ptr(o) for o in outs))
        return tuple(torch.from_numpy(o) for o in outs)

    def gray(r, g, b):
        r_, g_, b_ = planes(r, g, b)
        out = np.empty_like(r_)
        so.gray(ctypes.c_long(r_.size), ptr(r_), ptr(g_), ptr(b_), ptr(out))
        return torch.from_numpy(out)

    return step, gray


def _reference(t, x, params, api):
    """torchvision's own kernels, one image at a time, in each sample's drawn order."""
    F = torchvision.transforms.functional if api == "v1" else v2.functional
    adjust = (F.adjust_brightness, F.adjust_contrast, F.adjust_saturation, F.adjust_hue)
    out = []
    for img, (order, *fs) in zip(x, params):
        for k in order:
            if fs[int(k)] is not None:
                img = adjust[int(k)](img, fs[int(k)])
        out.append(img)
    return torch.stack(out)


CHAINS = {"all four": (0.4, 0.4, 0.4, 0.1), "wide": (0.8, (0.1, 1.9), (0.0, 2.5), 0.5), "no hue": (0.4, 0.4, 0.4, 0)}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("api", ["v1", "v2"])
@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32], ids=["uint8", "float"])
@pytest.mark.parametrize("chain", list(CHAINS))
def test_fused_color_jitter_equals_torchvision(photos, tmp_path, monkeypatch, device, api, dtype, chain):
    t = (T if api == "v1" else v2).ColorJitter(*CHAINS[chain])
    x = photos if dtype == torch.uint8 else photos.float() / 255
    x = x.to("cuda" if device == "gpu" else "cpu")
    torch.manual_seed(5)
    params = torchvision_jitter_params(t, x)
    orders, factors = batched.jitter_arrays(params)
    factors[3, :] = np.nan  # a row RandomApply left alone
    params[3] = [params[3][0], None, None, None, None]
    monkeypatch.setattr(color_kernels, "CHUNK", 10)  # three chunks, the last short
    if device == "gpu":
        got = color_kernels.color_jitter(x, orders, factors, v2=api == "v2")
        assert got is not None, color_kernels._BROKEN
    else:
        kernels = _cpu_kernels(tmp_path, dtype == torch.uint8, api == "v2")
        got = color_kernels._run(x, color_kernels.step_arrays(orders, factors), api == "v2", kernels=kernels)
    ref = _reference(t, x, params, api)
    assert got.shape == ref.shape and got.dtype == ref.dtype and got.device == ref.device
    assert torch.equal(got[3], x[3])
    d = (got.double() - ref.double()).abs() * (255 if dtype == torch.float32 else 1)
    assert (ref.double() - x.double()).abs().flatten(1).amax(1).gt(0).sum() >= 20, "too few rows changed"
    assert d.mean() < 0.01 and d.max() <= 1.0 + 1e-3, (d.mean().item(), d.max().item())
    if dtype == torch.uint8:
        assert (d == 0).double().mean() > 0.999, "more than one value in a thousand off by one"


@pytest.mark.gpu
def test_batched_stage_takes_the_fused_kernels_on_the_gpu(photos):
    """On CUDA the batched ColorJitter runs the fused kernels (none of torch's per-adjustment ops)."""
    x = photos.cuda()
    torch.manual_seed(1)
    orders, factors = batched.jitter_draws(T.ColorJitter(0.4, 0.4, 0.4, 0.1), len(x))
    fused = batched.color_jitter(x, orders, factors)
    ops = batched.color_jitter(x, orders, factors, fused=False)
    assert not color_kernels._BROKEN
    d = (fused.double() - ops.double()).abs()
    assert d.max() <= 1 and d.mean() < 0.01


def test_kernels_that_cannot_be_built_fall_back_to_torch_ops_once(photos, monkeypatch):
    """Where NVRTC is missing or refuses the source, the batched ColorJitter warns once and runs the torch
    ops from then on: the same images, no second attempt."""
    def refuse(integer, v2):
        attempts.append((integer, v2))
        raise RuntimeError("nvrtc: not available")

    attempts: list = []
    monkeypatch.setattr(color_kernels, "_BROKEN", [])
    monkeypatch.setattr(color_kernels, "usable", lambda x: not color_kernels._BROKEN)
    monkeypatch.setattr(color_kernels, "_kernels", refuse)
    torch.manual_seed(2)
    orders, factors = batched.jitter_draws(T.ColorJitter(0.4, 0.4, 0.4, 0.1), len(photos))
    with pytest.warns(RuntimeWarning, match="fused CUDA kernels are unavailable"):
        got = batched.color_jitter(photos, orders, factors)
    again = batched.color_jitter(photos, orders, factors)
    assert len(attempts) == 1 and color_kernels._BROKEN
    ref = batched.color_jitter(photos, orders, factors, fused=False)
    assert torch.equal(got, ref) and torch.equal(again, ref)


@pytest.mark.parametrize("integer", [True, False])
@pytest.mark.parametrize("v2_api", [True, False])
def test_jiterator_parses_the_kernels_as_their_entry_functions(integer, v2_api):
    """torch's jiterator finds a kernel's entry by a regular expression over the whole source (the last
    ``> type name(`` wins, and only the name is used): an edit that puts such a pattern in a body would launch
    the wrong function. Its own parser, which runs without a GPU, must name each kernel's entry."""
    from torch.cuda.jiterator import _CodeParser

    for code, name, returns in ((color_kernels._STEP, "gt_jitter_step", "void"),
                                (color_kernels._GRAY, "gt_jitter_gray", "T")):
        source = color_kernels.source(code, integer, v2_api).strip()
        parsed = _CodeParser(source)
        assert (parsed.function_name, parsed.return_type) == (name, returns)
        assert "GT_" not in source
