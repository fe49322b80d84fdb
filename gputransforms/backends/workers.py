"""torch's own DataLoader, for what does not compile: its worker processes run the dataset's
``__getitem__`` and the user's transform as written; batches are moved to the loader's device.
``explain()`` says why, and what ``num_workers=0`` would compile instead where that differs."""
from __future__ import annotations

from typing import Optional

from .. import state
from ..device import to_device, torch_device
from .base import Backend, EpochIterator, Sampling, Settings


class TorchWorkers(Backend):
    name = "torchvision"

    def __init__(self, settings: Settings, reason: str, plan=None, origin: str = ""):
        self.settings, self.reason, self.plan, self.origin = settings, reason, plan, origin

    def iterator(self, sampling: Sampling, resume: Optional[state.Position]) -> EpochIterator:
        return TorchIterator(self, sampling, resume)

    def explain(self) -> str:
        lines = [f"  reason: {self.reason}"]
        if self.plan is not None:
            if self.plan.compiled:
                lines.append("what num_workers=0 would run instead:")
            lines.append(self.plan.explain(self.settings.device))
        return "\n".join(lines)

    def fallback(self) -> Optional[str]:
        return f"running on torchvision's DataLoader ({self.reason})" if self.reason else None


class TorchIterator(EpochIterator):
    """torch's own iterator, batches moved to the device, counted for state_dict. Resuming replays
    the skipped batches: torch's worker iterators load what they are given."""

    def __init__(self, backend: TorchWorkers, sampling: Sampling, resume: Optional[state.Position]):
        super().__init__(sampling, resume)
        self.dev = torch_device(backend.settings.device)
        # Batches go to the GPU: with worker processes, torch's pin-memory thread pins them beside the
        # loop. Pinned in this thread instead (to_device), a detection batch of 32 images of their own
        # sizes held it so long that torch's 16 workers gave 83-103 img/s against 158-403 with the
        # thread (H100 host, the ssd and ssdlite presets, benchmarks/detection.py).
        pin = self.dev.type == "cuda" and backend.settings.num_workers > 0
        self.it = sampling.torch_iter(pin=pin)
        if resume is not None:
            state.skip_batches(self.it, resume.batches)
            self.yielded = resume.batches

    def __len__(self) -> int:
        return len(self.it)

    def _next(self):
        batch = next(self.it)
        return to_device(batch, self.dev) if self.dev.type == "cuda" else batch
