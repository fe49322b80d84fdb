"""A user's own map-style Dataset, read by running its ``__getitem__`` without decoding anything.

The hand-written dataset of every tutorial opens one file with ``PIL.Image.open`` and returns
``(self.transform(img), target)``. To compile it we need, for each index, the file it opens and the
target it returns. ``discover(ds)`` finds both by calling ``__getitem__`` once per index on a shallow
copy of the dataset whose transform is a recorder, while ``PIL.Image.open`` (for the calling thread
only) records the file and hands back a small placeholder image instead of opening it. Each call
is checked: exactly one file opened, the transform called once on the placeholder left as it was
(``convert("RGB")`` aside), and ``(image, target)`` returned with the image the transform's output.
Anything else (a crop before the transform, two files, bytes from an archive, no transform) is a
``NotCompilable`` whose one line says what the dataset did, and the dataset runs on torch's
DataLoader as it is.

A Dataset may also read its files with ``torchvision.io.read_image``, or ``torchvision.io.decode_image(path)``
called through the module (PyTorch's data tutorial's ``CustomImageDataset``, torchvision's detection tutorial's
``PennFudanDataset``): ``torchvision.io``'s ``read_file`` and ``decode_image``, which ``read_image`` looks up when
called, are intercepted as ``PIL.Image.open`` is, and the image is answered as a tensor.

What this cannot see: randomness or state inside ``__getitem__`` outside the transform where the first and
last indices, run again (``_made_without_the_image``), do not show it (a random target is then drawn once,
here), and opens through functions bound before import (``from PIL.Image
import open``, ``from torchvision.io import decode_image``) or other decoders (``cv2``): those datasets are
reported as not opening a file, or as decoding where the probe cannot answer.
"""
from __future__ import annotations

import copy
import dataclasses
import os
import threading
import weakref
from typing import Optional

import torch
from PIL import Image
from torchvision import tv_tensors

from ..compiler.joint import same
from ..errors import BadSampleError, NotCompilable

_local = threading.local()
_lock = threading.Lock()


def _io_decoders() -> tuple:
    import torchvision.io

    return torchvision.io.decode_image, torchvision.io.read_image


#: torchvision.io's own decoders as imported (a probe replaces the module's names while it runs: ``_intercept``)
IO_DECODERS = _io_decoders()
#: users of the interception, the real PIL.Image.open and Image.convert, torchvision.io's read_file and decode_image
_installed: list = [0, None, None, None, None]
_SIZE = (23, 17)  # the placeholder: a size and pattern no user code produces by chance
_OPENED = "gputransforms: opened"  # a sized placeholder's place among the opens of its sample
#: in a placeholder's info: True while it is the image as PIL opened it, False once converted to RGB (PIL's
#: copies and conversions keep the info): a file opened in another mode (grey, RGBA, CMYK, a palette) and
#: handed over without the conversion reaches the transform in that mode
_AS_OPENED = "gputransforms: as opened"


#: what to do instead, when the dataset's files cannot be found by running its __getitem__
_IMAGELIST = "to compile it, give the files and targets to gputransforms.datasets.ImageList"
_IN_MEMORY = ("its images are encoded bytes in memory, which the DataLoader compiles only from files: "
              "gputransforms.compile(transform) runs the chain compiled on batches of bytes (docs/inference.md), "
              "or write the bytes to files and use gputransforms.datasets.ImageList")


#: a torchvision detection or segmentation dataset (or a subclass) whose joint transforms are not v2's: the
#: detection reference without --use-v2 (its CocoDetection subclass and its own transform classes)
_DETECTION_V2 = ("to compile it, wrap it with torchvision.datasets.wrap_dataset_for_transforms_v2 and give it "
                 "torchvision.transforms.v2 transforms (the detection reference's --use-v2; docs/datasets.md)")


#: a file read by torchvision.io (read_file recorded it) and decoded where the probe cannot answer for it: by
#: ``decode_image`` under a name bound at import (``from torchvision.io import decode_image``)
_BOUND_DECODE = ("decodes its image with torchvision.io's decode_image by a name bound when it was imported (from "
                 "torchvision.io import decode_image), which the loader cannot answer without decoding")
_BOUND_DECODE_ADVICE = ("to compile it, call torchvision.io.decode_image(path) through the module, or "
                        "torchvision.io.read_image(path)")


#: a detection or segmentation Dataset whose image is not found by running it
_JOINT_FILES = ("to compile it, open the image with PIL.Image.open(path).convert(\"RGB\") or "
                "torchvision.io.read_image(path) in __getitem__, or wrap a torchvision detection dataset with "
                "torchvision.datasets.wrap_dataset_for_transforms_v2 (docs/datasets.md)")


_NOT_FILES = ("to compile it, give decoded images as a uint8 TensorDataset (N, C, H, W) or a torchvision in-memory "
              "dataset (docs/in-memory.md), or files to gputransforms.datasets.ImageList")


class _Undiscoverable(Exception):
    def __init__(self, reason: str, advice: str = _IMAGELIST):
        super().__init__(reason)
        self.advice = advice


class _Unreadable(OSError):
    """A sized probe's file whose header PIL cannot read (a bad file): the sample is kept, and reading it
    raises the error naming it (or skips it, where asked), as for any other sample."""

    def __init__(self, path: str, error: Exception):
        super().__init__(f"{type(error).__name__}: {error}")
        self.path = path


