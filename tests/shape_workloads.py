"""Test-only workloads whose input is an image or a latent, not a sequence.

They prove the plumbing of named dimensions (``Shape.image_size``, ``Shape.latent_size``)
end to end: planning and sweeps, the worker, the store, compare, ``--resume``, the summary
and the dashboard. Registered through ``TPUBENCH_WORKLOAD_MODULES=shape_workloads`` (see
conftest.py's ``shape_workloads`` fixture), so every worker process sees them too.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from workloads.base import Published, Shape, Workload

CLASSES = 10


class ToyConvNet(nn.Module):
    """One 3x3 convolution, global average pooling and a classifier: static shapes at any size."""

    def __init__(self, channels_in: int, width: int):
        super().__init__()
        self.conv = nn.Conv2d(channels_in, width, 3, padding=1)
        self.head = nn.Linear(width, CLASSES)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.head(F.relu(self.conv(pixels)).mean(dim=(2, 3)))


def _flops(channels_in: int, width: int, batch: int, side: int, mode: str) -> float:
    """2 per multiply-add: the convolution at every pixel, then the classifier; train = 3 x forward."""
    forward = 2 * batch * (side * side * channels_in * 9 * width + width * CLASSES)
    return float(3 * forward if mode == "train" else forward)


def _memory(width: int, batch: int, side: int, mode: str, dtype: torch.dtype) -> int:
    """Activations at a few copies of (B, width, side, side) plus weights; generous (tiny models)."""
    element = torch.finfo(dtype).bits // 8
    return int(1_000_000 + 8 * batch * width * side * side * element * (3 if mode == "train" else 1))


def _vision() -> Workload:
    return Workload(
        name="toy-vision",
        suites=("toys", "toy-images"),
        family="test",
        description="test-only: a one-convolution classifier on square images",
        sizes={"tiny": 8, "small": 16},
        default_size="tiny",
        default_shape={"cpu": Shape(2, image_size=16), "tpu": Shape(4, image_size=32)},
        build_model=lambda width: ToyConvNet(3, width),
        make_batch=lambda width, shape, generator: {
            "pixels": torch.randn(shape.batch_size, 3, shape.image_size, shape.image_size, generator=generator),
            "labels": torch.randint(0, CLASSES, (shape.batch_size,), generator=generator),
        },
        loss=lambda model, batch: F.cross_entropy(model(batch["pixels"]).float(), batch["labels"]),
        forward=lambda model, batch: model(batch["pixels"]),
        flops=lambda width, shape, mode: _flops(3, width, shape.batch_size, shape.image_size, mode),
        estimate_memory_bytes=lambda width, shape, mode, dtype: _memory(
            width, shape.batch_size, shape.image_size, mode, dtype
        ),
        dims=("image_size",),
        published={"small": Published(16 * 3 * 9 + 16 + 16 * CLASSES + CLASSES, "test-only: counted by hand")},
        size_suites={"small": ("toy-benchmark",)},
    )


def _latent() -> Workload:
    return Workload(
        name="toy-latent",
        suites=("toys",),
        family="test",
        description="test-only: the toy classifier on 4-channel latents (a diffusion model's input kind)",
        sizes={"tiny": 8},
        default_size="tiny",
        default_shape={"cpu": Shape(2, latent_size=4)},
        build_model=lambda width: ToyConvNet(4, width),
        make_batch=lambda width, shape, generator: {
            "pixels": torch.randn(shape.batch_size, 4, shape.latent_size, shape.latent_size, generator=generator),
            "labels": torch.randint(0, CLASSES, (shape.batch_size,), generator=generator),
        },
        loss=lambda model, batch: F.cross_entropy(model(batch["pixels"]).float(), batch["labels"]),
        forward=lambda model, batch: model(batch["pixels"]),
        flops=lambda width, shape, mode: _flops(4, width, shape.batch_size, shape.latent_size, mode),
        estimate_memory_bytes=lambda width, shape, mode, dtype: _memory(
            width, shape.batch_size, shape.latent_size, mode, dtype
        ),
        dims=("latent_size",),
    )


WORKLOADS = (_vision(), _latent())
