"""Compilation: compile count per step, first-step and compile time, recompilations after
warm-up, compile-cache hits and CPU-fallback ops per workload: the TPU migration blockers."""

from __future__ import annotations

import json

import pandas as pd
import streamlit as st

from dashboard import charts, data, ui


def fallbacks(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per (run, CPU-fallback op): op, count, backend, run (from the runs' JSON column)."""
    rows = []
    for run in runs[runs["fallback_ops"].notna()].itertuples():
        for op, count in json.loads(run.fallback_ops).items():
            rows.append({"op": op, "count": count, "backend": run.backend, "run": run.label, "run_id": run.run_id})
    return pd.DataFrame(rows, columns=["op", "count", "backend", "run", "run_id"])


def facts(runs: pd.DataFrame, fallback: pd.DataFrame) -> pd.DataFrame:
    per_run = fallback.groupby("run_id")["op"].apply(lambda ops: ", ".join(sorted(ops))).astype("string")
    return pd.DataFrame(
        {
            "configuration": charts.config_label(runs),
            "backend": runs["backend"],
            "status": runs["status"],
            "first step s": runs["first_step_s"],
            "compile s": runs["compile_s"],
            "graphs compiled": runs["compile_count"].astype("Int64"),
            "in the first step": runs["first_step_compiles"].astype("Int64"),
            "recompiles after warm-up": runs["recompiles_after_warmup"].astype("Int64"),
            "cache hits": runs["compile_cache_hits"].astype("Int64"),
            "cache misses": runs["compile_cache_misses"].astype("Int64"),
            "CPU-fallback executions": runs["fallback_op_count"].astype("Int64"),
            "CPU-fallback ops": runs["run_id"].map(per_run).astype("string").fillna(""),
            "run": "run_details?run=" + runs["run_id"],
        }
    )


def main() -> None:
    view = ui.page_view()
    if view is None:
        return
    st.title("Compilation")
    invocation = ui.invocation_picker(view.runs)
    ids = tuple(view.runs.loc[view.runs["invocation_id"] == invocation, "run_id"])
    loaded = data.runs(view.results, (invocation,), ids)
    ui.warn_skipped(loaded.skipped)
    runs = loaded.frame.copy()
    runs["label"] = data.series_label(runs)
    fallback = fallbacks(runs)
    recompiling = runs[runs["recompiles_after_warmup"].fillna(0) > 0]
    columns = st.columns(3)
    columns[0].metric("Runs that recompiled after warm-up", len(recompiling))
    columns[1].metric("Runs with CPU-fallback ops", fallback["run_id"].nunique())
    columns[2].metric("Distinct CPU-fallback ops", fallback["op"].nunique())
    for run in recompiling.itertuples():
        st.error(
            f"{run.label}: {int(run.recompiles_after_warmup)} compilation(s) while measuring, so its step times "
            "include compiling: a shape or a Python value changes between steps."
        )
    if not fallback.empty:
        st.plotly_chart(charts.fallback_bar(fallback), key="compile-fallbacks")
    if runs["first_step_s"].notna().any():
        st.plotly_chart(charts.compile_times(runs), key="compile-times")
    compiled = runs[runs["compile_count"].fillna(0) > 0]
    if not compiled.empty:
        steps = data.steps(
            view.results, (invocation,), tuple(compiled["run_id"]), None, ("run_id", "step", "phase", "compile_count")
        )
        ui.warn_skipped(steps.skipped)
        st.plotly_chart(
            charts.compile_counts(
                steps.frame,
                dict(zip(compiled["run_id"], compiled["label"], strict=True)),
                dict(zip(compiled["run_id"], compiled["backend"], strict=True)),
            ),
            key="compile-counts",
        )
    else:
        st.info("No run of this invocation compiled a graph (eager backends only).")
    st.subheader("Per run")
    ui.table(facts(runs, fallback).style.format(precision=2, thousands=","), links=("run",))
    st.caption(
        "Cache hits and misses: XLA's persistent cache, or Inductor's FX-graph cache (with `--compile-cache DIR`). "
        "CPU-fallback ops: aten ops XLA ran on the host (`PJRT`), each a transfer to and from the device."
    )


main()
