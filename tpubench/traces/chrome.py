"""torch.profiler Chrome traces (``trace.json``, also gzipped): per-op totals, streamed.

Host-side events (``cpu_op``, ``user_annotation``, CUDA runtime calls) become ``aten``
rows with self time from their nesting on each thread, which is how ``key_averages()``
counts it (the tests compare the two). GPU events (``kernel``, ``gpu_memcpy``,
``gpu_memset``) become ``kernel`` rows, each joined to the CPU op that launched it: the
kernel's ``correlation`` names a runtime call, whose ``External id`` names the op. The CPU
op's row gets that kernel time as ``device_us`` (its self device time).

The file is read one event at a time (:mod:`tpubench.traces.jsonstream`), and events are
kept as a few numbers each, so memory follows the number of events, not the JSON's size.
``ProfilerStep#N`` annotations (torch.profiler's schedule) mark steps when present.
"""

from __future__ import annotations

import gzip
import marshal
import re
from array import array
from pathlib import Path
from typing import IO

import numpy as np

from tpubench.traces.collectives import CommEvents
from tpubench.traces.counts import NO_WORK, freeze
from tpubench.traces.jsonstream import JSONStreamError, trace_events
from tpubench.traces.timeline import (
    NESTING_TOLERANCE_US,
    OpTotals,
    ShapeCalls,
    Timelines,
    TraceError,
    TraceOps,
    self_times,
)

HOST_CATEGORIES = frozenset({"cpu_op", "user_annotation", "cuda_runtime", "cuda_driver"})
DEVICE_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
STEP_MARKER = re.compile(r"ProfilerStep#\d+")


class _Interned:
    """Names as small integers, so that a million events hold a million ints, not strings."""

    def __init__(self) -> None:
        self.ids: dict[object, int] = {}

    def __call__(self, key: object) -> int:
        found = self.ids.get(key)
        if found is None:
            found = self.ids[key] = len(self.ids)
        return found

    def names(self) -> list:
        return sorted(self.ids, key=self.ids.__getitem__)


def _open(path: Path) -> IO[str]:
    try:
        if path.suffix == ".gz":
            return gzip.open(path, "rt", encoding="utf-8", newline="")
        return open(path, encoding="utf-8", newline="")
    except OSError as error:
        raise TraceError(f"cannot read {path}: {error.strerror}") from error


def read_chrome(path: Path) -> TraceOps:
    """Per-op totals of a torch.profiler Chrome trace."""
    host, device = Timelines(), Timelines()
    names, threads = _Interned(), _Interned()
    # the kernel -> runtime call -> CPU op join, as parallel arrays
    op_external, op_of_external = array("q"), array("q")  # CPU op events: External id, name id
    call_correlation, call_external = array("q"), array("q")  # runtime calls
    kernel_correlation, kernel_external = array("q"), array("q")  # one each per device event
    steps: list[tuple[float, float]] = []
    comm = CommEvents()
    signatures = _Signatures()  # (op name, recorded inputs) of cpu_op events recorded with shapes
    host_signature = array("q")  # per host event: its signature id, or -1
    host_is_op = array("b")  # per host event: an op (cpu_op) that does work, whose nesting makes a call no leaf
    kernel_counts: dict[int, list[float]] = {}  # device event's name id -> Inductor's FLOPs and GB, summed
    origin = None
    seen_events = False
    with _open(path) as stream:
        try:
            for event in trace_events(stream):
                seen_events = True
                if event.get("ph") != "X":
                    continue
                category = event.get("cat")
                on_device = category in DEVICE_CATEGORIES
                if not on_device and category not in HOST_CATEGORIES:
                    continue
                ts, duration = float(event["ts"]), float(event.get("dur", 0.0))
                if origin is None:
                    origin = ts  # times relative to the first event keep their nanoseconds
                name, args, thread = event["name"], event.get("args") or {}, (event.get("pid"), event.get("tid"))
                comm.see(category, name, ts, duration, thread, args)
                if category == "user_annotation" and STEP_MARKER.fullmatch(name):
                    steps.append((ts - origin, ts - origin + duration))
                    continue
                timelines = device if on_device else host
                timelines.timeline.append(threads(thread))
                timelines.start.append(ts - origin)
                timelines.duration.append(duration)
                if on_device:
                    kernel = names(("kernel", name))
                    timelines.op.append(kernel)
                    kernel_correlation.append(int(args.get("correlation", -1)))
                    kernel_external.append(int(args.get("External id", -1)))
                    if "kernel_flop" in args or "kernel_num_gb" in args:
                        _add_kernel_counts(kernel_counts, kernel, args)
                    continue
                op = names(("aten", name))
                timelines.op.append(op)
                if category == "cpu_op":
                    host_signature.append(signatures.of(name, args) if "Input Dims" in args else -1)
                    host_is_op.append(name not in NO_WORK)
                    if "External id" in args:
                        op_external.append(int(args["External id"]))
                        op_of_external.append(op)
                    continue
                host_signature.append(-1)
                host_is_op.append(False)
                if category != "user_annotation" and "correlation" in args:  # a CUDA runtime or driver call
                    call_correlation.append(int(args["correlation"]))
                    call_external.append(int(args.get("External id", -1)))
        except (JSONStreamError, UnicodeDecodeError, EOFError, gzip.BadGzipFile) as error:  # EOFError: a cut .gz
            raise TraceError(f"corrupt or truncated Chrome trace {path}: {error}") from error
        except (AttributeError, KeyError, TypeError, ValueError) as error:  # an event of the wrong shape
            what = f"lacks {error}" if isinstance(error, KeyError) else f"is of the wrong shape ({error})"
            raise TraceError(f"not a torch.profiler Chrome trace {path}: an event {what}") from error
    if not seen_events:
        raise TraceError(f"not a Chrome trace {path}: no traceEvents")
    keys = names.names()
    launcher = _launchers(
        kernel_correlation, kernel_external, call_correlation, call_external, op_external, op_of_external
    )
    ops = _host_ops(host, keys, device, launcher) + _kernel_ops(device, keys, launcher, kernel_counts)
    _add_shapes(ops, host, host_signature, host_is_op, signatures.names())
    span = _span(host, device)
    sizes = comm.sizes(path)
    if steps:
        begin = min(start for start, _ in steps)
        step_time = max(max(end for _, end in steps), begin + (span or 0)) - begin
        return TraceOps("chrome trace", ops, len(steps), step_time, devices=1, comm_sizes=sizes)
    return TraceOps("chrome trace", ops, None, span, devices=1, comm_sizes=sizes)  # a process's: its own device


