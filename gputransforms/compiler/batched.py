"""The batched stage: transforms with no DALI operator, run after the graph on the whole batch where
it is (the GPU), with torchvision's meaning.

Most entries draw their parameters per sample with torchvision's own code -- the transform's
``get_params`` (v1) or ``make_params`` (v2), preceded by the same coin flip, called sample after
sample exactly as N calls of ``forward`` would call them -- and then apply all N parameter sets
at once. Where a transform's only draws are one coin (random-p ops) or one uniform sigma
(GaussianBlur), they are drawn as one tensor, which gives the same numbers in the same order.
ColorJitter's parameters, RandomApply's coins and RandomErasing's boxes are drawn for the whole
batch at once too, in another order (the same distributions). Per sample in Python, these draws
cost more than the kernels, and more again in the loader, where the reader threads hold the GIL.
Then:

- random-p ops (invert, posterize, solarize, sharpness, autocontrast, equalize, grayscale, flips):
  torchvision's functional kernel, which takes a batch, on the rows whose coin came up;
- deterministic ones (Grayscale, Pad, Resize, CenterCrop, dtype conversions): the transform
  itself, whose tensor kernel takes (..., C, H, W); Normalize: its arithmetic, with the mean and
  std on the device once (torchvision's kernel waits for the GPU three times per call);
- ColorJitter: each of the four adjustments on the rows whose random order puts it there, with
  torchvision's tensor arithmetic and one factor per row; on CUDA each step is one fused kernel over
  all rows (``color_kernels``);
- GaussianBlur: grouped convolutions with a kernel per sample (separable, as kornia's
  filter2d_separable computes it; reflect border like torchvision's);
- RandomRotation / RandomAffine / RandomPerspective: torchvision's inverse matrices / perspective
  coefficients per sample, one sampling grid per sample built the way torchvision builds its one
  grid, then a single grid_sample through torchvision's own ``_apply_grid_transform`` (fill too);
- RandomErasing (torchvision's and timm's): parameters drawn for the whole batch, one mask;
- RandomApply / RandomChoice / RandomOrder: the coin / choice / order per sample, then the member
  transforms (batched themselves) on the rows that drew them.

Given the same global RNG state, the result equals torchvision applied to each sample in turn,
up to float rounding (tests/test_batched.py), except inside the three containers, where the
members draw their parameters after all the coins, and for the transforms whose parameters are
drawn for the whole batch: ColorJitter (its kernel is still compared exactly, on torchvision's
own draws), RandomApply and RandomErasing (same distributions, another order of draws; tested by
distribution in tests/test_recipes.py, tests/test_random.py and, timm's, tests/test_timm.py).

Each ``lower_*`` builds the batched function of one transform, or returns None where its arguments
have no batched form; which class uses which is the registry's (``compiler.registry``).
"""
from __future__ import annotations

import functools
import math
import random
from typing import Callable, Optional

import numpy as np
import torch
import torchvision.transforms as tv1
from torchvision.transforms import v2 as tv2

from .. import _compat
from . import color_kernels
from ..device import to_device

Batched = Callable[[torch.Tensor], torch.Tensor]
#: a transform's batched function, or None (the containers lower their members through it)
Lower = Callable[[object], Optional[Batched]]


# --- helpers --------------------------------------------------------------------------------------

#: rows a kernel with large float temporaries (ColorJitter's adjustments, GaussianBlur) works on at once.
#: The rows an adjustment or a RandomApply takes change in number every batch; worked on all at once,
#: their temporaries changed size every batch too, and torch's caching allocator fragmented over them
#: (SimCLR on the H100 host: 1,722 MiB reserved for a peak of 598 allocated). In chunks of this many rows
#: they are bounded. SimCLR, batch 256, on the H200 host (benchmarks/results/stop11-simclr-chunk.txt),
#: device peak / img/s: all rows at once 2,646-2,962 MiB / 11,245-12,177; chunks of 64 2,226-2,364 /
#: 12,351-12,931; of 32 1,824-1,882 / 9,136-9,793 (the batched stage's launches bound the main thread)
CHUNK = 64


def _chunks(n: int, size: Optional[int] = None):
    """(start, stop) of each chunk of ``size`` (``CHUNK``) rows in ``n``."""
    size = size or CHUNK
    return ((k, min(n, k + size)) for k in range(0, n, size))


