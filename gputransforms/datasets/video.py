"""Video datasets: torchvision's Kinetics, UCF101 and HMDB51, and what the loader needs of them.

The classes here are torchvision's (subclasses that keep ``__getitem__``), so clip indexing,
``frames_per_clip``/``step_between_clips``/``frame_rate``, folds, labels, ``metadata`` and errors are
torchvision's own. They differ in where torchvision needs torchcodec and the system's FFmpeg: the
scan at construction (``video.probe``, PyAV, in threads) and, where torchcodec cannot load, the
per-clip decoding of ``__getitem__`` (PyAV). A dataset built by torchvision itself compiles too.

``ClipSamples`` is what ``gputransforms.DataLoader`` reads of a video dataset: for each index, the
video file, the frame indices torchvision's ``VideoClips`` selects, the label and the transform.
"""
from __future__ import annotations

import functools
import inspect
import os
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import numpy as np
import torch
import torchvision.datasets as tvd
from torchvision.datasets.folder import find_classes, make_dataset
from torch.utils.data import default_collate
from torchvision.datasets.video_utils import VideoClips as _TVVideoClips

from .. import _compat, video
from ..device import batched, to_device
from ..errors import BadSampleError


class ClipSamples:
    """Index ``i`` is clip ``clip[i]`` of video ``video_of[i]``: the frames ``frames(i)`` of
    ``paths[i]``, ``transform`` applied to them in ``output_format``, and the label ``targets[i]``."""

    on_error = None  # (FileSamples' protocol: the loader's on_error applies)
    warn_skipped = True
    extras = False

    @property
    def plan_input(self) -> str:
        return f"video {self.output_format}"

    def __init__(self, video_clips, labels: list, transform, output_format: str, origin: str = ""):
        self.video_clips = video_clips
        self.labels = labels  # per video of video_clips
        self.transform = transform
        self.output_format = output_format
        self.origin = origin
        self.target_transforms = None
        sizes = np.asarray([len(c) for c in video_clips.clips], dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]) if len(sizes) else sizes
        video_of = np.repeat(np.arange(len(sizes)), sizes)
        clip = np.arange(len(video_of)) - starts[video_of]
        self.video_of, self.clip = video_of, clip
        vp = video_clips.video_paths
        self.paths = [vp[v] for v in video_of]
        self.targets = [labels[v] for v in video_of]

    def __len__(self) -> int:
        return len(self.video_of)

    def target(self, i: int):
        return self.targets[i]

    def frames(self, i: int) -> np.ndarray:
        f = _compat.clip_frames(self.video_clips, int(self.video_of[i]), int(self.clip[i]))
        return np.asarray(f, dtype=np.int32)

    def select(self, indices) -> "ClipSamples":
        idx = np.asarray([int(i) for i in indices], dtype=np.int64)
        out = ClipSamples.__new__(ClipSamples)
        out.__dict__.update(self.__dict__)
        out.video_of, out.clip = self.video_of[idx], self.clip[idx]
        out.paths = [self.paths[i] for i in idx]
        out.targets = [self.targets[i] for i in idx]
        return out

    def reader(self, *, gpu: bool, check_jpeg_scan: bool = False, planes: bool = False) -> Callable[[int], Any]:
        """Sample index -> the graph's inputs for it: on the GPU the file's bytes (NVDEC decodes them
        in the graph), the frame indices and the size; on the CPU the decoded frames and the size,
        or with ``planes`` their YUV planes, matrix and size (``video.read_planes``)."""

        def read(i: int):
            path = self.paths[i]
            try:
                meta = video.info(path)
                hw = np.asarray([meta.height, meta.width], dtype=np.int32)
                if gpu:
                    return video.read_bytes(path), self.frames(i), hw
                if planes:
                    return (*video.read_planes(path, self.frames(i), meta), hw)
                return video.read_frames(path, self.frames(i), meta), hw
            except (video.VideoReadError, OSError) as e:
                reason = e.reason if isinstance(e, video.VideoReadError) else f"cannot be read ({e})"
                raise BadSampleError(i, path, f"clip {int(self.clip[i])}: {reason}") from None

        return read

    def num_inputs(self, gpu: bool) -> int:
        return 3 if gpu else 2

    def per_sample_note(self) -> None:
        """Nothing of a video dataset's own runs per sample beyond the chain (FileSamples' protocol)."""
        return None

    def explain_lines(self) -> list:
        return []  # (FileSamples' protocol)

    def faster_on_workers(self, num_workers: int) -> None:
        """(FileSamples' protocol: the graph is the faster way for clips.)"""
        return None

    def audio(self, indices) -> list:
        """Each clip's audio as torchvision's ``VideoClips.get_clip`` returns it (``clip_audio``),
        decoded in threads (a video without audio costs one look at its header, once)."""
        fps = self.video_clips.video_fps
        return list(_audio_pool().map(
            lambda i: clip_audio(self.paths[i], self.frames(i), fps[int(self.video_of[i])]), indices))

    def batch(self, videos, labels, dev, indices) -> list:
        """(video, audio, label) batched as torch's default_collate batches torchvision's items: the
        clips' audio stacked, which raises torch's own error where their lengths differ (as torch's
        DataLoader does; torchvision's video references drop the audio in their collate_fn)."""
        return [batched(videos), to_device(default_collate(self.audio(indices)), dev), labels]

    def items(self, videos, indices) -> list:
        return [(v, a, self.target(i)) for v, a, i in zip(videos, self.audio(indices), indices)]

    def load(self, i: int) -> torch.Tensor:
        """The clip torchvision's transform receives: uint8 frames in ``output_format``."""
        frames = torch.from_numpy(video.read_frames(self.paths[i], self.frames(i)))
        return frames.permute(0, 3, 1, 2) if self.output_format == "TCHW" else frames


