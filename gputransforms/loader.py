"""DataLoader: a ``torch.utils.data.DataLoader`` whose batches come from one compiled DALI graph.

Index order, shuffling, sharding, ``drop_last`` and ``len()`` are torch's own (this class is torch's
DataLoader, and its index sampler is iterated exactly as torch's iterator iterates it), so the same
``generator`` gives the same batches of indices as torch, and frameworks that rebuild a DataLoader
with another sampler (Lightning, Accelerate) rebuild this one. Which files and targets the dataset
stands for comes from ``datasets.adapters``; how files reach the graph from ``feed``. Each
``iter(loader)`` is an independent pass with a pipeline of its own (``PipelineSlot``), so several
live iterators each yield a full epoch. Labels never travel through DALI: each batch's indices are
queued when its files are fed and popped when its images come out, in order.
"""
from __future__ import annotations

import itertools
import warnings
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional

import torch
import torch.utils.data as tud

from . import files, integrations, state
from .compiler import handoff, tail
from .compiler.plan import TO_TENSOR, Plan, plan as make_plan
from .datasets.adapters import FileSamples, NotCompilable, resolve
from .device import (cuda_connections_note, dali_available, default_device, default_threads, rank_tag,
                     resolve as resolve_device, to_device, torch_device)
from .feed import EpochFeed, PipelineSlot, ProcessDecoders, ProcessEpochFeed

__all__ = ["DataLoader", "FallbackWarning", "SkippedSamplesWarning", "UnshardedWarning", "dali_available",
           "default_device"]

#: DataLoader(video_decoder=...): "pyav" is "pyav-yuv" on the GPU and "pyav-rgb" on the CPU
VIDEO_DECODERS = ("pyav", "pyav-yuv", "pyav-rgb", "nvdec")


class FallbackWarning(UserWarning):
    """Part of a transform chain runs per sample with torchvision instead of in the DALI graph."""


class SkippedSamplesWarning(UserWarning):
    """With on_error="skip", samples whose files could not be loaded were left out of an epoch."""


class UnshardedWarning(UserWarning):
    """torch.distributed runs several ranks but the loader's sampler is not distributed."""


def _is_default_collate(fn) -> bool:
    return fn is None or fn is tud.default_collate or fn is tud._utils.collate.default_collate


