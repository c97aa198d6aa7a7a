"""FLOPs and bytes of XLA's HLO ops, from the HLO modules an xplane carries.

XProf computes these with XLA's cost model only where the trace has a device plane (TPU,
GPU: :func:`tpubench.traces.xplane.converted_hlo_stats`). On PJRT CPU its tables are
empty, and XLA's own cost analysis (``HloCostAnalysis``) has no Python entry point in
torch_xla. But the xplane's ``/host:metadata`` plane holds each compiled module's
``HloProto`` (a stat named ``Hlo Proto`` on the module's event metadata), and that has
every instruction's shape: this module counts from those shapes, ``hlo shapes`` in the
rows' ``bytes_source`` and, for FLOPs, one source per kind of work so that a run's dots are
read apart from its elementwise work (as the torch side's ``flop_counter`` and
``elementwise`` are): ``hlo dot``, ``hlo elementwise``, ``hlo dot+elementwise`` (a fusion
that holds both) and ``hlo data movement`` (0):

- FLOPs: ``dot`` 2 * output elements * contracted size (as XLA's cost analysis and the
  flop counter count a matmul); the arithmetic elementwise opcodes in
  :data:`ARITHMETIC` 1 per output element (as the aten side counts ``aten::add``);
  ``reduce`` 1 per input element; data movement (:data:`NO_FLOPS`) 0; a fusion the sum
  over its fused computation when every instruction in it has a figure. Anything else
  (``exponential``, ``convolution``, ``custom-call``...) has none: null, never 0.
- bytes: an op's operands and its output, each once (what XLA's cost analysis counts as
  bytes accessed for a fusion: its inner values stay in registers).

The HloProto is parsed with a subset of xla/service/hlo.proto built at run time, as
xplane.py does for the xplane, so that no XLA Python package is needed.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message, message_factory

SOURCE = "hlo shapes"  # the bytes' source
#: the FLOPs' sources, by the kinds of work an op's FLOPs come from (:meth:`_Module.kinds`)
DOT, ELEMENTWISE = "dot", "elementwise"
FLOPS_SOURCES = {
    frozenset({DOT}): "hlo dot",
    frozenset({ELEMENTWISE}): "hlo elementwise",
    frozenset({DOT, ELEMENTWISE}): "hlo dot+elementwise",
    frozenset(): "hlo data movement",
}
#: bytes per element of xla.PrimitiveType (xla/xla_data.proto); TUPLE, TOKEN and OPAQUE have none
ELEMENT_BYTES = {1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 1, 7: 2, 8: 4, 9: 8, 10: 2, 11: 4, 12: 8, 15: 8, 16: 2, 18: 16}
ELEMENT_BYTES |= dict.fromkeys((19, 20, 23, 24, 25), 1)  # the float8 types
#: opcodes with 1 FLOP per output element
ARITHMETIC = frozenset({"add", "subtract", "multiply", "divide", "negate", "maximum", "minimum"})
#: opcodes that move or relabel data and compute nothing
NO_FLOPS = frozenset(
    {
        "parameter", "constant", "broadcast", "reshape", "bitcast", "transpose", "copy", "slice", "concatenate",
        "convert", "tuple", "get-tuple-element", "iota", "pad", "reverse", "dynamic-slice", "dynamic-update-slice",
        "gather", "scatter", "select", "compare", "bitcast-convert", "copy-start", "copy-done",
    }
)  # fmt: skip


@functools.cache
def _messages() -> dict[str, type[message.Message]]:
    """The subset of xla/service/hlo.proto and xla/xla_data.proto this module reads."""
    f = descriptor_pb2.FieldDescriptorProto
    scalar = {"int64": f.TYPE_INT64, "string": f.TYPE_STRING, "int32": f.TYPE_INT32, "bool": f.TYPE_BOOL}
    layouts: dict[str, list[tuple[str, int, str, bool]]] = {  # name, number, type, repeated
        "ShapeProto": [
            ("element_type", 2, "int32", False),
            ("dimensions", 3, "int64", True),
            ("tuple_shapes", 4, "ShapeProto", True),
        ],
        "DotDimensionNumbers": [
            ("lhs_contracting_dimensions", 1, "int64", True),
            ("rhs_contracting_dimensions", 2, "int64", True),
            ("lhs_batch_dimensions", 3, "int64", True),
            ("rhs_batch_dimensions", 4, "int64", True),
        ],
        "HloInstructionProto": [
            ("name", 1, "string", False),
            ("opcode", 2, "string", False),
            ("shape", 3, "ShapeProto", False),
            ("dot_dimension_numbers", 30, "DotDimensionNumbers", False),
            ("id", 35, "int64", False),
            ("operand_ids", 36, "int64", True),
            ("called_computation_ids", 38, "int64", True),
        ],
        "HloComputationProto": [
            ("name", 1, "string", False),
            ("instructions", 2, "HloInstructionProto", True),
            ("id", 5, "int64", False),
        ],
        "HloModuleProto": [
            ("name", 1, "string", False),
            ("computations", 3, "HloComputationProto", True),
            ("entry_computation_id", 6, "int64", False),
        ],
        "HloProto": [("hlo_module", 1, "HloModuleProto", False)],
    }
    package = "tpubench.hlo_subset"
    proto = descriptor_pb2.FileDescriptorProto(name="tpubench_hlo_subset.proto", package=package, syntax="proto3")
    for name, fields in layouts.items():
        described = proto.message_type.add(name=name)
        for field_name, number, kind, repeated in fields:
            entry = described.field.add(
                name=field_name, number=number, label=f.LABEL_REPEATED if repeated else f.LABEL_OPTIONAL
            )
            if kind in scalar:
                entry.type = scalar[kind]
            else:
                entry.type, entry.type_name = f.TYPE_MESSAGE, f".{package}.{kind}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.{name}")) for name in layouts}


@dataclass(frozen=True)
class HloCount:
    """One HLO instruction's figures (None: no formula) and its shapes, for the roofline."""

    flops: float | None
    bytes: float | None
    opcode: str
    flops_source: str | None  # FLOPS_SOURCES' name for the kinds of work in ``flops``; None without FLOPs
    shape: str  # "f32[32,128] dot f32[32,128], f32[128,384]": output, opcode, operands
    dot: tuple[int, int, int, int] | None = None  # (batch, m, n, k) of a dot


