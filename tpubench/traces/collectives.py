"""Time in collectives per device per step, from a run's profiler trace.

The runs columns ``collective_ms``, ``collective_share``, ``exposed_collective_ms`` and
``exposed_collective_share`` (:func:`columns`). Each device's events are split into
communication and compute intervals, and :mod:`tpubench.analysis.collectives` takes their
unions (an overlap of two events counts once) and the exposed part (communication while no
compute ran on that device).

Which events are which, by trace:

- **Chrome trace of a CUDA rank**: the device's kernels. NCCL kernels are communication,
  every other kernel is compute (memcpy and memset are neither, as in HTA). Host-side
  c10d ops only launch them.
- **Chrome trace of a CPU rank (gloo)**: the process is the device. Communication is the
  communication ops themselves, on any thread: ``c10d::*`` ops, ``gloo:*`` annotations on
  gloo's worker threads, ``record_param_comms``, ``nccl:*``; never the framework's
  wrappers (``FSDP::all_gather``) nor FSDP's local copies (``fsdp::all_gather_copy_in``),
  which would count copy time as communication. Compute is the host ops whose category is
  arithmetic (matmul, attention, elementwise...).
- **XProf trace**: one SPMD process drives every device. A device plane
  (``/device:TPU:i``) is one device: its ``XLA Ops`` line (or its streams on a GPU). On
  PJRT CPU there is no device plane and each virtual device runs its ops on its own
  ``tf_XLAPjRtCpuClient`` thread, so each thread is a timeline. Collectives are the HLO
  collectives; an asynchronous one spans from its ``*-start`` to its ``*-done``.

A rank's Chrome trace holds its own device, an XProf trace the devices of its device planes,
and a PJRT CPU trace (no device plane) all ``devices`` of the SPMD run: sums are divided by
how many devices the trace holds (an average device). Step times come from the traced
steps (``profile_steps``); shares are of the run's median step.
"""

from __future__ import annotations

import functools
import gzip
import re
from array import array
from collections import defaultdict
from pathlib import Path
from typing import IO, Any

import numpy as np

from tpubench.analysis import collectives as intervals
from tpubench.analysis.categories import categorize, hlo_category
from tpubench.traces.files import XPLANE_SUFFIX, locate
from tpubench.traces.timeline import TraceError

#: host events that are communication itself, not a wrapper around it or a copy beside it
COMM_EVENT = re.compile(r"^(c10d::|gloo:|nccl:)|^record_param_comms$")
#: the ``ops`` categories that are arithmetic on the device (HTA's compute kernels)
COMPUTE_CATEGORIES = frozenset({"matmul", "convolution", "attention", "normalization", "elementwise", "reduction"})
#: XProf device-plane lines that hold the ops (TPU), else the GPU's streams
OPS_LINE, STREAM_LINE_PREFIX = "XLA Ops", "Stream"
ASYNC_START, ASYNC_DONE = "-start", "-done"


class Device:
    """One device's communication and compute intervals (microseconds), as flat arrays of
    doubles (a few bytes per event, never a Python object per event)."""

    def __init__(self) -> None:
        self.intervals = {kind: (array("d"), array("d")) for kind in ("comm", "compute")}

    def add(self, kind: str, start: float, end: float) -> None:
        starts, ends = self.intervals[kind]
        starts.append(start)
        ends.append(end)

    def arrays(self, kind: str) -> tuple[np.ndarray, np.ndarray]:
        starts, ends = self.intervals[kind]
        return np.frombuffer(starts, dtype=np.float64), np.frombuffer(ends, dtype=np.float64)

    def collective_us(self) -> float:
        return intervals.covered(*self.arrays("comm"))

    def exposed_us(self) -> float:
        return intervals.exposed(self.arrays("comm"), self.arrays("compute"))


