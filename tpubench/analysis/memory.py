"""A run's memory, read back: its breakdown per rank, its timeline by category, and the
parts of many runs side by side. Stateless functions over the runs and memory tables
(docs/schema.md), shared by ``tpubench memory``, the reports and the dashboard.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

#: the breakdown's parts, bottom to top of a stacked bar, with their runs columns and labels
PARTS = {
    "weights": ("mem_weights_bytes", "weights"),
    "gradients": ("mem_grads_bytes", "gradients"),
    "optimizer": ("mem_optimizer_bytes", "optimizer state"),
    "activations": ("mem_activations_bytes", "activations + temporaries"),
}
#: the profiler's categories (as the memory table names them) that measure the exactly counted parts
PROFILED_PART = {"parameter": "weights", "gradient": "gradients", "optimizer_state": "optimizer"}
#: the timeline's categories, bottom to top of a stacked area
TIMELINE_ORDER = (
    "parameter",
    "optimizer_state",
    "gradient",
    "input",
    "activation",
    "temporary",
    "autograd_detail",
    "unknown",
)


def _number(value: Any) -> float | None:
    return None if value is None or pd.isna(value) else float(value)


def run_parts(run: dict[str, Any]) -> dict[str, float | None]:
    """A runs row's breakdown: bytes per part (None: not measured), from its columns."""
    return {part: _number(run.get(column)) for part, (column, _) in PARTS.items()}


def per_rank(memory: pd.DataFrame) -> pd.DataFrame:
    """One run's breakdown rows as a table: one row per rank (0 for a one-process run), a
    column per part plus peak and baseline, in bytes."""
    rows = memory[memory["kind"] == "breakdown"]
    if rows.empty:
        return pd.DataFrame(columns=["rank", *PARTS, "peak", "baseline", "source"])
    rows = rows.assign(rank=rows["rank"].fillna(0).astype(int))
    table = rows.pivot_table(index="rank", columns="category", values="bytes", aggfunc="first", dropna=False)
    table = table.reindex(columns=[*PARTS, "peak", "baseline"])
    table["source"] = rows.groupby("rank")["source"].first()
    return table.reset_index()


def timeline_rank(memory: pd.DataFrame) -> int | None:
    """The rank whose profiled step a reader shows by default: the lowest with one (0 for a
    one-process run); None without --profile-memory."""
    ranks = memory.loc[memory["kind"] == "timeline", "rank"].fillna(0).astype(int)
    return int(ranks.min()) if len(ranks) else None


def breakdown_rank(memory: pd.DataFrame) -> int | None:
    """The rank whose breakdown a multi-rank run's row carries: the one with the highest peak
    (the device that decides whether the job fits, as the rank merge picks it); None for a
    run with one rank or no peaks."""
    ranks = per_rank(memory)
    if len(ranks) < 2 or ranks["peak"].isna().all():
        return None
    return int(ranks.loc[ranks["peak"].astype(float).idxmax(), "rank"])


def timeline(memory: pd.DataFrame, rank: int | None = None) -> pd.DataFrame:
    """One run's profiled step as a wide table: ``t_ms`` and bytes per category held at each
    allocation event, for ``rank`` (default: :func:`timeline_rank`). Empty without --profile-memory."""
    rows = memory[memory["kind"] == "timeline"]
    if rows.empty:
        return pd.DataFrame(columns=["t_ms"])
    ranks = rows["rank"].fillna(0).astype(int)
    rows = rows[ranks == (timeline_rank(memory) if rank is None else rank)]
    wide = rows.pivot_table(index="t_us", columns="category", values="bytes", aggfunc="last").fillna(0)
    wide = wide.reindex(columns=[c for c in TIMELINE_ORDER if c in wide.columns])
    wide.index = wide.index / 1e3
    return wide.rename_axis("t_ms").reset_index()


def timeline_peaks(memory: pd.DataFrame, rank: int | None = None) -> dict[str, int]:
    """Per category, the most it held during the profiled step (bytes)."""
    wide = timeline(memory, rank)
    return {column: int(wide[column].max()) for column in wide.columns if column != "t_ms"}


