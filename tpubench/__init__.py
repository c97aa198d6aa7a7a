"""tpubench: the same PyTorch models on CPUs, GPUs and TPUs, measured honestly.

The public Python API: :func:`tpubench.bench` measures your own model through the isolated
workers (see :mod:`tpubench.api`); :func:`workloads.load` builds a workload in your own code.
Nothing inside tpubench imports this package's root: its modules import the leaves
:mod:`tpubench.version` and :mod:`tpubench.warning`, so the root is the top of the graph.
"""

from typing import Any

from tpubench.version import __version__
from tpubench.warning import TpubenchWarning

__all__ = ["TpubenchWarning", "__version__", "bench"]


def __getattr__(name: str) -> Any:
    """``tpubench.bench``, imported on first use: ``import tpubench`` stays free of torch."""
    if name == "bench":
        from tpubench.api import bench

        return bench
    raise AttributeError(f"module 'tpubench' has no attribute {name!r}")
