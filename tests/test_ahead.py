"""Reading on into the next epoch (backends/ahead.py, feed.EpochFeed.adopt): the batches read ahead are used
only where they are the ones the next iterator's sampler draws, so every epoch keeps torch's order."""
import re
import shutil
from pathlib import Path

import pytest
import torch
import torch.utils.data as tud

from gputransforms import DataLoader, SkippedSamplesWarning, datasets
from gputransforms import transforms as T
from gputransforms.backends import ahead, compiled, feed

from conftest import DEVICES, decode_index
from test_files import _bad_folder

INDEX_TF = T.Compose([T.Resize((8, 8)), T.PILToTensor()])


def _adoptions(monkeypatch, feed_class) -> list:
    """What each next epoch's iterator decided: True where it took the feed on, False where it drained it."""
    seen = []
    original = feed_class.adopt

    def adopt(self, *args, **kwargs):
        seen.append(original(self, *args, **kwargs))
        return seen[-1]

    monkeypatch.setattr(feed_class, "adopt", adopt)
    return seen


@pytest.fixture
def adoptions(monkeypatch):
    return _adoptions(monkeypatch, feed.EpochFeed)


def _indices(loader) -> list:
    return [i for images, _ in loader for i in decode_index(images)[0]]


@pytest.mark.parametrize("device", DEVICES)
def test_the_next_epochs_first_batches_are_read_ahead_and_taken_on(indexed_folder, device, adoptions):
    ds = datasets.ImageFolder(str(indexed_folder), transform=INDEX_TF)
    ours = DataLoader(ds, batch_size=5, shuffle=True, generator=torch.Generator().manual_seed(7), device=device)
    theirs = tud.DataLoader(ds, batch_size=5, shuffle=True, generator=torch.Generator().manual_seed(7))
    for _ in range(4):
        assert _indices(ours) == _indices(theirs)
    assert adoptions == [True, True, True] and "epochs: as one ends" in ours.explain()
    assert [s.ahead for s in ours._backend.idle] == [True]  # the fifth epoch's first batches are in DALI's queue
    assert _indices(ours) == _indices(theirs)


@pytest.mark.parametrize("device", DEVICES)
def test_a_loop_that_draws_from_torchs_generator_keeps_torchs_order(indexed_folder, device, adoptions):
    """Without a generator the sampler draws from torch's global one, which the loop draws from too: the batches
    read ahead are not the next epoch's, DALI's queue is drained, and the epochs are torch's all the same."""
    ds = datasets.ImageFolder(str(indexed_folder), transform=INDEX_TF)

    def run(loader) -> list:
        torch.manual_seed(11)
        epochs = []
        for _ in range(3):
            got = []
            for k, (images, _) in enumerate(loader):
                got += decode_index(images)[0]
                if k == 1:
                    torch.rand(2)  # the loop's own draw, mid-epoch
            epochs.append(got)
        return epochs

    ours = run(DataLoader(ds, batch_size=4, shuffle=True, device=device))
    assert ours == run(tud.DataLoader(ds, batch_size=4, shuffle=True))
    assert all(sorted(e) == list(range(len(ds))) for e in ours) and ours[0] != ours[1]
    assert adoptions == [False]  # then this loader reads ahead no more


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("workers", [2, 0])
def test_random_transforms_after_the_graph_draw_as_torchs_workers_do(indexed_folder, device, workers, adoptions):
    """A chain with random transforms after the graph (RandomApply of ColorJitter, RandomGrayscale, in the batched
    stage; p=0, so that the images still say their index) and a collate_fn that draws: with workers, torch draws
    them in its worker processes, each seeded from the epoch's base seed, and its global generator keeps only the
    sampler's draws. So do ours (an iterator's own generator): each epoch is read ahead and taken on, in torch's
    order. With none, torch draws them from its global generator in the loop's process, and so do ours: the
    order read ahead is not the next epoch's (dropped once), the epochs still torch's."""
    tf = T.Compose([T.Resize((8, 8)), T.RandomApply([T.ColorJitter(0.4, 0.4, 0.4, 0.1)], p=0.0),
                    T.RandomGrayscale(p=0.0), T.PILToTensor()])
    ds = datasets.ImageFolder(str(indexed_folder), transform=tf)

    def collate(batch):
        torch.rand(3)  # (a collate_fn's own draw, as MixUp's or CutMix's)
        return tud.default_collate(batch)

    def run(cls, **kw):
        torch.manual_seed(4)
        loader = cls(ds, batch_size=4, shuffle=True, num_workers=workers, collate_fn=collate, **kw)
        return [[i for images, _ in loader for i in decode_index(images.cpu())[0]] for _ in range(4)]

    ours = run(DataLoader, device=device)
    assert ours == run(tud.DataLoader)
    assert all(sorted(e) == list(range(len(ds))) for e in ours) and ours[0] != ours[1]
    assert adoptions == ([True, True, True] if workers else [False])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("own_generator", [False, True])
