"""What runs on batches outside the DALI graph, stage by stage: for each transform, whether it runs
batched (the registry's batched kernel), drawn ahead (its vectorized form, in-memory data), per
sample with torchvision's own kernels, or is a conversion of the tensor standing in for the PIL
image torchvision would hold (ToTensor means "scale to float", PILToTensor/ToImage nothing).

A stage list is (transform, function of the batch or None, stage name) triples; ``tail.run_stages``
runs one. ``after_graph(plan)`` gives the stages after a DALI graph, ``in_memory(transform)`` those
of a chain over in-memory images (``backends.arrays``).
"""
from __future__ import annotations

from typing import Callable, Optional

import PIL.Image
import torch
import torchvision.transforms as tv1
from torchvision import tv_tensors
from torchvision.transforms import v2 as tv2
from torchvision.transforms.v2 import functional as F2

from . import registry
from .chain import TO_TENSOR, NotLowerable, flatten, output_kind, tensor_capable


def _scale_to_float(x: torch.Tensor) -> torch.Tensor:
    return F2.to_dtype(x, torch.float32, scale=True)


def on_stand_in(t) -> Optional[Callable]:
    """What ``t`` means for a uint8 CHW tensor standing in for a PIL image (None: nothing)."""
    if isinstance(t, (tv1.ToTensor, tv2.ToTensor)):
        return _scale_to_float
    if isinstance(t, TO_TENSOR):
        return None
    return t


def _clips_to_cthw(batch: torch.Tensor) -> torch.Tensor:
    return batch.permute(0, 2, 1, 3, 4)


def after_graph(plan) -> list:
    """(transform, function of the batch or None, stage) for each tail transform, in order;
    stage is "batched", "per sample", "conversion" (a ToTensor on the stand-in) or "pil"."""
    out = []
    real = False
    for t in plan.tail:
        if plan.tail_mode == "clip":  # a clip's frames share one draw: never batched across clips
            if type(t).__name__ == "ConvertBCHWtoCBHW":  # torchvision's video references: (T,C,..) -> (C,T,..)
                out.append((t, _clips_to_cthw, "batched"))
            else:
                out.append((t, t, "per sample"))
            continue
        if plan.tail_mode != "tensor":
            out.append((t, None, "pil"))
            continue
        if real or isinstance(t, (tv1.ToPILImage, tv2.ToPILImage)):
            # from a ToPILImage on, a sample is what the chain itself made (a PIL image, then what follows makes
            # of it), not a tensor standing in for torchvision's PIL image: each step runs as written
            real = True
            out.append((t, t, "per sample"))
            continue
        fn = on_stand_in(t)
        if fn is None or fn is _scale_to_float:
            out.append((t, fn, "conversion"))
            continue
        b = registry.batched_of(fn)
        if b is None and plan.tail_kinds.get(id(t)) == "tv_image":
            fn = _given_a_tv_image(t)  # (what torchvision hands it after ToImage)
        out.append((t, b, "batched") if b is not None else (t, fn, "per sample"))
    return out


def _given_a_tv_image(t) -> Callable:
    """``t`` run on a sample as a ``tv_tensors.Image``, as torchvision's chain hands it after v2's ``ToImage`` (a
    function of the user's sees the type it was written for; v2 transforms that pass images through, such as
    ``UniformTemporalSubsample``, do so); a tensor it returns goes on as a plain one, as the stages run on them."""
    def run(x):
        out = t(x.as_subclass(tv_tensors.Image) if type(x) is torch.Tensor else x)
        return out.as_subclass(torch.Tensor) if isinstance(out, torch.Tensor) else out
    return run


def _grey_of_pil(t) -> Callable:
    """Grayscale(3) on one-channel tensors standing in for PIL "L" images: PIL makes three channels of the grey
    one, where v1's tensor kernel keeps its input's one."""
    def run(x: torch.Tensor) -> torch.Tensor:
        return x.repeat_interleave(3, dim=-3) if x.shape[-3] == 1 else t(x)
    return run


def in_memory(transform, pil: bool = True) -> list:
    """(transform, function of the batch or None, stage) for each transform of an in-memory chain; stage
    is "vectorized", "batched", "per sample" or "conversion". ``pil``: the chain starts on PIL images."""
    out = []
    image_state = pil
    for t in flatten(transform):
        if image_state and isinstance(t, TO_TENSOR):
            image_state = False
            out.append((t, on_stand_in(t), "conversion"))
            continue
        if image_state and not tensor_capable(t):  # (after ToTensor torchvision hands it a tensor too)
            raise NotLowerable(f"{type(t).__name__} needs a PIL image (its tensor kernels differ or are missing, "
                               "or it is the user's own)", "to compile it, put ToImage() or PILToTensor() before "
                               "it, or write it with torch ops on tensors")
        if image_state and isinstance(t, (tv1.Grayscale, tv2.Grayscale)) and t.num_output_channels == 3:
            out.append((t, _grey_of_pil(t), "batched"))  # (tensor_capable: not a subclass of the user's)
            continue
        fn = registry.vectorized_of(t)
        if fn is not None:
            out.append((t, fn, "vectorized"))
            continue
        fn = registry.batched_of(t)
        out.append((t, fn, "batched") if fn is not None else (t, t, "per sample"))
    if image_state:
        raise TypeError("the transform chain ends with a PIL image, which cannot be batched (torch's "
                        "default_collate raises too); end it with ToTensor() or PILToTensor()")
    return out


def item_kind(transform, plan_input: str) -> Optional[str]:
    """``chain.output_kind`` of a chain over decoded files: what torchvision's own items are ("pil",
    "tv_image", "tensor"), or None where the loader's own output stands."""
    if plan_input not in ("image", "image tensor"):
        return None
    return output_kind(transform, "tensor" if plan_input == "image tensor" else "pil")


def as_made(images: list, kind: Optional[str]) -> list:
    """Each sample's output as torchvision's chain makes it (``kind``: ``item_kind``): our stages run on plain
    tensors, so where torchvision hands a ``tv_tensors.Image`` (a v2 chain after ``ToImage``) the tensor is
    viewed as one, and where it hands a PIL image (a chain without a conversion) the graph's HWC uint8 pixels
    become one. What a collate_fn of the user's receives; default_collate makes the same batch of either."""
    if kind == "tv_image":
        return [_as_tv_image(x) for x in images]
    if kind == "pil":
        return [_as_pil(x) for x in images]
    return images


def _as_tv_image(x):
    if isinstance(x, (list, tuple)):  # FiveCrop / TenCrop
        return type(x)(_as_tv_image(c) for c in x)
    if type(x) is torch.Tensor:
        return x.as_subclass(tv_tensors.Image)
    return x


def _as_pil(x):
    if isinstance(x, (list, tuple)):
        return type(x)(_as_pil(c) for c in x)
    if isinstance(x, torch.Tensor) and x.dtype == torch.uint8 and x.ndim == 3:
        arr = x.cpu().numpy()
        return PIL.Image.fromarray(arr[..., 0] if arr.shape[-1] == 1 else arr)
    return x
