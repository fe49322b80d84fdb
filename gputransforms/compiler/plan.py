"""Compose -> Plan: decide, from the transforms' own attributes and before anything runs, which
part of a chain becomes one DALI graph, which operations fuse, and what is left to run per sample.

Three layers, one direction:
  1. ``registry`` -- the one table from torchvision and timm classes (v1 and v2; ours are the same
     classes) to their lowerings; ``registry.dali_op`` gives an ``Op``, a backend-neutral record of the
     user's arguments.
  2. ``plan()`` -- walks the ops and emits ``Step``s, the operations of the DALI graph, fusing as it
     goes (RandomResizedCrop into decode; crop + flip + ToTensor/dtype + Normalize + HWC->CHW into
     one crop_mirror_normalize).
  3. ``compiler.dali`` turns steps into DALI operators; ``compiler.handoff.finish`` runs the rest after
     the graph (``stages``: batched kernels on whole batches where the registry has them, else per sample).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

import torch

from ..device import default_device
from . import joint_kernels
from . import stages as stage_lists
from .chain import TO_TENSOR, NotLowerable, Op, flatten, flatten_clips, kinds_before, tensor_capable
from .registry import dali_op

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
    # id of a tail transform -> what torchvision hands it ("tv_image": a tv_tensors.Image; chain.kinds_before)
    tail_kinds: dict = dataclasses.field(default_factory=dict)

    def hands_over_raw(self, device: str) -> bool:
        """On the GPU a float32 output that is an affine map of raw pixels leaves the graph as those
        raw uint8 pixels (a quarter of the bytes in DALI's queue) and ``compiler.handoff`` maps them."""
        return device == "gpu" and self.compiled and self.affine is not None

    def joint_program(self):
        """The recorded joint transform's program of the plan's joint step (``compiler.joint``), or None."""
        return next((s.args["program"] for s in self.steps if s.op == "joint"), None)

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
        joint = self.joint_program()
        if device == "gpu" and joint is not None and joint_kernels.takes(joint):
            lines.append("after the graph: the joint step's colour block, window and flips in CUDA kernels over the "
                         "batch (compiler.joint_kernels; the graph only decodes), each output pixel read from the "
                         "decoded image once" + (" and written as float32 (x * scale + shift per channel)"
                                                 if self.hands_over_raw(device) else ""))
        elif self.hands_over_raw(device):
            lines.append("hand-off: the graph's raw uint8 pixels become float32 in one kernel (x * scale + shift per "
                         "channel) on the loop's stream")
        if self.tail:
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
            for t, _, stage in stage_lists.after_graph(self):
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


def choose_tail_mode(tail: list, image_state: bool) -> str:
    """Tensor kernels on the device, unless a callable would receive a stand-in tensor where
    torchvision hands it a PIL image (before ToTensor)."""
    for t in tail:
        if image_state and isinstance(t, TO_TENSOR):
            image_state = False
        elif image_state and not tensor_capable(t):
            return "pil"
    return "tensor"


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
            raise NotLowerable(f"{type(op.source).__name__}: fill {tuple(op.args['fill'])} after a value change",
                               "to compile it, use whole numbers 0-255 for the fill, or move the transform "
                               "before the value change (ToTensor, ToDtype, Normalize)")
        return [float(round(r)) for r in raw]

    def value(self, op: Op):
        a = op.args
        if op.kind == "to_tensor":
            if self.tensor and _leaves_a_tensor(op.source):
                return  # (v2's conversions pass a plain tensor through: the classification reference's
                # --backend tensor --weights puts weights.transforms(), which converts, after its PILToTensor)
            if self.tensor:
                raise NotLowerable(f"{type(op.source).__name__}: input is already a tensor",
                                   "to compile it, convert to a tensor once (drop the second conversion)")
            self.tensor = True
            self.dtype = a["dtype"]
            if a["scale"]:
                self._affine(1 / 255.0, 0.0)
        elif op.kind == "to_dtype":
            if not self.tensor:
                raise NotLowerable(f"{type(op.source).__name__}: input is not a tensor yet",
                                   "to compile it, put ToImage() (or PILToTensor()) before it")
            new = a["dtype"]
            if not new.is_floating_point:
                if new != self.dtype:
                    raise NotLowerable(f"{type(op.source).__name__}: conversion to {new}",
                                       "to compile it, convert to uint8 or a float dtype")
            elif a["scale"] and not self.dtype.is_floating_point:
                self._affine(1 / 255.0, 0.0)
            self.dtype = new
        elif op.kind == "normalize":
            if not self.tensor or not self.dtype.is_floating_point:
                raise NotLowerable("Normalize: input is not a float tensor",
                                   "to compile it, put ToDtype(torch.float32, scale=True) or ToTensor() before it")
            mean, std = a["mean"], a["std"]
            if len(mean) == 1:
                mean = mean * 3
            if len(std) == 1:
                std = std * 3
            if len(mean) != 3 or len(std) != 3 or any(s <= 0 for s in std):
                raise NotLowerable("Normalize: mean/std are not 3 positive channels",
                                   "to compile it, give one mean and one positive std per RGB channel")
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
                raise NotLowerable(f"{type(op.source).__name__} after ToTensor (DALI's suite works on uint8 images)",
                                   "to compile it, put it before ToTensor/ToDtype (as torchvision's references do)")
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
                op = dali_op(t)
                if op.kind in per_clip:
                    raise NotLowerable(f"{type(t).__name__}: on clips it runs per clip with torchvision",
                                       "to compile it, apply it to frames (an image dataset), or accept the "
                                       "per-clip cost; explain() shows what stays in the graph")
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


#: DataLoader(video_decoder=...): "pyav" is "pyav-yuv" on the GPU and "pyav-rgb" on the CPU
VIDEO_DECODERS = ("pyav", "pyav-yuv", "pyav-rgb", "nvdec")


def plan(transform: Callable, input: str = "image", *, device: str = "cpu", video_decoder: str = "pyav") -> Plan:
    """Plan ``transform`` (a Compose of torchvision v1/v2 or gputransforms transforms).

    ``input``: "image" (files PIL would open), "image tensor" (files ``torchvision.io.decode_image`` reads: the
    chain is handed a uint8 (3, H, W) tensor), or the frames of video clips as torchvision's
    ``VideoClips`` hands them to the transform: "video TCHW" (a batch of images to torchvision's
    transforms: one set of random parameters per clip, applied to every frame) or "video THWC"
    (what torchvision's transforms do not read as images: the whole chain runs per clip).
    ``device`` and ``video_decoder`` choose how clips are decoded (``VIDEO_DECODERS``): NVDEC in the
    graph, or PyAV in worker processes handing over RGB frames or, on the GPU by default, YUV planes
    that the graph converts."""
    if input == "joint":
        return _plan_joint(transform)
    if input.startswith("video"):
        if video_decoder not in VIDEO_DECODERS:
            raise ValueError(f"video_decoder must be one of {', '.join(map(repr, VIDEO_DECODERS))}, "
                             f"got {video_decoder!r}")
        nvdec = device == "gpu" and video_decoder == "nvdec"
        yuv = not nvdec and (video_decoder == "pyav-yuv" or (video_decoder == "pyav" and device == "gpu"))
        layout = input.split()[-1]
        # (VideoClassification as its steps on (T, C, H, W) frames only: on (T, H, W, C) it runs as written)
        return _plan_video(flatten_clips(transform) if layout == "TCHW" else flatten(transform), layout,
                           decoder="nvdec" if nvdec else "pyav", frames="yuv420" if yuv else "rgb")
    transforms = flatten(transform)
    planner = _Planner()
    if input == "image tensor":  # torchvision.io's decode_image as the loader: the chain gets a uint8 CHW tensor
        transforms, refused = _on_a_tensor(transforms)
        if refused:
            return Plan(steps=[], tail=transforms, tail_reason=refused, output="image", out_dtype=torch.uint8,
                        compiled=False)
        planner.tensor = True
    decode = Step("decode", {}, [])
    planner.steps.append(decode)
    i = 0
    if transforms:
        try:
            first = dali_op(transforms[0])
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
                out_dtype=last["dtype"], compiled=True, tail_mode=tail_mode, affine=planner.affine,
                tail_kinds=kinds_before(transform, "tensor" if input == "image tensor" else "pil") if tail else {})


