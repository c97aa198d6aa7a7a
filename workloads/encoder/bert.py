"""BERT (Devlin et al. 2018): a bidirectional post-LayerNorm transformer encoder.

The module is Hugging Face's ``BertModel`` in plain PyTorch: word, position and
token-type embeddings, post-LayerNorm blocks with an exact-GELU MLP, and the pooler, so
base and large have exactly the published 109,482,240 and 335,141,888 parameters.

Training is masked-language modelling as BERT pre-trains: 15% of the positions are
masked and only those are predicted. Their indices are a fixed-size tensor per batch
(BERT's ``max_predictions_per_seq``), so shapes stay static. The prediction head is the
word-embedding matrix, tied as in BERT, without BERT's extra transform layer (a d x d
dense and LayerNorm, about 0.5% of a forward) and output bias, so the trained model is
the published one and has no parameters beyond it. Inference runs the encoder and
returns its hidden states; the pooler (BertModel's sentence output for classification
heads) is part of the published model and its count but runs in neither mode.

Sequences are full length with no padding, as packed pre-training data is. There is no
dropout, so every backend computes the same function (``--verify`` compares the losses).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from workloads.attention import scores_bytes, sdpa
from workloads.base import ALLOCATOR_HEADROOM, Batch, ParallelPlan, Published, Shape, Workload

MASK_TOKEN = 103  # [MASK] in BERT's WordPiece vocabulary
MASKED_SHARE = 0.15


@dataclass(frozen=True)
class BertConfig:
    n_layer: int
    n_head: int
    d_model: int
    d_ff: int
    vocab_size: int = 30522
    max_seq_len: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12


SIZES = {
    "tiny": BertConfig(n_layer=2, n_head=4, d_model=64, d_ff=256, vocab_size=2048),
    "base": BertConfig(n_layer=12, n_head=12, d_model=768, d_ff=3072),
    "large": BertConfig(n_layer=24, n_head=16, d_model=1024, d_ff=4096),
}

_SOURCE = "Devlin et al. 2018; HF google-bert/bert-{}-uncased BertModel, pooler included"
PUBLISHED = {
    "base": Published(109_482_240, _SOURCE.format("base")),
    "large": Published(335_141_888, _SOURCE.format("large") + "; MLPerf bert"),
}


class Layer(nn.Module):
    """Post-LayerNorm: x = norm(x + attention(x)), then x = norm(x + MLP(x))."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.n_head = config.n_head
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model)
        self.proj = nn.Linear(config.d_model, config.d_model)
        self.norm1 = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.fc1 = nn.Linear(config.d_model, config.d_ff)
        self.fc2 = nn.Linear(config.d_ff, config.d_model)
        self.norm2 = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, dim = x.shape
        q, k, v = self.qkv(x).view(batch, seq, 3, self.n_head, dim // self.n_head).unbind(2)
        attended = sdpa(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))  # the run's kernel
        x = self.norm1(x + self.proj(attended.transpose(1, 2).reshape(batch, seq, dim)))
        return self.norm2(x + self.fc2(F.gelu(self.fc1(x))))


