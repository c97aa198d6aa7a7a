"""Synthetic ``compiles`` tables, written through the store as a capture would write them.

They follow the table's contract (docs/schema.md) and the events the research note measured
on torch 2.13 and torch_xla 2.9 (a shape change at batches 8, 8, 12, 8, 16; a ``.item()`` in
a compiled step up to the recompile limit), so the reading side is tested on the rows the
capture gives without paying for a compile.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tpubench import store

SHAPE_LINE = "workloads/x.py:88"
ITEM_LINE = "workloads/x.py:131"
MISMATCH = "tensor 'x' size mismatch at index 0. expected 8, actual 12"


def run_row(run_id: str, invocation: str, backend: str = "cpu-compile", **extra: Any) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "invocation_id": invocation,
        "started_at": datetime(2026, 12, 2, 12, 0, tzinfo=UTC),
        "workload": "recompile-shape",
        "size": "tiny",
        "backend": backend,
        "device": "CPU",
        "mode": "train",
        "dtype": "float32",
        "batch_size": 8,
        "status": "ok",
        "warmup_steps": 2,
        "measured_steps": 3,
        "median_step_ms": 5.0,
        **extra,
    }


def event(run_id: str, invocation: str, step: int | None, phase: str, kind: str = "compile", **extra: Any) -> dict:
    return {"run_id": run_id, "invocation_id": invocation, "step": step, "phase": phase, "event": kind, **extra}


def shape_change_events(run_id: str, invocation: str) -> list[dict[str, Any]]:
    """cpu-compile, batches 8, 8, 12, 8, 16: forward compiles at steps 0, 2 and 4 (first, shape
    change, shape change) each with its lazy backward; a GB0124 graph break at step 0."""
    rows = []
    for step, cause, seconds in ((0, "first_compile", 30.0), (2, "shape_change", 1.9), (4, "shape_change", 1.9)):
        phase = "warmup" if step < 2 else "measured"
        raw = MISMATCH if cause == "shape_change" else None
        common = {"source": SHAPE_LINE, "compile_id": f"0/{step // 2}", "cause_inferred": False}
        rows.append(event(run_id, invocation, step, phase, layer="dynamo", cause=cause, raw=raw, compile_s=seconds,
                          cache="miss", **common))  # fmt: skip
        rows.append(event(run_id, invocation, step, phase, layer="aot_backward", cause="lazy_backward",
                          compile_s=seconds / 4, cache="miss", **common))  # fmt: skip
    rows.append(
        event(run_id, invocation, 0, "warmup", "graph_break", layer="dynamo", graph_break_id="GB0124",
              source=ITEM_LINE, raw="Unsupported Tensor.item() call with capture_scalar_outputs=False", count=1)
    )  # fmt: skip
    return [{"seq": seq, **row} for seq, row in enumerate(rows)]


def limit_events(run_id: str, invocation: str) -> list[dict[str, Any]]:
    """A ``.item()`` resume frame recompiled on its value until the limit (8), then eager."""
    rows = [event(run_id, invocation, 0, "warmup", layer="dynamo", cause="first_compile", compile_s=1.0)]
    for step in range(1, 8):
        rows.append(
            event(run_id, invocation, step, "warmup" if step < 2 else "measured", layer="dynamo", cause="value_change",
                  raw="___stack0 == 2.4869", source=ITEM_LINE, compile_s=0.2)
        )  # fmt: skip
    rows.append(
        event(run_id, invocation, 8, "measured", "recompile_limit", layer="dynamo", source=ITEM_LINE,
              raw="torch._dynamo hit config.recompile_limit (8)")
    )  # fmt: skip
    return rows


def xla_events(run_id: str, invocation: str, hashes: list[str]) -> list[dict[str, Any]]:
    """xla: one graph per hash (step i compiles ``hashes[i]``), a step-sync cause inferred as a
    shape change after the first; an in-memory cache hit at step 4 (a graph found, not
    compiled); a host read per step and an ``aten::histc`` fallback."""
    rows = []
    for step, graph in enumerate(hashes):
        cause = "first_compile" if step == 0 else "shape_change"
        rows.append(
            event(run_id, invocation, step, "warmup" if step < 2 else "measured", layer="xla", cause=cause,
                  cause_inferred=step > 0, raw="user torch_xla.sync", graph_id=graph, source="workloads/x.py:6",
                  compile_s=0.5, cache="miss")
        )  # fmt: skip
    rows.append(event(run_id, invocation, 4, "measured", layer="xla", cache="memory_hit", raw="CachedCompile", count=1))
    for step in range(2, 5):
        rows.append(event(run_id, invocation, step, "measured", "host_read", layer="xla", source=ITEM_LINE, count=1))
        rows.append(event(run_id, invocation, step, "measured", "fallback", layer="xla", op="aten::histc", count=1))
    return rows


def step_rows(run_id: str, invocation: str, compile_s: dict[int, float]) -> list[dict[str, Any]]:
    """Steps 0-4 of a run (first, warm-up, 3 measured) whose times grow with what they compiled."""
    phases = ["first", "warmup", "measure", "measure", "measure"]
    return [
        {"run_id": run_id, "invocation_id": invocation, "step": step, "phase": phase,
         "step_ms": 5.0 + 1000 * compile_s.get(step, 0.0), "compile_s": compile_s.get(step)}
        for step, phase in enumerate(phases)
    ]  # fmt: skip


def write(
    results: Path,
    invocation: str,
    runs: list[dict[str, Any]],
    events: list[dict[str, Any]],
    steps: list[dict[str, Any]] = (),
) -> None:
    """``runs``, ``events`` and ``steps`` as one invocation's files of the store (atomic, as a suite writes them)."""
    location = store.Location(results)
    partition = store.partition(datetime(2026, 12, 2, tzinfo=UTC))
    for table, rows in (("runs", runs), ("compiles", events), ("steps", list(steps))):
        location.write_table(store.to_table(rows, table), location.join(table, partition, f"{invocation}.parquet"))