def test_mixup_in_the_collate_fn_and_the_samplers_generator(indexed_folder, device, own_generator, adoptions):
    """torchvision's classification reference: MixUp/CutMix in the collate_fn draw from torch's global generator
    at every batch. A sampler drawing from it too gets other orders than those read ahead (dropped once, then
    no more reading ahead, explain() says why); with a generator of its own it is read ahead every epoch. The
    orders and the mixed batches are torch's DataLoader's either way."""
    from torch.utils.data import default_collate
    from torchvision.transforms import v2

    ds = datasets.ImageFolder(str(indexed_folder), transform=T.Compose([T.Resize((8, 8)), T.ToTensor()]))
    mix = v2.RandomChoice([v2.MixUp(num_classes=3), v2.CutMix(num_classes=3)])

    def collate(batch):
        return mix(*default_collate(batch))

    def run(cls, **kw):
        torch.manual_seed(8)
        gen = dict(generator=torch.Generator().manual_seed(2)) if own_generator else {}
        loader = cls(ds, batch_size=4, shuffle=True, collate_fn=collate, **gen, **kw)
        return loader, [[(x.cpu(), y.cpu()) for x, y in loader] for _ in range(3)]

    ours, got = run(DataLoader, device=device)
    _, want = run(tud.DataLoader)
    for e, (a, b) in enumerate(zip(got, want)):
        assert len(a) == len(b), e
        for (xa, ya), (xb, yb) in zip(a, b):
            torch.testing.assert_close(ya, yb)
            torch.testing.assert_close(xa, xb, atol=1 / 255 + 1e-6, rtol=0)
    assert adoptions == ([True, True] if own_generator else [False])
    assert ("no longer read ahead" in ours.explain()) is not own_generator


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("set_epoch", [True, False])
def test_distributed_sampler_read_ahead_for_its_next_epoch(indexed_folder, device, set_epoch, adoptions):
    ds = datasets.ImageFolder(str(indexed_folder), transform=INDEX_TF)
    sampler = tud.distributed.DistributedSampler(ds, num_replicas=2, rank=1, shuffle=True, seed=3)
    loader = DataLoader(ds, batch_size=2, sampler=sampler, device=device)
    for epoch in range(3):
        if set_epoch:
            sampler.set_epoch(epoch)
        assert _indices(loader) == list(iter(sampler))
    # the sampler's next epoch is the one after its own: a loop that never calls set_epoch misses once
    assert adoptions == ([True, True] if set_epoch else [False])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("where", ["first", "third"])
def test_a_bad_file_in_the_batches_read_ahead_is_met_by_its_own_epoch(tmp_path, photo_folder, device, where,
                                                                       adoptions, monkeypatch):
    """With on_error="skip" a file read ahead (where a bad one raises) is not recorded by the epoch before.
    In a batch already fed to DALI ("first"), the epoch before ends as it would (what DALI holds beyond it
    drained) and the next one starts anew; in one still being read ("third"), the next epoch takes the feed on
    and reads that batch again, skipping the file. Either way each epoch records and reports it once."""
    worked_out, failed = [], []

    def next_epoch(*args):
        worked_out.append(ahead.next_epoch(*args))
        return worked_out[-1]

    ended = compiled.CompiledIterator._ended_ahead

    def ended_ahead(self):
        failed.append(self.epoch.spec_failed)
        return ended(self)

    monkeypatch.setattr(compiled, "next_epoch", next_epoch)
    monkeypatch.setattr(compiled.CompiledIterator, "_ended_ahead", ended_ahead)
    root, bad = _bad_folder(tmp_path, photo_folder, "garbage")
    if where == "first":
        bad = bad.rename(root / "a" / "0_bad.jpg")
    ds = datasets.ImageFolder(str(root), transform=T.Compose([T.Resize((32, 32)), T.ToTensor()]))
    index = [p for p, _ in ds.samples].index(str(bad))
    # (four batches an epoch, four read ahead)
    loader = DataLoader(ds, batch_size=2, device=device, on_error="skip", prefetch_factor=2)
    for _ in range(3):
        with pytest.warns(SkippedSamplesWarning, match=str(bad)):
            labels = torch.cat([y.cpu() for _, y in loader]).tolist()
        assert [e.index for e in loader.skipped] == [index]
        assert labels == [t for i, t in enumerate(ds.targets) if i != index]
    # each epoch read the next one's first four batches ahead, the bad file among them
    assert len(worked_out) == 3 and all(len(b) == 4 and any(index in x for x in b) for _, b in worked_out)
    if where == "first":
        assert failed == [True] * 3 and adoptions == [] and not loader._backend.ahead_missed  # (reads ahead on)
    else:
        assert failed == [] and adoptions == [True, True]


