"""Compose -> Plan: decide, from the transforms' own attributes and before anything runs, which
part of a chain becomes one DALI graph, which operations fuse, and what is left to run per sample.

Three layers, one direction:
  1. ``LOWERINGS`` -- the one table from torchvision classes (v1 and v2; ours are the same classes)
     to an ``Op``: a backend-neutral record of the user's arguments.
  2. ``plan()`` -- walks the ops and emits ``Step``s, the operations of the DALI graph, fusing as it
     goes (RandomResizedCrop into decode; crop + flip + ToTensor/dtype + Normalize + HWC->CHW into
     one crop_mirror_normalize).
  3. ``compiler.dali`` turns steps into DALI operators; ``compiler.tail`` runs the rest after the graph
     (``compiler.batched`` on whole batches where it can, else per sample).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Optional

import torch
import torchvision.transforms as tv1
from torchvision.transforms import InterpolationMode
from torchvision.transforms import v2 as tv2

from .. import _compat
from ..device import default_device


class NotLowerable(Exception):
    """The transform has no DALI lowering with torchvision's meaning; it runs per sample."""


@dataclasses.dataclass(frozen=True)
class Op:
    kind: str
    args: dict
    source: Any  # the user's transform object


@dataclasses.dataclass
class Step:
    """One operator of the compiled graph."""

    op: str  # decode | video_decode | resize | random_resized_crop | slice | flip | crop_mirror_normalize
    args: dict
    sources: list
    note: str = ""


@dataclasses.dataclass
class Plan:
    steps: list  # list[Step], steps[0] is always the decode
    tail: list  # transforms run per sample with torchvision after the graph
    tail_reason: str
    output: str  # "tensor" (CHW), "image" (HWC uint8, what PIL would hold) or "video" (clips: FCHW or FHWC)
    out_dtype: torch.dtype
    compiled: bool  # False: the graph would only decode; the whole chain runs with torchvision
    # "tensor": the tail runs on the batch where it is (the GPU), batched or per sample with
    # torchvision's tensor kernels; "pil": it starts on PIL images, because a callable expects one;
    # "clip": per clip, on the device (video)
    tail_mode: str = "pil"
    # ((scale), (shift)) per channel when the graph's float32 output is raw uint8 pixels * scale +
    # shift: on the GPU the graph then hands over the raw pixels and ``compiler.handoff`` maps them
    affine: Optional[tuple] = None

    def hands_over_raw(self, device: str) -> bool:
        """On the GPU a float32 output that is an affine map of raw pixels leaves the graph as those
        raw uint8 pixels (a quarter of the bytes in DALI's queue) and ``compiler.handoff`` maps them."""
        return device == "gpu" and self.compiled and self.affine is not None

    @property
    def checkpointable(self) -> bool:
        """Whether DALI can checkpoint the graph's random state (its video decoder cannot)."""
        return not self.steps or self.steps[0].op != "video_decode"

    def explain(self, device: str = "cpu") -> str:
        lines = []
        if not self.compiled:
            lines.append("not compiled: every transform runs per sample with torchvision "
                         "(torch DataLoader workers)")
            lines.append(f"  reason: {self.tail_reason}")
            for t in self.tail:
                lines.append(f"  torchvision  {_short(t)}")
            return "\n".join(lines)
        nvdec = bool(self.steps) and self.steps[0].args.get("decoder") == "nvdec"
        yuv = bool(self.steps) and self.steps[0].args.get("frames") == "yuv420"
        dev = {"decode": "mixed" if device == "gpu" else "cpu",
               "video_decode": "mixed, NVDEC" if nvdec else
               f"decoded by PyAV in worker processes, to the {device}"
               + (f" as YUV planes, converted to RGB on the {device}" if yuv else "")}
        lines.append(f"DALI graph ({device}):")
        if self.output == "video":
            lines.append("  readers: clips in sampler order (" + ("each file's bytes, its frame indices and size)" if nvdec
                                                                else "decoded frames and their size)"))
        else:
            lines.append("  readers: encoded files fed in sampler order")
        for s in self.steps:
            where = dev.get(s.op, device)
            text = f"  {_dali_name(s)}({where})"
            if s.sources:
                text += "  <- " + ", ".join(_short(t) for t in s.sources)
            if s.note:
                text += f"  [{s.note}]"
            lines.append(text)
        if self.hands_over_raw(device):
            lines.append("hand-off: the graph's raw uint8 pixels become float32 in one kernel (x * scale + shift per "
                         "channel) on the loop's stream")
        if self.tail:
            from .tail import stages

            if self.tail_mode == "clip":
                lines.append(f"after the graph, per clip on the {device} batch with torchvision (graph ends at: "
                             f"{self.tail_reason}):")
            elif self.tail_mode == "tensor":
                lines.append(f"after the graph, on the {device} batch (graph ends at: {self.tail_reason}):")
            else:
                lines.append(f"after the graph, per sample on PIL images (a callable before ToTensor expects "
                             f"one; graph ends at: {self.tail_reason}):")
            labels = {"batched": "batched    ", "per sample": "per sample ", "conversion": "conversion ",
                      "pil": "per sample "}
            for t, _, stage in stages(self):
                lines.append(f"  {labels[stage]} {_short(t)}")
        return "\n".join(lines)


