"""The one table: for each torchvision (v1 and v2) and timm transform class, every lowering it has.

An ``Entry`` says, for one class:

- ``dali``: its DALI lowering (``lowerings``: the transform -> an ``Op`` the planner fuses into the graph);
- ``batched``: its batched kernel (``batched``: the transform -> a function of a whole (N, C, H, W)
  batch on the device with torchvision's per-sample meaning), used after the graph and for in-memory data;
- ``vectorized``: its draw-ahead form (``vectorized``: the batch's parameters drawn on the CPU, applied
  on the device), used for in-memory data and, with ``graph``, inside a CUDA graph;
- ``graph``: how a deterministic stage enters a CUDA graph of an in-memory chain ("normalize", "dtype");
- ``joint``: it may take part in a joint transform compiled by recording (``joint``: it runs as written on
  a stand-in image and the real target, and the image functionals it calls are ones the joint graph does);
- ``draw``: while recorded, its ``make_params`` is this exact, faster form of torchvision's own
  (``joint_draws``: the same RNG calls, the same result);
- ``forward``: while recorded, its ``forward`` is this exact, faster form of torchvision's own
  (``joint_forward``: the same steps on an (image, target dict) pair without the pytree);
- ``chain``: its step in the one pass a v2 ``Compose`` of such steps is recorded in (``joint_chain``:
  its forward restated on the sample's record and its boxes as NumPy; ``Compose``'s ``forward`` entry);
- ``vector``: its step over a worker's chunk of samples recorded at once, each sample's draws from its own
  seed (``joint_vector``: the parameters of the whole chunk at once, its boxes as one NumPy array).

A class is looked up by its exact type. A user's subclass gets its base's entry only where its
behaviour is provably the base's (``chain.user_override``: it overrides none of forward, __call__,
get_params, make_params, transform, ...); otherwise it has none, and runs as the user wrote it.
timm's classes join the table on the first lookup after timm's transforms were imported: neither
importing gputransforms nor planning a chain without timm imports timm.
"""
from __future__ import annotations

import dataclasses
import sys
from typing import Callable, Optional

import torch
import torchvision.transforms as tv1
import torchvision.transforms.functional as F1
from torchvision.transforms import v2 as tv2
from torchvision.transforms.v2 import functional as F2

from . import batched, joint_chain, joint_draws, joint_forward, joint_vector, lowerings, vectorized
from .chain import NotLowerable, Op, model_preprocessing, model_presets, overridden, steps_of, user_override


@dataclasses.dataclass(frozen=True)
class Entry:
    dali: Optional[Callable[[object], Op]] = None
    batched: Optional[Callable[[object], Optional[batched.Batched]]] = None
    vectorized: Optional[Callable[[object], Optional[vectorized.Vectorized]]] = None
    graph: Optional[str] = None
    joint: bool = False
    draw: Optional[Callable[[Callable], Callable]] = None
    forward: Optional[Callable[[Callable], Callable]] = None
    chain: Optional[Callable] = None
    vector: Optional[joint_vector.Vector] = None


REGISTRY: dict[type, Entry] = {}


def register(classes: tuple, **lowerings_of_the_class) -> None:
    for cls in classes:
        REGISTRY[cls] = Entry(**lowerings_of_the_class)


def _register_random_p(v1: type, v2: type, v1_kernel, v2_kernel=None, **more) -> None:
    register((v1,), batched=batched.lower_random_p(v1_kernel), **more)
    register((v2,), batched=batched.lower_random_p(v2_kernel or v1_kernel), **more)


# --- the DALI graph's transforms (and their batched forms, for after the graph) ---------------------
register((tv1.TrivialAugmentWide, tv2.TrivialAugmentWide), dali=lowerings.trivial_augment_wide)
register((tv1.RandAugment, tv2.RandAugment), dali=lowerings.rand_augment)
register((tv1.AutoAugment, tv2.AutoAugment), dali=lowerings.auto_augment)
register((tv1.RandomResizedCrop, tv2.RandomResizedCrop), dali=lowerings.random_resized_crop)
register((tv1.Resize, tv2.Resize), dali=lowerings.resize, batched=batched.lower_deterministic)
register((tv1.CenterCrop, tv2.CenterCrop), dali=lowerings.center_crop, batched=batched.lower_deterministic)
register((tv1.RandomCrop, tv2.RandomCrop), dali=lowerings.random_crop, vectorized=vectorized.lower_random_crop)
_register_random_p(tv1.RandomHorizontalFlip, tv2.RandomHorizontalFlip, lambda t, y: F1.hflip(y),
                   lambda t, y: F2.horizontal_flip(y), dali=lowerings.flip(True), vectorized=vectorized.lower_flip(-1))
_register_random_p(tv1.RandomVerticalFlip, tv2.RandomVerticalFlip, lambda t, y: F1.vflip(y),
                   lambda t, y: F2.vertical_flip(y), dali=lowerings.flip(False), vectorized=vectorized.lower_flip(-2))
