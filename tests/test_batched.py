"""The batched stage (compiler/batched.py) against torchvision applied to each sample in turn.

Each batched transform draws its parameters with torchvision's own get_params/make_params, sample
after sample, so from the same RNG seed it must produce torchvision's result for every sample, not
just the same distribution. Tolerance: a uint8 value may differ by 1 where torchvision's float
arithmetic and ours (batched matmul / separable convolution instead of per-image ones) land on
either side of a rounding boundary; the mean difference must stay under 0.01 (0-255 units).
The containers (RandomApply/Choice/Order) draw members' parameters after all coins, so they are
compared by distribution in test_recipes.py.
"""
import pytest
import torch
from torchvision.transforms import v2

from gputransforms import DataLoader, datasets, plan
from gputransforms import transforms as T
from gputransforms.compiler import batched, registry, stages

from conftest import DEVICES, torchvision_jitter_params

EXACT = {
    "ColorJitter": lambda m: m.ColorJitter(0.4, 0.4, 0.4, 0.1),
    "GaussianBlur": lambda m: m.GaussianBlur(9, sigma=(0.1, 3.0)),
    "GaussianBlur (kx, ky)": lambda m: m.GaussianBlur((3, 7), sigma=(0.5, 2.0)),
    "RandomRotation": lambda m: m.RandomRotation(30),
    "RandomRotation bilinear fill centre": lambda m: m.RandomRotation(
        20, interpolation=T.InterpolationMode.BILINEAR, fill=(10, 200, 30), center=(10, 20)),
    "RandomAffine": lambda m: m.RandomAffine(15, translate=(0.1, 0.1), scale=(0.8, 1.2), shear=(-5, 5, -5, 5)),
    "RandomPerspective": lambda m: m.RandomPerspective(0.4, p=0.7),
    "RandomInvert": lambda m: m.RandomInvert(),
    "RandomPosterize": lambda m: m.RandomPosterize(3),
    "RandomSolarize": lambda m: m.RandomSolarize(100),
    "RandomAdjustSharpness": lambda m: m.RandomAdjustSharpness(3),
    "RandomAutocontrast": lambda m: m.RandomAutocontrast(),
    "RandomEqualize": lambda m: m.RandomEqualize(),
    "RandomGrayscale": lambda m: m.RandomGrayscale(0.5),
    "Grayscale": lambda m: m.Grayscale(3),
    "RandomHorizontalFlip": lambda m: m.RandomHorizontalFlip(),
    "RandomVerticalFlip": lambda m: m.RandomVerticalFlip(0.3),
    "Pad reflect": lambda m: m.Pad((3, 5), padding_mode="reflect"),
    "Resize": lambda m: m.Resize(50),
    "CenterCrop": lambda m: m.CenterCrop((40, 70)),
}
UINT8_ONLY = {"RandomPosterize", "RandomEqualize", "RandomSolarize"}  # uint8 kernels; threshold in uint8 units


def jitter_on_torchvisions_draws(t):
    """The batched ColorJitter kernel fed torchvision's own per-sample draws, in forward's order."""
    def run(x):
        params = torchvision_jitter_params(t, x)
        return batched.color_jitter(x, *batched.jitter_arrays(params), v2=isinstance(t, v2.Transform))
    return run


