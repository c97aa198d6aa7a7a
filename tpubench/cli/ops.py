"""``tpubench ops`` and ``tpubench trace``: where a profiled run's time went, op by op.

Thin: the rows come from :func:`tpubench.store.load_ops`, the rankings and diffs from
:mod:`tpubench.analysis.ops`, the rebuild from :func:`tpubench.traces.ingest`; this module
checks input, picks and prints.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Annotated, Any

import pandas as pd
import typer
from rich.table import Table

from tpubench import peaks, store, store_compact, viewer
from tpubench.analysis import ops as analysis
from tpubench.analysis.categories import CATEGORIES, SOURCES
from tpubench.analysis.identity import config_labels
from tpubench.analysis.roofline import device_kind
from tpubench.cli.common import BadInput, app, console
from tpubench.results_dir import DEFAULT_RESULTS_DIR
from tpubench.store import StoreError
from tpubench.traces import TraceError, ingest, locate

LIST_HINT = "`tpubench ops` lists the profiled runs (`tpubench ops --results DIR` for another store)"


def _results_dir(results: str, local: bool = False) -> Path | str:
    """The store to read: a local directory, or (unless ``local``: the command reads trace
    files) an object-store URL, which the loaders read as they are."""
    if store.is_remote(results):
        if local:
            raise BadInput(f"{results}: traces are read from a local store; copy the run's trace folder here first")
        try:
            found = store.Location(results).exists()
        except Exception as error:  # fsspec back ends raise their own types: a missing package, no credentials
            raise BadInput(f"--results {results}: cannot read there ({type(error).__name__}: {error})") from error
        if not found:
            raise BadInput(f"--results {results} does not exist")
        return results
    path = Path(results)
    if path.exists() and not path.is_dir():
        raise BadInput(f"results directory {results!r} is a file, not a directory")
    if not path.is_dir():
        raise BadInput(f"results directory {results!r} does not exist; `tpubench run --results DIR` creates one")
    if (hint := store.table_folder_hint(path)) is not None:
        raise BadInput(hint)
    return path


def _value(run: dict[str, Any], key: str) -> Any:
    """A runs-table value, with pandas' missing values as None."""
    value = run.get(key)
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else value


def _label(run: dict[str, Any]) -> str:
    """The run's configuration as every reader labels it (:func:`config_labels`), then its
    backend (its device, where a command shows it, follows as "on DEVICE")."""
    return f"{config_labels(pd.DataFrame([run])).iloc[0]} {run['backend']}"


def _find_run(results_dir: Path | str, run_id: str, hint: str = LIST_HINT) -> dict[str, Any]:
    """The run whose id is ``run_id`` or starts with it (a unique prefix of 4 or more characters);
    an unknown one is a BadInput ending with ``hint``: the command that lists the runs to give."""
    try:
        runs = store.load_runs(results_dir)
    except StoreError as error:
        raise BadInput(str(error)) from error
    found = runs[runs["run_id"] == run_id]
    if found.empty and len(run_id) >= 4:
        found = runs[runs["run_id"].str.startswith(run_id)]
    if len(found) > 1:
        raise BadInput(f"run id {run_id!r} is ambiguous ({', '.join(found['run_id'])}); give more of it")
    if found.empty:
        raise BadInput(f"unknown run {run_id!r} in {results_dir}; {hint}")
    return found.iloc[0].to_dict()


def _capture_hint(run: dict[str, Any]) -> str:
    return (
        f"tpubench run --workload {run['workload']} --size {run['size']} --backend {run['backend']} "
        f"--mode {run['mode']} --profile"
    )


def _trace_of(results_dir: Path, run: dict[str, Any]) -> Path:
    """The run's trace, which must lie inside the results directory."""
    recorded = _value(run, "trace_path")
    if not recorded:
        raise BadInput(f"run {run['run_id']} has no trace; capture one with `{_capture_hint(run)}`")
    try:
        path = store.inside_results(results_dir, recorded)
    except StoreError as error:
        raise BadInput(f"run {run['run_id']}: trace_path {error}") from error
    if not path.exists():
        raise BadInput(f"run {run['run_id']}: its trace {path} is gone; capture another with `{_capture_hint(run)}`")
    return path


def _run_ops(results_dir: Path | str, run: dict[str, Any]) -> pd.DataFrame:
    """The run's ops rows; BadInput saying why (and what to do) when there are none."""
    rows = store.load_ops(results_dir, run_id=run["run_id"])
    if not rows.empty:
        return rows
    run_id = run["run_id"]
    if not _value(run, "trace_path"):
        raise BadInput(f"run {run_id} has no trace; capture one with `{_capture_hint(run)}`")
    if error := _value(run, "ops_error"):
        error = " ".join(str(error).split())  # one line
        raise BadInput(
            f"run {run_id}: its trace could not be read ({error}); retry with `tpubench ops --ingest {run_id}`"
        )
    raise BadInput(f"run {run_id} has no ops rows yet; build them with `tpubench ops --ingest {run_id}`")


