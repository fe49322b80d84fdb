"""DataLoader: torch's signature and epoch semantics, batches produced by one compiled DALI graph.

Index order, shuffling, sharding, ``drop_last`` and ``len()`` come from torch's own samplers (a
``torch.utils.data.DataLoader`` is built with the user's arguments and its index sampler is
iterated exactly as torch's loader iterates it), so the same ``generator`` gives the same batches
of indices as torch. Encoded files are read ahead by a few threads and handed to DALI in that
order; labels never travel through DALI: each batch's indices are queued when its files are fed
and popped when its images come out, in order.
"""
from __future__ import annotations

import collections
import itertools
import os
import warnings
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional

import torch
import torch.utils.data as tud
from torchvision.datasets import DatasetFolder
from torchvision.datasets.folder import default_loader, pil_loader

from . import files
from .compiler import tail
from .compiler.plan import TO_TENSOR, Plan, plan as make_plan


class FallbackWarning(UserWarning):
    """Part of a transform chain runs per sample with torchvision instead of in the DALI graph."""


class SkippedSamplesWarning(UserWarning):
    """With on_error="skip", samples whose files could not be loaded were left out of an epoch."""


def dali_available() -> bool:
    try:
        import nvidia.dali  # noqa: F401 - importable is the question
    except ImportError:
        return False
    return True


def default_device() -> str:
    """"gpu" when torch sees a CUDA device (DALI then decodes with nvJPEG), else "cpu"."""
    return "gpu" if torch.cuda.is_available() else "cpu"


def _is_image_folder_loader(loader) -> bool:
    return loader in (default_loader, pil_loader)


