"""Training frameworks that rebuild a DataLoader: the one place gputransforms reaches into another
library.

- PyTorch Lightning re-creates a loader from its attributes (``type(loader)(**attrs)``) to inject a
  ``DistributedSampler``: nothing to do here, since ``gputransforms.DataLoader`` is a torch DataLoader
  subclass that keeps every ``__init__`` argument under its own name.
- Hugging Face Accelerate's ``prepare()`` and ``skip_first_batches()`` build a new *torch* DataLoader
  over ``loader.dataset`` with a sharded batch sampler, which would drop the compiled graph. While
  accelerate is imported, its module-level ``DataLoader`` name is swapped for ``_AccelerateDataLoader``,
  a torch DataLoader subclass that builds a ``gputransforms.DataLoader`` (same torch arguments, plus
  the gputransforms arguments of the loader that was prepared) when the dataset came from one, and a
  plain torch DataLoader otherwise. Accelerate uses that name only to construct its base loader.
"""
from __future__ import annotations

import sys
import weakref

import torch.utils.data as tud

#: dataset -> (the class, the gputransforms-only arguments) of the latest gputransforms.DataLoader over it
_EXTRAS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_by_id: dict = {}  # datasets that cannot be weakly referenced


def remember(dataset, loader_class: type, extras: dict) -> None:
    """Called by every gputransforms.DataLoader: the class a framework's rebuild makes (the user's own
    subclass stays theirs) and what it needs beyond torch's arguments. This module never imports the
    loader: what it builds is the class it was given."""
    try:
        _EXTRAS[dataset] = (loader_class, extras)
    except TypeError:
        _by_id[id(dataset)] = (dataset, (loader_class, extras))
    install_accelerate()


def _extras_for(dataset):
    try:
        return _EXTRAS.get(dataset)
    except TypeError:
        entry = _by_id.get(id(dataset))
        return entry[1] if entry is not None and entry[0] is dataset else None


class _AccelerateDataLoader(tud.DataLoader):
    """What ``accelerate.data_loader.DataLoader`` names while gputransforms is in use."""

    def __new__(cls, dataset=None, *args, **kwargs):
        remembered = _extras_for(dataset)
        if remembered is None:
            return tud.DataLoader(dataset, *args, **kwargs)
        loader_class, extras = remembered
        # accelerate passes torch's default prefetch_factor (2) also without workers
        if not kwargs.get("num_workers"):
            kwargs.pop("prefetch_factor", None)
        return loader_class(dataset, *args, **kwargs, **extras)


def install_accelerate() -> None:
    module = sys.modules.get("accelerate.data_loader")
    if module is None or getattr(module, "DataLoader", None) is _AccelerateDataLoader:
        return
    module.DataLoader = _AccelerateDataLoader
