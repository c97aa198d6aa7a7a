"""Llama-3-style decoder: RMSNorm, rotary positions, SwiGLU and grouped-query attention.

Sizes use Meta's published Llama 3.x dimensions: 1b and 3b are Llama 3.2 (tied
embeddings), 8b is Llama 3.1. All share the 128256-token vocabulary and RoPE base 500000.
Llama 3.1's long-context frequency rescaling changes no shape or FLOP and is left out.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import nn

from workloads.base import Published, Shape
from workloads.llm import decoder
from workloads.llm.decoder import DecoderConfig

ROPE_THETA = 500_000.0
VOCAB = 128_256
CONTEXT = 131_072

# What every Llama 3 size shares; the sizes below differ only in depth and width.
llama3_config = partial(DecoderConfig, vocab_size=VOCAB, max_seq_len=CONTEXT, n_kv_head=8, gated_mlp=True)

SIZES = {
    # tiny is untied (the default), so that a random model does not just echo its last token
    "tiny": llama3_config(n_layer=2, n_head=4, n_kv_head=2, d_model=128, d_ff=384, vocab_size=2048),
    "1b": llama3_config(n_layer=16, n_head=32, d_model=2048, d_ff=8192, tied_embeddings=True),
    "3b": llama3_config(n_layer=28, n_head=24, d_model=3072, d_ff=8192, tied_embeddings=True),
    "8b": llama3_config(n_layer=32, n_head=32, d_model=4096, d_ff=14336),
}


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding on (B, H, S, D), pairing the two halves of the head dimension."""
    first, second = x.chunk(2, dim=-1)
    return torch.cat((first * cos - second * sin, second * cos + first * sin), dim=-1)


def rope_tables(
    positions: torch.Tensor, head_dim: int, dtype: torch.dtype, theta: float = ROPE_THETA
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin at ``positions`` for RoPE base ``theta``, computed in float32 then cast (bf16 angles drift)."""
    inverse = theta ** -(torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim)
    angles = torch.outer(positions.to(torch.float32), inverse)
    return angles.cos().to(dtype), angles.sin().to(dtype)


class Attention(nn.Module):
    def __init__(self, config: DecoderConfig, layer: int):
        super().__init__()
        self.layer = layer
        self.head_dim = config.head_dim
        self.q = nn.Linear(config.d_model, config.n_head * config.head_dim, bias=False)
        self.k = nn.Linear(config.d_model, config.kv_heads * config.head_dim, bias=False)
        self.v = nn.Linear(config.d_model, config.kv_heads * config.head_dim, bias=False)
        self.o = nn.Linear(config.n_head * config.head_dim, config.d_model, bias=False)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache: decoder.KVCache | None,
        positions: torch.Tensor | None,
    ) -> torch.Tensor:
        batch, seq, _ = x.shape
        # -1 heads: a tensor-parallel rank holds n_head / tp query and n_kv_head / tp KV heads
        q, k, v = (
            projection(x).view(batch, seq, -1, self.head_dim).transpose(1, 2) for projection in (self.q, self.k, self.v)
        )
        attended = decoder.attention(rotate(q, cos, sin), rotate(k, cos, sin), v, cache, self.layer, positions)
        return self.o(attended.transpose(1, 2).reshape(batch, seq, -1))


class SwiGLU(nn.Module):
    def __init__(self, config: DecoderConfig):
        super().__init__()
        self.gate = nn.Linear(config.d_model, config.d_ff, bias=False)
        self.up = nn.Linear(config.d_model, config.d_ff, bias=False)
        self.down = nn.Linear(config.d_ff, config.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(nn.functional.silu(self.gate(x)) * self.up(x))


class Block(nn.Module):
    def __init__(self, config: DecoderConfig, layer: int):
        super().__init__()
        self.attention_norm = nn.RMSNorm(config.d_model, eps=1e-5)
        self.attention = Attention(config, layer)
        self.ffn_norm = nn.RMSNorm(config.d_model, eps=1e-5)
        self.ffn = SwiGLU(config)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache: decoder.KVCache | None,
        positions: torch.Tensor | None,
    ) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin, cache, positions)
        return x + self.ffn(self.ffn_norm(x))


class Llama3(nn.Module):
    def __init__(self, config: DecoderConfig):
        super().__init__()
        self.head_dim = config.head_dim
        self.token_embedding = nn.Embedding(config.vocab_size, config.d_model)
        self.blocks = nn.ModuleList(Block(config, layer) for layer in range(config.n_layer))
        self.norm = nn.RMSNorm(config.d_model, eps=1e-5)
        self.lm_head = decoder.lm_head(config, self.token_embedding)
        self.apply(decoder.init_weights)

    def forward(
        self, input_ids: torch.Tensor, cache: decoder.KVCache | None = None, positions: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Logits for ``input_ids``; with a cache, the tokens sit at ``positions`` (see decoder.attention)."""
        x = self.token_embedding(input_ids)
        if positions is None:
            positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        cos, sin = rope_tables(positions, self.head_dim, x.dtype)
        for block in self.blocks:
            x = block(x, cos, sin, cache, positions)
        return self.lm_head(self.norm(x))


#: Meta's model cards (1.23B, 3.21B, 8.03B), exactly as Hugging Face's LlamaForCausalLM counts them
PUBLISHED = {
    "1b": Published(1_235_814_400, "Meta model card meta-llama/Llama-3.2-1B"),
    "3b": Published(3_212_749_824, "Meta model card meta-llama/Llama-3.2-3B"),
    "8b": Published(8_030_261_248, "Meta model card meta-llama/Llama-3.1-8B; MLPerf llama3.1_8b"),
}

WORKLOAD = decoder.decoder_workload(
    name="llama3",
    family="llama",
    description="Llama-3-style decoder: RMSNorm, RoPE, SwiGLU, grouped-query attention",
    sizes=SIZES,
    default_shape={"cpu": Shape(4, 128), "cuda": Shape(4, 2048), "tpu": Shape(4, 2048)},
    build_model=Llama3,
    published=PUBLISHED,
    size_suites={"8b": ("mlperf",)},  # MLPerf Training llama3.1_8b and Inference llama3.1-8b
    parallel=decoder.decoder_plan(
        tp={
            "blocks.*.attention.q": "colwise",
            "blocks.*.attention.k": "colwise",
            "blocks.*.attention.v": "colwise",
            "blocks.*.attention.o": "rowwise",
            "blocks.*.ffn.gate": "colwise",
            "blocks.*.ffn.up": "colwise",
            "blocks.*.ffn.down": "rowwise",
        },
        tp_divides=("n_head", "kv_heads", "d_ff"),
    ),
)
