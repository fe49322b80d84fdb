"""Video clips: torchvision's Kinetics/UCF101/HMDB51 through gputransforms.DataLoader, side by side
with torch's DataLoader over the same dataset object (whose ``__getitem__`` is torchvision's: it
decodes with torchcodec where that loads, else with PyAV).

The videos are H.264 of panning real photos, made by ``sampledata.make_video_folder``; every frame
shows its own index in a band of blocks, so a test reads back which frames a clip holds. The
frames a clip must hold are torchvision's: ``VideoClips.clips`` (``_compat.clip_frames``)."""
import shutil
import time
from collections import Counter

import numpy as np
import pytest
import torch
import torch.utils.data as tud
import torchvision
from scipy import stats
from torchvision.transforms import v2

from gputransforms import DataLoader, FallbackWarning, _compat, datasets, sampledata
from gputransforms import transforms as T
from gputransforms.files import BadSampleError
from gputransforms.video import VideoReadError

from conftest import abs_diff_stats

#: where clips are decoded and transformed: the CPU (PyAV in worker processes, DALI's CPU operators)
#: with FFmpeg's RGB (the CPU's default) or with YUV planes converted in the graph; the GPU with
#: PyAV's YUV planes (the GPU's default) or FFmpeg's RGB; the GPU with NVDEC (DALI's decoders.video)
DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("cpu-yuv", id="cpu-yuv"),
           pytest.param("gpu", id="gpu", marks=pytest.mark.gpu),
           pytest.param("gpu-rgb", id="gpu-rgb", marks=pytest.mark.gpu),
           pytest.param("nvdec", id="nvdec", marks=pytest.mark.gpu)]
_ON = {"cpu": dict(device="cpu"), "cpu-yuv": dict(device="cpu", video_decoder="pyav-yuv"), "gpu": dict(device="gpu"),
       "gpu-rgb": dict(device="gpu", video_decoder="pyav-rgb"), "nvdec": dict(device="gpu", video_decoder="nvdec")}
#: frames whose colour the graph converts (YUV planes or NVDEC), not FFmpeg
YUV = ("cpu-yuv", "gpu")


def on(device) -> dict:
    """DataLoader arguments for a DEVICES entry."""
    return dict(_ON[device])


MEAN, STD = (0.43216, 0.394666, 0.37645), (0.22803, 0.22145, 0.216989)
torchcodec = pytest.mark.skipif(not _compat.torchcodec_loads(),
                                reason="torchvision's own video decoding needs torchcodec and system FFmpeg")


class ConvertBCHWtoCBHW(torch.nn.Module):
    """torchvision's references/video_classification/transforms.py"""

    def forward(self, vid):
        return vid.permute(1, 0, 2, 3)


def preset_train(crop=(32, 32), resize=(48, 60), hflip_prob=0.5):
    """torchvision's VideoClassificationPresetTrain (references/video_classification/presets.py)."""
    return T.Compose([T.ConvertImageDtype(torch.float32), T.Resize(resize, antialias=False),
                      T.RandomHorizontalFlip(hflip_prob), T.Normalize(mean=MEAN, std=STD), T.RandomCrop(crop),
                      ConvertBCHWtoCBHW()])


def preset_eval(crop=(32, 32), resize=(48, 60)):
    return T.Compose([T.ConvertImageDtype(torch.float32), T.Resize(resize, antialias=False),
                      T.Normalize(mean=MEAN, std=STD), T.CenterCrop(crop), ConvertBCHWtoCBHW()])


def v2_eval(crop=(32, 32), resize=(48, 60)):
    return v2.Compose([v2.ToDtype(torch.float32, scale=True), v2.Resize(resize, antialias=True),
                       v2.CenterCrop(crop), v2.Normalize(mean=MEAN, std=STD)])


@pytest.fixture(scope="session")
def kinetics_root(tmp_path_factory):
    """9 H.264 videos (3 classes; 20-48 frames; 72x96; 30 and 25 fps; B-frames; GOP 12)."""
    root = tmp_path_factory.mktemp("kinetics")
    sampledata.make_video_folder(root / "train", classes=3, per_class=3, seed=3)
    return root


