"""A tiny workload's training losses or greedy tokens on the xla backends, on one device or
split over N.

Run as ``python tests/spmd_outputs.py WORKLOAD PARALLEL DEVICES TP [--backend xla-compile]
[--decode]`` under the torch_xla interpreter with ``PJRT_DEVICE=CPU`` (and
``CPU_NUM_DEVICES=DEVICES`` for N > 1, as ``XlaBackend.worker_env_for`` sets it). It takes
the worker's own path: ``setup`` (SPMD), ``build``, ``tpubench.worker.apply_plan``,
``prepare``, then ``make_step``'s AdamW step with the workload's loss wrapped to keep each
step's value (rows carry no losses), or with ``--decode`` a greedy generation. Prints JSON:
the losses or tokens, the device count torch_xla saw, and each parameter's sharding.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from tpubench.backends import Backend, get_backend
from tpubench.measure import make_step
from tpubench.spec import RunSpec
from tpubench.worker import apply_plan
from workloads import Instance, Shape, build, get_workload

STEPS, BATCH, SEQ, GENERATED = 3, 4, 32, 8


def losses(backend: Backend, instance: Instance) -> list[float]:
    seen: list[torch.Tensor] = []

    def recorded(model: torch.nn.Module, batch: dict) -> torch.Tensor:
        loss = instance.workload.loss(model, batch)
        seen.append(loss)
        return loss

    model = backend.prepare(instance.model)
    step = make_step(replace(instance, workload=replace(instance.workload, loss=recorded)), model, "train")
    for _ in range(STEPS):
        step()
        backend.after_step()
    backend.synchronize()
    return [loss.item() for loss in seen]


def tokens(backend: Backend, instance: Instance) -> list[list[int]]:
    model = backend.prepare(instance.model.eval())
    found = []
    with torch.no_grad():
        for token in instance.greedy(model, SEQ + GENERATED).tokens(GENERATED):
            backend.after_step()
            found.append(token.cpu())
    return torch.cat(found, dim=1).tolist()


def main() -> None:
    import torch_xla
    import torch_xla.runtime as xr

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("workload")
    parser.add_argument("parallel")
    parser.add_argument("devices", type=int)
    parser.add_argument("tp", type=int)
    parser.add_argument("--backend", default="xla")
    parser.add_argument("--decode", action="store_true")
    args = parser.parse_args()
    mode = "decode" if args.decode else "train"
    spec = RunSpec(
        "llm", args.workload, "tiny", args.backend, mode, "float32", BATCH, SEQ, devices=args.devices,
        parallel=args.parallel, tp_size=args.tp, scaling="strong" if args.devices > 1 else None,
    )  # fmt: skip
    backend = get_backend(args.backend)
    backend.setup(spec)
    instance = build(get_workload(args.workload), "tiny", device=backend.device(), shape=Shape(BATCH, seq_len=SEQ))
    instance = apply_plan(spec, backend, instance)
    found = tokens(backend, instance) if args.decode else losses(backend, instance)
    shardings = {name: torch_xla._XLAC._get_xla_sharding_spec(p) for name, p in instance.model.named_parameters()}
    print(
        json.dumps(
            {
                "tokens" if args.decode else "losses": found,
                "devices": xr.global_runtime_device_count(),
                "shardings": {name: sharding for name, sharding in shardings.items() if sharding},
            }
        )
    )


if __name__ == "__main__":
    main()
