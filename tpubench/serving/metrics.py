"""Serving metrics with vLLM's definitions (vllm/benchmarks), in one place for the engine sweeps
and the in-process decode mode.

Per request, from the times a streaming client saw (:class:`RequestRecord`):

* TTFT: the first streamed chunk that carries ``choices`` (its text may be empty), minus the send.
* ITL: the gaps between successive chunks, not tokens: a chunk may carry several tokens.
* E2EL: the last chunk that carries ``choices``, minus the send; a trailing usage-only chunk
  does not count.
* TPOT: (E2EL - TTFT) / (output tokens - 1), with the output tokens from the server's ``usage``;
  only with two or more.

Over a load point (:func:`summarize`): the mean and p50/p90/p99 of each, request, output and
total-token throughput over the point's duration, and goodput: the requests that meet every
SLO given (``ttft:MS tpot:MS e2el:MS``) per second.

The decode mode (:func:`serving_metrics`) applies the same TTFT, TPOT and ITL to each
"generation": one batch of ``batch_size`` sequences generated together, greedily, with a
static KV cache.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import numpy as np

PERCENTILES = (50, 90, 99)
#: the latencies a serving point reports, each as mean and p50/p90/p99 in milliseconds
LATENCIES = ("ttft", "tpot", "itl", "e2el")
#: the latencies a goodput SLO may bound (ITL has no per-request value)
SLO_METRICS = ("ttft", "tpot", "e2el")


def tpot_ms(e2el_ms: float, ttft_ms: float, output_tokens: int | None) -> float | None:
    """Time per output token after the first; None with fewer than two output tokens (or none known)."""
    if output_tokens is None or output_tokens < 2:
        return None
    return (e2el_ms - ttft_ms) / (output_tokens - 1)


@dataclass
class GenerationTiming:
    """The timings of one generation: prefill, then each decode step, and end to end."""

    ttft_ms: float
    itl_ms: list[float] = field(default_factory=list)
    e2e_ms: float = 0.0

    def tpot_ms(self, output_tokens: int) -> float | None:
        """Time per output token after the first; None with fewer than two output tokens."""
        return tpot_ms(self.e2e_ms, self.ttft_ms, output_tokens)


@dataclass
class RequestRecord:
    """One streamed request as the client saw it: the sums of :func:`summarize`'s figures.

    ``send_s`` is the send time since the point's start; ``input_len`` and ``output_len`` are
    the server's ``usage`` counts where it gave them (the dataset's nominal input length
    otherwise, and no output length). A request with an ``error`` failed: no chunk with
    ``choices`` arrived, or the connection broke.
    """

    input_len: int
    send_s: float
    output_len: int | None = None
    ttft_ms: float | None = None
    itl_ms: list[float] = field(default_factory=list)
    e2el_ms: float | None = None
    error: str | None = None

    @property
    def tpot_ms(self) -> float | None:
        if self.error is not None or self.ttft_ms is None or self.e2el_ms is None:
            return None
        return tpot_ms(self.e2el_ms, self.ttft_ms, self.output_len)


def request_record(
    input_len: int,
    send: float,
    chunk_times: list[float],
    output_len: int | None,
    error: str | None,
    start: float,
) -> RequestRecord:
    """A request's record from its send time and the arrival time of each chunk that carried
    ``choices`` (perf_counter seconds; ``start`` is the point's): TTFT, ITL and E2EL as vLLM
    defines them. No such chunk is a failed request."""
    if error is None and not chunk_times:
        error = "no chunk with choices arrived (TTFT undefined)"
    if error is not None:
        return RequestRecord(input_len, send - start, output_len, error=error)
    gaps = [1e3 * (later - earlier) for earlier, later in itertools.pairwise(chunk_times)]
    return RequestRecord(
        input_len,
        send - start,
        output_len,
        ttft_ms=1e3 * (chunk_times[0] - send),
        itl_ms=gaps,
        e2el_ms=1e3 * (chunk_times[-1] - send),
    )


def parse_slos(words: list[str] | None) -> dict[str, float]:
    """``["ttft:200", "tpot:50"]`` (or one string ``"ttft:200 tpot:50"``) as ``{"ttft": 200.0,
    "tpot": 50.0}``, milliseconds; ValueError naming the valid form on anything else."""
    slos: dict[str, float] = {}
    for word in " ".join(words or []).replace(",", " ").split():
        name, sep, value = word.partition(":")
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if not sep or name not in SLO_METRICS or not math.isfinite(number) or number <= 0:
            raise ValueError(
                f"expects NAME:MS with NAME one of {', '.join(SLO_METRICS)} and MS a positive number "
                f"(e.g. ttft:200 tpot:50), got {word!r}"
            )
        slos[name] = number
    return slos


def slos_text(slos: dict[str, float]) -> str | None:
    """The SLOs as they are given and stored: ``ttft:200 tpot:50``; None when none."""
    return " ".join(f"{name}:{value:g}" for name, value in slos.items()) or None


def meets_slos(record: RequestRecord, slos: dict[str, float]) -> bool:
    """Whether a completed request meets every SLO. As vLLM counts it, a request of one output
    token has a TPOT of 0 for this test."""
    values = {"ttft": record.ttft_ms, "tpot": record.tpot_ms or 0.0, "e2el": record.e2el_ms}
    return all(values[name] is not None and values[name] <= limit for name, limit in slos.items())


def _stats(name: str, values: list[float]) -> dict[str, float | None]:
    if not values:
        return {f"{name}_{stat}_ms": None for stat in ("mean", *(f"p{p}" for p in PERCENTILES))}
    return {f"{name}_mean_ms": float(np.mean(values)), **_percentiles(name, values)}


def summarize(records: list[RequestRecord], duration_s: float, slos: dict[str, float] | None = None) -> dict:
    """A load point's figures (the ``serving`` table's columns) from its requests' records.

    Throughputs and token totals count the completed requests only, over ``duration_s`` (the
    point's first send to its last response); goodput is null when no SLO is given.
    """
    done = [record for record in records if record.error is None]
    ttft = [r.ttft_ms for r in done if r.ttft_ms is not None]
    tpot = [t for r in done if (t := r.tpot_ms) is not None]
    itl = [gap for r in done for gap in r.itl_ms]
    e2el = [r.e2el_ms for r in done if r.e2el_ms is not None]
    input_tokens = sum(r.input_len for r in done)
    output_tokens = sum(r.output_len or 0 for r in done)
    per_s = (lambda count: count / duration_s) if duration_s > 0 else (lambda count: None)
    good = sum(meets_slos(r, slos) for r in done) if slos else None
    return {
        "completed": len(done),
        "failed": len(records) - len(done),
        "duration_s": duration_s,
        "total_input_tokens": input_tokens,
        "total_output_tokens": output_tokens,
        **_stats("ttft", ttft),
        **_stats("tpot", tpot),
        **_stats("itl", itl),
        **_stats("e2el", e2el),
        "request_throughput": per_s(len(done)),
        "output_throughput": per_s(output_tokens),
        "total_token_throughput": per_s(input_tokens + output_tokens),
        "request_goodput": None if good is None else per_s(good),
    }


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
    tpot = [t for g in generations if (t := g.tpot_ms(gen_len)) is not None]
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


def cost_per_m_output_tokens(price_per_hour: float | None, output_throughput: float | None) -> float | None:
    """Dollars per million output tokens at a point's throughput, where a price is known: the
    one formula of the stored cost (the sweep's rows, the importers) and the Serving page's."""
    if price_per_hour is None or not output_throughput:
        return None
    return price_per_hour / 3600.0 / output_throughput * 1e6
