"""What gputransforms raises and warns, in one place (the ground floor: imports nothing of ours).

- ``BadSampleError``: a sample whose file cannot be loaded; names the file and the sample index.
- ``FallbackWarning``: part of a chain, or a whole loader, runs as torchvision runs it (per sample, or
  on torch's worker processes) instead of compiled; says which transform and why, once.
- ``DamagedFileWarning``: a damaged file DALI refuses but PIL decodes was decoded by PIL, as torchvision would.
- ``SkippedSamplesWarning``: with ``on_error="skip"``, samples that were left out of an epoch.
- ``UnshardedWarning``: several torch.distributed ranks, but a sampler that gives each all samples.
- ``NotCompilable`` / ``NotLowerable``: internal answers of the dataset adapters and of the
  compiler (a dataset that cannot feed a graph; a transform with no lowering); their one-line
  message is what ``explain()`` and ``FallbackWarning`` show.
"""
from __future__ import annotations

import sys
from typing import Optional

#: packages whose frames a warning skips to point at the user's line (frameworks rebuild loaders)
_LIBRARIES = {"gputransforms", "torch", "lightning", "pytorch_lightning", "accelerate"}


def user_stacklevel() -> int:
    """``warnings.warn``'s stacklevel, called where the warning is issued, that points at the first
    frame outside gputransforms, torch and the training frameworks: the user's line."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_globals.get("__name__", "").split(".")[0] in _LIBRARIES:
        frame, level = frame.f_back, level + 1
    return level


class BadSampleError(RuntimeError):
    """A sample whose file cannot be loaded; names the file and the sample index."""

    def __init__(self, index: int, path: str, reason: str):
        super().__init__(f"gputransforms: sample {index} ({path}): {reason}")
        self.index, self.path, self.reason = index, path, reason

    def record(self) -> tuple:
        """What a worker sends for it (``bad_sample`` makes it again)."""
        return self.index, self.path, self.reason


class BadTargetError(BadSampleError):
    """A detection or segmentation sample whose target cannot be made (its mask or annotation file unreadable, or
    torchvision's wrapper refusing it): skipped and listed with ``on_error="skip"``; otherwise the loader raises
    ``raising``, torchvision's own exception with the sample, its image and the target's file named."""

    def __init__(self, index: int, path: str, reason: str, raising: Optional[BaseException] = None):
        super().__init__(index, path, reason)
        self.raising = raising

    def __reduce__(self):
        return type(self), (self.index, self.path, self.reason, self.raising)

    def record(self) -> tuple:
        return self.index, self.path, self.reason, self.raising


def bad_sample(index: int, path: str, reason: str, raising: Optional[BaseException] = None) -> BadSampleError:
    """The error a worker's record of a bad sample stands for (``BadSampleError.record``)."""
    return BadSampleError(index, path, reason) if raising is None else BadTargetError(index, path, reason, raising)


def naming_sample(err: Exception, index: int, path: str):
    """``err`` again, of its type and with its message, sample ``index`` and its file named after it
    (torchvision's own exceptions do not say which file); None where its type takes other arguments."""
    try:
        return type(err)(f"{err} (sample {index}: {path})")
    except Exception:  # noqa: BLE001 - an exception type that takes other arguments
        return None


class FallbackWarning(UserWarning):
    """Part of a transform chain runs per sample with torchvision instead of in the DALI graph."""


class DamagedFileWarning(UserWarning):
    """A damaged file that PIL decodes (as torchvision's loader does) was decoded by PIL instead of DALI;
    names the file, once."""


class SkippedSamplesWarning(UserWarning):
    """With on_error="skip", samples whose files could not be loaded were left out of an epoch."""


class LateImportWarning(UserWarning):
    """A GPU loader in a process where CUDA started before ``import gputransforms``: its decoding shares
    the driver's default 8 hardware queues with the model (said once, with the measured cost and the fix)."""


class UnshardedWarning(UserWarning):
    """torch.distributed runs several ranks but the loader's sampler is not distributed."""


class _WithAdvice(Exception):
    """A reason something runs as torchvision runs it, and what the user can change so that it compiles
    (every one is given advice: tests/test_structure.py lists them)."""

    def __init__(self, reason: str, advice: str):
        super().__init__(f"{reason}; {advice}" if advice else reason)
        self.reason, self.advice = reason, advice


class NotCompilable(_WithAdvice):
    """The dataset cannot be fed to a compiled graph; the message says why in one line, and what would
    compile instead."""


class NotLowerable(_WithAdvice):
    """The transform has no lowering with torchvision's meaning; it runs as torchvision runs it. The
    message says why, and what to change to keep it in the graph."""
