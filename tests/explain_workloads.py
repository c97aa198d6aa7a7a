"""A test-only workload whose batch changes between steps, for ``tpubench compiles --explain``.

Registered through ``TPUBENCH_WORKLOAD_MODULES=explain_workloads``. The step takes the first
8, 8, 12, 8, 16 rows of a 16-row batch in turn, so XLA compiles a new graph at the third
step, and its IR names the slice below as the line where the shape came in.
"""

from __future__ import annotations

import itertools

import torch
from torch import nn

from workloads.base import Shape, Workload

BATCHES = (8, 8, 12, 8, 16)
SLICE_LINE = 25  # the line of the slice in loss(); test_compiles_read checks --explain names it


def _loss():
    sizes = itertools.cycle(BATCHES)

    def loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        rows = batch["x"][: next(sizes)]
        return model(rows).square().mean()

    return loss


WORKLOAD = Workload(
    name="explain-shape",
    suites=("faults",),
    family="test",
    description="test-only: a batch of 8, 8, 12, 8, 16 rows in turn",
    sizes={"tiny": 0},
    default_size="tiny",
    default_shape={"cpu": Shape(16)},
    build_model=lambda config: nn.Linear(16, 4),
    make_batch=lambda config, shape, generator: {"x": torch.randn(shape.batch_size, 16, generator=generator)},
    loss=_loss(),
    forward=lambda model, batch: model(batch["x"]),
    flops=lambda config, shape, mode: 6.0 * shape.batch_size * 16 * 4,
    estimate_memory_bytes=lambda config, shape, mode, dtype: 4096,
)
