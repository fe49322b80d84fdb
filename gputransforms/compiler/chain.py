"""What a transform chain is, before anything is lowered: its transforms in order (``flatten``), which
of them hand PIL images on as tensors (``TO_TENSOR``), which have tensor kernels with their PIL
meaning (``tensor_capable``), and which are a user's own code (``user_override``).

A user's subclass of a torchvision (or timm) transform that overrides one of the methods that carry
its behaviour is the user's transform, whatever its base: it runs as the user wrote it, on what
torchvision would hand it. Only a subclass whose behaviour is provably the stock one (it overrides
none of those methods: a new ``__init__`` default, an extra attribute) is lowered as its base.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

import torch
import torchvision.transforms as tv1
from torchvision.transforms import InterpolationMode
from torchvision.transforms import v2 as tv2

from .. import _compat
from ..errors import NotLowerable  # noqa: F401 - the compiler's answer for "no lowering", raised from here on


@dataclasses.dataclass(frozen=True)
class Op:
    """A backend-neutral record of one transform's arguments, as the DALI planner reads them."""

    kind: str
    args: dict
    source: Any  # the user's transform object


#: the methods that carry a transform's behaviour (v1: forward/get_params, v2: forward/transform/
#: make_params, older v2: _transform/_get_params); a subclass overriding one is the user's own transform
BEHAVIOUR = ("forward", "__call__", "get_params", "make_params", "_get_params", "transform", "_transform")

#: modules whose classes are stock transforms (what the registry and the tensor-capability rule know)
_STOCK_MODULES = ("torchvision.", "timm.")


def overridden(cls: type, base: type) -> Optional[str]:
    """The first behaviour method that ``cls`` defines differently from ``base``, or None."""
    for m in BEHAVIOUR:
        if getattr(cls, m, None) is not getattr(base, m, None):
            return m
    return None


def stock_base(cls: type) -> Optional[type]:
    """The nearest torchvision or timm class in ``cls``'s MRO (``cls`` itself when it is one)."""
    return next((c for c in cls.__mro__ if c.__module__.startswith(_STOCK_MODULES)), None)


def user_override(t) -> Optional[str]:
    """Why ``t`` is a user's own transform though it subclasses a stock one ("MyCrop overrides
    RandomResizedCrop.forward"), or None (a stock class, or a subclass with stock behaviour)."""
    cls = type(t)
    base = stock_base(cls)
    if base is None or base is cls:
        return None
    method = overridden(cls, base)
    return None if method is None else f"{cls.__name__} overrides {base.__name__}.{method}"


def _stock_compose(t) -> bool:
    return isinstance(t, (tv1.Compose, tv2.Compose)) and user_override(t) is None


def steps_of(t) -> Optional[list]:
    """The steps a container runs one after the other on one input: a stock Compose's, or a
    ``torch.nn.Sequential``'s (that class exactly, without hooks: torchvision's docs chain scriptable
    transforms so; on one input it runs its modules as Compose does); None for anything else."""
    if _stock_compose(t):
        return list(t.transforms)
    if type(t) is torch.nn.Sequential and not (t._forward_hooks or t._forward_pre_hooks):
        return list(t)
    return None


def flatten_clips(transform) -> list:
    """``flatten`` for a chain given a clip's (T, C, H, W) frames: torchvision's ``VideoClassification`` as its steps
    too (on an image it raises in torchvision, so an image chain leaves it as written)."""
    out = []
    for t in flatten(transform):
        out.extend(video_preprocessing(t) if type(t) is _video_preset() else [t])
    return out


