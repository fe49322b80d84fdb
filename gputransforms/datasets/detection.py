"""Detection and segmentation datasets of torchvision v2: ``wrap_dataset_for_transforms_v2`` around
``CocoDetection``, ``VOCDetection`` or ``VOCSegmentation``, as torchvision's references build them
(``Subset``s of them too). The target is torchvision's own (its wrapper's boxes, labels, masks, ... from
the annotations, with the canvas size read from the file's header).

Two ways to run the joint transform:

- **recorded** (every step has a ``joint`` entry in the registry: the references' presets): in torch's
  worker processes (``num_workers``; none: this thread) the transform runs as written on a stand-in image
  and the real target (``compiler.joint``): torchvision draws every parameter and moves boxes and masks
  itself; the graph decodes and does the pixel work for the whole batch from each sample's recorded
  parameters.
- **per sample** (any other step): the graph decodes each image (nvJPEG on the GPU) to a uint8 CHW tensor
  on the device; the joint transform then runs per sample, as written, with torchvision's kernels.

A joint transform that augments PIL images (the references' default ``--backend pil``: a conversion to
tensor after the augmentations) is recorded on a PIL stand-in, so every type lookup and parameter draw is
what it is on PIL images; the graph does the pixel work with the tensor kernels' arithmetic (the difference
from PIL's kernels is torchvision's own tensor-against-PIL difference, in the docs). Such a chain compiles
only where it can be recorded: else it stays on torch's DataLoader (with PIL's kernels, as written).
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import inspect
import os
from typing import Any, Optional

import numpy as np
import torch
import torch.utils.data as tud
import torchvision
from PIL import Image
from torch.utils.data import default_collate
from torchvision import tv_tensors

from .. import files
from ..compiler import joint as recorded
from ..compiler import joint_chain, joint_masks, joint_record, joint_vector
from ..compiler.registry import chain_of, joint_ok, vector_of
from ..device import to_device
from ..errors import BadTargetError, NotCompilable, naming_sample
from . import adapters, coco_targets, discover, mask_targets, pickled
from .adapters import FileSamples
from .pickled import Pickled

_ADVICE = ("to compile it, leave out what reads the PIL image's pixels, or start the joint transform with "
           "v2.ToImage() or v2.PILToTensor() (torchvision's references: --backend tv_tensor or tensor): its steps "
           "then run per sample after the graph's decode")


def _coco(inner) -> tuple:
    paths = [os.path.join(inner.root, inner.coco.loadImgs(i)[0]["file_name"]) for i in inner.ids]
    return paths, lambda k: inner._load_target(inner.ids[k]), None


def _voc_detection(inner) -> tuple:
    from torchvision.datasets.voc import ET_parse

    return list(inner.images), lambda k: inner.parse_voc_xml(ET_parse(inner.annotations[k]).getroot()), \
        list(inner.annotations)


def _voc_segmentation(inner) -> tuple:
    return list(inner.images), lambda k: Image.open(inner.masks[k]), list(inner.masks)


def _oxford_pet(inner) -> tuple:
    """OxfordIIITPet's target as its ``__getitem__`` makes it: per target type the label, the binary label or
    the trimap opened with PIL; one alone, several as a tuple, none as None."""
    def raw(k):
        target = [inner._labels[k] if kind == "category" else inner._bin_labels[k] if kind == "binary-category"
                  else Image.open(inner._segs[k]) for kind in inner._target_types]
        return None if not target else target[0] if len(target) == 1 else tuple(target)

    trimaps = [str(p) for p in inner._segs] if inner._target_types == ["segmentation"] else None
    return [str(p) for p in inner._images], raw, trimaps


#: the wrapped dataset classes, each: its image files, its raw target by index (what its own __getitem__ reads
#: besides the image; torchvision's wrapper then makes the tv_tensors), and the file each target is read from
#: where it has one of its own (a mask, an XML annotation: named beside the image where reading it raises)
KINDS = {torchvision.datasets.CocoDetection: _coco, torchvision.datasets.VOCDetection: _voc_detection,
         torchvision.datasets.VOCSegmentation: _voc_segmentation, torchvision.datasets.OxfordIIITPet: _oxford_pet}


def _tensor(cls, array, attributes: dict) -> torch.Tensor:
    """A target's tensor from its array: a NumPy array, or a torch tensor in pinned memory (``pickled.load``)."""
    t = array if isinstance(array, torch.Tensor) else torch.from_numpy(array)
    if cls is not torch.Tensor:
        t = t.as_subclass(cls)
    if attributes:
        t.__dict__.update(attributes)
    return t


class _TargetPickler(pickled.ArraysApart):
    """Pickles a target's CPU tensors (plain, or tv_tensors with their metadata) as NumPy arrays:
    torch's own tensor pickling (``torch.save`` per tensor) took 155 us to write and 163 us to read a
    detection target of three entries; this, 31 and 14 (the reading is in the loader's main thread).
    Everything travels through the worker's pipe: torch's shared-memory hand-over of a tensor opens an
    authenticated connection to the worker per tensor (py-spy on the H100 host: 41% of a segmentation
    loader's main thread for one mask a sample). Integer tensors over ``NARROW`` bytes whose values fit
    in uint8 (a mask made int64 by ToDtype) travel as uint8 and are made their dtype again on the
    device (``joint_masks.widened``). Every array travels C-ordered, so that it arrives so, and beside the
    pickle (``apart``): on the GPU a batch's small targets go to the device in one copy (``pickled.load_to_device``),
    a large one from the worker's ring where it was written (``backends.arena``)."""

    NARROW = 1 << 16
    apart = 0  # every array beside the pickle: a batch's go to the device in one copy (``pickled.load_to_device``)

    def reducer_override(self, obj):
        if isinstance(obj, torch.Tensor) and (type(obj) is torch.Tensor or isinstance(obj, tv_tensors.TVTensor)) \
                and obj.device.type == "cpu" and not obj.requires_grad:
            attributes = dict(obj.__dict__)
            if obj.numel() * obj.element_size() > self.NARROW and _fits_uint8(obj):
                attributes[joint_masks.WIDEN] = obj.dtype
                return _tensor, (type(obj), np.ascontiguousarray(obj.to(torch.uint8).numpy()), attributes)
            try:
                array = obj.numpy()
            except (RuntimeError, TypeError):  # a dtype NumPy lacks (bfloat16), a conjugate view
                return NotImplemented
            # C-ordered here, in the worker: a strided mask (a gather's view) would arrive as NumPy pickled
            # it, in its own order, and the main thread's one copy into pinned memory would first copy it
            # byte by byte to flatten it (py-spy --native on the H100 host: 36% of the segmentation
            # loader's main thread)
            return _tensor, (type(obj), np.ascontiguousarray(array), attributes)
        return NotImplemented


