"""A dataset's transform changed between epochs (progressive resizing, an eval transform set on the training set)
takes effect at the next epoch, as with torch's DataLoader, whose workers call the transform as it then is."""
import os
import warnings

import pytest
import torch
import torch.utils.data as tud
import torchvision
from PIL import Image
from torchvision.transforms import v2

from gputransforms import DataLoader, FallbackWarning
from gputransforms import transforms as T

from conftest import DEVICES, abs_diff_stats
from test_inmemory import fake

TOL = {"cpu": 0.5, "gpu": 2.0}


def _same(ours, theirs, device):
    assert len(ours) == len(theirs)
    for (x, y), (xt, yt) in zip(ours, theirs):
        assert x.shape == xt.shape and torch.equal(y.cpu(), yt)
        assert abs_diff_stats(x, xt)["mean"] < TOL[device] / (255 if xt.is_floating_point() else 1)


def _epoch(loader):
    return [(x, y) for x, y in loader]


@pytest.mark.parametrize("device", DEVICES)
def test_a_transform_replaced_or_changed_in_place_takes_effect_at_the_next_epoch(photo_folder, device):
    """Progressive resizing, both ways users write it: the transform replaced, then a size changed in place.
    Each epoch is torch's DataLoader's over the same dataset; the loader plans again only where it changed."""
    ds = torchvision.datasets.ImageFolder(str(photo_folder), transform=T.Compose([T.Resize((32, 32)), T.ToTensor()]))
    ours = DataLoader(ds, batch_size=8, device=device)
    theirs = tud.DataLoader(ds, batch_size=8)
    _same(_epoch(ours), _epoch(theirs), device)
    _same(_epoch(ours), _epoch(theirs), device)
    assert ours._backend.planned_again == 0 and "planned again" not in ours.explain()
    ds.transform = T.Compose([T.Resize((48, 40)), T.ToTensor()])
    got = _epoch(ours)
    assert got[0][0].shape[-2:] == (48, 40)
    _same(got, _epoch(theirs), device)
    ds.transform.transforms[0].size = (56, 56)
    got = _epoch(ours)
    assert got[0][0].shape[-2:] == (56, 56)
    _same(got, _epoch(theirs), device)
    assert ours._backend.planned_again == 2 and "planned again at 2 epoch start(s)" in ours.explain()
    assert ours.backend == "dali"


@pytest.mark.parametrize("device", DEVICES)
def test_an_in_memory_dataset_and_a_subset_follow_their_transform(device):
    """In-memory data (the arrays backend) and a Subset of it: a magnitude raised in place (a curriculum)."""
    ds = fake(torchvision.datasets.CIFAR10, n=24, transform=v2.Compose([
        v2.ToImage(), v2.Pad(2), v2.CenterCrop(30), v2.ToDtype(torch.float32, scale=True)]))
    part = tud.Subset(ds, list(range(0, 24, 2)))
    for data in (ds, part):
        ours = DataLoader(data, batch_size=6, device=device)
        theirs = tud.DataLoader(data, batch_size=6)
        _same(_epoch(ours), _epoch(theirs), device)
        ds.transform.transforms[1].padding = [6, 6, 6, 6]
        ds.transform.transforms[2].size = [40, 40]
        got = _epoch(ours)
        assert got[0][0].shape[-2:] == (40, 40)
        _same(got, _epoch(theirs), device)
        ds.transform.transforms[1].padding, ds.transform.transforms[2].size = [2, 2, 2, 2], [30, 30]


def test_a_change_to_a_transform_that_does_not_compile_says_so_and_runs_as_torchs(photo_folder):
    """A Lambda on the PIL image cannot be lowered: the new plan runs it as written, and says so once."""
    ds = torchvision.datasets.ImageFolder(str(photo_folder), transform=T.Compose([T.Resize((32, 32)), T.ToTensor()]))
    ours = DataLoader(ds, batch_size=8, device="cpu")
    _epoch(ours)
    ds.transform = T.Compose([T.Resize((32, 32)), T.Lambda(lambda im: im.rotate(90)), T.ToTensor()])
    with pytest.warns(FallbackWarning, match="the dataset's transform or data changed since the last epoch"):
        got = _epoch(ours)
    _same(got, _epoch(tud.DataLoader(ds, batch_size=8)), "cpu")


class _Own(tud.Dataset):
    def __init__(self, root, transform):
        self.files = sorted(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs)
        self.transform = transform

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        return self.transform(Image.open(self.files[i]).convert("RGB")), i