def flatten(transform) -> list:
    """The chain's transforms in order: Compose (ours, torchvision's v1 and v2) and the reference
    presets' wrappers opened, torchvision's model preprocessing (``weights.transforms()``) as its steps,
    Identity and ToPureTensor dropped."""
    if transform is None:
        return []
    steps = steps_of(transform)
    if steps is not None:
        out = []
        for t in steps:
            out.extend(flatten(t))
        return out
    if isinstance(transform, (tv2.Identity, tv2.ToPureTensor)) and user_override(transform) is None:
        return []  # ToPureTensor only unwraps tv_tensors: our batches are plain tensors already
    if type(transform) in model_presets():
        return model_preprocessing(transform)
    if type(transform).__name__ in PRESET_WRAPPERS and isinstance(getattr(transform, "transforms", None),
                                                                  (tv1.Compose, tv2.Compose)):
        return flatten(transform.transforms)
    return [transform]


def model_presets() -> tuple:
    """torchvision's model preprocessing classes for images (what ``weights.transforms()`` gives)."""
    from torchvision.transforms import _presets

    return (_presets.ImageClassification, _presets.SemanticSegmentation, _presets.ObjectDetection)


def model_preprocessing(t) -> list:
    """torchvision's model preprocessing (``weights.transforms()``) as the steps its ``forward`` calls, the same
    functionals in the same order, so the same meaning:

    - ``ImageClassification`` (every classification model: the eval preprocessing of torchvision's model docs
      and of the classification reference's ``--test-only --weights``): ``resize`` to ``resize_size`` with its
      interpolation and antialias, ``center_crop``, ``pil_to_tensor`` where the image is a PIL image (v2's
      ``PILToTensor`` leaves a tensor as it is, as that ``forward`` does), ``convert_image_dtype`` to float and
      ``normalize``;
    - ``SemanticSegmentation``: the same without the crop (and without the resize where ``resize_size`` is None);
    - ``ObjectDetection`` (the detection reference's ``--test-only --weights``): ``pil_to_tensor`` where the image
      is a PIL image, ``convert_image_dtype`` to float."""
    import torch
    from torchvision.transforms import _presets

    to_float = [tv2.PILToTensor(), tv2.ToDtype(torch.float32, scale=True)]
    if type(t) is _presets.ObjectDetection:
        return to_float
    resize = [] if t.resize_size is None else \
        [tv2.Resize(t.resize_size, interpolation=t.interpolation, antialias=t.antialias)]
    crop = [tv2.CenterCrop(t.crop_size)] if type(t) is _presets.ImageClassification else []
    return resize + crop + to_float + [tv2.Normalize(mean=t.mean, std=t.std)]


def _video_preset() -> type:
    from torchvision.transforms import _presets

    return _presets.VideoClassification


class ConvertBCHWtoCBHW(tv1.Lambda):
    """A clip's (T, C, H, W) frames as (C, T, H, W): the last step of ``VideoClassification``'s ``forward``, by the
    name torchvision's video classification reference gives its own class for it (the tail does it for the batch
    of clips: ``stages.after_graph``)."""

    def __init__(self):
        super().__init__(_cbhw)


def _cbhw(vid):
    return vid.permute(1, 0, 2, 3)


def video_preprocessing(t) -> list:
    """torchvision's ``VideoClassification`` (``weights.transforms()`` of its video models: R3D, MC3, R(2+1)D, S3D,
    MViT, Swin3D) as the steps its ``forward`` calls on a clip's (T, C, H, W) uint8 frames: ``resize`` without
    antialiasing, ``center_crop``, ``convert_image_dtype`` to float, ``normalize``, then (T, C, H, W) -> (C, T, H,
    W)."""
    import torch

    return [tv2.Resize(t.resize_size, interpolation=t.interpolation, antialias=False), tv2.CenterCrop(t.crop_size),
            tv2.ToDtype(torch.float32, scale=True), tv2.Normalize(mean=t.mean, std=t.std), ConvertBCHWtoCBHW()]


#: torchvision's classification references wrap a Compose in a class whose __call__ is
#: ``self.transforms(img)`` (references/classification/presets.py); users copy those classes.
PRESET_WRAPPERS = {"ClassificationPresetTrain", "ClassificationPresetEval", "VideoClassificationPresetTrain",
                   "VideoClassificationPresetEval"}

