"""``tpubench parity A B``: two training runs' losses step by step, and their largest difference.

Thin: runs come from :mod:`tpubench.store`, picked by :mod:`tpubench.analysis.select`'s
selectors (as ``compare``'s); the curves and the difference from :mod:`tpubench.analysis.parity`,
which the dashboard's Run details page reads too.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import pandas as pd
import typer
from rich.table import Table

from tpubench import store
from tpubench.analysis import parity as analysis
from tpubench.analysis.select import SelectorError, select_runs
from tpubench.cli.common import BadInput, app, console
from tpubench.cli.compare import SELECTOR_HELP, load_all_runs
from tpubench.cli.ops import _label
from tpubench.results_dir import DEFAULT_RESULTS_DIR

#: how many runs an ambiguous selector's error names
NAMED = 6


def pick(results: str, selector: str, runs: pd.DataFrame, name: str) -> dict[str, Any]:
    """The one run ``selector`` picks in ``results``: of several, the one ok train run among
    them (``latest`` picks a whole invocation, ``backend=xla`` an unavailable row too); more,
    or none, is a BadInput naming them."""
    try:
        chosen = select_runs(runs, selector)
    except SelectorError as error:
        raise BadInput(f"{name} {selector!r} in {results}: {error}") from error
    for column, wanted in (("mode", "train"), ("status", "ok")):
        if len(chosen) > 1 and (chosen[column] == wanted).any():
            chosen = chosen[chosen[column] == wanted]
    if len(chosen) > 1:
        shown = ", ".join(f"{r['run_id'][:8]} ({_label(r)})" for r in chosen.head(NAMED).to_dict("records"))
        more = f" and {len(chosen) - NAMED} more" if len(chosen) > NAMED else ""
        raise BadInput(
            f"{name} {selector!r} picks {len(chosen)} runs, parity compares one with one: "
            f"add terms or give run=ID ({shown}{more})"
        )
    return chosen.iloc[0].to_dict()


def losses_of(results: str, run: dict[str, Any]) -> pd.DataFrame:
    """Every step row of ``run`` (all phases, every rank), read from its invocation's file only."""
    return store.scan_table(
        results, "steps", ("run_id", "step", "phase", "rank", "loss"),
        run_id=run["run_id"], invocation_id=run["invocation_id"],
    )  # fmt: skip


def _loss(value: float) -> str:
    return f"{value:.7g}"


@app.command("parity")
def parity_command(
    a: Annotated[str, typer.Argument(metavar="A", help=f"The reference run. {SELECTOR_HELP}")],
    b: Annotated[str, typer.Argument(metavar="B", help="The run checked against it (same selector syntax).")],
    results: Annotated[str, typer.Option(help="Results directory (B's, and A's unless --results-a).")] = str(
        DEFAULT_RESULTS_DIR
    ),
    results_a: Annotated[str | None, typer.Option(help="Results directory of A (default: --results).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="The steps and the largest difference as JSON.")] = False,
) -> None:
    """Two training runs of one workload, seed and batch: their losses step by step, and the
    largest relative difference |B - A| / |A| (docs/measurement.md#loss-parity-tpubench-parity)."""
    store_a = results_a or results
    runs_b = load_all_runs(results)
    runs_a = runs_b if store_a == results else load_all_runs(store_a)
    run_a, run_b = pick(store_a, a, runs_a, "A"), pick(results, b, runs_b, "B")
    if run_a["run_id"] == run_b["run_id"]:
        raise BadInput(f"A and B pick the same run, {run_a['run_id']}: give two runs")
    steps = pd.concat([losses_of(store_a, run_a), losses_of(results, run_b)], ignore_index=True)
    try:
        found = analysis.parity(run_a, run_b, steps)
    except analysis.ParityError as error:
        raise BadInput(str(error)) from error
    if as_json:
        side = {"run_id", "backend", "device", "dtype", "devices", "hosts", "parallel"}
        print(
            json.dumps(
                {
                    "a": {key: run_a.get(key) for key in sorted(side)},
                    "b": {key: run_b.get(key) for key in sorted(side)},
                    **found.as_dict(),
                },
                indent=1,
                default=str,
            )
        )
        return
    for name, run in (("A", run_a), ("B", run_b)):
        console.print(f"{name}: {run['run_id']}  {_label(run)} on {run.get('device') or '?'}", highlight=False)
    table = Table(title="loss per step")
    for column, justify in (("step", "right"), ("phase", "left"), ("A", "right"), ("B", "right")):
        table.add_column(column, justify=justify)
    table.add_column("|B - A| / |A|", justify="right")
    for row in found.frame.itertuples():
        phase = row.phase_a if row.phase_a == row.phase_b else f"{row.phase_a} / {row.phase_b}"
        table.add_row(str(row.step), phase, _loss(row.loss_a), _loss(row.loss_b), f"{row.rel_diff:.2e}")
    console.print(table)
    console.print(
        f"largest relative difference {found.max_rel_diff:.2e} at step {found.step_of_max}, "
        f"over {len(found.frame)} steps both stored",
        highlight=False,
    )
