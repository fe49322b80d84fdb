"""Reading video files: what a video holds (``probe``: its frames' timestamps, rate and size, read
from the container without decoding), the frames of one clip (``read_frames``, decoded with
PyAV on the CPU) and its audio (``read_audio``). The GPU path decodes with NVDEC inside the DALI
graph and only needs ``probe``'s answer and the file's bytes.

Frame ``k`` of a video is its k-th frame in presentation order, as torchvision's ``VideoClips``
(through torchcodec) counts them: the rate is torchcodec's ``average_fps`` after a scan, the number
of frames over the span from the first frame's timestamp to the end of the last one.

PyAV is the video extra (``pip install "gputransforms[video]"``): its wheels bring their own FFmpeg,
where torchvision's torchcodec needs the system's.
"""
from __future__ import annotations

import dataclasses
import functools
import math
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


@functools.lru_cache(maxsize=1 << 20)
def has_audio(path: str) -> bool:
    """Whether ``path`` has an audio stream (read from its header; False where it cannot be opened)."""
    try:
        with av().open(path) as c:
            return bool(c.streams.audio)
    except Exception:  # noqa: BLE001 - a file that cannot be opened has no audio to give
        return False


#: how far before a range ``read_audio`` seeks: an AAC frame is decoded with the one before it (its
#: transform overlaps), so decoding must start at least one frame (1024 samples) early
_AUDIO_PREROLL_S = 0.1


def read_audio(path: str, start: float, stop: float) -> np.ndarray:
    """The audio samples played in [start, stop) seconds, float32 (channels, samples), as torchcodec's
    ``AudioDecoder(path).get_samples_played_in_range(start, stop)`` gives them (torchvision's
    ``VideoClips.get_clip`` asks it for a clip's audio): the frames that overlap the range, decoded
    by PyAV from a seek ``_AUDIO_PREROLL_S`` before it, in the stream's rate and channels, converted
    to float by FFmpeg's resampler where the codec gives another sample format, then cut where
    torchcodec cuts, at ``floor((t - first frame's time) * rate + 0.5)``. Against torchcodec
    (tests/test_video.py): the same shapes, samples within 1e-4. Raises VideoReadError."""
    _av = av()
    try:
        with _av.open(path) as c:
            if not c.streams.audio:
                raise VideoReadError(path, "no audio stream")
            s = c.streams.audio[0]
            rate, channels = s.codec_context.sample_rate, s.codec_context.channels
            if start - _AUDIO_PREROLL_S > 0:
                c.seek(int((start - _AUDIO_PREROLL_S) / s.time_base), stream=s, backward=True, any_frame=False)
            resampler, chunks, first = None, [], None
            for frame in c.decode(s):
                t0 = float(frame.pts * frame.time_base)
                if t0 + frame.samples / rate <= start:
                    continue
                if t0 >= stop:
                    break
                first = t0 if first is None else first
                if frame.format.name != "fltp":
                    resampler = resampler or _av.AudioResampler(format="fltp", layout=frame.layout, rate=rate)
                    chunks += [f.to_ndarray() for f in resampler.resample(frame)]
                else:
                    chunks.append(frame.to_ndarray())
    except VideoReadError:
        raise
    except Exception as e:  # noqa: BLE001 - PyAV/FFmpeg errors of every kind name the file
        raise VideoReadError(path, f"audio cannot be decoded ({type(e).__name__}: {e})") from None
    if first is None:
        return np.zeros((channels, 0), np.float32)
    data = np.concatenate(chunks, axis=1).astype(np.float32, copy=False)

    def offset(t: float) -> int:
        return math.floor((t - first) * rate + 0.5)

    return data[:, offset(start) if first < start else 0:min(data.shape[1], offset(stop))]


def read_bytes(path: str) -> np.ndarray:
    from .files import read_file

    data = read_file(path)
    if not data:
        raise VideoReadError(path, "the file is empty")
    return np.frombuffer(data, dtype=np.uint8)
