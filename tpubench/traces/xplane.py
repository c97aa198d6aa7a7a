"""XProf xplane traces (``*.xplane.pb``: torch_xla, TorchTPU): per-op totals.

Two readers, by what the trace holds:

- **A device plane** (``/device:TPU:0``, ``/device:GPU:0``): XProf's own converter
  (``xspace_to_tool_data(..., "hlo_stats")``) computes per-HLO-op self time, FLOPs,
  bandwidth and what bounds each op; its figures are taken as they are, never derived
  again. It writes cache files next to the trace it reads, so it reads a link to the
  trace from a scratch folder.
- **No device plane** (PJRT CPU): the converter's tables are empty, so the raw events
  are read: XLA's thunk events (those with an ``hlo_op`` stat) on the host plane's
  threads, with self time = own duration minus nested ops (``call.*`` contains others).

The raw events are streamed. ``xprof.profile_data.ProfileData`` parses the whole XSpace
in memory and wraps every event in Python objects: on an 11.5 MB PJRT CPU trace it needed
98 MB beyond the interpreter and ran at 1.8 MB/s. Here the file is walked at the protobuf
wire level instead: plane and line headers are found by seeking past the events, then
each line's events are parsed in blocks of a few MB (by protobuf's C parser, upb, with the
subset of the xplane schema below) into flat arrays. Memory stays bounded by a block plus
a few numbers per op event. The tests hold it against ``ProfileData`` on a real trace.
"""

from __future__ import annotations

import functools
import json
import os
import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
from google.protobuf import descriptor_pb2, descriptor_pool, message, message_factory

from tpubench.traces.timeline import OpTotals, ShapeCalls, TraceError, TraceOps, self_times

#: bytes of events parsed at a time
BLOCK_BYTES = 4 << 20
#: stat names (XStatMetadata.name) the reader looks for
HLO_OP, HLO_MODULE, STEP_NUM = "hlo_op", "hlo_module", "step_num"
#: XPlane names of accelerators; a trace with one goes to XProf's converter
DEVICE_PLANE_PREFIX = "/device:"
#: one accelerator's plane (``/device:TPU:3``), as opposed to ``/device:TPU_NON_CORE``...
DEVICE_PLANE = re.compile(r"/device:[A-Z]+:\d+")

_VARINT, _FIXED64, _LENGTH, _FIXED32 = 0, 1, 2, 5
_EVENT_TAG = (4 << 3) | _LENGTH  # XLine.events = 4


@functools.cache
def _messages() -> dict[str, type[message.Message]]:
    """The subset of XProf's xplane.proto (tsl/profiler/protobuf/xplane.proto) this reader
    needs, as message classes: same field numbers and types, names read as bytes (so a
    name that is not UTF-8 cannot fail a parse), maps as their repeated entry messages."""
    f = descriptor_pb2.FieldDescriptorProto
    scalar = {
        "int64": f.TYPE_INT64,
        "uint64": f.TYPE_UINT64,
        "double": f.TYPE_DOUBLE,
        "bytes": f.TYPE_BYTES,
    }
    layouts: dict[str, list[tuple[str, int, str, bool]]] = {  # name, number, type, repeated
        "XStat": [
            ("metadata_id", 1, "int64", False),
            ("double_value", 2, "double", False),
            ("uint64_value", 3, "uint64", False),
            ("int64_value", 4, "int64", False),
            ("str_value", 5, "bytes", False),
            ("bytes_value", 6, "bytes", False),
            ("ref_value", 7, "uint64", False),
        ],
        "XEvent": [
            ("metadata_id", 1, "int64", False),
            ("offset_ps", 2, "int64", False),
            ("duration_ps", 3, "int64", False),
            ("stats", 4, "XStat", True),
        ],
        "EventBlock": [("events", 4, "XEvent", True)],  # a run of XLine.events
        "XEventMetadata": [("id", 1, "int64", False), ("name", 2, "bytes", False), ("stats", 5, "XStat", True)],
        "XStatMetadata": [("id", 1, "int64", False), ("name", 2, "bytes", False)],
        "EventMetadataEntry": [("key", 1, "int64", False), ("value", 2, "XEventMetadata", False)],
        "StatMetadataEntry": [("key", 1, "int64", False), ("value", 2, "XStatMetadata", False)],
        "PlaneHeader": [  # XPlane without its lines
            ("name", 2, "bytes", False),
            ("event_metadata", 4, "EventMetadataEntry", True),
            ("stat_metadata", 5, "StatMetadataEntry", True),
        ],
        "LineHeader": [("name", 2, "bytes", False), ("timestamp_ns", 3, "int64", False)],  # XLine without events
    }
    package = "tpubench.xplane_subset"
    proto = descriptor_pb2.FileDescriptorProto(name="tpubench_xplane_subset.proto", package=package, syntax="proto3")
    for name, fields in layouts.items():
        described = proto.message_type.add(name=name)
        if name == "XStat":
            described.oneof_decl.add(name="value")
        for field_name, number, kind, repeated in fields:
            entry = described.field.add(
                name=field_name, number=number, label=f.LABEL_REPEATED if repeated else f.LABEL_OPTIONAL
            )
            if kind in scalar:
                entry.type = scalar[kind]
            else:
                entry.type, entry.type_name = f.TYPE_MESSAGE, f".{package}.{kind}"
            if name == "XStat" and number > 1:
                entry.oneof_index = 0
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.{name}")) for name in layouts}


