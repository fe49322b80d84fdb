"""gputransforms: torchvision's datasets/transforms/DataLoader surface, compiled to NVIDIA DALI.

    from gputransforms import datasets, transforms, DataLoader
"""
from . import datasets, transforms
from .compiler import explain, plan
from .files import BadSampleError
from .loader import DataLoader, FallbackWarning, SkippedSamplesWarning

__version__ = "0.1.0"
__all__ = ["BadSampleError", "DataLoader", "FallbackWarning", "SkippedSamplesWarning", "datasets", "explain", "plan", "transforms"]
