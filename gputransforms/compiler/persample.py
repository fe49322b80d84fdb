"""The slow path: the transforms the planner could not lower, run per sample with torchvision
itself on what the DALI graph handed over.

- tail_mode "tensor": each sample stays where the batch is (the GPU) and goes through
  torchvision's tensor kernels; before the chain's ToTensor the sample is a uint8 CHW tensor
  standing in for the PIL image, so ToTensor means "scale to float" and PILToTensor/ToImage
  nothing. Deterministic per-pixel transforms at the end (Normalize, dtype conversions) run once
  on the stacked batch.
- tail_mode "pil": a callable in the tail expects the PIL image torchvision would give it, so each
  sample is moved to the CPU and becomes one.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch
import torchvision.transforms as tv1
from PIL import Image
from torch.utils.data import default_collate
from torchvision.transforms import v2 as tv2
from torchvision.transforms.v2 import functional as F2

from .plan import Plan, TO_TENSOR

_BATCHABLE = (tv1.Normalize, tv2.Normalize, tv1.ConvertImageDtype, tv2.ConvertImageDtype, tv2.ToDtype)


def _scale_to_float(x: torch.Tensor) -> torch.Tensor:
    return F2.to_dtype(x, torch.float32, scale=True)


def _on_stand_in(t) -> Callable:
    """What ``t`` means for a uint8 CHW tensor standing in for a PIL image."""
    if isinstance(t, (tv1.ToTensor, tv2.ToTensor)):
        return _scale_to_float
    if isinstance(t, TO_TENSOR):
        return lambda x: x
    return t


def split_batchable_suffix(tail: Sequence) -> tuple[list, list]:
    """(per-sample part, trailing part that can run on the whole batch at once)."""
    k = len(tail)
    while k > 0 and isinstance(tail[k - 1], _BATCHABLE + (tv1.ToTensor, tv2.ToTensor) + TO_TENSOR):
        k -= 1
    return list(tail[:k]), list(tail[k:])


def run_tail(images, plan: Plan, device: torch.device) -> torch.Tensor:
    """``images``: the graph's output batch as a tensor (N,...) or a list of per-sample tensors."""
    if plan.tail_mode == "tensor":
        per_sample, batched = split_batchable_suffix(plan.tail)
        per_sample = [_on_stand_in(t) for t in per_sample]
        samples = []
        for img in images:
            for t in per_sample:
                img = t(img)
            samples.append(img)
        batch = torch.stack([torch.as_tensor(s) for s in samples]) if per_sample else images
        if not isinstance(batch, torch.Tensor):
            batch = torch.stack(list(batch))
        for t in batched:
            batch = _on_stand_in(t)(batch)
        return batch.as_subclass(torch.Tensor)
    samples = []
    for img in images:
        if plan.output == "image":
            img = Image.fromarray(img.cpu().numpy())
        for t in plan.tail:
            img = t(img)
        samples.append(img)
    return default_collate(samples).to(device)
