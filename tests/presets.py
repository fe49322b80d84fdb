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
