"""Measures how busy the host was while a run was measured: :class:`HostLoadMeter` around the
measured steps gives the share of the host's CPU time that processes other than this worker
(and its children) used, from ``/proc/stat``-style system counters and the worker's own CPU
times. :mod:`tpubench.hostload` holds what that share means (the busy rule and the warning).
"""

from __future__ import annotations

import contextlib
import os
import time

import psutil

from tpubench.hostload import HostLoad


def _busy_seconds() -> float:
    times = psutil.cpu_times()
    return sum(times) - times.idle - getattr(times, "iowait", 0.0) - getattr(times, "guest", 0.0)


def _own_seconds() -> float:
    """CPU time of this run: the worker and its children; in a rank of a multi-device run,
    every process of the run's process group, since its peer ranks are the run, not
    competition (``TPUBENCH_RANK``: tpubench.launch.ranks)."""
    processes = [psutil.Process()]
    if "TPUBENCH_RANK" in os.environ:
        group = os.getpgid(0)
        processes = [process for process in psutil.process_iter() if _group_of(process) == group]
    total = 0.0
    for process in processes:
        with contextlib.suppress(psutil.Error):
            times = process.cpu_times()
            total += times.user + times.system + times.children_user + times.children_system
    return total


def _group_of(process: psutil.Process) -> int | None:
    try:
        return os.getpgid(process.pid)
    except OSError:
        return None


class HostLoadMeter:
    """Start before the measured steps, :meth:`stop` after them."""

    def __init__(self) -> None:
        self._load = os.getloadavg()[0]
        self._wall = time.perf_counter()
        self._busy = _busy_seconds()
        self._own = _own_seconds()

    def stop(self) -> HostLoad:
        wall = time.perf_counter() - self._wall
        others = (_busy_seconds() - self._busy) - (_own_seconds() - self._own)
        capacity = max(wall, 1e-9) * (psutil.cpu_count() or 1)
        return HostLoad(load_1m=self._load, other_cpu_share=min(max(others / capacity, 0.0), 1.0))
