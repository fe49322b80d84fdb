"""The opt-in prepared copy (#35): later epochs decode a reduced copy; stale, corrupt and unwritable
caches are never served; concurrent writers leave whole copies. CPU only (correctness; its speed is
a benchmark's)."""
from __future__ import annotations

import glob
import os
import shutil
import threading

import pytest
import torch
from PIL import Image

from gputransforms import DataLoader, PreparedCopy, PreparedCopyWarning, datasets
from gputransforms import transforms as T
from gputransforms.prepared import PreparedReader

EVAL = T.Compose([T.Resize(256), T.CenterCrop(224), T.PILToTensor()])


@pytest.fixture
def photos(photo_folder, tmp_path):
    root = tmp_path / "photos"
    shutil.copytree(photo_folder, root)
    return root


def epoch(loader):
    return torch.cat([x for x, _ in loader])


def copies(cache):
    return sorted(glob.glob(os.path.join(cache, "*", "*.jpg")))


def test_later_epochs_decode_the_copy_close_to_the_full_image(photos, tmp_path):
    cache = str(tmp_path / "cache")
    full = epoch(DataLoader(datasets.ImageFolder(str(photos), transform=EVAL), batch_size=16, device="cpu"))
    loader = DataLoader(datasets.ImageFolder(str(photos), transform=EVAL), batch_size=16, device="cpu",
                        prepared=PreparedCopy(cache, max_side=320, quality=90))
    first = epoch(loader)
    assert torch.equal(first, full)  # the first read decodes the file itself
    made = copies(cache)
    assert len(made) == 48 and all(max(Image.open(p).size) <= 320 for p in made)
    second = epoch(loader)
    d = (second.float() - full.float()).abs()
    assert 0 < d.mean() < 6, d.mean()  # a downscaled source: close, not equal (docs/performance.md)
    assert "prepared copies in" in loader.explain()


def test_a_changed_source_is_never_served_its_old_copy(photos, tmp_path):
    cache = str(tmp_path / "cache")
    ds = datasets.ImageFolder(str(photos), transform=EVAL)
    loader = DataLoader(ds, batch_size=16, device="cpu", prepared=PreparedCopy(cache, max_side=320))
    epoch(loader)
    victim = ds.samples[5][0]
    Image.new("RGB", (640, 480), (250, 10, 10)).save(victim, quality=95)  # new size and mtime
    out = epoch(loader)
    assert (out[5].float().mean((1, 2)) - torch.tensor([250.0, 10, 10])).abs().max() < 8  # the new image
    out = epoch(loader)  # and its new copy
    assert (out[5].float().mean((1, 2)) - torch.tensor([250.0, 10, 10])).abs().max() < 8
    assert len(copies(cache)) == 49  # the old copy stays unreferenced


def test_a_corrupt_copy_is_not_served_and_is_rebuilt(photos, tmp_path):
    cache = str(tmp_path / "cache")
    ds = datasets.ImageFolder(str(photos), transform=EVAL)
    full = epoch(DataLoader(ds, batch_size=16, device="cpu"))
    loader = DataLoader(ds, batch_size=16, device="cpu", prepared=PreparedCopy(cache, max_side=320))
    epoch(loader)
    for p in copies(cache)[:10]:  # cut short
        data = open(p, "rb").read()
        open(p, "wb").write(data[: len(data) // 2])
    cut = epoch(loader)
    served_full = sum(torch.equal(a, b) for a, b in zip(cut, full))
    assert served_full == 10  # those ten came from their sources
    assert all(open(p, "rb").read()[-2:] == b"\xff\xd9" for p in copies(cache))  # and were written again


def test_concurrent_writers_leave_whole_copies(photos, tmp_path):
    """Four readers (as ranks sharing the directory) make the same copies at once: every copy is whole
    and no temporary file is left."""
    cache = str(tmp_path / "cache")
    ds = datasets.ImageFolder(str(photos), transform=EVAL)
    samples = DataLoader(ds, batch_size=16, device="cpu")._backend.files
    copy = PreparedCopy(cache, max_side=256)
    readers = [PreparedReader(copy, samples.reader(gpu=False, check_jpeg_scan=False), samples.paths, gpu=False,
                              check_jpeg_scan=False) for _ in range(4)]
    threads = [threading.Thread(target=lambda r=r: [r(i) for i in range(len(ds))]) for r in readers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    made = copies(cache)
    assert len(made) == 48 and not glob.glob(os.path.join(cache, "*", "*.tmp"))
    for p in made:
        Image.open(p).load()  # whole JPEGs


@pytest.mark.parametrize("why", ["not a directory", "disk full"])
def test_an_unwritable_cache_warns_once_and_decodes_in_full(photos, tmp_path, monkeypatch, why):
    ds = datasets.ImageFolder(str(photos), transform=EVAL)
    full = epoch(DataLoader(ds, batch_size=16, device="cpu"))
    if why == "not a directory":
        (tmp_path / "file").write_text("x")
        cache = str(tmp_path / "file" / "cache")  # root can write anywhere: a path under a file cannot be made
    else:
        cache = str(tmp_path / "cache")

        def full_disk(*a, **k):
            raise OSError(28, "No space left on device")
        monkeypatch.setattr(Image.Image, "save", full_disk)
    loader = DataLoader(ds, batch_size=16, device="cpu", prepared=PreparedCopy(cache, max_side=320))
    with pytest.warns(PreparedCopyWarning) as caught:
        out = [epoch(loader) for _ in range(2)]
    assert len(caught) == 1 and "goes on decoding the full images" in str(caught[0].message)
    assert all(torch.equal(o, full) for o in out)


def test_images_within_max_side_are_read_as_they_are(photos, tmp_path):
    cache = str(tmp_path / "cache")
    ds = datasets.ImageFolder(str(photos), transform=EVAL)
    full = epoch(DataLoader(ds, batch_size=16, device="cpu"))
    loader = DataLoader(ds, batch_size=16, device="cpu", prepared=PreparedCopy(cache, max_side=4096))
    assert all(torch.equal(epoch(loader), full) for _ in range(2))
    assert not copies(cache) and len(glob.glob(os.path.join(cache, "*", "*.orig"))) == 48


def test_prepared_refuses_what_is_not_image_files(tmp_path):
    x = torch.randint(0, 255, (8, 3, 16, 16), dtype=torch.uint8)
    with pytest.raises(ValueError, match="PreparedCopy"):
        PreparedCopy(str(tmp_path), max_side=8)
    ds = torch.utils.data.TensorDataset(x, torch.zeros(8))
    loader = DataLoader(ds, batch_size=4, device="cpu", prepared=PreparedCopy(str(tmp_path)))
    assert loader.backend == "arrays"  # in-memory data never reads files: nothing to prepare
