"""ColorJitter's four adjustments as fused CUDA kernels, for the batched stage on the GPU.

Written with torch's ops (``batched.color_jitter``), one ColorJitter is about 150 kernel launches per
batch: for each of its four steps and each adjustment, a gather of the rows, torchvision's
arithmetic one elementwise op at a time (the hue alone is about thirty), a scatter back. Each op
allocates a float temporary of the rows it works on. Here each step is one elementwise kernel over
all rows (each row's adjustment and factor are inputs), compiled at first use by torch's jiterator
(NVRTC, cached on disk). The contrast's mean of the grayscale image is a second kernel and torch's
``mean``, as before.

The arithmetic is torchvision's tensor arithmetic as it runs on CUDA, rounding included: each
multiply, add and divide of torchvision's kernels is one correctly rounded float operation here
(``__fmul_rn`` and the like: the compiler may not fuse them), v2's ``add_(other, alpha=...)`` is
the fused multiply-add that torch's CUDA kernel compiles to, a division by a Python scalar is the
multiplication by its float reciprocal (torch's CUDA division by a CPU scalar), and an integer
image is truncated after each adjustment as ``.to(uint8)`` truncates. Integer images travel
between the steps as floats holding integers. tests/test_batched.py compares the result with
torchvision's per-image kernels on the GPU and, compiled by the host's C++ compiler, on the CPU.

``color_jitter`` returns None where the kernels cannot be used (not CUDA, another dtype, no
jiterator), and the caller runs the torch ops.
"""
from __future__ import annotations

import contextlib
import warnings
from typing import Optional

import numpy as np
import torch

from ..device import to_device

#: rows one kernel works on at once: their float planes (three in, three out) are the only temporaries.
#: A batch of 256 uint8 images of 224 x 224 on an H200, four steps: chunks of 64 rows 1.83 ms and 122 MiB
#: above the batch, of 128 rows 1.62 ms and 208 MiB, all 256 at once 1.48 ms and 336 MiB
CHUNK = 64