def _leaves_a_tensor(t) -> bool:
    """v2's ``ToImage``, ``PILToTensor`` and ``ToTensor``, which hand a plain tensor on as it is (their own classes;
    torchvision's v1 conversions raise on a tensor)."""
    from torchvision.transforms import v2 as tv2

    return type(t) in (tv2.ToImage, tv2.PILToTensor, tv2.ToTensor)


def _on_a_tensor(transforms: list) -> tuple:
    """A chain handed torchvision.io's uint8 (3, H, W) tensor: (its steps without v2's conversions to a tensor,
    which leave a tensor as it is; a reason it is not compiled, or ""). torchvision's v1 ``ToTensor`` and
    ``PILToTensor`` raise on a tensor, and a chain that goes back to PIL images is left as written: those run on
    torch's DataLoader, where torchvision raises or converts as it does."""
    import torchvision.transforms as tv1
    from torchvision.transforms import v2 as tv2

    for t in transforms:
        if type(t) in (tv1.ToTensor, tv1.PILToTensor, tv1.ToPILImage, tv2.ToPILImage):
            return transforms, (f"{type(t).__name__}: the loader (torchvision.io) hands the transform a tensor, which "
                                f"torchvision's v1 {type(t).__name__} does not take as a PIL image; to compile it, use "
                                "v2's ToDtype(torch.float32, scale=True) on the tensor, or leave loader= at its default")
    return [t for t in transforms if not _leaves_a_tensor(t)], ""