@pytest.mark.parametrize("api", ["v1", "v2"])
def test_color_jitter_draws_for_the_batch(api):
    """ColorJitter's batch draws: each of the 24 orders equally likely (chi-square), each factor
    uniform over its range (KS), none for an adjustment whose range is None."""
    import numpy as np
    from scipy import stats

    t = (T if api == "v1" else v2).ColorJitter(brightness=0.4, saturation=(0.2, 1.5), hue=0.1)
    torch.manual_seed(0)
    orders, factors = batched.jitter_draws(t, 24000)
    assert (np.sort(orders, 1) == np.arange(4)).all()
    codes = orders @ np.array([64, 16, 4, 1])
    counts = np.unique(codes, return_counts=True)[1]
    assert len(counts) == 24 and stats.chisquare(counts).pvalue > 1e-3
    assert np.isnan(factors[:, 1]).all()
    for k, (lo, hi) in {0: (0.6, 1.4), 2: (0.2, 1.5), 3: (-0.1, 0.1)}.items():
        assert stats.kstest(factors[:, k], stats.uniform(lo, hi - lo).cdf).pvalue > 1e-3
    wrong = stats.kstest(factors[:, 0], stats.uniform(0.5, 1.0).cdf).pvalue  # a wrong range fails
    assert wrong < 1e-6


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("api", ["v1", "v2"])
@pytest.mark.parametrize("name,dtype", [(n, d) for n in EXACT for d in (torch.uint8, torch.float32)
                                        if not (d == torch.float32 and n in UINT8_ONLY)],  # uint8 kernels only
                         ids=lambda v: {torch.uint8: "uint8", torch.float32: "float"}.get(v, v))
def test_batched_equals_torchvision_per_sample(photos, name, api, dtype, device):
    t = EXACT[name](T if api == "v1" else v2)
    x = photos.to("cuda" if device == "gpu" else "cpu")
    x = x if dtype == torch.uint8 else x.float() / 255
    fn = registry.batched_of(t)
    assert fn is not None, f"{name} should have a batched lowering"
    if name == "ColorJitter":  # drawn for the batch (tested by distribution): its kernel on torchvision's draws
        fn = jitter_on_torchvisions_draws(t)
    torch.manual_seed(11)
    got = fn(x)
    torch.manual_seed(11)
    ref = torch.stack([t(img) for img in x])
    assert got.shape == ref.shape and got.dtype == ref.dtype and got.device == ref.device
    d = (got.double() - ref.double()).abs() * (255 if dtype == torch.float32 else 1)
    changed = (ref.shape != x.shape or (ref.double() - x.double()).abs().flatten(1).amax(1) > 0)
    assert torch.as_tensor(changed).any(), "the draw changed no sample: the comparison would prove nothing"
    assert d.mean() < 0.01 and d.max() <= 1.0 + 1e-3, (d.mean().item(), d.max().item())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["ColorJitter", "GaussianBlur", "GaussianBlur (kx, ky)"])
def test_kernels_in_chunks_equal_torchvision(photos, name, device, monkeypatch):
    """ColorJitter's adjustments work on ``batched.CHUNK`` rows at a time and GaussianBlur on
    ``batched.BLUR_CHUNK`` (their float temporaries bounded, and the same size every batch for torch's
    allocator): in chunks of 5 rows the 24 photos still equal torchvision sample by sample."""
    monkeypatch.setattr(batched, "CHUNK", 5)
    monkeypatch.setattr(batched, "BLUR_CHUNK", 5)
    test_batched_equals_torchvision_per_sample(photos, name, "v2", torch.uint8, device)


def test_rotation_expand_and_user_subclasses_stay_per_sample():
    class MyJitter(T.ColorJitter):
        def forward(self, img):
            return super().forward(img) * 0.5

    assert registry.batched_of(T.RandomRotation(10, expand=True)) is None
    assert registry.batched_of(MyJitter(0.4)) is None
    assert registry.batched_of(T.RandomApply([MyJitter(0.4)])) is None
    assert registry.batched_of(T.AugMix()) is None
    assert registry.batched_of(T.RandomApply([T.ColorJitter(0.4), T.GaussianBlur(3)])) is not None


def test_explain_names_the_stage_of_each_transform_after_the_graph():
    tf = T.Compose([T.RandomResizedCrop(64), T.ToTensor(), T.RandomApply([T.ColorJitter(0.4, 0.4)], p=0.8),
                    T.GaussianBlur(5), T.AugMix(), T.RandomErasing()])
    text = plan(tf).explain("gpu")
    assert "batched     RandomApply(" in text and "batched     GaussianBlur(" in text
    assert "per sample  AugMix(" in text and "batched     RandomErasing(" in text
    assert [s for _, _, s in stages.after_graph(plan(tf))] == ["batched", "batched", "per sample", "batched"], text


