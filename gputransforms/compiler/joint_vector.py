"""A worker's chunk of detection samples recorded at once (the registry's ``vector`` entries).

In torch's worker processes a recorded detection sample costs a worker CPU time, and on a host where the
workers run beside DALI that time is what the graph loses (docs/performance.md): the one pass
(``joint_chain``) still spends most of a sample's time on Python around a few numbers. A worker reads its
samples in chunks of up to a batch (``backends/feed.py``), each sample with a seed of its own; where the
joint transform is a v2 ``Compose`` of classes with a ``vector`` entry (the resizes, crops and flips of the
detection references' ``hflip``, ``multiscale`` and ``lsj`` presets, and their tails) and every target is the
common one (one float32 XYXY or XYWH ``BoundingBoxes``, plain tensors and values), the chunk is recorded here:

- each sample's uniforms come from its own seed (``uniforms``: torch's CPU generator, seeded as the per-sample
  path seeds it), so a sample's draws do not depend on the chunk it travels in; each class turns them into its
  parameters with torchvision's distribution (``ScaleJitter``'s scale uniform in its range, ``RandomCrop``'s
  offsets uniform over the positions, the flip's coin with its ``p``, ``RandomShortestSize``'s size uniform over
  its list), not torchvision's stream of RNG calls;
- the sizes, paddings and offsets are computed for the whole chunk at once, in the same arithmetic as
  ``joint_draws`` (float32 where torchvision's draw is float32, Python's float64 where it is Python's);
- the boxes of all the samples move as one NumPy array by torchvision's box kernels (``joint_chain``'s, with the
  canvas of each box's sample): the same float32 operations in the same order, so the same values;
- each sample's record is the one the one pass makes for those parameters (``joint_record.recorded_op``).

A sample whose target or parameters the chunk does not carry (masks, another box type, a crop torchvision
raises for, a labels key missing) is left out (``None``): the caller records it one by one from its seed,
where torchvision's own error, if any, is raised. With no workers (no seeds) nothing here runs, and the samples
draw from the process's RNG as torch's DataLoader's do. tests/test_joint_vector.py checks each chunk's records
and targets against torchvision's forward run with the chunk's parameters, and the parameters' distributions
against torchvision's own draws.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import numpy as np
import torch
from torch.nn.modules import module as _nn_module
from torchvision import tv_tensors
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F
from torchvision.transforms.v2._utils import _find_labels_default_heuristic, _get_fill

from . import joint_chain, joint_masks, joint_record

_BBF = tv_tensors.BoundingBoxFormat
_F32 = np.float32
_F64 = np.float64

#: whether chunks are recorded at once (off: one by one, for the tests that compare the two)
ENABLED = [True]


@dataclasses.dataclass(frozen=True)
class Vector:
    """A class's step over a chunk: ``step(t, chunk, u)`` with ``u`` its (n, ``draws``) uniforms in [0, 1)."""
    step: Callable
    draws: int = 0