def to_dev(data, device: torch.device, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """Per-sample parameters onto the device without a synchronisation: ``torch.tensor(...,
    device="cuda")`` waits for the GPU to finish all queued work, which would serialise the Python
    parameter draws with the kernels of the batch before; a copy from pinned memory does not."""
    return to_device(torch.as_tensor(data, dtype=dtype), device)


def _coin_v1(p: float) -> bool:
    return torch.rand(1).item() < p  # v1: ``if torch.rand(1) < self.p: <apply>``


def _coin_v2(p: float) -> bool:
    return not bool(torch.rand(1) >= p)  # v2 _RandomApplyTransform: ``if torch.rand(1) >= self.p: return``


def _on_rows(x: torch.Tensor, rows: list, fn: Batched) -> torch.Tensor:
    """``fn`` applied to the rows ``rows`` of ``x`` (the others unchanged). A function with an ``on_rows``
    of its own (ColorJitter's, GaussianBlur's) takes the whole batch and the rows: no gather, no scatter,
    and tensors of the batch's size every time (a sub-batch changes size every batch, and torch's
    allocator fragments over such sizes)."""
    if not rows:
        return x
    if len(rows) == x.shape[0]:
        return fn(x)
    masked = getattr(fn, "on_rows", None)
    if masked is not None:
        return masked(x, rows)
    return _gathered(x, rows, fn)


def _gathered(x: torch.Tensor, rows: list, fn: Batched) -> torch.Tensor:
    """``fn`` on the sub-batch of ``rows``, scattered back into a copy of ``x``."""
    idx = to_dev(rows, x.device)
    out = x.clone()
    out[idx] = fn(x[idx]).to(x.dtype)
    return out


def _is_v2(t) -> bool:
    return isinstance(t, tv2.Transform)


def _interp_mode(t) -> Optional[str]:
    """grid_sample's mode for the transform's interpolation; None when torchvision's tensor kernels
    have none (they raise; such chains run on PIL images, see plan.tensor_capable)."""
    mode = _compat.interpolation_mode(t.interpolation).value
    return mode if mode in ("nearest", "bilinear") else None


# --- colour ---------------------------------------------------------------------------------------

def _coins(n: int, p: float, v2: bool) -> list:
    """The rows whose coin comes up, for n samples: v1's ``torch.rand(1) < p`` or v2's ``not
    torch.rand(1) >= p``, drawn as one ``torch.rand(n)``, which gives the numbers of n calls of
    ``torch.rand(1)`` in the same order (torch's CPU generator fills a tensor serially; tested), so
    the result is torchvision's sample after sample, exactly, for 2 calls instead of n."""
    u = torch.rand(n)
    return (~(u >= p) if v2 else u < p).nonzero().flatten().tolist()


def lower_random_p(kernel: Callable[[object, torch.Tensor], torch.Tensor]):
    """A transform that applies a deterministic functional kernel with probability p (its only draw
    is the coin)."""
    def build(t) -> Batched:
        v2 = _is_v2(t)
        return lambda x: _on_rows(x, _coins(x.shape[0], t.p, v2), lambda y: kernel(t, y))
    return build


def lower_deterministic(t) -> Batched:
    return t  # torchvision's tensor kernels of these take (..., C, H, W) with one set of parameters


def lower_normalize(t) -> Batched:
    """Normalize: torchvision's arithmetic (subtract the mean, divide by the std, per channel), in
    the stage's own batch, with the mean and std kept on the device per dtype. torchvision's kernel
    copies both from pageable memory and v1's tests ``std == 0`` on the device, at every call: each
    a wait for the GPU (torch's sync debug mode, H100), which held the loader's main thread until
    the batch's kernels were done. Where torchvision raises (not a float tensor, a zero std in the
    dtype) or its arithmetic is not this (a 2-D tensor), torchvision's own Normalize runs."""
    cache: dict = {}

    def run(x):
        key = (x.device, x.dtype)
        if key not in cache:
            if not x.is_floating_point() or x.ndim < 3:
                return t(x)
            mean = torch.as_tensor(t.mean, dtype=x.dtype)
            std = torch.as_tensor(t.std, dtype=x.dtype)
            if bool((std == 0).any()):
                return t(x)
            cache[key] = tuple(to_dev(v.view(-1, 1, 1) if v.ndim == 1 else v, x.device) for v in (mean, std))
        mean, std = cache[key]
        if mean.shape[0] not in (1, x.shape[-3]) or std.shape[0] not in (1, x.shape[-3]):
            return t(x)  # v1 raises (in place), v2 broadcasts to the mean's channels
        return x.sub_(mean).div_(std)
    return run


def lower_color_jitter(t) -> Batched:
    """ColorJitter's parameters drawn for the whole batch at once: a uniformly random order of the
    four adjustments per sample (torchvision: ``randperm(4)``; here the argsort of four uniforms) and
    each factor uniform in its range, or none where the range is None. The same distribution as
    ``get_params``/``make_params`` (tests/test_recipes.py), not its numbers from a seed: called 256
    times in Python those draws were half of the batched ColorJitter's 12.7 ms per batch on the H100
    (``benchmarks.batched_stage``), and the loader's main thread pays more for them while the reader
    threads hold the GIL."""
    v2 = _is_v2(t)

    def run(x):
        return color_jitter(x, *jitter_draws(t, x.shape[0]), v2=v2)

    def on_rows(x, rows):
        """The rows' draws, in the order ``run`` on the gathered rows would draw them; the other rows get
        no adjustment (NaN factors), which both kernels pass over."""
        n = x.shape[0]
        drawn_orders, drawn_factors = jitter_draws(t, len(rows))
        orders, factors = np.tile(np.arange(4), (n, 1)), np.full((n, 4), np.nan)
        orders[rows], factors[rows] = drawn_orders, drawn_factors
        return color_jitter(x, orders, factors, v2=v2)
    run.on_rows = on_rows
    return run


def jitter_draws(t, n: int) -> tuple:
    """(orders, factors) of ``color_jitter`` for n samples, from torch's global RNG."""
    orders = np.argsort(torch.rand(n, 4).numpy(), axis=1)
    factors = np.full((n, 4), np.nan)
    for k, r in enumerate((t.brightness, t.contrast, t.saturation, t.hue)):
        if r is not None:
            factors[:, k] = torch.empty(n).uniform_(float(r[0]), float(r[1])).numpy()
    return orders, factors


def jitter_arrays(params: list) -> tuple:
    """torchvision's per-sample ``get_params`` tuples (fn_idx, brightness, contrast, saturation, hue)
    as ``color_jitter``'s (orders, factors) arrays."""
    orders = np.asarray([[int(k) for k in p[0]] for p in params], dtype=np.int64).reshape(-1, 4)
    factors = np.asarray([[np.nan if f is None else float(f) for f in p[1:]] for p in params],
                         dtype=np.float64).reshape(-1, 4)
    return orders, factors


def color_jitter(x: torch.Tensor, orders: np.ndarray, factors: np.ndarray, v2: bool = False,
                 fused: bool = True) -> torch.Tensor:
    """ColorJitter on a (N,3,H,W) batch: ``orders[i, step]`` is the adjustment (0 brightness, 1
    contrast, 2 saturation, 3 hue) sample i gets at that step (torchvision's fn_idx), ``factors[i, a]``
    its factor (NaN: none). Each of the four steps is applied to the rows whose order puts that
    adjustment there, with torchvision's tensor arithmetic (blend, truncated grayscale, HSV; v1's or
    v2's HSV round trip). The rows and factors of all sixteen (step, adjustment) groups go to the
    device in one copy each. On CUDA (``fused``) the same arithmetic runs as one kernel per step
    (``color_kernels``), where it can."""
    if fused:
        out = color_kernels.color_jitter(x, orders, factors, v2)
        if out is not None:
            return out
    gray, rgb_to_hsv, convert, max_value = _compat.tensor_color_kernels(v2)
    x = x.clone()
    bound = max_value(x.dtype)

    def blend(a, b, ratio):  # v1's ``ratio*a + (1-ratio)*b``; v2's ``a.mul(ratio).add_(b, alpha=1-ratio)``
        if v2:  # (addcmul rounds like add with alpha, a fused multiply-add)
            return a.mul(ratio).addcmul_(b, 1.0 - ratio).clamp_(0, bound).to(a.dtype)
        return (ratio * a + (1.0 - ratio) * b).clamp(0, bound).to(a.dtype)

    groups, rows = [], []
    for step in range(4):
        for adj in range(4):
            r = np.nonzero((orders[:, step] == adj) & ~np.isnan(factors[:, adj]))[0]
            if len(r):  # (each group's rows in chunks of CHUNK at most)
                start = sum(len(g) for g in rows)
                groups += [(adj, start + c0, c1 - c0) for c0, c1 in _chunks(len(r))]
                rows.append(r)
    if not groups:
        return x
    all_rows = np.concatenate(rows)
    idx_all = to_dev(all_rows, x.device, torch.int64)
    f_all = to_dev(factors[all_rows, np.concatenate([[adj] * count for adj, _, count in groups])], x.device,
                 torch.float32)
    for adj, start, count in groups:
        idx = idx_all[start:start + count]
        f = f_all[start:start + count, None, None, None]
        img = x[idx]
        if adj == 0:
            img = blend(img, torch.zeros_like(img), f)
        elif adj == 1:
            mean = gray(img).to(torch.float32).mean(dim=(-3, -2, -1), keepdim=True)
            img = blend(img, mean, f)
        elif adj == 2:
            img = blend(img, gray(img), f)
        else:
            h, sat, val = rgb_to_hsv(convert(img, torch.float32)).unbind(dim=-3)
            img = convert(hsv_to_rgb(torch.stack(((h + f[:, 0]) % 1.0, sat, val), dim=-3), v2), x.dtype)
        x[idx] = img
    return x


_HSV_SELECT: dict = {}  # device -> which of (v, p, q, t) each of R, G, B is, for each hue sextant


def hsv_to_rgb(img: torch.Tensor, v2: bool = False) -> torch.Tensor:
    """torchvision's HSV->RGB with its own p, q, t arithmetic (v1's or v2's float rounding) and
    v2's gather for the sextant selection: bit-identical to v1's ``_hsv2rgb``, whose one-hot
    einsum over 18 stacked planes is 4x slower, and to v2's, whose table is copied from pageable
    memory on every call."""
    h, s, v = img.unbind(dim=-3)
    i = torch.floor(h * 6.0)
    f = (h * 6.0) - i
    i = i.to(torch.int64).remainder_(6)
    if v2:
        sxf, one_minus_s = s * f, 1.0 - s
        q = (1.0 - sxf).mul_(v).clamp_(0.0, 1.0)
        t = sxf.add_(one_minus_s).mul_(v).clamp_(0.0, 1.0)
        p = one_minus_s.mul_(v).clamp_(0.0, 1.0)
    else:
        p = torch.clamp(v * (1.0 - s), 0.0, 1.0)
        q = torch.clamp(v * (1.0 - s * f), 0.0, 1.0)
        t = torch.clamp(v * (1.0 - s * (1.0 - f)), 0.0, 1.0)
    select = _HSV_SELECT.get(img.device)
    if select is None:
        select = _HSV_SELECT[img.device] = to_dev([[0, 2, 1, 1, 3, 0], [3, 0, 0, 2, 1, 1], [1, 1, 3, 0, 0, 2]],
                                                img.device)
    return torch.stack((v, p, q, t), dim=-3).gather(-3, select[:, i].moveaxis(0, -3))


# --- blur -----------------------------------------------------------------------------------------

def _gaussian_kernels(size: int, sigmas: torch.Tensor) -> torch.Tensor:
    """torchvision's 1-D Gaussian (v2's formula) for each sigma: (N, size)."""
    lim = (size - 1) / (2.0 * 2.0 ** 0.5)
    xs = torch.linspace(-lim, lim, steps=size, dtype=sigmas.dtype, device=sigmas.device)
    return torch.softmax(-(xs[None, :] / sigmas[:, None]).pow(2), dim=1)


def gaussian_blur(x: torch.Tensor, kernel_size, sigmas: list) -> torch.Tensor:
    """torchvision's gaussian_blur with one (sigma_x, sigma_y) per sample: reflect border, float
    arithmetic, rounded back to an integer dtype. Separable, as kornia's ``filter2d_separable`` computes it
    (the same pads and grouped convolutions, so the same values), in chunks of ``BLUR_CHUNK`` rows with
    each temporary let go as soon as the next one is made: two float chunks at a time, where kornia's held
    five (SimCLR on the H100 host: 187 of torch's 408 MiB at its peak were those five)."""
    kx, ky = kernel_size
    fp = x.is_floating_point()
    dtype = x.dtype if fp else torch.float32
    s = to_dev(sigmas, x.device, dtype).reshape(-1, 2)
    kernels_x, kernels_y = _gaussian_kernels(kx, s[:, 0]), _gaussian_kernels(ky, s[:, 1])
    out = torch.empty_like(x)
    for c0, c1 in _chunks(x.shape[0], BLUR_CHUNK):
        part = x[c0:c1].to(dtype)  # (each step's input is let go when its output takes the name)
        part = _reflect_pad(part, 1, kx)
        part = _correlate(part, kernels_x[c0:c1, None, :])
        part = _reflect_pad(part, ky, 1)
        part = _correlate(part, kernels_y[c0:c1, :, None])
        out[c0:c1] = part if fp else part.round_()
        del part
    return out


#: the rows GaussianBlur convolves at once (two float copies of them alive at a time)
BLUR_CHUNK = 32


def _reflect_pad(x: torch.Tensor, kh: int, kw: int) -> torch.Tensor:
    """kornia's 'same' padding for a (kh, kw) kernel, reflected (an even size has the extra pixel after)."""
    return torch.nn.functional.pad(x, [(kw - 1) // 2, kw - 1 - (kw - 1) // 2, (kh - 1) // 2, kh - 1 - (kh - 1) // 2],
                                   mode="reflect")


def _correlate(padded: torch.Tensor, kernels: torch.Tensor) -> torch.Tensor:
    """kornia's ``filter2d`` after its padding: each sample of a padded float (B, C, H', W') batch correlated
    with its own (kh, kw) kernel, channel by channel, in one grouped convolution."""
    b, c = padded.shape[:2]
    kh, kw = kernels.shape[-2:]
    weight = kernels.to(padded.dtype)[:, None].expand(-1, c, -1, -1).reshape(-1, 1, kh, kw)
    out = torch.nn.functional.conv2d(padded.reshape(1, -1, padded.size(-2), padded.size(-1)), weight,
                                     groups=weight.size(0))
    return out.view(b, c, out.size(-2), out.size(-1))


def lower_gaussian_blur(t) -> Batched:
    """GaussianBlur's sigma, ``torch.empty(1).uniform_(lo, hi).item()`` per sample in v1's get_params
    and v2's make_params (both sigmas equal), drawn as one ``torch.empty(n).uniform_(lo, hi)``: the
    same numbers in the same order (see ``_coins``)."""
    ks = list(t.kernel_size)
    lo, hi = float(t.sigma[0]), float(t.sigma[1])

    def run(x):
        s = torch.empty(x.shape[0]).uniform_(lo, hi)
        return gaussian_blur(x, ks, torch.stack([s, s], 1))

    def on_rows(x, rows):
        """The rows' sigmas drawn as ``run`` on the gathered rows draws them. An integer batch is blurred
        whole, the other rows with a one-hot kernel (what they sum is the pixel itself, and the rounding
        gives it back exactly); a float batch has its rows gathered."""
        s = torch.empty(len(rows)).uniform_(lo, hi)
        if x.is_floating_point():
            return _gathered(x, rows, lambda y: gaussian_blur(y, ks, torch.stack([s, s], 1)))
        whole = torch.full((x.shape[0],), _ONE_HOT_SIGMA)
        whole[rows] = s
        return gaussian_blur(x, ks, torch.stack([whole, whole], 1))
    run.on_rows = on_rows
    return run


#: a sigma whose Gaussian is one-hot in float32 (the neighbours' weights underflow to 0)
_ONE_HOT_SIGMA = 1e-3


# --- geometry -------------------------------------------------------------------------------------

def _base_grid(oh: int, ow: int, offset: float, dtype, device) -> torch.Tensor:
    """torchvision's (1, oh*ow, 3) homogeneous pixel grid: affine grids are centred (offset
    (1-ow)/2), perspective ones start at 0.5."""
    if offset is None:
        xs = torch.linspace((1.0 - ow) * 0.5, (ow - 1.0) * 0.5, steps=ow, device=device, dtype=dtype)
        ys = torch.linspace((1.0 - oh) * 0.5, (oh - 1.0) * 0.5, steps=oh, device=device, dtype=dtype)
    else:
        xs = torch.linspace(offset, ow + offset - 1.0, steps=ow, device=device, dtype=dtype)
        ys = torch.linspace(offset, oh + offset - 1.0, steps=oh, device=device, dtype=dtype)
    base = torch.empty(1, oh, ow, 3, dtype=dtype, device=device)
    base[..., 0].copy_(xs)
    base[..., 1].copy_(ys[:, None])
    base[..., 2].fill_(1)
    return base.view(1, oh * ow, 3)


def affine_grids(matrices: list, w: int, h: int, dtype, device) -> torch.Tensor:
    """torchvision's _affine_grid for N inverse matrices at once: (N, h, w, 2)."""
    theta = to_dev(matrices, device, dtype).reshape(-1, 2, 3)
    scaled = theta.transpose(1, 2) / to_dev([0.5 * w, 0.5 * h], device, dtype)
    return _base_grid(h, w, None, dtype, device).matmul(scaled).view(-1, h, w, 2)


def perspective_grids(coeffs: list, w: int, h: int, dtype, device) -> torch.Tensor:
    """torchvision's _perspective_grid for N coefficient sets at once: (N, h, w, 2)."""
    c = to_dev(coeffs, device, dtype).reshape(-1, 8)
    ones = torch.ones_like(c[:, 0])
    theta1 = torch.stack([c[:, 0:3], c[:, 3:6]], dim=1)
    row2 = torch.stack([c[:, 6], c[:, 7], ones], dim=1)
    theta2 = torch.stack([row2, row2], dim=1)
    base = _base_grid(h, w, 0.5, dtype, device)
    g1 = base.matmul(theta1.transpose(1, 2) / to_dev([0.5 * w, 0.5 * h], device, dtype))
    g2 = base.matmul(theta2.transpose(1, 2))
    return (g1 / g2 - 1.0).view(-1, h, w, 2)


def _fill_for_tensors(t, channels: int):
    """The fill torchvision's forward passes to the tensor kernel: v1 turns a number into one per
    channel; v2 looks the fill up for plain tensors (None: no fill mask)."""
    if _is_v2(t):
        return _compat.v2_tensor_fill(t)
    fill = t.fill
    return [float(fill)] * channels if isinstance(fill, (int, float)) else [float(f) for f in fill]


def _warp(t, kind: str, draw) -> Optional[Batched]:
    """A geometric transform as one grid_sample. ``draw(x, i)`` returns the sample's inverse affine
    matrix (kind "affine") or perspective coefficients (kind "perspective"), or None (unchanged)."""
    mode = _interp_mode(t)
    if mode is None:
        return None
    apply_grid = _compat.apply_grid_transform()

    def run(x):
        n, c, h, w = x.shape
        params = [draw(x, i) for i in range(n)]
        rows = [i for i, p in enumerate(params) if p is not None]
        if not rows:
            return x
        dtype = x.dtype if x.is_floating_point() else torch.float32
        make = affine_grids if kind == "affine" else perspective_grids
        grids = make([params[i] for i in rows], w, h, dtype, x.device)
        fill = _fill_for_tensors(t, c)
        return _on_rows(x, rows, lambda y: apply_grid(y, grids, mode, fill))
    return run


def _center(t, w: int, h: int) -> list:
    return [0.0, 0.0] if t.center is None else [float(c) - s * 0.5 for c, s in zip(t.center, (w, h))]


def lower_random_rotation(t) -> Optional[Batched]:
    if t.expand:
        return None  # the output size depends on the angle: samples no longer stack
    inverse = _compat.inverse_affine_matrix()

    def draw(x, i):
        h, w = x.shape[-2:]
        if _is_v2(t):
            angle = _compat.make_params(t, x[i])["angle"] % 360
        else:
            angle = t.get_params(t.degrees)
        return inverse(_center(t, w, h), -angle, [0.0, 0.0], 1.0, [0.0, 0.0])
    return _warp(t, "affine", draw)


def lower_random_affine(t) -> Optional[Batched]:
    inverse = _compat.inverse_affine_matrix()

    def draw(x, i):
        h, w = x.shape[-2:]
        if _is_v2(t):
            p = _compat.make_params(t, x[i])
            angle, translate, scale, shear = p["angle"], p["translate"], p["scale"], p["shear"]
        else:
            angle, translate, scale, shear = t.get_params(t.degrees, t.translate, t.scale, t.shear, [w, h])
        return inverse(_center(t, w, h), float(angle), [float(v) for v in translate], scale, list(shear))
    return _warp(t, "affine", draw)


def lower_random_perspective(t) -> Optional[Batched]:
    def draw(x, i):
        h, w = x.shape[-2:]
        if _is_v2(t):
            return _compat.make_params(t, x[i])["coefficients"] if _coin_v2(t.p) else None
        if not _coin_v1(t.p):
            return None
        start, end = t.get_params(w, h, t.distortion_scale)
        return _compat.perspective_coefficients(start, end)
    return _warp(t, "perspective", draw)


# --- erasing --------------------------------------------------------------------------------------

def _erasing_value(t):
    """v1's forward turns ``value`` into what get_params takes (None: random normal pixels)."""
    value = t.value
    if isinstance(value, (int, float)):
        return [float(value)]
    if isinstance(value, str):
        return None
    if isinstance(value, (list, tuple)):
        return [float(v) for v in value]
    return value


def erase(x: torch.Tensor, boxes: list, inplace: bool = False) -> torch.Tensor:
    """torchvision's erase for one (i, j, h, w, v) or None per sample. Per-channel values v (C,1,1)
    are written through one mask over the batch (``fill_boxes``); random-pixel patches (C,h,w) are
    copied in one by one. ``inplace``: write into ``x`` (the batched stage owns its batch), which
    keeps the device memory of a batch-sized copy."""
    n, c, height, width = x.shape
    const = [(k, b) for k, b in enumerate(boxes) if b is not None and b[4].shape[-2:] == (1, 1)]
    pixels = [(k, b) for k, b in enumerate(boxes) if b is not None and b[4].shape[-2:] != (1, 1)]
    if not const and not pixels:
        return x
    if not inplace:
        x = x.clone()
    if const:
        box = np.zeros((n, 4), dtype=np.int64)
        values = torch.zeros(n, c)
        for k, b in const:
            box[k] = b[:4]
            values[k] = b[4].reshape(-1).expand(c)
        fill_boxes(x, box, values)
    for k, (i, j, h, w, v) in pixels:
        x[k, :, i:i + h, j:j + w] = to_dev(v, x.device)
    return x


def fill_boxes(x: torch.Tensor, box: np.ndarray, values: torch.Tensor) -> torch.Tensor:
    """Write ``values[k]`` (one per channel; (N,C) or (1,C)) into the box ``box[k]`` = (i, j, h, w)
    of each sample k of ``x``, in place, through one (N,1,H,W) mask: nothing batch-sized in float.
    An empty box (h = 0) leaves its sample alone."""
    mask = _box_mask(to_dev(box, x.device), x.shape[-2], x.shape[-1])
    return torch.where(mask, to_dev(values, x.device, x.dtype)[:, :, None, None], x, out=x)


def _box_mask(box: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """(N,1,H,W) bool, true inside sample k's box ``box[k]`` = (i, j, h, w) (an int tensor on the
    batch's device; h = 0: no box)."""
    ys = torch.arange(height, device=box.device)[None, :, None]
    xs = torch.arange(width, device=box.device)[None, None, :]
    i, j, h, w = (box[:, k, None, None] for k in range(4))
    return ((ys >= i) & (ys < i + h) & (xs >= j) & (xs < j + w))[:, None]


def _np(t: torch.Tensor) -> np.ndarray:
    return t.numpy().astype(np.float64)


def _erase_sizes(area: np.ndarray, log_aspect: torch.Tensor) -> tuple:
    """Erased boxes' (h, w) as torchvision's and timm's Python math gives them, ``round(sqrt(area *
    aspect))`` and ``round(sqrt(area / aspect))`` in float64, half to even, for all attempts at once.
    In numpy: torch's CPU sqrt, exp and round (MKL VML kernels, split across torch's intra-op
    threads above 2,048 elements) took 4.5-6.8 ms each on these few thousand numbers in the loader's
    process on the H100 host, where DALI's threads keep the cores busy: more than the erasing itself."""
    aspect = np.exp(_np(log_aspect))
    return np.round(np.sqrt(area * aspect)).astype(np.int64), np.round(np.sqrt(area / aspect)).astype(np.int64)


def lower_random_erasing(t) -> Batched:
    """torchvision's RandomErasing (v1 and v2), its parameters drawn for the whole batch at once:
    the coins, then up to 10 (area, log-aspect) attempts per erased sample from torchvision's
    ranges, the first attempt that fits (as get_params/make_params take it; none fits: no change),
    and a uniform integer offset. The same distribution as N calls, not the same numbers from a
    seed: per sample, the Python draws cost ~33 us, 8.5 ms per batch of 256 in the main thread,
    which measured as the loader's bottleneck under training (benchmarks/train.py, ta_wide)."""
    def run(x):
        n, c, height, width = x.shape
        value = t.value if _is_v2(t) else _erasing_value(t)
        if value is not None and len(value) not in (1, c):
            raise ValueError("If value is a sequence, it should have either a single value or "
                             f"{c} (number of input channels)")
        rows = (torch.rand(n) < t.p).nonzero().flatten()
        k = len(rows)
        if k == 0:
            return x
        area = height * width * _np(torch.empty(k, 10).uniform_(t.scale[0], t.scale[1]))
        hs, ws = _erase_sizes(area, torch.empty(k, 10).uniform_(math.log(t.ratio[0]), math.log(t.ratio[1])))
        fits = (hs < height) & (ws < width)
        first = fits.argmax(1)
        pick = np.arange(k)
        h, w = hs[pick, first], ws[pick, first]
        i = (_np(torch.rand(k)) * (height - h + 1)).astype(np.int64)
        j = (_np(torch.rand(k)) * (width - w + 1)).astype(np.int64)
        ok = fits.any(1)
        if value is not None:  # one fill for every box: no Python per erased sample (the stage's own batch)
            box = np.zeros((n, 4), dtype=np.int64)
            box[rows.numpy()[ok]] = np.stack([i, j, h, w], 1)[ok]
            return fill_boxes(x, box, torch.tensor(value, dtype=torch.float32).expand(c).contiguous()[None])
        boxes: list = [None] * n  # normal pixels, drawn box after box as torchvision does
        for r, fit, i0, j0, h0, w0 in zip(rows.tolist(), ok.tolist(), i.tolist(), j.tolist(), h.tolist(), w.tolist()):
            if fit:
                boxes[r] = (i0, j0, h0, w0, torch.empty([c, h0, w0], dtype=torch.float32).normal_())
        return erase(x, boxes, inplace=True)
    return run


def lower_timm_random_erasing(t) -> Batched:
    """timm's RandomErasing, each sample erased as timm's per-sample call (``create_transform``'s
    chain) erases it: a coin (``random.random() > probability`` skips), a count of boxes in
    [min_count, max_count], per box up to 10 (area / count, log-aspect) attempts, the first that fits
    (``w < W and h < H``), a uniform top-left; the box filled with zeros ('const'), one normal colour
    per channel ('rand') or normal pixels ('pixel'), later boxes over earlier ones. All draws for the
    whole batch at once from torch's RNG, the arithmetic in numpy (same distribution, another order
    of draws; tests/test_timm.py), then one copy to the device and one masked write per box. timm's
    own loop, run on a batch, erases sample after sample from Python and, with its ``device='cpu'``,
    waits for the GPU at every erased sample (a copy from pageable memory); on a batch it also skips
    the first ``batch // num_splits`` samples, which per-sample calls never do."""
    lo, hi = t.log_aspect_ratio
    m = t.max_count

    def run(x):
        n, c, height, width = x.shape
        count = _np(torch.randint(t.min_count, m + 1, (n,)))
        area = _np(torch.empty(n, m, 10).uniform_(t.min_area, t.max_area)) * (height * width) / count[:, None, None]
        hs, ws = _erase_sizes(area, torch.empty(n, m, 10).uniform_(lo, hi))
        fits = (ws < width) & (hs < height)
        first = fits.argmax(2)[..., None]
        h, w = np.take_along_axis(hs, first, 2)[..., 0], np.take_along_axis(ws, first, 2)[..., 0]
        ok = fits.any(2) & (np.arange(m) < count[:, None]) & ~(_np(torch.rand(n)) > t.probability)[:, None]
        if not ok.any():
            return x
        top = np.floor(_np(torch.rand(n, m)) * np.maximum(height - h + 1, 1))
        left = np.floor(_np(torch.rand(n, m)) * np.maximum(width - w + 1, 1))
        box = to_dev((np.stack([top, left, h, w], -1) * ok[..., None]).astype(np.int64), x.device)  # (n, m, 4)
        masks = [_box_mask(box[:, k], height, width) for k in range(m)]  # (a box that is not: h = 0)
        # written into x, the stage's own batch (tail.run_stages)
        if t.rand_color:  # a colour per box: a later box paints over an earlier one
            colours = to_dev(torch.empty(m, n, c, 1, 1).normal_(), x.device).to(x.dtype)
            for k in range(m):
                torch.where(masks[k], colours[k], x, out=x)
            return x
        mask = functools.reduce(torch.logical_or, masks)
        if t.per_pixel:
            return torch.where(mask, torch.randn(x.shape, device=x.device, dtype=x.dtype), x, out=x)
        return x.masked_fill_(mask, 0)
    return run


# --- containers -----------------------------------------------------------------------------------

def _lower_all(transforms, lower: Lower) -> Optional[list]:
    """Each transform's batched function, or None if one of them has none."""
    fns = [lower(t) for t in transforms]
    return None if any(f is None for f in fns) else fns


def sequence(transforms, lower: Lower) -> Optional[Batched]:
    """A list of transforms, each batched, or None if one of them is not."""
    fns = _lower_all(transforms, lower)
    if fns is None:
        return None
    if len(fns) == 1:
        return fns[0]  # (with its ``on_rows``, where it has one)

    def run(x):
        for f in fns:
            x = f(x)
        return x
    return run


def _keeps_shape(t) -> bool:
    """Whether ``t`` leaves a sample's shape and dtype as they are (what a container's rows are written back
    into): the colour, blur, noise, erasing and normalize kernels, warps without ``expand``, and containers of
    those; not a resize, crop, pad, dtype conversion or one-channel grayscale."""
    if isinstance(t, (tv1.RandomApply, tv1.RandomChoice, tv1.RandomOrder, tv1.Compose, tv2.RandomApply,
                      tv2.RandomChoice, tv2.RandomOrder, tv2.Compose)):
        return all(_keeps_shape(u) for u in t.transforms)
    if isinstance(t, (tv1.Grayscale, tv2.Grayscale)):
        return t.num_output_channels == 3
    if isinstance(t, (tv1.RandomRotation, tv2.RandomRotation)):
        return not t.expand
    return not isinstance(t, (tv1.Resize, tv2.Resize, tv1.CenterCrop, tv2.CenterCrop, tv1.Pad, tv2.Pad,
                              tv1.ConvertImageDtype, tv2.ConvertImageDtype, tv2.ToDtype))


def lower_random_apply(t, lower: Lower) -> Optional[Batched]:
    if not _keeps_shape(t):
        return None  # some rows would change shape and others not: per sample, as torchvision runs it
    inner = sequence(t.transforms, lower)
    if inner is None:
        return None
    # v1: ``if self.p < torch.rand(1): return img``; v2: ``if torch.rand(1) >= self.p: return``: each
    # applies with probability p; the coins of the batch are drawn at once (compared by distribution)
    return lambda x: _on_rows(x, _coins(x.shape[0], t.p, v2=True), inner)


def _grouped(x: torch.Tensor, keys: list, run_for_key) -> torch.Tensor:
    for key in dict.fromkeys(keys):
        x = _on_rows(x, [i for i, k in enumerate(keys) if k == key], run_for_key(key))
    return x


def lower_random_choice(t, lower: Lower) -> Optional[Batched]:
    if not _keeps_shape(t):
        return None  # (the rows' outputs are written back into the batch: ``_on_rows``)
    fns = _lower_all(t.transforms, lower)
    if fns is None:
        return None
    if _is_v2(t):
        def choose():
            return int(torch.multinomial(torch.tensor(t.p), 1))
    else:
        def choose():
            return random.choices(range(len(fns)), weights=t.p)[0]
    return lambda x: _grouped(x, [choose() for _ in range(x.shape[0])], lambda k: fns[k])


def lower_random_order(t, lower: Lower) -> Optional[Batched]:
    if not _keeps_shape(t):
        return None  # (the rows' outputs are written back into the batch: ``_on_rows``)
    fns = _lower_all(t.transforms, lower)
    if fns is None:
        return None

    def order():
        if _is_v2(t):
            return tuple(int(k) for k in torch.randperm(len(fns)))
        o = list(range(len(fns)))
        random.shuffle(o)
        return tuple(o)

    def in_order(key):
        def run(y):
            for k in key:
                y = fns[k](y)
            return y
        return run
    return lambda x: _grouped(x, [order() for _ in range(x.shape[0])], in_order)