@pytest.mark.filterwarnings("error::gputransforms.FallbackWarning")
def test_an_all_batched_tail_is_the_fast_path_and_does_not_warn(photo_folder):
    # a SimCLR-style chain: nothing here runs per sample, so no FallbackWarning
    tf = T.Compose([T.RandomResizedCrop(48), T.RandomHorizontalFlip(),
                    T.RandomApply([T.ColorJitter(0.4, 0.4, 0.4, 0.1)], p=0.8), T.RandomGrayscale(0.2),
                    T.RandomApply([T.GaussianBlur(5)], p=0.5), T.ToTensor(), T.Normalize([0.5] * 3, [0.5] * 3)])
    loader = DataLoader(datasets.ImageFolder(str(photo_folder), transform=tf), batch_size=8, device="cpu")
    x, y = next(iter(loader))
    assert x.shape == (8, 3, 48, 48) and x.dtype == torch.float32
    assert x.min() >= -1 - 1e-6 and x.max() <= 1 + 1e-6


def test_per_sample_fallback_warns_once_naming_the_transform(photo_folder):
    tf = T.Compose([T.Resize((48, 48)), T.AugMix(), T.ToTensor()])
    with pytest.warns(Warning) as rec:
        DataLoader(datasets.ImageFolder(str(photo_folder), transform=tf), batch_size=8, device="cpu")
    msgs = [str(r.message) for r in rec if "per sample" in str(r.message)]
    assert len(msgs) == 1 and "AugMix" in msgs[0]


@pytest.mark.parametrize("device", DEVICES)
def test_erasing_writes_into_the_stages_batch(device):
    """The batched stage owns its batch, so RandomErasing (torchvision's and timm's) writes into it
    instead of a batch-sized copy (device memory, benchmarks/train.py); the boxes hold the value and
    every other pixel is the input's."""
    from timm.data.random_erasing import RandomErasing as TimmErasing

    dev = "cuda" if device == "gpu" else "cpu"
    x = torch.rand(16, 3, 32, 40, device=dev)
    for t, value in ((T.RandomErasing(p=1.0, value=(0.25, 0.5, 0.75)), torch.tensor([0.25, 0.5, 0.75])),
                     (v2.RandomErasing(p=1.0, value=0.5), torch.tensor([0.5] * 3)),
                     (TimmErasing(probability=1.0, mode="const", device=dev), torch.zeros(3))):
        y = x.clone()
        torch.manual_seed(0)
        out = registry.batched_of(t)(y)
        assert out.data_ptr() == y.data_ptr(), type(t)
        erased = (out != x).any(1)  # (N, H, W)
        assert erased.flatten(1).any(1).all()
        assert torch.equal(out.permute(0, 2, 3, 1)[erased], value.to(dev).expand(int(erased.sum()), 3))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("api", ["v1", "v2"])
def test_normalize_equals_torchvision_without_waiting_for_the_gpu(device, api):
    """The batched Normalize gives torchvision's numbers bit for bit, raises torchvision's errors, and
    after its first call (which puts the mean and std on the device) never waits for the GPU:
    torchvision's kernel waits three times per call (pageable copies, ``(std == 0).any()``)."""
    m = T if api == "v1" else v2
    dev = "cuda" if device == "gpu" else "cpu"
    x = torch.rand(8, 3, 20, 24, device=dev)
    t = m.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
    fn = registry.batched_of(t)
    ref = torch.stack([t(img) for img in x])
    assert torch.equal(fn(x.clone()), ref)
    if dev == "cuda":
        y = x.clone()
        torch.cuda.set_sync_debug_mode("error")
        try:
            y = fn(y)
        finally:
            torch.cuda.set_sync_debug_mode(0)
        assert torch.equal(y, ref)  # (torch.equal itself waits)
        with pytest.raises(RuntimeError, match="synchroniz"):  # negative control: torchvision's does wait
            torch.cuda.set_sync_debug_mode("error")
            try:
                t(x)
            finally:
                torch.cuda.set_sync_debug_mode(0)
    with pytest.raises(TypeError, match="float tensor"):
        fn((x * 255).to(torch.uint8))
    zero = m.Normalize([0.5, 0.5, 0.5], [0.2, 0.0, 0.2])
    with pytest.raises(ValueError, match="zero"):
        registry.batched_of(zero)(x.clone())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("api", ["v1", "v2"])
