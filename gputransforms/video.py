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
    before the first one and converted to RGB by FFmpeg. Raises VideoReadError naming the file when
    a frame cannot be decoded."""
    video = video or info(path)
    if not len(frames):
        return np.zeros((0, video.height, video.width, 3), np.uint8)
    return np.stack(_decode(path, frames, video, lambda f: f.to_ndarray(format="rgb24")))


def read_planes(path: str, frames: Sequence[int], video: Optional[VideoInfo] = None):
    """Frames ``frames`` of ``path`` as the decoder gives them, before FFmpeg's conversion to RGB:
    luma (T, H, W, 1), chroma (T, h, w, 2) (Cb, Cr; half size for 4:2:0, else full size) and the
    (3, 4) float32 matrix ``[M T]`` that turns a pixel's (Y, Cb, Cr), chroma upsampled to (H, W) by
    repetition, into RGB as ``round(M @ yuv + T)`` (``yuv_to_rgb``). Half the bytes of RGB for 4:2:0,
    and no conversion on the CPU. Raises VideoReadError as ``read_frames``."""
    video = video or info(path)
    if not len(frames):
        return (np.zeros((0, video.height, video.width, 1), np.uint8),
                np.zeros((0, (video.height + 1) // 2, (video.width + 1) // 2, 2), np.uint8), yuv_matrix(2, False))
    planes = _decode(path, frames, video, _planes)
    return (np.stack([p[0] for p in planes]), np.stack([p[1] for p in planes]), planes[0][2])


def _decode(path: str, frames: Sequence[int], video: VideoInfo, convert) -> list:
    """``convert(frame)`` of each of ``frames`` (k: the video's k-th frame in presentation order)."""
    frames = [int(f) for f in frames]
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
                    wanted[frame.pts] = convert(frame)
                    missing -= 1
                if missing == 0 or (frame.pts is not None and frame.pts > last):
                    break
    except Exception as e:  # noqa: BLE001
        raise VideoReadError(path, f"cannot be decoded ({type(e).__name__}: {e})") from None
    lost = [f for f in frames if wanted[int(video.pts[f])] is None]
    if lost:
        raise VideoReadError(path, f"frame {lost[0]} cannot be decoded (truncated or corrupt)")
    return [wanted[int(video.pts[f])] for f in frames]


#: FFmpeg's colorspace codes (AVColorSpace) -> (Kr, Kb) of the YCbCr matrix; what is not listed
#: (2, unspecified, among them) is BT.601's, as FFmpeg's conversion to RGB takes it
_KR_KB = {1: (0.2126, 0.0722), 4: (0.30, 0.11), 7: (0.212, 0.087), 9: (0.2627, 0.0593), 10: (0.2627, 0.0593)}

#: added before rounding, for 4:2:0 frames: FFmpeg converts those to RGB in fixed point and truncates,
#: once for R and B and twice for G (two chroma terms). Fitted on 1080p H.264 frames against PyAV's
#: rgb24 (x86): mean |diff| 0.29 in 0-255 units, max 2, one value in 10^6 off by more than 1 (0.56
#: and 4% with plain rounding). FFmpeg's other conversions (4:4:4) round.
_TRUNCATION = (-0.8, -1.5, -0.7)


def yuv_matrix(colorspace: int, full_range: bool, truncate: bool = True) -> np.ndarray:
    """The (3, 4) ``[M T]`` of ``read_planes``: YCbCr of ``colorspace`` (an AVColorSpace code) in
    limited (16-235/240) or full range, to RGB in 0-255; ``truncate``: as FFmpeg's 4:2:0 conversion."""
    kr, kb = _KR_KB.get(int(colorspace), (0.299, 0.114))
    kg = 1.0 - kr - kb
    sy, sc, oy = (1.0, 1.0, 0.0) if full_range else (255.0 / 219.0, 255.0 / 224.0, 16.0)
    m = np.array([[sy, 0.0, 2 * (1 - kr) * sc],
                  [sy, -2 * kb * (1 - kb) / kg * sc, -2 * kr * (1 - kr) / kg * sc],
                  [sy, 2 * (1 - kb) * sc, 0.0]])
    t = -m @ np.array([oy, 128.0, 128.0]) + (np.asarray(_TRUNCATION) if truncate else 0.0)
    return np.concatenate([m, t[:, None]], axis=1).astype(np.float32)


def yuv_to_rgb(y: np.ndarray, uv: np.ndarray, mt: np.ndarray) -> np.ndarray:
    """``read_planes``'s frames in RGB (T, H, W, 3) uint8, on the CPU with numpy: what the graph
    computes on the device (the tests' reference for it)."""
    h, w = y.shape[1:3]
    f = 2 if uv.shape[1] < h or uv.shape[2] < w else 1
    uv = uv.repeat(f, axis=1).repeat(f, axis=2)[:, :h, :w]
    yuv = np.concatenate([y, uv], axis=3).astype(np.float32)
    rgb = yuv @ mt[:, :3].T + mt[:, 3]
    return np.clip(np.rint(rgb), 0, 255).astype(np.uint8)


def _planes(frame):
    """One decoded frame's (luma, chroma, [M T]) (``read_planes``). 8-bit 4:2:0 of even size is taken
    as decoded; anything else (odd sizes, 4:2:2, 4:4:4, 10-bit) is first converted by FFmpeg to 8-bit
    4:4:4 in the same colorspace and range."""
    name = frame.format.name
    full = name.startswith("yuvj") or int(frame.color_range) == 2  # AVCOL_RANGE_JPEG
    h, w = frame.height, frame.width
    as_decoded = name in ("yuv420p", "yuvj420p") and not h % 2 and not w % 2
    if as_decoded:
        ch, cw = h // 2, w // 2
    else:
        rng = "JPEG" if full else "MPEG"
        frame = frame.reformat(format="yuv444p", src_color_range=rng, dst_color_range=rng)
        ch, cw = h, w

    def plane(i, rows, cols):
        p = frame.planes[i]
        return np.frombuffer(p, np.uint8).reshape(-1, p.line_size)[:rows, :cols]

    y = plane(0, h, w)[..., None].copy()
    uv = np.stack([plane(1, ch, cw), plane(2, ch, cw)], axis=-1)
    return y, uv, yuv_matrix(int(frame.colorspace), full, truncate=as_decoded)


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
