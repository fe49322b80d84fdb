"""Datasets: file lists and labels, exactly torchvision's (they are torchvision's classes), so
``classes``, ``class_to_idx``, ``samples``, ``targets``, ``extensions``, ``is_valid_file``,
``allow_empty`` and every error are the same, and ``__getitem__`` still works per sample with a
plain ``torch.utils.data.DataLoader``. ``gputransforms.DataLoader`` reads their files, targets and
``transform`` (adapters.py, one row per class), or finds those of a user's own Dataset by running
its ``__getitem__`` on a placeholder image (discover.py), and compiles the transform. Video
datasets (video.py) give clips: the frames torchvision's ``VideoClips`` selects, decoded by NVDEC.
"""
import importlib as _importlib
import sys as _sys

import torchvision.datasets as _tvd
from torchvision.datasets import DatasetFolder as _TVDatasetFolder
from torchvision.datasets import ImageFolder as _TVImageFolder
from torchvision.datasets import (CIFAR10, CIFAR100, DTD, EMNIST, KMNIST, MNIST, STL10, SUN397, SVHN,  # noqa: F401
                                  Caltech101, Caltech256, CelebA, Country211, FashionMNIST,
                                  EuroSAT, FGVCAircraft, Flowers102, Food101, Imagenette, INaturalist,
                                  OxfordIIITPet, Places365, StanfordCars)
from torchvision.datasets.folder import IMG_EXTENSIONS, default_loader, has_file_allowed_extension

from .imagelist import ImageList
from .video import HMDB51, UCF101, Kinetics

#: torchvision's file-backed datasets, re-exported unchanged: gputransforms.DataLoader compiles them
#: (datasets/adapters.py) whether they come from here or from torchvision.datasets
FILE_BACKED = ["Caltech101", "Caltech256", "CelebA", "Country211", "DTD", "EuroSAT", "FGVCAircraft", "Flowers102",
               "Food101", "Imagenette", "INaturalist", "OxfordIIITPet", "Places365", "StanfordCars", "SUN397"]
#: torchvision's in-memory datasets, re-exported unchanged: gputransforms.DataLoader keeps their images on
#: the device (datasets/inmemory.py, arrays.py)
IN_MEMORY = ["CIFAR10", "CIFAR100", "EMNIST", "FashionMNIST", "KMNIST", "MNIST", "STL10", "SVHN"]
#: torchvision's video datasets, scanned and (where torchcodec cannot load) decoded with PyAV
VIDEO = ["HMDB51", "Kinetics", "UCF101"]
__all__ = ["DatasetFolder", "ImageFolder", "ImageList", "IMG_EXTENSIONS", "default_loader",
           "has_file_allowed_extension"] + FILE_BACKED + IN_MEMORY + VIDEO


def __getattr__(name: str):
    """Every other public name of ``torchvision.datasets`` (CocoDetection, VOCSegmentation, ImageNet, FakeData,
    ``wrap_dataset_for_transforms_v2``, ...), unchanged: swapping the import never breaks a script, and
    ``gputransforms.DataLoader`` reads those objects as torchvision's (what it cannot compile runs on torch's
    DataLoader, and says so)."""
    if not name.startswith("_") and hasattr(_tvd, name):
        return getattr(_tvd, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list:
    return sorted(set(globals()) | {n for n in dir(_tvd) if not n.startswith("_")})


# ``import gputransforms.datasets.folder`` and the like, as with torchvision: its own modules
for _sub in ("folder", "vision", "utils"):
    _sys.modules[f"{__name__}.{_sub}"] = _importlib.import_module(f"torchvision.datasets.{_sub}")


class DatasetFolder(_TVDatasetFolder):
    __doc__ = _TVDatasetFolder.__doc__


class ImageFolder(_TVImageFolder):
    __doc__ = _TVImageFolder.__doc__

    @classmethod
    def from_torchvision(cls, dataset: _TVDatasetFolder) -> "ImageFolder":
        """Wrap an existing torchvision ImageFolder/DatasetFolder without listing the files again.

        (``gputransforms.DataLoader`` also accepts the torchvision instance directly.)
        """
        if not isinstance(dataset, _TVDatasetFolder):
            raise TypeError(f"expected a torchvision DatasetFolder/ImageFolder, got {type(dataset).__name__}")
        new = cls.__new__(cls)
        new.__dict__.update(dataset.__dict__)
        return new
