"""webdataset pipelines of the standard shape, compiled: tar shards read by the reader threads, each
image member's bytes handed to the graph without PIL.

The shape: ``wds.WebDataset(urls, shardshuffle=..., nodesplitter=...)`` (or the same stages in a
``wds.DataPipeline``), optionally ``.shuffle(n)``, ``.decode("pil")`` (or ``"pilrgb"``), then either
``.to_tuple(image_keys, label_keys).map_tuple(transform, target_fn)`` or ``.map_dict(jpg=transform)``
before ``.to_tuple``. Any other stage keeps the pipeline on torch's DataLoader, named in the warning.

The shards are indexed once, when the loader is built: each member's offset and size (tar headers
only) and the label members' bytes, decoded by the pipeline's own ``Decoder``. This rank's shards are
the ones the pipeline's own node splitter gives it. Order per epoch: the shards' member order, as
webdataset reads them with one worker; with a shard shuffle or ``.shuffle(n)`` in the pipeline, a
random permutation of all of this rank's samples drawn from the loader's generator (every sample once
per epoch, better mixed than a shuffle buffer, and deterministic with a seed, so ``state_dict()``
resumes at the batch).
"""
from __future__ import annotations

import collections
import os
import sys
import tarfile
import threading
import weakref
from typing import Any, Callable, Optional

import torch

from .. import files
from ..errors import NotCompilable
from .adapters import FileSamples

#: the decoder specs whose PIL image the chain receives (webdataset's ImageHandler)
_PIL_SPECS = ("pil", "pilrgb")


def _stage_name(stage) -> str:
    f = getattr(stage, "f", None)
    name = getattr(f, "__name__", None) or getattr(stage, "__name__", None) or type(stage).__name__
    return name.lstrip("_")


def is_webdataset(dataset) -> bool:
    wds = sys.modules.get("webdataset")
    return wds is not None and isinstance(dataset, wds.DataPipeline)


