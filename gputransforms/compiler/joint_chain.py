"""A v2 ``Compose`` recorded in one pass (the registry's ``chain`` entries; ``Compose``'s ``forward`` entry).

A worker that records a detection sample spends most of its time on bookkeeping around a few numbers: each
step of the Compose is a module call, a pytree of the pair, a needs-transform list, a dispatch per leaf, a
tv_tensor wrapped around a four-column tensor after each box operator. On a host where the workers run
beside DALI, their CPU time is what the graph loses (docs/performance.md, stop 23). Here, where every step
of the Compose is a class with a ``chain`` entry and the pair is the common one (a stand-in image; a dict
of one float32 ``BoundingBoxes`` in XYXY or XYWH, plain tensors and plain values), the Compose runs as one
loop over a small state: the image's record, its size and type; the boxes as a NumPy array with their
format, canvas and clamping mode.

Each entry is its class's ``forward`` restated for that state: the class's ``make_params`` draws (its own,
or the registry's exact ``draw``: the same RNG calls, and its errors as it raises them; for RandomCrop,
ScaleJitter and RandomShortestSize, whose draws read only the image's size, the same draw on the size the pass
knows, ``joint_draws``, where an error leaves the pass for the class's own forward to raise it), the image
functional is recorded with the arguments its kernel binds (``joint_record.recorded_op``: the record the
step-by-step recording makes), and the boxes move by torchvision's box kernels written in NumPy: the same
float32 operations in the same order, so the same values. The output is what the Compose returns (a
stand-in carrying the record, the target dict in its key order). Anything else (another class, a
subclass, hooks on a step, masks or key points, integer, float64 or rotated boxes, a labels getter of the
user's, a padding mode torchvision refuses for boxes) leaves the pass, before it draws or after putting
torch's RNG state back, and the Compose's own forward runs. tests/test_detection.py compares records,
targets and the RNG state with torchvision's own forwards over random canvases and boxes, and checks
that the pass took the chains it should (on torchvision 0.29 and 0.26).
"""
from __future__ import annotations

import functools
import weakref
from typing import Any, Callable, Optional

import numpy as np
import PIL.Image
import torch
from torch.nn.modules import module as _nn_module
from torchvision import tv_tensors
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F
from torchvision.transforms.v2._utils import _find_labels_default_heuristic, _get_fill

from . import joint_draws, joint_record
from .joint_forward import valid_xyxy

_BBF = tv_tensors.BoundingBoxFormat
_FORMATS = (_BBF.XYXY, _BBF.XYWH)
_F32 = np.float32
#: label dtypes indexed through NumPy (the same values; any other through torch)
_NUMPY_INDEXED = (torch.int64, torch.int32, torch.int16, torch.uint8, torch.int8, torch.float32, torch.float64,
                  torch.bool)


#: the target's values that no step of the pass touches, besides plain tensors
_PLAIN = (int, float, str, bool, type(None))

#: whether Composes are recorded in one pass (off: step by step, for the tests that compare the two)
ENABLED = [True]


class _Off(Exception):
    """This sample leaves the one pass: the Compose's own forward runs, from the same RNG state."""


class _State:
    """One sample between the steps of the pass."""

    __slots__ = ("kind", "dtype", "h", "w", "ops", "boxes", "fmt", "canvas", "like", "plain", "target", "box_key")

    def __init__(self, kind, dtype, size, ops, target, box_key, like):
        self.kind, self.dtype, (self.h, self.w), self.ops = kind, dtype, size, ops
        self.target, self.box_key, self.like = target, box_key, like
        self.plain = False  # the boxes were made plain tensors (ToPureTensor): no step moves them any more
        if like is not None:
            self.boxes = like.as_subclass(torch.Tensor).numpy().copy()
            self.fmt, self.canvas = like.format, tuple(int(v) for v in like.canvas_size)
        else:
            self.boxes, self.fmt, self.canvas = None, None, None

    def record(self, functional, **kwargs) -> None:
        """The image functional ``functional`` called with ``kwargs``, as ``joint``'s recording kernel records it."""
        op, shape, dtype = joint_record.recorded_op(functional, self.kind, (3, self.h, self.w), self.dtype, kwargs)
        self.ops = self.ops + [op]
        self.h, self.w, self.dtype = int(shape[-2]), int(shape[-1]), dtype

    def moving_boxes(self) -> bool:
        """Whether a geometry step transforms the boxes (they are there and still ``BoundingBoxes``)."""
        return self.boxes is not None and not self.plain


