"""torch_xla's compiles, host reads and CPU fallbacks, step by step (xla, xla-compile).

With ``PT_XLA_DEBUG_LEVEL=1`` and ``PT_XLA_DEBUG_FILE`` set before the first compile
(:func:`debug_env`), torch_xla appends a "Compilation Analysis" block per compile: the
cause (what cut the graph: the step's sync, or a value read before it), the graph hash
(the persistent-cache file is its decimal form) and the Python frames. Level 1 writes
nothing per execution, so a settled run pays nothing. After each step the capture reads
the file's new blocks and pairs them, in order, with the step's new ``CompileTime``
samples (the seconds); per-step deltas of the metrics give executions, host reads and
fallbacks (:class:`CounterTotals`, which survives xla-compile's counter resets).

torch_xla never says "shape": a shape change shows as a new hash at the same sync frame.
A new graph at a frame that already compiled one with the same numbers of inputs and
outputs is labelled ``shape_change`` with ``cause_inferred`` (an extra optimizer state, as
AdamW's after step 0, changes the inputs, so it stays ``step_sync``). ``--explain``'s IR
diff is what proves it.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tpubench.compiles import Capture, Captures, Event, StepFacts, step_phase, user_source

#: ops the CPU runs on purpose: reading a value to the host, or a data-dependent shape.
#: Any other ``aten::`` counter is a missing lowering (torch_xla's troubleshooting guide).
HOST_READ_OPS = frozenset({"aten::_local_scalar_dense", "aten::nonzero"})

#: counters torch_xla's dynamo bridge wipes on every compile (``metrics.clear_counters()``)
CACHE_COUNTERS = ("CachedCompile", "PersistentCacheHit", "PersistentCacheMiss", "PersistentCacheDeserializeFailure")

_SYNC_CAUSES = ("user torch_xla.sync", "parallel loader", "StepTrace", "torch_xla.compile", "user mark_step")
_FRAME = re.compile(r"^\s*(.*?) \((.+):(\d+)\)\s*$")
_RULE = re.compile(r"^Compilation Analysis: =+$", re.MULTILINE)


#: Python frames per analysis (torch_xla's default, 8, can stop short of the user's line
#: under Dynamo, whose frames come first); walked once per compile, never per step
DEBUG_MAX_FRAMES = 32


def debug_env(directory: str | None = None) -> dict[str, str]:
    """The variables that make torch_xla write its compilation analyses to a file in the
    run's scratch folder (the worker's TMPDIR). They are read once, at the first compile."""
    path = os.path.join(directory or tempfile.gettempdir(), "pt_xla_debug.txt")
    return {"PT_XLA_DEBUG_LEVEL": "1", "PT_XLA_DEBUG_FILE": path, "PT_XLA_DEBUG_MAX_FRAME": str(DEBUG_MAX_FRAMES)}


def xla_cause(text: str) -> str:
    """The normalised cause of a PT_XLA_DEBUG "Compilation Cause" line."""
    if "access tensor value" in text:
        return "host_read"
    if any(marker in text for marker in _SYNC_CAUSES) and "dynamo" not in text:
        return "step_sync"
    return "unknown"


@dataclass
class Block:
    """One "Compilation Analysis" block."""

    cause: str = ""
    graph_hash: str | None = None
    inputs: int | None = None
    outputs: int | None = None
    frames: list[tuple[str, int]] = field(default_factory=list)  # innermost first, as printed


def parse_blocks(text: str) -> list[Block]:
    """The blocks in ``text``; a block cut short at the end is left for the next read."""
    blocks: list[Block] = []
    current: Block | None = None
    section = ""
    for raw in text.splitlines():
        if not raw.startswith("Compilation Analysis:"):
            continue
        line = raw[len("Compilation Analysis:") :]
        stripped = line.strip()
        if stripped.startswith("====="):
            if current is None:
                current = Block()
            else:
                blocks.append(current)
                current = None
            continue
        if current is None or stripped.startswith("-----"):
            continue
        if stripped == "Compilation Cause":
            section = "cause"
        elif stripped.startswith("Graph Info"):
            section = "graph"
        elif stripped.startswith("Python Frame Triggered Execution"):
            section = "frames"
        elif stripped.startswith("Graph Hash:"):
            current.graph_hash = stripped.split(":", 1)[1].strip()
        elif stripped.startswith("Number of Graph Inputs:"):
            current.inputs = int(stripped.split(":", 1)[1])
        elif stripped.startswith("Number of Graph Outputs:"):
            current.outputs = int(stripped.split(":", 1)[1])
        elif section == "cause":
            current.cause = f"{current.cause} {stripped}".strip()
        elif section == "frames" and (match := _FRAME.match(line)):
            current.frames.append((match.group(2), int(match.group(3))))
    return blocks


class CounterTotals:
    """Totals of torch_xla counters that survive resets: sampled after every step, a
    counter that went down was cleared (xla-compile's bridge clears them on each Dynamo
    compile), so its new value is all that happened since."""

    def __init__(self) -> None:
        self.totals: dict[str, int] = {}
        self.last_delta: dict[str, int] = {}
        self._last: dict[str, int] = {}

    def names(self) -> list[str]:
        import torch_xla.debug.metrics as met

        return [*CACHE_COUNTERS, *met.executed_fallback_ops()]

    def start(self) -> None:
        """The baseline: what the process counted before the run's steps (model build)."""
        import torch_xla.debug.metrics as met

        self._last = {name: met.counter_value(name) or 0 for name in self.names()}

    def sample(self) -> dict[str, int]:
        """Each counter's growth since the previous sample, added to the totals."""
        import torch_xla.debug.metrics as met

        delta = {}
        for name in set(self.names()) | set(self._last):
            now = met.counter_value(name) or 0
            before = self._last.get(name, 0)
            grown = now - before if now >= before else now  # a drop: reset, then counted ``now``
            if grown:
                delta[name] = grown
                self.totals[name] = self.totals.get(name, 0) + grown
            self._last[name] = now
        self.last_delta = delta
        return delta

    def fallbacks(self) -> dict[str, int]:
        return {name: count for name, count in sorted(self.totals.items()) if name.startswith("aten::")}