#: the conversions that end the PIL part of a chain
TO_TENSOR = (tv1.ToTensor, tv2.ToTensor, tv1.PILToTensor, tv2.PILToTensor, tv2.ToImage)

#: torchvision v1 transforms whose tensor kernels mean what their PIL kernels mean (torchvision
#: tests the two against each other); every v2 transform is, but the ones listed in _NOT_TENSOR.
TENSOR_CAPABLE_V1 = (
    tv1.ColorJitter, tv1.Grayscale, tv1.RandomGrayscale, tv1.GaussianBlur, tv1.RandomRotation, tv1.RandomAffine,
    tv1.RandomPerspective, tv1.Pad, tv1.RandomErasing, tv1.RandomInvert, tv1.RandomPosterize, tv1.RandomSolarize,
    tv1.RandomAdjustSharpness, tv1.RandomAutocontrast, tv1.RandomEqualize, tv1.AutoAugment, tv1.RandAugment,
    tv1.TrivialAugmentWide, tv1.AugMix, tv1.Resize, tv1.CenterCrop, tv1.RandomCrop, tv1.RandomResizedCrop,
    tv1.RandomHorizontalFlip, tv1.RandomVerticalFlip, tv1.Normalize, tv1.ConvertImageDtype, tv1.LinearTransformation,
    tv1.ElasticTransform,
)
_NOT_TENSOR = (tv2.ToPILImage, tv2.Lambda, tv2.FiveCrop, tv2.TenCrop)
_CONTAINERS = (tv1.RandomApply, tv1.RandomChoice, tv1.RandomOrder, tv1.Compose, tv2.RandomApply, tv2.RandomChoice,
               tv2.RandomOrder, tv2.Compose)
#: transforms whose tensor kernels warp with nearest and bilinear only (PIL's take more)
_WARPS = (tv1.RandomRotation, tv1.RandomAffine, tv1.RandomPerspective, tv2.RandomRotation, tv2.RandomAffine,
          tv2.RandomPerspective, tv1.AutoAugment, tv1.RandAugment, tv1.TrivialAugmentWide, tv1.AugMix,
          tv2.AutoAugment, tv2.RandAugment, tv2.TrivialAugmentWide, tv2.AugMix)


#: PIL's resampling filters that torchvision's tensor kernels do not have (they raise NotImplementedError)
_PIL_ONLY_FILTERS = (InterpolationMode.BOX, InterpolationMode.HAMMING)


def _pil_only_filter(interpolation) -> bool:
    if not isinstance(interpolation, (InterpolationMode, str, int)):
        return False  # (none, or timm's random choice of filters)
    try:
        return _compat.interpolation_mode(interpolation) in _PIL_ONLY_FILTERS
    except (ValueError, KeyError, TypeError):
        return False


def tensor_capable(t) -> bool:
    """Whether ``t`` means on a uint8 CHW tensor what it means on the PIL image torchvision hands it.
    A user's own subclass never is: it gets the PIL image it was written for."""
    if user_override(t) is not None:
        return False
    if isinstance(t, _CONTAINERS):
        return all(tensor_capable(c) for c in t.transforms)
    if isinstance(t, _WARPS) and _compat.interpolation_mode(t.interpolation) not in (
            InterpolationMode.NEAREST, InterpolationMode.BILINEAR):
        return False  # torchvision's tensor warps take nearest and bilinear only; PIL's take more
    if _pil_only_filter(getattr(t, "interpolation", None)):
        return False  # a resize with PIL's box or Hamming filter: torchvision's tensor kernels raise on them
    if isinstance(t, tv2.Transform):
        return not isinstance(t, _NOT_TENSOR)
    if isinstance(t, tv1.Pad) and not isinstance(t.fill, (int, float)):
        return False  # v1's tensor pad takes one number as fill; PIL's takes a colour
    return isinstance(t, TENSOR_CAPABLE_V1)