register((tv1.ToTensor, tv2.ToTensor), dali=lowerings.to_float_tensor)
register((tv1.PILToTensor, tv2.PILToTensor, tv2.ToImage), dali=lowerings.to_uint8_tensor)
register((tv1.ConvertImageDtype, tv2.ConvertImageDtype), dali=lowerings.convert_image_dtype,
         batched=batched.lower_deterministic, graph="dtype")
register((tv2.ToDtype,), dali=lowerings.to_dtype, batched=batched.lower_deterministic, graph="dtype")
register((tv1.Normalize, tv2.Normalize), dali=lowerings.normalize, batched=batched.lower_normalize, graph="normalize")

# --- batched after the graph ------------------------------------------------------------------------
register((tv1.ColorJitter, tv2.ColorJitter), batched=batched.lower_color_jitter)
register((tv1.GaussianBlur, tv2.GaussianBlur), batched=batched.lower_gaussian_blur)
register((tv1.RandomRotation, tv2.RandomRotation), batched=batched.lower_random_rotation)
register((tv1.RandomAffine, tv2.RandomAffine), batched=batched.lower_random_affine)
register((tv1.RandomPerspective, tv2.RandomPerspective), batched=batched.lower_random_perspective)
register((tv1.RandomErasing, tv2.RandomErasing), batched=batched.lower_random_erasing)
register((tv1.Grayscale, tv2.Grayscale), batched=batched.lower_deterministic)
register((tv1.Pad, tv2.Pad), batched=batched.lower_deterministic)
_register_random_p(tv1.RandomInvert, tv2.RandomInvert, lambda t, y: F1.invert(y), lambda t, y: F2.invert(y))
_register_random_p(tv1.RandomPosterize, tv2.RandomPosterize, lambda t, y: F1.posterize(y, t.bits),
                   lambda t, y: F2.posterize(y, t.bits))
_register_random_p(tv1.RandomSolarize, tv2.RandomSolarize, lambda t, y: F1.solarize(y, t.threshold),
                   lambda t, y: F2.solarize(y, t.threshold))
_register_random_p(tv1.RandomAdjustSharpness, tv2.RandomAdjustSharpness,
                   lambda t, y: F1.adjust_sharpness(y, t.sharpness_factor),
                   lambda t, y: F2.adjust_sharpness(y, t.sharpness_factor))
_register_random_p(tv1.RandomAutocontrast, tv2.RandomAutocontrast, lambda t, y: F1.autocontrast(y),
                   lambda t, y: F2.autocontrast(y))
# v2's equalize is vectorised over the batch; v1's loops over images; equal results (tests)
_register_random_p(tv1.RandomEqualize, tv2.RandomEqualize, lambda t, y: F2.equalize(y))
_register_random_p(tv1.RandomGrayscale, tv2.RandomGrayscale, lambda t, y: F1.rgb_to_grayscale(y, y.shape[-3]),
                   lambda t, y: F2.rgb_to_grayscale(y, y.shape[-3]))


_timm_registered = False


def _register_timm() -> None:
    """timm's entries, on the first lookup after timm's transforms were imported: a timm object can
    only exist then (its module imports ``timm.data``). Importing timm here instead cost every loader
    of a chain without timm 1.1 s on the H100 host (timm imports huggingface_hub and its models)."""
    global _timm_registered
    if _timm_registered or "timm.data" not in sys.modules:
        return
    _timm_registered = True
    try:
        from timm.data.auto_augment import AutoAugment, RandAugment
        from timm.data.random_erasing import RandomErasing
        from timm.data import transforms as timm_transforms
    except ImportError:  # timm.data half-imported or an unexpected layout: no timm entries
        return
    register((timm_transforms.RandomResizedCropAndInterpolation,), dali=lowerings.timm_random_resized_crop)
    register((RandAugment, AutoAugment), dali=lowerings.timm_auto_augment)
    register((RandomErasing,), batched=batched.lower_timm_random_erasing)
    # timm's Maybe* (timm >= 1.0) override __call__ only to pass a tensor through: on the PIL images
    # the graph stands for they are torchvision's conversions
    for name, stock in (("MaybeToTensor", tv1.ToTensor), ("MaybePILToTensor", tv1.PILToTensor)):
        if hasattr(timm_transforms, name):
            REGISTRY[getattr(timm_transforms, name)] = REGISTRY[stock]


def lookup(t) -> Optional[Entry]:
    """``t``'s entry: its exact class's, or its stock base's where ``t``'s behaviour is the base's."""
    _register_timm()
    cls = type(t)
    entry = REGISTRY.get(cls)
    if entry is not None:
        return entry
    for base in cls.__mro__[1:]:
        entry = REGISTRY.get(base)
        if entry is not None:
            return None if overridden(cls, base) else entry
    return None


def dali_op(t) -> Op:
    """``t``'s DALI lowering, or ``NotLowerable`` saying why there is none."""
    entry = lookup(t)
    if entry is None or entry.dali is None:
        why = user_override(t)
        if why:
            raise NotLowerable(f"{why}: runs as written", "to compile it, use torchvision's class itself (a subclass "
                               "that only changes __init__ arguments compiles)")
        raise NotLowerable(f"{type(t).__name__}: no DALI lowering", "it runs after the graph, batched on the device "
                           "where it has a batched kernel, else per sample; put it last in the chain to keep the "
                           "rest in the graph")
    return entry.dali(t)


