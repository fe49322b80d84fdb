"""In-memory image datasets: torchvision's CIFAR10/100, MNIST/FashionMNIST/KMNIST, SVHN and STL10
(and a ``TensorDataset`` of uint8 images) keep every image in one uint8 array, and ``__getitem__``
makes a PIL image of row ``i`` (mode "L" for the MNIST family, RGB otherwise) for the transform.

``ArraySamples`` is what the loader reads of them: the images as one (N, C, H, W) uint8 tensor (a
view of the dataset's own array where its layout allows), the targets, the transform, and what
torchvision would hand the transform (a PIL image, or the tensors of a TensorDataset as they are).
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import numpy as np
import torch
import torch.utils.data as tud
import torchvision.datasets as tvd

from ..errors import NotCompilable


class ArraySamples:
    """Index ``i`` is ``transform(PIL image of images[i])`` (or ``images[i]`` itself for a
    TensorDataset, whose items are its tensors) and ``target_transform(targets[i])``."""

    plan_input = "array"

    def __init__(self, images: torch.Tensor, targets: list, transform, target_transform=None, *, pil: bool = True,
                 origin: str = "", rows: Optional[np.ndarray] = None, extra: Optional[list] = None):
        self.images = images  # (N, C, H, W) uint8, CPU: the dataset's own memory where possible
        self.targets = targets
        self.transform = transform
        self.target_transform = target_transform
        self.target_transforms = None if target_transform is None else [target_transform] * len(targets)
        self.pil = pil  # the transform receives a PIL image (torchvision's in-memory datasets)
        self.origin = origin
        self.rows = np.arange(len(images)) if rows is None else rows  # sample -> row of images
        self.extra = extra  # a TensorDataset's further tensors (its targets), indexed by row

    def __len__(self) -> int:
        return len(self.rows)

    def target(self, i: int):
        t = self.targets[int(self.rows[i])]
        return self.target_transform(t) if self.target_transform is not None else t

    def select(self, indices) -> "ArraySamples":
        out = ArraySamples.__new__(ArraySamples)
        out.__dict__.update(self.__dict__)
        out.rows = self.rows[np.asarray([int(i) for i in indices], dtype=np.int64)]
        return out


def _nhwc(data) -> torch.Tensor:
    return torch.from_numpy(np.asarray(data)).permute(0, 3, 1, 2)


def _nchw(data) -> torch.Tensor:
    return torch.as_tensor(np.asarray(data)) if not isinstance(data, torch.Tensor) else data


def _origin(ds) -> str:
    return f"{type(ds).__name__}'s images in memory (datasets/inmemory.py)"


def _cifar(ds) -> ArraySamples:
    return ArraySamples(_nhwc(ds.data), list(ds.targets), ds.transform, ds.target_transform, origin=_origin(ds))


def _mnist(ds) -> ArraySamples:
    targets = [int(t) for t in ds.targets]
    return ArraySamples(ds.data.unsqueeze(1), targets, ds.transform, ds.target_transform, origin=_origin(ds))


def _svhn(ds) -> ArraySamples:
    return ArraySamples(_nchw(ds.data), [int(t) for t in ds.labels], ds.transform, ds.target_transform,
                        origin=_origin(ds))


def _stl10(ds) -> ArraySamples:
    labels = [None] * len(ds.data) if ds.labels is None else [int(t) for t in ds.labels]
    return ArraySamples(_nchw(ds.data), labels, ds.transform, ds.target_transform, origin=_origin(ds))


def _tensor_dataset(ds: tud.TensorDataset) -> ArraySamples:

    images = ds.tensors[0]
    if images.dtype != torch.uint8 or images.dim() != 4 or images.shape[1] not in (1, 3):
        raise NotCompilable("TensorDataset: its first tensor is not uint8 images (N, 1 or 3, H, W)",
                            "to compile it, give the images as a uint8 tensor (N, C, H, W) first")
    return ArraySamples(images, [None] * len(images), None, pil=False, extra=list(ds.tensors[1:]),
                        origin="TensorDataset's first tensor as uint8 images (datasets/inmemory.py)")


#: dataset class -> adapter (datasets/adapters.py's table takes these rows)
ARRAY_ADAPTERS: dict[type, Callable[[Any], ArraySamples]] = {
    tvd.CIFAR10: _cifar,  # CIFAR100 subclasses it
    tvd.MNIST: _mnist,  # FashionMNIST, KMNIST and EMNIST subclass it (QMNIST overrides __getitem__)
    tvd.SVHN: _svhn,
    tvd.STL10: _stl10,
    tud.TensorDataset: _tensor_dataset,
}
