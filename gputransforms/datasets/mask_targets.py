"""torchvision's v2 wrapper of ``VOCSegmentation`` restated for the workers that record segmentation samples
(``datasets.detection``): the wrapper opens the class mask with PIL and makes it a ``tv_tensors.Mask`` of
shape 1xHxW (uint8 palette indices); here the same mask is decoded from the PNG's bytes by ``png.values``
(0.07 ms against PIL's 0.84-1.02 on the development machine's core for a VOC-sized mask). A file ``png``
does not take (another kind of PNG, one not exactly well-formed, one that cannot be read) is the wrapper's
to open, as torchvision opens it. tests/test_detection.py compares the two over every mask of the project's
VOC layout and over files of each kind.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
import torchvision
from torchvision import tv_tensors

from .. import files, png

_QUALNAME = "segmentation_wrapper_factory.<locals>.wrapper"  # (torchvision's)


def maker(wrapped) -> Optional[Callable[[int], Optional[tv_tensors.Mask]]]:
    """``make(k)``: the mask torchvision's wrapper gives sample ``k`` of ``wrapped``, or None where the file is the
    wrapper's to open; None where ``wrapped`` is not torchvision's wrapper of a ``VOCSegmentation``."""
    w = getattr(wrapped, "_wrapper", None)
    inner = getattr(wrapped, "_dataset", None)
    if getattr(w, "__qualname__", None) != _QUALNAME or getattr(w, "__module__", None) != \
            "torchvision.tv_tensors._dataset_wrapper" or type(inner) is not torchvision.datasets.VOCSegmentation:
        return None
    return _Masks(list(inner.masks))


class _Masks:
    def __init__(self, paths: list):
        self.paths = paths

    def __call__(self, k: int) -> Optional[tv_tensors.Mask]:
        try:
            data = files.read_file(self.paths[k])
        except OSError:  # (torchvision's own error, from PIL)
            return None
        values = png.values(data)
        return None if values is None else tv_tensors.Mask(torch.from_numpy(values)[None])
