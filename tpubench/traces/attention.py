"""Which attention kernel a traced step ran, and attention's share of that step.

The kernel is read from the names of the ops the trace holds (:data:`KERNELS`), never from
what was asked for. The share is attention's time over the traced span, with attention
found by the op categories (:func:`tpubench.analysis.categories.categorize`):

- In a torch.profiler Chrome trace, an op named as attention (``aten::scaled_dot_product_
  attention``, ``aten::_scaled_dot_product_flash_attention_for_cpu``, ``flex_attention``,
  a kernel named ``flash``/``fmha``) counts with everything it runs inside it, so SDPA's math
  path (its bmm and softmax, which are matmul and reduction ops of their own) is attention
  here. Its backward has no attention op to nest in: an autograd node counts when its
  ``Sequence number`` is that of a forward op that ran inside attention (how Kineto links a
  backward node to its forward op). On a GPU the share is the device time of the kernels
  those ops launched, over the span; on a CPU, the host time of the ops.
- In an XProf trace (xla, tpu) the ``ops`` rows' attention category, self time over the step.

A compiler that fuses attention's math into kernels named after other ops (Inductor's
``cpp_fused__softmax_...`` for a compiled math path) leaves nothing here to find: the share
is then null rather than a figure that misses the attention it could not see.
"""

from __future__ import annotations

import gzip
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpubench.analysis.categories import categorize
from tpubench.traces.chrome import DEVICE_CATEGORIES, HOST_CATEGORIES
from tpubench.traces.files import XPLANE_SUFFIX, locate
from tpubench.traces.jsonstream import JSONStreamError, trace_events
from tpubench.traces.timeline import TraceError

#: an op's name -> the kernel it is, first match wins (the most specific names first)
KERNELS = (
    # Inductor's C++ template kernel: flex attention's in tpubench's CPU graphs (categories.ATEN_RULES)
    ("flex", re.compile(r"flex_attention|flex_attn|_flex_|^graph_\d+_kernel$", re.IGNORECASE)),
    ("splash", re.compile(r"splash", re.IGNORECASE)),
    ("cudnn", re.compile(r"cudnn_attention|cudnn.*(fmha|sdpa|attn)", re.IGNORECASE)),
    ("cpu-flash", re.compile(r"flash_attention_for_cpu")),
    ("efficient", re.compile(r"efficient_attention|fmha_cutlass|mem_eff|fmha_", re.IGNORECASE)),
    ("flash", re.compile(r"flash", re.IGNORECASE)),
    ("math", re.compile(r"_scaled_dot_product_attention_math")),
)
BACKWARD_NODE = "autograd::engine::evaluate_function: "


@dataclass(frozen=True)
class AttentionFound:
    """What a trace says about attention: the kernels that ran (``flash``, ``math``, ``flex``...,
    several joined by ``+``; None where no attention op was seen) and their share of the step."""

    kernel: str | None
    share: float | None


def kernel_of(names: set[str]) -> str | None:
    """The kernels that ``names`` (attention ops' names) ran, ``+``-joined; None for none."""
    found = set()
    for name in names:
        kernel = next((kernel for kernel, pattern in KERNELS if pattern.search(name)), None)
        if kernel is not None:
            found.add(kernel)
        elif "scaled_dot_product_attention" not in name:  # SDPA's dispatcher names no kernel
            found.add("other")  # attention all the same: said, not dropped
    return "+".join(sorted(found)) or None


def read(trace_path: str | Path) -> AttentionFound:
    """Attention's kernel and share of the traced steps at ``trace_path`` (a Chrome trace
    file, or an XProf logdir). Raises TraceError for a trace that cannot be read."""
    files = locate(Path(trace_path))
    if files[0].name.endswith(XPLANE_SUFFIX):
        return _from_ops(trace_path)
    return _from_chrome(files[0])


def _from_ops(trace_path: str | Path) -> AttentionFound:
    """An XProf trace: through the ``ops`` rows, whose categories it already has."""
    from tpubench.traces import ingest

    rows = ingest(trace_path)
    attention = [row for row in rows if row["category"] == "attention"]
    step = next((row["step_time_us"] for row in rows if row["step_time_us"]), None)
    share = sum(row["self_time_us"] for row in attention) / step if step and attention else None
    return AttentionFound(kernel_of({row["op"] for row in attention}), share)