# --- torchvision's box kernels in NumPy (float32, XYXY / XYWH; torchvision 0.26-0.29) --------------------

def _to_xyxy(b: np.ndarray, fmt) -> np.ndarray:
    if fmt == _BBF.XYWH:  # _xywh_to_xyxy
        b[:, 2:] += b[:, :2]
    return b


def _from_xyxy(b: np.ndarray, fmt) -> np.ndarray:
    if fmt == _BBF.XYWH:  # _xyxy_to_xywh
        b[:, 2:] -= b[:, :2]
    return b


def _clamp(b: np.ndarray, fmt, canvas: tuple, mode) -> np.ndarray:
    """``_clamp_bounding_boxes`` (soft and hard are one for boxes that are not rotated): x within [0, width],
    y within [0, height] (one clip against the four bounds: the same min(max(v, 0), bound) per value)."""
    if mode is None:
        return b.copy()
    return clamped(b, fmt, np.asarray([canvas[1], canvas[0], canvas[1], canvas[0]], dtype=_F32))


def clamped(b: np.ndarray, fmt, bounds: np.ndarray) -> np.ndarray:
    """``b`` clamped within [0, ``bounds``] (width, height, width, height as float32: one row, or one per box)."""
    if fmt == _BBF.XYXY:
        return np.clip(b, _F32(0), bounds)
    b = _to_xyxy(b.copy(), fmt)
    np.clip(b, _F32(0), bounds, out=b)
    return _from_xyxy(b, fmt)


def _pad(s: _State, padding, fill, padding_mode: str = "constant") -> None:
    """``F.pad`` on the pair: the image's record; the boxes as ``pad_bounding_boxes`` moves them (the shift
    as a float32 tensor added, then the clamp on the larger canvas)."""
    s.record(F.pad, padding=padding, fill=fill, padding_mode=padding_mode)
    if s.moving_boxes():
        left, right, top, bottom = F._geometry._parse_pad_padding(padding)
        shift = [left, top, left, top] if s.fmt == _BBF.XYXY else [left, top, 0, 0]
        canvas = (s.canvas[0] + top + bottom, s.canvas[1] + left + right)
        s.boxes, s.canvas = _clamp(s.boxes + np.asarray(shift, dtype=_F32), s.fmt, canvas, _mode(s.like)), canvas


def _crop(s: _State, top: int, left: int, height: int, width: int) -> None:
    """``F.crop`` on the pair: the image's record; the boxes as ``crop_bounding_boxes`` moves them (the shift
    as a float32 tensor subtracted, then the clamp on the window)."""
    s.record(F.crop, top=top, left=left, height=height, width=width)
    if s.moving_boxes():
        shift = [left, top, left, top] if s.fmt == _BBF.XYXY else [left, top, 0, 0]
        canvas = (int(height), int(width))
        s.boxes, s.canvas = _clamp(s.boxes - np.asarray(shift, dtype=_F32), s.fmt, canvas, _mode(s.like)), canvas


def _mode(like) -> Any:
    return getattr(like, "clamping_mode", "soft")


def _resize_boxes(s: _State, size) -> None:
    """``resize_bounding_boxes``: the ratios as a float32 tensor of Python's quotients, one multiplication."""
    old_h, old_w = s.canvas
    new_h, new_w = F._geometry._compute_resized_output_size(s.canvas, size=size, max_size=None)
    if (new_h, new_w) != (old_h, old_w):
        ratios = np.asarray([new_w / old_w, new_h / old_h, new_w / old_w, new_h / old_h], dtype=_F32)
        s.boxes = s.boxes * ratios
    s.canvas = (int(new_h), int(new_w))


def _flip_boxes(s: _State, horizontal: bool) -> None:
    """``horizontal_flip_bounding_boxes`` / ``vertical_flip_bounding_boxes``."""
    s.boxes = flipped(s.boxes, s.fmt, _F32(s.canvas[1] if horizontal else s.canvas[0]), horizontal)


