"""A test-only backend that computes something else, to check --verify catches it.

Registered through ``TPUBENCH_BACKEND_MODULES=fault_backends`` (see conftest.py).
"""

from __future__ import annotations

from torch import nn

from tpubench.backends.cpu import CpuBackend


class OffByOnePercent(CpuBackend):
    """The cpu backend, except that every model output is scaled by 1.01."""

    name = "cpu-wrong"
    description = "test-only: cpu with outputs scaled by 1.01"

    def prepare(self, model: nn.Module) -> nn.Module:
        model.register_forward_hook(lambda module, inputs, output: output * 1.01)
        return model


BACKENDS = (OffByOnePercent,)
