"""Measured ceilings: what a device really reaches, so that MFU has an attainable denominator.

A data sheet's peak is reached by no chip (mamf-finder measures 794.5 of 989 TFLOP/s bf16
on an H100, about 80 %), so a run at 60 % MFU against the sheet is much nearer the device's
limit than it reads. ``tpubench ceilings`` measures each limit with micro-benchmarks, in the
same isolated workers, under the same device locks, warm-up and device-synchronised timing
as every run, and stores one row per sweep point in the ``ceilings`` table (docs/ceilings.md):

- ``matmul``: FLOP/s of ``torch.mm`` (fp8: ``torch._scaled_mm``) per dtype, M=N=K powers of
  two and the registry's real GEMM shapes (:mod:`.matmul`);
- ``memory``: STREAM copy, scale, add and triad by array size, and host-device copies (:mod:`.memory`);
- ``collective``: bus bandwidth of all_reduce, all_gather, reduce_scatter, all_to_all and
  broadcast by message and group size (:mod:`.collective`: rank processes; torch_xla's under
  SPMD in one process: :mod:`.xla_collective`);
- ``latency``: the time of an empty step (:mod:`.latency`).

This module is torch-free: the parent plans and checks a sweep with it; the measuring
modules import torch and run in the worker.
"""

from __future__ import annotations

import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

from tpubench.analysis.ceilings import LLC_MULTIPLE, UNKNOWN_LLC_REACH
from tpubench.parallel import PROCESS_FAMILIES, SPMD_FAMILIES
from tpubench.spec import RunSpec

KINDS = ("matmul", "memory", "collective", "latency")
#: every dtype a ceiling may be measured in (``tf32``: float32 tensors on TF32 tensor cores)
DTYPES = ("float32", "tf32", "bfloat16", "float16", "fp8")
#: the matmul dtypes each backend family's device may have (cuda: narrowed by the GPU's
#: compute capability, :func:`supported_dtypes`)
FAMILY_DTYPES = {
    "cpu": ("float32", "bfloat16", "float16"),
    "cuda": ("float32", "tf32", "bfloat16", "float16", "fp8"),
    "xla": ("float32", "bfloat16"),
    "tpu": ("float32", "bfloat16"),
}
#: compute capability each CUDA dtype needs: TF32 and bf16 tensor cores from Ampere (8.0),
#: fp8 from Ada and Hopper (8.9), which ``torch._scaled_mm`` requires
CUDA_CAPABILITY = {"tf32": (8, 0), "bfloat16": (8, 0), "fp8": (8, 9)}
#: bytes per element of each ceiling dtype
ITEMSIZE = {"float32": 4, "tf32": 4, "bfloat16": 2, "float16": 2, "fp8": 1}
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")
STREAM_KERNELS = ("copy", "scale", "add", "triad")
#: arrays each STREAM kernel moves per element (read + written), STREAM's own count
STREAM_ARRAYS = {"copy": 2, "scale": 2, "add": 3, "triad": 3}
#: the group sizes a collective sweep tries, where the host has the devices
GROUP_SIZES = (2, 4, 8)
#: the registry model whose GEMMs the matmul sweep adds, its size, and the tokens per step
#: (batch x sequence) of those GEMMs
GEMM_MODEL, GEMM_SIZE, GEMM_TOKENS = "llama3", "8b", 4096


@dataclass(frozen=True)
class Sweep:
    """How far a sweep goes: the default one fits a 2-core CPU host in a few minutes."""

    samples: int = 10  # timed samples per point, at most
    warmup: int = 2  # untimed (recorded apart) calls after the first
    point_budget_s: float = 2.0  # a point stops sampling after this, with at least MIN_SAMPLES
    sample_limit_s: float = 1.0  # sizes stop growing once one sample takes longer

    @classmethod
    def full(cls) -> Sweep:
        return cls(samples=50, warmup=10, point_budget_s=20.0, sample_limit_s=10.0)


MIN_SAMPLES = 3


@dataclass(frozen=True)
class CeilingSpec:
    """One worker's share of a ceilings sweep: one backend, one kind, its dtypes and sizes.

    ``devices`` is the group size of a collective sweep (1 for the others); ``max_size``
    bounds the sweep (matmul: M=N=K; memory and collective: bytes per array or message).
    """

    backend: str
    kind: str
    dtypes: tuple[str, ...] = ("float32",)
    devices: int = 1
    max_size: int | None = None
    full: bool = False
    timeout_s: float = 900.0
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:16])

    @property
    def sweep(self) -> Sweep:
        return Sweep.full() if self.full else Sweep()

    def label(self) -> str:
        group = f" x{self.devices}" if self.kind == "collective" else ""
        return f"{self.backend} {self.kind}{group} {','.join(self.dtypes)}"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def run_spec(self) -> RunSpec:
        """The run settings a backend's ``setup`` and ``worker_env_for`` read, for this sweep:
        its backend and devices, no compile capture, no shared compile cache (every first
        call compiles cold, and is kept apart from the samples)."""
        return RunSpec(
            suite="ceilings",
            workload=self.kind,
            size="-",
            backend=self.backend,
            mode="infer",
            dtype="float32",
            batch_size=1,
            devices=self.devices,
            timeout_s=self.timeout_s,
            capture_compiles=False,
        )

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CeilingSpec:
        return cls(**{**data, "dtypes": tuple(data["dtypes"])})


def family(backend: str) -> str:
    """``cuda-compile`` -> ``cuda``."""
    return backend.split("-")[0]


