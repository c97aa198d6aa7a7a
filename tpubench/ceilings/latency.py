"""Launch-latency floor: the time of a step that does (almost) nothing, timed like a run's step.

``empty_step`` is the backend's step boundary alone (``after_step``: XLA's graph cut;
nothing on an eager backend), between the timer's two device synchronisations: the floor
under any step time a run can report. ``tiny_op`` adds one elementwise op on a one-element
tensor: the cost of launching a kernel (dispatching an op, tracing and running a graph).
"""

from __future__ import annotations

from typing import Any

import torch

from tpubench.ceilings import CeilingSpec
from tpubench.ceilings.device import DeviceFacts
from tpubench.ceilings.timing import failed_point, point_columns, sample


def measure(spec: CeilingSpec, facts: DeviceFacts, notes: list[str]) -> list[dict[str, Any]]:
    """The two latency points: rows with times and no rate."""
    x = torch.zeros(1, device=facts.device)
    rows = []
    for op, run in (("empty_step", lambda: None), ("tiny_op", lambda: x.add_(1))):
        row = {"op": op, "dtype": "float32", "shape": "1"}
        try:
            timed = sample(run, facts.backend, spec.sweep)
        except Exception as error:
            rows.append({**row, **failed_point(error)})
            continue
        rows.append({**row, **point_columns(timed, None, None), "status": "ok"})
    return rows
