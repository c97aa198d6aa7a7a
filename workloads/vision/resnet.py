"""ResNet v1.5 (He et al. 2015), the convolutional image classifier MLPerf and torchvision use.

v1.5 puts a bottleneck's stride on its 3x3 convolution, not on the first 1x1 (the v1 of the
paper), as torchvision, Hugging Face ``ResNetForImageClassification`` and MLPerf's
resnet50-v1.5 do. Parameter names follow torchvision's (``layer1.0.conv1``...), so its
state dicts load directly. Sizes 18, 50, 101 and 152 have the published dimensions and
exactly the published parameter counts; ``tiny`` (one bottleneck per stage, narrow) is
for tests.

BatchNorm normalises with the batch's statistics in train mode and with its running
statistics in infer mode, as every ResNet benchmark does. Its work is elementwise, so,
like ReLU and pooling, it is not in the FLOPs (``torch.utils.flop_counter`` does not count
it either): only convolutions and the classifier are.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from workloads.base import ALLOCATOR_HEADROOM, ParallelPlan, Published, Shape, Workload
from workloads.vision.common import classification_loss, conv_flops, logits, make_images


@dataclass(frozen=True)
class ResNetConfig:
    block: str  # "basic" (two 3x3 convolutions: 18, 34) or "bottleneck" (1x1, 3x3, 1x1: 50 and deeper)
    depths: tuple[int, int, int, int]  # blocks per stage
    widths: tuple[int, int, int, int] = (64, 128, 256, 512)  # each stage's 3x3 channels
    stem_width: int = 64
    num_classes: int = 1000

    @property
    def expansion(self) -> int:
        """A bottleneck block's output has 4x its 3x3 width; a basic block's, 1x."""
        return 4 if self.block == "bottleneck" else 1


SIZES = {
    "tiny": ResNetConfig("bottleneck", (1, 1, 1, 1), widths=(16, 32, 64, 128), stem_width=16, num_classes=10),
    "18": ResNetConfig("basic", (2, 2, 2, 2)),
    "50": ResNetConfig("bottleneck", (3, 4, 6, 3)),
    "101": ResNetConfig("bottleneck", (3, 4, 23, 3)),
    "152": ResNetConfig("bottleneck", (3, 8, 36, 3)),
}

_SOURCE = "He et al. 2015 (v1.5); torchvision resnet{0}; HF microsoft/resnet-{0}"
PUBLISHED = {
    "18": Published(11_689_512, _SOURCE.format(18)),
    "50": Published(25_557_032, _SOURCE.format(50) + "; MLPerf resnet50-v1.5"),
    "101": Published(44_549_160, _SOURCE.format(101)),
    "152": Published(60_192_808, _SOURCE.format(152)),
}


def _downsampled(size: int) -> int:
    """A stride-2 layer's output side: 7x7 pad 3, 3x3 pad 1 and 1x1 pad 0 all give this."""
    return (size - 1) // 2 + 1


