"""What GPT- and Llama-style decoders share: config, synthetic tokens, loss, FLOPs, memory.

Both decoders are plain PyTorch with static shapes (no data-dependent control flow), so
XLA compiles each (batch, sequence) shape once and never again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

from workloads.attention import activation_bytes, sdpa
from workloads.base import GENERATION_MODES, MODES, Batch, Generation, ParallelPlan, Published, Shape, Workload


@dataclass(frozen=True)
class DecoderConfig:
    n_layer: int
    n_head: int
    d_model: int
    d_ff: int
    vocab_size: int
    max_seq_len: int
    n_kv_head: int | None = None  # None: plain multi-head attention
    gated_mlp: bool = False  # SwiGLU has three FFN matrices, GELU MLP two
    tied_embeddings: bool = False  # the LM head reuses the token embedding

    @property
    def kv_heads(self) -> int:
        return self.n_kv_head or self.n_head

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    def matmul_params_per_layer(self) -> int:
        kv_dim = self.kv_heads * self.head_dim
        attention = 2 * self.d_model * self.d_model + 2 * self.d_model * kv_dim
        ffn = (3 if self.gated_mlp else 2) * self.d_model * self.d_ff
        return attention + ffn


def lm_head(config: DecoderConfig, embedding: nn.Embedding) -> nn.Linear:
    """The output projection. Tied, it shares the embedding matrix and never allocates one of
    its own: a placeholder built and then replaced would briefly double the largest matrix
    (525 MB for llama3 1b in bfloat16), past the memory estimate."""
    if not config.tied_embeddings:
        return nn.Linear(config.d_model, config.vocab_size, bias=False)
    head = nn.Linear(config.d_model, config.vocab_size, bias=False, device="meta")
    head.weight = embedding.weight
    return head


def init_weights(module: nn.Module) -> None:
    """GPT-2's initialisation, N(0, 0.02) weights and zero biases, for ``model.apply``.

    PyTorch's defaults give embeddings unit variance, which swamps the residual stream:
    a random model then just repeats its last input token, and greedy decoding would
    compare nothing.
    """
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


def make_tokens(config: DecoderConfig, shape: Shape, generator: torch.Generator) -> Batch:
    """Uniform random token ids; targets are the inputs shifted by one, as in pre-training."""
    tokens = torch.randint(0, config.vocab_size, (shape.batch_size, shape.seq_len + 1), generator=generator)
    return {"input_ids": tokens[:, :-1].contiguous(), "targets": tokens[:, 1:].contiguous()}


def next_token_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    logits = model(batch["input_ids"])
    return F.cross_entropy(logits.flatten(0, 1).float(), batch["targets"].flatten())


def logits(model: nn.Module, batch: Batch) -> torch.Tensor:
    return model(batch["input_ids"])


def decoder_flops(config: DecoderConfig, shape: Shape, mode: str) -> float:
    """Matmul FLOPs of one step, counted the way ``torch.utils.flop_counter`` counts them.

    Forward: 2 FLOPs per multiply-add over every projection and the LM head, plus the two
    attention matmuls (QK^T and AV) over the full S x S score matrix (SDPA's math counts
    the masked half too). Backward costs twice the forward. Elementwise work and the
    optimizer step are not counted, the convention MFU figures use.
    """
    # without a cache, the keys are the sequence
    forward = cached_flops(config, shape.batch_size, shape.seq_len, shape.seq_len)
    return float(3 * forward if mode == "train" else forward)


def cached_flops(config: DecoderConfig, batch_size: int, new_tokens: int, cache_len: int) -> float:
    """One forward of ``new_tokens`` tokens per sequence whose queries attend over ``cache_len`` keys.

    Every projection and the LM head run once per new token; QK^T and AV run over all
    ``cache_len`` positions, because a static cache is masked, not sliced, so SDPA computes
    (and the flop counter counts) the empty positions too. A decode step is
    ``new_tokens=1``; a decode run's prefill is the prompt over the cache of prompt +
    generated positions, not the prompt alone.
    """
    tokens = batch_size * new_tokens
    projections = 2 * tokens * (config.n_layer * config.matmul_params_per_layer() + config.d_model * config.vocab_size)
    return float(projections + config.n_layer * 4 * tokens * cache_len * config.d_model)


def kv_cache_bytes(config: DecoderConfig, batch_size: int, cache_len: int, dtype: torch.dtype) -> int:
    return (
        2 * config.n_layer * batch_size * config.kv_heads * cache_len * config.head_dim * torch.finfo(dtype).bits // 8
    )


def decode_bytes(config: DecoderConfig, batch_size: int, cache_len: int, dtype: torch.dtype) -> float:
    """Bytes a decode step must read: every weight once, and the whole static KV cache."""
    return float(
        parameter_count(config) * torch.finfo(dtype).bits // 8 + kv_cache_bytes(config, batch_size, cache_len, dtype)
    )


def parameter_count(config: DecoderConfig) -> int:
    """Weights, ignoring norms, biases and learned positions (< 1% at every published size)."""
    embeddings = config.vocab_size * config.d_model
    lm_head = 0 if config.tied_embeddings else embeddings
    return config.n_layer * config.matmul_params_per_layer() + embeddings + lm_head


#: the estimate's margin for what it does not itemise: norms, biases and learned positions,
#: temporaries, and the allocator's fragmentation (measured CPU peaks ran up to 8% over the items)
ALLOCATOR_HEADROOM = 1.15


def estimate_memory_bytes(config: DecoderConfig, shape: Shape, mode: str, dtype: torch.dtype) -> int:
    """The tensors a run holds at its peak (``Workload.memory_bytes`` adds the runtime), used to
    refuse runs that cannot fit.

    Tested against real peaks (``tests/test_memory.py``): it must not be below them, or a
    run passes the check and is then killed by the OOM killer. Train keeps weights,
    gradients and two AdamW moments, plus every layer's activations
    (about 10 d + 4 d_ff values per token) and float32 logits three times over (logits,
    softmax, gradient). Inference keeps the weights, one layer's activations and the logits.
    Attention's own activations are O(S^2) per head where the kernel holds the scores and
    O(S) where it is fused (:func:`workloads.attention.activation_bytes`).
    """
    batch_size, seq_len = shape.batch_size, shape.seq_len
    element = torch.finfo(dtype).bits // 8
    params = parameter_count(config)
    tokens = batch_size * seq_len
    layer_activations = tokens * (10 * config.d_model + 4 * config.d_ff) * element
    saved = config.n_layer if mode == "train" else 0  # the layers whose attention the backward keeps
    scores = activation_bytes(batch_size, config.n_head, seq_len, seq_len, element, saved)
    logits_bytes = 3 * tokens * config.vocab_size * 4
    if mode == "train":
        needed = 4 * params * element + config.n_layer * layer_activations + scores + logits_bytes
    elif mode in GENERATION_MODES:  # seq_len is prompt + generated tokens: the cache's length
        cache = kv_cache_bytes(config, batch_size, seq_len, dtype)
        needed = params * element + layer_activations + scores + logits_bytes + cache
    else:
        needed = params * element + layer_activations + scores + logits_bytes
    return int(needed * ALLOCATOR_HEADROOM)


@dataclass
class KVCache:
    """A static key/value cache: one (B, kv_heads, length, head_dim) pair per layer.

    Shapes are fixed when it is allocated and it is updated in place, so a decode step
    has the same shapes at every position and XLA compiles it once.
    """

    keys: list[torch.Tensor]
    values: list[torch.Tensor]

    @classmethod
    def allocate(
        cls, config: DecoderConfig, batch_size: int, length: int, device: torch.device, dtype: torch.dtype
    ) -> KVCache:
        shape = (batch_size, config.kv_heads, length, config.head_dim)
        return cls(
            [torch.zeros(shape, device=device, dtype=dtype) for _ in range(config.n_layer)],
            [torch.zeros(shape, device=device, dtype=dtype) for _ in range(config.n_layer)],
        )


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cache: KVCache | None = None,
    layer: int = 0,
    positions: torch.Tensor | None = None,
) -> torch.Tensor:
    """(B, H, T, D) causal attention; grouped KV heads are repeated to match the queries.

    With a cache, k and v are written at ``positions`` (a device tensor, so the graph does
    not change with the position) and the queries attend to every cached position up to
    their own, through a mask over the cache's full static length.
    """
    if cache is None:
        keys, values, mask, causal = k, v, None, True
    else:
        cache.keys[layer].index_copy_(2, positions, k)
        cache.values[layer].index_copy_(2, positions, v)
        keys, values, causal = cache.keys[layer], cache.values[layer], False
        mask = torch.arange(keys.shape[2], device=q.device)[None, :] <= positions[:, None]
    if keys.shape[1] != q.shape[1]:
        repeat = q.shape[1] // keys.shape[1]
        keys = keys.repeat_interleave(repeat, dim=1)
        values = values.repeat_interleave(repeat, dim=1)
    return sdpa(q, keys, values, attn_mask=mask, is_causal=causal)


def prefill(model: nn.Module, batch: Batch, cache: KVCache) -> torch.Tensor:
    """Run the prompt through the model, filling the cache; returns the first greedy token (B, 1)."""
    prompt = batch["input_ids"]
    positions = torch.arange(prompt.shape[1], device=prompt.device)
    logits = model(prompt, cache=cache, positions=positions)
    return logits[:, -1:].argmax(dim=-1)


def decode(model: nn.Module, token: torch.Tensor, position: torch.Tensor, cache: KVCache) -> torch.Tensor:
    """One greedy decode step at ``position`` (a 1-element device tensor, advanced in place)."""
    logits = model(token, cache=cache, positions=position)
    position.add_(1)
    return logits[:, -1:].argmax(dim=-1)


def tp_local(config: DecoderConfig, tp: int) -> DecoderConfig:
    """One tensor-parallel rank's shard of a decoder: its share of the query and KV heads,
    of the model width (so that the head size stays) and of the MLP width."""
    return replace(
        config,
        n_head=config.n_head // tp,
        n_kv_head=config.kv_heads // tp,
        d_model=config.d_model // tp,
        d_ff=config.d_ff // tp,
    )


def decoder_plan(tp: Mapping[str, str], tp_divides: tuple[str, ...]) -> ParallelPlan:
    """A decoder's plan: FSDP units are the blocks; ``tp`` is Megatron's (the projections into
    heads and into the MLP split by output features, the ones out of them by input features,
    so that each block needs one all-reduce in its attention and one in its MLP)."""
    return ParallelPlan(fsdp_units=("blocks.*",), tp=tp, tp_divides=tp_divides, tp_local=tp_local)


def decoder_workload(
    name: str,
    family: str,
    description: str,
    sizes: Mapping[str, DecoderConfig],
    default_shape: Mapping[str, Shape],
    build_model: Callable[[DecoderConfig], nn.Module],
    published: Mapping[str, Published],
    size_suites: Mapping[str, tuple[str, ...]] | None = None,
    parallel: ParallelPlan | None = None,
) -> Workload:
    """An llm-suite workload: next-token loss on synthetic tokens, FLOPs and memory from the config."""
    return Workload(
        name=name,
        suites=("llm",),
        family=family,
        description=description,
        sizes=sizes,
        default_size="tiny",
        default_shape=default_shape,
        build_model=build_model,
        make_batch=make_tokens,
        loss=next_token_loss,
        forward=logits,
        flops=decoder_flops,
        estimate_memory_bytes=estimate_memory_bytes,
        max_seq_len=lambda config: config.max_seq_len,
        modes=MODES + GENERATION_MODES,
        generation=Generation(KVCache.allocate, prefill, decode, cached_flops, decode_bytes),
        published=published,
        size_suites=size_suites or {},
        parallel=parallel,
    )
