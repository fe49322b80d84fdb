"""Which device a chain runs on, and how a batch gets there: the ground floor that datasets, the
compiler and the loader import (nothing here imports them)."""
from __future__ import annotations

import copy
import os
from typing import Optional

import numpy as np
import torch
from torch.utils.data import default_collate


#: hardware work queues asked of the CUDA driver (its maximum; the default is 8)
CUDA_CONNECTIONS = 32
_CONNECTIONS_VAR = "CUDA_DEVICE_MAX_CONNECTIONS"
_connections_note = ""


def widen_cuda_connections() -> None:
    """Ask the CUDA driver for its 32 hardware work queues instead of 8, for this process, unless the
    user has chosen a number or CUDA has already started (``import gputransforms`` calls this).

    The driver maps every stream of a process onto ``CUDA_DEVICE_MAX_CONNECTIONS`` queues; DALI and
    nvJPEG create ~90 streams, so with 8 many of them share a queue with the training loop's stream
    and their kernels wait behind the model's. Measured on an H100 beside a ResNet-18 step (medians of
    29 runs): hand-written DALI +6%, gputransforms +11% (docs/performance-notes.md). The variable
    is read when CUDA starts in the process, so it must be set before; CUDA started by a library other
    than torch is not seen here."""
    global _connections_note
    if _CONNECTIONS_VAR in os.environ:
        _connections_note = f"{_CONNECTIONS_VAR}={os.environ[_CONNECTIONS_VAR]} (set before gputransforms was imported)"
    elif torch.cuda.is_initialized():
        _connections_note = (f"{_CONNECTIONS_VAR} unset: CUDA started before gputransforms was imported, so its streams "
                             f"share the driver's default 8 hardware queues; import gputransforms first, or set "
                             f"{_CONNECTIONS_VAR}={CUDA_CONNECTIONS}, to keep DALI's work out of the model's queues")
    else:
        os.environ[_CONNECTIONS_VAR] = str(CUDA_CONNECTIONS)
        _connections_note = f"{_CONNECTIONS_VAR}={CUDA_CONNECTIONS} (set by gputransforms)"


def cuda_connections_note() -> str:
    """What ``widen_cuda_connections`` found and did, for ``DataLoader.explain()``."""
    return _connections_note


_late_warned = [False]


def late_import_warning(device: str) -> Optional[str]:
    """The one-time warning for a GPU loader in a process where CUDA started before ``import
    gputransforms`` (a notebook, a framework that builds the model first): the driver's 8 queues are
    then fixed for the process. None when that is not the case, or it was said already."""
    if device != "gpu" or _late_warned[0] or not _connections_note.startswith(f"{_CONNECTIONS_VAR} unset"):
        return None
    _late_warned[0] = True
    return ("gputransforms: CUDA started before gputransforms was imported, so DALI's decoding shares the "
            "driver's 8 hardware queues with your model: measured on an H100 (ResNet-18, a plain training "
            "script), 9,125 img/s instead of 10,873 (-16%). Import gputransforms before anything that starts "
            f"CUDA, or launch with {_CONNECTIONS_VAR}={CUDA_CONNECTIONS} in the environment")


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


#: the attribute of a tensor held in uint8 that stands for a wider integer dtype (``compiler.joint_masks``)
WIDEN = "_gputransforms_widen_to"


def to_device(batch, dev: torch.device):
    """Tensors in ``batch`` on ``dev``. A CPU tensor goes to the GPU through pinned memory: from
    pageable memory cudaMemcpyAsync first waits for everything queued on the stream (the user's
    training step included), which would make every hand-off a host synchronisation. Several CPU
    tensors (a detection batch's targets) go together, one copy per dtype (``_together``)."""
    moved = None
    if dev.type == "cuda":
        leaves: list = []
        _cpu_leaves(batch, leaves)
        if len(leaves) > 1:
            moved = _together(leaves, dev)
    return _to_device(batch, dev, moved)


def batched(images):
    """A batch's images as torch's ``default_collate`` batches them: a tensor as it is; a list of samples (the
    graph's or the tail's output where their sizes differ, or samples that are tuples: FiveCrop's) through
    ``default_collate`` itself, which stacks, or raises its error ("stack expects each tensor to be equal
    size, ...")."""
    return images if isinstance(images, torch.Tensor) else default_collate(list(images))


def map_tensors(batch, fn):
    """``batch`` with each tensor in it (in lists, tuples and mappings, at any depth) replaced by ``fn(t)``;
    a mapping keeps its type (defaultdict, OrderedDict, a user's)."""
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if isinstance(batch, (list, tuple)):
        return type(batch)(map_tensors(b, fn) for b in batch)
    if isinstance(batch, dict):
        out = copy.copy(batch)
        for k, v in batch.items():
            out[k] = map_tensors(v, fn)
        return out
    return batch