def _metric_samples(name: str) -> tuple[int, list[tuple[float, float]]]:
    import torch_xla.debug.metrics as met

    data = met.metric_data(name)
    return (int(data[0]), list(data[2])) if data else (0, [])


class XlaCapture(Capture):
    """Compile, host-read and fallback events of a torch_xla run, per step.

    ``counters`` are the backend's :class:`CounterTotals` (sampled by the backend after
    each step, before this capture reads their deltas). ``cache_dir`` is the persistent
    cache's folder, if any: a graph whose file was there before the run is a disk hit
    (or, on PJRT CPU, which cannot load executables, a failed load).
    """

    def __init__(self, counters: CounterTotals, debug_file: str | None, cache_dir: str | None = None):
        super().__init__()
        self.counters = counters
        self.debug_file = debug_file
        self.cache_dir = cache_dir
        self._offset = 0
        self._seen: dict[str, int] = {}
        self._cached_before: set[str] = set()
        self._shapes: dict[tuple, set[str]] = {}  # (frames, inputs, outputs) -> hashes compiled there
        self._steps: list[tuple[str, StepFacts]] = []
        self._compiled_last_step = False
        self.step: int | None = None
        self.phase = "setup"
        self.dropped = 0
        self.drop_reasons: list[str] = []

    def start(self) -> None:
        for metric in ("CompileTime", "ExecuteTime", "TransferFromDeviceTime"):
            self._seen[metric] = _metric_samples(metric)[0]
        if self.cache_dir and os.path.isdir(self.cache_dir):
            self._cached_before = set(os.listdir(self.cache_dir))

    def before_step(self, step: int, phase: str) -> None:
        if not self._steps and self.step is None:  # anything compiled while the model was built and moved
            self.events.extend(self._compiles(None, "setup", {}))
        self.step, self.phase = step, phase

    def after_step(self, step: int, phase: str) -> StepFacts:
        delta = self.counters.last_delta
        compiles = self._compiles(step, phase, delta)
        executions = self._new_samples("ExecuteTime")
        host_reads = self._new_samples("TransferFromDeviceTime")
        table_step, table_phase = step_phase(step, phase)
        hits = delta.get("CachedCompile", 0)
        if hits and self._compiled_last_step:  # back to graphs compiled before a new one
            compiles.append(
                Event("compile", "xla", table_step, table_phase, raw="CachedCompile", cache="memory_hit", count=hits)
            )
        self._compiled_last_step = any(event.cache != "memory_hit" for event in compiles)
        for op, count in sorted(delta.items()):
            if op.startswith("aten::"):
                kind = "host_read" if op in HOST_READ_OPS else "fallback"
                compiles.append(Event(kind, "xla", table_step, table_phase, op=op, count=count))
        self.events.extend(compiles)
        seconds = sum(event.compile_s or 0.0 for event in compiles)
        facts = StepFacts(compile_s=seconds, executions=len(executions), host_reads=len(host_reads))
        self._steps.append((phase, facts))
        return facts

    def finish(self) -> None:
        """What came after the last step read: the ``--profile`` steps' compiles, if any."""
        self.events.extend(self._compiles(self.step, self.phase, {}))
        if self.dropped:
            self.notes.append(f"{self.dropped} XLA compile(s) without a row: {'; '.join(self.drop_reasons)}")

    def _new_samples(self, metric: str) -> list[tuple[float, float]]:
        count, samples = _metric_samples(metric)
        new = count - self._seen.get(metric, 0)
        self._seen[metric] = count
        if new <= 0:
            return []
        kept = samples[-new:] if new <= len(samples) else samples
        if new > len(kept) and metric == "CompileTime":
            self.dropped += new - len(kept)
            self.drop_reasons.append(f"{new - len(kept)} CompileTime samples past XLA_METRICS_SAMPLES")
        return kept

    def _read_blocks(self) -> list[Block]:
        if not self.debug_file or not os.path.exists(self.debug_file):
            return []
        with open(self.debug_file, encoding="utf-8", errors="replace") as stream:
            stream.seek(self._offset)
            text = stream.read()
        rules = [match.start() for match in _RULE.finditer(text)]  # two per block: its first and last line
        # keep an unfinished block (its closing rule not yet written) for the next read
        complete = text if len(rules) % 2 == 0 else text[: rules[-1]]
        self._offset += len(complete.encode("utf-8", errors="replace"))
        return parse_blocks(complete)

    def _compiles(self, step: int | None, phase: str, delta: dict[str, int]) -> list[Event]:
        """Compile rows for the blocks and ``CompileTime`` samples since the last read."""
        blocks = self._read_blocks()
        samples = self._new_samples("CompileTime")
        table_step, table_phase = step_phase(step, phase)
        disk_hits = delta.get("PersistentCacheHit", 0)
        failed_loads = delta.get("PersistentCacheDeserializeFailure", 0)
        events = []
        for block in blocks:
            on_disk = block.graph_hash is not None and _cache_file(block.graph_hash) in self._cached_before
            cache = "miss"
            if on_disk and failed_loads:
                cache, failed_loads = "load_failed", failed_loads - 1
            elif on_disk and disk_hits:  # loaded: no compile, so no CompileTime sample to take
                events.append(self._event(block, None, "disk_hit", table_step, table_phase))
                disk_hits -= 1
                continue
            seconds = samples.pop(0)[1] / 1e9 if samples else None
            events.append(self._event(block, seconds, cache, table_step, table_phase))
        for _, nanoseconds in samples:  # compiles without a block: no Python frame (autograd's threads)
            events.append(
                Event(
                    "compile",
                    "xla",
                    table_step,
                    table_phase,
                    cause="unknown",
                    raw="no Compilation Analysis block (compiled on a thread without Python frames)",
                    compile_s=nanoseconds / 1e9,
                    cache="miss",
                )
            )
        return events

    def _event(self, block: Block, seconds: float | None, cache: str, step: int | None, phase: str) -> Event:
        cause, inferred = xla_cause(block.cause), False
        source = user_source(reversed(block.frames))
        where = (source, _cut_site(block.frames), block.inputs, block.outputs)
        known = self._shapes.setdefault(where, set())
        if cause == "step_sync" and known and block.graph_hash not in known:
            cause, inferred = "shape_change", True
        if block.graph_hash:
            known.add(block.graph_hash)
        return Event(
            "compile",
            "xla",
            step,
            phase,
            cause=cause,
            cause_inferred=inferred,
            raw=block.cause,
            source=source,
            graph_id=block.graph_hash,
            compile_s=seconds,
            cache=cache,
        )

    def columns(self) -> dict[str, Any]:
        measured = [facts for phase, facts in self._steps if phase == "measure"]
        missing = {op: n for op, n in self.counters.fallbacks().items() if op not in HOST_READ_OPS}
        return {
            "executions_per_step": _mean(measured, lambda facts: facts.executions),
            "host_reads_per_step": _mean(measured, lambda facts: facts.host_reads),
            "missing_lowerings": missing,
            "compile_events_dropped": self.dropped,
        }


