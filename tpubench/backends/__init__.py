"""The backend registry: adding a backend means one module and one line here.

Only names and classes live at this level; a backend's runtime (CUDA, XLA, TorchTPU) is
touched when its worker instantiates it, never when the parent process imports this.
"""

from __future__ import annotations

from tpubench.backends.base import Availability, Backend, StepTimer
from tpubench.backends.cpu import CpuBackend, CpuCompileBackend
from tpubench.backends.cuda import CudaBackend, CudaCompileBackend
from tpubench.backends.tpu import TpuBackend, TpuCompileBackend
from tpubench.backends.xla import XlaBackend, XlaCompileBackend

__all__ = ["BACKENDS", "Availability", "Backend", "StepTimer", "get_backend"]

BACKENDS: dict[str, type[Backend]] = {
    cls.name: cls
    for cls in (
        CpuBackend,
        CpuCompileBackend,
        CudaBackend,
        CudaCompileBackend,
        XlaBackend,
        XlaCompileBackend,
        TpuBackend,
        TpuCompileBackend,
    )
}


def get_backend(name: str) -> Backend:
    if name not in BACKENDS:
        raise KeyError(f"unknown backend {name!r}; valid: {', '.join(BACKENDS)}")
    return BACKENDS[name]()
