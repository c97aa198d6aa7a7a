"""A ceilings worker's sweep: set the backend up, measure each point, return the rows.

Runs inside a worker process (:mod:`tpubench.worker`, request kind ``ceiling``) or, for a
collective of a process family, in each of its rank processes. torch_xla's collectives run
in the one worker, over its group of devices under SPMD (:mod:`.xla_collective`).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from tpubench.backends import get_backend
from tpubench.ceilings import CeilingSpec, collective, device, family, latency, matmul, memory, xla_collective
from tpubench.hostload import busy_warning
from tpubench.hostmeter import HostLoadMeter
from tpubench.warning import TpubenchWarning

MEASURE = {
    "matmul": matmul.measure,
    "memory": memory.measure,
    "collective": collective.measure,
    "latency": latency.measure,
}
#: a kind's measure for a backend family with its own path (the SPMD families' collectives)
FAMILY_MEASURE = {("xla", "collective"): xla_collective.measure}


def measure(spec: CeilingSpec, channel: Any) -> dict[str, Any]:
    """The sweep's result: the device, its facts, and one row per point (``points``)."""
    backend = get_backend(spec.backend)
    backend.setup(spec.run_spec())  # a rank of a collective sweep takes its own GPU here
    availability = backend.availability()
    if not availability.available:
        return {"status": "unavailable", "error": availability.reason}
    facts = device.facts(backend)
    channel.send("phase", phase="measure", step=0, of=1, detail=spec.label())
    notes: list[str] = []
    meter = HostLoadMeter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        measure_points = FAMILY_MEASURE.get((family(spec.backend), spec.kind), MEASURE[spec.kind])
        points = measure_points(spec, facts, notes)
    load = meter.stop()
    notes += [str(w.message) for w in caught if issubclass(w.category, TpubenchWarning)]
    if busy := busy_warning(load):
        notes.append(busy)
    return {
        "status": "ok",
        "device": availability.device_name,
        "device_kind": facts.kind,
        "simulated": spec.devices > 1 and backend.simulated_devices(),
        "llc_bytes": facts.llc_bytes,
        "timing": facts.timing,
        "num_threads": torch.get_num_threads(),
        "host_load_1m": load.load_1m,
        "host_other_cpu_share": load.other_cpu_share,
        "points": points,
        "warnings": "\n".join(dict.fromkeys(notes)) or None,
    }
