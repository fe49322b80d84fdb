"""What reaches the decoder: a sample's file, read and checked so that DALI decodes it as
torchvision's loader (``PIL.Image.open(p).convert("RGB")``) would, or an error that names it.

DALI by itself stops the whole pipeline with an unnamed "Critical error" on a bad file, decodes a
truncated JPEG on the GPU without complaint (PIL raises), and scales 16-bit PNGs where PIL clips.
So each file is sniffed here, in the reader threads, from its first bytes:

- empty files, files no decoder recognises and files PIL cannot open raise ``BadSampleError``;
- image sizes go through PIL's own decompression-bomb check (``Image.MAX_IMAGE_PIXELS``);
- a JPEG that does not end with its EOI marker is checked by PIL: an error like PIL's, or, when the
  user enabled ``ImageFile.LOAD_TRUNCATED_IMAGES``, PIL's decode of it;
- what DALI would decode differently from PIL (CMYK JPEG, 16-bit PNG, TIFF, formats DALI lacks such
  as GIF) is
  decoded by PIL here and handed to DALI as an uncompressed BMP, which every DALI backend decodes
  exactly.

JPEG and 8-bit PNG, nearly every real file, cost a header scan of a few markers.
"""
from __future__ import annotations

import io
import os
import re
import struct
import warnings
from typing import Optional

import numpy as np
from PIL import Image, ImageOps

from . import png
from .errors import BadSampleError, DamagedFileWarning


def read_file(path: str) -> bytes:
    # os.read releases the GIL for the whole read and has no Python-level buffering: 6x the file
    # rate of np.fromfile per thread, and reading runs beside the main thread feeding DALI
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        data = os.read(fd, size)
        while len(data) < size:  # os.read may return less for large files
            chunk = os.read(fd, size - len(data))
            if not chunk:
                break
            data += chunk
        return data
    finally:
        os.close(fd)


_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}


def jpeg_header(data: bytes) -> Optional[tuple[int, int, int]]:
    """(width, height, components) from a JPEG's SOF marker, or None if the header is malformed."""
    i, n = 2, len(data)
    while i + 9 < n:
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in _SOF:
            h, w = struct.unpack(">HH", data[i + 5:i + 9])
            return (w, h, data[i + 9])
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:
            i += 2
            continue
        (length,) = struct.unpack(">H", data[i + 2:i + 4])
        i += 2 + length
    return None


#: In a JPEG's entropy-coded data 0xFF is followed by 0x00 (stuffing), a restart marker or, between
#: the scans of a progressive JPEG, a marker (0xC0-0xFE, 0x01); 0x02-0xBF after 0xFF is never valid:
#: a corrupted body shows it almost surely. libjpeg-turbo and nvJPEG decode past it silently,
#: PIL raises "broken data stream". One C-level regex scan: ~60 us for an 80 KiB file.
_INVALID_SCAN_MARKER = re.compile(rb"\xff[\x02-\xbf]")


def jpeg_scan_is_valid(data: bytes) -> bool:
    sos = data.find(b"\xff\xda")
    return sos >= 0 and _INVALID_SCAN_MARKER.search(data, sos + 2) is None


def jpeg_complete(data: bytes) -> bool:
    """Whether a JPEG's bytes end with its EOI marker (not cut short)."""
    tail = data[-16:].rstrip(b"\x00\r\n ")
    return tail.endswith(b"\xff\xd9")


def png_damage(data: bytes) -> Optional[str]:
    """What is wrong with a PNG's chunk structure (a chunk cut short, a CRC that does not match, no
    IEND), or None. libpng (DALI's decoders) refuses such files outright; PIL decodes some of them (a
    bad CRC on pixel data, a missing IEND, a cut file with LOAD_TRUNCATED_IMAGES) and refuses others
    (a bad CRC on a chunk before the pixels): torchvision's answer is PIL's, so such files go to PIL.
    One pass of zlib's CRC over the file: ~0.1 ms for 100 KiB."""
    for kind, pos, end in png.chunks(data):
        if end > len(data):
            return f"its {kind.decode('latin-1')} chunk is cut short"
        if not png.crc_ok(data, pos, end):
            return f"bad CRC in its {kind.decode('latin-1')} chunk"
        if kind == b"IEND":
            return None
    return "no IEND chunk (the file is cut short)"


