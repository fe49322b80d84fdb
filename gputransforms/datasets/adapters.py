"""Which files and targets a dataset stands for, without decoding anything: one table of adapters,
one row per dataset class.

The compiled loader needs, for every index ``i`` the sampler can draw, what ``dataset[i]`` would
open and return: the image file, the target (and the ``target_transform`` the dataset would apply
to it), and the transform chain. ``resolve(dataset)`` answers with a ``FileSamples`` or raises
``NotCompilable`` with a one-line reason the user can act on. Compositions (``Subset``,
``random_split``'s subsets, ``ConcatDataset``, nested in any order) map indices exactly as torch's
``__getitem__`` does, so targets follow pixels and repeated indices repeat.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Optional

import torch.utils.data as tud
import torchvision.datasets as tvd
from torchvision.datasets import DatasetFolder
from torchvision.datasets.folder import default_loader, pil_loader
from torchvision.datasets.vision import StandardTransform

from .. import _compat, files
from ..compiler import stages
from ..device import batched
from ..errors import NotCompilable  # noqa: F401 - adapters.NotCompilable, as before
from . import discover
from .imagelist import ImageList
from .inmemory import ARRAY_ADAPTERS
from .video import VIDEO_ADAPTERS


@dataclasses.dataclass
class FileSamples:
    """Index ``i`` of the dataset is ``transform(PIL.Image.open(paths[i]).convert("RGB"))`` and
    ``target_transforms[i](targets[i])`` (or ``targets[i]`` when ``target_transforms`` is None)."""

    paths: list
    targets: list
    transform: Any
    target_transforms: Optional[list] = None
    origin: str = ""  # how the files were found, for explain()
    #: what the dataset itself does with a bad sample ("raise", "skip"), or None: the loader's on_error
    on_error = None
    warn_skipped = True  # the epoch's skipped samples are reported in a SkippedSamplesWarning
    extras = False  # each sample gives something for the batch beside the graph's inputs (feed.ProcessDecoders)
    large_items = False  # what each sample gives is large (a recorded mask): fewer samples per worker item

    def __len__(self) -> int:
        return len(self.paths)

    def target(self, i: int):
        t = self.targets[i]
        if self.target_transforms is not None and self.target_transforms[i] is not None:
            t = self.target_transforms[i](t)
        return t

    def select(self, indices) -> "FileSamples":
        idx = [int(i) for i in indices]
        out = FileSamples([self.paths[i] for i in idx], [self.targets[i] for i in idx], self.transform,
                          None if self.target_transforms is None else [self.target_transforms[i] for i in idx],
                          self.origin)
        out.plan_input = self.plan_input  # (a Subset's files are read as the dataset reads them)
        return out

    # what the loader asks of any samples object (``datasets.video.ClipSamples`` answers the same)
    plan_input = "image"  # what the graph's first step decodes: compiler.plan.plan(..., input=plan_input)

    def num_inputs(self, gpu: bool) -> int:
        return 1  # the encoded file

    def reader(self, *, gpu: bool, check_jpeg_scan: bool) -> Callable[[int], Any]:
        """Sample index -> what the graph's external source takes for it (the encoded file), run in
        reader threads; raises ``files.BadSampleError`` naming the file."""
        paths = self.paths
        return lambda i: files.prepare(i, paths[i], small_jpegs_via_pil=gpu, check_jpeg_scan=check_jpeg_scan)

    def load(self, i: int):
        """What torchvision's transform receives for sample ``i`` (to find the sample DALI failed on)."""
        return pil_loader(self.paths[i])

    def decoded_by_pil(self, i: int):
        """Sample ``i`` decoded by PIL and handed to the graph losslessly (a file DALI failed on)."""
        return files.decoded_by_pil(i, self.paths[i])

    def batch(self, images, labels, dev, indices) -> list:
        """What the loop yields for a batch, as torch's default_collate would build it (a list, as it makes of
        (image, target) tuples)."""
        return [batched(images), labels]

    def items(self, images, indices) -> list:
        """What a user's collate_fn receives: dataset[i] for each index, images already transformed (and of
        torchvision's types: ``stages.as_made``)."""
        images = stages.as_made(images, self.item_kind())
        return list(zip(images, [_fresh(self.target(i)) for i in indices]))  # (_fresh: see ShapedSamples.items)

    def item_kind(self):
        """``stages.item_kind`` of this chain, worked out once per chain and input (not per batch)."""
        kept = getattr(self, "_item_kind", None)
        if kept is None or kept[0] is not self.transform or kept[1] != self.plan_input:
            kind = stages.item_kind(self.transform, self.plan_input)
            kept = self._item_kind = (self.transform, self.plan_input, kind)
        return kept[2]

    def per_sample_note(self) -> Optional[str]:
        """What of the dataset's own transform runs per sample after the graph (for the FallbackWarning),
        or None."""
        return None

    def explain_lines(self) -> list:
        """Lines explain() adds about what the dataset runs itself (a detection joint transform)."""
        return []

    def faster_on_workers(self, num_workers: int) -> Optional[str]:
        """Why torch's DataLoader with ``num_workers`` processes runs this dataset faster than the
        graph and the per-sample work after it, or None (the graph is faster, or nothing runs after it)."""
        return None


