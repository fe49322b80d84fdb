"""Swapping ``torchvision`` for ``gputransforms`` in an import never breaks a script: every public name of
torchvision's ``transforms`` and ``datasets`` (and of the modules users import from them) is there, and the
submodules import as torchvision's do."""
import importlib

import pytest

PAIRS = [("torchvision.transforms", "gputransforms.transforms"),
         ("torchvision.transforms.v2", "gputransforms.transforms.v2"),
         ("torchvision.transforms.functional", "gputransforms.transforms.functional"),
         ("torchvision.transforms.v2.functional", "gputransforms.transforms.v2.functional"),
         ("torchvision.transforms.autoaugment", "gputransforms.transforms.autoaugment"),
         ("torchvision.datasets", "gputransforms.datasets"),
         ("torchvision.datasets.folder", "gputransforms.datasets.folder"),
         ("torchvision.datasets.vision", "gputransforms.datasets.vision"),
         ("torchvision.datasets.utils", "gputransforms.datasets.utils")]


@pytest.mark.parametrize("theirs, ours", PAIRS, ids=[p[1] for p in PAIRS])
def test_every_public_name_is_there(theirs, ours):
    a, b = importlib.import_module(theirs), importlib.import_module(ours)
    missing = [n for n in dir(a) if not n.startswith("_") and not hasattr(b, n)]
    assert not missing, missing


def test_the_idioms_import():
    import torchvision
    import torchvision.transforms.functional as TF
    from torchvision.transforms.v2 import functional as F2

    import gputransforms.transforms.functional as ours_tf
    from gputransforms import datasets
    from gputransforms.datasets import CocoDetection, ImageNet, VOCSegmentation, wrap_dataset_for_transforms_v2
    from gputransforms.transforms.v2 import functional as ours_f2

    assert ours_tf is TF and ours_f2 is F2
    assert (CocoDetection, ImageNet, VOCSegmentation, wrap_dataset_for_transforms_v2) == (
        torchvision.datasets.CocoDetection, torchvision.datasets.ImageNet, torchvision.datasets.VOCSegmentation,
        torchvision.datasets.wrap_dataset_for_transforms_v2)
    assert issubclass(datasets.ImageFolder, torchvision.datasets.ImageFolder)  # (ours, with from_torchvision)
    with pytest.raises(AttributeError, match="no attribute 'NotADataset'"):
        datasets.NotADataset
