"""How encoded files reach a DALI graph: one epoch's files read ahead in threads and fed in sampler
order (``EpochFeed``; samples decoded on the CPU, video clips, come from worker processes instead:
``ProcessEpochFeed``), and a pipeline together with the epoch it is being fed (``PipelineSlot``).

A slot belongs to one iterator at a time, so several live iterators over one loader each get their
own pipeline and their own full epoch; an iterator that is dropped hands its slot back, and the
next one drains it (the batches DALI had already prefetched) before feeding it a new epoch.
"""
from __future__ import annotations

import collections
import gc
import inspect
import queue
import threading
import weakref
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Callable, Optional

import torch
import torch.utils.data as tud
from torch._utils import ExceptionWrapper

from .. import files
from ..datasets.adapters import FileSamples
from ..errors import bad_sample
from . import arena


class ReaderThreads:
    """``ThreadPoolExecutor.submit`` on daemon threads. A read that never returns (a FIFO, a stuck
    network mount) then cannot hold the process: concurrent.futures joins its own threads at interpreter
    exit, so after Ctrl-C such a process never ended; torch's DataLoader exits in half a second."""

    def __init__(self, workers: int, name: str):
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.threads = [threading.Thread(target=self._work, name=f"{name}-{k}", daemon=True) for k in range(workers)]
        for t in self.threads:
            t.start()

    def _work(self):
        while True:
            item = self.queue.get()
            if item is None:
                return
            future, fn, args = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args))
            except BaseException as e:  # noqa: BLE001 - handed to whoever waits on the future
                future.set_exception(e)

    def submit(self, fn, *args) -> Future:
        future: Future = Future()
        self.queue.put((future, fn, args))
        return future

    def shutdown(self, wait: bool = True, cancel_futures: bool = False):
        """End the threads once their current read returns; ``wait``: up to a second for them."""
        while cancel_futures:
            try:
                item = self.queue.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                item[0].cancel()
        for _ in self.threads:
            self.queue.put(None)
        if wait:
            for t in self.threads:
                t.join(timeout=1.0)


class _Held:
    """A batch fed from the workers' rings (``ProcessEpochFeed``): how far each ring may be marked read once
    DALI no longer reads its files there (``marks``), the batch's kept indices as ``in_flight`` holds them,
    and the CUDA event after the copies that read its targets in the rings (``ProcessEpochFeed.copied``)."""

    __slots__ = ("marks", "kept", "copies")

    def __init__(self, marks: dict):
        self.marks, self.kept, self.copies = marks, None, None


