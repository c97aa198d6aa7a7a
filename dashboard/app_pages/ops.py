"""Ops: where a profiled run's step went, by op and by category, and how two runs differ
(``tpubench ops`` and ``tpubench ops --diff``); the command that opens the trace."""

from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st

from dashboard import charts, data, state, ui
from tpubench.analysis import ops as analysis
from tpubench.analysis import roofline

NO_DIFF = ""
CATEGORY_COLUMNS = {
    "self_time_us": "self time, all traced steps (µs)",
    "self_us_per_step": "self µs per step",
    "self_pct": "% of step",
    "share": "share of self time",
}
RANKED_COLUMNS = {
    "self_us_per_step": "self µs per step",
    "self_pct": "% of step",
    "total_time_us": "total time, all traced steps (µs)",
    "bound_by": "bound by",
}


def _ops_of(view: ui.View, run_id: str) -> pd.DataFrame:
    loaded = data.run_ops(view.results, ui.invocation_of(view, run_id), run_id)
    ui.warn_skipped(loaded.skipped)
    return loaded.frame


def _no_rows(view: ui.View, run_id: str) -> None:
    st.info(
        f"Run `{run_id}` has a trace but no ops rows: its trace could not be read when it was ingested. "
        "Build them again with:"
    )
    st.code(f"tpubench ops --ingest {run_id} --results {ui.results_of(view, run_id)}", language="bash")


def ranked_table(ranked: pd.DataFrame) -> pd.DataFrame:
    columns = ["rank", "op", "category", "calls", "self_us_per_step", "self_pct", "total_time_us", "bound_by"]
    return ranked[columns].rename(columns=RANKED_COLUMNS)


def _roofline_of(view: ui.View, run_id: str) -> tuple[str, pd.DataFrame, roofline.RooflineCeilings]:
    """A run's ops by shape against its ceilings (:func:`data.run_roofline`), with the run's label."""
    return run_id, *data.run_roofline(view.results, ui.invocation_of(view, run_id), run_id)


SHARE_COLUMNS = {"time_us_per_step": "µs per step", "time_share": "% of step"}


def show_shares(shares: pd.DataFrame) -> None:
    """The traced step's lines, adding up to the step (the same table ``tpubench roofline``
    prints, :func:`tpubench.analysis.roofline.step_shares`)."""
    st.caption("The traced step by bound, per op and shape; the lines add up to the step:")
    ui.table(shares.rename(columns=SHARE_COLUMNS).style.format({"% of step": "{:.1%}"}, precision=1, thousands=","))


def _show_roofline(
    found: list[tuple[str, pd.DataFrame, roofline.RooflineCeilings]], key: str, shares: pd.DataFrame | None = None
) -> None:
    """The roofline chart of one or two runs, which ceilings it used, and (one run: its
    ``shares``) where its step went and what to fix first."""
    for run_id, table, ceilings in found:
        counted = table["intensity"].notna()
        st.caption(f"`{run_id}`: {ceilings.describe()}; {int(counted.sum())} of {len(table)} ops have FLOPs and bytes")
    for run_id, table, _ in found:
        if warning := roofline.above_ceiling(table):
            st.warning(f"`{run_id}`: {warning}.")
    st.plotly_chart(charts.roofline_chart(found), key=key)
    if shares is not None:
        _, table, ceilings = found[0]
        show_shares(shares)
        if ceilings.ridge is not None:
            ui.table(roofline.fix_first(table).style.format(precision=1, thousands=","))
    else:
        paired = roofline.pair(found[0][1], found[1][1])
        st.caption(f"Matched by {roofline.MATCHING}.")
        ui.table(paired.head(30).style.format(precision=2, thousands=","))


