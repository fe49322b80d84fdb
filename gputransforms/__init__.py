"""gputransforms: torchvision's datasets/transforms/DataLoader surface, compiled to NVIDIA DALI.

    from gputransforms import datasets, transforms, DataLoader
"""
from .device import widen_cuda_connections

widen_cuda_connections()  # before anything can start CUDA in this process: device.py says why

from . import datasets, transforms  # noqa: E402
from .compiler import explain, plan
from .files import BadSampleError
from .inference import CompiledTransform, compile  # noqa: A004 - gputransforms.compile, as the issue names it
from .loader import DataLoader, FallbackWarning, SkippedSamplesWarning

__version__ = "0.1.0"
__all__ = ["BadSampleError", "CompiledTransform", "DataLoader", "compile", "FallbackWarning", "SkippedSamplesWarning", "datasets", "explain", "plan", "transforms"]
