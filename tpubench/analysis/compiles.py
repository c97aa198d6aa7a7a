"""Why a run compiled and what it cost: readings of the ``compiles`` table (one row per
compile, graph break, host read, CPU fallback, recompile-limit hit or failed compile).

Stateless functions over DataFrames, shared by ``tpubench compiles``, ``compare``,
``regressions`` and the dashboard's Compilation page, so all of them say the same thing in
the same words. The table's columns are documented in docs/schema.md; the cause vocabulary
and what each backend can report are in the research note on compiles.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

#: the sign in "shape change x2" (written by name: ruff flags the literal as ambiguous with x)
TIMES = "\N{MULTIPLICATION SIGN}"
#: phases of a compile row that lie after warm-up: a compile there is paid inside measured time
AFTER_WARMUP = ("measured", "profiled")

#: each normalised cause in words
CAUSE_WORDS = {
    "first_compile": "first compile",
    "shape_change": "shape change",
    "value_change": "value change",
    "other_guard": "other guard",
    "graph_break_resume": "graph-break resume",
    "lazy_backward": "lazy backward",
    "step_sync": "step sync",
    "host_read": "host read",
    "unknown": "unknown",
}

#: what to do about a compile after warm-up, by cause
CAUSE_HINTS = {
    "shape_change": "pad or bucket the input shapes so that a few shapes recur (or mark the dimension dynamic)",
    "value_change": (
        "a Python number is baked into the graph: pass it as a tensor, or avoid .item() before it "
        "(torch._dynamo.config.capture_scalar_outputs = True)"
    ),
    "other_guard": "a guard on a type, attribute or global failed: keep them fixed between steps",
    "graph_break_resume": "remove the graph break before it (see its id)",
    "host_read": "a tensor value was read on the host (.item(), print, a CPU fallback): keep it on the device",
    "step_sync": "a new graph at the step's sync: run `tpubench compiles RUN_ID --explain` to see what changed",
    "unknown": "run `tpubench compiles RUN_ID --explain` for the backend's own trace",
}

#: the graph breaks users meet most, from torch/_dynamo/graph_break_registry.json: (name, hint)
GRAPH_BREAKS = {
    "GB0124": ("Tensor.item()", "avoid .item() in the step, or set torch._dynamo.config.capture_scalar_outputs = True"),
    "GB0170": ("data-dependent branching", "replace the Python `if` on a tensor by torch.where or torch.cond"),
    "GB0035": ("data-dependent branching", "replace the Python `if` on a tensor by torch.where or torch.cond"),
    "GB0036": (
        "dynamic-shape operator",
        "set torch._dynamo.config.capture_dynamic_output_shape_ops = True, or avoid nonzero/unique-like ops",
    ),
    "GB0109": ("Tensor.tolist()", "keep the values in a tensor"),
    "GB0105": ("Tensor.numpy()", "keep the computation in torch, or set torch._dynamo.config.trace_numpy = True"),
    "GB0293": ("numpy function", "use the torch equivalent, or set torch._dynamo.config.trace_numpy = True"),
    "GB0098": ("torch.compiler.disable()d function", "remove the torch.compiler.disable call"),
    "GB0007": ("call to a skipped function", "the function is outside what Dynamo traces: move it out of the step"),
    "GB0142": ("unsupported context manager", "move the context manager outside the compiled function"),
    "GB0059": ("builtin Dynamo cannot trace", "use a torch operation instead of the builtin"),
}
GRAPH_BREAK_SITE = "https://meta-pytorch.github.io/compile-graph-break-site/gb/{}.html"

#: the columns of :func:`why_table`
WHY_COLUMNS = [
    "cause",
    "source",
    "reported_by",
    "runs",
    "compiles",
    "after_warmup",
    "compile_s",
    "graph_breaks",
    "hint",
]
#: the columns of :func:`diff_graphs`
DIFF_COLUMNS = ["change", "layer", "graph_id", "cause", "source", "step", "compile_s"]


def _words(cause: Any) -> str:
    return CAUSE_WORDS.get(str(cause), str(cause)) if pd.notna(cause) else "unknown"


def _where(source: Any) -> str:
    return f" at {source}" if isinstance(source, str) and source else ""


def _seconds(value: float) -> str:
    return f"{value:.3g} s" if value < 10 else f"{value:.0f} s"


def graph_break_name(gb_id: Any, raw: Any = None) -> str:
    """A graph break's kind in a few words (``Tensor.item()``); for a rarer id, the first line of
    the backend's text (the capture gives the registry's name there), else the id."""
    if gb_id in GRAPH_BREAKS:
        return GRAPH_BREAKS[gb_id][0]
    if isinstance(raw, str) and raw.strip():
        text = " ".join(raw.strip().splitlines()[0].split())
        return text if len(text) <= 80 else text[:79] + "\N{HORIZONTAL ELLIPSIS}"
    return str(gb_id)


def _first(rows: pd.DataFrame, column: str) -> Any:
    values = rows[column].dropna()
    return values.iloc[0] if not values.empty else None


def graph_break_hint(gb_id: Any) -> str:
    """What to do about a graph break: the common ones' remedy, else the page of its id."""
    if gb_id in GRAPH_BREAKS:
        return GRAPH_BREAKS[gb_id][1]
    return f"see {GRAPH_BREAK_SITE.format(str(gb_id).lower())}" if isinstance(gb_id, str) else ""


