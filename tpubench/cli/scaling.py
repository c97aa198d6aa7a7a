"""``tpubench scaling``: how each multi-device configuration scales over N, and backends at equal N.

Thin: runs come from :mod:`tpubench.store`, the selection from
:mod:`tpubench.analysis.select`, the tables from :mod:`tpubench.analysis.scaling`, prices
from :mod:`tpubench.analysis.prices`; this module checks input, picks and prints.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import pandas as pd
import typer
from rich.table import Table

from tpubench.analysis import scaling
from tpubench.analysis.nulls import is_missing
from tpubench.analysis.select import SelectorError, select_runs
from tpubench.cli.common import BadInput, app, console
from tpubench.cli.compare import SELECTOR_HELP, _records, load_all_runs, prices_from
from tpubench.results_dir import DEFAULT_RESULTS_DIR


def _number(value: Any, digits: int = 1, scale: float = 1.0, suffix: str = "") -> str:
    if is_missing(value):
        return "-"
    return f"{value * scale:,.{digits}f}{suffix}"


def _share(row: dict[str, Any]) -> str:
    """Collective share of the step, its exposed part in brackets: ``41% (12%)``."""
    total, exposed = row["collective_share"], row["exposed_collective_share"]
    if total is None or total != total:
        return "-"
    return f"{100 * total:.0f}%" + (f" ({100 * exposed:.0f}%)" if exposed is not None and exposed == exposed else "")


def _memory(row: dict[str, Any]) -> str:
    """Peak memory per device in GiB: the largest, and the smallest where devices differ."""
    high, low = row["peak_mem_bytes"], row["peak_mem_bytes_min"]
    if high is None or high != high:
        return "-"
    text = f"{high / 2**30:,.2f}"
    return text + (f" / {low / 2**30:,.2f}" if low is not None and low == low and low != high else "")


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")


def _devices(row: dict[str, Any]) -> str:
    """N, over hosts as hosts x devices per host (``2 (2 hosts x 1)``), ``*`` where simulated."""
    per_host = int(row["devices_per_host"])
    hosts = int(row["devices"]) // per_host
    spread = f" ({hosts} hosts x {per_host})" if hosts > 1 else ""
    return f"{row['devices']}{spread}" + (" *" if row["simulated"] else "")


def _baseline(first: pd.Series) -> str:
    """The baseline a configuration's efficiency divides by, with its plan and hosts:
    ``baseline: 1 device, dp, 1 host, run ...`` (another plan's run never serves)."""
    if pd.isna(first["baseline_devices"]):
        return "baseline: none ran"
    devices, hosts = _plural(int(first["baseline_devices"]), "device"), _plural(int(first["baseline_hosts"]), "host")
    return f"baseline: {devices}, {first['baseline_parallel']}, {hosts}, run {first['baseline_run_id']}"


def _config_table(config: str, rows: pd.DataFrame) -> Table:
    baseline = _baseline(rows.iloc[0])
    table = Table(title=f"{config}\n{baseline}", title_justify="left")
    column = scaling.throughput_column(rows)
    throughput = column.removesuffix("_per_s_per_device") + "/s/device"
    for header in (
        "N",
        "status",
        "step ms",
        throughput,
        "MFU",
        "efficiency",
        "collectives (exposed)",
        "peak GiB/device (max / min)",
        "rank skew",
        "run",
    ):
        table.add_column(header, justify="left" if header in ("status", "run") else "right")
    for row in rows.astype(object).where(rows.notna(), None).to_dict("records"):
        table.add_row(
            _devices(row),
            row["status"],
            _number(row["step_ms"], 2),
            _number(row[column], 1),
            _number(row["mfu"], 1, 100, "%"),
            _number(row["efficiency"], 1, 100, "%"),
            _share(row),
            _memory(row),
            _number(row["rank_skew_pct"], 1, 1, "%"),
            str(row["run_id"] or "-"),
        )
    return table


def _cross_table(cross: pd.DataFrame) -> Table:
    table = Table(title="backends at equal N (cost: price per device-hour / tokens per device-hour)")
    measured = "joules_per_token" in cross and cross["joules_per_token"].notna().any()  # its column only then
    headers = ("configuration", "N", "backend", "device", "step ms", "tokens/s/device", "MFU", "$/Mtoken")
    for header in (*headers, *(["mJ/token"] if measured else [])):
        table.add_column(header, justify="left" if header in ("configuration", "backend", "device") else "right")
    for row in cross.astype(object).where(cross.notna(), None).to_dict("records"):
        table.add_row(
            row["configuration"],
            str(row["devices"]) + (" *" if row["simulated"] else ""),
            row["backend"],
            str(row["device"] or "-"),
            _number(row["step_ms"], 2),
            _number(row["tokens_per_s_per_device"], 1),
            _number(row["mfu"], 1, 100, "%"),
            _number(row["usd_per_million_tokens"], 3),
            *([_number(row.get("joules_per_token"), 3, 1e3)] if measured else []),
        )
    return table


@app.command("scaling")
def show_scaling(
    results: Annotated[str, typer.Option(help="Results directory.")] = str(DEFAULT_RESULTS_DIR),
    select_runs_: Annotated[str | None, typer.Option("--select", help=f"Only these runs. {SELECTOR_HELP}")] = None,
    prices: Annotated[Path | None, typer.Option(help="TOML of chip -> USD per hour, over the built-in table.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Both views as JSON on stdout.")] = False,
) -> None:
    """Each multi-device configuration over N (step, throughput and MFU per device, scaling
    efficiency against its baseline, collectives, memory, rank skew), then backends at equal N."""
    price_table = prices_from(prices)
    runs = load_all_runs(results)
    if select_runs_:
        try:
            runs = select_runs(runs, select_runs_)
        except SelectorError as error:
            raise BadInput(f"--select {select_runs_!r} in {results}: {error}") from error
    report = scaling.scaling_report(runs)
    cross = scaling.cross_backend(report, runs, price_table)
    if as_json:
        print(json.dumps({"configurations": _records(report), "cross_backend": _records(cross)}, indent=1))
        return
    if report.empty:
        console.print(f"no multi-device runs in {results}; a sweep over N that fills this view:", highlight=False)
        console.print(f"  {scaling.SWEEP_HINT}", highlight=False)
        return
    for config, rows in report.groupby("configuration", sort=False):
        console.print(_config_table(str(config), rows))
    if not cross.empty:
        console.print(_cross_table(cross))
    console.print(
        f"{scaling.efficiency_note(report)}. "
        "collectives: share of the step in collectives per device (exposed: not overlapped by compute)",
        highlight=False,
    )
    if report["simulated"].fillna(False).astype(bool).any():
        console.print(f"* {scaling.SIMULATED_NOTE}", highlight=False)