def _from_rows(ds, paths, targets) -> FileSamples:
    """What most datasets are: ``transform(loader(paths[i]))`` and ``target_transform(targets[i])``,
    compiled when the loader is PIL's RGB one (older torchvision datasets open files inline the same
    way) and no joint ``transforms`` was given."""
    loader = _compat.dataset_loader(ds)
    tensors = _is_torchvision_io_loader(loader)
    if loader not in (default_loader, pil_loader) and not tensors:
        raise NotCompilable(f"{type(ds).__name__} has a custom loader; DALI decodes only what PIL's RGB loader does "
                            "and torchvision.io's decode_image reads from an RGB file",
                            "to compile it, leave loader= at its default or give torchvision.io.decode_image")
    joint = getattr(ds, "transforms", None)
    if joint is not None and not isinstance(joint, StandardTransform):
        raise NotCompilable(f"{type(ds).__name__} was given a joint `transforms` (image and target together)",
                            "to compile the image chain, pass it as transform= and the target's as target_transform=")
    paths = [os.fspath(p) for p in paths]
    if tensors:
        bad = discover.first_not_rgb((p, p) for p in paths)
        if bad is not None:
            raise NotCompilable(f"{type(ds).__name__} reads its files with torchvision.io.{loader.__name__}, which "
                                f"gives {bad[0]} (mode {bad[1]}) other than 3 channels; the graph decodes RGB",
                                "to compile it, convert the files to RGB, or leave loader= at its default")
    out = FileSamples(paths, list(targets), ds.transform,
                      None if ds.target_transform is None else [ds.target_transform] * len(paths))
    if tensors:  # the transform is handed torchvision.io's uint8 (3, H, W) tensor, not a PIL image
        out.plan_input = "image tensor"
    return out


def _is_torchvision_io_loader(loader) -> bool:
    """``torchvision.io.decode_image`` or ``read_image`` as a dataset's ``loader`` (torchvision's v2 docs' way):
    the file as a uint8 (C, H, W) tensor, EXIF orientation not applied, as PIL's loader does not apply it. (Each
    file's header is read once when the loader is made: ``first_not_rgb``.)"""
    return any(loader is f for f in discover.IO_DECODERS)


def _pairs(ds, pairs) -> FileSamples:
    return _from_rows(ds, [p for p, _ in pairs], [t for _, t in pairs])


def _one_or_tuple(parts: list):
    return None if not parts else parts[0] if len(parts) == 1 else tuple(parts)


def _oxford_pet(ds) -> FileSamples:
    if "segmentation" in ds._target_types:
        raise NotCompilable("OxfordIIITPet: target_type 'segmentation' is an image, which the graph does not carry",
                            "to compile it, wrap it for torchvision's v2 transforms (wrap_dataset_for_transforms_v2: "
                            "the trimap becomes a tv_tensors.Mask, moved with the image by a joint transform), or use "
                            "target_type 'category' or 'binary-category'")
    columns = {"category": ds._labels, "binary-category": getattr(ds, "_bin_labels", None)}
    return _from_rows(ds, ds._images,
                      [_one_or_tuple([columns[t][i] for t in ds._target_types]) for i in range(len(ds._images))])


def _celeba(ds) -> FileSamples:
    # CelebA opens its files with PIL.Image.open and no convert("RGB"): they are RGB JPEGs, which
    # is what the graph decodes; its target_transform applies only to a non-empty target
    columns = {"attr": lambda i: ds.attr[i, :], "identity": lambda i: ds.identity[i, 0],
               "bbox": lambda i: ds.bbox[i, :], "landmarks": lambda i: ds.landmarks_align[i, :]}
    unknown = [t for t in ds.target_type if t not in columns]
    if unknown:
        raise NotCompilable(f"CelebA: target_type {unknown[0]!r}",
                            "to compile it, use target_type 'attr', 'identity', 'bbox' or 'landmarks'")
    n = len(ds.filename)
    targets = [_one_or_tuple([columns[t](i) for t in ds.target_type]) for i in range(n)]
    paths = [os.path.join(ds.root, ds.base_folder, "img_align_celeba", f) for f in ds.filename]
    return FileSamples(paths, targets, ds.transform,
                       None if ds.target_transform is None or not ds.target_type else [ds.target_transform] * n)