def flipped(boxes: np.ndarray, fmt, extent, horizontal: bool) -> np.ndarray:
    """``boxes`` flipped within ``extent`` (the canvas's width or height as float32: one, or one per box)."""
    b = boxes.copy()
    lo, hi = (0, 2) if horizontal else (1, 3)
    if fmt == _BBF.XYXY:
        b[:, lo], b[:, hi] = -(boxes[:, hi] - extent), -(boxes[:, lo] - extent)
    else:  # XYWH
        b[:, lo] = -((boxes[:, lo] + boxes[:, hi]) - extent)
    return b


# --- the steps: each class's forward on the state ------------------------------------------------------------

def _to_image(t, s: _State) -> None:
    if s.kind == "pil":
        s.kind, s.dtype = "image", torch.uint8
    elif s.kind == "tensor":
        s.kind = "image"


def _pil_to_tensor(t, s: _State) -> None:
    if s.kind == "pil":
        s.kind, s.dtype = "tensor", torch.uint8


def _to_dtype(t, s: _State) -> None:
    if not isinstance(t.dtype, torch.dtype):
        raise _Off  # per-type dtypes
    if s.kind != "pil":  # (a PIL image passes through, as the boxes and the labels do)
        s.record(F.to_dtype, dtype=t.dtype, scale=t.scale)


def _to_pure_tensor(t, s: _State) -> None:
    if s.kind == "image":
        s.kind = "tensor"
    if s.boxes is not None:
        s.plain = True


def _convert_format(t, s: _State) -> None:
    if not s.moving_boxes():
        return
    new = _BBF[t.format.upper()] if isinstance(t.format, str) else t.format
    if new not in _FORMATS:
        raise _Off
    if new != s.fmt:
        s.boxes = _from_xyxy(_to_xyxy(s.boxes.copy(), s.fmt), new)
        s.fmt = new


def _params(t, s: _State) -> dict:
    """The class's own ``make_params`` on the one input whose size it queries (the boxes' canvas is the image's)."""
    return t.make_params([_probe(s)])


def _probe(s: _State):
    """A plain tensor of the image's size, for ``query_size`` (the classes with a draw here ask only that)."""
    return _PROBE.expand(3, s.h, s.w)


_PROBE = torch.empty((), dtype=torch.uint8)


def _resize_drawn(t, s: _State) -> None:
    """ScaleJitter, RandomShortestSize: the size their draw gives, a resize with their interpolation."""
    size = _SIZE_DRAWS[type(t)](t, s.h, s.w)
    s.record(F.resize, size=size, interpolation=t.interpolation, antialias=t.antialias)
    if s.moving_boxes():
        _resize_boxes(s, size)


def _random_crop(t, s: _State) -> None:
    if t.padding_mode != "constant" and s.moving_boxes():
        raise _Off  # torchvision's ValueError for boxes, as its own forward raises it
    p = joint_draws.random_crop_params(t, s.h, s.w)
    if p is None:
        raise _Off  # its ValueError (a crop larger than the padded image), as its own forward raises it
    if p["needs_pad"]:
        _pad(s, p["padding"], _get_fill(t._fill, joint_record._KIND_CLASS[s.kind]), t.padding_mode)
    if p["needs_crop"]:
        _crop(s, p["top"], p["left"], p["height"], p["width"])


def _flip(horizontal: bool) -> Callable:
    functional = F.horizontal_flip if horizontal else F.vertical_flip

    def step(t, s: _State) -> None:
        if torch.rand(1) >= t.p:
            return
        s.record(functional)
        if s.moving_boxes():
            _flip_boxes(s, horizontal)

    return step


def _photometric_distort(t, s: _State) -> None:
    """RandomPhotometricDistort: colour functionals on the image only (the boxes pass through them)."""
    p = _params(t, s)
    if p["brightness_factor"] is not None:
        s.record(F.adjust_brightness, brightness_factor=p["brightness_factor"])
    if p["contrast_factor"] is not None and p["contrast_before"]:
        s.record(F.adjust_contrast, contrast_factor=p["contrast_factor"])
    if p["saturation_factor"] is not None:
        s.record(F.adjust_saturation, saturation_factor=p["saturation_factor"])
    if p["hue_factor"] is not None:
        s.record(F.adjust_hue, hue_factor=p["hue_factor"])
    if p["contrast_factor"] is not None and not p["contrast_before"]:
        s.record(F.adjust_contrast, contrast_factor=p["contrast_factor"])
    if p["channel_permutation"] is not None:
        s.record(F.permute_channels, permutation=p["channel_permutation"])


