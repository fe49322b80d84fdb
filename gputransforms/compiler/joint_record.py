"""What a recording records, apart from the swapping of torchvision's kernels (``compiler.joint``): the
stand-ins (a tensor of one element expanded to the image's shape, a PIL image without pixels), the record of
one sample, and an image functional's arguments as its kernel binds them. ``joint`` records by running the
transform with its kernels swapped; ``joint_chain`` records a Compose of known classes in one pass; both
record through these, so their records are the same."""
from __future__ import annotations

import contextlib
import functools
import inspect
import threading
from typing import Optional

import PIL.Image
import torch
from PIL._util import DeferredError
from torch.overrides import TorchFunctionMode
from torchvision import tv_tensors
from torchvision.transforms.v2 import functional as F
from torchvision.transforms.v2.functional import _utils as _futils

from . import joint_masks

#: the functionals the graph does: colour (in RandomPhotometricDistort's order), geometry, value tail
COLOUR_SLOTS = ("adjust_brightness", "adjust_contrast", "adjust_saturation", "adjust_hue", "adjust_contrast",
                "permute_channels")
GEOMETRY = ("crop", "pad", "horizontal_flip", "vertical_flip", "resize", "center_crop")
TAIL = ("to_dtype", "normalize")


class Unrecordable(Exception):
    """The transform called an image functional the recording does not know (it runs as written)."""


def _pil_stand_in(size: tuple) -> PIL.Image.Image:
    """A PIL image (of PIL's own class, as the transform's type lookups see it) of mode RGB and ``size``
    (h, w) that holds no pixels: anything that reads them raises Unrecordable. A joint transform written
    for PIL images (the references' ``--backend pil``) is recorded on it."""
    img = PIL.Image.Image()
    missing = DeferredError(Unrecordable("the transform read the pixels of a PIL image"))
    for field, value in (("size", (int(size[1]), int(size[0]))), ("mode", "RGB"), ("im", missing)):
        # Pillow >= 10.1 keeps them as properties over private fields; older Pillow as plain attributes
        setattr(img, "_" + field if isinstance(getattr(PIL.Image.Image, field, None), property) else field, value)
    img.gputransforms_stand_in = True
    return img


def _is_pil_stand_in(x) -> bool:
    return isinstance(x, PIL.Image.Image) and getattr(x, "gputransforms_stand_in", False)


def _key(x) -> Optional[int]:
    """What a record knows a stand-in by: a tensor's storage address, a PIL stand-in's identity."""
    if isinstance(x, torch.Tensor):
        return x.data_ptr()
    return id(x) if _is_pil_stand_in(x) else None


def _shape(x) -> tuple:
    return (3, x.height, x.width) if isinstance(x, PIL.Image.Image) else tuple(x.shape)


# --- the record of one sample ---------------------------------------------------------------------------

#: the record of the sample this thread is recording (``_Record``; None when it records none)
_LOCAL = threading.local()

class _Record:
    """The functionals called on the stand-ins of one sample, by stand-in (its storage's address)."""

    def __init__(self, value: Optional[int] = None):
        self.ops: dict[int, list] = {}
        self.alive: list = []  # the stand-ins, so that no address is reused while the record lives
        self.value = value  # every stand-in's one value (None: left uninitialised)
        self.masks_in: Optional[set] = None  # with lazy masks: ids of the target's masks (``joint.record``)

    def stand_in(self, like, shape, dtype, ops: list):
        if isinstance(like, PIL.Image.Image):
            img = _pil_stand_in(shape[-2:])
            self.alive.append(img)
            self.ops[id(img)] = ops
            return img
        t = (torch.empty((), dtype=dtype) if self.value is None else torch.full((), self.value, dtype=dtype)).expand(
            *shape)
        self.alive.append(t)
        self.ops[t.data_ptr()] = ops
        return t.as_subclass(type(like)) if isinstance(like, (tv_tensors.Image, tv_tensors.Mask)) else t


@functools.lru_cache(maxsize=None)
def _signature(kernel) -> inspect.Signature:
    return inspect.signature(kernel)