class _Epoch:
    """One pass over the sampler: reads files ahead in threads, feeds DALI, remembers the order."""

    def __init__(self, loader: "DataLoader", batches, pool: ThreadPoolExecutor, lookahead: int):
        self.samples = loader.dataset.samples
        self.batches = batches
        self.pool = pool
        self.lookahead = lookahead
        self.reading: collections.deque = collections.deque()
        self.in_flight: collections.deque = collections.deque()
        self.stopped = False
        self.skip = loader.on_error == "skip"
        self.gpu = loader.device == "gpu"
        self.check_jpeg_scan = loader.validate_jpeg
        self.skipped = loader.skipped
        self.error: Optional[files.BadSampleError] = None
        self._fill()

    def _read(self, indices):
        """Encoded files of one batch; bad files raise, or are dropped and recorded with on_error="skip"."""
        data, kept = [], []
        for i in indices:
            try:
                data.append(files.prepare(i, self.samples[i][0], small_jpegs_via_pil=self.gpu,
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


class DataLoader:
    """Drop-in for ``torch.utils.data.DataLoader`` over an ImageFolder/DatasetFolder.

    Arguments are torch's. How they map here:

    - ``batch_size, shuffle, sampler, batch_sampler, drop_last, generator``: exactly torch's meaning
      (torch's samplers are used).
    - ``num_workers``: CPU threads for DALI (decode on CPU, host-side work on GPU); 0 means all cores.
    - ``prefetch_factor``: batches DALI prepares ahead (default 4); unlike torch, allowed with
      ``num_workers=0``.
    - ``pin_memory, pin_memory_device, timeout, worker_init_fn, multiprocessing_context,
      persistent_workers, in_order``: accepted, and used only when the chain runs on the
      torchvision path; the DALI path has no worker processes and produces batches on the device.
    - ``collate_fn``: a custom one switches to the torchvision path (torch's DataLoader, moved to
      the device), since the compiled graph produces whole batches.

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
    """

    def __init__(self, dataset, batch_size: Optional[int] = 1, shuffle: Optional[bool] = None, sampler=None,
                 batch_sampler=None, num_workers: int = 0, collate_fn=None, pin_memory: bool = False,
                 drop_last: bool = False, timeout: float = 0, worker_init_fn=None, multiprocessing_context=None,
                 generator=None, *, prefetch_factor: Optional[int] = None, persistent_workers: bool = False,
                 pin_memory_device: str = "", in_order: bool = True, device: Optional[str] = None,
                 seed: Optional[int] = None, hw_decoder_load: float = 0.9, jpeg_fancy_upsampling: bool = False,
                 on_error: str = "raise", validate_jpeg: Optional[bool] = None):
        kwargs: dict[str, Any] = dict(persistent_workers=persistent_workers, pin_memory_device=pin_memory_device)
        if num_workers > 0:  # torch rejects prefetch_factor without workers; DALI's prefetch needs none
            kwargs["prefetch_factor"] = prefetch_factor
        if not in_order:
            kwargs["in_order"] = in_order
        # torch validates the arguments (same errors) and builds the samplers we iterate
        self._torch = tud.DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, sampler=sampler,
                                     batch_sampler=batch_sampler, num_workers=num_workers, collate_fn=collate_fn,
                                     pin_memory=pin_memory, drop_last=drop_last, timeout=timeout,
                                     worker_init_fn=worker_init_fn,
                                     multiprocessing_context=multiprocessing_context, generator=generator,
                                     **kwargs)
        if device not in (None, "gpu", "cpu", "cuda"):
            raise ValueError(f"device must be 'gpu', 'cpu' or None, got {device!r}")
        self.device = "gpu" if device == "cuda" else (device or default_device())
        if self.device == "gpu" and not torch.cuda.is_available():
            raise RuntimeError("device='gpu' but torch sees no CUDA device")
        self.seed = seed
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        self.on_error = on_error
        # ~60 us per 80 KiB file under the GIL: ~2% of a CPU decode, but a real share of the
        # reader threads' budget at GPU rates (unmeasured there), so on by default on the CPU only
        self.validate_jpeg = (self.device == "cpu") if validate_jpeg is None else bool(validate_jpeg)
        self.skipped: list = []  # files.BadSampleError of the current/last epoch (on_error="skip")
        self.hw_decoder_load = hw_decoder_load
        self.jpeg_fancy_upsampling = jpeg_fancy_upsampling
        self.num_threads = num_workers if num_workers > 0 else (os.cpu_count() or 1)
        # 4 batches in flight measured 5% faster than 2 on an H100 (benchmarks/probe_loader.py)
        self.prefetch_queue_depth = prefetch_factor or 4
        self.plan, self.backend, self.reason = self._choose_backend(dataset, collate_fn)
        self._stages = tail.stages(self.plan) if self.backend == "dali" else []
        slow = [type(t).__name__ for t, _, stage in self._stages if stage in ("per sample", "pil")]
        if slow:
            why = ("a callable before ToTensor expects a PIL image" if self.plan.tail_mode == "pil"
                   else "no DALI or batched lowering")
            warnings.warn(f"gputransforms: {', '.join(slow)} run(s) per sample with torchvision after the DALI graph "
                          f"({why}; the graph ends at {self.plan.tail_reason}); see DataLoader.explain()",
                          FallbackWarning, stacklevel=2)
        elif self.backend == "torchvision" and self.reason:
            warnings.warn(f"gputransforms: running on torchvision's DataLoader ({self.reason}); "
                          "see DataLoader.explain()", FallbackWarning, stacklevel=2)
        self._pipe = None
        self._pool: Optional[ThreadPoolExecutor] = None
        self._epoch: Optional[_Epoch] = None

    # torch's public attributes --------------------------------------------------------------------
    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._torch, name)

    def __len__(self) -> int:
        return len(self._torch)

    # planning -------------------------------------------------------------------------------------
    def _choose_backend(self, dataset, collate_fn) -> tuple[Optional[Plan], str, str]:
        if not isinstance(dataset, DatasetFolder):
            return None, "torchvision", f"{type(dataset).__name__} is not an ImageFolder/DatasetFolder"
        if not _is_image_folder_loader(dataset.loader):
            return None, "torchvision", "the dataset has a custom loader; DALI decodes only what PIL's RGB loader does"
        if collate_fn is not None:
            return None, "torchvision", "a custom collate_fn"
        if not dali_available():
            return None, "torchvision", "NVIDIA DALI is not installed"
        p = make_plan(dataset.transform)
        if not p.compiled:
            return p, "torchvision", p.tail_reason
        if p.output == "image" and not p.tail:
            raise TypeError("the transform chain ends with a PIL image, which cannot be batched "
                            "(torch's default_collate raises too); end it with ToTensor() or PILToTensor()")
        if p.tail and p.tail_mode == "pil" and self._torch.num_workers > 0:
            # After the graph these would run per sample on PIL images in this one thread: timm's
            # RandAugment chain measured 426 img/s that way on an H100 host against 2,317 img/s on
            # torch's DataLoader with 16 workers (benchmarks/results/h100-timm-ra.json).
            names = ", ".join(sorted({type(t).__name__ for t in p.tail if not isinstance(t, TO_TENSOR)}))
            return p, "torchvision", (f"{names} need(s) PIL images; per sample they run faster in torch's "
                                      f"{self._torch.num_workers} worker processes than in the main thread after "
                                      "the DALI graph (pass num_workers=0 to keep the graph)")
        return p, "dali", ""

    def explain(self) -> str:
        head = (f"gputransforms.DataLoader: {len(self._torch.dataset)} samples, batch_size={self.batch_size}, "
                f"backend={self.backend}, device={self.device}")
        if self.backend == "torchvision":
            lines = [head, f"  reason: {self.reason}"]
            if self.plan is not None:
                if self.plan.compiled:
                    lines.append("what num_workers=0 would run instead:")
                lines.append(self.plan.explain(self.device))
            return "\n".join(lines)
        return head + "\n" + self.plan.explain(self.device)

    # iteration ------------------------------------------------------------------------------------
    def __iter__(self):
        if self.backend == "torchvision":
            return self._iter_torchvision()
        return self._iter_dali()

    def _torch_device(self) -> torch.device:
        return torch.device("cuda", torch.cuda.current_device()) if self.device == "gpu" else torch.device("cpu")

    def _iter_torchvision(self):
        dev = self._torch_device()
        for batch in self._torch:
            if dev.type == "cuda":
                batch = _to_device(batch, dev)
            yield batch

    def _build_pipeline(self, seed: int):
        from .compiler.dali import build_pipeline

        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=max(1, min(4, self.num_threads)),
                                            thread_name_prefix="gputransforms-read")
        max_batch = self._torch.batch_size or max(len(b) for b in self._torch._index_sampler)
        self._pipe = build_pipeline(self.plan, _weak_feed(self), device=self.device, batch_size=max_batch,
                                    num_threads=self.num_threads, seed=seed,
                                    prefetch_queue_depth=self.prefetch_queue_depth,
                                    hw_decoder_load=self.hw_decoder_load,
                                    jpeg_fancy_upsampling=self.jpeg_fancy_upsampling)

    def _start_epoch(self) -> _Epoch:
        self._finish_epoch()
        # the same draws from ``generator`` as torch's _BaseDataLoaderIter, in the same order
        batches = iter(self._torch._index_sampler)
        base_seed = torch.empty((), dtype=torch.int64).random_(generator=self._torch.generator).item()
        self._seed = self.seed if self.seed is not None else base_seed % (2 ** 31)
        if self._pipe is None:
            self._build_pipeline(self._seed)
        self.skipped = []
        self._epoch = _Epoch(self, batches, self._pool, lookahead=self.prefetch_queue_depth + 2)
        return self._epoch

    def _restart_after_decode_error(self, epoch: _Epoch, bad: files.BadSampleError) -> _Epoch:
        """on_error="skip" and DALI failed on a file PIL cannot decode either: the pipeline object
        is dead after any error, so build a new one and feed it again, in order, every batch that
        was in flight (without the bad file) before the rest of the epoch."""
        self.skipped.append(bad)
        pending = [[i for i in b if i != bad.index] for b in epoch.in_flight]
        pending += [b for b, _ in epoch.reading]
        epoch.stopped = True
        self._pipe = None
        self._build_pipeline(self._seed + len(self.skipped))
        self._epoch = _Epoch(self, itertools.chain([b for b in pending if b], epoch.batches), self._pool,
                             lookahead=self.prefetch_queue_depth + 2)
        return self._epoch

    def _feed(self):
        if self._epoch is None:
            raise StopIteration
        return self._epoch.next_encoded()

    def _finish_epoch(self):
        """Drain a pipeline left mid-epoch (the user broke out of the loop) so the next epoch starts clean."""
        epoch, self._epoch = self._epoch, None
        if epoch is None or self._pipe is None:
            return
        epoch.stopped = True
        try:
            self._pipe.schedule_run()  # the callback now raises StopIteration: marks the end
            while True:
                self._pipe.outputs()
        except StopIteration:
            pass
        except RuntimeError:
            self._pipe = None  # a dead pipeline is rebuilt on the next epoch
            return
        self._pipe.reset()

    def _iter_dali(self):
        epoch = self._start_epoch()
        dev = self._torch_device()
        stream = torch.cuda.current_stream(dev) if dev.type == "cuda" else None
        dataset = self._torch.dataset
        targets = [s[1] for s in dataset.samples]
        target_transform = dataset.target_transform
        scheduled = False
        while True:
            pipe = self._pipe
            try:
                if not scheduled:
                    scheduled = True
                    pipe.schedule_run()
                out = pipe.outputs(stream) if stream is not None else pipe.outputs()
            except StopIteration:
                break
            except RuntimeError as e:
                err = _named_error(e, list(epoch.in_flight[0]) if epoch.in_flight else [], dataset)
                if self.on_error == "skip" and isinstance(err, files.BadSampleError):
                    epoch, scheduled = self._restart_after_decode_error(epoch, err), False
                    continue
                self._pipe, self._epoch = None, None
                raise err from e
            indices = epoch.in_flight.popleft()
            images = _to_torch(out[0])
            pipe.schedule_run()
            if self.plan.tail:
                images = tail.run_tail(images, self.plan, dev, self._stages)
            elif images.dtype != self.plan.out_dtype:
                images = images.to(self.plan.out_dtype)
            if target_transform is None:
                labels = torch.as_tensor([targets[i] for i in indices], dtype=torch.int64)
            else:
                labels = tud.default_collate([target_transform(targets[i]) for i in indices])
            yield images, _to_device(labels, dev)
        self._epoch = None
        self._pipe.reset()
        if epoch.error is not None:
            raise epoch.error
        if self.skipped:
            shown = "; ".join(f"{e.index}: {e.path} ({e.reason})" for e in self.skipped[:5])
            warnings.warn(f"gputransforms: skipped {len(self.skipped)} sample(s) this epoch "
                          f"(DataLoader.skipped lists them): {shown}", SkippedSamplesWarning, stacklevel=2)

    def close(self):
        """Release the DALI pipeline and the reader threads now (also done when the loader is
        garbage; a later iteration builds them again)."""
        self._epoch = None
        self._pipe = None
        pool, self._pool = getattr(self, "_pool", None), None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    def __del__(self):
        pool = getattr(self, "_pool", None)
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)


