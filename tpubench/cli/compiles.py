"""``tpubench compiles``: why a run compiled and what it cost, or which graphs two runs differ by.

Thin: the rows come from the store's ``compiles`` table, the readings from
:mod:`tpubench.analysis.compiles`, the run lookup from ``tpubench ops`` (ids or a unique
prefix), the diagnostic re-run from :mod:`tpubench.explain`; this module checks input, picks
and prints.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import pandas as pd
import typer
from rich.table import Table

from tpubench import store
from tpubench.analysis import compiles as analysis
from tpubench.analysis.identity import CONFIG_KEYS, configurations
from tpubench.cli.common import BadInput, app, console
from tpubench.cli.compare import _records
from tpubench.cli.ops import _find_run, _label, _results_dir, _value
from tpubench.results_dir import DEFAULT_RESULTS_DIR

#: the runs columns a run's label is made of (tpubench ops' ``_label``)
#: what a run's label (``_label``: its configuration and backend) reads
_LABEL_COLUMNS = tuple(key for key in CONFIG_KEYS if key != "device")
#: backends that never compile a graph: they have no compile events to show
EAGER_BACKENDS = ("cpu", "cuda")


def _compiling(run: dict[str, Any]) -> dict[str, Any]:
    if run["backend"] in EAGER_BACKENDS:
        raise BadInput(
            f"run {run['run_id']}: backend {run['backend']} does not compile (eager), so it has no compile events; "
            "compiling backends: cpu-compile, cuda-compile, xla, xla-compile, tpu, tpu-compile"
        )
    return run


def _events(results_dir: Path | str, run: dict[str, Any]) -> pd.DataFrame:
    """The run's events; a BadInput saying why when the store holds none for it."""
    try:
        rows = store.load_compiles(results_dir, run_id=run["run_id"])
    except store.StoreError as error:
        raise BadInput(str(error)) from error
    if rows.empty:
        captured = _value(run, "capture_compiles")
        if captured is False:
            why = "it ran with --no-capture-compiles"
        elif run["status"] != "ok":  # a run that ended early leaves no capture columns either
            why = f"its status is {run['status']}: it ended before its capture recorded any"
        elif captured is None:  # an ok run of a compiling backend without the columns: an older store
            why = "it ran before tpubench recorded them"
        else:
            why = "its capture recorded none"
        raise BadInput(
            f"run {run['run_id']} has no compile events: {why}; `tpubench compiles {run['run_id']} --explain` "
            "re-runs it with the backend's own diagnostics"
        )
    return analysis.run_events(rows, run["run_id"])


def _text(value: Any, width: int | None = None) -> str:
    if value is None or (isinstance(value, float) and pd.isna(value)) or value is pd.NA:
        return ""
    text = " ".join(str(value).split())
    return text if width is None or len(text) <= width else text[: width - 1] + "…"


def _what(row: dict[str, Any]) -> str:
    """The identity of an event: its graph, graph-break id or op."""
    for column, width in (("graph_break_id", None), ("op", None), ("graph_id", 12), ("compile_id", None)):
        if text := _text(row.get(column), width):
            return text
    return ""


def _event_table(events: pd.DataFrame) -> Table:
    table = Table()
    for header in ("step", "phase", "event", "layer", "cause", "where", "graph / id", "s", "cache", "backend says"):
        table.add_column(header, justify="right" if header in ("step", "s") else "left")
    for row in events.to_dict("records"):
        cause = analysis.CAUSE_WORDS.get(_text(row["cause"]), _text(row["cause"]))
        seconds = row["compile_s"]
        table.add_row(
            "-" if pd.isna(row["step"]) else str(int(row["step"])),
            _text(row["phase"]),
            _text(row["event"])
            + (f" {analysis.TIMES}{int(row['count'])}" if pd.notna(row.get("count")) and row["count"] > 1 else ""),
            _text(row["layer"]),
            cause + (" (inferred)" if row.get("cause_inferred") is True else ""),
            _text(row["source"]),
            _what(row),
            "" if pd.isna(seconds) else f"{seconds:.3g}",
            _text(row["cache"]),
            _text(row["raw"], 80),
        )
    return table


#: what an unknown run's error points at: this command's own list, not ``tpubench ops``'s profiled runs
LIST_HINT = (
    "`tpubench compiles` lists the runs and what they compiled (`tpubench compiles --results DIR` for another store)"
)


