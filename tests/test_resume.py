"""Mid-epoch resume: state_dict() after k batches, load_state_dict() into a new loader, and iteration
goes on with batch k+1; the epochs after it are the uninterrupted run's."""
import pickle

import pytest
import torch
import torch.utils.data as tud

from gputransforms import DataLoader, datasets
from gputransforms import transforms as T

from conftest import DEVICES, decode_index

INDEX_TF = T.Compose([T.Resize((8, 8)), T.PILToTensor()])


def epoch_items(it):
    out = []
    for images, labels in it:
        out.append((decode_index(images)[0], labels.cpu().tolist(), images.cpu()))
    return out


def run(loader, epochs):
    return [epoch_items(loader) for _ in range(epochs)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("source", ["generator", "global", "distributed", "sequential"])
@pytest.mark.parametrize("k", [0, 3, 7])
def test_resume_mid_epoch_gives_the_uninterrupted_run(indexed_folder, device, source, k):
    ds = datasets.ImageFolder(str(indexed_folder), transform=INDEX_TF)

    def make():
        kw = dict(batch_size=5, device=device)
        if source == "generator":
            kw.update(shuffle=True, generator=torch.Generator().manual_seed(11))
        elif source == "global":
            kw.update(shuffle=True)
        elif source == "distributed":
            kw.update(sampler=tud.distributed.DistributedSampler(ds, num_replicas=2, rank=1, seed=3))
        return DataLoader(ds, **kw)

    def set_epoch(loader, e):
        if source == "distributed":
            loader.sampler.set_epoch(e)

    torch.manual_seed(5)
    full = make()
    want = []
    for e in range(3):
        set_epoch(full, e)
        want.append(epoch_items(full))

    k = min(k, len(want[0]) - 1)  # the distributed shard has fewer batches
    torch.manual_seed(5)
    first = make()
    set_epoch(first, 0)
    it = iter(first)
    head = [epoch_items([next(it)])[0] for _ in range(k)]
    saved = pickle.loads(pickle.dumps(first.state_dict()))
    assert saved["batches_yielded"] == k and len(pickle.dumps(saved)) < 20_000  # no image data
    del it, first

    torch.manual_seed(999)  # a new process: other random state everywhere
    second = make()
    if source == "generator":
        second.generator.manual_seed(12345)
    second.load_state_dict(saved)
    got = []
    for e in range(3):
        set_epoch(second, e)
        got.append(epoch_items(second))
    got[0] = head + got[0]
    for e in range(3):
        assert [b[0] for b in got[e]] == [b[0] for b in want[e]], f"epoch {e}: other indices"
        assert [b[1] for b in got[e]] == [b[1] for b in want[e]], f"epoch {e}: other labels"
        for (_, _, x), (_, _, y) in zip(got[e], want[e]):
            assert torch.equal(x, y), "a deterministic chain gives the same images"


@pytest.mark.parametrize("generator", [True, False])
def test_resume_in_a_later_epoch_of_persistent_workers(indexed_folder, generator):
    """With persistent workers only the first epoch draws a base seed (as torch's reset iterator): a position saved
    in the second epoch, or between epochs, says so, and the resumed loader finishes that epoch and draws the next
    one as the uninterrupted run does."""
    ds = datasets.ImageFolder(str(indexed_folder), transform=INDEX_TF)

    def make():
        return DataLoader(ds, batch_size=5, shuffle=True, num_workers=2, persistent_workers=True, device="cpu",
                          generator=torch.Generator().manual_seed(11) if generator else None)

    torch.manual_seed(5)
    want = run(make(), 3)
    torch.manual_seed(5)
    first = make()
    epoch_items(first)
    between = pickle.loads(pickle.dumps(first.state_dict()))
    it = iter(first)
    head = [epoch_items([next(it)])[0] for _ in range(3)]
    saved = pickle.loads(pickle.dumps(first.state_dict()))
    del it, first
    for position, done in ((saved, head), (between, [])):
        torch.manual_seed(999)
        second = make()
        if generator:
            second.generator.manual_seed(12345)
        second.load_state_dict(position)
        got = run(second, 2)
        got[0] = done + got[0]
        for e in range(2):
            assert [b[0] for b in got[e]] == [b[0] for b in want[e + 1]], f"epoch {e + 1}: other indices"


def test_state_between_epochs_starts_the_next_epoch(indexed_folder):
    ds = datasets.ImageFolder(str(indexed_folder), transform=INDEX_TF)
    make = lambda: DataLoader(ds, batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(1),  # noqa
                              device="cpu")
    full = make()
    want = run(full, 2)
    a = make()
    epoch_items(a)
    saved = a.state_dict()
    assert saved["batches_yielded"] == 0
    b = make()
    b.load_state_dict(saved)
    assert [x[0] for x in epoch_items(b)] == [x[0] for x in want[1]]


def test_resume_on_the_torchvision_path(indexed_folder):
    class Plain(tud.Dataset):
        def __len__(self):
            return 23

        def __getitem__(self, i):
            return torch.tensor(i), i

    make = lambda: DataLoader(Plain(), batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(2),  # noqa
                              device="cpu")
    with pytest.warns(UserWarning):
        full = make()
    want = [[y.tolist() for _, y in full] for _ in range(2)]
    with pytest.warns(UserWarning):
        a = make()
    it = iter(a)
    head = [next(it)[1].tolist() for _ in range(2)]
    saved = a.state_dict()
    with pytest.warns(UserWarning):
        b = make()
    b.load_state_dict(saved)
    got = [[y.tolist() for _, y in b] for _ in range(2)]
    assert head + got[0] == want[0] and got[1] == want[1]


def test_skipped_records_travel_with_the_state(tmp_path, photo_folder):
    import shutil

    for c in ("a", "b"):
        (tmp_path / c).mkdir()
    photos = sorted(photo_folder.rglob("*.jpg"))[:6]
    for k, p in enumerate(photos):
        shutil.copy(p, tmp_path / ("a" if k < 3 else "b") / f"{k}.jpg")
    (tmp_path / "a" / "0.jpg").write_bytes(b"")  # index 0: skipped in the first batch
    ds = datasets.ImageFolder(str(tmp_path), transform=T.Compose([T.Resize((16, 16)), T.ToTensor()]))
    a = DataLoader(ds, batch_size=2, device="cpu", on_error="skip")
    it = iter(a)
    next(it)
    saved = a.state_dict()
    assert [s[0] for s in saved["skipped"]] == [0]
    b = DataLoader(ds, batch_size=2, device="cpu", on_error="skip")
    b.load_state_dict(saved)
    with pytest.warns(UserWarning, match="skipped 1 sample"):
        rest = [y.tolist() for _, y in b]
    assert sum(len(r) for r in rest) == 6 - 2 and [e.index for e in b.skipped] == [0]


def test_same_seed_same_batches_on_the_cpu(indexed_folder, photo_folder):
    """torch.manual_seed(s) (or generator=) makes two runs identical on the CPU: indices, labels
    and the random transforms' pixels."""
    tf = T.Compose([T.RandomResizedCrop(32), T.RandomHorizontalFlip(), T.ColorJitter(0.4, 0.4), T.PILToTensor()])
    ds = datasets.ImageFolder(str(photo_folder), transform=tf)

    def run_once(**kw):
        loader = DataLoader(ds, batch_size=8, shuffle=True, device="cpu", **kw)
        return [[(x.clone(), y.clone()) for x, y in loader] for _ in range(2)]

    torch.manual_seed(21)
    a = run_once()
    torch.manual_seed(21)
    b = run_once()
    for e1, e2 in zip(a, b):
        assert all(torch.equal(x1, x2) and torch.equal(y1, y2) for (x1, y1), (x2, y2) in zip(e1, e2))
    assert not torch.equal(a[0][0][0], a[1][0][0]), "epochs differ"
    # generator= alone fixes the order and DALI's draws; the transforms after the graph (ColorJitter
    # here) draw torchvision's parameters from torch's global RNG, as torch's DataLoader does with
    # num_workers=0
    torch.manual_seed(1)
    c = run_once(generator=torch.Generator().manual_seed(5))
    torch.manual_seed(1)
    d = run_once(generator=torch.Generator().manual_seed(5))
    for e1, e2 in zip(c, d):
        assert all(torch.equal(x1, x2) and torch.equal(y1, y2) for (x1, y1), (x2, y2) in zip(e1, e2))
    assert not torch.equal(a[0][0][0], c[0][0][0]), "seeds matter"
    # with workers, from a generator of each iterator's own seeded from the epoch's base seed, as torch's workers
    # are: generator= alone fixes them too, whatever torch's global generator holds
    torch.manual_seed(1)
    e = run_once(generator=torch.Generator().manual_seed(5), num_workers=2)
    torch.manual_seed(2)
    f = run_once(generator=torch.Generator().manual_seed(5), num_workers=2)
    for e1, e2 in zip(e, f):
        assert all(torch.equal(x1, x2) and torch.equal(y1, y2) for (x1, y1), (x2, y2) in zip(e1, e2))
    torch.manual_seed(1)
    g = run_once(generator=torch.Generator().manual_seed(6), num_workers=2)
    assert not torch.equal(e[0][0][0], g[0][0][0]), "seeds matter"


def test_default_threads_are_the_cores_of_one_local_rank(monkeypatch):
    from gputransforms.device import default_threads

    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    alone = default_threads()
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert default_threads() == max(1, alone // 2)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(alone * 4))
    assert default_threads() == 1


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("source", ["generator", "global"])
@pytest.mark.parametrize("workers", [0, 2])
def test_resume_repeats_random_transforms_exactly(photo_folder, device, source, workers):
    """A random chain (crop fused into the decode, flip, TrivialAugment in the graph; ColorJitter and
    RandomErasing in the batched stage): after a resume the images are the uninterrupted run's,
    because the state carries DALI's checkpoint and the batched stage's RNG (torch's global one, or with
    workers the iterator's own)."""
    tf = T.Compose([T.RandomResizedCrop(48), T.RandomHorizontalFlip(), T.TrivialAugmentWide(),
                    T.ColorJitter(0.4, 0.4, 0.4), T.PILToTensor(), T.RandomErasing(p=0.5, value=0)])
    ds = datasets.ImageFolder(str(photo_folder), transform=tf)

    def make():
        kw = dict(batch_size=4, shuffle=True, device=device, num_workers=workers)
        if source == "generator":
            kw["generator"] = torch.Generator().manual_seed(3)
        return DataLoader(ds, **kw)

    def images(it):
        return [x.cpu() for x, _ in it]

    torch.manual_seed(5)
    full = make()
    want = [images(full) for _ in range(2)]
    assert not torch.equal(want[0][0], want[1][0])

    torch.manual_seed(5)
    first = make()
    it = iter(first)
    head = [next(it)[0].cpu() for _ in range(2)]
    saved = pickle.loads(pickle.dumps(first.state_dict()))
    assert saved["dali_checkpoint"] and len(pickle.dumps(saved)) < 200_000
    for _ in range(2):  # the abandoned run went on drawing
        next(it)
    del it, first

    torch.manual_seed(999)
    second = make()
    if source == "generator":
        second.generator.manual_seed(77)
    second.load_state_dict(saved)
    got = [head + images(second), images(second)]
    for e in range(2):
        assert len(got[e]) == len(want[e])
        for k, (x, y) in enumerate(zip(got[e], want[e])):
            if device == "cpu":
                assert torch.equal(x, y), f"epoch {e}, batch {k}"
            else:  # nvJPEG's hardware decoder repeats itself too (test_random.py's seeded runs)
                assert torch.equal(x, y), f"epoch {e}, batch {k}"
