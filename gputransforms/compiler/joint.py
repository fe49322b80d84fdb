"""Joint transforms (image and tv_tensor targets together: detection, segmentation) compiled by recording.

torchvision's v2 transform runs as written, with the real target, on a *stand-in* image: a tensor of the
image's shape and dtype whose storage is one element. Every random parameter is drawn by torchvision's
own code from torch's RNG, boxes and masks are moved by torchvision's own kernels (exactly as in
torchvision), and each image functional the transform calls (``F.crop``, ``F.pad``, ``F.adjust_hue``, ...)
is recorded instead of run. ``JointProgram.row`` turns one sample's record into one row of parameters for
the graph's fixed structure (``compiler.dali``'s ``joint`` step), which does the pixel work for the whole
batch:

    colour block (brightness, contrast, saturation, hue, contrast, channel permutation: the order of
    RandomPhotometricDistort; each an identity where a sample skips it)
    -> stage 0: one window (every crop and pad of the stage folded into one slice, padding with the
       fill) and one flip -> resize -> stage 1 ... -> dtype, normalize, CHW

A sample whose record does not fit that structure (an op the structure lacks, or in another order) is
*replayed*: its recorded functionals run with torchvision's kernels on the image PIL decodes, and the
graph takes the result as it is (``replay``). Nothing is drawn twice, so the distribution is
torchvision's either way.

Which transform classes may take part is the registry's ``joint`` entry (``registry.joint_of``).
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import threading
from typing import Optional

import inspect

import numpy as np
import PIL.Image
import torch
from torchvision import tv_tensors
from torchvision.transforms.v2 import functional as F
from torchvision.transforms.v2.functional import _utils as _futils

from ..device import map_tensors
from . import joint_masks
from .joint_record import (_LIKE, _LOCAL, COLOUR_SLOTS, GEOMETRY, TAIL, Unrecordable, _as_pil_does, _bound,
                           _is_pil_stand_in, _key, _Record, _refuse, _shape, _shape_after, guarded)
from .registry import draws, forwards

_QUERIES = ("get_size", "get_dimensions", "get_num_channels", "get_num_frames")

#: the width of a row's parts (``JointProgram.row``)
COLOUR_WIDTH = 15  # brightness, contrast, saturation, hue applied, hue, contrast, 3x3 permutation
_COLOUR_IDENTITY = (1.0, 1.0, 1.0, 0.0, 0.0, 1.0)  # the factors of ``COLOUR_WIDTH`` before the permutation
STAGE_WIDTH = 6  # window top, left, height, width; horizontal flip, vertical flip
RESIZE_WIDTH = 2  # height, width


# --- recording ------------------------------------------------------------------------------------------

_SWAP_LOCK = threading.RLock()


def _recording_kernel(functional, registered):
    """``registered``: the kernel torchvision registered (which wraps its output as the input's tv_tensor
    type); its arguments are read from the kernel it wraps."""
    name = functional.__name__
    real = getattr(registered, "__wrapped__", registered)

    def kernel(inpt, *args, **kwargs):
        rec = getattr(_LOCAL, "record", None)
        ops = rec.ops.get(_key(inpt)) if rec is not None else None
        if ops is None and rec is not None and rec.masks_in is not None and name in joint_masks.MASK_OPS and \
                joint_masks.wanted(inpt):  # a real mask of the sample's, from here on a stand-in (``record``)
            ops = [(joint_masks.SOURCE, {"source": inpt}, tuple(inpt.shape[-2:]))]
        if ops is None:  # not one of ours (another thread's torchvision call while the kernels are swapped)
            return registered(inpt, *args, **kwargs)
        if joint_masks.made(ops):
            if name not in joint_masks.MASK_OPS:
                raise joint_masks.MaskUnrecordable(name)
        elif name not in COLOUR_SLOTS + GEOMETRY + TAIL:
            raise Unrecordable(name)
        a = _bound(real, inpt, args, kwargs)
        pil = isinstance(inpt, PIL.Image.Image)
        before = _shape(inpt)
        if pil:
            a = _as_pil_does(name, a, before[-2:])
        shape, dtype = _shape_after(name, before, torch.uint8 if pil else inpt.dtype, a)
        return rec.stand_in(inpt, shape, dtype, ops + [(name, a, before[-2:])])

    kernel.gputransforms_registered = registered
    return kernel


def _converting(original, like):
    """``F.to_image`` / ``F.pil_to_tensor`` while recording: a PIL stand-in becomes a uint8 tensor stand-in of
    its size (``like``'s type), carrying its record; anything else is converted as before."""

    def convert(inpt, *args, **kwargs):
        rec = getattr(_LOCAL, "record", None)
        ops = rec.ops.get(_key(inpt)) if rec is not None and _is_pil_stand_in(inpt) else None
        if ops is None:
            return original(inpt, *args, **kwargs)
        return rec.stand_in(like(), _shape(inpt), torch.uint8, list(ops))

    return convert


_SWAPPED = [0]  # how many recording() contexts are open (the kernels are swapped while > 0)
_SAVED: list = []


def _drawing(cls, original, faster):
    """``cls.make_params`` while recording: the registry's exact faster form for a sample being recorded
    in this thread by ``cls`` itself, the class's own method for anything else."""
    fast = faster(original)

    def make_params(self, flat_inputs):
        if type(self) is cls and getattr(_LOCAL, "record", None) is not None:
            return fast(self, flat_inputs)
        return original(self, flat_inputs)

    return make_params


def _forwarding(cls, original, faster):
    """``cls.forward`` while recording: the registry's exact faster form for ``cls`` itself in a thread
    that records (whatever it is given: the form runs the class's own forward for any input it does not
    take), the forward the class had for anything else (a subclass of the user's included)."""
    fast = faster(original)

    def forward(self, *inputs):
        if type(self) is cls and getattr(_LOCAL, "record", None) is not None:
            return fast(self, *inputs)
        return original(self, *inputs)

    return forward


def _put_forward_back(cls, had: bool, key: str, original) -> None:
    if had:
        setattr(cls, key, original)
    else:  # it was inherited
        delattr(cls, key)


#: whether ``recording`` swaps in the registry's faster forwards (off: torchvision's own, for tests)
FAST_FORWARD = [True]


#: the wrappers ``_swap_in`` installs, made once per (what it wraps): with no workers the swap is made per
#: sample, and making ~500 closures each time cost as much as installing them
_WRAPPERS: dict = {}


def _wrapper(key: tuple, make):
    w = _WRAPPERS.get(key)
    if w is None:
        w = _WRAPPERS[key] = make()
    return w


def _guarding(cls):
    """``cls.__torch_function__`` (``tv_tensors.Mask``'s, ``tv_tensors.Image``'s) while recording: any other torch
    operation on a stand-in of the sample being recorded raises: MaskUnrecordable on a mask's (SanitizeBoundingBoxes
    indexing the instance masks, a comparison; the sample is recorded again with its real masks), Unrecordable on
    the image's (a class that reads the pixels; the sample runs as written). A stand-in's values are undefined, and
    the probes made with the loader (``masks_blind``, ``pixel_blind``) follow one draw: a flip their draw skipped
    let SanitizeBoundingBoxes' indexing of flipped masks give those values as the sample's masks."""
    inherited = inspect.getattr_static(cls, "__torch_function__").__func__

    def torch_function(cls, func, types, args=(), kwargs=None):
        rec = getattr(_LOCAL, "record", None)
        if rec is not None:
            _refuse(rec, func, args, kwargs, (tv_tensors.Mask, tv_tensors.Image))
        return inherited(cls, func, types, args, kwargs)

    return classmethod(torch_function)


def _swap_in() -> None:
    for cls in (tv_tensors.Mask, tv_tensors.Image):
        own = "__torch_function__" in cls.__dict__
        _SAVED.append((functools.partial(_put_forward_back, cls, own), "__torch_function__",
                       cls.__dict__.get("__torch_function__")))
        cls.__torch_function__ = _wrapper(("guard", cls), functools.partial(_guarding, cls))
    for functional, registry in list(_futils._KERNEL_REGISTRY.items()):
        if functional.__name__ in _QUERIES:
            continue
        for cls in (tv_tensors.Image, torch.Tensor, tv_tensors.Mask, PIL.Image.Image):
            real = registry.get(cls)
            if real is not None:
                _SAVED.append((registry.__setitem__, cls, real))
                registry[cls] = _wrapper(("kernel", functional, real), lambda: _recording_kernel(functional, real))
    for name, like in (("to_image", _LIKE["image"]), ("pil_to_tensor", _LIKE["tensor"])):
        original = getattr(F, name)
        _SAVED.append((functools.partial(setattr, F), name, original))
        setattr(F, name, _wrapper(("convert", name, original), lambda: _converting(original, like)))
    for cls, faster in draws():
        original = cls.__dict__.get("make_params")
        if original is not None:
            _SAVED.append((functools.partial(setattr, cls), "make_params", original))
            cls.make_params = _wrapper(("draw", cls, original), lambda: _drawing(cls, original, faster))
    for cls, faster in forwards() if FAST_FORWARD[0] else ():
        original = cls.forward
        _SAVED.append((functools.partial(_put_forward_back, cls, "forward" in cls.__dict__), "forward", original))
        cls.forward = _wrapper(("forward", cls, original), lambda: _forwarding(cls, original, faster))


@contextlib.contextmanager
def recording():
    """While this lasts, the image kernels of every functional (for tv_tensors.Image, plain tensors and
    PIL images), and the conversions of a PIL image to a tensor, record when given a stand-in; given
    anything else they run as before, so torchvision calls elsewhere in the process are unaffected. The
    classes with a ``draw`` entry draw their parameters in its exact faster form for a sample being
    recorded. ``record`` runs inside it."""
    with _SWAP_LOCK:
        if not _SWAPPED[0]:
            _swap_in()
        _SWAPPED[0] += 1
    try:
        yield
    finally:
        with _SWAP_LOCK:
            _SWAPPED[0] -= 1
            if not _SWAPPED[0]:
                for put, key, real in reversed(_SAVED):
                    put(key, real)
                _SAVED.clear()


_KEPT = [False]


def keep_recording() -> None:
    """Swap the kernels for the rest of the process (a worker process that only records: no swap per
    sample); once."""
    with _SWAP_LOCK:
        if not _KEPT[0]:
            _KEPT[0] = True
            if not _SWAPPED[0]:
                _swap_in()
            _SWAPPED[0] += 1


def record(joint, size: tuple, target, kind: str = "image", value: Optional[int] = None,
           lazy_masks: bool = False, users: bool = True) -> tuple:
    """Run ``joint(image, target)`` on a stand-in uint8 RGB image of ``size`` (h, w) of ``kind`` (a
    tv_tensors "image", a plain "tensor", or "pil": a PIL image the transform converts): returns (the
    recorded functionals applied to the image, in order, each (name, arguments, size before); the
    transformed target; the output image's type: "image" or "tensor"). Unrecordable if the transform
    calls a functional the graph lacks. ``value``: every stand-in holds it (a probe of whether a
    transform reads the pixels: ``pixel_blind``). ``lazy_masks``: the target's uint8 masks are
    stand-ins too, made from their records in one gather (``joint_masks``); MaskUnrecordable where
    they cannot be (the caller records again with the real masks, from the same random state). ``users``: the
    transform may hold code of the user's, which may read the pixels (a plain tensor's stand-in is then guarded:
    ``joint_record.guarded``); torchvision's own classes do not read them."""
    rec = _Record(value)
    image = rec.stand_in(_LIKE[kind](), (3, int(size[0]), int(size[1])), torch.uint8, [])
    lazy = False  # mask stand-ins made: every Mask of the target is one the gather takes, and there is one
    if lazy_masks:
        masks: list = []
        map_tensors(target, lambda t: masks.append(t) if isinstance(t, tv_tensors.Mask) else None)
        lazy = bool(masks) and all(joint_masks.wanted(t) for t in masks)
        # a mask becomes a stand-in where it meets its first functional (``_recording_kernel``): one of the
        # target's, or one the transform made from them (the segmentation reference merges the instance masks
        # into a class mask first, reading their values); the target's masks it hands back untouched are
        # these objects
        rec.masks_in = {id(t) for t in masks} if lazy else None
    prev = getattr(_LOCAL, "record", None)
    _LOCAL.record = rec
    try:
        with recording(), guarded(rec, image, users):
            out = joint(image, target) if joint is not None else (image, target)
    finally:
        _LOCAL.record = prev
    if not isinstance(out, (tuple, list)) or len(out) != 2 or not isinstance(out[0], torch.Tensor):
        raise Unrecordable("the joint transform did not return (image, target)")
    ops = rec.ops.get(out[0].data_ptr())
    if ops is None:
        raise Unrecordable("the image the joint transform returned is not the one it was given")
    made = map_tensors(out[1], functools.partial(_made, rec)) if lazy else out[1]
    return ops, made, "image" if isinstance(out[0], tv_tensors.Image) else "tensor"


def _made(rec: _Record, t: torch.Tensor) -> torch.Tensor:
    """A target tensor as it leaves a recording with lazy masks: a mask stand-in made from its record; one of
    the target's masks handed back untouched as it is; any other Mask (one that left its stand-in by another way
    than the recorded functionals) refused."""
    ops = rec.ops.get(t.data_ptr()) if t.numel() else None
    if ops is not None and joint_masks.made(ops):
        mask = ops[0][1]["source"].as_subclass(torch.Tensor) if len(ops) == 1 else joint_masks.realize(ops)
        if type(t) is torch.Tensor:
            return mask
        out = mask.as_subclass(type(t))
        out.__dict__.update(mask.__dict__)
        return out
    if ops is not None or (isinstance(t, tv_tensors.Mask) and id(t) not in rec.masks_in):
        raise joint_masks.MaskUnrecordable("a mask left the transform other than through its functionals")
    return t


def pixel_blind(joint, size: tuple, make_target, kind: str) -> tuple:
    """Record one sample twice from the same RNG state, on stand-ins of 0 and of 255: (its record, its
    target, its output type) where both records and targets agree (the transform's draws and its
    functionals do not depend on the pixels), else Unrecordable. ``make_target()``: a fresh target."""
    state = torch.get_rng_state()
    first = record(joint, size, make_target(), kind, value=0)
    torch.set_rng_state(state)
    second = record(joint, size, make_target(), kind, value=255)
    if first[2] != second[2] or not same(first[0], second[0]) or not same(first[1], second[1]):
        raise Unrecordable("its parameters depend on the pixel values")
    return first


def masks_blind(joint, size: tuple, make_target, kind: str) -> bool:
    """Whether the target's masks may be recorded (``record(lazy_masks=True)``): one sample recorded with
    its real masks, and with mask stand-ins of 0 and of 255, from one random state, gives the same
    record and the same target each time (a transform that reads the masks' values, or moves them
    other than through their functionals, does not)."""
    state = torch.get_rng_state()
    try:
        real = record(joint, size, make_target(), kind)
        for value in (0, 255):
            torch.set_rng_state(state)
            lazy = record(joint, size, make_target(), kind, value=value, lazy_masks=True)
            if real[2] != lazy[2] or not same(real[0], lazy[0]) or not same(real[1], joint_masks.widened(lazy[1])):
                return False
    except (Unrecordable, joint_masks.MaskUnrecordable):
        return False
    finally:
        torch.set_rng_state(state)
    return True


def same(a, b) -> bool:
    """Equal records or targets: the same types, tensors and NumPy arrays by value (NaN equal to NaN: a missing
    value made twice is the same) with their tv_tensor attributes, mappings with the same keys in the same
    order, objects of a class without its own ``==`` by their attributes."""
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        if a.shape != b.shape or a.dtype != b.dtype or \
                not same(getattr(a, "__dict__", {}), getattr(b, "__dict__", {})):
            return False
        return bool(torch.equal(a, b)) or ((a.is_floating_point() or a.is_complex()) and
                                           bool(torch.equal(a.isnan(), b.isnan())) and
                                           bool(torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0))))
    if isinstance(a, np.ndarray):
        return a.shape == b.shape and a.dtype == b.dtype and \
            bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and a != a:
        return b != b
    if type(a).__eq__ is object.__eq__ and hasattr(a, "__dict__"):  # identity is its ==: made anew, equal if alike
        try:
            return same(vars(a), vars(b))
        except RecursionError:  # (an object that holds itself)
            return False
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - values without a truth value for ==
        return repr(a) == repr(b)


