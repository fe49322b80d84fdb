"""Hugging Face ``datasets`` tables with an ``Image()`` column, compiled: the encoded bytes (or the
file a row names) come straight from Arrow to the graph, the other columns from the table.

The shape (transformers' image-classification example): ``ds.with_transform(fn)`` or
``ds.set_transform(fn)`` where ``fn`` applies one torchvision/timm transform to each image of the
batch, after at most ``.convert("RGB")``, and puts the results under a key of its own, passing other
columns through (renamed or dropped as it likes)::

    def preprocess(batch):
        batch["pixel_values"] = [train_tf(img.convert("RGB")) for img in batch["image"]]
        return batch

``fn`` is run once, on the first row with a placeholder image and a recorder in place of the
transform it names, to see that shape; anything else stays on torch's DataLoader with the reason.
Items handed to a ``collate_fn`` are what ``ds[i]`` gives, except that the image column, where ``fn``
keeps it, is a ``LazyImage``: the row's image as ``datasets`` decodes it, read and decoded on first use.
"""
from __future__ import annotations

import functools
import io
import sys
import threading
import types
from typing import Any, Callable, Optional

import numpy as np
from PIL import ExifTags, Image, ImageOps
from torch.utils.data import default_collate

from .. import files
from ..compiler import stages
from ..device import batched, to_device
from ..errors import NotCompilable
from .adapters import FileSamples, _fresh
from .discover import JointCall, Recorder, as_opened, first_not_rgb, is_placeholder, is_transform, opened_placeholder, \
    watching

_ADVICE = ("to compile it, give the dataset ds.with_transform(fn) where fn sets batch[key] = "
           "[transform(img.convert('RGB')) for img in batch[image_column]] (docs/datasets.md)")
_lock = threading.Lock()


def is_hf_dataset(dataset) -> bool:
    mod = sys.modules.get("datasets")
    return mod is not None and isinstance(dataset, mod.Dataset)


def global_names(code) -> set:
    """Global names a function's code (its comprehensions and nested functions too) looks up."""
    names = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names |= global_names(c)
    return names


def _slots(fn) -> list:
    """(get, set) of every place ``fn`` finds a transform: its globals by name, its closure cells, its
    defaults; for a ``functools.partial`` of a function, its bound arguments and its function's places."""
    if isinstance(fn, functools.partial):
        slots = _slots(fn.func)
        for k, value in (fn.keywords or {}).items():
            if is_transform(value):
                slots.append((lambda k=k: fn.keywords[k], lambda v, k=k: fn.keywords.__setitem__(k, v)))
        for j, value in enumerate(fn.args):
            if is_transform(value):
                def put(v, j=j):
                    args = list(fn.args)
                    args[j] = v
                    fn.__setstate__((fn.func, tuple(args), fn.keywords, fn.__dict__ or None))
                slots.append((lambda j=j: fn.args[j], put))
        return slots
    slots = []
    for j, value in enumerate(fn.__defaults__ or ()):
        if is_transform(value):
            def put_default(v, j=j):
                defaults = list(fn.__defaults__)
                defaults[j] = v
                fn.__defaults__ = tuple(defaults)
            slots.append((lambda j=j: fn.__defaults__[j], put_default))
    for k, value in (fn.__kwdefaults__ or {}).items():
        if is_transform(value):
            slots.append((lambda k=k: fn.__kwdefaults__[k], lambda v, k=k: fn.__kwdefaults__.__setitem__(k, v)))
    g = getattr(fn, "__globals__", {})
    for name in sorted(global_names(fn.__code__)):
        if name in g and is_transform(g[name]):
            slots.append((lambda n=name: g[n], lambda v, n=name: g.__setitem__(n, v)))
    for cell in fn.__closure__ or ():
        try:
            value = cell.cell_contents
        except ValueError:
            continue
        if is_transform(value):
            slots.append((lambda c=cell: c.cell_contents, lambda v, c=cell: setattr(c, "cell_contents", v)))
    return slots


def _name(fn) -> str:
    return getattr(fn, "__name__", None) or f"partial({getattr(fn.func, '__name__', '?')}, ...)"