def _dali_name(step: Step) -> str:
    if step.op == "decode":
        return "decoders.image_random_crop" if step.args.get("random_crop") else "decoders.image"
    if step.op == "video_decode":
        return "decoders.video" if step.args.get("decoder") == "nvdec" else "clip frames"
    return step.op


def _short(t) -> str:
    text = repr(t).replace("\n", " ")
    return " ".join(text.split())


# --- 1. the table: torchvision class -> Op ------------------------------------------------------

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
        raise NotLowerable(f"{type(t).__name__}: interpolation {mode.value!r} has no DALI equivalent")
    return DALI_INTERPOLATION[mode]


def _random_resized_crop(t) -> Op:
    return Op("random_resized_crop", dict(size=tuple(t.size), scale=tuple(t.scale), ratio=tuple(t.ratio),
                                          interp=_interp(t), antialias=t.antialias), t)


def _resize(t) -> Op:
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


def _center_crop(t) -> Op:
    return Op("crop", dict(mode="center", size=tuple(t.size), padding=(0, 0, 0, 0), pad_if_needed=True,
                           fill=(0.0, 0.0, 0.0)), t)


def _random_crop(t) -> Op:
    padding = _compat.padding_ltrb(t)
    if (any(padding) or t.pad_if_needed) and t.padding_mode != "constant":
        raise NotLowerable(f"RandomCrop: padding_mode={t.padding_mode!r} (only 'constant' is lowered)")
    fill = _compat.constant_fill(t)
    if fill is None:
        raise NotLowerable("RandomCrop: fill given per input type")
    return Op("crop", dict(mode="random", size=tuple(t.size), padding=padding, pad_if_needed=bool(t.pad_if_needed),
                           fill=fill), t)


def _flip(horizontal: bool) -> Callable[[Any], Op]:
    return lambda t: Op("flip", dict(horizontal=horizontal, p=float(t.p)), t)


def _to_float_tensor(t) -> Op:
    return Op("to_tensor", dict(dtype=torch.float32, scale=True), t)


def _to_uint8_tensor(t) -> Op:
    return Op("to_tensor", dict(dtype=torch.uint8, scale=False), t)


def _convert_image_dtype(t) -> Op:
    return Op("to_dtype", dict(dtype=t.dtype, scale=True), t)


def _to_dtype(t) -> Op:
    dtype = t.dtype
    if isinstance(dtype, dict):
        from torchvision import tv_tensors

        dtype = dtype.get(tv_tensors.Image, dtype.get("others"))
        if dtype is None:
            raise NotLowerable("ToDtype: no dtype given for images")
    return Op("to_dtype", dict(dtype=dtype, scale=bool(t.scale)), t)


def _normalize(t) -> Op:
    # ``inplace`` only matters for aliasing, which a freshly decoded batch never has
    return Op("normalize", dict(mean=tuple(float(m) for m in t.mean), std=tuple(float(s) for s in t.std)), t)


