"""Serving metrics with vLLM's definitions (vllm/benchmarks), from per-generation timings.

* TTFT: time to first token, the prefill latency (prompt in, first token out).
* TPOT: time per output token after the first, (end-to-end latency - TTFT) / (output tokens - 1).
* ITL: inter-token latency, the time between consecutive output tokens (one decode step).
* Output tokens/s: generated tokens over the total time; total tokens/s adds the prompt.

Each is reported at p50/p90/p99 over the repeated generations (ITL over all decode
steps of all of them). Here a "generation" is one batch of ``batch_size`` sequences
generated together, greedily, with a static KV cache.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

PERCENTILES = (50, 90, 99)


@dataclass
class GenerationTiming:
    """The timings of one generation: prefill, then each decode step, and end to end."""

    ttft_ms: float
    itl_ms: list[float] = field(default_factory=list)
    e2e_ms: float = 0.0

    def tpot_ms(self, output_tokens: int) -> float | None:
        """Time per output token after the first; None with fewer than two output tokens."""
        return (self.e2e_ms - self.ttft_ms) / (output_tokens - 1) if output_tokens > 1 else None


def _percentiles(name: str, values: list[float]) -> dict[str, float | None]:
    if not values:
        return {f"{name}_p{p}_ms": None for p in PERCENTILES}
    return {f"{name}_p{p}_ms": float(np.percentile(values, p)) for p in PERCENTILES}


def serving_metrics(
    generations: list[GenerationTiming], batch_size: int, prompt_len: int, gen_len: int
) -> dict[str, float | None]:
    """TTFT/TPOT/ITL percentiles and token throughputs over ``generations``.

    ``gen_len`` is the number of output tokens per sequence, the first (from prefill)
    included; TPOT needs at least two.
    """
    ttft = [g.ttft_ms for g in generations]
    tpot = [g.tpot_ms(gen_len) for g in generations] if gen_len > 1 else []
    itl = [value for g in generations for value in g.itl_ms]
    total_s = sum(g.e2e_ms for g in generations) / 1e3
    runs = len(generations)
    return {
        **_percentiles("ttft", ttft),
        **_percentiles("tpot", tpot),
        **_percentiles("itl", itl),
        "output_tokens_per_s": batch_size * gen_len * runs / total_s if total_s > 0 else None,
        "total_tokens_per_s": batch_size * (prompt_len + gen_len) * runs / total_s if total_s > 0 else None,
    }


def bandwidth_utilisation(
    bytes_per_decode_step: float, tpot_ms: float | None, peak_bytes_per_s: float | None
) -> float | None:
    """Achieved bytes/s of a decode step (weights plus KV cache read, per TPOT) over the peak."""
    if tpot_ms is None or tpot_ms <= 0 or peak_bytes_per_s is None:
        return None
    return bytes_per_decode_step / (tpot_ms / 1e3) / peak_bytes_per_s
