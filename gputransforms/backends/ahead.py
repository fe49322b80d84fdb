"""Reading on into the next epoch: the first batches the next ``iter(loader)`` will draw, worked out before
it is called, without drawing them.

A hand-written DALI pipeline's file reader never stops between epochs, so a training loop's first batch
of an epoch is already decoded when the loop asks for it. Ours starts an epoch's reads when the loop asks
for its first batch, because torch's samplers draw an epoch's order then (``iter(loader)`` and the first
``next()``), and that cost 76-294 ms at each epoch's start on an H100 (ResNet-18 and -50 as plain training
scripts: the whole gap to hand-written DALI there; benchmarks/results/stop25-*.txt).

So when an epoch's last batch is read, the feed asks ``next_epoch`` what the next epoch's first batches
will be: the draws the next iterator makes (its base seed, then the sampler's order), run on copies of
the random states, which are then put back as they were. The feed reads and decodes those batches after
the epoch's own; a detection loader's workers (``feed.ProcessEpochFeed``) record them, each sample seeded
from the next iterator's seed as its epoch will seed it, and the next iterator takes them on only if it
draws that seed too. When the loop does call ``iter(loader)`` again, the sampler draws for real, as torch's
does, and the batches read ahead are used only if they are exactly the ones it drew
(``feed.EpochFeed.adopt``): anything that drew from the same random state in between (the loop's own use
of torch's CPU generator), a ``set_epoch`` other than the next one, a dataset or sampler changed in
between, makes the two differ, and the batches read ahead are dropped. The order is always the
sampler's own.

Only samplers whose iteration changes nothing but those random states are worked out ahead: torch's
BatchSampler over its SequentialSampler, RandomSampler or DistributedSampler (that one for the epoch
after its current one, as a loop that calls ``set_epoch(epoch)`` sets it). A sampler of the user's own,
or a subclass, may count its passes or share state between them: its epochs start as they did.
"""
from __future__ import annotations

import copy
import itertools
from typing import Any, Optional

import torch
import torch.utils.data as tud

from .. import state

_SAMPLERS = (tud.SequentialSampler, tud.RandomSampler, tud.distributed.DistributedSampler)


def _next_iterable(index_sampler) -> Optional[Any]:
    """What the next epoch iterates (a copy where the sampler has an epoch of its own), or None where
    iterating it ahead could change something other than the random states."""
    if type(index_sampler) is not tud.BatchSampler or type(index_sampler.sampler) not in _SAMPLERS:
        return None
    sampler = index_sampler.sampler
    if type(sampler) is tud.distributed.DistributedSampler:
        sampler = copy.copy(sampler)
        sampler.epoch += 1
        index_sampler = copy.copy(index_sampler)
        index_sampler.sampler = sampler
    return index_sampler


def next_epoch(index_sampler, generator: Optional[torch.Generator], k: int, seeds=None) -> Optional[tuple]:
    """(the next iterator's base seed, the first ``k`` index batches of the next epoch), as the next iterator
    would draw them from the random states as they are now (``compiled.CompiledIterator``: a base seed from
    ``generator``, then the sampler's order), or None where they cannot be worked out ahead. Draws nothing:
    torch's CPU generator and every generator involved are as they were afterwards."""
    iterable = _next_iterable(index_sampler)
    if iterable is None or k <= 0:
        return None
    generators = {id(g): g for g in (generator, getattr(index_sampler.sampler, "generator", None))
                  if isinstance(g, torch.Generator)}
    saved = [(g, g.get_state()) for g in generators.values()]
    try:
        with torch.random.fork_rng(devices=[]):
            # the iterator's base seed (drawn, or with persistent workers after the first epoch made: ``seeds``)
            base = seeds.peek(generator) if seeds is not None else state.draw_base_seed(generator)
            return base, [list(b) for b in itertools.islice(iter(iterable), k)]
    finally:
        for g, before in saved:
            g.set_state(before)


class TorchPaced:
    """An epoch's index batches pulled from the sampler no further than torch's iterator pulls them with no worker
    processes: its ``n`` batches, then the pull past them (which ends the sampler's iteration) only when the loop
    asks for a batch after the last one (``end``). torch's RandomSampler draws once more from its generator there
    (a ``randperm`` of which it keeps nothing): with a generator of the user's, a loop that stops after
    ``len(loader)`` batches (Lightning's), or breaks near an epoch's end, leaves it undrawn, and the next epoch's
    order follows from that. The feed reads ahead, and so pulled it early.

    ``end_ahead``: the pull made now, for working out the next epoch (``next_epoch``) from where it leaves the
    generators; ``undo_ahead`` then puts them back, and ``end`` moves them on to where that pull left them, if
    nothing drew from them in between."""

    def __init__(self, batches, n: int, generators: list):
        self.batches, self.n, self.count = batches, n, 0
        self.generators = [g for g in generators if isinstance(g, torch.Generator)]
        self.ended = False
        self.pulled: Optional[tuple] = None  # (the generators' states before the pull made ahead, after it)

    def __iter__(self):
        return self

    def __next__(self):
        if self.count >= self.n:
            raise StopIteration
        self.count += 1
        return next(self.batches)

    def end(self) -> None:
        """The pull past the last batch, as torch's iterator makes it when the loop asks for one more."""
        if self.ended or self.count < self.n:
            return
        self.ended = True
        if self.pulled is None:
            next(self.batches, None)
            return
        before, after = self.pulled
        if all(torch.equal(g.get_state(), s) for g, s in zip(self.generators, before)):
            for g, s in zip(self.generators, after):
                g.set_state(s)

    def end_ahead(self) -> None:
        """The pull past the last batch now (``undo_ahead`` puts the generators back until ``end``)."""
        if self.ended or self.pulled is not None or self.count < self.n:
            return
        before = [g.get_state() for g in self.generators]
        next(self.batches, None)
        self.pulled = (before, [g.get_state() for g in self.generators])

    def undo_ahead(self) -> None:
        if self.pulled is not None and not self.ended:
            for g, s in zip(self.generators, self.pulled[0]):
                g.set_state(s)