def _fits_uint8(t: torch.Tensor) -> bool:
    """An integer tensor wider than uint8 (a segmentation mask made int64 by ToDtype) whose values all fit
    in uint8: it travels as uint8 (an eighth of the bytes: a 480x480 int64 mask is 1.8 MB)."""
    if t.dtype in (torch.uint8, torch.bool) or t.dtype.is_floating_point or t.dtype.is_complex or not t.numel():
        return False
    low, high = torch.aminmax(t)
    return bool(low >= 0) and bool(high <= 255)


def _target_made(target_of, k, img, i: int, path: str, named: str):
    """Sample ``i``'s target (``target_of(k, img)``), or BadTargetError where it cannot be made (its mask or annotation
    file unreadable, torchvision's wrapper refusing it): the sample is skipped with ``on_error="skip"``, else
    torchvision's exception is raised with the sample, its image and the target's file named (``named``)."""
    try:
        return target_of(k, img)
    except files.BadSampleError:
        raise
    except Exception as e:  # noqa: BLE001 - whatever torchvision's dataset or wrapper raises there
        raising = naming_sample(e, i, named)
        raise BadTargetError(i, path, f"its target cannot be made ({named}: {type(e).__name__}: {e})",
                             raising if raising is not None else e) from e


def _raise_named(err: Exception, i: int, path: str):
    """Raise torchvision's exception for sample ``i`` again with the sample named (``naming_sample``); as it
    was where its type takes other arguments."""
    named = naming_sample(err, i, path)
    if named is None:
        raise err
    raise named from err


def _chunk_reader(joint, kind: str, program, shape, paths: list, targets: list, target_of, gpu: bool,
                  check_jpeg_scan: bool, lazy: list):
    """A recorded reader's ``many``: a worker's chunk of (index, seed) recorded together (``joint_vector``).
    ``lazy[0]``: the masks are recorded (``DetectionSamples.lazy_masks``, until a sample's cannot be): a chunk
    whose targets are masks is carried, a class of the user's own recorded in it sample by sample."""

    def many(chunk: list) -> list:
        """``read`` of each (index, seed[, True: its file decoded by PIL]) of a worker's chunk, recorded together
        where ``joint_vector`` carries them, each from its seed; None for a sample it leaves (read one by one,
        where its file or target is named if bad)."""
        if tud.get_worker_info() is not None:  # a worker process only records: the kernels stay swapped (a class
            recorded.keep_recording()  # of the user's is recorded through them in a chunk too)
        masks = lazy[0]
        steps = joint_vector.plan(joint, vector_of, _users_class if masks else None, kind)
        if steps is None:
            return [None] * len(chunk)
        masks_only = any(v is joint_vector.PER_SAMPLE for _, v in steps)  # (a class of the user's: chunks of masks)
        read_in = []
        for i, _, *pil in chunk:
            read_in.append(_read_in(i, paths[i], targets[i], target_of, gpu, check_jpeg_scan, bool(pil)))
            if masks_only and len(read_in) == 1 and read_in[0] is not None and \
                    type(read_in[0][2]) is not tv_tensors.Mask:
                return [None] * len(chunk)  # (left before the others' files are read)
        seeds = [item[1] for item, got in zip(chunk, read_in) if got is not None]
        ok = [got for got in read_in if got is not None]
        records = iter(joint_vector.record(steps, kind, [got[1] for got in ok], [got[2] for got in ok],
                                           joint_vector.uniforms(seeds, sum(v.draws for _, v in steps)),
                                           masks=masks))
        out: list = []
        for (i, *_), got in zip(chunk, read_in):
            done = next(records) if got is not None else None
            row = program.row(done[0], got[1]) if done is not None else None
            if row is None:
                out.append(None)
                continue
            target = done[1] if shape is None else around(shape, targets[i], None, done[1])
            out.append(((got[0], row), (done[2], target)))
        # the chunk's targets as one table that travels once (each sample's extra a part of it), else each pickled
        table = pickled.Targets.of([o[1][1] for o in out if o is not None])
        k = 0
        for j, o in enumerate(out):
            if o is not None:
                out[j] = (o[0], (o[1][0], pickled.Part(table, k) if table is not None else _pickled(o[1][1])))
                k += 1
        return out

    return many


