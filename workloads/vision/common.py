"""What the image classifiers share: synthetic labelled images, the loss and the logits."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from workloads.base import Batch, Shape


def make_images(num_classes: int, shape: Shape, generator: torch.Generator) -> Batch:
    """Standard-normal pixels (what a normalised ImageNet batch looks like) and random labels."""
    size = shape.image_size
    pixels = torch.randn(shape.batch_size, 3, size, size, generator=generator)
    return {"pixels": pixels, "labels": torch.randint(0, num_classes, (shape.batch_size,), generator=generator)}


def classification_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    return F.cross_entropy(model(batch["pixels"]).float(), batch["labels"])


def logits(model: nn.Module, batch: Batch) -> torch.Tensor:
    return model(batch["pixels"])


def conv_flops(batch_size: int, out_size: int, in_channels: int, out_channels: int, kernel: int) -> int:
    """Forward FLOPs of a square convolution: 2 per multiply-add, one kernel window per output pixel."""
    return 2 * batch_size * out_size * out_size * out_channels * in_channels * kernel * kernel
