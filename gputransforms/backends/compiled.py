"""The compiled backend: a dataset's files (``datasets.adapters``) read ahead in threads, or clips
decoded in worker processes (``feed``), fed in sampler order to one DALI graph per live iterator
(``compiler.dali``); what the graph hands over is finished by ``compiler.handoff.finish``.

Labels never travel through DALI: each batch's indices are queued when its files are fed and popped
when its images come out, in order. Each ``iter(loader)`` is an independent pass with a pipeline of its
own (``feed.PipelineSlot``), so several live iterators each yield a full epoch.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import sys
import warnings
from typing import Callable, Optional

import numpy as np
import torch
import torch.utils.data as tud

from .. import files, state
from ..compiler import handoff
from ..compiler.chain import TO_TENSOR
from ..compiler.plan import plan as make_plan
from ..compiler.stages import after_graph
from ..datasets.adapters import FileSamples
from ..device import cuda_connections_note, late_import_warning, to_device, torch_device
from ..errors import BadSampleError, DamagedFileWarning, LateImportWarning, NotCompilable, SkippedSamplesWarning, \
    naming_sample, user_stacklevel
from ..prepared import PreparedSamples
from .ahead import TorchPaced, next_epoch
from .base import Backend, EpochIterator, Sampling, Settings, pin_memory_note, pinning, put_back, random_states
from .feed import EpochFeed, PipelineSlot, ProcessDecoders, ProcessEpochFeed, ReaderThreads, without
from .workers import TorchWorkers


def choose(settings: Settings, dataset, resolve) -> Backend:
    """The compiled backend for a dataset whose files the adapters find (``resolve``) and whose chain
    compiles; else torch's workers, with the reason."""
    try:
        samples = resolve(dataset)
    except NotCompilable as e:
        return TorchWorkers(settings, str(e))
    p = make_plan(samples.transform, samples.plan_input, device=settings.device, video_decoder=settings.video_decoder)
    if not p.compiled:
        return TorchWorkers(settings, p.tail_reason, p, samples.origin)
    if p.output == "image" and not p.tail and settings.collate is None:
        raise TypeError("the transform chain ends with a PIL image, which cannot be batched "
                        "(torch's default_collate raises too); end it with ToTensor() or PILToTensor()")
    if p.tail and p.tail_mode == "pil" and settings.num_workers > 0:
        # After the graph these would run per sample on PIL images in this one thread: timm's
        # RandAugment chain measured 426 img/s that way on an H100 host against 2,317 img/s on
        # torch's DataLoader with 16 workers (benchmarks/results/h100-timm-ra.json).
        names = ", ".join(sorted({type(t).__name__ for t in p.tail if not isinstance(t, TO_TENSOR)}))
        return TorchWorkers(settings, f"{names} need(s) PIL images; per sample they run faster in torch's "
                                      f"{settings.num_workers} worker processes than in the main thread after "
                                      "the DALI graph (pass num_workers=0 to keep the graph)", p, samples.origin)
    faster = samples.faster_on_workers(settings.num_workers)
    if faster:
        return TorchWorkers(settings, faster, p, samples.origin)
    if settings.prepared is not None:
        if type(samples) is not FileSamples:
            raise ValueError("prepared= applies to datasets of image files (ImageFolder, ImageList, torchvision's file "
                             f"datasets, your own Dataset of files), not to {type(dataset).__name__}")
        samples = PreparedSamples(samples, settings.prepared)
    late = late_import_warning(settings.device)
    if late:
        warnings.warn(late, LateImportWarning, stacklevel=user_stacklevel())
    return CompiledGraph(settings, samples, p)


