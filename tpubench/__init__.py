"""tpubench: the same PyTorch models on CPUs, GPUs and TPUs, measured honestly.

The public Python API: :func:`tpubench.bench` measures your own model through the isolated
workers (see :mod:`tpubench.api`); :func:`workloads.load` builds a workload in your own code.
"""

from typing import Any

__version__ = "0.1.0"


class TpubenchWarning(UserWarning):
    """A note about a run that belongs in its row (``warnings`` column), e.g. an unknown peak."""


def __getattr__(name: str) -> Any:
    """``tpubench.bench``, imported on first use: ``import tpubench`` stays free of torch."""
    if name == "bench":
        from tpubench.api import bench

        return bench
    raise AttributeError(f"module 'tpubench' has no attribute {name!r}")
