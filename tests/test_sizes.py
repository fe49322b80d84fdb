"""Chains whose samples change size one by one after the graph, side by side with torch's DataLoader over the
same dataset object from one seed (no workers: both draw from torch's generator sample after sample).

Found by running every v2 transform class torchvision 0.29 has, first in a chain on PIL images and after
``ToImage``: these raised in gputransforms where torchvision runs (a per-sample random resize before a resize to
one size; a size-changing member of RandomApply/RandomChoice/RandomOrder; PIL's box and Hamming filters), or
ran where torchvision raises (samples of their own sizes and torch's default_collate)."""
import numpy as np
import pytest
import torch
import torch.utils.data as tud
import torchvision
from torchvision.transforms import InterpolationMode
from torchvision.transforms import v2

from gputransforms import DataLoader, datasets

from conftest import DEVICES
from test_inmemory import fake


def _float(steps: list) -> v2.Compose:
    return v2.Compose(steps + [v2.ToDtype(torch.float32, scale=True)])


def both(ds, device, **kw):
    """(ours, torch's) batches, or (ours, torch's) exceptions, from one seed."""
    out = []
    for make in (lambda: DataLoader(ds, device=device, **kw), lambda: tud.DataLoader(ds, **kw)):
        torch.manual_seed(0)
        try:
            out.append(list(make()))
        except Exception as e:  # noqa: BLE001 - compared with torch's below
            out.append(e)
    return out


def same_images(ours, theirs, bound: float):
    """The same batches: images (a batch, or a tuple of samples of their own sizes) within ``bound`` of 255 on
    average, labels equal."""
    assert len(ours) == len(theirs)
    for (a, la), (b, lb) in zip(ours, theirs):
        assert type(a) is type(b)
        for x, y in zip(*((a, b) if isinstance(a, tuple) else ([a], [b]))):
            assert x.shape == y.shape and x.dtype == y.dtype
            assert (x.cpu() - y).abs().mean().item() * 255 < bound
        assert torch.equal(torch.as_tensor(la).cpu(), torch.as_tensor(lb))


PER_SAMPLE_SIZES = {"ScaleJitter": v2.ScaleJitter((64, 64)), "RandomShortestSize": v2.RandomShortestSize([48, 64], 80),
                    "RandomResize": v2.RandomResize(48, 80), "RandomZoomOut": v2.RandomZoomOut(p=1.0)}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(PER_SAMPLE_SIZES))
@pytest.mark.parametrize("first", ["pil", "tensor"])
def test_a_per_sample_resize_before_a_resize_to_one_size(photo_folder, device, name, first):
    """A transform that gives each sample its own size, then a resize to one size: the steps after it run per
    sample until the samples are one size again, as torchvision runs them (before: "stack expects each tensor
    to be equal size" from the batched stage)."""
    t = PER_SAMPLE_SIZES[name]
    steps = [v2.Resize((80, 96)), t, v2.ToImage()] if first == "pil" else [v2.Resize((80, 96)), v2.ToImage(), t]
    ds = datasets.ImageFolder(photo_folder, transform=_float(steps + [v2.Resize((64, 64))]))
    ours, theirs = both(ds, device, batch_size=8)
    same_images(ours, theirs, 1.0 if device == "cpu" else 3.0)


CONTAINERS = {"RandomOrder": v2.RandomOrder([v2.RandomHorizontalFlip(), v2.Pad(2)]),
              "RandomApply": v2.RandomApply([v2.Pad(3)], p=0.5),
              "RandomChoice": v2.RandomChoice([v2.CenterCrop(60), v2.RandomHorizontalFlip()])}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(CONTAINERS))
def test_containers_of_size_changing_transforms(photo_folder, device, name):
    """A RandomOrder, RandomApply or RandomChoice holding a pad or a crop: per sample (the batched containers
    write each row's output back into the batch, which needs its shape kept; before: a shape-mismatch error)."""
    steps = [v2.Resize((80, 96)), v2.ToImage(), CONTAINERS[name], v2.Resize((64, 64))]
    ds = datasets.ImageFolder(photo_folder, transform=_float(steps))
    ours, theirs = both(ds, device, batch_size=8)
    same_images(ours, theirs, 1.0 if device == "cpu" else 3.0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", [InterpolationMode.BOX, InterpolationMode.HAMMING])
def test_pils_box_and_hamming_filters(photo_folder, device, mode):
    """Resize with PIL's box or Hamming filter on PIL images runs with PIL, as torchvision runs it (before: the
    tensor kernel's NotImplementedError); on tensors both loaders raise torchvision's NotImplementedError."""
    pil = datasets.ImageFolder(photo_folder, transform=_float([v2.Resize((64, 72), interpolation=mode), v2.ToImage()]))
    ours, theirs = both(pil, device, batch_size=8)
    same_images(ours, theirs, 1.0 if device == "cpu" else 3.0)
    tensor = datasets.ImageFolder(photo_folder, transform=_float([v2.ToImage(), v2.Resize((64, 72), interpolation=mode)]))
    ours, theirs = both(tensor, device, batch_size=8)
    assert type(ours) is type(theirs) is NotImplementedError


RAGGED = {"random resize": _float([v2.ToImage(), v2.RandomShortestSize([48, 64], 80)]),
          "no resize": torchvision.models.detection.FasterRCNN_ResNet50_FPN_Weights.DEFAULT.transforms()}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(RAGGED))
