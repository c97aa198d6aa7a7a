"""Memory-bandwidth ceilings: STREAM's four kernels by array size, and host-device copies.

Bytes per kernel are STREAM's count (each array read or written once; no write-allocate):
copy ``c = a`` and scale ``b = s c`` move 2 arrays, add ``c = a + b`` and triad
``a = b + s c`` move 3. Eager backends run each kernel once per sample with ``out=``.
Where operations are traced into a graph (torch_xla) a copy would be elided and adjacent
kernels fused into one pass, so a sample chains :data:`GRAPH_REPS` kernels with an
optimisation barrier between them (each then reads and writes memory) and copy is left out.
On CUDA the sweep adds host-to-device and device-to-host copies from pinned and pageable memory.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from tpubench.analysis.ceilings import size_label
from tpubench.ceilings import ITEMSIZE, STREAM_ARRAYS, STREAM_KERNELS, CeilingSpec, memory_sizes
from tpubench.ceilings.device import DeviceFacts
from tpubench.ceilings.timing import failed_point, point_columns, sample

SCALAR = 0.999  # STREAM's s; not 1, which a compiler may fold away


def stream_bytes(kernel: str, array_bytes: int) -> int:
    """Bytes one ``kernel`` moves over arrays of ``array_bytes`` each (STREAM's count)."""
    return STREAM_ARRAYS[kernel] * array_bytes


def eager_kernel(kernel: str, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> Callable[[], Any]:
    """STREAM's ``kernel`` over ``a``, ``b``, ``c``, written into an existing array."""
    if kernel == "copy":
        return lambda: c.copy_(a)
    if kernel == "scale":
        return lambda: torch.mul(c, SCALAR, out=b)
    if kernel == "add":
        return lambda: torch.add(a, b, out=c)
    return lambda: torch.add(b, c, alpha=SCALAR, out=a)


def graph_kernel(kernel: str, a: torch.Tensor, b: torch.Tensor, reps: int) -> Callable[[], Any]:
    """``reps`` of STREAM's ``kernel`` in one XLA graph, each its own memory pass: the result of
    one feeds the next, with an optimisation barrier between them so XLA fuses none together."""
    import torch_xla.core.xla_model as xm

    def chain() -> torch.Tensor:
        x = a
        for _ in range(reps):
            if kernel == "scale":
                x = x * SCALAR
            elif kernel == "add":
                x = x + b
            else:  # triad
                x = b + SCALAR * x
            xm.optimization_barrier_([x])
        return x

    return chain


def measure(spec: CeilingSpec, facts: DeviceFacts, notes: list[str]) -> list[dict[str, Any]]:
    """STREAM by size for each dtype (float32 by default), then CUDA's host-device copies."""
    rows: list[dict[str, Any]] = []
    limit = spec.sweep.sample_limit_s
    kernels = [k for k in STREAM_KERNELS if not (facts.graph and k == "copy")]
    if facts.graph:
        notes.append("memory: copy left out, XLA elides a copy inside a graph")
    for dtype in spec.dtypes:
        torch_dtype = getattr(torch, dtype)
        for size in memory_sizes(facts.llc_bytes, spec.full, spec.max_size):
            elements = size // ITEMSIZE[dtype]
            try:
                a, b, c = (
                    torch.full((elements,), value, dtype=torch_dtype, device=facts.device) for value in (1, 2, 0)
                )
            except Exception as error:
                rows.append({"op": "triad", "dtype": dtype, "size_bytes": size, **failed_point(error)})
                break
            slowest = 0.0
            for kernel in kernels:
                row = {
                    "op": kernel,
                    "dtype": dtype,
                    "size_bytes": size,
                    "shape": size_label(size),
                    "bytes_per_op": float(stream_bytes(kernel, size)),
                }
                run = graph_kernel(kernel, a, b, facts.reps) if facts.graph else eager_kernel(kernel, a, b, c)
                try:
                    timed = sample(run, facts.backend, spec.sweep, reps=facts.reps)
                except Exception as error:
                    rows.append({**row, **failed_point(error)})
                    continue
                columns = point_columns(timed, row["bytes_per_op"], "B/s")
                rows.append({**row, **columns, "status": "ok"})
                slowest = max(slowest, columns["median_s"] * facts.reps)
            del a, b, c
            if slowest > limit:
                notes.append(f"memory {dtype}: sizes above {size} B left out, one sample took {slowest:.2f} s")
                break
    if facts.kind == "cuda" and facts.device.type == "cuda":
        rows += host_copies(spec, facts)
    return rows


def host_copies(spec: CeilingSpec, facts: DeviceFacts) -> list[dict[str, Any]]:
    """Host-to-device and device-to-host copies of each STREAM size, pinned and pageable."""
    rows: list[dict[str, Any]] = []
    for size in memory_sizes(facts.llc_bytes, spec.full, spec.max_size):
        device_buffer = torch.empty(size, dtype=torch.uint8, device=facts.device)
        for pinned in (True, False):
            host = torch.empty(size, dtype=torch.uint8, pin_memory=pinned)
            memory = "pinned" if pinned else "pageable"
            for op, run in (
                (f"h2d_{memory}", lambda host=host, dev=device_buffer: dev.copy_(host, non_blocking=True)),
                (f"d2h_{memory}", lambda host=host, dev=device_buffer: host.copy_(dev, non_blocking=True)),
            ):
                row = {
                    "op": op,
                    "dtype": "uint8",
                    "size_bytes": size,
                    "shape": size_label(size),
                    "bytes_per_op": float(size),
                }
                try:
                    timed = sample(run, facts.backend, spec.sweep)
                except Exception as error:
                    rows.append({**row, **failed_point(error)})
                    continue
                rows.append({**row, **point_columns(timed, float(size), "B/s"), "status": "ok"})
    return rows
