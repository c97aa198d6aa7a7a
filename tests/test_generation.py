"""Greedy generation with the static KV cache (the workloads' part of issue 5)."""

from __future__ import annotations

import pytest
import torch

import workloads
from workloads import llm


@pytest.mark.parametrize("name", ["gpt2", "llama3"])
def test_cached_greedy_decode_equals_full_recompute(name: str) -> None:
    instance = workloads.load(name, "tiny", batch_size=2, seq_len=16)
    model, config = instance.model.eval(), instance.workload.config("tiny")
    generated = 6
    with torch.no_grad():
        reference = instance.batch["input_ids"]
        for _ in range(generated):  # no cache: the whole sequence every time
            reference = torch.cat([reference, model(reference)[:, -1:].argmax(-1)], dim=1)
        cache = llm.KVCache.allocate(config, 2, 16 + generated, torch.device("cpu"), torch.float32)
        tokens = [llm.prefill(model, instance.batch, cache)]
        position = torch.tensor([16])
        for _ in range(generated - 1):
            tokens.append(llm.decode(model, tokens[-1], position, cache))
    assert torch.equal(torch.cat(tokens, dim=1), reference[:, 16:])
    assert position.item() == 16 + generated - 1