def _zoom_out(t, s: _State) -> None:
    """RandomZoomOut (a random-apply transform): its coin, then a pad with the fill for the image's type."""
    if torch.rand(1) >= t.p:
        return
    _pad(s, _params(t, s)["padding"], _get_fill(t._fill, joint_record._KIND_CLASS[s.kind]))


def _iou_crop(t, s: _State) -> None:
    """RandomIoUCrop: its draw on the boxes (the registry's exact faster one while recorded), the crop, and the
    boxes outside the crop's area made 0 (for SanitizeBoundingBoxes after it)."""
    if not s.moving_boxes():
        raise _Off  # its TypeError (it needs boxes), as its own forward raises it
    boxes = tv_tensors.wrap(torch.from_numpy(s.boxes), like=s.like, format=s.fmt, canvas_size=s.canvas)
    p = t.make_params([_probe(s), boxes])
    if len(p) < 1:
        return
    _crop(s, p["top"], p["left"], p["height"], p["width"])
    s.boxes[~p["is_within_crop_area"].numpy()] = 0


def _sanitize(t, s: _State) -> None:
    if not s.moving_boxes() or s.fmt != _BBF.XYXY or t._labels_getter is not _find_labels_default_heuristic:
        raise _Off
    key = _labels_key(tuple(s.target))  # (the default getter's choice depends on the keys alone)
    if key is None:
        raise _Off  # its ValueError (no label-like key), as it words it
    label = s.target[key]
    if type(label) is not torch.Tensor or sum(v is label for v in s.target.values()) != 1:
        raise _Off  # its ValueError for labels that are not a tensor; (the one tensor under two keys: its own forward)
    n = len(s.boxes)
    if label.ndim == 0 or label.shape[0] != n:
        raise _Off  # its ValueError, as it words it
    valid = valid_xyxy(s.boxes, s.canvas, t.min_size, t.min_area)
    s.boxes = s.boxes[valid]
    s.target = dict(s.target)
    # (a plain CPU tensor indexed by a mask: a new contiguous one, as torch's indexing gives)
    s.target[key] = torch.from_numpy(label.numpy()[valid]) if label.dtype in _NUMPY_INDEXED else \
        label[torch.from_numpy(valid)]


@functools.lru_cache(maxsize=64)
def _labels_key(keys: tuple):
    """The key ``_find_labels_default_heuristic`` takes the labels from in a dict with ``keys`` (strings): the
    first whose lower case is "labels", else the first holding "label"; None where it finds none (it raises)."""
    if not all(type(k) is str for k in keys):
        return None
    return next((k for k in keys if k.lower() == "labels"), None) or next((k for k in keys if "label" in k.lower()), None)


_SIZE_DRAWS = {v2.ScaleJitter: joint_draws.scale_jitter_size, v2.RandomShortestSize: joint_draws.random_shortest_size}


#: the pass's steps, by exact class (the registry's ``chain`` entries)
def steps() -> dict:
    return {v2.ToImage: _to_image, v2.PILToTensor: _pil_to_tensor, v2.ToDtype: _to_dtype,
            v2.ToPureTensor: _to_pure_tensor, v2.ConvertBoundingBoxFormat: _convert_format,
            v2.ScaleJitter: _resize_drawn, v2.RandomShortestSize: _resize_drawn, v2.RandomCrop: _random_crop,
            v2.RandomHorizontalFlip: _flip(True), v2.RandomVerticalFlip: _flip(False),
            v2.RandomPhotometricDistort: _photometric_distort, v2.RandomZoomOut: _zoom_out, v2.RandomIoUCrop: _iou_crop,
            v2.SanitizeBoundingBoxes: _sanitize}


_OWN = ("forward", "transform", "make_params", "check_inputs", "_needs_transform_list", "_call_kernel", "__call__")


def _plan(compose, chain_of: Callable) -> Optional[list]:
    """(transform, its step) for every transform of ``compose`` (nested v2 Composes flattened), or None where
    one has no step, has hooks, or has its own methods on the instance. Kept per Compose while the modules
    it holds (nested ones included) are the same; their hooks are looked at on every call."""
    if any(getattr(_nn_module, name, None) for name in ("_global_forward_hooks", "_global_forward_pre_hooks")):
        return None
    modules = list(_modules(compose))
    ids = tuple(map(id, modules))
    kept = _PLANS.get(compose)
    if kept is None or kept[0] != ids:
        kept = (ids, plan_of(compose, chain_of))
        _PLANS[compose] = kept
    if kept[1] is None or any(t._forward_hooks or t._forward_pre_hooks for t in modules):
        return None
    return kept[1]