def _mean(steps: list[StepFacts], value: Callable[[StepFacts], int | None]) -> float | None:
    found = [value(facts) for facts in steps if value(facts) is not None]
    return sum(found) / len(found) if found else None  # type: ignore[arg-type]


def _cut_site(frames: list[tuple[str, int]]) -> tuple[str, int] | None:
    """The frame that cut the graph: the innermost one outside torch_xla (``frames`` go
    innermost first), e.g. the backend's ``torch_xla.sync()`` call after each step."""
    outside = [frame for frame in frames if f"{os.sep}torch_xla{os.sep}" not in frame[0]]
    return outside[0] if outside else None


def _cache_file(graph_hash: str) -> str:
    """The persistent-cache file of a graph: the hash's decimal form (seen in torch_xla 2.9)."""
    try:
        return str(int(graph_hash, 16))
    except ValueError:
        return graph_hash


def join_dynamo(events: list[Event]) -> None:
    """xla-compile: give each XLA compile that Dynamo caused its Dynamo compile's id and
    cause, and each Dynamo compile the hash of the graph it lowered to.

    torch_xla's bridge compiles twice per Dynamo compile, in order: a sync of the input
    graphs, then the FX graph lowered to HLO. Within a step, the lowering compiles are
    paired with the Dynamo and AOT-backward compiles in the order both happened.
    """
    steps = sorted({event.step for event in events if event.step is not None})
    for step in steps:
        here = [event for event in events if event.step == step]
        dynamo = [e for e in here if e.event == "compile" and e.layer in ("dynamo", "aot_backward")]
        lowered = [e for e in here if e.layer == "xla" and "dynamo" in (e.raw or "")]
        owner: Event | None = None
        pending = iter(dynamo)
        for xla_event in lowered:
            if "input graphs" in (xla_event.raw or "") or owner is None:
                owner = next(pending, owner)
            if owner is None:
                break
            xla_event.compile_id, xla_event.cause = owner.compile_id, owner.cause
            if "FX graph to HLO" in (xla_event.raw or "") and owner.graph_id is None:
                owner.graph_id = xla_event.graph_id


class XlaCompileCaptures(Captures):
    """xla-compile: the XLA capture first (its seconds are the run's), Dynamo's beside it,
    joined at the end (:func:`join_dynamo`)."""

    def finish(self) -> None:
        super().finish()
        join_dynamo(self.events)