@functools.lru_cache(maxsize=None)
def _parameters(kernel) -> Optional[tuple]:
    """The names and defaults (``inspect.Parameter.empty`` where there is none) of ``kernel``'s
    parameters after the image, where all of them may be passed by position or by name; else None."""
    params = list(_signature(kernel).parameters.values())[1:]
    if any(p.kind is not inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params):
        return None
    return tuple((p.name, p.default) for p in params)


def _bound(real, inpt, args, kwargs) -> dict:
    """The kernel's arguments after the image by name, its defaults filled in (what ``inspect``'s
    ``bind`` and ``apply_defaults`` give; they run, and raise as they do, for anything but a plain call)."""
    params = _parameters(real)
    if params is not None and len(args) <= len(params):
        out = {}
        for k, (name, default) in enumerate(params):
            if k < len(args):
                if name in kwargs:
                    break
                out[name] = args[k]
            elif name in kwargs:
                out[name] = kwargs[name]
            elif default is not inspect.Parameter.empty:
                out[name] = default
            else:
                break
        else:
            if all(name in out for name in kwargs):  # (else an argument it does not take)
                return out
    b = _signature(real).bind(inpt, *args, **kwargs)
    b.apply_defaults()
    out = dict(b.arguments)
    out.pop(next(iter(out)))  # the image
    return out


def _shape_after(name: str, shape: tuple, dtype, a: dict) -> tuple:
    lead, (h, w) = tuple(shape[:-2]), shape[-2:]
    if name in COLOUR_SLOTS or name in ("horizontal_flip", "vertical_flip", "normalize"):
        return shape, dtype
    if name == "to_dtype":
        return shape, a["dtype"]
    if name == "crop":
        return lead + (int(a["height"]), int(a["width"])), dtype
    if name == "pad":
        left, right, top, bottom = F._geometry._parse_pad_padding(a["padding"])
        return lead + (h + top + bottom, w + left + right), dtype
    if name == "resize":
        nh, nw = F._geometry._compute_resized_output_size((h, w), size=a["size"], max_size=a.get("max_size"))
        return lead + (nh, nw), dtype
    if name == "center_crop":
        ch, cw = F._geometry._center_crop_parse_output_size(a["output_size"])
        return lead + (ch, cw), dtype
    raise Unrecordable(name)


_KIND_CLASS = {"pil": PIL.Image.Image, "image": tv_tensors.Image, "tensor": torch.Tensor}


def recorded_op(functional, kind: str, shape: tuple, dtype, kwargs: dict) -> tuple:
    """What the recording kernel records for ``functional(stand-in, **kwargs)`` on a stand-in of ``kind``
    ("pil", "image", "tensor"), ``shape`` and ``dtype``: (the op, the shape and dtype after it). The
    bound arguments are those of the kernel torchvision registered for that type (``compiler.joint_chain``
    records a Compose in one pass with it)."""
    registered = _futils._KERNEL_REGISTRY[functional][_KIND_CLASS[kind]]
    registered = getattr(registered, "gputransforms_registered", registered)  # (swapped in: the one it wraps)
    name = functional.__name__
    a = _bound(getattr(registered, "__wrapped__", registered), None, (), kwargs)
    if kind == "pil":
        a = _as_pil_does(name, a, tuple(shape[-2:]))
    after, new_dtype = _shape_after(name, shape, dtype, a)
    return (name, a, tuple(shape[-2:])), after, new_dtype


def _as_pil_does(name: str, a: dict, size: tuple) -> dict:
    """A PIL kernel's arguments as it applies them to an image of ``size`` (h, w): it always antialiases a
    resize, and pads with the fill truncated to integers (``pil_fill``). A crop is PIL's ``Image.crop``, which
    refuses (and warns of) a crop of too many pixels as it refuses to open such a file
    (``Image.MAX_IMAGE_PIXELS``): so does its record."""
    if name == "resize":
        return dict(a, antialias=True)
    if name == "crop":
        PIL.Image._decompression_bomb_check((abs(int(round(a["width"]))), abs(int(round(a["height"])))))
    if name == "center_crop":  # (torchvision's PIL kernel pads an image smaller than the output first, and crops
        ch, cw = F._geometry._center_crop_parse_output_size(a["output_size"])  # only what is left over)
        if (max(ch, size[0]), max(cw, size[1])) != (ch, cw):
            PIL.Image._decompression_bomb_check((cw, ch))
    if name == "pad" and a.get("padding_mode", "constant") == "constant":
        return dict(a, fill=pil_fill(a["fill"]))
    return a


