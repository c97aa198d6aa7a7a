"""Compile counts and CPU fallbacks of mixtral and dit at tiny size on a torch_xla device.

Run as ``python tests/xla_moe_diffusion_steps.py`` under the torch_xla interpreter (PJRT
CPU in the tests); prints JSON {case: {"compiles": [...], "fallbacks": {...}}}, with the
``UncachedCompile`` count after every step (train and infer: ``STEPS`` steps; prefill
and decode: three whole greedy generations, one count per token) and the ``aten::*`` ops
that ran on the CPU instead of the device.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch
import torch_xla.debug.metrics as met

from tpubench.backends.xla import XlaBackend
from tpubench.measure import make_step
from workloads.base import Shape, build
from workloads.diffusion import dit
from workloads.moe import mixtral

STEPS, PROMPT, GENERATED = 4, 16, 6
CASES = [
    (mixtral.WORKLOAD, Shape(batch_size=2, seq_len=PROMPT), ("train", "infer", "decode")),
    (dit.WORKLOAD, Shape(batch_size=2, latent_size=8), ("train", "infer")),
]


def run(backend: XlaBackend, workload, shape: Shape, mode: str) -> dict:
    met.clear_all()
    instance = build(workload, "tiny", device=backend.device(), shape=shape)
    compiles = []
    if mode == "decode":  # three generations of a prefill then decode steps
        greedy = instance.greedy(instance.model.eval(), PROMPT + GENERATED)
        with torch.no_grad():
            for _ in range(3):
                for _token in greedy.tokens(GENERATED):
                    backend.after_step()
                    compiles.append(backend.compile_count())
    else:
        step = make_step(instance, instance.model, mode)
        for _ in range(STEPS):
            output = step()
            backend.after_step()
            compiles.append(backend.compile_count())
            del output
    fallbacks = {name: met.counter_value(name) for name in met.counter_names() if name.startswith("aten::")}
    return {"compiles": compiles, "fallbacks": fallbacks}


if __name__ == "__main__":
    backend = XlaBackend()
    print(
        json.dumps(
            {
                f"{workload.name}/{mode}": run(backend, workload, shape, mode)
                for workload, shape, modes in CASES
                for mode in modes
            }
        )
    )