def _auto_augment_args(t) -> dict:
    """Interpolation and fill of torchvision's automatic augmentations, as DALI's warps take them."""
    name = type(t).__name__
    mode = _compat.interpolation_mode(t.interpolation)
    if mode not in (InterpolationMode.NEAREST, InterpolationMode.BILINEAR):
        raise NotLowerable(f"{name}: interpolation {mode.value!r} (DALI's warps: nearest, bilinear)")
    fill = t.fill
    if isinstance(fill, dict):
        raise NotLowerable(f"{name}: fill given per input type")
    if isinstance(fill, (list, tuple)):
        if len(set(fill)) != 1:
            raise NotLowerable(f"{name}: a per-channel fill")
        fill = fill[0]
    return dict(interp=DALI_INTERPOLATION[mode], fill=0 if fill is None else int(fill))


def _trivial_augment_wide(t) -> Op:
    return Op("auto_augment", dict(policy="trivial_augment_wide", num_magnitude_bins=int(t.num_magnitude_bins),
                                   **_auto_augment_args(t)), t)


def _auto_augment(t) -> Op:
    # torchvision's AutoAugment draws magnitudes from 10 bins of RandAugment's ranges
    return Op("auto_augment", dict(policy="auto_augment", sub_policies=_compat.auto_augment_policies(t),
                                   num_magnitude_bins=10, **_auto_augment_args(t)), t)


def _rand_augment(t) -> Op:
    return Op("auto_augment", dict(policy="rand_augment", num_ops=int(t.num_ops), magnitude=int(t.magnitude),
                                   num_magnitude_bins=int(t.num_magnitude_bins), **_auto_augment_args(t)), t)


LOWERINGS: dict = {
    tv1.TrivialAugmentWide: _trivial_augment_wide, tv2.TrivialAugmentWide: _trivial_augment_wide,
    tv1.RandAugment: _rand_augment, tv2.RandAugment: _rand_augment,
    tv1.AutoAugment: _auto_augment, tv2.AutoAugment: _auto_augment,
    tv1.RandomResizedCrop: _random_resized_crop, tv2.RandomResizedCrop: _random_resized_crop,
    tv1.Resize: _resize, tv2.Resize: _resize,
    tv1.CenterCrop: _center_crop, tv2.CenterCrop: _center_crop,
    tv1.RandomCrop: _random_crop, tv2.RandomCrop: _random_crop,
    tv1.RandomHorizontalFlip: _flip(True), tv2.RandomHorizontalFlip: _flip(True),
    tv1.RandomVerticalFlip: _flip(False), tv2.RandomVerticalFlip: _flip(False),
    tv1.ToTensor: _to_float_tensor, tv2.ToTensor: _to_float_tensor,
    tv1.PILToTensor: _to_uint8_tensor, tv2.PILToTensor: _to_uint8_tensor, tv2.ToImage: _to_uint8_tensor,
    tv1.ConvertImageDtype: _convert_image_dtype, tv2.ConvertImageDtype: _convert_image_dtype,
    tv2.ToDtype: _to_dtype,
    tv1.Normalize: _normalize, tv2.Normalize: _normalize,
}


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
#: the conversions that end the PIL part of a chain
TO_TENSOR = (tv1.ToTensor, tv2.ToTensor, tv1.PILToTensor, tv2.PILToTensor, tv2.ToImage)


_GRID_TRANSFORMS = (tv1.RandomRotation, tv1.RandomAffine, tv1.RandomPerspective, tv2.RandomRotation,
                    tv2.RandomAffine, tv2.RandomPerspective)


def tensor_capable(t) -> bool:
    if isinstance(t, _CONTAINERS):
        return all(tensor_capable(c) for c in t.transforms)
    if isinstance(t, tv2.Transform):
        return not isinstance(t, _NOT_TENSOR)
    if isinstance(t, tv1.Pad) and not isinstance(t.fill, (int, float)):
        return False  # v1's tensor pad takes one number as fill; PIL's takes a colour
    if isinstance(t, _GRID_TRANSFORMS) and _compat.interpolation_mode(t.interpolation) not in (
            InterpolationMode.NEAREST, InterpolationMode.BILINEAR):
        return False  # torchvision's tensor warps take nearest and bilinear only; PIL's take more
    return isinstance(t, TENSOR_CAPABLE_V1)