class Block(nn.Module):
    """A residual block: basic (3x3, 3x3) or bottleneck (1x1, 3x3 with the stride, 1x1)."""

    def __init__(self, config: ResNetConfig, in_channels: int, width: int, stride: int):
        super().__init__()
        out_channels = width * config.expansion
        if config.block == "bottleneck":
            shapes = [(in_channels, width, 1, 1), (width, width, 3, stride), (width, out_channels, 1, 1)]
        else:
            shapes = [(in_channels, width, 3, stride), (width, out_channels, 3, 1)]
        for i, (cin, cout, kernel, conv_stride) in enumerate(shapes, start=1):
            self.add_module(f"conv{i}", nn.Conv2d(cin, cout, kernel, conv_stride, padding=kernel // 2, bias=False))
            self.add_module(f"bn{i}", nn.BatchNorm2d(cout))
        self.depth = len(shapes)
        self.relu = nn.ReLU()
        self.downsample = None
        if stride != 1 or in_channels != out_channels:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride, bias=False), nn.BatchNorm2d(out_channels)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = x
        for i in range(1, self.depth + 1):
            out = getattr(self, f"bn{i}")(getattr(self, f"conv{i}")(out))
            if i < self.depth:
                out = self.relu(out)
        identity = x if self.downsample is None else self.downsample(x)
        return self.relu(out + identity)


class ResNet(nn.Module):
    def __init__(self, config: ResNetConfig):
        super().__init__()
        self.conv1 = nn.Conv2d(3, config.stem_width, 7, 2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(config.stem_width)
        self.relu = nn.ReLU()
        self.maxpool = nn.MaxPool2d(3, 2, padding=1)
        channels = config.stem_width
        for stage, (depth, width) in enumerate(zip(config.depths, config.widths, strict=True)):
            blocks = []
            for i in range(depth):
                stride = 2 if stage > 0 and i == 0 else 1
                blocks.append(Block(config, channels, width, stride))
                channels = width * config.expansion
            self.add_module(f"layer{stage + 1}", nn.Sequential(*blocks))
        self.fc = nn.Linear(channels, config.num_classes)
        for module in self.modules():
            if isinstance(module, nn.Conv2d):  # torchvision's init; BatchNorm starts at 1 and 0
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """Logits (B, classes) for images (B, 3, H, W), cast to the weights' dtype."""
        x = self.maxpool(self.relu(self.bn1(self.conv1(pixels.to(self.conv1.weight.dtype)))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(x.mean(dim=(2, 3)))  # global average pooling


def _layers(config: ResNetConfig, image_size: int) -> list[tuple[int, int, int, int]]:
    """(output side, in channels, out channels, kernel) of every convolution, the stem first."""
    size = _downsampled(image_size)
    layers = [(size, 3, config.stem_width, 7)]
    size, channels = _downsampled(size), config.stem_width  # the max pool
    for stage, (depth, width) in enumerate(zip(config.depths, config.widths, strict=True)):
        for i in range(depth):
            out = width * config.expansion
            in_size, size = size, _downsampled(size) if stage > 0 and i == 0 else size
            if config.block == "bottleneck":
                layers += [(in_size, channels, width, 1), (size, width, width, 3), (size, width, out, 1)]
            else:
                layers += [(size, channels, width, 3), (size, width, out, 3)]
            if size != in_size or channels != out:
                layers.append((size, channels, out, 1))
            channels = out
    return layers


def flops(config: ResNetConfig, shape: Shape, mode: str) -> float:
    """Convolutions and the classifier, 2 FLOPs per multiply-add.

    Train is the forward three times over less the stem's input gradient, which is never
    computed (the pixels need none); that is 1-6% of a forward, what ``flop_counter`` and
    the hardware see.
    """
    batch = shape.batch_size
    convs = [conv_flops(batch, size, cin, cout, k) for size, cin, cout, k in _layers(config, shape.image_size)]
    forward = sum(convs) + 2 * batch * config.widths[-1] * config.expansion * config.num_classes
    return float(3 * forward - convs[0] if mode == "train" else forward)


def parameter_count(config: ResNetConfig) -> int:
    """Convolution weights, BatchNorm scales and shifts, and the classifier."""
    convs = sum(cin * cout * k * k + 2 * cout for _, cin, cout, k in _layers(config, 224))
    return convs + (config.widths[-1] * config.expansion + 1) * config.num_classes


def estimate_memory_bytes(config: ResNetConfig, shape: Shape, mode: str, dtype: torch.dtype) -> int:
    """The tensors a run holds at its peak (``Workload.memory_bytes`` adds the runtime),
    so that runs that cannot fit are refused
    (``tests/test_workloads_vision_encoder.py`` checks it covers measured CPU peaks).

    Train keeps weights, gradients, two AdamW moments and the optimizer's temporary (five
    copies), every convolution's output 3.5 times over (BatchNorm's input, the ReLU's
    output, and their gradients in backward; measured: 3x at ResNet-50, 4x at tiny, whose
    wide stem weighs more) and the max pool's int64 indices. Inference frees each activation after the next layer,
    but CPU peaks still grew with about the sum of them all (1-1.7x): the estimate takes 2x.
    """
    element = torch.finfo(dtype).bits // 8
    batch = shape.batch_size
    outputs = sum(batch * cout * size * size for size, _, cout, _ in _layers(config, shape.image_size))
    pixels = batch * 3 * shape.image_size**2 * 4
    weights = parameter_count(config) * element
    if mode == "train":
        pool_indices = 8 * batch * config.stem_width * _downsampled(_downsampled(shape.image_size)) ** 2
        needed = 5 * weights + 3.5 * outputs * element + pool_indices
    else:
        needed = weights + 2 * outputs * element
    return int((needed + pixels) * ALLOCATOR_HEADROOM)


WORKLOAD = Workload(
    # FSDP units: each residual block; no tensor-parallel plan
    parallel=ParallelPlan(fsdp_units=("layer1.*", "layer2.*", "layer3.*", "layer4.*")),
    name="resnet",
    suites=("vision",),
    family="cnn",
    description="ResNet v1.5 image classifier: bottleneck convolutions, BatchNorm, ReLU (as torchvision)",
    sizes=SIZES,
    default_size="tiny",
    default_shape={
        "cpu": Shape(8, image_size=224),
        "cuda": Shape(128, image_size=224),
        "tpu": Shape(128, image_size=224),
    },
    build_model=ResNet,
    make_batch=lambda config, shape, generator: make_images(config.num_classes, shape, generator),
    loss=classification_loss,
    forward=logits,
    flops=flops,
    estimate_memory_bytes=estimate_memory_bytes,
    dims=("image_size",),
    published=PUBLISHED,
    size_suites={"50": ("mlperf",)},  # MLPerf Inference resnet50-v1.5 (and Training until v4.0)
    attention=False,
)