def _header(path: str):
    """PIL's open of ``path`` for its header (``_Unreadable`` where PIL cannot open it)."""
    try:
        return _installed[1](path)
    except Exception as e:  # noqa: BLE001 - PIL's own error for a bad file, kept in the sample's later error
        raise _Unreadable(path, e) from None


def _template() -> Image.Image:
    img = Image.new("RGB", _SIZE)
    img.putdata([(x * 11 % 256, y * 13 % 256, (x + y) * 7 % 256) for y in range(_SIZE[1]) for x in range(_SIZE[0])])
    return img


_TEMPLATE = _template()
_PATTERN = _TEMPLATE.tobytes()
#: the placeholder as torchvision.io's decode_image would give it: uint8 (3, H, W)
_TENSOR_TEMPLATE = torch.frombuffer(bytearray(_PATTERN), dtype=torch.uint8).reshape(_SIZE[1], _SIZE[0], 3).permute(
    2, 0, 1).contiguous()


def placeholder() -> Image.Image:
    """A copy of the placeholder image a probe hands the code under study instead of a decoded file."""
    return _TEMPLATE.copy()


def is_placeholder(img, pixels: bool = True) -> bool:
    """Whether ``img`` is the placeholder as handed out: a PIL image of its size and mode (``pixels``:
    and its pattern, a copy of 1 KiB)."""
    return isinstance(img, Image.Image) and img.size == _SIZE and img.mode == "RGB" and \
        (not pixels or img.tobytes() == _PATTERN)


def _path_of(fp) -> str:
    if isinstance(fp, (str, bytes, os.PathLike)):
        return os.path.abspath(os.fsdecode(fp))
    name = getattr(fp, "name", None)
    if isinstance(name, (str, bytes)) and os.path.isfile(name):  # open(path, "rb") handed to PIL
        return os.path.abspath(os.fsdecode(name))
    raise _Undiscoverable(f"opens an image from a {type(fp).__name__}, not from a file", _IN_MEMORY)


def _open(fp, *args, **kwargs):
    calls = getattr(_local, "calls", None)
    if calls is None:  # another thread, or no probe running: PIL's own open
        return _installed[1](fp, *args, **kwargs)
    path = _path_of(fp)
    calls.append(path)
    if getattr(_local, "sized", False):  # black, of the file's own size (its header read, nothing decoded)
        if len(calls) > 1 and _local.rest == "real":  # a second file (a mask): read as the dataset reads it
            return _installed[1](fp, *args, **kwargs)
        with _header(path) as real:
            if len(calls) == 1:
                _local.first_size = real.size
            # black, in the file's own mode (an image the code does not convert to RGB is refused: the graph
            # decodes RGB), and its size
            black = Image.new(real.mode, real.size)
            if real.mode == "P" and real.getpalette() is not None:
                black.putpalette(real.getpalette())
            black.info[_OPENED] = len(calls)  # which open it came from (PIL's copy and convert keep it)
            return black
    return opened_placeholder()


def _read_file(path):
    """``torchvision.io``'s ``read_file`` during a probe: the bytes as it reads them, the file recorded as opened,
    for its ``decode_image`` to answer for them (``_decode_image``)."""
    data = _installed[3](path)
    calls = getattr(_local, "calls", None)
    if calls is not None:
        calls.append(os.path.abspath(os.fsdecode(path)))
        _local.reads[id(data)] = (calls[-1], len(calls), data)
    return data


def _decode_image(input, mode=None, apply_exif_orientation: bool = False):
    """``torchvision.io``'s ``decode_image`` (what its ``read_image`` calls) during a probe, for the bytes of a
    file ``_read_file`` read: in a classification probe (``discover``) the placeholder as a uint8 (3, H, W)
    tensor; in a sized one (``discover_joint``) black, uint8 (C, H, W) of the file's size, C the channels
    torchvision gives (ImageReadMode.RGB: 3; UNCHANGED: those of the file, 3 for RGB). A file read after the
    image where the probe reads the rest for real (``rest="real"``), and anything else, are decoded as
    torchvision does."""
    real = _installed[4]
    calls = getattr(_local, "calls", None)
    if calls is not None and not isinstance(input, torch.Tensor):
        input = _read_file(str(input))
    read = getattr(_local, "reads", {}).get(id(input)) if calls is not None else None
    if read is None or read[2] is not input or (read[1] > 1 and _local.rest == "real"):
        return real(input, mode, apply_exif_orientation=apply_exif_orientation) if mode is not None else \
            real(input, apply_exif_orientation=apply_exif_orientation)
    from torchvision.io import ImageReadMode

    path, order = read[0], read[1]
    name = mode.upper() if isinstance(mode, str) else getattr(mode, "name", "UNCHANGED")
    if not _local.sized:  # a classification probe (``discover``): the placeholder, as a tensor
        out = _TENSOR_TEMPLATE.clone()
        _local.tensors[out.data_ptr()] = (path, name)
        return out
    with _header(path) as img:
        size = img.size
        channels = {"RGB": 3, "GRAY": 1, "RGB_ALPHA": 4, "GRAY_ALPHA": 2}.get(name) or \
            {"RGB": 3, "L": 1, "RGBA": 4, "LA": 2}.get(img.mode)
    if channels is None:  # (a palette, CMYK, 16 bits, ...: as torchvision decodes it)
        channels = real(input, mode if mode is not None else ImageReadMode.UNCHANGED).shape[0]
    black = torch.zeros((channels, size[1], size[0]), dtype=torch.uint8)
    if order == 1:
        _local.first_size, _local.first_tensor = size, black
    return black


