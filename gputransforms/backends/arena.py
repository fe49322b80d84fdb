"""The large parts of what a worker process hands back, through shared memory instead of torch's pipe.

A recorded joint transform's worker returns per sample the encoded file and the pickled target. With
segmentation masks that is about 330 KB a sample, and torch's result queue moves it through one pipe
whose reads (64 KB at a time, the worker's feeder thread refilling it) and unpickling are done by the
loader's main thread: py-spy on the H100 host, 47% of the segmentation loader's main thread
(``benchmarks/results/h100-seg-pyspy-arena.txt``). torch's own shared-memory hand-over of a tensor
costs more per tensor (a connection to the worker each: ``datasets/detection.py``).

Here each worker has a ring of shared memory, made by the parent before the workers fork (an unlinked
file in /dev/shm, mapped: each forked worker inherits the mapping, and nothing outlives the processes).
A worker writes each large piece into its ring and sends only where it is; the main thread copies it
out as soon as it takes the item from torch's queue (a pickled target, ``pickled.Pickled``, it loads
from the ring itself, its masks into pinned memory when the batch goes to the GPU: ``pin``), and marks
the ring read up to there. When the batch goes to the GPU the rings are also registered with CUDA as
page-locked memory (``cudaHostRegister``, in the main process once the workers run): a pickled target's
large arrays are then views of the ring, which the copy to the device reads where the worker wrote
them, and the ring is marked read only once that copy has run (``ProcessEpochFeed.copied``). A piece that
does not fit in the ring's free space, a worker started otherwise than by fork, or a host whose /dev/shm
has no room, sends the piece through the pipe as before.

Space is counted in two ever-growing offsets: ``written`` (the worker's own) and ``read`` (the first
word of the ring, written by the main thread). Items a new epoch drops unread (torch's persistent
workers drain their queue when an epoch starts over) are never marked read: each chunk of indices
carries its epoch's number (``ProcessDecoders``), and a worker that sees a new one counts everything
it wrote before as free, since torch delivers nothing of the old epoch once the new one has begun.
"""
from __future__ import annotations

import mmap
import os
import tempfile
from typing import Optional

import numpy as np
import torch

from ..datasets import pickled
from ..datasets.pickled import Pickled

#: pieces from this size on travel through the ring
LARGE = 1 << 15
#: a ring's size at most (the items a worker has ahead are a few chunks of samples: ``ProcessDecoders``)
RING = 16 << 20
_HEADER = 64  # the first word: the offset read up to (written by the main thread only)
_ALIGN = 64  # each piece starts on a multiple of this (its arrays may be viewed as their dtype)
_TAG = "\0gputransforms-ring"
_PORTABLE = 1  # cudaHostRegisterPortable