def supported_dtypes(backend: str, compute_capability: str | None = None) -> tuple[str, ...]:
    """The dtypes ``backend``'s device can run a matmul in; a CUDA GPU's by its compute
    capability (``"9.0"``; unknown: every CUDA dtype, and the worker says which failed)."""
    dtypes = FAMILY_DTYPES.get(family(backend), ("float32",))
    if family(backend) != "cuda" or not compute_capability:
        return dtypes
    have = tuple(int(part) for part in compute_capability.split(".")[:2])
    return tuple(d for d in dtypes if have >= CUDA_CAPABILITY.get(d, (0, 0)))


def default_dtypes(backend: str, compute_capability: str | None = None) -> tuple[str, ...]:
    """A default sweep's dtypes: every supported one on an accelerator; on a CPU float32 and
    bfloat16 (float16 matmuls on a CPU are emulated, a ceiling of nothing real)."""
    dtypes = supported_dtypes(backend, compute_capability)
    return tuple(d for d in dtypes if d != "float16") if family(backend) == "cpu" else dtypes


def powers_of_two(low: int, high: int) -> list[int]:
    """``low``, 2 ``low``, ... up to ``high`` (both powers of two or not: the doubling decides)."""
    sizes, size = [], low
    while size <= high:
        sizes.append(size)
        size *= 2
    return sizes


#: largest M=N=K of the default matmul sweep per device kind (--full: up to what fits)
MATMUL_MAX = {"cpu": 2048, "cuda": 16384, "tpu": 16384}
MATMUL_MAX_FULL = {"cpu": 8192, "cuda": 32768, "tpu": 32768}
MATMUL_MIN = 64


def matmul_sizes(device_kind: str, full: bool, max_size: int | None) -> list[int]:
    """M=N=K of a matmul sweep: powers of two from 64 to the device kind's default (``--max-size`` caps it)."""
    top = (MATMUL_MAX_FULL if full else MATMUL_MAX).get(device_kind, 2048)
    return powers_of_two(MATMUL_MIN, min(top, max_size) if max_size else top)


def gemm_shapes(tokens: int = GEMM_TOKENS) -> list[tuple[str, int, int, int]]:
    """The registry model's real GEMMs at ``tokens`` rows, as (name, M, N, K): the fused q/k/v
    projection, the attention output, the gated MLP's up (gate and up fused) and down."""
    from workloads import get_workload  # the registry imports torch: only a worker asks

    config = get_workload(GEMM_MODEL).config(GEMM_SIZE)
    heads = (config.n_head + 2 * config.kv_heads) * config.head_dim
    return [
        ("qkv", tokens, heads, config.d_model),
        ("o", tokens, config.d_model, config.n_head * config.head_dim),
        ("gate_up", tokens, 2 * config.d_ff, config.d_model),
        ("down", tokens, config.d_model, config.d_ff),
    ]


#: bytes per array (STREAM) or message (collectives) of the default sweeps
MEMORY_MIN, COLLECTIVE_MIN = 2**20, 2**10
COLLECTIVE_MAX = {"cpu": 2**24, "cuda": 2**30, "tpu": 2**30}
COLLECTIVE_MAX_FULL = {"cpu": 2**27, "cuda": 2**33, "tpu": 2**33}


def memory_sizes(llc_bytes: int | None, full: bool, max_size: int | None) -> list[int]:
    """Bytes per array of a STREAM sweep: from 1 MiB (below any LLC worth the name), by
    doubling, to the first size at least :data:`LLC_MULTIPLE` times the last-level cache (a
    50 MiB L2: 256 MiB); --full goes 4x further. ``max_size`` caps it."""
    top = LLC_MULTIPLE * llc_bytes if llc_bytes else UNKNOWN_LLC_REACH
    top = 1 << (max(top, 4 * MEMORY_MIN) * (4 if full else 1) - 1).bit_length()  # a power of two at or above it
    return powers_of_two(MEMORY_MIN, min(top, max_size) if max_size else top)


def collective_sizes(device_kind: str, full: bool, max_size: int | None) -> list[int]:
    """Message bytes of a collective sweep (nccl-tests' S), 1 KiB up, by factors of 4."""
    top = (COLLECTIVE_MAX_FULL if full else COLLECTIVE_MAX).get(device_kind, 2**24)
    top = min(top, max_size) if max_size else top
    return [size for size in powers_of_two(COLLECTIVE_MIN, top) if (size.bit_length() - 1) % 2 == 0]


def estimate_bytes(kind: str, size: int, dtype: str, devices: int = 1) -> int:
    """What one point of ``size`` holds on a device, to refuse a sweep that cannot fit:
    matmul A, B and C of size^3 (fp8 adds a bf16 C), STREAM's three arrays, a collective's
    input and output (all-gather's output is the message; the rest at most twice it)."""
    if kind == "matmul":
        return 3 * size * size * max(ITEMSIZE[dtype], 2 if dtype == "fp8" else 0)
    if kind == "memory":
        return 3 * size
    if kind == "collective":
        return 2 * size
    return 0


def has_collectives(backend: str) -> bool:
    """Whether ``backend`` has a collective sweep: the process families' (gloo, nccl,
    ``tpu_dist`` ranks) or the SPMD families' (torch_xla's collectives in one process)."""
    return family(backend) in PROCESS_FAMILIES or family(backend) in SPMD_FAMILIES


def is_multi_process(spec: CeilingSpec) -> bool:
    """Whether the sweep runs in rank processes (a collective of a process family)."""
    return spec.kind == "collective" and spec.devices > 1 and family(spec.backend) in PROCESS_FAMILIES
