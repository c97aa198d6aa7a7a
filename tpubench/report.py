"""Terminal rendering of runs: the summary table and the notes that need a reader's eye."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.table import Table
from rich.text import Text

STATUS_STYLE = {"ok": "green", "skipped": "yellow", "unavailable": "dim"}  # others (mismatch, failed...) red


def _number(value: Any, digits: int = 2) -> str:
    if value is None or value != value:  # None or NaN
        return "-"
    return f"{value:,.{digits}f}"


def _bytes(value: Any) -> str:
    if value is None or value != value:
        return "-"
    return f"{value / 2**20:,.0f} MiB"


def summary_table(rows: Sequence[dict[str, Any]]) -> Table:
    table = Table(title="tpubench results", show_lines=False)
    for header in ("workload", "size", "backend", "mode", "shape", "status"):
        table.add_column(header)
    headers = (
        "median ms",
        "p90 ms",
        "samples/s",
        "tokens/s",
        "TTFT ms",
        "TPOT ms",
        "MFU",
        "first step s",
        "compile s",
        "peak mem",
    )
    for header in headers:
        table.add_column(header, justify="right")
    order = ("workload", "size", "backend", "mode", "batch_size", "seq_len", "gen_len")
    for row in sorted(rows, key=lambda r: tuple(r.get(key) or 0 for key in order)):  # sweeps grouped
        status = row["status"]
        mfu = row.get("mfu")
        shape = f"{row['batch_size']}x{row['seq_len']}" + (f"+{row['gen_len']}" if row.get("gen_len") else "")
        table.add_row(
            row["workload"],
            row["size"],
            row["backend"],
            row["mode"],
            shape,
            Text(
                status + (", verified" if row.get("verified") == "match" else ""),
                style=STATUS_STYLE.get(status, "bold red"),
            ),
            _number(row.get("median_step_ms")),
            _number(row.get("p90_step_ms")),
            _number(row.get("samples_per_s"), 1),
            _number(row.get("tokens_per_s"), 0),
            _number(row.get("ttft_p50_ms")),
            _number(row.get("tpot_p50_ms")),
            "-" if mfu is None else f"{100 * mfu:.1f}%",
            _number(row.get("first_step_s")),
            _number(row.get("compile_s")),
            _bytes(row.get("peak_mem_bytes")),
        )
    return table


def notes(rows: Sequence[dict[str, Any]]) -> list[str]:
    """One line per thing a reader must not miss: failures, recompiles, warnings (deduplicated)."""
    lines: list[str] = []
    for row in rows:
        label = f"{row['workload']}/{row['size']} {row['backend']} {row['mode']}"
        if row["status"] != "ok":
            lines.append(f"[{row['status']}] {label}: {row.get('error') or 'no reason given'}")
        if row.get("fallback_op_count"):
            lines.append(f"[cpu-fallback] {label}: {row['fallback_ops']}")
        if row.get("recompiles_after_warmup"):
            lines.append(f"[recompile] {label}: {row['recompiles_after_warmup']} compilation(s) after warm-up")
    seen = set()
    for row in rows:
        for warning in filter(None, (row.get("warnings") or "").splitlines()):
            if warning not in seen:
                seen.add(warning)
                lines.append(f"[warning] {warning}")
    return lines
