"""Per-op analyses over the ``ops`` table: rank, split by category, compare two runs.

Stateless functions from DataFrames (one run's rows of :func:`tpubench.store.load_ops`) to
DataFrames, with units in the column names and no I/O or printing, so that the CLI, the
reports and the dashboard share them (HolisticTraceAnalysis's analyzer style).

A run's rows can come from several sources: a CUDA run has ``aten`` rows (host) and
``kernel`` rows (device). Where time went on the device is the question, so analyses take
the most device-side source a run has (:data:`SOURCE_PREFERENCE`) unless told otherwise.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from tpubench.analysis.categories import CATEGORIES, fused_category

#: the source whose rows say where a run's device time went, most device-side first
SOURCE_PREFERENCE = ("kernel", "hlo", "aten")
#: a change within this fraction of the base time is "same" in :func:`diff_ops`
SAME_WITHIN = 0.05
OTHERS = "others"


def primary_source(ops: pd.DataFrame) -> str:
    """The most device-side source among ``ops``' rows ("kernel", then "hlo", then "aten")."""
    present = set(ops["source"])
    for source in SOURCE_PREFERENCE:
        if source in present:
            return source
    raise ValueError("no ops rows")


def of_source(ops: pd.DataFrame, source: str | None = None) -> pd.DataFrame:
    """``ops``' rows of ``source`` (default: :func:`primary_source`)."""
    source = source or primary_source(ops)
    return ops[ops["source"] == source]


def top_ops(
    ops: pd.DataFrame, n: int = 20, by: str = "self", category: str | None = None, source: str | None = None
) -> pd.DataFrame:
    """The ``n`` ops with the most self (or total) time, ranked, then one ``others`` row.

    Columns: rank, op, category, framework_op, calls, self_time_us, total_time_us,
    self_us_per_step, self_pct, flops, achieved_flops_per_s, bound_by. ``others`` (rank
    null) sums the rest, so that the table accounts for all of the source's time.
    """
    if by not in ("self", "total"):
        raise ValueError(f"by must be 'self' or 'total', got {by!r}")
    if category is not None and category not in CATEGORIES:
        raise ValueError(f"unknown category {category!r}; valid: {', '.join(CATEGORIES)}")
    rows = of_source(ops, source)
    if category is not None:
        rows = rows[rows["category"] == category]
    key = "self_time_us" if by == "self" else "total_time_us"
    ranked = rows.sort_values([key, "op"], ascending=[False, True]).reset_index(drop=True)
    columns = [
        "op",
        "category",
        "framework_op",
        "calls",
        "self_time_us",
        "total_time_us",
        "self_us_per_step",
        "self_pct",
        "flops",
        "achieved_flops_per_s",
        "bound_by",
    ]
    top = ranked.head(n)[columns].copy()
    top.insert(0, "rank", pd.array(range(1, len(top) + 1), dtype="Int64"))
    rest = ranked.iloc[n:]
    if len(rest):
        others = {
            "rank": pd.NA,
            "op": f"{OTHERS} ({len(rest)} ops)",
            "category": OTHERS,
            "calls": int(rest["calls"].sum()),
            **{column: rest[column].sum(min_count=1) for column in ("self_time_us", "self_us_per_step", "self_pct")},
        }
        top = pd.concat([top, pd.DataFrame([others]).astype({"rank": "Int64"})], ignore_index=True)
    return top


def category_breakdown(ops: pd.DataFrame, source: str | None = None) -> pd.DataFrame:
    """Self time per category, largest first: category, ops, calls, self_time_us,
    self_us_per_step, self_pct (of the traced steps' time) and share (of the source's self time)."""
    rows = of_source(ops, source)
    grouped = (
        rows.groupby("category", observed=True)
        .agg(
            ops=("op", "size"),
            calls=("calls", "sum"),
            self_time_us=("self_time_us", "sum"),
            self_us_per_step=("self_us_per_step", lambda s: s.sum(min_count=1)),
            self_pct=("self_pct", lambda s: s.sum(min_count=1)),
        )
        .reset_index()
    )
    total = grouped["self_time_us"].sum()
    grouped["share"] = grouped["self_time_us"] / total if total else np.nan
    return grouped.sort_values(["self_time_us", "category"], ascending=[False, True]).reset_index(drop=True)


def _per_step(rows: pd.DataFrame, key: str) -> pd.DataFrame:
    if rows["self_us_per_step"].isna().any():
        raise ValueError("the traced step count of a run is unknown (no self_us_per_step); re-ingest it")
    return rows.groupby(key, observed=True).agg(
        calls=("calls", "sum"), us_per_step=("self_us_per_step", "sum"), pct=("self_pct", "sum")
    )


