"""Vision Transformer (Dosovitskiy et al. 2020): an image as a sequence of patches.

A strided convolution cuts the image into patches and embeds each; a class token and
learned positions are added, and pre-LayerNorm transformer blocks (GELU MLP) follow;
the classifier reads the class token. Sizes b16 and l16 are ViT-B/16 and ViT-L/16 at
224 px with the published dimensions, LayerNorm epsilon (1e-6) and parameter counts (as
torchvision's and Hugging Face's ``ViTForImageClassification``); ``tiny`` is for tests.

The position table has one entry per patch of the size's ``image_size``, so that is the
only image size a size takes (a different one would be a different model, with another
parameter count: ViT-B/16 at 384 px is). There is no dropout, as in the published
ImageNet-21k-to-1k models, so every backend computes the same function.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from workloads.base import ALLOCATOR_HEADROOM, Batch, ParallelPlan, Published, Shape, Workload
from workloads.vision.common import classification_loss, logits, make_images


@dataclass(frozen=True)
class ViTConfig:
    n_layer: int
    n_head: int
    d_model: int
    d_ff: int
    patch_size: int = 16
    image_size: int = 224
    num_classes: int = 1000
    layer_norm_eps: float = 1e-6

    @property
    def patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2


SIZES = {
    "tiny": ViTConfig(n_layer=2, n_head=4, d_model=64, d_ff=256, num_classes=10),
    "b16": ViTConfig(n_layer=12, n_head=12, d_model=768, d_ff=3072),
    "l16": ViTConfig(n_layer=24, n_head=16, d_model=1024, d_ff=4096),
}

_SOURCE = "Dosovitskiy et al. 2020; torchvision vit_{}_16; HF google/vit-{}-patch16-224"
PUBLISHED = {
    "b16": Published(86_567_656, _SOURCE.format("b", "base")),
    "l16": Published(304_326_632, _SOURCE.format("l", "large")),
}


class Block(nn.Module):
    """Pre-LayerNorm: x + attention(norm(x)), then x + MLP(norm(x))."""

    def __init__(self, config: ViTConfig):
        super().__init__()
        self.n_head = config.n_head
        self.norm1 = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model)
        self.proj = nn.Linear(config.d_model, config.d_model)
        self.norm2 = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.fc1 = nn.Linear(config.d_model, config.d_ff)
        self.fc2 = nn.Linear(config.d_ff, config.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, dim = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(batch, tokens, 3, self.n_head, dim // self.n_head).unbind(2)
        attended = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, tokens, dim))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class ViT(nn.Module):
    def __init__(self, config: ViTConfig):
        super().__init__()
        self.config = config
        self.patch_embedding = nn.Conv2d(3, config.d_model, config.patch_size, stride=config.patch_size)
        self.class_token = nn.Parameter(torch.zeros(1, 1, config.d_model))
        self.position_embedding = nn.Parameter(torch.empty(1, config.patches + 1, config.d_model))
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.head = nn.Linear(config.d_model, config.num_classes)
        for module in self.modules():  # N(0, 0.02) truncated at 2 std, zero biases (Hugging Face's init)
            if isinstance(module, (nn.Linear, nn.Conv2d)):
                nn.init.trunc_normal_(module.weight, std=0.02)
                nn.init.zeros_(module.bias)
        nn.init.trunc_normal_(self.position_embedding, std=0.02)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """Logits (B, classes) for images (B, 3, H, W) at the config's image size."""
        x = self.patch_embedding(pixels.to(self.patch_embedding.weight.dtype)).flatten(2).transpose(1, 2)
        x = torch.cat([self.class_token.expand(x.shape[0], -1, -1), x], dim=1) + self.position_embedding
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x[:, 0]))


def shape_error(config: ViTConfig, shape: Shape) -> str | None:
    """The position table has one entry per patch at the size's own resolution."""
    if shape.image_size != config.image_size:
        return f"vit takes --image-size {config.image_size} (its position table), not {shape.image_size}"
    return None


def make_batch(config: ViTConfig, shape: Shape, generator: torch.Generator) -> Batch:
    if error := shape_error(config, shape):
        raise ValueError(error)
    return make_images(config.num_classes, shape, generator)


def flops(config: ViTConfig, shape: Shape, mode: str) -> float:
    """The patch embedding, every projection, QK^T and AV over all tokens, and the classifier.

    2 FLOPs per multiply-add; train is three forwards less the patch embedding's input
    gradient, which is never computed (the pixels need none), as ``flop_counter`` counts.
    """
    batch, tokens, d = shape.batch_size, config.patches + 1, config.d_model
    patch_embedding = 2 * batch * config.patches * 3 * config.patch_size**2 * d
    layer = 2 * batch * tokens * (4 * d * d + 2 * d * config.d_ff) + 4 * batch * tokens * tokens * d
    forward = patch_embedding + config.n_layer * layer + 2 * batch * d * config.num_classes
    return float(3 * forward - patch_embedding if mode == "train" else forward)


def parameter_count(config: ViTConfig) -> int:
    d = config.d_model
    layer = 4 * d * d + 2 * d * config.d_ff + 9 * d + config.d_ff  # weights, biases, two LayerNorms
    embedding = (3 * config.patch_size**2 + 1) * d + (config.patches + 2) * d
    return embedding + config.n_layer * layer + 2 * d + (d + 1) * config.num_classes


def estimate_memory_bytes(config: ViTConfig, shape: Shape, mode: str, dtype: torch.dtype) -> int:
    """The tensors a run holds at its peak (``Workload.memory_bytes`` adds the runtime),
    so that runs that cannot fit are refused
    (checked against measured CPU peaks in the tests). Train keeps weights, gradients, two
    AdamW moments and the optimizer's temporary (five copies), and every block's
    activations for backward: about 10 d + 2 d_ff values per token, and the T x T scores
    per head, in and out of the softmax, where attention is not fused (XLA's). Inference
    keeps the weights and one block's activations.
    """
    element = torch.finfo(dtype).bits // 8
    batch, tokens = shape.batch_size, config.patches + 1
    block = batch * tokens * (10 * config.d_model + 2 * config.d_ff) + 2 * batch * config.n_head * tokens * tokens
    pixels = batch * 3 * shape.image_size**2 * 4
    weights = parameter_count(config) * element
    needed = 5 * weights + config.n_layer * block * element if mode == "train" else weights + block * element
    return int((needed + pixels) * ALLOCATOR_HEADROOM)


WORKLOAD = Workload(
    parallel=ParallelPlan(fsdp_units=("blocks.*",)),  # FSDP units; no tensor-parallel plan
    name="vit",
    suites=("vision",),
    family="vit",
    description="Vision Transformer: 16x16 patches, class token, pre-LayerNorm GELU blocks (as torchvision)",
    sizes=SIZES,
    default_size="tiny",
    default_shape={
        "cpu": Shape(4, image_size=224),
        "cuda": Shape(64, image_size=224),
        "tpu": Shape(64, image_size=224),
    },
    build_model=ViT,
    make_batch=make_batch,
    loss=classification_loss,
    forward=logits,
    flops=flops,
    estimate_memory_bytes=estimate_memory_bytes,
    dims=("image_size",),
    published=PUBLISHED,
    shape_error=shape_error,
)
