"""``torch.compile`` bookkeeping shared by the compiled backends (cpu-compile, cuda-compile).

Dynamo keeps its statistics in private module-level tables; they are read defensively so
that a torch release that renames them yields a null figure, never a crash.
"""

from __future__ import annotations

import torch


def compile_count() -> int:
    """Distinct graphs Dynamo has compiled in this process (a recompile adds one)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def compile_seconds() -> float | None:
    """Frame compilation plus the lazily compiled backward graphs, in seconds.

    Dynamo compiles the forward when a frame is first called and AOTAutograd compiles the
    backward at the first ``backward()``, so both tables are needed.
    """
    try:
        from torch._dynamo.utils import compilation_time_metrics
    except ImportError:
        return None
    keys = ("_compile.compile_inner", "compile_fx.<locals>.bw_compiler")
    return float(sum(sum(compilation_time_metrics.get(key, ())) for key in keys))


def compile_model(model: torch.nn.Module, backend: str = "inductor") -> torch.nn.Module:
    """Compile with static shapes: a benchmark's shapes never change, so neither should graphs."""
    return torch.compile(model, backend=backend, dynamic=False)


class InductorCompiled:
    """Mixin for a backend that runs the model through ``torch.compile`` with Inductor."""

    def prepare(self, model: torch.nn.Module) -> torch.nn.Module:
        return compile_model(model)

    def compile_count(self) -> int:
        return compile_count()

    def compile_seconds(self) -> float | None:
        return compile_seconds()