class _Pipeline:
    """What a webdataset pipeline's stages say, or NotCompilable naming the first stage that is not
    of the standard shape."""

    def __init__(self, ds):
        import webdataset as wds

        stages = list(ds.pipeline)
        if not stages or not isinstance(stages[0], wds.SimpleShardList):
            first = type(stages[0]).__name__ if stages else "nothing"
            raise NotCompilable(f"webdataset pipeline starts with {first}, not a shard list (resampled shards are "
                                "an endless stream)", "to compile it, give WebDataset a list or brace pattern "
                                "of shards, without resampled=True")
        self.shard_list, self.splitters, self.shuffle = stages[0], [], False
        self.decoder = self.image_keys = self.label_keys = self.transform = None
        self.target_fn: Optional[Callable] = None
        self.map_dict: Optional[dict] = None
        self.pil_rgb = False
        self.handlers: list = []  # (stage, its exception handler) where one meets a bad sample
        for stage in stages[1:]:
            self._take(stage, wds)
        if self.image_keys is None:
            raise NotCompilable("webdataset pipeline has no .to_tuple(image, label)",
                                "to compile it, end it with .to_tuple('jpg;png', 'cls') and .map_tuple(transform, ...)")

    def _take(self, stage, wds):
        name = _stage_name(stage)
        if name in ("single_node_only", "split_by_node", "split_by_worker") and callable(stage):
            self.splitters.append(stage)
        elif name in ("shuffle", "detshuffle") or type(stage).__name__ == "detshuffle":
            size = (getattr(stage, "args", None) or (getattr(stage, "bufsize", 2),))[0]
            self.shuffle = self.shuffle or (size or 0) > 1
        elif isinstance(stage, (wds.cache.StreamingOpen, wds.cache.FileCache)) or \
                name in ("tar_file_expander", "group_by_keys", "check_empty", "tarfile_samples"):
            if name in ("tar_file_expander", "tarfile_samples"):  # a truncated shard
                self.handlers.append(("the tar reader", getattr(stage, "kw", {}).get("handler")))
        elif name == "map" and isinstance(stage.args[0], wds.autodecode.Decoder):
            self._decoder(stage.args[0], wds)
            self.handlers.append((".decode", stage.kw.get("handler")))
        elif name == "decode":  # wds.decode(...) in a DataPipeline: the Decoder its stage builds
            self.handlers.append((".decode", stage.kw.get("handler")))
            kw = {k: v for k, v in stage.kw.items() if k != "handler"}
            self._decoder(wds.autodecode.Decoder([wds.autodecode.imagehandler(x) if isinstance(x, str) else x
                                                  for x in stage.args], **kw), wds)
        elif name == "to_tuple" and self.image_keys is None:
            keys = stage.args[0].split() if len(stage.args) == 1 and " " in stage.args[0] else stage.args
            if len(keys) != 2 or stage.kw.get("missing_is_error") is False:
                raise NotCompilable(f"webdataset .to_tuple{tuple(keys)}: not (image, label)",
                                    "to compile it, ask for two fields: .to_tuple('jpg;png', 'cls')")
            self.image_keys, self.label_keys = (k.split(";") if isinstance(k, str) else list(k) for k in keys)
        elif name == "map_tuple" and self.image_keys is not None and self.transform is None:
            if len(stage.args) != 2:
                raise NotCompilable(f"webdataset .map_tuple with {len(stage.args)} functions",
                                    "to compile it, map the two fields: .map_tuple(transform, target_fn)")
            self.transform, self.target_fn = stage.args
            self.handlers.append((".map_tuple", stage.kw.get("handler")))
        elif name == "map_dict" and self.image_keys is None and self.transform is None:
            self.map_dict = {k: f for k, f in stage.kw.items() if k != "handler"}  # (to_tuple names the image)
            self.handlers.append((".map_dict", stage.kw.get("handler")))
        else:
            raise NotCompilable(f"webdataset stage {name} ({stage!r:.80}) is not of the standard shape",
                                "to compile it, keep to shards, shuffle, decode('pil'), to_tuple and "
                                "map_tuple/map_dict (docs/datasets.md); do the rest in the transform")

    def _decoder(self, decoder, wds):
        images = [h for h in decoder.handlers if isinstance(h, wds.autodecode.ImageHandler)]
        specs = {h.imagespec for h in images}
        if self.decoder is not None or len(specs) > 1 or (specs and not specs <= set(_PIL_SPECS)):
            raise NotCompilable(f"webdataset .decode({', '.join(sorted(specs)) or '...'}) gives the transform "
                                "something other than a PIL image",
                                "to compile it, decode with .decode('pil') or .decode('pilrgb')")
        if not specs:
            raise NotCompilable("webdataset .decode(...) without an image decoder",
                                "to compile it, decode with .decode('pil')")
        self.decoder, self.pil_rgb = decoder, specs == {"pilrgb"}

    def on_error(self) -> tuple:
        """(on_error, warn) as the pipeline's exception handlers treat a bad sample: webdataset's
        default (reraise_exception) raises; ignore_and_continue / warn_and_continue on the stages that
        meet one (the tar reader, .decode, .map_tuple) skip it, silently or with a warning (once per
        epoch here, listing them); a handler that stops the stream, or one of the user's own, keeps the
        pipeline on torch's DataLoader, where it runs as written."""
        kinds = {"reraise_exception": "raise", "ignore_and_continue": "skip", "warn_and_continue": "warn"}

        def kind(handler):  # (webdataset defines reraise_exception in more than one module)
            if handler is None:
                return "raise"
            ours = (getattr(handler, "__module__", None) or "").startswith("webdataset")
            return kinds.get(getattr(handler, "__name__", None)) if ours else None

        seen = set()
        for where, handler in self.handlers:
            seen.add(kind(handler))
            if None in seen:
                raise NotCompilable(f"webdataset {where} has handler={getattr(handler, '__name__', handler)}, "
                                    "which the compiled loader does not mirror",
                                    "to compile it, use reraise_exception (the default), ignore_and_continue or "
                                    "warn_and_continue, or DataLoader(on_error='skip')")
        if seen <= {"raise"}:
            return None, True
        return "skip", "warn" in seen

    def finish(self):
        funcs = self.map_dict
        if funcs is not None:
            image = [k for k in funcs if k in self.image_keys]
            label = [k for k in funcs if k in self.label_keys]
            if len(image) != 1 or len(self.image_keys) != 1 or len(funcs) != len(image) + len(label):
                raise NotCompilable(f"webdataset .map_dict({', '.join(funcs)}) does not map the image field",
                                    "to compile it, map the image field once: .map_dict(jpg=transform)")
            self.transform = funcs[image[0]]
            self.target_fn = funcs[label[0]] if label else None
        if self.decoder is None:
            raise NotCompilable("webdataset pipeline does not decode its images",
                                "to compile it, add .decode('pil') before .to_tuple")
        if self.transform is None:
            raise NotCompilable("webdataset pipeline has no transform on its image field",
                                "to compile it, add .map_tuple(transform, target_fn)")