def test_samples_of_their_own_sizes(photo_folder, device, name):
    """Samples of different sizes at the end: torch's default_collate raises, and so does ours, with its message
    (before: ours handed over a list); a collate_fn that keeps them apart gets them, as from torch's."""
    ds = datasets.ImageFolder(photo_folder, transform=RAGGED[name])
    ours, theirs = both(ds, device, batch_size=8)
    assert isinstance(theirs, RuntimeError) and type(ours) is RuntimeError and str(ours) == str(theirs)
    ours, theirs = both(ds, device, batch_size=8, collate_fn=lambda b: tuple(zip(*b)))
    same_images(ours, theirs, (1.0 if device == "cpu" else 3.0) if name == "random resize" else
                (0.01 if device == "cpu" else 3.0))


@pytest.mark.parametrize("device", DEVICES)
def test_in_memory_samples_of_their_own_sizes(device):
    """The same for an in-memory dataset (augmented on the device): a per-sample random resize, then a crop to
    one size; without it, torch's default_collate error; with a collate_fn that keeps them apart, its samples."""
    cls = torchvision.datasets.CIFAR10
    ds = fake(cls, n=24, transform=_float([v2.ToImage(), v2.RandomShortestSize([36, 48], 64), v2.CenterCrop(32)]))
    ours, theirs = both(ds, device, batch_size=8)
    same_images(ours, theirs, 1.0 if device == "cpu" else 3.0)
    ds = fake(cls, n=24, transform=_float([v2.ToImage(), v2.RandomShortestSize([36, 48], 64)]))
    ours, theirs = both(ds, device, batch_size=8)
    assert isinstance(theirs, RuntimeError) and type(ours) is RuntimeError and str(ours) == str(theirs)
    ours, theirs = both(ds, device, batch_size=8, collate_fn=lambda b: tuple(zip(*b)))
    same_images(ours, theirs, 1.0 if device == "cpu" else 3.0)
    assert np.mean([tuple(a.shape) != tuple(ours[0][0][0].shape) for a in ours[0][0]]) > 0  # (sizes differ)


@pytest.mark.parametrize("device", DEVICES)
def test_ten_crop_after_to_image(photo_folder, device):
    """v2's TenCrop after ToImage gives each sample a tuple of crops; default_collate makes a list of ten
    batches of them, on both loaders (before: a TypeError from making the tuples one tensor)."""
    ds = datasets.ImageFolder(photo_folder, transform=v2.Compose([v2.Resize((80, 96)), v2.ToImage(), v2.TenCrop(32)]))
    ours, theirs = both(ds, device, batch_size=8)
    assert len(ours) == len(theirs)
    for (a, la), (b, lb) in zip(ours, theirs):
        assert isinstance(a, list) and isinstance(b, list) and len(a) == len(b) == 10
        for x, y in zip(a, b):
            assert x.shape == y.shape == (len(lb), 3, 32, 32) and x.dtype == y.dtype == torch.uint8
            assert (x.cpu().float() - y.float()).abs().mean() < (1.0 if device == "cpu" else 3.0)
        assert torch.equal(la.cpu(), lb)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("v", ["v1", "v2"])
def test_to_pil_image_in_the_middle_of_a_chain(photo_folder, device, v):
    """A ToPILImage after the tensor conversion, then PIL steps and a conversion again: from the ToPILImage on
    each step runs as written on what the chain made (before: "Could not infer dtype of Image")."""
    import torchvision.transforms as T

    steps = ([T.Resize((80, 96)), T.PILToTensor(), T.ToPILImage(), T.ColorJitter(0.3, 0.3), T.ToTensor()] if v == "v1"
             else [v2.Resize((80, 96)), v2.ToImage(), v2.ToPILImage(), v2.ColorJitter(0.3, 0.3), v2.ToImage(),
                   v2.ToDtype(torch.float32, scale=True)])
    ds = datasets.ImageFolder(photo_folder, transform=(T.Compose if v == "v1" else v2.Compose)(steps))
    ours, theirs = both(ds, device, batch_size=8)
    same_images(ours, theirs, 1.0 if device == "cpu" else 3.0)
