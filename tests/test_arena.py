"""Worker pieces through shared memory (backends/arena.py): the same bytes as through torch's pipe, the
ring's space reused in order, a piece without room sent through the pipe, an epoch that starts over
freeing what the last one left unread; and a segmentation loader whose workers use it gives exactly
what the same loader gives through the pipe."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch
import torchvision
from presets import SegmentationPresetTrain, segmentation_collate

from gputransforms import DataLoader, sampledata
from gputransforms.backends import arena
from gputransforms.datasets import pickled
from gputransforms.datasets.pickled import ArraysApart

DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("gpu", id="gpu", marks=pytest.mark.gpu)]
pytestmark = pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm")


def _piece(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def _in_ring(x) -> bool:
    return isinstance(x, tuple) and len(x) == 6 and x[0] == arena._TAG


def test_pieces_come_back_as_they_went():
    rings = arena.Rings(2, size=1 << 20)
    assert rings, "no shared memory for the rings"
    big, small = _piece(arena.LARGE, 0), _piece(100, 1)
    items = [(0, (big, small), None, ("image", big.tobytes())), (1, None, ("x", "y", "z"))]
    sent = rings.stash(1, 1, items)
    assert _in_ring(sent[0][1][0]) and _in_ring(sent[0][3][1]) and sent[0][1][1] is small  # small: as is
    back = rings.unstash(sent)
    assert isinstance(back[0][1][0], np.ndarray) and np.array_equal(back[0][1][0], big)
    assert type(back[0][3][1]) is bytes and back[0][3][1] == big.tobytes()
    assert back[1] == items[1] and rings.taken == 2
    # a pickled extra (a recorded target) comes back loaded, straight from the ring
    target = {"masks": np.arange(arena.LARGE, dtype=np.int32).reshape(64, -1), "image_id": 3}
    pickled = ArraysApart.dumps(target)
    sent = rings.stash(0, 1, [(2, (small,), None, ("tensor", pickled))])
    assert _in_ring(sent[0][3][1])
    loaded = rings.unstash(sent)[0][3][1]
    assert loaded["image_id"] == 3 and np.array_equal(loaded["masks"], target["masks"])
    rings.close()


def test_pieces_start_aligned_and_a_pickle_loads_in_place():
    """Each piece starts on a multiple of 64 bytes (a ring whose size is none), so a pickled target's
    arrays (64-aligned in the pickle) can be viewed as their dtype where they are: ``load(IN_PLACE)``."""
    rings = arena.Rings(1, size=32 * arena.LARGE + 100)
    assert rings.cap % 64 == 0
    target = {"masks": np.arange(arena.LARGE, dtype=np.int32).reshape(64, -1), "image_id": 3}
    sent = [rings.stash(0, 1, [p])[0] for p in (_piece(arena.LARGE + 3, 0), ArraysApart.dumps(target),
                                                _piece(arena.LARGE + 61, 1), ArraysApart.dumps(target))]
    assert all(_in_ring(s) and s[2] % 64 == 0 for s in sent)
    view = np.frombuffer(rings.maps[0], np.uint8, count=sent[3][3], offset=arena._HEADER + sent[3][2])
    loaded = pickled.load(view, pin=pickled.IN_PLACE)
    assert isinstance(loaded["masks"], torch.Tensor) and loaded["masks"].dtype == torch.int32
    assert torch.equal(loaded["masks"], torch.from_numpy(target["masks"]))
    assert np.shares_memory(loaded["masks"].numpy(), np.frombuffer(rings.maps[0], np.uint8))  # no copy
    del loaded, view
    assert not rings.register()  # (no CUDA here, or not asked for: pieces are copied out as before)
    rings.close()


def test_held_pieces_are_read_where_they_are_until_released():
    """unstash(hold=True): an encoded file comes back as a view of the ring (DALI reads it there) and the
    ring is not marked read, so the worker cannot write over it, until release(); a pickled target is
    loaded at once either way."""
    rings = arena.Rings(1, size=4 * arena.LARGE)
    pieces = [_piece(arena.LARGE + 100, k) for k in range(3)]
    target = ArraysApart.dumps({"masks": np.ones((8, arena.LARGE // 8), np.uint8)})
    sent = [rings.stash(0, 1, [p])[0] for p in pieces[:2]] + [rings.stash(0, 1, [target])[0]]
    assert all(_in_ring(s) for s in sent)
    back, marks = rings.unstash(sent, hold=True)
    assert np.array_equal(back[0], pieces[0]) and np.array_equal(back[1], pieces[1])
    assert np.shares_memory(back[0], np.frombuffer(rings.maps[0], np.uint8))  # no copy
    assert back[2]["masks"].sum() == arena.LARGE
    assert not _in_ring(rings.stash(0, 1, [pieces[2]])[0])  # still held: no room
    rings.release(marks)
    assert _in_ring(rings.stash(0, 1, [pieces[2]])[0])
    del back
    rings.close()


def test_the_ring_wraps_and_a_piece_without_room_takes_the_pipe():
    rings = arena.Rings(1, size=8 * arena.LARGE)
    pieces = [_piece(arena.LARGE + 1000, k) for k in range(12)]
    outs = [rings.stash(0, 1, [p])[0] for p in pieces[:10]]
    # seven fit before any is read; then no room: through the pipe, as they were
    assert [_in_ring(o) for o in outs] == [True] * 7 + [False] * 3
    assert all(o is p for o, p in zip(outs[7:], pieces[7:]))
    for o, p in zip(outs[:3], pieces[:3]):  # three read: their space is free again
        assert np.array_equal(rings.unstash([o])[0], p)
    wrapped = rings.stash(0, 1, [pieces[10]])[0]
    assert _in_ring(wrapped) and wrapped[2] == 0  # at the ring's start (its end left unused)
    for o, p in zip(outs[3:7] + [wrapped], pieces[3:7] + [pieces[10]]):
        assert np.array_equal(rings.unstash([o])[0], p)
    # a new epoch: what the last one left unread (torch drops it when an epoch starts over) is free again
    full = arena.Rings(1, size=8 * arena.LARGE)
    assert [_in_ring(full.stash(0, 1, [p])[0]) for p in pieces[:8]][-1] is False
    assert not _in_ring(full.stash(0, 1, [pieces[8]])[0])
    again = full.stash(0, 2, [pieces[9]])[0]
    assert _in_ring(again) and np.array_equal(full.unstash([again])[0], pieces[9])
    rings.close()
    full.close()


def test_a_ring_read_while_written_gives_every_piece_in_order():
    rings = arena.Rings(1, size=6 * arena.LARGE)
    rng = np.random.default_rng(3)
    pending, expected, through_pipe = [], [], 0
    for k in range(300):
        p = _piece(int(rng.integers(arena.LARGE, 2 * arena.LARGE)), k)
        out = rings.stash(0, 1, [p])[0]
        through_pipe += not _in_ring(out)
        pending.append(out)
        expected.append(p)
        if rng.random() < 0.5:  # the main thread takes what has come, in order
            for o, e in zip(pending, expected):
                assert np.array_equal(rings.unstash([o])[0], e)
            pending, expected = [], []
    assert rings.taken > 150 and through_pipe > 0
    rings.close()


@pytest.fixture(scope="module")
def voc(photo_folder, tmp_path_factory):
    return sampledata.write_voc(photo_folder, tmp_path_factory.mktemp("voc"), seed=4)


@pytest.mark.parametrize("device", DEVICES)
def test_a_loaders_workers_hand_over_through_the_rings_as_through_the_pipe(voc, monkeypatch, device):
    """On the GPU, the masks that came through the rings were copied to the device from the rings
    themselves (registered with CUDA); those through the pipe took one pinned buffer: the batches are the
    same."""
    ds = torchvision.datasets.wrap_dataset_for_transforms_v2(torchvision.datasets.VOCSegmentation(
        str(voc), year="2012", image_set="train", transforms=SegmentationPresetTrain(base_size=160, crop_size=144)))

    def epochs(**patch):
        for k, v in patch.items():
            monkeypatch.setattr(arena, k, v)
        loader = DataLoader(ds, batch_size=8, collate_fn=segmentation_collate, device=device, num_workers=2,
                            shuffle=True)
        torch.manual_seed(11)
        out = [[(x.clone(), m.clone()) for x, m in loader] for _ in range(2)]
        it = iter(loader)  # an epoch left after one batch: its unread pieces must not block the next
        next(it)
        del it
        out.append([(x.clone(), m.clone()) for x, m in loader])
        rings = loader._backend.idle[0].decoders.rings
        return out, rings.taken if rings else 0, bool(rings and rings.registered)

    # every piece from 1 KB on through small rings (wrapping, some pieces through the pipe), against none
    ring_out, taken, in_place = epochs(LARGE=1024, RING=256 * 1024)
    pipe_out, none, _ = epochs(LARGE=1024, RING=0)
    assert taken > 50 and none == 0
    # on the GPU the rings are page-locked and the masks copied to the device from where the workers wrote
    # them: the ring's space is reused only once those copies have run (or the masks would differ below)
    assert in_place == (device == "gpu")
    for ours, theirs in zip(ring_out, pipe_out):
        assert len(ours) == len(theirs) == 6
        for (x, m), (xp, mp) in zip(ours, theirs):
            assert m.dtype == mp.dtype == torch.int64 and m.device.type == ("cuda" if device == "gpu" else "cpu")
            assert torch.equal(m, mp) and torch.equal(x, xp)


def test_large_arrays_travel_beside_the_pickle():
    """pickled: arrays from APART bytes on are left out of the pickle and put after it; each comes back
    with its values, dtype and shape, in memory of its own (the buffer, a ring's, is reused at once)."""
    rng = np.random.default_rng(0)
    obj = {"mask": rng.integers(0, 255, (1, 300, 301), dtype=np.uint8), "wide": rng.random((70, 90)),
           "small": np.arange(10), "strided": np.zeros((200, 200), np.int32)[:, ::2], "n": 3}
    data = bytearray(ArraysApart.dumps(obj))
    stream = int.from_bytes(bytes(data[:8]), "little")
    assert stream < 2000 + obj["strided"].nbytes  # the two large contiguous arrays are not in the pickle
    back = pickled.load(data)
    data[:] = bytes(len(data))  # the buffer reused: nothing loaded may change
    assert list(back) == list(obj) and back["n"] == 3
    for key in ("mask", "wide", "small", "strided"):
        assert back[key].dtype == obj[key].dtype and np.array_equal(back[key], obj[key]), key
        assert back[key].flags.writeable, key


@pytest.mark.gpu
def test_pinned_masks_and_paged_ones_reach_the_device_together():
    """device._together with masks loaded into pinned memory (pickled.load(pin=True)), pageable ones, and
    masks held narrow (WIDEN) among them: each arrives with its values, dtype, type and attributes."""
    from torchvision import tv_tensors

    from gputransforms.datasets.detection import _pickled
    from gputransforms.device import to_device

    gen = torch.Generator().manual_seed(1)
    targets = [{"masks": tv_tensors.Mask(torch.randint(0, 21, (1, 200 + k, 190), generator=gen)),  # int64: narrowed
                "boxes": tv_tensors.BoundingBoxes(torch.rand(2, 4, generator=gen) * 50, format="XYXY",
                                                  canvas_size=(200 + k, 190)),
                "raw": torch.randint(0, 255, (200, 200), dtype=torch.uint8, generator=gen)} for k in range(5)]
    loaded = [pickled.load(_pickled(t), pin=k % 2 == 0) for k, t in enumerate(targets)]
    assert loaded[0]["raw"].is_pinned() and not loaded[1]["raw"].is_pinned()
    moved = to_device(loaded, torch.device("cuda"))
    torch.cuda.synchronize()
    for t, m in zip(targets, moved):
        for key in t:
            assert type(m[key]) is type(t[key]) and m[key].dtype == t[key].dtype, key
            assert m[key].is_cuda and torch.equal(m[key].cpu(), t[key]), key
            assert m[key].__dict__ == t[key].__dict__, key


def test_together_orders_pinned_and_paged_tensors_back_to_their_own(monkeypatch):
    """device._together's branch for tensors already pinned, on the CPU (their pinning stood in for): pinned
    and pageable tensors of one dtype share one buffer, each comes back with its own values; masks held
    narrow (WIDEN) come back their dtype, type and attributes, without the mark."""
    from torchvision import tv_tensors

    from gputransforms.device import WIDEN, _together

    gen = torch.Generator().manual_seed(0)
    plain = [torch.randint(0, 20, (5, 7), dtype=torch.uint8, generator=gen) for _ in range(4)]
    masks = [tv_tensors.Mask(torch.randint(0, 20, (3, 4 + k), dtype=torch.uint8, generator=gen)) for k in range(3)]
    for m in masks:
        m.__dict__[WIDEN] = torch.int64
    marked = {id(plain[1]), id(plain[3]), id(masks[0])}
    monkeypatch.setattr(torch.Tensor, "is_pinned", lambda self: id(self) in marked)
    moved = _together(plain + masks, torch.device("cpu"))
    for t in plain:
        assert moved[id(t)].dtype == torch.uint8 and torch.equal(moved[id(t)], t)
    for m in masks:
        back = moved[id(m)]
        assert type(back) is tv_tensors.Mask and back.dtype == torch.int64 and torch.equal(back, m.to(torch.int64))
        assert WIDEN not in back.__dict__


def test_ring_space_a_batch_viewed_in_place_is_released_only_after_its_copies(monkeypatch):
    """ProcessEpochFeed: each fed batch's ring marks are released ``lookahead`` batches later, and where its
    targets viewed the rings in place (registered rings), only after the event recorded behind that batch's
    copies to the device has passed (``copied``); a batch fed but not yet handed out gets no event."""
    import collections
    import types

    from gputransforms.backends import feed

    log = []

    class Event:
        def record(self, stream=None):
            log.append(("record", self))

        def synchronize(self):
            log.append(("sync", self))

    class FakeRings:
        registered, last_copy = [1], None

        def unstash(self, items, hold):
            return items, {"batch": items}

        def release(self, marks):
            log.append(("release", marks["batch"]))

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda dev=None: None)
    ep = feed.ProcessEpochFeed.__new__(feed.ProcessEpochFeed)
    ep.held, ep.decoders = collections.deque(), types.SimpleNamespace(rings=FakeRings(), lookahead=2)
    batches = [[k] for k in range(5)]
    for b in batches[:3]:
        ep._from_rings(b)
        ep.held[-1].kept = b  # (next_encoded's kept indices)
    assert log == [("release", [0])]  # batch 0 was never handed out: nothing to wait for
    ep.copied(batches[1], torch.device("cuda"))
    ep.copied([9], torch.device("cuda"))  # not a batch in flight: no event
    (_, event), = [e for e in log if e[0] == "record"]
    assert ep.held[0].copies is event and ep.held[1].copies is None and ep.decoders.rings.last_copy is event
    ep._from_rings(batches[3])
    assert log[-2:] == [("sync", event), ("release", [1])]


