"""Exact, faster forms of torchvision's v2 ``forward``, for joint transforms while they are recorded
(``compiler.joint``; the registry's ``forward`` entries).

A sample being recorded is ``(image, target)``: the image a stand-in, the target a dict of tv_tensors,
tensors and plain values (what the datasets' v2 wrappers and a user's detection Dataset return). For
it, torchvision's ``Transform.forward`` flattens the pair with torch's pytree, asks each leaf's type, calls
``make_params`` and ``transform`` and unflattens again; in a worker that records an ssd sample that
bookkeeping, and SanitizeBoundingBoxes' indexing through tv_tensors' ``__torch_function__``, cost more
than the draws and the box arithmetic. The forms here do the same steps on the same leaves in the same
order (the class's own ``check_inputs``, ``_needs_transform_list``, ``make_params`` and ``transform``): the
same RNG calls, the same record, the same target. Only the flattening of that one shape of input is
written out (and a transform's needs-transform list kept per the types that decide it), and
SanitizeBoundingBoxes computes its mask in NumPy and indexes plain tensors (the same values; it wraps the
boxes again as torchvision does).

They apply to a transform of the registry's class itself (``type(t) is cls``), only while it is recorded
(``joint.recording``), only to that shape of input; anything else runs the class's own ``forward``.
tests/test_detection.py checks records, targets and the RNG state against torchvision's forward over the
reference presets, the other classes with an entry and the segmentation preset, on random samples with
empty, degenerate, outside and whole-pixel boxes (on torchvision 0.29 and 0.26).
"""
from __future__ import annotations

import weakref
from typing import Any, Callable, Optional

import numpy as np
import torch
from torch.utils._pytree import tree_is_leaf
from torchvision import tv_tensors
from torchvision.transforms.v2 import functional as F
from torchvision.transforms.v2._utils import is_pure_tensor

from . import joint_record


def flat_pair(inputs: tuple) -> Optional[list]:
    """``[image, *target.values()]``, or ``[image, target]``: what torch's pytree makes of ``(image, target)``
    where the target is a plain dict of leaves (tensors, numbers, strings, None) or one leaf (a segmentation
    mask); None for any other shape of input."""
    if len(inputs) != 2 or not tree_is_leaf(inputs[0]):
        return None
    target = inputs[1]
    if type(target) is dict:
        values = list(target.values())
        return [inputs[0], *values] if all(tree_is_leaf(v) for v in values) else None
    return [inputs[0], target] if tree_is_leaf(target) else None


def _pair(inputs: tuple, outputs: list) -> tuple:
    """The pair ``flat_pair`` flattened, rebuilt around ``outputs`` (as torch's pytree rebuilds it)."""
    if type(inputs[1]) is dict:
        return outputs[0], dict(zip(inputs[1].keys(), outputs[1:]))
    return outputs[0], outputs[1]


_NEEDS: dict = {}


def _needs(self, flat: list) -> list:
    """``self._needs_transform_list(flat)``, kept per its transformed types and the inputs' types where
    those decide it alone (its own method, types and torchvision's ``is_pure_tensor``: isinstance checks)."""
    types = self._transformed_types
    if type(types) is not tuple or not all(isinstance(t, type) or t is is_pure_tensor for t in types):
        return self._needs_transform_list(flat)
    key = (types, tuple(map(type, flat)))
    hit = _NEEDS.get(key)
    if hit is None:
        if len(_NEEDS) > 4096:
            _NEEDS.clear()
        hit = _NEEDS[key] = tuple(self._needs_transform_list(flat))
    return hit


def _apply(self, inputs: tuple, flat: list) -> tuple:
    """What ``Transform.forward`` does after ``check_inputs`` (and a random-apply transform after its draw):
    the parameters from the inputs it transforms, then each of those transformed, the pair rebuilt."""
    needs = _needs(self, flat)
    params = self.make_params([x for x, n in zip(flat, needs) if n])
    return _pair(inputs, [self.transform(x, params) if n else x for x, n in zip(flat, needs)])


def transform(original: Callable) -> Callable:
    """``Transform.forward`` (torchvision 0.26-0.29) on a flat pair."""

    def forward(self, *inputs: Any) -> Any:
        flat = flat_pair(inputs)
        if flat is None:
            return original(self, *inputs)
        self.check_inputs(flat)
        return _apply(self, inputs, flat)

    forward.__wrapped__ = original
    return forward


def random_apply(original: Callable) -> Callable:
    """``_RandomApplyTransform.forward`` (the flips, RandomZoomOut): the check, then the draw, and the pair
    itself back where the draw says no (torchvision returns its inputs as they are)."""

    def forward(self, *inputs: Any) -> Any:
        flat = flat_pair(inputs)
        if flat is None:
            return original(self, *inputs)
        self.check_inputs(flat)
        if torch.rand(1) >= self.p:
            return inputs
        return _apply(self, inputs, flat)

    forward.__wrapped__ = original
    return forward