def scan(paths: list, num_workers: int = 1) -> dict:
    """torchvision's ``VideoClips`` metadata for ``paths`` (what it computes with torchcodec), from
    PyAV's packet scan in threads. A file that cannot be read raises, naming it, as torchcodec's
    scan raises; videos too short for one clip are named in a warning (torchvision warns unnamed)."""
    workers = max(1, min(32, num_workers or 1, len(paths) or 1))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        infos = list(pool.map(video.info, [os.fspath(p) for p in paths]))
    return {"video_paths": list(paths),
            "video_pts": [torch.arange(v.num_frames, dtype=torch.int64) for v in infos],
            "video_fps": [v.fps for v in infos]}


def _no_audio() -> torch.Tensor:
    return torch.empty((1, 0), dtype=torch.float32)  # torchvision's, for a clip without audio


def clip_audio(path: str, frames, fps: float) -> torch.Tensor:
    """The audio torchvision's ``VideoClips.get_clip`` returns for the clip of frames ``frames``
    (first to last, in the video's frame indices) of ``path``: the samples played from the first
    frame's time to the end of the last, ``[first / fps, (last + 1) / fps)`` with the video's
    ``video_fps`` (torchcodec's ``average_fps``), float32 (channels, samples), decoded by PyAV
    (``video.read_audio``: within 1e-4 of torchcodec for AAC, equal for PCM); torchvision's empty
    ``(1, 0)`` where the video has no audio stream or its audio cannot be decoded (torchvision's
    get_clip catches every error there)."""
    if not fps or len(frames) == 0 or not video.has_audio(path):
        return _no_audio()
    try:
        return torch.from_numpy(video.read_audio(path, int(frames[0]) / fps, (int(frames[-1]) + 1) / fps))
    except Exception:  # noqa: BLE001 - as torchvision: any failure gives the empty audio
        return _no_audio()


@functools.lru_cache(maxsize=None)
def _audio_pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=min(16, os.cpu_count() or 1), thread_name_prefix="gputransforms-audio")


