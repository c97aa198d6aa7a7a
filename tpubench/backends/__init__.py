"""The backend registry: adding a backend means one module and one line here.

Only names and classes live at this level; a backend's runtime (CUDA, XLA, TorchTPU) is
touched when its worker instantiates it, never when the parent process imports this.
"""

from __future__ import annotations

import importlib
import os

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


PLUGIN_ENV = "TPUBENCH_BACKEND_MODULES"


def _register_plugins() -> None:
    """Backends from the modules named in TPUBENCH_BACKEND_MODULES (comma-separated, each with
    a ``BACKENDS`` sequence of classes): for out-of-tree backends, and for tests. The
    variable reaches every worker, so they see the same registry as the parent."""
    for module_name in filter(None, (m.strip() for m in os.environ.get(PLUGIN_ENV, "").split(","))):
        for cls in importlib.import_module(module_name).BACKENDS:
            BACKENDS[cls.name] = cls


def get_backend(name: str) -> Backend:
    _register_plugins()
    if name not in BACKENDS:
        raise KeyError(f"unknown backend {name!r}; valid: {', '.join(BACKENDS)}")
    return BACKENDS[name]()


_register_plugins()