def opened_placeholder() -> Image.Image:
    """The placeholder as a probe's ``PIL.Image.open`` hands it out: marked as opened, not yet converted to RGB
    (``as_opened``, while ``watching()``)."""
    img = placeholder()
    img.info[_AS_OPENED] = True
    return img


def as_opened(img) -> bool:
    """Whether an opened placeholder reached the code under study without ``convert("RGB")``."""
    return bool(getattr(img, "info", {}).get(_AS_OPENED))


def watching():
    """A probe for this thread: ``PIL.Image.open`` records and answers a placeholder, ``Image.convert``
    marks an opened placeholder converted to RGB (``_intercept``)."""
    return _intercept()


def _convert(self, *args, **kwargs):
    """``Image.convert`` during a probe: a placeholder converted to RGB is marked so (``_AS_OPENED``)."""
    out = _installed[2](self, *args, **kwargs)
    mode = args[0] if args else kwargs.get("mode")
    if getattr(_local, "calls", None) is not None and mode == "RGB" and self.info.get(_AS_OPENED):
        out.info[_AS_OPENED] = False
    return out


class _intercept:
    """PIL.Image.open records instead of opening, for the thread inside this block only. ``sized``: the
    image handed back is black and of the file's own size (a target may be made from the image's size);
    the files opened after the first (a mask) are black too, in their own mode, or (``rest="real"``)
    opened as PIL opens them."""

    def __init__(self, sized: bool = False, rest: str = "black"):
        self.sized, self.rest = sized, rest

    def __enter__(self):
        import torchvision.io
        from torchvision.io import image as tv_io

        with _lock:
            if _installed[0] == 0:
                _installed[1], _installed[2] = Image.open, Image.Image.convert
                Image.open, Image.Image.convert = _open, _convert
                # torchvision.io's read_image looks both up in its module when called: a dataset that bound
                # read_image at import (the detection tutorial's) is seen too; decode_image called through the
                # package (torchvision.io.decode_image(path)) as well
                _installed[3], _installed[4] = tv_io.read_file, tv_io.decode_image
                tv_io.read_file, tv_io.decode_image = _read_file, _decode_image
                torchvision.io.read_file, torchvision.io.decode_image = _read_file, _decode_image
            _installed[0] += 1
        _local.calls = []
        _local.sized, _local.rest, _local.first_size = self.sized, self.rest, None
        _local.reads, _local.first_tensor, _local.tensors = {}, None, {}
        return _local.calls

    def __exit__(self, *exc):
        import torchvision.io
        from torchvision.io import image as tv_io

        _local.calls = None
        _local.sized = False
        _local.reads, _local.first_tensor, _local.tensors = {}, None, {}
        with _lock:
            _installed[0] -= 1
            if _installed[0] == 0 and Image.open is _open:
                Image.open, Image.Image.convert = _installed[1], _installed[2]
                tv_io.read_file, tv_io.decode_image = _installed[3], _installed[4]
                torchvision.io.read_file, torchvision.io.decode_image = _installed[3], _installed[4]


class JointCall(TypeError):
    """A transform a probe stands a ``Recorder`` in for was called with more than the image (a joint
    transform: ``transform(image, target)``)."""

    def __str__(self):
        return "its transform is called with the image and a target (a joint transform)"


class Recorder:
    """Stands in for a transform during a probe: records what it is given, returns itself (a marker)."""

    def __init__(self):
        self.seen: list = []

    def __call__(self, img, *more):
        if more:
            raise JointCall()
        self.seen.append(img)
        return self


def is_transform(obj) -> bool:
    """A torchvision, timm or gputransforms transform object (what a probe stands a Recorder in for)."""
    return callable(obj) and not isinstance(obj, type) and \
        type(obj).__module__.startswith(("torchvision.transforms", "timm.data", "gputransforms.transforms"))


def transform_attribute(ds) -> str:
    """The attribute ``__getitem__`` applies: ``transform`` when the dataset has one, else its one
    attribute holding a torchvision/timm transform (``self.tfms``, ``self.augment``...)."""
    if getattr(ds, "transform", None) is not None:
        return "transform"
    found = [k for k, v in vars(ds).items() if is_transform(v)]
    if len(found) == 1:
        return found[0]
    reason = "has no `transform` attribute" if not found else \
        f"has several transforms ({', '.join(found)}) and it is not clear which one it applies"
    if _is_torchvision_detection(ds):
        raise _Undiscoverable(reason, _DETECTION_V2)
    raise _Undiscoverable(reason)


def _is_torchvision_detection(ds) -> bool:
    from torchvision import datasets

    return isinstance(ds, (datasets.CocoDetection, datasets.VOCDetection, datasets.VOCSegmentation))


