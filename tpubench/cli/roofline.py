"""``tpubench roofline``: each op of a profiled run against its roofline, or two runs op by op.

Thin: the rows come from :func:`tpubench.store.load_ops`, the figures from
:mod:`tpubench.analysis.roofline`; this module checks input, picks the ceilings and prints.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import pandas as pd
import typer
from rich.table import Table

from tpubench import store
from tpubench.analysis import ceilings as ceilings_analysis
from tpubench.analysis import roofline as analysis
from tpubench.cli.common import BadInput, app, console
from tpubench.cli.ops import _capture_hint, _device_kind, _emit, _find_run, _label, _results_dir, _run_ops, _value
from tpubench.results_dir import DEFAULT_RESULTS_DIR


def _measured(path: str | None, results_dir: Path | str) -> pd.DataFrame | None:
    """The measured ceilings: from a file (CSV or parquet, the shape ``ceilings_for``
    documents) when one is given, else the store's own ceilings table (``tpubench
    ceilings``), which the data sheet stands in for where it has no device."""
    if path is None:
        return ceilings_analysis.roofline_frame(store.load_ceilings(results_dir))
    file = Path(path)
    if not file.is_file():
        raise BadInput(f"--ceilings {path}: no such file; give a CSV or parquet file of measured ceilings")
    try:
        frame = pd.read_parquet(file) if file.suffix == ".parquet" else pd.read_csv(file)
    except Exception as error:  # pandas raises many types for a file it cannot parse
        raise BadInput(f"--ceilings {path}: cannot read it ({type(error).__name__}: {error})") from error
    if problem := analysis.measured_problem(frame):
        raise BadInput(f"--ceilings {path} {problem}")
    # each row's own rate is checked; the other kind's column may hold anything, and is no rate
    return frame.assign(**{c: pd.to_numeric(frame[c], errors="coerce") for c in analysis.MEASURED_RATES.values()})


def _run_table(
    results_dir: Path | str, run_id: str, measured: pd.DataFrame | None, by: str
) -> tuple[dict[str, Any], analysis.RooflineCeilings, pd.DataFrame, pd.DataFrame]:
    """One run's roofline table with its ceilings and its step's shares
    (:func:`tpubench.analysis.roofline.step_shares`); BadInput when its ops have no figures."""
    run = _find_run(results_dir, run_id)
    rows = _run_ops(results_dir, run)
    sources = rows.get("flops_source", pd.Series(dtype=object)).notna() | rows["flops"].notna()
    if not sources.any():
        raise BadInput(
            f"run {run['run_id']} has no FLOPs or bytes per op: its trace has no recorded shapes, or its ops rows "
            f"predate them; rebuild them with `tpubench ops --ingest {run['run_id']}`, and if the trace has no "
            f"shapes, record one with `{_capture_hint(run)}` (it records shapes)"
        )
    # against the peak of what its matmuls ran in: fp8 for a float8 run, TF32 where it was on
    matmuls = ceilings_analysis.matmul_dtype(run["dtype"], _value(run, "backend_metrics"), _value(run, "precision"))
    ceilings = analysis.ceilings_for(str(_value(run, "device") or ""), _device_kind(run), matmuls, measured)
    return run, ceilings, analysis.roofline(rows, ceilings, by=by), analysis.step_shares(rows, ceilings)


def _shares(shares: pd.DataFrame) -> str:
    """The step's lines as one sentence: "compute 45.7% (14 ops), ..., outside any op 0.9%"."""
    return ", ".join(
        f"{line} {_pct(share)}" + (f" ({ops} ops)" if ops else "")
        for line, share, ops in zip(shares["line"], shares["time_share"], shares["ops"], strict=True)
    )


def _si(value: Any, unit: str) -> str:
    if value is None or pd.isna(value):
        return "-"
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:,.3g} {prefix}{unit}"
    return f"{value:,.3g} {unit}"


def _pct(value: Any) -> str:
    return "-" if value is None or pd.isna(value) else f"{100 * value:.1f}%"


def _names(value: Any) -> str:
    """A key's op names, the first three and how many more."""
    if not isinstance(value, str):
        return "-"
    names = value.split(", ")
    return ", ".join(names[:3]) + (f" (+{len(names) - 3})" if len(names) > 3 else "")