def _elements(shape: Any) -> int:
    return math.prod(shape.dimensions) if not shape.tuple_shapes else 0


def _bytes(shape: Any) -> int | None:
    if shape.tuple_shapes:
        parts = [_bytes(part) for part in shape.tuple_shapes]
        return None if None in parts else sum(parts)  # type: ignore[arg-type]
    size = ELEMENT_BYTES.get(shape.element_type)
    return None if size is None else size * math.prod(shape.dimensions)


_TYPE_NAMES = {1: "pred", 2: "s8", 3: "s16", 4: "s32", 5: "s64", 10: "f16", 11: "f32", 12: "f64", 16: "bf16"}


def _label(shape: Any) -> str:
    if shape.tuple_shapes:
        return "(" + ", ".join(_label(part) for part in shape.tuple_shapes) + ")"
    return f"{_TYPE_NAMES.get(shape.element_type, f'type{shape.element_type}')}[{','.join(map(str, shape.dimensions))}]"


def _dot(instruction: Any, lhs: Any, rhs: Any) -> tuple[int, int, int, int]:
    """(batch, m, n, k) of a dot: the product of each kind of dimension."""
    numbers = instruction.dot_dimension_numbers
    lhs_dims, rhs_dims = list(lhs.shape.dimensions), list(rhs.shape.dimensions)
    batch = math.prod(lhs_dims[d] for d in numbers.lhs_batch_dimensions)
    k = math.prod(lhs_dims[d] for d in numbers.lhs_contracting_dimensions)
    used_lhs = set(numbers.lhs_batch_dimensions) | set(numbers.lhs_contracting_dimensions)
    used_rhs = set(numbers.rhs_batch_dimensions) | set(numbers.rhs_contracting_dimensions)
    m = math.prod(size for d, size in enumerate(lhs_dims) if d not in used_lhs)
    n = math.prod(size for d, size in enumerate(rhs_dims) if d not in used_rhs)
    return batch, m, n, k