class _Chunk:
    """The samples of a chunk between the steps: per sample its image's size, record, target and whether it
    left; all boxes as one float32 array in sample order (``counts`` rows each) with each sample's canvas."""

    def __init__(self, kind: str, sizes: np.ndarray, targets: list, box_key, first, boxes: list):
        n = len(targets)
        self.kind, self.dtype = kind, torch.uint8
        self.h, self.w = sizes[:, 0].copy(), sizes[:, 1].copy()
        self.ops: list = [[] for _ in range(n)]
        self.targets, self.box_key = list(targets), box_key
        self.off = np.zeros(n, dtype=bool)
        self.fmt = first.format
        self.mode = getattr(first, "clamping_mode", "soft")
        self.plain = False
        self.counts = np.asarray([b.as_subclass(torch.Tensor).shape[0] for b in boxes], dtype=np.int64)
        self.boxes = np.concatenate([b.as_subclass(torch.Tensor).numpy() for b in boxes]).astype(_F32, copy=True) \
            if n else np.zeros((0, 4), _F32)
        self.owner = np.repeat(np.arange(n), self.counts)
        self.ch, self.cw = self.h.copy(), self.w.copy()  # each sample's boxes' canvas
        self.params: Optional[list] = None  # each sample's parameters per step, where asked (the tests)
        #: a chunk of segmentation samples (each target one uint8 Mask): each mask's record, as ``joint_masks``
        #: makes it in one gather (its source first, then each functional with its arguments and the size before)
        self.masks: Optional[list] = None
        self.mask_dtype = torch.uint8

    def record(self, functional, samples, kwargs_of: Callable, varying: Callable, after: Callable) -> None:
        """``functional`` recorded on each of ``samples`` (indices), with ``kwargs_of(j)``: the first sample's
        record bound as the recording binds it (defaults, PIL's own arguments), the others its arguments with
        what varies between samples (``varying(j)``: a size, a padding, an offset, which binding leaves as they
        are), each leaving its sample at the size ``after(j)``."""
        first = None
        for j in samples:
            h, w = int(self.h[j]), int(self.w[j])
            if first is None:
                first, shape, self.dtype = joint_record.recorded_op(functional, self.kind, (3, h, w), self.dtype,
                                                                    kwargs_of(j))
                op = first
                self.h[j], self.w[j] = int(shape[-2]), int(shape[-1])
            else:
                a = dict(first[1])
                a.update(varying(j))
                op = (first[0], a, (h, w))
                self.h[j], self.w[j] = after(j)
            self.ops[j].append(op)

    def moving_boxes(self) -> bool:
        return not self.plain and self.masks is None

    def mask_op(self, samples, name: str, args_of: Callable) -> None:
        """``name`` with ``args_of(j)`` on the mask of each of ``samples`` (a chunk of masks), at its size before
        (call before the images' step moves the sizes)."""
        if self.masks is None:
            return
        for j in samples:
            self.masks[j].append((name, args_of(j), (int(self.h[j]), int(self.w[j]))))

    def size_of(self, j: int) -> tuple:
        return int(self.h[j]), int(self.w[j])

    def keep(self, j: int, **params) -> None:
        """Sample ``j``'s parameters of this step (where asked: ``params``)."""
        self.params[j].append(params)

    def live(self) -> np.ndarray:
        return np.flatnonzero(~self.off)

    def clamp(self) -> None:
        """``_clamp_bounding_boxes`` of every box on its sample's canvas (``joint_chain._clamp``)."""
        if self.mode is None:
            return
        bounds = np.stack([self.cw, self.ch, self.cw, self.ch], axis=1).astype(_F32)[self.owner]
        self.boxes = joint_chain.clamped(self.boxes, self.fmt, bounds)

    def shift(self, dx: np.ndarray, dy: np.ndarray, sign: int) -> None:
        """The boxes moved by each sample's (dx, dy) as torchvision's pad (+) and crop (-) kernels move them."""
        zero = np.zeros_like(dx)
        per = np.stack([dx, dy, dx, dy] if self.fmt == _BBF.XYXY else [dx, dy, zero, zero], axis=1).astype(_F32)
        per = per[self.owner]
        self.boxes = self.boxes + per if sign > 0 else self.boxes - per


_NO_BOXES = torch.zeros(0, 4)  # (a sample the chunk does not carry: no rows)


def _NOTHING(j: int) -> dict:
    return {}


class _Off(Exception):
    """The whole chunk leaves: its samples are recorded one by one."""


# --- the steps --------------------------------------------------------------------------------------------

def _to_image(t, c: _Chunk, u) -> None:
    if c.kind == "pil":
        c.kind, c.dtype = "image", torch.uint8
    elif c.kind == "tensor":
        c.kind = "image"


def _pil_to_tensor(t, c: _Chunk, u) -> None:
    if c.kind == "pil":
        c.kind, c.dtype = "tensor", torch.uint8


def _to_dtype(t, c: _Chunk, u) -> None:
    """The image's dtype (torchvision's lookup: a plain dtype for images alone, or per type, with "others"); a
    chunk of masks' dtype by the same lookup. Per-type dtypes only where the chunk's target is its masks (the
    boxes' and labels' per-type dtypes, and torchvision's warnings for a dict of both tensors and images, are
    left to the one-by-one recording)."""
    image_dtype = t.dtype
    if not isinstance(t.dtype, torch.dtype):
        if c.masks is None or c.kind == "pil" or torch.Tensor in t.dtype and tv_tensors.Image in t.dtype:
            raise _Off
        image_dtype = _per_type(t.dtype, joint_record._KIND_CLASS[c.kind])
        mask_dtype = _per_type(t.dtype, tv_tensors.Mask)
        if mask_dtype is not None:
            c.mask_op(c.live(), "to_dtype", lambda j: dict(dtype=mask_dtype, scale=t.scale))
            c.mask_dtype = mask_dtype
        if image_dtype is None:
            if t.scale:
                raise _Off  # (torchvision warns that nothing is scaled)
            return
    if c.kind != "pil":
        c.record(F.to_dtype, c.live(), lambda j: dict(dtype=image_dtype, scale=t.scale), _NOTHING, c.size_of)


