"""Masks recorded like the image (``compiler.joint``), then moved in one gather.

While a sample is recorded, each uint8 ``tv_tensors.Mask`` of its target is a stand-in too: torchvision's
code draws and calls the mask's functionals as written, and they are recorded instead of run. The mask
is then made from the record in one step: every recorded crop, pad, flip and nearest-neighbour resize
maps output rows (and columns) to source rows (or to a fill), so the output is one gather of the source,
``source[..., rows][..., cols]``, with the fills written over it. torchvision instead resizes the whole
mask before a crop keeps a part of it (the segmentation reference: 37% of a worker's time per sample).

The row and column maps reproduce torchvision's kernels exactly: crops out of bounds fill with 0 as
``crop_image`` does, pads with their fill, and the resize's source index is torch's CPU nearest-neighbour
index (``floorf(dst * (float)in / out)``, clamped; ``dst`` for equal sizes, ``dst >> 1`` for doubling).
A functional the gather cannot express (affine, rotate, a pad that reflects, a non-integer fill) raises
``MaskUnrecordable`` and the sample is recorded again with its real masks; so does a mask that leaves
the transform other than through these functionals (``SanitizeBoundingBoxes`` indexing instance masks).
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch
from torchvision import tv_tensors
from torchvision.transforms.v2 import functional as F

from ..device import WIDEN, map_tensors

#: the functionals a mask stand-in records (anything else raises MaskUnrecordable)
MASK_OPS = ("crop", "pad", "horizontal_flip", "vertical_flip", "resize", "center_crop", "to_dtype")
SOURCE = "mask"  # the name of a mask stand-in's first record entry: {"source": the real mask}
#: (``WIDEN``, from device.py: a tensor held in uint8 that stands for a wider integer dtype, a mask made int64
#: by ToDtype, travels so and is made that dtype on the device, by ``widened`` or with its batch by
#: ``device._together``)


class MaskUnrecordable(Exception):
    """A mask's functionals cannot be gathered in one step: record the sample again with its real masks."""


def wanted(t) -> bool:
    """A target entry recorded as a stand-in: a non-empty uint8 Mask on the CPU with at least two dimensions
    (an image without annotations has masks of none: that sample keeps torchvision's kernels)."""
    return isinstance(t, tv_tensors.Mask) and t.dtype == torch.uint8 and t.device.type == "cpu" and t.ndim >= 2 \
        and t.numel() > 0


def _nearest(n_in: int, n_out: int) -> np.ndarray:
    """torch's CPU ``upsample_nearest`` source index of each of ``n_out`` outputs (UpSample.h ``nearest_idx``)."""
    dst = np.arange(n_out, dtype=np.int64)
    if n_out == n_in:
        return dst
    if n_out == 2 * n_in:
        return dst >> 1
    scale = np.float32(n_in) / np.float32(n_out)
    return np.minimum(np.floor(dst.astype(np.float32) * scale).astype(np.int64), n_in - 1)


class _Axis:
    """One axis's map: each output position's source index, or ``-1 - k`` for the k-th fill."""

    def __init__(self, n: int):
        self.map = np.arange(n, dtype=np.int64)

    def window(self, start: int, length: int, code: int) -> None:
        """``crop_image`` along this axis, to the letter: in bounds a slice; else the slice
        ``[max(start, 0):end]`` (Python's, so a negative end counts from the far side) padded with
        ``code`` by the amounts it computes."""
        n, end = len(self.map), start + length
        if start >= 0 and end <= n:
            self.map = self.map[start:end]
            return
        self.pad(max(min(end, 0) - start, 0), max(end - max(n, start), 0), code, self.map[max(start, 0):end])

    def pad(self, before: int, after: int, code: int, middle: Optional[np.ndarray] = None) -> None:
        middle = self.map if middle is None else middle
        self.map = np.concatenate([np.full(before, code), middle, np.full(after, code)]).astype(np.int64)


def _fill_value(fill) -> int:
    if fill is None:
        return 0
    if isinstance(fill, (tuple, list)) or not float(fill).is_integer() or not 0 <= fill <= 255:
        raise MaskUnrecordable(f"a mask padded with {fill!r}")
    return int(fill)