def _read_in(i: int, path: str, k, target_of, gpu: bool, check_jpeg_scan: bool, pil: bool) -> Optional[tuple]:
    """Sample ``i``'s encoded file (``pil``: decoded by PIL, losslessly for the graph), its size (h, w) and its
    target before the transform; None where any of them fails (the sample is then read one by one, which names
    it)."""
    try:
        data = files.read_sample(i, path)
        encoded = files.bytes_decoded_by_pil(i, path, data) if pil else \
            files.prepare_bytes(i, path, data, small_jpegs_via_pil=gpu, check_jpeg_scan=check_jpeg_scan)
        img = files.pil_open(data, i, path)
        return encoded, (img.height, img.width), target_of(k, img)
    except Exception:  # noqa: BLE001 - named or raised as torchvision raises it when read one by one
        return None


@functools.lru_cache(maxsize=1)
def _placeholder() -> np.ndarray:
    """What the graph decodes in place of a sample that ran as written (its output is not used): 1x1 black."""
    return files.bmp_of(np.zeros((1, 1, 3), dtype=np.uint8))


def _as_written(joint, kind: str, shape, i: int, path: str, data: bytes, k, target, named: Optional[str] = None):
    """Sample ``i`` run as written on the pixels PIL decodes from ``data`` (``target()`` makes its target);
    its own error, if it has one, raised as torchvision raises it, with the file named (``named``: the image's
    and its target's)."""
    image = files.pil_rgb(i, path, data)
    if kind != "pil":
        image = torch.from_numpy(np.asarray(image)).permute(2, 0, 1)
    try:
        out = joint(tv_tensors.Image(image) if kind == "image" else image, target())
    except Exception as err:  # noqa: BLE001 - torchvision's (or the user's) error, the file named
        _raise_named(err, i, named or path)
    return out if shape is None else around(shape, k, *out)


def _pickled(target) -> Pickled:
    return _TargetPickler.dumps(target)


#: joint transforms whose per-sample cost in the main thread exceeds what torch's worker processes
#: spread over many cores (benchmarks/detection.py on the H100 host: docs/performance.md)
_HEAVY = {"RandomIoUCrop", "RandomZoomOut", "RandomPhotometricDistort"}
#: from how many workers torch's DataLoader runs a chain with one of ``_HEAVY`` faster than the main
#: thread after the graph: per worker the ssd preset ran 10 img/s and ssdlite 29 on that host, against
#: 60-69 and 98 here (the crossovers: 6-7 and 3-4 workers; the references default to 4)
WORKERS_FASTER = 8


#: what torchvision's kernels do to each tv_tensor type, by transform (explain()): colour transforms
#: touch only the image, geometric ones move every type (masks with nearest-neighbour, boxes by the
#: same parameters), the box-only ones only boxes
_COLOUR = {"ColorJitter", "RandomPhotometricDistort", "RandomGrayscale", "Grayscale", "GaussianBlur", "GaussianNoise",
           "RandomAutocontrast", "RandomEqualize", "RandomInvert", "RandomPosterize", "RandomSolarize",
           "RandomAdjustSharpness", "RandomChannelPermutation", "Normalize", "RandomErasing"}
_GEOMETRIC = {"RandomHorizontalFlip", "RandomVerticalFlip", "Resize", "RandomResize", "ScaleJitter",
              "RandomShortestSize", "RandomResizedCrop", "RandomCrop", "CenterCrop", "FixedSizeCrop", "RandomZoomOut",
              "RandomIoUCrop", "Pad", "RandomAffine", "RandomRotation", "RandomPerspective", "ElasticTransform"}
_BOXES_ONLY = {"ConvertBoundingBoxFormat": "format converted", "ClampBoundingBoxes": "clamped to the canvas"}


#: explain()'s line for a recorded step of the user's own (a class or a function)
_USER_EFFECTS = "yours: run as written on the stand-ins; each functional it calls recorded, the targets moved by it"


def _effects(name: str, types: list) -> str:
    """One line of explain(): what ``name`` does to each of ``types`` (tv_tensor class names)."""
    if name in _COLOUR:
        kept = [t for t in types if t != "Image"]
        return "Image: changed" + (f"; {', '.join(kept)}: unchanged" if kept else "")
    if name in _GEOMETRIC:
        return "; ".join({"Image": "Image: moved", "Mask": "Mask: moved (nearest-neighbour)",
                          "BoundingBoxes": "BoundingBoxes: moved by the same parameters"}.get(t, f"{t}: moved")
                         for t in types)
    if name in _BOXES_ONLY:
        return f"BoundingBoxes: {_BOXES_ONLY[name]}; others unchanged"
    if name == "SanitizeBoundingBoxes":
        return "BoundingBoxes: degenerate ones dropped, with their labels" + (" and masks" if "Mask" in types else "")
    if name == "ToDtype":
        return "each type to its dtype (Image scaled where scale=True)"
    if name in ("ToImage", "PILToTensor", "ToPureTensor"):
        return "type conversion"
    return "as torchvision's kernels for each type dispatch"


def is_detection(dataset) -> bool:
    """A torchvision v2 wrapper around one of ``KINDS`` (its class exactly: a subclass may read otherwise)."""
    return isinstance(dataset, adapters.wrapper_class()) and type(dataset._dataset) in KINDS


def _steps(joint) -> list:
    """The transforms a joint transform runs, in order, looked up through the containers that run their
    transforms one after the other (``_expanded``, nested: the segmentation reference's ``--use-v2`` joint is its
    own Compose of a class of its own and the preset, whose ``.transforms`` is a v2 Compose): for the check and
    for explain()."""
    out: list = []
    _walk(joint, out, 0)
    return out


def _walk(t, steps: list, depth: int) -> None:
    inner = _expanded(t) if depth < 8 else None
    if inner is None:
        steps.append(t)
        return
    for u in inner:
        _walk(u, steps, depth + 1)