def _per_type(dtypes: dict, cls: type):
    """``ToDtype``'s dtype for inputs of ``cls`` (None: left as it is); _Off where torchvision raises."""
    if cls in dtypes:
        return dtypes[cls]
    if "others" in dtypes:
        return dtypes["others"]
    raise _Off


def _normalize(t, c: _Chunk, u) -> None:
    """The image normalized (a float image's: torchvision raises for others, one by one); masks pass."""
    if c.kind == "pil" or not c.dtype.is_floating_point:
        raise _Off
    c.record(F.normalize, c.live(), lambda j: dict(mean=t.mean, std=t.std, inplace=t.inplace), _NOTHING, c.size_of)


def _to_pure_tensor(t, c: _Chunk, u) -> None:
    if c.kind == "image":
        c.kind = "tensor"
    c.plain = True


def _convert_format(t, c: _Chunk, u) -> None:
    if not c.moving_boxes():
        return
    new = _BBF[t.format.upper()] if isinstance(t.format, str) else t.format
    if new not in joint_chain._FORMATS:
        raise _Off
    if new != c.fmt:
        c.boxes = joint_chain._from_xyxy(joint_chain._to_xyxy(c.boxes.copy(), c.fmt), new)
        c.fmt = new


def _scale_jitter(t, c: _Chunk, u) -> np.ndarray:
    """``joint_draws.scale_jitter_size`` for every sample: the scale uniform in ``scale_range`` (float32)."""
    lo, hi = t.scale_range
    scale = _F32(lo) + u[:, 0].astype(_F32) * _F32(hi - lo)
    r = np.minimum(t.target_size[1] / c.h.astype(_F64), t.target_size[0] / c.w.astype(_F64)).astype(_F32) * scale
    return np.stack([(c.h.astype(_F32) * r).astype(np.int64), (c.w.astype(_F32) * r).astype(np.int64)], axis=1)


def _shortest_size(t, c: _Chunk, u) -> np.ndarray:
    """``joint_draws.random_shortest_size`` for every sample: the size uniform over ``min_size`` (float64)."""
    sizes = np.asarray(t.min_size, dtype=np.int64)
    pick = np.minimum((u[:, 0].astype(_F64) * len(sizes)).astype(np.int64), len(sizes) - 1)
    h, w = c.h.astype(_F64), c.w.astype(_F64)
    r = sizes[pick] / np.minimum(h, w)
    if t.max_size is not None:
        r = np.minimum(r, t.max_size / np.maximum(h, w))
    return np.stack([(h * r).astype(np.int64), (w * r).astype(np.int64)], axis=1)


def _random_resize(t, c: _Chunk, u) -> np.ndarray:
    """``RandomResize``'s size uniform over ``[min_size, max_size)`` (``torch.randint``), the shorter side resized
    to it as torchvision's ``_compute_resized_output_size`` does (the longer by Python's float quotient)."""
    span = t.max_size - t.min_size
    if span <= 0:
        raise _Off  # (torch.randint raises)
    short = t.min_size + np.minimum((u[:, 0].astype(_F64) * span).astype(np.int64), span - 1)
    h, w = c.h.astype(np.int64), c.w.astype(np.int64)
    tall = w <= h
    lo, hi = np.where(tall, w, h), np.where(tall, h, w)
    long = (short * hi.astype(_F64) / lo.astype(_F64)).astype(np.int64)
    return np.stack([np.where(tall, long, short), np.where(tall, short, long)], axis=1)