def shard_urls(pipe: _Pipeline) -> list:
    """This rank's shards, as the pipeline's own node splitter gives them (split_by_worker sees no
    worker here: the reader threads read them all); single_node_only raises under torchrun as it does."""
    stream: Any = iter(pipe.shard_list.urls)
    stream = ({"url": u} for u in stream)
    for split in pipe.splitters:
        stream = split(stream)
    return [d["url"] for d in stream]


class _Opened(threading.local):
    """Each reader thread's open remote shards (fsspec files keep a position: one per thread), the most
    recent few (a shuffled epoch jumps between shards; thousands of shards must not hold thousands of
    connections per thread)."""

    KEEP = 4

    def __init__(self):
        self.handles: dict = {}

    def get(self, shard: int, url: str):
        f = self.handles.pop(shard, None)
        if f is None:
            f = _open(url)
            while len(self.handles) >= self.KEEP:
                self.handles.pop(next(iter(self.handles))).close()
        self.handles[shard] = f  # (re)inserted last: the most recent
        return f


class _Descriptors:
    """The local shards' file descriptors, shared by the reader threads: ``os.pread`` keeps no file
    position, so one descriptor serves every thread at once and each read is one system call that
    releases the GIL. A shuffled epoch jumps between shards: with a handle per thread and shard
    (Python files, seek then read) the reader threads spent 126 us per image against 58 in shard order
    (H100 host, 10,000 photos in 63 shards, benchmarks/probes/sources.py). The most recently used
    ``KEEP`` stay open (one in use by a thread is never closed under it)."""

    KEEP = 64

    def __init__(self):
        self.lock = threading.Lock()
        self.open: collections.OrderedDict = collections.OrderedDict()  # shard -> [fd, threads reading it]

    def read(self, shard: int, path: str, offset: int, size: int) -> bytes:
        with self.lock:
            entry = self.open.pop(shard, None)
            if entry is None:
                entry = [os.open(path, os.O_RDONLY), 0]
            entry[1] += 1
            self.open[shard] = entry  # (re)inserted last: the most recent
            self._trim()
        try:
            data = os.pread(entry[0], size, offset)
            while 0 < len(data) < size:  # (a short read: ask for the rest)
                more = os.pread(entry[0], size - len(data), offset + len(data))
                if not more:
                    break
                data += more
            return data
        finally:
            with self.lock:
                entry[1] -= 1
                self._trim()  # (the ones kept past KEEP while in use)

    def _trim(self):
        """Close the least recently used descriptors past ``KEEP`` that no thread is reading (lock held)."""
        if len(self.open) > self.KEEP:
            for k in [k for k, (_, users) in self.open.items() if users == 0][:len(self.open) - self.KEEP]:
                os.close(self.open.pop(k)[0])

    def close(self):
        with self.lock:
            while self.open:
                os.close(self.open.popitem()[1][0])


