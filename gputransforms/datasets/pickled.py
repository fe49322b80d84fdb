"""A sample's extra pickled in a worker process with its large arrays beside the pickle, not in it.

``Pickled`` is what a worker hands back for a recorded sample's target: ``[length of the pickle][the
pickle][each large array's bytes]``. The pickle names each large array by where its bytes are
(``persistent_id``), so the main thread that loads it (``load``) puts each array where it will be used
with one copy: into pinned memory when the batch goes to the GPU (the copy to the device then reads it
from there), into an array of its own otherwise. Loaded in-band, as plain pickle does it, each mask was
copied out of the worker's ring into fresh memory by the unpickling and once more into pinned memory for
the device (``device._together``): two of the copies that bound the segmentation loader's main thread
(``benchmarks/results/h100-seg-pyspy-arena.txt``).

A detection target's pickler (``datasets.detection``) leaves every array beside its pickle, small ones too:
a batch of such pickles that came through torch's pipe goes to the GPU by ``load_to_device``, all their
arrays in one pinned buffer and one copy, each array a view of the device buffer as it is unpickled.

The pinned blocks come from torch's caching host allocator (``torch.empty(..., pin_memory=True)``) and
stay torch tensors: a copy to the device that reads one is recorded against its block, which is not
reused before the copy has run. (A pinned block handed back through NumPy loses that record.)
"""
from __future__ import annotations

import functools
import io
import pickle

import numpy as np
import torch

#: arrays from this size on travel beside the pickle
APART = 1 << 14
#: ``load(pin=IN_PLACE)``: the large arrays as torch tensors viewing the buffer itself (page-locked shared
#: memory the caller keeps unchanged until the copies that read them have run: ``backends.arena``)
IN_PLACE = "in place"
_ALIGN = 64
_LENGTH = 8  # the pickle's length, before it


def _arrays_at(n: int) -> int:
    """Where the arrays start after a pickle of ``n`` bytes (its length before it, aligned for their views)."""
    return -(-(_LENGTH + n) // _ALIGN) * _ALIGN


class Pickled(bytes):
    """A sample's extra (``FileSamples.extras``) pickled in a worker process, its large arrays beside the
    pickle: the main thread loads it as it receives it (``load``), from the worker's shared memory where
    it came through it (``backends.arena``)."""


class ArraysApart(pickle.Pickler):
    """A pickler that leaves each C-contiguous NumPy array of ``apart`` bytes or more (``APART``) out of the
    pickle: ``dumps`` puts their bytes after it."""

    apart = APART

    def __init__(self, file, protocol=pickle.HIGHEST_PROTOCOL):
        super().__init__(file, protocol=protocol)
        self.arrays: list = []
        self.size = 0

    def persistent_id(self, obj):
        if type(obj) is np.ndarray and obj.nbytes >= self.apart and obj.flags.c_contiguous and not obj.dtype.hasobject:
            at = self.size
            self.arrays.append(obj)
            self.size += -(-obj.nbytes // _ALIGN) * _ALIGN
            return at, obj.nbytes, obj.dtype.str, obj.shape
        return None

    @classmethod
    def dumps(cls, obj) -> Pickled:
        buf = io.BytesIO()
        p = cls(buf)
        p.dump(obj)
        stream = buf.getbuffer()
        start = _arrays_at(len(stream))
        out = bytearray(start + p.size)
        out[:_LENGTH] = len(stream).to_bytes(_LENGTH, "little")
        out[_LENGTH:_LENGTH + len(stream)] = stream
        view = np.frombuffer(out, np.uint8)
        at = start
        for a in p.arrays:
            view[at:at + a.nbytes] = a.reshape(-1).view(np.uint8)
            at += -(-a.nbytes // _ALIGN) * _ALIGN
        return Pickled(out)


class _Loader(pickle.Unpickler):
    def __init__(self, buf, start: int, stream, pin: bool):
        super().__init__(io.BytesIO(stream))
        self.buf, self.start, self.pin = buf, start, pin

    def persistent_load(self, pid):
        at, n, dtype, shape = pid
        src = np.frombuffer(self.buf, np.uint8, count=n, offset=self.start + at)
        if n < APART or not self.pin:  # (a small one goes to the device with the others: device._together)
            return src.copy().view(np.dtype(dtype)).reshape(shape)
        if self.pin == IN_PLACE:
            return torch.from_numpy(src).view(_torch_dtype(dtype)).view(shape)
        # a torch tensor in pinned memory, the one copy: the device's copy reads it from there
        out = torch.empty(n, dtype=torch.uint8, pin_memory=True)
        out.numpy()[:] = src
        return out.view(_torch_dtype(dtype)).view(shape)


def load(buf, pin=False):
    """What ``ArraysApart.dumps`` pickled, from ``buf`` (bytes, or a view of shared memory: nothing of it is
    kept). ``pin``: its large arrays come back as torch tensors in pinned memory, else as NumPy arrays;
    ``IN_PLACE``: as torch tensors viewing ``buf`` itself."""
    head = np.frombuffer(buf, np.uint8, count=_LENGTH)
    n = int.from_bytes(head.tobytes(), "little")
    stream = np.frombuffer(buf, np.uint8, count=n, offset=_LENGTH).tobytes()
    return _Loader(buf, _arrays_at(n), stream, pin).load()


class _DeviceLoader(pickle.Unpickler):
    def __init__(self, stream, typed: dict, base: int):
        super().__init__(io.BytesIO(stream))
        self.typed, self.base = typed, base

    def persistent_load(self, pid):
        at, n, dtype, shape = pid
        flat = self.typed.get(dtype)
        if flat is None:  # the device buffer viewed as this dtype, once a batch (its length is a multiple of _ALIGN)
            flat = self.typed[dtype] = self.typed[None].view(_torch_dtype(dtype))
        size = flat.element_size()
        strides, step = [], 1
        for d in reversed(shape):
            strides.append(step)
            step *= d
        # (one operation a tensor: a slice and two views were three, each a dispatch in the main thread)
        return flat.as_strided(shape, strides[::-1], (self.base + at) // size)


def load_to_device(bufs: list, dev: torch.device) -> list:
    """What ``ArraysApart.dumps`` pickled, from each of ``bufs`` (bytes), with the arrays beside each pickle as
    views of one buffer on ``dev``: every pickle's arrays, one after another, go through one pinned buffer and
    one copy. A detection batch's targets pickled with every array apart (``datasets.detection``) then come
    to the device as they are unpickled, instead of as CPU tensors gathered and copied again
    (``device._together``: a quarter of the ssd loader's main thread on the H100 host)."""
    heads, total = [], 0
    for b in bufs:
        n = int.from_bytes(b[:_LENGTH], "little")
        start = _arrays_at(n)
        heads.append((n, start, total))
        total += len(b) - start  # (a multiple of _ALIGN: each array's place is padded to it)
    host = torch.empty(total, dtype=torch.uint8, pin_memory=dev.type == "cuda")
    if total:
        np.concatenate([np.frombuffer(b, np.uint8, offset=start) for b, (_, start, _) in zip(bufs, heads)],
                       out=host.numpy())
    typed = {None: host.to(dev, non_blocking=True)}
    return [_DeviceLoader(bytes(b[_LENGTH:_LENGTH + n]), typed, base).load() for b, (n, _, base) in zip(bufs, heads)]


@functools.lru_cache(maxsize=None)
def _torch_dtype(dtype: str) -> torch.dtype:
    return torch.from_numpy(np.empty(0, np.dtype(dtype))).dtype
