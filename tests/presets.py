"""The transform chains torchvision's classification references build (references/classification/
presets.py), rebuilt here from torchvision's public classes with the same structure: a wrapper
class of that name holding a Compose in ``.transforms``, v1 or v2 spellings."""
import torch
import torchvision.transforms as tv1
from torchvision.transforms import InterpolationMode
from torchvision.transforms import v2 as tv2


class ClassificationPresetTrain:
    def __init__(self, *, crop_size, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225),
                 interpolation=InterpolationMode.BILINEAR, hflip_prob=0.5, auto_augment_policy=None, ra_magnitude=9,
                 augmix_severity=3, random_erase_prob=0.0, use_v2=False):
        T = tv2 if use_v2 else tv1
        trans = [T.RandomResizedCrop(crop_size, interpolation=interpolation, antialias=True)]
        if hflip_prob > 0:
            trans.append(T.RandomHorizontalFlip(hflip_prob))
        if auto_augment_policy == "ra":
            trans.append(T.RandAugment(interpolation=interpolation, magnitude=ra_magnitude))
        elif auto_augment_policy == "ta_wide":
            trans.append(T.TrivialAugmentWide(interpolation=interpolation))
        elif auto_augment_policy == "augmix":
            trans.append(T.AugMix(interpolation=interpolation, severity=augmix_severity))
        elif auto_augment_policy is not None:
            trans.append(T.AutoAugment(policy=T.AutoAugmentPolicy(auto_augment_policy), interpolation=interpolation))
        trans.append(T.PILToTensor())
        trans += [T.ToDtype(torch.float, scale=True) if use_v2 else T.ConvertImageDtype(torch.float),
                  T.Normalize(mean=mean, std=std)]
        if random_erase_prob > 0:
            trans.append(T.RandomErasing(p=random_erase_prob))
        if use_v2:
            trans.append(T.ToPureTensor())
        self.transforms = T.Compose(trans)

    def __call__(self, img):
        return self.transforms(img)


class ClassificationPresetEval:
    def __init__(self, *, crop_size, resize_size=256, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225),
                 interpolation=InterpolationMode.BILINEAR, use_v2=False):
        T = tv2 if use_v2 else tv1
        trans = [T.Resize(resize_size, interpolation=interpolation, antialias=True), T.CenterCrop(crop_size),
                 T.PILToTensor(), T.ToDtype(torch.float, scale=True) if use_v2 else T.ConvertImageDtype(torch.float),
                 T.Normalize(mean=mean, std=std)]
        if use_v2:
            trans.append(T.ToPureTensor())
        self.transforms = T.Compose(trans)

    def __call__(self, img):
        return self.transforms(img)


