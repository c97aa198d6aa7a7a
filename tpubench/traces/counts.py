"""FLOPs and bytes of one recorded aten call, from the shapes torch.profiler recorded.

A Chrome trace recorded with ``record_shapes`` gives each ``cpu_op`` event its inputs'
``Input Dims``, ``Input type``, ``Input Strides`` and ``Concrete Inputs`` (scalars). That
is enough to replay the call on the meta device (no data, no compute), which gives the
outputs' shapes, and to ask ``torch.utils.flop_counter``'s registered formulas (the ones
``FlopCounterMode`` uses) for its FLOPs. Each figure says where it came from:

- FLOPs: ``flop_counter`` (the op's own formula in ``flop_registry``: matmuls,
  convolutions, attention; the CPU flash-attention ops through the formula of the op they
  implement, see :data:`SAME_FORMULA`), ``elementwise`` (1 FLOP per output element for
  the arithmetic ops in :data:`ELEMENTWISE_FLOPS`), ``none: view`` (a view or an
  allocation: 0 FLOPs and 0 bytes by what it is); every other op null: no formula, no
  figure.
- bytes: ``shapes``: every tensor input and output counted once at its dtype's size (an
  in-place op's ``self`` is read and written; ops in :data:`WRITE_ONLY` only write it).
  That is what the op must move at least once, not what caches make of it.

An op's own work is counted where it does it, once: an op with a kernel of its own (a
``CPU``/``CUDA`` kernel: ``aten::mm``, ``aten::addmm``) does its work itself, and what it
calls inside (``addmm`` copies its bias into the output with ``aten::copy_``) is more
work, in those ops' rows. A CompositeImplicitAutograd op (``aten::linear``,
``aten::matmul``) does none: the ops it decomposes into do it, so it gets ``nested``. A
CompositeExplicitAutograd op (``aten::_to_copy``) does its work itself unless a call ran
other ops inside (its *leaf* calls are counted; the trace says which, see
:mod:`tpubench.traces.chrome`; ops in :data:`NO_WORK` inside a call do not count).

This module imports torch, inside its functions: the trace readers import none, so that
``tpubench ops`` and the torch_xla interpreter read traces without it, and only a trace
with shapes to count pays torch's import.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.util
import json
import math
import sys
from dataclasses import astuple, dataclass
from pathlib import Path
from typing import Any

from tpubench.cache_dir import keep, read_kept

#: FLOPs per output element of arithmetic elementwise ops (``alpha`` taken as 1)
ELEMENTWISE_FLOPS = {
    name: 1 for base in ("add", "sub", "mul", "div", "rsub", "neg", "reciprocal") for name in (base, f"{base}_")
}
#: CPU kernels of ops the flop counter has a formula for: the same arguments first, the same work
SAME_FORMULA = {
    "_scaled_dot_product_flash_attention_for_cpu": "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_flash_attention_for_cpu_backward": "_scaled_dot_product_flash_attention_backward",
}
#: allocations: they move no data
ALLOCATIONS = frozenset({"empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided", "resize_"})
#: ops that do no work of their own (views, allocations, conjugation flags): a call that
#: runs only these inside it is still a leaf (``aten::mm`` calls ``aten::resolve_conj``).
#: Names only, so that the trace readers, which import no torch, can use it.
NO_WORK = frozenset(
    f"aten::{name}"
    for name in (
        "empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided", "resize_", "as_strided",
        "view", "_unsafe_view", "_reshape_alias", "reshape", "t", "transpose", "permute", "expand", "expand_as",
        "slice", "select", "unsqueeze", "squeeze", "detach", "alias", "lift_fresh", "resolve_conj", "resolve_neg",
        "unfold", "narrow", "split", "chunk", "unbind", "split_with_sizes", "is_same_size", "result_type",
    )
)  # fmt: skip
#: in-place ops that write ``self`` without reading it
WRITE_ONLY = frozenset({"copy_", "fill_", "zero_", "normal_", "uniform_", "bernoulli_", "random_", "exponential_"})

#: torch.profiler's ``Input type`` strings of tensors -> torch dtype names
DTYPES = {
    "float": "float32",
    "double": "float64",
    "c10::Half": "float16",
    "c10::BFloat16": "bfloat16",
    "c10::Float8_e4m3fn": "float8_e4m3fn",
    "c10::Float8_e5m2": "float8_e5m2",
    "long int": "int64",
    "int": "int32",
    "short int": "int16",
    "signed char": "int8",
    "unsigned char": "uint8",
    "bool": "bool",
    "c10::complex<float>": "complex64",
    "c10::complex<double>": "complex128",
}


@dataclass(frozen=True)
class Counted:
    """One call's figures: FLOPs and bytes moved, each with its source (None: not counted),
    and which of the op's calls they stand for: "all", "leaf" (calls that ran no other op
    inside), or "none" (its work is in the ops it calls: ``nested``)."""

    flops: float | None
    flops_source: str | None
    bytes: float | None
    bytes_source: str | None
    calls: str = "all"


NOT_COUNTED = Counted(None, None, None, None)
NESTED = Counted(None, "nested", None, "nested", "none")


def freeze(value: Any) -> Any:
    """A recorded argument list as nested tuples, hashable for :func:`count_call`'s cache."""
    return tuple(freeze(item) for item in value) if isinstance(value, list) else value


