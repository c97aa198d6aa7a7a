"""The training losses of a tiny workload on the xla backend, on one device or split over N.

Run as ``python tests/spmd_losses.py WORKLOAD PARALLEL DEVICES TP [BACKEND]`` (``xla``, the
default, or ``xla-compile``) under the torch_xla interpreter with ``PJRT_DEVICE=CPU`` (and ``CPU_NUM_DEVICES=DEVICES`` for N > 1, as
``XlaBackend.worker_env_for`` sets it). It takes the worker's own path: ``setup`` (SPMD),
``build``, ``tpubench.parallel.apply``, ``prepare`` and ``make_step``'s AdamW step, with the workload's
loss wrapped to keep each step's value (rows carry no losses). Prints JSON: the losses,
the device count torch_xla saw, and each sharded parameter's sharding spec.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from tpubench import parallel
from tpubench.backends import get_backend
from tpubench.measure import make_step
from tpubench.spec import RunSpec
from workloads import Shape, build, get_workload

STEPS, BATCH, SEQ = 3, 4, 32


def losses(workload_name: str, parallel_name: str, devices: int, tp: int, backend_name: str) -> dict:
    import torch_xla
    import torch_xla.runtime as xr

    spec = RunSpec(
        "llm", workload_name, "tiny", backend_name, "train", "float32", BATCH, SEQ, devices=devices, parallel=parallel_name,
        tp_size=tp, scaling="strong" if devices > 1 else None,
    )  # fmt: skip
    backend = get_backend(backend_name)
    backend.setup(spec)
    workload = get_workload(workload_name)
    instance = build(workload, "tiny", device=backend.device(), shape=Shape(BATCH, seq_len=SEQ))
    instance = parallel.apply(spec, backend, instance)
    seen: list[torch.Tensor] = []

    def recorded(model: torch.nn.Module, batch: dict) -> torch.Tensor:
        loss = workload.loss(model, batch)
        seen.append(loss)
        return loss

    model = backend.prepare(instance.model)
    step = make_step(replace(instance, workload=replace(workload, loss=recorded)), model, "train")
    for _ in range(STEPS):
        step()
        backend.after_step()
    backend.synchronize()
    shardings = {
        name: torch_xla._XLAC._get_xla_sharding_spec(param) for name, param in instance.model.named_parameters()
    }
    return {
        "losses": [loss.item() for loss in seen],
        "devices": xr.global_runtime_device_count(),
        "shardings": {name: spec for name, spec in shardings.items() if spec},
    }


if __name__ == "__main__":
    workload, parallel_name, devices, tp = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    print(json.dumps(losses(workload, parallel_name, devices, tp, sys.argv[5] if len(sys.argv) > 5 else "xla")))
