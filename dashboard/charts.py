"""Plotly figures of the dashboard: frames in, figures out, one colour per backend on every page.

Colours: a backend family has one hue, its compiled variant the darker shade, so ``cuda`` and
``cuda-compile`` read as relatives and a GPU never looks like a TPU. A backend from a plug-in
gets a colour from its name, the same on every page.

The figures drawn on the pages' first screens are built from plain dicts in one
``go.Figure`` call (:func:`_figure`), not by Plotly Express: Express builds a figure by
updating it trace by trace and axis by axis, validating every step, which cost ten times as
much (a faceted serving chart: 0.19 s of CPU against 0.02 s), on every rerun of a page.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable

import pandas as pd
import plotly.express as px
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from tpubench.analysis.categories import CATEGORIES
from tpubench.analysis.compiles import CAUSE_WORDS
from tpubench.analysis.identity import config_labels
from tpubench.analysis.ops import OTHERS
from tpubench.analysis.roofline import NO_CEILING, RooflineCeilings, line_of

BACKEND_COLOURS = {
    "cpu": "#6baed6",
    "cpu-compile": "#08519c",
    "cuda": "#74c476",
    "cuda-compile": "#006d2c",
    "xla": "#fd8d3c",
    "xla-compile": "#a63603",
    "tpu": "#9e9ac8",
    "tpu-compile": "#54278f",
}
_SPARE = px.colors.qualitative.Safe
BOUND_COLOURS = {"compute": "#c62828", "memory": "#1565c0", "overhead": "#f9a825", NO_CEILING: "#757575"}
VERDICT_COLOURS = {
    "regressed": "#c62828",
    "improved": "#2e7d32",
    "worse": "#ef9a9a",  # across backends: a difference, not a regression
    "better": "#a5d6a7",
    "unchanged": "#9e9e9e",
    "inconclusive": "#f9a825",
    "unpaired": "#cfcfcf",
}
DIRECTION_COLOURS = {"regression": VERDICT_COLOURS["regressed"], "improvement": VERDICT_COLOURS["improved"]}
CATEGORY_ORDER = (*CATEGORIES, OTHERS)  # the library's one category table, then top_ops' folded tail
CATEGORY_COLOURS = dict(zip(CATEGORY_ORDER, px.colors.qualitative.Set3, strict=False))


def colour(backend: str) -> str:
    return BACKEND_COLOURS.get(backend) or _SPARE[zlib.crc32(backend.encode()) % len(_SPARE)]


def colours(backends: Iterable[str]) -> dict[str, str]:
    return {backend: colour(backend) for backend in backends}


MARGIN = {"l": 10, "r": 10, "t": 40, "b": 10}
#: Plotly Express's line dashes, in the order it hands them out
DASHES = ("solid", "dot", "dash", "longdash", "dashdot", "longdashdot")


def _layout(figure: go.Figure, height: int = 420, **extra: object) -> go.Figure:
    figure.update_layout(height=height, margin=MARGIN, **extra)
    return figure


def _figure(traces: list[dict], layout: dict, height: int | None = 420) -> go.Figure:
    """A figure from plain dicts, validated once (see the module's doc); ``height`` None leaves
    the height and margins to the page."""
    sized = {"height": height, "margin": MARGIN} if height is not None else {}
    return go.Figure({"data": traces, "layout": {**layout, **sized}})


def _title(text: str) -> dict:
    return {"text": text}


def _hover(fields: list[tuple[str, str]]) -> str:
    """A hover text as Plotly Express writes it: ``label=value`` lines, no trace box."""
    return "<br>".join(f"{label}={value}" for label, value in fields) + "<extra></extra>"


def _hline(y: float, dash: str, colour_: str, text: str | None = None, xaxis: str = "x", yaxis: str = "y") -> dict:
    """A horizontal line across a panel (``add_hline``), and its note if ``text``."""
    return {
        "shape": {"type": "line", "xref": f"{xaxis} domain", "x0": 0, "x1": 1, "yref": yaxis, "y0": y, "y1": y,
                  "line": {"dash": dash, "color": colour_}},
        "annotation": {"text": text, "xref": f"{xaxis} domain", "x": 1, "yref": yaxis, "y": y, "showarrow": False,
                       "xanchor": "right", "yanchor": "bottom"} if text else None,
    }  # fmt: skip


def step_bars(summary: pd.DataFrame, title: str = "Median step time (ms), 95% CI") -> go.Figure:
    """Median step per configuration, one bar per backend (and device), with the CI of the median."""
    frame = summary[summary["median_step_ms"].notna()].copy()
    frame["configuration"] = config_labels(frame)
    frame["side"] = frame["backend"] + " (" + frame["device"].fillna("?") + ")"
    frame["plus"] = frame["ci_high_step_ms"] - frame["median_step_ms"]
    frame["minus"] = frame["median_step_ms"] - frame["ci_low_step_ms"]
    traces = [
        {
            "type": "bar",
            "name": backend,
            "legendgroup": backend,
            "x": rows["configuration"].tolist(),
            "y": rows["median_step_ms"].tolist(),
            "marker": {"color": colour(backend)},
            "error_y": {"type": "data", "array": rows["plus"].tolist(), "arrayminus": rows["minus"].tolist()},
            "customdata": rows[["side", "runs"]].to_numpy(object).tolist(),
            "hovertemplate": _hover(
                [
                    ("backend", backend),
                    ("configuration", "%{x}"),
                    ("median step (ms)", "%{y}"),
                    ("side", "%{customdata[0]}"),
                    ("runs", "%{customdata[1]}"),
                ]
            ),
        }
        for backend, rows in frame.groupby("backend", sort=False)
    ]
    layout = {
        "title": _title(title),
        "barmode": "group",
        "legend": {"title": _title("backend"), "tracegroupgap": 0},
        "xaxis": {"title": _title("")},
        "yaxis": {"title": _title("median step (ms)")},
    }
    return _figure(traces, layout)


def side_bars(base: pd.DataFrame, test: pd.DataFrame) -> go.Figure:
    """Baseline and candidate median step per configuration side by side, with their CIs.

    When each side is one backend and they differ (GPU against TPU), the sides are named and
    coloured by their backend; otherwise baseline is grey, candidate blue, and a configuration
    run on several backends gets a bar pair per backend.
    """
    sides = [frame[frame["median_step_ms"].notna()].copy() for frame in (base, test)]
    backends = [list(frame["backend"].unique()) for frame in sides]
    across = all(len(names) == 1 for names in backends) and backends[0] != backends[1]
    names = [f"baseline: {backends[0][0]}", f"candidate: {backends[1][0]}"] if across else ["baseline", "candidate"]
    palette = [colour(backends[0][0]), colour(backends[1][0])] if across else ["#9e9e9e", "#1f77b4"]
    several = not across and len(set(backends[0]) | set(backends[1])) > 1
    for frame, name in zip(sides, names, strict=True):
        frame["configuration"] = config_labels(frame) + (" · " + frame["backend"] if several else "")
        frame["side"] = name
    frame = pd.concat(sides, ignore_index=True)
    frame["plus"] = frame["ci_high_step_ms"] - frame["median_step_ms"]
    frame["minus"] = frame["median_step_ms"] - frame["ci_low_step_ms"]
    traces = []
    for name, tint in reversed(list(zip(names, palette, strict=True))):  # a group's first bar is drawn lowest
        rows = frame[frame["side"] == name]
        traces.append(
            {
                "type": "bar",
                "orientation": "h",
                "name": name,
                "legendgroup": name,
                "x": rows["median_step_ms"].tolist(),
                "y": rows["configuration"].tolist(),
                "marker": {"color": tint},
                "error_x": {"type": "data", "array": rows["plus"].tolist(), "arrayminus": rows["minus"].tolist()},
                "customdata": rows[["backend", "device", "runs"]].to_numpy(object).tolist(),
                "hovertemplate": _hover(
                    [
                        ("side", name),
                        ("median step (ms)", "%{x}"),
                        ("configuration", "%{y}"),
                        ("backend", "%{customdata[0]}"),
                        ("device", "%{customdata[1]}"),
                        ("runs", "%{customdata[2]}"),
                    ]
                ),
            }
        )
    layout = {
        "title": _title("Median step time (ms) of each side, 95% CI of the median"),
        "barmode": "group",
        "legend": {"title": _title(""), "tracegroupgap": 0, "traceorder": "reversed"},
        "xaxis": {"title": _title("median step (ms)")},
        "yaxis": {
            "title": _title(""),
            "categoryorder": "array",
            "categoryarray": sorted(frame["configuration"].unique(), reverse=True),
        },
    }
    return _figure(traces, layout, height=max(300, 80 + 30 * frame["configuration"].nunique()))


def ratio_chart(step_rows: pd.DataFrame) -> go.Figure:
    """Candidate ÷ baseline step time per configuration, its 95% CI, coloured by verdict."""
    frame = step_rows[step_rows["ratio"].notna()].copy()
    frame["configuration"] = config_labels(frame) + " · " + frame["test_backend"].fillna("")
    frame["change_pct"] = 100 * (frame["ratio"] - 1)
    frame["plus"] = 100 * (frame["ci_high"] - frame["ratio"])
    frame["minus"] = 100 * (frame["ratio"] - frame["ci_low"])
    label = "step time change, candidate vs baseline (%)"
    traces = [
        {
            "type": "bar",
            "orientation": "h",
            "name": verdict,
            "legendgroup": verdict,
            "x": rows["change_pct"].tolist(),
            "y": rows["configuration"].tolist(),
            "marker": {"color": VERDICT_COLOURS.get(verdict)},
            "error_x": {"type": "data", "array": rows["plus"].tolist(), "arrayminus": rows["minus"].tolist()},
            "customdata": [[reason] for reason in rows["reason"]],
            "hovertemplate": _hover(
                [("verdict", verdict), (label, "%{x}"), ("configuration", "%{y}"), ("reason", "%{customdata[0]}")]
            ),
        }
        for verdict, rows in frame.groupby("verdict", sort=False)
    ]
    layout = {
        "title": _title("Step time change (%) with its 95% CI; above 0 is slower"),
        "barmode": "relative",
        "legend": {"title": _title("verdict"), "tracegroupgap": 0},
        "xaxis": {"title": _title(label)},
        "yaxis": {"title": _title(""), "categoryorder": "array", "categoryarray": list(frame["configuration"])[::-1]},
        "shapes": [{"type": "line", "xref": "x", "x0": 0, "x1": 0, "yref": "y domain", "y0": 0, "y1": 1,
                    "line": {"color": "#555"}}],
    }  # fmt: skip
    return _figure(traces, layout, height=max(300, 60 + 28 * len(frame)))


def speedup_chart(cross: pd.DataFrame) -> go.Figure:
    """Speedup (baseline step ÷ candidate step) per configuration; 1 means as fast."""
    frame = cross.copy()
    frame["configuration"] = config_labels(frame)
    frame["pair"] = frame["base_backend"] + " → " + frame["test_backend"]
    figure = px.bar(
        frame,
        x="configuration",
        y="speedup",
        color="test_backend",
        color_discrete_map=colours(frame["test_backend"].unique()),
        hover_data={"pair": True, "base_step_ms": ":.2f", "test_step_ms": ":.2f", "cost_ratio": ":.2f"},
        labels={"speedup": "speedup (x baseline)", "configuration": "", "test_backend": "candidate"},
        title="Speedup of the candidate: baseline step ÷ candidate step (above 1 is faster)",
    )
    figure.add_hline(y=1, line_dash="dash", line_color="#555")
    return _layout(figure)


def trend_chart(points: pd.DataFrame, series: list[str], changes: pd.DataFrame, metric: str, label: str) -> go.Figure:
    """One panel per series of ``series``, in that order: ``metric`` per run over time (p10-p90
    band for step time), change points as vertical lines (red: regression, green: improvement).
    Points carry their run id."""
    shown: set[str] = set()  # backends already in the legend
    rows = max(len(series), 1)
    gap = 0.3 / rows  # between panels, as make_subplots(vertical_spacing=...) spaced them
    height = (1 - gap * (rows - 1)) / rows
    layout: dict = {"annotations": [], "shapes": [], "hovermode": "closest", "clickmode": "event+select"}
    traces: list[dict] = []
    for row, name in enumerate(series, start=1):
        suffix = str(row) if row > 1 else ""
        top = 1 - (row - 1) * (height + gap)
        # the panels share the bottom panel's x axis; its tick labels only under it
        layout[f"xaxis{suffix}"] = {"anchor": f"y{suffix}", "domain": [0, 1], "showticklabels": row == len(series)}
        if row < len(series):
            layout[f"xaxis{suffix}"]["matches"] = f"x{len(series) if len(series) > 1 else ''}"
        layout[f"yaxis{suffix}"] = {"anchor": f"x{suffix}", "domain": [top - height, top], "title": _title(label)}
        layout["annotations"].append(
            {"text": name, "xref": "paper", "yref": "paper", "x": 0.5, "y": top, "xanchor": "center",
             "yanchor": "bottom", "showarrow": False, "font": {"size": 16}}
        )  # fmt: skip
        axes = {"xaxis": f"x{suffix}", "yaxis": f"y{suffix}"}
        frame = points[points["series"] == name].sort_values("started_at")
        backend = frame["backend"].iloc[0]
        when = frame["started_at"].tolist()
        if metric == "median_step_ms":
            traces.append(
                {"type": "scatter", "x": when, "y": frame["p90_step_ms"].tolist(), "mode": "lines",
                 "line": {"width": 0}, "hoverinfo": "skip", "showlegend": False, **axes}
            )  # fmt: skip
            traces.append(
                {"type": "scatter", "x": when, "y": frame["p10_step_ms"].tolist(), "mode": "lines",
                 "line": {"width": 0}, "fill": "tonexty", "fillcolor": "rgba(120,120,120,0.18)", "hoverinfo": "skip",
                 "name": "p10-p90 of the run's steps", "showlegend": row == 1, **axes}
            )  # fmt: skip
        traces.append(
            {
                "type": "scatter",
                "x": when,
                "y": frame[metric].tolist(),
                "mode": "lines+markers",
                "marker": {"size": 6, "color": colour(backend)},
                "line": {"color": colour(backend), "width": 1.5},
                "name": backend,
                "legendgroup": backend,
                "showlegend": backend not in shown,
                "customdata": frame[["run_id", "git_sha"]].to_numpy(object).tolist(),
                "hovertemplate": f"%{{x|%Y-%m-%d %H:%M}}<br>{label}: %{{y:,.3f}}<br>run %{{customdata[0]}}"
                "<br>git %{customdata[1]}<extra></extra>",
                **axes,
            }
        )
        shown.add(backend)
        for change in changes[changes["series"] == name].itertuples():
            tint = DIRECTION_COLOURS[change.direction]
            layout["shapes"].append(
                {"type": "line", "xref": f"x{suffix}", "x0": change.started_at, "x1": change.started_at,
                 "yref": f"y{suffix} domain", "y0": 0, "y1": 1, "line": {"dash": "dash", "color": tint}}
            )  # fmt: skip
            layout["annotations"].append(
                {"x": change.started_at, "y": 1, "xref": f"x{suffix}", "yref": f"y{suffix} domain",
                 "text": f"{change.direction} {change.change_pct:+.1f}%", "showarrow": False, "font": {"color": tint},
                 "xanchor": "left"}
            )  # fmt: skip
    return _figure(traces, layout, height=120 + 240 * len(series))


def serving_chart(
    runs: pd.DataFrame, x: str, y: str, facet: str | None, labels: dict[str, str], title: str
) -> go.Figure:
    """A serving metric across a sweep: one line per backend (and device), a panel per ``facet``
    value, titled ``labels[facet] value`` (a short label: panels are narrow)."""
    read = list(dict.fromkeys(column for column in (x, y, facet, "backend", "device", "run_id") if column))
    frame = runs.loc[runs[y].notna(), read].sort_values(x)  # the columns it draws, not every one
    frame["side"] = frame["backend"] + " (" + frame["device"].fillna("?") + ")"
    name = lambda column: labels.get(column, column)  # noqa: E731
    panels = list(dict.fromkeys(frame[facet])) if facet and frame[facet].nunique() > 1 else [None]
    swept = sorted(frame[x].unique())
    axis = {"type": "log" if swept[-1] > 8 * max(swept[0], 1) else "linear", "tickvals": swept}
    gap = 0.03  # between panels, as Plotly Express spaces facets
    width = (1 - gap * (len(panels) - 1)) / len(panels)
    layout: dict = {
        "title": _title(title),
        "legend": {"title": _title(name("backend")), "tracegroupgap": 0},
        "annotations": [],
    }
    # each panel's lines gathered in one pass over the rows, in x order (a frame filtered per
    # panel and backend, and grouped per side, cost 15 ms a chart)
    lines: dict[object, dict[str, dict[str, tuple[list, list, list]]]] = {}
    keys = frame[facet].tolist() if panels != [None] else [None] * len(frame)
    for key, backend, side, at, value, run in zip(
        keys, *(frame[column].tolist() for column in ("backend", "side", x, y, "run_id")), strict=True
    ):
        line = lines.setdefault(key, {}).setdefault(backend, {}).setdefault(side, ([], [], []))
        for values, item in zip(line, (at, value, run), strict=True):
            values.append(item)
    traces, shown = [], set()
    for index, value in enumerate(panels):
        suffix = str(index + 1) if index else ""
        left = index * (width + gap)
        layout[f"xaxis{suffix}"] = {**axis, "domain": [left, left + width], "anchor": f"y{suffix}",
                                    "title": _title(name(x))}  # fmt: skip
        layout[f"yaxis{suffix}"] = (
            {"anchor": f"x{suffix}", "matches": "y", "showticklabels": False}
            if index
            else {"anchor": "x", "title": _title(name(y))}
        )
        if value is not None:  # a panel's title: short, panels are narrow
            layout["annotations"].append(
                {"text": f"{name(facet)} {value}", "xref": "paper", "yref": "paper", "x": left + width / 2, "y": 1.0,
                 "xanchor": "center", "yanchor": "bottom", "showarrow": False}
            )  # fmt: skip
        panel = lines.get(value, {})
        for backend in sorted(panel):  # the same legend order on every panel
            for side, (at, values, run_ids) in panel[backend].items():
                traces.append(
                    {
                        "type": "scatter",
                        "mode": "lines+markers",
                        "name": backend,
                        "legendgroup": backend,
                        "showlegend": backend not in shown,
                        "x": at,
                        "y": values,
                        "xaxis": f"x{suffix}",
                        "yaxis": f"y{suffix}",
                        "line": {"color": colour(backend)},
                        "marker": {"color": colour(backend)},
                        "customdata": [[side, run] for run in run_ids],
                        "hovertemplate": _hover(
                            [
                                (name("backend"), backend),
                                (name(x), "%{x}"),
                                (name(y), "%{y}"),
                                ("side", "%{customdata[0]}"),
                                ("run_id", "%{customdata[1]}"),
                            ]
                        ),
                    }
                )
                shown.add(backend)
    return _figure(traces, layout, height=380)


#: the marker of each line's point of best goodput at its SLO (tpubench.analysis.serving.goodput_points)
GOODPUT_MARKER = {"symbol": "star", "size": 16, "color": "#f9a825", "line": {"color": "#5d4037", "width": 1}}


def serving_curves(
    lines: pd.DataFrame, x: str, y: str, labels: dict[str, str], title: str,
    goodput: pd.DataFrame | None = None, bound: float | None = None,
) -> go.Figure:  # fmt: skip
    """Latency against throughput (:func:`tpubench.analysis.serving.curves`' frame): a line per
    engine on a chip, solid, and per static batch (decode runs), dashed; each line's point of
    best goodput starred; the SLO on ``y``'s metric (``bound``, ms) as a dotted line."""
    frame = lines[lines[x].notna() & lines[y].notna()]
    name = lambda column: labels.get(column, column)  # noqa: E731
    hover = ["line", "load", "source", "run_id"]
    traces = []
    for line, points in frame.groupby("line", sort=False):
        static = (points["kind"] != "engine").all()
        shade = _SPARE[zlib.crc32(str(line).encode()) % len(_SPARE)]
        traces.append(
            {
                "type": "scatter",
                "mode": "lines+markers",
                "name": str(line),
                "legendgroup": str(line),
                "x": points[x].tolist(),
                "y": points[y].tolist(),
                "line": {"color": shade, "dash": "dash" if static else "solid"},
                "marker": {"color": shade, "symbol": "square" if static else "circle"},
                "customdata": points[hover].astype(object).to_numpy().tolist(),
                "hovertemplate": _hover(
                    [
                        ("line", "%{customdata[0]}"),
                        ("load", "%{customdata[1]}"),
                        (name(x), "%{x:,.4g}"),
                        (name(y), "%{y:,.4g}"),
                        ("source", "%{customdata[2]}"),
                        ("run_id", "%{customdata[3]}"),
                    ]
                ),
            }
        )
    best = goodput[goodput[x].notna() & goodput[y].notna()] if goodput is not None else pd.DataFrame()
    if not best.empty:
        traces.append(
            {
                "type": "scatter",
                "mode": "markers",
                "name": "best goodput at the SLO",
                "x": best[x].tolist(),
                "y": best[y].tolist(),
                "marker": GOODPUT_MARKER,
                "customdata": best[["line", "load", "request_goodput", "good_share", "goodput_slos"]]
                .astype(object)
                .to_numpy()
                .tolist(),
                "hovertemplate": _hover(
                    [
                        ("line", "%{customdata[0]}"),
                        ("load", "%{customdata[1]}"),
                        ("goodput (req/s)", "%{customdata[2]:,.4g}"),
                        ("share within the SLO", "%{customdata[3]:.1%}"),
                        ("SLO (ms)", "%{customdata[4]}"),
                    ]
                ),
            }
        )
    spread = sorted(frame[x].unique())
    wide = bool(spread) and spread[-1] > 8 * max(spread[0], 1e-9)
    layout: dict = {
        "title": _title(title),
        "legend": {"orientation": "h", "y": -0.25, "tracegroupgap": 0},
        "xaxis": {"title": _title(name(x)), "type": "log" if wide else "linear"},
        "yaxis": {"title": _title(name(y))},
    }
    if bound is not None:
        slo = _hline(bound, "dot", "#c62828", f"SLO {bound:g} ms")
        layout |= {"shapes": [slo["shape"]], "annotations": [slo["annotation"]]}
    return _figure(traces, layout, height=480)


def cold_start_bars(starts: pd.DataFrame) -> go.Figure:
    """Each engine's start to ready per chip (:func:`tpubench.analysis.serving.cold_starts`): the
    median over its sweeps, the whiskers their min and max."""
    traces = [
        {
            "type": "bar",
            "orientation": "h",
            "y": starts["line"].tolist(),
            "x": starts["median_s"].tolist(),
            "marker": {"color": "#8d6e63"},
            "error_x": {
                "type": "data", "symmetric": False,
                "array": (starts["max_s"] - starts["median_s"]).tolist(),
                "arrayminus": (starts["median_s"] - starts["min_s"]).tolist(),
            },
            "customdata": starts[["sweeps", "min_s", "max_s"]].astype(object).to_numpy().tolist(),
            "hovertemplate": _hover(
                [("line", "%{y}"), ("median (s)", "%{x:,.1f}"), ("sweeps", "%{customdata[0]}"),
                 ("min (s)", "%{customdata[1]:,.1f}"), ("max (s)", "%{customdata[2]:,.1f}")]
            ),
        }
    ]  # fmt: skip
    layout = {
        "title": _title("Cold start: engine start to ready (s)"),
        "xaxis": {"title": _title("seconds, median over sweeps (whiskers: min, max)")},
        "yaxis": {"automargin": True},
        "showlegend": False,
    }
    return _figure(traces, layout, height=max(220, 90 + 40 * len(starts)))


def lines(
    frame: pd.DataFrame,
    x: str,
    y: str,
    by: str,
    labels: dict[str, str],
    title: str,
    hover: dict[str, tuple[str, str]] | None = None,
    log_x: bool = False,
    legend: dict | None = None,
) -> go.Figure:
    """``px.line(frame, x, y, color=by, markers=True)`` from dicts: a line per value of ``by``
    in the order of the rows, coloured from the template's sequence as Express colours them;
    ``hover`` adds columns to the hover text (column -> (label, format))."""
    hover = hover or {}
    name = lambda column: labels.get(column, column)  # noqa: E731
    traces = []
    for value, line in frame.groupby(by, sort=False):
        fields = [(name(by), str(value)), (name(x), "%{x}"), (name(y), "%{y}")]
        fields += [(text, f"%{{customdata[{i}]{form}}}") for i, (text, form) in enumerate(hover.values())]
        traces.append(
            {
                "type": "scatter",
                "mode": "lines+markers",
                "name": str(value),
                "legendgroup": str(value),
                "x": line[x].tolist(),
                "y": line[y].tolist(),
                "customdata": line[list(hover)].to_numpy(object).tolist() if hover else None,
                "hovertemplate": _hover(fields),
            }
        )
    layout = {
        "title": _title(title),
        "legend": {"title": _title(name(by)), "tracegroupgap": 0, **(legend or {})},
        "xaxis": {"title": _title(name(x)), **({"type": "log"} if log_x else {})},
        "yaxis": {"title": _title(name(y))},
    }
    return _figure(traces, layout, height=None)


def top_ops_bar(ranked: pd.DataFrame) -> go.Figure:
    """The ranked ops' self time per traced step, coloured by category (``others`` included)."""
    frame = ranked.copy()
    frame["op"] = frame["op"].astype(str).str.slice(0, 60)
    traces = [
        {
            "type": "bar",
            "orientation": "h",
            "name": category,
            "legendgroup": category,
            "x": rows["self_us_per_step"].tolist(),
            "y": rows["op"].tolist(),
            "marker": {"color": CATEGORY_COLOURS.get(category)},
            "customdata": rows[["calls", "self_pct"]].to_numpy(object).tolist(),
            "hovertemplate": _hover(
                [
                    ("category", category),
                    ("self time per traced step (µs)", "%{x}"),
                    ("op", "%{y}"),
                    ("calls", "%{customdata[0]}"),
                    ("% of step", "%{customdata[1]:.1f}"),
                ]
            ),
        }
        for category, rows in frame.groupby("category", sort=False, dropna=False)
    ]
    layout = {
        "title": _title("Top ops by self time per traced step (µs)"),
        "barmode": "relative",
        "legend": {"orientation": "h", "y": -0.12, "title": _title(""), "tracegroupgap": 0},
        "xaxis": {"title": _title("self time per traced step (µs)")},
        "yaxis": {"title": _title(""), "categoryorder": "array", "categoryarray": list(frame["op"])[::-1]},
    }  # rank 1 on top
    return _figure(traces, layout, height=max(340, 100 + 22 * len(frame)))


def category_treemap(ops: pd.DataFrame) -> go.Figure:
    """Self time split by category, then op: where the step went at a glance."""
    frame = ops[ops["self_time_us"] > 0]
    root = "all ops"
    leaves = frame.groupby(["category", "op"], sort=False)["self_time_us"].sum().reset_index()
    branches = leaves.groupby("category", sort=False)["self_time_us"].sum()
    ids = [root, *(f"{root}/{c}" for c in branches.index), *(f"{root}/{c}/{o}" for c, o in zip(leaves["category"],
           leaves["op"], strict=True))]  # fmt: skip
    trace = {
        "type": "treemap",
        "ids": ids,
        "labels": [root, *branches.index, *leaves["op"]],
        "parents": ["", *([root] * len(branches)), *(f"{root}/{c}" for c in leaves["category"])],
        "values": [float(branches.sum()), *branches.tolist(), *leaves["self_time_us"].tolist()],
        "branchvalues": "total",
        "marker": {
            "colors": [
                "#eeeeee",
                *(CATEGORY_COLOURS.get(c, "#eeeeee") for c in branches.index),
                *(CATEGORY_COLOURS.get(c, "#eeeeee") for c in leaves["category"]),
            ]
        },
        "hovertemplate": "%{label}<br>%{value:,.0f} µs<br>%{percentRoot:.1%} of all<extra></extra>",
    }
    return _figure([trace], {"title": _title("Self time by category and op (area ∝ time)")}, height=460)


def diff_bar(diff: pd.DataFrame, key: str) -> go.Figure:
    """Change of each op (or category) per traced step, test minus base, largest first."""
    colours_by_change = {
        "slower": VERDICT_COLOURS["regressed"],
        "new": "#ef6c00",
        "faster": VERDICT_COLOURS["improved"],
        "missing": "#00838f",
        "same": VERDICT_COLOURS["unchanged"],
    }
    frame = diff.copy()
    frame[key] = frame[key].astype(str).str.slice(0, 60)
    figure = px.bar(
        frame,
        x="delta_us_per_step",
        y=key,
        color="change",
        orientation="h",
        color_discrete_map=colours_by_change,
        hover_data={"base_us_per_step": ":,.1f", "test_us_per_step": ":,.1f", "ratio": ":.2f"},
        labels={"delta_us_per_step": "change per traced step (µs): test - base", key: ""},
        title=f"Largest changes by {key} (µs per traced step; right of 0: the test run spends more)",
    )
    figure.add_vline(x=0, line_color="#555")
    figure.update_yaxes(categoryorder="array", categoryarray=list(frame[key])[::-1])  # largest change on top
    return _layout(figure, height=max(320, 60 + 22 * len(frame)))


ROOFLINE_SYMBOLS = ("circle", "diamond")


def roofline_chart(runs: list[tuple[str, pd.DataFrame, RooflineCeilings]]) -> go.Figure:
    """Ops on the roofline, log-log: intensity (FLOP/byte) against achieved FLOP/s, one point
    per op sized by its time per step, coloured by bound; each run's ceilings as a line
    (min(peak, intensity * bandwidth)), named with their source (measured or datasheet).
    ``runs`` holds one or two (label, :func:`tpubench.analysis.roofline.roofline` table,
    ceilings); ops without FLOPs or bytes have no place on it."""
    figure = go.Figure()
    placed = [
        (label, table[table["intensity"].gt(0) & table["achieved_flops_per_s"].gt(0)]) for label, table, _ in runs
    ]
    biggest = max((float(t["time_us_per_step"].max()) for _, t in placed if len(t)), default=1.0)
    intensities = [float(v) for _, t in placed for v in t["intensity"]] + [
        c.ridge for _, _, c in runs if c.ridge is not None
    ]
    low, high = (min(intensities) / 2, max(intensities) * 2) if intensities else (0.01, 100.0)
    for (label, points), symbol in zip(placed, ROOFLINE_SYMBOLS, strict=False):
        bounds = line_of(points)
        for bound in dict.fromkeys(bounds):
            these = points[bounds == bound]
            figure.add_trace(
                go.Scatter(
                    x=these["intensity"],
                    y=these["achieved_flops_per_s"],
                    mode="markers",
                    name=f"{label}: {bound}" if len(runs) > 1 else bound,
                    marker={
                        "size": 6 + 34 * (these["time_us_per_step"] / biggest) ** 0.5,
                        "color": BOUND_COLOURS.get(bound, "#9e9e9e"),
                        "symbol": symbol,
                        "line": {"width": 0.5, "color": "#333"},
                        "opacity": 0.75,
                    },
                    text=these["op"] + these["shape"].fillna("").map(lambda s: f" {s}" if s else ""),
                    customdata=these[["time_us_per_step", "ceiling_fraction"]],
                    hovertemplate="%{text}<br>%{x:.3g} FLOP/byte, %{y:.3g} FLOP/s<br>%{customdata[0]:,.1f} µs/step, "
                    "%{customdata[1]:.1%} of its ceiling<extra></extra>",
                )
            )
    for (label, _, ceilings), dash in zip(runs, ("solid", "dash"), strict=False):
        if ceilings.ridge is None:
            continue
        xs = sorted({low, ceilings.ridge, high})
        figure.add_trace(
            go.Scatter(
                x=xs,
                y=[ceilings.ceiling(x) for x in xs],
                mode="lines",
                name=f"{label + ': ' if len(runs) > 1 else ''}{ceilings.source} ceilings",
                line={"color": "#333", "dash": dash},
                hoverinfo="skip",
            )
        )
    figure.update_xaxes(type="log", title="arithmetic intensity (FLOP/byte)")
    figure.update_yaxes(type="log", title="achieved FLOP/s")
    figure.update_layout(title="Roofline: each op's achieved FLOP/s at its intensity (size: time per step)")
    return _layout(figure, height=480)


def compile_times(runs: pd.DataFrame) -> go.Figure:
    """First step (compilation included) and compile time per configuration and backend."""
    frame = runs[runs["first_step_s"].notna()].copy()
    frame["configuration"] = config_labels(frame)
    long = frame.melt(
        id_vars=["configuration", "backend", "run_id"],
        value_vars=["first_step_s", "compile_s"],
        var_name="what",
        value_name="seconds",
    ).dropna(subset=["seconds"])
    long["what"] = long["what"].map({"first_step_s": "first step", "compile_s": "compiling"})
    patterns = {what: ("", "/")[i % 2] for i, what in enumerate(dict.fromkeys(long["what"]))}  # Express's first two
    traces = [
        {
            "type": "bar",
            "name": f"{backend}, {what}",
            "legendgroup": f"{backend}, {what}",
            "x": rows["configuration"].tolist(),
            "y": rows["seconds"].tolist(),
            "marker": {"color": colour(backend), "pattern": {"shape": patterns[what]}},
            "customdata": [[run] for run in rows["run_id"]],
            "hovertemplate": _hover(
                [("backend", backend), ("what", what), ("configuration", "%{x}"), ("seconds", "%{y}"),
                 ("run_id", "%{customdata[0]}")]
            ),
        }
        for (backend, what), rows in long.groupby(["backend", "what"], sort=False)
    ]  # fmt: skip
    layout = {
        "title": _title("First step (compilation included) and time spent compiling (s)"),
        "barmode": "group",
        "legend": {"title": _title("backend, bar"), "tracegroupgap": 0},
        "xaxis": {"title": _title("")},
        "yaxis": {"title": _title("seconds")},
    }
    return _figure(traces, layout)


def compile_counts(steps: pd.DataFrame, labels: dict[str, str], backends: dict[str, str]) -> go.Figure:
    """Cumulative compile count per step of each run: flat after warm-up is what you want."""
    frame = steps[steps["compile_count"].notna()].sort_values(["run_id", "step"]).copy()
    frame["run"] = frame["run_id"].map(labels)
    frame["backend"] = frame["run_id"].map(backends)
    figure = px.line(
        frame,
        x="step",
        y="compile_count",
        color="backend",
        line_group="run",
        markers=True,
        color_discrete_map=colours(frame["backend"].unique()),
        hover_data={"run": True, "phase": True},
        labels={"compile_count": "graphs compiled so far", "step": "step (first, warm-up, measured)"},
        title="Compile count per step: it should stop rising once warm-up ends",
    )
    return _layout(figure)


def fallback_bar(fallbacks: pd.DataFrame) -> go.Figure:
    """CPU-fallback ops (executions) per op and backend: the TPU migration blockers."""
    traces = [
        {
            "type": "bar",
            "orientation": "h",
            "name": backend,
            "legendgroup": backend,
            "x": rows["count"].tolist(),
            "y": rows["op"].tolist(),
            "marker": {"color": colour(backend)},
            "customdata": [[run] for run in rows["run"]],
            "hovertemplate": _hover(
                [("backend", backend), ("executions on the CPU", "%{x}"), ("op", "%{y}"), ("run", "%{customdata[0]}")]
            ),
        }
        for backend, rows in fallbacks.groupby("backend", sort=False)
    ]
    layout = {
        "title": _title("Ops that fell back to the CPU (each is a TPU migration blocker)"),
        "barmode": "relative",
        "legend": {"title": _title("backend"), "tracegroupgap": 0},
        "xaxis": {"title": _title("executions on the CPU")},
        "yaxis": {"title": _title("")},
    }
    return _figure(traces, layout, height=max(280, 60 + 26 * fallbacks["op"].nunique()))


def step_histogram(steps: pd.DataFrame, median: float | None, p10: float | None, p90: float | None) -> go.Figure:
    """The raw measured step times of one run, with its median and p10/p90."""
    figure = px.histogram(
        steps, x="step_ms", nbins=40, labels={"step_ms": "step time (ms)"}, title="Measured step times (ms)"
    )
    figure.update_yaxes(title_text="steps")
    for value, name, dash in ((median, "median", "solid"), (p10, "p10", "dot"), (p90, "p90", "dot")):
        if value is not None and value == value:
            figure.add_vline(x=value, line_dash=dash, line_color="#c62828", annotation_text=name)
    return _layout(figure, height=360)


#: one colour per cause of a compile (the words of tpubench.analysis.compiles.CAUSE_WORDS)
CAUSE_COLOURS = dict(zip(CAUSE_WORDS.values(), px.colors.qualitative.Set2, strict=False))
CACHE_COLOURS = {"miss": "#c62828", "memory_hit": "#2e7d32", "disk_hit": "#1565c0", "load_failed": "#f9a825"}


def compile_timeline(steps: pd.DataFrame, per_step: pd.DataFrame, cache: pd.DataFrame, label: str) -> go.Figure:
    """One run's cost of compiling, step by step: the step time as a line, the seconds each
    step spent compiling as bars coloured by cause, and under them a strip of what each
    step's compiles found in the cache (a miss compiled; a hit did not)."""
    figure = make_subplots(
        rows=2, cols=1, shared_xaxes=True, row_heights=[0.82, 0.18], vertical_spacing=0.04,
        specs=[[{"secondary_y": True}], [{}]],
    )  # fmt: skip
    for cause, rows in per_step.groupby("cause", sort=False):
        figure.add_trace(
            go.Bar(
                x=rows["step"], y=rows["compile_s"], name=cause, marker_color=CAUSE_COLOURS.get(cause),
                customdata=rows["compiles"], hovertemplate="step %{x}: %{y:.3g} s compiling (%{customdata} compiles)",
            ),
            row=1, col=1,
        )  # fmt: skip
    ordered = steps.sort_values("step")
    figure.add_trace(
        go.Scatter(x=ordered["step"], y=ordered["step_ms"], name="step time (ms)", mode="lines+markers",
                   line={"color": "#424242"}),
        row=1, col=1, secondary_y=True,
    )  # fmt: skip
    for state, rows in cache.groupby("cache", sort=False):
        figure.add_trace(
            go.Scatter(
                x=rows["step"], y=[state] * len(rows), mode="markers", name=f"cache: {state}",
                marker={"symbol": "square", "size": 12, "color": CACHE_COLOURS.get(state, "#9e9e9e")},
                customdata=rows["compiles"], hovertemplate="step %{x}: %{customdata} compile(s), %{y}",
            ),
            row=2, col=1,
        )  # fmt: skip
    figure.update_layout(barmode="stack", title=f"Compile cost per step: {label}")
    figure.update_yaxes(title_text="compile s", row=1, col=1, secondary_y=False)
    figure.update_yaxes(title_text="step ms", row=1, col=1, secondary_y=True)
    figure.update_xaxes(title_text="step (first, warm-up, measured)", row=2, col=1)
    return _layout(figure, height=460)


def scaling_chart(report: pd.DataFrame, y: str, label: str, title: str) -> go.Figure:
    """A per-device figure over N: one line per configuration, coloured by backend, dashed by
    parallel plan; an ideal line at 1 for efficiency."""
    frame = report[report[y].notna()].sort_values("devices").copy()
    dashes = {plan: DASHES[i % len(DASHES)] for i, plan in enumerate(dict.fromkeys(frame["parallel"]))}
    traces, shown = [], set()
    for (backend, plan, configuration), line in frame.groupby(
        ["backend", "parallel", "configuration"], sort=False, dropna=False
    ):
        name = f"{backend}, {plan}"
        traces.append(
            {
                "type": "scatter",
                "mode": "lines+markers",
                "name": name,
                "legendgroup": name,
                "showlegend": name not in shown,
                "x": line["devices"].tolist(),
                "y": line[y].tolist(),
                "line": {"color": colour(backend), "dash": dashes[plan]},
                "marker": {"color": colour(backend)},
                "customdata": [
                    [configuration, run, base]
                    for run, base in zip(line["run_id"], line["baseline_devices"], strict=True)
                ],
                "hovertemplate": _hover(
                    [
                        ("backend", backend),
                        ("plan", plan),
                        ("devices (N)", "%{x}"),
                        (label, "%{y}"),
                        ("configuration", "%{customdata[0]}"),
                        ("run_id", "%{customdata[1]}"),
                        ("baseline_devices", "%{customdata[2]}"),
                    ]
                ),
            }
        )
        shown.add(name)
    swept = sorted(frame["devices"].unique())
    layout: dict = {
        "title": _title(title),
        "legend": {"title": _title("backend, plan"), "tracegroupgap": 0},
        "xaxis": {
            "title": _title("devices (N)"),
            "tickvals": swept,
            "type": "log" if swept and swept[-1] > 8 * max(swept[0], 1) else "linear",
        },
        "yaxis": {"title": _title(label)},
    }
    if y == "efficiency":
        ideal = _hline(1.0, "dot", "#9e9e9e", "ideal")
        layout |= {"shapes": [ideal["shape"]], "annotations": [ideal["annotation"]]}
    return _figure(traces, layout, height=380)


#: the memory breakdown's parts (tpubench.analysis.memory.PARTS' labels), bottom to top
PART_COLOURS = {
    "weights": "#1565c0",
    "gradients": "#ef6c00",
    "optimizer state": "#6a1b9a",
    "activations + temporaries": "#9e9e9e",
}


def memory_bars(stacked: pd.DataFrame, title: str = "Memory by part (GiB per device)") -> go.Figure:
    """One stacked bar per run (``tpubench.analysis.memory.stacked``): the counted parts and the
    activations the measured peak leaves, with the admitting estimate as a marker beside it, so
    backends and plans compare at a glance."""
    frame = stacked.assign(gib=stacked["bytes"] / 2**30)
    figure = px.bar(
        frame,
        x="label",
        y="gib",
        color="part",
        color_discrete_map=PART_COLOURS,
        category_orders={"part": list(PART_COLOURS)},
        labels={"label": "run", "gib": "GiB", "part": "part"},
        title=title,
    )
    estimates = frame.drop_duplicates("run_id")
    figure.add_trace(
        go.Scatter(
            x=estimates["label"],
            y=estimates["estimated_mem_bytes"] / 2**30,
            mode="markers",
            marker={"symbol": "line-ew-open", "size": 28, "color": "#c62828", "line": {"width": 3}},
            name="estimate (admission)",
        )
    )
    return _layout(figure, height=440, barmode="stack")


def memory_timeline(wide: pd.DataFrame, title: str = "One profiled step by category (MiB)") -> go.Figure:
    """One profiled step's memory by torch.profiler category (``tpubench.analysis.memory.timeline``);
    ``title`` names the rank on a multi-rank run."""
    categories = [c for c in wide.columns if c != "t_ms"]
    long = wide.melt(id_vars="t_ms", value_vars=categories, var_name="category", value_name="bytes")
    long["MiB"] = long["bytes"] / 2**20
    figure = px.area(
        long,
        x="t_ms",
        y="MiB",
        color="category",
        line_shape="hv",
        category_orders={"category": categories},
        labels={"t_ms": "time in the step (ms)"},
        title=title,
    )
    return _layout(figure, height=400)


def loss_curves(frame: pd.DataFrame, label_a: str, label_b: str) -> go.Figure:
    """Two training runs' losses by step (:func:`tpubench.analysis.parity.parity`'s frame):
    A, the reference, as a line, B as markers on it, so that a curve that agrees hides nothing."""
    steps = list(frame["step"])
    traces = [
        {"type": "scatter", "mode": "lines", "x": steps, "y": list(frame["loss_a"]), "name": f"A: {label_a}"},
        {"type": "scatter", "mode": "markers", "x": steps, "y": list(frame["loss_b"]), "name": f"B: {label_b}"},
    ]
    layout = {
        "title": _title("Loss per step"),
        "xaxis": {"title": {"text": "step (0: the first, before any update)"}},
        "yaxis": {"title": {"text": "loss"}},
        "legend": {"orientation": "h", "y": -0.25},
    }
    return _figure(traces, layout, height=360)