def _expanded(t) -> Optional[list]:
    """What a container may run: a list; torchvision's ``Compose`` (v1 or v2), and its ``RandomApply``,
    ``RandomChoice`` and ``RandomOrder`` (the recording runs them as written, drawing which to run; the check
    looks at what they hold); ``StandardTransform``'s transform; an object that is no transform class of
    torchvision's and holds its steps in ``.transforms`` (the references' presets and their Compose classes).
    Anything else is a step."""
    import torchvision.transforms as v1
    from torchvision.transforms import v2

    if isinstance(t, (list, tuple)):
        return list(t)
    if type(t) is CalledWithOne:
        return [t.joint]
    if type(t) in (v2.Compose, v1.Compose, v2.RandomApply, v1.RandomApply, v2.RandomChoice, v1.RandomChoice,
                   v2.RandomOrder, v1.RandomOrder):
        return list(t.transforms)
    if type(t).__name__ == "StandardTransform":
        return [t.transform] if getattr(t, "transform", None) is not None else []
    inner = getattr(t, "transforms", None)
    if isinstance(t, v2.Transform) or inner is None:
        return None
    if type(inner) in (v2.Compose, v1.Compose) or isinstance(inner, (list, tuple)):
        return [inner]
    return None


def _first_conversion(joint) -> str:
    """What the joint transform is handed: "image" (it starts with ``ToImage``), "tensor" (with
    ``PILToTensor``) or "pil" (the PIL image torchvision's datasets hand it)."""
    from torchvision.transforms import v2

    steps = _steps(joint)
    first = steps[0] if steps else None
    if type(first) is v2.ToImage:
        return "image"
    if type(first) is v2.PILToTensor:
        return "tensor"
    return "pil"


