"""Profiler traces into ``ops`` rows: one reader per kind of trace, one row builder.

- ``chrome``: torch.profiler Chrome traces (``cpu*``, ``cuda*``), streamed (``jsonstream``);
- ``xplane``: XProf xplanes (``xla*``, ``tpu*``): XProf's converter where there is a
  device plane, the raw XLA op events (PJRT CPU) otherwise.

:func:`ingest` reads the trace a run recorded (``runs.trace_path``) and returns its rows
of the ``ops`` table (without run_id, which the caller adds); it runs inside the worker at
the end of a profiled run, and again for ``tpubench ops --ingest``. Nothing here imports
torch, so the xla worker's interpreter runs it as well as the main one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tpubench.analysis.categories import categorize
from tpubench.traces.counts import count_shapes, shapes_json
from tpubench.traces.files import XPLANE_SUFFIX, locate
from tpubench.traces.timeline import OpTotals, TraceError, TraceOps

__all__ = ["TraceError", "ingest", "locate", "read_trace"]


def read_trace(path: Path) -> TraceOps:
    """Per-op totals of one trace file, by its kind."""
    if path.name.endswith(XPLANE_SUFFIX):
        from tpubench.traces.xplane import read_xplane

        return read_xplane(path)
    if path.name.endswith((".json", ".json.gz")):
        from tpubench.traces.chrome import read_chrome

        return read_chrome(path)
    raise TraceError(f"unknown trace kind {path.name!r}: expected a Chrome trace (.json) or an xplane (.xplane.pb)")


def _merged(found: list[TraceOps]) -> TraceOps:
    """Several hosts' xplanes of one session as one: ops with the same identity add up."""
    if len(found) == 1:
        return found[0]
    totals: dict[tuple, OpTotals] = {}
    for trace in found:
        for op in trace.ops:
            key = (op.source, op.op, op.framework_op, op.module)
            if key not in totals:
                totals[key] = op
                continue
            known = totals[key]
            known.calls += op.calls
            known.self_us += op.self_us
            known.total_us += op.total_us
            for name in ("device_us", "flops", "bytes_accessed"):
                if getattr(op, name) is not None:
                    setattr(known, name, (getattr(known, name) or 0.0) + getattr(op, name))
    steps = max((trace.steps for trace in found if trace.steps), default=None)
    step_time = max((trace.step_time_us for trace in found if trace.step_time_us), default=None)
    devices = None if any(trace.devices is None for trace in found) else sum(trace.devices for trace in found)
    return TraceOps(found[0].tool, list(totals.values()), steps, step_time, devices)


def ops_rows(found: TraceOps, traced_steps: int | None = None, devices: int = 1) -> list[dict[str, Any]]:
    """``found``'s ops as rows of the ``ops`` table (schema.OPS), run_id left to the caller.

    ``traced_steps`` is how many steps the run traced; step markers in the trace, where
    there are some, count instead. ``self_pct`` is of the traced steps' wall time, so ops
    that run in parallel (threads, streams) can add up to more than 100.

    ``devices`` is the run's device count. The figures are per device: a trace that holds
    several devices' ops (an SPMD process's: every device runs every op) has its calls and
    times divided by how many it holds, the count its device planes show, else ``devices``
    (PJRT CPU's virtual devices have no plane of their own). A rank's Chrome trace holds
    its own device and stays as it is.
    """
    steps = found.steps or traced_steps
    step_time = found.step_time_us
    held = max(found.devices or devices or 1, 1)

    def per_device(value: float | None) -> float | None:
        return value / held if value is not None else None

    rows = []
    for op in found.ops:
        seconds = op.self_us * 1e-6
        self_us = op.self_us / held
        rows.append(
            {
                "source": op.source,
                "op": op.op,
                "category": categorize(op.source, op.op, op.category_hint, op.framework_op),
                "framework_op": op.framework_op,
                "module": op.module,
                "calls": max(round(op.calls / held), 1) if op.calls else op.calls,
                "self_time_us": self_us,
                "total_time_us": op.total_us / held,
                "self_pct": 100.0 * self_us / step_time if step_time else None,
                "self_us_per_step": self_us / steps if steps else None,
                "device_time_us": per_device(op.device_us),
                "flops": per_device(op.flops),
                "bytes_accessed": per_device(op.bytes_accessed),
                "achieved_flops_per_s": op.flops / seconds if op.flops is not None and seconds > 0 else None,
                "bound_by": op.bound_by,
                "flops_source": op.flops_source,
                "bytes_source": op.bytes_source,
                "shapes": shapes_json(op.shapes, held),
                "traced_steps": steps,
                "step_time_us": step_time,
                "tool": found.tool,
                "devices": devices,
            }
        )
    return rows


def ingest(trace_path: str | Path, traced_steps: int | None = None, devices: int = 1) -> list[dict[str, Any]]:
    """The ``ops`` rows of the trace at ``trace_path`` (a file, or an XProf logdir), per
        device of a run on ``devices`` devices (:func:`ops_rows`). Collective rows of a Chrome
        trace carry ``comm_bytes`` and ``busbw_gbps`` where the trace gives the sizes
        (:class:`tpubench.traces.collectives.CommEvents`). Rows recorded with shapes (a Chrome
    trace of ``record_shapes``) get FLOPs and bytes from them (:mod:`tpubench.traces.counts`).

        Raises TraceError for a missing, truncated or corrupt trace: all rows or none.
    """
    found = _merged([read_trace(path) for path in locate(Path(trace_path))])
    count_shapes(found.ops)  # a Chrome trace's recorded shapes: FLOPs and bytes (torch only for shapes not kept)
    rows = ops_rows(found, traced_steps, devices)
    for row in rows:
        if (size := (found.comm_sizes or {}).get((row["source"], row["op"]))) is not None:
            row |= size.columns()
    return rows