#: conversions by what they make of each kind of image (v2's ToTensor and PILToTensor pass a tv_tensors.Image
#: through as it is; v1's raise on anything but their own input, which the chain would not run to)
_MAKES = ((tv2.ToImage, {"pil": "tv_image", "tensor": "tv_image", "tv_image": "tv_image"}),
          (tv2.ToPureTensor, {"pil": "pil", "tensor": "tensor", "tv_image": "tensor"}),
          ((tv2.ToTensor, tv2.PILToTensor), {"pil": "tensor", "tensor": "tensor", "tv_image": "tv_image"}),
          ((tv1.ToTensor, tv1.PILToTensor), {"pil": "tensor", "tensor": "tensor"}),
          ((tv1.ToPILImage, tv2.ToPILImage), {"pil": "pil", "tensor": "pil", "tv_image": "pil"}))


def output_kind(transform, start: str = "pil") -> Optional[str]:
    """What torchvision's ``transform`` hands out for an image given as ``start``: "pil", "tensor" (a plain
    tensor) or "tv_image" (a ``tv_tensors.Image``; tuples of them from FiveCrop/TenCrop), or None where code of
    the user's or a random draw decides (a Lambda, a user's class, a v1 transform on a ``tv_tensors.Image``,
    a container whose branches end differently). The loader's items follow it where it is known: our stages
    run on plain tensors standing in for both PIL images and tv_tensors."""
    from torchvision.transforms import _presets

    kind: Optional[str] = start
    if transform is None:
        return kind
    steps = steps_of(transform)
    if steps is not None:
        for t in steps:
            kind = output_kind(t, kind)  # (None on: a later ToImage or ToPILImage still decides)
        return kind
    if type(transform).__name__ in PRESET_WRAPPERS and isinstance(getattr(transform, "transforms", None),
                                                                  (tv1.Compose, tv2.Compose)):
        return output_kind(transform.transforms, start)
    if type(transform) in model_presets() + (_presets.VideoClassification,):
        return "tensor"  # (their forwards call v1 functionals, which hand plain tensors on)
    if user_override(transform) is not None or isinstance(transform, (tv1.Lambda, tv2.Lambda)):
        return None
    for classes, makes in _MAKES:
        if isinstance(transform, classes):
            if start is None:  # what came before is not known: known after only where every input ends alike
                return next(iter(makes.values())) if len(set(makes.values())) == 1 else None
            return makes.get(start)
    if start is None:
        return None
    if isinstance(transform, _CONTAINERS):  # every branch must end where it began (or the draw decides)
        inner = list(transform.transforms) if isinstance(transform.transforms, (list, tuple, torch.nn.ModuleList)) \
            else [transform.transforms]
        return start if all(output_kind(c, start) == start for c in inner) else None
    if isinstance(transform, tv2.Transform):
        return start  # v2 keeps each input's type
    if type(transform).__module__.startswith("torchvision.transforms."):
        return start if start != "tv_image" else None  # v1 on a tv_tensor: plain tensors, or the input as it is
    return None


def kinds_before(transform, start: str = "pil") -> dict:
    """``id`` of each step ``flatten(transform)`` gives -> what torchvision's chain hands that step ("pil",
    "tensor", "tv_image", or None where it is not known: ``output_kind``). A step met twice with different
    inputs is None. Steps that ``flatten`` makes anew (model preprocessing) are not in it."""
    out: dict = {}

    def walk(t, kind):
        if t is None:
            return kind
        steps = steps_of(t)
        if steps is not None:
            for c in steps:
                kind = walk(c, kind)
            return kind
        if isinstance(t, (tv2.Identity, tv2.ToPureTensor)) and user_override(t) is None:
            return output_kind(t, kind)  # (flatten drops them; ToPureTensor still unwraps a tv_tensor)
        if type(t) in model_presets():
            return "tensor"
        if type(t).__name__ in PRESET_WRAPPERS and isinstance(getattr(t, "transforms", None),
                                                           (tv1.Compose, tv2.Compose)):
            return walk(t.transforms, kind)
        out[id(t)] = kind if out.get(id(t), kind) == kind else None
        return output_kind(t, kind)

    walk(transform, start)
    return out