def choose_tail_mode(tail: list, image_state: bool) -> str:
    """Tensor kernels on the device, unless a callable would receive a stand-in tensor where
    torchvision hands it a PIL image (before ToTensor)."""
    for t in tail:
        if image_state and isinstance(t, TO_TENSOR):
            image_state = False
        elif image_state and not tensor_capable(t):
            return "pil"
    return "tensor"


def _timm_random_resized_crop(t) -> Op:
    """timm's RandomResizedCropAndInterpolation: torchvision's sampling rule (drawn with Python's
    ``random``), on PIL images; ``interpolation='random'`` (timm's train.py default) picks a filter
    per sample, uniformly from a tuple (bilinear, bicubic): ``interp`` is then the tuple of DALI's
    filters, one drawn per sample in the graph."""
    if isinstance(t.interpolation, (list, tuple)):
        modes = [_compat.interpolation_mode(m) for m in t.interpolation]
        missing = [m.value for m in modes if m not in DALI_INTERPOLATION]
        if missing or not modes:
            raise NotLowerable(f"RandomResizedCropAndInterpolation: interpolation {missing} has no DALI equivalent")
        interp = tuple(DALI_INTERPOLATION[m] for m in modes)
    else:
        interp = _interp(t)
    return Op("random_resized_crop", dict(size=tuple(t.size), scale=tuple(t.scale), ratio=tuple(t.ratio),
                                          interp=interp, antialias=True), t)


@functools.lru_cache(maxsize=None)  # on first use, so that importing gputransforms does not import timm
def _timm_lowerings() -> dict:
    try:
        from timm.data.auto_augment import AutoAugment, RandAugment
        from timm.data.transforms import RandomResizedCropAndInterpolation
    except ImportError:  # timm is optional
        return {}
    # timm's MaybeToTensor / MaybePILToTensor subclass torchvision's ToTensor / PILToTensor
    return {RandomResizedCropAndInterpolation: _timm_random_resized_crop,
            RandAugment: _timm_auto_augment, AutoAugment: _timm_auto_augment}


def _timm_auto_augment(t) -> Op:
    from . import timm_augment

    return Op("auto_augment", timm_augment.describe(t), t)


def lower_transform(t) -> Op:
    for cls in type(t).__mro__:
        fn = LOWERINGS.get(cls) or _timm_lowerings().get(cls)
        if fn is not None:
            return fn(t)
    raise NotLowerable(f"{type(t).__name__}: no DALI lowering")


def flatten(transform) -> list:
    if transform is None:
        return []
    if isinstance(transform, (tv1.Compose, tv2.Compose)):
        out = []
        for t in transform.transforms:
            out.extend(flatten(t))
        return out
    if isinstance(transform, (tv2.Identity, tv2.ToPureTensor)):
        return []  # ToPureTensor only unwraps tv_tensors: our batches are plain tensors already
    if type(transform).__name__ in PRESET_WRAPPERS and isinstance(getattr(transform, "transforms", None),
                                                                  (tv1.Compose, tv2.Compose)):
        return flatten(transform.transforms)
    return [transform]


#: torchvision's classification references wrap a Compose in a class whose __call__ is
#: ``self.transforms(img)`` (references/classification/presets.py); users copy those classes.
PRESET_WRAPPERS = {"ClassificationPresetTrain", "ClassificationPresetEval", "VideoClassificationPresetTrain",
                   "VideoClassificationPresetEval"}


# --- 2. planning and fusion ---------------------------------------------------------------------