def main() -> None:
    view = ui.page_view()
    if view is None:
        return
    st.title("Ops")
    traced = np.flatnonzero(view.runs["trace_path"].notna().to_numpy())
    if not len(traced):
        st.info("No profiled run matches the filters. `--profile` traces a run and fills this page, e.g.:")
        st.code("tpubench run --workload gpt2 --size tiny --profile", language="bash")
        return
    # the newest only, all that the pickers list (the second one less the first's run), not
    # a copy of every profiled run of a year
    profiled = view.runs.iloc[traced[-(ui.RUN_CHOICES + 1) :]]
    run_id = ui.run_picker(profiled, view.index, "Profiled run", total=len(traced), needs="trace_path")
    if run_id is None:
        return
    ops = _ops_of(view, run_id)
    st.caption("Open this run's trace in its viewer (XProf or Perfetto, served on 127.0.0.1):")
    st.code(ui.trace_command(view, run_id), language="bash")
    if ops.empty:
        _no_rows(view, run_id)
        return
    sources = sorted(ops["source"].unique(), key=analysis.SOURCE_PREFERENCE.index)
    left, middle, right = st.columns(3)
    source = left.radio(
        "Ops from",
        sources,
        horizontal=True,
        key=state.bind("source", sources[0], choices=sources),
        help="kernel: CUDA kernels; hlo: XLA's ops on the device; aten: PyTorch's ops on the host. The most "
        "device-side one is the default.",
    )
    top = middle.slider("Top ops", 5, 50, key=state.bind("top", 20, "int", range(5, 51)))
    by = right.radio(
        "Rank by", ["self", "total"], horizontal=True, key=state.bind("by", "self", choices=["self", "total"])
    )
    rows = analysis.of_source(ops, source)
    first = rows.iloc[0]
    steps, traced_ms = first["traced_steps"], analysis.traced_step_ms(ops, source)
    if traced_ms is not None:
        devices = first.get("devices")
        per_device = (
            f"; per device of {int(devices)}" if devices is not None and devices == devices and devices > 1 else ""
        )
        st.caption(
            f"{source} ops from the {first['tool']}; {int(steps)} traced steps of {traced_ms:.2f} ms{per_device}"
        )
    invocation = ui.invocation_of(view, run_id)
    figures = ("run_id", "median_step_ms", "collective_ms", "collective_share")
    run = data.runs(view.results, (invocation,), (run_id,), figures).frame
    median = run["median_step_ms"]
    overhead = analysis.profiler_overhead(traced_ms, float(median.iloc[0]) if len(median) else None)
    if overhead:
        st.info(f"Profiler overhead: {overhead}.")
    if unsplit := analysis.unsplit_graphs(ops, source):
        st.warning(unsplit + ".")
    said = run.iloc[0].astype(object).where(run.iloc[0].notna(), None).to_dict() if len(run) else {}
    if overlap := analysis.overlapping_threads(ops, said, source):
        st.info(f"Overlapping threads: {overlap}.")
    ranked = analysis.top_ops(ops, n=top, by=by, source=source)
    left, right = st.columns([3, 2])
    left.plotly_chart(charts.top_ops_bar(ranked), key="ops-top")
    right.plotly_chart(charts.category_treemap(rows), key="ops-treemap")
    split = analysis.category_breakdown(ops, source).rename(columns=CATEGORY_COLUMNS)
    ui.table(split.style.format({"share of self time": "{:.1%}"}, precision=1, thousands=","))
    with st.expander("Top ops table"):
        ui.table(ranked_table(ranked).style.format(precision=1, thousands=","))
    st.subheader("Roofline")
    found = _roofline_of(view, run_id)
    _show_roofline([found], "ops-roofline", data.run_step_shares(view.results, invocation, run_id))
    st.subheader("Compare with another run")
    listed = profiled[profiled["run_id"] != run_id].iloc[::-1].head(ui.RUN_CHOICES)
    options = [NO_DIFF, *listed["run_id"]]
    # the listed runs' labels only: labelling every profiled run (10,000) took half of a rerun
    labels = dict(zip(listed["run_id"], data.run_label(listed), strict=True))
    other = st.selectbox(
        "Base run (the one above is the test)",
        options,
        format_func=lambda value: "(none)" if value == NO_DIFF else labels[value],
        key=state.bind("base", NO_DIFF, choices=options),
    )
    if other == NO_DIFF:
        return
    base = _ops_of(view, other)
    if base.empty:
        _no_rows(view, other)
        return
    same_source = analysis.primary_source(base) == analysis.primary_source(ops)
    by_key = "op" if same_source else "category"
    if not same_source:
        st.caption(
            "The two runs' ops come from different sources (e.g. CUDA kernels and XLA ops): compared by category."
        )
    if unsplit := analysis.unsplit_graphs(base):
        st.warning(f"Base run `{other}`: {unsplit}.")
    diff = analysis.diff_ops(base, ops, by=by_key)
    st.plotly_chart(charts.diff_bar(diff.head(top), by_key), key="ops-diff")
    ui.table(diff.style.format(precision=1, thousands=","))
    st.markdown("**Both runs on the roofline** (the base run's points are circles, this run's diamonds)")
    _show_roofline([_roofline_of(view, other), found], "ops-roofline-pair")
    where = data.store_of(view.results, view.index, [other, run_id])
    st.caption(
        f"In a terminal: `tpubench ops --diff {other} {run_id} --results {where}`"
        if where
        else "The two runs lie in different stores: merge them (docs/dashboard.md, Several machines) "
        "to diff them in a terminal."
    )


main()