class Rings:
    """One ring per worker (``worker_id``), made in the parent before the workers start."""

    def __init__(self, workers: int, size: Optional[int] = None, pin: bool = False):
        self.maps: list = []
        self.taken = 0  # pieces copied out (the main thread's count)
        self.pin = pin  # a pickled target's large arrays are loaded into pinned memory (the batch goes to the GPU)
        self.registered: Optional[list] = None  # the rings' addresses once registered with CUDA (or [] if not)
        self.last_copy = None  # the CUDA event after the last batch's copies that read the rings in place
        size = min(RING if size is None else size, _room(workers))
        self.cap = (size - _HEADER) // _ALIGN * _ALIGN
        # the worker's side (each worker process has its own copy of these after the fork)
        self.written = 0
        self.freed = 0  # everything written before the current epoch began is free
        self.epoch: Optional[int] = None
        if size < 4 * LARGE:
            return
        for _ in range(workers):
            m = _mapped(size)
            if m is None:
                break
            self.maps.append(m)
        if len(self.maps) < workers:  # all or none: a partial set would fill the shared memory for nothing
            self.close()

    def __bool__(self) -> bool:
        return bool(self.maps)

    def __getstate__(self):  # a worker started by spawn or forkserver gets no rings (the pipe, as before)
        return {"maps": []}

    def close(self) -> None:
        self.wait_for_copies()
        maps, self.maps = self.maps, []
        for addr in self.registered or ():
            _cudart().cudaHostUnregister(addr)
        self.registered = None
        for m in maps:
            try:
                m.close()
            except BufferError:  # a view of it still alive somewhere: the mapping goes with the process
                pass

    def restart(self) -> None:
        """New worker processes are about to start (the first epoch, or after the last ones were stopped):
        each ring is empty again, and its read offset goes back to where their written one starts."""
        for m in self.maps:
            np.frombuffer(m, np.int64, count=1)[0] = 0

    # --- in a worker ------------------------------------------------------------------------------

    def stash(self, worker: int, epoch: int, items):
        """``items`` with each large bytes or 1-D uint8 array in them (in tuples and lists) written to
        worker ``worker``'s ring and replaced by where it is."""
        if not self.maps or worker >= len(self.maps):
            return items
        if epoch != self.epoch:  # torch delivers nothing of an earlier epoch any more
            self.epoch, self.freed = epoch, self.written
        return self._walk(self.maps[worker], worker, items, 0)

    def _walk(self, m, worker: int, x, depth: int):
        if isinstance(x, (tuple, list)) and depth < 4:
            return type(x)(self._walk(m, worker, y, depth + 1) for y in x)
        if type(x) is pickled.Part and x.table.keys is None:  # a chunk's masks as one table: its column (once)
            table = x.table
            column = table.columns[0]
            if isinstance(column, np.ndarray) and column.nbytes >= LARGE and column.flags.c_contiguous:
                placed = self._put(m, worker, column.reshape(-1).view(np.uint8), "a")
                if placed is not None:
                    table.columns = [(placed, column.dtype.str, column.shape)]
            return x
        if isinstance(x, bytes) and len(x) >= LARGE:
            return self._put(m, worker, x, "p" if isinstance(x, Pickled) else "b") or x
        if isinstance(x, np.ndarray) and x.dtype == np.uint8 and x.ndim == 1 and x.size >= LARGE \
                and x.flags.c_contiguous:
            return self._put(m, worker, x, "a") or x
        return x

    def _put(self, m, worker: int, data, kind: str):
        n = -(-len(data) // _ALIGN) * _ALIGN  # (the space it takes)
        self.written = -(-self.written // _ALIGN) * _ALIGN
        at = self.written % self.cap
        skip = self.cap - at if at + n > self.cap else 0  # a piece never wraps: the ring's end is left unused
        read = max(int(np.frombuffer(m, np.int64, count=1)[0]), self.freed)
        if self.written + skip + n - read > self.cap:
            return None  # no room now: this piece goes through the pipe
        self.written += skip
        at = self.written % self.cap
        m[_HEADER + at:_HEADER + at + len(data)] = data
        self.written += n
        return (_TAG, worker, at, len(data), self.written, kind)

    # --- in the main thread -----------------------------------------------------------------------

    def wait_for_copies(self) -> None:
        """Return once every copy that read a ring in place has run (a new epoch's workers count all that
        was written before as free; the rings are about to go)."""
        event, self.last_copy = self.last_copy, None
        if event is not None:
            event.synchronize()

    def register(self) -> bool:
        """Register the rings with CUDA as page-locked memory (once; in the main process, after the workers
        started: nothing CUDA crosses a fork). False where CUDA refuses (the pieces are then copied out)."""
        if self.registered is None:
            self.registered = []
            if self.pin and self.maps and torch.cuda.is_available():
                for m in self.maps:
                    view = np.frombuffer(m, np.uint8)
                    addr = view.ctypes.data
                    del view  # (the address stays valid while the mapping does)
                    # (portable: page-locked for every device's context, whichever the batch goes to)
                    if int(_cudart().cudaHostRegister(addr, len(m), _PORTABLE)) != 0:
                        break
                    self.registered.append(addr)
                if len(self.registered) < len(self.maps):  # all or none
                    for addr in self.registered:
                        _cudart().cudaHostUnregister(addr)
                    self.registered = []
        return bool(self.registered)

    def unstash(self, items, hold: bool = False):
        """``items`` with each piece a worker put in its ring copied out of it; each ring is marked read
        up to the last piece (the pieces of one worker come in the order it wrote them).

        ``hold``: an array piece (an encoded file) comes back as a view of the ring itself, not a copy,
        and no ring is marked read: the call returns ``(items, marks)``, and ``release(marks)`` marks
        them read once the views are no longer used (DALI has run the iteration fed with them). Copying
        each batch's files out took 6% of the detection loader's main thread (py-spy, H200 host)."""
        if not self.maps:
            return (items, {}) if hold else items
        marks: Optional[dict] = {} if hold else None
        out = self._take(items, 0, marks)
        return (out, marks) if hold else out

    def release(self, marks: dict) -> None:
        """Mark each ring read up to ``marks[worker]`` (from ``unstash(..., hold=True)``), in the order the
        batches were taken: the worker may then write over what those views showed."""
        for worker, end in marks.items():
            if worker < len(self.maps):
                head = np.frombuffer(self.maps[worker], np.int64, count=1)
                head[0] = max(int(head[0]), end)

    def _take(self, x, depth: int, marks: Optional[dict] = None):
        if isinstance(x, tuple) and len(x) == 6 and type(x[0]) is str and x[0] == _TAG:
            _, worker, at, n, end, kind = x
            m = self.maps[worker]
            view = np.frombuffer(m, np.uint8, count=n, offset=_HEADER + at)
            self.taken += 1
            if marks is not None:  # read later (release): an array stays where it is
                marks[worker] = end
                if kind == "a":
                    return view
                if kind == "p" and self.register():  # its large arrays: views of the registered ring
                    return pickled.load(view, pin=pickled.IN_PLACE)
            # an array or bytes copied out; a pickle loaded from the ring itself (its arrays are copies)
            out = view.copy() if kind == "a" else pickled.load(view, self.pin) if kind == "p" else view.tobytes()
            del view
            if marks is None:
                np.frombuffer(m, np.int64, count=1)[0] = end
            return out
        if isinstance(x, (tuple, list)) and depth < 4:
            return type(x)(self._take(y, depth + 1, marks) for y in x)
        if type(x) is pickled.Part and x.table.keys is None and type(x.table.columns[0]) is tuple:
            placed, dtype, shape = x.table.columns[0]  # (the ring's bytes, viewed as the column: once a table)
            # held and registered (page-locked, as for a pickled piece), the column stays a view of the ring, which
            # the copy to the device reads in place (the ring marked read once it has run: ``feed.copied``); else
            # a copy of its own: loaded on the CPU, the targets are views of the column, and the user keeps them
            in_place = marks is not None and self.register()
            column = self._take(placed, depth, marks)
            column = np.asarray(column) if in_place or marks is None else np.array(column)
            x.table.columns = [column.view(np.dtype(dtype)).reshape(shape)]
        return x


def _cudart():
    return torch.cuda.cudart()


def _room(workers: int) -> int:
    """Bytes a ring may take: a quarter of /dev/shm's free space shared by the workers (a container's
    /dev/shm is often 64 MB, and torch's own tensors need it too)."""
    try:
        st = os.statvfs("/dev/shm")
    except OSError:
        return 0
    return (st.f_bavail * st.f_frsize) // 4 // max(workers, 1)


def _mapped(size: int) -> Optional[mmap.mmap]:
    """``size`` bytes of shared memory, reserved up front (a later shortage would be SIGBUS), unlinked
    at once: the mapping lives while this process or a forked child holds it."""
    try:
        fd, path = tempfile.mkstemp(prefix="gputransforms-ring-", dir="/dev/shm")
    except OSError:
        return None
    try:
        os.unlink(path)
        os.posix_fallocate(fd, 0, size)
        return mmap.mmap(fd, size)
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
