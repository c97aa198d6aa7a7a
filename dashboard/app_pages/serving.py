"""Serving: TTFT, TPOT and ITL percentiles, tokens/s and bandwidth utilisation of prefill and
decode runs across backends and sweeps (batch x prompt length); the latest run of each
configuration."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard import charts, data, state, ui
from tpubench.serving.metrics import PERCENTILES

SWEEP_HINT = "tpubench run --suite llm --mode decode --batch-size 1,8,32 --prompt-len 128,1024 --gen-len 128"
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


def main() -> None:
    view = ui.page_view()
    if view is None:
        return
    st.title("Serving")
    serving = view.runs[view.runs["mode"].isin(data.SERVING_MODES) & (view.runs["status"] == "ok")]
    if serving.empty:
        st.info("No ok prefill or decode run matches the filters. A sweep that fills this page:")
        st.code(SWEEP_HINT, language="bash")
        return
    models = sorted((serving["workload"] + "/" + serving["size"]).unique())
    model = st.selectbox("Model", models, key=state.bind("model", models[0], choices=models))
    latest = data.latest_per_config(serving[(serving["workload"] + "/" + serving["size"]) == model])
    # read by invocation, not by run: a filter that hides a backend then finds the rows cached
    loaded = data.runs(view.results, tuple(sorted(latest["invocation_id"].unique())), None, data.SERVING_COLUMNS)
    ui.warn_skipped(loaded.skipped)
    runs = loaded.frame[loaded.frame["run_id"].isin(latest["run_id"])]
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
