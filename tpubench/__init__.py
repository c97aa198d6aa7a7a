"""tpubench: the same PyTorch models on CPUs, GPUs and TPUs, measured honestly.

The public Python API for running a workload in your own code is :func:`workloads.load`.
"""

__version__ = "0.1.0"


class TpubenchWarning(UserWarning):
    """A note about a run that belongs in its row (``warnings`` column), e.g. an unknown peak."""