def sanitize_bounding_boxes(original: Callable) -> Callable:
    """``SanitizeBoundingBoxes.forward``: its labels getter and checks, then the validity mask
    (``sanitize_mask``) on the boxes as a plain tensor, and the boxes and labels indexed as plain tensors
    (the boxes wrapped again like the input, as its ``transform`` does); anything else (masks) through its
    ``transform``. Rotated boxes, labels it would refuse and counts that differ run its own forward."""

    def forward(self, *inputs: Any) -> Any:
        flat = flat_pair(inputs)
        if flat is None:
            return original(self, *inputs)
        boxes = next((x for x in flat if isinstance(x, tv_tensors.BoundingBoxes)), None)
        if boxes is None or boxes.ndim != 2 or _rotated(boxes.format):
            return original(self, *inputs)
        labels = self._labels_getter(inputs)
        if labels is not None:
            if isinstance(labels, torch.Tensor):
                labels = (labels,)
            elif not (isinstance(labels, (tuple, list)) and all(isinstance(x, torch.Tensor) for x in labels)):
                return original(self, *inputs)  # its ValueError, as it words it
            if any(boxes.shape[0] != label.shape[0] for label in labels):
                return original(self, *inputs)
        valid = sanitize_mask(boxes.as_subclass(torch.Tensor), boxes.format, boxes.canvas_size, self.min_size,
                              self.min_area)
        params = dict(valid=valid, labels=labels)
        out = []
        for x in flat:
            is_label = labels is not None and any(x is label for label in labels)
            if is_label or type(x) is tv_tensors.BoundingBoxes:
                try:
                    y = x.as_subclass(torch.Tensor)[valid]
                except IndexError:  # (its transform passes such an input through)
                    out.append(x)
                    continue
                out.append(y if is_label else tv_tensors.wrap(y, like=x))
            else:
                out.append(self.transform(x, params))
        return _pair(inputs, out)

    forward.__wrapped__ = original
    return forward


def sanitize_mask(boxes: torch.Tensor, fmt, canvas_size: tuple, min_size: float, min_area: float) -> torch.Tensor:
    """torchvision's ``_get_sanitize_bounding_boxes_mask``: for float32 XYXY boxes on the CPU (what the
    references' presets sanitize) the same comparisons with NumPy in float32, as torch makes them (a
    Python number against a float32 tensor is compared in float32); any other boxes by its own function."""
    if fmt != tv_tensors.BoundingBoxFormat.XYXY or boxes.dtype != torch.float32 or boxes.device.type != "cpu":
        return F._misc._get_sanitize_bounding_boxes_mask(boxes, format=fmt, canvas_size=canvas_size,
                                                         min_size=min_size, min_area=min_area)
    return torch.from_numpy(valid_xyxy(boxes.numpy(), canvas_size, min_size, min_area))


def valid_xyxy(b: np.ndarray, canvas_size: tuple, min_size: float, min_area: float) -> np.ndarray:
    """``_get_sanitize_bounding_boxes_mask`` of float32 XYXY boxes as a NumPy array: widths and heights at least
    ``min_size``, every coordinate within [0, the canvas's width or height], the area at least ``min_area``."""
    f32 = np.float32
    wh = b[:, 2:] - b[:, :2]
    bounds = np.asarray([canvas_size[1], canvas_size[0], canvas_size[1], canvas_size[0]], dtype=f32)
    return (wh >= f32(min_size)).all(axis=1) & ((b >= f32(0)) & (b <= bounds)).all(axis=1) & \
        (wh[:, 0] * wh[:, 1] >= f32(min_area))


def form_of(cls: type) -> Optional[Callable[[Callable], Callable]]:
    """The faster form of ``cls.forward`` (the registry's ``forward`` entry), by the forward the class
    runs: torchvision's ``Transform.forward``, ``_RandomApplyTransform.forward`` or SanitizeBoundingBoxes';
    None for any other (Compose's own loop, say)."""
    from torchvision.transforms import v2
    from torchvision.transforms.v2 import _transform

    forms = {_transform.Transform.forward: transform, _transform._RandomApplyTransform.forward: random_apply,
             v2.SanitizeBoundingBoxes.forward: sanitize_bounding_boxes}
    return forms.get(cls.forward)


def _rotated(fmt) -> bool:
    is_rotated = getattr(tv_tensors, "is_rotated_bounding_format", None)
    return bool(is_rotated(fmt)) if is_rotated is not None else False


def model_preset(steps_of: Callable[[Any], list]) -> Callable[[Callable], Callable]:
    """The registry's ``forward`` entry of torchvision's model preprocessing (``weights.transforms()``:
    ``ObjectDetection``, ``ImageClassification``, ``SemanticSegmentation``) while recorded. Its ``forward``
    calls v1 functionals, which the recording does not see; on the stand-in image of the sample being
    recorded it runs ``steps_of(preset)`` instead (``chain.model_preprocessing``: the v2 classes of the same
    functionals, in the same order), so a joint transform of the user's that calls it (the detection
    reference's ``--test-only --weights``: ``lambda img, target: (trans(img), target)``) is recorded. On anything
    else it runs the class's own forward."""

    kept: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # per preset: (its settings, its steps)

    def steps(preset) -> list:
        settings = repr(sorted((k, v) for k, v in vars(preset).items() if not k.startswith("_")))
        found = kept.get(preset)
        if found is None or found[0] != settings:
            found = kept[preset] = (settings, steps_of(preset))
        return found[1]

    def faster(original: Callable) -> Callable:
        def forward(self, *inputs: Any) -> Any:
            rec = getattr(joint_record._LOCAL, "record", None)
            if rec is None or len(inputs) != 1 or rec.ops.get(joint_record._key(inputs[0])) is None:
                return original(self, *inputs)
            image = inputs[0]
            for t in steps(self):
                image = t(image)
            return image

        return forward

    return faster
