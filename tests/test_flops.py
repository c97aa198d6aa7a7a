"""Analytic FLOPs per step against torch.utils.flop_counter, at every size, within 1%.

The models are built on the meta device, so even 8b costs no memory or time; on meta,
SDPA decomposes into bmm, which the flop counter sees (the fused CPU kernel it does not:
on a CPU tensor it counts 0).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import workloads
from tpubench.runner import SuiteRunner, plan
from workloads.base import Instance, Shape

CASES = [(w.name, size) for w in workloads.registry().values() for size in w.sizes]


@pytest.mark.parametrize(("name", "size"), CASES)
@pytest.mark.parametrize("mode", ["train", "infer"])
def test_analytic_flops_match_flop_counter(name: str, size: str, mode: str) -> None:
    workload = workloads.get_workload(name)
    config = workload.config(size)
    shape = replace(workload.shape_for("cpu"), batch_size=2)
    with torch.device("meta"):
        model = workload.build_model(config)
    batch = {k: v.to("meta") for k, v in workload.make_batch(config, shape, torch.Generator().manual_seed(0)).items()}
    with FlopCounterMode(display=False) as counter:
        if mode == "train":
            workload.loss(model, batch).backward()
        else:
            with torch.no_grad():
                workload.forward(model, batch)
    counted = counter.get_total_flops()
    assert counted > 0
    assert workload.flops(config, shape, mode) == pytest.approx(counted, rel=0.01)


def test_a_decode_runs_flops_per_step_is_what_the_flop_counter_counts(results_dir: Path) -> None:
    """A decode run's row against FlopCounterMode over the same generation on the meta device.

    The prefill attends over the whole static cache (prompt + generated positions), not the
    prompt alone, and so does each decode step; the row must count what actually runs.
    """
    batch_size, prompt, generated = 2, 32, 32
    specs = plan(
        ["gpt2", "llama3"], modes=["decode"], batch_size=batch_size, seq_len=prompt, gen_len=generated, steps=1
    )
    for row in SuiteRunner(results_dir).run(specs):
        assert row["status"] == "ok", row.get("stderr_tail")
        workload = workloads.get_workload(row["workload"])
        with torch.device("meta"):
            model = workload.build_model(workload.config(row["size"])).eval()
            batch = {"input_ids": torch.zeros(batch_size, prompt, dtype=torch.long)}
        instance = Instance(workload, row["size"], model, batch, Shape(batch_size, prompt))
        greedy = instance.greedy(model, prompt + generated)
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            assert len(list(greedy.tokens(generated))) == generated
        assert row["flops_per_step"] == pytest.approx(counter.get_total_flops(), rel=1e-9)
