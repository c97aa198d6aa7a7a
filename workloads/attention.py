"""Which attention implementation a workload's attention call runs, chosen from outside it.

Every built-in workload computes attention through :func:`sdpa`, PyTorch's
``scaled_dot_product_attention`` by default. A run's ``--attention`` choice is applied by its
backend around the whole run (:meth:`tpubench.backends.base.Backend.attention`): an SDPA
backend is forced with ``torch.nn.attention.sdpa_kernel`` and needs nothing here; flex
attention, or a chip's own kernel (PyTorch/XLA's Pallas flash attention), replaces the call
through :func:`use`. So a model never knows the chip or the kernel; the setting is a
module-level one because one worker process measures one run.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F

#: ``(q, k, v, attn_mask, is_causal) -> output``: an implementation that replaces SDPA
Kernel = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, bool], torch.Tensor]

_kernel: Kernel | None = None


FLEX_NO_CACHE = "flex attention here takes causal or full attention, not a static KV cache's mask (prefill, decode)"


class AttentionUnsupported(RuntimeError):
    """The chosen kernel cannot compute this call (a mask it does not take, a backward it lacks)."""


def sdpa(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False
) -> torch.Tensor:
    """(B, H, T, D) attention with equal query and key heads, by the kernel in use (SDPA by default)."""
    if _kernel is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal)
    return _kernel(q, k, v, attn_mask, is_causal)


@contextlib.contextmanager
def use(kernel: Kernel) -> Iterator[None]:
    """Run every :func:`sdpa` call inside with ``kernel`` instead of SDPA."""
    global _kernel
    previous, _kernel = _kernel, kernel
    try:
        yield
    finally:
        _kernel = previous


def _causal(batch: torch.Tensor, head: torch.Tensor, q_index: torch.Tensor, kv_index: torch.Tensor) -> torch.Tensor:
    return q_index >= kv_index


def flex(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None, is_causal: bool
) -> torch.Tensor:
    """Flex attention (``torch.nn.attention.flex_attention``) with a causal block mask, or none.

    It is fused only under ``torch.compile``, which traces the block mask's construction into
    the same graph. An explicit mask (a static KV cache's, in prefill and decode) is not
    expressed here: those modes are refused rather than run through another kernel."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    if attn_mask is not None:
        raise AttentionUnsupported(FLEX_NO_CACHE)
    block_mask = None
    if is_causal:
        block_mask = create_block_mask(_causal, None, None, q.shape[-2], k.shape[-2], device=q.device)
    return flex_attention(q, k, v, block_mask=block_mask)


#: whether the memory estimates made now count attention's S x S scores (see :func:`estimating`)
_scores_held = True


@contextlib.contextmanager
def estimating(scores_held: bool) -> Iterator[None]:
    """Memory estimates made inside count attention as a kernel that holds the S x S scores
    (SDPA's math path, and XLA's, which materialises them) or as a fused one (flash, memory-
    efficient, cuDNN, flex: O(S) per head, the log-sum-exp). Outside, estimates count the
    scores: an estimate must not fall below the peak, and a fused kernel is not always what runs."""
    global _scores_held
    previous, _scores_held = _scores_held, scores_held
    try:
        yield
    finally:
        _scores_held = previous


#: the S x S tensors SDPA's math path has alive at once in a layer's forward: the scores, the
#: causal bias, the softmax and ``_safe_softmax``'s output (its -inf check adds a bool one)
MATH_LIVE_SCORES = 4
#: those it keeps per layer for the backward: the softmax (the bmm's input) and the bool mask
MATH_SAVED_SCORES = 1.25


def activation_bytes(batch: int, heads: int, q_len: int, k_len: int, element: int, layers_saved: int) -> int:
    """Attention's own activations in one step: the live layer's and those ``layers_saved``
    layers keep for the backward (0 in inference). Holding the scores, that is
    ``MATH_LIVE_SCORES`` S x S tensors for the live layer and ``MATH_SAVED_SCORES`` per saved
    one; fused, one float32 log-sum-exp per query and head (the output is the caller's)."""
    if _scores_held:
        scores = batch * heads * q_len * k_len * element
        return int(scores * (MATH_LIVE_SCORES + MATH_SAVED_SCORES * layers_saved))
    return batch * heads * q_len * 4 * (1 + layers_saved)


def scores_bytes(batch: int, heads: int, q_len: int, k_len: int, element: int, copies: float) -> int:
    """One layer's attention scores for an estimate that counts ``copies`` S x S tensors per
    head (its own measured count: the scores and the softmax, for an encoder's or a DiT's
    unmasked attention) where the kernel holds them, or the fused kernel's one float32
    log-sum-exp per query and head (see :func:`estimating`)."""
    if _scores_held:
        return int(copies * batch * heads * q_len * k_len * element)
    return batch * heads * q_len * 4