def cause_hint(cause: Any) -> str:
    return CAUSE_HINTS.get(str(cause), "")


def run_events(compiles: pd.DataFrame, run_id: str) -> pd.DataFrame:
    """A run's rows in the order they happened: before the first step (null step) first, then by
    step, keeping the capture's own order within a step."""
    rows = compiles[compiles["run_id"] == run_id]
    order = rows["step"].fillna(-1)
    return rows.assign(_order=order).sort_values("_order", kind="stable").drop(columns="_order").reset_index(drop=True)


def compile_rows(events: pd.DataFrame) -> pd.DataFrame:
    """The compiles that were paid for: ``compile`` rows other than in-memory cache hits (XLA's
    ``CachedCompile``: the graph was found compiled in this process, so nothing compiled)."""
    return events[(events["event"] == "compile") & (events["cache"] != "memory_hit")]


def memory_hits(events: pd.DataFrame) -> int:
    """How many times a graph was found compiled in this process's cache instead of compiled."""
    return _occurrences(events[(events["event"] == "compile") & (events["cache"] == "memory_hit")])


def after_warmup(events: pd.DataFrame) -> pd.DataFrame:
    """The compiles paid inside measured (or profiled) steps."""
    rows = compile_rows(events)
    return rows[rows["phase"].isin(AFTER_WARMUP)]


def _occurrences(rows: pd.DataFrame) -> int:
    """How many times the events of ``rows`` happened: their ``count`` where given, else one each."""
    return int(rows["count"].fillna(1).clip(lower=1).sum()) if "count" in rows else len(rows)


def _groups_text(rows: pd.DataFrame) -> str:
    """``shape change x2 at workloads/x.py:88, 1.9 s each; value change at ...``, largest first."""
    parts = []
    grouped = rows.assign(_source=rows["source"].fillna("")).groupby(["cause", "_source"], dropna=False, sort=False)
    ranked = sorted(grouped, key=lambda item: (-len(item[1]), -item[1]["compile_s"].fillna(0).sum()))
    for (cause, source), group in ranked:
        times = f" {TIMES}{len(group)}" if len(group) > 1 else ""
        seconds = group["compile_s"].dropna()
        cost = ""
        if not seconds.empty:
            mean = float(seconds.mean())
            cost = f", {_seconds(mean)} each" if len(group) > 1 else f", {_seconds(mean)}"
        inferred = " (inferred)" if group.get("cause_inferred", pd.Series(dtype=bool)).fillna(False).any() else ""
        parts.append(f"{_words(cause)}{inferred}{times}{_where(source)}{cost}")
    return "; ".join(parts)