class CompiledGraph(Backend):
    name = "dali"

    def __init__(self, settings: Settings, samples: FileSamples, plan):
        self.settings, self.files, self.plan = settings, samples, plan
        self.origin = samples.origin
        self.stages = after_graph(plan)
        self.idle: list = []  # PipelineSlots no live iterator holds
        self.via_pil: set = set()  # samples DALI failed on and PIL decodes: PIL decodes them from then on
        self.pool: Optional[ReaderThreads] = None
        self._max_batch_size: Optional[int] = None
        self.ahead_missed = False  # the batches read ahead were not the next epoch's once: no more reading ahead

    def iterator(self, sampling: Sampling, resume: Optional[state.Position]) -> EpochIterator:
        order = getattr(self.files, "epoch_order", None)
        if order is not None:  # samples that keep their own order (tar shards: the sampler is torch's endless one)
            own = order(self.settings.batch_size, self.settings.drop_last, sampling.generator)
            sampling = dataclasses.replace(sampling, index_sampler=own, length=own.__len__)
        return CompiledIterator(self, sampling, resume)

    def explain(self) -> str:
        lines = []
        if self.settings.collate is not None:
            c = self.settings.collate
            lines.append(f"  collate_fn {getattr(c, '__name__', type(c).__name__)} runs on each compiled batch")
        if self.settings.device == "gpu" and cuda_connections_note():
            lines.append(f"  {cuda_connections_note()}")
        if pin_memory_note(self.settings):
            lines.append(f"  {pin_memory_note(self.settings)}")
        if self.settings.prepared is not None:
            lines.append(f"  {self.settings.prepared.describe()}")
        if (not self.files.extras or self.settings.num_workers > 0) and self.plan.steps[0].op != "video_decode" and \
                getattr(self.files, "epoch_order", None) is None:
            lines.append("  epochs: " + (
                "no longer read ahead: the batches read ahead once differed from those the sampler then drew (it "
                "draws from torch's global generator, which something else drew from between epochs: the loop, or "
                "with num_workers=0 random steps after the graph or a collate_fn's MixUp or CutMix; a DataLoader "
                "generator= keeps its draws apart), or set_epoch was not the next epoch, or with num_workers=0 and a "
                "generator= the loop stopped after len(loader) batches without asking past the last (torch's "
                "RandomSampler draws once more there: backends/ahead.py TorchPaced)" if self.ahead_missed else
                "as one ends, the next one's first batches are read and decoded ahead where the sampler is torch's "
                "own, and used if they are the batches it then draws (backends/ahead.py)"))
        return "\n".join(lines + [self.plan.explain(self.settings.device)] + self.files.explain_lines())

    def fallback(self) -> Optional[str]:
        slow = [type(t).__name__ for t, _, stage in self.stages if stage in ("per sample", "pil")]
        if not slow:
            return self.files.per_sample_note()
        why = "a callable before ToTensor expects a PIL image" if self.plan.tail_mode == "pil" else \
            "no DALI or batched lowering"
        return (f"{', '.join(slow)} run(s) per sample with torchvision after the DALI graph ({why}; the graph ends "
                f"at {self.plan.tail_reason})")

    # pipelines -----------------------------------------------------------------------------------
    def acquire_slot(self) -> PipelineSlot:
        slot = self.idle.pop() if self.idle else PipelineSlot()
        if not slot.ahead:  # (one fed on into the next epoch: its iterator's first batch decides)
            slot.drain()
        return slot

    def release_slot(self, slot: PipelineSlot, *, dirty: bool):
        slot.dirty = dirty
        if not dirty and not slot.ahead:
            slot.epoch = None
        self.idle.append(slot)

    @property
    def lookahead(self) -> int:
        """Batches fed ahead of the one DALI runs: its prefetch queue, the batch being fed and the one it
        runs. The slot's callback keeps each batch's inputs that long, and the feeds (the workers' rings
        included, ``Rings.release``) free them no sooner: the two must be the same number."""
        return self.settings.prefetch_queue_depth + 2

    def build_pipeline(self, slot: PipelineSlot, seed: int, checkpoint: Optional[bytes] = None):
        from ..compiler.dali import build_pipeline  # DALI is imported only on the compiled path

        s = self.settings
        if self.pool is None:
            self.pool = ReaderThreads(max(1, min(4, s.num_threads)), "gputransforms-read")
        # no_copy: DALI reads the files where the reader threads put them; copied in, they cost the
        # main thread (schedule_run runs the callback) a memcpy of every batch's files
        slot.pipe = build_pipeline(self.plan, slot.callback(keep=self.lookahead), device=s.device,
                                   batch_size=self._max_batch_size, num_threads=s.num_threads, seed=seed,
                                   prefetch_queue_depth=s.prefetch_queue_depth, hw_decoder_load=s.hw_decoder_load,
                                   jpeg_fancy_upsampling=s.jpeg_fancy_upsampling, checkpoint=checkpoint,
                                   no_copy=True, raw_output=self.plan.hands_over_raw(s.device), joint_after=True)

    def max_batch(self, sampling: Sampling) -> int:
        """The largest batch the index sampler gives (the pipeline's batch size), found before an
        epoch starts: a custom batch sampler may share one iterator between its iter() calls
        (Lightning's _IndexBatchSamplerWrapper does), and scanning it must not draw from the RNG."""
        if self._max_batch_size is None:
            size = self.settings.batch_size or declared_batch_size(self.settings.batch_sampler)
            if size is None:  # a batch sampler that declares no size: scan it (it may count its passes)
                # (the random generators it draws from as they were: the loader's, torch's, Python's and NumPy's
                # global ones, and those the sampler holds, a RandomSampler's own generator inside a batch
                # sampler of the user's: the first epoch then draws the order torch's DataLoader draws)
                kept = random_states(sampling.index_sampler, sampling.generator)
                try:
                    size = max((len(b) for b in sampling.index_sampler), default=1)
                finally:
                    put_back(kept)
            self._max_batch_size = size
        return self._max_batch_size

    def new_epoch(self, batches, skipped: list, slot: PipelineSlot, ahead: Optional[Callable] = None,
                  start: int = 0) -> EpochFeed:
        """The feed of an epoch's ``batches``; ``start``: the place in the epoch of their first sample (a
        resumed epoch's), where samples are seeded by their place (recorded in worker processes)."""
        s, first = self.settings, self.plan.steps[0]
        if first.op == "video_decode" and first.args["decoder"] == "pyav":
            if slot.decoders is None:
                slot.decoders = ProcessDecoders(self.files, s.num_threads, lookahead=self.lookahead,
                                                planes=first.args["frames"] == "yuv420", timeout=s.timeout)
            return ProcessEpochFeed(slot.decoders, batches, skip=self.skips(), skipped=skipped)
        if self.files.extras:  # a joint transform recorded per sample, in torch's workers
            if slot.decoders is None:
                slot.decoders = ProcessDecoders(self.files, s.num_workers, lookahead=self.lookahead,
                                                timeout=s.timeout, gpu=s.device == "gpu", seed=slot.seed)
            # with workers each sample draws from a seed of its own, and the next epoch can be read ahead (with
            # none, from torch's RNG in this thread as they are read, as torch's DataLoader with no workers does,
            # which reading them ahead would move)
            return ProcessEpochFeed(slot.decoders, batches, skip=self.skips(), skipped=skipped,
                                    seed=slot.sample_seed if s.num_workers > 0 else None,
                                    ahead=ahead if s.num_workers > 0 else None, start=start,
                                    via_pil=frozenset(self.via_pil))
        return EpochFeed(self.files, batches, self.pool, lookahead=self.lookahead,
                         skip=self.skips(), gpu=s.device == "gpu", check_jpeg_scan=s.validate_jpeg,
                         skipped=skipped, timeout=s.timeout, via_pil=frozenset(self.via_pil), ahead=ahead)

    def reads_ahead(self, sampling: Sampling) -> Optional[Callable]:
        """What tells an epoch's feed (the next iterator's seed, the next epoch's first batches)
        (``backends.ahead``), or None: where the batches read ahead did not turn out to be the next epoch's once,
        this loader stops reading ahead (each time would cost the drain of DALI's queue)."""
        if self.ahead_missed:
            return None
        return functools.partial(_seeded_next_epoch, sampling.index_sampler, sampling.generator, self.lookahead,
                                 sampling.seeds)

    def skips(self) -> bool:
        """Whether a bad sample is skipped: the loader's ``on_error``, unless the dataset says what it
        does itself (a webdataset pipeline's exception handler)."""
        return (self.files.on_error or self.settings.on_error) == "skip"

    def labels(self, indices, dev: torch.device):
        f = self.files
        if f.target_transforms is None and all(type(f.targets[i]) is int for i in indices):
            labels = torch.as_tensor([f.targets[i] for i in indices], dtype=torch.int64)
        else:
            labels = tud.default_collate(tuple(f.target(i) for i in indices))  # (a tuple: torch's transposed batch)
        return to_device(labels, dev)

    def close(self):
        idle, self.idle = self.idle, []
        for slot in idle:
            slot.close()  # video decoding worker processes end now, not at a later garbage collection
        pool, self.pool = self.pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    def __del__(self, _finalizing=sys.is_finalizing):
        # the loader and every iterator over it are gone: stop the reader threads without waiting
        # (nothing is asked of them). Not at interpreter exit: they are daemon threads, and the
        # modules they use may already be gone (``sys`` among them: hence the default argument).
        pool = getattr(self, "pool", None)
        if pool is not None and not _finalizing():
            pool.shutdown(wait=False, cancel_futures=True)