def _weak_feed(loader: DataLoader):
    """The external_source callback without a strong reference to the loader: the pipeline would
    otherwise keep its loader (and so itself, its threads and its device memory) alive in a cycle
    until the cyclic garbage collector happens to run."""
    ref = weakref.ref(loader)

    def feed():
        owner = ref()
        if owner is None:
            raise StopIteration
        return owner._feed()

    return feed


def _to_torch(tensor_list):
    """A DALI TensorList as one torch tensor (zero-copy via DLPack), or a list when shapes differ."""
    if tensor_list.is_dense_tensor():
        return torch.from_dlpack(tensor_list.as_tensor())
    return [torch.from_dlpack(tensor_list[i]) for i in range(len(tensor_list))]


def _to_device(batch, dev: torch.device):
    if isinstance(batch, torch.Tensor):
        return batch.to(dev, non_blocking=True)
    if isinstance(batch, (list, tuple)):
        return type(batch)(_to_device(b, dev) for b in batch)
    return batch


def _named_error(err: Exception, indices, dataset) -> Exception:
    """DALI reports "Critical error in pipeline" without the file. Find it: first a file PIL cannot
    decode, else the sample on which torchvision's own run of the chain raises (an image smaller
    than RandomCrop's size, say), re-raised as torchvision's exception type with the file named."""
    samples = dataset.samples
    text = str(err)
    if "out of memory" in text.lower() or "cudaErrorMemoryAllocation" in text:
        return MemoryError(f"gputransforms: the GPU ran out of memory on a batch of {len(indices)} images; reduce "
                           "batch_size or prefetch_factor (batches prepared ahead), or resize earlier in the chain "
                           f"(DALI: {text.strip().splitlines()[-1] if text.strip() else 'out of memory'})")
    for i in indices:
        path = samples[i][0]
        try:
            pil_loader(path)
        except Exception as pil_err:  # noqa: BLE001 - any failure to decode names the file
            return files.BadSampleError(i, path, f"cannot be decoded ({type(pil_err).__name__}: {pil_err})")
    if dataset.transform is not None:
        for i in indices:
            path = samples[i][0]
            try:
                dataset.transform(pil_loader(path))
            except Exception as tv_err:  # noqa: BLE001 - torchvision's exception is the answer
                try:
                    return type(tv_err)(f"{tv_err} (sample {i}: {path})")
                except Exception:  # noqa: BLE001 - an exception type that takes other arguments
                    return RuntimeError(f"gputransforms: sample {i} ({path}): {type(tv_err).__name__}: {tv_err}")
    paths = ", ".join(f"{i}: {samples[i][0]}" for i in indices[:8])
    more = f" and {len(indices) - 8} more" if len(indices) > 8 else ""
    first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return RuntimeError(f"gputransforms: DALI failed on the batch of samples {paths}{more}: {first_line}")
