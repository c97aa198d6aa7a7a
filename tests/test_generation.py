"""Greedy generation with the static KV cache."""

from __future__ import annotations

import pytest
import torch

import workloads


@pytest.mark.parametrize("name", ["gpt2", "llama3"])
def test_cached_greedy_decode_equals_full_recompute(name: str) -> None:
    instance = workloads.load(name, "tiny", batch_size=2, seq_len=16)
    model = instance.model.eval()
    generated = 6
    with torch.no_grad():
        reference = instance.batch["input_ids"]
        for _ in range(generated):  # no cache: the whole sequence every time
            reference = torch.cat([reference, model(reference)[:, -1:].argmax(-1)], dim=1)
        greedy = instance.greedy(model, 16 + generated)
        tokens = list(greedy.tokens(generated))
    assert torch.equal(torch.cat(tokens, dim=1), reference[:, 16:])
    assert greedy.position.item() == 16 + generated - 1