def test_random_apply_of_color_jitter_takes_the_whole_batch(photos, api, device):
    """RandomApply(ColorJitter) works on the whole batch with no adjustment for the rows whose coin did not
    come up (``on_rows``): from the same seed, the same images as the gathered sub-batch gives."""
    m = T if api == "v1" else v2
    t = m.RandomApply([m.ColorJitter(0.4, 0.4, 0.4, 0.1)], p=0.6)
    x = photos.to("cuda" if device == "gpu" else "cpu")
    fn = registry.batched_of(t)
    torch.manual_seed(4)
    got = fn(x)
    jitter = registry.batched_of(t.transforms[0])
    torch.manual_seed(4)
    rows = batched._coins(len(x), t.p, v2=True)
    assert 0 < len(rows) < len(x)
    ref = x.clone()
    ref[rows] = jitter(x[rows])
    assert torch.equal(got, ref)
    kept = [i for i in range(len(x)) if i not in rows]
    assert torch.equal(got[kept], x[kept]) and not torch.equal(got[rows], x[rows])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32], ids=["uint8", "float"])
def test_random_apply_of_gaussian_blur_takes_the_whole_batch(photos, dtype, device):
    """RandomApply(GaussianBlur) on an integer batch blurs it whole, the rows whose coin did not come up with
    a one-hot kernel: they come back exactly, and the blurred rows are those of the gathered sub-batch."""
    t = v2.RandomApply([v2.GaussianBlur(23, sigma=(0.1, 2.0))], p=0.5)
    x = photos.to("cuda" if device == "gpu" else "cpu")
    x = x if dtype == torch.uint8 else x.float() / 255
    torch.manual_seed(6)
    got = registry.batched_of(t)(x)
    torch.manual_seed(6)
    rows = batched._coins(len(x), t.p, v2=True)
    assert 0 < len(rows) < len(x)
    ref = x.clone()
    ref[rows] = registry.batched_of(t.transforms[0])(x[rows])
    kept = [i for i in range(len(x)) if i not in rows]
    assert torch.equal(got[kept], x[kept])
    d = (got.double() - ref.double()).abs() * (255 if dtype == torch.float32 else 1)
    assert d.max() <= 1.0 + 1e-3 and d.mean() < 0.01 and not torch.equal(got[rows], x[rows])


@pytest.mark.gpu
def test_gaussian_blur_holds_two_float_chunks_at_most(monkeypatch):
    """GaussianBlur's float temporaries: each step's input is let go once its output exists, so at most two
    float copies of ``BLUR_CHUNK`` rows (padded) are alive besides the batch and the result (kornia's
    ``filter2d_separable`` held five: the peak of SimCLR's batched stage on the H100 host)."""
    monkeypatch.setattr(batched, "BLUR_CHUNK", 16)
    x = torch.randint(0, 256, (64, 3, 128, 128), dtype=torch.uint8, device="cuda")
    k = 23
    sigmas = torch.full((64, 2), 1.5)
    batched.gaussian_blur(x, [k, k], sigmas)  # (kernels compiled, cuDNN's workspace settled)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = batched.gaussian_blur(x, [k, k], sigmas)
    torch.cuda.synchronize()
    chunk = 16 * 3 * (128 + k - 1) * 128 * 4  # one padded float chunk
    above = torch.cuda.max_memory_allocated() - base - out.numel() * out.element_size()
    assert above <= 3.0 * chunk, (above / chunk)