# The step: ``op`` 0 brightness, 1 contrast (``mean`` is the row's grayscale mean), 2 saturation,
# 3 hue, anything else none. GT_INT: the image holds integers (uint8); GT_V2: torchvision's v2 kernels;
# GT_GRAY: the grayscale of (g0, g1, g2), shared with the contrast's ``_GRAY`` (``_gray``).
# No ">" in the bodies: jiterator's parser takes the last "> name name(" as the entry's signature.
_STEP = """
template <typename T> void gt_jitter_step(T r_, T g_, T b_, T op_, T f_, T mean_, T& ro, T& go, T& bo) {
  const float bound = GT_INT ? 255.0f : 1.0f;
  float x[3] = {(float)r_, (float)g_, (float)b_};
  const int op = (int)op_;
  const float f = (float)f_;
  const float c = __fsub_rn(1.0f, f);
  auto settle = [&](float v) {
    v = fminf(fmaxf(v, 0.0f), bound);
    return GT_INT ? truncf(v) : v;
  };
  auto blend = [&](float a, float other) {
    return GT_V2 ? __fmaf_rn(c, other, __fmul_rn(a, f)) : __fadd_rn(__fmul_rn(f, a), __fmul_rn(c, other));
  };
  if (op == 0) {
    for (int k = 0; k < 3; ++k) x[k] = settle(__fmul_rn(x[k], f));
  } else if (op == 1) {
    const float m = (float)mean_;
    for (int k = 0; k < 3; ++k) x[k] = settle(blend(x[k], m));
  } else if (op == 2) {
    const float g0 = x[0], g1 = x[1], g2 = x[2];
    const float gray = GT_GRAY;
    for (int k = 0; k < 3; ++k) x[k] = settle(blend(x[k], gray));
  } else if (op == 3) {
    float rr = x[0], gg = x[1], bb = x[2];
    if (GT_INT) {
      const float inv255 = 1.0f / 255.0f;
      rr = __fmul_rn(rr, inv255); gg = __fmul_rn(gg, inv255); bb = __fmul_rn(bb, inv255);
    }
    const float maxc = fmaxf(fmaxf(rr, gg), bb);
    const float minc = fminf(fminf(rr, gg), bb);
    const bool eqc = maxc == minc;
    const float cr = __fsub_rn(maxc, minc);
    const float s = __fdiv_rn(cr, eqc ? 1.0f : maxc);
    const float div = eqc ? 1.0f : cr;
    const float rc = __fdiv_rn(__fsub_rn(maxc, rr), div);
    const float gc = __fdiv_rn(__fsub_rn(maxc, gg), div);
    const float bc = __fdiv_rn(__fsub_rn(maxc, bb), div);
    float h;
    if (maxc == rr) h = __fsub_rn(bc, gc);
    else if (maxc == gg) h = __fsub_rn(__fadd_rn(rc, 2.0f), bc);
    else h = __fsub_rn(__fadd_rn(gc, 4.0f), rc);
    h = fmodf(__fadd_rn(__fmul_rn(h, 1.0f / 6.0f), 1.0f), 1.0f);
    h = fmodf(__fadd_rn(h, f), 1.0f);
    if (h != 0.0f && h < 0.0f) h = __fadd_rn(h, 1.0f);
    const float v = maxc;
    const float h6 = __fmul_rn(h, 6.0f);
    const float fi = floorf(h6);
    const float fr = __fsub_rn(h6, fi);
    const int i = ((int)fi) % 6;
    float p, q, t;
    if (GT_V2) {
      const float sxf = __fmul_rn(s, fr);
      const float oms = __fsub_rn(1.0f, s);
      q = fminf(fmaxf(__fmul_rn(__fsub_rn(1.0f, sxf), v), 0.0f), 1.0f);
      t = fminf(fmaxf(__fmul_rn(__fadd_rn(sxf, oms), v), 0.0f), 1.0f);
      p = fminf(fmaxf(__fmul_rn(oms, v), 0.0f), 1.0f);
    } else {
      p = fminf(fmaxf(__fmul_rn(v, __fsub_rn(1.0f, s)), 0.0f), 1.0f);
      q = fminf(fmaxf(__fmul_rn(v, __fsub_rn(1.0f, __fmul_rn(s, fr))), 0.0f), 1.0f);
      t = fminf(fmaxf(__fmul_rn(v, __fsub_rn(1.0f, __fmul_rn(s, __fsub_rn(1.0f, fr)))), 0.0f), 1.0f);
    }
    const float rs[6] = {v, q, p, p, t, v};
    const float gs[6] = {t, v, v, q, p, p};
    const float bs[6] = {p, p, t, v, v, q};
    x[0] = rs[i]; x[1] = gs[i]; x[2] = bs[i];
    if (GT_INT) {
      const float scale = 255.999f;
      for (int k = 0; k < 3; ++k) x[k] = truncf(__fmul_rn(x[k], scale));
    }
  }
  ro = (T)x[0]; go = (T)x[1]; bo = (T)x[2];
}
"""

# The grayscale that contrast takes the mean of (torchvision's, truncated for an integer image).
_GRAY = """
template <typename T> T gt_jitter_gray(T r_, T g_, T b_) {
  const float g0 = (float)r_, g1 = (float)g_, g2 = (float)b_;
  return (T)(GT_GRAY);
}
"""


def _gray(integer: bool, v2: bool) -> str:
    """GT_GRAY: the grayscale of the pixel (g0, g1, g2) as torchvision computes it -- v1's products and sums,
    v2's ``mul`` and ``add_(alpha=)`` (fused multiply-adds) -- truncated (v1's ``.to(uint8)``, v2's
    ``floor_``) for an integer image."""
    if v2:
        gray = "__fmaf_rn(0.114f, g2, __fmaf_rn(0.587f, g1, __fmul_rn(g0, 0.2989f)))"
        return f"floorf({gray})" if integer else gray
    gray = "__fadd_rn(__fadd_rn(__fmul_rn(0.2989f, g0), __fmul_rn(0.587f, g1)), __fmul_rn(0.114f, g2))"
    return f"truncf({gray})" if integer else gray


