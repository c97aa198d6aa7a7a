"""Serving, per model: engines under load (``tpubench serving``, ``tpubench import``) as latency
against throughput, a line per engine on a chip, with the best goodput at the SLO starred, the
cold start beside it and the decode runs of the same model as static-batch lines
(:mod:`tpubench.analysis.serving`); then the decode and prefill runs' own sweeps (batch x prompt
length: TTFT, TPOT and ITL percentiles, tokens/s, bandwidth utilisation), the latest run of
each configuration."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard import charts, data, state, ui
from tpubench.analysis import serving as serving_analysis
from tpubench.analysis.prices import load_prices
from tpubench.serving.metrics import PERCENTILES

SWEEP_HINT = "tpubench run --suite llm --mode decode --batch-size 1,8,32 --prompt-len 128,1024 --gen-len 128"
IMPORT_HINT = (
    "tpubench import vllm-bench RESULT.json --device 'NVIDIA H100 80GB HBM3'   # or: tpubench import sglang F.jsonl"
)
#: the throughput axes of the engines' curves
THROUGHPUTS = {"output_throughput": "output tokens/s", "output_tokens_per_usd": "output tokens per USD"}
LABELS = {
    "batch_size": "batch size",
    "seq_len": "prompt length (tokens)",
    "tpot_p50_ms": "TPOT p50 (ms)",
    "ttft_p50_ms": "TTFT p50 (ms)",
    "output_tokens_per_s": "output tokens/s",
    "bandwidth_util": "HBM bandwidth utilisation (fraction of peak)",
    "backend": "backend",
    "prompt": "prompt",
    "batch": "batch",
}


def percentiles(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per run: configuration, and p50/p90/p99 of TTFT, TPOT and ITL in ms."""
    table = pd.DataFrame(
        {
            "backend": runs["backend"],
            "device": runs["device"],
            "mode": runs["mode"],
            # a store holding a workload without a sequence gives seq_len nulls, which read
            # back as floats: 128.0 tokens; shown as whole numbers
            "batch": runs["batch_size"].astype("Int64"),
            "prompt": runs["seq_len"].astype("Int64"),
            "generated": runs["gen_len"].astype("Int64"),
        }
    )
    for metric in ("ttft", "tpot", "itl"):
        for p in PERCENTILES:
            table[f"{metric.upper()} p{p} ms"] = runs[f"{metric}_p{p}_ms"]
    table["output tokens/s"] = runs["output_tokens_per_s"]
    table["bandwidth util %"] = 100 * runs["bandwidth_util"]
    table["run"] = "run_details?run=" + runs["run_id"]
    return table.sort_values(["mode", "backend", "batch", "prompt"])


def engines(results: str, curves: pd.DataFrame, static: pd.DataFrame, points: pd.DataFrame, model: str) -> None:
    """The model's engines under load: latency against tok/s and tok/s per dollar, a line per
    engine on a chip and per static batch, the best goodput starred, the cold start beside."""
    st.subheader("Engines under load")
    lines = pd.concat([frame for frame in (curves, static) if not frame.empty], ignore_index=True)
    options = list(serving_analysis.LATENCIES)
    latency = st.selectbox(
        "Latency", options, format_func=serving_analysis.LATENCIES.__getitem__,
        key=state.bind("latency", options[0], choices=options),
    )  # fmt: skip
    goodput = serving_analysis.goodput_points(curves)
    bound = serving_analysis.slo_bound(curves, latency)
    labels = {**THROUGHPUTS, **serving_analysis.LATENCIES}
    left, right = st.columns([3, 2])
    left.plotly_chart(
        charts.serving_curves(lines, "output_throughput", latency, labels, f"{labels[latency]} by output tokens/s",
                              goodput, bound),
        key="serving-curves",
    )  # fmt: skip
    starts = serving_analysis.cold_starts(points[points["model"] == model])
    if starts.empty:
        right.info("No cold start: these points were imported, or their engine was not started by tpubench.")
    else:
        right.plotly_chart(charts.cold_start_bars(starts), key="serving-cold-start")
    priced = lines[lines["output_tokens_per_usd"].notna()]
    if priced.empty:
        st.info("No tokens per dollar: no line's chip has a price (give --price-per-hour, or TPUBENCH_PRICES).")
    else:
        st.plotly_chart(
            charts.serving_curves(priced, "output_tokens_per_usd", latency, labels,
                                  f"{labels[latency]} by output tokens per USD", goodput, bound),
            key="serving-per-dollar",
        )  # fmt: skip
        unpriced = sorted(set(lines["line"]) - set(priced["line"]))
        if unpriced:
            st.caption("Without a price (left out above): " + "; ".join(unpriced))
    st.caption(
        "A line per engine on a chip; dashed: the decode mode's static batch of the same model (one batch, no "
        "arrivals, queueing or continuous batching: a bound, not a load point). Star: each line's point of highest "
        "goodput, the requests per second that met every SLO; dotted: the SLO on this latency. Cost per hour: "
        "every device the engine served on."
    )
    ui.table(points_table(lines, goodput).style.format(precision=2, thousands=",", na_rep="-"))
    with st.expander("A point's requests"):
        requests(results, curves)


