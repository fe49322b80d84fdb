"""Exact, faster forms of torchvision's parameter draws, for joint transforms while they are recorded
(``compiler.joint``; the registry's ``draw`` entries).

A draw here returns what the class's own ``make_params`` returns for the same inputs and the same state of
torch's RNG, and leaves that state where ``make_params`` leaves it: the values come from the same
generator in the same order, and the arithmetic on them is done in the same float precision and
operation order. Only the bookkeeping is cheaper (NumPy over all of an option's trials at once instead of
a dozen torch operators per trial: 12x faster over random boxes). tests/test_detection.py checks it
against torchvision's own over a thousand random canvases and box sets.

One difference in a corner: torch's RNG state is saved and put back around each option, so a draw from
another thread at that moment would be undone (torchvision's loop would interleave it instead; with
either, such a program's draws depend on thread timing). Where the inputs are not the common case
(boxes with batch dimensions, integer boxes, another default dtype) the class's own method runs.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import numpy as np
import torch
from torchvision import tv_tensors
from torchvision.transforms.v2 import functional as F
from torchvision.transforms.v2._utils import get_bounding_boxes, query_size


def random_iou_crop(original: Callable) -> Callable:
    """``RandomIoUCrop.make_params`` (torchvision 0.26-0.29).

    torchvision draws an option with ``torch.randint``, then per trial ``torch.rand(2)`` for the crop's
    size and, where its aspect ratio passes, ``torch.rand(2)`` for its place; about twenty torch operators
    per trial test it against the boxes. Here, per option, one ``torch.rand`` draws what the option's trials
    could consume at most (consecutive ``torch.rand`` calls on the CPU give one stream of values: a call
    of 2n values gives what n calls of 2 do), every trial is tested at once with NumPy in torchvision's
    float precision and operation order, and torch's RNG is then put back and advanced by exactly what
    torchvision's trials up to the accepted one consumed."""

    def make_params(self, flat_inputs: list[Any]) -> dict[str, Any]:
        bboxes = get_bounding_boxes(flat_inputs)
        if bboxes.ndim != 2 or bboxes.dtype not in (torch.float32, torch.float64) or \
                bboxes.device.type != "cpu" or torch.get_default_dtype() != torch.float32:
            return original(self, flat_inputs)
        size = query_size(flat_inputs)
        boxes = _Boxes(F.convert_bounding_box_format(bboxes.as_subclass(torch.Tensor), bboxes.format,
                                                     tv_tensors.BoundingBoxFormat.XYXY).numpy())
        start = torch.get_rng_state()
        while True:
            idx = int(torch.randint(low=0, high=len(self.options), size=(1,)))
            min_jaccard_overlap = self.options[idx]
            if min_jaccard_overlap >= 1.0:
                return dict()
            if self.trials <= 0:
                continue
            state = torch.get_rng_state()
            found = _option(self, size, boxes, min_jaccard_overlap, torch.rand(4 * self.trials).numpy())
            torch.set_rng_state(state)
            if found is None:  # a zero crop height: torchvision's own draws from the call's start (it raises
                torch.set_rng_state(start)  # ZeroDivisionError, or accepts a crop before that trial)
                return original(self, flat_inputs)
            consumed, crop = found
            torch.rand(consumed)
            if crop is not None:
                top, left, height, width = crop
                within = boxes.within(left, top, left + width, top + height)
                return dict(top=top, left=left, height=height, width=width,
                            is_within_crop_area=torch.from_numpy(within))

    make_params.__wrapped__ = original
    return make_params


def _option(t, size: tuple, boxes: "_Boxes", min_jaccard_overlap: float, u: np.ndarray) -> Optional[tuple]:
    """One option's trials on the values ``u`` (what its trials could draw): (how many of the values
    torchvision's trials consume, the accepted crop (top, left, height, width) or None); None where a
    crop's height is 0."""
    orig_h, orig_w = size
    # at every position, the trial that would start there: its size, and whether its aspect passes
    scale = np.float32(t.min_scale) + np.float32(t.max_scale - t.min_scale) * u
    new_w = (np.float32(orig_w) * scale).astype(np.int64)
    new_h = np.empty_like(new_w)
    new_h[:-1] = (np.float32(orig_h) * scale[1:]).astype(np.int64)
    new_h[-1] = 1
    if not new_h[:-1:2].all():
        return None
    with np.errstate(divide="ignore", invalid="ignore"):  # (at odd positions, where no trial starts)
        aspect = new_w / new_h  # float64, as Python's int / int
    passes = ((t.min_aspect_ratio <= aspect) & (aspect <= t.max_aspect_ratio)).tolist()
    starts, pos = [], 0
    for _ in range(t.trials):  # the values consumed: 2 per trial, 4 where its aspect passes
        if passes[pos]:
            starts.append(pos)
            pos += 4
        else:
            pos += 2
    if not starts:
        return pos, None
    at = np.asarray(starts)
    cw, ch = new_w[at], new_h[at]
    left = ((orig_w - cw).astype(np.float32) * u[at + 2]).astype(np.int64)
    top = ((orig_h - ch).astype(np.float32) * u[at + 3]).astype(np.int64)
    k = boxes.first_accepted(left, top, left + cw, top + ch, min_jaccard_overlap)
    if k is None:
        return pos, None
    return int(at[k]) + 4, (int(top[k]), int(left[k]), int(ch[k]), int(cw[k]))


