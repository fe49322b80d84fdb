"""An in-memory chain replayed as one CUDA graph per batch size.

At CIFAR sizes the GPU work of a batch (a gather, a crop, a flip, a normalisation of 1.5 MB) is far
less than the host's cost of launching it one torch op at a time (H100: 1.2 ms per batch of 512 op
by op, 0.35 ms as a graph), so the loader's pace is the main thread's. When every transform of the
chain is one whose randomness can be drawn ahead (``vectorized.Vectorized``: RandomCrop, the flips)
or deterministic (ToTensor, PILToTensor, ConvertImageDtype/ToDtype, Normalize), the whole batch --
gather by index, the transforms, the targets -- is captured once as a CUDA graph. Each batch then
costs the parameter draws on the CPU (the same torch RNG calls, in the same order, as the op-by-op
path: the same images from the same seed), one copy of rows and parameters to the device, one
replay and a copy of the outputs out of the graph's buffers.

``build`` returns None where the chain does not qualify; ``ArrayIterator`` then runs it op by op.
"""
from __future__ import annotations

import warnings
from typing import Optional

import torch

from .registry import graph_kind
from .vectorized import Vectorized


def _kind(t, fn, stage: str) -> Optional[str]:
    """How a stage enters the graph: "vectorized", "skip", "normalize", "dtype"; None: it cannot."""
    if isinstance(fn, Vectorized):
        return "vectorized"
    if stage == "conversion":
        return "skip" if fn is None else "dtype"
    return graph_kind(t) if stage == "batched" else None


def capturable(compiled: list) -> bool:
    """Whether every stage of ``compiled`` (``stages.in_memory``) can be captured."""
    return all(_kind(t, fn, stage) is not None for t, fn, stage in compiled)


class GraphedChain:
    """``chain(rows)``: the transformed images and targets of dataset rows ``rows`` (CPU int64)."""

    def __init__(self, images: torch.Tensor, targets: torch.Tensor, steps: list):
        self.images, self.targets, self.steps = images, targets, steps
        self.width = 1 + sum(w for _, _, w in steps)
        self.graphs: dict = {}

    def _forward(self, p: torch.Tensor):
        rows = p[:, 0]
        x = self.images.index_select(0, rows)
        col = 1
        for fn, vec, width in self.steps:
            x = fn(x, p[:, col:col + width]) if vec is not None else fn(x)
            col += width
        return x, self.targets.index_select(0, rows)

    def _capture(self, n: int):
        params = torch.zeros(n, self.width, dtype=torch.int64, device=self.images.device)
        side = torch.cuda.Stream(self.images.device)
        side.wait_stream(torch.cuda.current_stream(self.images.device))
        with torch.cuda.stream(side):
            for _ in range(2):  # warm-up outside the graph, as torch.cuda.graphs asks
                self._forward(params)
        torch.cuda.current_stream(self.images.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            x, y = self._forward(params)
        self.graphs[n] = (graph, params, x, y)
        return self.graphs[n]

    def draw(self, rows: torch.Tensor) -> torch.Tensor:
        """Rows and every random parameter of the batch, drawn in the chain's order."""
        shape = (len(rows), *self.images.shape[1:])
        cols = [rows[:, None]]
        for fn, vec, _ in self.steps:
            if vec is not None:
                cols.append(vec.draw(shape))
                shape = vec.out_shape(shape)
        return torch.cat(cols, 1)

    def __call__(self, rows: torch.Tensor):
        p = self.draw(rows)
        graph, params, x, y = self.graphs.get(len(rows)) or self._capture(len(rows))
        params.copy_(p.pin_memory(), non_blocking=True)
        graph.replay()
        return [x.clone(), y.clone()]  # (a list, as default_collate makes of (image, target) tuples)


def build(images: torch.Tensor, targets: Optional[torch.Tensor], compiled: list) -> Optional[GraphedChain]:
    """A GraphedChain for ``compiled`` (``stages.in_memory``) on CUDA images, or None."""
    if images.device.type != "cuda" or targets is None or not capturable(compiled):
        return None
    steps = []
    for t, fn, stage in compiled:
        kind = _kind(t, fn, stage)
        if kind == "vectorized":
            steps.append((fn.apply, fn, fn.width))
        elif kind in ("normalize", "dtype"):  # (batched's Normalize: no host-side wait, capturable)
            steps.append((fn, None, 0))
    return GraphedChain(images, targets, steps)


def first_batch(chain: GraphedChain, rows: torch.Tensor):
    """The first call, which captures: a failure to capture (a kernel that synchronises, say) is
    reported once and the chain is run op by op from then on (None)."""
    try:
        return chain(rows)
    except RuntimeError as e:  # torch raises RuntimeError for what cannot be captured
        warnings.warn(f"gputransforms: the in-memory chain could not be captured as a CUDA graph ({e}); "
                      "it runs op by op", stacklevel=3)
        return None
