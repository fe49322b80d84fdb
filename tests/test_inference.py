"""gputransforms.compile: batched inference on encoded images, against torchvision applied per image
to ``PIL.Image.open(io.BytesIO(b)).convert("RGB")``."""
import io
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import gputransforms
from gputransforms import BadSampleError
from gputransforms import transforms as T

from conftest import DEVICES, abs_diff_stats

EVAL = lambda: T.Compose([T.Resize(64), T.CenterCrop(56), T.PILToTensor()])  # noqa: E731 - 0-255 units
TOL = {"cpu": 0.5, "gpu": 1.0}  # test_parity's eval-chain bounds, at this size


def reference(tf, blobs):
    return torch.stack([tf(Image.open(io.BytesIO(b)).convert("RGB")) for b in blobs])


@pytest.fixture(scope="module")
def blobs(photo_folder):
    return [p.read_bytes() for p in sorted(photo_folder.rglob("*.jpg"))[:10]]


@pytest.mark.parametrize("device", DEVICES)
def test_bytes_in_batch_out_equals_torchvision(blobs, device):
    tf = EVAL()
    run = gputransforms.compile(tf, device=device, max_batch_size=4)
    out = run(blobs)  # 10 images, batches of at most 4
    ref = reference(tf, blobs)
    assert out.shape == ref.shape and out.dtype == ref.dtype
    assert out.device.type == ("cuda" if device == "gpu" else "cpu")
    assert abs_diff_stats(out, ref)["mean"] < TOL[device]
    pipe = run._pipe
    for n in (1, 3, 4):  # any batch size up to the maximum, one pipeline
        assert torch.equal(run(blobs[:n]).cpu(), out[:n].cpu())
    assert run._pipe is pipe
    single = run(blobs[0])
    assert single.shape == ref.shape[1:] and torch.equal(single.cpu(), out[0].cpu())


def test_every_input_kind_gives_the_same_batch(blobs, photo_folder, tmp_path):
    run = gputransforms.compile(EVAL(), device="cpu")
    paths = sorted(photo_folder.rglob("*.jpg"))[:3]
    want = run(blobs[:3])
    kinds = [[bytearray(b) for b in blobs[:3]], [memoryview(b) for b in blobs[:3]],
             [np.frombuffer(b, dtype=np.uint8) for b in blobs[:3]],
             [torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in blobs[:3]], [str(p) for p in paths],
             [Path(p) for p in paths]]
    for items in kinds:
        assert torch.equal(run(items), want), type(items[0]).__name__
    with pytest.raises(TypeError, match="image 1: expected encoded bytes or a path"):
        run([blobs[0], 3.5])
    with pytest.raises(TypeError, match="1-D uint8"):
        run([np.zeros((2, 2), np.uint8)])


@pytest.mark.parametrize("device", DEVICES)
def test_odd_formats(tmp_path, device):
    from gputransforms import sampledata

    odd = sampledata.make_odd_files(tmp_path, seed=5)
    names = ["gray.jpg", "cmyk.jpg", "rgba.png", "palette.png", "gray16.png", "plain.webp", "progressive.jpg"]
    blobs = [(odd / n).read_bytes() for n in names]
    tf = EVAL()
    out, ref = gputransforms.compile(tf, device=device)(blobs), reference(tf, blobs)
    for n, o, r in zip(names, out, ref):
        lossless = not n.endswith(".jpg") or n in ("cmyk.jpg", "gray.jpg")
        assert abs_diff_stats(o, r)["mean"] <= (0.5 if lossless else TOL[device] * 2), n


@pytest.mark.parametrize("device", DEVICES)
def test_bad_bytes_name_their_position_and_the_next_call_works(blobs, device):
    run = gputransforms.compile(EVAL(), device=device)
    for bad in (b"", b"not an image at all", blobs[1][: len(blobs[1]) // 3]):
        with pytest.raises(BadSampleError) as info:
            run([blobs[0], blobs[1], bad, blobs[2]])
        assert info.value.index == 2 and "image 2 of the batch" in str(info.value)
        assert run(blobs[:2]).shape[0] == 2


def test_sizes_that_differ_give_a_list_and_a_full_chain_normalizes(blobs):
    out = gputransforms.compile(T.Compose([T.Resize(40), T.PILToTensor()]), device="cpu")(blobs[:4])
    ref = [T.Compose([T.Resize(40), T.PILToTensor()])(Image.open(io.BytesIO(b)).convert("RGB")) for b in blobs[:4]]
    assert isinstance(out, list) and [o.shape for o in out] == [r.shape for r in ref]
    tf = T.Compose([T.Resize(64), T.CenterCrop(56), T.ToTensor(), T.Normalize([0.5] * 3, [0.25] * 3)])
    got = gputransforms.compile(tf, device="cpu")(blobs[:4])
    assert got.dtype == torch.float32 and (got - reference(tf, blobs[:4])).abs().mean() < 0.5 / 255 / 0.25
    with pytest.raises(ValueError, match="nothing in this chain compiles"):
        gputransforms.compile(T.Compose([T.Lambda(lambda x: x)]))


def test_five_crops_give_a_list_of_each_images_tuple(blobs):
    tf = T.Compose([T.Resize((64, 64)), T.PILToTensor(), T.FiveCrop(32)])
    out = gputransforms.compile(tf, device="cpu")(blobs[:3])
    ref = [tf(Image.open(io.BytesIO(b)).convert("RGB")) for b in blobs[:3]]
    assert isinstance(out, list) and len(out) == 3
    for got, want in zip(out, ref):
        assert isinstance(got, tuple) and len(got) == 5
        assert all((g.double() - w.double()).abs().mean() < TOL["cpu"] for g, w in zip(got, want))
