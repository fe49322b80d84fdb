"""Sample data made by the project itself: the tests, the demo and the benchmarks use it, so that a
fresh clone needs nothing outside the repository.

- ``make_photo_folder``: an ImageFolder of real-photo JPEGs with ImageNet-like sizes, chroma
  subsampling and quality. The pixels come from the photographs that ship inside scikit-image's and
  scikit-learn's wheels (both are test extras): each file is a random window of one photo, resized,
  re-coloured a little and re-encoded, so decoders and resizers see natural-image statistics.
  Without those packages it says so; ``synthetic=True`` draws scenes instead (the demo's fallback).
- ``make_odd_files``: the inputs real datasets contain and decoders disagree on: grayscale, CMYK and
  progressive JPEGs, RGBA/palette/16-bit PNG, BMP, TIFF, WEBP, an EXIF-rotated JPEG, an upper-case
  extension, tiny, one-pixel, strip-shaped and huge images.
- ``write_bad_file``: files that must raise a named error: empty, garbage, text, truncated, a JPEG
  with a corrupted entropy-coded body.

Every file is a function of (seed, index) only, whatever the number of processes.
"""
from __future__ import annotations

import functools
import glob
import io
import os
from pathlib import Path
from typing import Optional

import numpy as np
from PIL import Image, ImageDraw, ImageFilter


class NoSamplePhotos(RuntimeError):
    """scikit-image / scikit-learn, whose wheels carry the source photographs, are not installed."""


@functools.lru_cache(maxsize=1)
def source_photos() -> tuple:
    """The colour photographs bundled in scikit-image's and scikit-learn's wheels, as RGB arrays,
    in a fixed order. Only files of the wheels themselves: nothing is downloaded."""
    paths = []
    try:
        import skimage

        paths += sorted(glob.glob(os.path.join(os.path.dirname(skimage.__file__), "data", "*.png")))
        paths += sorted(glob.glob(os.path.join(os.path.dirname(skimage.__file__), "data", "*.jpg")))
    except ImportError:
        pass
    try:
        import sklearn

        paths += sorted(glob.glob(os.path.join(os.path.dirname(sklearn.__file__), "datasets", "images", "*.jpg")))
    except ImportError:
        pass
    photos = []
    for p in paths:
        try:
            img = Image.open(p)
            img.load()
        except Exception:  # noqa: BLE001 - a data file that is not a picture is simply not a source
            continue
        # colour photographs of some size; skip masks, single-channel scans and tiny icons
        if img.mode not in ("RGB", "RGBA") or min(img.size) < 256:
            continue
        arr = np.asarray(img.convert("RGB"))
        if arr.std(axis=(0, 1)).mean() < 20 or _channel_spread(arr) < 4:
            continue  # flat or nearly grey: not the statistics of a photo
        photos.append(arr)
    if len(photos) < 3:
        raise NoSamplePhotos("gputransforms.sampledata needs the photographs that ship with scikit-image and "
                             "scikit-learn: pip install scikit-image scikit-learn (the project's [test] extra)")
    return tuple(photos)