def _local_path(url: str) -> Optional[str]:
    """The file a shard URL names on this machine, or None (a remote URL, read through fsspec)."""
    if url.startswith("file://"):
        return url[len("file://"):]
    return None if "://" in url or url.startswith("pipe:") else url


def _open(url: str):
    if url.startswith("pipe:"):
        raise NotCompilable(f"webdataset shard {url!r} is a pipe: command, read once from start to end",
                            "to compile it, name the shard files, or their URLs (s3://, gs://, https://) "
                            "read through fsspec")
    if "://" in url and not url.startswith("file://"):
        import fsspec

        return fsspec.open(url, "rb").open()
    return open(url[len("file://"):] if url.startswith("file://") else url, "rb")


def _base_plus_ext(name: str):
    from webdataset.tariterators import base_plus_ext

    return base_plus_ext(name)


class ShardSamples(FileSamples):
    """Samples of tar shards: ``paths[i]`` names the member ("shard:key.ext", for errors and explain),
    ``members[i]`` is (shard index, offset, size) of its bytes."""

    def __init__(self, shards: list, members: list, names: list, targets: list, transform, target_fn,
                 shuffle: bool, pil_rgb: bool, origin: str):
        super().__init__(names, targets, transform, None if target_fn is None else [target_fn] * len(names), origin)
        self.shards, self.members, self.shuffle, self.pil_rgb = shards, members, shuffle, pil_rgb
        self.local = [_local_path(u) for u in shards]
        self._opened = _Opened()
        self._descriptors = _Descriptors()
        weakref.finalize(self, self._descriptors.close)

    def read(self, i: int) -> bytes:
        shard, offset, size = self.members[i]
        if size < 0:
            raise files.BadSampleError(i, self.paths[i], "the shard ends before this sample's image (a truncated "
                                                         "shard)")
        try:
            path = self.local[shard]
            if path is not None:
                data = self._descriptors.read(shard, path, offset, size)
            else:
                f = self._opened.get(shard, self.shards[shard])
                f.seek(offset)
                data = f.read(size)
        except OSError as e:
            raise files.BadSampleError(i, self.paths[i], f"cannot read it ({e})") from e
        if len(data) != size:
            raise files.BadSampleError(i, self.paths[i], f"the shard ends {size - len(data)} bytes into this "
                                                         "member (a truncated shard)")
        return data

    def reader(self, *, gpu: bool, check_jpeg_scan: bool) -> Callable[[int], Any]:
        return lambda i: files.prepare_bytes(i, self.paths[i], self.read(i), small_jpegs_via_pil=gpu,
                                             check_jpeg_scan=check_jpeg_scan)

    def decoded_by_pil(self, i: int):
        return files.bytes_decoded_by_pil(i, self.paths[i], self.read(i))

    def load(self, i: int):
        """The member decoded by PIL as RGB, as the graph decodes it (to find the sample DALI failed on)."""
        return files.pil_rgb(i, self.paths[i], self.read(i))

    def select(self, indices):
        raise NotCompilable("a webdataset pipeline inside a Subset or ConcatDataset",
                            "to compile it, give the pipeline to the DataLoader itself")

    def epoch_order(self, batch_size: int, drop_last: bool, generator: Optional[torch.Generator]) -> "ShardOrder":
        return ShardOrder(len(self.paths), batch_size, drop_last, self.shuffle, generator)


