"""Mixtral-style mixture-of-experts decoder: Llama's attention, and top-2 of 8 SwiGLU experts.

Sizes use Mistral AI's published Mixtral 8x7B dimensions (Jiang et al., 2024; Hugging Face
``MixtralConfig()``'s defaults): 32 layers of width 4096, 32 query and 8 key/value heads,
8 experts of width 14336 of which each token uses 2, a 32000-token vocabulary and RoPE
base 10^6. ``8x7b-2l`` keeps those widths at 2 layers, as torchprime's "shallow" configs
do, so one chip holds a real-width MoE layer.

Routing has static shapes, so XLA compiles it once. Each expert takes a fixed number of
tokens, its *capacity*: ``ceil(capacity_factor * tokens * top_k / experts)`` of the tokens
in the call (GShard, Switch Transformer, torchprime's ``capacity_factor``). A token's
choices are placed in their experts' slots by a cumulative count (all first choices
before any second choice); a choice that finds its expert full is dropped and the token
keeps only its residual and its other expert. Tokens are gathered into the slots and
scattered back by index, so dispatch costs no matmul; the experts then run as one
batched matmul over (experts, capacity) whether their slots are full or not. There is
no ``nonzero``, no ``torch._grouped_mm`` and no ``.item()``.

FLOPs are what this computation executes: every expert runs all its ``capacity`` slots,
full or empty, so at the default capacity factor 1.25 the expert matmuls cost 1.25x the
top-k formula (``2 * tokens * top_k * 3 * d_model * d_ff``). With ``capacity_factor =
experts / top_k`` every expert has a slot for every token and nothing is ever dropped
(the reference test's setting), at ``experts / top_k`` times the top-k cost.

Training loss: next-token cross-entropy plus 0.02 x the load-balancing loss of Switch
Transformer as Hugging Face's Mixtral computes it (``router_aux_loss_coef``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

from workloads.base import GENERATION_MODES, MODES, Batch, Generation, ParallelPlan, Published, Shape, Workload
from workloads.llm import decoder, llama3
from workloads.llm.decoder import DecoderConfig

AUX_LOSS_COEF = 0.02  # Hugging Face MixtralConfig.router_aux_loss_coef


@dataclass(frozen=True)
class MoEConfig(DecoderConfig):
    """A decoder whose feed-forward is ``n_experts`` SwiGLU experts of width ``d_ff``."""

    n_experts: int = 8
    top_k: int = 2
    capacity_factor: float = 1.25  # each expert's slots, as a multiple of an even share of the choices
    rope_theta: float = 1_000_000.0

    def capacity(self, tokens: int) -> int:
        """Slots per expert for a call of ``tokens`` tokens; never more than the tokens themselves."""
        return min(tokens, math.ceil(self.capacity_factor * tokens * self.top_k / self.n_experts))

    def attention_params(self) -> int:
        kv_dim = self.kv_heads * self.head_dim
        return 2 * self.d_model * self.n_head * self.head_dim + 2 * self.d_model * kv_dim

    def expert_params(self) -> int:
        return 3 * self.d_model * self.d_ff


def total_params(config: MoEConfig) -> int:
    """Every parameter: per layer attention, router, experts and two norms; embeddings, final norm."""
    layer = config.attention_params() + config.d_model * config.n_experts
    layer += config.n_experts * config.expert_params() + 2 * config.d_model
    embeddings = config.vocab_size * config.d_model * (1 if config.tied_embeddings else 2)
    return config.n_layer * layer + embeddings + config.d_model


def active_params(config: MoEConfig) -> int:
    """Parameters one token touches: all but the experts it is not routed to."""
    return total_params(config) - config.n_layer * (config.n_experts - config.top_k) * config.expert_params()


MIXTRAL_8X7B = MoEConfig(
    n_layer=32, n_head=32, n_kv_head=8, d_model=4096, d_ff=14336, vocab_size=32000, max_seq_len=32768
)

SIZES = {
    "tiny": MoEConfig(
        n_layer=2,
        n_head=4,
        n_kv_head=2,
        d_model=128,
        d_ff=256,
        vocab_size=2048,
        max_seq_len=4096,
        n_experts=4,
        top_k=2,
    ),
    "8x7b-2l": replace(MIXTRAL_8X7B, n_layer=2),  # real widths, 2 layers (torchprime's "shallow" configs)
    "8x7b": MIXTRAL_8X7B,
}

PUBLISHED = {
    "8x7b": Published(
        params=46_702_792_704,
        active_params=12_879_925_248,
        source="Jiang et al. 2024, Mixtral of Experts (46.7B total, 12.9B active); "
        "Hugging Face MixtralConfig() (46,702,792,704 / 12,879,925,248)",
    ),
}


class Experts(nn.Module):
    """The router and ``n_experts`` SwiGLU experts, their weights stacked for one batched matmul."""

    def __init__(self, config: MoEConfig):
        super().__init__()
        self.config = config
        experts, d_model, d_ff = config.n_experts, config.d_model, config.d_ff
        self.router = nn.Linear(d_model, experts, bias=False)
        self.gate = nn.Parameter(torch.empty(experts, d_model, d_ff))
        self.up = nn.Parameter(torch.empty(experts, d_model, d_ff))
        self.down = nn.Parameter(torch.empty(experts, d_ff, d_model))
        for weight in (self.gate, self.up, self.down):
            nn.init.normal_(weight, mean=0.0, std=0.02)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The experts' weighted sum for each token of ``x`` (B, S, d), and routing statistics for the
        load-balancing loss: (2, E) choices per expert and router probability summed over the tokens."""
        config = self.config
        experts, top_k = config.n_experts, config.top_k
        tokens = x.reshape(-1, x.shape[-1])
        count = tokens.shape[0]
        capacity = config.capacity(count)

        # Hugging Face Mixtral's routing: softmax in float32, top-k, renormalised over the k.
        probs = torch.softmax(self.router(tokens).float(), dim=-1)
        weights, chosen = probs.topk(top_k, dim=-1)  # (N, k)
        weights = (weights / weights.sum(dim=-1, keepdim=True)).to(x.dtype)

        # Slot of every (choice, token) in its expert, all first choices before any second.
        choice = chosen.t().reshape(-1)  # (k*N,), choice-major
        assigned = (choice[:, None] == torch.arange(experts, device=x.device)).long()  # (k*N, E)
        position = ((assigned.cumsum(dim=0) - 1) * assigned).sum(dim=-1)
        spare = experts * capacity  # where a dropped choice goes: a slot no expert reads
        slot = torch.where(position < capacity, choice * capacity + position, spare)

        # Gather tokens into the slots; an empty slot reads a zero row appended after the tokens.
        token_ids = torch.arange(count, device=x.device).repeat(top_k)
        source = torch.full((spare + 1,), count, dtype=torch.long, device=x.device).scatter(0, slot, token_ids)
        padded = torch.cat([tokens, tokens.new_zeros(1, tokens.shape[1])])
        inputs = padded.index_select(0, source[:spare]).view(experts, capacity, -1)
        hidden = F.silu(torch.bmm(inputs, self.gate)) * torch.bmm(inputs, self.up)
        outputs = torch.bmm(hidden, self.down).view(spare, -1)

        # Scatter back: each choice reads its slot's output (a dropped one the zero spare row).
        outputs = torch.cat([outputs, outputs.new_zeros(1, outputs.shape[1])])
        picked = outputs.index_select(0, slot).view(top_k, count, -1)
        combined = (picked * weights.t().unsqueeze(-1)).sum(dim=0)

        # For the load-balancing loss: choices per expert (over the k ranks) and summed router probability.
        routing = torch.stack([assigned.sum(dim=0).float(), probs.sum(dim=0)])
        return combined.view_as(x), routing


