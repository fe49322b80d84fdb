"""The hand-off of a float batch: on the GPU the graph ends in raw uint8 pixels (cropped, mirrored,
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

from .plan import Plan


def to_float(images, plan: Plan):
    """The graph's raw uint8 batch (N, ..., C, H, W), or a list of samples, as ``plan.out_dtype``."""
    if isinstance(images, (list, tuple)):
        return [to_float(img, plan) for img in images]
    scale, shift = _coefficients(plan.affine, images.device)
    return torch.addcmul(shift, images, scale)


@functools.lru_cache(maxsize=16)
def _coefficients(affine: tuple, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale, shift) as (3, 1, 1) float32 tensors on ``device``, made once: the channel axis is -3
    in CHW images and FCHW clips."""
    return tuple(torch.tensor(v, dtype=torch.float32).view(3, 1, 1).to(device) for v in affine)