def discover(ds):
    """``(paths, targets, transform, plan_input, place)`` of a user's map-style dataset, one entry per index
    (``plan_input``: "image" where it opens its images with PIL, "image tensor" where it reads them with
    ``torchvision.io.read_image``, as PyTorch's data tutorial does); raises ``NotCompilable`` (from ``adapters``)
    when ``__getitem__`` does not follow the pattern above. ``place``: None where each sample is ``(image,
    target)`` (``targets[i]`` is the target); else the keys and indices of the image in what ``__getitem__``
    returns (a dict, a longer tuple, the image alone), and ``targets[i]`` is that output with 0 in its place."""

    name = type(ds).__name__
    n = _length(ds, name)
    try:
        try:
            attr = transform_attribute(ds)
        except _Undiscoverable:
            _opens_a_file(ds)
            raise
        chain = getattr(ds, attr)
        probe = copy.copy(ds)
        recorder = Recorder()
        setattr(probe, attr, recorder)
        getitem = type(ds).__getitem__
        paths, targets, unconverted, unchanged, kinds, places = [], [], [], [], set(), []
        with _intercept() as calls:
            for i in range(n):
                del calls[:]
                recorder.seen.clear()
                try:
                    out = getitem(probe, i)
                except _Undiscoverable:
                    raise
                except Exception as e:  # what it does to an image needs a real one
                    what = (f"does something to what self.{attr} returns" if recorder.seen else
                            f"does something to the image before self.{attr}")
                    raise _Undiscoverable(f"{what} (on a placeholder, index {i}: {type(e).__name__}: {e})") from None
                path, at = _check(i, calls, recorder, out, attr)
                paths.append(path)
                pair = type(out) in (tuple, list) and len(out) == 2 and at == PAIR
                if places and (pair, at) != places[0]:
                    raise _Undiscoverable(f"returns its image at another place for index {i} than for index 0")
                places.append((pair, at))
                targets.append(out[1] if pair else put(out, at, 0))
                read = _local.tensors.get(recorder.seen[0].data_ptr()) \
                    if isinstance(recorder.seen[0], torch.Tensor) else None
                kinds.add("image tensor" if read is not None else "image")
                if read is not None and read[1] == "UNCHANGED":
                    unchanged.append(paths[-1])
                if as_opened(recorder.seen[0]):
                    unconverted.append(paths[-1])
        if len(kinds) > 1:
            raise _Undiscoverable("opens some images with PIL and reads others with torchvision.io")
        _made_without_the_image(probe, getitem, recorder, targets, places, attr)
        _opened_as_rgb(unconverted, attr)
        _read_as_rgb(unchanged)
    except _Undiscoverable as e:
        raise NotCompilable(f"{name}.__getitem__ {e}", e.advice) from None
    shape = None if not places or places[0][0] else places[0][1]
    return paths, targets, chain, kinds.pop() if kinds else "image", shape


def _made_without_the_image(probe, getitem, recorder: "Recorder", targets: list, places: list, attr: str) -> None:
    """What ``__getitem__`` returns beside the transformed image must not depend on the image (its size, its
    pixels: ``img.size`` as a target): the first and last indices run again on an image of the file's own size
    (black), and the rest must be what the placeholder gave. A file whose header PIL cannot read is passed
    over for its neighbour (up to 8 on each side): reading it raises the error naming it."""
    n = len(targets)
    for ends in (range(0, min(n, 8)), range(n - 1, max(n - 9, -1), -1)) if n else ():
        for i in ends:
            recorder.seen.clear()
            with _intercept(sized=True):
                try:
                    out = getitem(probe, i)
                except _Unreadable:
                    continue
                except Exception:  # noqa: BLE001 - it depends on the image's pixels
                    out = None
            _same_beside_the_image(i, out, recorder, targets, places, attr)
            break


def _same_beside_the_image(i: int, out, recorder: "Recorder", targets: list, places: list, attr: str) -> None:
    pair, at = places[i]
    at_now = place_of(out, recorder) if out is not None else None
    if at_now != at or not same(out[1] if pair else put(out, at, 0), targets[i]):
        raise _Undiscoverable(f"makes part of what it returns beside self.{attr} from the image or at random "
                              f"(index {i} gave other values when run again on an image of the file's own "
                              "size: img.size as a target, or a random draw)")


def first_not_rgb(images) -> Optional[tuple]:
    """Of ``images`` ((name, what ``PIL.Image.open`` takes) pairs), the first (name, mode) whose header is not
    RGB, or None. An image handed to a transform as PIL opens it (no ``convert("RGB")``) reaches torchvision's
    transform in its own mode (grey, RGBA, CMYK, a palette), where the graph decodes RGB. One PIL cannot open
    is passed over: the loader names it when it reads it."""
    for name, source in images:
        try:
            with Image.open(source) as img:
                mode = img.mode
        except Exception:  # noqa: BLE001 - see above
            continue
        if mode != "RGB":
            return name, mode
    return None


def _opened_as_rgb(paths: list, attr: str) -> None:
    """The files a dataset hands to its transform as PIL opens them must open as RGB (``first_not_rgb``)."""
    bad = first_not_rgb((p, p) for p in paths)
    if bad is not None:
        raise _Undiscoverable(f"hands self.{attr} its image as PIL opens it, and {bad[0]} opens in mode {bad[1]} "
                              "(torchvision's transform gets it so; the graph decodes RGB)",
                              "to compile it, convert the image to RGB as torchvision's ImageFolder does "
                              "(Image.open(path).convert(\"RGB\"))")


