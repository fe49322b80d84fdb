"""The in-memory backend: an in-memory dataset's images go to the device once (per loader), and
each batch is gathered there by index and augmented as a whole (``compiler.stages.in_memory``). No DALI
graph and no file: what bounds a CIFAR-sized pass is the host's cost of launching the small kernels,
so a chain that qualifies is replayed as one CUDA graph (``compiler.graphed``).

The iterator keeps torch's order of random draws at the start of an epoch (the sampler's order,
then the base seed), so the same ``generator`` gives torch's batches of indices, and it records
what ``state_dict()`` needs; the augmentations draw from torch's global RNG, which the state holds.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.utils.data as tud

from .. import state
from ..compiler import graphed
from ..compiler.batched import to_dev
from ..compiler.chain import output_kind
from ..compiler.stages import as_made
from ..compiler.stages import in_memory as in_memory_stages
from ..compiler.tail import run_stages
from ..datasets.inmemory import ARRAY_ADAPTERS, ArraySamples
from ..device import batched, to_device, torch_device
from ..errors import NotCompilable, NotLowerable
from .base import Backend, EpochIterator, Sampling, Settings, pin_memory_note, pinning
from .workers import TorchWorkers


class DeviceArrays:
    """A loader's images (and int targets) on its device, uploaded on first use."""

    def __init__(self, samples: ArraySamples, device: str):
        self.samples = samples
        self.dev = torch_device(device)
        self._images: Optional[torch.Tensor] = None
        self._targets: Optional[torch.Tensor] = None
        self._graphed: Optional[tuple] = None  # (compiled stages, graphed.GraphedChain or None)

    def images(self) -> torch.Tensor:
        if self._images is None:
            self._images = self.samples.images.contiguous().to(self.dev)
        return self._images

    def targets(self) -> Optional[torch.Tensor]:
        """The targets as one int64 tensor on the device, when they are plain ints without a
        target_transform (else None: they are collated per batch as torch would)."""
        s = self.samples
        if self._targets is None and s.target_transform is None and s.extra is None and \
                all(type(t) is int for t in s.targets):
            self._targets = torch.as_tensor(s.targets, dtype=torch.int64).to(self.dev)
        return self._targets

    def graphed(self, compiled: list) -> Optional[graphed.GraphedChain]:
        """The chain as a CUDA graph (compiler/graphed.py), or None where it runs op by op."""
        if self._graphed is None or self._graphed[0] is not compiled:
            s = self.samples
            ok = self.dev.type == "cuda" and s.transform is not None and s.extra is None
            self._graphed = (compiled, graphed.build(self.images(), self.targets(), compiled) if ok else None)
        return self._graphed[1]

    def op_by_op(self) -> None:
        """The graph could not be captured: run the chain op by op from now on."""
        self._graphed = (self._graphed[0], None)


class DeviceArraysBackend(Backend):
    """In-memory datasets (``datasets.inmemory``): their images on the device, each batch gathered and
    augmented there as a whole (``stages.in_memory``), as one CUDA graph where the chain allows."""

    name = "arrays"

    def __init__(self, settings: Settings, samples: ArraySamples, stages: list):
        self.settings, self.samples, self.stages = settings, samples, stages
        self.arrays = DeviceArrays(samples, settings.device)
        self.origin = getattr(samples, "origin", "")

    def iterator(self, sampling: Sampling, resume: Optional[state.Position]) -> EpochIterator:
        return ArrayIterator(self, sampling, resume)

    def explain(self) -> str:
        device = self.settings.device
        lines = [f"in memory: the images on the {device} once, each batch gathered there by index"]
        if torch_device(device).type == "cuda" and graphed.capturable(self.stages):
            lines[0] += ("; gather, transforms and targets (plain ints) replayed as one CUDA graph per batch size "
                         "(compiler/graphed.py)")
        for t, fn, stage in self.stages:
            label = {"vectorized": "vectorized ", "batched": "batched    ", "per sample": "per sample ",
                     "conversion": "conversion "}[stage]
            lines.append(f"  {label} {' '.join(repr(t).split())}")
        if pin_memory_note(self.settings):
            lines.append(pin_memory_note(self.settings))
        return "\n".join(lines)

    def fallback(self) -> Optional[str]:
        slow = [type(t).__name__ for t, _, stage in self.stages if stage == "per sample"]
        if not slow:
            return None
        return f"{', '.join(slow)} run(s) per sample with torchvision on the device (no batched lowering)"