class _Planner:
    """Walks ops in order, keeping crop, horizontal flip and per-pixel value maps pending so that
    they fold into one crop_mirror_normalize at the end; anything else flushes them first."""

    def __init__(self):
        self.steps: list = []
        self.crop: Optional[Op] = None
        self.crop_fill_raw = None
        self.flip: Optional[Op] = None
        # pixel values as torchvision would hold them = raw_uint8 * scale + shift (per channel)
        self.scale = [1.0, 1.0, 1.0]
        self.shift = [0.0, 0.0, 0.0]
        self.value_sources: list = []
        self.tensor = False  # has ToTensor/PILToTensor/ToImage run
        self.dtype = torch.uint8
        self.graph_float = False  # the graph's data became float (a resize of float values)
        # ((scale), (shift)) of the float32 output from raw uint8 pixels, where it is one (finish())
        self.affine: Optional[tuple] = None

    # values -------------------------------------------------------------------------------------
    def raw_fill(self, fill, op: Op, strict: bool = True):
        """A padding fill given in the current value space, as a raw value (what DALI holds). A slice
        pads the graph's data itself, so on uint8 data (``strict``) the fill must be a uint8 value;
        crop_mirror_normalize pads in output units, which any fill maps to."""
        raw = [(f - b) / a for f, a, b in zip(fill, self.scale, self.shift)]
        return self.slice_fill(raw, op) if strict else [float(r) for r in raw]

    def slice_fill(self, raw: list, op: Op) -> list:
        """A raw fill as a slice of the graph's data can pad with it: any value on float data, a
        uint8 value on uint8 data."""
        if self.graph_float:
            return [float(r) for r in raw]
        if not _are_uint8_values(raw):
            raise NotLowerable(f"{type(op.source).__name__}: fill {tuple(op.args['fill'])} after a value change")
        return [float(round(r)) for r in raw]

    def value(self, op: Op):
        a = op.args
        if op.kind == "to_tensor":
            if self.tensor:
                raise NotLowerable(f"{type(op.source).__name__}: input is already a tensor")
            self.tensor = True
            self.dtype = a["dtype"]
            if a["scale"]:
                self._affine(1 / 255.0, 0.0)
        elif op.kind == "to_dtype":
            if not self.tensor:
                raise NotLowerable(f"{type(op.source).__name__}: input is not a tensor yet")
            new = a["dtype"]
            if not new.is_floating_point:
                if new != self.dtype:
                    raise NotLowerable(f"{type(op.source).__name__}: conversion to {new}")
            elif a["scale"] and not self.dtype.is_floating_point:
                self._affine(1 / 255.0, 0.0)
            self.dtype = new
        elif op.kind == "normalize":
            if not self.tensor or not self.dtype.is_floating_point:
                raise NotLowerable("Normalize: input is not a float tensor")
            mean, std = a["mean"], a["std"]
            if len(mean) == 1:
                mean = mean * 3
            if len(std) == 1:
                std = std * 3
            if len(mean) != 3 or len(std) != 3 or any(s <= 0 for s in std):
                raise NotLowerable("Normalize: mean/std are not 3 positive channels")
            self.scale = [s / d for s, d in zip(self.scale, std)]
            self.shift = [(b - m) / d for b, m, d in zip(self.shift, mean, std)]
        self.value_sources.append(op.source)

    def _affine(self, a, b):
        self.scale = [s * a for s in self.scale]
        self.shift = [t * a + b for t in self.shift]

    # geometry -----------------------------------------------------------------------------------
    def flush(self):
        if self.crop is not None:
            # (raises if the fill is no uint8 value: the crop then stays pending, for crop_mirror_normalize)
            fill = self.slice_fill(self.crop_fill_raw, self.crop)
            self.steps.append(Step("slice", dict(self.crop.args, fill=fill), [self.crop.source]))
            self.crop = None
        if self.flip is not None:
            self.emit_flip(self.flip)
            self.flip = None

    def emit_flip(self, op: Op):
        """A flip right after a resize is the resize's own: its ROI reversed (DALI's resize flips a
        dimension whose ROI end is before its start), so no separate pass over the images."""
        last = self.steps[-1]
        key = "hflip_p" if op.args["horizontal"] else "vflip_p"
        if last.op == "resize" and key not in last.args:
            last.args[key] = op.args["p"]
            last.sources.append(op.source)
            if "flip fused" not in last.note:
                last.note = ", ".join(n for n in (last.note, "flip fused (ROI reversed)") if n)
        else:
            self.steps.append(Step("flip", dict(op.args), [op.source]))

    def antialias(self, op: Op) -> bool:
        # PIL always antialiases when downscaling; ``antialias`` only applies to tensors.
        return True if not self.tensor else bool(op.args["antialias"])

    def geometric(self, op: Op):
        if op.kind in ("resize", "random_resized_crop"):
            self.flush()
            # torchvision resizes float tensors without rounding: so does the graph, in float
            to_float = self.tensor and self.dtype.is_floating_point and op.kind == "resize"
            self.graph_float = self.graph_float or to_float
            self.steps.append(Step(op.kind, dict(op.args, antialias=self.antialias(op), float=to_float), [op.source]))
        elif op.kind == "crop":
            explicit_padding = any(op.args["padding"])
            self.flush()
            if explicit_padding:
                # the crop window can leave [min(0, H-h), max(0, H-h)]: crop_mirror_normalize's
                # normalised crop_pos cannot express that, an absolute slice can
                self.steps.append(Step("slice", dict(op.args, fill=self.raw_fill(op.args["fill"], op)), [op.source]))
            else:
                self.crop, self.crop_fill_raw = op, self.raw_fill(op.args["fill"], op, strict=False)
        elif op.kind == "auto_augment":
            if self.tensor:
                raise NotLowerable(f"{type(op.source).__name__} after ToTensor (DALI's suite works on uint8 images)")
            self.flush()
            note = ("timm's ops and level functions, DALI conditionals" if op.args["policy"] == "timm_augment"
                    else "torchvision's augmentation space in DALI's auto_aug ops")
            self.steps.append(Step(op.args["policy"], dict(op.args), [op.source], note))
        elif op.kind == "flip":
            if op.args["horizontal"]:
                if self.flip is not None:
                    self.flush()
                self.flip = op
            else:
                self.flush()
                self.emit_flip(op)

    def lower(self, transforms: list, per_clip: tuple = ()) -> tuple[list, str]:
        """Plan ``transforms`` in order up to the first one without a lowering (ops of a kind in
        ``per_clip`` count as such); returns (the rest: the tail, the reason it starts there)."""
        for j, t in enumerate(transforms):
            try:
                op = lower_transform(t)
                if op.kind in per_clip:
                    raise NotLowerable(f"{type(t).__name__}: on clips it runs per clip with torchvision")
                if op.kind in ("to_tensor", "to_dtype", "normalize"):
                    self.value(op)
                else:
                    self.geometric(op)
            except NotLowerable as e:
                return transforms[j:], str(e)
        return [], ""

    def finish(self, chw: bool = False):
        args: dict[str, Any] = dict(layout="CHW" if self.tensor or chw else "HWC",
                                    dtype=self.dtype if self.tensor else torch.uint8)
        # crop_mirror_normalize computes (x - mean) / std from raw values
        args["mean"] = [-b / a for a, b in zip(self.scale, self.shift)]
        args["std"] = [1.0 / a for a in self.scale]
        sources = []
        if self.crop is not None:
            args["crop"] = dict(self.crop.args)
            # padding is written in output units
            args["crop"]["fill"] = [f * a + b for f, a, b in zip(self.crop_fill_raw, self.scale, self.shift)]
            sources.append(self.crop.source)
        if self.flip is not None:
            args["mirror_p"] = self.flip.args["p"]
            sources.append(self.flip.source)
        sources.extend(self.value_sources)
        note = "crop+flip+normalize+layout fused" if len(sources) > 1 else ""
        self.steps.append(Step("crop_mirror_normalize", args, sources, note))
        if self.affine_eligible(args):
            self.affine = tuple(float(a) for a in self.scale), tuple(float(b) for b in self.shift)
            if self.crop is not None:  # the raw graph pads with the raw value (a uint8 value here)
                args["crop"]["raw_fill"] = [float(round(f)) for f in self.crop_fill_raw]

    def affine_eligible(self, args: dict) -> bool:
        """Whether the float32 output is a per-channel affine map of raw uint8 pixels, padding included
        (a crop that may pad fills with a raw value that must itself be a uint8 value)."""
        if self.graph_float or args["dtype"] != torch.float32 or not args["layout"].endswith("CHW"):
            return False
        if self.crop is not None and self.crop.args["pad_if_needed"]:
            return _are_uint8_values(self.crop_fill_raw)
        return True


