"""Transforms: torchvision's own classes, so signatures, defaults, validation errors, attributes,
``repr`` and eager ``__call__`` on one PIL image or tensor are torchvision's by construction.

What gputransforms adds is not here but in ``gputransforms.compiler``: one table that reads these
classes' attributes (v1 and v2 alike) and lowers a Compose to a DALI graph. ``Compose`` gains
``explain()``. Every other torchvision transform is re-exported too, so swapping the import never
breaks a chain; those without a lowering run per sample and ``explain()`` says so.
"""
from torchvision.transforms import *  # noqa: F401,F403 - the full torchvision v1 surface
from torchvision.transforms import Compose as _TVCompose
from torchvision.transforms import InterpolationMode  # noqa: F401
from torchvision.transforms import v2  # noqa: F401
from torchvision.transforms.v2 import ToDtype, ToImage  # noqa: F401 - the v2 spellings

import importlib as _importlib
import sys as _sys

import torchvision.transforms as _tv

# ``import gputransforms.transforms.functional as F``, ``from gputransforms.transforms.v2 import functional``:
# torchvision's own modules under this name, as a swapped import expects them
for _sub in ("functional", "transforms", "autoaugment", "v2", "v2.functional"):
    _sys.modules[f"{__name__}.{_sub}"] = _importlib.import_module(f"torchvision.transforms.{_sub}")

__all__ = sorted(set(getattr(_tv, "__all__", [n for n in dir(_tv) if n[:1].isupper()]))
                 | {"Compose", "ToImage", "ToDtype", "InterpolationMode", "v2"})


class Compose(_TVCompose):
    __doc__ = _TVCompose.__doc__

    def explain(self, device: "str | None" = None) -> str:
        """How this chain is compiled: the DALI graph, its fusions, and what runs per sample."""
        from ..compiler import explain

        return explain(self, device)
