"""A loader's position, for mid-epoch resume (torchdata StatefulDataLoader's meaning).

An epoch's order is a function of the random state its iterator starts from: torch's DataLoader
draws its base seed, then its sampler draws the permutation, from the loader's ``generator`` (or,
without one, from torch's global RNG). So the state is that random state as it was when the
epoch's iterator was created, and the number of batches handed out since. Resuming restores the
random state, lets the sampler draw the same order again and skips the batches already handed
out by advancing the index sampler alone: no file is read for them. The following epochs then draw
what the uninterrupted run would have drawn. The state holds no image data, and pickles.

Random transforms repeat too: the state also holds the DALI pipeline's checkpoint (the state of
its random operators after the last batch handed out) and torch's global RNG as it was then, which
the batched stage after the graph draws from; a resumed iterator builds its pipeline from the
checkpoint and sets torch's global RNG back once its sampler has drawn the epoch's order.

Samplers that do not draw from that RNG (``DistributedSampler``: seed + ``set_epoch``; a user's
sampler with its own generator) give the same order when the framework restores their epoch, as
Lightning and Accelerate do.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import torch

VERSION = 1


class BaseSeeds:
    """The base seed of each epoch's iterator. torch's iterator draws one from the loader's ``generator`` (or torch's
    global RNG) when it is made, before its sampler draws the order. With ``persistent_workers=True`` torch makes one
    iterator and resets it for each later epoch, drawing no base seed (its workers go on from their state): the
    epochs after the first draw their order straight from the generator. Here the first epoch's seed is drawn as
    torch's, and each later one made from it and the epoch's number (different draws each epoch, nothing drawn).
    ``state()``: (first seed, epochs that took one) or None, saved in a ``Position``."""

    def __init__(self, persistent: bool):
        self.persistent = persistent
        self.first: Optional[int] = None
        self.taken = 0

    def _later(self) -> int:
        return (self.first + self.taken * 0x9E3779B97F4A7C15) % (1 << 63)

    def take(self, generator: Optional[torch.Generator]) -> int:
        """The next iterator's base seed (drawn from ``generator`` where torch's iterator draws one)."""
        if self.persistent and self.first is not None:
            seed = self._later()
        else:
            seed = draw_base_seed(generator)
            if self.persistent:
                self.first = seed
        self.taken += 1
        return seed

    def peek(self, generator: Optional[torch.Generator]) -> int:
        """What ``take`` will give, drawing from ``generator`` where it will (the caller puts its state back)."""
        return self._later() if self.persistent and self.first is not None else draw_base_seed(generator)

    def state(self) -> Optional[tuple]:
        return (self.first, self.taken) if self.persistent else None

    def restore(self, saved: Optional[tuple]) -> None:
        if self.persistent and saved is not None:
            self.first, self.taken = saved


def draw_base_seed(generator: Optional[torch.Generator]) -> int:
    """torch's ``_BaseDataLoaderIter``'s base seed, drawn as it draws it."""
    return torch.empty((), dtype=torch.int64).random_(generator=generator).item()


def rng_state(generator: Optional[torch.Generator]) -> torch.Tensor:
    return generator.get_state() if generator is not None else torch.get_rng_state()


def set_rng_state(generator: Optional[torch.Generator], value: torch.Tensor) -> None:
    if generator is not None:
        generator.set_state(value)
    else:  # torch's samplers draw from the global RNG when the loader has no generator
        torch.set_rng_state(value)


@dataclasses.dataclass
class Position:
    rng: torch.Tensor  # the random state the epoch's iterator started from
    batches: int  # batches handed out in that epoch
    skipped: list  # (index, path, reason) of samples left out with on_error="skip"
    dali: Optional[bytes] = None  # the pipeline's checkpoint after those batches
    rng_now: Optional[torch.Tensor] = None  # torch's global RNG after those batches (the batched stage's)
    seeds: Optional[tuple] = None  # ``BaseSeeds.state()`` before the epoch took its base seed (persistent workers)

    def to_dict(self) -> dict:
        return {"version": VERSION, "rng": self.rng.clone(), "batches_yielded": self.batches,
                "skipped": [tuple(s) for s in self.skipped], "dali_checkpoint": self.dali,
                "global_rng": None if self.rng_now is None else self.rng_now.clone(),
                "base_seeds": None if self.seeds is None else list(self.seeds)}

    @classmethod
    def from_dict(cls, d: dict) -> "Position":
        if d.get("version") != VERSION:
            raise ValueError(f"not a gputransforms.DataLoader state (version {d.get('version')!r}, expected {VERSION})")
        seeds = d.get("base_seeds")
        return cls(rng=d["rng"], batches=int(d["batches_yielded"]), skipped=list(d.get("skipped", [])),
                   dali=d.get("dali_checkpoint"), rng_now=d.get("global_rng"),
                   seeds=None if seeds is None else tuple(seeds))


def skip_batches(index_batches, n: int) -> int:
    """Advance an index-batch iterator by ``n`` batches without loading anything; the indices passed over."""
    passed = 0
    for _ in range(n):
        batch = next(index_batches, None)
        if batch is None:
            break
        passed += len(batch)
    return passed