def codes(videos: torch.Tensor, layout: str = "TCHW") -> list:
    """The frame indices a batch of raw clips shows: (N, T, C, H, W) or (N, T, H, W, C) uint8."""
    v = videos.cpu()
    if layout == "TCHW":
        v = v.permute(0, 1, 3, 4, 2)
    return [[sampledata.frame_index(f.numpy()) for f in clip] for clip in v]


def side_by_side(ds, device, **kw):
    """(ours, torch's) batches over one epoch, the same generator seed on both sides."""
    ours = list(DataLoader(ds, **on(device), generator=torch.Generator().manual_seed(7), **kw))
    theirs = list(tud.DataLoader(ds, generator=torch.Generator().manual_seed(7), **kw))
    return ours, theirs


def same_normalized_clips(ours, theirs, device):
    """Normalised clips within the bound of ``device`` of torchvision's, and the same labels."""
    stats_ = abs_diff_stats(torch.cat([o[0].cpu() for o in ours]), torch.cat([t[0] for t in theirs]))
    # in 0-255 units (normalised values times 255 * std): resize arithmetic on the CPU; NVDEC's
    # colour conversion on the GPU
    scale = 255 * min(STD)
    limit = {"cpu": 0.05, "gpu-rgb": 0.05, "cpu-yuv": 0.4, "gpu": 0.4, "nvdec": 3.0}[device]
    assert stats_["mean"] * scale < limit, stats_
    for o, t in zip(ours, theirs):
        assert type(o) is type(t) is list  # (default_collate's list of the (video, audio, label) batches)
        assert torch.equal(o[2].cpu(), t[2])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fpc,step,rate", [(8, 8, None), (5, 3, None), (6, 4, 15), (4, 5, 10)])