def _device_kind(run: dict[str, Any]) -> str:
    """The device kind the run's device name is listed under in the peak table."""
    return device_kind(run["backend"], _value(run, "device"))


def _peak_flops(run: dict[str, Any]) -> float | None:
    peak = peaks.lookup(str(_value(run, "device") or ""), _device_kind(run))
    return peak.device_flops(run["dtype"]) if peak else None


def _number(value: Any, digits: int = 1) -> str:
    if value is None or pd.isna(value):
        return "-"
    return f"{value:,.{digits}f}"


def _emit(frame: pd.DataFrame, as_json: bool, as_csv: bool) -> bool:
    """Print ``frame`` as JSON records or CSV if asked; whether it did."""
    if as_json:
        print(json.dumps(json.loads(frame.to_json(orient="records")), indent=2))
    elif as_csv:
        sys.stdout.write(frame.to_csv(index=False))
    return as_json or as_csv


def _choice(option: str, value: str | None, valid: tuple[str, ...]) -> str | None:
    if value is not None and value not in valid:
        raise BadInput(f"unknown {option} {value!r}; valid: {', '.join(valid)}")
    return value


@app.command("ops")
def show_ops(
    run_id: Annotated[str | None, typer.Argument(help="The run (its id or a unique prefix); none lists them.")] = None,
    top: Annotated[int, typer.Option(help="Rows to show; the rest fold into one 'others' row.")] = 20,
    by: Annotated[str, typer.Option(help="Rank by self or total (inclusive) time.")] = "self",
    category: Annotated[str | None, typer.Option(help=f"Only this category: {', '.join(CATEGORIES)}.")] = None,
    source: Annotated[
        str | None, typer.Option(help="hlo, aten or kernel (default: the run's most device-side source).")
    ] = None,
    diff: Annotated[
        tuple[str, str] | None, typer.Option(metavar="RUN_A RUN_B", help="Compare two runs (A is the base).")
    ] = None,
    diff_by: Annotated[
        str | None, typer.Option(help="--diff by op or category (default: op when both runs share a source).")
    ] = None,
    rebuild: Annotated[
        str | None, typer.Option("--ingest", metavar="RUN_ID", help="(Re)build a run's ops rows from its trace.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Rows as JSON records.")] = False,
    as_csv: Annotated[bool, typer.Option("--csv", help="Rows as CSV.")] = False,
    results: Annotated[str, typer.Option(help="Results directory.")] = str(DEFAULT_RESULTS_DIR),
) -> None:
    """Show where a profiled run's time went, op by op, or compare two runs."""
    if sum(x is not None for x in (run_id, diff, rebuild)) > 1:
        raise BadInput("give one of RUN_ID, --diff RUN_A RUN_B or --ingest RUN_ID")
    if as_json and as_csv:
        raise BadInput("--json and --csv exclude each other")
    if top < 1:
        raise BadInput(f"--top expects a positive number, got {top}")
    _choice("--by", by, ("self", "total"))
    _choice("--category", category, CATEGORIES)
    _choice("--source", source, SOURCES)
    _choice("--diff-by", diff_by, ("op", "category"))
    results_dir = _results_dir(results, local=rebuild is not None)
    if rebuild is not None:
        _rebuild(Path(results_dir), rebuild)
    elif diff is not None:
        _diff(results_dir, diff, diff_by, source, top, as_json, as_csv)
    elif run_id is not None:
        _show(results_dir, run_id, top, by, category, source, as_json, as_csv)
    else:
        _list(results_dir, as_json, as_csv)


def _list(results_dir: Path | str, as_json: bool, as_csv: bool) -> None:
    runs = store.load_runs(results_dir)
    runs = runs[runs["trace_path"].notna()]
    counts = store.load_ops(results_dir).groupby("run_id").size()
    listing = pd.DataFrame(
        {
            "run_id": runs["run_id"],
            "run": [_label(run) for run in runs.to_dict("records")],
            "device": runs["device"],
            "traced_steps": runs["profile_steps"].astype("Int64"),
            "ops_rows": runs["run_id"].map(counts).fillna(0).astype(int),
            "ops_error": runs["ops_error"],
        }
    )
    if _emit(listing, as_json, as_csv):
        return
    if listing.empty:
        console.print(f"no profiled runs in {results_dir}; `tpubench run --profile` traces runs")
        return
    table = Table(title=f"profiled runs in {results_dir}")
    for header in ("run id", "run", "device", "traced steps", "ops rows", "ingest error"):
        table.add_column(header)
    for row in listing.to_dict("records"):
        table.add_row(
            row["run_id"],
            row["run"],
            str(row["device"]),
            _number(row["traced_steps"], 0),
            str(row["ops_rows"]),
            row["ops_error"] if isinstance(row["ops_error"], str) else "",
        )
    console.print(table)


