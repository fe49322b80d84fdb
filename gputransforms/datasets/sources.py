"""Which samples a dataset stands for: the first source, in ``SOURCES``' order, that claims the dataset
answers (webdataset pipelines: ``shards``; Hugging Face tables: ``hf``; torchvision v2's wrapped CocoDetection
and a user's own Dataset with a joint ``transforms``: ``detection``; everything else: ``adapters.resolve``, the table of torchvision's
datasets and the discovery of a user's own). A new kind of source is a new module and one line here."""
from __future__ import annotations

from typing import Any, Callable

import torch.utils.data as tud

from . import adapters, detection, hf, shards

#: (claims the dataset?, its samples) in order; the last one takes every dataset
SOURCES: tuple[tuple[Callable[[Any], bool], Callable[[Any], Any]], ...] = (
    (shards.is_webdataset, shards.resolve_webdataset),
    (hf.is_hf_dataset, hf.resolve_hf),
    (detection.is_detection, detection.resolve_detection),
    (detection.is_user_detection, detection.resolve_user_detection),
    (lambda ds: True, adapters.resolve),
)


def resolve(dataset):
    """The samples ``dataset`` stands for (``adapters.FileSamples`` or a kind of it), or NotCompilable.
    A ``Subset`` of a source's dataset (or of a Subset of one) is that source's samples, selected
    (torchvision's detection reference drops the images without annotations so; ``random_split`` then splits
    that Subset)."""
    if isinstance(dataset, tud.Subset) and any(claims(_under_subsets(dataset.dataset)) for claims, _ in SOURCES[:-1]):
        return resolve(dataset.dataset).select(dataset.indices)  # (a Subset of one: the same, on its own turn)
    for claims, samples in SOURCES:
        if claims(dataset):
            return samples(dataset)
    raise AssertionError("adapters.resolve takes every dataset")  # pragma: no cover


def _under_subsets(dataset):
    """The dataset under any number of ``Subset``s (``random_split`` of a ``Subset``, say)."""
    while isinstance(dataset, tud.Subset):
        dataset = dataset.dataset
    return dataset