class ShardOrder:
    """Index batches of one epoch over the shards' samples: the members in shard order, or with a
    shuffle in the pipeline a permutation drawn as torch's RandomSampler draws one (from ``generator``,
    else a seed from the global RNG), so a seed fixes it and a saved position resumes it."""

    def __init__(self, n: int, batch_size: int, drop_last: bool, shuffle: bool, generator):
        self.n, self.batch_size, self.drop_last, self.shuffle, self.generator = n, batch_size, drop_last, shuffle, generator

    def __len__(self) -> int:
        return self.n // self.batch_size if self.drop_last else -(-self.n // self.batch_size)

    def __iter__(self):
        if self.shuffle:
            gen = self.generator
            if gen is None:
                gen = torch.Generator()
                gen.manual_seed(int(torch.empty((), dtype=torch.int64).random_().item()))
            order = torch.randperm(self.n, generator=gen).tolist()
        else:
            order = list(range(self.n))
        for start in range(0, len(self) * self.batch_size, self.batch_size):
            yield order[start:start + self.batch_size]


def _scan(url: str, k: int, pipe: _Pipeline, members: list, names: list, targets: list) -> None:
    """Index one shard's samples (tar headers, and each label member's bytes through the pipeline's
    Decoder); a sample without an image or label field raises as webdataset's to_tuple does."""
    with _open(url) as f:
        try:
            tar = tarfile.open(fileobj=f, mode="r:")
        except tarfile.ReadError as e:
            raise ValueError(f"gputransforms: webdataset shard {url} is not a tar file ({e})") from None
        groups: dict = {}
        order: list = []
        truncated = False
        try:
            for info in tar:
                if not info.isreg() or info.name.startswith("__") or "/__" in info.name:
                    continue
                prefix, suffix = _base_plus_ext(info.name)
                if prefix is None:
                    continue
                if prefix not in groups:
                    groups[prefix] = {}
                    order.append(prefix)
                groups[prefix][suffix.lower()] = (info.offset_data, info.size)
        except tarfile.ReadError as e:
            if not order:
                raise ValueError(f"gputransforms: webdataset shard {url}: {e} (a truncated shard)") from None
            truncated = True  # the shard ends inside its last sample: that one fails when read, named
        for key in order:
            fields = groups[key]
            image = next((e for e in pipe.image_keys if e in fields), None)
            label = next((e for e in pipe.label_keys if e in fields), None)
            if truncated and key == order[-1] and (image is None or label is None):
                members.append((k, *fields[image]) if image is not None else (k, 0, -1))
                names.append(f"{url}:{key}.{image or pipe.image_keys[0]}")
                targets.append(None)
                continue
            if image is None or label is None:
                raise ValueError(f"gputransforms: webdataset shard {url}, sample {key!r}: didn't find "
                                 f"{pipe.image_keys if image is None else pipe.label_keys} in {sorted(fields)} "
                                 "(as webdataset's to_tuple raises)")
            offset, length = fields[label]
            f.seek(offset)
            raw = f.read(length)
            decoded = pipe.decoder({"__key__": key, "__url__": url, label: raw})
            members.append((k, *fields[image]))
            names.append(f"{url}:{key}.{image}")
            targets.append(decoded[label])


def resolve_webdataset(ds) -> ShardSamples:
    pipe = _Pipeline(ds)
    pipe.finish()
    on_error, warn = pipe.on_error()
    urls = shard_urls(pipe)
    members: list = []
    names: list = []
    targets: list = []
    for k, url in enumerate(urls):
        _scan(url, k, pipe, members, names, targets)
    how = "shuffled each epoch" if pipe.shuffle else "in shard order"
    skip = "" if on_error is None else \
        f"; bad samples skipped, as the pipeline's {'warn' if warn else 'ignore'}_and_continue handler does"
    samples = ShardSamples(urls, members, names, targets, pipe.transform, pipe.target_fn, pipe.shuffle,
                           pipe.pil_rgb, f"{len(members)} samples in {len(urls)} webdataset shard(s) of this rank, "
                                         f"indexed from their tar headers, {how}{skip} (datasets/shards.py)")
    samples.on_error, samples.warn_skipped = on_error, warn
    return samples