def _parse(kind: str, data: bytes) -> Any:
    try:
        return _messages()[kind].FromString(data)
    except message.DecodeError as error:
        raise TraceError(f"corrupt xplane: cannot decode an {kind}: {error}") from error


def _varint(buffer: bytes, pos: int) -> tuple[int, int]:
    """The varint at ``pos`` and the position after it; IndexError if ``buffer`` ends inside it."""
    value = shift = 0
    while True:
        byte = buffer[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise TraceError("corrupt xplane: a varint longer than 10 bytes")


class _File:
    """Random access to the trace file a field at a time: headers only, never events."""

    def __init__(self, stream: BinaryIO, size: int):
        self.stream, self.size = stream, size

    def read_at(self, pos: int, n: int) -> bytes:
        self.stream.seek(pos)
        data = self.stream.read(n)
        if len(data) < n:
            raise TraceError(f"truncated xplane: {self.size} bytes, a field at byte {pos} runs past the end")
        return data

    def field(self, pos: int, end: int) -> tuple[int, int, int, int]:
        """The field at ``pos``: (number, wire type, where its value starts, where it ends)."""
        number, wire, value, after = _field(self.read_at(pos, min(20, end - pos)), 0)
        if pos + after > end:
            raise TraceError(f"truncated xplane: a field at byte {pos} runs past the end of its message")
        return number, wire, pos + value, pos + after


def _field(buffer: bytes, pos: int) -> tuple[int, int, int, int]:
    """The field at ``pos`` of ``buffer``: (number, wire type, value start, field end).

    Raises IndexError when ``buffer`` ends inside the field's tag or length (read more);
    the field's value itself may run past the buffer's end (``field end`` says so).
    """
    tag, at = _varint(buffer, pos)
    number, wire = tag >> 3, tag & 7
    if wire == _LENGTH:
        length, value = _varint(buffer, at)
        return number, wire, value, value + length
    if wire == _VARINT:
        return number, wire, at, _varint(buffer, at)[1]
    if wire in (_FIXED64, _FIXED32):
        return number, wire, at, at + (8 if wire == _FIXED64 else 4)
    raise TraceError(f"corrupt xplane: wire type {wire}, which xplane.proto does not use")


@dataclass
class _Plane:
    name: str
    header: Any  # PlaneHeader: the name and the metadata maps
    lines: list[tuple[int, int]] = field(default_factory=list)  # (offset, length) of each XLine


def _index(stream: BinaryIO, size: int) -> list[_Plane]:
    """Every plane's name and metadata, and where its lines are, without reading any event."""
    file, planes, pos = _File(stream, size), [], 0
    while pos < size:
        number, wire, value, after = _checked(file.field, pos, size)
        if number == 1 and wire == _LENGTH:  # XSpace.planes
            planes.append(_plane(file, value, after))
        pos = after
    if not planes:
        raise TraceError("not an xplane: no XPlane in the file")
    return planes


def _plane(file: _File, pos: int, end: int) -> _Plane:
    lines, header = [], bytearray()
    while pos < end:
        number, wire, value, after = _checked(file.field, pos, end)
        if number == 3 and wire == _LENGTH:  # XPlane.lines: where they are, read later
            lines.append((value, after - value))
        else:
            header += file.read_at(pos, after - pos)
        pos = after
    parsed = _parse("PlaneHeader", bytes(header))
    return _Plane(parsed.name.decode("utf-8", "replace"), parsed, lines)


def _checked(read: Any, pos: int, end: int) -> tuple[int, int, int, int]:
    try:
        return read(pos, end)
    except IndexError as error:
        raise TraceError(f"truncated xplane: a field at byte {pos} runs past the end") from error


@dataclass
class _Block:
    """Whole XLine.events entries read from the file: the bytes, and where each entry starts
    (at ``starts[i] - base`` in ``data``)."""

    data: bytes
    starts: list[int]
    base: int


def _event_blocks(stream: BinaryIO, offset: int, length: int) -> Iterator[_Block | bytes]:
    """One XLine's fields in file order: a _Block of whole events (about BLOCK_BYTES), or the
    bytes of a field that is not an event (the line's name and timestamp).

    The step from one event to the next (its tag and length) is the only per-event work
    done in Python; :func:`_decode` reads the events' fields with numpy.
    """
    end, read_to, buffer, pos = offset + length, offset, b"", 0
    stream.seek(offset)

    def more(at_least: int) -> None:
        nonlocal buffer, pos, read_to
        if read_to >= end:
            raise TraceError(f"truncated xplane: the line at byte {offset} ends inside a field")
        data = stream.read(min(max(BLOCK_BYTES, at_least), end - read_to))
        if not data:
            raise TraceError(f"truncated xplane: the file ends inside the line at byte {offset}")
        buffer, pos, read_to = buffer[pos:] + data, 0, read_to + len(data)

    while pos < len(buffer) or read_to < end:
        if pos == len(buffer):
            more(0)
        try:
            number, wire, _, after = _field(buffer, pos)
        except IndexError:
            more(0)
            continue
        if after > len(buffer):
            more(after - len(buffer))
            continue
        if number != 4 or wire != _LENGTH:
            yield buffer[pos:after]
            pos = after
            continue
        run, size, tag = pos, len(buffer) - 1, _EVENT_TAG
        starts = [run]
        append = starts.append
        pos = after
        while pos < size and buffer[pos] == tag:  # the rest of the run, fast
            length_byte = buffer[pos + 1]
            if length_byte < 0x80:
                after = pos + 2 + length_byte
            else:  # a length of two bytes or more
                try:
                    value_length, value = _varint(buffer, pos + 1)
                except IndexError:
                    break
                after = value + value_length
            if after > size + 1:
                break
            append(pos)
            pos = after
        yield _Block(buffer[run:pos], starts, run)


def _varints(data: np.ndarray, at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The varints starting at positions ``at`` of ``data`` (padded with zero bytes): their
    values (int64, as protobuf's int64 fields store them) and lengths in bytes."""
    value = np.zeros(len(at), dtype=np.uint64)
    length = np.zeros(len(at), dtype=np.int64)
    going = np.ones(len(at), dtype=bool)
    for k in range(10):
        byte = data[at + k]
        value |= np.where(going, (byte & 0x7F).astype(np.uint64) << np.uint64(7 * k), np.uint64(0))
        length += going
        going &= byte >= 0x80
        if not going.any():
            break
    return value.view(np.int64), length


def _decode(block: _Block) -> tuple[np.ndarray, ...]:
    """metadata_id, offset_ps and duration_ps of every event of ``block``, vectorised;
    whether each event had them in protobuf's canonical order (fields 1, 2, 3, then stats or
    num_occurrences), which is how XProf writes them (the others need :func:`_parse`); and
    where each event's body (an XEvent message) starts and ends."""
    data = np.frombuffer(block.data + bytes(11), dtype=np.uint8)  # a varint read at the very end stays inside
    start = np.array(block.starts, dtype=np.int64) - block.base
    length, length_bytes = _varints(data, start + 1)  # after the XLine.events tag
    body = start + 1 + length_bytes
    cursor, end = body, body + length
    values = []
    for tag in (0x08, 0x10, 0x18):  # XEvent.metadata_id = 1, offset_ps = 2, duration_ps = 3: varints
        present = (cursor < end) & (data[cursor] == tag)
        value, length = _varints(data, cursor + 1)
        values.append(np.where(present, value, 0))
        cursor = cursor + np.where(present, 1 + length, 0)
    canonical = (cursor == end) | (data[cursor] == 0x22) | (data[cursor] == 0x28)  # stats = 4, num_occurrences = 5
    return values[0], values[1], values[2], canonical, body, end


_SKIP, _OP, _STEP = 0, 1, 2


@dataclass
class _Events:
    """What the raw events add up to over the host planes."""

    ops: dict[tuple[str | None, str], int] = field(default_factory=dict)  # (module, name) -> op id
    calls: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # per op id
    total_us: np.ndarray = field(default_factory=lambda: np.zeros(0))
    self_us: np.ndarray = field(default_factory=lambda: np.zeros(0))
    first_us: float | None = None  # the first op event's start and the last one's end
    last_us: float | None = None
    steps: dict[str, tuple[float, float]] = field(default_factory=dict)  # step number -> (start, end) us
    base_ns: int | None = None  # the first line's timestamp: times are kept relative to it
    #: each line's op events (plane, line, op ids, start and duration in us), when asked to keep them
    lines: list[tuple[str, str, np.ndarray, np.ndarray, np.ndarray]] | None = None

    def add(self, op: np.ndarray, start: np.ndarray, duration: np.ndarray) -> None:
        """One timeline's op events (microseconds): self times, then per-op sums."""
        order = np.lexsort((-duration, start))
        op, start, duration = op[order], start[order], duration[order]
        own = self_times(np.zeros(len(op), dtype=np.int64), start, duration)
        size = len(self.ops)
        grown = size - len(self.calls)
        self.calls = np.concatenate([self.calls, np.zeros(grown, dtype=np.int64)]) + np.bincount(op, minlength=size)
        self.total_us = np.concatenate([self.total_us, np.zeros(grown)]) + np.bincount(op, duration, size)
        self.self_us = np.concatenate([self.self_us, np.zeros(grown)]) + np.bincount(op, own, size)
        first, last = float(start.min()), float((start + duration).max())
        self.first_us = first if self.first_us is None else min(self.first_us, first)
        self.last_us = last if self.last_us is None else max(self.last_us, last)


def _stat_value(stat: Any, names: dict[int, str]) -> str | None:
    kind = stat.WhichOneof("value")
    if kind is None:
        return None
    value = getattr(stat, kind)
    if kind == "ref_value":
        return names.get(value)
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _read_lines(stream: BinaryIO, plane: _Plane, found: _Events, every_event: bool = False) -> None:
    """Add one plane's op events and step markers to ``found``, a line at a time.

    Op events are those with an ``hlo_op`` stat (XLA's thunks on a host plane), or with
    ``every_event`` every event (a device plane's lines, whose events are the ops)."""
    event_names = {e.key: e.value.name.decode("utf-8", "replace") for e in plane.header.event_metadata}
    stat_names = {s.key: s.value.name.decode("utf-8", "replace") for s in plane.header.stat_metadata}
    stat_ids = {name: key for key, name in stat_names.items()}
    hlo_op, hlo_module, step_num = (stat_ids.get(name) for name in (HLO_OP, HLO_MODULE, STEP_NUM))
    kinds: dict[int, int] = {}  # event metadata id -> what its events are, from the first one seen
    op_ids: dict[int, int] = {}  # event metadata id -> op id

    def classify(event: Any) -> int:
        stats = {stat.metadata_id: stat for stat in event.stats}
        if every_event or (hlo_op is not None and hlo_op in stats):
            module = _stat_value(stats[hlo_module], stat_names) if hlo_module in stats else None
            key = (module, event_names.get(event.metadata_id, f"#{event.metadata_id}"))
            op_ids[event.metadata_id] = found.ops.setdefault(key, len(found.ops))
            return _OP
        return _STEP if step_num is not None and step_num in stats else _SKIP

    for line_offset, line_length in plane.lines:
        header, pieces = bytearray(), []
        markers: list[tuple[str, int, int]] = []
        for block in _event_blocks(stream, line_offset, line_length):
            if isinstance(block, bytes):
                header += block
                continue
            metadata, offset, duration, canonical, bodies, ends = _decode(block)

            def event(i: int, data: bytes = block.data, bodies: np.ndarray = bodies, ends: np.ndarray = ends) -> Any:
                return _parse("XEvent", data[bodies[i] : ends[i]])

            for i in np.flatnonzero(~canonical).tolist():  # written in another order: protobuf reads it
                parsed = event(i)
                metadata[i], offset[i], duration[i] = parsed.metadata_id, parsed.offset_ps, parsed.duration_ps
            seen, first, inverse = np.unique(metadata, return_index=True, return_inverse=True)
            for m, i in zip(seen.tolist(), first.tolist(), strict=True):
                if m not in kinds:
                    kinds[m] = classify(event(i))
            kind = np.array([kinds[m] for m in seen.tolist()])[inverse]
            wanted = kind == _OP
            if wanted.any():
                op = np.array([op_ids.get(m, -1) for m in seen.tolist()])[inverse]
                pieces.append((op[wanted], offset[wanted], duration[wanted]))
            for i in np.flatnonzero(kind == _STEP).tolist():
                number = next(_stat_value(s, stat_names) for s in event(i).stats if s.metadata_id == step_num)
                markers.append((number or "", int(offset[i]), int(duration[i])))
        line = _parse("LineHeader", bytes(header))
        if found.base_ns is None:
            found.base_ns = line.timestamp_ns
        shift_us = (line.timestamp_ns - found.base_ns) * 1e-3
        if pieces:
            op, offset, duration = (np.concatenate(column) for column in zip(*pieces, strict=True))
            found.add(op, offset * 1e-6 + shift_us, duration * 1e-6)
            if found.lines is not None:
                name = line.name.decode("utf-8", "replace")
                found.lines.append((plane.name, name, op, offset * 1e-6 + shift_us, duration * 1e-6))
        for number, offset_ps, duration_ps in markers:
            begin, end = shift_us + offset_ps * 1e-6, shift_us + (offset_ps + duration_ps) * 1e-6
            known = found.steps.get(number, (begin, end))
            found.steps[number] = (min(known[0], begin), max(known[1], end))


def read_xplane(path: Path) -> TraceOps:
    """Per-op totals of one ``*.xplane.pb``: XProf's converter where there is a device plane,
    the raw XLA op events otherwise."""
    try:
        size = os.path.getsize(path)
        stream = open(path, "rb")  # noqa: SIM115  (closed below; the readers take the stream)
    except OSError as error:
        raise TraceError(f"cannot read {path}: {error.strerror}") from error
    with stream:
        planes = _index(stream, size)
        found = _Events()
        for plane in planes:
            if not plane.name.startswith(DEVICE_PLANE_PREFIX):
                _read_lines(stream, plane, found)
    steps, step_time = _steps(found)
    if any(plane.name.startswith(DEVICE_PLANE_PREFIX) and plane.lines for plane in planes):
        devices = sum(1 for plane in planes if DEVICE_PLANE.fullmatch(plane.name) and plane.lines)
        return TraceOps("xprof hlo_stats", converted_hlo_stats(path), steps, step_time, devices=devices or None)
    names = sorted(found.ops, key=found.ops.__getitem__)
    ops = [
        OpTotals("hlo", name, int(found.calls[i]), float(found.self_us[i]), float(found.total_us[i]), module=module)
        for i, (module, name) in enumerate(names)
    ]
    _count_hlo(ops, planes)
    span = found.last_us - found.first_us if found.first_us is not None else None
    return TraceOps("xplane events", ops, steps, step_time if steps else span)


#: the metadata plane's stat that holds a compiled module's HloProto
HLO_PROTO = "Hlo Proto"


def _hlo_protos(planes: list[_Plane]) -> dict[str, bytes]:
    """Each compiled module's HloProto, by its event name on the metadata plane."""
    protos = {}
    for plane in planes:
        stat_names = {s.key: s.value.name.decode("utf-8", "replace") for s in plane.header.stat_metadata}
        wanted = {key for key, name in stat_names.items() if name == HLO_PROTO}
        if not wanted:
            continue
        for entry in plane.header.event_metadata:
            for stat in entry.value.stats:
                if stat.metadata_id in wanted and stat.WhichOneof("value") == "bytes_value":
                    protos[entry.value.name.decode("utf-8", "replace")] = stat.bytes_value
    return protos


def _count_hlo(ops: list[OpTotals], planes: list[_Plane]) -> None:
    """FLOPs and bytes of each HLO op from its module's shapes (:mod:`tpubench.traces.hlo`),
    where the trace carries the modules; ops of a module it lacks keep nulls."""
    from tpubench.traces.hlo import SOURCE, parse_modules

    modules = parse_modules(_hlo_protos(planes))
    for op in ops:
        module = modules.get(op.module or "")
        counted = module.count(op.op) if module is not None else None
        if counted is None:
            continue
        if counted.opcode in ("call", "while", "conditional"):
            op.flops_source = op.bytes_source = "nested"  # the ops it runs have their own rows
        if counted.flops is not None:
            op.flops, op.flops_source = counted.flops * op.calls, counted.flops_source
        if counted.bytes is not None:
            op.bytes_accessed, op.bytes_source = counted.bytes * op.calls, SOURCE
        op.shapes = [
            ShapeCalls(None, None, None, None, op.calls, op.calls, op.self_us, counted.flops, op.flops_source,
                       counted.bytes, op.bytes_source, op.calls, label=counted.shape, dot=counted.dot)
        ]  # fmt: skip


@dataclass
class OpLine:
    """One timeline's op events: a device plane's line (``/device:TPU:0`` ``XLA Ops``) or a
    host thread running XLA's thunks (PJRT CPU: one ``tf_XLAPjRtCpuClient`` thread per device)."""

    plane: str
    line: str
    names: list[str]  # per event
    start_us: np.ndarray
    duration_us: np.ndarray


def op_lines(path: Path) -> list[OpLine]:
    """Every timeline's op events, by line, for per-device time accounting
    (:mod:`tpubench.traces.collectives`): the device planes' lines where the trace has
    device planes, else the host planes' XLA op events."""
    try:
        size = os.path.getsize(path)
        stream = open(path, "rb")  # noqa: SIM115  (closed below; the readers take the stream)
    except OSError as error:
        raise TraceError(f"cannot read {path}: {error.strerror}") from error
    with stream:
        planes = _index(stream, size)
        device = [plane for plane in planes if plane.name.startswith(DEVICE_PLANE_PREFIX) and plane.lines]
        found = _Events(lines=[])
        for plane in device or planes:
            _read_lines(stream, plane, found, every_event=bool(device))
    names = [name for _, name in sorted(found.ops, key=found.ops.__getitem__)]
    return [
        OpLine(plane, line, [names[i] for i in op.tolist()], start, duration)
        for plane, line, op, start, duration in found.lines or []
    ]


def _steps(found: _Events) -> tuple[int | None, float | None]:
    """Traced steps marked in the trace, and their wall time: from the first marker's start to
    the later of the last marker's end and the last op's end (a step's ops may run after
    its marker closes: XLA executes asynchronously)."""
    if not found.steps:
        return None, None
    begin = min(start for start, _ in found.steps.values())
    end = max(end for _, end in found.steps.values())
    if found.last_us is not None:
        end = max(end, found.last_us)
    return len(found.steps), end - begin


def converted_hlo_stats(path: Path) -> list[OpTotals]:
    """XProf's ``hlo_stats`` table of the trace, one OpTotals per HLO op.

    The converter writes ``*.op_stats_v2.pb`` and ``*.hlo_proto.pb`` beside the file it
    reads, so it reads a link to the trace from a scratch folder and the trace's folder
    stays as it was.
    """
    from xprof.convert import raw_to_tool_data

    with tempfile.TemporaryDirectory(prefix="tpubench-xprof-") as scratch:
        link = Path(scratch) / Path(path).name
        link.symlink_to(Path(path).resolve())
        data, _ = raw_to_tool_data.xspace_to_tool_data([str(link)], "hlo_stats", {})
    if not data:
        raise TraceError(f"xprof's hlo_stats converter returned nothing for {path}")
    table = json.loads(data)
    columns = [column["id"] for column in table["cols"]]
    ops = []
    for row in table["rows"]:
        cells = dict(zip(columns, ((cell or {}).get("v") for cell in row["c"]), strict=True))
        self_us = float(cells["total_self_time"] or 0.0)
        flop_rate = cells.get("model_flop_rate")  # GFLOP/s over the op's self time
        bandwidth = cells.get("measured_memory_bw")  # GiB/s over the op's self time
        ops.append(
            OpTotals(
                source="hlo",
                op=cells["hlo_op_name"],
                calls=int(cells["occurrences"] or 0),
                self_us=self_us,
                total_us=float(cells["total_time"] or 0.0),
                framework_op=cells.get("tf_op_name") or None,
                module=str(cells["program_id"]) if cells.get("program_id") is not None else None,
                flops=flop_rate * 1e9 * self_us * 1e-6 if flop_rate is not None else None,
                bytes_accessed=bandwidth * 2**30 * self_us * 1e-6 if bandwidth is not None else None,
                bound_by=cells.get("bound_by") or None,
                category_hint=cells.get("category") or None,
                flops_source="xprof hlo_stats" if flop_rate is not None else None,
                bytes_source="xprof hlo_stats" if bandwidth is not None else None,
            )
        )
    return ops
