"""Terminal rendering of runs: a summary that fits the terminal, and the notes that need a reader's eye.

A row has some forty figures and a terminal is 80 to 200 columns wide, so the summary
shows only the columns that say something for the rows at hand (no TTFT column for a
train-only suite, no MFU column when no device has a peak) and, if the terminal is still
too narrow, leaves out the least important ones and says which: ``--wide`` shows them all,
``--json`` gives every column of every row.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from tpubench.hostload import is_busy
from tpubench.precision import choices as precisions
from tpubench.spec import DIMENSIONS, model_label, parallel_label, shape_label

STATUS_STYLE = {"ok": "green", "skipped": "yellow", "unavailable": "dim"}  # others (mismatch, failed...) red
BUSY_STYLE = "yellow"  # ok, but measured while other processes competed for the CPUs


def _number(value: Any, digits: int = 2) -> str:
    if value is None or value != value:  # None or NaN
        return "-"
    return f"{value:,.{digits}f}"


def _bytes(value: Any) -> str:
    if value is None or value != value:
        return "-"
    return f"{value / 2**20:,.0f} MiB"


def _percent(value: Any) -> str:
    return "-" if value is None or value != value else f"{100 * value:.1f}%"


def _shape(row: dict[str, Any]) -> str:
    return shape_label(row["batch_size"], row, row.get("gen_len"), prefix="")


def _devices(row: dict[str, Any]) -> str:
    """The run's plan, degrees and hosts (``dp4``, ``fsdp2xtp2``, ``dp2 on 2 hosts``), as every
    reader of the store labels them; ``-`` for a one-device run with no plan."""
    return parallel_label(row.get("parallel"), row.get("devices"), row.get("tp_size"), row.get("hosts")) or "-"


def _status(row: dict[str, Any]) -> Text:
    status = row["status"]
    busy = is_busy(row.get("host_other_cpu_share"))
    return Text(
        status
        + (", verified" if row.get("verified") == "match" else "")
        + (", host busy" if busy else "")
        + (", simulated" if row.get("simulated") is True else ""),
        style=BUSY_STYLE if busy and status == "ok" else STATUS_STYLE.get(status, "bold red"),
    )


@dataclass(frozen=True)
class Column:
    header: str
    cell: Callable[[dict[str, Any]], str | Text]
    keep: int  # the narrower the terminal, the lower ``keep`` goes first; from KEPT up, never
    numeric: bool = True
    wraps: bool = False  # folds onto more lines where the terminal is narrow (the others keep one line)


#: in display order; ``keep`` ranks what stays when the terminal is narrow
COLUMNS = (
    Column(
        "workload", lambda r: model_label(r["workload"], r["size"], r.get("model_hash")), 100, numeric=False, wraps=True
    ),
    Column("backend", lambda r: r["backend"], 100, numeric=False),
    Column("mode", lambda r: r["mode"], 100, numeric=False),
    Column("shape", _shape, 100, numeric=False),
    Column("devices", _devices, 100, numeric=False),
    Column("precision", lambda r: precisions.label(r.get("precision"), r.get("dtype")) or "-", 95, numeric=False),
    Column("status", _status, 100, numeric=False),
    Column("median ms", lambda r: _number(r.get("median_step_ms")), 90),
    Column("p90 ms", lambda r: _number(r.get("p90_step_ms")), 20),
    Column("samples/s", lambda r: _number(r.get("samples_per_s"), 1), 30),
    Column("tokens/s", lambda r: _number(r.get("tokens_per_s"), 0), 60),
    Column("tokens/s/dev", lambda r: _number(r.get("tokens_per_s_per_device"), 0) if _devices(r) != "-" else "-", 55),
    Column("TTFT ms", lambda r: _number(r.get("ttft_p50_ms")), 80),
    Column("TPOT ms", lambda r: _number(r.get("tpot_p50_ms")), 80),
    Column("MFU", lambda r: _percent(r.get("mfu")), 70),
    Column("vs bf16", lambda r: _quality(r), 65, numeric=False),
    Column("first step s", lambda r: _number(r.get("first_step_s")), 50),
    Column("compile s", lambda r: _number(r.get("compile_s")), 40),
    Column("peak mem", lambda r: _bytes(r.get("peak_mem_bytes")), 10),
)
ALWAYS = 100  # identity: shown even where every row's cell is empty
#: from this rank up a column is never left out for the width (the median, a run's headline
#: figure, included): the workload column folds instead, however long a user's model's label
KEPT = 90


def _sorted(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    order = ("workload", "size", "backend", "mode", "devices", "batch_size", *DIMENSIONS, "gen_len")
    return sorted(rows, key=lambda r: tuple(r.get(key) or 0 for key in order))  # sweeps grouped


def _table(rows: list[dict[str, Any]], columns: list[Column]) -> Table:
    table = Table(title="tpubench results", box=box.SIMPLE_HEAD, pad_edge=False)
    for column in columns:
        table.add_column(
            column.header,
            justify="right" if column.numeric else "left",
            no_wrap=not column.wraps,
            overflow="fold" if column.wraps else "ellipsis",
        )
    for row in rows:
        table.add_row(*(column.cell(row) for column in columns))
    return table


def summary_table(
    rows: Sequence[dict[str, Any]], width: int | None = None, console: Console | None = None
) -> tuple[Table, list[str]]:
    """The summary of ``rows`` and the headers left out to fit ``width`` columns (None: all).

    Columns empty for every row (``-``) are never shown.
    """
    ordered = _sorted(rows)
    columns = [c for c in COLUMNS if c.keep == ALWAYS or any(c.cell(row) != "-" for row in ordered)]
    hidden: list[str] = []
    if width is not None:
        console = console or Console(width=width, markup=False)
        for column in sorted(columns, key=lambda c: c.keep):
            needed = Measurement.get(console, console.options.update(width=10_000), _table(ordered, columns)).maximum
            if needed <= width or column.keep >= KEPT:
                break
            columns.remove(column)
            hidden.append(column.header)
    return _table(ordered, columns), hidden


def notes(rows: Sequence[dict[str, Any]]) -> list[str]:
    """One line per thing a reader must not miss: failures, recompiles, warnings (deduplicated)."""
    lines: list[str] = []
    for row in rows:
        label = _label(row)
        if row["status"] != "ok":
            lines.append(f"[{row['status']}] {label}: {row.get('error') or 'no reason given'}")
        if row.get("fallback_op_count"):
            lines.append(f"[cpu-fallback] {label}: {row['fallback_ops']}")
        if row.get("recompiles_after_warmup"):
            lines.append(f"[recompile] {label}: {row['recompiles_after_warmup']} compilation(s) after warm-up")
    runs_of: dict[str, list[str]] = {}  # each warning, and the runs that have it
    for row in _sorted(rows):
        for warning in filter(None, (row.get("warnings") or "").splitlines()):
            runs_of.setdefault(warning, []).append(f"{_label(row)} {_shape(row)}")
    for warning, labels in runs_of.items():  # each names its runs, unless every one of several has it
        if len(labels) == 1:
            lines.append(f"[warning] {labels[0]}: {warning}")
        elif len(labels) < len(rows):
            lines.append(f"[warning] {warning} ({'; '.join(labels)})")
        else:
            lines.append(f"[warning] {warning}")
    return lines


def _quality(row: dict[str, Any]) -> str:
    """A converted run's divergence from bf16: the loss's (train) or the logits' relative
    error, flagged where it is past the bounds (docs/precision.md)."""
    if row.get("loss_rel_diff") is not None:
        text = f"loss {100 * row['loss_rel_diff']:+.2f}%"
    elif row.get("logits_rel_error") is not None:
        text = f"logits {100 * row['logits_rel_error']:.2f}%"
    else:
        return "-"
    return text + ("" if row.get("quality_ok") else " off")


def _label(row: dict[str, Any]) -> str:
    label = f"{model_label(row['workload'], row['size'], row.get('model_hash'))} {row['backend']} {row['mode']}"
    if named := precisions.label(row.get("precision"), row.get("dtype")):
        label = f"{label} {named}"
    return label if _devices(row) == "-" else f"{label} {_devices(row)}"
