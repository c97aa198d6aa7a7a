"""``torch.compile``'s compiles, graph breaks and recompile-limit hits (cpu-, cuda-, xla-, tpu-compile).

Dynamo already keeps one ``CompilationMetrics`` record per compile (forward frames, and
AOTAutograd's lazy backward with the same ``compile_id``): its reason (the first failing
guard), seconds, FX-cache hits and, when a frame reached ``recompile_limit``, a
``fail_type`` saying so. Three cheap additions make them a ``compiles`` table:

- the records are kept (the deque holds 64 unless :data:`METRICS_LIMIT` raises it), and
  the new ones are read after each step, which gives each its step;
- a recompile user-context hook, which Dynamo calls at every frame compile, notes the
  user's line that called into the compiled code (for an ``nn.Module`` the record's own
  ``co_filename`` is Dynamo's ``external_utils.inner``, nobody's line);
- an in-memory handler on Dynamo's ``graph_breaks`` log records, which give each break's
  line and reason (its id, ``GB0124``, comes from the doc link or the registry).

Nothing here turns on the structured trace (``TORCH_TRACE``): it builds every artifact's
payload and costs compile time (``--explain`` territory).
"""

from __future__ import annotations

import json
import logging
import os
import re
import traceback
from typing import Any

from tpubench.compiles import Capture, Event, StepFacts, current_user_source, step_phase, user_source

#: compilation-metrics records kept per process (Dynamo's default is 64: a long run loses its first)
METRICS_LIMIT = 4096
_CONTEXT_PREFIX = "tpubench:"
_GB_LINK = re.compile(r"/gb/gb(\d{4})")
_BREAK_AT = re.compile(r"in user code at (.+):(\d+)")
_TRACEBACK_FRAME = re.compile(r'File "([^"]+)", line (\d+)')
#: a guard on a Python value: a number, a bool (``___stack0 == False``), None or a string
_VALUE_GUARD = re.compile(r"(==|!=)\s*(-?\d|True\b|False\b|None\b|['\"])")
_SHAPE_GUARD = ("size mismatch", "stride mismatch", "dimensionality", "rank", "dim ", "shape")


def reason_cause(reason: str | None, co_name: str | None) -> str:
    """A Dynamo compile's cause, from its ``recompile_reason`` (the first failing guard)."""
    if not reason:
        return "graph_break_resume" if (co_name or "").startswith("torch_dynamo_resume_in") else "first_compile"
    text = reason.lower()
    if any(marker in text for marker in _SHAPE_GUARD):
        return "shape_change"
    if _VALUE_GUARD.search(reason):
        return "value_change"
    return "other_guard"


def graph_break_ids() -> dict[str, str]:
    """Graph-break type (the first line of Dynamo's message) -> its id in the registry."""
    import torch

    path = os.path.join(os.path.dirname(torch.__file__), "_dynamo", "graph_break_registry.json")
    try:
        with open(path) as stream:
            registry = json.load(stream)
    except (OSError, ValueError):  # an older torch without the registry: ids stay null
        return {}
    return {entry["Gb_type"]: gb_id for gb_id, entries in registry.items() for entry in entries}


def _first_line(text: str | None) -> str:
    return (text or "").strip().splitlines()[0].strip() if (text or "").strip() else ""


def is_limit_failure(fail_type: str | None, fail_reason: str | None) -> bool:
    text = f"{fail_type or ''} {fail_reason or ''}".lower()
    return "limit" in text and ("recompile" in text or "cache_size" in text)


def _stance_guard(error: BaseException) -> tuple[str, str | None] | None:
    """The failing guard and the user's line of the error Dynamo raises under the
    ``fail_on_recompile`` stance (whose own message names ``external_utils.inner`` for a
    compiled module); None for any other error."""
    text = str(error)
    if "fail_on_recompile" not in text:
        return None
    guards = [line.strip().removeprefix("- ") for line in text.splitlines() if line.strip().startswith("- ")]
    frames = [(frame.filename, frame.lineno or 0) for frame in traceback.extract_tb(error.__traceback__)]
    return (guards[0] if guards else _first_line(text)), user_source(frames)


