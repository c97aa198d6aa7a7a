"""Matmul ceilings: the FLOP/s a device reaches, per dtype and shape (mamf-finder's rules).

FLOPs per matmul are ``2 M N K``. On eager backends each sample is one ``torch.mm(A, B,
out=C)`` (fp8: ``torch._scaled_mm`` with unit scales and a bf16 output), after a write of a
buffer twice the last-level cache so that no operand starts cached. Compiled backends run
the product through the backend's own ``prepare`` (``torch.compile``). Where host timing
includes tracing and dispatch (torch_xla, TorchTPU) a sample is :data:`GRAPH_REPS` chained
products in one graph or queue, divided by their number: ``X @ B`` then ``(X @ B) @ B^T``
alternately, so no product repeats another (XLA would merge it) and any M, N, K chain.
B is drawn with variance 1/K, so the chain's values stay finite.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tpubench.ceilings import CeilingSpec, gemm_shapes, matmul_sizes
from tpubench.ceilings.device import DeviceFacts
from tpubench.ceilings.timing import failed_point, point_columns, sample

#: the torch dtype of each ceiling dtype's operands
TORCH_DTYPES = {"float32": "float32", "tf32": "float32", "bfloat16": "bfloat16", "float16": "float16"}


def flops(m: int, n: int, k: int) -> float:
    """FLOPs of one (M x K) @ (K x N) product: a multiply and an add per term."""
    return 2.0 * m * n * k


class Chain(nn.Module):
    """``reps`` products: X @ B, then @ B^T, then @ B..., each depending on the one before."""

    def __init__(self, reps: int):
        super().__init__()
        self.reps = reps

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        x = a
        for index in range(self.reps):
            x = x @ (b if index % 2 == 0 else b.t())
        return x


def precision(dtype: str) -> None:
    """TF32 for the ``tf32`` points, full float32 ("highest") for every other."""
    torch.set_float32_matmul_precision("high" if dtype == "tf32" else "highest")


def operation(facts: DeviceFacts, dtype: str, m: int, n: int, k: int) -> Any:
    """The timed call of one point: a function of no arguments that runs ``facts.reps`` products."""
    device = facts.device
    generator = torch.Generator().manual_seed(0)
    if dtype == "fp8":
        a = torch.randn(m, k, generator=generator).to(device=device, dtype=torch.float8_e4m3fn)
        b = torch.randn(n, k, generator=generator).to(device=device, dtype=torch.float8_e4m3fn).t()  # column-major
        one = torch.tensor(1.0, device=device)
        return lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    torch_dtype = getattr(torch, TORCH_DTYPES[dtype])
    a = torch.randn(m, k, generator=generator).to(device=device, dtype=torch_dtype)
    b = (torch.randn(k, n, generator=generator) / k**0.5).to(device=device, dtype=torch_dtype)
    module = facts.backend.prepare(Chain(facts.reps))
    if module.__class__ is Chain and facts.reps == 1:  # eager: mamf-finder's out= product, no allocation
        c = torch.empty(m, n, device=device, dtype=torch_dtype)
        return lambda: torch.mm(a, b, out=c)
    return lambda: module(a, b)


def measure(spec: CeilingSpec, facts: DeviceFacts, notes: list[str]) -> list[dict[str, Any]]:
    """Every point of the sweep, dtype by dtype: M=N=K powers of two, then the registry's
    GEMMs (on an accelerator, or with --full). Sizes stop growing once one sample takes
    longer than the sweep's limit; a GEMM whose predicted sample time exceeds it is left out."""
    flush = None
    if facts.flush_bytes:
        buffer = torch.empty(facts.flush_bytes // 4, dtype=torch.float32, device=facts.device)
        flush = buffer.zero_
    limit = spec.sweep.sample_limit_s
    rows: list[dict[str, Any]] = []
    for dtype in spec.dtypes:
        precision(dtype)
        best_rate = 0.0
        for size in matmul_sizes(facts.kind, spec.full, spec.max_size):
            row = point(spec, facts, dtype, f"{size}x{size}x{size}", (size, size, size), flush)
            rows.append(row)
            if row["status"] != "ok":
                break
            best_rate = max(best_rate, row["median_rate"])
            if row["median_s"] * facts.reps > limit:
                notes.append(
                    f"matmul {dtype}: sizes above {size} left out, one sample took "
                    f"{row['median_s'] * facts.reps:.2f} s (--full raises the limit)"
                )
                break
        if facts.kind == "cpu" and not spec.full:
            continue
        for name, m, n, k in gemm_shapes():
            if spec.max_size and max(m, n, k) > spec.max_size:
                continue
            if best_rate and flops(m, n, k) * facts.reps / best_rate > limit:
                notes.append(
                    f"matmul {dtype} {name}: left out, a sample would take about "
                    f"{flops(m, n, k) * facts.reps / best_rate:.1f} s (--full raises the limit)"
                )
                continue
            rows.append(point(spec, facts, dtype, f"{name} {m}x{n}x{k}", (m, n, k), flush))
    precision("float32")
    return rows


def point(
    spec: CeilingSpec, facts: DeviceFacts, dtype: str, shape: str, mnk: tuple[int, int, int], flush: Any
) -> dict[str, Any]:
    """One point's row; an unsupported dtype or an OOM costs the point (its status says why),
    not the sweep."""
    m, n, k = mnk
    row = {
        "op": "scaled_mm" if dtype == "fp8" else "mm",
        "dtype": dtype,
        "shape": shape,
        "m": m,
        "n": n,
        "k": k,
        "flops_per_op": flops(m, n, k),
        "flush_bytes": facts.flush_bytes if flush is not None else None,
    }
    try:
        timed = sample(operation(facts, dtype, m, n, k), facts.backend, spec.sweep, reps=facts.reps, before=flush)
    except Exception as error:
        return {**row, **failed_point(error)}
    return {**row, **point_columns(timed, flops(m, n, k), "FLOP/s"), "status": "ok"}
