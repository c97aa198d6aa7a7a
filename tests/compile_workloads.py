"""Test-only workloads (and a cheap compiled backend) for the ``compiles`` table.

Each makes a backend compile in a known way, at a known line of this file:

- ``recompile-shape``: batch 8, 8, 12, 8, 16 (``Workload.batch_schedule``), so a compiled
  backend recompiles at steps 2 and 4 and finds step 3's graph again;
- ``item-in-step``: a ``.item()`` in the forward: a Dynamo graph break (GB0124) whose
  resumed frame guards on the float's value, a host read on XLA;
- ``histc-fallback``: ``torch.histc``, which torch_xla runs on the CPU (a missing lowering);
  with the shape schedule, so xla-compile recompiles after the fallback has been counted;
- ``compile-clean``: nothing of the above.

``cpu-compile-eager`` is cpu-compile with Dynamo's ``aot_eager`` backend instead of
Inductor: the same Dynamo records at a fraction of Inductor's compile time (an Inductor
compile took minutes on the shared 2-core CI host), for the tests that check Dynamo's side.

Registered through ``TPUBENCH_WORKLOAD_MODULES`` and ``TPUBENCH_BACKEND_MODULES`` (see
conftest.py's ``compile_workloads`` fixture), so every worker process sees them too.
"""

from __future__ import annotations

import torch
from torch import nn

from tpubench.backends.cpu import CpuCompileBackend
from tpubench.backends.dynamo import compile_model
from workloads.base import Shape, Workload

WIDTH = 16
SHAPE_SCHEDULE = (8, 8, 12, 8, 16)


class Scaled(nn.Module):
    """A linear layer whose output is divided by its largest magnitude, read to the host."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.layer(x)
        scale = y.abs().max().item()  # ITEM_LINE: a graph break (Dynamo), a host read (XLA)
        return y / (scale + 1.0)


class Histogram(nn.Module):
    """A linear layer plus a histogram of its output, an op torch_xla has no lowering for."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.layer(x)
        counts = torch.histc(y.detach(), bins=4)  # HISTC_LINE: a CPU fallback on XLA
        return y + counts.sum() * 0.0


def _workload(name: str, model: type[nn.Module], schedule: tuple[int, ...] = ()) -> Workload:
    return Workload(
        name=name,
        suites=("compiles",),
        family="test",
        description=f"test-only: {name}",
        sizes={"tiny": 0},
        default_size="tiny",
        default_shape={"cpu": Shape(schedule[0] if schedule else 8, 1)},
        build_model=lambda config: model(),
        make_batch=lambda config, shape, generator: {"x": torch.randn(shape.batch_size, WIDTH, generator=generator)},
        loss=lambda model, batch: model(batch["x"]).square().mean(),  # CALL_LINE: where the model is called
        forward=lambda model, batch: model(batch["x"]),
        flops=lambda config, shape, mode: (6 if mode == "train" else 2) * shape.batch_size * WIDTH * WIDTH * 1.0,
        estimate_memory_bytes=lambda config, shape, mode, dtype: 1024,
        batch_schedule=schedule,
    )


WORKLOADS = (
    _workload("recompile-shape", lambda: nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU()), SHAPE_SCHEDULE),
    _workload("item-in-step", Scaled),
    _workload("histc-fallback", Histogram, SHAPE_SCHEDULE),
    _workload("compile-clean", lambda: nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU())),
)


class CpuCompileEager(CpuCompileBackend):
    """cpu-compile through Dynamo and AOTAutograd without Inductor's code generation."""

    name = "cpu-compile-eager"
    description = "test-only: torch.compile(backend='aot_eager') on the host CPU"

    def prepare(self, model: nn.Module) -> nn.Module:
        return compile_model(model, backend="aot_eager")


BACKENDS = (CpuCompileEager,)


def line_of(marker: str) -> str:
    """``tests/compile_workloads.py:N``: the line of this file that carries ``marker``."""
    with open(__file__) as stream:
        for number, line in enumerate(stream, 1):
            if marker in line and "def line_of" not in line and "marker in line" not in line:
                return f"tests/compile_workloads.py:{number}"
    raise LookupError(marker)