@app.command("compiles")
def show_compiles(
    run_ids: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="[RUN_ID [RUN_B]]", help="A run (id or unique prefix); two runs: their graph diff; none: a list."
        ),
    ] = None,
    explain: Annotated[
        bool,
        typer.Option(help="Re-run the run's spec with the backend's diagnostics (timings not comparable; not stored)."),
    ] = False,
    python: Annotated[
        list[str] | None,
        typer.Option(help="--explain: BACKEND=INTERPRETER for its worker (e.g. xla=/venv-xla/bin/python); repeatable."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Events and summary (or the diff) as JSON.")] = False,
    results: Annotated[str, typer.Option(help="Results directory.")] = str(DEFAULT_RESULTS_DIR),
) -> None:
    """Why a run compiled: one row per compile, graph break, host read and fallback, then a summary."""
    run_ids = run_ids or []
    if len(run_ids) > 2:
        raise BadInput(f"give one run, or two runs to diff their graphs; got {len(run_ids)}")
    if not run_ids and not explain:
        _list(_results_dir(results), as_json)
        return
    if explain and len(run_ids) != 1:
        raise BadInput("--explain takes one run")
    if python and not explain:
        raise BadInput("--python is for --explain's worker")
    if explain and store.is_remote(results):
        raise BadInput(f"--results {results}: --explain writes its diagnostics beside a local store; give one")
    results_dir = _results_dir(results)
    runs = [_compiling(_find_run(results_dir, run_id, LIST_HINT)) for run_id in run_ids]
    if explain:
        from tpubench import explain as diagnose  # the worker's machinery: only --explain needs it
        from tpubench.cli.planning import pythons, use_workload_modules

        interpreters = pythons(python)
        # a user's model named by module (mypkg.models:make_model) is found from here, as `run` found it
        use_workload_modules(None, _value(runs[0], "model_ref"))

        try:
            diagnose.explain(Path(results_dir), runs[0], as_json, console, interpreters)
        except diagnose.ExplainError as error:
            raise BadInput(f"run {runs[0]['run_id']}: {error}") from error
    elif len(runs) == 2:
        _diff(results_dir, runs[0], runs[1], as_json)
    else:
        _show(results_dir, runs[0], as_json)


def _show(results_dir: Path | str, run: dict[str, Any], as_json: bool) -> None:
    events = _events(results_dir, run)
    measured = _value(run, "measured_steps")
    lines = analysis.summary(events, int(measured) if measured else None)
    if as_json:
        print(json.dumps({"run_id": run["run_id"], "events": _records(events), "summary": lines}, indent=1))
        return
    console.print(f"run {run['run_id']}: {_label(run)} on {_value(run, 'device') or '?'}", highlight=False)
    console.print(_event_table(events))
    for line in lines:
        console.print(line, highlight=False)


def _diff(results_dir: Path | str, base_run: dict[str, Any], test_run: dict[str, Any], as_json: bool) -> None:
    base_key, test_key = configurations(pd.DataFrame([base_run, test_run])).to_dict("records")
    differs = [key for key in CONFIG_KEYS if _value(base_key, key) != _value(test_key, key)]
    if differs:
        raise BadInput(
            f"runs {base_run['run_id']} and {test_run['run_id']} are not two runs of one configuration "
            f"({', '.join(differs)} differ); their graphs cannot match"
        )
    base, test = _events(results_dir, base_run), _events(results_dir, test_run)
    diff = analysis.diff_graphs(base, test)
    if as_json:
        print(json.dumps({"base": base_run["run_id"], "test": test_run["run_id"], "graphs": _records(diff)}, indent=1))
        return
    console.print(f"base {base_run['run_id']}, test {test_run['run_id']}: {_label(base_run)}", highlight=False)
    counts = {
        side: analysis.compile_rows(events)["graph_id"].nunique()
        for side, events in {"base": base, "test": test}.items()
    }
    if diff.empty:
        console.print(f"the same {counts['base']} graph(s) in both runs", highlight=False)
        return
    table = Table()
    for header in ("change", "layer", "graph", "cause", "where", "step", "s"):
        table.add_column(header)
    for row in diff.to_dict("records"):
        seconds = row["compile_s"]
        table.add_row(
            row["change"],
            row["layer"],
            row["graph_id"],
            row["cause"],
            row["source"],
            "" if row["step"] is None or pd.isna(row["step"]) else str(int(row["step"])),
            "" if seconds is None or pd.isna(seconds) else f"{seconds:.3g}",
        )
    console.print(table)
    changes = diff["change"].value_counts()
    console.print(
        f"{changes.get('new', 0)} new, {changes.get('gone', 0)} gone; "
        f"{counts['base']} graph(s) in the base, {counts['test']} in the test",
        highlight=False,
    )


def _list(results_dir: Path | str, as_json: bool) -> None:
    """The runs that have compile events, with their counts: where to look first."""
    try:
        runs = store.load_runs(results_dir)
    except store.StoreError as error:
        raise BadInput(str(error)) from error
    events = store.load_compiles(results_dir)
    compiled = analysis.compile_rows(events)
    counts = pd.DataFrame(
        {
            "compiles": compiled.groupby("run_id").size(),
            "after_warmup": {run_id: len(analysis.recompiles(rows)) for run_id, rows in events.groupby("run_id")},
            "graph_breaks": events[events["event"] == "graph_break"].groupby("run_id").size(),
            "limit_hit": events[events["event"] == "recompile_limit"].groupby("run_id").size() > 0,
        }
    )
    chosen = runs.loc[runs["run_id"].isin(counts.index), ["run_id", *_LABEL_COLUMNS]]
    listing = chosen.set_index("run_id").join(counts).reset_index()
    listing["run"] = [_label(run) for run in listing.to_dict("records")]
    listing = listing[["run_id", "run", "compiles", "after_warmup", "graph_breaks", "limit_hit"]]
    listing = listing.fillna({"compiles": 0, "after_warmup": 0, "graph_breaks": 0, "limit_hit": False})
    if as_json:
        print(json.dumps(_records(listing), indent=1))
        return
    if listing.empty:
        console.print(f"no run in {results_dir} has compile events; compiling backends record them as they run")
        return
    table = Table(title=f"runs with compile events in {results_dir}")
    for header in ("run id", "run", "compiles", "after warm-up", "graph breaks", "recompile limit"):
        table.add_column(header)
    for row in listing.to_dict("records"):
        table.add_row(
            row["run_id"],
            row["run"],
            str(int(row["compiles"])),
            str(int(row["after_warmup"])),
            str(int(row["graph_breaks"])),
            "hit" if row["limit_hit"] else "",
        )
    console.print(table)
