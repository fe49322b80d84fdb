"""DataLoader semantics against torch's: coverage, order, batching, labels, fallbacks."""

import os
import warnings

import numpy as np
import pytest
import torch
import torch.utils.data as tud
import torchvision
from PIL import Image

import gputransforms
from gputransforms import DataLoader, FallbackWarning, datasets
from gputransforms import transforms as T

from conftest import DEVICES, decode_index

# flat-colour files: the centre pixel survives any of these chains
INDEX_TF = T.Compose([T.Resize((8, 8)), T.PILToTensor()])


def epoch(loader):
    idx, cls, lab, sizes = [], [], [], []
    for images, labels in loader:
        i, c = decode_index(images)
        idx += i
        cls += c
        lab += labels.cpu().tolist()
        sizes.append(len(labels))
        assert labels.dtype == torch.int64 and images.shape[0] == labels.shape[0]
    return idx, cls, lab, sizes


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("batch_size,drop_last", [(1, False), (5, False), (5, True), (16, False), (36, True),
                                                  (37, False), (64, False)])
def test_every_sample_once_per_epoch(indexed_folder, device, batch_size, drop_last):
    ds = datasets.ImageFolder(str(indexed_folder), transform=INDEX_TF)
    loader = DataLoader(ds, batch_size=batch_size, shuffle=True, drop_last=drop_last, device=device, num_workers=2)
    torch_loader = tud.DataLoader(ds, batch_size=batch_size, shuffle=True, drop_last=drop_last)
    assert len(loader) == len(torch_loader)
    n = len(ds)
    orders = []
    for _ in range(2):
        idx, cls, lab, sizes = epoch(loader)
        full = n // batch_size * batch_size
        expected_sizes = [batch_size] * (n // batch_size) + ([] if drop_last or n == full else [n - full])
        assert sizes == expected_sizes
        assert len(sizes) == len(loader)
        assert len(set(idx)) == len(idx), "a sample came twice"
        if not drop_last:
            assert sorted(idx) == list(range(n)), "a sample is missing"
        assert lab == cls, "a label does not belong to its image"
        assert lab == [ds.targets[i] for i in idx]
        orders.append(idx)
    if batch_size < n:
        assert orders[0] != orders[1], "shuffle must differ between epochs"


@pytest.mark.parametrize("device", DEVICES)
def test_same_index_order_as_torch_with_same_generator(indexed_folder, device):
    ds = datasets.ImageFolder(str(indexed_folder), transform=INDEX_TF)
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    ours = DataLoader(ds, batch_size=8, shuffle=True, generator=g1, device=device)
    theirs = tud.DataLoader(ds, batch_size=8, shuffle=True, generator=g2)
    for _ in range(2):
        got = epoch(ours)[0]
        want = [i for images, _ in theirs for i in decode_index(images)[0]]
        assert got == want


@pytest.mark.parametrize("generator", [True, False])
def test_persistent_workers_draw_later_epochs_as_torchs(indexed_folder, photo_folder, generator):
    """With persistent_workers=True torch's DataLoader makes its iterator once and resets it for each later epoch:
    only the first epoch draws a base seed (from the generator, or torch's global RNG), so the later epochs' orders
    follow from the sampler's draws alone. Ours drew a base seed every epoch: epochs 2 and 3 came in other orders
    than torch's. The same three epochs as torch's with and without a generator, and the epochs' random transforms
    still differ."""
    ds = datasets.ImageFolder(str(indexed_folder), transform=INDEX_TF)
    orders = []
    for make in (DataLoader, tud.DataLoader):
        torch.manual_seed(4)
        loader = make(ds, batch_size=8, shuffle=True, num_workers=2, persistent_workers=True,
                      generator=torch.Generator().manual_seed(3) if generator else None)
        orders.append([[i for images, _ in loader for i in decode_index(images)[0]] for _ in range(3)])
    assert orders[0] == orders[1]
    assert orders[0][0] != orders[0][1] != orders[0][2]
    torch.manual_seed(4)
    flips = DataLoader(datasets.ImageFolder(str(photo_folder), transform=T.Compose([
        T.Resize((8, 8)), T.RandomHorizontalFlip(), T.PILToTensor()])), batch_size=8, num_workers=2,
        persistent_workers=True)
    assert len({tuple(torch.cat([x for x, _ in flips]).flatten().tolist()) for _ in range(3)}) == 3


@pytest.mark.parametrize("device", DEVICES)
def test_sequential_and_sampler_and_batch_sampler(indexed_folder, device):
    ds = datasets.ImageFolder(str(indexed_folder), transform=INDEX_TF)
    assert epoch(DataLoader(ds, batch_size=10, device=device))[0] == list(range(len(ds)))
    sub = [5, 3, 30, 1]
    assert epoch(DataLoader(ds, batch_size=3, sampler=sub, device=device))[0] == sub
    assert epoch(DataLoader(ds, batch_sampler=[[4, 2], [9], [0, 1, 2]], device=device))[0] == [4, 2, 9, 0, 1, 2]
    # sharding: two DistributedSampler ranks cover the dataset once between them (padding aside)
    shards = [tud.distributed.DistributedSampler(ds, num_replicas=2, rank=r, shuffle=True, seed=1) for r in (0, 1)]
    got = [epoch(DataLoader(ds, batch_size=4, sampler=s, device=device))[0] for s in shards]
    assert set(got[0]) | set(got[1]) == set(range(len(ds)))
    assert got[0] == list(iter(shards[0]))


class _Pairs:
    """A batch sampler of the user's that declares no batch_size (the loader scans it for its largest batch), over
    a RandomSampler with its own generator, shuffling the pairs with a NumPy generator of its own."""

    def __init__(self, sampler, rng):
        self.sampler, self.rng = sampler, rng

    def __iter__(self):
        order = list(self.sampler)
        pairs = [order[k:k + 2] for k in range(0, len(order), 2)]
        return iter([pairs[k] for k in self.rng.permutation(len(pairs))])

    def __len__(self):
        return -(-len(self.sampler) // 2)


@pytest.mark.parametrize("device", DEVICES)
def test_a_batch_sampler_scanned_for_its_size_draws_its_first_epoch_as_torchs(indexed_folder, device):
    """The scan for the largest batch leaves the generators the sampler holds as they were: the first epoch is
    the one torch's DataLoader draws (it was torch's second)."""
    ds = datasets.ImageFolder(str(indexed_folder), transform=INDEX_TF)

    def sampler():
        return _Pairs(tud.RandomSampler(ds, generator=torch.Generator().manual_seed(4)), np.random.default_rng(5))

    ours, theirs = DataLoader(ds, batch_sampler=sampler(), device=device), tud.DataLoader(ds, batch_sampler=sampler())
    for _ in range(2):
        assert epoch(ours)[0] == [i for images, _ in theirs for i in decode_index(images)[0]]


class _OwnDraws(tud.Dataset):
    """A Dataset of the user's that draws each label from a generator of its own (NumPy's, torch's or Python's)."""

    def __init__(self, folder, kind: str):
        import random

        self.files = sorted(str(p) for p in folder.rglob("*") if p.is_file())[:12]
        self.kind = kind
        self.rng = {"numpy": lambda: np.random.default_rng(0), "torch": lambda: torch.Generator().manual_seed(0),
                    "python": lambda: random.Random(0)}[kind]()

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        r = int(self.rng.integers(1000)) if self.kind == "numpy" else self.rng.randint(0, 999) if \
            self.kind == "python" else int(torch.randint(1000, (), generator=self.rng))
        return INDEX_TF(Image.open(self.files[i]).convert("RGB")), r


@pytest.mark.parametrize("kind", ["numpy", "torch", "python"])
def test_a_dataset_drawing_from_its_own_generator_draws_as_with_torchs_loader(indexed_folder, kind):
    """Choosing a backend probes ``__getitem__``; the generators the dataset holds are left as they were, so its
    labels (drawn at random: it runs on torch's DataLoader, with the reason) are the ones torch's DataLoader gives."""
    with pytest.warns(FallbackWarning):
        ours = DataLoader(_OwnDraws(indexed_folder, kind), batch_size=4, device="cpu")
    theirs = tud.DataLoader(_OwnDraws(indexed_folder, kind), batch_size=4)
    got = [int(v) for _, labels in ours for v in labels]
    assert len(got) == 12 and got == [int(v) for _, labels in theirs for v in labels]


@pytest.mark.parametrize("device", DEVICES)
def test_break_mid_epoch_then_iterate_again(indexed_folder, device):
    ds = datasets.ImageFolder(str(indexed_folder), transform=INDEX_TF)
    loader = DataLoader(ds, batch_size=4, shuffle=True, device=device, prefetch_factor=3)
    for k, _ in enumerate(loader):
        if k == 2:
            break
    idx = epoch(loader)[0]
    assert sorted(idx) == list(range(len(ds)))
    it = iter(loader)
    next(it)
    assert sorted(epoch(loader)[0]) == list(range(len(ds)))


def test_torch_argument_errors_are_torchs(indexed_folder):
    ds = datasets.ImageFolder(str(indexed_folder), transform=INDEX_TF)
    for kwargs in (dict(shuffle=True, sampler=[0, 1]), dict(batch_sampler=[[0]], batch_size=2),
                   dict(num_workers=-1), dict(batch_size=None, drop_last=True)):
        with pytest.raises(ValueError) as ours:
            DataLoader(ds, **kwargs)
        with pytest.raises(ValueError) as theirs:
            tud.DataLoader(ds, **kwargs)
        assert str(ours.value) == str(theirs.value)


def test_target_transform_applied(indexed_folder):
    ds = datasets.ImageFolder(str(indexed_folder), transform=INDEX_TF, target_transform=lambda t: t + 10)
    images, labels = next(iter(DataLoader(ds, batch_size=37, device="cpu")))
    assert labels.tolist() == [t + 10 for t in ds.targets]


def test_no_dali_runs_torchvision(indexed_folder, monkeypatch):
    import gputransforms.backends as B

    monkeypatch.setattr(B, "dali_available", lambda: False)
    ds = datasets.ImageFolder(str(indexed_folder), transform=INDEX_TF)
    with pytest.warns(FallbackWarning, match="DALI is not installed"):
        loader = DataLoader(ds, batch_size=8, shuffle=True, device="cpu")
    assert loader.backend == "torchvision"
    idx, cls, lab, _ = epoch(loader)
    assert sorted(idx) == list(range(len(ds))) and lab == cls


def test_custom_collate_is_compiled_and_a_plain_dataset_uses_torchvision_path(indexed_folder):
    ds = datasets.ImageFolder(str(indexed_folder), transform=INDEX_TF)
    loader = DataLoader(ds, batch_size=4, collate_fn=lambda b: len(b), device="cpu")
    assert loader.backend == "dali"
    assert list(loader) == [len(b) for b in tud.DataLoader(ds, batch_size=4, collate_fn=lambda b: b)]

    class Plain(tud.Dataset):
        def __len__(self):
            return 3

        def __getitem__(self, i):
            return torch.full((3, 2, 2), i), i

    with pytest.warns(FallbackWarning, match=r"Plain.__getitem__ opens no image with PIL.Image.open \(its samples are not image files\)"):
        loader = DataLoader(Plain(), batch_size=2, device="cpu")
    assert [y.tolist() for _, y in loader] == [[0, 1], [2]]


def test_untransformable_tail_runs_per_sample_with_torchvision_meaning(photo_folder):
    """A transform with neither a DALI nor a batched lowering (a rotation with expand=True: the
    output size depends on the angle) runs per sample after the graph with torchvision's tensor
    kernel, on the device, and the user is told; what follows it (Grayscale) runs batched. The
    result matches torchvision's PIL path within torchvision's own tensor-vs-PIL difference
    (nearest sampling at pixel centres; uint8 grayscale truncates where PIL rounds: < 1 in 0-255)."""
    make = lambda: T.Compose([T.Resize(64), T.CenterCrop(64), T.RandomRotation((30, 30), expand=True),
                              T.Grayscale(num_output_channels=3), T.ToTensor()])
    ds = datasets.ImageFolder(str(photo_folder), transform=make())
    with pytest.warns(FallbackWarning, match="RandomRotation") as rec:
        loader = DataLoader(ds, batch_size=16, device="cpu")
    assert "Grayscale" not in str(rec[0].message)
    assert loader.plan.tail_mode == "tensor"
    text = loader.explain()
    assert "per sample  RandomRotation" in text and "batched     Grayscale" in text and "crop_mirror_normalize" in text
    got = torch.cat([x for x, _ in loader])
    ref_ds = torchvision.datasets.ImageFolder(str(photo_folder), transform=make())
    ref = torch.stack([ref_ds[i][0] for i in range(len(ref_ds))])
    assert got.dtype == ref.dtype == torch.float32 and got.shape == ref.shape
    assert ((got - ref).abs() * 255).mean() < 1.0


def test_callable_before_to_tensor_receives_a_pil_image(photo_folder):
    seen = []

    def probe(img):
        seen.append(type(img))
        return img.convert("L").convert("RGB")  # PIL-only code, as users write it

    tf = T.Compose([T.Resize((32, 32)), T.Lambda(probe), T.ToTensor()])
    ds = datasets.ImageFolder(str(photo_folder), transform=tf)
    with pytest.warns(FallbackWarning):
        loader = DataLoader(ds, batch_size=4, device="cpu")
    assert loader.plan.tail_mode == "pil"
    x, _ = next(iter(loader))
    assert all(issubclass(t, Image.Image) for t in seen) and x.shape == (4, 3, 32, 32)
    torch.testing.assert_close(x[:, 0], x[:, 1])


def test_pil_tail_with_workers_runs_on_torchs_workers(photo_folder):
    """Per-sample PIL work after the graph would run in the main thread; with workers requested the
    whole chain runs on torch's DataLoader instead (measured 5x faster for timm's RandAugment chain),
    the user is told, and num_workers=0 keeps the graph."""
    tf = T.Compose([T.Resize((32, 32)), T.Lambda(lambda img: img.convert("L").convert("RGB")), T.ToTensor()])
    ds = datasets.ImageFolder(str(photo_folder), transform=tf)
    with pytest.warns(FallbackWarning, match="num_workers=0"):
        loader = DataLoader(ds, batch_size=4, num_workers=2, device="cpu")
    assert loader.backend == "torchvision" and "num_workers=0 would run" in loader.explain()
    ref = torch.stack([ds[i][0] for i in range(4)])
    x, _ = next(iter(loader))
    torch.testing.assert_close(x, ref)
    assert DataLoader(ds, batch_size=4, num_workers=0, device="cpu").backend == "dali"


def test_lambda_after_to_tensor_receives_a_tensor(photo_folder):
    seen = []

    def probe(x):
        seen.append(type(x))
        return x * 2

    tf = T.Compose([T.Resize((32, 32)), T.ToTensor(), T.Lambda(probe)])
    ds = datasets.ImageFolder(str(photo_folder), transform=tf)
    with pytest.warns(FallbackWarning):
        x, _ = next(iter(DataLoader(ds, batch_size=4, device="cpu")))
    assert set(seen) == {torch.Tensor} and x.shape == (4, 3, 32, 32) and x.max() > 1.0


def test_chain_ending_in_pil_image_is_a_clear_error(indexed_folder):
    ds = datasets.ImageFolder(str(indexed_folder), transform=T.Compose([T.Resize(8)]))
    with pytest.raises(TypeError, match="ToTensor"):
        DataLoader(ds, batch_size=2, device="cpu")


def test_explain_shows_fusions():
    train = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
                       T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
    text = train.explain("gpu")
    assert "decoders.image_random_crop(mixed)" in text and "ROI decode" in text
    assert "crop_mirror_normalize(gpu)" in text and "fused" in text
    steps = gputransforms.plan(train).steps
    assert [s.op for s in steps] == ["decode", "resize", "crop_mirror_normalize"]
    ev = gputransforms.plan(T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor()]))
    assert [s.op for s in ev.steps] == ["decode", "resize", "crop_mirror_normalize"] and not ev.tail
    # a flip before a crop cannot move into crop_mirror_normalize (it mirrors after cropping)
    p = gputransforms.plan(T.Compose([T.RandomHorizontalFlip(), T.CenterCrop(10), T.ToTensor()]))
    assert [s.op for s in p.steps] == ["decode", "flip", "crop_mirror_normalize"]