def test_a_users_dataset_and_a_transform_unchanged_over_epochs(photo_folder):
    """A Dataset of the user's own follows its transform too; with nothing changed the plan is kept, epoch after
    epoch, for every kind of chain (the snapshot is of the settings, not of what a run leaves behind)."""
    ds = _Own(photo_folder, T.Compose([T.RandomResizedCrop(24), T.RandomHorizontalFlip(), T.ToTensor()]))
    ours = DataLoader(ds, batch_size=8, device="cpu", shuffle=True)
    for _ in range(3):
        _epoch(ours)
    assert ours._backend.planned_again == 0
    ds.transform = T.Compose([T.Resize((20, 20)), T.ToTensor()])
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        got = _epoch(ours)
    assert ours._backend.planned_again == 1 and got[0][0].shape[-2:] == (20, 20)
    assert sorted(int(i) for _, y in got for i in y) == list(range(len(ds)))


def test_persistent_workers_keep_the_dataset_of_the_first_epoch_as_torchs_do(photo_folder):
    """torch's persistent workers keep the copy of the dataset they were started with (at the first epoch):
    a transform changed later is not seen there, and not here either; one changed before the first epoch is."""
    ds = torchvision.datasets.ImageFolder(str(photo_folder), transform=T.Compose([T.Resize((32, 32)), T.ToTensor()]))
    ours = DataLoader(ds, batch_size=8, device="cpu", num_workers=2, persistent_workers=True)
    theirs = tud.DataLoader(ds, batch_size=8, num_workers=2, persistent_workers=True)
    ds.transform.transforms[0].size = (24, 24)
    sizes = []
    for _ in range(2):
        sizes.append((next(iter(ours))[0].shape[-1], next(iter(theirs))[0].shape[-1]))
        ds.transform.transforms[0].size = (40, 40)
    assert sizes == [(24, 24), (24, 24)]


@pytest.mark.parametrize("device", DEVICES)
def test_samples_relabelled_or_filtered_between_epochs_are_torchs(indexed_folder, device):
    """Pseudo-labels written into an ImageFolder's samples, the samples filtered, a Subset's indices changed:
    each next epoch is torch's DataLoader's (files and labels; the pixels name their file)."""
    from conftest import decode_index

    for subset in (False, True):
        ds = torchvision.datasets.ImageFolder(str(indexed_folder),
                                              transform=T.Compose([T.Resize((8, 8)), T.PILToTensor()]))
        data = part = tud.Subset(ds, list(range(0, len(ds), 2))) if subset else ds
        ours = DataLoader(data, batch_size=5, device=device)
        theirs = tud.DataLoader(data, batch_size=5)

        def epoch(loader):
            return [(i, int(y)) for x, ys in loader for i, y in zip(decode_index(x)[0], ys.cpu())]

        assert epoch(ours) == epoch(theirs)
        ds.samples = [(p, (y + 1) % 3) for p, y in ds.samples]  # relabelled
        ds.targets = [y for _, y in ds.samples]
        assert epoch(ours) == epoch(theirs)
        if subset:
            part.indices = part.indices[::-1][:7]
        else:
            ds.samples, ds.targets = ds.samples[5:20], ds.targets[5:20]  # filtered
        got = epoch(ours)
        assert got == epoch(theirs) and len(got) == len(data)
        assert ours._backend.planned_again == 2


def test_a_collate_fn_set_on_the_loader_takes_effect_at_the_next_epoch(photo_folder):
    """torch's iterator takes the loader's collate_fn as it is when the iterator is made (mixup turned off for
    the last epochs by setting ``loader.collate_fn``); so does ours."""
    from torch.utils.data import default_collate

    def shifted(batch):
        x, y = default_collate(batch)
        return x, y + 100

    ds = torchvision.datasets.ImageFolder(str(photo_folder), transform=T.Compose([T.Resize((8, 8)), T.ToTensor()]))
    for loader in (DataLoader(ds, batch_size=6, device="cpu"), tud.DataLoader(ds, batch_size=6)):
        labels = [next(iter(loader))[1].tolist()]
        loader.collate_fn = shifted
        labels.append(next(iter(loader))[1].tolist())
        loader.collate_fn = default_collate
        labels.append(next(iter(loader))[1].tolist())
        assert labels == [[0] * 6, [100] * 6, [0] * 6]


CHAIN = T.Compose([T.Resize((16, 16)), T.ToTensor()])


def _format(batch):
    """A Hugging Face format transform that reads its chain by its global name, in a comprehension."""
    batch["pixel_values"] = [CHAIN(im.convert("RGB")) for im in batch["image"]]
    del batch["image"]
    return batch


