"""Which samples a dataset stands for: the first source, in ``SOURCES``' order, that claims the dataset
answers (webdataset pipelines: ``shards``; Hugging Face tables: ``hf``; everything else: ``adapters.resolve``, the table of torchvision's
datasets and the discovery of a user's own). A new kind of source is a new module and one line here."""
from __future__ import annotations

from typing import Any, Callable

from . import adapters, hf, shards

#: (claims the dataset?, its samples) in order; the last one takes every dataset
SOURCES: tuple[tuple[Callable[[Any], bool], Callable[[Any], Any]], ...] = (
    (shards.is_webdataset, shards.resolve_webdataset),
    (hf.is_hf_dataset, hf.resolve_hf),
    (lambda ds: True, adapters.resolve),
)


def resolve(dataset):
    """The samples ``dataset`` stands for (``adapters.FileSamples`` or a kind of it), or NotCompilable."""
    for claims, samples in SOURCES:
        if claims(dataset):
            return samples(dataset)
    raise AssertionError("adapters.resolve takes every dataset")  # pragma: no cover
