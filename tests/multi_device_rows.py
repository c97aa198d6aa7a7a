"""Stored runs of multi-device configurations, without running them: rows with the
multi-device columns, written by the store's own writer, for the read side's tests (scaling
CLI, dashboard)."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from tpubench import store

_ids = itertools.count()
START = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)


def run_row(**columns: Any) -> dict[str, Any]:
    """One ok gpt2/124m cuda train row on an H100 SXM; ``columns`` override (``devices``,
    ``parallel``, ``median_step_ms``...). Throughput follows the step time and the batch."""
    n = next(_ids)
    row: dict[str, Any] = {
        "run_id": f"run{n:012d}",
        "invocation_id": "inv-scaling",
        "started_at": START + timedelta(minutes=n),
        "workload": "gpt2",
        "size": "124m",
        "backend": "cuda",
        "device": "NVIDIA H100 80GB HBM3",
        "mode": "train",
        "dtype": "bfloat16",
        "seq_len": 1024,
        "gen_len": None,
        "status": "ok",
        "devices": 1,
        "parallel": "none",
        "tp_size": 1,
        "scaling": None,
        "batch_size": 8,
        "median_step_ms": 100.0,
        "flops_per_step": None,
    }
    row.update(columns)
    devices, batch = row["devices"], row["batch_size"]
    if row["status"] == "ok" and "tokens_per_s" not in columns:
        row["tokens_per_s"] = batch * row["seq_len"] / (row["median_step_ms"] / 1e3)
        row.setdefault("tokens_per_s_per_device", row["tokens_per_s"] / devices)
    if row["status"] != "ok":
        row["median_step_ms"] = None
    return row


def write_runs(results: Path, rows: list[dict[str, Any]]) -> Path:
    """``rows`` in ``results`` through the store's writer (one invocation)."""
    writer = store.InvocationWriter(results, "inv-scaling", START)
    for row in rows:
        writer.add(row)
    return results
