"""Time in collectives: interval unions, the exposed part, and bus bandwidth.

Stateless functions over intervals (start and end in microseconds, as numpy arrays) and
plain numbers, shared by the trace readers (:mod:`tpubench.traces.collectives`), the
``ops`` rows and the scaling analysis.

Why unions, not sums: one collective shows up as several overlapping events. With gloo the
main thread's ``c10d::allreduce_`` overlaps the ``gloo:all_reduce`` annotation on gloo's
worker thread, and Kineto nests ``record_param_comms`` inside the c10d op; summing their
times counts one wait two or three times. The time a device spends in collectives is the
length of the union of their intervals on that device.

*Exposed* collective time is HolisticTraceAnalysis's definition (``get_comm_comp_overlap``):
the part of the collective time during which no compute ran on the same device, i.e. what
overlapping communication with compute did not hide.

Bus bandwidth follows nccl-tests (doc/PERFORMANCE.md): ``algbw = bytes / time`` and
``busbw = algbw x factor(n)``, the factor making the figure comparable to the link's peak
whatever the number of ranks.
"""

from __future__ import annotations

import numpy as np

#: nccl-tests' bus-bandwidth factor per collective, as a function of the group size n
BUSBW_FACTORS = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
}

#: words in an op's name that say which collective it is, most specific first
#: (``reduce_scatter`` before ``reduce``, ``all_reduce`` before ``reduce``)
_KINDS = (
    ("reduce_scatter", ("reduce_scatter", "reducescatter", "reduce-scatter")),
    ("all_reduce", ("all_reduce", "allreduce", "all-reduce")),
    ("all_gather", ("all_gather", "allgather", "all-gather")),
    ("all_to_all", ("all_to_all", "alltoall", "all-to-all")),
    ("broadcast", ("broadcast", "bcast")),
    ("reduce", ("reduce",)),
)


def union(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The union of intervals ``[start, end)`` as disjoint intervals, sorted by start.

    Overlapping and touching intervals merge, so nested or overlapping events (a c10d op
    and the gloo annotation it waits for) count once.
    """
    start, end = np.asarray(start, dtype=np.float64), np.asarray(end, dtype=np.float64)
    keep = end > start
    start, end = start[keep], end[keep]
    if not len(start):
        return start, end
    order = np.argsort(start, kind="stable")
    start, end = start[order], end[order]
    reach = np.maximum.accumulate(end)
    opens = np.ones(len(start), dtype=bool)  # an interval that starts after everything before it ended
    opens[1:] = start[1:] > reach[:-1]
    first = np.flatnonzero(opens)
    last = np.append(first[1:] - 1, len(start) - 1)
    return start[first], reach[last]


def covered(start: np.ndarray, end: np.ndarray) -> float:
    """How long the union of the intervals lasts (microseconds): no double counting."""
    merged_start, merged_end = union(start, end)
    return float((merged_end - merged_start).sum())


def overlap(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> float:
    """How long the unions of ``a`` and ``b`` (each ``(start, end)`` arrays) overlap."""
    a_start, a_end = union(*a)
    b_start, b_end = union(*b)
    if not len(a_start) or not len(b_start):
        return 0.0
    # both are disjoint and sorted: the overlap is |A| + |B| - |A u B|
    both = covered(np.concatenate([a_start, b_start]), np.concatenate([a_end, b_end]))
    return float((a_end - a_start).sum() + (b_end - b_start).sum() - both)


def exposed(collective: tuple[np.ndarray, np.ndarray], compute: tuple[np.ndarray, np.ndarray]) -> float:
    """Collective time not overlapped by compute on the same device (HTA's exposed
    communication): the collectives' union minus its overlap with the compute's union."""
    return covered(*collective) - overlap(collective, compute)


def collective_kind(name: str) -> str | None:
    """Which collective an op's name says it is (a key of :data:`BUSBW_FACTORS`), or None."""
    lowered = name.lower()
    for kind, words in _KINDS:
        if any(word in lowered for word in words):
            return kind
    return None


def busbw_factor(kind: str, group_size: int) -> float:
    """nccl-tests' factor from algorithm to bus bandwidth for ``kind`` over ``group_size`` ranks."""
    if kind not in BUSBW_FACTORS:
        raise ValueError(f"unknown collective {kind!r}; known: {', '.join(BUSBW_FACTORS)}")
    if group_size < 1:
        raise ValueError(f"a group has at least one rank, got {group_size}")
    return float(BUSBW_FACTORS[kind](group_size))


def busbw_gbps(kind: str, group_size: int, size_bytes: float, duration_us: float) -> float | None:
    """Bus bandwidth in GB/s (10^9 bytes/s) of one collective of ``size_bytes`` (nccl-tests'
    S: the buffer each rank holds, the output for all-gather, the input for reduce-scatter)
    that took ``duration_us``; None when the duration is not positive."""
    if duration_us <= 0:
        return None
    return size_bytes / (duration_us * 1e-6) * busbw_factor(kind, group_size) / 1e9
