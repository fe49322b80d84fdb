"""How encoded files reach a DALI graph: one epoch's files read ahead in threads and fed in sampler
order (``EpochFeed``), and a pipeline together with the epoch it is being fed (``PipelineSlot``).

A slot belongs to one iterator at a time, so several live iterators over one loader each get their
own pipeline and their own full epoch; an iterator that is dropped hands its slot back, and the
next one drains it (the batches DALI had already prefetched) before feeding it a new epoch.
"""
from __future__ import annotations

import collections
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Optional

from . import files
from .datasets.adapters import FileSamples


class EpochFeed:
    """One pass over the sampler: reads files ahead in threads, feeds DALI, remembers the order."""

    def __init__(self, samples: FileSamples, batches, pool: ThreadPoolExecutor, lookahead: int, *, skip: bool,
                 gpu: bool, check_jpeg_scan: bool, skipped: list):
        self.paths = samples.paths
        self.batches = batches
        self.pool = pool
        self.lookahead = lookahead
        self.reading: collections.deque = collections.deque()
        self.in_flight: collections.deque = collections.deque()
        self.stopped = False
        self.skip = skip
        self.gpu = gpu
        self.check_jpeg_scan = check_jpeg_scan
        self.skipped = skipped
        self.error: Optional[files.BadSampleError] = None
        self._fill()

    def _read(self, indices):
        """Encoded files of one batch; bad files raise, or are dropped and recorded with on_error="skip"."""
        data, kept = [], []
        for i in indices:
            try:
                data.append(files.prepare(i, self.paths[i], small_jpegs_via_pil=self.gpu,
                                          check_jpeg_scan=self.check_jpeg_scan))
                kept.append(i)
            except files.BadSampleError as e:
                if not self.skip:
                    raise
                self.skipped.append(e)
        return kept, data

    def _fill(self):
        while not self.stopped and len(self.reading) < self.lookahead:
            indices = next(self.batches, None)
            if indices is None:
                break
            indices = list(indices)
            self.reading.append((indices, self.pool.submit(self._read, indices)))

    def pending(self) -> list:
        """Index batches handed to DALI or being read, in order (to replay after a rebuild)."""
        return [list(b) for b in self.in_flight] + [b for b, _ in self.reading]

    def next_encoded(self):
        """The external_source callback: the next batch of encoded files, in sampler order."""
        while True:
            if self.stopped or not self.reading:
                raise StopIteration
            _, future = self.reading.popleft()
            try:
                indices, data = future.result()
            except files.BadSampleError as e:
                self.error = e  # raised from the loop by the iterator, not from inside DALI
                raise StopIteration
            self._fill()
            if indices:  # a batch whose every file was skipped is not fed
                self.in_flight.append(indices)
                return data


class PipelineSlot:
    """A DALI pipeline and the epoch it is fed. The pipeline's callback reaches the slot through a
    weak reference: no cycle keeps the pipeline, its threads and its device memory alive."""

    def __init__(self):
        self.pipe = None
        self.epoch: Optional[EpochFeed] = None
        self.dirty = False  # an epoch was left mid-way: DALI may hold prefetched batches of it

    def callback(self) -> Callable:
        ref = weakref.ref(self)

        def feed():
            slot = ref()
            if slot is None or slot.epoch is None:
                raise StopIteration
            return slot.epoch.next_encoded()

        return feed

    def drain(self):
        """Finish an epoch left mid-way (the user broke out of the loop, or dropped the iterator) so
        that the next one starts clean."""
        epoch, self.epoch, dirty, self.dirty = self.epoch, None, self.dirty, False
        if epoch is not None:
            epoch.stopped = True
        if not dirty or self.pipe is None:
            return
        try:
            self.pipe.schedule_run()  # the callback now raises StopIteration: marks the end
            while True:
                self.pipe.outputs()
        except StopIteration:
            pass
        except RuntimeError:
            self.pipe = None  # a dead pipeline is rebuilt on the next epoch
            return
        self.pipe.reset()
