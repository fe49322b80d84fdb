"""torchvision's v2 wrappers of ``VOCSegmentation`` and of ``OxfordIIITPet`` with its trimaps, restated for the
workers that record segmentation samples (``datasets.detection``): the wrapper opens the class mask with PIL
and makes it a ``tv_tensors.Mask`` of shape 1xHxW (uint8 palette indices or grey values); here the same mask
is decoded from the PNG's bytes by ``png.values`` (0.07 ms against PIL's 0.84-1.02 on the development
machine's core for a VOC-sized mask). A file ``png`` does not take (another kind of PNG, one not exactly
well-formed, one that cannot be read) is the wrapper's to open, as torchvision opens it.
tests/test_png.py compares the two over every mask of the project's VOC layout and over files of each kind.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch
import torchvision
from torchvision import tv_tensors

from .. import files, png

#: torchvision's wrappers (their factories' names) by the exact dataset class they wrap
_WRAPPERS = {torchvision.datasets.VOCSegmentation: "segmentation_wrapper_factory.<locals>.wrapper",
             torchvision.datasets.OxfordIIITPet: "oxford_iiit_pet_wrapper_factor.<locals>.wrapper"}


def maker(wrapped) -> Optional[Callable[[int], Optional[Any]]]:
    """``make(k)``: the target torchvision's wrapper gives sample ``k`` of ``wrapped``, or None where the mask's
    file is the wrapper's to open; None where ``wrapped`` is not torchvision's wrapper of a ``VOCSegmentation``
    or of an ``OxfordIIITPet`` with trimaps among its target types."""
    w = getattr(wrapped, "_wrapper", None)
    inner = getattr(wrapped, "_dataset", None)
    if getattr(w, "__qualname__", None) != _WRAPPERS.get(type(inner)) or getattr(w, "__module__", None) != \
            "torchvision.tv_tensors._dataset_wrapper":
        return None
    if type(inner) is torchvision.datasets.VOCSegmentation:
        return _Masks(list(inner.masks))
    if "segmentation" not in inner._target_types:
        return None
    return _Pets(inner, _Masks([str(p) for p in inner._segs]))


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


class _Pets:
    """``OxfordIIITPet.__getitem__``'s target as the wrapper gives it: per target type the label, the binary label
    or the trimap as a Mask; one alone, several as a tuple."""

    def __init__(self, inner, masks: _Masks):
        self.inner, self.masks = inner, masks

    def __call__(self, k: int):
        out = []
        for kind in self.inner._target_types:
            if kind == "segmentation":
                mask = self.masks(k)
                if mask is None:
                    return None
                out.append(mask)
            else:
                out.append(self.inner._labels[k] if kind == "category" else self.inner._bin_labels[k])
        return out[0] if len(out) == 1 else tuple(out)