def replay(image: torch.Tensor, ops: list) -> torch.Tensor:
    """The recorded functionals (the value tail left out) run on the real image with torchvision's kernels."""
    for name, a, _ in ops:
        if name in TAIL:
            continue
        image = getattr(F, name)(image, **a)
    return image


# --- the graph's structure and one row per sample ----------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class JointProgram:
    """The fixed structure of a joint graph (what ``compiler.dali`` builds), and how one sample's record
    becomes a row of its parameters."""

    colour: bool  # the colour block is in the graph
    resizes: tuple  # per resize: (interpolation name as DALI's, antialias)
    fill: tuple  # the uint8 fill of every padding (one per graph)
    tail: tuple  # the value ops at the end: ("to_dtype", dtype, scale) / ("normalize", mean, std)
    #: the graph cuts a window and flips before the first resize; False where the chain resizes before any other
    #: geometry (ScaleJitter, RandomShortestSize first: the lsj and multiscale presets), and the graph then leaves
    #: that stage out (a slice and a flip of every full-size image, and their CPU argument operators, a batch);
    #: a sample whose record has geometry there after all gets no row (``row``: it is replayed)
    first_window: bool = True

    @property
    def width(self) -> int:
        return (COLOUR_WIDTH if self.colour else 0) + STAGE_WIDTH * (len(self.resizes) + 1) + \
            RESIZE_WIDTH * len(self.resizes)

    def identity(self, size: tuple) -> np.ndarray:
        """The row of a sample the graph leaves as it is (a replayed one) at ``size``."""
        row = []
        if self.colour:
            row += list(_COLOUR_IDENTITY) + list(np.eye(3).ravel())
        for k in range(len(self.resizes) + 1):
            row += [0, 0, size[0], size[1], 0, 0]
            if k < len(self.resizes):
                row += [size[0], size[1]]
        return np.asarray(row, dtype=np.float32)

    def as_recorded(self, ops: list) -> "JointProgram":
        """This structure with the resizes, the fill and the colour block as one sample's record has them
        (for a chain whose classes say nothing of them: a user's own; a sample recorded otherwise is
        replayed, ``row``)."""
        resizes = tuple((interp_name(a["interpolation"]), bool(a["antialias"])) for name, a, _ in ops
                        if name == "resize")
        fills = [uint8_fill(a["fill"]) for name, a, _ in ops
                 if name == "pad" and any(F._geometry._parse_pad_padding(a["padding"]))]
        colour = self.colour or any(name in COLOUR_SLOTS for name, _, _ in ops)
        return dataclasses.replace(self, resizes=resizes, fill=fills[0] if fills else self.fill, colour=colour)

    def row(self, ops: list, size: tuple) -> Optional[np.ndarray]:
        """One sample's row, from its record on an image of ``size``; None where the structure cannot
        express it (the sample is then replayed); long because it is one pass over the record: each op
        moves the window, the flips and the colour slots that the ops after it read."""
        colour = list(_COLOUR_IDENTITY)
        perm = np.eye(3)
        slot = 0
        stages: list = []
        win = [0, 0, size[0], size[1]]  # top, left, height, width in the stage's input
        flips = [0, 0]  # horizontal, vertical
        geometry = False
        tail: list = []
        for name, a, before in ops:
            if tail and name not in TAIL:
                return None
            if name in COLOUR_SLOTS:
                # per-pixel maps and a mean over the whole image: they commute with flips only
                if geometry or not self.colour:
                    return None
                k = next((j for j in range(slot, len(COLOUR_SLOTS)) if COLOUR_SLOTS[j] == name), None)
                if k is None:
                    return None
                slot = k + 1
                if name == "permute_channels":
                    if len(a["permutation"]) != 3:
                        return None
                    perm = np.eye(3)[list(a["permutation"])] @ perm
                elif name == "adjust_hue":
                    colour[3], colour[4] = 1.0, float(a["hue_factor"])
                else:
                    colour[{0: 0, 1: 1, 2: 2, 4: 5}[k]] = float(a[name.replace("adjust_", "") + "_factor"])
            elif name in ("horizontal_flip", "vertical_flip"):
                flips[0 if name == "horizontal_flip" else 1] ^= 1
            elif name == "crop":
                top, left, h, w = int(a["top"]), int(a["left"]), int(a["height"]), int(a["width"])
                if top < 0 or left < 0 or top + h > before[0] or left + w > before[1] or h <= 0 or w <= 0:
                    return None  # torchvision pads with zeros there: not the stage's fill
                geometry = True
                win = _crop_window(win, flips, top, left, h, w)
            elif name in ("pad", "center_crop"):
                if name == "center_crop":
                    pads, crop = _center_crop(before, a["output_size"])
                    fill, mode = 0, "constant"
                else:
                    pads, crop, fill, mode = F._geometry._parse_pad_padding(a["padding"]), None, a["fill"], \
                        a["padding_mode"]
                left, right, top, bottom = pads
                if any(p < 0 for p in pads) or mode != "constant":
                    return None
                geometry = True
                if any(pads):
                    if uint8_fill(fill) != self.fill:  # one fill per graph
                        return None
                    win = _pad_window(win, flips, left, right, top, bottom)
                if crop is not None:
                    top, left, h, w = crop
                    win = _crop_window(win, flips, top, left, h, w)
            elif name == "resize":
                k = len(stages)
                nh, nw = F._geometry._compute_resized_output_size(tuple(before), size=a["size"],
                                                                 max_size=a.get("max_size"))
                if k >= len(self.resizes) or interp_name(a["interpolation"]) != self.resizes[k][0] or \
                        bool(a["antialias"]) != self.resizes[k][1]:
                    return None
                geometry = True
                stages.append((win, flips, (nh, nw)))
                win, flips = [0, 0, nh, nw], [0, 0]
            elif name in TAIL:
                tail.append(tail_op(name, a))
            else:
                return None
        if len(stages) != len(self.resizes) or tuple(tail) != self.tail:
            return None
        if not self.first_window and stages and (stages[0][0] != [0, 0, size[0], size[1]] or any(stages[0][1])):
            return None  # (geometry before the first resize, which this graph does not do)
        row = []
        if self.colour:
            row += colour + list(perm.ravel())
        for w, f, out in stages:
            row += list(w) + list(f) + list(out)
        row += win + flips
        return np.asarray(row, dtype=np.float32)