class Block(nn.Module):
    def __init__(self, config: MoEConfig, layer: int):
        super().__init__()
        self.attention_norm = nn.RMSNorm(config.d_model, eps=1e-5)
        self.attention = llama3.Attention(config, layer)
        self.ffn_norm = nn.RMSNorm(config.d_model, eps=1e-5)
        self.experts = Experts(config)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache: decoder.KVCache | None,
        positions: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        x = x + self.attention(self.attention_norm(x), cos, sin, cache, positions)
        moe, routing = self.experts(self.ffn_norm(x))
        return x + moe, routing


class Mixtral(nn.Module):
    def __init__(self, config: MoEConfig):
        super().__init__()
        self.config = config
        self.token_embedding = nn.Embedding(config.vocab_size, config.d_model)
        self.blocks = nn.ModuleList(Block(config, layer) for layer in range(config.n_layer))
        self.norm = nn.RMSNorm(config.d_model, eps=1e-5)
        self.lm_head = decoder.lm_head(config, self.token_embedding)
        self.apply(decoder.init_weights)

    def forward(
        self,
        input_ids: torch.Tensor,
        cache: decoder.KVCache | None = None,
        positions: torch.Tensor | None = None,
        return_balance: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Logits for ``input_ids`` (with a cache, at ``positions``: see decoder.attention); with
        ``return_balance``, also Switch Transformer's load-balancing loss as transformers'
        ``load_balancing_loss_func`` computes it: over all layers' tokens at once, E x the sum over
        experts of (choices routed there per token) x (mean router probability)."""
        x = self.token_embedding(input_ids)
        if positions is None:
            positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        cos, sin = llama3.rope_tables(positions, self.config.head_dim, x.dtype, self.config.rope_theta)
        routing = torch.zeros(2, self.config.n_experts, device=x.device)
        for block in self.blocks:
            x, layer_routing = block(x, cos, sin, cache, positions)
            routing = routing + layer_routing
        logits = self.lm_head(self.norm(x))
        if not return_balance:
            return logits
        rows = input_ids.numel() * len(self.blocks)
        return logits, self.config.n_experts * (routing[0] * routing[1]).sum() / rows**2


def loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    """Next-token cross-entropy plus ``AUX_LOSS_COEF`` x the load-balancing loss."""
    logits, balance = model(batch["input_ids"], return_balance=True)
    return F.cross_entropy(logits.flatten(0, 1).float(), batch["targets"].flatten()) + AUX_LOSS_COEF * balance


def cached_flops(config: MoEConfig, batch_size: int, new_tokens: int, cache_len: int) -> float:
    """One forward of ``new_tokens`` tokens per sequence attending over ``cache_len`` keys.

    Attention projections, the router and the LM head run once per token; QK^T and AV over
    all ``cache_len`` positions (full S x S, the masked half included, as decoder.cached_flops);
    the experts over all ``n_experts x capacity`` slots, full or empty.
    """
    tokens = batch_size * new_tokens
    per_layer = 2 * tokens * (config.attention_params() + config.d_model * config.n_experts)
    per_layer += 4 * tokens * cache_len * config.n_head * config.head_dim
    per_layer += 2 * config.n_experts * config.capacity(tokens) * config.expert_params()
    return float(config.n_layer * per_layer + 2 * tokens * config.d_model * config.vocab_size)


def flops(config: MoEConfig, shape: Shape, mode: str) -> float:
    """One step's matmul FLOPs (2 per multiply-add) at capacity; training is 3x the forward."""
    forward = cached_flops(config, shape.batch_size, shape.seq_len, shape.seq_len)
    return 3 * forward if mode == "train" else forward


def decode_bytes(config: MoEConfig, batch_size: int, cache_len: int, dtype: torch.dtype) -> float:
    """Bytes a decode step reads: every expert runs its slots, so every weight, and the whole cache."""
    return float(
        total_params(config) * torch.finfo(dtype).bits // 8
        + decoder.kv_cache_bytes(config, batch_size, cache_len, dtype)
    )


def estimate_memory_bytes(config: MoEConfig, shape: Shape, mode: str, dtype: torch.dtype) -> int:
    """The tensors a run holds at its peak (``Workload.memory_bytes`` adds the runtime's
    allowance), used to refuse runs that cannot fit.

    As decoder.estimate_memory_bytes: training keeps weights, gradients and two AdamW moments
    (16 bytes a parameter in float32: 750 GB at 8x7b) and every layer's activations;
    inference one layer's. A layer's activations are the attention's (10 d per token and
    the S x S scores per head) and the experts' slots (input, output and three d_ff-wide
    intermediates per slot). ``shape.seq_len`` in the generation modes is the cache's
    length, prompt plus generated tokens.
    """
    element = torch.finfo(dtype).bits // 8
    tokens = shape.batch_size * shape.seq_len
    slots = config.n_experts * config.capacity(tokens)
    layer_activations = (tokens * 10 * config.d_model + slots * (2 * config.d_model + 3 * config.d_ff)) * element
    layer_activations += shape.batch_size * config.n_head * shape.seq_len**2 * element
    logits_bytes = 3 * tokens * config.vocab_size * 4
    weights = total_params(config) * element
    if mode == "train":
        needed = 4 * weights + config.n_layer * layer_activations + logits_bytes
    else:
        needed = weights + layer_activations + logits_bytes
        if mode in GENERATION_MODES:
            needed += decoder.kv_cache_bytes(config, shape.batch_size, shape.seq_len, dtype)
    return int(needed * decoder.ALLOCATOR_HEADROOM)


WORKLOAD = Workload(
    parallel=ParallelPlan(fsdp_units=("blocks.*",)),  # FSDP units; no tensor-parallel plan
    name="mixtral",
    suites=("moe",),
    family="mixtral",
    description="Mixtral-style MoE decoder: top-2 of 8 SwiGLU experts at a fixed capacity, GQA, RoPE",
    sizes=SIZES,
    default_size="tiny",
    default_shape={
        "cpu": Shape(batch_size=2, seq_len=64),
        "cuda": Shape(batch_size=4, seq_len=2048),
        "tpu": Shape(batch_size=4, seq_len=2048),
    },
    build_model=Mixtral,
    make_batch=decoder.make_tokens,
    loss=loss,
    forward=decoder.logits,
    flops=flops,
    estimate_memory_bytes=estimate_memory_bytes,
    dims=("seq_len",),
    modes=MODES + GENERATION_MODES,
    max_seq_len=lambda config: config.max_seq_len,
    generation=Generation(decoder.KVCache.allocate, decoder.prefill, decoder.decode, cached_flops, decode_bytes),
    published=PUBLISHED,
    size_suites={"8x7b": ("mlperf",)},
    active_params=active_params,
)