def _probe(fn, row: dict, column: str):
    """(the transform fn applies, the key its results go under, {output key: input column}) from one
    run of ``fn`` on ``row`` with a placeholder image; NotCompilable where fn is not of the shape."""
    if not isinstance(fn.func if isinstance(fn, functools.partial) else fn, types.FunctionType):
        raise NotCompilable(f"the dataset's format transform is a {type(fn).__name__}, not a function", _ADVICE)
    name = _name(fn)
    slots = _slots(fn)
    chains = {id(get()): get() for get, _ in slots}
    if len(chains) != 1:
        raise NotCompilable(f"the format transform {name} names {len(chains)} torchvision/timm transforms "
                            "(one is needed, applied to each image)", _ADVICE)
    chain = next(iter(chains.values()))
    recorder = Recorder()
    batch = {k: [v] for k, v in row.items()}
    batch[column] = [opened_placeholder()]
    inputs = {k: batch[k] for k in batch}
    with _lock:
        for _, put in slots:
            put(recorder)
        try:
            with watching():  # (whether it converts the image to RGB)
                out = fn(batch)
        except JointCall:
            raise NotCompilable(f"the format transform {name} calls its transform with the image and a target (a "
                                "joint transform: detection and segmentation rows of a Hugging Face dataset are not "
                                "compiled)", "to compile it, give the images as files: CocoDetection, VOC, or a "
                                "Dataset of your own that opens them (docs/datasets.md)") from None
        except Exception as e:  # noqa: BLE001 - what it does to an image needs a real one
            raise NotCompilable(f"the format transform {name} does something to the image before or after "
                                f"its transform (on a placeholder: {type(e).__name__}: {e})", _ADVICE) from None
        finally:
            for _, put in slots:
                put(chain)
    seen = recorder.seen
    if len(seen) != 1 or not is_placeholder(seen[0]):
        raise NotCompilable(f"the format transform {name} changes the image before its transform (only "
                            ".convert('RGB') is compiled)", _ADVICE)
    if not isinstance(out, dict):
        raise NotCompilable(f"the format transform {name} returns a {type(out).__name__}, not the batch", _ADVICE)
    keys = [k for k, v in out.items() if isinstance(v, list) and len(v) == 1 and v[0] is recorder]
    mapping = {}
    for k, v in out.items():
        if k in keys:
            continue
        source = next((c for c, col in inputs.items() if v is col), None)
        if source is None:
            raise NotCompilable(f"the format transform {name} computes {k!r} from the row", _ADVICE)
        mapping[k] = source
    if len(keys) != 1:
        raise NotCompilable(f"the format transform {name} puts the transformed images under {len(keys)} keys",
                            _ADVICE)
    return chain, keys[0], mapping, list(out), as_opened(seen[0])


def _has_exif(data: bytes) -> bool:
    """Whether a JPEG has an APP1 Exif segment (walking the segments before the image data)."""
    if data[:2] != b"\xff\xd8":
        return False
    at = 2
    while at + 4 <= len(data) and data[at] == 0xFF and (0xE0 <= data[at + 1] <= 0xEF or data[at + 1] == 0xFE):
        if data[at + 1] == 0xE1 and data[at + 4:at + 10] == b"Exif\x00\x00":
            return True
        at += 2 + int.from_bytes(data[at + 2:at + 4], "big")
    return False


def _oriented(data: bytes) -> Optional[np.ndarray]:
    """A JPEG with an EXIF orientation, as ``datasets`` decodes it (exif_transpose), handed over
    losslessly as BMP; None for every other file (the graph decodes it)."""
    if not _has_exif(data):
        return None
    img = Image.open(io.BytesIO(data))
    if img.getexif().get(ExifTags.Base.Orientation) is None:
        return None
    buf = io.BytesIO()
    ImageOps.exif_transpose(img).convert("RGB").save(buf, "BMP")
    return np.frombuffer(buf.getvalue(), dtype=np.uint8)


