"""Training losses of the tiny decoders split over a real process group, for test_ranks.py.

Run as N rank processes (``ranks.rank_env``'s variables set) with arguments
``WORKLOAD:PARALLEL[:TP] ...``; each configuration is built from the one seed, split by
``tpubench.parallel.dtensor.apply`` (the code a rank of a run uses) and trained for
:data:`STEPS` AdamW steps on one global batch. Rank 0 prints JSON: per configuration, the
loss of each step over the global batch, the parameter elements rank 0 holds and (tp)
greedy tokens generated before training.
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch
import torch.distributed as dist

from tpubench.backends import get_backend
from tpubench.launch.rank import exit_rank
from tpubench.parallel import dtensor
from tpubench.spec import RunSpec
from workloads import build, get_workload

STEPS, BATCH, SEQ, GENERATED = 3, 4, 32, 4


def tokens(instance) -> list[list[int]]:
    """Greedy tokens through the static KV cache (a tensor-parallel rank's holds its heads)."""
    with torch.no_grad():
        generated = list(instance.greedy(instance.model, SEQ + GENERATED).tokens(GENERATED))
    return torch.cat(generated, dim=1).tolist()


def losses(instance) -> list[float]:
    """Each step's loss (the mean over the global batch) while training ``instance``."""
    optimizer = torch.optim.AdamW(instance.model.parameters(), lr=1e-3)
    found = []
    for _ in range(STEPS):
        loss = instance.workload.loss(instance.model, instance.batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if dist.is_initialized():  # every rank's mean over its slice; equal slices, so the mean of means
            loss = loss.detach().clone()
            dist.all_reduce(loss)
            loss /= dist.get_world_size()
        found.append(loss.item())
    return found


def run(configuration: str) -> dict:
    name, parallel, *tp = configuration.split(":")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    spec = RunSpec(
        suite="test", workload=name, size="tiny", backend="cpu", mode="train", dtype="float32",
        batch_size=BATCH, devices=world, parallel=parallel,
        tp_size=int(tp[0]) if tp else (world if parallel == "tp" else 1),
    )  # fmt: skip
    workload = get_workload(name)
    instance = build(workload, "tiny", batch_size=BATCH, seq_len=SEQ if "seq_len" in workload.dims else None)
    if parallel != "none":
        instance = dtensor.apply(spec, get_backend("cpu"), instance)
    # the tokens of the whole batch: only where every rank holds it (tp, or one device)
    generated = tokens(instance) if parallel in ("none", "tp") and workload.generation else None
    return {
        "losses": losses(instance),
        "local_params": dtensor.local_parameter_count(instance.model),
        "tokens": generated,
    }


if __name__ == "__main__":
    faulthandler.enable()  # an abort in torch's C++ (a gloo thread) shows where Python was
    torch.set_num_threads(1)
    found = {configuration: run(configuration) for configuration in sys.argv[1:]}
    if not dist.is_initialized() or dist.get_rank() == 0:
        print(json.dumps(found))
    dtensor.finish()
    exit_rank()
