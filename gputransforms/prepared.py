"""An opt-in prepared copy of each image at reduced resolution (FFCV's trick without a conversion step):
``DataLoader(..., prepared=PreparedCopy("/fast/cache", max_side=512, quality=90))``.

The first time a file is read its full bytes go to the graph as always, and a copy whose longest side
is at most ``max_side`` is written to ``cache_dir`` (JPEG at ``quality``), keyed by the source's path,
size and modification time; later reads hand the graph the copy, which decodes in a fraction of the
time. What it changes, and what it does not:

- The random crop is drawn on the copy's geometry: RandomResizedCrop's scale and ratio are fractions
  of the image, so its distribution is torchvision's up to the rounding of a smaller grid; the pixels
  are those of a downscaled source (docs/performance.md gives the measured difference).
- A stale copy (the source changed size or mtime) is never found (the key changes); a corrupt one
  (cut short, not a JPEG) is not served: the source is read and the copy written again.
- Writers in several processes (torchrun ranks sharing the directory) each write a temporary file and
  rename it into place, so a reader sees a whole copy or none.
- A directory that cannot be written (read-only, full disk) warns once and the loader goes on with
  full decodes.
- Images already within ``max_side`` get a marker instead of a copy, and are read as they are.
"""
from __future__ import annotations

import dataclasses
import hashlib
import io
import os
import threading
import warnings
from typing import Any, Callable, Optional

from PIL import Image

from . import files

__all__ = ["PreparedCopy", "PreparedCopyWarning"]


class PreparedCopyWarning(UserWarning):
    """The prepared-copy directory could not be written (read-only, full disk): full decodes go on."""


@dataclasses.dataclass(frozen=True)
class PreparedCopy:
    """Where and how the reduced copies are kept: ``cache_dir``, the copy's longest side
    ``max_side`` (pixels) and its JPEG ``quality``."""

    cache_dir: str
    max_side: int = 512
    quality: int = 90

    def __post_init__(self):
        if self.max_side < 32 or not 1 <= self.quality <= 100:
            raise ValueError(f"PreparedCopy: max_side >= 32 and quality in 1..100, got {self.max_side}, {self.quality}")

    def describe(self) -> str:
        return (f"prepared copies in {self.cache_dir} (longest side <= {self.max_side}, JPEG quality {self.quality}; "
                "a file's first read decodes it in full and writes its copy)")


def cache_path(copy: PreparedCopy, path: str, st: os.stat_result) -> str:
    """The copy's file for ``path`` as it is now (its size and mtime are in the key)."""
    key = f"{os.path.abspath(path)}\0{st.st_size}\0{st.st_mtime_ns}\0{copy.max_side}\0{copy.quality}"
    h = hashlib.sha1(key.encode("utf-8", "surrogateescape")).hexdigest()
    return os.path.join(copy.cache_dir, h[:2], h + ".jpg")


class _Writable:
    """Whether copies may still be written, for every reader of one loader (epoch after epoch): the
    first failed write turns it off and warns, once."""

    def __init__(self):
        self.on = True
        self.lock = threading.Lock()

    def fail(self, copy: PreparedCopy, err: OSError) -> None:
        with self.lock:
            if not self.on:
                return
            self.on = False
        warnings.warn(f"gputransforms: prepared copies cannot be written to {copy.cache_dir} ({err}); the loader "
                      "goes on decoding the full images", PreparedCopyWarning, stacklevel=3)


class PreparedReader:
    """A samples' reader with the copies in front: the copy when a whole one exists, else the source
    (and its copy written)."""

    def __init__(self, copy: PreparedCopy, read: Callable[[int], Any], paths, *, gpu: bool, check_jpeg_scan: bool,
                 writable: Optional[_Writable] = None):
        self.copy, self.read, self.paths = copy, read, paths
        self.gpu, self.check_jpeg_scan = gpu, check_jpeg_scan
        self.writable = writable or _Writable()

    def __call__(self, i: int):
        path = self.paths[i]
        try:
            target = cache_path(self.copy, path, os.stat(path))
        except OSError:
            return self.read(i)  # the source's own read names the error
        data = self._cached(target)
        if data is not None:
            return files.prepare_bytes(i, path, data, small_jpegs_via_pil=self.gpu,
                                       check_jpeg_scan=self.check_jpeg_scan)
        out = self.read(i)
        if self.writable.on and not os.path.exists(target + ".orig"):  # (.orig: within max_side, no copy)
            self._write(target, out.tobytes())
        return out

    def _cached(self, target: str) -> Optional[bytes]:
        try:
            data = files.read_file(target)
        except OSError:
            return None
        header = files.jpeg_header(data)
        if header is None or max(header[:2]) > self.copy.max_side or not files.jpeg_complete(data):
            try:  # not served; the next write replaces it
                os.unlink(target)
            except OSError:
                pass
            return None
        return data

    def _write(self, target: str, encoded: bytes) -> None:
        tmp = f"{target}.{os.getpid()}.{threading.get_ident()}.tmp"
        try:
            img = Image.open(io.BytesIO(encoded))
            if max(img.size) <= self.copy.max_side:
                os.makedirs(os.path.dirname(target), exist_ok=True)
                open(target + ".orig", "wb").close()
                return
            img.draft("RGB", (self.copy.max_side, self.copy.max_side))  # JPEG: decode at 1/2, 1/4, 1/8
            img = img.convert("RGB")
            img.thumbnail((self.copy.max_side, self.copy.max_side), Image.Resampling.LANCZOS)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(tmp, "wb") as f:
                img.save(f, "JPEG", quality=self.copy.quality)
            os.replace(tmp, target)
        except OSError as e:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            self.writable.fail(self.copy, e)


class PreparedSamples:
    """``samples`` with the copies in front of its reader; everything else is the samples' own."""

    def __init__(self, samples, copy: PreparedCopy):
        if getattr(samples, "plan_input", "") != "image":
            raise ValueError("prepared= applies to datasets of image files")
        self._samples, self._copy, self._writable = samples, copy, _Writable()

    def reader(self, *, gpu: bool, check_jpeg_scan: bool) -> Callable[[int], Any]:
        return PreparedReader(self._copy, self._samples.reader(gpu=gpu, check_jpeg_scan=check_jpeg_scan),
                              self._samples.paths, gpu=gpu, check_jpeg_scan=check_jpeg_scan, writable=self._writable)

    def __getattr__(self, name: str):
        return getattr(self._samples, name)