_PLANS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _modules(compose):
    """The transforms of ``compose``, each nested v2 Compose followed by its own."""
    for t in compose.transforms:
        yield t
        if type(t) is v2.Compose:
            yield from _modules(t)


def plan_of(compose, chain_of: Callable) -> Optional[list]:
    """``_plan`` without the keeping (explain() asks it)."""
    if any(not isinstance(t, torch.nn.Module) or t._forward_hooks or t._forward_pre_hooks or
           any(k in t.__dict__ for k in _OWN) for t in _modules(compose)):
        return None  # (a function, or a module with hooks or methods of its own)
    out = [(t, chain_of(type(t))) for t in _modules(compose) if type(t) is not v2.Compose]
    return out if all(step is not None for _, step in out) else None


def _boxes_of(target: dict):
    """The target's one BoundingBoxes (its key and itself), where every leaf is one the pass carries; else _Off.
    By exact types (a container is none of them): one float32 XYXY / XYWH BoundingBoxes, plain CPU tensors,
    plain values."""
    found = None
    for k, v in target.items():
        kind = type(v)
        if kind is tv_tensors.BoundingBoxes:
            if found is not None:
                raise _Off
            plain = v.as_subclass(torch.Tensor)
            if plain.ndim != 2 or plain.shape[-1] != 4 or plain.dtype != torch.float32 or \
                    plain.device.type != "cpu" or plain.requires_grad or v.format not in _FORMATS or \
                    _mode(v) not in ("soft", "hard", None):
                raise _Off
            found = (k, v)
        elif kind is torch.Tensor:
            if v.device.type != "cpu" or v.requires_grad:
                raise _Off  # (masks, key points and other tv_tensors are not of this exact type either)
        elif kind not in _PLAIN:
            raise _Off  # a container, an array or an image, which ToImage or a geometry step would transform
    return found if found is not None else (None, None)


def compose(original: Callable, chain_of: Callable) -> Callable:
    """``Compose.forward`` while recorded: the one pass where it applies (``chain_of(cls)``: a class's step)."""

    def forward(self, *inputs: Any) -> Any:
        rec = getattr(joint_record._LOCAL, "record", None)
        if rec is None or not ENABLED[0] or len(inputs) != 2 or type(inputs[1]) is not dict:
            return original(self, *inputs)
        image, target = inputs
        ops = rec.ops.get(joint_record._key(image))
        plan = _plan(self, chain_of) if ops is not None else None
        if plan is None:
            return original(self, *inputs)
        kind = "pil" if isinstance(image, PIL.Image.Image) else \
            "image" if type(image) is tv_tensors.Image else "tensor" if type(image) is torch.Tensor else None
        try:
            if kind is None or torch.get_default_dtype() != torch.float32:  # (the box kernels' ratios)
                raise _Off
            box_key, boxes = _boxes_of(target)
            size = joint_record._shape(image)[-2:]
            if boxes is not None and tuple(boxes.canvas_size) != tuple(size):
                raise _Off  # query_size's error, as torchvision raises it
        except _Off:
            return original(self, *inputs)
        state = torch.get_rng_state()
        s = _State(kind, torch.uint8 if kind == "pil" else image.dtype, tuple(size), ops, target, box_key, boxes)
        try:
            for t, step in plan:
                step(t, s)
        except _Off:
            torch.set_rng_state(state)
            return original(self, *inputs)
        return _output(rec, s)

    forward.__wrapped__ = original
    return forward


def _output(rec, s: _State) -> tuple:
    like = {"pil": PIL.Image.Image, "image": _IMAGE_LIKE, "tensor": _TENSOR_LIKE}[s.kind]
    image = rec.stand_in(like() if s.kind == "pil" else like, (3, s.h, s.w), s.dtype, s.ops)
    target = dict(s.target)
    if s.box_key is not None:
        b = torch.from_numpy(np.ascontiguousarray(s.boxes, dtype=_F32))
        target[s.box_key] = b if s.plain else tv_tensors.wrap(b, like=s.like, format=s.fmt, canvas_size=s.canvas)
    return image, target


_IMAGE_LIKE = tv_tensors.Image(torch.empty(1, 1))
_TENSOR_LIKE = torch.empty(0)