def _read_as_rgb(paths: list) -> None:
    """The files read with torchvision.io in its default mode (UNCHANGED) must be RGB: it gives their own
    channels (1 for grey, 4 for RGBA), where the graph decodes RGB."""
    bad = first_not_rgb((p, p) for p in paths)
    if bad is not None:
        raise _Undiscoverable(f"reads {bad[0]} (mode {bad[1]}) with torchvision.io as it is (not 3 channels; the graph "
                              "decodes RGB)", "to compile it, read it as RGB (read_image(path, ImageReadMode.RGB))")


def _length(ds, name: str) -> int:
    try:
        return len(ds)
    except TypeError:
        raise NotCompilable(f"{name} has no __len__; only map-style datasets compile", _IMAGELIST) from None


def _opens_a_file(ds):
    """Raise "opens no image" for a dataset that keeps its samples in memory (a clearer reason than
    a missing transform attribute)."""
    with _intercept() as calls:
        try:
            ds[0] if len(ds) else None
        except Exception:  # noqa: BLE001 - a placeholder in its own transform; it did open a file
            pass
        if not calls:
            raise _Undiscoverable("opens no image with PIL.Image.open (its samples are not image files)", _NOT_FILES)


def _check(i: int, calls: list, recorder: Recorder, out, attr: str) -> tuple:
    if len(calls) != 1:
        raise _Undiscoverable("opens no image with PIL.Image.open" if not calls else
                              f"opens {len(calls)} files for index {i}")
    if len(recorder.seen) != 1:
        raise _Undiscoverable(f"does not call self.{attr} on its image" if not recorder.seen else
                              f"calls self.{attr} {len(recorder.seen)} times for index {i}")
    img = recorder.seen[0]
    if isinstance(img, torch.Tensor):  # read by torchvision.io.read_image / decode_image (PyTorch's data tutorial)
        read = _local.tensors.get(img.data_ptr())
        if read is None and not _local.tensors and _local.reads:
            raise _Undiscoverable(_BOUND_DECODE, _BOUND_DECODE_ADVICE)
        if read is None or img.shape != _TENSOR_TEMPLATE.shape or img.dtype != torch.uint8 or (
                (i < 64 or i % 997 == 0) and not torch.equal(img.as_subclass(torch.Tensor), _TENSOR_TEMPLATE)):
            raise _Undiscoverable(f"changes the image between reading it and self.{attr} (a crop, a resize, a "
                                  "conversion)")
        if read[1] not in ("RGB", "UNCHANGED"):
            raise _Undiscoverable(f"reads its image with torchvision.io in mode {read[1]} (the graph decodes RGB)",
                                  "to compile it, read it as RGB (read_image(path, ImageReadMode.RGB))")
    elif not is_placeholder(img, pixels=i < 64 or i % 997 == 0):  # (the pixels compared on the first indices
        # and every 997th: a copy of 1 KiB costs half of a probe; size and mode on all)
        raise _Undiscoverable(f"changes the image between opening it and self.{attr} (a crop, a resize, a mode "
                              "other than RGB)")
    at = place_of(out, recorder)
    if at is None:
        raise _Undiscoverable("does not return self.transform(image) once, in a tuple, list or dict (or alone)"
                              .replace("transform", attr))
    if _holds_the_image(out, img):
        raise _Undiscoverable(f"returns the image it opened beside self.{attr}'s output")
    return calls[0], at


def _holds_the_image(out, img) -> bool:
    """Whether ``out`` holds, besides the transform's output, an image (a PIL image, or the tensor read)."""
    if isinstance(out, Image.Image):
        return True
    if isinstance(out, torch.Tensor):
        return isinstance(img, torch.Tensor) and out.untyped_storage().data_ptr() == img.untyped_storage().data_ptr()
    if type(out) in (tuple, list):
        return any(_holds_the_image(v, img) for v in out)
    if type(out) is dict:
        return any(_holds_the_image(v, img) for v in out.values())
    return False


#: a sample's output is (image, target): the common shape, whose targets are kept as they are
PAIR = (0,)


def place_of(out, marker) -> "Optional[tuple]":
    """Where ``marker`` is in ``out`` (the keys and indices down tuples, lists and dicts), where it is there
    exactly once and nothing else in ``out`` holds it; else None."""
    found = places(out, lambda x: x is marker)
    return found[0] if len(found) == 1 else None


def places(out, hit) -> list:
    """The places (keys and indices down tuples, lists and dicts) of what ``hit`` is true of in ``out``."""
    found: list = []

    def walk(x, at: tuple):
        if hit(x):
            found.append(at)
        elif type(x) in (tuple, list):
            for k, v in enumerate(x):
                walk(v, at + (k,))
        elif type(x) is dict:
            for k, v in x.items():
                walk(v, at + (k,))
    walk(out, ())
    return found


def put(out, at: tuple, value):
    """``out`` with ``value`` at ``at`` (copies along the way; the rest shared)."""
    if not at:
        return value
    head, rest = at[0], at[1:]
    if type(out) is dict:
        new = dict(out)
        new[head] = put(out[head], rest, value)
        return new
    items = list(out)
    items[head] = put(out[head], rest, value)
    return type(out)(items)


class NotJoint(Exception):
    """``self.transforms`` is called on the image alone: a classification Dataset that names its transform so."""