def _text(value: Any, missing: str = "-") -> str:
    return value if isinstance(value, str) else missing


def _number(value: Any, digits: int = 1) -> str:
    return "-" if value is None or pd.isna(value) else f"{value:,.{digits}f}"


@app.command("roofline")
def show_roofline(
    run_ids: Annotated[list[str], typer.Argument(metavar="RUN_ID [RUN_B]", help="One run, or two to pair op by op.")],
    by: Annotated[str, typer.Option(help="op: one point per op; shape: per op and recorded input shapes.")] = "op",
    top: Annotated[int, typer.Option(help="Rows to show (largest time first).")] = 20,
    ceilings: Annotated[
        str | None,
        typer.Option(help="Measured ceilings, CSV or parquet: kind, device, dtype, flops_per_s, bytes_per_s."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="The table (and summary) as JSON.")] = False,
    results: Annotated[str, typer.Option(help="Results directory.")] = str(DEFAULT_RESULTS_DIR),
) -> None:
    """Each op of a profiled run against the roofline: FLOPs, bytes, intensity, the fraction
    of its ceiling it reached, what bounds it, and what reaching it would save."""
    if len(run_ids) > 2:
        raise BadInput(f"give one run, or two to compare; got {len(run_ids)}: {' '.join(run_ids)}")
    if by not in ("op", "shape"):
        raise BadInput(f"unknown --by {by!r}; valid: op, shape")
    if top < 1:
        raise BadInput(f"--top expects a positive number, got {top}")
    results_dir = _results_dir(results)
    measured = _measured(ceilings, results_dir)
    if len(run_ids) == 2:
        _pair(results_dir, run_ids, measured, top, as_json)
        return
    run, found, table, shares = _run_table(results_dir, run_ids[0], measured, by)
    fix, counted = analysis.fix_first(table), analysis.counted_flops(table)
    if as_json:
        _emit_json(run, found, table, shares, fix, counted)
        return
    console.print(f"run {run['run_id']}: {_label(run)} on {_value(run, 'device') or '?'}")
    source = table["source"].iloc[0] if len(table) else "no"
    console.print(f"{source} ops against {found.describe()}", highlight=False)
    if found.source != "measured" and measured is not None and "sweep" in measured:
        unset = measured[(measured["device"] == _value(run, "device")) & measured["bytes_per_s"].isna()]
        for sweep in unset["sweep"].dropna().unique():  # a memory sweep that measured a cache
            console.print(f"note: no measured memory roof: {sweep}", highlight=False)
    if found.ridge is None:
        console.print(
            "note: without ceilings no op is placed against a roof (bound, ceiling and savings stay empty); "
            "`tpubench ceilings` measures them into the store (or --ceilings FILE gives them)",
        )
    _print_table(table.head(top))
    if warning := analysis.above_ceiling(table):
        console.print(f"note: {warning}", highlight=False)
    if len(table) > top:
        console.print(f"{len(table) - top} more ops; --top N shows more")
    console.print(f"the traced step by bound (per op and shape; the lines add up to the step): {_shares(shares)}")
    flops = ", ".join(
        f"{s} {_si(f, 'FLOP')}"
        for s, f in zip(counted["flops_source"], counted["flops_per_step"], strict=True)
        if pd.notna(f)
    )
    per_step = _value(run, "flops_per_step")
    console.print(
        f"FLOPs per step by source: {flops}"
        + (f"; the run's flops_per_step (matmuls and attention): {_si(per_step, 'FLOP')}" if per_step else "")
    )
    if len(fix) and found.ridge is not None:
        console.print("what to fix first (time saved per step if the op reached its ceiling):")
        for row in fix.head(5).to_dict("records"):
            console.print(
                f"  {row['rank']}. {row['op']}{' ' + row['shape'] if row['shape'] else ''} [{row['bound']}]: "
                f"{_number(row['saving_us_per_step'])} µs/step ({_pct(row['saving_share'])} of the step), "
                f"at {_pct(row['ceiling_fraction'])} of its ceiling",
                highlight=False,
            )


