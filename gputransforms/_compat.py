"""Everything that depends on the installed torchvision version lives here.

CI runs torchvision 0.29, the GPU machine 0.26; both store the user's arguments under the same
attribute names, but a few of them are normalised differently between v1 and v2 classes.
"""
from __future__ import annotations

import numbers
from typing import Optional, Sequence

import torch
import torchvision
from torchvision.transforms import InterpolationMode
from torchvision.transforms import v2 as tv2

TORCHVISION_VERSION = tuple(int(p) for p in torchvision.__version__.split("+")[0].split(".")[:2])


def interpolation_mode(value) -> InterpolationMode:
    """v1 transforms still accept PIL's integer constants for ``interpolation``; torchvision 0.29's
    v2 classes store the mode's string value."""
    if isinstance(value, InterpolationMode):
        return value
    if isinstance(value, str):
        return InterpolationMode(value)
    from torchvision.transforms.functional import _interpolation_modes_from_int

    return _interpolation_modes_from_int(int(value))


def padding_ltrb(transform) -> tuple[int, int, int, int]:
    """(left, top, right, bottom) padding of a RandomCrop, v1 or v2.

    v1 keeps the user's raw ``padding`` (int, or 2 or 4 numbers in torchvision's l,t,r,b order);
    v2 stores it already parsed as [left, right, top, bottom].
    """
    padding = transform.padding
    if not padding:
        return (0, 0, 0, 0)
    if isinstance(transform, tv2.Transform):
        left, right, top, bottom = padding
        return (left, top, right, bottom)
    if isinstance(padding, numbers.Number):
        p = int(padding)
        return (p, p, p, p)
    padding = list(padding)
    if len(padding) == 1:
        return (padding[0],) * 4
    if len(padding) == 2:
        return (padding[0], padding[1], padding[0], padding[1])
    return tuple(padding)  # type: ignore[return-value]


def constant_fill(transform) -> Optional[Sequence[float]]:
    """The fill of a padding transform as per-channel numbers, or None if it is per input type.

    v2 accepts a dict keyed by input type; v1 a number or a sequence.
    """
    fill = transform.fill
    if isinstance(fill, dict):
        return None
    if fill is None:
        return (0.0, 0.0, 0.0)
    if isinstance(fill, numbers.Number):
        return (float(fill),) * 3
    fill = [float(f) for f in fill]
    return tuple(fill * 3) if len(fill) == 1 else tuple(fill)


def auto_augment_policies(transform) -> list:
    """An AutoAugment's sub-policies as [[(op name, probability, magnitude bin or None), ...], ...]:
    v1 keeps them in ``policies``, v2 in ``_policies``."""
    policies = getattr(transform, "policies", None)
    if policies is None:
        policies = transform._policies
    return [[tuple(op) for op in sub] for sub in policies]


def tensor_color_kernels(v2: bool = False):
    """torchvision's own batch-capable colour kernels (private in every version we support):
    grayscale (truncated to the input dtype), RGB->HSV, dtype conversion and the dtype's maximum.
    v1 and v2 share the arithmetic but for the grayscale sum and the HSV conversion, whose float
    rounding differs; each API gets its own."""
    from torchvision.transforms import _functional_tensor as F_t

    if v2:
        from torchvision.transforms.v2.functional import _color as C2

        # (image, 1, preserve_dtype=True): truncated like v1's
        return C2._rgb_to_grayscale_image, C2._rgb_to_hsv, F_t.convert_image_dtype, F_t._max_value
    return F_t.rgb_to_grayscale, F_t._rgb2hsv, F_t.convert_image_dtype, F_t._max_value


def make_params(transform, sample):
    """A v2 transform's parameters for one sample, drawn as its ``forward`` draws them (without
    the coin of a random-p transform). torchvision < 0.21 called the method ``_get_params``."""
    fn = getattr(transform, "make_params", None) or transform._get_params
    return fn([sample])


def v2_tensor_fill(transform):
    """The fill a v2 geometric transform hands its kernel for a plain tensor (None: no fill mask)."""
    from torchvision.transforms.v2._utils import _get_fill

    return _get_fill(transform._fill, torch.Tensor)


def apply_grid_transform():
    """torchvision's grid_sample + fill-mask + rounding step shared by its affine, rotate and
    perspective tensor kernels; it takes one grid per image as well as one for all."""
    from torchvision.transforms.v2.functional._geometry import _apply_grid_transform

    return _apply_grid_transform


def inverse_affine_matrix():
    from torchvision.transforms.v2.functional._geometry import _get_inverse_affine_matrix

    return _get_inverse_affine_matrix


def perspective_coefficients(startpoints, endpoints):
    from torchvision.transforms.functional import _get_perspective_coeffs

    return _get_perspective_coeffs(startpoints, endpoints)


def dataset_loader(dataset):
    """The image loader of a torchvision file-backed dataset (Food101, DTD, ...): torchvision 0.29
    keeps a ``loader`` argument, older versions open ``PIL.Image.open(f).convert("RGB")`` inline,
    which is ``default_loader``'s meaning (as does INaturalist's ``loader=None``)."""
    from torchvision.datasets.folder import default_loader

    loader = getattr(dataset, "loader", None)
    return default_loader if loader is None else loader


def clip_frames(video_clips, video_idx: int, clip_idx: int):
    """The frame indices (presentation order) of one clip of a torchvision ``VideoClips``. Since
    torchvision moved video decoding to torchcodec (0.26 and 0.29 here), ``video_pts`` is
    ``range(num_frames)``, so a clip's pts are its frame indices, resampled ones included
    (``compute_clips_for_video`` unfolds the resampled pts); older versions kept stream timestamps."""
    return video_clips.clips[video_idx][clip_idx]


def torchcodec_loads() -> bool:
    """Whether torchvision can decode video here (torchcodec imports and finds FFmpeg's libraries)."""
    try:
        import torchcodec.decoders  # noqa: F401 - loading FFmpeg is the question
    except Exception:  # noqa: BLE001 - ImportError, or RuntimeError when FFmpeg is missing
        return False
    return True
