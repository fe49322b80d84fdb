"""Each transform's DALI lowering: the transform's own attributes (v1 and v2 alike, and timm's) read
into an ``Op``, the backend-neutral record the planner fuses and ``compiler.dali`` turns into
operators. A function here raises ``NotLowerable`` where DALI has no operator with torchvision's
meaning for those arguments (the transform then runs after the graph). Which class uses which
function is the registry's (``compiler.registry``).
"""
from __future__ import annotations

from typing import Any, Callable

import torch
from torchvision.transforms import InterpolationMode

from .. import _compat
from . import timm_augment
from .chain import NotLowerable, Op


#: Interpolation modes whose DALI filter matches torchvision's (PIL's) result; the others
#: (BOX, HAMMING, NEAREST_EXACT) have no DALI equivalent and run per sample.
DALI_INTERPOLATION = {
    InterpolationMode.NEAREST: "INTERP_NN",
    InterpolationMode.BILINEAR: "INTERP_LINEAR",
    InterpolationMode.BICUBIC: "INTERP_CUBIC",
    InterpolationMode.LANCZOS: "INTERP_LANCZOS3",
}


def _interp(t) -> str:
    mode = _compat.interpolation_mode(t.interpolation)
    if mode not in DALI_INTERPOLATION:
        raise NotLowerable(f"{type(t).__name__}: interpolation {mode.value!r} has no DALI equivalent",
                           "to compile it, use InterpolationMode.BILINEAR, BICUBIC, NEAREST or LANCZOS")
    return DALI_INTERPOLATION[mode]


def random_resized_crop(t) -> Op:
    return Op("random_resized_crop", dict(size=tuple(t.size), scale=tuple(t.scale), ratio=tuple(t.ratio),
                                          interp=_interp(t), antialias=t.antialias), t)


def resize(t) -> Op:
    size = t.size
    if size is not None:
        size = (size,) if isinstance(size, int) else tuple(size)
    if size is not None and len(size) == 2:
        target = ("exact", size)
    elif size is None:
        target = ("longer", t.max_size)
    else:
        target = ("shorter", size[0], t.max_size)
    return Op("resize", dict(target=target, interp=_interp(t), antialias=t.antialias), t)


def center_crop(t) -> Op:
    return Op("crop", dict(mode="center", size=tuple(t.size), padding=(0, 0, 0, 0), pad_if_needed=True,
                           fill=(0.0, 0.0, 0.0)), t)


def random_crop(t) -> Op:
    padding = _compat.padding_ltrb(t)
    if (any(padding) or t.pad_if_needed) and t.padding_mode != "constant":
        raise NotLowerable(f"RandomCrop: padding_mode={t.padding_mode!r} (only 'constant' is lowered)",
                           "to compile it, use padding_mode='constant' (the default)")
    fill = _compat.constant_fill(t)
    if fill is None:
        raise NotLowerable("RandomCrop: fill given per input type",
                           "to compile it, give one fill for every input (a number or a tuple)")
    return Op("crop", dict(mode="random", size=tuple(t.size), padding=padding, pad_if_needed=bool(t.pad_if_needed),
                           fill=fill), t)


def flip(horizontal: bool) -> Callable[[Any], Op]:
    return lambda t: Op("flip", dict(horizontal=horizontal, p=float(t.p)), t)


def to_float_tensor(t) -> Op:
    return Op("to_tensor", dict(dtype=torch.float32, scale=True), t)


def to_uint8_tensor(t) -> Op:
    return Op("to_tensor", dict(dtype=torch.uint8, scale=False), t)


def convert_image_dtype(t) -> Op:
    return Op("to_dtype", dict(dtype=t.dtype, scale=True), t)


def to_dtype(t) -> Op:
    dtype = t.dtype
    if isinstance(dtype, dict):
        from torchvision import tv_tensors

        dtype = dtype.get(tv_tensors.Image, dtype.get("others"))
        if dtype is None:
            raise NotLowerable("ToDtype: no dtype given for images",
                               "to compile it, give a dtype for tv_tensors.Image or for 'others'")
    return Op("to_dtype", dict(dtype=dtype, scale=bool(t.scale)), t)


def normalize(t) -> Op:
    # ``inplace`` only matters for aliasing, which a freshly decoded batch never has
    return Op("normalize", dict(mean=tuple(float(m) for m in t.mean), std=tuple(float(s) for s in t.std)), t)


def _auto_augment_args(t) -> dict:
    """Interpolation and fill of torchvision's automatic augmentations, as DALI's warps take them."""
    name = type(t).__name__
    mode = _compat.interpolation_mode(t.interpolation)
    if mode not in (InterpolationMode.NEAREST, InterpolationMode.BILINEAR):
        raise NotLowerable(f"{name}: interpolation {mode.value!r} (DALI's warps: nearest, bilinear)",
                           "to compile it, use InterpolationMode.BILINEAR or NEAREST")
    fill = t.fill
    if isinstance(fill, dict):
        raise NotLowerable(f"{name}: fill given per input type",
                           "to compile it, give one fill for every input (a number or a tuple)")
    if isinstance(fill, (list, tuple)):
        if len(set(fill)) != 1:
            raise NotLowerable(f"{name}: a per-channel fill", "to compile it, fill every channel with one value")
        fill = fill[0]
    return dict(interp=DALI_INTERPOLATION[mode], fill=0 if fill is None else int(fill))


def trivial_augment_wide(t) -> Op:
    return Op("auto_augment", dict(policy="trivial_augment_wide", num_magnitude_bins=int(t.num_magnitude_bins),
                                   **_auto_augment_args(t)), t)


def auto_augment(t) -> Op:
    # torchvision's AutoAugment draws magnitudes from 10 bins of RandAugment's ranges
    return Op("auto_augment", dict(policy="auto_augment", sub_policies=_compat.auto_augment_policies(t),
                                   num_magnitude_bins=10, **_auto_augment_args(t)), t)


def rand_augment(t) -> Op:
    return Op("auto_augment", dict(policy="rand_augment", num_ops=int(t.num_ops), magnitude=int(t.magnitude),
                                   num_magnitude_bins=int(t.num_magnitude_bins), **_auto_augment_args(t)), t)


def timm_random_resized_crop(t) -> Op:
    """timm's RandomResizedCropAndInterpolation: torchvision's sampling rule (drawn with Python's
    ``random``), on PIL images; ``interpolation='random'`` (timm's train.py default) picks a filter
    per sample, uniformly from a tuple (bilinear, bicubic): ``interp`` is then the tuple of DALI's
    filters, one drawn per sample in the graph."""
    if isinstance(t.interpolation, (list, tuple)):
        modes = [_compat.interpolation_mode(m) for m in t.interpolation]
        missing = [m.value for m in modes if m not in DALI_INTERPOLATION]
        if missing or not modes:
            raise NotLowerable(f"RandomResizedCropAndInterpolation: interpolation {missing} has no DALI equivalent",
                               "to compile it, use interpolation 'bilinear', 'bicubic' or 'random'")
        interp = tuple(DALI_INTERPOLATION[m] for m in modes)
    else:
        interp = _interp(t)
    return Op("random_resized_crop", dict(size=tuple(t.size), scale=tuple(t.scale), ratio=tuple(t.ratio),
                                          interp=interp, antialias=True), t)


def timm_auto_augment(t) -> Op:
    return Op("auto_augment", timm_augment.describe(t), t)


