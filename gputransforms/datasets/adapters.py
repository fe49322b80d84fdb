"""Which files and targets a dataset stands for, without decoding anything: one table of adapters,
one row per dataset class.

The compiled loader needs, for every index ``i`` the sampler can draw, what ``dataset[i]`` would
open and return: the image file, the target (and the ``target_transform`` the dataset would apply
to it), and the transform chain. ``resolve(dataset)`` answers with a ``FileSamples`` or raises
``NotCompilable`` with a one-line reason the user can act on. Compositions (``Subset``,
``random_split``'s subsets, ``ConcatDataset``, nested in any order) map indices exactly as torch's
``__getitem__`` does, so targets follow pixels and repeated indices repeat.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

import torch.utils.data as tud
from torchvision.datasets import DatasetFolder
from torchvision.datasets.folder import default_loader, pil_loader


class NotCompilable(Exception):
    """The dataset cannot be fed to a compiled graph; the message says why in one line."""


@dataclasses.dataclass
class FileSamples:
    """Index ``i`` of the dataset is ``transform(PIL.Image.open(paths[i]).convert("RGB"))`` and
    ``target_transforms[i](targets[i])`` (or ``targets[i]`` when ``target_transforms`` is None)."""

    paths: list
    targets: list
    transform: Any
    target_transforms: Optional[list] = None

    def __len__(self) -> int:
        return len(self.paths)

    def target(self, i: int):
        t = self.targets[i]
        if self.target_transforms is not None and self.target_transforms[i] is not None:
            t = self.target_transforms[i](t)
        return t

    def select(self, indices) -> "FileSamples":
        idx = [int(i) for i in indices]
        return FileSamples([self.paths[i] for i in idx], [self.targets[i] for i in idx], self.transform,
                           None if self.target_transforms is None else [self.target_transforms[i] for i in idx])


def _folder(ds: DatasetFolder) -> FileSamples:
    if ds.loader not in (default_loader, pil_loader):
        raise NotCompilable(f"{type(ds).__name__} has a custom loader; DALI decodes only what PIL's RGB loader does")
    n = len(ds.samples)
    return FileSamples([p for p, _ in ds.samples], [t for _, t in ds.samples], ds.transform,
                       None if ds.target_transform is None else [ds.target_transform] * n)


def _subset(ds: tud.Subset) -> FileSamples:
    return resolve(ds.dataset).select(ds.indices)


def _concat(ds: tud.ConcatDataset) -> FileSamples:
    parts = [resolve(d) for d in ds.datasets]
    chain = parts[0].transform
    for k, p in enumerate(parts[1:], 1):
        if not same_chain(chain, p.transform):
            raise NotCompilable(f"ConcatDataset: part {k}'s transform differs from part 0's ({_short(p.transform)} vs "
                                f"{_short(chain)}); one compiled graph serves one chain, so give the parts the same "
                                "Compose object")
    with_tt = any(p.target_transforms is not None for p in parts)
    return FileSamples(
        [x for p in parts for x in p.paths], [x for p in parts for x in p.targets], chain,
        [x for p in parts for x in (p.target_transforms or [None] * len(p))] if with_tt else None)


#: dataset class -> adapter; a subclass is served by its nearest listed base, unless it overrides
#: ``__getitem__`` (then what it returns is its own business, and it runs on torch's DataLoader)
ADAPTERS: dict[type, Callable[[Any], FileSamples]] = {
    DatasetFolder: _folder,
    tud.Subset: _subset,
    tud.ConcatDataset: _concat,
}


def resolve(dataset) -> FileSamples:
    for cls in type(dataset).__mro__:
        adapter = ADAPTERS.get(cls)
        if adapter is None:
            continue
        if type(dataset).__getitem__ is not cls.__getitem__:
            raise NotCompilable(f"{type(dataset).__name__} overrides __getitem__ of {cls.__name__}")
        return adapter(dataset)
    raise NotCompilable(f"{type(dataset).__name__} is not a dataset gputransforms can read files from "
                        f"(compiled: {', '.join(c.__name__ for c in ADAPTERS)} and their compositions)")


def same_chain(a, b) -> bool:
    """Whether two transform chains mean the same: the same object, or equal reprs made only of
    classes whose repr shows all their arguments (a Lambda or a user object may hide a difference)."""
    if a is b:
        return True
    return repr(a) == repr(b) and not _opaque(a) and not _opaque(b)


def _opaque(t) -> bool:
    members = getattr(t, "transforms", None)
    if isinstance(members, (list, tuple)):
        return any(_opaque(m) for m in members)
    if members is not None:  # a wrapper such as the reference presets
        return _opaque(members)
    module = type(t).__module__
    return type(t).__name__ == "Lambda" or not module.startswith(("torchvision.", "timm.", "gputransforms."))


def _short(t) -> str:
    text = " ".join(repr(t).split())
    return text if len(text) <= 60 else text[:57] + "..."
