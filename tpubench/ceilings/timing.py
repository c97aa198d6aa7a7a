"""How a ceiling's point is timed: the run protocol's rules, for one operation.

Each sample is bracketed by the backend's timer (:class:`tpubench.backends.StepTimer`: the
device drained before the start and after the stop; CUDA events on a GPU), with the
backend's ``after_step`` inside (XLA's graph cut and launch), as :mod:`tpubench.measure`
times a step. What must not count (the last-level cache flush, a collective's barrier)
runs before the timer starts. The first call (compilation, autotuning, allocation) and
the warm-up calls are timed and kept apart from the measured samples.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from tpubench.backends import Backend
from tpubench.ceilings import MIN_SAMPLES, Sweep


@dataclass
class Samples:
    """A point's times, in seconds per operation (a sample of ``reps`` operations divided by ``reps``)."""

    first_s: float
    warmup_s: list[float]
    samples_s: list[float]
    reps: int


def sample(
    run: Callable[[], Any],
    backend: Backend,
    sweep: Sweep,
    *,
    reps: int = 1,
    before: Callable[[], None] | None = None,
    agree: Callable[[float], float] | None = None,
) -> Samples:
    """Time ``run`` (``reps`` operations per call): a first call, ``sweep.warmup`` calls, then
    samples until ``sweep.samples`` or, past :data:`MIN_SAMPLES`, ``sweep.point_budget_s``.

    ``before`` runs untimed ahead of each call (a cache flush, a barrier). ``agree`` makes
    every rank of a collective take the same number of samples: it gets this rank's time
    spent so far and returns the largest any rank spent (each rank calls it at the same point).
    """
    timer = backend.timer()

    def once() -> float:
        if before is not None:
            before()
        timer.start()
        output = run()
        backend.after_step()
        elapsed_ms = timer.stop()
        del output
        return elapsed_ms / 1e3 / reps

    first = once()
    warmup = [once() for _ in range(sweep.warmup)]
    samples: list[float] = []
    started = time.perf_counter()
    while len(samples) < sweep.samples:
        if len(samples) >= MIN_SAMPLES:
            spent = time.perf_counter() - started
            if (agree(spent) if agree is not None else spent) >= sweep.point_budget_s:
                break
        samples.append(once())
    return Samples(first, warmup, samples, reps)


def point_columns(samples: Samples, work: float | None, unit: str | None) -> dict[str, Any]:
    """A point's columns from its samples: time (median, min, p90) and, where it does ``work``
    (FLOPs or bytes per operation), the achieved rate per sample (median, max, p10: the
    slow end)."""
    times = np.asarray(samples.samples_s, dtype=float)
    columns: dict[str, Any] = {
        "samples": int(times.size),
        "samples_s": [float(t) for t in times],
        "warmup_s": [float(t) for t in samples.warmup_s],
        "first_s": float(samples.first_s),
        "reps": samples.reps,
        "median_s": float(np.median(times)),
        "min_s": float(times.min()),
        "p90_s": float(np.percentile(times, 90)),
        "rate_unit": unit,
        "median_rate": None,
        "max_rate": None,
        "p10_rate": None,
    }
    if work:
        rates = work / times
        columns |= {
            "median_rate": float(np.median(rates)),
            "max_rate": float(rates.max()),
            "p10_rate": float(np.percentile(rates, 10)),
        }
    return columns


def is_oom(error: BaseException) -> bool:
    import torch

    return isinstance(error, (MemoryError, torch.OutOfMemoryError)) or "out of memory" in str(error).lower()


def failed_point(error: BaseException) -> dict[str, Any]:
    """A point that raised: its status and the error, so the sweep goes on without it."""
    return {"status": "oom" if is_oom(error) else "failed", "error": f"{type(error).__name__}: {error}"}