class EpochFeed:
    """One pass over the sampler: reads files ahead in threads, feeds DALI, remembers the order.
    ``timeout`` (torch's DataLoader argument; 0: none): seconds a batch's files may take to read before
    the epoch ends with an error naming the sample whose read stalled. ``ahead``: once the epoch's last
    batch is read, the next epoch's first batches (``backends.ahead.next_epoch``), or None; the feed then
    reads and feeds those on after the epoch's own (``spec``), and the next epoch's iterator takes the feed
    on (``adopt``) where they are the batches its sampler drew."""

    extras: Optional[collections.deque] = None  # what samples gave beside the graph's inputs, per batch fed
    spec: Optional[list] = None  # the next epoch's batches read so far, once this epoch's are all read
    spec_in_flight = 0  # of them, fed (the last ones of in_flight)
    spec_failed = False  # a file of them failed: the next epoch starts anew, and reads it again
    ended = False  # the callback told DALI the data ended (DALI's queue ends there)

    def __init__(self, samples: FileSamples, batches, pool: ReaderThreads, lookahead: int, *, skip: bool,
                 gpu: bool, check_jpeg_scan: bool, skipped: list, timeout: float = 0, via_pil: frozenset = frozenset(),
                 ahead: Optional[Callable[[], Optional[list]]] = None):
        self.samples, self.timeout = samples, timeout
        read = samples.reader(gpu=gpu, check_jpeg_scan=check_jpeg_scan)
        # samples DALI failed on earlier (``via_pil``): decoded by PIL, handed over losslessly
        self.read_one = read if not via_pil else \
            (lambda i: samples.decoded_by_pil(i) if i in via_pil else read(i))
        self.columns = samples.num_inputs(gpu)
        self.batches = batches
        self.pool = pool
        self.lookahead = lookahead
        # (indices, the sample being read, the read's future, whether the batch is the next epoch's, whether it
        # was read as one: its bad files raise)
        self.reading: collections.deque = collections.deque()
        self.in_flight: collections.deque = collections.deque()
        self.stopped = False
        self.skip = skip
        self.skipped = skipped
        self.error: Optional[files.BadSampleError] = None
        self.ahead = ahead
        self._fill()

    def _read(self, indices, now: list, spec: bool = False):
        """Encoded files of one batch; bad files raise, or are dropped and recorded with on_error="skip"
        (the next epoch's, read ahead, always raise: the epoch that meets them records them).
        ``now[0]``: the sample being read (for a timeout's error)."""
        data, kept = [], []
        for i in indices:
            now[0] = i
            try:
                data.append(self.read_one(i))
                kept.append(i)
            except files.BadSampleError as e:
                if spec or not self.skip:
                    raise
                self.skipped.append(e)
        return kept, data

    def _fill(self):
        while not self.stopped and len(self.reading) < self.lookahead:
            indices = next(self.batches, None)
            if indices is None:
                if self.spec is not None or not self._read_on():
                    break
                continue
            indices, now, spec = list(indices), [None], self.spec is not None
            if spec:
                self.spec.append(indices)
            self.reading.append((indices, now, self.pool.submit(self._read, indices, now, spec), spec, spec))

    def _read_on(self) -> bool:
        """This epoch's batches are all read or being read: go on with the next epoch's first ones, if
        ``ahead`` knows them."""
        ahead, self.ahead = self.ahead, None
        got = ahead() if ahead is not None else None  # (the next iterator's seed, its first batches)
        # (an epoch shorter than that would end in DALI's queue before the next iterator takes the feed on)
        if not got or len(got[1]) < self.lookahead:
            return False
        self.spec, self.batches = [], iter(got[1])
        return True

    def handed_out(self) -> bool:
        """Reading on into the next epoch, and every batch of this one fed and handed out: the iterator
        ends here, with the next epoch's batches in DALI's queue."""
        return self.spec is not None and len(self.in_flight) == self.spec_in_flight and \
            all(entry[3] for entry in self.reading)

    def adopt(self, first: list, batches, skipped: list, skip: bool,
              ahead: Optional[Callable[[], Optional[tuple]]], seed: Optional[int] = None) -> bool:
        """The next epoch's iterator takes this feed on: ``first`` the batches its sampler drew (as many as
        were read ahead), ``batches`` the sampler's iterator past them, ``seed`` its seed. True where they are
        the batches read ahead, and this feed then goes on as that epoch's; False (nothing changed) otherwise."""
        if self.spec is None or self.spec_failed or self.stopped or self.ended or self.error is not None or \
                [list(b) for b in first] != self.spec:
            return False
        self.spec, self.spec_in_flight = None, 0
        self.reading = collections.deque((i, now, f, False, ahead) for i, now, f, _, ahead in self.reading)
        self.batches, self.skipped, self.skip, self.ahead = batches, skipped, skip, ahead
        self._fill()
        return True

    def stop(self):
        self.stopped = True

    def copied(self, kept: list, dev: torch.device) -> None:
        """The batch ``kept`` is on the device (its targets' copies queued): nothing here reads in place."""

    def pending(self) -> list:
        """This epoch's index batches handed to DALI or being read, in order (to replay after a rebuild)."""
        fed = list(self.in_flight)[:len(self.in_flight) - self.spec_in_flight]
        return [list(b) for b in fed] + [entry[0] for entry in self.reading if not entry[3]]

    def rest(self):
        """This epoch's batches not read yet (to replay after a rebuild, after ``pending``)."""
        return iter(()) if self.spec is not None else self.batches

    def rest_place(self) -> int:
        """The place in the epoch of the first sample of ``rest`` (where samples are seeded by their place)."""
        return 0

    def next_encoded(self):
        """The external_source callback: the next batch of encoded files, in sampler order."""
        try:
            return self._next_encoded()
        except StopIteration:
            self.ended = True
            raise

    def _next_encoded(self):
        while True:
            if self.stopped or not self.reading:
                raise StopIteration
            batch, now, future, spec, read_as_next = self.reading.popleft()
            try:
                try:
                    indices, data = future.result(timeout=self.timeout or None)
                except files.BadSampleError:
                    if spec or not (read_as_next and self.skip):
                        raise
                    # read ahead as the next epoch's, where a bad file raises: this epoch skips it, so read again
                    indices, data = self._read(batch, now)
            except (files.BadSampleError, FutureTimeout) as e:
                if spec:  # a file of the next epoch's: that epoch meets it itself, after a new start
                    self.spec_failed = self.stopped = True
                    raise StopIteration
                if isinstance(e, files.BadSampleError):
                    self.error = e  # raised from the loop by the iterator, not from inside DALI
                    raise StopIteration
                i = now[0]
                path = self.samples.paths[i] if i is not None else "?"
                self.error = RuntimeError(f"gputransforms: DataLoader timed out after {self.timeout} seconds: the "
                                          f"read of sample {i} ({path}) did not return")
                self.stopped = True
                raise StopIteration
            self._fill()
            if indices:  # a batch whose every file was skipped is not fed
                self.in_flight.append(indices)
                self.spec_in_flight += spec
                if self.columns > 1:  # one list per output of the external source
                    return tuple(list(col) for col in zip(*data))
                return data