def bmp_damage(data: bytes) -> Optional[str]:
    """A BMP shorter than its header says (uncompressed), or compressed: PIL's answer, not DALI's."""
    if len(data) < 34:
        return "its header is cut short"
    offset, = struct.unpack("<I", data[10:14])
    width, height, _, bpp, compression = struct.unpack("<iiHHI", data[18:34])
    if compression not in (0, 3):
        return f"compression {compression}"
    needed = offset + ((bpp * abs(width) + 31) // 32) * 4 * abs(height)
    return f"cut short ({len(data)} of {needed} bytes)" if len(data) < needed else None


def sniff(data: bytes) -> str:
    if data[:3] == b"\xff\xd8\xff":
        return "jpeg"
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        return "png16" if len(data) > 24 and data[24] == 16 else "png"
    if data[:2] == b"BM":
        return "bmp"
    if data[:4] in (b"II*\x00", b"MM\x00*"):
        return "tiff"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    if data[:2] in (b"P1", b"P2", b"P3", b"P4", b"P5", b"P6"):
        return "pnm"
    if data[:12] == b"\x00\x00\x00\x0cjP  \r\n\x87\n" or data[:4] == b"\xff\x4f\xff\x51":
        return "jpeg2000"
    return "other"


def pil_open(data: bytes, index: int, path: str) -> Image.Image:
    try:
        img = Image.open(io.BytesIO(data))  # runs PIL's decompression-bomb check on the header
    except Image.DecompressionBombError:
        raise
    except Exception as e:  # noqa: BLE001 - whatever PIL says is the reason
        raise BadSampleError(index, path, f"not an image PIL can open ({type(e).__name__}: {e})") from e
    return img


def _pil_to_bmp(data: bytes, index: int, path: str) -> bytes:
    img = pil_open(data, index, path)
    try:
        rgb = img.convert("RGB")
    except Exception as e:  # noqa: BLE001
        raise BadSampleError(index, path, f"PIL cannot decode it ({type(e).__name__}: {e})") from e
    return _bmp_bytes(rgb)


#: On the GPU, nvJPEG's chroma upsampling differs from libjpeg-turbo's most at image borders; on a
#: JPEG with a side under this many pixels borders are most of the image (a 7x5 JPEG: 5 in 0-255
#: units, a 4000x50 strip: 1.8), and PIL decodes such a file in microseconds.
SMALL_JPEG_SIDE = 64


def prepare(index: int, path: str, *, small_jpegs_via_pil: bool = False, check_jpeg_scan: bool = False) -> np.ndarray:
    """The bytes to hand to DALI's decoder for sample ``index``, or BadSampleError.
    ``small_jpegs_via_pil``: decode JPEGs with a side under SMALL_JPEG_SIDE with PIL (GPU decoding);
    ``check_jpeg_scan``: look for invalid markers in the entropy-coded data; a JPEG that has one is
    left to PIL, which raises for it like torchvision would."""
    return prepare_bytes(index, path, read_sample(index, path), small_jpegs_via_pil=small_jpegs_via_pil,
                         check_jpeg_scan=check_jpeg_scan)


def bmp_of(pixels: np.ndarray) -> np.ndarray:
    """An HWC uint8 RGB array as a BMP file for the graph's decoder (lossless)."""
    return _as_array(_bmp_bytes(Image.fromarray(pixels, "RGB")))


def _bmp_bytes(rgb: Image.Image) -> bytes:
    buf = io.BytesIO()
    rgb.save(buf, format="BMP")
    return buf.getvalue()


def read_sample(index: int, path: str) -> bytes:
    """The file's bytes, or BadSampleError naming it."""
    try:
        return read_file(path)
    except OSError as e:
        raise BadSampleError(index, path, f"cannot read it ({e.strerror or e})") from e


def prepare_bytes(index: int, path: str, data: bytes, *, small_jpegs_via_pil: bool = False,
                  check_jpeg_scan: bool = False) -> np.ndarray:
    """``prepare`` for an encoded image already in memory (``path`` only names it in errors)."""
    if not data:
        raise BadSampleError(index, path, "empty file")
    kind = sniff(data)
    try:
        if kind == "jpeg":
            header = jpeg_header(data)
            if header is None or header[2] == 4 or (small_jpegs_via_pil and min(header[:2]) < SMALL_JPEG_SIDE):
                # CMYK/YCCK: nvJPEG's conversion to RGB is not PIL's; rare enough to hand to PIL
                return _as_array(_pil_to_bmp(data, index, path))
            Image._decompression_bomb_check(header[:2])
            if not jpeg_complete(data) or (check_jpeg_scan and not jpeg_scan_is_valid(data)):
                # PIL raises "image file is truncated" unless LOAD_TRUNCATED_IMAGES; nvJPEG decodes
                # silently and libjpeg-turbo raises: let PIL decide, and decode it if it agrees
                return _as_array(_pil_to_bmp(data, index, path))
            return _as_array(data)
        if kind == "png":
            w, h = struct.unpack(">II", data[16:24])
            Image._decompression_bomb_check((w, h))
            damage = png_damage(data)
            return _as_array(data if damage is None else _damaged_via_pil(data, index, path, damage))
        if kind == "bmp":
            pil_open(data, index, path)
            damage = bmp_damage(data)
            return _as_array(data if damage is None else _damaged_via_pil(data, index, path, damage))
        if kind in ("webp", "pnm", "jpeg2000"):
            pil_open(data, index, path)  # header only: size check, and a clear error for junk
            return _as_array(data)
        # 16-bit PNG (PIL clips to 8 bits, DALI scales), TIFF (modes DALI maps differently) and
        # formats DALI has no decoder for (GIF, ICO, ...): PIL decodes, DALI gets a BMP
        return _as_array(_pil_to_bmp(data, index, path))
    except Image.DecompressionBombError as e:
        raise BadSampleError(index, path, f"{e} (PIL.Image.MAX_IMAGE_PIXELS)") from e


def _damaged_via_pil(data: bytes, index: int, path: str, damage: str) -> bytes:
    """A damaged file goes to PIL, which decodes it (warned once per file) or raises, as for torchvision."""
    bmp = _pil_to_bmp(data, index, path)
    warnings.warn(f"gputransforms: sample {index} ({path}): {damage}; PIL decodes it, as torchvision's loader "
                  "does, so it was decoded by PIL", DamagedFileWarning, stacklevel=2)
    return bmp


def decoded_by_pil(index: int, path: str) -> np.ndarray:
    """The file decoded by PIL as torchvision's loader would, handed to DALI losslessly (a file DALI
    failed on); BadSampleError where PIL cannot read or decode it either."""
    return bytes_decoded_by_pil(index, path, read_sample(index, path))


def bytes_decoded_by_pil(index: int, path: str, data: bytes) -> np.ndarray:
    """``decoded_by_pil`` for an encoded image already in memory (a tar member; ``path`` names it)."""
    return _as_array(_pil_to_bmp(data, index, path))


def pil_rgb(index: int, path: str, data: bytes, *, exif_transpose: bool = False) -> Image.Image:
    """An encoded image in memory decoded by PIL as RGB (optionally turned by its EXIF orientation),
    or BadSampleError naming it: what a samples object's ``load`` gives for a member or a row."""
    try:
        img = Image.open(io.BytesIO(data))
        img.load()
        return (ImageOps.exif_transpose(img) if exif_transpose else img).convert("RGB")
    except (OSError, SyntaxError, ValueError) as e:
        raise BadSampleError(index, path, f"cannot be decoded ({type(e).__name__}: {e})") from e


def _as_array(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype=np.uint8)