def _crop_window(win, flips, top, left, h, w):
    """The window after cropping (top, left, h, w) of what the window shows, flipped by ``flips``."""
    y0, x0, wh, ww = win
    if flips[0]:
        left = ww - left - w
    if flips[1]:
        top = wh - top - h
    return [y0 + top, x0 + left, h, w]


def _pad_window(win, flips, left, right, top, bottom):
    y0, x0, wh, ww = win
    if flips[0]:
        left, right = right, left
    if flips[1]:
        top, bottom = bottom, top
    return [y0 - top, x0 - left, wh + top + bottom, ww + left + right]


def _center_crop(before, output_size) -> tuple:
    """torchvision's center_crop_image as a padding (with zeros) and a crop."""
    g = F._geometry
    ch, cw = g._center_crop_parse_output_size(output_size)
    h, w = before
    pads = [0, 0, 0, 0]
    if ch > h or cw > w:
        left, top, right, bottom = g._center_crop_compute_padding(ch, cw, h, w)
        pads = [left, right, top, bottom]
        h, w = h + top + bottom, w + left + right
    top, left = g._center_crop_compute_crop_anchor(ch, cw, h, w)
    return pads, (top, left, ch, cw)


def uint8_fill(fill) -> tuple:
    """The three uint8 values torchvision's pad writes into a uint8 RGB image for ``fill``."""
    return _uint8_fill(tuple(fill) if isinstance(fill, (list, tuple)) else fill)