class HFSamples(FileSamples):
    """Rows of a ``datasets.Dataset``: the image column's bytes (or file) per row, the other columns
    as Python values; items and batches are the format transform's dicts."""

    def __init__(self, ds, column: str, chain, key: str, mapping: dict, order: list, rows: dict, origin: str):
        n = len(ds)
        self.cells = _Cells(ds, column)
        super().__init__(_RowNames(self.cells, n), list(range(n)), chain, None, origin)
        self.column, self.key, self.mapping, self.order, self.rows = column, key, mapping, order, rows

    def encoded(self, i: int) -> bytes:
        return self._encoded(i)[0]

    def _encoded(self, i: int) -> tuple:
        """(the encoded image, its name for errors) of row ``i``."""
        data, path = self.cells.get(i)
        if data is not None:
            return data, f"row {i}"
        try:
            if path is None:
                raise OSError("the row has neither bytes nor a path")
            if "://" in path:
                import fsspec

                with fsspec.open(path, "rb") as f:
                    return f.read(), f"row {i} ({path})"
            return files.read_file(path), f"row {i} ({path})"
        except OSError as e:
            raise files.BadSampleError(i, path or f"row {i}", f"cannot read it ({e})") from e

    def reader(self, *, gpu: bool, check_jpeg_scan: bool) -> Callable[[int], Any]:
        def read(i: int):
            data, name = self._encoded(i)
            oriented = _oriented(data)
            return oriented if oriented is not None else \
                files.prepare_bytes(i, name, data, small_jpegs_via_pil=gpu, check_jpeg_scan=check_jpeg_scan)
        return read

    def decoded_by_pil(self, i: int):
        data, name = self._encoded(i)
        oriented = _oriented(data)
        return oriented if oriented is not None else files.bytes_decoded_by_pil(i, name, data)

    def load(self, i: int):
        data, name = self._encoded(i)
        return files.pil_rgb(i, name, data, exif_transpose=True)

    def select(self, indices):
        raise NotCompilable("a Hugging Face dataset inside a Subset or ConcatDataset",
                            "to compile it, use ds.select(indices) or datasets.concatenate_datasets")

    def decoded(self, i: int) -> Image.Image:
        """Row ``i``'s image as ``datasets`` decodes it: opened, loaded, EXIF-transposed."""
        img = Image.open(io.BytesIO(self.encoded(i)))
        img.load()
        return ImageOps.exif_transpose(img) if img.getexif().get(ExifTags.Base.Orientation) is not None else img

    def _value(self, source: str, i: int, lazy: bool = True):
        if source == self.column:  # the image column kept by the format transform
            return LazyImage(self.decoded, i) if lazy else self.decoded(i)
        return self.rows[source][i]

    def items(self, images, indices) -> list:
        """One dict per row, built column by column (the main thread builds 256 of them per batch
        while the reader threads wait for the GIL)."""
        columns = []
        for k in self.order:
            source = self.mapping.get(k)
            if k == self.key:
                columns.append(stages.as_made(images, self.item_kind()))
            elif source == self.column:
                columns.append([LazyImage(self.decoded, i) for i in indices])
            else:
                values = self.rows[source]
                columns.append([_fresh(values[i]) for i in indices])  # (a list cell changed in place stays so)
        order = self.order
        return [dict(zip(order, row)) for row in zip(*columns)]

    def batch(self, images, labels, dev, indices) -> dict:
        """The dict torch's default_collate makes of the items (which raises, as it does, where a kept
        image column holds PIL images)."""
        return {k: batched(images) if k == self.key else
                to_device(default_collate([self._value(self.mapping[k], i, lazy=False) for i in indices]), dev)
                for k in self.order}


class LazyImage:
    """The image column's value in the items a ``collate_fn`` receives, where the format transform
    keeps that column: the row's image as ``datasets`` decodes it, read and decoded on first use (the
    example's collate_fn never uses it, and reading every file a second time in the main thread
    halved the loader's speed). Attributes and ``isinstance(x, PIL.Image.Image)`` reach the image."""

    __slots__ = ("_make", "_row", "_image")

    def __init__(self, make: Callable[[int], Image.Image], row: int):
        self._make, self._row, self._image = make, row, None

    def _get(self) -> Image.Image:
        if self._image is None:
            self._image = self._make(self._row)
        return self._image

    @property
    def __class__(self):  # isinstance() sees the image's class
        return type(self._get())

    def __getattr__(self, name: str):
        return getattr(self._get(), name)

    def __repr__(self) -> str:
        return repr(self._get())


class _Chunk:
    """One Arrow chunk of the image column, read without pyarrow scalars (the reader threads hold
    the GIL while they look a row up): the bytes child's offsets and data buffer, its nulls, and
    the paths as Python strings."""

    def __init__(self, chunk):
        import pyarrow as pa

        data = chunk.field("bytes")
        wide = pa.types.is_large_binary(data.type)
        offsets = np.frombuffer(data.buffers()[1], dtype=np.int64 if wide else np.int32)
        self.offsets = offsets[data.offset:data.offset + len(data) + 1].astype(np.int64)
        self.data = memoryview(data.buffers()[2]) if data.buffers()[2] is not None else memoryview(b"")
        self.has_bytes = ~data.is_null().to_numpy(zero_copy_only=False)
        self.paths = chunk.field("path").to_pylist()

    def get(self, j: int):
        data = bytes(self.data[self.offsets[j]:self.offsets[j + 1]]) if self.has_bytes[j] else None
        return data, self.paths[j]