class DataLoader(tud.DataLoader):
    """Drop-in for ``torch.utils.data.DataLoader`` (and one: ``isinstance`` holds) over datasets
    whose files gputransforms can read (``datasets.adapters``: ImageFolder/DatasetFolder, and
    ``Subset``/``random_split``/``ConcatDataset`` of them).

    Arguments are torch's. How they map here:

    - ``batch_size, shuffle, sampler, batch_sampler, drop_last, generator``: exactly torch's meaning
      (torch's samplers are used).
    - ``num_workers``: CPU threads for DALI (decode on CPU, host-side work on GPU); 0 means the
      cores this process may use, divided among torchrun's ranks on this host (``LOCAL_WORLD_SIZE``).
    - ``prefetch_factor``: batches DALI prepares ahead (default 4); unlike torch, allowed with
      ``num_workers=0``.
    - ``collate_fn``: torch's ``default_collate`` (or None) is what the graph produces. Any other
      function is called on each compiled batch with what torch would give it, a list of per-sample
      ``(image, target)`` pairs whose images are views into the batch on the device, and its result
      is what the loop yields (tensors in it moved to the device). The reference recipe's
      ``lambda b: mixup_cutmix(*default_collate(b))`` thus runs MixUp/CutMix on the GPU. A collate
      function that cannot take tensors (it calls ``.numpy()`` on them, or wants PIL images) raises on
      the first batch with an error that says so.
    - ``pin_memory, pin_memory_device, timeout, worker_init_fn, multiprocessing_context,
      persistent_workers, in_order``: accepted, and used only when the chain runs on the
      torchvision path; the DALI path has no worker processes and produces batches on the device.

    Extra keyword arguments: ``device`` ("gpu", "cpu" or None for the GPU when torch sees one),
    ``seed`` (DALI's seed; default drawn from ``generator``/torch's RNG like torch's base seed),
    ``hw_decoder_load`` (share of JPEGs for the hardware decoder on GPUs that have one),
    ``on_error`` ("raise": a file that cannot be loaded raises ``BadSampleError`` naming it and its
    sample index, from the loop, after the batches before it; "skip": such samples are left out,
    every other sample still comes once, ``DataLoader.skipped`` lists them and a
    ``SkippedSamplesWarning`` reports them at the end of the epoch),
    ``validate_jpeg`` (scan each JPEG's entropy-coded data for invalid markers, so that a JPEG with
    a corrupted body raises like PIL instead of decoding to garbage; default: on for device="cpu",
    off for "gpu"),
    ``jpeg_fancy_upsampling`` (GPU only: decode chroma like libjpeg-turbo/PIL; closer to torchvision,
    mean |diff| 0.15 instead of 0.30 in 0-255 units, but ~30% slower full-image decoding on an H100; never
    applied to RandomResizedCrop's ROI decode, which nvJPEG < 13.2 does not support).
    ``video_decoder`` (video datasets): "pyav" (default) decodes clips with PyAV in ``num_workers`` worker
    processes and runs the chain in the graph on the device: on the GPU the workers hand over the
    frames' YUV planes and the graph converts them to RGB ("pyav-yuv": half the bytes, no conversion
    on the CPU; within 2 of FFmpeg's RGB, mean 0.2-0.3 in 0-255 units, README, Video), on the CPU
    FFmpeg converts them in the workers ("pyav-rgb", frames equal to PyAV's); "nvdec" decodes them on
    the GPU inside the graph with DALI's ``decoders.video`` (measured ~9x slower on an H100 with
    DALI 2.4: README, Video).

    Every extra argument is kept under its own name as a public attribute, as torch keeps its own,
    so a framework that re-creates the loader from its attributes gets the same loader. Nothing is
    built until the first iteration.
    """

    def __init__(self, dataset, batch_size: Optional[int] = 1, shuffle: Optional[bool] = None, sampler=None,
                 batch_sampler=None, num_workers: int = 0, collate_fn=None, pin_memory: bool = False,
                 drop_last: bool = False, timeout: float = 0, worker_init_fn=None, multiprocessing_context=None,
                 generator=None, *, prefetch_factor: Optional[int] = None, persistent_workers: bool = False,
                 pin_memory_device: str = "", in_order: bool = True, device: Optional[str] = None,
                 seed: Optional[int] = None, hw_decoder_load: float = 0.9, jpeg_fancy_upsampling: bool = False,
                 on_error: str = "raise", validate_jpeg: Optional[bool] = None, video_decoder: str = "pyav"):
        kwargs: dict[str, Any] = dict(persistent_workers=persistent_workers, pin_memory_device=pin_memory_device)
        if num_workers > 0:  # torch rejects prefetch_factor without workers; DALI's prefetch needs none
            kwargs["prefetch_factor"] = prefetch_factor
        if not in_order:
            kwargs["in_order"] = in_order
        # torch validates the arguments (same errors) and builds the samplers we iterate
        super().__init__(dataset, batch_size=batch_size, shuffle=shuffle, sampler=sampler, batch_sampler=batch_sampler,
                         num_workers=num_workers, collate_fn=collate_fn, pin_memory=pin_memory, drop_last=drop_last,
                         timeout=timeout, worker_init_fn=worker_init_fn,
                         multiprocessing_context=multiprocessing_context, generator=generator, **kwargs)
        self.device = resolve_device(device)
        self.seed = seed
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        self.on_error = on_error
        # ~60 us per 80 KiB file under the GIL: ~2% of a CPU decode, but a real share of the
        # reader threads' budget at GPU rates (unmeasured there), so on by default on the CPU only
        self.validate_jpeg = (self.device == "cpu") if validate_jpeg is None else bool(validate_jpeg)
        self.skipped: list = []  # files.BadSampleError of the latest epoch (on_error="skip")
        self.hw_decoder_load = hw_decoder_load
        self.jpeg_fancy_upsampling = jpeg_fancy_upsampling
        if video_decoder not in VIDEO_DECODERS:
            raise ValueError(f"video_decoder must be one of {', '.join(map(repr, VIDEO_DECODERS))}, got {video_decoder!r}")
        self.video_decoder = video_decoder
        self.num_threads = num_workers if num_workers > 0 else default_threads()
        # 4 batches in flight measured 5% faster than 2 on an H100 (benchmarks/probe_loader.py)
        self.prefetch_queue_depth = prefetch_factor or 4
        self._user_collate = None if _is_default_collate(collate_fn) else collate_fn
        self._files: Optional[FileSamples] = None  # which files and targets the dataset stands for
        self._arrays = None  # an in-memory dataset's images on the device (arrays.py)
        self._array_stages: list = []
        self.plan, self.backend, self.reason = self._choose_backend(dataset)
        self._stages = tail.stages(self.plan) if self.backend == "dali" else []
        if self.backend == "arrays":
            self._stages = self._array_stages
        slow = [type(t).__name__ for t, _, stage in self._stages if stage in ("per sample", "pil")]
        if slow and self.backend == "arrays":
            warnings.warn(f"gputransforms: {', '.join(slow)} run(s) per sample with torchvision on the device (no "
                          "batched lowering); see DataLoader.explain()", FallbackWarning, stacklevel=2)
        elif slow:
            why = ("a callable before ToTensor expects a PIL image" if self.plan.tail_mode == "pil"
                   else "no DALI or batched lowering")
            warnings.warn(f"gputransforms: {', '.join(slow)} run(s) per sample with torchvision after the DALI graph "
                          f"({why}; the graph ends at {self.plan.tail_reason}); see DataLoader.explain()",
                          FallbackWarning, stacklevel=2)
        elif self.backend == "torchvision" and self.reason:
            warnings.warn(f"gputransforms: running on torchvision's DataLoader ({self.reason}); "
                          "see DataLoader.explain()", FallbackWarning, stacklevel=2)
        self._idle: list = []  # PipelineSlots no live iterator holds
        self._pool: Optional[ThreadPoolExecutor] = None
        self._resume: Optional[state.Position] = None  # from load_state_dict, for the next iterator
        self._last_iter = None  # weak reference to the newest iterator: the one state_dict() describes
        self._warned_unsharded = False
        self._max_batch_size: Optional[int] = None
        integrations.remember(dataset, dict(device=self.device, seed=seed, hw_decoder_load=hw_decoder_load,
                                            jpeg_fancy_upsampling=jpeg_fancy_upsampling, on_error=on_error,
                                            validate_jpeg=self.validate_jpeg, video_decoder=video_decoder))

    # planning -------------------------------------------------------------------------------------
    def _choose_backend(self, dataset) -> tuple[Optional[Plan], str, str]:
        if self.batch_size is None and self.batch_sampler is None:
            return None, "torchvision", "batch_size=None: per-sample items, not batches"
        arrays = self._in_memory(dataset)
        if arrays is not None:
            return arrays
        if not dali_available():
            return None, "torchvision", "NVIDIA DALI is not installed"
        try:
            self._files = resolve(dataset)
        except NotCompilable as e:
            return None, "torchvision", str(e)
        p = make_plan(self._files.transform, self._files.plan_input)
        if p.steps and p.steps[0].op == "video_decode":
            nvdec = self.device == "gpu" and self.video_decoder == "nvdec"
            yuv = self.video_decoder == "pyav-yuv" or (self.video_decoder == "pyav" and self.device == "gpu")
            p.steps[0].args.update(decoder="nvdec" if nvdec else "pyav", frames="yuv420" if yuv and not nvdec else "rgb")
        if not p.compiled:
            return p, "torchvision", p.tail_reason
        if p.output == "image" and not p.tail and self._user_collate is None:
            raise TypeError("the transform chain ends with a PIL image, which cannot be batched "
                            "(torch's default_collate raises too); end it with ToTensor() or PILToTensor()")
        if p.tail and p.tail_mode == "pil" and self.num_workers > 0:
            # After the graph these would run per sample on PIL images in this one thread: timm's
            # RandAugment chain measured 426 img/s that way on an H100 host against 2,317 img/s on
            # torch's DataLoader with 16 workers (benchmarks/results/h100-timm-ra.json).
            names = ", ".join(sorted({type(t).__name__ for t in p.tail if not isinstance(t, TO_TENSOR)}))
            return p, "torchvision", (f"{names} need(s) PIL images; per sample they run faster in torch's "
                                      f"{self.num_workers} worker processes than in the main thread after "
                                      "the DALI graph (pass num_workers=0 to keep the graph)")
        return p, "dali", ""

    def _in_memory(self, dataset) -> Optional[tuple]:
        """An in-memory dataset (datasets/inmemory.py) runs on its device without DALI (arrays.py)."""
        from .arrays import DeviceArrays
        from .compiler import vectorized
        from .compiler.plan import NotLowerable
        from .datasets.inmemory import ARRAY_ADAPTERS

        inner = dataset
        while isinstance(inner, tud.Subset):  # random_split's parts too
            inner = inner.dataset
        if not any(c in ARRAY_ADAPTERS for c in type(inner).__mro__):
            return None
        try:
            samples = resolve(dataset)
        except NotCompilable as e:
            return None, "torchvision", str(e)
        if getattr(samples, "plan_input", "") != "array":
            return None
        try:
            self._array_stages = vectorized.stages(samples.transform, samples.pil) if samples.transform else []
        except NotLowerable as e:
            return None, "torchvision", str(e)
        if samples.pil and samples.transform is None:
            if self._user_collate is not None:
                return None, "torchvision", f"{type(dataset).__name__} without a transform gives the collate_fn PIL images"
            raise TypeError(f"{type(dataset).__name__} without a transform gives PIL images, which cannot be batched "
                            "(torch's default_collate raises too); add ToTensor() or PILToTensor()")
        self._files = samples
        self._arrays = DeviceArrays(samples, self.device)
        return None, "arrays", ""

    def explain(self) -> str:
        head = (f"gputransforms.DataLoader: {len(self.dataset)} samples, batch_size={self.batch_size}, "
                f"backend={self.backend}, device={self.device}")
        if self._files is not None and self._files.origin:
            head += f"\n  files: {self._files.origin}"
        if self._user_collate is not None and self.backend == "dali":
            head += f"\n  collate_fn {getattr(self._user_collate, '__name__', type(self._user_collate).__name__)} " \
                    "runs on each compiled batch"
        if self.backend == "arrays":
            from .arrays import explain

            return head + "\n" + explain(self._array_stages, self.device)
        if self.backend == "torchvision":
            lines = [head, f"  reason: {self.reason}"]
            if self.plan is not None:
                if self.plan.compiled:
                    lines.append("what num_workers=0 would run instead:")
                lines.append(self.plan.explain(self.device))
            return "\n".join(lines)
        if self.device == "gpu" and cuda_connections_note():
            head += f"\n  {cuda_connections_note()}"
        return head + "\n" + self.plan.explain(self.device)

    # iteration ------------------------------------------------------------------------------------
    def __iter__(self):
        self._warn_if_unsharded()
        resume, self._resume = self._resume, None
        if self.backend == "arrays":
            from .arrays import ArrayIterator

            it = ArrayIterator(self, self._arrays, self._array_stages, resume)
        else:
            it = _TorchIterator(self, resume) if self.backend == "torchvision" else _CompiledIterator(self, resume)
        self._last_iter = weakref.ref(it)
        return it

    # resume -----------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Where the newest iterator stands (``gputransforms.state``): the random state its epoch
        started from and the batches it handed out. Small, picklable, no image data."""
        it = self._last_iter() if self._last_iter is not None else None
        if it is not None and not it.done:
            skipped = [(e.index, e.path, e.reason) for e in it.skipped]
            return state.Position(it.rng_start, it.yielded, skipped, *it.random_state()).to_dict()
        return state.Position(state.rng_state(self.generator), 0, []).to_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        """The next ``iter(loader)`` goes on where the saved one stood: with batch k+1 of its epoch,
        and the epochs after it are the uninterrupted run's."""
        self._resume = state.Position.from_dict(state_dict)

    def _warn_if_unsharded(self):
        import torch.distributed as dist

        if self._warned_unsharded or not (dist.is_available() and dist.is_initialized()):
            return
        world = dist.get_world_size()
        if world < 2 or _sharded(self.sampler) or _sharded(self.batch_sampler):
            return
        self._warned_unsharded = True
        warnings.warn(f"gputransforms: torch.distributed runs {world} ranks but this DataLoader's sampler is not "
                      f"distributed, so rank {dist.get_rank()} gets every sample of every epoch: pass "
                      "sampler=DistributedSampler(dataset) and call sampler.set_epoch(epoch) each epoch (Lightning "
                      "and Accelerate inject one themselves)", UnshardedWarning, stacklevel=3)

    def _acquire_slot(self) -> PipelineSlot:
        slot = self._idle.pop() if self._idle else PipelineSlot()
        slot.drain()
        return slot

    def _release_slot(self, slot: PipelineSlot, *, dirty: bool):
        slot.dirty = dirty
        if not dirty:
            slot.epoch = None
        self._idle.append(slot)

    def _build_pipeline(self, slot: PipelineSlot, seed: int, checkpoint: Optional[bytes] = None):
        from .compiler.dali import build_pipeline

        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=max(1, min(4, self.num_threads)),
                                            thread_name_prefix="gputransforms-read")
        # no_copy: DALI reads the files where the reader threads put them; copied in, they cost the
        # main thread (schedule_run runs the callback) a memcpy of every batch's files
        slot.pipe = build_pipeline(self.plan, slot.callback(keep=self.prefetch_queue_depth + 2), device=self.device,
                                   batch_size=self._max_batch(), num_threads=self.num_threads, seed=seed,
                                   prefetch_queue_depth=self.prefetch_queue_depth,
                                   hw_decoder_load=self.hw_decoder_load,
                                   jpeg_fancy_upsampling=self.jpeg_fancy_upsampling, checkpoint=checkpoint,
                                   no_copy=True, raw_output=self.plan.hands_over_raw(self.device))

    def _max_batch(self) -> int:
        """The largest batch the index sampler gives (the pipeline's batch size), found before an
        epoch starts: a custom batch sampler may share one iterator between its iter() calls
        (Lightning's _IndexBatchSamplerWrapper does), and scanning it must not draw from the RNG."""
        if self._max_batch_size is None:
            size = self.batch_size or _declared_batch_size(self.batch_sampler)
            if size is None:  # a batch sampler that declares no size: scan it (it may count its passes)
                gen_state = self.generator.get_state() if self.generator is not None else None
                with torch.random.fork_rng(devices=[]):
                    size = max((len(b) for b in self._index_sampler), default=1)
                if gen_state is not None:
                    self.generator.set_state(gen_state)
            self._max_batch_size = size
        return self._max_batch_size

    def _new_epoch(self, batches, skipped: list, slot: PipelineSlot) -> EpochFeed:
        first = self.plan.steps[0]
        if first.op == "video_decode" and first.args["decoder"] == "pyav":
            if slot.decoders is None:
                slot.decoders = ProcessDecoders(self._files, self.num_threads, lookahead=self.prefetch_queue_depth + 2,
                                                planes=first.args["frames"] == "yuv420")
            return ProcessEpochFeed(slot.decoders, batches, skip=self.on_error == "skip", skipped=skipped)
        return EpochFeed(self._files, batches, self._pool, lookahead=self.prefetch_queue_depth + 2,
                         skip=self.on_error == "skip", gpu=self.device == "gpu",
                         check_jpeg_scan=self.validate_jpeg, skipped=skipped)

    def _labels(self, indices, dev: torch.device):
        s = self._files
        if s.target_transforms is None and all(type(s.targets[i]) is int for i in indices):
            labels = torch.as_tensor([s.targets[i] for i in indices], dtype=torch.int64)
        else:
            labels = tud.default_collate([s.target(i) for i in indices])
        return to_device(labels, dev)

    def close(self):
        """Release the DALI pipelines and the reader threads now (also done when the loader is
        garbage; a later iteration builds them again)."""
        idle, self._idle = self._idle, []
        for slot in idle:
            slot.close()  # video decoding worker processes end now, not at a later garbage collection
        pool, self._pool = getattr(self, "_pool", None), None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    def __del__(self):
        pool = getattr(self, "_pool", None)
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)


