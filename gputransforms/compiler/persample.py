"""The slow path: run the transforms the planner could not lower, per sample, with torchvision
itself, on what the DALI graph handed over (PIL images before ToTensor, tensors after)."""
from __future__ import annotations

from typing import Sequence

import torch
from PIL import Image
from torch.utils.data import default_collate


def run_tail(images, output: str, tail: Sequence) -> torch.Tensor:
    """``images``: the graph's output batch as torch tensors (N,H,W,3 uint8 for "image", N,C,H,W
    for "tensor"), or a list of per-sample tensors when sizes differ."""
    samples = []
    for img in images:
        if output == "image":
            img = Image.fromarray(img.cpu().numpy())
        for t in tail:
            img = t(img)
        samples.append(img)
    return default_collate(samples)