class Leaf:
    """What a joint transform hands back at one place of what it was given (``JointRecorder``): ``at``, the
    keys and indices of that place; ``(0,)`` and ``(1,)`` the image and the target of ``transforms(image,
    target)``. A v2 transform returns the structure it is given, each leaf transformed."""

    __slots__ = ("at",)

    def __init__(self, at: tuple):
        self.at = at

    def __eq__(self, other):
        return type(other) is Leaf and other.at == self.at

    def __hash__(self):
        return hash((Leaf, self.at))

    def __repr__(self):
        return f"Leaf{self.at}"

    def __getstate__(self):
        return self.at

    def __setstate__(self, at):
        self.at = at


def _mirror(x, at: tuple = ()):
    """``x`` with each leaf (all but tuples, lists and dicts) a ``Leaf`` of its place."""
    if type(x) in (tuple, list):
        return type(x)(_mirror(v, at + (k,)) for k, v in enumerate(x))
    if type(x) is dict:
        return {k: _mirror(v, at + (k,)) for k, v in x.items()}
    return Leaf(at)


def get(x, at: tuple):
    """What is at ``at`` (keys and indices) in ``x``."""
    for k in at:
        x = x[k]
    return x


def fill(template, out):
    """``template`` (what ``__getitem__`` returned around a ``JointRecorder``'s markers) with each ``Leaf`` the
    value at its place in ``out`` (what the joint transform returned), in new tuples, lists and dicts (without
    markers: a fresh copy of its containers, the values in them shared)."""
    if type(template) is Leaf:
        return get(out, template.at)
    if type(template) in (tuple, list):
        return type(template)(fill(v, out) for v in template)
    if type(template) is dict:
        return {k: fill(v, out) for k, v in template.items()}
    return template


#: what __getitem__ returns in the common shape, ``self.transforms(image, target)`` itself
PLAIN = (Leaf((0,)), Leaf((1,)))


@dataclasses.dataclass(frozen=True)
class JointShape:
    """How a user's ``__getitem__`` calls its joint transform, and what it returns around its output.

    ``one``: called with one tuple, list or dict that holds the image (``transforms({"image": img, "boxes":
    ...})``, ``transforms((img, target))``), else with two arguments, the image and the target. ``image_at``:
    the image's place in what the transform is given and returns ((0,) for two arguments). ``place``: the
    transformed image's place in what ``__getitem__`` returns. ``templates``: per index, what ``__getitem__``
    returned, with a ``Leaf`` for each part of the transform's output (``fill``); None where every index
    returns the transform's ``(image, target)`` as it is. ``fine``: the probe marked the target's leaves
    (``JointRecorder``)."""

    one: bool
    image_at: tuple
    place: tuple
    templates: Optional[list]
    fine: bool = False


class JointRecorder:
    """Stands in for a joint transform during a probe: records what it is given and returns markers of
    what a v2 transform would return (``Leaf``): for one tuple, list or dict, the same structure with a
    marker for each leaf; for two arguments ``(image, target)``, the target's leaves each marked too where
    ``fine`` (the joint transform is torchvision's v2, which returns the structure it is given), else
    ``PLAIN`` (what another transform returns for the target is its own)."""

    def __init__(self, fine: bool = False):
        self.seen: list = []
        self.returned: list = []
        self.fine = fine

    def __call__(self, *args):
        if len(args) == 2:
            out = _mirror(args) if self.fine else PLAIN
        elif len(args) == 1 and type(args[0]) in (tuple, list, dict):
            out = _mirror(args[0])
        else:
            raise NotJoint
        self.seen.append(args)
        self.returned.append(out)
        return out


def split(args: tuple, image_at: Optional[tuple] = None) -> tuple:
    """``(image_at, image, rest)`` of what a joint transform was given: for ``(image, target)`` ((0,), the
    image, the target); for one structure, the place of the image the probe opened in it (or ``image_at``),
    that image, and the structure with None there."""
    if len(args) == 2:
        return (0,), args[0], args[1]
    inp = args[0]
    if image_at is None:
        found = places(inp, _is_the_image)
        if len(found) != 1:
            raise _Undiscoverable("calls self.transforms with one tuple, list or dict that does not hold the image "
                                  "it opened" if not found else "calls self.transforms with one tuple, list or dict "
                                  "that holds the image it opened more than once")
        image_at = found[0]
    return image_at, get(inp, image_at), put(inp, image_at, None)


def _is_the_image(x) -> bool:
    """Whether ``x`` is the image a sized probe opened first (PIL's, or the tensor torchvision.io read)."""
    if isinstance(x, Image.Image):
        return x.info.get(_OPENED) == 1
    return isinstance(x, torch.Tensor) and _local.first_tensor is not None and \
        x.untyped_storage().data_ptr() == _local.first_tensor.untyped_storage().data_ptr()