def _show(
    results_dir: Path | str,
    run_id: str,
    top: int,
    by: str,
    category: str | None,
    source: str | None,
    as_json: bool,
    as_csv: bool,
) -> None:
    run = _find_run(results_dir, run_id)
    rows = _run_ops(results_dir, run)
    if source is not None and source not in set(rows["source"]):
        raise BadInput(f"run {run['run_id']} has no {source} ops; it has {', '.join(sorted(set(rows['source'])))}")
    ranked = analysis.top_ops(rows, n=top, by=by, category=category, source=source)
    peak = _peak_flops(run)
    ranked["peak_fraction"] = ranked["achieved_flops_per_s"] / peak if peak else float("nan")
    if _emit(ranked, as_json, as_csv):
        return
    first = analysis.of_source(rows, source).iloc[0].to_dict()
    steps, step_us = _value(first, "traced_steps"), _value(first, "step_time_us")
    per_step = f", {step_us / steps / 1e3:.2f} ms per step" if steps and step_us else ""
    console.print(f"run {run['run_id']}: {_label(run)} on {_value(run, 'device') or '?'}")
    others = sorted(set(rows["source"]) - {first["source"]})
    devices = int(_value(first, "devices") or 1) if "devices" in first else 1
    console.print(
        f"{first['source']} ops from the {first['tool']}; {steps or '?'} traced steps{per_step}"
        + (f"; per device of {devices}" if devices > 1 else "")
        + (f"; also {', '.join(others)} ops (--source)" if others else "")
    )
    for note in _notes(rows, run, source):
        console.print(note, highlight=False)
    table = Table()
    flops = ranked["achieved_flops_per_s"].notna().any()  # only xprof's device tables count FLOPs
    headers = ["#", "op", "category", "calls/step", "self µs/step", "% of step", "total µs/step"]
    headers += (["TFLOP/s"] + (["% of peak"] if peak else [])) if flops else []
    for header in headers:
        table.add_column(header, justify="left" if header in ("op", "category") else "right")
    for row in ranked.to_dict("records"):
        per = steps or 1
        cells = [
            _number(row["rank"], 0),
            str(row["op"]),
            str(row["category"]),
            _number(row["calls"] / per, 1),
            _number(row["self_us_per_step"]),
            _number(row["self_pct"]),
            _number(row["total_time_us"] / per if pd.notna(row.get("total_time_us")) else None),
        ]
        if flops:
            achieved = row["achieved_flops_per_s"]
            cells.append(_number(achieved / 1e12 if pd.notna(achieved) else None, 2))
        if flops and peak:
            cells.append(_number(100 * row["peak_fraction"]))
        table.add_row(*cells)
    console.print(table)
    split = analysis.category_breakdown(rows, source)
    console.print(
        "by category (% of step): "
        + ", ".join(f"{c} {_number(p)}" for c, p in zip(split["category"], split["self_pct"], strict=True))
    )


def _notes(rows: pd.DataFrame, run: dict[str, Any], source: str | None) -> list[str]:
    """What to know before reading a run's ops: the profiler's overhead, and unsplit Inductor graphs."""
    overhead = analysis.profiler_overhead(analysis.traced_step_ms(rows, source), _value(run, "median_step_ms"))
    overlap = analysis.overlapping_threads(
        rows, {key: _value(run, key) for key in ("collective_ms", "collective_share")}, source
    )
    return [f"note: {note}" for note in (overhead, analysis.unsplit_graphs(rows, source), overlap) if note]