def _batches_from(flat, returned: list) -> list:
    """ProcessEpochFeed._assemble over ``flat``'s batches, its chunks ``returned`` by the workers in that order
    (each result: the chunk's place and one item per index): (batch, the indices of its items) in turn."""
    import types

    from gputransforms.backends import feed

    ep = feed.ProcessEpochFeed.__new__(feed.ProcessEpochFeed)
    ep.decoders, ep.waiting = types.SimpleNamespace(flat=flat), {}
    ep.it = iter([(seq, [("r", i) for i in idx]) for _, seq, idx in returned])
    got = []
    while True:
        batch, items = ep._assemble()
        if batch is None:
            assert not ep.waiting and not flat.pulled and not flat.starts
            return got
        got.append((batch, [i for _, i in items]))


def test_chunks_returned_out_of_order_make_the_batches_in_order():
    """ProcessEpochFeed._assemble: the workers' chunks come back as they are done (torch's in_order=False,
    set for recorded joint transforms, whose samples draw from seeds of their own); each batch is made of its
    own chunks, in the sampler's order, the chunks of later batches kept until theirs is next."""
    from gputransforms.backends import feed

    flat = feed._Flat(chunk=3)
    flat.batches = iter([list(range(0, 7)), list(range(7, 9)), list(range(9, 17))])  # 3 + 1 + 3 chunks
    chunks = list(flat)
    assert [c[1] for c in chunks] == list(range(7)) and list(flat.starts) == [(0, 3), (3, 1), (4, 3)]
    returned = [chunks[k] for k in (4, 2, 6, 0, 5, 1, 3)]  # (a worker's results: its chunk's place, one per index)
    got = _batches_from(flat, returned)
    assert got == [(list(range(0, 7)), list(range(0, 7))), ([7, 8], [7, 8]), (list(range(9, 17)), list(range(9, 17)))]
    # the loader of chunks lets them come back out of order only where it can (torch 2.6 on)
    assert "in_order" in feed._LOADER_ARGS


