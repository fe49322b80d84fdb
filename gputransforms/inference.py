"""Batched inference on encoded images: ``gputransforms.compile(transform)`` turns an eval chain into a
callable that takes encoded images (bytes, bytearray, memoryview, 1-D uint8 numpy arrays or torch
tensors) or paths, and returns the model's input batch on the device, equal to
``torch.stack([transform(PIL.Image.open(io.BytesIO(b)).convert("RGB")) ...])`` within the
DataLoader's parity bounds. One DALI pipeline is built on the first call and reused for any batch
size up to ``max_batch_size`` (larger lists run in chunks).
"""
from __future__ import annotations

import io
import os
from typing import Callable, Optional, Union

import numpy as np
import torch
from PIL import Image

from . import files
from .compiler import handoff
from .compiler.plan import plan as make_plan
from .compiler.stages import after_graph
from .device import resolve as resolve_device, torch_device

Encoded = Union[bytes, bytearray, memoryview, np.ndarray, torch.Tensor, str, os.PathLike]


class CompiledTransform:
    """What ``compile`` returns; call it on one encoded image or a list of them."""

    def __init__(self, transform: Callable, device: Optional[str] = None, max_batch_size: int = 64,
                 num_threads: Optional[int] = None, seed: int = 0):
        self.transform = transform
        self.plan = make_plan(transform)
        if not self.plan.compiled:
            raise ValueError(f"gputransforms.compile: nothing in this chain compiles ({self.plan.tail_reason}); "
                             "apply the transform per image with torchvision instead")
        if self.plan.output == "image" and not self.plan.tail:
            raise TypeError("the transform chain ends with a PIL image; end it with ToTensor() or PILToTensor()")
        self.device = resolve_device(device)
        self.max_batch_size = int(max_batch_size)
        self.num_threads = num_threads or min(8, os.cpu_count() or 1)
        self.seed = seed
        self._stages = after_graph(self.plan)
        self._pipe = None

    def explain(self) -> str:
        """The compiled chain: the DALI graph with its fusions, and what runs after it."""
        return self.plan.explain(self.device)

    def __call__(self, images):
        single = not isinstance(images, (list, tuple))
        items = [images] if single else list(images)
        out: list = []
        for start in range(0, len(items), self.max_batch_size):
            out.extend(self._run(items[start:start + self.max_batch_size], start))
        if single:
            return out[0]
        if out and all(isinstance(o, torch.Tensor) and o.shape == out[0].shape for o in out):
            return torch.stack(out)
        return out  # output sizes differ (a chain without a fixed final size), or tuples (FiveCrop's)

    def _encoded(self, index: int, item) -> np.ndarray:
        name, raw = _raw(index, item)
        # as the DataLoader: corrupted JPEG bodies checked on the CPU by default (see files.py)
        return files.prepare_bytes(index, name, raw, small_jpegs_via_pil=self.device == "gpu",
                                   check_jpeg_scan=self.device == "cpu")

    def _build(self):
        from .compiler.dali import build_pipeline

        self._pipe = build_pipeline(self.plan, None, device=self.device, batch_size=self.max_batch_size,
                                    num_threads=self.num_threads, seed=self.seed, prefetch_queue_depth=1,
                                    raw_output=self.plan.hands_over_raw(self.device))

    def _run(self, chunk: list, offset: int) -> list:
        from .compiler.dali import to_torch  # DALI is imported on first use

        data = [self._encoded(offset + k, item) for k, item in enumerate(chunk)]
        if self._pipe is None:
            self._build()
        dev = torch_device(self.device)
        stream = torch.cuda.current_stream(dev) if dev.type == "cuda" else None
        try:
            self._pipe.feed_input("encoded", data)
            self._pipe.schedule_run()
            out = self._pipe.outputs(stream) if stream is not None else self._pipe.outputs()
        except RuntimeError as e:
            self._pipe = None  # a DALI pipeline is dead after any error
            raise self._name_failure(chunk, offset, e) from e
        # (per-sample sizes differ where the graph hands over a list: the tail runs on batches of one)
        images = handoff.finish(to_torch(out[0]), self.plan, dev, self._stages,
                                raw=self.plan.hands_over_raw(self.device), per_sample=True)
        return list(images.unbind(0)) if isinstance(images, torch.Tensor) else list(images)

    def _name_failure(self, chunk: list, offset: int, err: Exception) -> Exception:
        for k, item in enumerate(chunk):
            name, raw = _raw(offset + k, item)
            try:
                Image.open(io.BytesIO(raw)).convert("RGB")
            except Exception as pil_err:  # noqa: BLE001 - any failure to decode names the image
                return files.BadSampleError(offset + k, name, f"cannot be decoded ({type(pil_err).__name__}: {pil_err})")
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        return RuntimeError(f"gputransforms.compile: DALI failed on a batch of {len(chunk)} images: {first}")


def _raw(index: int, item) -> tuple[str, bytes]:
    """(a name for errors, the encoded bytes) of one input of any accepted kind."""
    if isinstance(item, (str, os.PathLike)):
        path = os.fspath(item)
        try:
            return path, files.read_file(path)
        except OSError as e:
            raise files.BadSampleError(index, path, f"cannot read it ({e.strerror or e})") from e
    if isinstance(item, torch.Tensor):
        item = item.detach().cpu().numpy()
    if isinstance(item, np.ndarray):
        if item.dtype != np.uint8 or item.ndim != 1:
            raise TypeError(f"image {index}: an encoded image as an array must be 1-D uint8, got {item.dtype} "
                            f"with shape {item.shape}")
        item = item.tobytes()
    if not isinstance(item, (bytes, bytearray, memoryview)):
        raise TypeError(f"image {index}: expected encoded bytes or a path, got {type(item).__name__}")
    return f"<image {index} of the batch>", bytes(item)


def compile(transform: Callable, device: Optional[str] = None, max_batch_size: int = 64, **kwargs) -> CompiledTransform:  # noqa: A001
    """``transform`` (an eval Compose) compiled for batches of encoded images or paths: see ``CompiledTransform``."""
    return CompiledTransform(transform, device=device, max_batch_size=max_batch_size, **kwargs)