def _emit_json(
    run: dict[str, Any],
    found: analysis.RooflineCeilings,
    table: pd.DataFrame,
    shares: pd.DataFrame,
    fix: pd.DataFrame,
    counted: pd.DataFrame,
) -> None:
    import json

    def records(frame: pd.DataFrame) -> list[dict[str, Any]]:
        return json.loads(frame.to_json(orient="records"))

    print(
        json.dumps(
            {
                "run_id": run["run_id"],
                "ceilings": {
                    "peak_flops": found.peak_flops,
                    "bandwidth_bytes_per_s": found.bandwidth_bytes_per_s,
                    "source": found.source,
                    "ridge": found.ridge,
                    "sweeps": found.sweeps,
                },
                "ops": records(table),
                "by_bound": records(shares.rename(columns={"line": "bound"})),
                "fix_first": records(fix),
                "flops_by_source": records(counted),
                "above_ceiling": analysis.above_ceiling(table),
            },
            indent=2,
        )
    )


def _print_table(table: pd.DataFrame) -> None:
    out = Table()
    headers = ["op", "% step", "µs/step", "FLOP/step", "bytes/step", "FLOP/B", "FLOP/s", "B/s", "ceiling", "of ceil"]
    for header in [*headers, "bound", "flops from"]:
        out.add_column(header, justify="left" if header in ("op", "bound", "flops from") else "right")
    for row in table.assign(line=analysis.line_of(table)).to_dict("records"):
        name = row["op"] + (f" {row['shape']}" if row.get("shape") else "")
        out.add_row(
            name,
            _pct(row["time_share"]),
            _number(row["time_us_per_step"]),
            _si(row["flops_per_step"], ""),
            _si(row["bytes_per_step"], ""),
            _number(row["intensity"], 2),
            _si(row["achieved_flops_per_s"], ""),
            _si(row["achieved_bytes_per_s"], ""),
            _si(row["ceiling_flops_per_s"], ""),
            # above its ceiling: the ceiling was measured low (or the trace times the op short), no figure
            "above" if row["ceiling_fraction"] > analysis.ABOVE_CEILING else _pct(row["ceiling_fraction"]),
            row["line"],
            _text(row["flops_source"], "-"),
        )
    console.print(out)


def _pair(results_dir: Path | str, run_ids: list[str], measured: pd.DataFrame | None, top: int, as_json: bool) -> None:
    (run_a, found_a, table_a, _), (run_b, found_b, table_b, _) = (
        _run_table(results_dir, run_id, measured, "shape") for run_id in run_ids
    )
    paired = analysis.pair(table_a, table_b)
    if _emit(paired, as_json, False):
        return
    for name, run, found in (("A", run_a, found_a), ("B", run_b, found_b)):
        console.print(f"{name} {run['run_id']}: {_label(run)}; {found.describe()}", highlight=False)
    console.print(f"matched by {analysis.MATCHING}", highlight=False)
    for name, table in (("A", table_a), ("B", table_b)):
        if warning := analysis.above_ceiling(table):
            console.print(f"note: {name}: {warning}", highlight=False)
    out = Table()
    for header in ("key", "A op", "B op", "A µs/step", "B µs/step", "B/A", "A of ceil", "B of ceil", "A", "B"):
        out.add_column(header, justify="left" if header in ("key", "A op", "B op", "A", "B") else "right")
    for row in paired.head(top).to_dict("records"):
        out.add_row(
            row["key"][:60],
            _names(row["a_op"]),
            _names(row["b_op"]),
            _number(row["a_time_us_per_step"]),
            _number(row["b_time_us_per_step"]),
            _number(row["ratio"], 2),
            _pct(row["a_ceiling_fraction"]),
            _pct(row["b_ceiling_fraction"]),
            _text(row["a_bound"]),
            _text(row["b_bound"]),
        )
    console.print(out)
    both = paired[paired["a_op"].notna() & paired["b_op"].notna()]
    console.print(
        f"{len(both)} matched, {int(paired['a_op'].isna().sum())} only in B, {int(paired['b_op'].isna().sum())} "
        f"only in A; matched time per step: A {_number(both['a_time_us_per_step'].sum())} µs, "
        f"B {_number(both['b_time_us_per_step'].sum())} µs"
    )
