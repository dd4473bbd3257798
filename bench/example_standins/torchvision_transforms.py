"""A stand-in for `torchvision.transforms`, for bench/example_scripts.py: the eight transforms run_image_classification
uses, for PIL images, drawing the same random numbers from torch's global generator as torchvision's own
(RandomResizedCrop.get_params, RandomHorizontalFlip).

PyPI's torchvision is built against CUDA torch and its compiled ops fail to load beside the local CPU torch
(/work/shared/PEERS.md, "Vision"). bench/example_shim.py hands this module to the example script's own
`from torchvision.transforms import ...` (both Trainers alike); it is not on sys.path, so transformers still sees
no torchvision and keeps its PIL image processors.
"""

import math

import numpy as np
import torch
from PIL import Image


def _size(size):
    return (size, size) if isinstance(size, int) else tuple(size)


class Compose:
    def __init__(self, transforms):
        self.transforms = transforms

    def __call__(self, image):
        for transform in self.transforms:
            image = transform(image)
        return image


class Lambda:
    def __init__(self, function):
        self.function = function

    def __call__(self, image):
        return self.function(image)


class ToTensor:
    def __call__(self, image):
        array = np.array(image, np.uint8, copy=True)
        tensor = torch.from_numpy(array).view(image.size[1], image.size[0], len(image.getbands()))
        return tensor.permute((2, 0, 1)).contiguous().to(dtype=torch.get_default_dtype()).div(255)


class Normalize:
    def __init__(self, mean, std):
        self.mean, self.std = mean, std

    def __call__(self, tensor):
        mean = torch.as_tensor(self.mean, dtype=tensor.dtype).view(-1, 1, 1)
        std = torch.as_tensor(self.std, dtype=tensor.dtype).view(-1, 1, 1)
        return tensor.sub(mean).div(std)


class Resize:
    """A (height, width) size resizes to it; an int resizes the shorter edge to it (aspect kept)."""

    def __init__(self, size):
        self.size = size

    def __call__(self, image):
        width, height = image.size
        if isinstance(self.size, int):
            short, long = (width, height) if width <= height else (height, width)
            new_short, new_long = self.size, int(self.size * long / short)
            new_w, new_h = (new_short, new_long) if width <= height else (new_long, new_short)
        else:
            new_h, new_w = self.size
        return image.resize((new_w, new_h), Image.BILINEAR)


class CenterCrop:
    def __init__(self, size):
        self.size = _size(size)

    def __call__(self, image):
        crop_h, crop_w = self.size
        width, height = image.size
        top, left = int(round((height - crop_h) / 2.0)), int(round((width - crop_w) / 2.0))
        return image.crop((left, top, left + crop_w, top + crop_h))


class RandomHorizontalFlip:
    def __init__(self, p=0.5):
        self.p = p

    def __call__(self, image):
        return image.transpose(Image.FLIP_LEFT_RIGHT) if torch.rand(1) < self.p else image


class RandomResizedCrop:
    def __init__(self, size, scale=(0.08, 1.0), ratio=(3.0 / 4.0, 4.0 / 3.0)):
        self.size, self.scale, self.ratio = _size(size), scale, ratio

    def get_params(self, image):
        width, height = image.size
        area = height * width
        log_ratio = torch.log(torch.tensor(self.ratio))
        for _ in range(10):
            target_area = area * torch.empty(1).uniform_(self.scale[0], self.scale[1]).item()
            aspect_ratio = torch.exp(torch.empty(1).uniform_(log_ratio[0], log_ratio[1])).item()
            w = int(round(math.sqrt(target_area * aspect_ratio)))
            h = int(round(math.sqrt(target_area / aspect_ratio)))
            if 0 < w <= width and 0 < h <= height:
                i = torch.randint(0, height - h + 1, size=(1,)).item()
                j = torch.randint(0, width - w + 1, size=(1,)).item()
                return i, j, h, w
        in_ratio = float(width) / float(height)
        if in_ratio < min(self.ratio):
            w, h = width, int(round(width / min(self.ratio)))
        elif in_ratio > max(self.ratio):
            h, w = height, int(round(height * max(self.ratio)))
        else:
            w, h = width, height
        return (height - h) // 2, (width - w) // 2, h, w

    def __call__(self, image):
        i, j, h, w = self.get_params(image)
        out_h, out_w = self.size
        return image.crop((j, i, j + w, i + h)).resize((out_w, out_h), Image.BILINEAR)
