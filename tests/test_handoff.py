"""The float hand-off (compiler/handoff.py): on the GPU a chain ending in ToTensor/ToDtype+Normalize
leaves the graph as raw uint8 pixels and becomes float32 in one kernel. Same values as the graph's own
normalisation (float32 rounding), same random draws, padding fills included; chains whose output is
not an affine map of raw pixels keep the graph's float output.

On the CPU the graph normalises by default; ``raw_on_cpu`` turns the GPU's path on there so that CI
runs it on DALI's CPU operators."""
import pytest
import torch
from torchvision.transforms import v2

from gputransforms import DataLoader, datasets
from gputransforms import transforms as T
from gputransforms.compiler import handoff, plan
from gputransforms.compiler.plan import Plan

from conftest import DEVICES

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]

CHAINS = {
    "train preset": lambda: T.Compose([T.RandomResizedCrop(64), T.RandomHorizontalFlip(), T.ToTensor(),
                                       T.Normalize(MEAN, STD)]),
    "eval, v2": lambda: v2.Compose([v2.Resize(72), v2.CenterCrop(64), v2.ToImage(),
                                    v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)]),
    "crop that pads, fill (10, 20, 30)": lambda: T.Compose([
        T.Resize(48), T.RandomCrop(56, pad_if_needed=True, fill=(10, 20, 30)), T.ToTensor(), T.Normalize(MEAN, STD)]),
    "center crop larger than the image pads with 0": lambda: T.Compose([
        T.Resize(40), T.CenterCrop(64), T.ToTensor()]),
    "then RandomErasing on the batch": lambda: T.Compose([
        T.RandomResizedCrop(64), T.ToTensor(), T.Normalize(MEAN, STD), T.RandomErasing(p=1.0)]),
}


@pytest.fixture
def raw_on_cpu(monkeypatch):
    force_hand_off(monkeypatch, True)


_HANDS_OVER_RAW = Plan.hands_over_raw


def force_hand_off(monkeypatch, on: bool):
    """On every device, the hand-off where the GPU would use it (``on``), or nowhere."""
    monkeypatch.setattr(Plan, "hands_over_raw", lambda self, device: on and _HANDS_OVER_RAW(self, "gpu"))


@pytest.fixture
def handed_over(monkeypatch):
    """The dtypes the hand-off received: uint8 batches when the graph gave raw pixels."""
    seen = []
    to_float = handoff.to_float

    def spy(images, p):
        seen.append(images.dtype if isinstance(images, torch.Tensor) else images[0].dtype)
        return to_float(images, p)

    monkeypatch.setattr(handoff, "to_float", spy)
    return seen


def batches(root, tf, device, seed=5):
    torch.manual_seed(seed)  # the batched stage's draws (RandomErasing)
    ds = datasets.ImageFolder(str(root), transform=tf)
    loader = DataLoader(ds, batch_size=7, shuffle=False, num_workers=2, device=device, seed=seed)
    assert loader.backend == "dali", loader.explain()
    return torch.cat([x.cpu() for x, _ in loader])


@pytest.mark.parametrize("name", list(CHAINS))
def test_raw_hand_off_gives_the_graphs_values(photo_folder, name, monkeypatch, handed_over):
    """DALI's CPU operators: the graph normalising (the CPU's default) against the graph handing over
    raw pixels (the GPU's default, forced here), same seed."""
    normalised = batches(photo_folder, CHAINS[name](), "cpu")
    assert handed_over == [] and "hand-off" not in plan(CHAINS[name]()).explain("cpu")
    assert "hand-off: the graph's raw uint8 pixels" in plan(CHAINS[name]()).explain("gpu")
    force_hand_off(monkeypatch, True)
    raw = batches(photo_folder, CHAINS[name](), "cpu")
    assert handed_over and set(handed_over) == {torch.uint8}
    assert raw.dtype == normalised.dtype == torch.float32 and raw.shape == normalised.shape
    torch.testing.assert_close(raw, normalised, atol=2e-6, rtol=1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CHAINS))
def test_gpu_hands_over_raw_pixels_by_default(photo_folder, name, handed_over):
    """On the GPU the hand-off is the default; values as the graph's own normalisation would give."""
    out = batches(photo_folder, CHAINS[name](), "gpu")
    assert handed_over and set(handed_over) == {torch.uint8} and out.dtype == torch.float32
    assert "hand-off: the graph's raw uint8 pixels" in plan(CHAINS[name]()).explain("gpu")


def test_not_affine_keeps_the_graphs_float_output(photo_folder, raw_on_cpu, handed_over):
    """A resize of float values, a pad whose fill is no uint8 value, and uint8 or float16 outputs are
    no affine map of raw uint8 pixels to float32: the graph keeps its output."""
    not_affine = [
        v2.Compose([v2.ToImage(), v2.ToDtype(torch.float32, scale=True), v2.Resize((48, 48)), v2.Normalize(MEAN, STD)]),
        T.Compose([T.Resize(48), T.ToTensor(), T.Normalize(MEAN, STD), T.RandomCrop(56, pad_if_needed=True, fill=0.3)]),
        T.Compose([T.Resize((48, 48)), T.PILToTensor()]),
        v2.Compose([v2.Resize((48, 48)), v2.ToImage(), v2.ToDtype(torch.float16, scale=True)]),
    ]
    for tf in not_affine:
        assert plan(tf).affine is None, tf
        assert "hand-off" not in plan(tf).explain("gpu")
        batches(photo_folder, tf, "cpu")
    assert handed_over == []
    assert plan(CHAINS["train preset"]()).affine is not None


@pytest.mark.parametrize("device", DEVICES)
def test_inference_hands_over_raw_pixels_too(photo_folder, device, monkeypatch):
    import gputransforms

    files = sorted(str(p) for p in photo_folder.rglob("*.jpg"))[:6]
    tf = T.Compose([T.Resize(72), T.CenterCrop(64), T.ToTensor(), T.Normalize(MEAN, STD)])
    force_hand_off(monkeypatch, False)
    ref = gputransforms.compile(tf, device=device)(files).cpu()
    force_hand_off(monkeypatch, True)
    raw = gputransforms.compile(tf, device=device)(files).cpu()
    torch.testing.assert_close(raw, ref, atol=2e-6, rtol=1e-6)
