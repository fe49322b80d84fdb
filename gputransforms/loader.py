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
import os
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional

import numpy as np
import torch
import torch.utils.data as tud
from torchvision.datasets import DatasetFolder
from torchvision.datasets.folder import default_loader, pil_loader

from .compiler import persample
from .compiler.plan import Plan, plan as make_plan


class FallbackWarning(UserWarning):
    """Part of a transform chain runs per sample with torchvision instead of in the DALI graph."""


def dali_available() -> bool:
    try:
        import nvidia.dali  # noqa: F401
    except ImportError:
        return False
    return True


def default_device() -> str:
    """"gpu" when torch sees a CUDA device (DALI then decodes with nvJPEG), else "cpu"."""
    return "gpu" if torch.cuda.is_available() else "cpu"


def _is_image_folder_loader(loader) -> bool:
    return loader in (default_loader, pil_loader)


def _read_file(path: str) -> bytes:
    # os.read releases the GIL for the whole read and has no Python-level buffering: 6x the file
    # rate of np.fromfile per thread here, and reading runs beside the main thread feeding DALI
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        data = os.read(fd, size)
        while len(data) < size:  # os.read may return less for large files
            chunk = os.read(fd, size - len(data))
            if not chunk:
                break
            data += chunk
        return data
    finally:
        os.close(fd)


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
        self._fill()

    def _read(self, indices):
        out = []
        for i in indices:
            path = self.samples[i][0]
            try:
                out.append(np.frombuffer(_read_file(path), dtype=np.uint8))
            except OSError as e:
                raise OSError(f"gputransforms: cannot read sample {i} ({path}): {e}") from e
        return out

    def _fill(self):
        while not self.stopped and len(self.reading) < self.lookahead:
            indices = next(self.batches, None)
            if indices is None:
                break
            indices = list(indices)
            self.reading.append((indices, self.pool.submit(self._read, indices)))

    def next_encoded(self):
        """The external_source callback: the next batch of encoded files, in sampler order."""
        if self.stopped or not self.reading:
            raise StopIteration
        indices, future = self.reading.popleft()
        data = future.result()
        self.in_flight.append(indices)
        self._fill()
        return data


