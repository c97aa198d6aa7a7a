"""Compilation: why each run compiled and what it cost (the compiles table), graph breaks and
host syncs, first-step and compile time, compile-cache hits and CPU-fallback ops: the TPU
migration blockers."""

from __future__ import annotations

import json

import pandas as pd
import streamlit as st

from dashboard import charts, data, ui
from tpubench.analysis import compiles as analysis
from tpubench.analysis.identity import config_labels


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
            "configuration": config_labels(runs),
            "backend": runs["backend"],
            "status": runs["status"],
            "first step s": runs["first_step_s"],
            "compile s": runs["compile_s"],
            "graphs compiled": runs["compile_count"].astype("Int64"),
            "in the first step": runs["first_step_compiles"].astype("Int64"),
            "recompiles after warm-up": runs["recompiles_after_warmup"].astype("Int64"),
            "compile s in measured steps": runs["compile_s_measured"],
            "cache hits": runs["compile_cache_hits"].astype("Int64"),
            "cache misses": runs["compile_cache_misses"].astype("Int64"),
            "CPU-fallback executions": runs["fallback_op_count"].astype("Int64"),
            "CPU-fallback ops": runs["run_id"].map(per_run).astype("string").fillna(""),
            "run": "run_details?run=" + runs["run_id"],
        }
    )


def breaks_and_syncs(runs: pd.DataFrame) -> pd.DataFrame:
    """Per run that has any: graph breaks by id, XLA executions and host reads per measured step
    (1 execution is a clean step), and real missing lowerings kept apart from `.item()` reads."""
    shown = runs[
        runs["graph_breaks"].fillna(0).gt(0)
        | runs["executions_per_step"].notna()
        | runs["host_reads_per_step"].fillna(0).gt(0)
    ]
    return pd.DataFrame(
        {
            "run": shown["label"],
            "graph breaks": shown["graph_breaks"].astype("Int64"),
            "by id": shown["graph_break_ids"].replace("{}", "").fillna(""),
            "executions per step": shown["executions_per_step"],
            "host reads per step": shown["host_reads_per_step"],
            "missing lowerings": shown["missing_lowerings"].replace("{}", "").fillna(""),
            "details": "run_details?run=" + shown["run_id"],
        }
    )


def headline(runs: pd.DataFrame, events: pd.DataFrame) -> None:
    """The four figures: runs that recompiled after warm-up, broke a graph, hit the recompile
    limit, and the compile seconds paid inside measured steps."""
    broke = set(runs.loc[runs["graph_breaks"].fillna(0) > 0, "run_id"])
    broke |= set(events.loc[events["event"] == "graph_break", "run_id"])
    limited = set(runs.loc[runs["recompile_limit_hit"].fillna(False).astype(bool), "run_id"])
    limited |= set(events.loc[events["event"] == "recompile_limit", "run_id"])
    columns = st.columns(4)
    columns[0].metric("Runs that recompiled after warm-up", int((runs["recompiles_after_warmup"].fillna(0) > 0).sum()))
    columns[1].metric("Runs with graph breaks", len(broke))
    columns[2].metric("Runs that hit the recompile limit", len(limited))
    columns[3].metric("Compile s inside measured steps", f"{runs['compile_s_measured'].fillna(0).sum():.3g}")
    labels = dict(zip(runs["run_id"], runs["label"], strict=True))
    for run in runs[runs["recompiles_after_warmup"].fillna(0) > 0].itertuples():
        why = analysis.top_cause(events[events["run_id"] == run.run_id])
        st.error(
            f"{run.label}: {int(run.recompiles_after_warmup)} compilation(s) while measuring, so its step times "
            "include compiling: " + (why or "its cause was not captured (`tpubench compiles RUN_ID --explain`)")
        )
    for run_id in sorted(limited):
        st.warning(
            f"{labels.get(run_id, run_id)}: a frame hit Dynamo's recompile limit and runs eagerly since, so its "
            "compile count stopped growing although it is no longer compiled"
        )


def timeline(results: str, invocation: str, runs: pd.DataFrame, events: pd.DataFrame) -> None:
    """Step time against the seconds each step spent compiling, for one run picked here."""
    candidates = runs[runs["run_id"].isin(analysis.compile_rows(events)["run_id"])]
    if candidates.empty:
        return
    st.subheader("Cost per step")
    labels = dict(zip(candidates["run_id"], candidates["label"], strict=True))
    run_id = st.selectbox("Run", list(labels), format_func=labels.__getitem__, key="compile-run")
    steps = data.steps(results, (invocation,), (run_id,), None, ("run_id", "step", "phase", "step_ms"))
    ui.warn_skipped(steps.skipped)
    mine = analysis.run_events(events, run_id)
    figure = charts.compile_timeline(
        steps.frame, analysis.seconds_per_step(mine), analysis.cache_states(mine), labels[run_id]
    )
    st.plotly_chart(figure, key="compile-timeline")
    run = runs[runs["run_id"] == run_id].iloc[0]
    measured = int(run["measured_steps"]) if pd.notna(run["measured_steps"]) else None
    st.code("\n".join(analysis.summary(mine, measured)), language=None)


