"""Overview: one invocation (the latest by default) as a matrix of configuration x backend, and
every run that did not finish ok, with its reason."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard import charts, data, state, ui
from reports import summary_table
from tpubench.analysis import memory as memory_analysis
from tpubench.analysis.ceilings import CEILING_LOW
from tpubench.analysis.identity import config_labels
from tpubench.hostload import BUSY_SHARE, is_busy

#: what a matrix cell shows: summary column -> (label, how a value reads)
VALUES = {
    "median_step_ms": ("median step (ms)", lambda v: ui.number(v)),
    "tokens_per_s": ("tokens/s", lambda v: ui.number(v, 0)),
    "mfu": ("MFU (%)", lambda v: ui.number(100 * v, 1) if pd.notna(v) else "-"),
    "mfu_attained": ("MFU of measured ceiling (%)", lambda v: ui.number(100 * v, 1) if pd.notna(v) else "-"),
    "status": ("status", str),
}
NOT_OK_MARK = "✗ "
BUSY_MARK = " ⚠"  # some of the cell's runs were measured on a busy host


def matrix(summary: pd.DataFrame, value: str) -> pd.DataFrame:
    """Configurations as rows, backend (device) as columns; a cell whose runs were not all ok
    shows the status instead of a number, so a failure is never a blank."""
    frame = summary.copy()
    frame["configuration"] = config_labels(frame)
    frame["column"] = frame["backend"] + " (" + frame["device"].fillna("no device") + ")"
    read = VALUES[value][1]
    frame["cell"] = [
        (
            CEILING_LOW
            if value == "mfu_attained" and row["status"] == "ok" and row.get("ceiling_low_runs")
            else read(row[value])
            if row["status"] == "ok" or value == "status"
            else NOT_OK_MARK + row["status"]
        )
        + (BUSY_MARK if row["host_busy_runs"] else "")
        for row in frame.to_dict("records")
    ]
    pivot = frame.pivot_table(index="configuration", columns="column", values="cell", aggfunc="first")
    return pivot.reindex(sorted(pivot.columns, key=lambda c: (c.split(" ")[0], c)), axis=1).fillna("")


def _style(cell: str) -> str:
    if cell.startswith(NOT_OK_MARK) or cell in ("failed", "crashed", "timeout", "oom", "mismatch"):
        return "color: #c62828; font-weight: 600"
    return "color: #888" if cell in ("unavailable", "skipped") else ""


def problems(runs: pd.DataFrame) -> pd.DataFrame:
    """The runs that did not finish ok, with why and a link to their details."""
    bad = runs[runs["status"] != "ok"].copy()
    first_warning = bad["warnings"].fillna("").str.split("\n").str[0]
    reason = bad["error"].where(bad["error"].notna() & (bad["error"] != ""), first_warning)
    return pd.DataFrame(
        {
            "status": bad["status"],
            "configuration": config_labels(bad),
            "backend": bad["backend"],
            "device": bad["device"].fillna("-"),
            "reason": reason.fillna("").str.split("\n").str[0].str.slice(0, 300),
            "details": "run_details?run=" + bad["run_id"],
        }
    )


def busy_runs(busy: pd.DataFrame) -> pd.DataFrame:
    """The runs other processes competed with, each with their share of the CPUs."""
    return pd.DataFrame(
        {
            "configuration": config_labels(busy),
            "backend": busy["backend"],
            "median step (ms)": busy["median_step_ms"],
            "other processes' CPU share (%)": 100 * busy["host_other_cpu_share"],
            "details": "run_details?run=" + busy["run_id"],
        }
    )


def main() -> None:
    view = ui.page_view()
    if view is None:
        return
    st.title("Overview")
    invocation = ui.invocation_picker(view.runs)
    kept = view.runs.loc[view.runs["invocation_id"] == invocation, "run_id"]
    # the invocation read whole and its kept runs picked here: a filter that hides some of its
    # runs then finds the file's rows cached instead of reading the file again
    loaded = data.runs(view.results, (invocation,))
    ui.warn_skipped(loaded.skipped)
    runs = data.with_attained(view.results, loaded.frame[loaded.frame["run_id"].isin(kept)])
    counts = runs["status"].value_counts()
    columns = st.columns(5)
    columns[0].metric("Runs", len(runs))
    columns[1].metric("ok", int(counts.get("ok", 0)))
    columns[2].metric("Not ok", int(len(runs) - counts.get("ok", 0)))
    columns[3].metric("git sha", ", ".join(sorted(runs["git_sha"].dropna().unique())) or "-")
    columns[4].metric("Hosts", ", ".join(sorted(runs["host"].dropna().unique())) or "-")
    summary = summary_table(runs)
    value = st.radio(
        "Cells show",
        list(VALUES),
        format_func=lambda v: VALUES[v][0],
        horizontal=True,
        key=state.bind("value", "median_step_ms", choices=list(VALUES)),
    )
    st.subheader(f"{VALUES[value][0]} per configuration and backend")
    st.caption(
        "Repeated runs of a configuration are pooled (median of their medians). A cell marked ✗ did not finish "
        "ok: its status replaces the number. A cell marked ⚠ has runs measured on a busy host (other processes "
        f"used more than {100 * BUSY_SHARE:.0f}% of the CPUs): their times may be inflated. MFU is empty where the "
        "device has no peak FLOP/s entry (every CPU); MFU of measured ceiling where `tpubench ceilings` has not "
        "measured the device's matmul ceiling for the dtype (the Ceilings page); 'ceiling measured low' where a run "
        "beat its ceiling, which a busy host or a small sweep measured low."
    )
    ui.table(matrix(summary, value).style.map(_style), hide_index=False, height="content")
    if value == "mfu_attained":  # which measured ceiling the cells divide by, and why that sweep
        for choice in dict.fromkeys(runs["ceiling_choice"].dropna()):
            st.caption(f"Against {choice}")
    if summary["median_step_ms"].notna().any():
        st.plotly_chart(charts.step_bars(summary), key="overview-steps")
    ok = memory_analysis.with_breakdown(runs[runs["status"] == "ok"])  # labelled only where there is a bar
    parts = memory_analysis.stacked(ok, data.series_label(ok) + " · " + ok["run_id"].str[:6]) if len(ok) else None
    if parts is not None and not parts.empty:
        st.subheader("Memory by part per run")
        st.caption(
            "Per device: weights, gradients and optimizer state counted from the torch objects, activations + "
            "temporaries the measured peak above the baseline less them (empty where no device peak exists, e.g. "
            "XLA under SPMD); the red marker is the estimate that admitted the run."
        )
        st.plotly_chart(charts.memory_bars(parts), key="overview-memory")
    busy = runs[runs["host_other_cpu_share"].map(is_busy)]
    if not busy.empty:
        st.subheader(f"Runs measured on a busy host ({len(busy)})")
        ui.table(busy_runs(busy), links=("details",))
    bad = problems(runs)
    st.subheader(f"Runs that did not finish ok ({len(bad)})")
    if bad.empty:
        st.success("Every run of this invocation finished ok.")
    else:
        ui.table(bad, links=("details",))


main()