@pytest.mark.parametrize("device", DEVICES)
def test_an_epoch_whose_last_batches_are_all_skipped_ends_before_the_next_ones(tmp_path, photo_folder, device,
                                                                              adoptions):
    """With on_error="skip" an epoch whose last batches hold only bad files feeds none of them: what DALI holds
    after its last good batch is the next epoch's, which this epoch must not hand out."""
    photos = sorted(photo_folder.rglob("*.jpg"))
    for c, n in (("a", 8), ("b", 4)):
        (tmp_path / c).mkdir()
        for k, p in enumerate(photos[:n]):
            shutil.copy(p, tmp_path / c / f"{k}.jpg")
    for k in range(4):  # two whole batches of bad files, sorted last
        (tmp_path / "b" / f"z{k}.jpg").write_bytes(b"not a jpeg")
    ds = datasets.ImageFolder(str(tmp_path), transform=T.Compose([T.Resize((32, 32)), T.ToTensor()]))
    bad = sorted(i for i, (p, _) in enumerate(ds.samples) if "/z" in p)
    # (four batches read ahead: the next epoch's first four are good ones)
    loader = DataLoader(ds, batch_size=2, device=device, on_error="skip", prefetch_factor=2)
    for _ in range(3):
        with pytest.warns(SkippedSamplesWarning):
            labels = torch.cat([y.cpu() for _, y in loader]).tolist()
        assert labels == [t for i, t in enumerate(ds.targets) if i not in bad]
        assert sorted(e.index for e in loader.skipped) == bad
    assert adoptions == [True, True]


@pytest.mark.parametrize("device", DEVICES)
def test_a_loop_that_stops_after_len_batches_is_read_ahead(indexed_folder, device, adoptions):
    """Lightning's loop takes ``len(loader)`` batches and never asks for the StopIteration, keeping the iterator
    while it makes the next one: the slot goes back with the last batch, the next epoch takes it on, and a
    position saved after the last batch is the one before (all its batches out, DALI's state after them)."""
    ds = datasets.ImageFolder(str(indexed_folder), transform=INDEX_TF)
    ours = DataLoader(ds, batch_size=5, shuffle=True, generator=torch.Generator().manual_seed(4), device=device)
    theirs = tud.DataLoader(ds, batch_size=5, shuffle=True, generator=torch.Generator().manual_seed(4))
    kept = []
    for _ in range(3):
        it = iter(ours)
        got = [i for _ in range(len(ours)) for i in decode_index(next(it)[0])[0]]
        assert got == _indices(theirs)
        kept.append(it)  # alive while the next epoch starts
    saved = ours.state_dict()
    assert saved["batches_yielded"] == len(ours) and saved["global_rng"] is not None
    assert adoptions == [True, True] and len(ours._backend.idle) == 1
    with pytest.raises(StopIteration):
        next(kept[-1])


def _state_after_two_batches(loader) -> dict:
    it = iter(loader)
    next(it), next(it)
    return loader.state_dict()


@pytest.mark.parametrize("device", DEVICES)
def test_a_state_loaded_between_epochs_drops_the_batches_read_ahead(indexed_folder, device):
    ds = datasets.ImageFolder(str(indexed_folder), transform=INDEX_TF)

    def make():
        return DataLoader(ds, batch_size=5, shuffle=True, generator=torch.Generator().manual_seed(3), device=device)

    want = _indices(make())
    saved = _state_after_two_batches(make())
    loader = make()
    _indices(loader)  # a whole epoch: its pipeline runs on into the next one's first batches
    assert [s.ahead for s in loader._backend.idle] == [True]
    loader.load_state_dict(saved)
    assert _indices(loader) == want[10:]


