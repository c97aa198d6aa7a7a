"""Plotly figures of the dashboard: frames in, figures out, one colour per backend on every page.

Colours: a backend family has one hue, its compiled variant the darker shade, so ``cuda`` and
``cuda-compile`` read as relatives and a GPU never looks like a TPU. A backend from a plug-in
gets a colour from its name, the same on every page.
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
from tpubench.analysis.roofline import RooflineCeilings

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
BOUND_COLOURS = {"compute": "#c62828", "memory": "#1565c0", "overhead": "#f9a825", "no ceilings": "#757575"}
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


def _layout(figure: go.Figure, height: int = 420, **extra: object) -> go.Figure:
    figure.update_layout(height=height, margin={"l": 10, "r": 10, "t": 40, "b": 10}, **extra)
    return figure


def step_bars(summary: pd.DataFrame, title: str = "Median step time (ms), 95% CI") -> go.Figure:
    """Median step per configuration, one bar per backend (and device), with the CI of the median."""
    frame = summary[summary["median_step_ms"].notna()].copy()
    frame["configuration"] = config_labels(frame)
    frame["side"] = frame["backend"] + " (" + frame["device"].fillna("?") + ")"
    frame["plus"] = frame["ci_high_step_ms"] - frame["median_step_ms"]
    frame["minus"] = frame["median_step_ms"] - frame["ci_low_step_ms"]
    figure = px.bar(
        frame,
        x="configuration",
        y="median_step_ms",
        color="backend",
        color_discrete_map=colours(frame["backend"].unique()),
        barmode="group",
        error_y="plus",
        error_y_minus="minus",
        hover_data={"side": True, "runs": True, "plus": False, "minus": False},
        labels={"median_step_ms": "median step (ms)", "configuration": ""},
        title=title,
    )
    return _layout(figure)


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
    figure = px.bar(
        frame,
        y="configuration",
        x="median_step_ms",
        color="side",
        orientation="h",
        category_orders={"side": names[::-1]},  # a group's first bar is drawn lowest
        color_discrete_map=dict(zip(names, palette, strict=True)),
        barmode="group",
        error_x="plus",
        error_x_minus="minus",
        hover_data={"backend": True, "device": True, "runs": True, "plus": False, "minus": False},
        labels={"median_step_ms": "median step (ms)", "configuration": "", "side": ""},
        title="Median step time (ms) of each side, 95% CI of the median",
    )
    figure.update_yaxes(categoryorder="array", categoryarray=sorted(frame["configuration"].unique(), reverse=True))
    figure.update_layout(legend_traceorder="reversed")
    return _layout(figure, height=max(300, 80 + 30 * frame["configuration"].nunique()))


def ratio_chart(step_rows: pd.DataFrame) -> go.Figure:
    """Candidate ÷ baseline step time per configuration, its 95% CI, coloured by verdict."""
    frame = step_rows[step_rows["ratio"].notna()].copy()
    frame["configuration"] = config_labels(frame) + " · " + frame["test_backend"].fillna("")
    frame["change_pct"] = 100 * (frame["ratio"] - 1)
    frame["plus"] = 100 * (frame["ci_high"] - frame["ratio"])
    frame["minus"] = 100 * (frame["ratio"] - frame["ci_low"])
    figure = px.bar(
        frame,
        y="configuration",
        x="change_pct",
        color="verdict",
        color_discrete_map=VERDICT_COLOURS,
        orientation="h",
        error_x="plus",
        error_x_minus="minus",
        hover_data={"reason": True, "plus": False, "minus": False},
        labels={"change_pct": "step time change, candidate vs baseline (%)", "configuration": ""},
        title="Step time change (%) with its 95% CI; above 0 is slower",
    )
    figure.add_vline(x=0, line_color="#555")
    figure.update_yaxes(categoryorder="array", categoryarray=list(frame["configuration"])[::-1])
    return _layout(figure, height=max(300, 60 + 28 * len(frame)))


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
    figure = make_subplots(
        rows=len(series), cols=1, shared_xaxes=True, subplot_titles=series, vertical_spacing=0.3 / max(len(series), 1)
    )
    for row, name in enumerate(series, start=1):
        frame = points[points["series"] == name].sort_values("started_at")
        backend = frame["backend"].iloc[0]
        if metric == "median_step_ms":
            figure.add_trace(
                go.Scatter(
                    x=frame["started_at"],
                    y=frame["p90_step_ms"],
                    mode="lines",
                    line={"width": 0},
                    hoverinfo="skip",
                    showlegend=False,
                ),
                row=row,
                col=1,
            )
            figure.add_trace(
                go.Scatter(
                    x=frame["started_at"],
                    y=frame["p10_step_ms"],
                    mode="lines",
                    line={"width": 0},
                    fill="tonexty",
                    fillcolor="rgba(120,120,120,0.18)",
                    hoverinfo="skip",
                    name="p10-p90 of the run's steps",
                    showlegend=row == 1,
                ),
                row=row,
                col=1,
            )
        figure.add_trace(
            go.Scatter(
                x=frame["started_at"],
                y=frame[metric],
                mode="lines+markers",
                marker={"size": 6, "color": colour(backend)},
                line={"color": colour(backend), "width": 1.5},
                name=backend,
                legendgroup=backend,
                showlegend=backend not in shown,
                customdata=frame[["run_id", "git_sha"]].to_numpy(),
                hovertemplate=f"%{{x|%Y-%m-%d %H:%M}}<br>{label}: %{{y:,.3f}}<br>run %{{customdata[0]}}"
                "<br>git %{customdata[1]}<extra></extra>",
            ),
            row=row,
            col=1,
        )
        shown.add(backend)
        for change in changes[changes["series"] == name].itertuples():
            figure.add_vline(
                x=change.started_at,
                line_dash="dash",
                line_color=DIRECTION_COLOURS[change.direction],
                row=row,
                col=1,
            )
            figure.add_annotation(
                x=change.started_at,
                y=1,
                yref=f"y{row if row > 1 else ''} domain",
                text=f"{change.direction} {change.change_pct:+.1f}%",
                showarrow=False,
                font={"color": DIRECTION_COLOURS[change.direction]},
                xanchor="left",
                row=row,
                col=1,
            )
        figure.update_yaxes(title_text=label, row=row, col=1)
    return _layout(figure, height=120 + 240 * len(series), hovermode="closest", clickmode="event+select")


def serving_chart(
    runs: pd.DataFrame, x: str, y: str, facet: str | None, labels: dict[str, str], title: str
) -> go.Figure:
    """A serving metric across a sweep: one line per backend (and device), a panel per ``facet``
    value, titled ``labels[facet] value`` (a short label: panels are narrow)."""
    frame = runs[runs[y].notna()].sort_values(x).copy()
    frame["side"] = frame["backend"] + " (" + frame["device"].fillna("?") + ")"
    figure = px.line(
        frame,
        x=x,
        y=y,
        color="backend",
        line_group="side",
        facet_col=facet if facet and frame[facet].nunique() > 1 else None,
        category_orders={"backend": sorted(frame["backend"].unique())},  # the same legend on every panel
        markers=True,
        color_discrete_map=colours(frame["backend"].unique()),
        hover_data={"side": True, "run_id": True},
        labels=labels,
        title=title,
    )
    swept = sorted(frame[x].unique())
    figure.update_xaxes(type="log" if swept[-1] > 8 * max(swept[0], 1) else "linear", tickvals=swept)
    figure.for_each_annotation(lambda note: note.update(text=note.text.replace("=", " ")))
    return _layout(figure, height=380)


def top_ops_bar(ranked: pd.DataFrame) -> go.Figure:
    """The ranked ops' self time per traced step, coloured by category (``others`` included)."""
    frame = ranked.copy()
    frame["op"] = frame["op"].astype(str).str.slice(0, 60)
    figure = px.bar(
        frame,
        x="self_us_per_step",
        y="op",
        color="category",
        orientation="h",
        color_discrete_map=CATEGORY_COLOURS,
        hover_data={"calls": True, "self_pct": ":.1f"},
        labels={"self_us_per_step": "self time per traced step (µs)", "op": "", "self_pct": "% of step"},
        title="Top ops by self time per traced step (µs)",
    )
    figure.update_yaxes(categoryorder="array", categoryarray=list(frame["op"])[::-1])  # rank 1 on top
    figure.update_layout(legend={"orientation": "h", "y": -0.12, "title": ""})
    return _layout(figure, height=max(340, 100 + 22 * len(frame)))