def _channel_spread(arr: np.ndarray) -> float:
    a = arr.reshape(-1, 3)[:: max(1, arr.size // 30000)].astype(np.float32)
    return float(np.abs(a - a.mean(axis=1, keepdims=True)).mean())


def _imagenet_like_size(rng: np.random.Generator, long_side: Optional[int]) -> tuple[int, int]:
    """(width, height): most 500 px on the long side at 4:3, some other sizes and aspects, a few large."""
    if long_side is None:
        u = rng.random()
        long_side = 500 if u < 0.65 else int(rng.integers(250, 1000)) if u < 0.92 else int(rng.integers(1000, 1800))
    aspect = float(rng.choice([4 / 3, 4 / 3, 4 / 3, 3 / 2, 1.0, 16 / 9]))
    short_side = max(32, int(round(long_side / aspect)))
    return (long_side, short_side) if rng.random() < 0.7 else (short_side, long_side)


def photo(rng: np.random.Generator, long_side: Optional[int] = None) -> Image.Image:
    """A new natural image: a random window of a source photo at a random size, slightly recoloured."""
    sources = source_photos()
    src = sources[int(rng.integers(len(sources)))]
    h, w = src.shape[:2]
    width, height = _imagenet_like_size(rng, long_side)
    # a window of the photo with the output's aspect ratio, covering 35-100% of the shorter side
    frac = rng.uniform(0.35, 1.0)
    win_w = min(w, int(round(frac * min(w, h * width / height))))
    win_h = max(8, min(h, int(round(win_w * height / width))))
    x0, y0 = int(rng.integers(0, w - win_w + 1)), int(rng.integers(0, h - win_h + 1))
    img = Image.fromarray(src[y0:y0 + win_h, x0:x0 + win_w]).resize((width, height), Image.BICUBIC)
    if rng.random() < 0.5:
        img = img.transpose(Image.FLIP_LEFT_RIGHT)
    gain = rng.uniform(0.85, 1.15, 3) * rng.uniform(0.8, 1.2)
    arr = np.asarray(img, dtype=np.float32) * gain + rng.normal(0, 1.5, (height, width, 1))
    return Image.fromarray(np.clip(arr, 0, 255).round().astype(np.uint8))


def scene(rng: np.random.Generator, long_side: Optional[int] = None) -> Image.Image:
    """A drawn scene (gradient sky, blurred shapes, sensor noise) for when no photographs are installed."""
    w, h = _imagenet_like_size(rng, long_side)
    top, bottom = rng.integers(0, 256, 3), rng.integers(0, 256, 3)
    t = np.linspace(0, 1, h)[:, None, None]
    img = Image.fromarray(((1 - t) * top + t * bottom).repeat(w, 1).astype(np.uint8))
    d = ImageDraw.Draw(img)
    for _ in range(int(rng.integers(4, 12))):
        x0, y0 = int(rng.integers(-w // 4, w)), int(rng.integers(-h // 4, h))
        x1, y1 = x0 + int(rng.integers(w // 10, w // 2)), y0 + int(rng.integers(h // 10, h // 2))
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        (d.ellipse if rng.random() < 0.5 else d.rectangle)([x0, y0, x1, y1], fill=colour)
    img = img.filter(ImageFilter.GaussianBlur(float(rng.uniform(0.3, 1.5))))
    a = np.asarray(img, dtype=np.float32) + rng.normal(0, rng.uniform(2, 6), (h, w, 1))
    return Image.fromarray(np.clip(a, 0, 255).astype(np.uint8))


def save_jpeg(img: Image.Image, path, rng: np.random.Generator) -> None:
    """JPEG settings found in the wild: quality 70-95, mostly 4:2:0, some 4:4:4 and 4:2:2, some progressive."""
    sub = int(rng.choice([2, 2, 2, 2, 0, 1]))
    img.save(path, "JPEG", quality=int(rng.integers(70, 96)), subsampling=sub, progressive=bool(rng.random() < 0.1))


def _write_one(job) -> None:
    root, i, classes, per_class, seed, long_side, synthetic = job
    rng = np.random.default_rng([seed, i])
    d = Path(root) / f"class_{i // per_class:03d}"
    img = scene(rng, long_side) if synthetic else photo(rng, long_side)
    save_jpeg(img, d / f"img_{i:06d}.jpg", rng)


def make_photo_folder(root, *, classes: int = 4, per_class: int = 16, seed: int = 0, long_side: Optional[int] = None,
                      jobs: int = 1, synthetic: bool = False) -> Path:
    """Write ``classes * per_class`` JPEGs into ``root/class_NNN/``; the same files for the same seed."""
    root = Path(root)
    for c in range(classes):
        (root / f"class_{c:03d}").mkdir(parents=True, exist_ok=True)
    if not synthetic:
        source_photos()  # fail here, once, with the install hint
    work = [(str(root), i, classes, per_class, seed, long_side, synthetic) for i in range(classes * per_class)]
    if jobs > 1 and len(work) > 64:
        import multiprocessing as mp

        with mp.get_context("spawn").Pool(jobs) as pool:
            pool.map(_write_one, work, chunksize=32)
    else:
        for job in work:
            _write_one(job)
    return root


#: the odd files ``make_odd_files`` writes, by name
ODD_FILES = ("gray.jpg", "cmyk.jpg", "progressive.jpg", "upper.JPG", "long_ext.jpeg", "rgba.png", "palette.png",
             "gray8.png", "gray16.png", "plain.bmp", "plain.tiff", "plain.webp", "exif_rot90.jpg", "tiny_7x5.jpg",
             "one_pixel.jpg", "strip_4000x50.jpg", "huge_6000x4000.jpg")


def make_odd_files(directory, seed: int = 0) -> Path:
    """Write ``ODD_FILES`` into ``directory``, each made from a real photo."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng([seed, 7])
    base = photo(rng, long_side=400)
    base.convert("L").save(d / "gray.jpg", "JPEG", quality=88)
    base.convert("CMYK").save(d / "cmyk.jpg", "JPEG", quality=88)
    base.save(d / "progressive.jpg", "JPEG", quality=88, progressive=True)
    base.save(d / "upper.JPG", "JPEG", quality=88)
    base.save(d / "long_ext.jpeg", "JPEG", quality=88, subsampling=0)
    rgba = base.convert("RGBA")
    alpha = np.tile(np.linspace(0, 255, base.width, dtype=np.uint8), (base.height, 1))
    rgba.putalpha(Image.fromarray(alpha))
    rgba.save(d / "rgba.png")
    base.convert("P", palette=Image.ADAPTIVE, colors=200).save(d / "palette.png")
    base.convert("L").save(d / "gray8.png")
    gray16 = (np.asarray(base.convert("L"), dtype=np.uint16) * 257 + rng.integers(0, 257, base.size[::-1]))
    Image.fromarray(gray16.astype(np.uint16)).save(d / "gray16.png")
    base.save(d / "plain.bmp")
    base.save(d / "plain.tiff")
    base.save(d / "plain.webp", quality=85)
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation: rotate 90 CW to display; torchvision's loader ignores it
    base.save(d / "exif_rot90.jpg", "JPEG", quality=88, exif=exif)
    base.resize((7, 5), Image.BILINEAR).save(d / "tiny_7x5.jpg", "JPEG", quality=90)
    base.resize((1, 1), Image.BILINEAR).save(d / "one_pixel.jpg", "JPEG", quality=90)
    base.resize((4000, 50), Image.BILINEAR).save(d / "strip_4000x50.jpg", "JPEG", quality=90)
    photo(rng, long_side=1200).resize((6000, 4000), Image.BILINEAR).save(d / "huge_6000x4000.jpg", "JPEG", quality=82)
    return d


def make_indexed_folder(root, counts=(13, 12, 12)) -> Path:
    """Small flat-colour JPEGs whose pixels name them: red = 6 x the sample's index in ImageFolder's
    sorted order, blue = 100 x its class (tests/conftest.decode_index reads them back)."""
    root = Path(root)
    i = 0
    for c, count in enumerate(counts):
        d = root / f"class{c}"
        d.mkdir(parents=True, exist_ok=True)
        for _ in range(count):
            Image.new("RGB", (24 + i % 5, 20 + i % 7), (i * 6, 100, c * 100)).save(d / f"img{i:03d}.jpg", quality=100)
            i += 1
    return root


BAD_KINDS = ("empty", "garbage", "not-an-image", "truncated", "corrupt-body")


def write_bad_file(path, kind: str, good_jpeg: bytes, seed: int = 0) -> Path:
    """A file a loader must reject (or, for JPEGs, treat as PIL does), made from a good JPEG's bytes."""
    path = Path(path)
    rng = np.random.default_rng(seed)
    if kind == "empty":
        path.write_bytes(b"")
    elif kind == "garbage":
        path.write_bytes(rng.integers(0, 256, 5000, dtype=np.uint8).tobytes())
    elif kind == "not-an-image":
        path.write_text("this is a text file with an image extension\n")
    elif kind == "truncated":
        path.write_bytes(good_jpeg[: len(good_jpeg) // 2])
    elif kind == "corrupt-body":  # header and end marker intact, random bytes in the scan data
        body = bytearray(good_jpeg)
        mid = len(body) // 2
        body[mid:mid + 2000] = rng.integers(0, 256, 2000, dtype=np.uint8).tobytes()
        path.write_bytes(bytes(body))
    else:
        raise ValueError(f"unknown bad-file kind {kind!r}; one of {BAD_KINDS}")
    return path


def jpeg_bytes(img: Image.Image, quality: int = 90) -> bytes:
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=quality)
    return buf.getvalue()


# --- video ----------------------------------------------------------------------------------------

#: frames carry their own index as a band of CODE_BITS blocks along the top (white = 1), readable
#: after H.264 at any quality the generator uses and after a resize that keeps the band's blocks
CODE_BITS = 10


def _draw_code(frame: np.ndarray, index: int) -> None:
    h, w = frame.shape[:2]
    band, block = max(4, h // 8), w // CODE_BITS
    for b in range(CODE_BITS):
        frame[:band, b * block:(b + 1) * block] = 255 if (index >> b) & 1 else 0


def frame_index(frame: np.ndarray) -> int:
    """The index a generated frame (H, W, 3 uint8, RGB, any decoder) shows in its top band."""
    h, w = frame.shape[:2]
    band, block = max(4, h // 8), w // CODE_BITS
    value = 0
    for b in range(CODE_BITS):
        cell = frame[band // 4:band - band // 4, b * block + block // 4:(b + 1) * block - block // 4]
        if float(np.mean(cell)) > 127:
            value |= 1 << b
    return value


def video_frames(rng: np.random.Generator, count: int, height: int, width: int, code: bool = True):
    """``count`` frames of natural motion: a window of a real photo that pans and zooms across it
    (what an encoder and a resizer see in real footage), each frame showing its index if ``code``."""
    src = source_photos()[int(rng.integers(len(source_photos())))]
    sh, sw = src.shape[:2]
    aspect = width / height
    # window sizes from 90% down to 55% of the largest window of the output's aspect ratio
    full_w = min(sw, int(sh * aspect))
    z0, z1 = rng.uniform(0.75, 0.9), rng.uniform(0.55, 0.75)
    x0, x1 = rng.uniform(0, 1, 2)
    y0, y1 = rng.uniform(0, 1, 2)
    for k in range(count):
        t = k / max(1, count - 1)
        win_w = max(16, int(full_w * (z0 + (z1 - z0) * t)))
        win_h = max(16, int(win_w / aspect))
        x = int((sw - win_w) * (x0 + (x1 - x0) * t))
        y = int((sh - win_h) * (y0 + (y1 - y0) * t))
        img = Image.fromarray(src[y:y + win_h, x:x + win_w]).resize((width, height), Image.BILINEAR)
        frame = np.array(img)
        if code:
            _draw_code(frame, k)
        yield frame


def write_video(path, frames, fps: float = 30, *, crf: int = 18, gop: int = 12, bframes: int = 2,
                codec: str = "libx264", audio: Optional[str] = None, sample_rate: int = 44100,
                channels: int = 2) -> Path:
    """Encode RGB frames as H.264 (yuv420p) in ``path``'s container (.mp4, .avi, .mkv) with PyAV;
    ``audio`` (an encoder: "aac", "pcm_s16le") adds an audio stream as long as the video: a tone
    per channel, its pitch rising over the video, so that every stretch of it differs."""
    import fractions

    import av

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), "w") as c:
        rate = fractions.Fraction(fps).limit_denominator(1001)
        s = c.add_stream(codec, rate=rate)
        s.pix_fmt = "yuv420p"
        s.options = {"crf": str(crf), "g": str(gop), "bf": str(bframes), "preset": "veryfast"}
        a = None
        if audio is not None:  # (every stream before the first packet)
            a = c.add_stream(audio, rate=sample_rate)
            a.layout = "stereo" if channels == 2 else "mono"
        count = 0
        for f in frames:
            count += 1
            if count == 1:
                s.height, s.width = f.shape[:2]
            for pkt in s.encode(av.VideoFrame.from_ndarray(f, format="rgb24")):
                c.mux(pkt)
        for pkt in s.encode():
            c.mux(pkt)
        if a is not None:
            _write_audio(c, a, sample_rate, channels, seconds=count / fps)
    return path


def _write_audio(container, a, rate: int, channels: int, seconds: float) -> None:
    """``seconds`` of rising tones into the audio stream ``a``, in 1024-sample frames in the format
    its encoder takes."""
    import av

    t = np.arange(int(round(rate * seconds))) / rate
    pitch = 220.0 * (1 + np.arange(channels))[:, None] * (1 + t / max(seconds, 1e-3))
    wave = (0.4 * np.sin(2 * np.pi * pitch * t)).astype(np.float32)
    fmt = a.codec_context.format.name  # what the encoder takes: fltp (aac), s16 (pcm_s16le), ...
    step, pts = 1024, 0
    for k in range(0, wave.shape[1], step):
        chunk = wave[:, k:k + step]
        if fmt == "s16":
            frame = av.AudioFrame.from_ndarray(np.ascontiguousarray((chunk.T * 32767).astype(np.int16).reshape(1, -1)),
                                               format="s16", layout=a.layout.name)
        else:
            frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(chunk), format="fltp", layout=a.layout.name)
        frame.sample_rate, frame.pts = rate, pts
        pts += frame.samples
        for pkt in a.encode(frame):
            container.mux(pkt)
    for pkt in a.encode():
        container.mux(pkt)


def _write_video_job(job) -> None:
    path, seed, count, height, width, fps, code, ext_kw = job
    rng = np.random.default_rng(seed)
    write_video(path, video_frames(rng, count, height, width, code), fps, **ext_kw)


def make_video_folder(root, *, classes: int = 3, per_class: int = 3, frames=(20, 48), size=(72, 96),
                      fps=(30, 25), ext: str = "mp4", seed: int = 0, code: bool = True, workers: int = 1,
                      **encode) -> Path:
    """A video folder laid out as torchvision's video datasets read it (``root/<class>/<name>.<ext>``;
    for Kinetics pass ``root=<root>/train``): H.264 videos of panning real photos, with frame counts
    drawn in ``frames``, rates cycling through ``fps``, frames showing their index when ``code``."""
    root = Path(root)
    if ext == "avi":  # AVI keeps no presentation timestamps: B-frames come out of order there
        encode.setdefault("bframes", 0)
    jobs = []
    for c in range(classes):
        for j in range(per_class):
            k = c * per_class + j
            rng = np.random.default_rng([seed, k])
            count = int(rng.integers(frames[0], frames[1] + 1))
            jobs.append((root / f"class_{c:02d}" / f"video_{k:03d}.{ext}", int(rng.integers(2 ** 31)), count,
                         size[0], size[1], fps[k % len(fps)], code, encode))
    if workers > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(workers) as pool:
            list(pool.map(_write_video_job, jobs))
    else:
        for job in jobs:
            _write_video_job(job)
    return root


def write_shards(folder, out, *, per_shard: int = 16, seed: Optional[int] = None) -> list:
    """The class folder ``folder`` (``make_photo_folder``'s layout) as webdataset tar shards in ``out``:
    ``shard-000000.tar``..., each sample ``{key}.jpg`` (the file's bytes, or ``.png``...) and ``{key}.cls``
    (its class index, as text), in sorted order (``seed``: shuffled first). Returns the shard paths."""
    import tarfile

    folder, out = Path(folder), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    classes = sorted(d.name for d in folder.iterdir() if d.is_dir())
    items = [(p, y) for y, c in enumerate(classes) for p in sorted((folder / c).iterdir()) if p.is_file()]
    if seed is not None:
        np.random.default_rng(seed).shuffle(items)
    paths = []
    for s in range(0, len(items), per_shard):
        path = out / f"shard-{s // per_shard:06d}.tar"
        with tarfile.open(path, "w") as tar:
            for k, (p, y) in enumerate(items[s:s + per_shard], s):
                for name, data in ((f"{k:08d}{p.suffix.lower()}", p.read_bytes()), (f"{k:08d}.cls", str(y).encode())):
                    info = tarfile.TarInfo(name)
                    info.size, info.mtime = len(data), 0
                    tar.addfile(info, io.BytesIO(data))
        paths.append(str(path))
    return paths


def write_coco(folder, out, *, seed: int = 0, max_boxes: int = 6, empty_every: int = 7,
               suffixes=(".jpg", ".jpeg", ".png")) -> tuple:
    """The photos of ``folder`` (any depth; files of ``suffixes``) as a COCO detection layout in ``out``: ``images/`` and
    ``annotations.json`` with 1..``max_boxes`` objects per image (a box, a polygon inside it, a category
    of 1..5, its area), every ``empty_every``-th image without annotations, and one crowd object per
    image given as an uncompressed RLE. Returns (images dir, annotation file)."""
    import json
    import shutil

    folder, out = Path(folder), Path(out)
    (out / "images").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    images, anns = [], []
    for k, src in enumerate(sorted(p for p in folder.rglob("*") if p.suffix.lower() in suffixes)):
        name = f"{k:06d}{src.suffix.lower()}"
        shutil.copy(src, out / "images" / name)
        with Image.open(src) as img:
            w, h = img.size
        images.append({"id": k + 1, "file_name": name, "width": w, "height": h})
        if k % empty_every == empty_every - 1:
            continue
        for _ in range(int(rng.integers(1, max_boxes + 1))):
            bw, bh = float(rng.uniform(min(8, w / 2), w / 2)), float(rng.uniform(min(8, h / 2), h / 2))  # (tiny images)
            x, y = float(rng.uniform(0, w - bw)), float(rng.uniform(0, h - bh))
            cx, cy = x + bw / 2, y + bh / 2
            angles = np.sort(rng.uniform(0, 2 * np.pi, int(rng.integers(4, 9))))
            poly = [v for a in angles for v in (cx + np.cos(a) * bw / 2, cy + np.sin(a) * bh / 2)]
            anns.append({"id": len(anns) + 1, "image_id": k + 1, "category_id": int(rng.integers(1, 6)),
                         "bbox": [x, y, bw, bh], "area": bw * bh, "iscrowd": 0,
                         "segmentation": [[round(float(v), 2) for v in poly]]})
        # a crowd region: rows y0..y1 of columns x0..x1, as column-major run lengths
        x0, x1 = sorted(int(v) for v in rng.integers(0, w, 2))
        y0, y1 = sorted(int(v) for v in rng.integers(0, h, 2))
        mask = np.zeros((h, w), dtype=np.uint8)
        mask[y0:y1 + 1, x0:x1 + 1] = 1
        flat = mask.flatten(order="F")
        edges = np.flatnonzero(np.diff(flat)) + 1  # where a run ends; the first run counts zeros
        bounds = np.concatenate([[0], edges, [flat.size]])
        counts = ([0] if flat[0] else []) + np.diff(bounds).tolist()
        anns.append({"id": len(anns) + 1, "image_id": k + 1, "category_id": 1, "iscrowd": 1,
                     "bbox": [x0, y0, x1 - x0 + 1, y1 - y0 + 1], "area": float(mask.sum()),
                     "segmentation": {"counts": counts, "size": [h, w]}})
    ann_file = out / "annotations.json"
    ann_file.write_text(json.dumps({"images": images, "annotations": anns,
                                    "categories": [{"id": c, "name": f"c{c}"} for c in range(1, 6)]}))
    return out / "images", ann_file


VOC_CLASSES = ("aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat", "chair", "cow", "diningtable",
               "dog", "horse", "motorbike", "person", "pottedplant", "sheep", "sofa", "train", "tvmonitor")


def write_voc(folder, root, *, seed: int = 0, max_objects: int = 4) -> Path:
    """The photos of ``folder`` as a Pascal VOC 2012 layout under ``root`` (``VOCdevkit/VOC2012``):
    ``JPEGImages``, ``Annotations`` (1..``max_objects`` objects: a class, a box, difficult/truncated
    flags), ``SegmentationClass`` (palette PNGs: each object's box filled with its class index inside a
    255 border, as VOC marks boundaries) and the ``train`` lists of ``Main`` and ``Segmentation``.
    Returns ``root`` (what torchvision's VOC datasets take)."""
    import shutil

    root = Path(root)
    voc = root / "VOCdevkit" / "VOC2012"
    for d in ("JPEGImages", "Annotations", "SegmentationClass", "ImageSets/Main", "ImageSets/Segmentation"):
        (voc / d).mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    names = []
    palette = [v for c in range(256) for v in ((c * 37) % 256, (c * 91) % 256, (c * 53) % 256)]
    for k, src in enumerate(sorted(p for p in Path(folder).rglob("*") if p.suffix.lower() in (".jpg", ".jpeg"))):
        name = f"2012_{k:06d}"
        names.append(name)
        shutil.copy(src, voc / "JPEGImages" / f"{name}.jpg")
        with Image.open(src) as img:
            w, h = img.size
        mask = np.zeros((h, w), dtype=np.uint8)
        objects = []
        for _ in range(int(rng.integers(1, max_objects + 1))):
            c = int(rng.integers(0, len(VOC_CLASSES)))
            x0, x1 = sorted(int(v) for v in rng.integers(1, w, 2))
            y0, y1 = sorted(int(v) for v in rng.integers(1, h, 2))
            x1, y1 = max(x1, x0 + 4), max(y1, y0 + 4)
            mask[y0 - 1:y1 + 1, x0 - 1:x1 + 1] = 255
            mask[y0:y1, x0:x1] = c + 1
            objects.append(f"<object><name>{VOC_CLASSES[c]}</name><pose>Unspecified</pose>"
                           f"<truncated>{int(rng.integers(0, 2))}</truncated><difficult>{int(rng.integers(0, 2))}"
                           f"</difficult><bndbox><xmin>{x0}</xmin><ymin>{y0}</ymin><xmax>{x1}</xmax>"
                           f"<ymax>{y1}</ymax></bndbox></object>")
        (voc / "Annotations" / f"{name}.xml").write_text(
            f"<annotation><folder>VOC2012</folder><filename>{name}.jpg</filename><size><width>{w}</width>"
            f"<height>{h}</height><depth>3</depth></size><segmented>1</segmented>{''.join(objects)}</annotation>")
        png = Image.fromarray(mask, mode="P")
        png.putpalette(palette)
        png.save(voc / "SegmentationClass" / f"{name}.png")
    for split in ("Main", "Segmentation"):
        (voc / "ImageSets" / split / "train.txt").write_text("\n".join(names) + "\n")
    return root