class VideoClips(_TVVideoClips):
    """torchvision's VideoClips whose ``get_clip`` decodes with PyAV where torchcodec cannot load."""

    def get_clip(self, idx: int):
        if _compat.torchcodec_loads():
            return super().get_clip(idx)
        if idx >= self.num_clips():
            raise IndexError(f"Index {idx} out of range ({self.num_clips()} number of clips)")
        video_idx, clip_idx = self.get_clip_location(idx)
        path = self.video_paths[video_idx]
        frames = torch.from_numpy(video.read_frames(path, _compat.clip_frames(self, video_idx, clip_idx).tolist()))
        if self.output_format == "TCHW":
            frames = frames.permute(0, 3, 1, 2)
        fps = self.frame_rate if self.frame_rate is not None else self.video_fps[video_idx]
        audio = clip_audio(path, _compat.clip_frames(self, video_idx, clip_idx), self.video_fps[video_idx])
        return frames, audio, {"video_fps": fps}, video_idx


def _videos_kinetics(a: dict) -> list:
    folder = a["root"] if a["_legacy"] else os.path.join(a["root"], a["split"])
    return _listed(folder, a["extensions"])


def _videos_ucf_hmdb(a: dict) -> list:
    return _listed(a["root"], ("avi",))


def _listed(folder, extensions) -> list:
    _, class_to_idx = find_classes(folder)
    return [p for p, _ in make_dataset(folder, class_to_idx, extensions, is_valid_file=None)]


def _scanned(tv_cls, list_videos):
    """``tv_cls`` whose constructor scans its videos with PyAV (unless given ``_precomputed_metadata``
    or asked to download), then decodes per clip with PyAV where torchcodec cannot load."""
    sig = inspect.signature(tv_cls.__init__)

    def __init__(self, *args, **kwargs):
        bound = sig.bind(self, *args, **kwargs)
        bound.apply_defaults()
        a = bound.arguments
        if a.get("_precomputed_metadata") is None and not a.get("download", False):
            paths = list_videos(a)
            meta = scan(paths, a.get("num_workers") or 1)
            short = [p for p, pts in zip(paths, meta["video_pts"]) if len(pts) < a["frames_per_clip"]]
            if short:
                warnings.warn(f"gputransforms: {len(short)} video(s) have fewer frames than frames_per_clip="
                              f"{a['frames_per_clip']} and give no clip (torchvision skips them too): "
                              + ", ".join(short[:5]), UserWarning, stacklevel=2)
            a["_precomputed_metadata"] = meta
        tv_cls.__init__(*bound.args, **bound.kwargs)
        for name in ("video_clips", "full_video_clips"):
            vc = getattr(self, name, None)
            if type(vc) is _TVVideoClips:
                vc.__class__ = VideoClips

    __init__.__signature__ = sig
    return type(tv_cls.__name__, (tv_cls,), {"__init__": __init__, "__doc__": tv_cls.__doc__,
                                             "__module__": __name__, "__qualname__": tv_cls.__name__})


Kinetics = _scanned(tvd.Kinetics, _videos_kinetics)
UCF101 = _scanned(tvd.UCF101, _videos_ucf_hmdb)
HMDB51 = _scanned(tvd.HMDB51, _videos_ucf_hmdb)


def _kinetics(ds) -> ClipSamples:
    return ClipSamples(ds.video_clips, [y for _, y in ds.samples], ds.transform, ds.video_clips.output_format,
                       _ORIGIN.format(type(ds).__name__))


def _ucf_hmdb(ds) -> ClipSamples:
    # video_clips is the fold's subset: its video k is samples[indices[k]]
    labels = [ds.samples[i][1] for i in ds.indices]
    return ClipSamples(ds.video_clips, labels, ds.transform, ds.video_clips.output_format,
                       _ORIGIN.format(type(ds).__name__))


_ORIGIN = "{}'s clips, as its VideoClips indexes them (datasets/video.py)"


#: video dataset class -> adapter (datasets/adapters.py's table takes these rows)
VIDEO_ADAPTERS: dict = {tvd.Kinetics: _kinetics, tvd.UCF101: _ucf_hmdb, tvd.HMDB51: _ucf_hmdb}
