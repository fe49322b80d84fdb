"""torchvision's v2 wrapper of ``CocoDetection`` restated for the keys its default gives (``image_id``, ``boxes``,
``labels``), for the workers that record detection samples (``datasets.detection``).

torchvision's wrapper makes each target with a pytree of the annotations, a tensor built from nested lists, a
``BoundingBoxes`` and a format conversion by its kernel: about 50 us a sample on the development machine's core
(2.5x that on the H100 host, beside DALI), a tenth of what a worker spends on a recorded lsj-v2 sample. Here the
same target is made from the same annotations with one NumPy array: the boxes' dtype as ``torch.as_tensor``
infers it from the numbers (int64 where all are Python ints, float32 where one is a float), the XYWH to XYXY
conversion as torchvision's kernel adds (in that dtype), the labels by ``torch.tensor``, the keys in the
wrapper's order. Anything else (other keys, masks, a wrapper or a dataset that is not torchvision's own,
annotations of other types) is made by torchvision's wrapper. tests/test_detection.py compares the two over
every sample of the project's fake COCO and over edge cases.
"""
from __future__ import annotations

from typing import Callable, Optional

import numpy as np
import torch
from torchvision import tv_tensors

_KEYS = frozenset({"image_id", "boxes", "labels"})
_QUALNAME = "coco_dectection_wrapper_factory.<locals>.wrapper"  # (torchvision's spelling)
_XYXY = tv_tensors.BoundingBoxFormat.XYXY
_EXACT = 1 << 24  # a float32 holds every integer up to this one
#: what the boxes are wrapped like (the format the wrapper converts to, the default clamping mode where the
#: installed torchvision has one)
_LIKE = tv_tensors.BoundingBoxes(torch.zeros(1, 4), format=_XYXY, canvas_size=(1, 1))


def maker(wrapped) -> Optional[Callable]:
    """``make(k, raw_target, (height, width))``: the target torchvision's wrapper gives sample ``k`` of ``wrapped``
    (its ``_wrapper(k, (image, raw_target))[1]`` for an image of that size), or None where the annotations are
    not the common kind (the caller then runs the wrapper); None where ``wrapped`` is not torchvision's wrapper
    of a CocoDetection with keys among the default's."""
    w = getattr(wrapped, "_wrapper", None)
    if getattr(w, "__qualname__", None) != _QUALNAME or getattr(w, "__module__", None) != \
            "torchvision.tv_tensors._dataset_wrapper" or not w.__closure__:
        return None
    cells = dict(zip(w.__code__.co_freevars, (c.cell_contents for c in w.__closure__)))
    keys, dataset = cells.get("target_keys"), cells.get("dataset")
    if dataset is not getattr(wrapped, "_dataset", None) or not isinstance(keys, (set, frozenset)) or \
            not keys <= _KEYS:
        return None
    return _Maker(wrapped, frozenset(keys))


class _Maker:
    def __init__(self, wrapped, keys: frozenset):
        self.wrapped, self.keys = wrapped, keys

    def __call__(self, k: int, target, canvas: tuple) -> Optional[dict]:
        return _target(self.wrapped._dataset.ids[k], target, (int(canvas[0]), int(canvas[1])), self.keys)


def _target(image_id, target, canvas: tuple, keys) -> Optional[dict]:
    if not isinstance(target, list):
        return None
    if not target:
        return dict(image_id=image_id)
    bboxes, labels = [], []
    for ann in target:
        if type(ann) is not dict or "bbox" not in ann or "category_id" not in ann:
            return None
        bboxes.append(ann["bbox"])
        labels.append(ann["category_id"])
    out: dict = {}
    if "image_id" in keys:
        out["image_id"] = image_id
    if "boxes" in keys:
        boxes = _boxes(bboxes)
        if boxes is None:
            return None
        out["boxes"] = tv_tensors.wrap(torch.from_numpy(boxes), like=_LIKE, canvas_size=canvas)
    if "labels" in keys:
        out["labels"] = torch.tensor(labels)
    return out


def _boxes(bboxes: list) -> Optional[np.ndarray]:
    """The boxes as XYXY in the dtype ``torch.as_tensor`` gives the XYWH lists; None for anything but lists of
    four Python ints and floats (torch's inference is then torchvision's to make)."""
    floats = False
    for b in bboxes:
        if type(b) is not list or len(b) != 4:
            return None
        for v in b:
            t = type(v)
            if t is float:
                floats = True
            elif t is not int or not -_EXACT <= v <= _EXACT:
                return None
    if floats and torch.get_default_dtype() != torch.float32:
        return None
    a = np.array(bboxes, dtype=np.float32 if floats else np.int64)
    a[:, 2:] += a[:, :2]  # (``_xywh_to_xyxy``: in the boxes' dtype)
    return a