def source(code: str, integer: bool, v2: bool) -> str:
    """A kernel's code with its switches written in (jiterator's code must begin with ``template``)."""
    return code.replace("GT_GRAY", _gray(integer, v2)).replace("GT_INT", "true" if integer else "false") \
        .replace("GT_V2", "true" if v2 else "false")


_KERNELS: dict = {}
_BROKEN: list = []  # the reason the kernels could not be built or run, once it happened


def _kernels(integer: bool, v2: bool):
    key = (integer, v2)
    if key not in _KERNELS:
        from torch.cuda import jiterator

        _KERNELS[key] = (jiterator._create_multi_output_jit_fn(source(_STEP, integer, v2).strip(), num_outputs=3),
                         jiterator._create_jit_fn(source(_GRAY, integer, v2).strip()))
    return _KERNELS[key]


def usable(x: torch.Tensor) -> bool:
    return not _BROKEN and x.is_cuda and x.dtype in (torch.uint8, torch.float32) and x.ndim == 4 and x.shape[1] == 3


def step_arrays(orders: np.ndarray, factors: np.ndarray) -> np.ndarray:
    """(N, 8) float32: each row's adjustment at each of the four steps (4: none, where its factor is
    NaN) and that adjustment's factor."""
    n = orders.shape[0]
    rows = np.arange(n)[:, None]
    f = factors[rows, orders]
    ops = np.where(np.isnan(f), 4, orders)
    return np.concatenate([ops, np.nan_to_num(f, nan=0.0)], axis=1).astype(np.float32)


def color_jitter(x: torch.Tensor, orders: np.ndarray, factors: np.ndarray, v2: bool) -> Optional[torch.Tensor]:
    """``batched.color_jitter`` in fused kernels, or None where they cannot run (the caller then runs
    the torch ops). A failure to compile or launch is reported once and the torch ops are used from
    then on."""
    if not usable(x):
        return None
    try:
        # (the kernels launch on the current device's stream)
        with torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext():
            return _run(x, step_arrays(orders, factors), v2)
    except torch.cuda.OutOfMemoryError:
        raise  # (the torch ops would need more)
    except Exception as e:  # NVRTC missing or refusing: torchvision's arithmetic in torch ops still runs
        _BROKEN.append(repr(e))
        warnings.warn(f"gputransforms: ColorJitter's fused CUDA kernels are unavailable ({e!r}); the batched "
                      "stage runs it as torch ops (slower, more memory)", RuntimeWarning, stacklevel=3)
        return None


def _run(x: torch.Tensor, params: np.ndarray, v2: bool, kernels=None) -> torch.Tensor:
    """The steps chunk by chunk; ``kernels`` (step, gray) stand in for the compiled ones (the tests' CPU
    build of the same code)."""
    integer = not x.is_floating_point()
    step, gray = kernels or _kernels(integer, v2)
    out = torch.empty_like(x)
    p = to_device(torch.from_numpy(params), x.device)
    for c0 in range(0, x.shape[0], CHUNK):
        c1 = min(x.shape[0], c0 + CHUNK)
        ops = params[c0:c1, :4]
        r, g, b = (x[c0:c1, k:k + 1] for k in range(3))
        for k in range(4):
            if (ops[:, k] == 4).all():
                continue
            op = p[c0:c1, k].view(-1, 1, 1, 1)
            f = p[c0:c1, 4 + k].view(-1, 1, 1, 1)
            mean = f
            if (ops[:, k] == 1).any():
                mean = gray(r, g, b).mean(dim=(-3, -2, -1), keepdim=True, dtype=torch.float32)
            r, g, b = step(r, g, b, op, f, mean)
        for k, plane in enumerate((r, g, b)):
            out[c0:c1, k:k + 1].copy_(plane)
    return out
