"""Running a chain side by side: ours (gputransforms' DataLoader over an ImageFolder) and theirs
(torchvision's ImageFolder, per sample, as a plain loop would), and putting both in 0-255 units.
The one place the test files take these from."""
from __future__ import annotations

from typing import Optional

import torch
import torchvision

from gputransforms import DataLoader, datasets

IMAGENET_MEAN, IMAGENET_STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def loader(root, tf, device, *, batch_size: int = 16, backend: Optional[str] = "dali", **kwargs) -> DataLoader:
    """Our DataLoader over ``root`` (no shuffle and 2 DALI threads unless given); ``backend``: the
    backend it must take (None: any)."""
    kwargs = {"shuffle": False, "num_workers": 2, **kwargs}
    dl = DataLoader(datasets.ImageFolder(str(root), transform=tf), batch_size=batch_size, device=device, **kwargs)
    if backend is not None:
        assert dl.backend == backend, dl.explain()
    return dl


def ours(root, tf, device, epochs: int = 1, **kwargs) -> torch.Tensor:
    """Every image of ``epochs`` epochs of ``loader(...)``, on the CPU, in loader order."""
    dl = loader(root, tf, device, **kwargs)
    return torch.cat([x.cpu() for _ in range(epochs) for x, _ in dl])


def ours_with_labels(root, tf, device, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    """Images and labels of one epoch, where the loader put them (the device)."""
    images, labels = zip(*loader(root, tf, device, **kwargs))
    return torch.cat(images), torch.cat(labels)


def theirs(root, tf, epochs: int = 1) -> torch.Tensor:
    """torchvision's ImageFolder with the same transform, sample after sample, ``epochs`` times."""
    ds = torchvision.datasets.ImageFolder(str(root), transform=tf)
    return torch.stack([ds[i][0] for _ in range(epochs) for i in range(len(ds))])


def theirs_with_labels(root, tf) -> tuple[torch.Tensor, torch.Tensor]:
    ds = torchvision.datasets.ImageFolder(str(root), transform=tf)
    images, labels = zip(*(ds[i] for i in range(len(ds))))
    return torch.stack(images), torch.tensor(labels)


def to_255(x: torch.Tensor, mean=None, std=None) -> torch.Tensor:
    """A batch in 0-255 units, float64 on the CPU: uint8 as it is, float scaled by 255, a normalised
    batch (``mean`` and ``std`` given) un-normalised first."""
    if not x.is_floating_point():
        return x.double().cpu()
    x = x.double().cpu()
    if mean is not None:
        x = x * torch.tensor(std, dtype=x.dtype)[:, None, None] + torch.tensor(mean, dtype=x.dtype)[:, None, None]
    return x * 255
