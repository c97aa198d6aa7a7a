"""Why a run compiled, and what it cost: one event per compile, graph break, host read or
fallback, captured in the worker (the ``compiles`` table in docs/schema.md).

Each backend family has its own module, since each tells a different story:

- :mod:`tpubench.compiles.dynamo`: ``torch.compile`` (cpu-, cuda-, xla-, tpu-compile), from
  Dynamo's own per-compile records and its graph-break and recompile log records;
- :mod:`tpubench.compiles.xla`: torch_xla (xla, xla-compile), from ``PT_XLA_DEBUG_LEVEL=1``'s
  "Compilation Analysis" blocks and the metrics, sampled around each step;
- :mod:`tpubench.compiles.tpu`: TorchTPU, from its cache counters only.

A backend hands the worker a :class:`Capture` (``Backend.compile_capture``); the timing
protocol calls it before and after each step, outside the timed region, so the capture's
own bookkeeping never lands in a step's time. What it does inside a compile (a hook call,
a log record, PT_XLA_DEBUG's block) is the cost the benchmark script
``benchmarks/compile_capture_cost.py`` measures.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

EVENTS = ("compile", "graph_break", "host_read", "fallback", "recompile_limit", "compile_failed")
LAYERS = ("dynamo", "aot_backward", "xla", "inductor", "tpu")
CAUSES = (
    "first_compile",
    "shape_change",
    "value_change",
    "other_guard",
    "graph_break_resume",
    "lazy_backward",
    "step_sync",
    "host_read",
    "unknown",
)
CACHES = ("miss", "memory_hit", "disk_hit", "load_failed")
#: the protocol's step phases (``StepRecord.phase``) as the compiles table names them
PHASES = {"first": "warmup", "warmup": "warmup", "measure": "measured", "profile": "profiled"}

#: packages whose frames are never "the user's line", and the harness's adapter around a
#: user's factory (``workloads/custom``): the factory's own module is the user's line
_LIBRARY_PACKAGES = ("torch", "torch_xla", "torch_tpu", "tpubench", "functorch")
_LIBRARY_SUBFOLDERS = {"workloads": "custom"}


@dataclass
class Event:
    """One row of the ``compiles`` table, less the run's ids and its ``seq``."""

    event: str
    layer: str
    step: int | None = None
    phase: str = "setup"
    cause: str | None = None
    cause_inferred: bool = False
    raw: str | None = None
    graph_break_id: str | None = None
    source: str | None = None
    graph_id: str | None = None
    compile_id: str | None = None
    compile_s: float | None = None
    cache: str | None = None
    op: str | None = None
    count: int = 1


@dataclass
class StepFacts:
    """What a capture learnt about one step: the steps table's columns."""

    compile_s: float | None = None
    executions: int | None = None
    host_reads: int | None = None


@dataclass
class Capture:
    """What a backend records about its compiles. Subclasses override the hooks they need.

    ``events`` fills as steps run; ``columns()`` adds the runs table's figures at the end.
    """

    events: list[Event] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # for the run's warnings

    def start(self) -> None:
        """Before the model is built or wrapped: install hooks, take the counters' baseline."""

    def before_step(self, step: int, phase: str) -> None:
        """Just before the step's timed region."""

    def after_step(self, step: int, phase: str) -> StepFacts:
        """Just after the step's timed region: collect what happened during it."""
        return StepFacts()

    def after_warmup(self, fail_on_recompile: bool) -> None:
        """Warm-up is over; with ``fail_on_recompile``, make any further compile an error
        where the backend can (Dynamo's stance, TorchTPU's cache-only mode)."""

    def compile_refused(self, step: int, phase: str, error: BaseException) -> None:
        """``--fail-on-recompile`` made the backend refuse a compile during ``step`` with
        ``error``: record the refusal where the backend keeps no record of it."""

    def finish(self) -> None:
        """After the last step: turn what is left into events."""

    def events_so_far(self) -> list[Event]:
        """The events recorded up to now (``--fail-on-recompile`` names the latest)."""
        return self.events

    def columns(self) -> dict[str, Any]:
        """The runs table's compile columns this capture can fill."""
        return {}


class Captures(Capture):
    """Several captures as one (xla-compile: Dynamo's and XLA's; tpu-compile: Dynamo's and TorchTPU's).

    ``primary`` is the one whose seconds the backend's ``compile_s`` counts: its step
    figures win where both have one.
    """

    def __init__(self, primary: Capture, *others: Capture):
        super().__init__()
        self.parts = (primary, *others)

    def start(self) -> None:
        for part in self.parts:
            part.start()

    def before_step(self, step: int, phase: str) -> None:
        for part in self.parts:
            part.before_step(step, phase)

    def after_step(self, step: int, phase: str) -> StepFacts:
        facts = [part.after_step(step, phase) for part in self.parts]
        merged = StepFacts()
        for found in reversed(facts):  # the primary's, first in parts, set last: it wins
            merged = StepFacts(
                **{key: value if value is not None else getattr(merged, key) for key, value in asdict(found).items()}
            )
        return merged

    def events_so_far(self) -> list[Event]:
        return [event for part in self.parts for event in part.events_so_far()]

    def after_warmup(self, fail_on_recompile: bool) -> None:
        for part in self.parts:
            part.after_warmup(fail_on_recompile)

    def compile_refused(self, step: int, phase: str, error: BaseException) -> None:
        for part in self.parts:
            part.compile_refused(step, phase, error)

    def finish(self) -> None:
        for part in self.parts:
            part.finish()
        events = [event for part in self.parts for event in part.events]
        # in step order (before the first step first); within a step, part by part
        self.events = sorted(events, key=lambda event: (event.step is not None, event.step or 0))
        self.notes = [note for part in self.parts for note in part.notes]

    def columns(self) -> dict[str, Any]:
        found: dict[str, Any] = {}
        for part in reversed(self.parts):
            found |= {key: value for key, value in part.columns().items() if value is not None}
        return found