def columns(trace_path: str | Path, profile_steps: int, devices: int, step_ms: float | None) -> dict[str, Any]:
    """The runs table's collective columns of a profiled multi-device run: time in
    collectives per device per step (ms), the part of it not hidden behind compute, and
    both as shares of the run's median step ``step_ms``. Raises TraceError for a trace it
    cannot read."""
    files = locate(Path(trace_path))
    found: list[Device] = []
    held = 0  # how many devices the trace's timelines belong to
    for path in files:
        if path.name.endswith(XPLANE_SUFFIX):
            timelines, planes = xplane_devices(path)
            found += timelines
            held += planes or max(devices, 1)  # no device plane: PJRT CPU's threads are the run's devices
        else:
            timelines = chrome_devices(path)
            found += timelines
            held += len(timelines)  # a rank's trace: its own device
    steps = max(profile_steps or 1, 1)
    held = max(held, 1)
    collective_ms = sum(device.collective_us() for device in found) / held / steps / 1e3
    exposed_ms = sum(device.exposed_us() for device in found) / held / steps / 1e3
    share = (lambda ms: ms / step_ms) if step_ms and step_ms > 0 else (lambda ms: None)
    return {
        "collective_ms": collective_ms,
        "collective_share": share(collective_ms),
        "exposed_collective_ms": exposed_ms,
        "exposed_collective_share": share(exposed_ms),
    }


def _open(path: Path) -> IO[bytes]:
    try:
        return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")
    except OSError as error:
        raise TraceError(f"cannot read {path}: {error.strerror}") from error


@functools.cache  # a trace repeats a few hundred names over millions of events
def host_kind(name: str) -> str | None:
    """A host event's part in the accounting: "comm", "compute" or None (neither)."""
    if COMM_EVENT.search(name):
        return "comm"
    return "compute" if categorize("aten", name) in COMPUTE_CATEGORIES else None


@functools.cache
def kernel_kind(name: str) -> str:
    """A GPU kernel's part: NCCL's kernels communicate, every other kernel computes."""
    return "comm" if categorize("kernel", name) == "collective" else "compute"


def chrome_devices(path: Path) -> list[Device]:
    """The devices of a torch.profiler Chrome trace: its GPUs (by the kernels' pid) when it
    has kernels, else the process itself."""
    import ijson

    host: dict[Any, Device] = defaultdict(Device)
    gpu: dict[Any, Device] = defaultdict(Device)
    with _open(path) as stream:
        try:
            for event in ijson.items(stream, "traceEvents.item", use_float=True):
                if event.get("ph") != "X":
                    continue
                category, name = event.get("cat"), str(event.get("name", ""))
                start = float(event["ts"])
                end = start + float(event.get("dur", 0.0))
                if category == "kernel":
                    gpu[event.get("pid")].add(kernel_kind(name), start, end)
                elif category in ("cpu_op", "user_annotation") and (kind := host_kind(name)):
                    host[event.get("pid")].add(kind, start, end)
        except ijson.JSONError as error:
            raise TraceError(f"corrupt or truncated Chrome trace {path}: {error}") from error
        except (KeyError, TypeError, ValueError) as error:
            raise TraceError(f"not a torch.profiler Chrome trace {path}: an event is of the wrong shape") from error
    return list((gpu or host).values())


def xplane_devices(path: Path) -> tuple[list[Device], int]:
    """The timelines of an XProf trace, each as a Device: a device plane's ops (its ``XLA
    Ops`` line, or its streams), or on PJRT CPU each thread that runs XLA's ops; and how many
    device planes there were (0 on PJRT CPU, where threads need not map one to one to devices)."""
    from tpubench.traces.xplane import DEVICE_PLANE_PREFIX, op_lines

    lines = op_lines(path)
    by_plane: dict[str, list] = defaultdict(list)
    for line in lines:
        by_plane[line.plane].append(line)
    timelines, planes = [], 0
    for plane, found in by_plane.items():
        if not plane.startswith(DEVICE_PLANE_PREFIX):
            timelines += [[line] for line in found]  # a host thread per device
            continue
        ops = [line for line in found if line.line == OPS_LINE]
        timelines.append(ops or [line for line in found if line.line.startswith(STREAM_LINE_PREFIX)])
        planes += 1
    devices = []
    for group in timelines:
        device = Device()
        for line in group:
            _add_hlo_events(device, line.names, line.start_us, line.start_us + line.duration_us)
        devices.append(device)
    return devices, planes