def _span(*timelines: Timelines) -> float | None:
    """From the first event's start to the last event's end, over all timelines."""
    starts, ends = [], []
    for events in timelines:
        if len(events):
            start = np.frombuffer(events.start, dtype=np.float64)
            starts.append(start.min())
            ends.append((start + np.frombuffer(events.duration, dtype=np.float64)).max())
    return float(max(ends) - min(starts)) if starts else None


def _launchers(
    kernel_correlation: array,
    kernel_external: array,
    call_correlation: array,
    call_external: array,
    op_external: array,
    op_of: array,
) -> np.ndarray:
    """For each device event, the name id of the CPU op that launched it, or -1.

    The runtime call with the kernel's correlation id names the op (its External id);
    where no call matches, the kernel's own External id, which Kineto also records.
    """
    kernels = np.frombuffer(kernel_correlation, dtype=np.int64)
    if not len(kernels) or not len(op_external):
        return np.full(len(kernels), -1, dtype=np.int64)
    external = np.frombuffer(kernel_external, dtype=np.int64).copy()
    if len(call_correlation):
        via_call = _lookup(kernels, np.frombuffer(call_correlation, dtype=np.int64), np.frombuffer(call_external, "q"))
        external = np.where(via_call >= 0, via_call, external)
    return _lookup(external, np.frombuffer(op_external, dtype=np.int64), np.frombuffer(op_of, dtype=np.int64))


def _lookup(wanted: np.ndarray, keys: np.ndarray, values: np.ndarray) -> np.ndarray:
    """``values`` at ``wanted``'s positions in ``keys`` (the last one, for a repeated key), -1 where absent."""
    order = np.argsort(keys, kind="stable")
    keys, values = keys[order], values[order]
    at = np.searchsorted(keys, wanted, side="right") - 1
    hit = (at >= 0) & (keys[np.clip(at, 0, None)] == wanted)
    return np.where(hit, values[np.clip(at, 0, None)], -1)


def _host_ops(host: Timelines, keys: list, device: Timelines, launcher: np.ndarray) -> list[OpTotals]:
    calls, total, own = host.totals(len(keys))
    device_time = None
    if len(device):
        launched = launcher >= 0
        duration = np.frombuffer(device.duration, dtype=np.float64)
        device_time = np.bincount(launcher[launched], weights=duration[launched], minlength=len(keys))
    return [
        OpTotals(
            "aten",
            name,
            int(calls[i]),
            float(own[i]),
            float(total[i]),
            device_us=float(device_time[i]) if device_time is not None else None,
        )
        for i, (source, name) in enumerate(keys)
        if source == "aten" and calls[i]
    ]


