"""What every backend shares: the loader's settings (``Settings``), one epoch's sampling (``Sampling``),
and the iterator base (``EpochIterator``) that holds resume bookkeeping and error naming once.

An epoch's order is a function of the random state its iterator starts from (``gputransforms.state``):
each iterator records that state and the batches it handed out, and a resumed one restores it,
lets the sampler draw the same order again and skips the batches already handed out.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import random
import warnings
from typing import Any, Callable, Optional

import numpy as np
import torch
import torch.utils.data as tud

from .. import state
from ..device import rank_tag
from ..errors import BadSampleError


def random_states(*holders) -> list:
    """(how to put it back, its state) for torch's CPU generator, Python's and NumPy's global ones, and every
    generator ``holders`` are or hold in their attributes (a sampler's, a dataset's: nested objects too, a few
    levels deep; of a list or dict, its first items). Code of the user's that the loader runs before an epoch
    (a batch sampler scanned for its size, a dataset's ``__getitem__`` probed) draws from them; torch's
    DataLoader draws nothing then, so they are put back."""
    kept = [(torch.set_rng_state, torch.get_rng_state()), (random.setstate, random.getstate()),
            (np.random.set_state, np.random.get_state())]
    seen: set = set()

    def walk(x, depth: int) -> None:
        if id(x) in seen or depth < 0 or isinstance(x, (type, str, bytes, torch.Tensor, np.ndarray)):
            return
        seen.add(id(x))
        if isinstance(x, torch.Generator):
            kept.append((x.set_state, x.get_state()))
        elif isinstance(x, np.random.Generator):
            kept.append((functools.partial(setattr, x.bit_generator, "state"), x.bit_generator.state))
        elif isinstance(x, np.random.RandomState):
            kept.append((x.set_state, x.get_state()))
        elif isinstance(x, random.Random):
            kept.append((x.setstate, x.getstate()))
        elif isinstance(x, (list, tuple)):
            for y in x[:16]:
                walk(y, depth - 1)
        elif isinstance(x, dict):
            for y in itertools.islice(x.values(), 16):
                walk(y, depth - 1)
        else:
            try:
                values = list(vars(x).values())
            except TypeError:  # (no __dict__, or one that is not a mapping)
                return
            for y in values:
                walk(y, depth - 1)

    for holder in holders:
        walk(holder, 3)
    return kept


def put_back(kept: list) -> None:
    """The states ``random_states`` kept, put back."""
    for put, was in kept:
        put(was)


@dataclasses.dataclass(frozen=True)
class Settings:
    """The loader's arguments that backends read (``DataLoader`` keeps each as a public attribute too)."""

    device: str
    seed: Optional[int]
    on_error: str
    validate_jpeg: bool
    hw_decoder_load: float
    jpeg_fancy_upsampling: bool
    video_decoder: str
    num_threads: int  # DALI's CPU threads; also the video decoders' worker processes
    num_workers: int  # as the user gave it (torch's workers, on the torchvision path)
    prefetch_queue_depth: int
    collate: Optional[Callable]  # the user's collate_fn, None for torch's default_collate
    batch_size: Optional[int]
    batch_sampler: Any
    pin_memory: bool = False
    timeout: float = 0
    drop_last: bool = False
    prepared: Any = None  # prepared.PreparedCopy, or None
    persistent_workers: bool = False


def _accelerator() -> bool:
    acc = getattr(torch, "accelerator", None)
    return acc.is_available() if acc is not None else torch.cuda.is_available()


def pin_memory_note(settings: Settings) -> str:
    """What ``pin_memory=True`` does on a backend that makes batches itself, for explain()."""
    if not settings.pin_memory:
        return ""
    if settings.device == "gpu":
        return "pin_memory: nothing to pin, the batches are made on the GPU"
    if _accelerator():
        return "pin_memory: each batch is copied to pinned host memory, as torch's DataLoader does"
    return "pin_memory: no accelerator, so nothing is pinned (torch's DataLoader warns the same)"


def pinning(settings: Settings):
    """A function that pins a CPU batch where torch's DataLoader would (``pin_memory=True``, batches on the
    CPU, an accelerator present), else None; without an accelerator it warns as torch does."""
    if not settings.pin_memory or settings.device == "gpu":
        return None
    if not _accelerator():
        warnings.warn("'pin_memory' argument is set as true but no accelerator is found, then device pinned memory "
                      "won't be used.", stacklevel=5)
        return None
    from torch.utils.data._utils.pin_memory import pin_memory

    return pin_memory


@dataclasses.dataclass
class Sampling:
    """One epoch's sampling, as the face hands it to a backend: torch's index sampler (iterated as
    torch's iterator iterates it), the loader's generator, its ``len()`` (a function: an iterable dataset
    may have none) and ``torch_iter(pin=False)``, torch's own iterator over the loader (the torchvision
    backend's); ``pin``: its batches pinned in torch's pin-memory thread whatever the loader's ``pin_memory``.
    ``collate``: the loader's ``collate_fn`` as it is now (None: torch's default), which torch's iterator reads
    when it is made."""

    index_sampler: Any
    generator: Optional[torch.Generator]
    length: Callable[[], int]
    torch_iter: Callable
    collate: Optional[Callable] = None
    seeds: Optional[state.BaseSeeds] = None  # the loader's (persistent workers: one base seed drawn, the first)

    def base_seed(self) -> int:
        """This epoch's iterator's base seed, drawn (or not) as torch's iterator draws it."""
        return self.seeds.take(self.generator) if self.seeds is not None else state.draw_base_seed(self.generator)


class EpochIterator:
    """One pass over the sampler. Subclasses implement ``_next()`` (the next batch, or StopIteration)
    and may override ``random_state()``; this base restores a saved position's random state, counts
    the batches handed out, and tags errors with the torchrun rank."""

    def __init__(self, sampling: Sampling, resume: Optional[state.Position]):
        self.length = sampling.length
        if resume is not None:
            state.set_rng_state(sampling.generator, resume.rng)
            if sampling.seeds is not None:
                sampling.seeds.restore(resume.seeds)
        self.rng_start = state.rng_state(sampling.generator)
        self.seeds_start = sampling.seeds.state() if sampling.seeds is not None else None
        self.yielded, self.done = 0, False
        self.resumed_at = 0  # the place in the epoch of its first sample (a saved position's batches passed over)
        self.stage_rng: Optional[torch.Tensor] = None  # the stages' own CPU generator (``own_stage_rng``), if any
        self.skipped: list = [] if resume is None else [BadSampleError(*s) for s in resume.skipped]
        self.pin = None  # a backend that makes CPU batches itself sets pinning(settings)

    def resume_at(self, batches, resume: Optional[state.Position]):
        """Advance ``batches`` (index batches, nothing loaded) past those the saved iterator handed out,
        and give the batched stage's draws the global RNG they had then."""
        if resume is not None:
            self.resumed_at = state.skip_batches(batches, resume.batches)
            self.yielded = resume.batches
            if resume.rng_now is not None:
                self.restore_stage_rng(resume.rng_now)
        return batches

    def own_stage_rng(self, base_seed: int, num_workers: int) -> None:
        """With ``num_workers > 0`` torch draws the transforms and the collate_fn in its workers, each seeded from
        the epoch's base seed, and its global generator keeps only the loop's draws and the sampler's: the stages
        this iterator runs on its batches (and the collate_fn) then draw from a CPU generator of its own, seeded
        from ``base_seed``. With none, from torch's global generator, as torch's draw in the loop's process."""
        self.stage_rng = torch.Generator().manual_seed(base_seed).get_state() if num_workers > 0 else None

    def stage_random_state(self) -> torch.Tensor:
        """The state of the generator the stages draw from (torch's global one, or the iterator's own)."""
        return torch.get_rng_state() if self.stage_rng is None else self.stage_rng.clone()

    def restore_stage_rng(self, value: torch.Tensor):
        """Where the stages' draws stood at a saved position."""
        if self.stage_rng is None:
            torch.set_rng_state(value)
        else:
            self.stage_rng = value.clone()

    def on_stage_rng(self, fn, *args, **kw):
        """``fn(*args, **kw)`` with the stages' generator: the iterator's own where it has one (swapped in for
        torch's global CPU generator, which is left as it was), else torch's global one."""
        if self.stage_rng is None:
            return fn(*args, **kw)
        outer = torch.get_rng_state()
        torch.set_rng_state(self.stage_rng)
        try:
            return fn(*args, **kw)
        finally:
            self.stage_rng = torch.get_rng_state()
            torch.set_rng_state(outer)

    def __iter__(self):
        return self

    def __len__(self) -> int:
        return self.length()

    def random_state(self) -> tuple:
        """(DALI checkpoint, the batched stage's CPU generator: torch's global one, or the iterator's own) after
        the batches handed out so far."""
        return None, None

    def _next(self):
        raise NotImplementedError

    def __next__(self):
        try:
            batch = self._next()
        except StopIteration:
            self.done = True
            raise
        except Exception as e:
            raise tagged_with_rank(e)
        self.yielded += 1
        return self.pin(batch) if self.pin is not None else batch

    def position(self) -> state.Position:
        skipped = [(e.index, e.path, e.reason) for e in self.skipped]
        return state.Position(self.rng_start, self.yielded, skipped, *self.random_state(), seeds=self.seeds_start)


class Backend:
    """How a loader's batches are made. ``name`` is what ``DataLoader.backend`` says; ``reason`` why a
    faster backend was not taken; ``plan`` the compiled chain where there is one."""

    name = ""
    plan = None
    reason = ""
    origin = ""  # how the dataset's samples were found, for explain()

    def iterator(self, sampling: Sampling, resume: Optional[state.Position]) -> EpochIterator:
        raise NotImplementedError

    def explain(self) -> str:
        raise NotImplementedError

    def fallback(self) -> Optional[str]:
        """The one-line FallbackWarning of this backend, or None: what runs as torchvision runs it."""
        return None

    def close(self) -> None:
        """Release threads, processes and pipelines now (a later iteration starts them again)."""


def tagged_with_rank(err: Exception) -> Exception:
    """Under torchrun, a loader's error says which rank raised it (the others then stop at their
    next collective: torchrun ends them when this process exits)."""
    tag = rank_tag()
    if tag and err.args and isinstance(err.args[0], str) and tag not in err.args[0]:
        err.args = (f"[{tag}] {err.args[0]}",) + err.args[1:]
    return err


def is_sharded(sampler, depth: int = 3) -> bool:
    """Whether a sampler (or one it wraps) hands each rank its own part: DistributedSampler,
    Lightning's wrappers of it, Accelerate's BatchSamplerShard."""
    if sampler is None or depth == 0:
        return False
    if isinstance(sampler, tud.distributed.DistributedSampler) or hasattr(sampler, "num_replicas") \
            or hasattr(sampler, "num_processes"):
        return True
    return any(is_sharded(getattr(sampler, a, None), depth - 1) for a in ("sampler", "batch_sampler"))


def unsharded_warning(sampler, batch_sampler) -> Optional[str]:
    """The UnshardedWarning's text when torch.distributed runs several ranks over an unsharded sampler."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    world = dist.get_world_size()
    if world < 2 or is_sharded(sampler) or is_sharded(batch_sampler):
        return None
    return (f"gputransforms: torch.distributed runs {world} ranks but this DataLoader's sampler is not "
            f"distributed, so rank {dist.get_rank()} gets every sample of every epoch: pass "
            "sampler=DistributedSampler(dataset) and call sampler.set_epoch(epoch) each epoch (Lightning "
            "and Accelerate inject one themselves)")