def test_an_epochs_first_batches_go_out_in_smaller_chunks():
    """_Flat with ``ramp``: the epoch's first batches in chunks halved once for each ramp batch still ahead
    (at least one sample), then ``chunk``; back in any order they make the same batches, in order; the loader of
    recorded samples ramps with several workers only."""
    import random
    import types

    from gputransforms.backends import feed

    flat = feed._Flat(chunk=4, ramp=2)
    batches = [list(range(8 * k, 8 * k + 8)) for k in range(4)] + [[32, 33, 34]]
    flat.batches = iter(batches)
    chunks = list(flat)
    assert [len(c[2]) for c in chunks] == [1] * 8 + [2] * 4 + [4] * 4 + [3]
    assert list(flat.starts) == [(0, 8), (8, 4), (12, 2), (14, 2), (16, 1)]
    assert [flat.size(k) for k in range(4)] == [1, 2, 4, 4] and feed._Flat(chunk=32, ramp=4).size(0) == 2
    returned = chunks[:]
    random.Random(0).shuffle(returned)
    got = _batches_from(flat, returned)
    assert got == [(b, b) for b in batches]
    samples = types.SimpleNamespace(extras=True, large_items=False, paths=[],
                                    reader=lambda **_: (lambda i: ((), None)))
    assert feed.ProcessDecoders(samples, 2, lookahead=6).flat.ramp == feed.ProcessDecoders.RAMP > 0
    assert feed.ProcessDecoders(samples, 1, lookahead=6).flat.ramp == 0