class DetectionSamples(FileSamples):
    """Images of a wrapped CocoDetection: the graph decodes ``paths[i]``; ``target(i)`` is torchvision's
    wrapped target; ``items`` runs the joint transform per sample on the decoded image, or, where
    ``program`` is set, the transform is recorded per sample by ``reader`` (in torch's workers) and the
    graph runs ``program`` (``compiler.joint``)."""

    def __init__(self, ds, index: list, joint, kind: str, origin: str):
        paths, self.raw_target, target_files = KINDS[type(ds._dataset)](ds._dataset)
        self.made_target = coco_targets.maker(ds)  # (None: torchvision's wrapper makes every target)
        self.made_mask = mask_targets.maker(ds)  # (None: torchvision's wrapper opens every mask)
        # ``targets[i]``: sample i's index in the wrapped dataset, from which its target is made
        self._start(ds, [paths[k] for k in index], list(index), joint, kind, origin)
        self.target_files = target_files

    def _start(self, ds, paths: list, targets: list, joint, kind: str, origin: str) -> None:
        from torchvision.transforms import v2

        FileSamples.__init__(self, paths, targets, v2.PILToTensor(), None, origin)
        self.ds, self.joint, self.kind = ds, joint, kind
        self.program: Optional[recorded.JointProgram] = None
        #: how a user's __getitem__ calls its joint transform and returns around it, where it is not
        #: ``return self.transforms(image, target)`` (``discover.JointShape``); None for that
        self.shape: Optional[discover.JointShape] = None
        self.user_steps: list = []  # the joint transform's own classes of the user's, recorded after a probe
        self.lazy_masks = False  # masks recorded and made in one gather (compiler.joint_masks), after a probe
        self.target_files: Optional[list] = None  # each target's own file by target index (a mask, an XML)

    def record_with(self, program: recorded.JointProgram, origin: str) -> None:
        """Run the joint transform recorded, its pixel work in the graph as ``program``."""
        self.program, self.origin = program, origin
        self.plan_input = "joint"
        self.transform = program
        self.extras = True  # each sample's target comes with its inputs (feed.ProcessDecoders)

    def reader(self, *, gpu: bool, check_jpeg_scan: bool):
        if self.program is None:
            return super().reader(gpu=gpu, check_jpeg_scan=check_jpeg_scan)
        paths, program, joint, kind, target_of, targets = (self.paths, self.program, self.joint, self.kind,
                                                           self.target_of, self.targets)
        user = bool(self.user_steps)
        shape = self.shape
        target_files = self.target_files  # (named in an error with the image: a mask PIL cannot read, say)

        lazy = [self.lazy_masks]  # cleared in this process the first time a sample's masks cannot be

        def read(i: int, pil: bool = False):
            """(the encoded file, its row of parameters), (the output's type, the pickled target). ``pil``: the
            file decoded by PIL and handed to the graph losslessly (DALI failed on it, PIL decodes it)."""
            if tud.get_worker_info() is not None:  # a worker process only records: the kernels stay swapped
                recorded.keep_recording()
            path = paths[i]
            data = files.read_sample(i, path)
            encoded = files.bytes_decoded_by_pil(i, path, data) if pil else \
                files.prepare_bytes(i, path, data, small_jpegs_via_pil=gpu, check_jpeg_scan=check_jpeg_scan)
            # the header: the canvas size the wrapper asks of the image (and PIL's verdict on it: a file it
            # cannot open is named here, where torchvision's dataset raises; a JPEG's SOF marker alone is not)
            img = files.pil_open(data, i, path)
            k = targets[i]
            size = (img.height, img.width)
            named = path if target_files is None else f"{path}, its target {target_files[k]}"
            made = _target_made(target_of, k, img, i, path, named)
            state = torch.get_rng_state()
            try:
                try:  # the masks recorded too and made in one gather, or moved by torchvision's kernels
                    ops, target, out_kind = recorded.record(joint, size, made, kind, lazy_masks=lazy[0], users=user)
                except joint_masks.MaskUnrecordable:
                    lazy[0] = False
                    torch.set_rng_state(state)
                    ops, target, out_kind = recorded.record(joint, size, target_of(k, img), kind, users=user)
            except Exception as e:  # noqa: BLE001 - a user's class may fail on a stand-in: see below
                if not (isinstance(e, recorded.Unrecordable) or user):  # torchvision's own error (it raises it too)
                    _raise_named(e, i, named)
                # the sample runs as written, from the same RNG state, on the pixels PIL decodes. The graph gets
                # a 1x1 placeholder in its place (its output is left unused), not the file to decode again.
                torch.set_rng_state(state)
                out = _as_written(joint, kind, shape, i, path, data, k, lambda: target_of(k, img), named)
                return (_placeholder(), program.identity((1, 1))), ("ready", _pickled(out))
            row = program.row(ops, size)
            if row is None:  # the graph's structure cannot express it: torchvision's kernels on PIL's pixels
                image = recorded.replay(torch.from_numpy(
                    np.asarray(files.pil_rgb(i, path, data))).permute(2, 0, 1), ops)
                encoded = files.bmp_of(image.permute(1, 2, 0).contiguous().numpy())
                row = program.identity(tuple(image.shape[-2:]))
            if shape is not None:  # the sample as __getitem__ returns it, its image left out
                target = around(shape, k, None, target)
            return (encoded, row), (out_kind, _pickled(target))

        read.many = _chunk_reader(joint, kind, program, shape, paths, targets, target_of, gpu, check_jpeg_scan, lazy)
        return read

    def target(self, i: int):
        """torchvision's wrapped target of sample ``i`` (the wrapper reads only the image's size)."""
        k = self.targets[i]
        with Image.open(self.paths[i]) as img:  # the header: the canvas size the wrapper asks of the image
            return self.target_of(k, img)

    def target_of(self, k, img: Image.Image):
        """The target of the wrapped dataset's sample ``k`` whose image (its header) is ``img``: torchvision's
        wrapper makes it, or its restatement in ``coco_targets`` or ``mask_targets`` the same one."""
        if self.made_mask is not None:
            made = self.made_mask(k)
            if made is not None:
                return made
        raw = self.raw_target(k)
        if self.made_target is not None:
            made = self.made_target(k, raw, (img.height, img.width))
            if made is not None:
                return made
        return self.ds._wrapper(k, (img, raw))[1]

    def sample(self, image: torch.Tensor, i: int):
        """``dataset[i]`` from the decoded image: the joint transform run as written."""
        if self.kind == "image":
            image = tv_tensors.Image(image)
        if self.joint is None:
            return image, self.target(i)
        out = self.joint(image, self.target(i))
        return out if self.shape is None else around(self.shape, self.targets[i], *out)

    def items(self, images, indices, extras=None) -> list:
        if extras is not None:  # recorded: the targets came from the workers, the images from the graph
            # the targets (and the samples that ran as written) on the images' device together, before the
            # collate_fn: one copy (per dtype for what came through the rings), and a collate_fn that pads or
            # stacks masks does it there
            dev = images[0].device if len(images) else torch.device("cpu")
            # (loaded as they arrived where a worker's piece came through its ring, backends/arena.py; those
            # through torch's pipe, small ones, are loaded here: on the GPU straight to the device, together)
            # (a chunk's targets recorded at once come as one table: ``pickled.Targets``, loaded here at once)
            targets = pickled.resolve([target for _, target in extras], dev)
            if dev.type == "cuda":
                raw = [target for target in targets if isinstance(target, bytes)]
                loaded = iter(pickled.load_to_device(raw, dev) if raw else ())
                unpacked = [next(loaded) if isinstance(target, bytes) else target for target in targets]
                moved = all(isinstance(target, (bytes, pickled.Part)) for _, target in extras)
                unpacked = joint_masks.widened(unpacked if moved else to_device(unpacked, dev))
            else:
                unpacked = joint_masks.widened([pickled.load(target) if isinstance(target, bytes) else target
                                                for target in targets])
            if self.shape is not None:  # the image put where __getitem__ returns it
                place = self.shape.place
                return [sample if kind == "ready" else
                        discover.put(sample, place, tv_tensors.Image(img) if kind == "image" else img)
                        for img, (kind, _), sample in zip(images, extras, unpacked)]
            return [sample if kind == "ready" else (tv_tensors.Image(img) if kind == "image" else img, sample)
                    for img, (kind, _), sample in zip(images, extras, unpacked)]
        return [self.sample(img, i) for img, i in zip(images, indices)]

    def batch(self, images, labels, dev, indices, extras=None) -> Any:
        """What torch's default_collate makes of the items (it raises, as it does, for images of
        different sizes: detection loaders pass a collate_fn)."""
        items = self.items(images.unbind(0) if isinstance(images, torch.Tensor) else images, indices, extras)
        return to_device(default_collate(items), dev)

    def per_sample_note(self) -> Optional[str]:
        if self.joint is None or self.program is not None:
            return None
        names = [_step_name(t) for t in _steps(self.joint)]
        note = (f"{', '.join(names)} run(s) per sample on the decoded images with torchvision's kernels (boxes "
                "and masks follow the pixels as in torchvision; the graph decodes)")
        heavy = self._heavy()
        if heavy:
            note += (f"; {', '.join(heavy)} cost more in one thread than across {WORKERS_FASTER} or more worker "
                     f"processes: with num_workers >= {WORKERS_FASTER} this chain runs on torch's own DataLoader")
        return note

    def explain_lines(self) -> list:
        """What happens to each tv_tensor type at each step of the joint transform (explain())."""
        if self.joint is None or not len(self.paths):
            return []
        types = ["Image"] + sorted({type(v).__name__ for v in _leaves(self._a_target())
                                    if isinstance(v, tv_tensors.TVTensor) and not isinstance(v, tv_tensors.Image)})
        if self.program is not None:
            lines = [f"  joint transform, recorded per sample in torch's worker processes (torchvision draws the "
                     f"parameters and moves the targets; the graph moves the pixels), on {', '.join(types)}:"]
            if self.kind == "pil":
                lines.append("  (on PIL images, as the dataset hands them: recorded on a PIL image without pixels; the "
                             "graph's pixel arithmetic is torchvision's tensor kernels', which differ from its PIL "
                             "kernels' by torchvision's own difference: docs/datasets.md)")
            if self.user_steps:
                lines.append(f"  ({', '.join(self.user_steps)}: your own class(es) or function(s), recorded as they ran "
                             "on the first samples, whose records did not depend on the pixel values; a sample they "
                             "run otherwise on runs as written on the CPU)")
            if _one_pass(self.joint):
                lines.append("  (in one pass: every step is a class the pass restates, its boxes moved as NumPy; a "
                             "sample whose target it does not carry, such as masks or float64 boxes, is recorded "
                             "step by step: compiler/joint_chain.py)")
            if joint_vector.plan(self.joint, vector_of, _users_class if self.lazy_masks else None, self.kind) is not None:
                lines.append("  (with worker processes, each worker's chunk of samples at once: each sample's "
                             "parameters from its own seed, with torchvision's distributions, and the chunk's boxes "
                             "moved as one array or its masks each made in one gather"
                             + (", your own class(es) recorded sample by sample from a seed of the sample's" if
                                self.user_steps else "") + "; without workers, drawn from torch's RNG as torch's "
                             "DataLoader draws them: compiler/joint_vector.py)")
            if self.lazy_masks and "Mask" in types:
                lines.append("  (masks: recorded with the image, then each made in one gather of its source: every "
                             "crop, pad, flip and nearest resize at once, exactly torchvision's)")
        else:
            lines = [f"  joint transform, per sample after the graph's decode (torchvision's kernels; the image on "
                     f"the device, the target on the CPU), on {', '.join(types)}:"]
        width = max(len(_step_name(t)) for t in _steps(self.joint))
        yours = _user_steps(_steps(self.joint)) if self.program is not None else []
        lines += [f"    {_step_name(t):{width}s}  "
                  f"{_USER_EFFECTS if any(t is u for u in yours) else _effects(_step_name(t), types)}"
                  for t in _steps(self.joint)]
        return lines

    def _a_target(self):
        """The first of the first samples' targets that can be made (a bad file's cannot), for explain()."""
        for i in range(min(8, len(self.paths))):
            try:
                return self.target(i)
            except Exception:  # noqa: BLE001 - a bad file: its error is the loop's, when it is read
                continue
        return None

    def _heavy(self) -> list:
        return [n for n in (type(t).__name__ for t in _steps(self.joint)) if n in _HEAVY] if self.joint else []

    def faster_on_workers(self, num_workers: int) -> Optional[str]:
        if self.program is not None:
            return None
        heavy = self._heavy()
        if heavy and num_workers >= WORKERS_FASTER:
            return (f"{', '.join(heavy)} run per sample; in torch's {num_workers} worker processes they run faster "
                    "than in one thread after the graph's decode (H100 host, 16 workers: the ssd preset 161 img/s "
                    f"there against 60-69, ssdlite 462 against 98; fewer than {WORKERS_FASTER} workers keep the "
                    "GPU decode)")
        return None

    def select(self, indices) -> "DetectionSamples":
        out = DetectionSamples.__new__(DetectionSamples)
        out.__dict__.update(self.__dict__)
        idx = [int(i) for i in indices]
        out.paths = [self.paths[i] for i in idx]
        out.targets = [self.targets[i] for i in idx]
        return out


