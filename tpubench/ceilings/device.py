"""What a ceilings worker knows about its device: kind, last-level cache, how it times.

The last-level cache decides two things: the buffer written between matmul samples so
that no operand is still cached (mamf-finder's rule: a buffer larger than the cache,
zeroed before every iteration), and how far a STREAM sweep must go (4x the cache).
"""

from __future__ import annotations

import glob
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tpubench.backends import Backend

if TYPE_CHECKING:
    import torch

#: operations per timed sample where host timing includes tracing and dispatch (torch_xla,
#: TorchTPU): they run as one graph (XLA) or one queue (TorchTPU), and the sample is divided
GRAPH_REPS = 8
#: the smallest L2 flush on a GPU (mamf-finder and Triton's do_bench zero 256 MB)
GPU_FLUSH_BYTES = 256 * 2**20


def cpu_llc_bytes(root: Path = Path("/")) -> int | None:
    """The largest cache of CPU 0 (its last level), from sysfs; None where unreadable."""
    sizes = []
    for path in glob.glob(str(root / "sys/devices/system/cpu/cpu0/cache/index*/size")):
        text = Path(path).read_text().strip().upper()
        factor = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            sizes.append(int(digits) * factor)
    return max(sizes) if sizes else None


@dataclass
class DeviceFacts:
    """A ceilings worker's device, as the sweeps use it."""

    backend: Backend
    device: torch.device
    kind: str  # "cpu", "cuda" or "tpu" (torch_xla: its PJRT device's kind)
    llc_bytes: int | None
    reps: int  # operations per timed sample (:data:`GRAPH_REPS` where host timing includes tracing)
    timing: str  # how a sample is timed, for the rows

    @property
    def graph(self) -> bool:
        """Whether operations are traced into a graph or queue and amortised over ``reps``."""
        return self.reps > 1

    @property
    def flush_bytes(self) -> int | None:
        """The cache-flush buffer: twice the last-level cache (a GPU's at least 256 MB); none
        where operations are amortised in a graph, or the cache is unknown."""
        if self.graph or not self.llc_bytes:
            return None
        return max(2 * self.llc_bytes, GPU_FLUSH_BYTES) if self.kind == "cuda" else 2 * self.llc_bytes


def facts(backend: Backend) -> DeviceFacts:
    """The device of ``backend``'s worker (after its ``setup``). ``timing`` names the method
    (docs/ceilings.md): ``perf_counter`` (a host-synchronous CPU), ``cuda_events``, or the host
    clock around the backend's synchronisation over :data:`GRAPH_REPS` operations
    (``xla_graph/8``, ``tpu_queue/8``)."""
    import torch

    family = backend.name.split("-")[0]
    device = backend.device()
    kind = backend.device_kind
    if family in ("xla", "tpu"):
        method = "xla_graph" if family == "xla" else "tpu_queue"
        llc = cpu_llc_bytes() if kind == "cpu" else None  # PJRT CPU runs in the host's caches
        return DeviceFacts(backend, device, kind, llc, GRAPH_REPS, f"{method}/{GRAPH_REPS}")
    if kind == "cuda":
        llc = torch.cuda.get_device_properties(device).L2_cache_size
        return DeviceFacts(backend, device, kind, llc, 1, "cuda_events")
    return DeviceFacts(backend, device, kind, cpu_llc_bytes(), 1, "perf_counter")
