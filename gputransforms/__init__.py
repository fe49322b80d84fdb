"""gputransforms: torchvision's datasets, transforms and DataLoader, compiled to NVIDIA DALI.

Change only the imports::

    from gputransforms import datasets, transforms, DataLoader

    train = datasets.ImageFolder("train/", transform=transforms.Compose([...]))
    loader = DataLoader(train, batch_size=256, shuffle=True)   # batches of CUDA tensors
    print(loader.explain())                                    # what compiled, what runs per sample

Where to start: ``DataLoader`` (the face; ``help(gputransforms.DataLoader)`` lists its extra
arguments), ``explain`` (how a chain compiles), ``compile`` (an eval chain for batches of encoded
images), ``FallbackWarning`` (what runs as torchvision runs it, and why), ``BadSampleError``.

Importing gputransforms asks CUDA for 32 hardware work queues (``CUDA_DEVICE_MAX_CONNECTIONS``) unless
the variable is set or CUDA has already started: ``device.widen_cuda_connections`` says why; set
``CUDA_DEVICE_MAX_CONNECTIONS=8`` before the import to keep the driver's default.
"""
from .device import widen_cuda_connections

widen_cuda_connections()  # before anything can start CUDA in this process: device.py says why

from . import datasets, transforms  # noqa: E402
from .compiler import explain, plan  # noqa: E402
from .errors import (BadSampleError, DamagedFileWarning, FallbackWarning, LateImportWarning,  # noqa: E402
                     SkippedSamplesWarning, UnshardedWarning)
from .inference import CompiledTransform, compile  # noqa: E402,A004 - gputransforms.compile, as the issue names it
from .loader import DataLoader  # noqa: E402
from .prepared import PreparedCopy, PreparedCopyWarning  # noqa: E402

from ._version import __version__  # noqa: E402

# (``compile`` is gputransforms.compile, but not in __all__: ``from gputransforms import *`` must not
# shadow Python's builtin)
__all__ = ["BadSampleError", "CompiledTransform", "DamagedFileWarning", "DataLoader", "FallbackWarning",
           "LateImportWarning", "PreparedCopy", "PreparedCopyWarning", "SkippedSamplesWarning", "UnshardedWarning", "datasets", "explain", "plan", "transforms"]
