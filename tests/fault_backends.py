"""Test-only backends that compute something else, to check --verify catches it.

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


class Untied(CpuBackend):
    """The cpu backend, except that every shared parameter gets a copy of its own: what
    torch_xla's ``Module.to`` did to gpt2's tied LM head. The first loss is unchanged."""

    name = "cpu-untied"
    description = "test-only: cpu with shared weights untied"

    def prepare(self, model: nn.Module) -> nn.Module:
        seen: set[int] = set()
        for module in model.modules():
            for name, parameter in module.named_parameters(recurse=False):
                if id(parameter) in seen:
                    setattr(module, name, nn.Parameter(parameter.detach().clone()))
                seen.add(id(parameter))
        return model


BACKENDS = (OffByOnePercent, Untied)