def _declared_batch_size(batch_sampler, depth: int = 4) -> Optional[int]:
    """The ``batch_size`` a batch sampler, or one it wraps, declares (Accelerate's SkipBatchSampler
    wraps its BatchSamplerShard, which wraps torch's BatchSampler): no iteration, which a stateful
    sampler would count as a pass (Accelerate's SeedableRandomSampler advances its epoch)."""
    while batch_sampler is not None and depth > 0:
        size = getattr(batch_sampler, "batch_size", None)
        if isinstance(size, int) and size > 0:
            return size
        batch_sampler, depth = getattr(batch_sampler, "batch_sampler", None), depth - 1
    return None


def _sharded(sampler, depth: int = 3) -> bool:
    """Whether a sampler (or one it wraps) hands each rank its own part: DistributedSampler,
    Lightning's wrappers of it, Accelerate's BatchSamplerShard."""
    if sampler is None or depth == 0:
        return False
    if isinstance(sampler, tud.distributed.DistributedSampler) or hasattr(sampler, "num_replicas") \
            or hasattr(sampler, "num_processes"):
        return True
    return any(_sharded(getattr(sampler, a, None), depth - 1) for a in ("sampler", "batch_sampler"))


class _TorchIterator:
    """torch's own iterator (the torchvision path), batches moved to the device, counted for state_dict.
    Resuming replays the skipped batches: torch's worker iterators load what they are given."""

    def __init__(self, loader: DataLoader, resume: Optional[state.Position]):
        if resume is not None:
            state.set_rng_state(loader.generator, resume.rng)
        self.rng_start = state.rng_state(loader.generator)
        self.dev = torch_device(loader.device)
        self.it = tud.DataLoader.__iter__(loader)
        self.yielded, self.done, self.skipped = 0, False, []
        if resume is not None:
            state.skip_batches(self.it, resume.batches)
            self.yielded = resume.batches

    def __iter__(self):
        return self

    def __len__(self) -> int:
        return len(self.it)

    def random_state(self) -> tuple:
        return None, None  # torch's workers draw from seeds the epoch's start fixes

    def __next__(self):
        try:
            batch = next(self.it)
        except StopIteration:
            self.done = True
            raise
        self.yielded += 1
        return to_device(batch, self.dev) if self.dev.type == "cuda" else batch


