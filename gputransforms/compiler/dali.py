"""Lower a Plan's steps to one DALI graph.

Image sizes are tracked through the graph as scalars: Python ints where the plan fixes them (after
a resize to an exact size or a crop), DALI integer nodes where they depend on the image (after a
plain decode, read from the encoded header with peek_image_shape). Output sizes and crop offsets
are computed from them with torchvision's integer arithmetic, not DALI's own rounding rules
(``resize_shorter`` and ``crop_pos=0.5`` differ from torchvision by up to a pixel).
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import threading
import warnings
from typing import Any, Callable, Optional

import numpy as np
import torch

import nvidia.dali.fn as fn
import nvidia.dali.math as dmath
import nvidia.dali.types as types
from nvidia.dali import pipeline_def
from nvidia.dali.pipeline import Pipeline, do_not_convert

from . import joint_dali, timm_augment
from .dali_scalars import Scalar, as_float, as_int, int_vector, is_node, select, smax, smin
from .plan import Plan, Step

_DALI_DTYPE = {
    torch.uint8: types.UINT8,
    torch.float16: types.FLOAT16,
    torch.float32: types.FLOAT,
    torch.float64: types.FLOAT,  # cast in torch afterwards: DALI's normalize has no float64 output
    torch.bfloat16: types.FLOAT,
}

def resized_size(h: Scalar, w: Scalar, target) -> tuple[Scalar, Scalar]:
    """torchvision's ``_compute_resized_output_size``, in integer arithmetic so that the result is
    exact whether h and w are Python ints or DALI nodes (``int(s * long / short)`` in float64
    equals ``s * long // short`` for these magnitudes)."""
    kind = target[0]
    if kind == "exact":
        return target[1]
    w_is_short = w <= h  # a bool, or a boolean node
    short, long = smin(h, w), smax(h, w)
    if kind == "longer":
        max_size = target[1]
        new_short, new_long = (max_size * short) // long, max_size
    else:
        _, s, max_size = target
        new_short, new_long = s, (s * long) // short
        if max_size is not None:
            if max_size <= s:
                raise ValueError(f"max_size = {max_size} must be strictly greater than the requested "
                                 f"size for the smaller edge size = {[s]}")
            too_long = new_long > max_size
            new_short = select(too_long, (max_size * new_short) // smax(new_long, 1), new_short)
            new_long = select(too_long, max_size, new_long)
    new_h = select(w_is_short, new_long, new_short)
    new_w = select(w_is_short, new_short, new_long)
    return new_h, new_w


def center_offset(extent: Scalar, size: int) -> Scalar:
    """torchvision's CenterCrop offset along one axis, in input coordinates.

    ``int(round((extent - size) / 2))`` with Python's half-to-even rounding when the image is large
    enough; when it is smaller torchvision pads ``(size - extent) // 2`` before, i.e. the offset is
    negative.
    """
    d = extent - size
    dp, dn = smax(d, 0), smax(-d, 0)
    k = dp // 2
    return k + (dp % 2) * (k % 2) - dn // 2


def random_offset(extent: Scalar, size: int, pad_before: int, pad_after: int, pad_if_needed: bool) -> Scalar:
    """torchvision's RandomCrop offset (uniform integer, like ``torch.randint``), in coordinates of
    the unpadded input: padding, then ``pad_if_needed`` padding of both sides, then a uniform pick."""
    padded = extent + pad_before + pad_after
    extra = smax(size - padded, 0) if pad_if_needed else 0
    span = padded + 2 * extra - size  # number of valid offsets - 1; negative: torchvision raises
    u = fn.random.uniform(range=[0.0, 1.0], dtype=types.FLOAT)
    pick = as_int(dmath.floor(u * as_float(smax(span, 0) + 1)))
    pick = dmath.min(pick, smax(span, 0))
    return pick - pad_before - extra


@dataclasses.dataclass
class _Graph:
    img: Any
    h: Scalar
    w: Scalar
    device: str  # "gpu" or "cpu"
    encoded: Any  # the external source's output, or its outputs (a tuple) for video
    seq: bool = False  # samples are sequences of frames (FHWC): per-sample parameters hold for every frame
    raw_output: bool = False  # a float32 output's raw uint8 pixels instead (compiler.handoff)
    params: Any = None  # each sample's row of parameters (a joint step's: compiler.joint)
    joint_after: bool = False  # a joint step may leave its pixels to compiler.joint_kernels, after the graph
    rows: Any = None  # ... and did: the rows of parameters, the graph's second output (CPU)


def _decode(g: _Graph, step: Step, *, hw_decoder_load: float, jpeg_fancy_upsampling: bool) -> None:
    kw: dict[str, Any] = dict(output_type=types.RGB, adjust_orientation=False)  # torchvision ignores EXIF
    rc = step.args.get("random_crop")
    encoded = g.encoded
    if step.args.get("joint"):  # (encoded file, row of parameters)
        encoded, g.params = g.encoded
    if g.device == "gpu":
        # nvJPEG < 13.2 refuses fancy upsampling for ROI decodes (and warns for every image)
        kw.update(device="mixed", hw_decoder_load=hw_decoder_load,
                  jpeg_fancy_upsampling=jpeg_fancy_upsampling and not rc)
    else:
        kw.update(device="cpu")
    if rc:
        g.img = fn.decoders.image_random_crop(g.encoded, random_area=list(rc["scale"]),
                                              random_aspect_ratio=list(rc["ratio"]), num_attempts=10, **kw)
        g.h = g.w = None  # always followed by a resize to an exact size
    else:
        g.img = fn.decoders.image(encoded, **kw)
        shape = fn.peek_image_shape(encoded, adjust_orientation=False, dtype=types.INT32)
        g.h, g.w = shape[0], shape[1]


def _video_decode(g: _Graph, step: Step, **_) -> None:
    """Clips: with NVDEC the external source gives each clip's file bytes, frame indices and size, and
    DALI's video decoder decodes those frames; with PyAV it gives the decoded frames (RGB, or YUV
    planes and their matrix: ``frames="yuv420"``) and their size."""
    g.seq = True
    if step.args.get("decoder") == "nvdec":
        encoded, frames, hw = g.encoded
        # pad_mode="none": a frame past the video's end (a truncated file) raises instead of padding
        g.img = fn.decoders.video(encoded, device="mixed", frames=frames, pad_mode="none")
    elif step.args.get("frames") == "yuv420":
        # PyAV's planes (video.read_planes): chroma repeated to the frame's size, then one matrix per
        # clip (its colorspace and range) to RGB, where the chain runs: half the bytes of RGB cross
        # from the decoders, and the conversion leaves the CPU
        luma, chroma, mt, hw = g.encoded
        if g.device == "gpu":
            luma, chroma = luma.gpu(), chroma.gpu()
        chroma = fn.resize(chroma, size=fn.cast(hw, dtype=types.FLOAT), interp_type=types.INTERP_NN, antialias=False)
        g.img = fn.coord_transform(fn.cat(luma, chroma, axis=3), MT=mt, dtype=types.UINT8)
    else:
        g.img, hw = g.encoded
        if g.device == "gpu":
            g.img = g.img.gpu()
    g.h, g.w = hw[0], hw[1]


def _interp_type(interp):
    """A DALI filter by name, or for a tuple of names one drawn per sample, uniformly (timm's
    ``interpolation='random'``: ``random.choice`` of bilinear and bicubic per image)."""
    if isinstance(interp, str):
        return getattr(types, interp)
    codes = [int(getattr(types, name)) for name in interp]
    return fn.cast(fn.random.uniform(values=codes, dtype=types.INT32), dtype=types.INTERP_TYPE)


def _flip_roi(step: Step) -> dict:
    """A resize's ROI, reversed in the dimensions a flip folded into it (plan: ``emit_flip``) drew: the
    start ``sum(coin * unit vector)``, the end ``1 - start``, in float arithmetic that broadcasts each
    sample's coin (no stack of per-sample scalars: DALI's CPU operators cost per sample, and two stacks
    were the costliest operators of a training chain's graph)."""
    if "vflip_p" not in step.args and "hflip_p" not in step.args:
        return {}
    start = None
    for axis, key in enumerate(("vflip_p", "hflip_p")):
        if key in step.args:
            unit = types.Constant(np.eye(2, dtype=np.float32)[axis], device="cpu")
            term = _coin(step.args[key]) * unit  # (int32 times float32: float32)
            start = term if start is None else start + term
    return dict(roi_start=start, roi_end=1.0 - start, roi_relative=True)


def _resize(g: _Graph, step: Step, **_) -> None:
    h, w = resized_size(g.h, g.w, step.args["target"])
    kw = dict(dtype=types.FLOAT) if step.args.get("float") else {}
    kw.update(_flip_roi(step))
    g.img = fn.resize(g.img, resize_y=as_float(h), resize_x=as_float(w), interp_type=_interp_type(step.args["interp"]),
                      antialias=step.args["antialias"], **kw)
    g.h, g.w = h, w


def _random_resized_crop(g: _Graph, step: Step, **_) -> None:
    size = step.args["size"]
    g.img = fn.random_resized_crop(g.img, size=list(size), random_area=list(step.args["scale"]),
                                   random_aspect_ratio=list(step.args["ratio"]), num_attempts=10,
                                   interp_type=_interp_type(step.args["interp"]), antialias=step.args["antialias"])
    g.h, g.w = size


def _crop_offsets(g: _Graph, crop: dict) -> tuple[Scalar, Scalar]:
    ch, cw = crop["size"]
    if crop["mode"] == "center":
        return center_offset(g.h, ch), center_offset(g.w, cw)
    left, top, right, bottom = crop["padding"]
    return (random_offset(g.h, ch, top, bottom, crop["pad_if_needed"]),
            random_offset(g.w, cw, left, right, crop["pad_if_needed"]))


def _slice(g: _Graph, step: Step, **_) -> None:
    ch, cw = step.args["size"]
    y, x = _crop_offsets(g, step.args)
    g.img = fn.slice(g.img, start=int_vector(y, x), shape=[int(ch), int(cw)], axis_names="HW",
                     out_of_bounds_policy="pad", fill_values=list(step.args["fill"]))
    g.h, g.w = ch, cw


def _coin(p: float):
    return fn.random.coin_flip(probability=p, dtype=types.INT32)


def _flip(g: _Graph, step: Step, **_) -> None:
    coin = _coin(step.args["p"])
    if step.args["horizontal"]:
        g.img = fn.flip(g.img, horizontal=coin, vertical=0)
    else:
        g.img = fn.flip(g.img, horizontal=0, vertical=coin)


def _crop_pos(offset: Scalar, slack: Scalar):
    """crop_mirror_normalize's normalised position for an integer offset, given extent - size."""
    if not is_node(slack):
        return offset / slack if slack else 0.0
    return as_float(offset) / as_float(select(slack == 0, 1, slack))


def _crop_mirror_normalize(g: _Graph, step: Step, **_) -> None:
    a = step.args
    if g.seq and a["layout"] == "HWC" and a["dtype"] == torch.uint8 and "crop" not in a and "mirror_p" not in a:
        return  # raw frames (output_format "THWC"): nothing to do
    raw = g.raw_output  # compiler.handoff maps the values
    kw: dict[str, Any] = dict(dtype=types.UINT8 if raw else _DALI_DTYPE.get(a["dtype"], types.FLOAT),
                              output_layout=("F" if g.seq else "") + a["layout"],
                              mean=[0.0] * 3 if raw else list(a["mean"]), std=[1.0] * 3 if raw else list(a["std"]))
    crop = a.get("crop")
    if crop is not None:
        ch, cw = crop["size"]
        y, x = _crop_offsets(g, crop)
        # crop_mirror_normalize places the window at roundf(pos * (extent - size)); passing
        # pos = offset / (extent - size) lands exactly on torchvision's integer offset
        pos_y, pos_x = _crop_pos(y, g.h - ch), _crop_pos(x, g.w - cw)
        # torchvision's RandomCrop raises for an image smaller than the crop unless pad_if_needed
        policy = "pad" if crop["pad_if_needed"] else "error"
        kw.update(crop=[float(ch), float(cw)], crop_pos_y=pos_y, crop_pos_x=pos_x, out_of_bounds_policy=policy,
                  fill_values=list(crop["raw_fill"] if raw else crop["fill"]))
        g.h, g.w = ch, cw
    if "mirror_p" in a:
        kw["mirror"] = _coin(a["mirror_p"])
    g.img = fn.crop_mirror_normalize(g.img, **kw)


@do_not_convert
def torchvision_augmentation_space(policy: str) -> dict:
    """torchvision's augmentation spaces (``_augmentation_space`` of TrivialAugmentWide, and of
    RandAugment and AutoAugment: magnitude ranges, which operations take a random sign), keyed by
    torchvision's operation names, built from DALI's auto_aug operations. DALI's own suites differ
    in small ways (enhance magnitudes from 0.01, solarize from 256, absolute translations)."""
    from nvidia.dali.auto_aug import augmentations as a

    if policy == "trivial_augment_wide":
        shear, rotate, enhance, bits = 0.99, 135, 0.99, (8, 2)
        translate_x = a.translate_x_no_shape.augmentation((0, 32), True)  # absolute pixels
        translate_y = a.translate_y_no_shape.augmentation((0, 32), True)
    else:
        shear, rotate, enhance, bits = 0.3, 30, 0.9, (8, 4)
        translate_x = a.translate_x.augmentation((0, 150 / 331), True)  # a share of the image size
        translate_y = a.translate_y.augmentation((0, 150 / 331), True)
    return {
        "TranslateX": translate_x, "TranslateY": translate_y,
        "ShearX": a.shear_x.augmentation((0, shear), True),
        "ShearY": a.shear_y.augmentation((0, shear), True),
        "Rotate": a.rotate.augmentation((0, rotate), True),
        "Brightness": a.brightness.augmentation((0, enhance), True, a.shift_enhance_range),
        "Color": a.color.augmentation((0, enhance), True, a.shift_enhance_range),
        "Contrast": a.contrast.augmentation((0, enhance), True, a.shift_enhance_range),
        "Sharpness": _sharpness().augmentation((0, enhance), True, a.sharpness_kernel),
        "Posterize": a.posterize.augmentation(bits, False, a.poster_mask_uint8),
        "Solarize": a.solarize.augmentation((255, 0)),
        "AutoContrast": a.auto_contrast,
        "Equalize": _equalize(),
        "Invert": a.invert,  # AutoAugment's policies only
        "Identity": a.identity,  # TrivialAugmentWide and RandAugment only
    }


@functools.lru_cache(maxsize=None)
def _sharpness():
    """DALI's auto_aug ``sharpness`` (PIL's ImageEnhance.Sharpness but the 1-px border), on DALI's
    ``fn.filter``: its own calls the deprecated ``fn.experimental.filter``, whose DeprecationWarning
    would reach the user though it says nothing about their code."""
    from nvidia.dali.auto_aug.core import augmentation

    conv = getattr(fn, "filter", None) or fn.experimental.filter  # (DALI < 1.4x: experimental only)

    @augmentation(mag_range=(0, 0.9), randomly_negate=True, param_device="auto", name="sharpness")
    def sharpness(data, kernel):
        return conv(data, kernel)
    return sharpness


@functools.lru_cache(maxsize=None)
def _equalize():
    """DALI's auto_aug ``equalize`` (OpenCV's lookup table) on ``fn.equalize``, for the same reason."""
    from nvidia.dali.auto_aug.core import augmentation

    eq = getattr(fn, "equalize", None) or fn.experimental.equalize

    @augmentation(name="equalize")
    def equalize(data, _):
        return eq(data)
    return equalize


@do_not_convert
def _suite(policy: str) -> list:
    space = torchvision_augmentation_space(policy)
    del space["Invert"]
    return list(space.values())


def _trivial_augment_wide(g: _Graph, step: Step, **_) -> None:
    from nvidia.dali.auto_aug.trivial_augment import apply_trivial_augment

    g.img = apply_trivial_augment(_suite("trivial_augment_wide"), g.img,
                                  num_magnitude_bins=step.args["num_magnitude_bins"], fill_value=step.args["fill"],
                                  interp_type=getattr(types, step.args["interp"]))


def _rand_augment(g: _Graph, step: Step, **_) -> None:
    from nvidia.dali.auto_aug.rand_augment import apply_rand_augment

    a = step.args
    g.img = apply_rand_augment(_suite("rand_augment"), g.img, n=a["num_ops"],
                               m=a["magnitude"], num_magnitude_bins=a["num_magnitude_bins"], shape=(g.h, g.w),
                               fill_value=a["fill"], interp_type=getattr(types, a["interp"]))


def _auto_augment(g: _Graph, step: Step, **_) -> None:
    from nvidia.dali.auto_aug.auto_augment import apply_auto_augment
    from nvidia.dali.auto_aug.core import Policy

    space = torchvision_augmentation_space("auto_augment")
    a = step.args
    policy = Policy(name="torchvision", num_magnitude_bins=a["num_magnitude_bins"],
                    sub_policies=[[(space[name], p, mag) for name, p, mag in sub] for sub in a["sub_policies"]])
    used = {name for sub in a["sub_policies"] for name, _, _ in sub}
    kwargs: dict[str, Any] = {}  # DALI rejects arguments that no operation of the policy takes
    if used & {"TranslateX", "TranslateY"}:
        kwargs["shape"] = (g.h, g.w)
    if used & {"TranslateX", "TranslateY", "ShearX", "ShearY", "Rotate"}:
        kwargs.update(fill_value=a["fill"], interp_type=getattr(types, a["interp"]))
    g.img = apply_auto_augment(policy, g.img, **kwargs)


def to_torch(tensor_list):
    """A DALI TensorList as one torch tensor (zero-copy via DLPack), or a list when shapes differ."""
    if tensor_list.is_dense_tensor():
        return torch.from_dlpack(tensor_list.as_tensor())
    samples = [tensor_list[i] for i in range(len(tensor_list))]
    kind, index = samples[0].__dlpack_device__() if samples else (None, None)
    if kind != 2:  # (kDLCUDA)
        return [torch.from_dlpack(t) for t in samples]
    # on the GPU: the consumer stream found once for the batch, not once a sample (torch.from_dlpack's
    # negotiation per call was 7% of a detection loader's main thread on the H100 host)
    stream = torch.cuda.current_stream(index).cuda_stream or 1
    try:
        return [torch.from_dlpack(t.__dlpack__(stream=stream)) for t in samples]
    except TypeError:  # a DALI whose __dlpack__ takes no stream
        return [torch.from_dlpack(t) for t in samples]


LOWER: dict[str, Callable] = {
    "auto_augment": _auto_augment,
    "trivial_augment_wide": _trivial_augment_wide,
    "rand_augment": _rand_augment,
    "timm_augment": timm_augment.lower,
    "decode": _decode,
    "video_decode": _video_decode,
    "resize": _resize,
    "random_resized_crop": _random_resized_crop,
    "slice": _slice,
    "flip": _flip,
    "crop_mirror_normalize": _crop_mirror_normalize,
    "joint": joint_dali.lower,
}


#: the lowerings that branch per sample on a DataNode (a Python ``if`` DALI's conditionals rewrite)
CONDITIONAL = ("trivial_augment_wide", "rand_augment", "auto_augment", "timm_augment")
#: steps whose graph runs its independent operators at once, each GPU operator on a stream of its own
#: (DALI's OperatorConcurrency.FULL, StreamPolicy.PER_OPERATOR): a recorded joint transform is hundreds of
#: small operators (torchvision's colour arithmetic, exactly: about seventy for the hue), which DALI otherwise
#: runs one after another. On the H200 host (benchmarks/detection.py, two runs each): ssd 2,372-2,425 ->
#: 2,641-2,807 img/s, seg 2,785-3,252 -> 3,244-3,569, hflip 4,368-4,548 -> 4,665-4,852; the classification
#: train chain 13,806-13,933 -> 13,770-15,021 (no gain there: left as it was)
CONCURRENT = ("joint",)

#: DALI's auto_aug modules whose functions never branch on a DataNode: the augmentations and the
#: magnitude arithmetic (only ``core._select`` and the policies' ``apply_*`` do)
_NO_BRANCHES = ("nvidia.dali.auto_aug.augmentations", "nvidia.dali.auto_aug.core._augmentation",
                "nvidia.dali.auto_aug.core._args")


@contextlib.contextmanager
def _quick_trace():
    """What DALI does per traced function and per operator that our graphs do not need, off for this
    build (#37: a TrivialAugmentWide graph's first batch took 4.3 s on a 2-core CPU, now 0.6):

    - AutoGraph (DALI's conditionals) rewrites every function a conditional definition calls unless
      told not to: parsing and transforming each one's source took 2.6 s. Only the functions that
      branch on a DataNode need it, so the others run as written: DALI's augmentations and
      magnitude arithmetic (by module, here) and our lowerings outside the auto-augment family
      (``do_not_convert``, in ``graph`` and on helpers).
    - Each operator records the Python stack that defined it, for DALI's error messages (about 1 ms
      an operator; an auto-augment graph has hundreds): ours name the samples and the transform."""
    from nvidia.dali._autograph.core import config

    try:
        from nvidia.dali._utils import dali_trace
    except ImportError:  # a DALI without origin tracing
        dali_trace = None
    with _TRACE_LOCK:  # both settings are process-wide: builds in two threads take turns
        saved = config.CONVERSION_RULES
        traced = dali_trace.is_tracing_enabled() if dali_trace else False
        config.CONVERSION_RULES = tuple(config.DoNotConvert(m) for m in _NO_BRANCHES) + saved
        if traced:
            dali_trace.set_tracing(enabled=False)
        try:
            yield
        finally:
            config.CONVERSION_RULES = saved
            if traced:
                dali_trace.set_tracing(enabled=True)


_TRACE_LOCK = threading.RLock()


@do_not_convert
def _encoded(plan: Plan, source: Optional[Callable], reader: Optional[Callable], no_copy: bool):
    """The graph's input node(s): encoded files (or a clip's bytes or frames) from ``source``, or ``reader()``."""
    if reader is not None:
        encoded = reader()
    elif plan.steps[0].op == "video_decode":  # (bytes, frame indices, size) or (frames, size)
        if plan.steps[0].args.get("decoder") == "nvdec":
            encoded = fn.external_source(source=source, batch=True, num_outputs=3, dtype=[
                types.UINT8, types.INT32, types.INT32], ndim=[1, 1, 1], no_copy=no_copy)
        elif plan.steps[0].args.get("frames") == "yuv420":  # (luma, chroma, [M T], size)
            encoded = fn.external_source(source=source, batch=True, num_outputs=4, dtype=[
                types.UINT8, types.UINT8, types.FLOAT, types.INT32], ndim=[4, 4, 2, 1],
                layout=["FHWC", "FHWC", "", ""], no_copy=no_copy)
        else:
            encoded = fn.external_source(source=source, batch=True, num_outputs=2, dtype=[
                types.UINT8, types.INT32], ndim=[4, 1], layout=["FHWC", ""], no_copy=no_copy)
    elif plan.steps[0].args.get("joint"):  # (encoded file, its row of the joint step's parameters)
        encoded = fn.external_source(source=source, batch=True, num_outputs=2, dtype=[types.UINT8, types.FLOAT],
                                     ndim=[1, 1], no_copy=no_copy)
    else:
        encoded = fn.external_source(source=source, batch=True, dtype=types.UINT8, ndim=1, name="encoded",
                                     no_copy=no_copy)
    return encoded


def _concurrency(plan: Plan) -> dict:
    """The pipeline's operator concurrency for ``plan`` (``CONCURRENT``); DALI's defaults where its release
    has no such setting (the dynamic executor's ``concurrency`` and ``stream_policy``)."""
    if not any(s.op in CONCURRENT for s in plan.steps):
        return {}
    import inspect

    import nvidia.dali as dali

    if not hasattr(dali, "OperatorConcurrency") or \
            "concurrency" not in inspect.signature(dali.Pipeline.__init__).parameters:
        return {}
    return dict(concurrency=dali.OperatorConcurrency.FULL, stream_policy=dali.StreamPolicy.PER_OPERATOR)


def build_pipeline(plan: Plan, source: Optional[Callable], *, device: str, batch_size: int, num_threads: int,
                   seed: int, prefetch_queue_depth: int = 2, device_id: Optional[int] = None,
                   hw_decoder_load: float = 0.9, jpeg_fancy_upsampling: bool = False,
                   reader: Optional[Callable] = None, checkpoint: Optional[bytes] = None,
                   no_copy: bool = False, raw_output: bool = False, joint_after: bool = False) -> Pipeline:
    """One DALI pipeline for ``plan``, fed encoded files by ``source`` (a batch callback), or by
    ``reader()`` (a function returning a DALI node of encoded files, e.g. fn.readers.file, used by
    the benchmarks to take Python out of the measurement). Checkpointing is on (DALI: no cost), so
    ``pipe.checkpoint()`` holds its random operators' state after the last batch handed out, and a
    pipeline built with ``checkpoint=`` draws what the saved one would have drawn next. ``no_copy``:
    DALI reads what ``source`` returns (encoded files, clips' frames) where it is, instead of copying
    it in the calling thread; the caller keeps them alive and unchanged until their iteration has run
    (``feed.PipelineSlot`` keeps the last batches fed). ``raw_output`` (only where ``plan.affine`` is set):
    the graph ends in its raw uint8 pixels, for ``compiler.handoff.to_float``. ``joint_after`` (the caller
    hands the outputs to ``compiler.handoff.finish`` with the second one's rows): a joint step that
    ``compiler.joint_kernels`` can do ends the graph at the decoded images, its rows of parameters beside them."""
    if raw_output and plan.affine is None:
        raise ValueError("raw_output: the plan's float output is no affine map of raw pixels (plan.affine is None)")
    if device == "gpu" and device_id is None:
        device_id = torch.cuda.current_device()

    # pipeline_def, not Pipeline: auto_aug picks an operation per sample with DALI's conditionals,
    # which only the traced definition supports
    @pipeline_def(batch_size=batch_size, num_threads=num_threads, device_id=device_id if device == "gpu" else None,
                  seed=seed, prefetch_queue_depth=prefetch_queue_depth, exec_dynamic=True,
                  enable_checkpointing=plan.checkpointable,
                  enable_conditionals=any(s.op in CONDITIONAL for s in plan.steps), **_concurrency(plan))
    def graph():  # AutoGraph rewrites this body in a conditional graph: the rest lives outside it
        encoded = _encoded(plan, source, reader, no_copy)
        g = _Graph(img=None, h=None, w=None, device=device, encoded=encoded, raw_output=raw_output,
                   joint_after=joint_after)
        for step in plan.steps:
            lower = LOWER[step.op] if step.op in CONDITIONAL else do_not_convert(LOWER[step.op])
            lower(g, step, hw_decoder_load=hw_decoder_load, jpeg_fancy_upsampling=jpeg_fancy_upsampling)
        return g.img if g.rows is None else (g.img, g.rows)

    # catch_warnings swaps the process's filters: builds in two threads take turns, or one's exit
    # would restore the filters under the other's build and DALI's notes below would reach the user
    with _TRACE_LOCK, warnings.catch_warnings():
        # torchvision's own AutoAugment policies have sub-policies of probability 0: true of torchvision's
        # policy, nothing the user wrote
        warnings.filterwarnings("ignore", message=r"The augmentation `\w+` in policy `torchvision` is used with "
                                                  "probability 0")
        # the source is the loader's feed, which a resumed iterator positions itself
        warnings.filterwarnings("ignore", message="Checkpointing enabled in a pipeline with external source")
        # a clip's size is fed for the steps that need it (a shorter-side resize, a crop); others do not
        warnings.filterwarnings("ignore", message=r"The external source node .* produces \d+ outputs, but the output")
        with _quick_trace():
            pipe = graph(checkpoint=checkpoint) if checkpoint is not None else graph()
            pipe.build()
    return pipe