class DataLoader:
    """Drop-in for ``torch.utils.data.DataLoader`` over an ImageFolder/DatasetFolder.

    Arguments are torch's. How they map here:

    - ``batch_size, shuffle, sampler, batch_sampler, drop_last, generator``: exactly torch's meaning
      (torch's samplers are used).
    - ``num_workers``: CPU threads for DALI (decode on CPU, host-side work on GPU); 0 means all cores.
    - ``prefetch_factor``: batches DALI prepares ahead (default 2); unlike torch, allowed with
      ``num_workers=0``.
    - ``pin_memory, pin_memory_device, timeout, worker_init_fn, multiprocessing_context,
      persistent_workers, in_order``: accepted, and used only when the chain runs on the
      torchvision path; the DALI path has no worker processes and produces batches on the device.
    - ``collate_fn``: a custom one switches to the torchvision path (torch's DataLoader, moved to
      the device), since the compiled graph produces whole batches.

    Extra keyword arguments: ``device`` ("gpu", "cpu" or None for the GPU when torch sees one),
    ``seed`` (DALI's seed; default drawn from ``generator``/torch's RNG like torch's base seed),
    ``hw_decoder_load`` (share of JPEGs for the hardware decoder on GPUs that have one),
    ``jpeg_fancy_upsampling`` (GPU only: decode chroma like libjpeg-turbo/PIL; closer to torchvision,
    mean |diff| 0.15 instead of ~0.5 in 0-255 units, but ~30% slower decoding on an H100; never
    applied to RandomResizedCrop's ROI decode, which nvJPEG < 13.2 does not support).
    """

    def __init__(self, dataset, batch_size: Optional[int] = 1, shuffle: Optional[bool] = None, sampler=None,
                 batch_sampler=None, num_workers: int = 0, collate_fn=None, pin_memory: bool = False,
                 drop_last: bool = False, timeout: float = 0, worker_init_fn=None, multiprocessing_context=None,
                 generator=None, *, prefetch_factor: Optional[int] = None, persistent_workers: bool = False,
                 pin_memory_device: str = "", in_order: bool = True, device: Optional[str] = None,
                 seed: Optional[int] = None, hw_decoder_load: float = 0.9, jpeg_fancy_upsampling: bool = False):
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
        self.hw_decoder_load = hw_decoder_load
        self.jpeg_fancy_upsampling = jpeg_fancy_upsampling
        self.num_threads = num_workers if num_workers > 0 else (os.cpu_count() or 1)
        self.prefetch_queue_depth = prefetch_factor or 2
        self.plan, self.backend, self.reason = self._choose_backend(dataset, collate_fn)
        if self.backend == "dali" and self.plan.tail:
            warnings.warn(f"gputransforms: {len(self.plan.tail)} transform(s) run per sample with torchvision "
                          f"({self.plan.tail_reason}); see DataLoader.explain()", FallbackWarning, stacklevel=2)
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
        return p, "dali", ""

    def explain(self) -> str:
        head = (f"gputransforms.DataLoader: {len(self._torch.dataset)} samples, batch_size={self.batch_size}, "
                f"backend={self.backend}, device={self.device}")
        if self.backend == "torchvision":
            lines = [head, f"  reason: {self.reason}"]
            if self.plan is not None:
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

    def _start_epoch(self) -> _Epoch:
        self._finish_epoch()
        # the same draws from ``generator`` as torch's _BaseDataLoaderIter, in the same order
        batches = iter(self._torch._index_sampler)
        base_seed = torch.empty((), dtype=torch.int64).random_(generator=self._torch.generator).item()
        if self._pipe is None:
            from .compiler.dali import build_pipeline

            seed = self.seed if self.seed is not None else base_seed % (2 ** 31)
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=max(1, min(4, self.num_threads)),
                                                thread_name_prefix="gputransforms-read")
            max_batch = self._torch.batch_size or max(len(b) for b in self._torch._index_sampler)
            self._pipe = build_pipeline(self.plan, self._feed, device=self.device, batch_size=max_batch,
                                        num_threads=self.num_threads, seed=seed,
                                        prefetch_queue_depth=self.prefetch_queue_depth,
                                        hw_decoder_load=self.hw_decoder_load,
                                        jpeg_fancy_upsampling=self.jpeg_fancy_upsampling)
            self._pipe.build()
        self._epoch = _Epoch(self, batches, self._pool, lookahead=self.prefetch_queue_depth + 2)
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
        pipe = self._pipe
        dev = self._torch_device()
        stream = torch.cuda.current_stream(dev) if dev.type == "cuda" else None
        dataset = self._torch.dataset
        targets = [s[1] for s in dataset.samples]
        target_transform = dataset.target_transform
        try:
            pipe.schedule_run()
        except StopIteration:
            pass
        while True:
            try:
                out = pipe.outputs(stream) if stream is not None else pipe.outputs()
            except StopIteration:
                break
            except RuntimeError as e:
                self._pipe, self._epoch = None, None
                raise _named_error(e, epoch.in_flight[0] if epoch.in_flight else [], dataset.samples) from e
            indices = epoch.in_flight.popleft()
            images = _to_torch(out[0])
            pipe.schedule_run()
            if self.plan.tail:
                images = persample.run_tail(images, self.plan.output, self.plan.tail).to(dev)
            elif images.dtype != self.plan.out_dtype:
                images = images.to(self.plan.out_dtype)
            if target_transform is None:
                labels = torch.as_tensor([targets[i] for i in indices], dtype=torch.int64)
            else:
                labels = tud.default_collate([target_transform(targets[i]) for i in indices])
            yield images, _to_device(labels, dev)
        self._epoch = None
        pipe.reset()

    def __del__(self):
        pool = getattr(self, "_pool", None)
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)


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


def _named_error(err: Exception, indices, samples) -> RuntimeError:
    """DALI reports "Critical error in pipeline" without the file; find which one PIL cannot read."""
    for i in indices:
        path = samples[i][0]
        try:
            pil_loader(path)
        except Exception as pil_err:  # noqa: BLE001 - any failure to decode names the file
            return RuntimeError(f"gputransforms: sample {i} ({path}) could not be decoded: {pil_err}")
    paths = ", ".join(f"{i}: {samples[i][0]}" for i in indices[:8])
    more = f" and {len(indices) - 8} more" if len(indices) > 8 else ""
    first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return RuntimeError(f"gputransforms: DALI failed on the batch of samples {paths}{more}: {first_line}")