class _CompiledIterator:
    """One pass over the sampler through a pipeline of its own: torch's ``_BaseDataLoaderIter``
    draws (the sampler's order, then the base seed from ``generator``) in the same order."""

    def __init__(self, loader: DataLoader, resume: Optional[state.Position] = None):
        self.loader = loader
        self.slot = loader._acquire_slot()
        if resume is not None:
            state.set_rng_state(loader.generator, resume.rng)
        self.rng_start = state.rng_state(loader.generator)
        loader._max_batch()  # before the epoch's iter(): see there
        self.batches = iter(loader._index_sampler)
        base_seed = torch.empty((), dtype=torch.int64).random_(generator=loader.generator).item()
        self.seed = loader.seed if loader.seed is not None else base_seed % (2 ** 31)
        self.skipped: list = []
        self.yielded = 0
        self.resumed_random = (None, None) if resume is None else (resume.dali, resume.rng_now)
        if resume is not None:
            self.skipped = [files.BadSampleError(*s) for s in resume.skipped]
            if resume.dali is not None:  # random operators go on where the saved pipeline stood
                loader._build_pipeline(self.slot, self.seed + len(self.skipped), checkpoint=resume.dali)
        if self.slot.pipe is None:
            loader._build_pipeline(self.slot, self.seed)
        if resume is not None:
            state.skip_batches(self.batches, resume.batches)
            self.yielded = resume.batches
            if resume.rng_now is not None:  # the batched stage's draws go on too
                torch.set_rng_state(resume.rng_now)
        loader.skipped = self.skipped
        self.epoch: Optional[EpochFeed] = None  # started by the first next(): the sampler draws then, as torch's
        self.dev = torch_device(loader.device)
        self.stream = torch.cuda.current_stream(self.dev) if self.dev.type == "cuda" else None
        from .compiler.dali import to_torch  # DALI is imported only on the compiled path

        self.to_torch = to_torch
        self.raw = loader.plan.hands_over_raw(loader.device)  # the graph hands over raw uint8 pixels
        self.scheduled = False
        self.first = True
        self.done = False

    def __iter__(self):
        return self

    def __len__(self) -> int:
        return len(self.loader)

    def random_state(self) -> tuple:
        """(DALI checkpoint, torch's global RNG) after the batches handed out so far."""
        pipe = self.slot.pipe
        if pipe is None or self.epoch is None:  # nothing drawn since this iterator started
            return self.resumed_random
        return pipe.checkpoint() if self.loader.plan.checkpointable else None, torch.get_rng_state()

    def __next__(self):
        try:
            return self._next()
        except StopIteration:
            raise
        except Exception as e:
            raise _tagged_with_rank(e)

    def _next(self):
        if self.done:
            raise StopIteration
        loader, slot = self.loader, self.slot
        while True:
            pipe = slot.pipe
            try:
                if not self.scheduled:
                    if self.epoch is None:
                        self.epoch = slot.epoch = loader._new_epoch(self.batches, self.skipped, slot)
                    self.scheduled = True
                    pipe.schedule_run()
                out = pipe.outputs(self.stream) if self.stream is not None else pipe.outputs()
                break
            except StopIteration:
                self._end_of_epoch()
            except RuntimeError as e:
                err = _named_error(e, list(self.epoch.in_flight[0]) if self.epoch.in_flight else [], loader._files)
                if loader.on_error == "skip" and isinstance(err, files.BadSampleError):
                    self._restart_after_decode_error(err)
                    continue
                slot.pipe = None  # the pipeline object is dead after any error
                self._release(dirty=False)
                raise err from e
        indices = self.epoch.in_flight.popleft()
        images = self.to_torch(out[0])
        if self.raw:
            images = handoff.to_float(images, loader.plan)
        pipe.schedule_run()
        self.yielded += 1
        plan = loader.plan
        if plan.tail:
            images = tail.run_tail(images, plan, self.dev, loader._stages)
        elif isinstance(images, torch.Tensor) and images.dtype != plan.out_dtype:
            images = images.to(plan.out_dtype)
        if loader._user_collate is None:
            return loader._files.batch(images, loader._labels(indices, self.dev), self.dev, indices)
        return self._collate(images, indices)

    def _collate(self, images, indices):
        """The user's collate_fn on what torch would hand it: per-sample (image, target) pairs."""
        loader = self.loader
        batch = loader._files.items(images.unbind(0) if isinstance(images, torch.Tensor) else images, indices)
        first, self.first = self.first, False
        try:
            return to_device(loader._user_collate(batch), self.dev)
        except Exception as e:  # noqa: BLE001 - any failure on the first batch gets the explanation
            if not first:
                raise
            name = getattr(loader._user_collate, "__name__", type(loader._user_collate).__name__)
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

    def _restart_after_decode_error(self, bad: files.BadSampleError):
        """on_error="skip" and DALI failed on a file PIL cannot decode either: the pipeline object
        is dead after any error, so build a new one and feed it again, in order, every batch that
        was in flight (without the bad file) before the rest of the epoch."""
        self.skipped.append(bad)
        done = {e.index for e in self.skipped}  # this one, and those the reader threads already left out
        pending = [[i for i in b if i not in done] for b in self.epoch.pending()]
        self.epoch.stop()
        self.slot.pipe = None
        self.loader._build_pipeline(self.slot, self.seed + len(self.skipped))
        self.epoch = self.slot.epoch = self.loader._new_epoch(
            itertools.chain([b for b in pending if b], self.epoch.batches), self.skipped, self.slot)
        self.scheduled = False

    def _end_of_epoch(self):
        self.done = True
        self.slot.pipe.reset()
        epoch = self.epoch
        self._release(dirty=False)
        if epoch.error is not None:
            raise epoch.error
        if self.skipped:
            shown = "; ".join(f"{e.index}: {e.path} ({e.reason})" for e in self.skipped[:5])
            warnings.warn(f"gputransforms: skipped {len(self.skipped)} sample(s) this epoch "
                          f"(DataLoader.skipped lists them): {shown}", SkippedSamplesWarning, stacklevel=3)
        raise StopIteration

    def _release(self, *, dirty: bool):
        slot, self.slot = self.slot, None
        self.done = True
        if slot is not None:
            self.loader._release_slot(slot, dirty=dirty)

    def close(self):
        """Stop this pass early; its pipeline goes back to the loader for the next iterator."""
        self._release(dirty=True)

    def __del__(self):
        if getattr(self, "slot", None) is not None:
            try:
                self._release(dirty=True)
            except Exception:  # noqa: BLE001 - at interpreter exit the loader may be half gone
                pass


def _tagged_with_rank(err: Exception) -> Exception:
    """Under torchrun, a loader's error says which rank raised it (the others then stop at their
    next collective: torchrun ends them when this process exits)."""
    tag = rank_tag()
    if tag and err.args and isinstance(err.args[0], str) and tag not in err.args[0]:
        err.args = (f"[{tag}] {err.args[0]}",) + err.args[1:]
    return err


def _named_error(err: Exception, indices, samples: FileSamples) -> Exception:
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
    if samples.transform is not None:
        for i in indices:
            path = paths[i]
            try:
                samples.transform(samples.load(i))
            except Exception as tv_err:  # noqa: BLE001 - torchvision's exception is the answer
                try:
                    return type(tv_err)(f"{tv_err} (sample {i}: {path})")
                except Exception:  # noqa: BLE001 - an exception type that takes other arguments
                    return RuntimeError(f"gputransforms: sample {i} ({path}): {type(tv_err).__name__}: {tv_err}")
    named = ", ".join(f"{i}: {paths[i]}" for i in indices[:8])
    more = f" and {len(indices) - 8} more" if len(indices) > 8 else ""
    first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return RuntimeError(f"gputransforms: DALI failed on the batch of samples {named}{more}: {first_line}")
