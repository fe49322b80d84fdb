"""gputransforms: torchvision's datasets/transforms/DataLoader surface, compiled to NVIDIA DALI.

    from gputransforms import datasets, transforms, DataLoader
"""
from . import datasets, transforms
from .compiler import explain, plan
from .loader import DataLoader, FallbackWarning

__version__ = "0.1.0"
__all__ = ["DataLoader", "FallbackWarning", "datasets", "explain", "plan", "transforms"]