def test_a_hugging_face_format_transform_and_the_chain_it_reads_are_followed(photo_folder):
    """A table of its image column alone (which raised IndexError when the loader was made), its format
    transform's chain changed in place (found through the function's global names, in a comprehension), then
    a new format transform set."""
    hfd = pytest.importorskip("datasets")
    files = sorted(str(p) for p in photo_folder.rglob("*") if p.is_file())[:12]
    table = hfd.Dataset.from_dict({"image": files}).cast_column("image", hfd.Image()).with_transform(_format)
    ours = DataLoader(table, batch_size=4, device="cpu")
    assert ours.backend == "dali", ours.reason
    sizes = [next(iter(ours))["pixel_values"].shape[-1]]
    CHAIN.transforms[0].size = (24, 24)  # the chain the function reads, changed in place
    sizes.append(next(iter(ours))["pixel_values"].shape[-1])

    def other(batch):
        batch["pixel_values"] = [T.functional.to_tensor(im.convert("RGB").resize((8, 8))) for im in batch["image"]]
        del batch["image"]
        return batch

    table.set_transform(other)  # (in place: a new format transform, one that does not compile)
    with pytest.warns(FallbackWarning, match="transform or data changed since the last epoch"):
        sizes.append(next(iter(ours))["pixel_values"].shape[-1])
    CHAIN.transforms[0].size = (16, 16)
    assert sizes == [16, 24, 8]


class _Growing(_Own):
    """A length from a number of its own (samples let in as a curriculum goes on)."""

    def __init__(self, root, transform, n):
        super().__init__(root, transform)
        self.n = n

    def __len__(self):
        return self.n


def test_a_dataset_whose_length_changed_is_read_as_it_is(photo_folder):
    """A length that grew between epochs, by a number the snapshot does not compare: the next epoch raised
    IndexError (samples beyond those found when the loader was made); the length itself is compared too."""
    ds = _Growing(photo_folder, T.Compose([T.Resize((8, 8)), T.ToTensor()]), 8)
    ours, theirs = DataLoader(ds, batch_size=4, device="cpu"), tud.DataLoader(ds, batch_size=4)
    assert [y.tolist() for _, y in ours] == [y.tolist() for _, y in theirs] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    ds.n = 14
    assert [y.tolist() for _, y in ours] == [y.tolist() for _, y in theirs]
    assert sum(len(y) for _, y in ours) == 14


def test_a_webdataset_pipelines_chain_changed_in_place_is_followed(photo_folder, tmp_path):
    """The chain a webdataset stage holds (``map_tuple(tf, ...)``), changed in place between epochs; a shuffled
    pipeline left alone plans once over three epochs (its stages' own state is not compared)."""
    wds = pytest.importorskip("webdataset")
    from gputransforms import sampledata

    shards = sampledata.write_shards(photo_folder, tmp_path / "shards", per_shard=8)
    tf = T.Compose([T.Resize((16, 16)), T.ToTensor()])
    ds = wds.WebDataset(shards, shardshuffle=False).decode("pil").to_tuple("jpg;png", "cls").map_tuple(tf, lambda y: y)
    ours, theirs = DataLoader(ds, batch_size=4, device="cpu"), tud.DataLoader(ds, batch_size=4)
    assert ours.backend == "dali", ours.reason
    sizes = [(next(iter(ours))[0].shape[-1], next(iter(theirs))[0].shape[-1])]
    tf.transforms[0].size = (24, 24)
    sizes.append((next(iter(ours))[0].shape[-1], next(iter(theirs))[0].shape[-1]))
    assert sizes == [(16, 16), (24, 24)]
    shuffled = wds.WebDataset(shards, shardshuffle=100).shuffle(10).decode("pil").to_tuple("jpg;png", "cls").map_tuple(
        tf, lambda y: y)
    loader = DataLoader(shuffled, batch_size=4, device="cpu")
    for _ in range(3):
        assert sum(len(y) for _, y in loader) == sum(1 for p in photo_folder.rglob("*") if p.is_file())
    assert loader._backend.planned_again == 0


class _FromFrame(tud.Dataset):
    """Files and labels in a pandas DataFrame, as many datasets keep them (read from a CSV)."""

    def __init__(self, frame, transform):
        self.df, self.transform = frame, transform

    def __len__(self):
        return len(self.df)

    def __getitem__(self, i):
        row = self.df.iloc[i]
        return self.transform(Image.open(row["path"]).convert("RGB")), int(row["label"])


def test_labels_changed_in_a_dataframe_are_followed(photo_folder):
    pd = pytest.importorskip("pandas")
    files = sorted(str(p) for p in photo_folder.rglob("*") if p.is_file())[:12]
    ds = _FromFrame(pd.DataFrame({"path": files, "label": [i % 3 for i in range(len(files))]}),
                    T.Compose([T.Resize((8, 8)), T.ToTensor()]))
    ours, theirs = DataLoader(ds, batch_size=6, device="cpu"), tud.DataLoader(ds, batch_size=6)
    assert ours.backend == "dali", ours.reason
    assert [y.tolist() for _, y in ours] == [y.tolist() for _, y in theirs]
    ds.df.loc[:, "label"] = 7  # relabelled in place
    assert [y.tolist() for _, y in ours] == [y.tolist() for _, y in theirs] == [[7] * 6] * 2
    ds.df = ds.df.iloc[::2]  # filtered
    assert [y.tolist() for _, y in ours] == [y.tolist() for _, y in theirs] == [[7] * 6]