def _caltech101(ds) -> FileSamples:
    # Caltech opens its files with PIL.Image.open and no convert("RGB"): its few grayscale
    # JPEGs come out of the graph with 3 channels (torchvision's would have 1 and not batch)
    if "annotation" in ds.target_type:
        raise NotCompilable("Caltech101: target_type 'annotation' is read from a .mat file per sample",
                            "to compile it, use target_type 'category'")
    paths = [os.path.join(ds.root, "101_ObjectCategories", ds.categories[y], f"image_{k:04d}.jpg")
             for y, k in zip(ds.y, ds.index)]
    return _from_rows(ds, paths, ds.y)


def _caltech256(ds) -> FileSamples:
    paths = [os.path.join(ds.root, "256_ObjectCategories", ds.categories[y], f"{y + 1:03d}_{k:04d}.jpg")
             for y, k in zip(ds.y, ds.index)]
    return _from_rows(ds, paths, ds.y)


def _inaturalist(ds) -> FileSamples:
    paths = [os.path.join(ds.root, ds.all_categories[c], f) for c, f in ds.index]
    targets = [_one_or_tuple([c if t == "full" else ds.categories_map[c][t] for t in ds.target_type])
               for c, _ in ds.index]
    return _from_rows(ds, paths, targets)


def _subset(ds: tud.Subset) -> FileSamples:
    return resolve(ds.dataset).select(ds.indices)


def wrapper_class() -> type:
    """torchvision's ``wrap_dataset_for_transforms_v2`` wrapper (detection and segmentation datasets)."""
    from torchvision.tv_tensors._dataset_wrapper import VisionDatasetTVTensorWrapper

    return VisionDatasetTVTensorWrapper


def _concat(ds: tud.ConcatDataset) -> FileSamples:
    inner = [d.dataset if isinstance(d, tud.Subset) else d for d in ds.datasets]
    if any(isinstance(d, wrapper_class()) for d in inner):
        raise NotCompilable("ConcatDataset of detection or segmentation datasets",
                            "to compile them, give each dataset its own DataLoader")
    parts = [resolve(d) for d in ds.datasets]
    if not all(isinstance(p, FileSamples) for p in parts):
        raise NotCompilable("ConcatDataset of video or in-memory datasets",
                            "to compile them, give each dataset its own DataLoader")
    kinds = {(type(p), getattr(p, "place", None), p.plan_input) for p in parts}
    if len(kinds) > 1 or next(iter(kinds))[0] not in (FileSamples, ShapedSamples):
        raise NotCompilable("ConcatDataset of datasets whose samples differ in shape or in how they are read "
                            "(or Hugging Face tables)", "to compile them, give each dataset its own DataLoader")
    chain = parts[0].transform
    for k, p in enumerate(parts[1:], 1):
        if not same_chain(chain, p.transform):
            raise NotCompilable(f"ConcatDataset: part {k}'s transform differs from part 0's ({_short(p.transform)} vs "
                                f"{_short(chain)}); one compiled graph serves one chain",
                                "to compile it, give the parts the same Compose object")
    with_tt = any(p.target_transforms is not None for p in parts)
    kind, place, plan_input = next(iter(kinds))
    out = kind(
        [x for p in parts for x in p.paths], [x for p in parts for x in p.targets], chain,
        [x for p in parts for x in (p.target_transforms or [None] * len(p))] if with_tt else None,
        **({"place": place} if kind is ShapedSamples else {}))
    out.plan_input = plan_input
    return out


#: dataset class -> adapter; a subclass is served by its nearest listed base, unless it overrides
#: ``__getitem__`` (then what it returns is its own business, and it runs on torch's DataLoader)
def _image_files(ds) -> FileSamples:
    return _from_rows(ds, ds._image_files, ds._labels)