def _resize_drawn(draw: Callable, as_asked: bool = False) -> Callable:
    def step(t, c: _Chunk, u) -> None:
        """A resize to the drawn size, with the class's interpolation (``joint_chain._resize_drawn``); ``as_asked``:
        recorded as the class asks it (``RandomResize``: the shorter side's length alone)."""
        size = draw(t, c, u)
        live = c.live()
        oh, ow = c.ch.copy(), c.cw.copy()
        short = size.min(axis=1) if as_asked else None  # (the shorter side is the size drawn: the longer, its multiple)
        sized = (lambda j: dict(size=[int(short[j])])) if as_asked else \
            (lambda j: dict(size=(int(size[j, 0]), int(size[j, 1]))))  # noqa: E731
        c.mask_op(live, "resize", sized)
        c.record(F.resize, live, lambda j: dict(sized(j), interpolation=t.interpolation, antialias=t.antialias),
                 sized, lambda j: (int(size[j, 0]), int(size[j, 1])))
        for j in live if c.params is not None else ():
            c.keep(j, size=int(short[j]) if as_asked else (int(size[j, 0]), int(size[j, 1])))
        if c.moving_boxes():  # ``resize_bounding_boxes``: the ratios of Python's quotients as float32
            moved = np.zeros(len(oh), dtype=bool)
            moved[live] = (size[live, 0] != oh[live]) | (size[live, 1] != ow[live])
            rw = (size[:, 1] / ow.astype(_F64)).astype(_F32)
            rh = (size[:, 0] / oh.astype(_F64)).astype(_F32)
            ratios = np.where(moved[:, None], np.stack([rw, rh, rw, rh], axis=1), _F32(1)).astype(_F32)
            rows = moved[c.owner]
            c.boxes[rows] = c.boxes[rows] * ratios[c.owner[rows]]
            c.ch[live], c.cw[live] = size[live, 0], size[live, 1]
    return step


def _random_crop(t, c: _Chunk, u) -> None:
    """``joint_draws.random_crop_params`` for every sample, then the pad and the crop (``joint_chain._random_crop``):
    the offsets uniform over the crop's positions."""
    if t.padding_mode != "constant" and c.moving_boxes():
        raise _Off  # torchvision's ValueError for boxes (its own forward raises it)
    pl, pr, pt, pb = (t.padding[0], t.padding[1], t.padding[2], t.padding[3]) if t.padding is not None else (0, 0, 0, 0)
    n = len(c.h)
    pad_left, pad_right = np.full(n, pl, np.int64), np.full(n, pr, np.int64)
    pad_top, pad_bottom = np.full(n, pt, np.int64), np.full(n, pb, np.int64)
    ph, pw = c.h + pt + pb, c.w + pl + pr
    crop_h, crop_w = t.size
    if t.pad_if_needed:
        dh, dw = np.maximum(crop_h - ph, 0), np.maximum(crop_w - pw, 0)
        pad_top, pad_bottom, ph = pad_top + dh, pad_bottom + dh, ph + 2 * dh
        pad_left, pad_right, pw = pad_left + dw, pad_right + dw, pw + 2 * dw
    c.off |= (ph < crop_h) | (pw < crop_w)  # its ValueError: the sample goes one by one, where it is raised
    top = np.where(ph > crop_h, (u[:, 0].astype(_F64) * np.maximum(ph - crop_h + 1, 1)).astype(np.int64), 0)
    left = np.where(pw > crop_w, (u[:, 1].astype(_F64) * np.maximum(pw - crop_w + 1, 1)).astype(np.int64), 0)
    live = c.live()
    padded = live[(pad_left[live] | pad_right[live] | pad_top[live] | pad_bottom[live]) != 0]
    cropped = live[(ph[live] > crop_h) | (pw[live] > crop_w)]
    fill = _get_fill(t._fill, joint_record._KIND_CLASS[c.kind])
    mask_fill = _get_fill(t._fill, tv_tensors.Mask)
    for j in live if c.params is not None else ():
        c.keep(j, needs_crop=bool(ph[j] > crop_h or pw[j] > crop_w), top=int(top[j]), left=int(left[j]),
               height=crop_h, width=crop_w, needs_pad=bool(pad_left[j] or pad_top[j] or pad_right[j] or pad_bottom[j]),
               padding=[int(pad_left[j]), int(pad_top[j]), int(pad_right[j]), int(pad_bottom[j])])
    if len(padded):
        padding = lambda j: dict(padding=[int(pad_left[j]), int(pad_top[j]), int(pad_right[j]),  # noqa: E731
                                          int(pad_bottom[j])])
        c.mask_op(padded, "pad", lambda j: dict(padding(j), fill=mask_fill, padding_mode=t.padding_mode))
        c.record(F.pad, padded, lambda j: dict(padding(j), fill=fill, padding_mode=t.padding_mode), padding,
                 lambda j: (int(c.h[j] + pad_top[j] + pad_bottom[j]), int(c.w[j] + pad_left[j] + pad_right[j])))
        if c.moving_boxes():
            at = np.zeros(n, dtype=bool)
            at[padded] = True
            dx, dy = np.where(at, pad_left, 0), np.where(at, pad_top, 0)
            c.ch[padded] += pad_top[padded] + pad_bottom[padded]
            c.cw[padded] += pad_left[padded] + pad_right[padded]
            _move_some(c, at, dx, dy, +1)
    if len(cropped):
        offsets = lambda j: dict(top=int(top[j]), left=int(left[j]))  # noqa: E731
        c.mask_op(cropped, "crop", lambda j: dict(offsets(j), height=crop_h, width=crop_w))
        c.record(F.crop, cropped, lambda j: dict(offsets(j), height=crop_h, width=crop_w), offsets,
                 lambda j: (crop_h, crop_w))
        if c.moving_boxes():
            at = np.zeros(n, dtype=bool)
            at[cropped] = True
            c.ch[cropped], c.cw[cropped] = crop_h, crop_w
            _move_some(c, at, np.where(at, left, 0), np.where(at, top, 0), -1)