def _are_uint8_values(raw: list) -> bool:
    """Whether raw values are uint8 values (integers in 0..255, within float rounding)."""
    return all(abs(r - round(r)) <= 1e-3 and 0 <= round(r) <= 255 for r in raw)


def plan(transform, input: str = "image") -> Plan:
    """Plan ``transform`` (a Compose of torchvision v1/v2 or gputransforms transforms).

    ``input``: "image" (files PIL would open), or the frames of video clips as torchvision's
    ``VideoClips`` hands them to the transform: "video TCHW" (a batch of images to torchvision's
    transforms: one set of random parameters per clip, applied to every frame) or "video THWC"
    (what torchvision's transforms do not read as images: the whole chain runs per clip)."""
    if input.startswith("video"):
        return _plan_video(flatten(transform), input.split()[-1])
    transforms = flatten(transform)
    planner = _Planner()
    decode = Step("decode", {}, [])
    planner.steps.append(decode)
    i = 0
    if transforms:
        try:
            first = lower_transform(transforms[0])
        except NotLowerable:
            first = None
        if first is not None and first.kind == "random_resized_crop":
            decode.args["random_crop"] = dict(scale=first.args["scale"], ratio=first.args["ratio"])
            decode.sources.append(first.source)
            decode.note = "random crop fused into decode (ROI decode)"
            planner.steps.append(Step("resize", dict(target=("exact", first.args["size"]), interp=first.args["interp"],
                                                     antialias=True), [first.source]))
            i = 1
    tail, reason = planner.lower(transforms[i:])
    tail_mode = choose_tail_mode(tail, image_state=not planner.tensor) if tail else "pil"
    planner.finish(chw=tail_mode == "tensor")
    steps = planner.steps
    compiled = len(tail) < len(transforms) or not transforms  # else the graph would only decode
    if not compiled:
        return Plan(steps=[], tail=transforms, tail_reason=reason, output="image", out_dtype=torch.uint8,
                    compiled=False)
    last = steps[-1].args
    return Plan(steps=steps, tail=tail, tail_reason=reason, output="tensor" if last["layout"] == "CHW" else "image",
                out_dtype=last["dtype"], compiled=True, tail_mode=tail_mode, affine=planner.affine)