def test_next_epoch_draws_nothing_and_knows_only_torchs_samplers(indexed_folder):
    ds = datasets.ImageFolder(str(indexed_folder), transform=INDEX_TF)
    gen = torch.Generator().manual_seed(5)
    batches = tud.BatchSampler(tud.RandomSampler(ds, generator=gen), 4, False)
    torch.manual_seed(2)
    before, global_before = gen.get_state(), torch.get_rng_state()
    got = ahead.next_epoch(batches, gen, 3)
    assert torch.equal(gen.get_state(), before) and torch.equal(torch.get_rng_state(), global_before)
    base = torch.empty((), dtype=torch.int64).random_(generator=gen).item()  # the iterator's base seed, then the order
    assert got == (base, list(iter(batches))[:3])

    class Counting(tud.RandomSampler):  # a sampler of the user's own: it may keep state between passes
        pass

    assert ahead.next_epoch(tud.BatchSampler(Counting(ds), 4, False), None, 3) is None
    assert ahead.next_epoch([[0, 1], [2]], None, 3) is None
    assert ahead.next_epoch(tud.BatchSampler(tud.SequentialSampler(ds), 4, False), None, 2)[1] == [[0, 1, 2, 3],
                                                                                                  [4, 5, 6, 7]]


# --- the detection workers' path (feed.ProcessEpochFeed): a recorded joint transform, samples seeded one by one ---

@pytest.fixture(scope="module")
def coco(photo_folder, tmp_path_factory):
    pytest.importorskip("pycocotools")
    from gputransforms import sampledata

    return sampledata.write_coco(photo_folder, tmp_path_factory.mktemp("coco"), seed=2)


def _detection(coco):
    """The detection reference's way (wrapped for v2, the images without annotations left out) with a random
    joint chain of same-size outputs."""
    import torchvision
    from torchvision.transforms import v2

    chain = v2.Compose([v2.ToImage(), v2.RandomHorizontalFlip(), v2.ScaleJitter((48, 64), antialias=True),
                        v2.RandomCrop((48, 64), pad_if_needed=True), v2.ToDtype(torch.float32, scale=True),
                        v2.SanitizeBoundingBoxes()])
    ds = torchvision.datasets.CocoDetection(str(coco[0]), str(coco[1]), transforms=chain)
    ds = torchvision.datasets.wrap_dataset_for_transforms_v2(ds, target_keys=["boxes", "labels", "image_id"])
    return tud.Subset(ds, [i for i, img_id in enumerate(ds.ids) if ds.coco.getAnnIds(imgIds=img_id)])


def _pairs(batch):
    return tuple(zip(*batch))


def _epochs(loader, n: int, draw_between: bool = False) -> list:
    """Per epoch: (image ids, images, boxes, labels) in the order the loader gave them."""
    out = []
    for _ in range(n):
        ids, images, boxes, labels = [], [], [], []
        for ims, targets in loader:
            ids += [t["image_id"] for t in targets]
            images += [im.cpu() for im in ims]
            boxes += [t["boxes"].cpu() for t in targets]
            labels += [t["labels"].cpu() for t in targets]
        out.append((ids, images, boxes, labels))
        if draw_between:
            torch.rand(2)  # the loop's own draw from torch's generator, after the epoch was read ahead
    return out


@pytest.fixture
def process_adoptions(monkeypatch):
    return _adoptions(monkeypatch, feed.ProcessEpochFeed)


