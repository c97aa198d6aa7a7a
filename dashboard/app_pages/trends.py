"""Trends: each series' metric over time (step time with its p10-p90 band), with the change
points ``tpubench regressions`` finds marked; a point leads to its run. A store with serving
points offers their history too, one series per serving configuration, as ``tpubench
regressions --serving`` follows it."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard import charts, data, state, ui

#: how far back from the newest filtered run: days, or None for everything
WINDOWS = {"30": 30, "90": 90, "365": 365, "all": None}
WINDOW_LABELS = {"30": "30 days", "90": "90 days", "365": "a year", "all": "all of it"}
#: series drawn at once (one panel each); more are listed below the chart
MAX_PANELS = 6
DEFAULT_PANELS = 4


def window_runs(runs: pd.DataFrame, window: str) -> pd.DataFrame:
    days = WINDOWS[window]
    if days is None:
        return runs
    return runs[runs["started_at"] >= runs["started_at"].max() - pd.Timedelta(days=days)]


#: what Trends can follow in a store that holds serving points
KINDS = {"runs": "runs", "serving": "serving points"}


def main() -> None:
    store_view = ui.store_view()  # first: a store that cannot be read is said, not raised
    if store_view is None:
        return
    serving = data.serving_trend_points(store_view.results)
    if serving.empty:  # the page as it was before serving points
        if ui.has_runs(store_view):
            st.title("Trends")
            runs_trends(store_view)
        return
    st.title("Trends")
    kind = st.radio(
        "Series of",
        list(KINDS),
        format_func=KINDS.__getitem__,
        horizontal=True,
        key=state.bind("kind", "runs", choices=list(KINDS)),
    )
    if kind == "serving":
        serving_trends(store_view.results, serving)
    elif store_view.runs.empty:
        st.info("No runs match the filters in the sidebar (or the store holds none): see its serving points.")
    else:
        runs_trends(store_view)


def serving_trends(results: str, points: pd.DataFrame) -> None:
    """The serving points' history: one series per serving configuration, one point per sweep's
    point, the change points ``tpubench regressions --serving`` finds."""
    left, right = st.columns([2, 1])
    metrics = data.SERVING_TREND_METRICS
    metric = left.selectbox(
        "Figure",
        list(metrics),
        format_func=metrics.__getitem__,
        key=state.bind("serving_metric", "tpot_p50_ms", choices=list(metrics)),
    )
    window = right.radio(
        "Window, back from the newest sweep",
        list(WINDOWS),
        format_func=WINDOW_LABELS.__getitem__,
        horizontal=True,
        key=state.bind("serving_window", "30", choices=list(WINDOWS)),
    )
    chosen = window_runs(points, window)
    chosen = chosen[(chosen["status"] == "ok") & chosen[metric].notna()]
    if chosen.empty:
        st.info(f"No ok serving point in the window has a value for {metrics[metric]}.")
        return
    lengths = chosen.groupby("series")["invocation_id"].nunique()
    all_series = sorted(lengths.index, key=lambda name: (-lengths[name], name))
    changes = data.serving_change_points(results, tuple(sorted(chosen["invocation_id"].unique())), metric)
    flagged = list(dict.fromkeys(changes.sort_values("started_at", ascending=False)["series"]))
    default = (flagged + [s for s in all_series if s not in flagged])[:DEFAULT_PANELS]
    shown = st.multiselect(
        f"Serving series ({len(all_series)} in the window; those with change points, then the longest, first)",
        all_series,
        key=state.bind("serving_series", default, "list", all_series),
        max_selections=MAX_PANELS,
    )
    regressions = int((changes["direction"] == "regression").sum()) if not changes.empty else 0
    st.caption(
        f"{len(changes)} change point(s), {regressions} of them regressions, in {len(all_series)} serving series. "
        "One point per sweep; a change point must last 3 sweeps on each side and pass a Welch's t-test on the "
        "log values (p < 0.01, ≥ 5%). The engine version is not part of a series: a release's change shows in it."
    )
    if shown:
        st.plotly_chart(charts.trend_chart(chosen, shown, changes, metric, metrics[metric]), key="serving_trend")
    st.subheader("Change points")
    if changes.empty:
        st.success("No change point in the serving series of the window.")
        return
    ui.table(change_table(changes, {"engine version": changes["engine_version"]}))


def runs_trends(view: ui.View) -> None:
    """The runs' history (the page as it was before serving points)."""
    left, right = st.columns([2, 1])
    metric = left.selectbox(
        "Metric",
        list(data.TREND_METRICS),
        format_func=data.TREND_METRICS.__getitem__,
        key=state.bind("metric", "median_step_ms", choices=list(data.TREND_METRICS)),
    )
    window = right.radio(
        "Window, back from the newest run",
        list(WINDOWS),
        format_func=WINDOW_LABELS.__getitem__,
        horizontal=True,
        key=state.bind("window", "30", choices=list(WINDOWS)),
        help="Change points are tested within the window. Their test costs the square of a series' points: "
        "on a big store a long window takes seconds the first time (then it is cached).",
    )
    chosen = window_runs(view.runs, window)
    invocations = tuple(sorted(chosen["invocation_id"].unique()))
    loaded = data.trend_runs(view.results, invocations, metric)
    ui.warn_skipped(loaded.skipped)
    points = loaded.frame[loaded.frame["run_id"].isin(chosen["run_id"])]
    points = points[(points["status"] == "ok") & points[metric].notna()]
    if points.empty:
        st.info(f"No ok run in the window has a value for {data.TREND_METRICS[metric]}.")
        return
    # the longest histories first: a series measured once has no trend to show
    lengths = points.groupby("series")["invocation_id"].nunique()
    all_series = sorted(lengths.index, key=lambda name: (-lengths[name], name))
    changes = data.change_points(view.results, invocations, metric)
    changes = changes[changes["series"].isin(all_series)]
    flagged = list(dict.fromkeys(changes.sort_values("started_at", ascending=False)["series"]))
    default = (flagged + [s for s in all_series if s not in flagged])[:DEFAULT_PANELS]
    shown = st.multiselect(
        f"Series ({len(all_series)} in the window; those with change points, then the longest, first)",
        all_series,
        key=state.bind("series", default, "list", all_series),
        max_selections=MAX_PANELS,
        help=f"Up to {MAX_PANELS} at once, one panel each.",
    )
    regressions = int((changes["direction"] == "regression").sum()) if not changes.empty else 0
    st.caption(
        f"{len(changes)} change point(s), {regressions} of them regressions, in {len(all_series)} series over "
        f"{len(invocations)} invocations. A change point must last 3 invocations on each side and pass a "
        "Welch's t-test on the log values (p < 0.01, ≥ 5%): a single slow night is not one."
    )
    if shown:
        figure = charts.trend_chart(points, shown, changes, metric, data.TREND_METRICS[metric])
        event = st.plotly_chart(figure, key="trend", on_select="rerun", selection_mode="points")
        picked = [point["customdata"][0] for point in event.selection.points if point.get("customdata")]
        if picked:
            st.page_link(
                "app_pages/run_details.py",
                label=f"Open run {picked[0]} in Run details",
                icon=":material/open_in_new:",
                query_params={"run": picked[0]},
            )
        else:
            st.caption("Click a point to open its run.")
    st.subheader("Change points")
    if changes.empty:
        st.success("No change point in the series shown by the filters and the window.")
        return
    first_runs = points.drop_duplicates(["series", "invocation_id"])[["series", "invocation_id", "run_id"]]
    listed = changes.merge(first_runs, on=["series", "invocation_id"], how="left")
    ui.table(
        change_table(listed, after={"first run after": "run_details?run=" + listed["run_id"].fillna("")}),
        links=("first run after",),
    )


def change_table(
    changes: pd.DataFrame, version: dict[str, pd.Series] | None = None, after: dict[str, pd.Series] | None = None
) -> pd.DataFrame:
    """The change points as both kinds of series list them, newest first: ``version`` columns
    before the git sha (a serving point's engine version), ``after`` columns last."""
    return pd.DataFrame(
        {
            "series": changes["series"],
            "from": pd.to_datetime(changes["started_at"], utc=True).dt.strftime("%Y-%m-%d %H:%M"),
            "direction": changes["direction"],
            "change %": changes["change_pct"].round(1),
            "before": changes["before"].round(3),
            "after": changes["after"].round(3),
            "p": changes["p_value"],
            **(version or {}),
            "git sha": changes["git_sha"],
            "invocation": changes["invocation_id"],
            **(after or {}),
        }
    ).sort_values("from", ascending=False)


main()
