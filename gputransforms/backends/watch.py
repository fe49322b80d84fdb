"""The dataset's transforms and data as they stand at each epoch.

torch's DataLoader calls the dataset's transform as it is when a sample is read, so code that changes it
between epochs takes effect at the next one: progressive resizing (``ds.transform = bigger`` or
``ds.transform.transforms[0].size = 192``), a curriculum that raises a magnitude, an eval transform set on
the training set, pseudo-labels written into an ImageFolder's ``samples``, a collate_fn set on the loader.
A compiled backend made its graph from all that as it was when it was chosen. ``Watched`` keeps a snapshot
of what the plan was made from (``snapshot_of``: the dataset's length; each transform it holds, found
through its attributes and its parts, by identity and, for torchvision's, timm's and our classes, by their
settings; the lists and arrays its samples were found from) and at each ``iter()`` where it (or the
loader's collate_fn) differs, chooses the backend again from the dataset as it is then (the old one's
pipelines and read-ahead are dropped). A change inside an epoch waits for the next one: the epoch goes on
with the plan it started with. As with torch's DataLoader, a loader with ``persistent_workers=True`` and
worker processes keeps the dataset as it was at its first epoch (torch's workers keep the copy they were
started with).
"""
from __future__ import annotations

import dataclasses
import enum
import functools
import types
import warnings
from typing import Callable, Optional

import numpy as np
import torch
import torch.utils.data as tud

from ..datasets.hf import global_names
from ..errors import FallbackWarning
from .base import Backend, EpochIterator, Sampling, Settings

#: classes whose objects the plan reads the settings of (the rest, a user's own, by identity: they run as
#: written, their changes with them)
_PLANNED = ("torchvision.", "timm.", "gputransforms.", "torch.nn.modules.container")


class Watched(Backend):
    """``inner``, made again by ``choose(settings)`` at an ``iter()`` where the dataset's transforms or data
    changed since (``first_only``: at the first ``iter()`` only, as torch's persistent workers see it), or the
    loader's ``collate_fn`` (torch's iterator takes the one set when it is made: mixup turned off for the last
    epochs by setting ``loader.collate_fn``)."""

    def __init__(self, inner: Backend, dataset, settings: Settings, choose: Callable[[Settings], Backend],
                 first_only: bool = False):
        self.inner, self.dataset, self.settings, self._choose = inner, dataset, settings, choose
        self.seen: Optional[tuple] = snapshot_of(dataset)
        self.planned_again = 0
        self.first_only = first_only

    def __getattr__(self, name):  # (the chosen backend's own attributes: its samples, pipelines, ...)
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def plan(self):
        return self.inner.plan

    @property
    def reason(self) -> str:
        return self.inner.reason

    @property
    def origin(self) -> str:
        return self.inner.origin

    def iterator(self, sampling: Sampling, resume) -> EpochIterator:
        if self.seen is None:  # (persistent workers, after their first epoch: they keep what they started with)
            return self.inner.iterator(sampling, resume)
        collate = sampling.collate != self.settings.collate
        if collate or _differs(snapshot_of(self.dataset), self.seen):
            self.settings = dataclasses.replace(self.settings, collate=sampling.collate)
            self.inner.close()
            self.inner = self._choose(self.settings)
            self.seen = snapshot_of(self.dataset)
            self.planned_again += 1
            fallback = self.inner.fallback()
            if fallback:
                what = "the loader's collate_fn" if collate else "the dataset's transform or data"
                warnings.warn(f"gputransforms: {what} changed since the last epoch; {fallback}",
                              FallbackWarning, stacklevel=3)
        if self.first_only:
            self.seen = None
        return self.inner.iterator(sampling, resume)

    def explain(self) -> str:
        text = self.inner.explain()
        if self.planned_again:
            text += (f"\n  (planned again at {self.planned_again} epoch start(s): the dataset's transform, its data "
                     "or the loader's collate_fn had changed since the plan was made)")
        return text

    def fallback(self) -> Optional[str]:
        return self.inner.fallback()

    def close(self) -> None:
        self.inner.close()


def snapshot_of(dataset) -> tuple:
    """What a plan made from ``dataset`` depends on, as comparable data: each callable attribute of the dataset
    and of its parts (a Subset's dataset, a ConcatDataset's datasets, torchvision's v2 wrapper's dataset), a
    Hugging Face dataset's format transform, a webdataset pipeline's stages (``_snap``); and the data the
    samples were found from: each list, tuple, dict or array attribute (an ImageFolder's ``samples`` and
    ``targets`` relabelled or filtered between epochs, a Subset's ``indices``: ``_contents``)."""
    out: list = []
    try:
        out.append(("len", len(dataset)))  # (a length that changed: samples added or dropped, however)
    except TypeError:  # (an iterable dataset)
        pass
    _walk(dataset, out, 0, set(), {})
    return tuple(out)


def _is_dataset(x) -> bool:
    return isinstance(x, (tud.Dataset, tud.IterableDataset)) or type(x).__module__.startswith("datasets.")