class _Decoded(tud.Dataset):
    """Index -> (index, the graph's inputs as tensors, None) or (index, None, the error's arguments),
    in a worker process (tensors travel back through shared memory, arrays would be pickled).
    ``extras``: ``read`` returns (the graph's inputs, something for the batch beside them: a recorded
    joint transform's target), and both travel pickled (small inputs: an encoded file, a row of
    parameters; one pickle is cheaper than a shared-memory segment per tensor)."""

    def __init__(self, read: Callable, extras: bool = False, rings: Optional[arena.Rings] = None):
        self.read, self.extras, self.rings = read, extras, rings

    def __len__(self) -> int:  # never asked: the sampler drives
        raise TypeError

    def __getitem__(self, item):
        """``item``: (the epoch's number, the chunk's place in the epoch, a list of indices (or (index, seed)
        pairs) of one batch); (the chunk's place, one result per sample), its large parts in this worker's
        ring of shared memory where it has one."""
        epoch, seq, chunk = item
        info = tud.get_worker_info()
        try:
            many = getattr(self.read, "many", None) if self.extras else None
            out = self._many(chunk, many) if many is not None else [self._one(i) for i in chunk]
        except Exception:  # noqa: BLE001 - in a worker: raised in the main thread when its batch is next, as
            if info is None:  # torch's own worker loop wraps it (its chunk may come back before those ahead)
                raise
            return seq, ExceptionWrapper(where=f"in DataLoader worker process {info.id}")
        if self.rings and info is not None:
            out = self.rings.stash(info.id, epoch, out)
        return seq, out

    def _many(self, chunk: list, many: Callable) -> list:
        """The chunk's samples with seeds of their own read together (``many``, a recorded joint transform's
        ``read.many``, given (index, seed[, True: its file decoded by PIL]): None for a sample it leaves), the
        others one by one."""
        seeded = [k for k, i in enumerate(chunk) if isinstance(i, tuple) and i[1] is not None]  # (index, seed[, pil])
        got = dict(zip(seeded, many([chunk[k] for k in seeded]))) if seeded else {}
        return [(chunk[k][0], tuple(got[k][0]), None, got[k][1]) if got.get(k) is not None else self._one(chunk[k])
                for k in range(len(chunk))]

    def _one(self, i):
        pil = False
        if isinstance(i, tuple):  # (index, seed[, True]): this sample's draws from its own seed (``_Flat.seed``)
            i, seed, *pil = i  # (True: its file to be decoded by PIL, ``_Flat.via_pil``)
            if seed is not None:
                # the CPU generator's, which is all a forked worker draws from (it cannot use CUDA): what
                # torch.manual_seed sets there, without the CUDA seeding it queues with stack traces each time
                # (77 us a sample, about a tenth of recording lsj-v2's)
                torch.default_generator.manual_seed(seed)
        try:
            if self.extras:
                inputs, extra = self.read(i, pil=True) if pil else self.read(i)
                return i, tuple(inputs), None, extra
            return i, tuple(torch.from_numpy(a) for a in self.read(i)), None
        except files.BadSampleError as e:
            return i, None, e.record()


class Placed(list):
    """A batch's indices with each sample's place in the epoch (``places``), which seeds its draws: a batch fed
    again after the pipeline was built anew (``CompiledIterator._refeed``) keeps them."""

    __slots__ = ("places",)

    def __init__(self, indices, places):
        super().__init__(indices)
        self.places = list(places)


def same_places(batch) -> list:
    """A copy of ``batch``, its samples' places kept where it has them."""
    places = getattr(batch, "places", None)
    return list(batch) if places is None else Placed(batch, places)


def without(batch, left_out) -> list:
    """``batch`` without the indices in ``left_out``, the others' places kept where it has them."""
    places = getattr(batch, "places", None)
    if places is None:
        return [i for i in batch if i not in left_out]
    kept = [(i, p) for i, p in zip(batch, places) if i not in left_out]
    return Placed([i for i, _ in kept], [p for _, p in kept])


def _by_pil(item, via_pil: frozenset):
    """A sampler item (an index, or (index, seed)) as (index, seed or None, True) where its file is to be decoded
    by PIL in the worker (``_Decoded._one``)."""
    i = item[0] if isinstance(item, tuple) else item
    if i not in via_pil:
        return item
    return (*item, True) if isinstance(item, tuple) else (item, None, True)


