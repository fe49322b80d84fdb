"""After the graph: the transforms the planner could not lower to DALI, run on what the graph
handed over.

- tail_mode "tensor": the batch stays where it is (the GPU). Each transform runs in the batched
  stage when the registry has a batched kernel for it (torchvision's per-sample parameters, one batched kernel),
  else per sample with torchvision's own tensor kernels; consecutive per-sample transforms share
  one pass over the samples. Before the chain's ToTensor a sample is a uint8 CHW tensor standing in
  for the PIL image, so ToTensor means "scale to float" and PILToTensor/ToImage nothing.
- tail_mode "clip" (video): every transform runs per clip with torchvision on the device, so that
  a clip's frames share one set of random parameters, as torchvision gives them.
- tail_mode "pil": a callable in the tail expects the PIL image torchvision would give it, so each
  sample is moved to the CPU and becomes one.
"""
from __future__ import annotations

import numpy as np
import torch
from PIL import Image
from torch.utils.data import default_collate

from ..device import to_device


def _one_batch(samples: list) -> bool:
    """Whether per-sample outputs stack into one batch: all tensors of one shape and dtype."""
    return all(isinstance(s, torch.Tensor) for s in samples) and len({(s.shape, s.dtype) for s in samples}) == 1


def run_stages(batch, compiled: list):
    """(transform, function, stage) triples on a batch, in order: whole-batch functions on the batch,
    consecutive "per sample" ones in one pass over its samples. ``batch`` is the stage's to overwrite
    (the graph's output, a gather): a batched function may write into it rather than into a copy.

    Samples of different sizes (a list: the graph's output without a resize to one size, or after a
    per-sample ScaleJitter, RandomZoomOut, random resize) run the stages per sample, each as torchvision's
    transform itself (a conversion as the function it stands for), until they are one size again and make a
    batch: torchvision runs them on each sample. Samples still of different sizes at the end come back as a
    list, for the collate_fn (``default_collate`` raises on them, as it does in torch's DataLoader), and so do
    samples that are not one tensor (FiveCrop's and TenCrop's tuples)."""
    pending: list = []

    def settled(samples: list):
        return torch.stack(samples) if _one_batch(samples) else samples

    def flush(batch):
        if pending:
            out = []
            for img in batch:
                for t in pending:
                    img = t(img)
                # (a NumPy array of a user's Lambda as a tensor; FiveCrop's tuple, a PIL image as they are)
                out.append(torch.as_tensor(img) if isinstance(img, np.ndarray) else img)
            pending.clear()
            return settled(out)
        return batch

    if isinstance(batch, (list, tuple)):
        batch = settled(list(batch))
    for t, fn, stage in compiled:
        if fn is None:
            continue
        if stage == "per sample":
            pending.append(fn)
            continue
        batch = flush(batch)
        if isinstance(batch, list):  # samples of their own sizes: this stage per sample, as torchvision runs it
            pending.append(fn if stage == "conversion" else t)
        else:
            batch = fn(batch)
    batch = flush(batch)
    if isinstance(batch, list):
        return [b.as_subclass(torch.Tensor) if isinstance(b, torch.Tensor) else b for b in batch]
    return batch.as_subclass(torch.Tensor)


def run_tail(images, plan, device: torch.device, compiled: list) -> torch.Tensor:
    """``images``: the graph's output batch as a tensor (N,...) or a list of per-sample tensors.
    ``compiled``: ``stages.after_graph(plan)``, computed once by the caller (lowering is not per batch work)."""
    if plan.tail_mode in ("tensor", "clip"):
        return run_stages(images, compiled)
    samples = []
    for img in images:
        if plan.output == "image":
            img = Image.fromarray(img.cpu().numpy())
        for t in plan.tail:
            img = t(img)
        samples.append(img)
    if _one_batch(samples):
        return default_collate(samples).to(device)  # (one copy)
    # tuples (FiveCrop's), PIL images, samples of their own sizes: each as the chain made it, for the collate_fn
    # (or default_collate, which stacks or raises as it does in torch's loader)
    return [to_device(s, device) for s in samples]
