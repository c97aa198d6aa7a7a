"""Numerics parity: the same seeded inputs through a backend and a CPU float32 eager reference.

A comparison between chips is worthless if they compute different things. ``--verify``
runs each workload twice more, in separate workers: once on the backend under test and
once on ``cpu`` in float32, from bit-identical weights and inputs (workloads are built on
the CPU from a seed, then moved). It compares what the mode produces:

* infer and prefill: the logits; prefill also its first greedy token;
* train: the loss before and after each of three AdamW steps, and the parameter count;
* decode: the prefill logits and the generated token ids.

Relative error is ``max|candidate - reference| / max|reference|``. Tolerances (below) are
per dtype; token ids must match exactly in float32 (in bfloat16 greedy paths may fork
legitimately, so tokens are reported but not judged). The parameter count must match
exactly: a backend that unties shared weights (torch_xla's ``Module.to`` did, until
``workloads.base.to_device``) trains a different model, yet its first step's loss is
identical; only later steps drift (0.36% after the second step for gpt2 tiny).

A train run of rank processes (cpu, cuda, tpu over several devices or hosts) is verified by
the losses its timed steps stored: step k's loss is the model's before its k-th update, the
same quantity as the reference's k-th loss here, and the job's is the mean of its ranks'
(each over an equal slice of the global batch). The reference runs on one device with the
global batch; the parameter count is not compared (a rank holds a shard).
"""

from __future__ import annotations

from typing import Any

import torch

from tpubench.backends import Backend
from tpubench.measure import make_step
from tpubench.spec import RunSpec
from workloads import GENERATION_MODES, Instance

TOLERANCE = {"float32": 1e-3, "bfloat16": 5e-2}
REFERENCE_BACKEND, REFERENCE_DTYPE = "cpu", "float32"
TRAIN_STEPS = 3  # optimizer steps whose losses train mode compares
EXACT = ("tokens", "param_count")  # outputs compared for equality, not within a tolerance
#: the reference of a run of rank processes: the same global batch on one device
ONE_DEVICE = {
    "devices": 1,
    "parallel": "none",
    "tp_size": 1,
    "scaling": None,
    "hosts": 1,
    "node_rank": 0,
    "master": None,
}


def outputs(spec: RunSpec, backend: Backend, instance: Instance) -> dict[str, torch.Tensor]:
    """What ``spec.mode`` computes on ``backend``, as float32 CPU tensors (token ids as int64)."""
    model = backend.prepare(instance.model)
    found: dict[str, Any] = {}
    if spec.mode == "train":
        step = make_step(instance, model, "train")
        losses = [instance.workload.loss(model, instance.batch).detach()]
        for _ in range(TRAIN_STEPS):
            step()
            backend.after_step()
            losses.append(instance.workload.loss(model, instance.batch).detach())
        found["loss"] = torch.stack(losses)
        found["param_count"] = torch.tensor([sum(p.numel() for p in model.parameters())])
    else:
        model.eval()
        with torch.no_grad():
            found["logits"] = instance.workload.forward(model, instance.batch)
        if spec.mode in GENERATION_MODES:
            found["tokens"] = greedy_tokens(instance, model, backend, max(spec.gen_len, 1))
    backend.after_step()
    return {key: (value.cpu() if key in EXACT else value.float().cpu()) for key, value in found.items()}


def stored_losses(steps: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """A ranked train run's outputs to compare: the job's loss (the mean of its ranks') at
    steps 0 to :data:`TRAIN_STEPS`, as far as every rank stored one."""
    by_step: dict[int, list[float | None]] = {}
    for row in steps:
        by_step.setdefault(row["step"], []).append(row.get("loss"))
    losses = []
    for step in range(TRAIN_STEPS + 1):
        found = by_step.get(step, [None])
        if any(loss is None for loss in found):
            break
        losses.append(sum(found) / len(found))
    return {"loss": torch.tensor(losses, dtype=torch.float32)}


def greedy_tokens(instance: Instance, model: torch.nn.Module, backend: Backend, count: int) -> torch.Tensor:
    """``count`` greedy tokens per sequence (B, count) through the static-cache path."""
    tokens = []
    with torch.no_grad():
        for token in instance.greedy(model, instance.seq_len + count).tokens(count):
            backend.after_step()
            tokens.append(token)
    return torch.cat(tokens, dim=1)


def compare(reference: dict[str, torch.Tensor], candidate: dict[str, torch.Tensor], dtype: str) -> dict[str, Any]:
    """The verify columns: ``verified`` (match/mismatch), ``max_rel_err``, ``verify_tolerance``,
    ``tokens_match``; with a parameter count that differs, also ``verify_note`` saying so (the
    runner puts it in the row's error)."""
    tolerance = TOLERANCE[dtype]
    errors = [
        float((candidate[key] - reference[key]).abs().max() / reference[key].abs().max().clamp_min(1e-30))
        for key in reference
        if key not in EXACT
    ]
    max_rel_err = max(errors)
    tokens_match = bool(torch.equal(reference["tokens"], candidate["tokens"])) if "tokens" in reference else None
    counts_match = "param_count" not in reference or torch.equal(reference["param_count"], candidate["param_count"])
    ok = max_rel_err <= tolerance and (tokens_match is not False or dtype != "float32") and counts_match
    columns = {
        "verified": "match" if ok else "mismatch",
        "max_rel_err": max_rel_err,
        "verify_tolerance": tolerance,
        "tokens_match": tokens_match,
    }
    if not counts_match:
        columns["verify_note"] = (
            f"{int(candidate['param_count'].sum())} parameter elements against the reference's "
            f"{int(reference['param_count'].sum())} (shared weights untied?)"
        )
    return columns