def test_a_samples_seed_gives_the_draws_torch_manual_seed_gives():
    """_Decoded._one: a sample handed out with a seed of its own (``_Flat.seed``) draws what it draws after
    ``torch.manual_seed(seed)``, whatever the generator held before (the worker seeds the CPU generator alone,
    which is all a forked worker draws from)."""
    from gputransforms.backends import feed

    def draws():
        return torch.rand(4), torch.randint(0, 1 << 20, (3,)), torch.empty(2).normal_()

    decoded = feed._Decoded(lambda i: ((), draws()), extras=True)
    for k, seed in enumerate([0, 1, 7, 2 ** 62 + 5]):
        torch.manual_seed(1000 + k)  # (a state the sample's seed must replace)
        i, inputs, err, got = decoded._one((5, seed))
        assert (i, inputs, err) == (5, (), None)
        torch.manual_seed(seed)
        want = draws()
        assert all(torch.equal(a, b) for a, b in zip(got, want)), seed


@pytest.mark.parametrize("device", DEVICES)
def test_a_chunks_masks_travel_as_one_table_through_the_ring(device):
    """A chunk's masks as one table (``pickled.Targets`` of bare targets, its ``Part`` each sample's extra): the
    worker puts the table's one column in its ring once, whatever the number of parts; held, the main thread
    reads it where it is, and the table loads each sample's mask as the mask pickled alone loads it (type,
    dtype made wide again from ``WIDEN``, values, attributes), on the device. Masks of different attributes,
    dtypes or shapes are not tabled."""
    import pickle

    from gputransforms.compiler.joint_masks import WIDEN, widened
    from gputransforms.datasets.detection import _pickled

    rng = np.random.default_rng(2)
    masks = []
    for k in range(5):
        m = torch.from_numpy(rng.integers(0, 21, (1, 120, 130), dtype=np.uint8))
        m.__dict__[WIDEN] = torch.int64
        masks.append(m)
    table = pickled.Targets.of(masks)
    assert table is not None and table.keys is None
    rings = arena.Rings(1, size=64 * arena.LARGE, pin=device == "gpu")
    parts = [pickled.Part(table, j) for j in range(5)]
    sent = rings.stash(0, 1, [(j, None, None, ("tensor", p)) for j, p in enumerate(parts)])
    sent = pickle.loads(pickle.dumps(sent))  # (torch's queue)
    column = sent[0][3][1].table.columns[0]
    assert type(column) is tuple and _in_ring(column[0])  # (in the ring, once)
    back, marks = rings.unstash(sent, hold=True)
    # (a view of the ring where the copy to the device reads it in place, registered; else a copy of its own, which
    # the targets loaded on the CPU view: the worker writes over the ring once it is marked read)
    in_place = np.shares_memory(back[0][3][1].table.columns[0], np.frombuffer(rings.maps[0], np.uint8))
    assert in_place == (device == "gpu") == bool(rings.registered)
    dev = torch.device("cuda" if device == "gpu" else "cpu")
    got = pickled.resolve([b[3][1] for b in back], dev)
    for ours, m in zip(got, masks):
        theirs = widened(pickled.load(_pickled(m)))
        assert type(ours) is type(theirs) is torch.Tensor and ours.dtype == theirs.dtype == torch.int64
        assert ours.device.type == dev.type and torch.equal(ours.cpu(), theirs) and WIDEN not in ours.__dict__
    if dev.type == "cuda":
        torch.cuda.synchronize()
    rings.release(marks)
    kept = [torchvision.tv_tensors.Mask(m.clone()) for m in masks[:3]]
    for m in kept:
        m.__dict__["note"] = "kept"
    out = pickled.Targets.of(kept).load(torch.device("cpu"))
    assert all(type(o) is torchvision.tv_tensors.Mask and o.note == "kept" and torch.equal(o, m)
               for o, m in zip(out, kept))
    other = masks[1].clone()
    assert pickled.Targets.of([masks[0], other]) is None  # (no WIDEN on the copy: other attributes)
    assert pickled.Targets.of([masks[0].as_subclass(torch.Tensor).clone(), torch.zeros(1, 120, 131, dtype=torch.uint8)]) is None
    assert pickled.Targets.of([torch.zeros(1, 2), torchvision.tv_tensors.Mask(torch.zeros(1, 2))]) is None
    rings.close()
