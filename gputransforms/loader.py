"""DataLoader: a ``torch.utils.data.DataLoader`` whose batches come from a compiled backend.

This module is the face: the arguments (torch's, validated by torch, plus ours), ``__iter__``,
``state_dict``/``load_state_dict``, ``explain`` and ``close``. Which backend makes the batches --
one DALI graph over the dataset's files, device arrays for in-memory data, or torch's own workers --
is ``backends.choose``'s answer; each backend owns its iterator. Index order, shuffling, sharding,
``drop_last`` and ``len()`` are torch's own (this class is torch's DataLoader, and its index sampler
is iterated exactly as torch's iterator iterates it), so the same ``generator`` gives the same batches
of indices as torch, and frameworks that rebuild a DataLoader with another sampler (Lightning,
Accelerate) rebuild this one.
"""
from __future__ import annotations

import warnings
import weakref
from typing import Any, Callable, Iterable, Optional, Union

import torch
import torch.utils.data as tud

from . import backends, integrations, state
from .compiler.plan import VIDEO_DECODERS
from .device import default_threads, resolve as resolve_device
from .errors import FallbackWarning, SkippedSamplesWarning, UnshardedWarning, user_stacklevel
from .prepared import PreparedCopy

__all__ = ["DataLoader", "FallbackWarning", "SkippedSamplesWarning", "UnshardedWarning"]


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
      As with torch's workers, where it is over 0 the transforms after the graph and the collate_fn draw
      from a generator seeded from each epoch's base seed, and with 0 from torch's global one.
    - ``prefetch_factor``: batches DALI prepares ahead (default 4); unlike torch, allowed with
      ``num_workers=0``.
    - ``collate_fn``: torch's ``default_collate`` (or None) is what the graph produces. Any other
      function is called on each compiled batch with what torch would give it, a list of per-sample
      ``(image, target)`` pairs whose images are views into the batch on the device, and its result
      is what the loop yields (tensors in it moved to the device). The reference recipe's
      ``lambda b: mixup_cutmix(*default_collate(b))`` thus runs MixUp/CutMix on the GPU. A collate
      function that cannot take tensors (it calls ``.numpy()`` on them, or wants PIL images) raises on
      the first batch with an error that says so.
    - ``pin_memory``: as torch, batches made on the CPU are pinned where an accelerator is present;
      batches made on the GPU have nothing to pin (``explain()`` says which).
    - ``timeout``: as torch, an error when a batch takes longer than this to load; on the compiled path
      it names the sample whose file read did not return.
    - ``pin_memory_device, worker_init_fn, multiprocessing_context, persistent_workers, in_order``:
      accepted, and used only when the chain runs on the torchvision path; the DALI path has no worker
      processes.

    Extra keyword arguments: ``device`` ("gpu", "cpu" or None for the GPU when torch sees one),
    ``seed`` (DALI's seed; default drawn from ``generator``/torch's RNG like torch's base seed; samples
    recorded in worker processes draw from each epoch's base seed either way),
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
    on the CPU; within 2 of FFmpeg's RGB, mean 0.2-0.3 in 0-255 units, docs/video.md), on the CPU
    FFmpeg converts them in the workers ("pyav-rgb", frames equal to PyAV's); "nvdec" decodes them on
    the GPU inside the graph with DALI's ``decoders.video`` (measured ~9x slower on an H100 with
    DALI 2.4: docs/video.md).
    ``prepared`` (a ``PreparedCopy``, image files only; opt-in): after a file's first read, later epochs
    decode a copy of it at reduced resolution kept in a cache directory (docs/performance.md gives
    the pixel difference).

    Every extra argument is kept under its own name as a public attribute, as torch keeps its own,
    so a framework that re-creates the loader from its attributes gets the same loader. Nothing is
    built until the first iteration.
    """

    def __init__(self, dataset: tud.Dataset, batch_size: Optional[int] = 1, shuffle: Optional[bool] = None,
                 sampler: Union[tud.Sampler, Iterable, None] = None,
                 batch_sampler: Union[tud.Sampler[list], Iterable[list], None] = None, num_workers: int = 0,
                 collate_fn: Optional[Callable[[list], Any]] = None, pin_memory: bool = False,
                 drop_last: bool = False, timeout: float = 0, worker_init_fn: Optional[Callable[[int], None]] = None,
                 multiprocessing_context: Any = None, generator: Optional[torch.Generator] = None, *,
                 prefetch_factor: Optional[int] = None, persistent_workers: bool = False,
                 pin_memory_device: str = "", in_order: bool = True, device: Optional[str] = None,
                 seed: Optional[int] = None, hw_decoder_load: float = 0.9, jpeg_fancy_upsampling: bool = False,
                 on_error: str = "raise", validate_jpeg: Optional[bool] = None, video_decoder: str = "pyav",
                 prepared: Optional[PreparedCopy] = None):
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
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        if video_decoder not in VIDEO_DECODERS:
            raise ValueError(f"video_decoder must be one of {', '.join(map(repr, VIDEO_DECODERS))}, got {video_decoder!r}")
        self.device = resolve_device(device)
        self.seed = seed
        self.on_error = on_error
        # ~60 us per 80 KiB file under the GIL: ~2% of a CPU decode, but a real share of the
        # reader threads' budget at GPU rates (unmeasured there), so on by default on the CPU only
        self.validate_jpeg = (self.device == "cpu") if validate_jpeg is None else bool(validate_jpeg)
        self.hw_decoder_load = hw_decoder_load
        self.jpeg_fancy_upsampling = jpeg_fancy_upsampling
        self.video_decoder = video_decoder
        self.prepared = prepared
        self.num_threads = num_workers if num_workers > 0 else default_threads()
        # 4 batches in flight measured 5% faster than 2 on an H100 (benchmarks/probes/probe_loader.py)
        self.prefetch_queue_depth = prefetch_factor or 4
        self.skipped: list = []  # BadSampleError of the latest epoch (on_error="skip")
        self._backend = backends.choose(backends.Settings(
            device=self.device, seed=seed, on_error=on_error, validate_jpeg=self.validate_jpeg,
            hw_decoder_load=hw_decoder_load, jpeg_fancy_upsampling=jpeg_fancy_upsampling, video_decoder=video_decoder,
            num_threads=self.num_threads, num_workers=num_workers, prefetch_queue_depth=self.prefetch_queue_depth,
            collate=None if _is_default_collate(collate_fn) else collate_fn, batch_size=self.batch_size,
            batch_sampler=batch_sampler, pin_memory=pin_memory, timeout=timeout, drop_last=drop_last,
            prepared=prepared, persistent_workers=persistent_workers), dataset)
        fallback = self._backend.fallback()
        if fallback:
            warnings.warn(f"gputransforms: {fallback}; see DataLoader.explain()", FallbackWarning,
                          stacklevel=user_stacklevel())
        # each epoch's base seed: torch's persistent workers' iterator draws one for the first epoch only
        self._seeds = state.BaseSeeds(persistent_workers and num_workers > 0)
        self._resume: Optional[state.Position] = None  # from load_state_dict, for the next iterator
        self._last_iter = None  # weak reference to the newest iterator: the one state_dict() describes
        self._warned_unsharded = False
        # a framework that rebuilds this loader (Accelerate) rebuilds it with these, as this class
        integrations.remember(dataset, type(self), dict(
            device=self.device, seed=seed, hw_decoder_load=hw_decoder_load, jpeg_fancy_upsampling=jpeg_fancy_upsampling,
            on_error=on_error, validate_jpeg=self.validate_jpeg, video_decoder=video_decoder, prepared=prepared))

    @property
    def backend(self) -> str:
        """Which backend makes the batches: "dali" (the compiled graph), "arrays" (in-memory data on the
        device) or "torchvision" (torch's own DataLoader; ``reason`` says why)."""
        return self._backend.name

    @property
    def plan(self):
        """The compiled chain (``compiler.Plan``), or None where nothing was planned."""
        return self._backend.plan

    @property
    def reason(self) -> str:
        """Why the batches do not come from a compiled graph ("" where they do)."""
        return self._backend.reason

    def explain(self) -> str:
        """How this loader makes its batches: the backend, why it was chosen, and its plan (the DALI
        graph with its fusions, what runs batched on the device, what runs per sample)."""
        try:
            size = f"{len(self.dataset)} samples"
        except TypeError:  # an IterableDataset
            size = f"an iterable dataset ({type(self.dataset).__name__})"
        head = (f"gputransforms.DataLoader: {size}, batch_size={self.batch_size}, backend={self.backend}, "
                f"device={self.device}")
        if self._backend.origin:
            head += f"\n  files: {self._backend.origin}"
        return head + "\n" + self._backend.explain()

    def __iter__(self):
        text = None if self._warned_unsharded else backends.base.unsharded_warning(self.sampler, self.batch_sampler)
        if text:
            self._warned_unsharded = True
            warnings.warn(text, UnshardedWarning, stacklevel=2)
        resume, self._resume = self._resume, None
        sampling = backends.Sampling(self._index_sampler, self.generator, self.__len__, self._torch_iter,
                                     None if _is_default_collate(self.collate_fn) else self.collate_fn, self._seeds)
        it = self._backend.iterator(sampling, resume)
        self.skipped = it.skipped
        self._last_iter = weakref.ref(it)
        return it

    def _torch_iter(self, pin: bool = False):
        """torch's own iterator over this loader. ``pin``: its batches are pinned by torch's pin-memory
        thread, as with ``pin_memory=True``, while ``self.pin_memory`` stays as the user set it (torch's
        iterator reads it once, when it is made)."""
        if not pin or self.pin_memory:
            return tud.DataLoader.__iter__(self)
        self.pin_memory = True
        try:
            return tud.DataLoader.__iter__(self)
        finally:
            self.pin_memory = False

    def state_dict(self) -> dict:
        """Where the newest iterator stands (``gputransforms.state``): the random state its epoch
        started from and the batches it handed out. Small, picklable, no image data."""
        it = self._last_iter() if self._last_iter is not None else None
        if it is not None and not it.done:
            return it.position().to_dict()
        return state.Position(state.rng_state(self.generator), 0, [], seeds=self._seeds.state()).to_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        """The next ``iter(loader)`` goes on where the saved one stood: with batch k+1 of its epoch,
        and the epochs after it are the uninterrupted run's."""
        self._resume = state.Position.from_dict(state_dict)

    def close(self):
        """Release the DALI pipelines, reader threads and decoder processes now (also done when the
        loader and its iterators are garbage; a later iteration builds them again)."""
        self._backend.close()
