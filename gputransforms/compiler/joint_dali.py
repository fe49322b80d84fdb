"""The ``joint`` step in DALI: the fixed structure of a ``joint.JointProgram``, each sample's numbers from
its row of parameters (the external source's second output). Colour ops follow torchvision's uint8
arithmetic (``adjust_*_image``: float products truncated to uint8 after each op, contrast about the
image's mean grey, hue through torchvision's HSV formulas); a sample that skips an op gets that op's
identity, which is exact."""
from __future__ import annotations

import nvidia.dali.fn as fn
import nvidia.dali.math as dmath
import nvidia.dali.types as types
from nvidia.dali.pipeline import do_not_convert

from .joint import COLOUR_WIDTH, RESIZE_WIDTH, STAGE_WIDTH, affine_of

_GREY = [0.2989, 0.587, 0.114]


def _u8(x):
    """torchvision's ``_blend`` on uint8: clamp to [0, 255], then truncate (``.to(uint8)``)."""
    return dmath.floor(dmath.clamp(x, 0.0, 255.0))


def _grey(x):
    """``_rgb_to_grayscale_image(preserve_dtype=False).floor_()`` of a uint8 image (HWC, as floats): HW1."""
    return dmath.floor(fn.coord_transform(x, M=_GREY))


def _contrast(x, c):
    mean = fn.reductions.mean(_grey(x))
    return _u8(x * c + mean * (1.0 - c))


def _saturation(x, s):
    return _u8(x * s + _grey(x) * (1.0 - s))


#: where each output channel reads torchvision's (v, q, p, t, ...) sequence for sector i: red at i, green at
#: i + 4, blue at i + 2 (mod 6), so one comparison per sector serves the three channels
_SECTOR = [0.0, 4.0, 2.0]


def _hue(x, h):
    """``adjust_hue_image``: to [0, 1], to HSV, shift, back, to uint8 with ``* 255.999`` truncated (one
    DALI operator per torchvision operation, the channels together where the formulas allow)."""
    img = x * (1.0 / 255.0)
    maxc = fn.reductions.max(img, axes=[2], keep_dims=True)
    minc = fn.reductions.min(img, axes=[2], keep_dims=True)
    eqc = maxc == minc
    crange = maxc - minc
    s = crange / (maxc + eqc * (1.0 - maxc))
    div = crange + eqc * (1.0 - crange)
    c = (maxc - img) / div
    rc, gc, bc = c[:, :, 0:1], c[:, :, 1:2], c[:, :, 2:3]
    neq_r = maxc != img[:, :, 0:1]
    eq_g = maxc == img[:, :, 1:2]
    hg = (rc + 2.0 - bc) * (eq_g & neq_r)
    hr = (bc - gc) * (neq_r == 0)
    hb = (gc + 4.0 - rc) * (neq_r & (eq_g == 0))
    hh = (hr + hg + hb) * (1.0 / 6.0) + 1.0
    hh = hh - dmath.floor(hh)  # fmod(., 1) of a positive number
    hh = hh + h
    hh = hh - dmath.floor(hh)  # remainder(., 1)
    h6 = hh * 6.0
    i = dmath.floor(h6)
    f = h6 - i
    sxf = s * f
    q = dmath.clamp((1.0 - sxf) * maxc, 0.0, 1.0)
    t = dmath.clamp((sxf + (1.0 - s)) * maxc, 0.0, 1.0)
    p = dmath.clamp((1.0 - s) * maxc, 0.0, 1.0)
    # (a 1x1x3 tensor per sample: a constant node would have the whole batch's size inside a conditional branch)
    j = i + fn.coord_transform(img[0:1, 0:1, :], M=[0.0] * 9, T=_SECTOR)
    j = j - (j >= 6.0) * 6.0
    j = j - (j >= 6.0) * 6.0  # (i itself may be 6: h6 rounds up to 6.0)
    out = maxc * ((j == 0.0) | (j == 5.0)) + q * (j == 1.0) + p * ((j == 2.0) | (j == 3.0)) + t * (j == 4.0)
    return dmath.floor(out * (255.0 + 1.0 - 1e-3))


def _only(applies, x, scalars: list, op):
    """``op(x, *scalars)`` on the samples where ``applies`` (CPU booleans) holds, ``x`` as it is on the
    others. Each colour step of RandomPhotometricDistort applies with p=0.5, and each is dozens of full
    passes over a float image (the hue about sixty): a sample that skips it is left out of them
    (DALI's conditional split and merge move samples, not pixels) instead of taking the step's identity."""
    on, off = fn._conditional.split(x, predicate=applies)
    args = [fn._conditional.split(s, predicate=applies)[0] for s in scalars]
    # (the arithmetic drops the layout, which the branches must agree on)
    return fn._conditional.merge(fn.reshape(op(on, *args), layout="HWC"), off, predicate=applies)


@do_not_convert
def lower(g, step, **_) -> None:
    program = step.args["program"]
    p = g.params  # CPU: argument inputs read it there
    pa = p.gpu() if g.device == "gpu" else p  # the arithmetic's scalars, beside the pixels
    x = g.img
    off = 0
    if program.colour:
        xf = fn.cast(x, dtype=types.FLOAT)
        # a factor of 1 (a hue flag of 0) is a step the sample skips, or its identity: exact either way
        xf = _only(p[0] != 1.0, xf, [pa[0]], lambda v, b: _u8(v * b))
        xf = _only(p[1] != 1.0, xf, [pa[1]], _contrast)
        xf = _only(p[2] != 1.0, xf, [pa[2]], _saturation)
        xf = _only(p[3] != 0.0, xf, [pa[4]], _hue)
        xf = _only(p[5] != 1.0, xf, [pa[5]], _contrast)
        xf = fn.coord_transform(xf, M=fn.reshape(p[6:15], shape=[3, 3]))
        x = fn.cast(xf, dtype=types.UINT8)
        off = COLOUR_WIDTH
    fill = [float(v) for v in program.fill]
    for k in range(len(program.resizes) + 1):
        start = fn.cast(fn.stack(p[off], p[off + 1]), dtype=types.INT32)
        shape = fn.cast(fn.stack(p[off + 2], p[off + 3]), dtype=types.INT32)
        x = fn.slice(x, start=start, shape=shape, axis_names="HW", out_of_bounds_policy="pad", fill_values=fill)
        x = fn.flip(x, horizontal=fn.cast(p[off + 4], dtype=types.INT32),
                    vertical=fn.cast(p[off + 5], dtype=types.INT32))
        off += STAGE_WIDTH
        if k < len(program.resizes):
            interp, antialias = program.resizes[k]
            x = fn.resize(x, resize_y=p[off], resize_x=p[off + 1], interp_type=getattr(types, interp),
                          antialias=antialias)
            off += RESIZE_WIDTH
    dtype, scale, shift = affine_of(program.tail)
    if g.raw_output or not dtype.is_floating_point:
        g.img = fn.transpose(x, perm=[2, 0, 1])  # raw uint8 pixels (the hand-off maps them), CHW
    else:
        g.img = fn.crop_mirror_normalize(x, dtype=types.FLOAT, output_layout="CHW",
                                         mean=[-b / a for a, b in zip(scale, shift)], std=[1.0 / a for a in scale])