@dataclass
class _Op:
    thread: Any
    start: float
    end: float
    name: str
    sequence: int | None
    external: int | None


def _events(path: Path) -> list[dict[str, Any]]:
    try:
        with gzip.open(path, "rt") if path.suffix == ".gz" else open(path) as stream:
            return [event for event in trace_events(stream) if event.get("ph") == "X"]
    except (OSError, JSONStreamError, UnicodeDecodeError, EOFError) as error:
        raise TraceError(f"cannot read the Chrome trace {path}: {error}") from error


def _from_chrome(path: Path) -> AttentionFound:
    events = _events(path)
    ops = [
        _Op(
            (event.get("pid"), event.get("tid")),
            float(event["ts"]),
            float(event["ts"]) + float(event.get("dur", 0.0)),
            event["name"],
            (event.get("args") or {}).get("Sequence number"),
            (event.get("args") or {}).get("External id"),
        )
        for event in events
        if event.get("cat") == "cpu_op"
    ]
    kernels = [event for event in events if event.get("cat") == "kernel"]
    timed = [e for e in events if e.get("cat") in HOST_CATEGORIES | DEVICE_CATEGORIES]  # not the session's own
    spans = [(float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0))) for e in timed]
    if not spans:
        raise TraceError(f"no events in the Chrome trace {path}")
    span = max(end for _, end in spans) - min(start for start, _ in spans)
    named = {op.name for op in ops if categorize("aten", op.name) == "attention"}
    named |= {e["name"] for e in kernels if categorize("kernel", e["name"]) == "attention"}
    inside = _inside_attention(ops)
    if kernels:
        launched = {op.external for op in inside if op.external is not None}
        busy = [
            (float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0)))
            for e in kernels
            if (e.get("args") or {}).get("External id") in launched or categorize("kernel", e["name"]) == "attention"
        ]
    else:
        busy = [(op.start, op.end) for op in inside]
    attended = sum(_union(intervals) for intervals in _by_thread(busy, inside, bool(kernels)).values())
    share = attended / span if attended and span > 0 else None
    return AttentionFound(kernel_of(named), share)


def _by_thread(busy: list[tuple[float, float]], inside: list[_Op], on_device: bool) -> dict[Any, list]:
    """Intervals per timeline: the device's one stream of kernels, or each host thread's ops."""
    if on_device:
        return {"device": busy}
    threads: dict[Any, list] = defaultdict(list)
    for op, interval in zip(inside, busy, strict=True):
        threads[op.thread].append(interval)
    return threads


def _inside_attention(ops: list[_Op]) -> list[_Op]:
    """The ops that ran as attention: an attention op and the ops nested in it on its thread
    (forward), and the backward nodes whose sequence number is one of theirs, with the ops
    nested in those."""
    outer = _nested_in(ops, lambda op: categorize("aten", op.name) == "attention")
    forward_sequences = {op.sequence for op in outer if op.sequence is not None and not _is_backward(op.name)}
    backward = _nested_in(ops, lambda op: op.name.startswith(BACKWARD_NODE) and op.sequence in forward_sequences)
    seen = {id(op) for op in outer}
    return outer + [op for op in backward if id(op) not in seen]


def _is_backward(name: str) -> bool:
    return name.startswith(BACKWARD_NODE) or name.endswith("Backward0")


def _nested_in(ops: list[_Op], is_root: Any) -> list[_Op]:
    """The ops for which ``is_root`` holds, and every op inside one of them on the same thread."""
    found: list[_Op] = []
    by_thread: dict[Any, list[_Op]] = defaultdict(list)
    for op in ops:
        by_thread[op.thread].append(op)
    for thread_ops in by_thread.values():
        thread_ops.sort(key=lambda op: (op.start, -op.end))
        open_until = float("-inf")
        for op in thread_ops:
            if op.start < open_until:
                found.append(op)
            elif is_root(op):
                found.append(op)
                open_until = op.end
    return found


def _union(intervals: list[tuple[float, float]]) -> float:
    """The time covered by ``intervals``, overlaps once."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total
