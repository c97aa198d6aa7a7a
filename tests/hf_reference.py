"""Hugging Face reference models for the same-model tests, and their weights in our names.

Each reference is built from a transformers config class (never a hub id; the tests run
with ``HF_HUB_OFFLINE=1``) at the dimensions of one of our configs, and its random
weights are renamed into our module's state dict: a separate q/k/v projection becomes our
fused ``qkv``. ``load_into`` then demands that every one of our tensors is assigned, so a
mapping that drops or invents a tensor fails rather than leaving a random weight in place.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable

import torch
from torch import nn

from workloads.encoder.bert import BertConfig
from workloads.vision.resnet import ResNetConfig
from workloads.vision.vit import ViTConfig

os.environ["HF_HUB_OFFLINE"] = "1"  # read when transformers is imported, in the builders below


def resnet(config: ResNetConfig) -> nn.Module:
    from transformers import ResNetConfig as HFConfig
    from transformers import ResNetForImageClassification

    hf = HFConfig(
        layer_type=config.block,
        embedding_size=config.stem_width,
        hidden_sizes=[width * config.expansion for width in config.widths],
        depths=list(config.depths),
        num_labels=config.num_classes,
    )
    return ResNetForImageClassification(hf)


def vit(config: ViTConfig) -> nn.Module:
    from transformers import ViTConfig as HFConfig
    from transformers import ViTForImageClassification

    hf = HFConfig(
        hidden_size=config.d_model,
        num_hidden_layers=config.n_layer,
        num_attention_heads=config.n_head,
        intermediate_size=config.d_ff,
        image_size=config.image_size,
        patch_size=config.patch_size,
        num_labels=config.num_classes,
        layer_norm_eps=config.layer_norm_eps,
    )
    return ViTForImageClassification(hf)


def bert(config: BertConfig) -> nn.Module:
    from transformers import BertConfig as HFConfig
    from transformers import BertModel

    hf = HFConfig(
        vocab_size=config.vocab_size,
        hidden_size=config.d_model,
        num_hidden_layers=config.n_layer,
        num_attention_heads=config.n_head,
        intermediate_size=config.d_ff,
        max_position_embeddings=config.max_seq_len,
        type_vocab_size=config.type_vocab_size,
        layer_norm_eps=config.layer_norm_eps,
    )
    return BertModel(hf)


Rules = list[tuple[str, Callable[[re.Match], str]]]

RESNET_NAMES: Rules = [  # torchvision numbers stages and convolutions from 1, Hugging Face from 0
    (r"resnet\.embedder\.embedder\.convolution\.", lambda m: "conv1."),
    (r"resnet\.embedder\.embedder\.normalization\.", lambda m: "bn1."),
    (
        r"resnet\.encoder\.stages\.(\d+)\.layers\.(\d+)\.shortcut\.(convolution|normalization)\.",
        lambda m: f"layer{int(m[1]) + 1}.{m[2]}.downsample.{int(m[3] == 'normalization')}.",
    ),
    (
        r"resnet\.encoder\.stages\.(\d+)\.layers\.(\d+)\.layer\.(\d+)\.(convolution|normalization)\.",
        lambda m: f"layer{int(m[1]) + 1}.{m[2]}.{'conv' if m[4] == 'convolution' else 'bn'}{int(m[3]) + 1}.",
    ),
    (r"classifier\.1\.", lambda m: "fc."),
]
VIT_NAMES: Rules = [
    (r"vit\.embeddings\.cls_token", lambda m: "class_token"),
    (r"vit\.embeddings\.position_embeddings", lambda m: "position_embedding"),
    (r"vit\.embeddings\.patch_embeddings\.projection\.", lambda m: "patch_embedding."),
    (r"vit\.layers\.(\d+)\.attention\.([qkv])_proj\.", lambda m: f"blocks.{m[1]}.qkv.{m[2]}:"),
    (r"vit\.layers\.(\d+)\.attention\.o_proj\.", lambda m: f"blocks.{m[1]}.proj."),
    (r"vit\.layers\.(\d+)\.layernorm_before\.", lambda m: f"blocks.{m[1]}.norm1."),
    (r"vit\.layers\.(\d+)\.layernorm_after\.", lambda m: f"blocks.{m[1]}.norm2."),
    (r"vit\.layers\.(\d+)\.mlp\.(fc[12])\.", lambda m: f"blocks.{m[1]}.{m[2]}."),
    (r"vit\.layernorm\.", lambda m: "norm."),
    (r"classifier\.", lambda m: "head."),
]
BERT_NAMES: Rules = [
    (r"embeddings\.word_embeddings\.", lambda m: "word_embedding."),
    (r"embeddings\.position_embeddings\.", lambda m: "position_embedding."),
    (r"embeddings\.token_type_embeddings\.", lambda m: "token_type_embedding."),
    (r"embeddings\.LayerNorm\.", lambda m: "embedding_norm."),
    (r"encoder\.layer\.(\d+)\.attention\.self\.(query|key|value)\.", lambda m: f"layers.{m[1]}.qkv.{m[2]}:"),
    (r"encoder\.layer\.(\d+)\.attention\.output\.dense\.", lambda m: f"layers.{m[1]}.proj."),
    (r"encoder\.layer\.(\d+)\.attention\.output\.LayerNorm\.", lambda m: f"layers.{m[1]}.norm1."),
    (r"encoder\.layer\.(\d+)\.intermediate\.dense\.", lambda m: f"layers.{m[1]}.fc1."),
    (r"encoder\.layer\.(\d+)\.output\.dense\.", lambda m: f"layers.{m[1]}.fc2."),
    (r"encoder\.layer\.(\d+)\.output\.LayerNorm\.", lambda m: f"layers.{m[1]}.norm2."),
    (r"pooler\.dense\.", lambda m: "pooler."),
]
FUSED_ORDER = {"q": 0, "k": 1, "v": 2, "query": 0, "key": 1, "value": 2}


def converted(reference: nn.Module, rules: Rules) -> dict[str, torch.Tensor]:
    """The reference's state dict in our names, q/k/v concatenated in that order into ``qkv``."""
    state: dict[str, torch.Tensor] = {}
    fused: dict[str, dict[int, torch.Tensor]] = {}
    for name, tensor in reference.state_dict().items():
        renamed = [rename(m) + name[m.end() :] for pattern, rename in rules if (m := re.match(pattern, name))]
        if not renamed:
            continue  # a buffer of the reference's own (position ids)
        ours = renamed[0]
        if ":" in ours:  # blocks.0.qkv.q:weight is one third of blocks.0.qkv.weight
            module, rest = ours.split(":")
            module, part = module.rsplit(".", 1)
            fused.setdefault(f"{module}.{rest}", {})[FUSED_ORDER[part]] = tensor
        else:
            state[ours] = tensor
    for name, parts in fused.items():
        state[name] = torch.cat([parts[0], parts[1], parts[2]])
    return state


def load_into(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Copy ``state`` into ``model``: every tensor of ours assigned, none left over."""
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not missing and not unexpected, (missing, unexpected)
