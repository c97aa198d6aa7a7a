"""The workload registry: published dimensions, defaults, determinism, the public API."""

from __future__ import annotations

import pytest
import torch

import workloads
from workloads.llm import parameter_count


def test_llm_suite_has_gpt2_and_llama3_with_their_sizes() -> None:
    assert workloads.suites()["llm"] == ["gpt2", "llama3"]
    assert list(workloads.get_workload("gpt2").sizes) == ["tiny", "124m", "355m", "774m", "1.5b"]
    assert list(workloads.get_workload("llama3").sizes) == ["tiny", "1b", "3b", "8b"]


@pytest.mark.parametrize(
    ("name", "size", "published_millions"),
    [
        ("gpt2", "124m", 124),
        ("gpt2", "355m", 355),
        ("gpt2", "774m", 774),
        ("gpt2", "1.5b", 1558),
        ("llama3", "1b", 1236),
        ("llama3", "3b", 3213),
        ("llama3", "8b", 8030),
    ],
)
def test_published_sizes_have_published_parameter_counts(name: str, size: str, published_millions: int) -> None:
    workload = workloads.get_workload(name)
    with torch.device("meta"):
        model = workload.build_model(workload.config(size))
    total = sum(p.numel() for p in model.parameters())
    assert total / 1e6 == pytest.approx(published_millions, rel=0.01)
    assert parameter_count(workload.config(size)) == pytest.approx(total, rel=0.01)


def test_llama3_uses_grouped_query_attention_and_swiglu() -> None:
    config = workloads.get_workload("llama3").config("8b")
    assert (config.n_head, config.kv_heads, config.d_model, config.d_ff) == (32, 8, 4096, 14336)
    model = workloads.load("llama3", "tiny").model
    attention = model.blocks[0].attention
    assert attention.k.out_features == attention.q.out_features // 2  # tiny: 4 query heads, 2 KV heads
    assert isinstance(model.blocks[0].attention_norm, torch.nn.RMSNorm)


def test_unknown_names_list_the_valid_choices() -> None:
    with pytest.raises(KeyError, match="valid: gpt2, llama3"):
        workloads.get_workload("t5")
    with pytest.raises(KeyError, match="valid: tiny, 1b, 3b, 8b"):
        workloads.get_workload("llama3").config("124m")


@pytest.mark.parametrize("name", ["gpt2", "llama3"])
def test_load_is_seeded_and_uses_the_per_device_default_shape(name: str) -> None:
    first, second = workloads.load(name, "tiny"), workloads.load(name, "tiny")
    shape = workloads.get_workload(name).shape_for("cpu")
    assert first.batch["input_ids"].shape == (shape.batch_size, shape.seq_len)
    assert torch.equal(first.batch["input_ids"], second.batch["input_ids"])
    assert torch.equal(first.loss(), second.loss())
    assert torch.equal(first.batch["targets"][:, :-1], first.batch["input_ids"][:, 1:])


def test_load_honours_dtype_batch_and_seq_len() -> None:
    instance = workloads.load("gpt2", "tiny", dtype=torch.bfloat16, batch_size=3, seq_len=17)
    assert instance.forward().shape == (3, 17, 2048)
    assert next(instance.model.parameters()).dtype == torch.bfloat16


def test_seq_len_beyond_the_context_is_refused() -> None:
    with pytest.raises(ValueError, match="context of 1024"):
        workloads.load("gpt2", "tiny", seq_len=2048)


def test_plugin_modules_extend_the_registry(fault_workloads: None) -> None:
    assert "fault-abort" in workloads.registry()
    assert "faults" in workloads.suites()
