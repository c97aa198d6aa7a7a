"""What every trace reader shares: per-op totals, and self time from nested events.

A trace is a set of timelines (a thread, an XLine, a CUDA stream) whose events nest:
an op's *self* time is its duration minus its direct children's on the same timeline,
which is how torch.profiler's ``key_averages`` and XProf count it. Readers collect
events as flat numeric arrays (a few bytes each, never Python objects per event), then
:func:`self_times` walks one timeline at a time.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: how far a child may stick out of its parent and still count as nested (rounding)
NESTING_TOLERANCE_US = 1e-3


class TraceError(Exception):
    """A trace that cannot be read: missing, truncated, corrupt, or of an unknown kind."""


@dataclass
class OpTotals:
    """One op's aggregate over a trace, before it becomes an ``ops`` row."""

    source: str  # "hlo", "aten" or "kernel"
    op: str
    calls: int
    self_us: float
    total_us: float
    framework_op: str | None = None  # the framework op (or module) that produced an HLO op or launched a kernel
    module: str | None = None  # the HLO module/program an HLO op belongs to
    device_us: float | None = None  # CUDA: kernel time this CPU op launched itself
    flops: float | None = None
    bytes_accessed: float | None = None
    bound_by: str | None = None
    category_hint: str | None = None  # the tool's own category (xprof's HLO category), for categorize()
    flops_source: str | None = None  # where ``flops`` came from (docs/schema.md, ops)
    bytes_source: str | None = None
    shapes: list[ShapeCalls] | None = None  # a Chrome trace's op recorded with shapes: its calls by inputs


@dataclass
class ShapeCalls:
    """One op's calls with the same recorded inputs (``record_shapes``), and their figures
    once counted (:func:`tpubench.traces.counts.count_call`): per call, standing for
    ``counted_calls`` of them (those that do the op's own work)."""

    dims: Any  # Input Dims, Input type, Input Strides, Concrete Inputs as the trace has them (frozen)
    types: Any
    strides: Any
    concrete: Any
    calls: int
    leaf_calls: int  # calls that ran no other op (doing work) inside
    self_us: float  # all calls' self time
    flops: float | None = None  # per call
    flops_source: str | None = None
    bytes: float | None = None
    bytes_source: str | None = None
    counted_calls: int = 0
    label: str | None = None  # the shapes as words, where not from dims and types (an HLO op's)
    dot: tuple[int, int, int, int] | None = None  # a matmul's (batch, m, n, k)


@dataclass
class TraceOps:
    """Everything a reader extracts from one trace."""

    tool: str  # which reader and library produced the figures
    ops: list[OpTotals]
    steps: int | None = None  # traced steps marked in the trace (None: no step markers)
    step_time_us: float | None = None  # wall time of the traced steps; the op events' span without markers
    devices: int | None = None  # devices whose ops the trace holds (None: not known from the trace)
    comm_sizes: dict[tuple[str, str], Any] | None = None  # (source, op) -> its collectives' sizes (Chrome)


@dataclass
class Timelines:
    """Events of many timelines as flat arrays: timeline, start and duration (microseconds), op id."""

    timeline: array = field(default_factory=lambda: array("q"))
    start: array = field(default_factory=lambda: array("d"))
    duration: array = field(default_factory=lambda: array("d"))
    op: array = field(default_factory=lambda: array("q"))

    def __len__(self) -> int:
        return len(self.op)

    def span(self) -> float | None:
        """From the first event's start to the last event's end, or None without events."""
        if not len(self):
            return None
        start = np.frombuffer(self.start, dtype=np.float64)
        end = start + np.frombuffer(self.duration, dtype=np.float64)
        return float(end.max() - start.min())

    def totals(self, n_ops: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per op id: calls, total (inclusive) and self microseconds."""
        if not len(self):
            zeros = np.zeros(n_ops)
            return zeros.astype(np.int64), zeros, zeros
        duration = np.frombuffer(self.duration, dtype=np.float64)
        op = np.frombuffer(self.op, dtype=np.int64)
        calls = np.bincount(op, minlength=n_ops)
        total = np.bincount(op, weights=duration, minlength=n_ops)
        self_total = np.bincount(op, weights=self.own(), minlength=n_ops)
        return calls, total, self_total

    def own(self) -> np.ndarray:
        """Each event's self time (microseconds), in the order the events were added."""
        timeline = np.frombuffer(self.timeline, dtype=np.int64)
        start = np.frombuffer(self.start, dtype=np.float64)
        duration = np.frombuffer(self.duration, dtype=np.float64)
        # by timeline, then start; a parent (longer) before a child that starts with it
        order = np.lexsort((-duration, start, timeline))
        own = np.empty(len(order))
        own[order] = self_times(timeline[order], start[order], duration[order])
        return own


def self_times(timeline: np.ndarray, start: np.ndarray, duration: np.ndarray) -> np.ndarray:
    """Each event's duration minus its direct children's, for events sorted by (timeline, start, -duration).

    Times are in microseconds. A child lies inside its parent on the same timeline, to
    within :data:`NESTING_TOLERANCE_US` (Chrome traces round times to the nanosecond).
    Events that overlap without nesting, which a well-formed timeline does not have, are
    treated as siblings. Only events that overlap a neighbour are walked one by one (in
    Python): on a flat timeline, such as most of an XLA thread's, that is few of them.
    """
    own = duration.copy()
    if len(own) < 2:
        return own
    end = start + duration
    # the running maximum of the ends, restarted per timeline by shifting each past the last
    first = np.ones(len(own), dtype=bool)
    first[1:] = timeline[1:] != timeline[:-1]
    shift = np.cumsum(first) * (float(end.max() - start.min()) + 1.0)
    reach = np.maximum.accumulate(end + shift)
    overlaps = np.zeros(len(own), dtype=bool)  # starts before an earlier event of its timeline ended
    overlaps[1:] = start[1:] + shift[1:] < reach[:-1]
    cluster = np.cumsum(~overlaps)  # runs of events that overlap what came before them
    walked = np.flatnonzero(overlaps | np.append(overlaps[1:], False))  # clusters of two or more
    ends = (end[walked] + NESTING_TOLERANCE_US).tolist()
    durations = duration[walked].tolist()
    children = [0.0] * len(walked)
    stack: list[int] = []
    current = None
    for i, (group, finish) in enumerate(zip(cluster[walked].tolist(), end[walked].tolist(), strict=True)):
        if group != current:
            stack.clear()
            current = group
        while stack and finish > ends[stack[-1]]:  # the top has ended, or does not contain this event
            stack.pop()
        if stack:
            children[stack[-1]] += durations[i]
        stack.append(i)
    own[walked] -= np.asarray(children)
    return own