def count_call(name: str, dims: tuple, types: tuple, strides: tuple | None, concrete: tuple | None) -> Counted:
    """FLOPs and bytes of one call of ``name`` ("aten::mm") with these recorded inputs
    (as :func:`freeze` makes them); :data:`NOT_COUNTED` where the call cannot be replayed."""
    if not name.startswith("aten::"):
        return NOT_COUNTED
    try:
        return _count(name.removeprefix("aten::"), dims, types, strides, concrete)
    except Exception:  # a call the meta device cannot replay (data-dependent, an unparsed argument): no figure
        return NOT_COUNTED


@functools.lru_cache(maxsize=4096)
def _count(op: str, dims: tuple, types: tuple, strides: tuple | None, concrete: tuple | None) -> Counted:
    import torch
    from torch.utils.flop_counter import flop_registry

    packet = getattr(torch.ops.aten, op, None)
    if packet is None:
        return NOT_COUNTED
    if op in ALLOCATIONS or _is_view(packet):
        return Counted(0.0, "none: view", 0.0, "none: view")
    args = [_argument(i, dims, types, strides, concrete) for i in range(len(types))]
    while args and args[-1] is None:  # trailing defaults the profiler records as empty
        args.pop()
    out, positional, keywords, overload = _replay(packet, args)
    calls = _own_work(overload)
    if calls == "none":
        return NESTED
    tensors_in = [t for t in _tensors(args[1:] if op in WRITE_ONLY else args)]
    moved = sum(_nbytes(t) for t in tensors_in) + sum(_nbytes(t) for t in _tensors(out))
    flops, source = None, None
    formula_op = getattr(torch.ops.aten, SAME_FORMULA.get(op, op))
    formula = flop_registry.get(formula_op) or next(
        (flop_registry[o] for o in _overloads(formula_op) if o in flop_registry), None
    )
    if formula is not None:
        flops, source = float(formula(*positional, out_val=out, **keywords)), "flop_counter"
    elif op in ELEMENTWISE_FLOPS:
        first = next(iter(_tensors(out)), None)
        if first is not None:
            flops, source = float(ELEMENTWISE_FLOPS[op] * first.numel()), "elementwise"
    return Counted(flops, source, float(moved), "shapes", calls)


def _own_work(overload: Any) -> str:
    """Which calls of ``overload`` do its work (:class:`Counted`'s ``calls``), from the
    kernels the dispatcher has for it."""
    import torch

    name = overload.name()
    if any(torch._C._dispatch_has_kernel_for_dispatch_key(name, key) for key in ("CPU", "CUDA")):
        return "all"
    if torch._C._dispatch_has_kernel_for_dispatch_key(name, "CompositeImplicitAutograd"):
        return "none"
    return "leaf"