def _move_some(c: _Chunk, at: np.ndarray, dx, dy, sign: int) -> None:
    """The boxes of the samples ``at`` shifted and clamped on their new canvas (the others untouched)."""
    rows = at[c.owner]
    kept = c.boxes[~rows]
    c.shift(dx, dy, sign)
    c.clamp()
    c.boxes[~rows] = kept


def _flip(horizontal: bool) -> Callable:
    functional = F.horizontal_flip if horizontal else F.vertical_flip

    def step(t, c: _Chunk, u) -> None:
        """The coin (``torch.rand(1) < p`` in torchvision), then ``joint_chain._flip_boxes`` on the flipped."""
        at = (u[:, 0] < t.p) & ~c.off
        flipped = np.flatnonzero(at)
        for j in c.live() if c.params is not None else ():
            c.keep(j, flipped=bool(at[j]))
        c.mask_op(flipped, functional.__name__, _NOTHING)
        c.record(functional, flipped, lambda j: {}, _NOTHING, c.size_of)
        if c.moving_boxes() and len(flipped):
            rows = at[c.owner]
            extent = (c.cw if horizontal else c.ch).astype(_F32)[c.owner[rows]]
            c.boxes[rows] = joint_chain.flipped(c.boxes[rows], c.fmt, extent, horizontal)
    return step


def _sanitize(t, c: _Chunk, u) -> None:
    """``joint_chain._sanitize`` for every sample: the boxes kept by ``valid_xyxy`` on their canvases, and the
    labels with them."""
    if c.masks is not None or not c.moving_boxes() or c.fmt != _BBF.XYXY or \
            t._labels_getter is not _find_labels_default_heuristic:
        raise _Off
    keys = [None] * len(c.targets)
    for j in c.live():
        target = c.targets[j]
        key = joint_chain._labels_key(tuple(target))
        label = target.get(key) if key is not None else None
        if key is None or type(label) is not torch.Tensor or sum(v is label for v in target.values()) != 1 or \
                label.ndim == 0 or label.shape[0] != c.counts[j]:
            c.off[j] = True  # its ValueError, raised one by one
            continue
        keys[j] = key
    f32 = _F32
    b = c.boxes
    wh = b[:, 2:] - b[:, :2]
    bounds = np.stack([c.cw, c.ch, c.cw, c.ch], axis=1).astype(f32)[c.owner]
    valid = (wh >= f32(t.min_size)).all(axis=1) & ((b >= f32(0)) & (b <= bounds)).all(axis=1) & \
        (wh[:, 0] * wh[:, 1] >= f32(t.min_area))
    starts = np.concatenate([[0], np.cumsum(c.counts)])
    for j in c.live():
        v = valid[starts[j]:starts[j + 1]]
        label = c.targets[j][keys[j]]
        c.targets[j] = dict(c.targets[j])
        c.targets[j][keys[j]] = torch.from_numpy(label.numpy()[v]) if label.dtype in joint_chain._NUMPY_INDEXED \
            else label[torch.from_numpy(v)]
    valid |= c.off[c.owner]  # (a sample that left keeps its boxes: it is recorded again one by one)
    c.boxes, c.owner = c.boxes[valid], c.owner[valid]
    c.counts = np.bincount(c.owner, minlength=len(c.counts)).astype(np.int64)