def resolve_detection(ds) -> DetectionSamples:
    joint = ds.transforms
    kind = _first_conversion(joint) if joint is not None else "tensor"
    names = [_step_name(t) for t in _steps(joint)] if joint is not None else []
    what = f"{len(ds)} images of {type(ds._dataset).__name__} decoded in the graph; torchvision's targets; the " \
           f"joint transform ({', '.join(names) or 'none'})"
    return _compiled(DetectionSamples(ds, range(len(ds)), joint, kind,
                                      f"{what} per sample on the decoded image with torchvision's kernels "
                                      "(datasets/detection.py)"), what)


def _compiled(samples: DetectionSamples, what: str) -> DetectionSamples:
    """The samples with their joint transform recorded, where it can be (else per sample after the graph)."""
    joint = samples.joint
    program = _program(samples)
    if program is None and samples.kind == "pil":  # not per sample after the graph: that has no PIL images
        raise NotCompilable(f"{type(samples.ds).__name__}'s joint transform augments PIL images and cannot be "
                            "recorded", _ADVICE)
    if program is not None:
        samples.user_steps = [_step_name(t) for t in _user_steps(_steps(joint))]
        samples.record_with(program, f"{what} recorded per sample, its pixel work in the graph "
                                     "(datasets/detection.py, compiler/joint.py)")
    return samples