def describe_stance_error(error: BaseException) -> str | None:
    """Cause, user line and guard of a ``fail_on_recompile`` stance error; None for any other error."""
    if (found := _stance_guard(error)) is None:
        return None
    reason, where = found
    return f"dynamo {reason_cause(reason.split(': ', 1)[-1], None)} at {where or 'an unknown line'} ({reason})"


class _BreakLog(logging.Handler):
    """Keeps Dynamo's graph-break log records (only their text) as they are emitted."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


class DynamoCapture(Capture):
    """Compiles and graph breaks of everything ``torch.compile`` runs in this worker.

    ``shared_cache`` says whether the compile cache may hold graphs from earlier runs
    (``--compile-cache``): only then is an FX-graph cache hit a disk hit; in a private
    cache, which starts empty, a hit is a graph this run compiled before (a memory hit).
    ``seconds_layer`` is False under xla-compile, where the XLA layer's seconds are the
    run's ``compile_s`` (a Dynamo compile's seconds include its XLA compiles).
    """

    def __init__(self, shared_cache: bool = False, seconds_layer: bool = True):
        super().__init__()
        self.shared_cache = shared_cache
        self.seconds_layer = seconds_layer
        self.step: int | None = None
        self.phase = "setup"
        self._contexts: list[tuple[int | None, str, str | None]] = []  # per frame compile: step, phase, line
        self._seen = 0
        self._sources: dict[str, str | None] = {}  # compile_id -> the user's line of its forward
        self._breaks = _BreakLog()
        self._break_index = 0
        self._ids: dict[str, str] | None = None

    def start(self) -> None:
        import torch._dynamo
        from torch._dynamo import utils
        from torch._logging._internal import log_registry

        if hasattr(utils, "set_compilation_metrics_limit"):
            utils.set_compilation_metrics_limit(METRICS_LIMIT)
        self._seen = len(utils.get_compilation_metrics())
        if hasattr(torch._dynamo, "register_hook_for_recompile_user_context"):
            torch._dynamo.register_hook_for_recompile_user_context(self._context)
        for name in log_registry.artifact_log_qnames:
            if name.endswith(".__graph_breaks"):
                logger = logging.getLogger(name)
                logger.setLevel(logging.DEBUG)  # Dynamo formats the record only when its logger is enabled
                logger.addHandler(self._breaks)

    def _context(self) -> str:
        """Called by Dynamo at each frame compile: note the step and the user's line."""
        self._contexts.append((self.step, self.phase, current_user_source()))
        return f"{_CONTEXT_PREFIX}{len(self._contexts) - 1}"

    def before_step(self, step: int, phase: str) -> None:
        self.step, self.phase = step, phase

    def after_step(self, step: int, phase: str) -> StepFacts:
        found = self._collect(step, phase)
        seconds = [event.compile_s for event in found if event.compile_s is not None]
        if not self.seconds_layer:
            return StepFacts()
        return StepFacts(compile_s=float(sum(seconds)))

    def after_warmup(self, fail_on_recompile: bool) -> None:
        if fail_on_recompile:
            import torch

            torch.compiler.set_stance("fail_on_recompile")

    def compile_refused(self, step: int, phase: str, error: BaseException) -> None:
        """The stance refused the compile, so Dynamo keeps no record of it: the refusal is
        the run's last event (``compile_failed``), with the guard that failed and its line."""
        if (found := _stance_guard(error)) is None:
            return
        reason, where = found
        table_step, table_phase = step_phase(step, phase)
        self.events.append(
            Event(
                event="compile_failed",
                layer="dynamo",
                step=table_step,
                phase=table_phase,
                cause=reason_cause(reason.split(": ", 1)[-1], None),
                raw=f"refused by --fail-on-recompile: {reason}",
                source=where,
            )
        )

    def finish(self) -> None:
        self._collect(self.step, self.phase)  # the --profile steps', if any
        limits = [event for event in self.events if event.event == "recompile_limit"]
        for event in limits:
            self.notes.append(
                f"Dynamo hit its recompile limit at {event.source or 'an unknown line'} (step {event.step}): "
                "that frame now runs eagerly, so the compile count stopped growing although the code is no "
                f"longer compiled; last reason: {event.raw}"
            )

    def _collect(self, step: int | None, phase: str) -> list[Event]:
        """Events for the compiles and graph breaks since the last call (all during ``step``)."""
        from torch._dynamo.utils import get_compilation_metrics

        records = list(get_compilation_metrics())
        fresh, self._seen = records[self._seen :], len(records)
        full = f"Dynamo's compilation-metrics deque is full ({METRICS_LIMIT} records): later compiles have no rows"
        if len(records) >= METRICS_LIMIT and full not in self.notes:
            self.notes.append(full)
        found = [*self._break_events(step, phase), *(self._record_event(r, step, phase) for r in fresh)]
        self.events.extend(found)
        return found

    def _break_events(self, step: int | None, phase: str) -> list[Event]:
        messages = self._breaks.messages[self._break_index :]
        self._break_index = len(self._breaks.messages)
        step, table_phase = step_phase(step, phase)
        return [self._break_event(message, step, table_phase) for message in messages]

    def _break_event(self, message: str, step: int | None, phase: str) -> Event:
        lines = message.splitlines()
        reason = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("Graph Break Reason:")), "")
        if self._ids is None:
            self._ids = graph_break_ids()
        link = _GB_LINK.search(message)
        gb_id = f"GB{link.group(1)}" if link else self._ids.get(reason)
        types = {found: gb_type for gb_type, found in self._ids.items()}
        reason = types.get(gb_id or "", reason)  # the registry's name of the break, not the wrapper's text
        frames = [(path, int(line)) for path, line in _TRACEBACK_FRAME.findall(message)]
        if at := _BREAK_AT.search(lines[0] if lines else ""):
            frames.append((at.group(1), int(at.group(2))))
        return Event(
            event="graph_break",
            layer="dynamo",
            step=step,
            phase=phase,
            cause=None,
            raw=reason or message[:500],
            graph_break_id=gb_id,
            source=user_source(frames),
        )

    def _record_event(self, record: Any, step: int | None, phase: str) -> Event:
        contexts = getattr(record, "recompile_user_contexts", None) or ()
        noted = [c for c in contexts if isinstance(c, str) and c.startswith(_CONTEXT_PREFIX)]
        if noted:  # the hook saw the step and line when the frame was compiled
            context_step, context_phase, source = self._contexts[int(noted[0][len(_CONTEXT_PREFIX) :])]
            if context_step is not None:
                step, phase = context_step, context_phase
        else:
            source = self._sources.get(record.compile_id)
        step, table_phase = step_phase(step, phase)
        forward = getattr(record, "is_forward", True) is not False
        if forward:
            self._sources[record.compile_id] = source
        if not forward:
            backward_us = getattr(record, "backward_cumulative_compile_time_us", None)
            return Event(
                event="compile",
                layer="aot_backward",
                step=step,
                phase=table_phase,
                cause="lazy_backward",
                source=source,
                compile_id=record.compile_id,
                compile_s=backward_us / 1e6 if backward_us is not None else None,
                cache=self._cache(record),
            )
        reason = record.recompile_reason
        if record.fail_type:
            limit = is_limit_failure(record.fail_type, record.fail_reason)
            return Event(
                event="recompile_limit" if limit else "compile_failed",
                layer="dynamo",
                step=step,
                phase=table_phase,
                cause=reason_cause(reason, record.co_name),
                raw=f"{record.fail_type}: {_first_line(record.fail_reason)}"
                + (f"; last reason: {_first_line(reason)}" if reason else ""),
                source=source,
                compile_id=record.compile_id,
                compile_s=record.entire_frame_compile_time_s,
            )
        return Event(
            event="compile",
            layer="dynamo",
            step=step,
            phase=table_phase,
            cause=reason_cause(reason, record.co_name),
            raw=reason,
            source=source,
            compile_id=record.compile_id,
            compile_s=record.entire_frame_compile_time_s,
            cache=self._cache(record),
        )

    def _cache(self, record: Any) -> str | None:
        """Inductor's FX-graph cache verdict for a compile: all hits, or a miss."""
        hits = getattr(record, "inductor_fx_local_cache_hit_count", None) or 0
        misses = getattr(record, "inductor_fx_local_cache_miss_count", None) or 0
        if hits and not misses:
            return "disk_hit" if self.shared_cache else "memory_hit"
        return "miss" if misses or hits else None

    def columns(self) -> dict[str, Any]:
        breaks = [event for event in self.events if event.event == "graph_break"]
        return {"graph_breaks": len(breaks)}