class RASampler:
    """references/classification/sampler.py's repeated-augmentation sampler (--ra-sampler --ra-reps N),
    its arithmetic as written there: each index ``repetitions`` times, sharded, the first
    ``len(dataset) // 256 * 256 / num_replicas`` kept."""

    def __init__(self, dataset, num_replicas=1, rank=0, shuffle=True, seed=0, repetitions=3):
        import math

        self.dataset, self.num_replicas, self.rank, self.epoch = dataset, num_replicas, rank, 0
        self.num_samples = int(math.ceil(len(dataset) * float(repetitions) / num_replicas))
        self.total_size = self.num_samples * num_replicas
        self.num_selected_samples = int(math.floor(len(dataset) // 256 * 256 / num_replicas))
        self.shuffle, self.seed, self.repetitions = shuffle, seed, repetitions

    def __iter__(self):
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            indices = torch.randperm(len(self.dataset), generator=g).tolist()
        else:
            indices = list(range(len(self.dataset)))
        indices = [e for e in indices for _ in range(self.repetitions)]
        indices += indices[: (self.total_size - len(indices))]
        indices = indices[self.rank: self.total_size: self.num_replicas]
        return iter(indices[: self.num_selected_samples])

    def __len__(self):
        return self.num_selected_samples

    def set_epoch(self, epoch):
        self.epoch = epoch


#: the flag sets of torchvision's classification README (references/classification/README.md), as the
#: recipe's presets, sampler and collate read them: model -> (train crop, val resize, val crop,
#: interpolation, auto-augment, random erase, mixup alpha, cutmix alpha, ra-sampler reps)
PUBLISHED = {
    "resnet50-v2": (176, 232, 224, "bilinear", "ta_wide", 0.1, 0.2, 1.0, 4),
    "vit_b_16": (224, 256, 224, "bilinear", "ra", 0.0, 0.2, 1.0, 3),
    "swin_t": (224, 224, 224, "bicubic", "ta_wide", 0.25, 0.8, 1.0, 4),
    "maxvit_t": (224, 224, 224, "bicubic", "ta_wide", 0.0, 0.8, 1.0, 4),
    "efficientnet_v2_s": (300, 384, 384, "bilinear", "ta_wide", 0.1, 0.2, 1.0, 4),
    "regnet_y_16gf": (176, 232, 224, "bilinear", "ta_wide", 0.1, 0.2, 1.0, 4),
    "mobilenet_v3_large": (224, 256, 224, "bilinear", "imagenet", 0.2, 0.0, 0.0, 0),
    "convnext_tiny": (176, 232, 224, "bilinear", "ta_wide", 0.1, 0.2, 1.0, 4),
}


class DetectionPresetTrain:
    """references/detection/presets.py with ``use_v2=True`` (the v2 spelling the reference runs with
    ``--use-v2``): hflip, multiscale, ssd, ssdlite. (``lsj`` uses the reference's own v1
    FixedSizeCrop, which it notes does not work on tensors.)"""

    def __init__(self, *, data_augmentation, hflip_prob=0.5, mean=(123.0, 117.0, 104.0), backend="pil"):
        from collections import defaultdict

        from torchvision import tv_tensors
        from torchvision.transforms import v2 as T

        transforms = []
        if backend == "tv_tensor":
            transforms.append(T.ToImage())
        elif backend == "tensor":
            transforms.append(T.PILToTensor())
        if data_augmentation == "hflip":
            transforms += [T.RandomHorizontalFlip(p=hflip_prob)]
        elif data_augmentation == "multiscale":
            transforms += [T.RandomShortestSize(min_size=(480, 512, 544, 576, 608, 640, 672, 704, 736, 768, 800),
                                                max_size=1333), T.RandomHorizontalFlip(p=hflip_prob)]
        elif data_augmentation == "ssd":
            fill = defaultdict(lambda: mean, {tv_tensors.Mask: 0})
            transforms += [T.RandomPhotometricDistort(), T.RandomZoomOut(fill=fill), T.RandomIoUCrop(),
                           T.RandomHorizontalFlip(p=hflip_prob)]
        elif data_augmentation == "ssdlite":
            transforms += [T.RandomIoUCrop(), T.RandomHorizontalFlip(p=hflip_prob)]
        else:
            raise ValueError(data_augmentation)
        if backend == "pil":
            transforms += [T.ToImage()]
        transforms += [T.ToDtype(torch.float, scale=True), T.ConvertBoundingBoxFormat(tv_tensors.BoundingBoxFormat.XYXY),
                       T.SanitizeBoundingBoxes(), T.ToPureTensor()]
        self.transforms = T.Compose(transforms)

    def __call__(self, img, target):
        return self.transforms(img, target)


def detection_collate(batch):  # references/detection/utils.py collate_fn
    return tuple(zip(*batch))


class PadIfSmaller(tv2.Transform):
    """references/segmentation/v2_extras.py's PadIfSmaller (a user's own v2 class there): pads the right
    and bottom up to ``size``, with the fill per tv_tensor type."""

    def __init__(self, size, fill=0):
        super().__init__()
        self.size = size
        self.fill = tv2._utils._setup_fill_arg(fill)

    def make_params(self, flat_inputs):
        _, height, width = tv2._utils.query_chw(flat_inputs)
        padding = [0, 0, max(self.size - width, 0), max(self.size - height, 0)]
        return dict(padding=padding, needs_padding=any(padding))

    def transform(self, inpt, params):
        if not params["needs_padding"]:
            return inpt
        fill = tv2._utils._convert_fill_arg(tv2._utils._get_fill(self.fill, type(inpt)))
        return tv2.functional.pad(inpt, padding=params["padding"], fill=fill)


class SegmentationPresetTrain:
    """references/segmentation/presets.py with ``use_v2=True``: random resize, flip, PadIfSmaller (mask
    filled with 255), random crop, per-type dtypes, normalize."""

    def __init__(self, *, base_size, crop_size, hflip_prob=0.5, mean=(0.485, 0.456, 0.406),
                 std=(0.229, 0.224, 0.225), backend="tv_tensor"):
        from torchvision import tv_tensors
        from torchvision.transforms import v2 as T

        transforms = []
        if backend == "tv_tensor":
            transforms.append(T.ToImage())
        elif backend == "tensor":
            transforms.append(T.PILToTensor())
        transforms += [T.RandomResize(min_size=int(0.5 * base_size), max_size=int(2.0 * base_size))]
        if hflip_prob > 0:
            transforms += [T.RandomHorizontalFlip(hflip_prob)]
        transforms += [PadIfSmaller(crop_size, fill={tv_tensors.Mask: 255, "others": 0}), T.RandomCrop(crop_size)]
        if backend == "pil":
            transforms += [T.PILToTensor()]
        img_type = tv_tensors.Image if backend == "tv_tensor" else torch.Tensor
        transforms += [T.ToDtype(dtype={img_type: torch.float32, tv_tensors.Mask: torch.int64, "others": None},
                                 scale=True),
                       T.Normalize(mean=mean, std=std), T.ToPureTensor()]
        self.transforms = T.Compose(transforms)

    def __call__(self, img, target):
        return self.transforms(img, target)


class SegmentationPresetEval:
    """references/segmentation/presets.py's eval preset with ``use_v2=True``: a square resize, the
    conversion (after it on PIL images), float, normalize."""

    def __init__(self, *, base_size, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225), backend="pil"):
        from torchvision.transforms import v2 as T

        transforms = {"tensor": [T.PILToTensor()], "tv_tensor": [T.ToImage()], "pil": []}[backend]
        transforms += [T.Resize(size=(base_size, base_size))]
        if backend == "pil":
            transforms += [T.ToImage()]
        transforms += [T.ToDtype(torch.float, scale=True), T.Normalize(mean=mean, std=std), T.ToPureTensor()]
        self.transforms = T.Compose(transforms)

    def __call__(self, img, target):
        return self.transforms(img, target)


class CocoDetectionToVOCSegmentation(tv2.Transform):
    """references/segmentation/v2_extras.py's class of that name (a user's own v2 class there, restated): the
    wrapped CocoDetection's instance masks merged into one class mask (COCO's categories mapped to VOC's, the
    pixels of overlapping instances 255), or zeros of the image's size."""

    COCO_TO_VOC = dict(zip([0, 5, 2, 16, 9, 44, 6, 3, 17, 62, 21, 67, 18, 19, 4, 1, 64, 20, 63, 7, 72], range(21)))

    def forward(self, image, target):
        from torchvision import tv_tensors

        mask = None
        if "masks" in target:
            keep = [(i, self.COCO_TO_VOC[c]) for i, c in enumerate(target["labels"].tolist()) if c in self.COCO_TO_VOC]
            if keep:
                idx, voc = zip(*keep)
                masks = target["masks"][list(idx)].to(torch.uint8)
                mask, _ = (masks * torch.tensor(voc, dtype=torch.uint8).reshape(-1, 1, 1)).max(dim=0)
                mask[masks.sum(dim=0) > 1] = 255
        if mask is None:
            mask = torch.zeros(tv2.functional.get_size(image), dtype=torch.uint8)
        return image, tv_tensors.Mask(mask)


class ReferenceCompose:
    """references/segmentation/transforms.py's Compose (the joint steps one after the other)."""

    def __init__(self, transforms):
        self.transforms = transforms

    def __call__(self, image, target):
        for t in self.transforms:
            image, target = t(image, target)
        return image, target


def segmentation_coco(images: str, annotations: str, preset, train: bool = True):
    """references/segmentation/coco_utils.py's ``get_coco`` with ``use_v2=True``, restated: COCO as segmentation
    (the reference's only dataset with --use-v2), a wrapped CocoDetection of masks and labels, its own Compose of
    CocoDetectionToVOCSegmentation and the preset, and, for training, the images whose annotations of VOC's
    categories cover more than 1,000 pixels."""
    import torchvision

    ds = torchvision.datasets.CocoDetection(images, annotations,
                                            transforms=ReferenceCompose([CocoDetectionToVOCSegmentation(), preset]))
    ds = torchvision.datasets.wrap_dataset_for_transforms_v2(ds, target_keys={"masks", "labels"})
    if not train:
        return ds
    keep = [i for i, img_id in enumerate(ds.ids)
            if sum(a["area"] for a in ds.coco.loadAnns(ds.coco.getAnnIds(imgIds=img_id))
                   if a["category_id"] in CocoDetectionToVOCSegmentation.COCO_TO_VOC) > 1000]
    return torch.utils.data.Subset(ds, keep)


def segmentation_collate(batch):  # references/segmentation/utils.py collate_fn (cat_list)
    images, targets = list(zip(*batch))
    return _cat_list(images, 0), _cat_list(targets, 255)


def _cat_list(tensors, fill_value):
    max_size = tuple(max(s) for s in zip(*[t.shape for t in tensors]))
    out = tensors[0].new(*((len(tensors),) + max_size)).fill_(fill_value)
    for t, o in zip(tensors, out):
        o[..., : t.shape[-2], : t.shape[-1]].copy_(t)
    return out