def pil_fill(fill):
    """What PIL's pad of an RGB image writes for ``fill``: one integer per channel, each truncated
    (torchvision's ``_parse_fill``); kept per fill of plain numbers (a pad a sample: 15 us each)."""
    seq = isinstance(fill, (list, tuple))
    values = tuple(fill) if seq else (fill,)
    if all(type(v) in (int, float) for v in values):
        return _pil_fill(type(fill), values if seq else fill)
    return _parse_pil_fill(fill)


@functools.lru_cache(maxsize=64)
def _pil_fill(kind: type, value):
    return _parse_pil_fill(kind(value) if kind in (list, tuple) else value)


def _parse_pil_fill(fill):
    from torchvision.transforms import _functional_pil as FP

    return FP._parse_fill(fill, _pil_stand_in((1, 1)), name="fill")["fill"]


#: per kind of image a joint transform is handed, something of its type (what ``_Record.stand_in`` copies)
_LIKE = {"image": lambda: tv_tensors.Image(torch.empty(1, 1)), "tensor": lambda: torch.empty(0),
         "pil": PIL.Image.Image}

#: what may be done to a stand-in besides its functionals: reading what it is, viewing it as another class
_SAFE = frozenset([torch.Tensor.data_ptr, torch.Tensor.as_subclass, torch.Tensor.numel, torch.Tensor.dim,
                   torch.Tensor.size, torch.Tensor.stride, torch.Tensor.element_size, torch.Tensor.is_contiguous,
                   torch.Tensor.is_floating_point, torch.Tensor.is_complex, torch.Tensor.__len__, torch.Tensor.__repr__,
                   torch.Tensor.__format__, torch.Tensor.requires_grad_] +
                  [getattr(torch.Tensor, name).__get__ for name in (
                      "shape", "ndim", "dtype", "device", "requires_grad", "is_cuda", "layout", "is_sparse")])


def _refuse(rec: _Record, func, args, kwargs, kinds) -> None:
    """Raise if ``func`` (not a safe one) is given a stand-in of ``rec``'s (an argument of one of ``kinds``):
    MaskUnrecordable for a mask's, Unrecordable for the image's."""
    kwargs = kwargs or {}
    if func in _SAFE or (func is torch.as_tensor and len(args) == 1 and kwargs.get("device") is None and
                         kwargs.get("dtype") in (None, getattr(args[0], "dtype", None))):
        return  # (as_tensor handing back the tensor itself: tv_tensors.Image(t) from F.to_image, say)
    for a in (*args, *kwargs.values()):
        for t in (a if isinstance(a, (list, tuple)) else (a,)):
            if isinstance(t, kinds):
                ops = rec.ops.get(t.data_ptr())
                if ops is not None:
                    name = getattr(func, "__name__", func)
                    if joint_masks.made(ops):
                        raise joint_masks.MaskUnrecordable(f"{name} on a mask")
                    raise Unrecordable(f"{name} on the image (it reads the pixels)")


class _PlainGuard(TorchFunctionMode):
    """The guard of ``joint._guarding`` for a stand-in that is a plain tensor (``joint.record``'s kind "tensor": the
    references' ``--backend tensor``), which has no ``__torch_function__`` of its own to guard: a mode, on
    while that sample is recorded (every torch call in the thread passes through it)."""

    def __init__(self, rec: _Record):
        super().__init__()
        self.rec = rec

    def __torch_function__(self, func, types, args=(), kwargs=None):
        _refuse(self.rec, func, args, kwargs, torch.Tensor)
        return func(*args, **(kwargs or {}))


def guarded(rec: _Record, image, users: bool = True):
    """While recording ``image`` (a stand-in of ``rec``'s) through code that may be the user's (``users``):
    ``_PlainGuard`` where it is a plain tensor (a ``tv_tensors`` stand-in is guarded by its class,
    ``joint._guarding``). Only then: the mode costs every torch call (the segmentation preset with ``--backend tensor``,
    one by one: 0.92 -> 1.28 ms a worker's sample), and torchvision's own classes do not read the pixels."""
    return _PlainGuard(rec) if users and type(image) is torch.Tensor else contextlib.nullcontext()
