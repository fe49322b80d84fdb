"""Class masks stored as 8-bit PNGs (palette indices, as VOC's ``SegmentationClass``, or grey values), decoded
to the values PIL gives (``np.asarray(Image.open(path))``), without PIL.

A worker that records a segmentation sample reads its mask in full: on the development machine's core PIL took
0.84-1.02 ms for a VOC-sized mask of 2 KB, 0.69 of it in zlib's inflate of the long runs a class mask is made
of (that is nearly all of it: the rows are stored unfiltered). zlib-ng's inflate (the ``zlib-ng`` package,
installed with the ``cu12``/``cu13`` extras) does the same in 0.03 ms; without it the standard library's zlib
is used. The rows' filters are undone with NumPy where they are None, Sub and Up (what libpng and PIL write for
palette images, and the common case for grey ones).

Anything else gives None and the caller opens the file with PIL as torchvision does: another colour type or
bit depth, interlacing, an animated PNG, a broken checksum before the image data (PIL checks those), a
stream that does not inflate to exactly the image's rows, an Average or Paeth filter, an image above PIL's
decompression-bomb limit. So a file PIL would reject, warn about or read differently is PIL's to read.
"""
from __future__ import annotations

import struct
import zlib
from typing import Callable, Optional

import numpy as np
from PIL import Image

SIGNATURE = b"\x89PNG\r\n\x1a\n"
_COLOUR_TYPES = (0, 3)  # grey, palette (each one 8-bit sample a pixel)
_ANIMATED = (b"acTL", b"fcTL", b"fdAT", b"DDAT")


def _inflater() -> Callable[[bytes], bytes]:
    try:
        from zlib_ng import zlib_ng
        return zlib_ng.decompress
    except ImportError:  # (the package is optional: the standard library's zlib gives the same bytes, slower)
        return zlib.decompress


#: the inflate in use (zlib-ng's where installed)
inflate = _inflater()


def chunks(data: bytes):
    """Each chunk of a PNG after its signature: (its type, where it starts, where its CRC ends). The last one's end
    lies past the data's where the file is cut short within it."""
    pos, n = 8, len(data)
    while pos + 12 <= n:
        length, kind = struct.unpack_from(">I4s", data, pos)
        end = pos + 12 + length
        yield kind, pos, end
        if end > n:
            return
        pos = end


def crc_ok(data: bytes, pos: int, end: int) -> bool:
    """Whether the chunk at ``pos`` (to ``end``: ``chunks``) holds the CRC of its type and data."""
    return zlib.crc32(data[pos + 4:end - 4]) == struct.unpack_from(">I", data, end - 4)[0]


def values(data: bytes) -> Optional[np.ndarray]:
    """The HxW uint8 values of an 8-bit palette (its indices) or grey PNG, exactly PIL's, or None where the
    file is of another kind or not exactly well-formed (see the module's docstring)."""
    if data[:8] != SIGNATURE:
        return None
    head, idat = None, []
    for cid, pos, end in chunks(data):
        if end > len(data):
            return None
        if cid == b"IDAT":
            idat.append(data[pos + 8:end - 4])
        elif idat:  # the image data is over (PIL reads no further)
            break
        else:
            if cid in _ANIMATED or not crc_ok(data, pos, end):
                return None
            if cid == b"IHDR":
                head = data[pos + 8:end - 4]
    if head is None or len(head) != 13 or not idat:
        return None
    w, h, depth, colour, compression, filtering, interlace = struct.unpack(">IIBBBBB", head)
    if depth != 8 or colour not in _COLOUR_TYPES or compression or filtering or interlace or not w or not h:
        return None
    limit = Image.MAX_IMAGE_PIXELS
    if limit is not None and w * h > limit:  # (PIL warns, or raises above twice this)
        return None
    try:
        raw = inflate(b"".join(idat))
    except Exception:  # noqa: BLE001 - zlib's or zlib-ng's error for a broken stream: PIL's to report
        return None
    if len(raw) != h * (w + 1):
        return None
    return _unfiltered(np.frombuffer(raw, np.uint8).reshape(h, w + 1))


def _unfiltered(rows: np.ndarray) -> Optional[np.ndarray]:
    """The pixels of ``rows`` (each its filter byte, then one byte a pixel), or None for Average or Paeth."""
    kind = rows[:, 0]
    out = rows[:, 1:].copy()
    if not kind.any():
        return out
    if (kind > 2).any():
        return None
    sub = kind == 1
    if sub.any():
        out[sub] = np.cumsum(out[sub], axis=1, dtype=np.uint8)  # Sub: each byte plus the one on its left
    up = kind == 2
    if up.any():  # Up: each row plus the row above, which is itself decoded (a run of Up rows adds up)
        total = np.cumsum(out, axis=0, dtype=np.uint8)
        # each row's last row that is not Up (0 where there is none: the row above the first is zeros)
        anchor = np.maximum(np.maximum.accumulate(np.where(up, -1, np.arange(len(kind)))), 0)
        above = np.concatenate([np.zeros_like(out[:1]), total])[anchor]  # the sum of the rows above that one
        out = total - above
    return out
