"""Backends: how a DataLoader's batches are made. The face (``gputransforms.loader``) builds the
``Settings`` from its arguments and asks ``choose`` for one backend, which then owns its iterator:

- ``compiled``: the dataset's files through one DALI graph (``CompiledGraph``; video clips too, whose
  frames come from decoder processes in ``feed``);
- ``arrays``: in-memory datasets, batched on the device (``DeviceArraysBackend``);
- ``workers``: torch's own DataLoader and its worker processes, for what does not compile (``TorchWorkers``);
- ``watch``: a backend of the first two, chosen again where the dataset's transforms changed between epochs.

``choose`` asks in order; the first backend that takes the dataset wins. A new kind of data is a new
module here and one line in ``_CHOOSERS``.
"""
from __future__ import annotations

import contextlib

from ..datasets.sources import resolve
from ..device import dali_available
from . import arrays, compiled, watch
from .base import Backend, EpochIterator, Sampling, Settings, put_back, random_states
from .workers import TorchWorkers

__all__ = ["Backend", "EpochIterator", "Sampling", "Settings", "choose"]


def _per_sample_items(settings: Settings, dataset, resolve):
    if settings.batch_size is None and settings.batch_sampler is None:
        return TorchWorkers(settings, "batch_size=None: per-sample items, not batches; to compile it, give a "
                                      "batch_size (the graph works on batches)")
    return None


def _without_dali(settings: Settings, dataset, resolve):
    return None if dali_available() else TorchWorkers(
        settings, "NVIDIA DALI is not installed: pip install 'gputransforms[cu13]' for a CUDA 13 driver, '[cu12]' "
                  "for CUDA 12; without a GPU either runs DALI's CPU operators")


_CHOOSERS = (_per_sample_items, arrays.choose, _without_dali, compiled.choose)


def choose(settings: Settings, dataset) -> Backend:
    """The first backend, in ``_CHOOSERS``' order, that takes ``dataset``; one that makes its batches itself is
    chosen again at an epoch's start where the dataset's transforms changed since (``watch``). Choosing runs
    the user's code (the dataset's ``__getitem__`` and its transform, to see what they do:
    ``datasets.discover``, the chains' probes); torch's DataLoader draws nothing when it is built, so the
    generators that code may draw from are left as they were found (``_random_state_kept``)."""
    backend = _chosen(settings, dataset)
    if isinstance(backend, TorchWorkers):  # (torch's own iterator calls the transforms as they are)
        return backend
    return watch.Watched(backend, dataset, settings, lambda s: _chosen(s, dataset),
                         first_only=settings.persistent_workers and settings.num_workers > 0)


def _chosen(settings: Settings, dataset) -> Backend:
    with _random_state_kept(dataset):
        for chooser in _CHOOSERS:
            backend = chooser(settings, dataset, resolve)
            if backend is not None:
                return backend
    raise AssertionError("compiled.choose always answers")  # pragma: no cover


@contextlib.contextmanager
def _random_state_kept(dataset):
    """torch's CPU generator, Python's ``random``, NumPy's global generator and every generator the dataset holds
    (``base.random_states``: a ``numpy`` or ``torch`` generator of its own that ``__getitem__`` draws from) as
    they were on entry, on exit (a dataset that then runs on torch's workers draws its order and its transforms
    as it would with torch's DataLoader built in its place). CUDA's generators are not touched: nothing here
    draws on the device."""
    kept = random_states(dataset)
    try:
        yield
    finally:
        put_back(kept)
