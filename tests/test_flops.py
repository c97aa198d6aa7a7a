"""Analytic FLOPs per step against torch.utils.flop_counter, at every size.

The models are built on the meta device, so even 8b costs no memory or time; on meta,
SDPA decomposes into bmm, which the flop counter sees (the fused CPU kernel it does not).
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import workloads

CASES = [(w.name, size) for w in workloads.registry().values() if w.suite == "llm" for size in w.sizes]


@pytest.mark.parametrize(("name", "size"), CASES)
@pytest.mark.parametrize("mode", ["train", "infer"])
def test_analytic_flops_match_flop_counter(name: str, size: str, mode: str) -> None:
    workload = workloads.get_workload(name)
    config = workload.config(size)
    batch_size, seq_len = 2, 64
    with torch.device("meta"):
        model = workload.build_model(config)
        batch = {key: torch.zeros(batch_size, seq_len, dtype=torch.long) for key in ("input_ids", "targets")}
    with FlopCounterMode(display=False) as counter:
        if mode == "train":
            workload.loss(model, batch).backward()
        else:
            with torch.no_grad():
                workload.forward(model, batch)
    counted = counter.get_total_flops()
    assert workload.flops(config, batch_size, seq_len, mode) == pytest.approx(counted, rel=0.05)