def _diff(
    results_dir: Path | str,
    pair: tuple[str, str],
    diff_by: str | None,
    source: str | None,
    top: int,
    as_json: bool,
    as_csv: bool,
) -> None:
    base_run, test_run = (_find_run(results_dir, run_id) for run_id in pair)
    base, test = (_run_ops(results_dir, run) for run in (base_run, test_run))
    sources = (analysis.of_source(base, source), analysis.of_source(test, source))
    if any(frame.empty for frame in sources):
        raise BadInput(f"--source {source}: one of the runs has no such ops")
    same_source = sources[0]["source"].iloc[0] == sources[1]["source"].iloc[0]
    by = diff_by or ("op" if same_source else "category")
    try:
        compared = analysis.diff_ops(base, test, by=by, source=source)
    except ValueError as error:
        raise BadInput(str(error)) from error
    if _emit(compared, as_json, as_csv):
        return
    console.print(f"base {base_run['run_id']}: {_label(base_run)} ({sources[0]['source'].iloc[0]} ops)")
    console.print(f"test {test_run['run_id']}: {_label(test_run)} ({sources[1]['source'].iloc[0]} ops)")
    for run, rows in ((base_run, base), (test_run, test)):
        for note in _notes(rows, run, source):
            console.print(f"{run['run_id']}: {note}", highlight=False)
    console.print(f"by {by}, per traced step, largest change first:")
    table = Table()
    for header in (by, "change", "base µs/step", "test µs/step", "delta µs/step", "ratio", "base %", "test %"):
        table.add_column(header, justify="left" if header in (by, "change") else "right")
    for row in compared.head(top).to_dict("records"):
        table.add_row(
            str(row[by]),
            row["change"],
            _number(row["base_us_per_step"]),
            _number(row["test_us_per_step"]),
            _number(row["delta_us_per_step"]),
            _number(row["ratio"], 2),
            _number(row["base_pct"]),
            _number(row["test_pct"]),
        )
    console.print(table)
    if len(compared) > top:
        console.print(f"{len(compared) - top} more; --top N shows more")
    counts = compared["change"].value_counts()
    changes = ", ".join(f"{counts[c]} {c}" for c in ("new", "missing", "slower", "faster", "same") if c in counts)
    base_total, test_total = compared["base_us_per_step"].sum(), compared["test_us_per_step"].sum()
    console.print(f"total: base {base_total:,.1f} µs/step, test {test_total:,.1f} µs/step; {changes}")


def _rebuild(results_dir: Path, run_id: str) -> None:
    run = _find_run(results_dir, run_id)
    path = _trace_of(results_dir, run)
    try:
        rows = ingest(path, _value(run, "profile_steps"), devices=int(_value(run, "devices") or 1))
    except TraceError as error:
        raise BadInput(f"run {run['run_id']}: {error}; the store is unchanged") from error
    written = store_compact.replace_run_ops(results_dir, run, rows)
    tool = rows[0]["tool"] if rows else "no ops"
    console.print(f"run {run['run_id']}: {len(rows)} ops rows from {path} ({tool}) -> {written}")


@app.command("trace")
def show_trace(
    run_id: Annotated[str, typer.Argument(help="The run (its id or a unique prefix).")],
    open_viewer: Annotated[
        bool, typer.Option("--open", help="Serve the trace's viewer on 127.0.0.1 and print its URL.")
    ] = False,
    port: Annotated[
        int | None, typer.Option(help=f"Viewer port (XProf {viewer.XPROF_PORT}, Perfetto {viewer.PERFETTO_PORT}).")
    ] = None,
    results: Annotated[str, typer.Option(help="Results directory.")] = str(DEFAULT_RESULTS_DIR),
) -> None:
    """Print a run's trace path and how to open it; --open serves its viewer locally."""
    if port is not None and not 0 < port < 65536:
        raise BadInput(f"--port expects 1-65535, got {port}")
    results_dir = Path(_results_dir(results, local=True))
    run = _find_run(results_dir, run_id)
    path = _trace_of(results_dir, run)
    try:
        files = locate(path)
    except TraceError as error:
        raise BadInput(f"run {run['run_id']}: {error}") from error
    xplane = path.is_dir()
    print(f"trace: {files[0] if not xplane else path}")
    if xplane:
        print(f"open:  tpubench trace {run['run_id']} --open   (XProf, on 127.0.0.1)")
        print(f"  or:  xprof --logdir {path}   (XProf's server; it listens on every interface)")
    else:
        print(f"open:  tpubench trace {run['run_id']} --open   (Perfetto UI, the trace served from 127.0.0.1)")
        print(f"  or:  open {viewer.PERFETTO_UI} and load {files[0]}")
    if not open_viewer:
        return

    def ready(url: str) -> None:
        print(f"viewer: {url}   (Ctrl-C stops it)", flush=True)

    if not xplane and port not in (None, viewer.PERFETTO_PORT):
        print(
            f"warning: Perfetto's UI fetches traces only from {viewer.LOOPBACK}:{viewer.PERFETTO_PORT} (its content "
            f"security policy), so the link below will not load with --port {port}: leave --port out, or open "
            f"{viewer.PERFETTO_UI} and load {files[0]} with 'Open trace file'",
            file=sys.stderr,
            flush=True,
        )
    try:
        if xplane:
            viewer.serve_xprof(path, port or viewer.XPROF_PORT, ready)
        else:
            viewer.serve_chrome_trace(files[0], port or viewer.PERFETTO_PORT, ready)
    except viewer.ViewerError as error:
        raise BadInput(str(error)) from error