def requests(results: str, curves: pd.DataFrame) -> None:
    """One engine point's requests (the serving_requests table): lengths, send time, latencies,
    chunk count and error, where its sweep or file kept them."""
    labels = dict(zip(curves["run_id"], curves["line"] + " · " + curves["load"], strict=True))
    options = list(labels)
    chosen = st.selectbox(
        "Point", options, format_func=labels.__getitem__, key=state.bind("point", options[0], choices=options)
    )
    invocation = curves.loc[curves["run_id"] == chosen, "invocation_id"].iloc[0]
    loaded = data.serving_requests(results, invocation, chosen)
    ui.warn_skipped(loaded.skipped)
    rows = loaded.frame.sort_values("request")
    if rows.empty:
        st.caption("No request of this point was kept (vLLM keeps them with --save-detailed, SGLang --output-details).")
        return
    chunks = rows["itl_ms"].map(lambda gaps: len(gaps) + 1 if gaps is not None else None)
    table = rows[["request", "input_len", "output_len", "send_s", "ttft_ms", "tpot_ms", "e2el_ms", "error"]]
    ui.table(table.assign(chunks=chunks).style.format(precision=2, thousands=",", na_rep="-"))


def points_table(lines: pd.DataFrame, goodput: pd.DataFrame) -> pd.DataFrame:
    """Every point drawn: its line and load, throughput, latencies, goodput, cost, where it came from."""
    best = set(goodput["run_id"])
    return pd.DataFrame(
        {
            "line": lines["line"],
            "load": lines["load"],
            "output tok/s": lines["output_throughput"],
            "req/s": lines["request_throughput"],
            **{label: lines[column] for column, label in serving_analysis.LATENCIES.items()},
            "goodput req/s": lines["request_goodput"],
            "SLO (ms)": lines["goodput_slos"],
            "best goodput": lines["run_id"].isin(best),
            "USD per M output tokens": lines["cost_per_m_output_tokens"],
            "source": lines["source"],
        }
    )


def decode_runs(view: ui.View) -> pd.DataFrame:
    """The latest ok prefill and decode run of each configuration the filters keep, with the
    serving columns; empty for a store without runs."""
    if view.runs.empty:
        return pd.DataFrame()
    serving = view.runs[view.runs["mode"].isin(data.SERVING_MODES) & (view.runs["status"] == "ok")]
    if serving.empty:
        return pd.DataFrame()
    latest = data.latest_per_config(serving)
    # read by invocation, not by run: a filter that hides a backend then finds the rows cached
    loaded = data.runs(view.results, tuple(sorted(latest["invocation_id"].unique())), None, data.SERVING_COLUMNS)
    ui.warn_skipped(loaded.skipped)
    return loaded.frame[loaded.frame["run_id"].isin(latest["run_id"])]


def main() -> None:
    view = ui.store_view()
    if view is None:
        return
    st.title("Serving")
    loaded = data.serving_points(view.results)
    ui.warn_skipped(loaded.skipped)
    points = loaded.frame
    runs = decode_runs(view)
    if points.empty and runs.empty:
        if view.problem == "empty":
            ui.empty_state(view)
        st.info("No serving point, and no ok prefill or decode run matches the filters. What fills this page:")
        st.code(SWEEP_HINT, language="bash")
        st.code(IMPORT_HINT, language="bash")
        return
    models = serving_analysis.models(points, runs)
    model = st.selectbox("Model", models, key=state.bind("model", models[0], choices=models))
    curves = data.serving_curves(view.results)
    curves = curves[curves["model"] == model]
    static = serving_analysis.static_batch(runs, load_prices()) if not runs.empty else pd.DataFrame()
    static = static[static["model"] == model] if not static.empty else static
    if not curves.empty:
        engines(view.results, curves, static, points, model)
    mine = runs[serving_analysis.run_models(runs) == model] if not runs.empty else runs
    if not mine.empty:
        decode_sweep(mine)


def decode_sweep(runs: pd.DataFrame) -> None:
    """The decode and prefill runs' sweeps: TPOT, tokens/s, TTFT and bandwidth by batch and prompt."""
    runs = runs.assign(prompt=runs["seq_len"], batch=runs["batch_size"])  # short panel titles
    st.caption(
        f"The latest ok run of each configuration ({len(runs)} runs, "
        f"{runs['started_at'].min():%Y-%m-%d} to {runs['started_at'].max():%Y-%m-%d}). TTFT: time to the first "
        "token (the prefill); TPOT: time per output token after it; ITL: every gap between tokens (vLLM's "
        "definitions). Bandwidth utilisation counts every weight and the whole KV cache per step (an upper bound)."
    )
    decode, prefill = runs[runs["mode"] == "decode"], runs[runs["mode"] == "prefill"]
    if not decode.empty:
        st.subheader("Decode")
        left, right = st.columns(2)
        left.plotly_chart(
            charts.serving_chart(
                decode, "batch_size", "tpot_p50_ms", "prompt", LABELS, "TPOT p50 (ms) by batch, per prompt length"
            ),
            key="serving-tpot",
        )
        right.plotly_chart(
            charts.serving_chart(
                decode, "batch_size", "output_tokens_per_s", "prompt", LABELS, "Output tokens/s by batch"
            ),
            key="serving-tokens",
        )
        left, right = st.columns(2)
        left.plotly_chart(
            charts.serving_chart(decode, "seq_len", "ttft_p50_ms", "batch", LABELS, "TTFT p50 (ms) by prompt length"),
            key="serving-ttft",
        )
        if decode["bandwidth_util"].notna().any():
            right.plotly_chart(
                charts.serving_chart(
                    decode, "batch_size", "bandwidth_util", "prompt", LABELS, "Bandwidth utilisation by batch"
                ),
                key="serving-bandwidth",
            )
        else:
            right.info("No bandwidth utilisation: the devices have no peak bandwidth entry (every CPU).")
    if not prefill.empty:
        st.subheader("Prefill")
        st.plotly_chart(
            charts.serving_chart(prefill, "seq_len", "ttft_p50_ms", "batch", LABELS, "TTFT p50 (ms) by prompt length"),
            key="serving-prefill",
        )
    st.subheader("Percentiles")
    ui.table(percentiles(runs).style.format(precision=2, thousands=","), links=("run",))


main()
