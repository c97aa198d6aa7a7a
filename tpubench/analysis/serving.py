"""Serving points (the ``serving`` table) as curves: latency against throughput, one line per
engine on a chip (:func:`identity.serving_lines`), with what each costs, where each meets its
goodput SLO, how long each engine took to start, and the decode mode's static-batch runs of
the same model beside them (docs/serving.md, "Reading serving points").

Stateless functions over DataFrames, shared by the Serving page and any report: every figure
here is computed once, in this module.

- **Cost.** A point's price is the hour of every device it served on: the stored
  ``price_per_hour`` (``tpubench import --price-per-hour``, or the sweep's), else the price
  table's (:mod:`tpubench.analysis.prices`) per-device price times its devices
  (``device_count``, else ``tp_size``, else 1). Output tokens per dollar =
  output tok/s x 3600 / USD per hour; cost per million output tokens = 10^6 / that. A chip
  without a price gets none (null), never a borrowed one.
- **Goodput.** A point's ``request_goodput`` counts the requests per second that met every SLO
  of its ``goodput_slos`` (vLLM's definition). A line's marker is its point of highest goodput:
  the load at which the engine on that chip served the most requests within the SLO.
- **Static batch.** A decode run (``tpubench run --mode decode``) is one batch generated
  greedily in one process, without arrivals, queueing or continuous batching: its output
  tok/s and TPOT are a bound an engine's curve approaches, not a point of it. A run is of a
  serving point's model when the point's ``model`` is the run's ``workload/size`` or the
  Hugging Face model it loaded (``--model hf:ID``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import pandas as pd

from tpubench.analysis.identity import serving_lines, serving_load_labels
from tpubench.analysis.prices import Price, device_kind, device_price
from tpubench.serving.metrics import cost_per_m_output_tokens, parse_slos

#: the latencies a curve can be drawn against, and their labels
LATENCIES = {
    "tpot_p50_ms": "TPOT p50 (ms)",
    "tpot_p99_ms": "TPOT p99 (ms)",
    "ttft_p50_ms": "TTFT p50 (ms)",
    "ttft_p99_ms": "TTFT p99 (ms)",
}
STATIC_BATCH = "static batch"
#: the columns of :func:`curves` and :func:`static_batch`, which the page draws alike
CURVE_COLUMNS = (
    "run_id",
    "invocation_id",
    "model",
    "line",
    "load",
    "kind",
    "output_throughput",
    "request_throughput",
    "request_goodput",
    "goodput_slos",
    *LATENCIES,
    "usd_per_hour",
    "output_tokens_per_usd",
    "cost_per_m_output_tokens",
    "cold_start_s",
    "source",
)


def devices(points: pd.DataFrame) -> pd.Series:
    """How many devices each point's engine served on: ``device_count``, else ``tp_size``, else 1."""
    count = points["device_count"] if "device_count" in points else pd.Series(pd.NA, index=points.index)
    return count.fillna(points["tp_size"]).fillna(1).astype(float)


def usd_per_hour(points: pd.DataFrame, prices: Mapping[str, Price]) -> pd.Series:
    """Each point's price per hour of all its devices: the stored price, else the price table's."""
    table = [
        device_price(device, device_kind("xla", device), prices) if isinstance(device, str) else None
        for device in points["device"]  # "xla": the kind its device name shows (TPU, CPU, else a GPU)
    ]
    looked_up = pd.Series(table, index=points.index, dtype=float) * devices(points)
    return points["price_per_hour"].astype(float).fillna(looked_up)


def with_costs(frame: pd.DataFrame, hourly: pd.Series, tokens_per_s: pd.Series) -> pd.DataFrame:
    """``frame`` with ``usd_per_hour``, ``output_tokens_per_usd`` and ``cost_per_m_output_tokens``
    (:func:`tpubench.serving.metrics.cost_per_m_output_tokens`, the stored cost's formula)."""
    costs = [
        cost_per_m_output_tokens(
            None if pd.isna(price) or price <= 0 else float(price), None if pd.isna(rate) else float(rate)
        )
        for price, rate in zip(hourly.tolist(), tokens_per_s.tolist(), strict=True)
    ]
    per_usd = tokens_per_s.astype(float) * 3600 / hourly.where(hourly > 0)
    cost = pd.Series(costs, index=frame.index, dtype=float)
    return frame.assign(usd_per_hour=hourly, output_tokens_per_usd=per_usd, cost_per_m_output_tokens=cost)


def curves(points: pd.DataFrame, prices: Mapping[str, Price]) -> pd.DataFrame:
    """The ok points as curves: :data:`CURVE_COLUMNS`, one ``line`` per engine on a chip, each
    line's points by output throughput, with each point's load and costs."""
    ok = points[points["status"] == "ok"]
    if ok.empty:
        return pd.DataFrame(columns=CURVE_COLUMNS)
    frame = ok.assign(line=serving_lines(ok), load=serving_load_labels(ok), kind="engine")
    frame = with_costs(frame, usd_per_hour(ok, prices), ok["output_throughput"])
    frame = frame.sort_values(["model", "line", "output_throughput"], kind="stable")
    return frame[list(CURVE_COLUMNS)].reset_index(drop=True)