class _Module:
    """One HloModuleProto's instructions, and the figures of each, computed on demand."""

    def __init__(self, module: Any):
        self.computations = {c.id: c for c in module.computations}
        self.instructions = {i.id: i for c in module.computations for i in c.instructions}
        self.by_name = {i.name: i for c in module.computations for i in c.instructions}

    @functools.cache  # noqa: B019  (one per module, kept for the module's lifetime)
    def flops(self, instruction_id: int) -> float | None:
        instruction = self.instructions[instruction_id]
        opcode = instruction.opcode
        if opcode == "dot" and len(instruction.operand_ids) >= 2:
            lhs, rhs = (self.instructions[i] for i in instruction.operand_ids[:2])
            batch, m, n, k = _dot(instruction, lhs, rhs)
            return 2.0 * batch * m * n * k
        if opcode in ARITHMETIC:
            return float(_elements(instruction.shape))
        if opcode == "reduce" and instruction.operand_ids:
            return float(_elements(self.instructions[instruction.operand_ids[0]].shape))
        if opcode in NO_FLOPS:
            return 0.0
        if opcode == "fusion" and instruction.called_computation_ids:
            inner = self.computations.get(instruction.called_computation_ids[0])
            if inner is None:
                return None
            parts = [self.flops(i.id) for i in inner.instructions]
            return None if None in parts else float(sum(parts))  # type: ignore[arg-type]
        return None

    @functools.cache  # noqa: B019  (as flops)
    def kinds(self, instruction_id: int) -> frozenset[str]:
        """The kinds of work (:data:`DOT`, :data:`ELEMENTWISE`) that give an instruction's
        FLOPs: a fusion's are its computation's; none for data movement."""
        instruction = self.instructions[instruction_id]
        if instruction.opcode == "fusion" and instruction.called_computation_ids:
            inner = self.computations.get(instruction.called_computation_ids[0])
            return frozenset().union(*(self.kinds(i.id) for i in inner.instructions)) if inner else frozenset()
        if not self.flops(instruction_id):
            return frozenset()
        return frozenset({DOT if instruction.opcode == "dot" else ELEMENTWISE})

    def count(self, name: str) -> HloCount | None:
        """The figures of the instruction called ``name`` (as the trace's op events name it)."""
        instruction = self.by_name.get(name) or self.by_name.get(name.removesuffix(".clone"))
        if instruction is None:
            return None
        operands = [self.instructions[i] for i in instruction.operand_ids if i in self.instructions]
        sizes = [_bytes(instruction.shape), *(_bytes(operand.shape) for operand in operands)]
        moved = None if None in sizes or instruction.opcode in ("call", "while", "conditional") else sum(sizes)
        flops = self.flops(instruction.id) if instruction.opcode not in ("call", "while", "conditional") else None
        label = f"{_label(instruction.shape)} {instruction.opcode} " + ", ".join(_label(o.shape) for o in operands)
        dot = _dot(instruction, *operands[:2]) if instruction.opcode == "dot" and len(operands) >= 2 else None
        source = FLOPS_SOURCES[self.kinds(instruction.id)] if flops is not None else None
        return HloCount(flops, float(moved) if moved is not None else None, instruction.opcode, source, label, dot)


def parse_modules(protos: dict[str, bytes]) -> dict[str, _Module]:
    """Module name (as the op events' ``hlo_module`` stat gives it) -> its instructions.

    ``protos`` maps the metadata plane's event names (``SyncTensorsGraph.2639(0)``) to
    their ``Hlo Proto`` bytes; the name is kept with and without the program id suffix."""
    modules = {}
    for name, data in protos.items():
        try:
            parsed = _messages()["HloProto"].FromString(data).hlo_module
        except message.DecodeError:
            continue  # a module this reader cannot parse gets no figures, not a failed trace
        module = _Module(parsed)
        for key in (name, name.split("(")[0], parsed.name):
            modules.setdefault(key, module)
    return modules
