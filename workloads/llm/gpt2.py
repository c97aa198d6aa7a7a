"""GPT-2-style decoder (learned positions, LayerNorm, GELU MLP, tied LM head).

Sizes use the dimensions published with GPT-2 (Radford et al., 2019): 124M, 355M, 774M
and 1.5B, with a 50257-token vocabulary and a 1024-token context.
"""

from __future__ import annotations

import torch
from torch import nn

from workloads.base import Published, Shape
from workloads.llm import decoder
from workloads.llm.decoder import DecoderConfig


def _gpt2(n_layer: int, n_head: int, d_model: int) -> DecoderConfig:
    return DecoderConfig(
        n_layer, n_head, d_model, 4 * d_model, vocab_size=50257, max_seq_len=1024, tied_embeddings=True
    )


SIZES = {
    "tiny": DecoderConfig(
        n_layer=2, n_head=4, d_model=128, d_ff=512, vocab_size=2048, max_seq_len=1024, tied_embeddings=True
    ),
    "124m": _gpt2(12, 12, 768),
    "355m": _gpt2(24, 16, 1024),
    "774m": _gpt2(36, 20, 1280),
    "1.5b": _gpt2(48, 25, 1600),
}


class Block(nn.Module):
    def __init__(self, config: DecoderConfig, layer: int):
        super().__init__()
        self.layer = layer
        self.head_dim = config.head_dim
        self.ln_1 = nn.LayerNorm(config.d_model)
        # three projections, not one fused ``qkv``: tensor parallelism splits each by output
        # features, so that a rank holds whole heads of q, k and v (a split of a fused matrix
        # would give one rank all of q and the next all of k). Same parameters and FLOPs.
        self.q = nn.Linear(config.d_model, config.d_model)
        self.k = nn.Linear(config.d_model, config.d_model)
        self.v = nn.Linear(config.d_model, config.d_model)
        self.proj = nn.Linear(config.d_model, config.d_model)
        self.ln_2 = nn.LayerNorm(config.d_model)
        self.mlp = nn.Sequential(
            nn.Linear(config.d_model, config.d_ff),
            nn.GELU(approximate="tanh"),
            nn.Linear(config.d_ff, config.d_model),
        )

    def forward(self, x: torch.Tensor, cache: decoder.KVCache | None, positions: torch.Tensor | None) -> torch.Tensor:
        batch, seq, _ = x.shape
        normed = self.ln_1(x)
        # -1 heads: a tensor-parallel rank holds n_head / tp of them (its share of q, k, v)
        q, k, v = (
            projection(normed).view(batch, seq, -1, self.head_dim).transpose(1, 2)
            for projection in (self.q, self.k, self.v)
        )
        attended = decoder.attention(q, k, v, cache, self.layer, positions).transpose(1, 2).reshape(batch, seq, -1)
        x = x + self.proj(attended)
        return x + self.mlp(self.ln_2(x))


class GPT2(nn.Module):
    def __init__(self, config: DecoderConfig):
        super().__init__()
        self.token_embedding = nn.Embedding(config.vocab_size, config.d_model)
        self.position_embedding = nn.Embedding(config.max_seq_len, config.d_model)
        self.blocks = nn.ModuleList(Block(config, layer) for layer in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.d_model)
        self.lm_head = decoder.lm_head(config, self.token_embedding)
        self.register_buffer("positions", torch.arange(config.max_seq_len), persistent=False)
        self.apply(decoder.init_weights)

    def forward(
        self, input_ids: torch.Tensor, cache: decoder.KVCache | None = None, positions: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Logits for ``input_ids``; with a cache, the tokens sit at ``positions`` (see decoder.attention)."""
        positions = self.positions[: input_ids.shape[1]] if positions is None else positions
        x = self.token_embedding(input_ids) + self.position_embedding(positions)
        for block in self.blocks:
            x = block(x, cache, positions)
        return self.lm_head(self.ln_f(x))


#: OpenAI's checkpoints as Hugging Face counts them (GPT2LMHeadModel, LM head tied); the
#: paper's own figures (117M, 345M, 762M, 1542M) were rounded from an earlier count
PUBLISHED = {
    "124m": Published(124_439_808, "Radford et al. 2019; HF openai-community/gpt2"),
    "355m": Published(354_823_168, "Radford et al. 2019; HF openai-community/gpt2-medium"),
    "774m": Published(774_030_080, "Radford et al. 2019; HF openai-community/gpt2-large"),
    "1.5b": Published(1_557_611_200, "Radford et al. 2019; HF openai-community/gpt2-xl"),
}

WORKLOAD = decoder.decoder_workload(
    name="gpt2",
    family="gpt",
    description="GPT-2-style decoder: LayerNorm, GELU MLP, learned positions, tied LM head",
    sizes=SIZES,
    default_shape={"cpu": Shape(4, 128), "cuda": Shape(8, 1024), "tpu": Shape(8, 1024)},
    build_model=GPT2,
    published=PUBLISHED,
    parallel=decoder.decoder_plan(
        tp={
            "blocks.*.q": "colwise",
            "blocks.*.k": "colwise",
            "blocks.*.v": "colwise",
            "blocks.*.proj": "rowwise",
            "blocks.*.mlp.0": "colwise",
            "blocks.*.mlp.2": "rowwise",
        },
        tp_divides=("n_head", "d_ff"),
    ),
)
