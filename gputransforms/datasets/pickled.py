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
from typing import Optional

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


# --- a worker's chunk of targets as one object -----------------------------------------------------------------

#: whether a chunk's targets travel as one table (off: each pickled on its own, for the runs that compare the two)
TABLES = [True]


class Targets:
    """The targets of a worker's chunk (``compiler.joint_vector``: dicts of one structure), as one object that
    travels once with the chunk: each key's tensors concatenated along their first dimension (one array a key,
    each sample's length beside it), its plain values listed, its BoundingBoxes' format and canvas. Each sample's
    extra is a ``Part`` of it; the main thread loads a table once (``load``): all its arrays in one buffer and one
    copy to the device, each key's per-sample tensors split from it in one call, instead of one pickle, one
    unpickler and a view per tensor for each sample (``load_to_device``: a quarter of the lsj-v2 loader's main
    thread on an H200 host, benchmarks/results/stop32-chunks-recorded-at-once.txt)."""

    __slots__ = ("keys", "kinds", "columns", "lengths", "likes")

    @classmethod
    def of(cls, targets: list) -> Optional["Targets"]:
        """The table of ``targets`` (dicts with the same keys in the same order; each key's values plain CPU
        tensors of one dtype and trailing shape with at least one dimension, or BoundingBoxes so, or plain
        values), else None (each sample is then pickled on its own)."""
        from torchvision import tv_tensors

        if not TABLES[0] or not targets:
            return None
        if type(targets[0]) in (torch.Tensor, tv_tensors.Mask):
            return cls._bare(targets)
        if any(type(t) is not dict for t in targets):
            return None
        keys = tuple(targets[0])
        if any(tuple(t) != keys for t in targets):
            return None
        out = cls()
        out.keys, out.kinds, out.columns, out.lengths, out.likes = keys, [], [], [], []
        for k in keys:
            values = [t[k] for t in targets]
            kind = type(values[0])
            if kind is torch.Tensor or kind is tv_tensors.BoundingBoxes:
                got = _column([v.as_subclass(torch.Tensor) if type(v) is kind else None for v in values])
                if got is None:
                    return None
                out.kinds.append("boxes" if kind is tv_tensors.BoundingBoxes else "tensor")
                out.columns.append(got[0])
                out.lengths.append(got[1])
                # (a BoundingBoxes' metadata: a one-row stand-in of each sample's, which wrap copies)
                out.likes.append([tv_tensors.wrap(torch.empty(0, *got[0].shape[1:], dtype=values[0].dtype), like=v)
                                  for v in values] if kind is tv_tensors.BoundingBoxes else None)
            elif kind in (int, float, str, bool, type(None)) and all(type(v) is kind for v in values):
                out.kinds.append("value")
                out.columns.append(values)
                out.lengths.append(None)
                out.likes.append(None)
            else:
                return None
        return out

    @classmethod
    def _bare(cls, targets: list) -> Optional["Targets"]:
        """The table of targets that are each one tensor (a segmentation sample's mask: plain or ``Mask``, of one
        type, dtype and trailing shape, with the same attributes, such as ``WIDEN``), else None. Its one column
        travels through the worker's ring of shared memory (``backends.arena``), and loads onto the device with one
        copy from there."""
        kind, attributes = type(targets[0]), dict(targets[0].__dict__)
        if any(t.__dict__ != attributes for t in targets):
            return None
        got = _column([t.as_subclass(torch.Tensor) if type(t) is kind else None for t in targets])
        if got is None:
            return None
        out = cls()
        out.keys, out.kinds, out.columns, out.lengths, out.likes = None, ["bare"], [got[0]], [got[1]], \
            [(kind, attributes)]
        return out

    def __reduce__(self):
        return _targets, (self.keys, self.kinds, self.columns, self.lengths, self.likes)

    def load(self, dev: torch.device) -> list:
        """Each sample's target on ``dev``: its dict, its tensors views of one buffer copied there at once."""
        from torchvision import tv_tensors

        if self.keys is None:
            return self._load_bare(dev)
        arrays = [c for c, kind in zip(self.columns, self.kinds) if kind != "value"]
        places, total = [], 0
        for a in arrays:
            places.append(total)
            total += -(-a.nbytes // _ALIGN) * _ALIGN
        host = torch.empty(total, dtype=torch.uint8, pin_memory=dev.type == "cuda")
        flat = host.numpy()
        for a, at in zip(arrays, places):
            flat[at:at + a.nbytes] = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
        on = host.to(dev, non_blocking=True) if dev.type != "cpu" else host
        per_key: list = []
        it = iter(zip(arrays, places))
        for kind, column, lengths, likes in zip(self.kinds, self.columns, self.lengths, self.likes):
            if kind == "value":
                per_key.append(column)
                continue
            a, at = next(it)
            t = on[at:at + a.nbytes].view(_torch_dtype(a.dtype.str)).view(a.shape).split(lengths)
            if likes is not None:
                t = [tv_tensors.wrap(v, like=like) for v, like in zip(t, likes)]
            per_key.append(t)
        return [dict(zip(self.keys, row)) for row in zip(*per_key)]


    def _load_bare(self, dev: torch.device) -> list:
        """The tensors of a table of bare targets: the column copied to ``dev`` at once (from where it is when
        that is page-locked: the ring, registered), made its wider dtype there at once (``WIDEN``), split."""
        from ..device import WIDEN

        column = self.columns[0]
        kind, attributes = self.likes[0]
        t = torch.from_numpy(column)
        if dev.type != "cpu":
            if not t.is_pinned():
                host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
                host.numpy()[...] = column
                t = host
            t = t.to(dev, non_blocking=True)
        wide = attributes.get(WIDEN)
        if wide is not None:
            t = t.to(wide)
            attributes = {k: v for k, v in attributes.items() if k != WIDEN}
        out = t.split(self.lengths[0])
        if kind is not torch.Tensor:
            out = [v.as_subclass(kind) for v in out]
        if attributes:
            for v in out:
                v.__dict__.update(attributes)
        return list(out)


def _column(plain: list) -> Optional[tuple]:
    """A table's column of plain CPU tensors (None: not one) of one dtype and trailing shape, each of at least one
    dimension: (their rows concatenated, each one's number of rows), else None."""
    first = plain[0]
    if any(p is None or p.device.type != "cpu" or p.dtype != first.dtype or p.ndim == 0 or
           p.shape[1:] != first.shape[1:] or p.requires_grad for p in plain):
        return None
    return (np.concatenate([p.numpy() for p in plain]) if len(plain) > 1 else
            np.ascontiguousarray(first.numpy()).copy()), [int(p.shape[0]) for p in plain]


def _targets(keys, kinds, columns, lengths, likes) -> Targets:
    out = Targets()
    out.keys, out.kinds, out.columns, out.lengths, out.likes = keys, kinds, columns, lengths, likes
    return out


class Part:
    """Sample ``j``'s target in a chunk's ``Targets`` (its extra; the table travels once with the chunk)."""

    __slots__ = ("table", "j")

    def __init__(self, table: Targets, j: int):
        self.table, self.j = table, j

    def __reduce__(self):
        return Part, (self.table, self.j)


def resolve(targets: list, dev: torch.device) -> list:
    """``targets`` with each ``Part`` replaced by its target on ``dev`` (each table loaded once)."""
    if not any(type(t) is Part for t in targets):
        return targets
    tables: dict = {}
    out = []
    for t in targets:
        if type(t) is Part:
            got = tables.get(id(t.table))
            if got is None:
                got = tables[id(t.table)] = t.table.load(dev)
            t = got[t.j]
        out.append(t)
    return out