#: a stand-in of a mask, for a class of the user's recorded sample by sample (``_per_sample``)
_MASK_LIKE = tv_tensors.Mask(torch.empty(0, 0, dtype=torch.uint8))


def _per_sample(t, c: _Chunk, u) -> None:
    """A class of the user's own (the segmentation reference's ``PadIfSmaller``), in a chunk of masks: each sample
    recorded through it on stand-ins, as the one-by-one recording does (the worker's recording kernels, swapped in
    for the process), its draws from torch's CPU generator seeded from the sample's two uniforms. A sample it does
    not leave as an image and a mask with records of their own (it read the pixels or the mask's values, raised,
    returned something else) is left out."""
    if c.masks is None or c.kind not in ("image", "tensor"):
        raise _Off
    gen = torch.default_generator
    state = gen.get_state()
    prev = getattr(joint_record._LOCAL, "record", None)
    try:
        for j in c.live():
            gen.manual_seed(int(u[j, 0] * (1 << 24)) << 24 | int(u[j, 1] * (1 << 24)))
            if c.params is not None:
                c.keep(j, seed=gen.initial_seed())
            rec = joint_record._Record()
            rec.masks_in = set()  # (masks recorded: a mask stand-in guarded while recording, joint._guarding)
            h, w = int(c.h[j]), int(c.w[j])
            image = rec.stand_in(joint_record._LIKE[c.kind](), (3, h, w), c.dtype, c.ops[j])
            lead = c.masks[j][0][1]["source"].shape[:-2]
            mask = rec.stand_in(_MASK_LIKE, (*lead, h, w), c.mask_dtype, c.masks[j])
            joint_record._LOCAL.record = rec
            try:
                with joint_record.guarded(rec, image):  # (a plain tensor's stand-in: a mode guards it)
                    out = t(image, mask)
            except Exception:  # noqa: BLE001 - its own error, or the recording's refusal: raised one by one
                out = None
            finally:
                joint_record._LOCAL.record = prev
            if not isinstance(out, tuple) or len(out) != 2 or type(out[0]) is not type(image) or \
                    type(out[1]) is not type(mask) or out[0].dtype != c.dtype or out[1].dtype != c.mask_dtype:
                c.off[j] = True
                continue
            ops, mask_ops = rec.ops.get(out[0].data_ptr()), rec.ops.get(out[1].data_ptr())
            if ops is None or mask_ops is None or not joint_masks.made(mask_ops) or joint_masks.made(ops) or \
                    tuple(out[0].shape[-2:]) != tuple(out[1].shape[-2:]) or out[0].shape[0] != 3:
                c.off[j] = True
                continue
            c.ops[j], c.masks[j] = ops, mask_ops
            c.h[j], c.w[j] = out[0].shape[-2:]
    finally:
        gen.set_state(state)
        joint_record._LOCAL.record = prev


#: the step of a class of the user's own (``plan``'s ``user``)
PER_SAMPLE = Vector(_per_sample, 2)


def steps() -> dict:
    """The classes a chunk is recorded with, by exact class (the registry's ``vector`` entries)."""
    return {v2.ToImage: Vector(_to_image), v2.PILToTensor: Vector(_pil_to_tensor), v2.ToDtype: Vector(_to_dtype),
            v2.ToPureTensor: Vector(_to_pure_tensor), v2.ConvertBoundingBoxFormat: Vector(_convert_format),
            v2.ScaleJitter: Vector(_resize_drawn(_scale_jitter), 1),
            v2.RandomShortestSize: Vector(_resize_drawn(_shortest_size), 1),
            v2.RandomResize: Vector(_resize_drawn(_random_resize, as_asked=True), 1), v2.Normalize: Vector(_normalize),
            v2.RandomCrop: Vector(_random_crop, 2),
            v2.RandomHorizontalFlip: Vector(_flip(True), 1), v2.RandomVerticalFlip: Vector(_flip(False), 1),
            v2.SanitizeBoundingBoxes: Vector(_sanitize)}


