"""ImageList: images named by a list, with one or several integer labels each: the dataset users
write by hand for a flat folder and a list file (``image_05973.jpg 0 3``)."""
from __future__ import annotations

import os
from typing import Any, Callable, Optional, Sequence, Union

import torch
from torchvision.datasets import VisionDataset
from torchvision.datasets.folder import default_loader


class ImageList(VisionDataset):
    """``samples``: a list of ``(path, target)``, or the path of a text/CSV file whose lines are
    ``path label [label ...]`` (separated by spaces, tabs or commas; a first line whose labels are
    not integers is taken for a header; blank lines and lines starting with ``#`` are skipped).
    Relative paths are relative to ``root`` (default: the list file's folder, or the working
    directory for a list of pairs). One label gives an ``int`` target, several an int64 tensor, so
    that a batch's targets are ``(N, K)``. ``classes``, when given, names the labels.

    Per sample it is ``(transform(loader(path)), target_transform(target))``, like torchvision's
    datasets, so it works with torch's DataLoader as well; ``gputransforms.DataLoader`` compiles it.
    """

    def __init__(self, samples: Union[str, os.PathLike, Sequence], root: Optional[Union[str, os.PathLike]] = None,
                 transform: Optional[Callable] = None, target_transform: Optional[Callable] = None,
                 loader: Callable[[str], Any] = default_loader, classes: Optional[Sequence[str]] = None):
        if isinstance(samples, (str, os.PathLike)):
            list_file = os.fspath(samples)
            root = os.path.dirname(os.path.abspath(list_file)) if root is None else root
            pairs = _read_list(list_file)
        else:
            pairs = [(os.fspath(p), t) for p, t in samples]
        super().__init__(os.fspath(root) if root is not None else "", transform=transform,
                         target_transform=target_transform)
        self.samples = [(p if os.path.isabs(p) or not self.root else os.path.join(self.root, p), t) for p, t in pairs]
        self.targets = [t for _, t in self.samples]
        self.loader = loader
        if classes is not None:
            self.classes = list(classes)
            self.class_to_idx = {c: i for i, c in enumerate(self.classes)}

    def __getitem__(self, index: int):
        path, target = self.samples[index]
        image = self.loader(path)
        if self.transform is not None:
            image = self.transform(image)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return image, target

    def __len__(self) -> int:
        return len(self.samples)


def _read_list(list_file: str) -> list:
    pairs = []
    with open(list_file) as f:
        lines = [ln.strip() for ln in f]
    for n, line in enumerate(lines):
        if not line or line.startswith("#"):
            continue
        sep = "," if "," in line else ("\t" if "\t" in line else None)
        fields = [x.strip() for x in line.split(sep)]
        fields = [x for x in fields if x]
        try:
            labels = [int(x) for x in fields[1:]]
        except ValueError:
            if not pairs:
                continue  # a header line
            raise ValueError(f"{list_file}, line {n + 1}: labels must be integers, got {fields[1:]!r}") from None
        if not labels:
            raise ValueError(f"{list_file}, line {n + 1}: no label after the path {fields[0]!r}")
        pairs.append((fields[0], labels[0] if len(labels) == 1 else torch.tensor(labels, dtype=torch.int64)))
    return pairs
