"""Which device a chain runs on, and how a batch gets there: the ground floor that datasets, the
compiler and the loader import (nothing here imports them)."""
from __future__ import annotations

import copy
import os
from typing import Optional

import torch


def dali_available() -> bool:
    try:
        import nvidia.dali  # noqa: F401 - importable is the question
    except ImportError:
        return False
    return True


def default_device() -> str:
    """"gpu" when torch sees a CUDA device (DALI then decodes with nvJPEG), else "cpu"."""
    return "gpu" if torch.cuda.is_available() else "cpu"


def resolve(device: Optional[str]) -> str:
    """A user's ``device=`` argument as "gpu" or "cpu" (None: the default)."""
    if device not in (None, "gpu", "cpu", "cuda"):
        raise ValueError(f"device must be 'gpu', 'cpu' or None, got {device!r}")
    dev = "gpu" if device == "cuda" else (device or default_device())
    if dev == "gpu" and not torch.cuda.is_available():
        raise RuntimeError("device='gpu' but torch sees no CUDA device")
    return dev


def torch_device(device: str) -> torch.device:
    """The torch device batches are handed over on: this process's current CUDA device for "gpu"."""
    return torch.device("cuda", torch.cuda.current_device()) if device == "gpu" else torch.device("cpu")


def default_threads() -> int:
    """DALI's CPU threads when the user asks for none (``num_workers=0``): the cores this process may
    use, shared between the ranks that torchrun started on this host (``LOCAL_WORLD_SIZE``), so
    that N ranks do not each start a thread per core."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    return max(1, cores // max(1, ranks))


def rank_tag() -> str:
    """"rank R of W" when torch.distributed runs several ranks (errors then say which rank failed),
    else ""."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return f"rank {dist.get_rank()} of {dist.get_world_size()}"
    return ""


def to_device(batch, dev: torch.device):
    """Tensors in ``batch`` on ``dev``. A CPU tensor goes to the GPU through pinned memory: from
    pageable memory cudaMemcpyAsync first waits for everything queued on the stream (the user's
    training step included), which would make every hand-off a host synchronisation."""
    if isinstance(batch, torch.Tensor):
        if batch.device == dev:
            return batch
        if dev.type == "cuda" and batch.device.type == "cpu" and not batch.is_pinned():
            batch = batch.pin_memory()
        return batch.to(dev, non_blocking=True)
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(b, dev) for b in batch)
    if isinstance(batch, dict):
        out = copy.copy(batch)  # keeps the mapping's type (defaultdict, OrderedDict, a user's)
        for k, v in batch.items():
            out[k] = to_device(v, dev)
        return out
    return batch