def declared_batch_size(batch_sampler, depth: int = 4) -> Optional[int]:
    """The ``batch_size`` a batch sampler, or one it wraps, declares (Accelerate's SkipBatchSampler
    wraps its BatchSamplerShard, which wraps torch's BatchSampler): no iteration, which a stateful
    sampler would count as a pass (Accelerate's SeedableRandomSampler advances its epoch)."""
    while batch_sampler is not None and depth > 0:
        size = getattr(batch_sampler, "batch_size", None)
        if isinstance(size, int) and size > 0:
            return size
        batch_sampler, depth = getattr(batch_sampler, "batch_sampler", None), depth - 1
    return None


def _paced(batches, sampling: Sampling) -> Optional[TorchPaced]:
    """``batches`` paced as torch's iterator with no workers pulls them, where the sampler's length is known."""
    try:
        n = len(sampling.index_sampler)
    except TypeError:
        return None
    return TorchPaced(batches, n, [sampling.generator, getattr(getattr(sampling.index_sampler, "sampler", None),
                                                               "generator", None)])


def _seed_of(base_seed: int) -> int:
    """An iterator's seed from its base seed (DALI's, where the loader has none, and its workers' samples')."""
    return base_seed % (2 ** 31)


def _seeded_next_epoch(index_sampler, generator, k: int, seeds=None) -> Optional[tuple]:
    """``ahead.next_epoch`` with the base seed made the iterator's ``sample_seed``, as the iterator makes it."""
    got = next_epoch(index_sampler, generator, k, seeds)
    if got is None:
        return None
    base, batches = got
    return _seed_of(base), batches