def _plan_video(transforms: list, layout: str) -> Plan:
    """Clips: NVDEC (or PyAV on the CPU) decodes the frames, the lowerable prefix of the chain runs
    on the whole sequence in the graph, and the rest per clip on the device, never batched across
    clips (the batched stage draws per image). Decoding alone is worth the graph, so a video chain
    is always compiled."""
    planner = _Planner()
    planner.steps.append(Step("video_decode", dict(layout=layout, decoder="pyav"), []))
    tail, reason = list(transforms), "output_format='THWC': the transform gets (T, H, W, C) frames"
    if layout == "TCHW":
        planner.tensor = True  # torchvision hands the transform a uint8 tensor, not a PIL image
        # DALI draws these per frame of a sequence, or not with torchvision's meaning there
        tail, reason = planner.lower(transforms, per_clip=("auto_augment", "random_resized_crop"))
        planner.finish()
    last = planner.steps[-1].args
    out_dtype = last["dtype"] if layout == "TCHW" else torch.uint8
    return Plan(steps=planner.steps, tail=tail, tail_reason=reason, output="video", out_dtype=out_dtype,
                compiled=True, tail_mode="clip", affine=planner.affine)


def explain(transform, device: Optional[str] = None) -> str:
    return plan(transform).explain(device or default_device())