def profiler_agreement(run: dict[str, Any], memory: pd.DataFrame, rank: int | None = None) -> pd.DataFrame:
    """One rank's counted parts beside the profiler's categories for them on the same rank
    (the most each held during its profiled step): part, counted, profiled, and profiled /
    counted; ``rank`` defaults to :func:`timeline_rank`. Not the row's columns, which on a
    multi-rank run are another rank's (:func:`breakdown_rank`). On an FSDP rank the
    weights' and gradients' ratios are well above 1 by design (:func:`profiler_note`)."""
    rank = timeline_rank(memory) if rank is None else rank
    peaks = timeline_peaks(memory, rank)
    ranks = per_rank(memory).set_index("rank")
    counted = ranks.loc[rank, list(PARTS)].to_dict() if rank in ranks.index else run_parts(run)
    counted = {part: _number(value) for part, value in counted.items()}
    rows = []
    for category, part in PROFILED_PART.items():
        have, seen = counted[part], peaks.get(category)
        ratio = seen / have if have and seen is not None else None
        rows.append({"part": part, "counted": have, "profiled": seen, "ratio": ratio})
    return pd.DataFrame(rows)


def agreement_text(agreement: pd.DataFrame) -> str:
    """:func:`profiler_agreement` as a reader prints it: "weights 1.000x, gradients 1.000x,
    optimizer 1.000x", naming a counted part no profiler category held."""
    shown = ", ".join(f"{r.part} {r.ratio:.3f}x" for r in agreement.itertuples() if pd.notna(r.ratio))
    missing = [r.part for r in agreement.itertuples() if r.counted and pd.isna(r.profiled)]
    return shown + (f"; no profiler category held {', '.join(missing)}" if missing else "")


#: why an FSDP rank's profiled weights and gradients read above its counted shard
FSDP_PROFILE_NOTE = (
    "on an FSDP rank the profiler's parameter category holds, beside the rank's own shard, the parameters FSDP "
    "all-gathers for each layer's forward and backward (the gathered buffer and the unsharded parameters copied "
    "out of it), and its gradient category the unsharded gradients before their reduce-scatter: the weights' and "
    "gradients' ratios measure those transient copies (on N ranks up to 2N+1 and N times the shard: 5x and 1.9x "
    "on 2 ranks of a small MLP), not a miscount; the optimizer state's ratio is the check"
)


def profiler_note(run: dict[str, Any]) -> str | None:
    """What a reader must know to read :func:`profiler_agreement` on this run: None where
    the ratios should be 1 (one process, data parallel), the FSDP note where they cannot."""
    parallel = str(run.get("parallel") or "")
    return FSDP_PROFILE_NOTE if "fsdp" in parallel and (_number(run.get("devices")) or 1) > 1 else None


def with_breakdown(runs: pd.DataFrame) -> pd.DataFrame:
    """The runs that have a memory breakdown (the ones :func:`stacked` draws), with every part's
    column (null where a frame lacks one): a reader labels only these."""
    columns = [column for column, _ in PARTS.values()]
    have = runs.reindex(columns=[*runs.columns, *[c for c in columns if c not in runs.columns]])
    return have[have[columns[0]].notna()]


def stacked(runs: pd.DataFrame, label: pd.Series | None = None) -> pd.DataFrame:
    """Runs' breakdowns in long form for a stacked bar: run_id, label, part, bytes, with
    each run's estimate and peak beside; runs without a breakdown are left out."""
    have = with_breakdown(runs)
    names = label.loc[have.index] if label is not None else have["run_id"]
    rows = [
        {
            "run_id": run["run_id"],
            "label": names.loc[index],
            "part": name,
            "bytes": _number(run.get(column)),
            "estimated_mem_bytes": _number(run.get("estimated_mem_bytes")),
            "peak_above_baseline": _number(run.get("peak_mem_bytes")) - (_number(run.get("baseline_mem_bytes")) or 0)
            if _number(run.get("peak_mem_bytes")) is not None
            else None,
        }
        for index, run in have.iterrows()
        for _, (column, name) in PARTS.items()
    ]
    return pd.DataFrame(
        rows, columns=["run_id", "label", "part", "bytes", "estimated_mem_bytes", "peak_above_baseline"]
    )