class _Boxes:
    """XYXY boxes, tested against many crops at once in torchvision's arithmetic (the boxes' dtype)."""

    def __init__(self, xyxy: np.ndarray):
        self.xyxy, self.real = xyxy, xyxy.dtype.type
        half = self.real(0.5)
        self.x1, self.y1, self.x2, self.y2 = (np.ascontiguousarray(xyxy[:, k]) for k in range(4))
        self.cx = half * (self.x1 + self.x2)
        self.cy = half * (self.y1 + self.y2)
        self.area = (self.x2 - self.x1) * (self.y2 - self.y1)

    def within(self, left, top, right, bottom) -> np.ndarray:
        """Boxes whose centres are inside the crop (scalars): (boxes,)."""
        real = self.real
        return (real(left) < self.cx) & (self.cx < real(right)) & (real(top) < self.cy) & (self.cy < real(bottom))

    def first_accepted(self, left, top, right, bottom, min_jaccard_overlap):
        """The first crop (of arrays of crops) that holds a box centre and whose best IoU with those boxes
        is not below ``min_jaccard_overlap`` (torchvision's ``ious.max() < min_jaccard_overlap``), or None."""
        if not len(self.xyxy):
            return None
        real = self.real
        l, t, r, b = (v.astype(real)[:, None] for v in (left, top, right, bottom))
        within = (l < self.cx) & (self.cx < r) & (t < self.cy) & (self.cy < b)
        holds = within.any(axis=1)
        if not holds.any():
            return None
        area2 = (r - l) * (b - t)
        w = np.minimum(self.x2, r) - np.maximum(self.x1, l)
        h = np.minimum(self.y2, b) - np.maximum(self.y1, t)
        zero = real(0)
        inter = np.maximum(w, zero) * np.maximum(h, zero)
        with np.errstate(divide="ignore", invalid="ignore"):
            iou = inter / (self.area + area2 - inter)
        best = np.where(within, iou, real(-np.inf)).max(axis=1)
        hits = np.flatnonzero(holds & ~(best < real(min_jaccard_overlap)))
        return int(hits[0]) if len(hits) else None


def scale_jitter(original: Callable) -> Callable:
    """``ScaleJitter.make_params`` (torchvision 0.26-0.29): its one ``torch.rand(1)`` and the same float32
    arithmetic as NumPy scalars (a float32 tensor and a Python number multiply and add in float32), without
    the four tensor operators around one number (20 us of the 60 a recorded ScaleJitter took)."""

    def make_params(self, flat_inputs: list[Any]) -> dict[str, Any]:
        if torch.get_default_dtype() != torch.float32:
            return original(self, flat_inputs)
        return dict(size=scale_jitter_size(self, *query_size(flat_inputs)))

    make_params.__wrapped__ = original
    return make_params


# --- draws on a known size (``joint_chain``: the one pass knows the image's size; torchvision's ``query_size``
# over the inputs, which those classes' ``make_params`` begin with, was a third of each step's time there) ---

def scale_jitter_size(t, orig_height: int, orig_width: int) -> tuple:
    """``ScaleJitter.make_params(...)["size"]`` for an image of that size (float32 default dtype)."""
    f32 = np.float32
    lo, hi = t.scale_range
    scale = f32(lo) + f32(torch.rand(1).item()) * f32(hi - lo)
    r = f32(min(t.target_size[1] / orig_height, t.target_size[0] / orig_width)) * scale
    return int(f32(orig_height) * r), int(f32(orig_width) * r)


def random_shortest_size(t, orig_height: int, orig_width: int) -> tuple:
    """``RandomShortestSize.make_params(...)["size"]`` (torchvision 0.26-0.29: Python's arithmetic)."""
    min_size = t.min_size[int(torch.randint(len(t.min_size), ()))]
    r = min_size / min(orig_height, orig_width)
    if t.max_size is not None:
        r = min(r, t.max_size / max(orig_height, orig_width))
    return int(orig_height * r), int(orig_width * r)


def random_crop_params(t, padded_height: int, padded_width: int) -> Optional[dict]:
    """``RandomCrop.make_params`` (torchvision 0.26-0.29) for an image of that size; None where it raises
    (the caller lets torchvision's own forward raise it, before any draw)."""
    if t.padding is not None:
        pad_left, pad_right, pad_top, pad_bottom = t.padding
        padded_height += pad_top + pad_bottom
        padded_width += pad_left + pad_right
    else:
        pad_left = pad_right = pad_top = pad_bottom = 0
    cropped_height, cropped_width = t.size
    if t.pad_if_needed:
        if padded_height < cropped_height:
            diff = cropped_height - padded_height
            pad_top += diff
            pad_bottom += diff
            padded_height += 2 * diff
        if padded_width < cropped_width:
            diff = cropped_width - padded_width
            pad_left += diff
            pad_right += diff
            padded_width += 2 * diff
    if padded_height < cropped_height or padded_width < cropped_width:
        return None
    padding = [pad_left, pad_top, pad_right, pad_bottom]
    needs_vert_crop, top = (True, int(torch.randint(0, padded_height - cropped_height + 1, size=()))) \
        if padded_height > cropped_height else (False, 0)
    needs_horz_crop, left = (True, int(torch.randint(0, padded_width - cropped_width + 1, size=()))) \
        if padded_width > cropped_width else (False, 0)
    return dict(needs_crop=needs_vert_crop or needs_horz_crop, top=top, left=left, height=cropped_height,
                width=cropped_width, needs_pad=any(padding), padding=padding)
