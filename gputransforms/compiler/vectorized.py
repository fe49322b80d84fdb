"""Chains over in-memory images: every transform runs on the whole batch where it is (the GPU).

A batch starts as the uint8 (N, C, H, W) rows of the dataset's array, each standing in for the PIL
image torchvision would make of it (as in ``tail``: ToTensor scales, PILToTensor/ToImage do nothing).
The transforms the common recipes use draw their parameters for the whole batch at once from torch's
global RNG -- the same distributions as torchvision's per-sample draws, not the same numbers from a
seed (tests/test_inmemory.py tests them by distribution) -- because at CIFAR sizes a per-sample
Python draw costs more than the image's whole augmentation:

- RandomCrop (padding of any mode, pad_if_needed), RandomHorizontalFlip, RandomVerticalFlip.

The rest go where the tail sends them (``stages.in_memory``): the batched stage (Normalize, dtype
conversions, ColorJitter, RandomErasing, ...), else torchvision per sample on the device. A
transform that needs a PIL image (tensor kernels missing or meaning something else) makes the chain
``NotLowerable``: the loader then runs on torch's DataLoader.
"""
from __future__ import annotations

from typing import Optional

import torch
import torchvision.transforms.functional as F1

from .. import _compat
from .batched import to_dev


class Vectorized:
    """A random transform as two halves: ``draw(shape)`` takes the parameters of a whole batch from
    torch's global RNG on the CPU (an int64 (N, width) tensor), ``apply(x, params)`` uses them on
    the device. Called on a batch, it does both (one copy of the parameters to the device); a CUDA
    graph (``graphed.py``) replays the applies of a whole chain, its parameters copied in at once."""

    def __init__(self, width: int, draw, apply, out_shape=None):
        self.width, self.draw, self.apply = width, draw, apply
        self.out_shape = out_shape or (lambda shape: shape)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.apply(x, to_dev(self.draw(x.shape), x.device))


def lower_random_crop(t) -> Optional[Vectorized]:
    left, top, right, bottom = _compat.padding_ltrb(t)
    fill = _compat.constant_fill(t)
    if fill is None or len(set(fill)) != 1:
        return None  # a per-channel or per-type fill: torchvision's tensor pad takes one number
    th, tw = t.size

    def padded(shape) -> tuple:
        h, w = shape[-2] + top + bottom, shape[-1] + left + right
        if t.pad_if_needed:  # torchvision pads by the shortfall on both sides
            h, w = (2 * th - h if h < th else h), (2 * tw - w if w < tw else w)
        if h < th or w < tw:
            raise ValueError(f"Required crop size {(th, tw)} is larger than input image size {(h, w)}")
        return h, w

    def draw(shape) -> torch.Tensor:
        n, (h, w) = shape[0], padded(shape)
        i = torch.randint(0, h - th + 1, (n,))
        j = torch.randint(0, w - tw + 1, (n,))
        return torch.stack([i, j], 1)

    def apply(x: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        if left or top or right or bottom:
            x = F1.pad(x, [left, top, right, bottom], fill=fill[0], padding_mode=t.padding_mode)
        n, _, h, w = x.shape
        if t.pad_if_needed and h < th:
            x = F1.pad(x, [0, th - h], fill=fill[0], padding_mode=t.padding_mode)
        if t.pad_if_needed and w < tw:
            x = F1.pad(x, [tw - w, 0], fill=fill[0], padding_mode=t.padding_mode)
        rows = p[:, 0, None] + torch.arange(th, device=x.device)
        cols = p[:, 1, None] + torch.arange(tw, device=x.device)
        nhwc = x.permute(0, 2, 3, 1)
        out = nhwc[torch.arange(n, device=x.device)[:, None, None], rows[:, :, None], cols[:, None, :]]
        return out.permute(0, 3, 1, 2).contiguous()

    return Vectorized(2, draw, apply, lambda shape: (*shape[:-2], th, tw))


def lower_flip(dim: int):
    def build(t) -> Vectorized:
        def draw(shape) -> torch.Tensor:
            return (torch.rand(shape[0]) < t.p).to(torch.int64)[:, None]

        def apply(x: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
            return torch.where(p[:, 0, None, None, None] > 0, x.flip(dim), x)
        return Vectorized(1, draw, apply)
    return build