@pytest.mark.parametrize("device", DEVICES)
def test_detection_workers_read_the_next_epoch_ahead(coco, device, process_adoptions, monkeypatch):
    """The workers record the next epoch's first batches as an epoch ends; each later epoch takes them on, and
    gives what the same loader gives without reading ahead (the same samples, draws, boxes and labels), in the
    order of torch's DataLoader."""
    ds = _detection(coco)

    def loader():
        return DataLoader(ds, batch_size=4, shuffle=True, num_workers=2, generator=torch.Generator().manual_seed(5),
                          collate_fn=_pairs, device=device)

    ahead_epochs = _epochs(loader(), 4)
    assert process_adoptions == [True, True, True]
    monkeypatch.setattr(compiled.CompiledGraph, "reads_ahead", lambda self, sampling: None)
    plain_epochs = _epochs(loader(), 4)
    assert process_adoptions == [True, True, True]  # (none read ahead: nothing to take on)
    torch_ids = [[t["image_id"] for _, targets in tud.DataLoader(ds, batch_size=4, shuffle=True, collate_fn=_pairs,
                                                                  generator=g) for t in targets]
                 for g in [torch.Generator().manual_seed(5)] for _ in range(4)]
    for (ids, images, boxes, labels), (ids2, images2, boxes2, labels2), theirs in zip(ahead_epochs, plain_epochs,
                                                                                      torch_ids):
        assert ids == ids2 == theirs and sorted(ids) == sorted(set(ids))
        assert all(torch.equal(a, b) for a, b in zip(images, images2))
        assert all(torch.equal(a, b) for a, b in zip(boxes, boxes2))
        assert all(torch.equal(a, b) for a, b in zip(labels, labels2))
    assert ahead_epochs[0][0] != ahead_epochs[1][0]
    assert not all(torch.equal(a, b) for a, b in zip(ahead_epochs[0][2], ahead_epochs[1][2]))


@pytest.mark.parametrize("device", DEVICES)
def test_detection_workers_drop_what_the_loop_made_wrong(coco, device, process_adoptions):
    """Without a generator the sampler draws from torch's global one, which the loop draws from between epochs:
    the batches the workers read ahead are not the next epoch's, they are dropped, and the epochs keep torch's
    order (its DataLoader with workers, whose main process draws what ours does) and every sample once."""
    ds = _detection(coco)
    torch.manual_seed(11)
    ours = _epochs(DataLoader(ds, batch_size=4, shuffle=True, num_workers=2, collate_fn=_pairs, device=device), 3,
                   draw_between=True)
    torch.manual_seed(11)
    theirs = [e[0] for e in _epochs(tud.DataLoader(ds, batch_size=4, shuffle=True, num_workers=2, collate_fn=_pairs),
                                    3, draw_between=True)]
    assert [e[0] for e in ours] == theirs and all(sorted(e) == sorted(theirs[0]) for e in theirs)
    assert theirs[0] != theirs[1]
    assert process_adoptions == [False]  # then this loader reads ahead no more


@pytest.mark.parametrize("device", DEVICES)
def test_detection_bad_file_in_the_batches_read_ahead_is_met_by_its_own_epoch(tmp_path, coco, device,
                                                                               process_adoptions):
    """With on_error="skip", a file PIL cannot open in the first batch, which the workers read ahead as each epoch
    ends: the epoch before does not record it, the next one starts anew and skips and reports it, once an
    epoch; every other sample comes once an epoch."""
    shutil.copytree(coco[0], tmp_path / "images")
    ds = _detection((tmp_path / "images", coco[1]))
    bad = tmp_path / "images" / ds.dataset.coco.loadImgs(ds.dataset.ids[ds.indices[0]])[0]["file_name"]
    bad.write_bytes(b"not an image at all")
    loader = DataLoader(ds, batch_size=4, num_workers=2, collate_fn=_pairs, device=device, on_error="skip")
    want = [ds.dataset.ids[i] for i in ds.indices[1:]]
    for _ in range(3):
        with pytest.warns(SkippedSamplesWarning, match=str(bad)):
            got = [t["image_id"] for _, targets in loader for t in targets]
        assert got == want and [e.index for e in loader.skipped] == [0]
    assert process_adoptions == [] and not loader._backend.ahead_missed  # (failed ahead, not missed: reads ahead on)


@pytest.mark.parametrize("device", DEVICES)
def test_detection_samples_seeded_as_their_epoch_would_seed_them(coco, device, process_adoptions, monkeypatch):
    """Each sample read ahead draws from the seed the next iterator takes from the loader's generator: where
    that generator is drawn from between epochs, and the sampler's own is not (the same order), the batches
    read ahead are dropped and the epochs are what they are without reading ahead."""
    ds = _detection(coco)

    def epochs():
        loader_gen, order_gen = torch.Generator().manual_seed(1), torch.Generator().manual_seed(2)
        loader = DataLoader(ds, batch_size=4, sampler=tud.RandomSampler(ds, generator=order_gen), num_workers=2,
                            generator=loader_gen, collate_fn=_pairs, device=device)
        out = []
        for _ in range(3):
            out.append(_epochs(loader, 1)[0])
            torch.rand(1, generator=loader_gen)  # the next iterator's base seed is another than the one worked out
        return out

    ahead_epochs = epochs()
    assert process_adoptions == [False]
    monkeypatch.setattr(compiled.CompiledGraph, "reads_ahead", lambda self, sampling: None)
    for (ids, images, boxes, _), (ids2, images2, boxes2, _) in zip(ahead_epochs, epochs()):
        assert ids == ids2
        assert all(torch.equal(a, b) for a, b in zip(images, images2))
        assert all(torch.equal(a, b) for a, b in zip(boxes, boxes2))


