"""Reading video files: what a video holds (``probe``: its frames' timestamps, rate and size, read
from the container without decoding) and the frames of one clip (``read_frames``, decoded with
PyAV on the CPU). The GPU path decodes with NVDEC inside the DALI graph and only needs ``probe``'s
answer and the file's bytes.

Frame ``k`` of a video is its k-th frame in presentation order, as torchvision's ``VideoClips``
(through torchcodec) counts them: the rate is torchcodec's ``average_fps`` after a scan, the number
of frames over the span from the first frame's timestamp to the end of the last one.

PyAV is the video extra (``pip install "gputransforms[video]"``): its wheels bring their own FFmpeg,
where torchvision's torchcodec needs the system's.
"""
from __future__ import annotations

import dataclasses
import functools
import os
from typing import Optional, Sequence

import numpy as np


class VideoReadError(RuntimeError):
    """A video file that cannot be read (zero-length, not a video, no video stream, truncated)."""

    def __init__(self, path: str, reason: str):
        super().__init__(f"gputransforms: video {path}: {reason}")
        self.path, self.reason = path, reason


def av():
    try:
        import av as _av
    except ImportError as e:  # the video extra
        raise ImportError("gputransforms reads video with PyAV, which brings its own FFmpeg: "
                          'pip install "gputransforms[video]" (or pip install av)') from e
    return _av


@dataclasses.dataclass(frozen=True)
class VideoInfo:
    path: str
    pts: np.ndarray  # int64, the frames' timestamps in presentation order: frame k is pts[k]
    fps: Optional[float]  # torchcodec's average_fps after a scan; None without frames
    height: int
    width: int
    has_audio: bool

    @property
    def num_frames(self) -> int:
        return len(self.pts)


def probe(path: str) -> VideoInfo:
    """Scan ``path``'s packets (no decoding). Raises VideoReadError naming the file."""
    path = os.fspath(path)
    _av = av()
    if os.path.getsize(path) == 0:
        raise VideoReadError(path, "the file is empty")
    try:
        with _av.open(path) as c:
            if not c.streams.video:
                raise VideoReadError(path, "no video stream")
            s = c.streams.video[0]
            has_audio = bool(c.streams.audio)
            pts, end = [], None
            for pkt in c.demux(s):
                if pkt.pts is None:  # the demuxer's flush packet
                    continue
                pts.append(pkt.pts)
                stop = pkt.pts + (pkt.duration or 0)
                end = stop if end is None else max(end, stop)
            height, width = s.height, s.width
            tb = s.time_base
    except VideoReadError:
        raise
    except Exception as e:  # noqa: BLE001 - PyAV/FFmpeg errors of every kind name the file
        raise VideoReadError(path, f"cannot be read ({type(e).__name__}: {e})") from None
    pts_sorted = np.sort(np.asarray(pts, dtype=np.int64))
    fps = None
    if len(pts_sorted):
        span = float((end - pts_sorted[0]) * tb)
        fps = len(pts_sorted) / span if span > 0 else None
    return VideoInfo(path, pts_sorted, fps, int(height), int(width), has_audio)


@functools.lru_cache(maxsize=4096)
def info(path: str) -> VideoInfo:
    """``probe(path)``, remembered: reader threads ask for it once per clip."""
    return probe(path)



def read_frames(path: str, frames: Sequence[int], video: Optional[VideoInfo] = None) -> np.ndarray:
    """Frames ``frames`` of ``path`` as uint8 RGB (T, H, W, 3), decoded by PyAV from the key frame
    before the first one. Raises VideoReadError naming the file when a frame cannot be decoded."""
    video = video or info(path)
    frames = [int(f) for f in frames]
    if not frames:
        return np.zeros((0, video.height, video.width, 3), np.uint8)
    if min(frames) < 0 or max(frames) >= video.num_frames:
        raise VideoReadError(path, f"frames {min(frames)}..{max(frames)} requested, the video has {video.num_frames}")
    wanted = {int(video.pts[f]): None for f in sorted(set(frames))}
    last = max(wanted)
    _av = av()
    try:
        with _av.open(path) as c:
            s = c.streams.video[0]
            s.thread_type = "AUTO"
            c.seek(int(video.pts[min(frames)]), stream=s, backward=True, any_frame=False)
            missing = len(wanted)
            for frame in c.decode(s):
                if frame.pts in wanted and wanted[frame.pts] is None:
                    wanted[frame.pts] = frame.to_ndarray(format="rgb24")
                    missing -= 1
                if missing == 0 or (frame.pts is not None and frame.pts > last):
                    break
    except Exception as e:  # noqa: BLE001
        raise VideoReadError(path, f"cannot be decoded ({type(e).__name__}: {e})") from None
    lost = [f for f in frames if wanted[int(video.pts[f])] is None]
    if lost:
        raise VideoReadError(path, f"frame {lost[0]} cannot be decoded (truncated or corrupt)")
    return np.stack([wanted[int(video.pts[f])] for f in frames])


def read_bytes(path: str) -> np.ndarray:
    from .files import read_file

    data = read_file(path)
    if not data:
        raise VideoReadError(path, "the file is empty")
    return np.frombuffer(data, dtype=np.uint8)
