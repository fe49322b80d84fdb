"""After the graph, one sequence for every caller (the loader's compiled backend, ``compile()``):
``finish`` takes the graph's output as torch tensors and gives what the chain gives -- raw pixels made
float (below), the tail run (``tail``), the chain's dtype.

The hand-off of a float batch: on the GPU the graph ends in raw uint8 pixels (cropped, mirrored,
CHW) and the batch becomes the chain's float32 values here, ``raw * scale + shift`` per channel,
in one kernel (``torch.addcmul``) on the stream the training loop reads from.

Why: DALI keeps ``prefetch_queue_depth`` batches of its output in its own memory pool, beside the
batch the loop holds in torch's; as uint8 those queued batches take a quarter of float32's bytes
(38 MB instead of 154 MB a batch of 256 at 224x224), and the graph's last kernel writes a quarter
as much. The values are torchvision's to float32 rounding: ``(x / 255 - mean) / std`` is computed
as ``x * (1 / (255 std)) - mean / std`` (within 1e-6 of crop_mirror_normalize's own arithmetic).

Where it applies: ``Plan.hands_over_raw``. On the CPU the graph's threads normalize as before
(there the hand-off would move the work onto the main thread)."""
from __future__ import annotations

import functools

import torch

from . import joint_kernels, tail
from .plan import Plan


def to_float(images, plan: Plan):
    """The graph's raw uint8 batch (N, ..., C, H, W), or a list of samples, as ``plan.out_dtype``."""
    if isinstance(images, (list, tuple)):
        if not images:
            return []
        scale, shift = _coefficients(plan.affine, images[0].device)
        # one call for the batch (torch loops over the samples in C++: on the H100 host the Python loop
        # took 8% of a detection loader's main thread)
        return list(torch._foreach_addcmul([shift] * len(images), list(images), [scale] * len(images)))
    scale, shift = _coefficients(plan.affine, images.device)
    return torch.addcmul(shift, images, scale)


@functools.lru_cache(maxsize=16)
def _coefficients(affine: tuple, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale, shift) as (3, 1, 1) float32 tensors on ``device``, made once: the channel axis is -3
    in CHW images and FCHW clips."""
    return tuple(torch.tensor(v, dtype=torch.float32).view(3, 1, 1).to(device) for v in affine)


def finish(images, plan: Plan, device: torch.device, stages: list, *, raw: bool, per_sample: bool = False,
           rows=None):
    """The graph's output (a batch tensor, or a list of samples whose sizes differ) as the chain's output.
    ``raw``: the graph handed over raw pixels (``Plan.hands_over_raw``). ``stages``:
    ``stages.after_graph(plan)``, made once by the caller. ``per_sample``: a list is finished sample by
    sample (batches of one) instead of being stacked for the tail. ``rows``: the graph's second output, where
    it ended at the decoded images and left a joint step's pixels to ``joint_kernels`` (with the float map
    of the hand-off in the same pass)."""
    if rows is not None:
        images = joint_kernels.run(list(images), rows, plan.joint_program(), plan.affine if raw else None)
        raw = False
    if raw:
        images = to_float(images, plan)
    if isinstance(images, (list, tuple)) and per_sample:
        return [finish(img[None], plan, device, stages, raw=False)[0] for img in images]
    if plan.tail:  # (plan.out_dtype is the graph's: the tail's own conversions stand)
        return tail.run_tail(images, plan, device, stages)
    if isinstance(images, torch.Tensor) and images.dtype != plan.out_dtype:
        images = images.to(plan.out_dtype)  # (float64, bfloat16: DALI's output is float32)
    return images