def diff_ops(
    base: pd.DataFrame, test: pd.DataFrame, by: str = "op", source: str | None = None, same_within: float = SAME_WITHIN
) -> pd.DataFrame:
    """Compare two runs' ops, per traced step: by op within one source, or by category, which
    also compares across sources (a GPU run's kernels with a TPU run's HLO ops).

    Each run contributes its ``source`` rows (default: its :func:`primary_source`); by op,
    both must be the same source. Columns: the key (op or category), base_/test_calls,
    base_/test_us_per_step, delta_us_per_step, ratio (test / base), base_/test_pct,
    delta_pct, and change: new, missing, slower, faster or same (within ``same_within``
    of the base). Sorted by impact: the largest absolute delta first.
    """
    if by not in ("op", "category"):
        raise ValueError(f"by must be 'op' or 'category', got {by!r}")
    base_rows, test_rows = of_source(base, source), of_source(test, source)
    sources = (base_rows["source"].iloc[0], test_rows["source"].iloc[0])
    if by == "op" and sources[0] != sources[1]:
        raise ValueError(f"the runs' ops come from different sources ({sources[0]} vs {sources[1]}): diff by category")
    key = by
    joined = pd.merge(
        _per_step(base_rows, key),
        _per_step(test_rows, key),
        how="outer",
        left_index=True,
        right_index=True,
        suffixes=("_base", "_test"),
    )
    frame = pd.DataFrame(
        {
            key: joined.index,
            "base_calls": joined["calls_base"].astype("Int64").to_numpy(),
            "test_calls": joined["calls_test"].astype("Int64").to_numpy(),
            "base_us_per_step": joined["us_per_step_base"].to_numpy(),
            "test_us_per_step": joined["us_per_step_test"].to_numpy(),
            "base_pct": joined["pct_base"].to_numpy(),
            "test_pct": joined["pct_test"].to_numpy(),
        }
    )
    base_us, test_us = frame["base_us_per_step"].fillna(0.0), frame["test_us_per_step"].fillna(0.0)
    frame["delta_us_per_step"] = test_us - base_us
    frame["ratio"] = np.where(base_us > 0, test_us / base_us.where(base_us > 0, 1.0), np.nan)
    frame["delta_pct"] = frame["test_pct"].fillna(0.0) - frame["base_pct"].fillna(0.0)
    frame["change"] = np.select(
        [
            frame["base_us_per_step"].isna(),
            frame["test_us_per_step"].isna(),
            frame["delta_us_per_step"].abs() <= same_within * base_us,
            frame["delta_us_per_step"] > 0,
        ],
        ["new", "missing", "same", "slower"],
        default="faster",
    )
    order = frame["delta_us_per_step"].abs().sort_values(ascending=False, kind="stable").index
    columns = [
        key,
        "change",
        "base_calls",
        "test_calls",
        "base_us_per_step",
        "test_us_per_step",
        "delta_us_per_step",
        "ratio",
        "base_pct",
        "test_pct",
        "delta_pct",
    ]
    return frame.loc[order, columns].reset_index(drop=True)


def traced_step_ms(ops: pd.DataFrame, source: str | None = None) -> float | None:
    """One traced step's wall time (ms): the traced steps' time over their count; None if unknown."""
    first = of_source(ops, source).iloc[0]
    steps, step_us = first["traced_steps"], first["step_time_us"]
    return float(step_us / steps / 1e3) if pd.notna(steps) and pd.notna(step_us) and steps else None


def profiler_overhead(traced_ms: float | None, median_step_ms: float | None) -> str | None:
    """The traced step against the run's untraced median, said beside every ops table: a
    profiler records each op (with its shapes), so a traced step is slower than a measured
    one, by how much depends on how many ops a step runs. The table's times are the traced
    step's; its percentages are the shares to read."""
    if traced_ms is None or median_step_ms is None or median_step_ms != median_step_ms or median_step_ms <= 0:
        return None
    ratio = traced_ms / median_step_ms
    effect = (
        f"the profiler's overhead is {100 * (ratio - 1):.0f}% (it records every op, with its shapes)"
        if ratio >= 1
        else "no profiler overhead shows: the host's load differed between the measured and the traced steps"
    )
    return (
        f"a traced step took {traced_ms:,.2f} ms against the run's untraced median of {median_step_ms:,.2f} ms "
        f"(x{ratio:.2f}): {effect}. The times in the table are the traced step's; read its percentages as the "
        "shares of the run's step"
    )


def overlapping_threads(ops: pd.DataFrame, run: dict[str, Any], source: str | None = None) -> str | None:
    """Why a trace's shares add up to more than its step, when they do: ops on several threads
    overlap in time (gloo runs each collective on a worker thread while the main thread waits
    in the c10d op or FSDP's annotation), and each thread's self time counts. The run's
    ``collective_ms`` is the time in collectives counted once (the union of their intervals,
    :mod:`tpubench.traces.collectives`). None when the shares fit in the step."""
    total = of_source(ops, source)["self_pct"].sum(min_count=1)
    if pd.isna(total) or total <= 100.5:
        return None
    collectives = run.get("collective_ms")
    once = (
        f"; the time in collectives counted once is {collectives:,.2f} ms per step "
        f"({100 * run['collective_share']:.1f}% of the run's step, `collective_ms`)"
        if collectives is not None and run.get("collective_share") is not None
        else ""
    )
    return (
        f"the shares add up to {total:.0f}% of the step: ops on several threads overlapped (collectives run on "
        f"worker threads while the main thread waits for them), and each thread's time counts{once}"
    )


GRAPH_CALL = "## Call CompiledFxGraph"


def unsplit_graphs(ops: pd.DataFrame, source: str | None = None) -> str | None:
    """Why a compiled run's categories cannot be trusted, when they cannot: Inductor's fused
    kernels ran inside ``## Call CompiledFxGraph`` events (category other) and the trace does
    not name them (traced before tpubench had Inductor name its kernels: runs profiled now
    have a row per kernel, :func:`tpubench.analysis.categories.fused_category`). None otherwise."""
    rows = of_source(ops, source)
    graphs = rows[rows["op"].str.startswith(GRAPH_CALL)]
    if graphs.empty or rows["op"].map(fused_category).notna().any():
        return None
    share = graphs["self_pct"].sum(min_count=1)
    said = f" ({share:.1f}% of the step)" if pd.notna(share) else ""
    return (
        f"Inductor's fused kernels ran inside {len(graphs)} `{GRAPH_CALL} ...` row(s) in 'other'{said}, which this "
        "trace does not split: the elementwise and normalization work they fused is missing from those categories. "
        "Profile the run again (`tpubench run --profile`) to get a row per fused kernel, named after its ops"
    )
