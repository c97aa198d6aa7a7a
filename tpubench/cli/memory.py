"""``tpubench memory``: what a run's memory held, by part and (with --profile-memory) over a step."""

from __future__ import annotations

import json
from typing import Annotated, Any

import pandas as pd
import typer
from rich.table import Table

from tpubench import store
from tpubench.analysis import memory as analysis
from tpubench.cli.common import BadInput, app, console
from tpubench.cli.ops import _find_run, _label, _results_dir, _value
from tpubench.results_dir import DEFAULT_RESULTS_DIR

#: how many instants of the profiled step the table shows (--json gives every one)
TIMELINE_ROWS = 12


def mib(value: Any) -> str:
    return "-" if value is None or pd.isna(value) else f"{float(value) / 2**20:,.1f}"


@app.command("memory")
def show_memory(
    run_id: Annotated[str, typer.Argument(metavar="RUN_ID", help="A run (id or unique prefix).")],
    as_json: Annotated[bool, typer.Option("--json", help="Breakdown per rank and the whole timeline as JSON.")] = False,
    results: Annotated[str, typer.Option(help="Results directory.")] = str(DEFAULT_RESULTS_DIR),
) -> None:
    """What a run's memory held: weights, gradients, optimizer state and activations+temporaries
    beside the peak and the admitting estimate; with --profile-memory, one step by category."""
    results_dir = _results_dir(results)
    try:
        run = _find_run(results_dir, run_id)
    except BadInput as error:  # the shared finder's hint names `tpubench ops`, which lists profiled runs only
        message = error.format_message()
        if message.startswith("unknown run"):
            message = f"unknown run {run_id!r} in {results_dir}; the dashboard's Run details page lists a store's runs"
        raise BadInput(message) from error
    memory = store.load_memory(results_dir, run_id=run["run_id"])
    ranks = analysis.per_rank(memory)
    wide = analysis.timeline(memory)
    if as_json:
        print(json.dumps(payload(run, ranks, wide, memory), indent=1, default=_plain))
        return
    if _value(run, "memory_breakdown_source") is None:
        status = _value(run, "status")
        why = f"it is {status}" if status != "ok" else "it was stored before tpubench measured memory by part"
        raise BadInput(f"run {run['run_id']} has no memory breakdown: {why}")
    console.print(f"run {run['run_id']}: {_label(run)} on {_value(run, 'device') or '?'}", highlight=False)
    console.print(breakdown_table(run, ranks))
    for line in notes(run):
        console.print(line, highlight=False)
    if not wide.empty:
        rank = analysis.timeline_rank(memory)
        of_rank = f" of rank {rank} (--json: every rank's)" if len(ranks) > 1 else ""
        console.print(timeline_table(wide, of_rank))
        agreement = analysis.agreement_text(analysis.profiler_agreement(run, memory, rank))
        said = f", rank {rank}" if len(ranks) > 1 else ""
        console.print(f"profiler / counted{said}: {agreement}", highlight=False)
        if note := analysis.profiler_note(run):
            console.print(f"note: {note}", highlight=False)


def breakdown_table(run: dict[str, Any], ranks: pd.DataFrame) -> Table:
    """Parts in MiB, one column per rank (a one-process run: one column), then peak, baseline, estimate."""
    table = Table(title=f"memory (MiB), {_value(run, 'memory_breakdown_source')}")
    table.add_column("part")
    ranks = ranks if not ranks.empty else pd.DataFrame([{"rank": 0, **analysis.run_parts(run)}])
    for rank in ranks["rank"]:
        table.add_column(f"rank {rank}" if len(ranks) > 1 else "bytes (MiB)", justify="right")
    for part, (_, label) in analysis.PARTS.items():
        table.add_row(label, *(mib(value) for value in ranks[part]))
    for key, label in (("peak", "peak (measured)"), ("baseline", "baseline before the model")):
        if key in ranks:
            table.add_row(label, *(mib(value) for value in ranks[key]))
    table.add_row("estimate (admission)", mib(_value(run, "estimated_mem_bytes")), *[""] * (len(ranks) - 1))
    return table


def notes(run: dict[str, Any]) -> list[str]:
    """What a reader must know to read the figures."""
    found = []
    if _value(run, "mem_activations_bytes") is None:
        found.append("activations + temporaries: not measured (no device peak for this run; see its warnings)")
    if _value(run, "memory_breakdown_source") == "counted_shards":
        found.append("per device: each tensor's shard under SPMD (torch_xla gives no per-device peak)")
    if (_value(run, "devices") or 1) > 1 and _value(run, "memory_breakdown_source") != "counted_shards":
        found.append("the run's columns are the rank with the highest peak; each rank is shown above")
    return found


def timeline_table(wide: pd.DataFrame, of_rank: str = "") -> Table:
    """The profiled step by category at :data:`TIMELINE_ROWS` instants, the peak's among
    them; ``of_rank`` names the rank it is on a multi-rank run."""
    categories = [c for c in wide.columns if c != "t_ms"]
    total = wide[categories].sum(axis=1)
    picks = set(range(0, len(wide), max(len(wide) // (TIMELINE_ROWS - 1), 1))) | {int(total.idxmax()), len(wide) - 1}
    table = Table(title=f"one profiled step{of_rank}, by torch.profiler category (MiB)")
    table.add_column("t (ms)", justify="right")
    for category in categories:
        table.add_column(category.replace("_", " "), justify="right")
    table.add_column("total", justify="right")
    for index in sorted(picks):
        mark = " peak" if index == int(total.idxmax()) else ""
        table.add_row(
            f"{wide['t_ms'].iloc[index]:.2f}{mark}",
            *(mib(wide[c].iloc[index]) for c in categories),
            mib(total.iloc[index]),
        )
    return table


def payload(run: dict[str, Any], ranks: pd.DataFrame, wide: pd.DataFrame, memory: pd.DataFrame) -> dict[str, Any]:
    """``--json``: the run's columns, the breakdown per rank, and the timeline per category."""
    keys = [
        "run_id",
        "workload",
        "size",
        "backend",
        "device",
        "mode",
        "devices",
        "parallel",
        "memory_breakdown_source",
        "peak_mem_bytes",
        "baseline_mem_bytes",
        "estimated_mem_bytes",
        *(column for column, _ in analysis.PARTS.values()),
    ]
    timelines, agreement = {}, {}
    if not wide.empty:
        for rank in sorted(memory.loc[memory["kind"] == "timeline", "rank"].fillna(0).astype(int).unique()):
            per = analysis.timeline(memory, int(rank))
            timelines[str(rank)] = {column: per[column].tolist() for column in per.columns}
            agreed = analysis.profiler_agreement(run, memory, int(rank))
            agreement[str(rank)] = agreed.astype(object).where(agreed.notna(), None).to_dict("records")
    return {
        **{key: _value(run, key) for key in keys},
        "breakdown_rank": analysis.breakdown_rank(memory),  # whose breakdown the columns above are (multi-rank)
        "ranks": ranks.astype(object).where(ranks.notna(), None).to_dict("records"),
        "timeline": timelines,
        "profiler_agreement": agreement,  # per rank: that rank's counted parts against its profiled step
        "profiler_note": analysis.profiler_note(run),
    }


def _plain(value: Any) -> Any:
    """numpy scalars as Python numbers for json."""
    return value.item() if hasattr(value, "item") else str(value)
