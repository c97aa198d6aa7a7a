"""Stored runs of multi-device configurations, without running them: rows with the columns of
issue 27's contract, written by the store's own writer, for the read side's tests (scaling
CLI, dashboard). ``schema`` adds the contract's columns the store's schema does not have
yet (a no-op once tpubench/schema.py has them all)."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa

from tpubench import schema, store

_string, _int, _float = pa.string(), pa.int64(), pa.float64()
#: issue 27's stored columns (contract-27.md, "Stored columns")
CONTRACT = {
    "runs": [
        ("devices", _int),
        ("chips", _int),
        ("hosts", _int),
        ("parallel", _string),
        ("parallel_impl", _string),
        ("mesh", _string),
        ("comm_backend", _string),
        ("tp_size", _int),
        ("scaling", _string),
        ("global_batch_size", _int),
        ("per_device_batch_size", _int),
        ("tokens_per_s_per_device", _float),
        ("samples_per_s_per_device", _float),
        ("collective_ms", _float),
        ("collective_share", _float),
        ("exposed_collective_ms", _float),
        ("exposed_collective_share", _float),
        ("rank_skew_pct", _float),
        ("peak_mem_bytes_min", _int),
        ("failed_rank", _int),
        ("simulated", pa.bool_()),
    ],
    "steps": [("rank", _int)],
    "ops": [("devices", _int), ("comm_bytes", _float), ("busbw_gbps", _float)],
}


@contextlib.contextmanager
def schema_with_contract() -> Iterator[None]:
    """The store's schemas with every contract column (those already there stay as they are)."""
    saved = dict(schema.TABLES)
    try:
        for table, columns in CONTRACT.items():
            current = schema.TABLES[table]
            for name, kind in columns:
                if name not in current.names:
                    current = current.append(pa.field(name, kind))
            schema.TABLES[table] = current
        yield
    finally:
        schema.TABLES.clear()
        schema.TABLES.update(saved)


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