def _add_hlo_events(device: Device, names: list[str], start: np.ndarray, end: np.ndarray) -> None:
    """One line's HLO ops: a collective counts from its start to its end, or for an
    asynchronous one (``all-reduce-start.3`` ... ``all-reduce-done.3``) from the start op's
    start to the done op's end; everything else on the line computes."""
    waiting: dict[str, list[tuple[float, float]]] = defaultdict(list)  # the done op's name -> starts not done
    for i in np.argsort(start, kind="stable").tolist():
        name = names[i]
        if hlo_category(name) != "collective":
            device.add("compute", float(start[i]), float(end[i]))
        elif ASYNC_START in name:
            waiting[name.replace(ASYNC_START, ASYNC_DONE, 1)].append((float(start[i]), float(end[i])))
        elif ASYNC_DONE in name and waiting.get(name):
            device.add("comm", waiting[name].pop(0)[0], float(end[i]))
        else:
            device.add("comm", float(start[i]), float(end[i]))
    for starts in waiting.values():  # a start whose done the trace cut off: its own op only
        for begin, finish in starts:
            device.add("comm", begin, finish)


#: bytes per element of the dtypes torch.profiler names in ``Input type`` (and Kineto's
#: ``record_param_comms`` ``dtype``)
DTYPE_BYTES = {
    "double": 8,
    "float": 4,
    "c10::half": 2,
    "c10::bfloat16": 2,
    "half": 2,
    "bfloat16": 2,
    "long int": 8,
    "long": 8,
    "int": 4,
    "short int": 2,
    "signed char": 1,
    "unsigned char": 1,
    "bool": 1,
    "c10::float8_e4m3fn": 1,
    "c10::float8_e5m2": 1,
}


class CommSize:
    """What the trace says about one op's collectives: calls with a known size, their bytes,
    and (for ops whose own time is the transfer's: NCCL kernels) bus-bandwidth sums."""

    def __init__(self) -> None:
        self.calls, self.bytes = 0, 0.0
        self.bus_bytes, self.transfer_us = 0.0, 0.0

    def add(self, size: float, factor: float | None, duration_us: float | None) -> None:
        self.calls += 1
        self.bytes += size
        if factor is not None and duration_us:
            self.bus_bytes += size * factor
            self.transfer_us += duration_us

    def columns(self) -> dict[str, float | None]:
        """``comm_bytes``: bytes per call (nccl-tests' S); ``busbw_gbps``: bus bandwidth
        over the calls' time, where that time is the transfer's."""
        return {
            "comm_bytes": self.bytes / self.calls if self.calls else None,
            "busbw_gbps": self.bus_bytes / self.transfer_us / 1e3 if self.transfer_us else None,
        }


def event_size(name: str, args: dict[str, Any]) -> float | None:
    """nccl-tests' S of one collective event in bytes, from its arguments: Kineto's
    ``record_param_comms`` message sizes, or a c10d op's tensor arguments (``Input Dims``
    and ``Input type``, recorded with shapes), the largest of which is S (the output of an
    all-gather, the input of a reduce-scatter, the buffer of an all-reduce)."""
    if "In msg nelems" in args or "Out msg nelems" in args:
        elements = max(float(args.get("In msg nelems") or 0), float(args.get("Out msg nelems") or 0))
        element = DTYPE_BYTES.get(str(args.get("dtype", "")).lower())
        return elements * element if element and elements else None
    if not name.startswith("c10d::"):
        return None
    sizes = []
    for dims, dtype in zip(args.get("Input Dims") or [], args.get("Input type") or [], strict=False):
        element = DTYPE_BYTES.get(str(dtype).lower())
        shapes = dims if dims and isinstance(dims[0], list) else [dims]  # a tensor list: one shape per tensor
        if element and dims and all(isinstance(d, int | float) for shape in shapes for d in shape):
            sizes.append(sum(float(np.prod(shape)) for shape in shapes) * element)
    return max(sizes) if sizes else None