def opening(runs: pd.DataFrame) -> tuple[str | None, list[str]]:
    """The invocation the page opens on, the latest that compiled a graph (a cpu run after a
    night of compiled ones opened it on "no run of this invocation compiled a graph"), and the
    newer ones it passes over; (None, []) when none compiled: the newest, then."""
    compiled = runs.loc[runs["compile_count"].fillna(0) > 0, ["invocation_id", "started_at"]]
    if compiled.empty:
        return None, []
    chosen = compiled.sort_values("started_at")["invocation_id"].iloc[-1]
    newest = list(data.invocations(runs)["invocation_id"])
    return chosen, newest[: newest.index(chosen)]


def main() -> None:
    view = ui.page_view()
    if view is None:
        return
    st.title("Compilation")
    default, newer = opening(view.runs)
    invocation = ui.invocation_picker(view.runs, default=default)
    if invocation == default and newer:
        st.caption(
            f"Opened on `{default}`, the latest invocation with a run that compiled a graph; the "
            f"{len(newer)} newer one(s) ({', '.join(f'`{n}`' for n in newer)}) compiled nothing."
        )
    kept = view.runs.loc[view.runs["invocation_id"] == invocation, "run_id"]
    # the invocation's files read whole and its kept runs picked here: a filter that hides some
    # of its runs then finds them cached (Overview does the same)
    loaded = data.runs(view.results, (invocation,))
    captured = data.compiles(view.results, (invocation,))
    ui.warn_skipped((*loaded.skipped, *captured.skipped))
    runs = loaded.frame[loaded.frame["run_id"].isin(kept)].copy()
    runs["label"] = data.series_label(runs)
    events = captured.frame[captured.frame["run_id"].isin(kept)]
    fallback = fallbacks(runs)
    headline(runs, events)
    why = analysis.why_table(events)
    if not why.empty:
        st.subheader("Why it compiled")
        ui.table(why.style.format({"compile_s": "{:.3g}"}, na_rep="-"))
        st.caption(
            "Grouped by cause and source line over the invocation. Reported by the backend: Dynamo's own "
            "recompile reason or graph-break id; inferred by tpubench: XLA never says 'shape', so a new graph "
            "at the same sync line is inferred to be a shape change (`tpubench compiles RUN_ID --explain` "
            "diffs the graphs' IR to say which shape)."
        )
    timeline(view.results, invocation, runs, events)
    syncs = breaks_and_syncs(runs)
    if not syncs.empty:
        st.subheader("Graph breaks and host syncs")
        ui.table(syncs, links=("details",))
    if not fallback.empty:
        st.plotly_chart(charts.fallback_bar(fallback), key="compile-fallbacks")
    if runs["first_step_s"].notna().any():
        st.plotly_chart(charts.compile_times(runs), key="compile-times")
    compiled = runs[runs["compile_count"].fillna(0) > 0]
    uncaptured = compiled[~compiled["run_id"].isin(events["run_id"])]
    if not uncaptured.empty:  # runs from before the compiles table, or with the capture off
        steps = data.steps(
            view.results, (invocation,), tuple(uncaptured["run_id"]), None, ("run_id", "step", "phase", "compile_count")
        )
        ui.warn_skipped(steps.skipped)
        st.plotly_chart(
            charts.compile_counts(
                steps.frame,
                dict(zip(uncaptured["run_id"], uncaptured["label"], strict=True)),
                dict(zip(uncaptured["run_id"], uncaptured["backend"], strict=True)),
            ),
            key="compile-counts",
        )
    elif compiled.empty and events.empty:
        st.info("No run of this invocation compiled a graph (eager backends only).")
    st.subheader("Per run")
    ui.table(facts(runs, fallback).style.format(precision=2, thousands=","), links=("run",))
    st.caption(
        "Cache hits and misses: XLA's persistent cache, or Inductor's FX-graph cache (with `--compile-cache DIR`). "
        "CPU-fallback ops: aten ops XLA ran on the host (`PJRT`), each a transfer to and from the device."
    )


main()