# --- a chunk --------------------------------------------------------------------------------------------------

def plan(joint, vector_of: Callable, user: Callable = None, kind: Optional[str] = None) -> Optional[list]:
    """(transform, its ``Vector``) for each transform of ``joint``, a v2 Compose (nested ones flattened) of
    classes with a ``vector`` entry and no hooks or methods of the instance's own, or an object whose call is
    ``return self.transforms(image, target)`` of one (the detection reference's ``DetectionPresetTrain``);
    else None. ``user(cls)``: whether a class without an entry is one of the user's own, recorded sample by
    sample in a chunk of masks (``PER_SAMPLE``); None: none is. ``kind``: the images' kind as the dataset hands
    them, where a class of the user's would meet a PIL image (which its step does not take): None."""
    if type(joint) is not v2.Compose and _calls_its_transforms(type(joint)):
        joint = joint.transforms
    if not ENABLED[0] or type(joint) is not v2.Compose or torch.get_default_dtype() != torch.float32 or \
            any(getattr(_nn_module, name, None) for name in ("_global_forward_hooks", "_global_forward_pre_hooks")):
        return None
    out = joint_chain.plan_of(joint, vector_of if user is None else
                              lambda cls: vector_of(cls) or (PER_SAMPLE if user(cls) else None))
    if out is None or any(t._forward_hooks or t._forward_pre_hooks for t, _ in out):
        return None
    for t, v in out if kind is not None else ():  # (the kinds the steps hand on, as the chunk's steps set them)
        if v is PER_SAMPLE and kind == "pil":
            return None
        kind = "image" if type(t) is v2.ToImage else "tensor" if type(t) is v2.PILToTensor and kind == "pil" or \
            type(t) is v2.ToPureTensor and kind == "image" else kind
    return out


class _Calls:
    def __call__(self, image, target):
        return self.transforms(image, target)


def _calls_its_transforms(cls: type) -> bool:
    """Whether ``cls``'s call is exactly ``return self.transforms(image, target)`` (its code compared with that
    of a class that says it: the same instructions on the same names; flags of the code itself, not of the
    module's ``__future__`` imports), and not a torch module (whose call runs hooks)."""
    call = getattr(cls, "__call__", None)
    code, ref = getattr(call, "__code__", None), _Calls.__call__.__code__
    return code is not None and not issubclass(cls, torch.nn.Module) and not call.__defaults__ and \
        not call.__kwdefaults__ and not call.__closure__ and \
        (code.co_code, code.co_names, code.co_consts, code.co_argcount, code.co_kwonlyargcount, code.co_flags & 0x3FF) \
        == (ref.co_code, ref.co_names, ref.co_consts, ref.co_argcount, ref.co_kwonlyargcount, ref.co_flags & 0x3FF)


def uniforms(seeds: list, draws: int) -> np.ndarray:
    """(n, draws) uniforms in [0, 1), row ``j`` from ``seeds[j]`` on torch's CPU generator (a worker's)."""
    out = np.empty((len(seeds), max(draws, 1)), dtype=np.float32)
    gen = torch.default_generator
    for j, seed in enumerate(seeds):
        gen.manual_seed(seed)
        out[j] = torch.rand(max(draws, 1)).numpy()
    return out


def carried(target, size: tuple, masks: bool = False):
    """The target's BoundingBoxes key and itself where the chunk carries this target (``joint_chain._boxes_of``:
    one float32 XYXY / XYWH BoundingBoxes, here on the image's canvas, plain CPU tensors and plain values);
    ``masks``: also a target that is one mask the gather takes (``joint_masks.wanted``) of the image's size,
    as (``MASK``, itself); else None."""
    if masks and type(target) is tv_tensors.Mask:
        return (MASK, target) if joint_masks.wanted(target) and tuple(target.shape[-2:]) == tuple(size) else None
    if type(target) is not dict:
        return None
    try:
        key, boxes = joint_chain._boxes_of(target)
    except joint_chain._Off:
        return None
    return (key, boxes) if boxes is not None and tuple(boxes.canvas_size) == tuple(size) else None