@pytest.mark.parametrize("device", DEVICES)
def test_detection_epochs_draw_anew_with_a_fixed_seed(coco, device):
    """With DataLoader(seed=...) the samples its workers record still draw from each epoch's base seed, as torch
    seeds its workers: the same images in the same places (no shuffling) get other draws each epoch, and the same
    global seed gives the same epochs again."""
    ds = _detection(coco)

    def run():
        torch.manual_seed(0)
        return _epochs(DataLoader(ds, batch_size=4, num_workers=2, collate_fn=_pairs, device=device, seed=3), 2)

    (ids, _, boxes, _), (ids2, _, boxes2, _) = first = run()
    assert ids == ids2 and not all(torch.equal(a, b) for a, b in zip(boxes, boxes2))
    for (ids, images, boxes, _), (ids2, images2, boxes2, _) in zip(first, run()):
        assert ids == ids2 and all(torch.equal(a, b) for a, b in zip(images, images2))
        assert all(torch.equal(a, b) for a, b in zip(boxes, boxes2))


@pytest.mark.parametrize("device", DEVICES)
def test_detection_resumed_mid_epoch_draws_as_the_epoch_would(coco, device):
    """A position saved after two batches and loaded into a loader whose workers read its next epoch ahead: the
    batches read ahead are dropped, and the rest of the saved epoch comes in its order with the same draws (each
    sample seeded by its place in the epoch, not its place after the resume)."""
    ds = _detection(coco)

    def make():
        return DataLoader(ds, batch_size=4, shuffle=True, num_workers=2, generator=torch.Generator().manual_seed(3),
                          collate_fn=_pairs, device=device)

    ids, images, boxes, _ = _epochs(make(), 1)[0]
    saved = _state_after_two_batches(make())
    loader = make()
    _epochs(loader, 1)  # a whole epoch: its workers read the next one's first batches
    assert [s.ahead for s in loader._backend.idle] == [True]
    loader.load_state_dict(saved)
    ids2, images2, boxes2, _ = _epochs(loader, 1)[0]
    assert ids2 == ids[8:]
    assert all(torch.equal(a, b) for a, b in zip(boxes2, boxes[8:]))
    assert all(torch.equal(a, b) for a, b in zip(images2, images[8:]))


def _dali_refuses(monkeypatch, path, worker_skips: bool = False):
    """The workers hand DALI bytes it cannot decode for the file at ``path`` (``worker_skips``: they leave it out,
    as a file they cannot read)."""
    import numpy as np

    from gputransforms import files

    prepare = files.prepare_bytes

    def prepared(index, p, data, **kw):
        if p == str(path) and worker_skips:
            raise files.BadSampleError(index, p, "left out by the worker")
        if p == str(path):
            return np.frombuffer(b"\xff\xd8\xff\xe0" + b"\x00" * 64, dtype=np.uint8)
        return prepare(index, p, data, **kw)

    monkeypatch.setattr(files, "prepare_bytes", prepared)