ADAPTERS: dict[type, Callable[[Any], FileSamples]] = {
    DatasetFolder: lambda ds: _pairs(ds, ds.samples),  # ImageFolder, EuroSAT, Country211, a user's DatasetFolder
    ImageList: lambda ds: _pairs(ds, ds.samples),
    tvd.Food101: _image_files,  # these five keep ``_image_files`` and ``_labels``
    tvd.Flowers102: _image_files,
    tvd.DTD: _image_files,
    tvd.FGVCAircraft: _image_files,
    tvd.SUN397: _image_files,
    tvd.StanfordCars: lambda ds: _pairs(ds, ds._samples),
    tvd.Imagenette: lambda ds: _pairs(ds, ds._samples),
    tvd.Places365: lambda ds: _pairs(ds, ds.imgs),
    tvd.OxfordIIITPet: _oxford_pet,
    tvd.CelebA: _celeba,
    tvd.Caltech101: _caltech101,
    tvd.Caltech256: _caltech256,
    tvd.INaturalist: _inaturalist,
    tud.Subset: _subset,
    tud.ConcatDataset: _concat,
    **VIDEO_ADAPTERS,  # Kinetics, UCF101, HMDB51: ClipSamples (datasets/video.py)
    **ARRAY_ADAPTERS,  # CIFAR, MNIST family, SVHN, STL10, TensorDataset: ArraySamples (datasets/inmemory.py)
}


def resolve(dataset) -> FileSamples:
    """The dataset's row in ``ADAPTERS``; else, for any other map-style dataset (a user's own, or a
    subclass whose ``__getitem__`` differs from its listed base's), what running its ``__getitem__``
    on a placeholder image shows (``discover.py``)."""
    name = type(dataset).__name__
    for cls in type(dataset).__mro__:
        adapter = ADAPTERS.get(cls)
        if adapter is None:
            continue
        if type(dataset).__getitem__ is cls.__getitem__:
            samples = adapter(dataset)
            samples.origin = samples.origin or f"{cls.__name__}'s files and targets (datasets/adapters.py)"
            return samples
        break
    if isinstance(dataset, tud.IterableDataset) or not hasattr(dataset, "__getitem__"):
        raise NotCompilable(f"{name} is an iterable dataset; only map-style datasets compile",
                            "to compile it, give the files and targets to gputransforms.datasets.ImageList")
    paths, targets, chain, plan_input, place = discover.discover(dataset)
    origin = (f"found by running {name}.__getitem__ on a placeholder image for each of its {len(paths)} indices "
              "(no file decoded; datasets/discover.py)")
    if place is not None:  # (explain(): where the image is in each sample)
        where = "".join(f"[{k!r}]" for k in place) or "the top"
        origin += f"; each sample as __getitem__ returns it, the image at {where}"
    out = FileSamples(paths, targets, chain, None, origin) if place is None else \
        ShapedSamples(paths, targets, chain, None, origin, place=place)
    out.plan_input = plan_input  # "image tensor": read with torchvision.io, the chain gets a uint8 (3, H, W) tensor
    return out


@dataclasses.dataclass
class ShapedSamples(FileSamples):
    """A user's Dataset whose ``__getitem__`` returns its transformed image inside another shape: a dict
    (``{"image": ..., "label": ..., "path": ...}``), a longer tuple (``(image, label, index)``), the image
    alone. ``targets[i]`` is that output as the probe saw it, with 0 where the image goes (``place``)."""

    place: tuple = ()

    def select(self, indices) -> "ShapedSamples":
        out = FileSamples.select(self, indices)
        shaped = ShapedSamples(out.paths, out.targets, out.transform, out.target_transforms, out.origin,
                               place=self.place)
        shaped.plan_input = out.plan_input
        return shaped

    def batch(self, images, labels, dev, indices):
        """default_collate's batch of the outputs: its batch of the rest (``labels``: the targets collated),
        with the images' batch in the image's place."""
        return discover.put(labels, self.place, batched(images))

    def items(self, images, indices) -> list:
        images = stages.as_made(images, self.item_kind())
        # (fresh containers for each item, as __getitem__ makes them: a collate_fn may change them in place)
        return [discover.put(_fresh(self.target(i)), self.place, img) for img, i in zip(images, indices)]


def _fresh(x):
    """``x`` with new dicts, lists and tuples all the way down (the values in them shared): ``discover.fill``
    of a structure that holds no marker."""
    return discover.fill(x, None)


def same_chain(a, b) -> bool:
    """Whether two transform chains mean the same: the same object, or equal reprs made only of
    classes whose repr shows all their arguments (a Lambda or a user object may hide a difference)."""
    if a is b:
        return True
    return repr(a) == repr(b) and not _opaque(a) and not _opaque(b)


def _opaque(t) -> bool:
    members = getattr(t, "transforms", None)
    if isinstance(members, (list, tuple)):
        return any(_opaque(m) for m in members)
    if members is not None:  # a wrapper such as the reference presets
        return _opaque(members)
    module = type(t).__module__
    return type(t).__name__ == "Lambda" or not module.startswith(("torchvision.", "timm.", "gputransforms."))


def _short(t) -> str:
    text = " ".join(repr(t).split())
    return text if len(text) <= 60 else text[:57] + "..."
