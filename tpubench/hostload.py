"""How busy the host was while a run was measured, so contention never passes as a result.

Two benchmarks on one machine slow each other down (two CPU suites at once measured
gpt2 infer 60 times slower), and nothing in the step times says so. The runner serialises
runs per device (:mod:`tpubench.devicelock`), but other programs still compete;
:mod:`tpubench.hostmeter` measures them (the share of the host's CPU time that processes
other than this worker and its children used during the measured steps). This module is
the rule that reads it: when a run counts as measured on a busy host, and the warning its
row gets. Readers (comparisons, reports, the dashboard) import this and not the meter, so
they do not load psutil.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: above this share of all CPUs used by other processes, a run's row gets a warning
BUSY_SHARE = 0.2
#: how the row's host-busy warning begins
BUSY = "host busy: "


@dataclass(frozen=True)
class HostLoad:
    load_1m: float  # the 1-minute load average when measuring began
    other_cpu_share: float  # other processes' CPU time / (wall time x CPUs), 0..1


def is_busy(other_cpu_share: float | None) -> bool:
    """Whether a run's ``host_other_cpu_share`` marks it as measured on a busy host (null: not
    measured, not busy): the one test the summary, reports, dashboard and comparisons share."""
    return other_cpu_share is not None and other_cpu_share == other_cpu_share and other_cpu_share > BUSY_SHARE


def busy_warning(load: HostLoad) -> str | None:
    """The row's warning when other processes competed for the CPUs while measuring."""
    if not is_busy(load.other_cpu_share):
        return None
    return (
        f"{BUSY}other processes used {100 * load.other_cpu_share:.0f}% of the CPUs while this run was "
        f"measured (load average {load.load_1m:.1f}); its step times may be inflated"
    )


def job_load(ranks: Sequence[Mapping[str, Any]]) -> HostLoad | None:
    """A multi-rank job's host load, from its ranks' results: the most contended rank's. Each
    rank measures its own window, and every rank waits for the slowest at each collective,
    so the job was as contended as its most contended rank. None when no rank measured it."""
    loads = [
        HostLoad(rank["host_load_1m"], rank["host_other_cpu_share"])
        for rank in ranks
        if rank.get("host_load_1m") is not None and rank.get("host_other_cpu_share") is not None
    ]
    return max(loads, key=lambda load: load.other_cpu_share, default=None)


def job_columns(ranks: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The job's row columns of host load and its warnings: the ranks' warnings, each once,
    with their host-busy warnings (one per rank, each of its own window) replaced by the
    job's one, which says what ``host_other_cpu_share`` stores (:func:`job_load`)."""
    load = job_load(ranks)
    notes = dict.fromkeys(
        line for rank in ranks for line in (rank.get("warnings") or "").splitlines() if not line.startswith(BUSY)
    )
    if load is not None and (busy := busy_warning(load)):
        notes[busy] = None
    return {
        "host_load_1m": load.load_1m if load else None,
        "host_other_cpu_share": load.other_cpu_share if load else None,
        "warnings": "\n".join(notes) or None,
    }