def _plan_video(transforms: list, layout: str, decoder: str, frames: str) -> Plan:
    """Clips: NVDEC (or PyAV on the CPU) decodes the frames, the lowerable prefix of the chain runs
    on the whole sequence in the graph, and the rest per clip on the device, never batched across
    clips (the batched stage draws per image). Decoding alone is worth the graph, so a video chain
    is always compiled."""
    planner = _Planner()
    planner.steps.append(Step("video_decode", dict(layout=layout, decoder=decoder, frames=frames), []))
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


def _plan_joint(program) -> Plan:
    """A joint transform recorded per sample (``compiler.joint``): decode, then one ``joint`` step whose
    structure is ``program`` (a ``joint.JointProgram``) and whose parameters come with each sample."""
    from .joint import affine_of

    dtype, scale, shift = affine_of(program.tail)
    parts = (["colour (brightness, contrast, saturation, hue, contrast, channel order)"] if program.colour else []) + \
        [("window+flip, " if k or program.first_window else "") + f"resize ({interp[7:].lower()})"
         for k, (interp, _) in enumerate(program.resizes)] + ["window+flip"]
    if program.tail:
        parts.append("dtype/normalize, CHW")
    steps = [Step("decode", {"joint": program.width}, []),
             Step("joint", {"program": program}, [], "per-sample parameters recorded from torchvision's own draws: "
                  + " -> ".join(parts))]
    affine = (scale, shift) if dtype == torch.float32 else None
    return Plan(steps=steps, tail=[], tail_reason="", output="tensor", out_dtype=dtype, compiled=True,
                tail_mode="tensor", affine=affine)


def explain(transform: Callable, device: Optional[str] = None) -> str:
    """How ``transform`` (a Compose of torchvision v1/v2, timm or gputransforms transforms) compiles: the
    DALI graph's operators with the transforms each comes from and its fusions, then what runs after the
    graph, batched on the device or per sample, and why the graph ends where it does.

    :param transform: the chain, as the dataset would apply it
    :param device: "gpu" or "cpu" (default: the GPU when torch sees one)
    :return: the plan, one line per operator or transform
    """
    return plan(transform).explain(device or default_device())
