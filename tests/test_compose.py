"""Datasets as users compose them (random_split, Subset, ConcatDataset, nested) and iterators as torch
makes them (several alive at once, a peeked batch), side by side with torch's DataLoader over the
same objects. ``indexed_folder``'s pixels name their file, so every check is on what came out."""
import pytest
import torch
import torch.utils.data as tud
from torchvision.transforms import v2

from gputransforms import DataLoader, FallbackWarning, datasets
from gputransforms import transforms as T

from conftest import DEVICES, decode_index

INDEX_TF = T.Compose([T.Resize((8, 8)), T.PILToTensor()])


def folder(root, transform=INDEX_TF, **kw):
    return datasets.ImageFolder(str(root), transform=transform, **kw)


def items(batches):
    """(file index, label) per sample, in order, from batches of (images, labels)."""
    out = []
    for images, labels in batches:
        out += list(zip(decode_index(images)[0], labels.cpu().tolist()))
    return out


def side_by_side(ds, device, epochs=2, **kw):
    """Our epochs and torch's over the same dataset and the same generator seed."""
    ours = DataLoader(ds, generator=torch.Generator().manual_seed(7), device=device, **kw)
    theirs = tud.DataLoader(ds, generator=torch.Generator().manual_seed(7), **kw)
    assert ours.backend == "dali", ours.explain()
    assert len(ours) == len(theirs)
    return [items(ours) for _ in range(epochs)], [items(theirs) for _ in range(epochs)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shuffle,drop_last", [(True, False), (False, False), (True, True)])
def test_random_split_parts_are_compiled_and_equal_torchs(indexed_folder, device, shuffle, drop_last):
    train, val = tud.random_split(folder(indexed_folder), [0.8, 0.2], generator=torch.Generator().manual_seed(1))
    for part in (train, val):
        ours, theirs = side_by_side(part, device, batch_size=5, shuffle=shuffle, drop_last=drop_last)
        assert ours == theirs
        if not drop_last:
            assert sorted(i for i, _ in ours[0]) == sorted(part.indices)


@pytest.mark.parametrize("device", DEVICES)
def test_subset_with_repeated_indices(indexed_folder, device):
    ds = folder(indexed_folder)
    sub = tud.Subset(ds, [3, 3, 10, 0, 36, 3, -1])
    ours, theirs = side_by_side(sub, device, batch_size=3, shuffle=True)
    assert ours == theirs
    assert sorted(i for i, _ in ours[0]) == sorted([3, 3, 10, 0, 36, 3, 36])
    assert all(label == ds.targets[i] for i, label in ours[0]), "targets follow pixels"


@pytest.mark.parametrize("device", DEVICES)
def test_concat_of_a_folder_and_a_subset_of_it_and_nesting(indexed_folder, device):
    ds = folder(indexed_folder)
    concat = tud.ConcatDataset([ds, tud.Subset(ds, [1, 2, 2])])
    ours, theirs = side_by_side(concat, device, batch_size=8, shuffle=True)
    assert ours == theirs and len(ours[0]) == len(ds) + 3
    nested = tud.Subset(tud.ConcatDataset([tud.Subset(ds, [5, 6]), concat]), [0, 2, 40, 39, 1, 0])
    ours, theirs = side_by_side(nested, device, batch_size=4, shuffle=False)
    assert ours == theirs
    assert [i for i, _ in ours[0]] == [5, 0, 2, 1, 6, 5]


def test_concat_parts_with_equal_chains_and_their_own_target_transforms(indexed_folder):
    a = folder(indexed_folder, transform=T.Compose([T.Resize((8, 8)), T.PILToTensor()]))
    b = folder(indexed_folder, transform=T.Compose([T.Resize((8, 8)), T.PILToTensor()]),
               target_transform=lambda t: t + 100)
    concat = tud.ConcatDataset([a, b])
    ours, theirs = side_by_side(concat, "cpu", batch_size=10, shuffle=True)
    assert ours == theirs
    assert sorted(label for _, label in ours[0]) == sorted(a.targets + [t + 100 for t in b.targets])


def test_concat_of_different_chains_falls_back_with_a_one_line_reason(indexed_folder):
    a = folder(indexed_folder)
    b = folder(indexed_folder, transform=T.Compose([T.Resize((8, 8)), T.RandomHorizontalFlip(), T.PILToTensor()]))
    with pytest.warns(FallbackWarning, match="part 1's transform differs from part 0's"):
        loader = DataLoader(tud.ConcatDataset([a, b]), batch_size=8, device="cpu")
    assert loader.backend == "torchvision" and "\n" not in loader.reason
    assert len(items(loader)) == 2 * len(a)
    lam = folder(indexed_folder, transform=T.Compose([T.Resize((8, 8)), T.Lambda(lambda x: x), T.PILToTensor()]))
    lam2 = folder(indexed_folder, transform=T.Compose([T.Resize((8, 8)), T.Lambda(lambda x: x), T.PILToTensor()]))
    with pytest.warns(FallbackWarning):  # equal reprs, but a Lambda may hide a difference
        assert DataLoader(tud.ConcatDataset([lam, lam2]), batch_size=8, device="cpu").backend == "torchvision"


def test_explain_shows_the_composed_dataset_compiled(indexed_folder):
    train, _ = tud.random_split(folder(indexed_folder), [0.5, 0.5])
    text = DataLoader(train, batch_size=4, device="cpu").explain()
    assert "backend=dali" in text and "DALI graph" in text


def test_subclass_that_overrides_getitem_is_not_compiled(indexed_folder):
    class Flipped(datasets.ImageFolder):
        def __getitem__(self, i):
            x, y = super().__getitem__(i)
            return x.flip(-1), y

    with pytest.warns(FallbackWarning, match="Flipped.__getitem__ does something to what self.transform returns"):
        loader = DataLoader(Flipped(str(indexed_folder), transform=INDEX_TF), batch_size=4, device="cpu")
    assert loader.backend == "torchvision"


# --- iterators -----------------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("live", [2, 3])
def test_live_iterators_each_give_a_full_epoch_in_torchs_order(indexed_folder, device, live):
    ds = folder(indexed_folder)
    ours = DataLoader(ds, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(5), device=device,
                      prefetch_factor=2)
    theirs = tud.DataLoader(ds, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(5))
    got = [[] for _ in range(live)]
    want = [[] for _ in range(live)]
    for loader, out in ((ours, got), (theirs, want)):
        its = [iter(loader) for _ in range(live)]
        active = list(range(live))
        step = 0
        while active:  # interleaved unevenly: iterator k advances on every (k+1)-th step
            step += 1
            for k in list(active):
                if step % (k + 1):
                    continue
                try:
                    out[k] += items([next(its[k])])
                except StopIteration:
                    active.remove(k)
    for k in range(live):
        assert sorted(i for i, _ in got[k]) == list(range(len(ds))), f"iterator {k} lost or repeated samples"
    assert got == want


@pytest.mark.parametrize("device", DEVICES)
def test_zip_of_a_loader_with_itself(indexed_folder, device):
    ds = folder(indexed_folder)
    loader = DataLoader(ds, batch_size=5, shuffle=True, device=device)
    a, b = [], []
    for (xa, ya), (xb, yb) in zip(loader, loader):
        a += decode_index(xa)[0]
        b += decode_index(xb)[0]
    assert sorted(a) == sorted(b) == list(range(len(ds)))


@pytest.mark.parametrize("device", DEVICES)
def test_peeked_batch_costs_the_epoch_nothing(indexed_folder, device):
    ds = folder(indexed_folder)
    loader = DataLoader(ds, batch_size=4, shuffle=True, device=device)
    x, y = next(iter(loader))  # the first line of many notebooks
    assert x.shape[0] == 4
    for _ in range(2):
        assert sorted(i for i, _ in items(loader)) == list(range(len(ds)))
    assert len(loader._backend.idle) == 1, "the peek's pipeline was reused, not a second one built"


def test_an_evaluation_pass_inside_a_training_epoch(indexed_folder):
    """A training iterator still alive (mid-epoch) while a validation loop runs over another loader
    and over the same one: nobody loses a sample."""
    ds = folder(indexed_folder)
    train_loader = DataLoader(ds, batch_size=6, shuffle=True, device="cpu")
    val_loader = DataLoader(tud.Subset(ds, range(10)), batch_size=4, device="cpu")
    seen = []
    for k, batch in enumerate(train_loader):
        seen += items([batch])
        if k == 2:
            assert [i for i, _ in items(val_loader)] == list(range(10))
            assert sorted(i for i, _ in items(train_loader)) == list(range(len(ds)))
    assert sorted(i for i, _ in seen) == list(range(len(ds)))


def test_v2_chain_through_a_split(indexed_folder):
    tf = v2.Compose([v2.Resize((8, 8)), v2.PILToTensor()])
    train, val = tud.random_split(datasets.ImageFolder(str(indexed_folder), transform=tf), [30, 7])
    ours, theirs = side_by_side(val, "cpu", batch_size=3)
    assert ours == theirs