def _causing(late: pd.DataFrame, compiled: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``late`` compiles split into those with a cause of their own and those that follow one:
    a lazy backward compile follows its forward compile, and under xla-compile the XLA compiles
    that carry a Dynamo compile's id follow that Dynamo compile. Counted apart, a Dynamo run's
    "after warm-up" agrees with its ``recompiles_after_warmup``."""
    dynamo_ids = set(compiled.loc[compiled["layer"] == "dynamo", "compile_id"].dropna())
    follows = (late["cause"] == "lazy_backward") | ((late["layer"] == "xla") & late["compile_id"].isin(dynamo_ids))
    return late[~follows], late[follows]


def recompiles(events: pd.DataFrame) -> pd.DataFrame:
    """One run's compiles after warm-up that have a cause of their own (:func:`_causing`):
    what its ``recompiles_after_warmup`` counts."""
    return _causing(after_warmup(events), compile_rows(events))[0]


def top_cause(events: pd.DataFrame) -> str | None:
    """The commonest cause and source line of the compiles after warm-up, in words
    (``shape change x2 at workloads/x.py:88``); None when there is none. What a compile-count
    regression in ``compare`` and ``regressions`` names as its reason. Compiles that follow
    another (:func:`_causing`) are named only when nothing else is."""
    rows = after_warmup(events)
    if rows.empty:
        return None
    caused, _ = _causing(rows, compile_rows(events))
    rows = caused if not caused.empty else rows
    counted = rows.assign(_source=rows["source"].fillna("")).groupby(["cause", "_source"], dropna=False).size()
    (cause, source), n = counted.sort_values(ascending=False, kind="stable").index[0], int(counted.max())
    return f"{_words(cause)}{f' {TIMES}{n}' if n > 1 else ''}{_where(source)}"


def summary(events: pd.DataFrame, measured_steps: int | None = None) -> list[str]:
    """One line per fact about one run's events (:func:`run_events`): the compiles and their
    seconds, the compiles after warm-up grouped by cause and line, each graph-break kind with
    its line and hint, the recompile-limit warning, failed compiles, host reads and CPU
    fallbacks (per measured step when ``measured_steps`` is given)."""
    lines = []
    compiled = compile_rows(events)
    seconds = compiled["compile_s"].dropna()
    total = f", {_seconds(float(seconds.sum()))}" if not seconds.empty else ""
    layers = compiled["layer"].value_counts()
    split = f" ({', '.join(f'{n} {layer}' for layer, n in layers.items())})" if len(layers) > 1 else ""
    late = after_warmup(events)
    caused, following = _causing(late, compiled)
    hits = memory_hits(events)
    line = f"{len(compiled)} compile{'s' if len(compiled) != 1 else ''}{split}{total}"
    line += f" (and {hits} graph(s) found in the in-memory cache)" if hits else ""
    line += f"; after warm-up {len(caused)}" + (f" ({_groups_text(caused)})" if not caused.empty else "")
    if not following.empty:
        seconds = following["compile_s"].dropna()
        cost = f", {_seconds(float(seconds.sum()))}" if not seconds.empty else ""
        line += f", which brought {len(following)} more ({', '.join(following['layer'].value_counts().index)}{cost})"
    lines.append(line)
    for cause in dict.fromkeys(late["cause"].dropna()):
        if hint := cause_hint(cause):
            lines.append(f"hint ({_words(cause)}): {hint}")
    breaks = events[events["event"] == "graph_break"]
    for gb_id, group in breaks.groupby(breaks["graph_break_id"].fillna("unknown id"), sort=True):
        n = _occurrences(group)
        sources = ", ".join(dict.fromkeys(group["source"].dropna())) or "an unknown line"
        lines.append(
            f"{n} graph break{'s' if n != 1 else ''} {gb_id} at {sources} "
            f"({graph_break_name(gb_id, _first(group, 'raw'))}; hint: {graph_break_hint(gb_id) or 'see the raw text'})"
        )
    limit = events[events["event"] == "recompile_limit"]
    for row in limit.to_dict("records"):
        lines.append(
            f"warning: hit the recompile limit{_where(row.get('source'))}: from then on that frame runs eagerly, "
            "so the compile count stopped growing although the run is no longer compiled"
            + (f" ({' '.join(str(row['raw']).split())[:160]})" if isinstance(row.get("raw"), str) else "")
        )
    failed = events[events["event"] == "compile_failed"]
    if not failed.empty:
        sources = ", ".join(dict.fromkeys(failed["source"].dropna()))
        lines.append(f"{len(failed)} failed compile(s){_where(sources)}")
    for event, words in (("host_read", "host read"), ("fallback", "CPU fallback")):
        rows = events[events["event"] == event]
        if rows.empty:
            continue
        measured = rows[rows["phase"].isin(AFTER_WARMUP)]
        n = _occurrences(measured if measured_steps else rows)
        rate = f"{n / measured_steps:.3g}/step" if measured_steps else f"{n}"
        if event == "fallback":
            ops = ", ".join(dict.fromkeys(rows["op"].dropna())) or "unknown op"
            lines.append(f"CPU fallbacks {rate} ({ops}): a missing lowering, each a device-host round trip")
        else:
            sources = ", ".join(dict.fromkeys(rows["source"].dropna()))
            lines.append(f"{words}s {rate}{f' at {sources}' if sources else ''}")
    return lines


def why_table(compiles: pd.DataFrame) -> pd.DataFrame:
    """The compiles and graph breaks of many runs (an invocation) grouped by cause and source
    line: how many runs, compiles, compiles after warm-up, seconds and graph breaks each
    accounts for, whether the cause was reported by the backend or inferred by tpubench, and
    what to do. Largest after-warm-up count first, then seconds. Columns: :data:`WHY_COLUMNS`."""
    rows = pd.concat([compile_rows(compiles), compiles[compiles["event"] == "graph_break"]]).copy()
    if rows.empty:
        return pd.DataFrame(columns=WHY_COLUMNS)
    breaks = rows["event"] == "graph_break"
    rows.loc[breaks, "cause"] = rows.loc[breaks, "graph_break_id"].fillna("graph break")
    rows["source"] = rows["source"].fillna("")
    rows["cause"] = rows["cause"].fillna("unknown")
    found = []
    for (cause, source), group in rows.groupby(["cause", "source"], sort=False):
        compiled = group[group["event"] == "compile"]
        is_break = (group["event"] == "graph_break").any()
        inferred = compiled["cause_inferred"].fillna(False).astype(bool)
        found.append(
            {
                "cause": f"graph break {cause} ({graph_break_name(cause, _first(group, 'raw'))})"
                if is_break
                else _words(cause),
                "source": source,
                "reported_by": "tpubench (inferred)" if inferred.any() else "the backend",
                "runs": group["run_id"].nunique(),
                "compiles": len(compiled),
                "after_warmup": int(compiled["phase"].isin(AFTER_WARMUP).sum()),
                "compile_s": float(compiled["compile_s"].sum()) if compiled["compile_s"].notna().any() else None,
                "graph_breaks": _occurrences(group[group["event"] == "graph_break"]),
                "hint": graph_break_hint(cause) if is_break else cause_hint(cause),
            }
        )
    table = pd.DataFrame(found, columns=WHY_COLUMNS)
    ranked = table.assign(_s=table["compile_s"].fillna(0)).sort_values(
        ["after_warmup", "graph_breaks", "_s"], ascending=False, kind="stable"
    )
    return ranked.drop(columns="_s").reset_index(drop=True)


def diff_graphs(base: pd.DataFrame, test: pd.DataFrame) -> pd.DataFrame:
    """Graphs compiled by one of two runs of one configuration and not the other, by graph
    identity (XLA graph hash, Inductor FX key, TorchTPU key) and layer: ``new`` in ``test``,
    ``gone`` from it. Each with the cause, line, step and seconds of its first compile.
    Compiles without an identity (Dynamo frames) are left out: there is nothing to match on.
    Columns: :data:`DIFF_COLUMNS`."""

    def graphs(events: pd.DataFrame) -> pd.DataFrame:
        rows = compile_rows(events)
        rows = rows[rows["graph_id"].notna() & (rows["graph_id"] != "")]
        return rows.drop_duplicates(subset=["layer", "graph_id"], keep="first").set_index(["layer", "graph_id"])

    before, after = graphs(base), graphs(test)
    found = []
    for change, side, other in (("new", after, before), ("gone", before, after)):
        for (layer, graph_id), row in side[~side.index.isin(other.index)].iterrows():
            found.append(
                {
                    "change": change,
                    "layer": layer,
                    "graph_id": graph_id,
                    "cause": _words(row["cause"]),
                    "source": row["source"] if pd.notna(row["source"]) else "",
                    "step": None if pd.isna(row["step"]) else int(row["step"]),
                    "compile_s": None if pd.isna(row["compile_s"]) else float(row["compile_s"]),
                }
            )
    return pd.DataFrame(found, columns=DIFF_COLUMNS)


def seconds_per_step(events: pd.DataFrame) -> pd.DataFrame:
    """Compile seconds per (run, step, cause), for a timeline of step time against what each
    step spent compiling; rows before the first step are left out."""
    rows = compile_rows(events)
    rows = rows[rows["step"].notna()]
    grouped = rows.assign(cause=rows["cause"].map(_words)).groupby(["run_id", "step", "cause"], as_index=False)
    return grouped.agg(compile_s=("compile_s", "sum"), compiles=("event", "size"))


def cache_states(events: pd.DataFrame) -> pd.DataFrame:
    """Per (run, step, cache state), how many compiles and cache hits: the cache strip under a timeline."""
    rows = events[events["event"] == "compile"]
    rows = rows[rows["step"].notna()]
    return (
        rows.assign(cache=rows["cache"].fillna("unknown"))
        .assign(compiles=rows["count"].fillna(1).clip(lower=1))
        .groupby(["run_id", "step", "cache"], as_index=False)["compiles"]
        .sum()
    )


#: runs columns whose regression is a compile regression, which the compiles table can explain
COMPILE_METRICS = ("recompiles_after_warmup", "compile_count", "first_step_compiles", "compile_s", "compile_s_measured")


def change_point_causes(found: pd.DataFrame, runs: pd.DataFrame, compiles: pd.DataFrame, keys: tuple) -> pd.Series:
    """For each change point of ``found`` (:func:`tpubench.analysis.changepoints.change_points`),
    the :func:`top_cause` of the compiles after warm-up of its series' runs in the invocation
    that shifted it; None where they compiled nothing after warm-up or were not captured."""
    causes = []
    for point in found.to_dict("records"):
        chosen = runs[runs["invocation_id"] == point["invocation_id"]]
        for key in keys:
            value = point[key]
            chosen = chosen[chosen[key].isna()] if pd.isna(value) else chosen[chosen[key] == value]
        causes.append(top_cause(compiles[compiles["run_id"].isin(chosen["run_id"])]))
    return pd.Series(causes, index=found.index, dtype=object)