class _Flat(tud.Sampler):
    """The current epoch's index batches as one stream of chunks of indices (each worker reads one chunk
    at a time, so a batch is spread over several of them), remembering the batches in order.
    ``chunk``: samples per chunk (a chunk never spans two batches)."""

    def __init__(self, chunk: int = 1, ramp: int = 0):
        self.chunk = chunk
        # the epoch's first ``ramp`` batches go out in smaller chunks (``size``): at an epoch's start every
        # worker is idle and DALI's queue is empty, and a first batch in one chunk of 32 would wait for one
        # worker to record 32 samples in a row (35-50 ms for lsj-v2 on an H100 host)
        self.ramp = ramp
        self.batches = iter(())
        self.pulled: collections.deque = collections.deque()  # batches handed to workers, not yet returned
        # beside pulled: each batch's first chunk's place in the epoch and its number of chunks
        self.starts: collections.deque = collections.deque()
        # set: each index goes out with a seed of its own, from this one and its place in the epoch, so
        # that an epoch's draws do not depend on which worker takes which sample
        self.seed: Optional[int] = None
        self.epoch = 0  # each chunk goes out with it (arena.Rings: what a worker wrote before is free)
        self.offset = 0  # the place in the epoch of the first sample of ``batches`` (a resumed epoch's, or the rest
        # of one taken on) that has no places of its own (``Placed``)
        self.place = 0  # the place of the epoch's next sample not yet handed out (where the rest of it starts)
        # asked once ``batches`` run out: (the next epoch's seed, its first batches) to go on with, or None
        # (``ProcessEpochFeed._more``); ``own`` then holds how many batches were this epoch's
        self.more: Optional[Callable[[], Optional[tuple]]] = None
        self.own: Optional[int] = None
        self.via_pil: frozenset = frozenset()  # samples whose files the workers decode with PIL (DALI failed on them)

    def size(self, k: int) -> int:
        """Samples per chunk of the epoch's ``k``-th batch: ``chunk`` halved for each of the first ``ramp``
        batches still ahead (32: 2, 4, 8, 16, then 32), at least one."""
        return max(1, self.chunk >> max(0, self.ramp - k))

    def __iter__(self):
        n, seq, seed, batches, count, own = self.offset, 0, self.seed, self.batches, 0, True
        self.place = n
        while True:
            for j, b in enumerate(batches):
                places = getattr(b, "places", None)  # (a batch fed again keeps its samples' places)
                if places is None:
                    places = range(n, n + len(b))
                    n += len(b)
                b = Placed(b, places)
                size = self.size(j)
                self.pulled.append(b)
                self.starts.append((seq, -(-len(b) // size)))
                count += 1
                if own:
                    self.place = n
                if seed is not None:
                    b = [(i, (seed * 1_000_003 + p) % (2 ** 63)) for i, p in zip(b, b.places)]
                if self.via_pil:
                    b = [_by_pil(item, self.via_pil) for item in b]
                for k in range(0, len(b), size):
                    yield self.epoch, seq, b[k:k + size]
                    seq += 1
            more, self.more = self.more, None
            got = more() if more is not None else None
            if got is None:
                return
            # on into the next epoch: its seed, its samples' places from 0, its first chunks small again
            self.own, (seed, batches), n, own = count, got, 0, False


#: the arguments this torch's DataLoader takes (``in_order`` since torch 2.6)
_LOADER_ARGS = frozenset(inspect.signature(tud.DataLoader.__init__).parameters)


def _identity(x):
    return x


def _inherit_without_collecting(_worker_id: int) -> None:
    """A forked decoder starts with a copy of everything the parent held, DALI pipelines included,
    whose destructors join threads that do not exist in the child. The cyclic collector would reach
    the unreachable ones at the child's first collection: a segmentation fault, once in a full CPU
    test run. Frozen, the inherited objects are never collected here (the parent collects them)."""
    gc.freeze()


def _stop_workers(dl: tud.DataLoader, rings: Optional[arena.Rings] = None) -> None:
    """End ``dl``'s persistent worker processes now. torch's own shutdown (its iterator's ``__del__``,
    at whatever garbage collection reaches an abandoned loader) lets each worker first decode the
    clips already queued to it, then joins them one by one, up to 5 s each: on an H100 host an
    abandoned 16-worker video loader held its process's main thread there for minutes (py-spy, the
    GPU test run of test_bad_videos_named_or_skipped). The workers hold nothing worth finishing."""
    it = getattr(dl, "_iterator", None)
    if it is not None:
        for w in getattr(it, "_workers", ()):
            if w.is_alive():
                w.terminate()
        it._shutdown_workers()  # joins the dead workers, closes the queues; its __del__ then does nothing
        dl._iterator = None
    if rings is not None:
        rings.close()


class ProcessDecoders:
    """Worker processes that decode samples, kept across epochs (torch's persistent workers: no
    start-up per epoch). One per pipeline slot, so each live iterator has its own."""

    #: samples per item from a worker where samples are small (an encoded file, a row, a target: a recorded
    #: joint transform). Each item costs torch's loader about 0.1 ms of its main thread (its profiler hooks,
    #: queues, index hand-out; py-spy on the H100 host, 12% of the detection loader's main thread at one sample
    #: an item) and its worker a hand-over; items of 32 (at most a batch: a chunk never spans two) against
    #: 8 measured lsj-v2 9% and ssd 19% faster on H100s (benchmarks/results/stop21-what-bounds-detection.txt).
    #: Decoded clips travel one per item (their own shared memory each).
    CHUNK = 32
    #: where each sample's pieces are large (``samples.large_items``: a recorded mask, ~330 KB through the
    #: worker's ring): two items of 32 ahead per worker would not fit its ring (``arena.RING``), and what does
    #: not fit goes through torch's pipe
    CHUNK_LARGE = 8
    #: an epoch's first batches go out in smaller items (``_Flat.size``): the first in items of 2 samples
    #: (CHUNK 32), so that the graph starts on it while the workers record the next ones. On an H100 host the
    #: first batch of each epoch came after 62-95 ms instead of 98-132 (lsj-v2; ssd 84-110 against 93-174), the
    #: epochs' rate within the spread (benchmarks/results/stop22-epochs-and-the-decoder.txt)
    RAMP = 4

    def __init__(self, samples, workers: int, lookahead: int, planes: bool = False, timeout: float = 0,
                 gpu: bool = False, seed: Optional[int] = None):
        extras = bool(samples.extras)
        chunk = (self.CHUNK_LARGE if samples.large_items else self.CHUNK) if extras and workers > 0 else 1
        self.flat = _Flat(chunk, self.RAMP if workers > 1 else 0)
        # planes: clips as the decoder gives them (video.read_planes), converted to RGB in the graph
        read = samples.reader(gpu=gpu, check_jpeg_scan=False, planes=True) if planes else \
            samples.reader(gpu=gpu, check_jpeg_scan=False)
        more = dict(prefetch_factor=max(2, -(-lookahead // self.flat.chunk)), persistent_workers=True,
                    worker_init_fn=_inherit_without_collecting) if workers > 0 else {}
        # the workers' seeds come from this generator, never from the process's RNG (with no workers the
        # samples draw from it in this thread, as torch's DataLoader with no workers does)
        gen = torch.Generator()
        gen.manual_seed(seed if seed is not None else 0)
        if extras and workers > 0 and "in_order" in _LOADER_ARGS:
            # each sample draws from a seed of its own (``_Flat.seed``), so which worker takes it changes
            # nothing: its chunks come back as they are done, and a worker is handed more as soon as it has
            # room, instead of waiting behind a slow chunk of another (the batches still go in order:
            # ProcessEpochFeed.next_encoded)
            more["in_order"] = False
        # a recorded sample's encoded file and target through shared memory (arena.py), not torch's pipe
        self.rings = arena.Rings(workers, pin=gpu) if extras and workers > 0 else None
        self.dl = tud.DataLoader(_Decoded(read, extras, self.rings), batch_size=None, sampler=self.flat,
                                 num_workers=workers, collate_fn=_identity, timeout=timeout, generator=gen, **more)
        # when the slot goes (the loader closed or dropped), its workers go at once (_stop_workers)
        self.paths = samples.paths
        self.lookahead = lookahead  # batches fed ahead of the one DALI runs (the slot's callback keeps as many)
        self.close = weakref.finalize(self, _stop_workers, self.dl, self.rings)

    def epoch(self, batches, seed: Optional[int] = None, start: int = 0, go_on: bool = False):
        """A new torch iterator over ``batches``, each sample seeded from ``seed`` and its place in the epoch,
        the first at ``start`` (a resumed epoch's, or the rest of one taken on). ``go_on`` (an epoch taken on,
        ``ProcessEpochFeed.adopt``): its first batches came through the iterator before, and its chunks keep
        that epoch's number (the rings' space, which DALI may still read, stays counted)."""
        self.flat.batches = batches
        self.flat.pulled.clear()
        self.flat.starts.clear()
        self.flat.seed = seed
        self.flat.offset, self.flat.more, self.flat.own = start, None, None
        if not go_on:
            self.flat.epoch += 1
            if self.rings:  # its workers write over all that was written before: what reads it in place has run
                self.rings.wait_for_copies()
        if self.dl._iterator is None:  # workers are forked now: garbage (a dropped pipeline) goes first
            gc.collect()
            if self.rings:
                self.rings.restart()
        it = iter(self.dl)  # a persistent iterator resets: outstanding work of a left epoch is dropped
        if getattr(it, "_worker_pids_set", False):
            # torch's SIGCHLD handler would raise a dead worker's error in whatever Python code the main
            # thread runs next (DALI's, ours, a test runner's), and again at every later child's exit while
            # the iterator lives. Unregistered, the death is found by the iterator itself (its 5 s status
            # check) inside next(), where ProcessEpochFeed names it and ends the epoch.
            torch.utils.data._utils.signal_handling._remove_worker_pids(id(it))
            it._worker_pids_set = False
        return it


def _died_in_transfer(it, err: Exception) -> RuntimeError:
    """torch's error for a worker that died, where it died while a sample's memory was being handed
    over: the connection to its file-descriptor sharer is reset, and torch raises ConnectionResetError
    instead of its "DataLoader worker (pid X) is killed" (seen once, in a CPU suite run of the test
    that kills a decoder)."""
    import time

    dead: list = []
    deadline = time.monotonic() + 1.0  # (the process is exiting: its sockets are closed)
    while not dead and time.monotonic() < deadline:
        dead = [str(w.pid) for w in getattr(it, "_workers", ()) if not w.is_alive()]
        if not dead:
            time.sleep(0.02)
    return RuntimeError(f"DataLoader worker (pid(s) {', '.join(dead) or '?'}) exited unexpectedly while handing over a "
                        f"sample ({type(err).__name__}: {err})")


class ProcessEpochFeed(EpochFeed):
    """One pass over the sampler whose samples are decoded in worker processes (video with PyAV, which
    holds the GIL for part of its work: on an H100 host 16 threads of one process decoded 21.8 clips/s
    of 360p, 16 processes 52-73). torch's own DataLoader machinery moves the frames through shared
    memory; the batches are fed in sampler order (a recorded joint transform's chunks come back in any
    order: ``_assemble``)."""

    def __init__(self, decoders: ProcessDecoders, batches, *, skip: bool, skipped: list, seed: Optional[int] = None,
                 ahead: Optional[Callable[[], Optional[tuple]]] = None, start: int = 0,
                 via_pil: frozenset = frozenset()):
        self.batches = batches
        self.in_flight = collections.deque()
        self.extras: collections.deque = collections.deque()  # beside in_flight, where samples give extras
        self.stopped = False
        self.skip = skip
        self.skipped = skipped
        self.error: Optional[Exception] = None
        self.decoders = decoders
        self.held: collections.deque = collections.deque()  # a _Held per batch fed from the rings, not yet released
        self.waiting: dict = {}  # chunks returned ahead of a batch before theirs, by their place in the epoch
        self.ready: collections.deque = collections.deque()  # (batch, results) taken on with the epoch (``adopt``)
        self.assembled = 0  # batches taken from the workers' current iterator so far (not from ``ready``)
        self.ahead, self.spec_seed = ahead, None
        decoders.flat.via_pil = via_pil  # (samples DALI failed on earlier: the workers decode them with PIL)
        self.it = decoders.epoch(batches, seed, start=start)  # (start: the place of a resumed epoch's first sample)
        decoders.flat.more = self._more if ahead is not None else None

    def _more(self) -> Optional[tuple]:
        """The sampler's chunks ran out (``_Flat.more``): (the next epoch's seed, its first batches) for the
        workers to go on with, where ``ahead`` knows them; they are fed after this epoch's (``spec``)."""
        ahead, self.ahead = self.ahead, None
        got = ahead() if ahead is not None and not self.stopped else None
        if not got or len(got[1]) < self.decoders.lookahead:
            return None
        self.spec, self.spec_seed = [list(b) for b in got[1]], got[0]
        return got[0], iter(self.spec)

    def _spec_next(self) -> bool:
        """Whether the next batch taken from the workers is one of the next epoch's, read ahead (those taken on
        with the epoch, ``ready``, go first, and are its own)."""
        own = self.decoders.flat.own
        return not self.ready and self.spec is not None and own is not None and self.assembled >= own

    def handed_out(self) -> bool:
        return self._spec_next() and len(self.in_flight) == self.spec_in_flight

    def adopt(self, first: list, batches, skipped: list, skip: bool,
              ahead: Optional[Callable[[], Optional[tuple]]], seed: Optional[int] = None) -> bool:
        """As ``EpochFeed.adopt``, with the workers: their last chunks, the rest of the batches read ahead, are
        collected from the iterator that made them and wait in ``ready``; a new iterator goes on from there
        with the epoch's other batches, at their places in it, with the chunks' epoch number kept (what DALI
        holds of the rings stays theirs)."""
        if self.spec is None or self.spec_failed or self.stopped or self.ended or self.error is not None or \
                seed != self.spec_seed or [list(b) for b in first] != self.spec:
            return False
        try:
            for got in self.it:
                self.waiting[got[0]] = got[1]
            while self.decoders.flat.pulled:
                self.ready.append(self._assemble())
                if self.ready[-1][0] is None:
                    raise RuntimeError("a chunk read ahead did not come back")
        except Exception:  # noqa: BLE001 - a worker's error in them: the epoch starts anew and meets it itself
            self.ready.clear()
            self.spec_failed = True
            return False
        self.spec, self.spec_in_flight, self.spec_seed, self.assembled, self.waiting = None, 0, None, 0, {}
        self.batches, self.skipped, self.skip, self.ahead = batches, skipped, skip, ahead
        self.it = self.decoders.epoch(batches, seed, start=sum(len(b) for b in first), go_on=True)
        self.decoders.flat.more = self._more if ahead is not None else None
        return True

    def pending(self) -> list:
        """This epoch's batches fed to DALI or with the workers, in order, each sample's place kept (``Placed``);
        not the next epoch's, read ahead."""
        flat = self.decoders.flat
        fed = list(self.in_flight)[:len(self.in_flight) - self.spec_in_flight]
        pulled = list(flat.pulled)[:None if flat.own is None else max(0, flat.own - self.assembled)]
        return [same_places(b) for b in fed] + [same_places(b) for b, _ in self.ready] + \
            [same_places(b) for b in pulled]

    def rest_place(self) -> int:
        return self.decoders.flat.place

    def _next_encoded(self):
        while True:
            if self.stopped:
                raise StopIteration
            pulled, batch, spec, taken_on = self.decoders.flat.pulled, None, self._spec_next(), bool(self.ready)
            try:
                batch, items = self._next_batch()
                if batch is None:
                    self.stopped = True
                    raise StopIteration
                self.assembled += not taken_on
                if self.decoders.rings:
                    items = self._from_rings(items)
            except (RuntimeError, ConnectionError, EOFError) as e:  # a worker died, or timeout= passed
                batch = batch or (pulled[0] if pulled else None)
                if not isinstance(e, RuntimeError):  # it died while handing over a sample (torch's fd share)
                    e = _died_in_transfer(self.it, e)
                if "timed out" in str(e) and batch:
                    names = ", ".join(f"{i} ({self.decoders.paths[i]})" for i in batch[:4])
                    e = RuntimeError(f"gputransforms: {e}: the decode of one of samples {names} did not return")
                self.error, self.stopped = e, True
                # the others end now; the next epoch starts new ones
                _stop_workers(self.decoders.dl)
                raise StopIteration from None
            except StopIteration:  # the epoch's end (raised above): no error
                raise
            except Exception as e:  # noqa: BLE001 - the dataset's own error (torch re-raises it as its type)
                if spec:  # in a batch of the next epoch's: that epoch meets it itself, after a new start
                    self.spec_failed = self.stopped = True
                    raise StopIteration from None
                self.error, self.stopped = e, True
                raise StopIteration from None
            kept, places, data, extras = [], [], [], []
            for i, place, (_, item, err, *extra) in zip(batch, batch.places, items):
                if err is None:
                    kept.append(i)
                    places.append(place)
                    if extra:
                        data.append(item)
                        extras.append(extra[0])
                    else:
                        data.append(tuple(t.numpy() for t in item))
                elif spec:  # a bad file of the next epoch's: that epoch meets it itself, after a new start
                    self.spec_failed = self.stopped = True
                    raise StopIteration
                elif self.skip:
                    self.skipped.append(bad_sample(*err))
                else:
                    self.error = bad_sample(*err)
                    self.stopped = True
                    raise StopIteration
            if kept:
                kept = Placed(kept, places)
                self.in_flight.append(kept)
                self.spec_in_flight += spec
                if self.held:
                    self.held[-1].kept = kept
                if extras:
                    self.extras.append(extras)
                return tuple(list(col) for col in zip(*data))

    def _next_batch(self) -> tuple:
        """The next batch to feed: one taken on with the epoch (``ready``), else from the workers."""
        return self.ready.popleft() if self.ready else self._assemble()

    def _assemble(self) -> tuple:
        """(the next batch in the sampler's order, its samples' results), or (None, None) at the epoch's end.
        Its chunks are taken as the workers return them (in any order where the loader of chunks does not
        keep it: ProcessDecoders); those of later batches wait in ``waiting``."""
        flat, waiting = self.decoders.flat, self.waiting

        def complete() -> bool:  # (the sampler records a batch when it hands out its first chunk)
            return bool(flat.pulled) and all(flat.starts[0][0] + k in waiting for k in range(flat.starts[0][1]))

        while not complete():
            got = next(self.it, None)
            if got is None:
                return None, None
            waiting[got[0]] = got[1]
        batch, (start, chunks) = flat.pulled.popleft(), flat.starts.popleft()
        items: list = []
        for k in range(chunks):
            chunk = waiting.pop(start + k)
            if isinstance(chunk, ExceptionWrapper):  # the dataset's own error, at its batch (torch's reraise)
                chunk.reraise()
            items += chunk
        return batch, items

    def _from_rings(self, items: list) -> list:
        """A batch's items with what came through the workers' rings in place of where it is there. The
        encoded files are fed where the workers wrote them (the pipeline is built with no_copy): their space
        is freed ``lookahead`` batches later, when the slot's callback lets go of them too; a target viewing
        the ring (arena.Rings.register) no sooner than the copies to the device that read it have run
        (``copied``)."""
        rings = self.decoders.rings
        items, marks = rings.unstash(items, hold=True)
        self.held.append(_Held(marks))
        while len(self.held) > self.decoders.lookahead:
            held = self.held.popleft()
            if held.copies is not None:
                held.copies.synchronize()
            rings.release(held.marks)
        return items

    def copied(self, kept: list, dev: torch.device) -> None:
        """The batch ``kept`` (as ``in_flight`` held it) is on ``dev``: where its targets are views of the
        workers' rings, the copies that read them are queued on ``dev``'s current stream, and the rings' space
        is freed only once they have run."""
        rings = self.decoders.rings
        if not rings or not rings.registered or not any(held.kept is kept for held in self.held):
            return
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(dev))
        rings.last_copy = event
        for held in self.held:  # (this batch's, and any earlier one's without: its copies were queued before)
            if held.copies is None:
                held.copies = event
            if held.kept is kept:
                return


class PipelineSlot:
    """A DALI pipeline and the epoch it is fed. The pipeline's callback reaches the slot through a
    weak reference: no cycle keeps the pipeline, its threads and its device memory alive."""

    def __init__(self):
        self.pipe = None  # (first: when the slot goes, the pipeline goes before the files it reads)
        self.decoders: Optional[ProcessDecoders] = None  # worker processes, for samples decoded on the CPU
        self.epoch: Optional[EpochFeed] = None
        self.seed: Optional[int] = None  # the iterator's seed (the first one's seeds a slot's worker processes)
        self.sample_seed: Optional[int] = None  # the iterator's seed for the samples its workers record
        self.dirty = False  # an epoch was left mid-way: DALI may hold prefetched batches of it
        # the epoch ended with ``epoch`` reading on into the next one (``EpochFeed.spec``): the next iterator
        # takes it on or drains it (``CompiledIterator._take_ahead``)
        self.ahead = False
        self.fed: collections.deque = collections.deque()  # the last batches fed, which DALI reads in place

    def callback(self, keep: int = 0) -> Callable:
        """The pipeline's external-source callback. ``keep``: how many of the last batches fed to
        hold alive (a pipeline built with ``no_copy`` reads them where they are until their
        iteration has run: at most its prefetch depth after the feed)."""
        ref = weakref.ref(self)
        self.fed = collections.deque(maxlen=keep)

        def feed():
            slot = ref()
            if slot is None or slot.epoch is None:
                raise StopIteration
            data = slot.epoch.next_encoded()
            slot.fed.append(data)
            return data

        return feed

    def close(self):
        """End the worker processes now (they are started again by the next epoch)."""
        decoders, self.decoders = self.decoders, None
        if decoders is not None:
            decoders.close()

    def drain(self):
        """Finish an epoch left mid-way (the user broke out of the loop, or dropped the iterator) so
        that the next one starts clean."""
        epoch, self.epoch, dirty, self.dirty = self.epoch, None, self.dirty or self.ahead, False
        self.ahead = False
        if epoch is not None:
            epoch.stop()
        if not dirty or self.pipe is None:
            return
        try:
            if not getattr(epoch, "ended", False):
                self.pipe.schedule_run()  # the callback now raises StopIteration: marks the end
            while True:
                self.pipe.outputs()
        except StopIteration:
            pass
        except RuntimeError:
            self.pipe = None  # a dead pipeline is rebuilt on the next epoch
            return
        self.pipe.reset()