class CompiledIterator(EpochIterator):
    """One pass over the sampler through a pipeline of its own: torch's ``_BaseDataLoaderIter``
    draws (the sampler's order, then the base seed from ``generator``) in the same order."""

    def __init__(self, backend: CompiledGraph, sampling: Sampling, resume: Optional[state.Position] = None):
        self.backend = backend
        self.sampling = sampling
        self.slot = backend.acquire_slot()
        super().__init__(sampling, resume)
        backend.max_batch(sampling)  # before the epoch's iter(): see there
        self.batches = iter(sampling.index_sampler)
        # with no worker processes torch's iterator pulls the sampler batch by batch, and past the last one only
        # when the loop asks for more (a RandomSampler with the user's generator draws there): so does the feed
        self.paced = _paced(self.batches, sampling) if backend.settings.num_workers == 0 else None
        if self.paced is not None:
            self.batches = self.paced
        base_seed = sampling.base_seed()
        s = backend.settings
        self.seed = s.seed if s.seed is not None else _seed_of(base_seed)
        # the samples recorded in worker processes draw from seeds made from this epoch's base seed, whatever
        # DALI's seed is (torch seeds its workers from each epoch's base seed): with seed= given, epochs differ too
        self.sample_seed = _seed_of(base_seed)
        self.slot.seed, self.slot.sample_seed = self.seed, self.sample_seed
        self.own_stage_rng(base_seed, s.num_workers)  # (and so the next epoch's order is known ahead)
        self.resumed_random = (None, None) if resume is None else (resume.dali, resume.rng_now)
        if resume is not None and self.slot.ahead:  # a saved position: what was read ahead is not its epoch
            self.slot.drain()
        if resume is not None and resume.dali is not None:  # random operators go on where the saved pipeline stood
            backend.build_pipeline(self.slot, self.seed + len(self.skipped), checkpoint=resume.dali)
        if self.slot.pipe is None:
            backend.build_pipeline(self.slot, self.seed)
        self.resume_at(self.batches, resume)
        self.epoch: Optional[EpochFeed] = None  # started by the first next(): the sampler draws then, as torch's
        self.dev = torch_device(s.device)
        self.stream = torch.cuda.current_stream(self.dev) if self.dev.type == "cuda" else None
        from ..compiler.dali import to_torch  # DALI is imported only on the compiled path

        self.to_torch = to_torch
        self.raw = backend.plan.hands_over_raw(s.device)  # the graph hands over raw uint8 pixels
        self.scheduled = False
        self.first = True
        self.pin = pinning(s)
        self.final_random: Optional[tuple] = None  # the random state after the last batch, once handed back ahead

    def random_state(self) -> tuple:
        if self.slot is None and self.final_random is not None:  # handed back ahead (``_hand_back_ahead``)
            return self.final_random
        pipe = self.slot.pipe if self.slot is not None else None
        if pipe is None or self.epoch is None:  # nothing drawn since this iterator started
            return self.resumed_random
        return pipe.checkpoint() if self.backend.plan.checkpointable else None, self.stage_random_state()

    def _next(self):
        if self.done:
            raise StopIteration
        if self.slot is None and self.final_random is not None:  # its last batch is out, the slot handed back
            self._paced_end()
            self._warn_skipped()
            raise StopIteration
        b, slot = self.backend, self.slot
        if self.epoch is None and slot.ahead:
            self._take_ahead()
        while True:
            pipe, out = slot.pipe, None
            try:
                if not self.scheduled:
                    if self.epoch is None:
                        self.epoch = slot.epoch = b.new_epoch(self.batches, self.skipped, slot,
                                                              self._reads_ahead(), start=self.resumed_at)
                    self.scheduled = True
                    pipe.schedule_run()
                # (where every batch of this epoch is out, what DALI holds next is the next epoch's)
                if not (self.epoch.handed_out() and self._ended_ahead()):
                    out = pipe.outputs(self.stream) if self.stream is not None else pipe.outputs()
                break
            except StopIteration:
                self._end_of_epoch()
            except RuntimeError as e:
                batch = list(self.epoch.in_flight[0]) if self.epoch.in_flight else []
                err = name_failure(e, batch, b.files)
                if b.skips() and isinstance(err, BadSampleError):
                    self._restart_after_decode_error(err)
                    continue
                if isinstance(err, DecodedOnlyByPil) and not set(batch) <= b.via_pil and \
                        b.plan.steps[0].op == "decode":
                    self._restart_with_pil(batch)
                    continue
                slot.pipe = None  # the pipeline object is dead after any error
                self._release(dirty=False)
                raise err from e
        if out is None:
            self._paced_end()
            raise StopIteration  # this epoch's batches are all out; DALI runs on into the next one's
        indices = self.epoch.in_flight.popleft()
        # what the samples gave beside the graph's inputs (a recorded joint transform's targets)
        more = dict(extras=self.epoch.extras.popleft()) if self.epoch.extras else {}
        images = self.to_torch(out[0])
        # a joint step's rows, where its pixels run after the graph (compiler.joint_kernels)
        rows = np.array(out[1].as_array()) if len(out) > 1 else None
        pipe.schedule_run()
        out = self.on_stage_rng(self._finish, images, indices, rows, more)
        if more:  # (targets that may view the workers' rings: arena.Rings.register)
            self.epoch.copied(indices, self.dev)
        if self.epoch.handed_out() and self.epoch.error is None and not self.epoch.spec_failed:
            self._hand_back_ahead()
        return out

    def _finish(self, images, indices, rows, more: dict):
        """The batch as the loop gets it: the chain's stages after the graph, then the collate_fn."""
        b = self.backend
        images = handoff.finish(images, b.plan, self.dev, b.stages, raw=self.raw, rows=rows)
        if b.settings.collate is None:
            labels = None if more else b.labels(indices, self.dev)
            return b.files.batch(images, labels, self.dev, indices, **more)
        return self._collate(images, indices, more)

    def _hand_back_ahead(self):
        """The epoch's last batch is out and DALI runs on into the next epoch's: the slot goes back now, not at
        the StopIteration a loop that stops after ``len(loader)`` batches never asks for (Lightning's), so that
        the next iterator finds it. This one still ends at its next ``next()``; its position keeps the random
        state after its last batch."""
        self.final_random = self.random_state()
        slot, self.slot = self.slot, None
        slot.ahead = True
        self.backend.release_slot(slot, dirty=False)

    def _collate(self, images, indices, more: Optional[dict] = None):
        """The user's collate_fn on what torch would hand it: per-sample (image, target) pairs."""
        collate = self.backend.settings.collate
        batch = self.backend.files.items(images.unbind(0) if isinstance(images, torch.Tensor) else images, indices,
                                         **(more or {}))
        first, self.first = self.first, False
        try:
            return to_device(collate(batch), self.dev)
        except Exception as e:  # noqa: BLE001 - any failure on the first batch gets the explanation
            if not first:
                raise
            name = getattr(collate, "__name__", type(collate).__name__)
            msg = (f"{e}\n(gputransforms: collate_fn {name} failed on the first compiled batch. It receives what "
                   f"torch's DataLoader gives it, a list of (image, target) pairs, but each image is already "
                   f"transformed: a {tuple(batch[0][0].shape)} {batch[0][0].dtype} tensor on {batch[0][0].device}. "
                   "Make it work on tensors (e.g. .cpu() before .numpy()), or use torch.utils.data.DataLoader "
                   "for this loader.)")
            try:
                err = type(e)(msg)
            except Exception:  # noqa: BLE001 - an exception type that takes other arguments
                err = RuntimeError(msg)
            raise err from e

    def _restart_after_decode_error(self, bad: BadSampleError):
        """on_error="skip" and DALI failed on a file PIL cannot decode either: the pipeline object
        is dead after any error, so build a new one and feed it again, in order, every batch that
        was in flight (without the bad file) before the rest of the epoch."""
        self.skipped.append(bad)
        done = {e.index for e in self.skipped}  # this one, and those the reader threads already left out
        self._refeed([kept for kept in (without(b, done) for b in self.epoch.pending()) if kept])

    def _restart_with_pil(self, batch: list):
        """DALI failed on a batch whose every file PIL decodes (and torchvision's chain runs on): which
        file DALI refused it does not say, so PIL decodes the batch's files, now and in later epochs
        (handed to DALI losslessly), and the epoch goes on from that batch in a new pipeline."""
        b = self.backend
        b.via_pil.update(batch)
        named = ", ".join(f"{i}: {b.files.paths[i]}" for i in batch[:8]) + (" ..." if len(batch) > 8 else "")
        warnings.warn(f"gputransforms: DALI could not decode a batch that PIL decodes (samples {named}); its files "
                      "are decoded by PIL from now on, as torchvision's loader decodes them", DamagedFileWarning,
                      stacklevel=4)
        self._refeed(self.epoch.pending())

    def _refeed(self, pending: list):
        """The pipeline object is dead after any error: a new one, fed ``pending`` (the batches that were
        in flight), in order, before the rest of the epoch."""
        self.epoch.stop()
        self.slot.pipe = None
        self.backend.build_pipeline(self.slot, self.seed + len(self.skipped))
        # (the batches keep their samples' places in the epoch, where these seed their draws: ``feed.Placed``)
        self.epoch = self.slot.epoch = self.backend.new_epoch(itertools.chain(pending, self.epoch.rest()),
                                                              self.skipped, self.slot,
                                                              self._reads_ahead(),
                                                              start=self.epoch.rest_place())
        self.scheduled = False

    def _reads_ahead(self) -> Optional[Callable]:
        """The backend's ``reads_ahead``, the sampler's end pulled first where it is paced as torch's (``TorchPaced``:
        the next epoch follows a loop that asks past the last batch, as a for loop does)."""
        predict = self.backend.reads_ahead(self.sampling)
        paced = self.paced
        if predict is None or paced is None:
            return predict

        def after_the_end():
            paced.end_ahead()
            try:
                return predict()
            finally:
                paced.undo_ahead()

        return after_the_end

    def _take_ahead(self):
        """This iterator's first batch, on a pipeline that the epoch before fed on into this one: the sampler
        draws this epoch's first batches now (as torch's iterator draws them), and the feed goes on as this
        epoch's if they are the ones it read ahead. Otherwise DALI's queue is drained and the epoch starts
        anew with them (and this loader reads ahead no more)."""
        slot, feed = self.slot, self.slot.epoch
        first = list(itertools.islice(self.batches, len(feed.spec) if feed is not None and feed.spec else 0))
        if feed is not None and feed.adopt(first, self.batches, self.skipped, self.backend.skips(),
                                           self._reads_ahead(), seed=self.sample_seed):
            slot.ahead = False
            self.epoch, self.scheduled = feed, True  # (DALI's queue holds this epoch's first batches)
            return
        if feed is None or not feed.spec_failed:  # other batches than those read ahead
            self.backend.ahead_missed = True
        slot.drain()
        if slot.pipe is None:
            self.backend.build_pipeline(slot, self.seed)
        self.batches = itertools.chain(first, self.batches)

    def _ended_ahead(self) -> bool:
        """The epoch's batches are all handed out and the feed reads on into the next epoch: True, and the
        slot goes back as it is (its pipeline's queue holds the next epoch's first batches), or False where
        the feed cannot go on (an error to raise: DALI's queue ends there)."""
        epoch = self.epoch
        if epoch.error is not None:
            return False
        if epoch.spec_failed:  # what DALI holds beyond this epoch is dropped; the next epoch starts anew
            self.slot.dirty = True
            self.slot.drain()
            self._release(dirty=False)
        else:
            self._hand_back_ahead()
        self._warn_skipped()
        return True

    def _paced_end(self):
        if self.paced is not None:
            self.paced.end()

    def _end_of_epoch(self):
        self._paced_end()
        self.done = True
        self.slot.pipe.reset()
        epoch = self.epoch
        self._release(dirty=False)
        if epoch.error is not None:  # (a target that cannot be made: torchvision's own exception, named)
            raise getattr(epoch.error, "raising", None) or epoch.error
        self._warn_skipped()
        raise StopIteration

    def _warn_skipped(self):
        if self.skipped and self.backend.files.warn_skipped:
            shown = "; ".join(f"{e.index}: {e.path} ({e.reason})" for e in self.skipped[:5])
            warnings.warn(f"gputransforms: skipped {len(self.skipped)} sample(s) this epoch "
                          f"(DataLoader.skipped lists them): {shown}", SkippedSamplesWarning, stacklevel=5)

    def _release(self, *, dirty: bool):
        slot, self.slot = self.slot, None
        self.done = True
        if slot is not None:
            self.backend.release_slot(slot, dirty=dirty)

    def close(self):
        """Stop this pass early; its pipeline goes back to the loader for the next iterator."""
        self._release(dirty=True)

    def __del__(self):
        if getattr(self, "slot", None) is not None:
            try:
                self._release(dirty=True)
            except Exception:  # noqa: BLE001 - at interpreter exit the loader may be half gone
                pass