class _Cells:
    """Row ``i``'s image cell (bytes, path) from the Arrow table, through the dataset's indices
    mapping: one bisect over the chunks, then two array lookups (the bytes are not copied ahead)."""

    def __init__(self, ds, column: str):
        import bisect

        self.chunks = [_Chunk(c) for c in ds._data.column(column).chunks]
        self.starts = [int(s) for s in np.cumsum([0] + [len(c.paths) for c in self.chunks])[:-1]]
        self.row_of = None if ds._indices is None else ds._indices.column(0).to_numpy()
        self.bisect = bisect.bisect_right

    def get(self, i: int):
        r = i if self.row_of is None else int(self.row_of[i])
        k = self.bisect(self.starts, r) - 1
        return self.chunks[k].get(r - self.starts[k])


class _RowNames:
    """``paths`` of HFSamples: "row i (its file)", made when an error or explain() asks."""

    def __init__(self, cells: _Cells, n: int):
        self.cells, self.n = cells, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> str:
        path = self.cells.get(i)[1]
        return f"row {i} ({path})" if path else f"row {i}"


def resolve_hf(ds) -> HFSamples:
    import datasets

    name = type(ds).__name__
    columns = [k for k, f in ds.features.items() if isinstance(f, datasets.Image)]
    if len(columns) != 1:
        raise NotCompilable(f"{name} has {len(columns)} Image() columns (one is compiled)",
                            "to compile it, keep one image column (ds.select_columns)")
    column = columns[0]
    feature = ds.features[column]
    if not feature.decode or feature.mode not in (None, "RGB"):
        raise NotCompilable(f"{name}'s Image() column has decode={feature.decode}, mode={feature.mode!r}",
                            "to compile it, use Image() (decode=True, mode None or 'RGB')")
    fmt = ds.format
    if fmt["type"] != "custom":
        raise NotCompilable(f"{name} has format {fmt['type']!r}: its items are not transformed images", _ADVICE)
    if fmt.get("output_all_columns"):
        raise NotCompilable(f"{name}'s transform was set with output_all_columns=True",
                            "to compile it, set the transform without output_all_columns")
    wanted = fmt.get("columns") or list(ds.features)
    plain = ds.with_format(None)
    others = [c for c in wanted if c != column]
    # (a table of the image column alone: a table of no columns has no rows to index)
    first = {c: v for c, v in plain.select_columns(others)[0].items()} if len(ds) and others else {}
    first[column] = None
    fn = fmt["format_kwargs"]["transform"]
    chain, key, mapping, order, unconverted = _probe(fn, {c: first[c] for c in wanted}, column)
    needed = sorted({s for s in mapping.values() if s != column})
    rows = plain.select_columns(needed)[:] if needed else {}
    samples = HFSamples(ds, column, chain, key, mapping, order, rows,
                        f"{len(ds)} rows of a Hugging Face dataset: column {column!r}'s encoded images from Arrow, "
                        f"items as {_name(fn)} makes them (datasets/hf.py)")
    if unconverted:
        _decoded_as_rgb(samples, _name(fn))
    return samples


def _decoded_as_rgb(samples: HFSamples, fn: str) -> None:
    """A format transform that hands its transform the image as ``datasets`` decodes it (no
    ``.convert("RGB")``): every row's image must open as RGB (``discover.first_not_rgb``)."""
    def rows():
        for i in range(len(samples.paths)):
            try:
                data, name = samples._encoded(i)
            except files.BadSampleError:  # (the loader names it when it reads it)
                continue
            yield name, io.BytesIO(data)

    bad = first_not_rgb(rows())
    if bad is not None:
        raise NotCompilable(f"the format transform {fn} hands its transform the image as datasets decodes it, "
                            f"and {bad[0]} is in mode {bad[1]} (torchvision's transform gets it so; the graph "
                            "decodes RGB)", "to compile it, convert each image to RGB: "
                            "[transform(img.convert('RGB')) for img in batch[image_column]] (docs/datasets.md)")
