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

from . import joint_kernels
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


#: for each hue sextant i (0-5; 6 is 0 again: h * 6 may round up to 6), which channel torchvision's
#: ``_hsv_to_rgb`` gives v (the largest) and which the middle value (q in odd sextants, t in even ones)
_MAX_CHANNEL = [0.0, 1.0, 1.0, 2.0, 2.0, 0.0, 0.0]
_MID_CHANNEL = [1.0, 0.0, 2.0, 1.0, 0.0, 2.0, 1.0]
_TINY = 1e-30  # below any non-zero difference of two uint8 values over 255


def _hue(x, h):
    """``adjust_hue_image``: to [0, 1], to HSV, shift, back, to uint8 with ``* 255.999`` truncated.

    torchvision's float arithmetic step for step where it decides a value, and no more passes over the
    three channels than that needs: a hue shift keeps each pixel's largest and smallest value (its v and
    its p come back to the same uint8, checked over every RGB triple and tested), so only the middle
    value is computed per pixel, in one channel, and each output channel takes the largest, the middle or
    the smallest value by the sextant. ``torch.where(eqc, 1, d)`` is ``max(d, tiny)``: where the channels
    are equal, what it divides is 0 either way."""
    maxc8 = fn.reductions.max(x, axes=[2], keep_dims=True)
    minc8 = fn.reductions.min(x, axes=[2], keep_dims=True)
    maxc = maxc8 * (1.0 / 255.0)  # = the max of the scaled channels (rounding is monotonic)
    minc = minc8 * (1.0 / 255.0)
    crange = maxc - minc
    s = crange / dmath.max(maxc, _TINY)
    c = (maxc - x * (1.0 / 255.0)) / dmath.max(crange, _TINY)
    rc, gc, bc = c[:, :, 0:1], c[:, :, 1:2], c[:, :, 2:3]
    neq_r = rc != 0.0  # maxc != r (what rc divides is 0 exactly there)
    hr = (bc - gc) * (rc == 0.0)
    hg = (rc + 2.0 - bc) * ((gc == 0.0) & neq_r)
    hb = (gc + 4.0 - rc) * (neq_r & (gc != 0.0))
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
    odd = i - dmath.floor(i * 0.5) * 2.0
    mid8 = dmath.floor((q * odd + t * (1.0 - odd)) * (255.0 + 1.0 - 1e-3))
    sextant = fn.cast(i, dtype=types.UINT8)
    keys = list(range(7))
    top = fn.lookup_table(sextant, keys=keys, values=_MAX_CHANNEL, dtype=types.FLOAT)
    middle = fn.lookup_table(sextant, keys=keys, values=_MID_CHANNEL, dtype=types.FLOAT)
    # (a 1x1x3 tensor per sample: a constant node would have the whole batch's size inside a conditional branch)
    channel = fn.coord_transform(x[0:1, 0:1, :], M=[0.0] * 9, T=[0.0, 1.0, 2.0])
    return minc8 + (maxc8 - minc8) * (top == channel) + (mid8 - minc8) * (middle == channel)


def _only(applies, x, scalars: list, op):
    """``op(x, *scalars)`` on the samples where ``applies`` (CPU booleans) holds, ``x`` as it is on the
    others. Each colour step of RandomPhotometricDistort applies with p=0.5, and each is several to dozens
    of operators over a float image (the hue seventy-one, nine of them over all three channels): a sample
    that skips it is left out of them
    (DALI's conditional split and merge move samples, not pixels) instead of taking the step's identity."""
    on, off = fn._conditional.split(x, predicate=applies)
    args = [fn._conditional.split(s, predicate=applies)[0] for s in scalars]
    # (the arithmetic drops the layout, which the branches must agree on)
    return fn._conditional.merge(fn.reshape(op(on, *args), layout="HWC"), off, predicate=applies)


@do_not_convert
def lower(g, step, **_) -> None:
    program = step.args["program"]
    p = g.params  # CPU: argument inputs read it there
    dtype, scale, shift = affine_of(program.tail)
    if g.joint_after and g.device == "gpu" and (g.raw_output or not dtype.is_floating_point) and \
            joint_kernels.takes(program) and joint_kernels.ready():
        g.rows = p  # the graph decodes; the colour block, the window and the flips run after it
        return
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
        if k > 0 or program.first_window:
            # the stage's six numbers as integers in one cast of one slice of the row, then cut: each operator
            # here is a CPU operator per batch (element subscripts, stacks and casts were twelve a stage)
            q = fn.cast(p[off:off + STAGE_WIDTH], dtype=types.INT32)
            x = fn.slice(x, start=q[0:2], shape=q[2:4], axis_names="HW", out_of_bounds_policy="pad",
                         fill_values=fill)
            x = fn.flip(x, horizontal=q[4], vertical=q[5])
        off += STAGE_WIDTH
        if k < len(program.resizes):
            interp, antialias = program.resizes[k]
            # (height, width) in one subscript of the row: each subscript is an operator on the CPU per batch
            x = fn.resize(x, size=p[off:off + RESIZE_WIDTH], interp_type=getattr(types, interp), antialias=antialias)
            off += RESIZE_WIDTH
    if g.raw_output or not dtype.is_floating_point:
        g.img = fn.transpose(x, perm=[2, 0, 1])  # raw uint8 pixels (the hand-off maps them), CHW
    else:
        g.img = fn.crop_mirror_normalize(x, dtype=types.FLOAT, output_layout="CHW",
                                         mean=[-b / a for a, b in zip(scale, shift)], std=[1.0 / a for a in scale])