def _replay(packet: Any, args: list[Any]) -> tuple[Any, list[Any], dict[str, Any], Any]:
    """The op called on meta tensors with the recorded arguments. The profiler records
    keyword-only arguments (``addmm``'s beta, alpha) in schema order with the others, so
    each overload's schema says which recorded argument goes where; the first overload
    that takes them runs. Returns its outputs, the arguments as it took them, and it."""
    failures = []
    for overload in _overloads(packet):
        schema = overload._schema
        if len(args) > len(schema.arguments) or any(a.is_out for a in schema.arguments):
            continue
        positional = [value for value, a in zip(args, schema.arguments, strict=False) if not a.kwarg_only]
        keywords = {a.name: value for value, a in zip(args, schema.arguments, strict=False) if a.kwarg_only}
        try:
            return overload(*positional, **keywords), positional, keywords, overload
        except Exception as error:  # the next overload may take them
            failures.append(error)
    raise ValueError(f"no overload of {packet} takes the recorded arguments: {failures[:1]}")


def _overloads(packet: Any) -> list[Any]:
    return [getattr(packet, name) for name in packet.overloads()]


def _is_view(packet: Any) -> bool:
    """Whether every overload returns an alias of an input without writing it (``view``, ``t``)."""
    schemas = [overload._schema for overload in _overloads(packet)]
    return bool(schemas) and all(
        schema.returns and all(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns)
        for schema in schemas
    )


def _argument(i: int, dims: tuple, types: tuple, strides: tuple | None, concrete: tuple | None) -> Any:
    """The i-th recorded input as a meta tensor, a list of them, a scalar or None."""
    import torch

    kind = types[i]
    if kind in DTYPES:
        shape = dims[i]
        stride = strides[i] if strides and i < len(strides) and strides[i] else None
        dtype = getattr(torch, DTYPES[kind])
        if stride is not None and len(stride) == len(shape):
            return torch.empty_strided(shape, stride, dtype=dtype, device="meta")
        return torch.empty(shape, dtype=dtype, device="meta")
    if kind == "TensorList":
        dtype = next((getattr(torch, DTYPES[t]) for t in types if t in DTYPES), None)
        if dtype is None:
            raise ValueError("a tensor list whose dtype the trace does not give")
        return [torch.empty(shape, dtype=dtype, device="meta") for shape in dims[i]]
    value = concrete[i] if concrete and i < len(concrete) else ""
    if kind in ("Scalar", "ScalarList") and value != "":
        return _literal(value)
    if kind == "" and value == "":
        return None
    raise ValueError(f"an argument of type {kind!r} this replay does not read")


def _literal(text: str) -> Any:
    if text in ("True", "False"):
        return text == "True"
    if text.endswith("."):
        text += "0"
    return ast.literal_eval(text)


def _tensors(value: Any) -> list[Any]:
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in _tensors(item)]
    return []


def _nbytes(tensor: Any) -> int:
    return math.prod(tensor.shape) * tensor.element_size()


def count_shapes(ops: list[Any]) -> None:
    """Count every aten row's recorded calls (``OpTotals.shapes``), then the row's own
    figures: the sum over the calls that do its work when one source counted all of them,
    else null (a partial sum passed off as the op's would understate it; the shapes keep
    what was counted). A row whose work is all in the ops it calls says so (``nested``).

    Each distinct call is counted once, from the kept counts (:func:`kept_counts`) where
    they hold it: torch is imported only for a call they do not."""
    rows = [row for row in ops if row.shapes and row.source == "aten"]
    signatures = {(row.op, s.dims, s.types, s.strides, s.concrete) for row in rows for s in row.shapes}
    counts = kept_counts(signatures)
    for row in rows:
        for shape in row.shapes:
            counted = counts[(row.op, shape.dims, shape.types, shape.strides, shape.concrete)]
            shape.flops, shape.flops_source = counted.flops, counted.flops_source
            shape.bytes, shape.bytes_source = counted.bytes, counted.bytes_source
            shape.counted_calls = {"all": shape.calls, "leaf": shape.leaf_calls}.get(counted.calls, 0)
        working = [shape for shape in row.shapes if shape.counted_calls]
        if not working:
            row.flops_source = row.bytes_source = "nested"
            continue
        for figure in ("flops", "bytes"):
            sources = {getattr(shape, f"{figure}_source") for shape in working}
            values = [getattr(shape, figure) for shape in working]
            if len(sources) == 1 and None not in sources and None not in values:
                total = sum(value * shape.counted_calls for value, shape in zip(values, working, strict=True))
                setattr(row, "flops" if figure == "flops" else "bytes_accessed", total)
                setattr(row, f"{figure}_source", sources.pop())