def _kernel_ops(
    device: Timelines, keys: list, launcher: np.ndarray, counts: dict[int, list[float]] | None = None
) -> list[OpTotals]:
    """One row per (kernel, launching op): kernels do not nest, so self time is their time.

    An Inductor kernel whose launches carry ``kernel_flop``/``kernel_num_gb`` (Inductor
    records them with ``benchmark_kernel``) gets their sums, split over its rows by calls."""
    if not len(device):
        return []
    kernel = np.frombuffer(device.op, dtype=np.int64)
    duration = np.frombuffer(device.duration, dtype=np.float64)
    pairs, index = np.unique(np.stack([kernel, launcher]), axis=1, return_inverse=True)
    calls = np.bincount(index, minlength=pairs.shape[1])
    time = np.bincount(index, weights=duration, minlength=pairs.shape[1])
    all_calls = np.bincount(kernel, minlength=len(keys))
    rows = []
    for i, (k, op) in enumerate(pairs.T.tolist()):
        row = OpTotals(
            "kernel",
            keys[k][1],
            int(calls[i]),
            float(time[i]),
            float(time[i]),
            framework_op=keys[op][1] if op >= 0 else None,
            device_us=float(time[i]),
        )
        if counts and k in counts:
            flops, gb, flop_calls, gb_calls = counts[k]
            share = calls[i] / all_calls[k]
            if flop_calls == all_calls[k]:  # every launch said: a sum, never a part passed off as the whole
                row.flops, row.flops_source = flops * share, "inductor kernel_flop"
            if gb_calls == all_calls[k]:
                row.bytes_accessed, row.bytes_source = gb * 1e9 * share, "inductor kernel_num_gb"
        rows.append(row)
    return rows


def _add_kernel_counts(counts: dict[int, list[float]], kernel: int, args: dict) -> None:
    """Add one launch's Inductor figures to its kernel's: FLOPs, GB, and how many launches gave each."""
    found = counts.setdefault(kernel, [0.0, 0.0, 0, 0])
    if (flop := args.get("kernel_flop")) is not None:
        found[0] += float(flop)
        found[2] += 1
    if (gb := args.get("kernel_num_gb")) is not None:
        found[1] += float(gb)
        found[3] += 1


class _Signatures(_Interned):
    """Op events' identities with their recorded inputs, (name, dims, types, strides,
    concrete) as :func:`counts.freeze` makes them, as small integers: calls with the same one
    count the same.

    Freezing each event's nested lists to hash them took half of a warm ingest (six million
    recursive calls for a 100 MB trace), so an event is looked up by its inputs' ``marshal``
    bytes (C, one call) and frozen only when those are new: a trace repeats a few hundred.
    Equal inputs that marshal differently (an interned string, 1 against 1.0) freeze equal
    and share the id, as before."""

    def __init__(self) -> None:
        super().__init__()
        self.by_bytes: dict[bytes, int] = {}

    def of(self, name: str, args: dict) -> int:
        get = args.get
        inputs = (name, get("Input Dims"), get("Input type"), get("Input Strides"), get("Concrete Inputs"))
        key = marshal.dumps(inputs, 2)  # version 2: no back-references, so equal values write the same
        found = self.by_bytes.get(key)
        if found is None:
            found = self.by_bytes[key] = self(freeze(list(inputs)))
        return found


def _add_shapes(ops: list[OpTotals], host: Timelines, signature: array, is_op: array, names: list) -> None:
    """Give each aten row recorded with shapes its calls by recorded inputs (ShapeCalls).

    A call is a *leaf* when no other op (``cpu_op``) runs inside it on its thread; runtime
    calls (``cudaLaunchKernel``), annotations and ops that do no work (``counts.NO_WORK``:
    views, allocations) inside it do not count. Those ops are leaves themselves."""
    if not names:
        return
    sig = np.frombuffer(signature, dtype=np.int64)
    op_event = np.frombuffer(is_op, dtype=np.int8).astype(bool)
    timeline = np.frombuffer(host.timeline, dtype=np.int64)[op_event]
    start = np.frombuffer(host.start, dtype=np.float64)[op_event]
    duration = np.frombuffer(host.duration, dtype=np.float64)[op_event]
    order = np.lexsort((-duration, start, timeline))
    op_own = np.empty(len(order))
    op_own[order] = self_times(timeline[order], start[order], duration[order])
    leaf = np.ones(len(sig), dtype=bool)
    leaf[op_event] = duration - op_own <= NESTING_TOLERANCE_US
    recorded = sig >= 0
    calls = np.bincount(sig[recorded], minlength=len(names))
    leaf_calls = np.bincount(sig[recorded & leaf], minlength=len(names))
    own = np.bincount(sig[recorded], weights=host.own()[recorded], minlength=len(names))
    by_op: dict[str, list[ShapeCalls]] = {}
    for i, (name, dims, types, strides, concrete) in enumerate(names):
        by_op.setdefault(name, []).append(
            ShapeCalls(dims, types, strides, concrete, int(calls[i]), int(leaf_calls[i]), float(own[i]))
        )
    for row in ops:
        if row.source == "aten" and row.op in by_op:
            row.shapes = by_op[row.op]