def choose(settings: Settings, dataset, resolve) -> Optional[Backend]:
    """This backend for an in-memory dataset (``resolve``: the dataset adapters' ``resolve``), torch's
    workers for one whose chain needs PIL images, or None for any other dataset."""
    inner = dataset
    while isinstance(inner, tud.Subset):  # random_split's parts too
        inner = inner.dataset
    if not any(c in ARRAY_ADAPTERS for c in type(inner).__mro__):
        return None
    try:
        samples = resolve(dataset)
    except NotCompilable as e:
        return TorchWorkers(settings, str(e))
    if getattr(samples, "plan_input", "") != "array":
        return None
    kind = output_kind(samples.transform, "pil" if samples.pil else "tensor")
    if kind == "pil" and samples.transform is not None and settings.collate is not None:
        return TorchWorkers(settings, f"{type(dataset).__name__}'s transform hands your collate_fn PIL images; they "
                                      "are made per sample by torchvision (to compile it, end the transform with "
                                      "ToTensor() or PILToTensor())")
    try:
        stages = in_memory_stages(samples.transform, samples.pil) if samples.transform else []
    except NotLowerable as e:
        return TorchWorkers(settings, str(e))
    if samples.pil and samples.transform is None:
        if settings.collate is not None:
            return TorchWorkers(settings, f"{type(dataset).__name__} without a transform gives the collate_fn "
                                          "PIL images; to compile it, give the dataset transform=PILToTensor() "
                                          "(the collate_fn then gets uint8 tensors)")
        raise TypeError(f"{type(dataset).__name__} without a transform gives PIL images, which cannot be batched "
                        "(torch's default_collate raises too); add ToTensor() or PILToTensor()")
    return DeviceArraysBackend(settings, samples, stages)


class ArrayIterator(EpochIterator):
    """One pass over the sampler (torch's ``_BaseDataLoaderIter`` draws: the sampler's order, then
    the base seed, from ``generator``)."""

    def __init__(self, backend: DeviceArraysBackend, sampling: Sampling, resume: Optional[state.Position] = None):
        super().__init__(sampling, resume)
        self.arrays, self.compiled, self.collate = backend.arrays, backend.stages, backend.settings.collate
        s = backend.arrays.samples
        self.kind = output_kind(s.transform, "pil" if s.pil else "tensor") if s.transform is not None else None
        self.batches = iter(sampling.index_sampler)
        base_seed = sampling.base_seed()  # (torch's)
        self.own_stage_rng(base_seed, backend.settings.num_workers)
        self.resume_at(self.batches, resume)
        self.rows = torch.as_tensor(self.arrays.samples.rows, dtype=torch.int64)
        self.pin = pinning(backend.settings)

    def random_state(self) -> tuple:
        return None, self.stage_random_state()

    def _next(self):
        indices = next(self.batches, None)
        if indices is None:
            raise StopIteration
        return self.on_stage_rng(self._batch, indices)

    def _batch(self, indices):
        a, s = self.arrays, self.arrays.samples
        rows = self.rows[torch.as_tensor(indices, dtype=torch.int64)]
        chain = a.graphed(self.compiled) if self.collate is None else None
        if chain is not None:
            out = chain(rows) if chain.graphs else graphed.first_batch(chain, rows)
            if out is not None:
                return out
            a.op_by_op()
        rows_dev = to_dev(rows, a.dev)
        x = a.images().index_select(0, rows_dev)
        if s.transform is not None:
            x = run_stages(x, self.compiled)
        collate = self.collate
        if collate is not None:  # what torch hands it: dataset[i] for each index, transformed
            images = x.unbind(0) if isinstance(x, torch.Tensor) else x  # (a list: samples of their own sizes)
            images = as_made(images, self.kind)  # (tv_tensors.Image where torchvision's v2 chain makes them)
            if s.extra is not None:
                items = [(img, *(t[r] for t in s.extra)) for img, r in zip(images, rows.tolist())]
            else:
                items = list(zip(images, [s.target(int(i)) for i in indices]))
            return to_device(collate(items), a.dev)
        x = batched(x)  # (samples of their own sizes: raises as torch's default_collate does)
        if s.extra is not None:  # a TensorDataset: its tensors, as default_collate stacks them
            return [x] + [to_device(t[rows], a.dev) for t in s.extra]
        targets = a.targets()
        if targets is not None:
            labels = targets.index_select(0, rows_dev)
        else:
            # (nested targets too: where the images are, as the file-backed path hands them over)
            # (a tuple, as torch's transposed batch: a batch of strings stays one)
            labels = to_device(tud.default_collate(tuple(s.target(int(i)) for i in indices)), a.dev)
        return [x, labels]  # (a list, as default_collate makes of (image, target) tuples)