def category_treemap(ops: pd.DataFrame) -> go.Figure:
    """Self time split by category, then op: where the step went at a glance."""
    frame = ops[ops["self_time_us"] > 0].copy()
    figure = px.treemap(
        frame,
        path=[px.Constant("all ops"), "category", "op"],
        values="self_time_us",
        color="category",
        color_discrete_map={**CATEGORY_COLOURS, "(?)": "#eeeeee"},
        title="Self time by category and op (area ∝ time)",
    )
    figure.update_traces(hovertemplate="%{label}<br>%{value:,.0f} µs<br>%{percentRoot:.1%} of all<extra></extra>")
    return _layout(figure, height=460)


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
        bounds = points["bound"].fillna("no ceilings")
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
    figure = px.bar(
        long,
        x="configuration",
        y="seconds",
        color="backend",
        pattern_shape="what",
        barmode="group",
        color_discrete_map=colours(long["backend"].unique()),
        hover_data={"run_id": True},
        labels={"seconds": "seconds", "configuration": ""},
        title="First step (compilation included) and time spent compiling (s)",
    )
    # plotly titles a colour-and-pattern legend "backend, what"; with "what" unlabelled it read "backend,"
    return _layout(figure, legend_title_text="backend, bar")


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
    figure = px.bar(
        fallbacks,
        x="count",
        y="op",
        color="backend",
        orientation="h",
        color_discrete_map=colours(fallbacks["backend"].unique()),
        hover_data={"run": True},
        labels={"count": "executions on the CPU", "op": ""},
        title="Ops that fell back to the CPU (each is a TPU migration blocker)",
    )
    return _layout(figure, height=max(280, 60 + 26 * fallbacks["op"].nunique()))


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
    figure = px.line(
        frame,
        x="devices",
        y=y,
        color="backend",
        line_dash="parallel",
        line_group="configuration",
        markers=True,
        color_discrete_map=colours(frame["backend"].unique()),
        hover_data={"configuration": True, "run_id": True, "baseline_devices": True},
        labels={"devices": "devices (N)", y: label, "backend": "backend", "parallel": "plan"},
        title=title,
    )
    swept = sorted(frame["devices"].unique())
    figure.update_xaxes(type="log" if swept and swept[-1] > 8 * max(swept[0], 1) else "linear", tickvals=swept)
    if y == "efficiency":
        figure.add_hline(y=1.0, line_dash="dot", line_color="#9e9e9e", annotation_text="ideal")
    return _layout(figure, height=380)


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


def memory_timeline(wide: pd.DataFrame) -> go.Figure:
    """One profiled step's memory by torch.profiler category (``tpubench.analysis.memory.timeline``)."""
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
        title="One profiled step by category (MiB)",
    )
    return _layout(figure, height=400)