def discover_joint(ds, fine: bool = False) -> tuple:
    """``(paths, targets, kind, shape)`` of a user's detection or segmentation Dataset: ``__getitem__`` opens an
    image with ``PIL.Image.open`` (``kind`` None), or reads it with ``torchvision.io.read_image`` (``kind`` "image"
    where it hands the transform a ``tv_tensors.Image``, "tensor" a plain tensor: the detection tutorial's way),
    makes its target (a dict of tv_tensors, a ``Mask``), and calls ``self.transforms(image, target)``, or
    ``self.transforms`` on one tuple, list or dict holding the image and its targets (``shape``, a
    ``JointShape``, says which, and what ``__getitem__`` returns around the output: the output itself, a longer
    tuple, a dict, its parts picked out). Each index runs once with the image black and of the file's own size
    (nothing decoded), its target kept as it went into ``self.transforms`` (for one structure: that structure with
    None in the image's place). Where it opens more files after the image (a mask), those stand black in their own
    mode and size here, and ``targets`` is None: each target is made again when the sample is read
    (``joint_target``), with the other files read for real. The first index runs again on its real pixels, and a
    target or an output that differs there (made from the image's pixels) is a ``NotCompilable``, as is anything
    else ``discover`` refuses; ``NotJoint`` where ``self.transforms`` is called on the image alone. ``fine``: the
    joint transform returns the structure it is given (torchvision's v2: ``JointRecorder``), so ``__getitem__``
    may pick parts of the target or add to it."""
    name = type(ds).__name__
    n = _length(ds, name)
    probe, recorder = _joint_probe(ds, fine)
    getitem = type(ds).__getitem__
    paths, targets, templates, more, kind, shape, plain = [], [], [], False, None, None, True
    bad = set()  # indices whose file (or another file they open) PIL cannot open
    try:
        with _intercept(sized=True) as calls:
            for i in range(n):
                path, found, image, target, out, as_is = _probe_joint(getitem, probe, recorder, calls, i)
                paths.append(path)
                targets.append(target)
                templates.append(out)
                if found is None:  # a bad file: reading the sample names it (or skips it)
                    bad.add(i)
                    continue
                if shape is not None and found != shape:
                    raise _Undiscoverable(f"calls self.transforms or returns its output otherwise for index {i} "
                                          "than for the first index")
                read_as = None if isinstance(image, Image.Image) else \
                    "image" if isinstance(image, tv_tensors.Image) else "tensor"
                if shape is not None and read_as != kind:
                    raise _Undiscoverable(f"hands self.transforms its image as a {type(image).__name__} for index "
                                          f"{i} and otherwise for the first index")
                shape, kind = found, read_as
                more = more or len(calls) > 1
                plain = plain and as_is
        if more:
            targets = None
        if n:
            _same_on_its_pixels(getitem, probe, recorder, [i for i in range(n) if i not in bad], paths, targets,
                                templates, shape)
    except _Undiscoverable as e:
        raise NotCompilable(f"{name}.__getitem__ {e}", e.advice) from None
    if shape is None:
        shape = JointShape(False, (0,), (0,), None)
    return paths, targets, kind, dataclasses.replace(shape, templates=None if plain else templates, fine=fine)


def _probe_joint(getitem, probe, recorder: JointRecorder, calls: list, i: int) -> tuple:
    """Index ``i`` run by the sized probe: (its file, the ``JointShape`` of its call, the image and the target
    the transform was given, what ``__getitem__`` returned, whether that is the transform's output as it is);
    the file alone (the rest None) where PIL cannot open a file it opens."""
    del calls[:]
    recorder.seen.clear()
    recorder.returned.clear()
    try:
        out = getitem(probe, i)
    except (_Undiscoverable, NotJoint):
        raise
    except _Unreadable as e:
        return calls[0] if calls else e.path, None, None, None, None, False
    except Exception as e:  # noqa: BLE001 - what it does to an image needs a real one
        raise _Undiscoverable(f"does something to the image or the target the placeholder cannot "
                              f"stand for (index {i}: {type(e).__name__}: {e})") from None
    path, found, image, target = _check_joint(i, calls, recorder, out, pixels=i < 64 or i % 997 == 0)
    return path, found, image, target, out, not found.one and same(out, recorder.returned[0])


def _same_on_its_pixels(getitem, probe, recorder: JointRecorder, good: list, paths: list, targets: Optional[list],
                        templates: list, shape: "JointShape") -> None:
    """The first index PIL can open and decode run again on its real pixels (and files): its target and what
    ``__getitem__`` returns must be what the black image gave, and its target must hold no second image. (An
    index whose file fails to decode is passed over: reading it raises the error naming it.)"""
    for first in good[:8]:
        recorder.seen.clear()
        try:
            real = getitem(probe, first)
        except Exception:  # noqa: BLE001 - a file PIL cannot decode, met where the sample is read
            continue
        if len(recorder.seen) != 1:
            raise _Undiscoverable(f"calls self.transforms otherwise on the real pixels of index {first}")
        made = split(recorder.seen[0], shape.image_at)[2]
        found = targets[first] if targets is not None else _rerun(probe, recorder, first, paths[first], shape)
        if not same(made, found) or not same(real, templates[first]):
            raise _Undiscoverable(f"makes its target from the image's pixels (index {first} differs on a black image "
                                  "of the same size)")
        if _has_image(found):
            raise _Undiscoverable("passes a second image in its target (a mask is a tv_tensors.Mask)")
        return
    raise _Undiscoverable("opens no file PIL can read" if not good else
                          f"fails on the real pixels of its first {min(len(good), 8)} files")


def _joint_probe(ds, fine: bool = False) -> tuple:
    probe = copy.copy(ds)
    recorder = JointRecorder(fine)
    probe.transforms = recorder
    return probe, recorder