@pytest.mark.parametrize("device", DEVICES)
def test_detection_decode_error_mid_epoch_keeps_each_samples_draws(tmp_path, coco, device, monkeypatch):
    """With on_error="skip", a file DALI fails on in the fourth batch (PIL fails on it too): the pipeline is built
    again and the batches that were in flight are fed again, each sample seeded by its place in the epoch. The
    epoch is the one the same loader gives where its worker leaves that file out: the same ids, draws, boxes."""
    shutil.copytree(coco[0], tmp_path / "images")
    ds = _detection((tmp_path / "images", coco[1]))
    bad = tmp_path / "images" / ds.dataset.coco.loadImgs(ds.dataset.ids[ds.indices[13]])[0]["file_name"]
    bad.write_bytes(bad.read_bytes()[:len(bad.read_bytes()) // 3])  # its header opens, its pixels do not

    def epoch(worker_skips: bool):
        _dali_refuses(monkeypatch, bad, worker_skips)
        torch.manual_seed(0)
        loader = DataLoader(ds, batch_size=4, num_workers=2, collate_fn=_pairs, device=device, on_error="skip")
        with pytest.warns(SkippedSamplesWarning, match=str(bad)):
            out = _epochs(loader, 1)[0]
        assert [e.index for e in loader.skipped] == [13]  # (its index in the Subset)
        return out

    ids, images, boxes, _ = epoch(worker_skips=False)
    ids2, images2, boxes2, _ = epoch(worker_skips=True)
    want = [ds.dataset.ids[i] for k, i in enumerate(ds.indices) if k != 13]
    assert ids == ids2 == want
    assert all(torch.equal(a, b) for a, b in zip(boxes, boxes2))
    assert all(torch.equal(a, b) for a, b in zip(images, images2))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("workers", [2, 0])
def test_detection_file_only_dali_fails_on_is_decoded_by_pil(coco, device, workers, monkeypatch):
    """A file DALI fails on and PIL decodes, in the fourth batch of a detection loader: its batch's files are
    decoded by PIL from then on (a DamagedFileWarning names them), every sample comes once, in torch's order;
    with workers, each with the draws of the uninterrupted epoch (boxes equal), images within the decoders'
    parity."""
    from gputransforms.errors import DamagedFileWarning

    ds = _detection(coco)
    victim = Path(coco[0]) / ds.dataset.coco.loadImgs(ds.dataset.ids[ds.indices[13]])[0]["file_name"]

    def epoch():
        torch.manual_seed(0)
        return _epochs(DataLoader(ds, batch_size=4, num_workers=workers, collate_fn=_pairs, device=device), 1)[0]

    ids, images, boxes, _ = epoch()
    _dali_refuses(monkeypatch, victim)
    with pytest.warns(DamagedFileWarning, match=re.escape(str(victim))):
        ids2, images2, boxes2, _ = epoch()
    assert ids == ids2 == [ds.dataset.ids[i] for i in ds.indices]
    if workers:
        assert all(torch.equal(a, b) for a, b in zip(boxes, boxes2))
        assert all(torch.equal(a, b) for k, (a, b) in enumerate(zip(images, images2)) if not 12 <= k < 16)
        for a, b in zip(images[12:16], images2[12:16]):
            assert a.shape == b.shape and (a - b).abs().mean() <= (0.3 if device == "cpu" else 1.0) / 255


def _three_epochs(make, style: str) -> list:
    """The indices of three epochs of ``make()``'s loader, as a loop of ``style`` takes them: "for" (asks past the
    last batch), "len" (takes len(loader) batches and stops: Lightning's), "break" (stops after its second batch)."""
    loader, out = make(), []
    for _ in range(3):
        it, got = iter(loader), []
        for k in range(len(loader)):
            if style == "break" and k == 2:
                break
            got += decode_index(next(it)[0])[0]
        if style == "for":
            assert next(it, None) is None
        out.append(got)
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("style,n", [("for", 36), ("for", 37), ("len", 36), ("len", 37), ("break", 36)])
def test_the_samplers_generator_as_torchs_iterator_leaves_it(indexed_folder, device, style, n, adoptions):
    """With no workers torch's iterator pulls the sampler past its last full batch only when the loop asks for one
    more, and its RandomSampler then draws once more from the DataLoader's generator: a loop that takes len(loader)
    batches (Lightning's), or breaks before an epoch's end, leaves that draw undone, and the next epochs' orders
    follow. Ours pulled it early (the feed reads ahead), and gave other orders from the second epoch on. A for loop
    still gets the next epoch read ahead. (Where the last batch is a partial one, torch's pull of it ends the
    sampler's pass: a loop that breaks within the feed's read-ahead of that batch still differs; not tested.)"""
    ds = tud.Subset(datasets.ImageFolder(str(indexed_folder), transform=INDEX_TF), list(range(n)))  # 9 or 10 batches

    def make(cls, **kw):
        return lambda: cls(ds, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(9), **kw)

    ours = _three_epochs(make(DataLoader, device=device), style)
    theirs = _three_epochs(make(tud.DataLoader), style)
    assert ours == theirs
    if style == "for":
        assert adoptions == [True, True]  # (the epochs read ahead were the ones drawn)
