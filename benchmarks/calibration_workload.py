"""A calibration workload with a known amount of extra work, for benchmarks/regression_calibration.py.

``calib-mlp`` is a stack of square Linear + tanh layers; its size is the layer count:
``base`` has 20, and ``plus5``, ``plus10``, ``plus20`` have 5, 10 and 20% more, so each does
exactly that much more matmul work on the same shape. The calibration compares ``base``
with a ``plus`` size while pairing on everything but the size, as it would a code change.
(The sizes are not one environment switch because workers fork from a fork server per
environment: switching it per run would restart the server, and its import of torch,
every time.) Registered with ``TPUBENCH_WORKLOAD_MODULES=calibration_workload`` and
``benchmarks/`` on ``PYTHONPATH``.
"""

from __future__ import annotations

import torch
from torch import nn

from workloads.base import Shape, Workload

WIDTH = 256
#: size name -> layers; the share of extra work is exact in FLOPs
SIZES = {"base": 20, "plus5": 21, "plus10": 22, "plus20": 24}


def _build(layers: int) -> nn.Module:
    stack: list[nn.Module] = []
    for _ in range(layers):
        stack += [nn.Linear(WIDTH, WIDTH), nn.Tanh()]
    return nn.Sequential(*stack)


WORKLOAD = Workload(
    name="calib-mlp",
    suites=("calibration",),
    family="calibration",
    description=f"calibration: Linear({WIDTH}) + tanh layers; plusN sizes do N% more work than base",
    sizes=SIZES,
    default_size="base",
    default_shape={"cpu": Shape(64, 1)},
    build_model=_build,
    make_batch=lambda layers, shape, generator: {"x": torch.randn(shape.batch_size, WIDTH, generator=generator)},
    loss=lambda model, batch: model(batch["x"]).square().mean(),
    forward=lambda model, batch: model(batch["x"]),
    flops=lambda layers, shape, mode: (6 if mode == "train" else 2) * shape.batch_size * WIDTH * WIDTH * layers,
    estimate_memory_bytes=lambda layers, shape, mode, dtype: (
        4 * layers * (WIDTH * WIDTH + 2 * shape.batch_size * WIDTH)
    ),
    modes=("train", "infer"),
)