class Bert(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.word_embedding = nn.Embedding(config.vocab_size, config.d_model)
        self.position_embedding = nn.Embedding(config.max_seq_len, config.d_model)
        self.token_type_embedding = nn.Embedding(config.type_vocab_size, config.d_model)
        self.embedding_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.layers = nn.ModuleList(Layer(config) for _ in range(config.n_layer))
        self.pooler = nn.Linear(config.d_model, config.d_model)
        for module in self.modules():  # BERT's init: N(0, 0.02), zero biases
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear):
                nn.init.zeros_(module.bias)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Hidden states (B, S, d) of one-segment sequences (token type 0)."""
        positions = self.position_embedding.weight[: input_ids.shape[1]]
        x = self.word_embedding(input_ids) + positions + self.token_type_embedding.weight[0]
        x = self.embedding_norm(x)
        for layer in self.layers:
            x = layer(x)
        return x

    def pool(self, hidden: torch.Tensor) -> torch.Tensor:
        """BertModel's pooled output: tanh of a dense layer over the first ([CLS]) token."""
        return torch.tanh(self.pooler(hidden[:, 0]))

    def masked_logits(self, hidden: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Vocabulary logits (B, P, V) at ``positions`` (B, P), through the tied word embeddings."""
        picked = hidden.gather(1, positions.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))
        return picked @ self.word_embedding.weight.T


def masked_count(seq_len: int) -> int:
    """Predictions per sequence: 15% of the positions (BERT's max_predictions_per_seq: 19 at 128)."""
    return max(1, round(MASKED_SHARE * seq_len))


def make_batch(config: BertConfig, shape: Shape, generator: torch.Generator) -> Batch:
    """Random tokens with a random 15% of each sequence replaced by [MASK]; the labels are
    the tokens that were there."""
    batch, seq = shape.batch_size, shape.seq_len
    tokens = torch.randint(0, config.vocab_size, (batch, seq), generator=generator)
    positions = torch.rand(batch, seq, generator=generator).argsort(dim=1)[:, : masked_count(seq)]
    return {
        "input_ids": tokens.scatter(1, positions, MASK_TOKEN),
        "masked_positions": positions,
        "masked_labels": tokens.gather(1, positions),
    }


def masked_lm_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    logits = model.masked_logits(model(batch["input_ids"]), batch["masked_positions"])
    return F.cross_entropy(logits.flatten(0, 1).float(), batch["masked_labels"].flatten())


def hidden_states(model: nn.Module, batch: Batch) -> torch.Tensor:
    return model(batch["input_ids"])


def flops(config: BertConfig, shape: Shape, mode: str) -> float:
    """Every projection, and QK^T and AV over the full S x S, 2 FLOPs per multiply-add;
    train adds the masked positions' vocabulary projection, and its backward costs twice
    its forward. Embedding lookups, LayerNorm and softmax are not counted, as in
    ``flop_counter``."""
    batch, seq, d = shape.batch_size, shape.seq_len, config.d_model
    layer = 2 * batch * seq * (4 * d * d + 2 * d * config.d_ff) + 4 * batch * seq * seq * d
    encoder = config.n_layer * layer
    if mode != "train":
        return float(encoder)
    return float(3 * (encoder + 2 * batch * masked_count(seq) * d * config.vocab_size))


def parameter_count(config: BertConfig) -> int:
    d = config.d_model
    embeddings = (config.vocab_size + config.max_seq_len + config.type_vocab_size + 2) * d
    layer = 4 * d * d + 2 * d * config.d_ff + 9 * d + config.d_ff  # weights, biases, two LayerNorms
    return embeddings + config.n_layer * layer + d * d + d


def estimate_memory_bytes(config: BertConfig, shape: Shape, mode: str, dtype: torch.dtype) -> int:
    """The tensors a run holds at its peak (``Workload.memory_bytes`` adds the runtime),
    so that runs that cannot fit are refused
    (checked against measured CPU peaks in the tests). Train keeps weights, gradients, two
    AdamW moments and the optimizer's temporary (five copies; without the fifth, base
    trained at 2,192 MiB against an estimate of 2,228), every layer's activations for
    backward (about 10 d + 2 d_ff values per token, and the S x S scores per head in and
    out of the softmax where the kernel holds them, a log-sum-exp where it is fused:
    :func:`workloads.attention.scores_bytes`) and the masked positions' float32
    logits three times (logits, softmax, gradient). Inference keeps the weights and one
    layer's activations.
    """
    element = torch.finfo(dtype).bits // 8
    batch, seq = shape.batch_size, shape.seq_len
    scores = scores_bytes(batch, config.n_head, seq, seq, element, copies=2)
    layer = batch * seq * (10 * config.d_model + 2 * config.d_ff) * element + scores
    weights = parameter_count(config) * element
    if mode == "train":
        logits = 3 * batch * masked_count(seq) * config.vocab_size * 4
        needed = 5 * weights + config.n_layer * layer + logits
    else:
        needed = weights + layer
    return int(needed * ALLOCATOR_HEADROOM)


WORKLOAD = Workload(
    parallel=ParallelPlan(fsdp_units=("layers.*",)),  # FSDP units; no tensor-parallel plan
    name="bert",
    suites=("encoder",),
    family="bert",
    description="BERT encoder: post-LayerNorm, GELU MLP; masked-LM training with a tied head, encoder inference",
    sizes=SIZES,
    default_size="tiny",
    default_shape={"cpu": Shape(4, seq_len=128), "cuda": Shape(32, seq_len=512), "tpu": Shape(32, seq_len=512)},
    build_model=Bert,
    make_batch=make_batch,
    loss=masked_lm_loss,
    forward=hidden_states,
    flops=flops,
    estimate_memory_bytes=estimate_memory_bytes,
    dims=("seq_len",),
    max_seq_len=lambda config: config.max_seq_len,
    published=PUBLISHED,
    size_suites={"large": ("mlperf",)},  # MLPerf Inference bert (SQuAD) and Training BERT-large until v5.0
)
