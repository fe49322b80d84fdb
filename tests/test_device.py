"""device.widen_cuda_connections: gputransforms asks CUDA for 32 hardware work queues, so that DALI's
streams share fewer of them with the training loop's (its effect is measured by benchmarks/train.py,
docs/performance-notes.md)."""
import os
import subprocess
import sys

import pytest

from conftest import ROOT
from gputransforms import device

VAR = "CUDA_DEVICE_MAX_CONNECTIONS"


def _python(code, env_var=None):
    env = {k: v for k, v in os.environ.items() if k != VAR}  # this process's import already set it
    if env_var is not None:
        env[VAR] = env_var
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip().splitlines()[-1]


def test_import_sets_connections_unless_the_user_did():
    show = "import os, gputransforms; print(os.environ.get('CUDA_DEVICE_MAX_CONNECTIONS'), '|', " \
           "gputransforms.device.cuda_connections_note())"
    assert _python(show) == f"32 | {VAR}=32 (set by gputransforms)"
    assert _python(show, env_var="1") == f"1 | {VAR}=1 (set before gputransforms was imported)"


def test_too_late_is_said_not_done(monkeypatch):
    monkeypatch.delenv(VAR, raising=False)
    monkeypatch.setattr(device, "_connections_note", device._connections_note)  # restored as the import left it
    monkeypatch.setattr(device.torch.cuda, "is_initialized", lambda: True)
    device.widen_cuda_connections()
    assert VAR not in os.environ
    assert "CUDA started before gputransforms was imported" in device.cuda_connections_note()


def test_a_late_import_warns_once_for_a_gpu_loader(monkeypatch):
    """#35: CUDA started before the import: the first GPU loader says what it costs and the fix, once;
    a CPU loader, or a process that imported in time, is not told."""
    monkeypatch.setattr(device, "_late_warned", [False])
    assert device.late_import_warning("gpu") is None  # this process imported in time
    monkeypatch.delenv(VAR, raising=False)
    monkeypatch.setattr(device, "_connections_note", device._connections_note)
    monkeypatch.setattr(device.torch.cuda, "is_initialized", lambda: True)
    device.widen_cuda_connections()
    assert device.late_import_warning("cpu") is None
    text = device.late_import_warning("gpu")
    assert "-16%" in text and f"{VAR}=32" in text and "Import gputransforms before" in text
    assert device.late_import_warning("gpu") is None  # once per process


_LATE = """
import warnings, torch
torch.zeros(1, device="cuda")  # CUDA starts first, as when a framework builds the model before the loader
import gputransforms
from gputransforms import datasets, transforms as T
ds = datasets.ImageFolder(ROOT, transform=T.Compose([T.Resize((8, 8)), T.ToTensor()]))
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    gputransforms.DataLoader(ds, batch_size=4, device="gpu")
    gputransforms.DataLoader(ds, batch_size=4, device="gpu")
late = [x for x in w if x.category is gputransforms.LateImportWarning]
print(len(late), "CUDA_DEVICE_MAX_CONNECTIONS unset" in gputransforms.DataLoader(ds, batch_size=4).explain())
"""


@pytest.mark.gpu
def test_late_import_warning_reaches_the_user(indexed_folder):
    assert _python(_LATE.replace("ROOT", repr(str(indexed_folder)))) == "1 True"


@pytest.mark.gpu
def test_targets_go_to_the_device_together_as_they_were():
    """A detection batch's CPU tensors go to the GPU one copy per dtype (device._together): each comes
    back with its values, shape, type and tv_tensor attributes, and writing one leaves the others."""
    import torch
    from torchvision import tv_tensors

    from gputransforms.device import to_device

    dev = torch.device("cuda")
    targets = tuple({"boxes": tv_tensors.BoundingBoxes(torch.rand(k, 4) * 100, format="XYWH", canvas_size=(48, 64)),
                     "labels": torch.arange(k), "masks": tv_tensors.Mask(torch.rand(k, 48, 64) > 0.5),
                     "image_id": k, "empty": torch.zeros(0, 4), "scalar": torch.tensor(k * 1.5),
                     "strided": torch.arange(12.0).view(3, 4).t()} for k in (3, 0, 5))
    images = [torch.rand(3, 8, 8, device=dev)]
    out_images, out = to_device((images, targets), dev)
    assert out_images[0] is images[0]
    for theirs, ours in zip(targets, out):
        assert list(ours) == list(theirs) and ours["image_id"] == theirs["image_id"]
        for key, t in theirs.items():
            if not isinstance(t, torch.Tensor):
                continue
            assert ours[key].device.type == "cuda" and type(ours[key]) is type(t), key
            assert ours[key].shape == t.shape and ours[key].dtype == t.dtype, key
            assert torch.equal(ours[key].cpu(), t), key
        assert ours["boxes"].format == theirs["boxes"].format
        assert ours["boxes"].canvas_size == theirs["boxes"].canvas_size
    out[0]["labels"].add_(100)
    assert torch.equal(out[2]["labels"].cpu(), targets[2]["labels"])