#: the cache folder's file of kept counts (:func:`kept_counts`)
KEPT_FILE = "shape-counts.json"


def kept_counts(signatures: set[tuple]) -> dict[tuple, Counted]:
    """:func:`count_call` of each (name, dims, types, strides, concrete), kept between runs in
    ``shape-counts.json`` of the cache folder (``TPUBENCH_CACHE_DIR``): a trace records a few
    hundred distinct calls, the same from one run of a model to the next, and counting one
    needs torch (a 2.6 s import) and its first meta-device replays (about 1 s more). The
    kept counts are valid for the torch build (its ``version.py``) and this module's source
    they were counted with: any change to either counts again. An unreadable file is counted
    over; one that cannot be written is counted again next time."""
    if not signatures:
        return {}
    key = _kept_key()
    kept = read_kept(KEPT_FILE, key) if key is not None else {}
    counts, missing = {}, {}
    for signature in signatures:
        text = repr(signature)
        entry = kept.get(text)
        if _is_kept(entry):
            counts[signature] = Counted(*entry)
        else:
            counts[signature] = count_call(*signature)
            missing[text] = list(astuple(counts[signature]))
    if missing and key is not None:
        keep(KEPT_FILE, key, kept | missing)
    return counts


def _is_kept(entry: Any) -> bool:
    """Whether ``entry`` reads as a :class:`Counted` (its fields in order), as
    :func:`kept_counts` writes one."""
    if not isinstance(entry, list) or len(entry) != 5:
        return False
    flops, flops_source, moved, bytes_source, calls = entry
    return (
        all(value is None or isinstance(value, float) for value in (flops, moved))
        and all(source is None or isinstance(source, str) for source in (flops_source, bytes_source))
        and calls in ("all", "leaf", "none")
    )


def _kept_key() -> str | None:
    """What kept counts are valid for: the torch build's ``version.py`` (read without importing
    torch) and this module's source; None where no torch is found (nothing to keep)."""
    torch = sys.modules.get("torch")
    spec = torch.__spec__ if torch is not None else importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        return None
    try:
        build = (Path(spec.origin).parent / "version.py").read_bytes()
        source = Path(__file__).read_bytes()
    except OSError:
        return None
    return hashlib.sha256(build + b"\0" + source).hexdigest()


def shapes_json(shapes: list[Any] | None, per_device: int = 1) -> str | None:
    """A row's calls by recorded inputs as the ``ops.shapes`` JSON: a list of
    ``{"inputs", "dims", "dtypes", "matmul", "calls", "counted_calls", "self_us", "flops",
    "bytes", "flops_source", "bytes_source"}``: FLOPs and bytes per call, for the
    ``counted_calls`` that do the op's own work; ``matmul`` a matmul's (batch, m, n, k)
    (docs/schema.md)."""
    if not shapes:
        return None

    entries = []
    for shape in shapes:
        tensors = [(d, DTYPES[t]) for d, t in zip(shape.dims or (), shape.types or (), strict=False) if t in DTYPES]
        entries.append(
            {
                "inputs": shape.label or ", ".join(f"{dtype}[{','.join(map(str, d))}]" for d, dtype in tensors),
                "dims": [list(d) for d, _ in tensors],
                "dtypes": [dtype for _, dtype in tensors],
                "matmul": list(shape.dot) if shape.dot else None,
                "calls": shape.calls,
                "counted_calls": shape.counted_calls,
                "self_us": shape.self_us / per_device,
                "flops": shape.flops,
                "bytes": shape.bytes,
                "flops_source": shape.flops_source,
                "bytes_source": shape.bytes_source,
            }
        )
    return json.dumps(entries)