def batched_of(t) -> Optional[batched.Batched]:
    """``t`` as a function of a (N,C,H,W) batch with torchvision's per-sample meaning, or None. The
    function may write into the batch it is given (RandomErasing does): the stage owns its batch."""
    entry = lookup(t)
    return entry.batched(t) if entry is not None and entry.batched is not None else None


def vectorized_of(t) -> Optional[vectorized.Vectorized]:
    entry = lookup(t)
    return entry.vectorized(t) if entry is not None and entry.vectorized is not None else None


def graph_kind(t) -> Optional[str]:
    """How a deterministic batched stage enters a CUDA graph ("normalize", "dtype"), or None."""
    entry = lookup(t)
    if entry is None or entry.graph is None:
        return None
    if entry.graph == "normalize" and t.inplace:
        return None
    return entry.graph


# containers: their members lowered through this same table
register((tv1.RandomApply, tv2.RandomApply), batched=lambda t: batched.lower_random_apply(t, batched_of))
register((tv1.RandomChoice, tv2.RandomChoice), batched=lambda t: batched.lower_random_choice(t, batched_of))
register((tv1.RandomOrder, tv2.RandomOrder), batched=lambda t: batched.lower_random_order(t, batched_of))
register((tv1.Compose, tv2.Compose), batched=lambda t: batched.sequence(t.transforms, batched_of))
register((torch.nn.Sequential,), batched=lambda t: batched.sequence(steps_of(t), batched_of) if steps_of(t) else None)


# --- joint transforms (image and tv_tensor targets), recorded: compiler/joint.py --------------------------
def _allow_joint(classes: tuple) -> None:
    for cls in classes:
        REGISTRY[cls] = dataclasses.replace(REGISTRY.get(cls, Entry()), joint=True,
                                            forward=joint_forward.form_of(cls))


_allow_joint((tv2.ToImage, tv2.PILToTensor, tv2.RandomPhotometricDistort, tv2.RandomZoomOut, tv2.RandomIoUCrop,
              tv2.RandomHorizontalFlip, tv2.RandomVerticalFlip, tv2.ScaleJitter,
              tv2.RandomShortestSize, tv2.RandomResize, tv2.Resize, tv2.RandomCrop, tv2.CenterCrop, tv2.Pad,
              tv2.ToDtype, tv2.ConvertImageDtype, tv2.Normalize, tv2.ConvertBoundingBoxFormat, tv2.ClampBoundingBoxes,
              tv2.SanitizeBoundingBoxes, tv2.ToPureTensor, tv2.Compose))


REGISTRY[tv2.RandomIoUCrop] = dataclasses.replace(REGISTRY[tv2.RandomIoUCrop], draw=joint_draws.random_iou_crop)
REGISTRY[tv2.ScaleJitter] = dataclasses.replace(REGISTRY[tv2.ScaleJitter], draw=joint_draws.scale_jitter)
for _cls, _step in joint_chain.steps().items():
    REGISTRY[_cls] = dataclasses.replace(REGISTRY[_cls], chain=_step)
for _cls, _vec in joint_vector.steps().items():
    REGISTRY[_cls] = dataclasses.replace(REGISTRY[_cls], vector=_vec)


# torchvision's model preprocessing (``weights.transforms()``) inside a joint transform of the user's: recorded as the
# steps its forward calls (a classification chain opens it into those steps: ``chain.flatten``)
for _cls in model_presets():
    REGISTRY[_cls] = Entry(joint=True, forward=joint_forward.model_preset(model_preprocessing))


def chain_of(cls: type) -> Optional[Callable]:
    """A class's step in a Compose recorded in one pass (its exact class's entry: a subclass has none)."""
    entry = REGISTRY.get(cls)
    return entry.chain if entry is not None else None


def vector_of(cls: type) -> Optional[joint_vector.Vector]:
    """A class's step over a chunk of samples recorded at once (its exact class's entry)."""
    entry = REGISTRY.get(cls)
    return entry.vector if entry is not None else None


REGISTRY[tv2.Compose] = dataclasses.replace(
    REGISTRY[tv2.Compose], forward=lambda original: joint_chain.compose(original, chain_of))


def draws() -> list:
    """(class, its ``draw``) for every class that has one (``joint.recording`` swaps them in)."""
    return [(cls, entry.draw) for cls, entry in REGISTRY.items() if entry.draw is not None]


def forwards() -> list:
    """(class, its ``forward``) for every class that has one (``joint.recording`` swaps them in)."""
    return [(cls, entry.forward) for cls, entry in REGISTRY.items() if entry.forward is not None]


def joint_ok(t) -> bool:
    """Whether ``t`` may take part in a recorded joint transform (its class's entry, as ``lookup`` finds it)."""
    entry = lookup(t)
    return entry is not None and entry.joint