def goodput_points(lines: pd.DataFrame) -> pd.DataFrame:
    """Each line's point of highest goodput (of :func:`curves`' points that measured one), with
    the share of its requests that met the SLO (goodput / request throughput)."""
    measured = lines[lines["request_goodput"].notna() & (lines["kind"] == "engine")]
    if measured.empty:
        return pd.DataFrame(columns=[*CURVE_COLUMNS, "good_share"])
    best = measured.loc[measured.groupby(["model", "line"], sort=False)["request_goodput"].idxmax()]
    share = best["request_goodput"] / best["request_throughput"].where(best["request_throughput"] > 0)
    return best.assign(good_share=share).reset_index(drop=True)


def slo_bound(lines: pd.DataFrame, latency: str) -> float | None:
    """The SLO every goodput of ``lines`` was measured at on ``latency``'s metric (``tpot_p99_ms``:
    the tpot SLO), to draw as a bound; None when they name none or differ."""
    metric = latency.split("_", 1)[0]
    texts = set(lines.loc[lines["request_goodput"].notna(), "goodput_slos"].dropna())
    bounds = {parse_slos([text]).get(metric) for text in texts}
    return bounds.pop() if len(bounds) == 1 else None


def cold_starts(points: pd.DataFrame) -> pd.DataFrame:
    """Per model and line, the engine's time from start to ready (compile included) over its
    sweeps: one figure per sweep (invocation), their median, min and max, and how many."""
    started = points[points["cold_start_s"].notna()]
    columns = ["model", "line", "sweeps", "median_s", "min_s", "max_s"]
    if started.empty:
        return pd.DataFrame(columns=columns)
    frame = started.assign(line=serving_lines(started))
    per_sweep = frame.groupby(["model", "line", "invocation_id"], sort=False)["cold_start_s"].first().reset_index()
    grouped = per_sweep.groupby(["model", "line"], sort=True)["cold_start_s"]
    table = grouped.agg(sweeps="size", median_s="median", min_s="min", max_s="max").reset_index()
    return table[columns]


def run_models(runs: pd.DataFrame) -> pd.Series:
    """The model each run is of, as a serving point names it: the Hugging Face id or folder a
    ``--model hf:...`` run loaded, else ``workload/size``."""
    names = []
    for workload, size, ref in zip(runs["workload"], runs["size"], _column(runs, "model_ref"), strict=True):
        target = _hf_target(ref)
        names.append(target if target else f"{workload}/{size}")
    return pd.Series(names, index=runs.index, dtype=object)


def _hf_target(ref: object) -> str | None:
    if not isinstance(ref, str) or not ref:
        return None
    try:
        parsed = json.loads(ref)
    except json.JSONDecodeError:
        return None
    return parsed.get("target") if isinstance(parsed, dict) and parsed.get("route") == "hf" else None


def _column(frame: pd.DataFrame, name: str) -> pd.Series:
    return frame[name] if name in frame else pd.Series(None, index=frame.index, dtype=object)


def static_batch(runs: pd.DataFrame, prices: Mapping[str, Price]) -> pd.DataFrame:
    """Ok decode runs as curves beside the engines' (:data:`CURVE_COLUMNS`): a line per
    backend, device and shape of prompt and generation, a point per batch size, ``model`` as
    :func:`run_models` names it, ``kind`` "static batch"."""
    decode = runs[(runs["mode"] == "decode") & (runs["status"] == "ok")]
    if decode.empty:
        return pd.DataFrame(columns=CURVE_COLUMNS)
    tokens = decode["output_tokens_per_s"].fillna(decode["tokens_per_s"]).astype(float)
    lines = [
        f"{STATIC_BATCH}: {backend} on {device}, prompt {int(prompt)}, {int(generated)} generated"
        for backend, device, prompt, generated in zip(
            decode["backend"], decode["device"], decode["seq_len"], decode["gen_len"], strict=True
        )
    ]
    frame = decode.assign(
        model=run_models(decode),
        line=lines,
        load=[f"batch {int(batch)}" for batch in decode["batch_size"]],
        kind=STATIC_BATCH,
        output_throughput=tokens,
        request_throughput=None,
        request_goodput=None,
        goodput_slos=None,
        cold_start_s=None,
        source="tpubench run --mode decode",
        **{latency: decode.get(latency) for latency in LATENCIES},
    )
    prices_per_device = [
        device_price(device, device_kind(backend, device), prices)
        for backend, device in zip(decode["backend"], decode["device"], strict=True)
    ]
    hourly = pd.Series(prices_per_device, index=decode.index, dtype=float) * decode["devices"].fillna(1)
    frame = with_costs(frame, hourly, tokens).sort_values(["model", "line", "output_throughput"], kind="stable")
    return frame[list(CURVE_COLUMNS)].reset_index(drop=True)


def models(points: pd.DataFrame, runs: pd.DataFrame) -> list[str]:
    """Every model with a serving point or a decode run, those with serving points first."""
    served = sorted(points["model"].dropna().unique()) if not points.empty else []
    decoded = sorted(set(run_models(runs)) - set(served)) if not runs.empty else []
    return [*served, *decoded]