def _walk(ds, out: list, depth: int, seen: set, contents: dict) -> None:
    if depth > 6 or id(ds) in seen:
        return
    seen.add(id(ds))
    for name, value in (getattr(ds, "__dict__", None) or {}).items():
        if _is_dataset(value):
            _walk(value, out, depth + 1, seen, contents)
        elif isinstance(value, (list, tuple)) and value and len(value) <= 256 and all(_is_dataset(v) for v in value):
            for part in value:
                _walk(part, out, depth + 1, seen, contents)
        elif name == "_format_kwargs" and isinstance(value, dict):  # a Hugging Face dataset's with_transform
            out.append((name, _snap(value.get("transform"), 0)))
        elif callable(value) and not isinstance(value, type):
            out.append((name, _snap(value, 0)))
        elif isinstance(value, list) and 0 < len(value) <= 64 and any(callable(v) for v in value):
            out.append((name, tuple(_snap(v, 0) for v in value)))  # (webdataset's pipeline of stages)
        elif isinstance(value, (list, tuple, dict, range, np.ndarray, torch.Tensor)) or _is_pandas(value):
            if id(value) not in contents:  # (an ImageFolder's ``imgs`` is its ``samples``)
                contents[id(value)] = _contents(value)
            out.append((name, contents[id(value)]))


#: arrays up to this many bytes are compared by value at each epoch's start; larger ones (an in-memory
#: dataset's images) by identity, shape and address
_BY_VALUE = 4 << 20


def _contents(x):
    """A list's, tuple's, dict's or array's contents, comparable: a hash of its items where they hash (a list of
    1.3 million (path, label) pairs in about 0.1 s, nothing kept), else a shallow copy (compared item by item,
    each by identity first)."""
    if isinstance(x, range):
        return ("range", x.start, x.stop, x.step)
    if _is_pandas(x):  # (a DataFrame of files and labels, as many datasets keep them: hashed row by row)
        import pandas

        columns = tuple(map(str, getattr(x, "columns", ()))), tuple(map(str, getattr(x, "dtypes", ())))
        try:
            rows = pandas.util.hash_pandas_object(x, index=True).to_numpy()
        except TypeError:  # (cells pandas cannot hash: lists, arrays)
            return ("pandas", id(x), x.shape, columns)
        return ("pandas", x.shape, columns, hash(rows.tobytes()))
    if isinstance(x, torch.Tensor):
        if x.device.type != "cpu" or x.numel() * x.element_size() > _BY_VALUE:
            return ("tensor", id(x), x.data_ptr(), tuple(x.shape), str(x.dtype))
        x = x.numpy(force=True)
    if isinstance(x, np.ndarray):
        if x.nbytes > _BY_VALUE or x.dtype == object:
            return ("array", id(x), x.__array_interface__["data"][0], x.shape, str(x.dtype))
        return ("array", x.shape, str(x.dtype), x.tobytes())
    items = tuple(x.items()) if isinstance(x, dict) else tuple(x)
    try:
        return (type(x).__name__, len(items), hash(items))
    except TypeError:  # (unhashable items: lists, dicts, arrays)
        return (type(x).__name__, items)


def _is_pandas(x) -> bool:
    return type(x).__name__ in ("DataFrame", "Series") and type(x).__module__.split(".")[0] == "pandas"


def _differs(a, b) -> bool:
    """Whether two snapshots differ (a comparison that cannot be made, an array against another, counts)."""
    try:
        return bool(a != b)
    except Exception:  # noqa: BLE001 - items whose == gives no truth value
        return True


def _snap(x, depth: int):
    """``x`` as comparable data: values by value, containers by their items, functions by identity with what
    their closures and defaults hold, and the transforms the plan reads (``_PLANNED``) by their attributes."""
    if depth > 12:
        return ("deep", id(x))
    if x is None or isinstance(x, (bool, int, float, complex, str, bytes, enum.Enum, torch.dtype)):
        return x
    if isinstance(x, torch.Tensor):  # (a large one by identity)
        values = tuple(x.detach().flatten().tolist()) if x.numel() <= 64 else id(x)
        return ("tensor", str(x.dtype), tuple(x.shape), values)
    if isinstance(x, np.ndarray):
        return ("array", str(x.dtype), x.shape, tuple(x.ravel().tolist()) if x.size <= 64 else id(x))
    if isinstance(x, (list, tuple)):
        return (type(x).__name__,) + tuple(_snap(v, depth + 1) for v in x)
    if isinstance(x, dict):
        return ("dict",) + tuple((repr(k), _snap(v, depth + 1)) for k, v in x.items())
    if isinstance(x, functools.partial):
        return ("partial", _snap(x.func, depth + 1), _snap(x.args, depth + 1), _snap(x.keywords, depth + 1))
    if type(x).__name__ == "FilterFunction" and type(x).__module__.startswith("webdataset."):  # a pipeline stage
        return ("stage", _snap(x.f, depth + 1), _snap(x.args, depth + 1), _snap(x.kw, depth + 1))
    if isinstance(x, types.FunctionType):
        cells = tuple(_snap(c.cell_contents, depth + 1) for c in (x.__closure__ or ()) if _filled(c))
        named = tuple(_snap(x.__globals__[n], depth + 1) for n in sorted(global_names(x.__code__))
                      if _planned(x.__globals__.get(n)))  # a transform the function reads by its global name
        return ("function", id(x), cells, named, _snap(x.__defaults__, depth + 1))
    if _planned(x):
        attributes = {k: v for k, v in vars(x).items() if "hook" not in k and k != "training"}
        return (type(x).__qualname__, id(x), _snap(attributes, depth + 1))
    return (type(x).__qualname__, id(x))


def _planned(x) -> bool:
    return not isinstance(x, type) and hasattr(x, "__dict__") and type(x).__module__.startswith(_PLANNED)


def _filled(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:  # an empty cell (a name not yet bound)
        return False
    return True