def name_failure(err: Exception, indices, samples: FileSamples) -> Exception:
    """DALI reports "Critical error in pipeline" without the file. Find it: first a file PIL (PyAV for a
    clip) cannot decode, else the sample on which torchvision's own run of the chain raises (an image smaller
    than RandomCrop's size, say), re-raised as torchvision's exception type with the file named."""
    paths = samples.paths
    text = str(err)
    if "out of memory" in text.lower() or "cudaErrorMemoryAllocation" in text:
        return MemoryError(f"gputransforms: the GPU ran out of memory on a batch of {len(indices)} images; reduce "
                           "batch_size or prefetch_factor (batches prepared ahead), or resize earlier in the chain "
                           f"(DALI: {text.strip().splitlines()[-1] if text.strip() else 'out of memory'})")
    for i in indices:
        path = paths[i]
        try:
            samples.load(i)
        except Exception as pil_err:  # noqa: BLE001 - any failure to decode names the file
            reason = getattr(pil_err, "reason", None) or f"cannot be decoded ({type(pil_err).__name__}: {pil_err})"
            return files.BadSampleError(i, path, reason)
    if samples.transform is not None and not samples.extras:  # (recorded in the workers: their errors came there)
        for i in indices:
            path = paths[i]
            try:
                samples.transform(samples.load(i))
            except Exception as tv_err:  # noqa: BLE001 - torchvision's exception is the answer
                return naming_sample(tv_err, i, path) or \
                    RuntimeError(f"gputransforms: sample {i} ({path}): {type(tv_err).__name__}: {tv_err}")
    named = ", ".join(f"{i}: {paths[i]}" for i in indices[:8])
    more = f" and {len(indices) - 8} more" if len(indices) > 8 else ""
    text = str(err).strip()
    reason = next((ln.strip() for ln in reversed(text.splitlines()) if ln.strip() and "Critical error" not in ln),
                  type(err).__name__)  # (DALI's first line says nothing; the decoder's reason comes last)
    return DecodedOnlyByPil(f"gputransforms: DALI failed on the batch of samples {named}{more}, which PIL decodes: "
                            f"{reason}")


class DecodedOnlyByPil(RuntimeError):
    """DALI failed on a batch whose every file PIL decodes: the compiled backend then decodes them with PIL."""