def _to_device(batch, dev: torch.device, moved: Optional[dict]):
    def one(t: torch.Tensor) -> torch.Tensor:
        if moved is not None and id(t) in moved:
            return moved[id(t)]
        if t.device == dev:
            return t
        attributes = getattr(t, "__dict__", None)
        if dev.type == "cuda" and t.device.type == "cpu" and not t.is_pinned():
            t = t.pin_memory()
        out = t.to(dev, non_blocking=True)
        if attributes:  # (a tv_tensor's own metadata comes along anyway; any other attribute too)
            out.__dict__.update(attributes)
        return out

    return map_tensors(batch, one)


def _cpu_leaves(batch, out: list) -> None:
    if isinstance(batch, torch.Tensor):
        if batch.device.type == "cpu" and not batch.requires_grad:
            out.append(batch)
    elif isinstance(batch, (list, tuple)):
        for b in batch:
            _cpu_leaves(b, out)
    elif isinstance(batch, dict):
        for b in batch.values():
            _cpu_leaves(b, out)


def _pinned_cat(group: list, dtype: torch.dtype, dev: torch.device) -> torch.Tensor:
    """The plain tensors of ``group`` flattened one after another into one pinned buffer, by NumPy: one
    single-threaded copy. torch.cat here ran on the main process's intra-op threads, which wait for
    cores that torch's worker processes keep busy: on the H100 host cat of 32 masks (7 MB) took 47% of
    the segmentation loader's main thread."""
    pin = dev.type == "cuda"
    try:
        arrays = [t.numpy().reshape(-1) for t in group]
    except (RuntimeError, TypeError):  # a dtype NumPy lacks (bfloat16)
        flat = torch.cat([t.reshape(-1) for t in group])
        return flat.pin_memory() if pin else flat
    buf = torch.empty(sum(a.size for a in arrays), dtype=dtype, pin_memory=pin)
    np.concatenate(arrays, out=buf.numpy())
    return buf


def _together(leaves: list, dev: torch.device) -> dict:
    """CPU tensors on ``dev``, by ``id``: per dtype, one device buffer, each tensor a view of it with its own
    shape, type and attributes (a tv_tensor's format and canvas size, any other). Those in pageable memory
    go to it through one pinned buffer and one copy; those already pinned (a segmentation batch's masks,
    ``datasets.pickled``) are copied each from where they are. Tensors held narrow (``WIDEN``) are made
    their dtype in one step, the buffer at once. On the H100 host, moving a detection batch's targets one
    tensor at a time took 14-16% of the loader's main thread, and widening the masks one at a time 6%.
    Each tensor's size, shape and memory are read from a plain view of it: through a tv_tensor each read
    is a Python ``__torch_function__`` call (half of this function's time on a detection batch)."""
    moved: dict = {}
    by_dtype: dict = {}
    for t in leaves:
        if id(t) not in moved:
            moved[id(t)] = None
            plain = t if type(t) is torch.Tensor else t.as_subclass(torch.Tensor)
            attributes = t.__dict__
            by_dtype.setdefault((plain.dtype, attributes.get(WIDEN) if attributes else None), []).append(
                (t, plain, attributes))
    for (dtype, wide), group in by_dtype.items():
        flags = [p.is_contiguous() and p.is_pinned() for _, p, _ in group]
        paged = [g for g, f in zip(group, flags) if not f]
        pinned = [g for g, f in zip(group, flags) if f]
        group = paged + pinned  # (the device buffer's order)
        sizes = [p.numel() for _, p, _ in group]
        if not pinned:
            flat = _pinned_cat([p for _, p, _ in group], dtype, dev).to(dev, non_blocking=True)
        else:
            flat = torch.empty(sum(sizes), dtype=dtype, device=dev)
            parts = flat.split(sizes)
            if paged:
                flat[:sum(sizes[:len(paged)])].copy_(_pinned_cat([p for _, p, _ in paged], dtype, dev),
                                                     non_blocking=True)
            for (_, p, _), part in zip(pinned, parts[len(paged):]):
                part.copy_(p.view(-1), non_blocking=True)
        if wide is not None:
            flat = flat.to(wide)
        for (t, p, attributes), part in zip(group, flat.split(sizes)):
            part = part.view(p.shape)
            if type(t) is not torch.Tensor:
                part = part.as_subclass(type(t))
            if attributes:
                part.__dict__.update(attributes)
                part.__dict__.pop(WIDEN, None)
            moved[id(t)] = part
    return moved