#: ``carried``'s key for a target that is one mask
MASK = "\0mask"
#: a chunk of masks' stand-in for its boxes
_ONE_BOX = tv_tensors.BoundingBoxes(torch.zeros(0, 4), format="XYXY", canvas_size=(1, 1))


def record(steps: list, kind: str, sizes: list, targets: list, u: np.ndarray,
           params: Optional[list] = None, masks: bool = False) -> list:
    """Each sample's (record, target, the output's type: "image" or "tensor") after ``steps`` (``plan``), or
    None for one the chunk does not carry. ``sizes``: the images' (h, w); ``u``: the uniforms (``uniforms``),
    each step taking its ``draws`` columns in order; ``params``: a list that gets each sample's parameters;
    ``masks``: targets that are one mask each are carried too (where a probe showed that the joint transform moves
    them only through their functionals: ``joint.masks_blind``), each made in one gather (``joint_masks``)."""
    n = len(targets)
    got = [carried(t, s, masks) for t, s in zip(targets, sizes)]
    first = next((g for g in got if g is not None), None)
    if first is None:
        return [None] * n
    if first[0] == MASK:
        same = [g is not None and g[0] == MASK for g in got]
        likes = [_NO_BOXES] * n
        first = (None, _ONE_BOX)
    else:
        same = [g is not None and g[0] == first[0] and g[1].format == first[1].format and
                getattr(g[1], "clamping_mode", "soft") == getattr(first[1], "clamping_mode", "soft") for g in got]
        likes = [g[1] if ok else _NO_BOXES for g, ok in zip(got, same)]
    c = _Chunk(kind, np.asarray(sizes, dtype=np.int64).reshape(n, 2), targets, first[0], first[1], likes)
    c.off |= ~np.asarray(same, dtype=bool)
    if first[0] is None:
        c.masks = [[(joint_masks.SOURCE, {"source": g[1]}, tuple(s))] if g is not None else None
                   for g, s in zip(got, sizes)]
    if params is not None:
        c.params = [[] for _ in range(n)]
    col = 0
    try:
        for t, vec in steps:
            vec.step(t, c, u[:, col:col + vec.draws])
            col += vec.draws
    except _Off:
        return [None] * n
    if c.kind == "pil":
        return [None] * n  # (the recording's Unrecordable: the output is not a tensor)
    out_kind = "image" if c.kind == "image" else "tensor"
    starts = np.concatenate([[0], np.cumsum(c.counts)])
    if c.masks is not None:
        return _masks_out(c, out_kind, params)
    out: list = []
    for j in range(n):
        if c.off[j]:
            out.append(None)
            continue
        b = torch.from_numpy(np.ascontiguousarray(c.boxes[starts[j]:starts[j + 1]], dtype=_F32))
        target = dict(c.targets[j])
        target[c.box_key] = b if c.plain else \
            tv_tensors.wrap(b, like=likes[j], format=c.fmt, canvas_size=(int(c.ch[j]), int(c.cw[j])))
        out.append((c.ops[j], target, out_kind))
        if params is not None:
            params.append(c.params[j])
    return out


def _masks_out(c: _Chunk, out_kind: str, params: Optional[list]) -> list:
    """A chunk of masks' samples: each mask made from its record in one gather (``joint._made``'s way: its type
    kept until ToPureTensor), or None where the gather refuses it (recorded one by one)."""
    out: list = []
    for j in range(len(c.masks)):
        if c.off[j]:
            out.append(None)
            continue
        ops = c.masks[j]
        try:
            mask = ops[0][1]["source"].as_subclass(torch.Tensor) if len(ops) == 1 else joint_masks.realize(ops)
        except joint_masks.MaskUnrecordable:
            out.append(None)
            continue
        if not c.plain:
            wrapped = mask.as_subclass(tv_tensors.Mask)
            wrapped.__dict__.update(mask.__dict__)
            mask = wrapped
        out.append((c.ops[j], mask, out_kind))
        if params is not None:
            params.append(c.params[j])
    return out