def _step(name: str, a: dict, h: int, w: int, rows: _Axis, cols: _Axis, code) -> None:
    """One recorded functional on the row and column maps of an ``h`` x ``w`` mask; ``code(v)``: a new
    fill of value ``v``."""
    if name == "crop":
        zero = code(0)
        rows.window(int(a["top"]), int(a["height"]), zero)
        cols.window(int(a["left"]), int(a["width"]), zero)
    elif name == "center_crop":
        ch, cw = F._geometry._center_crop_parse_output_size(a["output_size"])
        if ch > h or cw > w:  # center_crop_image pads first, with zeros
            left, top, right, bottom = F._geometry._center_crop_compute_padding(ch, cw, h, w)
            zero = code(0)
            rows.pad(top, bottom, zero)
            cols.pad(left, right, zero)
            h, w = rows.map.size, cols.map.size
        top, left = F._geometry._center_crop_compute_crop_anchor(ch, cw, h, w)
        zero = code(0)
        rows.window(top, ch, zero)
        cols.window(left, cw, zero)
    elif name == "pad":
        if a.get("padding_mode", "constant") != "constant":
            raise MaskUnrecordable(f"a mask padded in mode {a['padding_mode']!r}")
        left, right, top, bottom = F._geometry._parse_pad_padding(a["padding"])
        if min(left, right, top, bottom) < 0:
            raise MaskUnrecordable("a negative padding")
        fill = code(_fill_value(a.get("fill")))
        rows.pad(top, bottom, fill)
        cols.pad(left, right, fill)
    elif name == "horizontal_flip":
        cols.map = cols.map[::-1].copy()
    elif name == "vertical_flip":
        rows.map = rows.map[::-1].copy()
    elif name == "resize":
        nh, nw = F._geometry._compute_resized_output_size((h, w), size=a["size"], max_size=a.get("max_size"))
        rows.map = rows.map[_nearest(h, nh)]
        cols.map = cols.map[_nearest(w, nw)]
    else:
        raise MaskUnrecordable(name)


def realize(ops: list) -> torch.Tensor:
    """The mask a stand-in's record ``ops`` stands for: ``ops[0]`` names the real mask, the rest are
    (functional, its arguments, the size before) in order. A wider integer dtype (ToDtype's int64) is
    held in uint8 with ``WIDEN`` naming it."""
    source = ops[0][1]["source"]
    h, w = source.shape[-2:]
    if not h or not w:
        raise MaskUnrecordable("an empty mask")
    rows, cols = _Axis(h), _Axis(w)
    fills: list = []  # fill value of code -1 - k
    dtype = source.dtype

    def code(value) -> int:
        fills.append(value)
        return -len(fills)

    for name, a, (h, w) in ops[1:]:
        if (rows.map.size, cols.map.size) != (h, w):  # (the record and the maps disagree: never seen)
            raise MaskUnrecordable(f"{name} on a {h}x{w} mask mapped as {rows.map.size}x{cols.map.size}")
        if name == "to_dtype":
            dtype = a["dtype"]
        else:
            _step(name, a, h, w, rows, cols, code)
    src = source.as_subclass(torch.Tensor).numpy()
    # (the columns taken with np.take, whose output is C-ordered: ``[..., cols]``'s is not, and the pickler's copy
    # of it to send it took as long as the gather)
    out = np.take(src[..., np.clip(rows.map, 0, None), :], np.clip(cols.map, 0, None), axis=-1)
    for k, value in enumerate(fills):  # in the order the functionals made them: a later one is outermost
        out[..., rows.map == -1 - k, :] = value
        out[..., cols.map == -1 - k] = value
    mask = torch.from_numpy(out)
    if dtype.is_floating_point or dtype.is_complex or dtype in (torch.uint8, torch.bool):
        return mask.to(dtype)
    mask.__dict__[WIDEN] = dtype  # (its values are uint8's: made wider where it arrives, ``widened``)
    return mask


def widened(obj):
    """Tensors held narrow (``WIDEN``) as their own dtype again, with their type and other attributes."""
    def one(t: torch.Tensor) -> torch.Tensor:
        dtype = t.__dict__.get(WIDEN)
        if dtype is None:
            return t
        wide = t.as_subclass(torch.Tensor).to(dtype)
        if type(t) is not torch.Tensor:
            wide = wide.as_subclass(type(t))
        wide.__dict__.update({k: v for k, v in t.__dict__.items() if k != WIDEN})
        return wide

    return map_tensors(obj, one)


def made(ops: Optional[list]) -> bool:
    """Whether a record is a mask stand-in's."""
    return bool(ops) and ops[0][0] == SOURCE