def test_transforms_are_torchvisions():
    """Same signatures, defaults, validation errors and eager behaviour, by being the same classes."""
    for name in ["RandomResizedCrop", "RandomHorizontalFlip", "RandomVerticalFlip", "Resize", "CenterCrop",
                 "RandomCrop", "ToTensor", "PILToTensor", "ConvertImageDtype", "Normalize"]:
        assert getattr(T, name) is getattr(torchvision.transforms, name)
    assert T.ToImage is torchvision.transforms.v2.ToImage and T.ToDtype is torchvision.transforms.v2.ToDtype
    assert issubclass(T.Compose, torchvision.transforms.Compose)
    with pytest.raises(TypeError, match="Scale should be a sequence"):
        T.RandomResizedCrop(224, scale=0.5)


def test_imagefolder_equals_torchvisions(photo_folder, tmp_path):
    ours = datasets.ImageFolder(str(photo_folder))
    theirs = torchvision.datasets.ImageFolder(str(photo_folder))
    for attr in ("classes", "class_to_idx", "samples", "targets", "imgs", "extensions"):
        assert getattr(ours, attr) == getattr(theirs, attr)
    assert len(ours) == len(theirs)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "x.jpg").write_bytes((photo_folder / theirs.classes[0]).glob("*.jpg").__next__().read_bytes())
    for cls in (datasets.ImageFolder, torchvision.datasets.ImageFolder):
        with pytest.raises(FileNotFoundError, match="Found no valid file for the classes b"):
            cls(str(tmp_path))
    assert datasets.ImageFolder(str(tmp_path), allow_empty=True).classes == ["a", "b"]
    only_a = datasets.ImageFolder(str(tmp_path), allow_empty=True, is_valid_file=lambda p: p.endswith("x.jpg"))
    assert len(only_a) == 1
    wrapped = datasets.ImageFolder.from_torchvision(theirs)
    assert wrapped.samples == theirs.samples and isinstance(wrapped, datasets.ImageFolder)