def test_clips_are_torchvisions(kinetics_root, device, fpc, step, rate):
    ds = datasets.Kinetics(kinetics_root, frames_per_clip=fpc, step_between_clips=step, frame_rate=rate)
    ours, theirs = side_by_side(ds, device, batch_size=5, shuffle=True)
    assert len(ours) == len(theirs) == -(-len(ds) // 5)
    order = [i for b in tud.DataLoader(range(len(ds)), batch_size=5, shuffle=True,
                                       generator=torch.Generator().manual_seed(7)) for i in b.tolist()]
    got, labels, diffs = [], [], []
    for (v, a, y), (tv, ta, ty) in zip(ours, theirs):
        assert v.shape == tv.shape and v.dtype == tv.dtype == torch.uint8 and a.shape == ta.shape
        assert v.device.type == ("cpu" if device.startswith("cpu") else "cuda")
        assert torch.equal(y.cpu(), ty)
        assert codes(v) == codes(tv)
        got += codes(v)
        labels += y.tolist()
        diffs.append((v.cpu().double() - tv.double()).abs().mean().item())
    vc = ds.video_clips
    want = [_compat.clip_frames(vc, *vc.get_clip_location(i)).tolist() for i in order]
    assert got == want  # the frames torchvision's VideoClips selects, in the sampler's order
    assert labels == [ds.samples[vc.get_clip_location(i)[0]][1] for i in order]
    # PyAV (CPU) and torchcodec convert colour with the same FFmpeg code; the graph converts PyAV's
    # YUV planes with FFmpeg's matrix (video.read_planes); NVDEC converts its own way
    assert np.mean(diffs) < (3.0 if device == "nvdec" else 0.5 if device in YUV else 0.01), diffs


@torchcodec
def test_scan_equals_torchvisions(kinetics_root):
    """Our PyAV scan gives torchvision's (torchcodec's) metadata, so the clip index is the same."""
    tv = torchvision.datasets.Kinetics(kinetics_root, frames_per_clip=6, step_between_clips=4, num_workers=0)
    ours = datasets.Kinetics(kinetics_root, frames_per_clip=6, step_between_clips=4)
    assert ours.video_clips.video_paths == tv.video_clips.video_paths
    assert ours.video_clips.video_fps == tv.video_clips.video_fps  # the same float, to the last bit
    assert [len(p) for p in ours.video_clips.video_pts] == [len(p) for p in tv.video_clips.video_pts]
    for rate in (None, 15, 10):
        ours.video_clips.compute_clips(6, 4, rate)
        tv.video_clips.compute_clips(6, 4, rate)
        assert all(torch.equal(a, b) for a, b in zip(ours.video_clips.clips, tv.video_clips.clips))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("drop_last", [False, True])
def test_each_clip_once(kinetics_root, device, drop_last):
    ds = datasets.Kinetics(kinetics_root, frames_per_clip=4, step_between_clips=4)
    loader = DataLoader(ds, batch_size=6, shuffle=True, drop_last=drop_last, **on(device))
    for _ in range(2):  # two epochs from one loader
        seen = []
        for v, _, y in loader:
            assert len(v) == 6 or not drop_last
            seen += [(tuple(c), label) for c, label in zip(codes(v), y.tolist())]
        assert len(seen) == (len(ds) // 6 * 6 if drop_last else len(ds))
        every = Counter((tuple(_compat.clip_frames(ds.video_clips, *ds.video_clips.get_clip_location(i)).tolist()),
                         ds.samples[ds.video_clips.get_clip_location(i)[0]][1]) for i in range(len(ds)))
        if drop_last:
            assert not Counter(seen) - every
        else:
            assert Counter(seen) == every


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("chain", ["v1", "v2"])
def test_eval_chain_equals_torchvision(kinetics_root, device, chain):
    tf = preset_eval() if chain == "v1" else v2_eval()
    ds = datasets.Kinetics(kinetics_root, frames_per_clip=8, step_between_clips=8, transform=tf)
    loader = DataLoader(ds, batch_size=4, **on(device))
    text = loader.explain()
    assert ("decoders.video(mixed, NVDEC)" if device == "nvdec" else "decoded by PyAV in worker processes") in text
    assert "crop_mirror_normalize" in text and ("ConvertBCHWtoCBHW" in text) == (chain == "v1")
    ours, theirs = side_by_side(ds, device, batch_size=4)
    shape = (4, 3, 8, 32, 32) if chain == "v1" else (4, 8, 3, 32, 32)
    assert ours[0][0].shape == theirs[0][0].shape == shape
    same_normalized_clips(ours, theirs, device)


@pytest.mark.parametrize("device", DEVICES)
def test_video_model_weights_preprocessing_is_compiled(kinetics_root, device):
    """``weights.transforms()`` of torchvision's video models (VideoClassification: resize without antialiasing,
    centre crop, float, normalize, (T, C, H, W) -> (C, T, H, W)) is the graph's resize and one fused
    crop-normalize, then the clips' permute for the batch; torchvision's clips. It ran per clip after the graph
    ("VideoClassification: no DALI lowering")."""
    tf = torchvision.models.video.R3D_18_Weights.DEFAULT.transforms()
    ds = datasets.Kinetics(kinetics_root, frames_per_clip=8, step_between_clips=8, transform=tf)
    text = DataLoader(ds, batch_size=4, **on(device)).explain()
    assert "resize" in text and "crop_mirror_normalize" in text and "batched     ConvertBCHWtoCBHW" in text, text
    assert "\n  per sample" not in text, text  # (no step of it per clip)
    ours, theirs = side_by_side(ds, device, batch_size=4)
    assert ours[0][0].shape == theirs[0][0].shape == (4, 3, 8, 112, 112)
    same_normalized_clips(ours, theirs, device)


@pytest.mark.parametrize("device", DEVICES)
def test_train_chain_one_draw_per_clip(kinetics_root, device):
    """RandomHorizontalFlip and RandomCrop: each clip's frames share one draw, and the draws are
    torchvision's distributions (flip p=0.5, offsets uniform)."""
    ds = datasets.Kinetics(kinetics_root, frames_per_clip=4, step_between_clips=4, transform=preset_train())
    ref_ds = datasets.Kinetics(kinetics_root, frames_per_clip=4, step_between_clips=4,
                               transform=T.Compose([T.ConvertImageDtype(torch.float32),
                                                    T.Resize((48, 60), antialias=False),
                                                    T.Normalize(mean=MEAN, std=STD)]))
    ref = {i: ref_ds[i][0] for i in range(len(ds))}  # (T, 3, 48, 60)
    flips, ys, xs = [], [], []
    for epoch in range(3):
        order = torch.randperm(len(ds), generator=torch.Generator().manual_seed(epoch)).tolist()
        loader = DataLoader(ds, batch_size=8, sampler=order, **on(device))
        out = torch.cat([v.cpu() for v, _, _ in loader])  # (N, C, T, 32, 32)
        for clip, i in zip(out, order):
            clip = clip.permute(1, 0, 2, 3)  # (T, C, 32, 32)
            r = ref[i]
            cands = torch.stack([r, r.flip(-1)])  # (2, T, C, 48, 60)
            win = cands.unfold(3, 32, 1).unfold(4, 32, 1)  # (2, T, C, 17, 29, 32, 32)
            err = (win - clip[None, :, :, None, None]).abs().mean(dim=(1, 2, 5, 6))  # (2, 17, 29)
            f, y, x = np.unravel_index(int(err.argmin()), tuple(err.shape))
            # every frame matches the one window (a per-frame draw would not)
            per_frame = (win[f, :, :, y, x] - clip).abs().flatten(1).mean(1)
            assert per_frame.max() < (0.1 if device == "nvdec" else 0.03 if device in YUV else 0.01), per_frame
            flips.append(f)
            ys.append(y)
            xs.append(x)
    n = len(flips)
    assert stats.binomtest(sum(flips), n, 0.5).pvalue > 1e-3
    for vals, k in ((ys, 17), (xs, 29)):
        counts = np.bincount(vals, minlength=k)
        assert stats.chisquare(counts).pvalue > 1e-3, counts


@pytest.mark.parametrize("device", DEVICES)
def test_ucf101_and_hmdb51_folds(tmp_path, device):
    root = sampledata.make_video_folder(tmp_path / "videos", classes=2, per_class=3, ext="avi", seed=5)
    videos = sorted(p.relative_to(root) for p in root.glob("*/*.avi"))
    ann = tmp_path / "ann"
    ann.mkdir()
    (ann / "trainlist01.txt").write_text("".join(f"{p.as_posix()} 1\n" for p in videos[::2]))
    (ann / "testlist01.txt").write_text("".join(f"{p.as_posix()}\n" for p in videos[1::2]))
    for c in ("class_00", "class_01"):
        (ann / f"{c}_test_split1.txt").write_text(
            "".join(f"{p.name} {1 if k % 2 == 0 else 2}\n" for k, p in enumerate(videos) if p.parts[0] == c))
    for cls, kw in ((datasets.UCF101, {}), (datasets.HMDB51, {})):
        for train in (True, False):
            ds = cls(root, str(ann), frames_per_clip=4, step_between_clips=6, train=train, **kw)
            assert isinstance(ds, getattr(torchvision.datasets, cls.__name__))
            ours, theirs = side_by_side(ds, device, batch_size=4, shuffle=True)
            assert len(ours) == len(theirs) > 0
            for (v, a, y), (tv, ta, ty) in zip(ours, theirs):
                assert v.shape == tv.shape and v.shape[-1] == 3  # THWC, torchvision's default for these
                assert torch.equal(y.cpu(), ty) and codes(v, "THWC") == codes(tv, "THWC")


@pytest.mark.parametrize("device", DEVICES)
def test_thwc_chain_runs_per_clip(kinetics_root, device):
    """With output_format="THWC" torchvision's transforms would read H as channels: a chain for that
    layout is the user's own, and runs per clip on the device after the decode."""
    tf = T.Compose([T.Lambda(lambda x: x.permute(3, 0, 1, 2).float() / 255)])  # (C, T, H, W)
    ds = datasets.Kinetics(kinetics_root, frames_per_clip=8, step_between_clips=8, transform=tf,
                           output_format="THWC")
    with pytest.warns(FallbackWarning, match="Lambda"):
        loader = DataLoader(ds, batch_size=4, **on(device))
    assert "per clip" in loader.explain()
    ours = list(loader)
    theirs = list(tud.DataLoader(ds, batch_size=4))
    assert ours[0][0].shape == theirs[0][0].shape == (4, 3, 8, 72, 96)
    d = abs_diff_stats(torch.cat([o[0].cpu() for o in ours]), torch.cat([t[0] for t in theirs]))
    assert d["mean"] * 255 < (3.0 if device == "nvdec" else 0.5 if device in YUV else 0.01)


def _damage(path, kind):
    if kind == "empty":
        open(path, "wb").close()
    elif kind == "truncated":
        data = open(path, "rb").read()
        open(path, "wb").write(data[:len(data) // 2])
    elif kind == "garbage":
        open(path, "wb").write(np.random.default_rng(0).integers(0, 256, 20000, dtype=np.uint8).tobytes())
    elif kind == "no video stream":
        import av

        with av.open(str(path), "w", format="mp4") as c:
            s = c.add_stream("aac", rate=16000)
            frame = av.AudioFrame.from_ndarray(np.zeros((1, 16000), np.float32), format="fltp", layout="mono")
            frame.sample_rate = 16000
            for pkt in s.encode(frame):
                c.mux(pkt)
            for pkt in s.encode():
                c.mux(pkt)


@pytest.mark.parametrize("device", DEVICES)
def test_bad_videos_named_or_skipped(kinetics_root, tmp_path, device):
    root = tmp_path / "k"
    shutil.copytree(kinetics_root, root)
    ds = datasets.Kinetics(root, frames_per_clip=4, step_between_clips=8)
    # the files go bad after the scan (torchvision's recipe caches the metadata; files change)
    bad = {}
    for kind, v in zip(["empty", "truncated", "garbage", "no video stream"], [1, 3, 5, 7]):
        path = ds.video_clips.video_paths[v]
        _damage(path, kind)
        bad[path] = kind
    first_bad = min(i for i in range(len(ds)) if ds.video_clips.video_paths[ds.video_clips.get_clip_location(i)[0]]
                    in bad)
    with pytest.raises(BadSampleError) as e:
        for _ in DataLoader(ds, batch_size=4, **on(device)):
            pass
    assert e.value.index == first_bad and e.value.path in bad and str(first_bad) in str(e.value)
    loader = DataLoader(ds, batch_size=4, shuffle=True, on_error="skip", **on(device))
    for _ in range(2):  # and the next epoch works
        with pytest.warns(UserWarning, match="skipped"):
            seen = sum(len(v) for v, _, _ in loader)
        good = [i for i in range(len(ds)) if ds.video_clips.video_paths[ds.video_clips.get_clip_location(i)[0]]
                not in bad]
        assert seen == len(good)
        assert sorted(e.index for e in loader.skipped) == sorted(set(range(len(ds))) - set(good))
        assert {e.path for e in loader.skipped} == set(bad)


def _slow_once_flagged(decode, flag):
    """``video._decode`` that blocks for a minute once ``flag`` exists (a worker busy with a clip)."""
    import os
    import time

    def slow(*args, **kwargs):
        if os.path.exists(flag):
            time.sleep(60)
        return decode(*args, **kwargs)

    return slow


@pytest.mark.parametrize("device", [d for d in DEVICES if d.id != "nvdec"])
def test_decoder_processes_end_with_their_loader(kinetics_root, tmp_path, monkeypatch, device):
    """PyAV's worker processes end when the loader is closed, or dropped mid-epoch, at once, even
    while they decode: torch's own shutdown of persistent workers (at whatever garbage collection
    reaches the loader) lets each worker finish the clips queued to it and joins them one by one,
    5 s each at most, which held the GPU machine's test runs for minutes."""
    import gc
    import multiprocessing as mp
    import time

    from gputransforms import video

    flag = tmp_path / "busy"
    monkeypatch.setattr(video, "_decode", _slow_once_flagged(video._decode, str(flag)))  # forked workers inherit it
    ds = datasets.Kinetics(kinetics_root, frames_per_clip=4, step_between_clips=2)  # clips queued to every worker
    before = {p.pid for p in mp.active_children()}
    loader = DataLoader(ds, batch_size=2, num_workers=2, **on(device))
    assert sum(len(v) for v, _, _ in loader) == len(ds)
    workers = [p for p in mp.active_children() if p.pid not in before]
    assert len(workers) == 2  # persistent: they stay for the next epoch
    loader.close()
    assert not any(p.is_alive() for p in workers)
    it = iter(loader)  # a later epoch starts them again; dropped mid-epoch and busy, they end at once
    next(it)
    workers = [p for p in mp.active_children() if p.pid not in before]
    assert len(workers) == 2
    flag.touch()
    time.sleep(1.0)  # each worker is now inside a clip that takes a minute
    start = time.monotonic()
    del it, loader
    gc.collect()
    assert not any(p.is_alive() for p in workers) and time.monotonic() - start < 3


@pytest.mark.parametrize("device", [d for d in DEVICES if d.id != "nvdec"])
def test_a_dead_decoder_process_is_named(kinetics_root, device):
    """A PyAV worker that dies mid-epoch ends the epoch with torch's own error (which worker, which
    signal), not with a guess that DALI failed on files that decode."""
    import os
    import signal

    ds = datasets.Kinetics(kinetics_root, frames_per_clip=4, step_between_clips=2)
    loader = DataLoader(ds, batch_size=2, num_workers=2, **on(device))
    it = iter(loader)
    next(it)
    victim = it.slot.decoders.dl._iterator._workers[0]  # this loader's own (other tests' may linger)
    os.kill(victim.pid, signal.SIGKILL)
    with pytest.raises(RuntimeError, match=f"DataLoader worker \\(pid.*{victim.pid}") as info:
        for _ in it:
            pass
    assert "DALI failed" not in str(info.value)
    assert sum(len(v) for v, _, _ in loader) == len(ds)  # the next epoch starts new decoders
    loader.close()


def test_a_decoder_dying_mid_transfer_is_named_as_torch_names_it():
    """A worker killed while the loop receives a sample's memory makes torch raise ConnectionResetError
    (its file-descriptor sharer is gone): the epoch's error is torch's worker error all the same."""
    import multiprocessing
    import types

    from gputransforms.backends.feed import _died_in_transfer

    ctx = multiprocessing.get_context("fork")
    dead, alive = ctx.Process(target=int), ctx.Process(target=time.sleep, args=(5,))
    dead.start(), alive.start()
    dead.join()
    try:
        err = _died_in_transfer(types.SimpleNamespace(_workers=[alive, dead]), ConnectionResetError(104, "reset"))
    finally:
        alive.kill()
        alive.join()
    assert isinstance(err, RuntimeError)
    assert f"DataLoader worker (pid(s) {dead.pid}) exited unexpectedly" in str(err) and "ConnectionResetError" in str(err)


def test_timeout_names_the_clip_whose_decode_stalled(kinetics_root, tmp_path):
    """timeout= reaches the decoder processes: a clip whose file blocks (a FIFO, as a stuck mount)
    ends the epoch with torch's "timed out" error naming the samples of its batch."""
    import os
    import time

    root = tmp_path / "k"
    shutil.copytree(kinetics_root, root)
    ds = datasets.Kinetics(root, frames_per_clip=4, step_between_clips=2)
    victim = ds.video_clips.video_paths[1]
    os.unlink(victim)
    os.mkfifo(victim)  # after the scan: only the decode blocks
    loader = DataLoader(ds, batch_size=2, num_workers=2, timeout=3, device="cpu")
    start = time.monotonic()
    try:
        with pytest.raises(RuntimeError, match=r"timed out after 3 seconds.*did not return") as info:
            for _ in loader:
                pass
        assert os.path.basename(victim) in str(info.value) and time.monotonic() - start < 60
    finally:
        loader.close()  # the blocked worker is terminated
        try:
            os.close(os.open(victim, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass


def test_bad_video_at_scan_named(kinetics_root, tmp_path):
    root = tmp_path / "k"
    shutil.copytree(kinetics_root, root)
    victim = sorted((root / "train").glob("*/*.mp4"))[2]
    _damage(victim, "garbage")
    with pytest.raises(VideoReadError, match=str(victim.name)):
        datasets.Kinetics(root, frames_per_clip=4)
    victim.unlink()
    short = root / "train" / "class_00" / "short.mp4"
    sampledata.write_video(short, list(sampledata.video_frames(np.random.default_rng(0), 3, 72, 96)))
    with pytest.warns(UserWarning, match="short.mp4"):
        ds = datasets.Kinetics(root, frames_per_clip=4)
    assert len(ds.video_clips.clips[ds.video_clips.video_paths.index(str(short))]) == 0


def test_pyav_decoding_equals_torchcodec_frame_for_frame(kinetics_root):
    """The CPU path's decoder against torchvision's (where torchcodec loads; else against PyAV's
    own full sequential decode, which the seek-and-select path must reproduce)."""
    from gputransforms import video

    path = sorted((kinetics_root / "train").glob("*/*.mp4"))[0]
    meta = video.probe(str(path))
    frames = [0, 5, 13, 14, 2, meta.num_frames - 1]
    ours = video.read_frames(str(path), frames)
    assert [sampledata.frame_index(f) for f in ours] == frames
    if _compat.torchcodec_loads():
        from torchcodec.decoders import VideoDecoder

        ref = VideoDecoder(str(path), dimension_order="NHWC").get_frames_at(indices=frames).data.numpy()
    else:
        import av

        with av.open(str(path)) as c:
            allf = [f.to_ndarray(format="rgb24") for f in c.decode(c.streams.video[0])]
        ref = np.stack([allf[k] for k in frames])
    assert np.abs(ours.astype(int) - ref.astype(int)).max() <= 1


@pytest.mark.parametrize("device", [pytest.param("cpu-yuv", id="cpu"), pytest.param("gpu", id="gpu", marks=pytest.mark.gpu)])
def test_yuv_planes_give_ffmpegs_rgb(kinetics_root, device):
    """video_decoder="pyav-yuv" (the GPU's default): the workers hand over PyAV's YUV planes and the
    graph converts them. Against FFmpeg's own RGB of the same frames (PyAV's rgb24; torchcodec's
    where it loads): within 2, mean below 0.35 in 0-255 units (0.22-0.38 per clip measured; plain
    rounding of the same matrix, without FFmpeg's truncation, is off by 0.9-1.1: the negative
    control). The graph's conversion is video.yuv_to_rgb's, to within 1 (float rounding)."""
    from gputransforms import video

    ds = datasets.Kinetics(kinetics_root, frames_per_clip=8, step_between_clips=8)
    loader = DataLoader(ds, batch_size=4, **on(device))
    assert "as YUV planes, converted to RGB" in loader.explain()
    vc, n, plain, means = ds.video_clips, 0, [], []
    for b, (v, _, _) in enumerate(loader):
        for k, clip in enumerate(v.cpu().permute(0, 1, 3, 4, 2).numpy()):
            path = vc.video_paths[vc.get_clip_location(4 * b + k)[0]]
            frames = _compat.clip_frames(vc, *vc.get_clip_location(4 * b + k)).tolist()
            rgb = video.read_frames(path, frames)
            d = np.abs(clip.astype(int) - rgb.astype(int))
            assert d.max() <= 2 and d.mean() < 0.5, (path, d.mean(), d.max())
            means.append(d.mean())
            y, uv, mt = video.read_planes(path, frames)
            assert np.abs(video.yuv_to_rgb(y, uv, mt).astype(int) - clip.astype(int)).max() <= 1
            mt_plain = mt.copy()
            mt_plain[:, 3] -= np.asarray(video._TRUNCATION, np.float32)
            plain.append(np.abs(video.yuv_to_rgb(y, uv, mt_plain).astype(int) - rgb.astype(int)).mean())
            if _compat.torchcodec_loads():
                from torchcodec.decoders import VideoDecoder

                ref = VideoDecoder(path, dimension_order="NHWC").get_frames_at(indices=frames).data.numpy()
                assert np.abs(clip.astype(int) - ref.astype(int)).max() <= 3
            n += 1
    assert n == len(ds)
    assert np.mean(means) < 0.35 and np.mean(plain) > 0.7, (np.mean(means), np.mean(plain))


def test_yuv_matrix_inverts_ffmpegs_encoding():
    """video.yuv_matrix for each colorspace and range: FFmpeg's own RGB -> YUV -> RGB of a smooth
    image (4:4:4, no chroma loss; FFmpeg rounds there, so no truncation) comes back within 1."""
    import av

    from gputransforms import video

    yy, xx = np.mgrid[0:64, 0:96]
    img = np.stack([xx * 2.5, yy * 3.5, 255 - xx * 2.0], -1).clip(0, 255).astype(np.uint8)
    for space, code in [("ITU601", 5), ("ITU709", 1), ("BT2020", 9)]:
        for rng, full in [("MPEG", False), ("JPEG", True)]:
            f = av.VideoFrame.from_ndarray(img, format="rgb24").reformat(
                format="yuv444p", dst_colorspace=space, dst_color_range=rng)
            y, uv, mt = video._planes(f)
            assert np.allclose(mt, video.yuv_matrix(code, full, truncate=False)), (space, rng)
            back = video.yuv_to_rgb(y[None], uv[None], mt)[0]
            assert np.abs(back.astype(int) - img.astype(int)).max() <= 2, (space, rng)


@pytest.fixture(scope="session")
def audio_root(tmp_path_factory):
    """Kinetics-style videos with AAC audio (a rising tone per channel): 4 at 30 fps, 2 at 25."""
    root = tmp_path_factory.mktemp("kinetics_audio")
    sampledata.make_video_folder(root / "train", classes=2, per_class=3, frames=(24, 40), fps=(30, 30, 25),
                                 seed=5, audio="aac")
    return root


@torchcodec
@pytest.mark.parametrize("codec,ext,kw", [("aac", "mp4", {}), ("pcm_s16le", "avi", dict(bframes=0)),
                                          ("pcm_s16le", "mkv", dict(sample_rate=16000, channels=1))])
def test_read_audio_equals_torchcodec(tmp_path, codec, ext, kw):
    """A clip's audio range as torchcodec's AudioDecoder gives it (torchvision's VideoClips asks it):
    the same samples for PCM, within 1e-4 for AAC (two FFmpeg builds), the same shapes always, on
    ranges from the first frame to the last."""
    from torchcodec.decoders import AudioDecoder

    from gputransforms import video

    path = str(sampledata.write_video(tmp_path / f"a.{ext}", sampledata.video_frames(np.random.default_rng(1), 60, 72, 96),
                                      25, audio=codec, **kw))
    worst = 0.0
    for first in (0, 1, 7, 23, 44):
        start, stop = first / 25, (first + 16) / 25
        ref = AudioDecoder(path).get_samples_played_in_range(start_seconds=start, stop_seconds=stop).data
        got = torch.from_numpy(video.read_audio(path, start, stop))
        assert got.shape == ref.shape and got.dtype == ref.dtype == torch.float32
        assert ref.abs().max() > 0.1  # the tone is there: the comparison can fail
        worst = max(worst, (got - ref).abs().max().item())
    assert worst <= (0 if codec.startswith("pcm") else 1e-4), worst


@torchcodec
def test_clip_audio_is_torchvisions(audio_root):
    """Each clip's audio through gputransforms.DataLoader (batched, and per item for a collate_fn)
    is the audio torchvision's Kinetics returns for that clip (torchcodec's), in the sampler's order;
    a batch whose clips' audio lengths differ raises torch's own collate error on both sides."""
    ds = datasets.Kinetics(audio_root, frames_per_clip=8, step_between_clips=6)
    ours, theirs = side_by_side(ds, "cpu", batch_size=1, shuffle=True)
    assert len(ours) == len(theirs) == len(ds)
    lengths = set()
    for (v, a, y), (tv, ta, ty) in zip(ours, theirs):
        assert a.shape == ta.shape and a.shape[1] == 2 and a.shape[2] > 0, (a.shape, ta.shape)
        assert (a - ta).abs().max().item() <= 1e-4 and codes(v) == codes(tv)
        lengths.add(a.shape[2])
    assert len(lengths) > 1  # 30 and 25 fps: clips of 8 frames play for different times

    def audio_only(batch):
        return [item[1] for item in batch]
    got = next(iter(DataLoader(ds, device="cpu", batch_size=4, collate_fn=audio_only)))
    want = [ds[i][1] for i in range(4)]
    assert [g.shape for g in got] == [w.shape for w in want]
    assert max((g - w).abs().max().item() for g, w in zip(got, want)) <= 1e-4

    with pytest.raises(RuntimeError, match="stack expects each tensor to be equal size"):
        list(tud.DataLoader(ds, batch_size=len(ds)))
    with pytest.raises(RuntimeError, match="stack expects each tensor to be equal size"):
        list(DataLoader(ds, device="cpu", batch_size=len(ds)))