@functools.lru_cache(maxsize=64)
def _uint8_fill(fill) -> tuple:
    probe = F._geometry.pad_image(torch.zeros(3, 1, 1, dtype=torch.uint8), [1], fill=fill)
    return tuple(int(v) for v in probe[:, 0, 0])


def interp_name(interpolation) -> str:
    """DALI's name of a resize filter, or ``_NO_FILTER`` and torchvision's name where DALI has none."""
    from torchvision.transforms.v2.functional._geometry import _check_interpolation

    mode = _check_interpolation(interpolation)
    return {"NEAREST": "INTERP_NN", "NEAREST_EXACT": "INTERP_NN", "BILINEAR": "INTERP_LINEAR",
            "BICUBIC": "INTERP_CUBIC", "LANCZOS": "INTERP_LANCZOS3"}.get(mode.name, _NO_FILTER + mode.name)


_NO_FILTER = "?"


def lacks_a_filter(program: "JointProgram") -> bool:
    """Whether one of ``program``'s resizes has a filter DALI lacks (PIL's box or Hamming)."""
    return any(name.startswith(_NO_FILTER) for name, _ in program.resizes)


def tail_op(name: str, a: dict) -> tuple:
    if name == "to_dtype":
        return ("to_dtype", a["dtype"], bool(a["scale"]))
    return ("normalize", tuple(float(m) for m in a["mean"]), tuple(float(s) for s in a["std"]))


def affine_of(tail: tuple) -> tuple:
    """The output's dtype, and per channel (scale, shift) of the raw uint8 pixels, for the tail ops."""
    dtype, scale, shift = torch.uint8, [1.0] * 3, [0.0] * 3
    for op in tail:
        if op[0] == "to_dtype":
            new, sc = op[1], op[2]
            if new.is_floating_point and sc and not dtype.is_floating_point:
                scale, shift = [s / 255.0 for s in scale], [b / 255.0 for b in shift]
            elif not new.is_floating_point and new != dtype:
                raise Unrecordable(f"to_dtype({new})")
            dtype = new
        else:
            mean, std = list(op[1]) * (3 if len(op[1]) == 1 else 1), list(op[2]) * (3 if len(op[2]) == 1 else 1)
            scale = [s / d for s, d in zip(scale, std)]
            shift = [(b - m) / d for b, m, d in zip(shift, mean, std)]
    return dtype, tuple(scale), tuple(shift)
