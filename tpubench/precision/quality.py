"""Quality beside speed: a converted run's divergence from bf16 of the same seed and inputs.

A faster run that no longer computes the same model is no win, so every converted row
(fp8, int8, int4...) carries how far it moved from the bf16 model it was converted from,
measured in its own worker, outside the timed steps (docs/precision.md):

* infer, prefill and decode: the bf16 model's logits on the run's fixed inputs, taken before
  conversion (one extra forward, its logits held on the device until the measurement ends),
  against the converted model's on the same inputs after it: ``logits_rel_error``
  (``||converted - bf16|| / ||bf16||``, Frobenius norms over the whole logits tensor) and
  ``top1_agreement`` (the share of positions whose argmax agrees; classifiers and language
  models only).
* train: ``final_loss`` is the loss of the run's last measured step, computed after every
  earlier step's update; ``reference_loss`` is a fresh bf16 model's (same seed, same
  batches) after the same number of AdamW steps, run eagerly after the measurement on the
  same device (its cost: that many bf16 steps and a second model's memory). ``loss_rel_diff``
  is their signed relative difference.

``quality_ok`` holds a row to :data:`LOGITS_BOUND` and :data:`TOP1_BOUND` (inference) or
:data:`LOSS_BOUND` (training): the bounds docs/precision.md gives with the figures measured.
"""

from __future__ import annotations

from typing import Any

import torch

from tpubench.backends import Backend
from tpubench.measure import StepRecord, make_step
from tpubench.precision.choices import REFERENCE
from workloads import Instance, Shape, Workload, build

#: the largest relative logits error a converted inference run may have and still compute the model
LOGITS_BOUND = 0.10
#: the smallest share of positions whose top-1 class must agree with bf16's
TOP1_BOUND = 0.90
#: the largest relative loss difference from bf16 after the same training steps
LOSS_BOUND = 0.05
#: the suites whose outputs are class scores (a diffusion model's noise prediction is not)
CLASSIFIERS = ("llm", "moe", "vision", "encoder")


def logits(instance: Instance, model: torch.nn.Module) -> torch.Tensor:
    """``model``'s output on the instance's fixed inputs, under no_grad, in eval mode, moved to
    the host in its own dtype: held there, it adds nothing to the run's device memory peak."""
    was_training = model.training
    model.eval()
    with torch.no_grad():
        output = instance.workload.forward(model, instance.batch)
    model.train(was_training)
    return output.detach().cpu()


def inference_columns(reference: torch.Tensor, instance: Instance) -> dict[str, Any]:
    """The quality columns of an inference run: the converted model's logits (eager, the
    instance's model after conversion) against the bf16 ``reference``, compared on the host
    one sample at a time in float32 (a whole batch of a large vocabulary would double)."""
    candidate = logits(instance, instance.model)
    squared_error = squared_norm = agreeing = 0.0
    for got, expected in zip(candidate, reference, strict=True):
        got, expected = got.float(), expected.float()
        squared_error += float((got - expected).square().sum())
        squared_norm += float(expected.square().sum())
        if expected.ndim >= 1:
            agreeing += float((got.argmax(-1) == expected.argmax(-1)).float().sum())
    error = (squared_error / max(squared_norm, 1e-30)) ** 0.5
    positions = reference[..., 0].numel()
    agreement = None
    if instance.workload.suite in CLASSIFIERS and reference.ndim >= 2:
        agreement = agreeing / positions
    ok = error <= LOGITS_BOUND and (agreement is None or agreement >= TOP1_BOUND)
    return {
        "reference_precision": REFERENCE,
        "logits_rel_error": error,
        "top1_agreement": agreement,
        "quality_ok": ok,
    }


def train_columns(
    workload: Workload, size: str, shape: Shape, backend: Backend, records: list[StepRecord]
) -> dict[str, Any]:
    """The quality columns of a training run: its last measured step's loss against a fresh
    bf16 model's after as many eager steps on the same device (see the module doc)."""
    final = next((r.loss for r in reversed(records) if r.phase == "measure" and r.loss is not None), None)
    if final is None:
        return {"reference_precision": REFERENCE}
    count = 1 + max(r.step for r in records if r.phase == "measure")
    instance = build(workload, size, device=backend.device(), dtype=torch.bfloat16, shape=shape)
    step = make_step(instance, instance.model, "train")
    for _ in range(count):
        loss = step()
        backend.after_step()
    reference = float(loss.float().cpu())
    difference = (final - reference) / abs(reference) if reference else None
    return {
        "reference_precision": REFERENCE,
        "final_loss": final,
        "reference_loss": reference,
        "loss_rel_diff": difference,
        "quality_ok": difference is not None and abs(difference) <= LOSS_BOUND,
    }