def user_source(frames: Iterable[tuple[str, int]]) -> str | None:
    """``path:line`` of the innermost frame outside torch, torch_xla, torch_tpu and tpubench.

    ``frames`` go outermost first (as a traceback lists them). A path inside the working
    directory is given relative to it (``tests/compile_workloads.py:41``).
    """
    chosen = None
    for filename, line in frames:
        if not _is_library(filename):
            chosen = (filename, line)
    if chosen is None:
        return None
    return f"{_display_path(chosen[0])}:{chosen[1]}"


def current_user_source() -> str | None:
    """The innermost user frame of the calling thread's Python stack (see :func:`user_source`)."""
    frames = []
    frame = sys._getframe(1)
    while frame is not None:
        frames.append((frame.f_code.co_filename, frame.f_lineno))
        frame = frame.f_back
    return user_source(reversed(frames))


def _is_library(filename: str) -> bool:
    if filename.startswith("<"):  # <frozen runpy>, <string>, Dynamo's generated code
        return True
    path = os.path.normpath(os.path.abspath(filename))
    parts = path.split(os.sep)
    if "site-packages" in parts or "dist-packages" in parts:
        return True  # an installed library (transformers' modules are not the user's line either)
    # by the packages' own folders, not a path part named like one: a clone of this repository
    # in ~/tpubench would otherwise make every workload's line a library's
    return path.startswith(_library_folders())


@functools.cache
def _library_folders() -> tuple[str, ...]:
    """The folders of :data:`_LIBRARY_PACKAGES` and :data:`_LIBRARY_SUBFOLDERS` this interpreter
    has: found by top-level ``find_spec``, which imports nothing."""
    folders = []
    for package in (*_LIBRARY_PACKAGES, *_LIBRARY_SUBFOLDERS):
        spec = importlib.util.find_spec(package)
        locations = list(spec.submodule_search_locations or []) if spec is not None else []
        sub = _LIBRARY_SUBFOLDERS.get(package)
        folders += [os.path.join(location, sub) if sub else location for location in locations]
    return tuple(os.path.normpath(folder) + os.sep for folder in folders)


def _display_path(filename: str) -> str:
    try:
        relative = os.path.relpath(filename)
    except ValueError:
        return filename
    return filename if relative.startswith("..") else relative


def step_phase(step: int | None, phase: str | None) -> tuple[int | None, str]:
    """An event's step and the compiles table's phase name for it."""
    return step, PHASES.get(phase or "", phase or "setup")


def _in_memory(event: Event) -> bool:
    """An XLA graph found compiled in this process: a lookup, not a compile."""
    return event.layer == "xla" and event.cache == "memory_hit"


def rows(events: Sequence[Event]) -> list[dict[str, Any]]:
    """The ``compiles`` table's rows of a run, numbered in order."""
    return [{"seq": index, **asdict(event)} for index, event in enumerate(events)]


def run_columns(events: Sequence[Event], records: Sequence[Any]) -> dict[str, Any]:
    """The runs table's compile columns that follow from the events and the step records
    (``measure.StepRecord``: each step's protocol phase and captured ``compile_s``)."""
    breaks = [event for event in events if event.event == "graph_break"]
    # a recompile is a frame's (Dynamo) or a graph's (XLA, TorchTPU); its lazy backward follows from it
    measured_compiles = [
        e
        for e in events
        if e.event == "compile" and e.phase == "measured" and not _in_memory(e) and e.layer != "aot_backward"
    ]
    after_warmup = [e for e in measured_compiles if e.layer == "dynamo"] or measured_compiles
    warm = [r.compile_s for r in records if r.phase != "measure" and r.compile_s is not None]
    measured = [r.compile_s for r in records if r.phase == "measure" and r.compile_s is not None]
    compiled = any(r.compile_s is not None for r in records)
    return {
        "graph_break_ids": dict(Counter(event.graph_break_id or "unknown" for event in breaks)),
        "recompile_causes": dict(Counter(event.cause or "unknown" for event in after_warmup)),
        "recompile_limit_hit": any(event.event == "recompile_limit" for event in events),
        "compile_s_warmup": float(sum(warm)) if compiled else None,
        "compile_s_measured": float(sum(measured)) if compiled else None,
    }