def _rerun(probe, recorder: JointRecorder, i: int, path: str, shape: "JointShape"):
    """Index ``i``'s target, its image black of the file's size and its other files read as they are."""
    recorder.seen.clear()
    with _intercept(sized=True, rest="real") as calls:
        try:
            type(probe).__getitem__(probe, i)
        except Exception as e:
            _name_a_bad_file(i, calls[1:], e)
            raise
        first = calls[0] if calls else None
    if first != path:
        raise RuntimeError(f"gputransforms: sample {i} of {type(probe).__name__} opened {first} now, {path} when "
                           "the loader was made (a Dataset whose files change cannot be compiled)")
    if len(recorder.seen) != 1:
        raise RuntimeError(f"gputransforms: sample {i} of {type(probe).__name__} called self.transforms "
                           f"{len(recorder.seen)} times now, once when the loader was made")
    return split(recorder.seen[0], shape.image_at)[2]


def _name_a_bad_file(i: int, others: list, error: Exception) -> None:
    """Where making sample ``i``'s target failed: a ``BadSampleError`` naming the first of the other files it
    opened (a mask) that PIL cannot open and decode, if one is (skippable with ``on_error="skip"``)."""
    for path in others:
        try:
            with _installed[1](path) as img:
                img.load()
        except Exception as bad:  # noqa: BLE001 - PIL's verdict is the reason
            raise BadSampleError(i, path, f"not an image PIL can open ({type(bad).__name__}: {bad})") from error


#: the probe of the dataset whose targets this process makes (``joint_target``): (a weak reference to the
#: dataset, its probe, the probe's recorder)
_PROBE: list = [None]


def joint_target(ds, i: int, path: str, shape: JointShape):
    """Sample ``i``'s target as ``ds.__getitem__`` makes it, without decoding its image (``discover_joint``
    where it opens more files than the image: they are read here)."""
    if _PROBE[0] is None or _PROBE[0][0]() is not ds:
        _PROBE[0] = (weakref.ref(ds),) + _joint_probe(ds, shape.fine)
    _, probe, recorder = _PROBE[0]
    return _rerun(probe, recorder, i, path, shape)


def _has_image(target) -> bool:
    if isinstance(target, Image.Image):
        return True
    if isinstance(target, dict):
        return any(_has_image(v) for v in target.values())
    if isinstance(target, (list, tuple)):
        return any(_has_image(v) for v in target)
    return False


def _check_joint(i: int, calls: list, recorder: JointRecorder, out, pixels: bool) -> tuple:
    """(the file, the ``JointShape`` of the call, the image, the target) of index ``i``'s probe."""
    if not calls:
        raise _Undiscoverable("opens no image with PIL.Image.open or torchvision.io.read_image", _JOINT_FILES)
    if len(recorder.seen) != 1:
        raise _Undiscoverable("does not call self.transforms(image, target) once")
    args = recorder.seen[0]
    image_at, img, target = split(args)
    if isinstance(img, torch.Tensor):  # read by torchvision.io.read_image (the detection tutorial's way)
        first = _local.first_tensor
        if first is None and _local.reads:
            raise _Undiscoverable(_BOUND_DECODE, _BOUND_DECODE_ADVICE)
        if first is None or img.data_ptr() != first.data_ptr() or img.shape != first.shape or \
                (pixels and bool(img.as_subclass(torch.Tensor).any())):
            raise _Undiscoverable("changes the image between reading it and self.transforms (a crop, a resize, a "
                                  "conversion), or hands it another file's image")
        if img.ndim != 3 or img.shape[0] != 3:
            raise _Undiscoverable(f"hands self.transforms its image with {img.shape[0]} channels, as "
                                  f"torchvision.io reads {calls[0]} (the graph decodes RGB)",
                                  "to compile it, read it as RGB (read_image(path, ImageReadMode.RGB))")
    elif isinstance(img, Image.Image) and img.info.get(_OPENED, 1) != 1:
        raise _Undiscoverable("opens another file before its image (open the image first: the other files are "
                              "read as they are, the first one is the image the graph decodes)")
    elif isinstance(img, Image.Image) and img.mode != "RGB" and img.size == _local.first_size:
        raise _Undiscoverable(f"hands self.transforms its image in mode {img.mode}, as PIL opens {calls[0]} "
                              "(torchvision's transform gets it so; the graph decodes RGB)",
                              "to compile it, convert the image to RGB (Image.open(path).convert(\"RGB\"))")
    elif not (isinstance(img, Image.Image) and img.mode == "RGB" and img.size == _local.first_size and
              (not pixels or img.getbbox() is None)):
        raise _Undiscoverable("changes the image between opening it and self.transforms (a crop, a resize, a mode "
                              "other than RGB, a conversion to a tensor)")
    place = _place_of_leaf(out, Leaf(image_at))
    if place is None or _holds_the_image(out, img):
        raise _Undiscoverable("does not return the image self.transforms returns once, in a tuple, list or dict "
                              "(beside its target or parts of it, or alone)")
    return calls[0], JointShape(len(args) == 1, image_at, place, None), img, target


def _place_of_leaf(out, leaf: Leaf) -> Optional[tuple]:
    """Where ``leaf`` is in ``out``, where it is there exactly once."""
    found = places(out, lambda x: type(x) is Leaf and x == leaf)
    return found[0] if len(found) == 1 else None