class CommEvents:
    """The collective events of a Chrome trace, gathered while a reader streams its events
    (:func:`tpubench.traces.chrome.read_chrome` passes each one to :meth:`see`, so sizes cost
    no second pass over the file); :meth:`sizes` turns them into ``ops`` row columns."""

    def __init__(self) -> None:
        self.threads: dict[Any, list[tuple[float, float, str, dict[str, Any]]]] = defaultdict(list)
        self.kernels: list[tuple[str, int, float]] = []

    def see(self, category: str, name: str, start: float, duration: float, thread: Any, args: dict) -> None:
        if category == "kernel" and kernel_kind(name) == "comm":
            self.kernels.append((name, int(args.get("External id", -1)), duration))
        elif category in ("cpu_op", "user_annotation") and host_kind(name) == "comm":
            self.threads[thread].append((start, start + duration, name, args))

    def sizes(self, path: Path) -> dict[tuple[str, str], CommSize]:
        """Per ``ops`` row key (source, op): the sizes of its collectives.

        Host ops get ``comm_bytes`` from their own arguments (or the c10d op around them:
        ``record_param_comms`` inside ``c10d::allreduce_``). A host op's time is not the
        transfer's (a gloo or NCCL op returns once it has queued the work), so only NCCL
        kernels, joined to the op that launched them by ``External id``, get a bus bandwidth,
        from their own time and the group size (``Group size``, else the trace's world size).
        """
        found: dict[tuple[str, str], CommSize] = defaultdict(CommSize)
        by_external: dict[int, tuple[float, int | None]] = {}
        for events in self.threads.values():
            enclosing: list[tuple[float, float | None, int | None]] = []  # (end, size, group) of open events
            for _start, end, name, args in sorted(events, key=lambda e: (e[0], -e[1])):
                while enclosing and enclosing[-1][0] < end:
                    enclosing.pop()
                size, group = event_size(name, args), args.get("Group size")
                if size is None and enclosing:  # record_param_comms without sizes: its c10d op's
                    size, group = enclosing[-1][1], group or enclosing[-1][2]
                enclosing.append((end, size, group))
                if size is None:
                    continue
                found[("aten", name)].add(size, None, None)
                if "External id" in args:
                    by_external[int(args["External id"])] = (size, int(group) if group else None)
        world = _world_size(path) if any(external in by_external for _, external, _ in self.kernels) else None
        for name, external, duration in self.kernels:
            if external in by_external:
                size, group = by_external[external]
                kind, group = intervals.collective_kind(name), group or world
                factor = intervals.busbw_factor(kind, int(group)) if kind and group else None
                found[("kernel", name)].add(size, factor, duration)
        return dict(found)


def chrome_comm_sizes(path: str | Path) -> dict[tuple[str, str], CommSize]:
    """:meth:`CommEvents.sizes` of the Chrome trace at ``path``: its ops' collective sizes."""
    import ijson

    path, events = Path(path), CommEvents()
    with _open(path) as stream:
        try:
            for item in ijson.items(stream, "traceEvents.item", use_float=True):
                if item.get("ph") == "X":
                    thread = (item.get("pid"), item.get("tid"))
                    start, duration = float(item["ts"]), float(item.get("dur", 0.0))
                    events.see(
                        item.get("cat"), str(item.get("name", "")), start, duration, thread, item.get("args") or {}
                    )
        except ijson.JSONError as error:
            raise TraceError(f"corrupt or truncated Chrome trace {path}: {error}") from error
        except (KeyError, TypeError, ValueError) as error:
            raise TraceError(f"not a torch.profiler Chrome trace {path}: an event is of the wrong shape") from error
    return events.sizes(path)


def _world_size(path: Path) -> int | None:
    """The ``world_size`` Kineto writes in the trace's ``distributedInfo`` (before the events)."""
    import ijson

    with _open(path) as stream:
        try:
            info = next(ijson.items(stream, "distributedInfo"), None)
        except ijson.JSONError:
            return None
    return int(info["world_size"]) if isinstance(info, dict) and info.get("world_size") else None