@pytest.mark.parametrize("device", DEVICES)
def test_accepts_torchvision_imagefolder_instance(photo_folder, device):
    tf = torchvision.transforms.Compose([torchvision.transforms.Resize((32, 32)), torchvision.transforms.ToTensor()])
    loader = DataLoader(torchvision.datasets.ImageFolder(str(photo_folder), transform=tf), batch_size=16,
                        device=device)
    assert loader.backend == "dali"
    x, y = next(iter(loader))
    assert x.shape == (16, 3, 32, 32) and x.dtype == torch.float32


def test_explain_iterable_dataset():
    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            yield from (torch.zeros(3, 4, 4) for _ in range(3))

    with pytest.warns(FallbackWarning, match="iterable dataset"):
        loader = DataLoader(Stream(), batch_size=2, device="cpu")
    text = loader.explain()
    assert "an iterable dataset (Stream)" in text and "backend=torchvision" in text, text
    assert [b.shape[0] for b in loader] == [2, 1]


def test_no_noise_at_interpreter_exit(indexed_folder):
    """A loader still alive (mid-epoch) when the interpreter exits leaves nothing on stderr."""
    import subprocess
    import sys

    code = ("import gputransforms as g\n"
            f"ds = g.datasets.ImageFolder({str(indexed_folder)!r}, transform=g.transforms.Compose(["
            "g.transforms.Resize((8, 8)), g.transforms.PILToTensor()]))\n"  # (one size: torch's collate stacks them)
            "loader = g.DataLoader(ds, batch_size=4, device='cpu')\n"
            "it = iter(loader); next(it)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "Exception ignored" not in done.stderr and "Error" not in done.stderr, done.stderr


@pytest.mark.parametrize("device", DEVICES)
def test_pin_memory_means_what_it_means_in_torch(indexed_folder, device):
    """pin_memory=True: CPU batches pinned where an accelerator is present, torch's warning where none;
    GPU batches have nothing to pin. explain() says which."""
    ds = datasets.ImageFolder(str(indexed_folder), transform=INDEX_TF)
    loader = DataLoader(ds, batch_size=8, pin_memory=True, device=device)
    if device == "gpu":
        assert "nothing to pin" in loader.explain()
        assert next(iter(loader))[0].is_cuda
    elif torch.cuda.is_available():
        assert "pinned host memory" in loader.explain()
        x, y = next(iter(loader))
        assert x.is_pinned() and y.is_pinned()
    else:
        assert "no accelerator" in loader.explain()
        with pytest.warns(UserWarning, match="no accelerator is found"):
            x, _ = next(iter(loader))
        assert not x.is_pinned()


class _Ragged(tud.Dataset):
    """Images of their own sizes and a target dict: what a detection Dataset of the user's gives."""

    def __len__(self):
        return 12

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return torch.rand(3, 40 + 7 * i, 60 - 3 * i, generator=g), {"boxes": torch.rand(i % 3 + 1, 4, generator=g)}


def _tuples(batch):
    return tuple(zip(*batch))


@pytest.mark.gpu
def test_torchs_workers_pin_in_their_thread_for_the_gpu():
    """On torch's workers with batches for the GPU, torch's pin-memory thread pins them (pinned in the
    loop's thread a detection batch held it: 83-103 img/s against 158-403); the user's pin_memory is
    left as set, and the batches are torch's, on the device."""
    with pytest.warns(FallbackWarning):
        loader = DataLoader(_Ragged(), batch_size=4, num_workers=2, collate_fn=_tuples, device="gpu")
    assert loader.backend == "torchvision" and loader.pin_memory is False
    it = iter(loader)
    assert it.it._pin_memory and loader.pin_memory is False
    got = list(it)
    want = list(tud.DataLoader(_Ragged(), batch_size=4, num_workers=2, collate_fn=_tuples))
    for (gi, gt), (wi, wt) in zip(got, want):
        for a, b in zip(gi, wi):
            assert a.is_cuda and torch.equal(a.cpu(), b)
        for a, b in zip(gt, wt):
            assert a["boxes"].is_cuda and torch.equal(a["boxes"].cpu(), b["boxes"])


def test_fallback_warning_names_the_transform_and_points_at_the_users_line(indexed_folder):
    class Mine(T.RandomHorizontalFlip):
        def forward(self, img):
            return img

    ds = datasets.ImageFolder(str(indexed_folder), transform=T.Compose([Mine(), T.PILToTensor()]))

    class MyLoader(DataLoader):  # a user's subclass: the warning still points here, at the user's code
        pass

    with pytest.warns(FallbackWarning, match="Mine") as caught:
        MyLoader(ds, batch_size=4, device="cpu")
    assert caught[0].filename == __file__, caught[0].filename


class _JointFlip:
    """A user's own joint transform, as torchvision's detection reference writes them without --use-v2: it draws
    from torch's, Python's and NumPy's generators."""

    def __call__(self, image, target):
        import random

        import numpy as np

        flip = torch.rand(1).item() < 0.5
        image = image.transpose(Image.FLIP_LEFT_RIGHT) if flip else image
        return torchvision.transforms.functional.pil_to_tensor(image), dict(
            target, flip=flip, r=random.random(), n=float(np.random.rand()))


class _JointDataset(tud.Dataset):
    def __init__(self, files):
        self.files = files
        self._transforms = _JointFlip()

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        return self._transforms(Image.open(self.files[i]).convert("RGB"), {"i": i})


def _random_states():
    import random

    import numpy as np

    return torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy()


@pytest.mark.parametrize("workers", [0, 2])
def test_building_a_loader_leaves_the_random_state_as_torchs_does(indexed_folder, workers):
    """torch's DataLoader draws nothing when it is built. Ours runs the dataset's ``__getitem__`` to find what it
    does (``datasets.discover``): that must leave torch's, Python's and NumPy's generators as they were, or a
    dataset that runs on torch's workers gets another order and other draws than torch's DataLoader from the same
    seed (found with torchvision's detection reference without --use-v2: its CocoDetection subclass and joint
    transforms)."""
    import random

    import numpy as np

    files = sorted(str(p) for p in indexed_folder.rglob("*.jpg"))
    ds = _JointDataset(files)

    def batches(cls):
        torch.manual_seed(3)
        random.seed(3)
        np.random.seed(3)
        kw = dict(device="cpu") if cls is DataLoader else {}
        before = _random_states()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dl = cls(ds, batch_size=5, shuffle=True, num_workers=workers, collate_fn=lambda b: tuple(zip(*b)), **kw)
        after = _random_states()
        assert torch.equal(before[0], after[0]) and before[1] == after[1] and (before[2] == after[2]).all()
        return [(img, tgt) for _ in range(2) for img, tgt in dl]

    theirs, ours = batches(tud.DataLoader), batches(DataLoader)
    assert len(theirs) == len(ours) == 2 * 8
    for (ti, tt), (oi, ot) in zip(theirs, ours):
        assert tt == ot  # the order, and every draw (the flip, Python's, NumPy's)
        assert all(torch.equal(a, b) for a, b in zip(ti, oi))


@pytest.mark.parametrize("device", DEVICES)
def test_imagefolder_with_torchvisions_decode_image_loader(photo_folder, tmp_path, device):
    """``ImageFolder(root, transform, loader=torchvision.io.decode_image)`` (torchvision's v2 docs' way) hands the
    transform a uint8 (3, H, W) tensor: the chain is planned on a tensor (v2's ToImage a no-op), compiles, and
    gives torchvision's images; a v1 ToTensor raises torchvision's own TypeError there, on both loaders; a file of
    other than 3 channels runs as written, with that reason. It ran on torch's DataLoader before ("a custom
    loader")."""
    from torchvision.io import decode_image
    from torchvision.transforms import v2

    eval_v2 = v2.Compose([v2.ToImage(), v2.Resize(72), v2.CenterCrop(64), v2.ToDtype(torch.float32, scale=True),
                          v2.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
    for tf, worst in ((eval_v2, 0.6), (v2.Compose([v2.Resize((40, 48))]), 0.3)):
        ds = torchvision.datasets.ImageFolder(str(photo_folder), tf, loader=decode_image)
        loader = DataLoader(ds, batch_size=16, device=device)
        assert loader.backend == "dali", loader.reason
        got = torch.cat([x.cpu() for x, _ in loader])
        ref = torch.stack([ds[i][0] for i in range(len(ds))])
        assert got.dtype == ref.dtype and got.shape == ref.shape
        scale = torch.tensor([0.229, 0.224, 0.225])[:, None, None] * 255 if got.is_floating_point() else 1
        assert ((got.double() - ref.double()).abs() * scale).mean() < (worst if device == "cpu" else 1.0)
    v1 = torchvision.datasets.ImageFolder(str(photo_folder), T.Compose([T.Resize(64), T.ToTensor()]),
                                          loader=decode_image)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loader = DataLoader(v1, batch_size=16, device=device)
    assert loader.backend == "torchvision" and "ToTensor" in loader.reason
    with warnings.catch_warnings():  # a Subset's files are read as its dataset reads them
        warnings.simplefilter("ignore")
        assert DataLoader(tud.Subset(v1, [0, 2]), batch_size=2, device=device).backend == "torchvision"
    with pytest.raises(TypeError, match="pic should be PIL Image") as ours:
        next(iter(loader))
    with pytest.raises(TypeError) as ref:
        next(iter(tud.DataLoader(v1, batch_size=16)))
    assert str(ours.value) == str(ref.value)
    grey = tmp_path / "grey" / "a"
    grey.mkdir(parents=True)
    Image.new("L", (32, 24), 90).save(grey / "0.png")
    with pytest.warns(FallbackWarning, match="other than 3 channels"):
        DataLoader(torchvision.datasets.ImageFolder(str(tmp_path / "grey"), eval_v2, loader=decode_image),
                   batch_size=1, device=device)


class _TutorialImages(tud.Dataset):
    """PyTorch's "Datasets & DataLoaders" tutorial's CustomImageDataset, restated (a list of rows for its pandas
    table): the image read with torchvision.io.read_image, the label from the row."""

    def __init__(self, rows, img_dir, transform=None, target_transform=None):
        self.img_labels, self.img_dir = rows, img_dir
        self.transform, self.target_transform = transform, target_transform

    def __len__(self):
        return len(self.img_labels)

    def __getitem__(self, idx):
        from torchvision.io import read_image

        image = read_image(os.path.join(self.img_dir, self.img_labels[idx][0]))
        label = self.img_labels[idx][1]
        if self.transform:
            image = self.transform(image)
        if self.target_transform:
            label = self.target_transform(label)
        return image, label


@pytest.mark.parametrize("device", DEVICES)
def test_the_data_tutorials_dataset_compiles(photo_folder, tmp_path, device):
    """PyTorch's data tutorial's Dataset reads its images with torchvision.io.read_image: it compiles (the reads
    found by running it on a placeholder tensor, the chain planned on the tensor), with torchvision's images and
    the labels; a grey file read as it is (1 channel) runs as written, with that reason. It ran on torch's
    DataLoader before ("opens no image with PIL.Image.open")."""
    from torchvision.transforms import v2

    root = str(photo_folder)
    rows = [(os.path.relpath(p, root), k % 3) for k, p in enumerate(sorted(photo_folder.rglob("*.jpg")))]
    tf = v2.Compose([v2.Resize(72), v2.CenterCrop(64), v2.ToDtype(torch.float32, scale=True)])
    ds = _TutorialImages(rows, root, transform=tf)
    loader = DataLoader(ds, batch_size=16, device=device)
    assert loader.backend == "dali", loader.reason
    got, labels = zip(*((x.cpu(), y.cpu()) for x, y in loader))
    got, ref = torch.cat(got), torch.stack([ds[i][0] for i in range(len(ds))])
    assert got.shape == ref.shape and ((got - ref).abs() * 255).mean() < (0.3 if device == "cpu" else 1.0)
    assert torch.cat(labels).tolist() == [r[1] for r in rows]
    Image.new("L", (32, 24), 90).save(tmp_path / "grey.png")
    with pytest.warns(FallbackWarning, match="not 3 channels"):
        DataLoader(_TutorialImages([("grey.png", 0)], str(tmp_path), transform=tf), batch_size=1, device=device)


class _DecodedImages(_TutorialImages):
    """The same, decoding with torchvision.io.decode_image(path): through the module, or by a name bound at import."""

    def __init__(self, *args, bound, **kwargs):
        super().__init__(*args, **kwargs)
        self.bound = bound

    def __getitem__(self, idx):
        import torchvision.io

        path = os.path.join(self.img_dir, self.img_labels[idx][0])
        image = (_BOUND_DECODE_IMAGE if self.bound else torchvision.io.decode_image)(path)
        return self.transform(image), self.img_labels[idx][1]


_BOUND_DECODE_IMAGE = torchvision.io.decode_image  # (bound when this module was imported)


def test_a_dataset_decoding_with_decode_image(photo_folder):
    """``torchvision.io.decode_image(path)`` through the module compiles as read_image does; by a name bound at
    import it cannot be answered without decoding, and the reason says so and how to compile it."""
    from torchvision.transforms import v2

    root = str(photo_folder)
    rows = [(os.path.relpath(p, root), 0) for p in sorted(photo_folder.rglob("*.jpg"))[:8]]
    tf = v2.Compose([v2.Resize(40), v2.CenterCrop(32)])
    loader = DataLoader(_DecodedImages(rows, root, transform=tf, bound=False), batch_size=4, device="cpu")
    assert loader.backend == "dali", loader.reason
    with pytest.warns(FallbackWarning, match="bound when it was imported.*call torchvision.io.decode_image"):
        loader = DataLoader(_DecodedImages(rows, root, transform=tf, bound=True), batch_size=4, device="cpu")
    assert loader.backend == "torchvision"


@pytest.mark.parametrize("device", DEVICES)
def test_a_batch_is_the_list_default_collate_makes(indexed_folder, device):
    """torch's default_collate makes a list of (image, target) tuples' batches; so does ours, on the file path,
    the in-memory path (op by op and, on the GPU, as a CUDA graph) and after the graph's tail (it handed over a
    tuple before)."""
    from test_inmemory import fake

    file_tf = T.Compose([T.Resize((8, 8)), T.PILToTensor(), T.ColorJitter(0.2)])
    memory_tf = T.Compose([T.RandomCrop(24), T.ToTensor()])
    for ds in (datasets.ImageFolder(str(indexed_folder), transform=INDEX_TF),
               datasets.ImageFolder(str(indexed_folder), transform=file_tf),
               fake(torchvision.datasets.CIFAR10, n=16, transform=memory_tf)):
        ours = [b for _, b in zip(range(2), DataLoader(ds, batch_size=4, device=device))]
        theirs = next(iter(tud.DataLoader(ds, batch_size=4)))
        assert all(type(b) is type(theirs) is list and len(b) == len(theirs) == 2 for b in ours), (ds, ours[0])