class UserDetectionSamples(DetectionSamples):
    """A user's own detection Dataset (``discover.discover_joint``): the file each index opens and the target
    it makes, found once; the joint transform is the dataset's ``transforms``, recorded or run as for the
    wrapped datasets."""

    def __init__(self, ds, paths: list, made: Optional[list], joint, kind: str, origin: str,
                 shape: discover.JointShape):
        self._start(ds, list(paths), list(range(len(paths))), CalledWithOne(joint, shape.image_at) if shape.one
                    else joint, kind, origin)
        self.made = made  # None: it opens more files than the image (a mask), read when the sample is
        self.joint_shape = shape  # (as found: the targets made again are split by it)
        self.shape = shape if shape.one or shape.templates is not None else None

    def target_of(self, k, img: Image.Image):
        """Sample ``k``'s target as its ``__getitem__`` made it (a copy: a transform may change it in place),
        or makes it again (its image black, its other files read: ``discover.joint_target``)."""
        if self.made is None or self.made[k] is None:  # (None: a file PIL could not open when it was made)
            return discover.joint_target(self.ds, k, self.paths[k], self.joint_shape)
        return copy.deepcopy(self.made[k])

    def explain_lines(self) -> list:
        lines = DetectionSamples.explain_lines(self)
        shape = self.shape
        if shape is not None and lines:
            called = (f"on one {type(self._a_target()).__name__} holding the image at {_keys(shape.image_at)}"
                      if shape.one else "as (image, target)")
            lines.insert(1, f"  (__getitem__ calls the joint transform {called}; each sample is made as it returns "
                            f"it, the transformed image at {_keys(shape.place)}, the rest from the transform's "
                            "output and what __getitem__ adds)")
        return lines


class CalledWithOne:
    """A joint transform as a user's ``__getitem__`` calls it with one tuple, list or dict that holds the image
    (``transforms({"image": img, "boxes": ..., "labels": ...})``, ``transforms((img, target))``), called as the
    recording and the per-sample path call one: ``(image, rest)``, ``rest`` that structure with None in the
    image's place. It calls the transform as the user's code does (what v2 draws and does depends on that
    structure: its labels getter, which tensor is the image) and returns (the image it returns, the rest of
    what it returns, None in the image's place): a v2 transform returns the structure it is given."""

    def __init__(self, joint, image_at: tuple):
        self.joint, self.image_at = joint, image_at

    def __call__(self, image, rest):
        out = self.joint(discover.put(rest, self.image_at, image))
        return discover.get(out, self.image_at), discover.put(out, self.image_at, None)


def around(shape: discover.JointShape, k, image, rest):
    """Sample ``k`` as its ``__getitem__`` returns it, from its joint transform's output (``image``, ``rest``:
    the target, or for one structure the rest of it); ``image`` None leaves its place empty (the graph's
    image goes there in the main process)."""
    if shape.one:
        out = rest if image is None else discover.put(rest, shape.image_at, image)
    else:
        out = (image, rest)
    return discover.fill(shape.templates[k], out) if shape.templates is not None else out


def _keys(at: tuple) -> str:
    """A place in a structure as Python indexes it: ``["image"]``, ``[0]``."""
    return "".join(f"[{k!r}]" for k in at) or "the top"


def _leaves(x) -> list:
    """The values in ``x`` (down its tuples, lists and dicts)."""
    if type(x) in (tuple, list):
        return [v for y in x for v in _leaves(y)]
    if isinstance(x, dict):
        return [v for y in x.values() for v in _leaves(y)]
    return [x]


def is_user_detection(dataset) -> bool:
    """A user's own map-style Dataset with a torchvision v2 joint transform in ``transforms`` (a v2
    ``Compose``, or a class holding one, as the references' presets do) and none in ``transform``:
    ``__getitem__`` returns ``self.transforms(image, target)``."""
    from torchvision.transforms import v2

    joint = getattr(dataset, "transforms", None)
    return isinstance(dataset, tud.Dataset) and not isinstance(dataset, tud.IterableDataset) and \
        not type(dataset).__module__.startswith("torchvision.") and getattr(dataset, "transform", None) is None and \
        callable(joint) and any(isinstance(t, v2.Transform) for t in _steps(joint))


def resolve_user_detection(ds) -> FileSamples:
    joint = ds.transforms
    # torchvision's v2 all through: it returns the structure it is given (__getitem__ may pick from it, add to it)
    v2_only = all(type(t).__module__.startswith("torchvision.transforms.v2") for t in [joint] + _steps(joint))
    try:
        paths, targets, read_as, shape = discover.discover_joint(ds, fine=v2_only)
    except discover.NotJoint:  # a classification Dataset whose transform is named ``transforms``
        return adapters.resolve(ds)
    if shape.one and not v2_only:
        raise NotCompilable(f"{type(ds).__name__}.__getitem__ hands self.transforms one structure (a tuple, list or "
                            "dict holding the image), and not every step of it is torchvision's v2 class (what a "
                            "step of your own returns for a structure is yours)",
                            "to compile it, call self.transforms(image, target)")
    kind = read_as or _first_conversion(joint)  # (read_as: a tensor read by torchvision.io.read_image)
    names = [_step_name(t) for t in _steps(joint)]
    made = ("found once on black images of each file's size" if targets is not None else
            "made per sample as it reads them, its other files (masks) read and its image black of the file's size")
    what = f"{len(paths)} images of {type(ds).__name__} decoded in the graph; the targets its __getitem__ makes " \
           f"({made}: datasets/discover.py); the joint transform ({', '.join(names)})"
    return _compiled(UserDetectionSamples(ds, paths, targets, joint, kind,
                                          f"{what} per sample on the decoded image with torchvision's kernels "
                                          "(datasets/detection.py)", shape), what)


_RESIZES = ("Resize", "RandomResize", "ScaleJitter", "RandomShortestSize")
_PADS = ("RandomZoomOut", "RandomCrop", "Pad")
#: torchvision's classes that move no pixel of the image's geometry (conversions, colour, the value tail, the
#: boxes' bookkeeping)
_NO_GEOMETRY = ("ToImage", "PILToTensor", "ToDtype", "ToPureTensor", "ConvertBoundingBoxFormat", "ClampBoundingBoxes",
                "SanitizeBoundingBoxes", "Normalize", "RandomPhotometricDistort")


