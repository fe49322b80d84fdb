"""The slow path: the transforms the planner could not lower, run per sample with torchvision
itself on what the DALI graph handed over.

- tail_mode "tensor": each sample stays where the batch is (the GPU) and goes through
  torchvision's tensor kernels; before the chain's ToTensor the sample is a uint8 CHW tensor
  standing in for the PIL image, so ToTensor means "scale to float" and PILToTensor/ToImage
  nothing. Per-pixel transforms (Normalize, dtype conversions) and ColorJitter (``BATCHED``) run
  once on the whole batch; consecutive others run in one pass over the samples.
- tail_mode "pil": a callable in the tail expects the PIL image torchvision would give it, so each
  sample is moved to the CPU and becomes one.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
import torchvision.transforms as tv1
from PIL import Image
from torch.utils.data import default_collate
from torchvision.transforms import v2 as tv2
from torchvision.transforms.v2 import functional as F2

from .. import _compat
from .plan import Plan, TO_TENSOR

_BATCHABLE = (tv1.Normalize, tv2.Normalize, tv1.ConvertImageDtype, tv2.ConvertImageDtype, tv2.ToDtype)


def _scale_to_float(x: torch.Tensor) -> torch.Tensor:
    return F2.to_dtype(x, torch.float32, scale=True)


def _on_stand_in(t) -> Optional[Callable]:
    """What ``t`` means for a uint8 CHW tensor standing in for a PIL image (None: nothing)."""
    if isinstance(t, (tv1.ToTensor, tv2.ToTensor)):
        return _scale_to_float
    if isinstance(t, TO_TENSOR):
        return None
    return t


def color_jitter_batched(t: tv1.ColorJitter, x: torch.Tensor) -> torch.Tensor:
    """torchvision's v1 ColorJitter on a whole (N,3,H,W) batch: per-sample parameters drawn with
    torchvision's own ``get_params`` (one call per sample, in order, as N calls of ``forward``
    draw them), then each of the four steps applied to the samples whose random order puts that
    adjustment there, with torchvision's tensor arithmetic (blend, grayscale, HSV)."""
    gray, rgb2hsv, hsv2rgb, convert, max_value = _compat.tensor_color_kernels()
    params = [t.get_params(t.brightness, t.contrast, t.saturation, t.hue) for _ in range(x.shape[0])]
    x = x.clone()
    bound = max_value(x.dtype)

    def blend(a, b, ratio):
        return (ratio * a + (1.0 - ratio) * b).clamp(0, bound).to(a.dtype)

    for step in range(4):
        for adj in range(4):
            rows = [i for i, p in enumerate(params) if int(p[0][step]) == adj and p[1 + adj] is not None]
            if not rows:
                continue
            idx = torch.tensor(rows, device=x.device)
            f = torch.tensor([params[i][1 + adj] for i in rows], dtype=torch.float32, device=x.device)[:, None, None, None]
            img = x[idx]
            if adj == 0:
                img = blend(img, torch.zeros_like(img), f)
            elif adj == 1:
                mean = gray(img).to(torch.float32).mean(dim=(-3, -2, -1), keepdim=True)
                img = blend(img, mean, f)
            elif adj == 2:
                img = blend(img, gray(img), f)
            else:
                h, sat, v = rgb2hsv(convert(img, torch.float32)).unbind(dim=-3)
                img = convert(hsv2rgb(torch.stack(((h + f[:, 0]) % 1.0, sat, v), dim=-3)), x.dtype)
            x[idx] = img
    return x


#: transforms with a batched implementation of torchvision's exact semantics
BATCHED = {tv1.ColorJitter: color_jitter_batched}


def run_tail(images, plan: Plan, device: torch.device) -> torch.Tensor:
    """``images``: the graph's output batch as a tensor (N,...) or a list of per-sample tensors."""
    if plan.tail_mode == "tensor":
        batch = images if isinstance(images, torch.Tensor) else torch.stack(list(images))
        pending: list = []  # consecutive per-sample transforms, applied in one pass over the samples

        def flush(batch):
            if pending:
                out = []
                for img in batch:
                    for t in pending:
                        img = t(img)
                    out.append(torch.as_tensor(img))
                batch = torch.stack(out)
                pending.clear()
            return batch

        for t in plan.tail:
            t = _on_stand_in(t)
            if t is None:
                continue
            if type(t) in BATCHED:
                batch = BATCHED[type(t)](t, flush(batch))
            elif isinstance(t, _BATCHABLE) or t is _scale_to_float:
                batch = t(flush(batch))
            else:
                pending.append(t)
        return flush(batch).as_subclass(torch.Tensor)
    samples = []
    for img in images:
        if plan.output == "image":
            img = Image.fromarray(img.cpu().numpy())
        for t in plan.tail:
            img = t(img)
        samples.append(img)
    return default_collate(samples).to(device)
