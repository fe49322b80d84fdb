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