def _resizes_first(steps: list) -> bool:
    """Whether the chain resizes (each sample) before any other geometry: only torchvision's classes that move
    no geometry come before its first resizing class (a user's class or any other may move it)."""
    for t in steps:
        name = type(t).__name__
        if not type(t).__module__.startswith("torchvision."):
            return False
        if name in _RESIZES:
            return True
        if name not in _NO_GEOMETRY:
            return False
    return False


#: a target of more bytes than this, as a worker pickles it, makes the worker items smaller as masks do
#: (``feed.ProcessDecoders.CHUNK_LARGE``): two items of 32 such samples ahead would not fit a worker's ring
#: of shared memory (16 MB), and what does not fit goes through torch's pipe
LARGE_TARGET = 128 << 10


def _travels_large(target) -> bool:
    """Whether ``target`` (one sample's, before the transform) pickles to more than ``LARGE_TARGET`` bytes."""
    try:
        return len(_pickled(target)) > LARGE_TARGET
    except Exception:  # noqa: BLE001 - something that does not pickle: the worker's own error names it later
        return False


def _one_pass(joint) -> bool:
    """Whether the joint transform is (or holds as ``transforms``) a v2 Compose the one pass takes."""
    from torchvision.transforms import v2

    compose = joint if type(joint) is v2.Compose else getattr(joint, "transforms", None)
    return type(compose) is v2.Compose and joint_chain.plan_of(compose, chain_of) is not None


def _user_class(t) -> bool:
    """A transform class of the user's own (a ``v2.Transform`` defined outside torchvision: the references'
    ``PadIfSmaller``, say), or a function of the user's (the detection reference's ``--test-only --weights`` joint
    transform: ``lambda img, target: (trans(img), target)``, ``trans`` being ``weights.transforms()``), which may
    be recorded where a probe shows that it does not read the pixels."""
    function = _function_of(t)
    if function is not None:
        return not (function.__module__ or "").startswith("torchvision.")
    return _users_class(type(t))


def _users_class(cls: type) -> bool:
    """A transform class of the user's own (``_user_class``'s, of a class)."""
    from torchvision.transforms import v2

    return issubclass(cls, v2.Transform) and not cls.__module__.startswith("torchvision.")


def _function_of(t):
    """The function a step is (a ``functools.partial``'s own), or None for an object."""
    t = t.func if isinstance(t, functools.partial) else t
    return t if inspect.isfunction(t) else None


def _step_name(t) -> str:
    """A step's name for explain(): its class's, or a function's own."""
    function = _function_of(t)
    return function.__qualname__ if function is not None else type(t).__name__


def _user_steps(steps: list) -> list:
    """The steps recorded only after the pixel-blind probe: the user's own classes without a ``joint`` entry."""
    return [t for t in steps if not joint_ok(t) and _user_class(t)]


def _uint8_fill(fill, kind: str) -> tuple:
    """The uint8 values a pad writes for ``fill`` (PIL's kernel first truncates it to integers)."""
    return recorded.uint8_fill(joint_record.pil_fill(fill) if kind == "pil" else fill)


def _program(samples: DetectionSamples) -> Optional[recorded.JointProgram]:
    """The joint graph's structure for the samples' joint transform, where every step may be recorded
    (the registry's ``joint`` entries, or a user's own class whose recording on stand-ins of 0 and of 255
    agrees: ``recorded.pixel_blind``) and a recording of one sample works; else None (per sample after
    the graph)."""
    from torchvision.transforms.v2._utils import _get_fill

    joint, kind = samples.joint, samples.kind
    steps = _steps(joint) if joint is not None else []
    user = _user_steps(steps)
    if not steps or not all(joint_ok(t) or _user_class(t) for t in steps) or not len(samples):
        return None
    image_type = {"image": tv_tensors.Image, "pil": Image.Image}.get(kind, torch.Tensor)
    resizes = tuple((recorded.interp_name(t.interpolation), kind == "pil" or bool(getattr(t, "antialias", True)))
                    for t in steps if type(t).__name__ in _RESIZES)
    fills = [_uint8_fill(_get_fill(t._fill, image_type), kind) for t in steps
             if type(t).__name__ in _PADS and hasattr(t, "_fill")]
    program = recorded.JointProgram(colour=any(type(t).__name__ == "RandomPhotometricDistort" for t in steps),
                                    resizes=resizes, fill=fills[0] if fills else (0, 0, 0), tail=(),
                                    first_window=not _resizes_first(steps))
    for i in range(min(8, len(samples))):  # one sample recorded, for the value tail (ToDtype, Normalize)
        try:
            with torch.random.fork_rng(devices=[]), Image.open(samples.paths[i]) as img:
                k = samples.targets[i]

                def target():
                    return samples.target_of(k, img)

                size = (img.height, img.width)
                ops = (recorded.pixel_blind(joint, size, target, kind) if user else
                       recorded.record(joint, size, target(), kind))[0]
                samples.lazy_masks = recorded.masks_blind(joint, size, target, kind)
                whole = target()
                leaves = _leaves(whole)
                # (a sample's mask, or any target as large, travels beside its file: fewer samples per worker
                # item, feed.ProcessDecoders)
                samples.large_items = any(isinstance(v, tv_tensors.Mask) for v in leaves) or _travels_large(whole)
            tail = tuple(recorded.tail_op(name, a) for name, a, _ in ops if name in recorded.TAIL)
            recorded.affine_of(tail)
            program = dataclasses.replace(program.as_recorded(ops) if user else program, tail=tail)
            if recorded.lacks_a_filter(program):
                return None  # a filter DALI lacks (PIL's box or Hamming): as torchvision runs it, or raises
            return program
        except recorded.Unrecordable:
            return None
        except Exception:  # noqa: BLE001 - this sample's own error (no boxes, say): the next one
            continue
    return None
