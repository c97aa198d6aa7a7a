"""The workload registry: published dimensions, defaults, determinism, the public API."""

from __future__ import annotations

import pytest
import torch

import workloads
from workloads.llm.decoder import parameter_count


def test_llm_suite_has_gpt2_and_llama3_with_their_sizes() -> None:
    assert workloads.suites()["llm"] == ["gpt2", "llama3"]
    assert list(workloads.get_workload("gpt2").sizes) == ["tiny", "124m", "355m", "774m", "1.5b"]
    assert list(workloads.get_workload("llama3").sizes) == ["tiny", "1b", "3b", "8b"]


PUBLISHED = [(w.name, size) for w in workloads.registry().values() for size in w.published]


@pytest.mark.parametrize(("name", "size"), PUBLISHED)
def test_published_sizes_have_exactly_the_published_parameter_count(name: str, size: str) -> None:
    """Unique parameter elements (a tied LM head once), built on the meta device."""
    workload = workloads.get_workload(name)
    with torch.device("meta"):
        model = workload.build_model(workload.config(size))
    total = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    assert total == workload.published[size].params
    if workload.suite == "llm":
        assert parameter_count(workload.config(size)) == pytest.approx(total, rel=0.01)


def test_every_real_llm_size_has_a_published_figure_and_llama3_8b_is_mlperf() -> None:
    assert [size for size in workloads.get_workload("gpt2").sizes if size != "tiny"] == list(
        workloads.get_workload("gpt2").published
    )
    llama3 = workloads.get_workload("llama3")
    assert list(llama3.published) == ["1b", "3b", "8b"]
    assert llama3.suites_of("8b") == ("llm", "mlperf") and llama3.suites_of("1b") == ("llm",)
    # the MLPerf reference models: resnet50-v1.5, bert (large), llama3.1 8b, mixtral 8x7b
    mlperf = {
        name: workloads.suite_sizes("mlperf", workloads.get_workload(name)) for name in workloads.suites()["mlperf"]
    }
    assert mlperf == {"llama3": ["8b"], "resnet": ["50"], "bert": ["large"], "mixtral": ["8x7b"]}
    assert workloads.suite_sizes("llm", llama3) is None


def test_shapes_name_their_dimensions_and_refuse_ones_a_workload_does_not_take() -> None:
    assert workloads.Shape(8, seq_len=128).dims() == {"seq_len": 128}
    assert workloads.Shape(8, image_size=224).dims() == {"image_size": 224}
    gpt2 = workloads.get_workload("gpt2")
    assert gpt2.dims == ("seq_len",)
    assert gpt2.shape("cpu", 2) == workloads.Shape(2, seq_len=128)
    with pytest.raises(ValueError, match="takes seq_len, not image_size"):
        gpt2.shape("cpu", image_size=224)
    with pytest.raises(ValueError, match="takes seq_len, not image_size"):
        workloads.load("gpt2", "tiny", image_size=32)


def test_an_image_workload_builds_at_its_image_size(shape_workloads: None) -> None:
    instance = workloads.load("toy-vision", "tiny", batch_size=3, image_size=24)
    assert instance.shape == workloads.Shape(3, image_size=24) and instance.seq_len is None
    assert instance.batch["pixels"].shape == (3, 3, 24, 24)
    assert instance.forward().shape == (3, 10)
    assert workloads.suites()["toys"] == ["toy-vision", "toy-latent"]


@pytest.mark.parametrize("backend", ["cpu", "cpu-compile"])
def test_each_backend_runs_the_cpu_builds_parameters(backend: str) -> None:
    """What a run counts (``param_count``): the prepared model on the backend's device; xla in
    test_xla. TorchTPU's ``tpu`` device cannot be built on without a chip."""
    from tpubench.backends import get_backend

    chosen = get_backend(backend)
    prepared = chosen.prepare(workloads.load("gpt2", "tiny", device=chosen.device()).model)
    model = getattr(prepared, "_orig_mod", prepared)  # torch.compile's wrapper holds the model's parameters
    assert model.lm_head.weight is model.token_embedding.weight
    assert sum(p.numel() for p in prepared.parameters()) == 790_016


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_moving_a_model_keeps_its_tied_lm_head_tied(device: str) -> None:
    """``Module.to`` gives every module its own new Parameter where the tensor type changes
    (CPU to XLA); torch's overwrite flag makes it do so for any move, which is how this test
    meets the bug without torch_xla (test_xla meets it on xla)."""
    reference = workloads.load("gpt2", "tiny").model
    model = workloads.load("gpt2", "tiny").model
    torch.__future__.set_overwrite_module_params_on_conversion(True)
    try:
        model = workloads.base.to_device(model, torch.device(device))
    finally:
        torch.__future__.set_overwrite_module_params_on_conversion(False)
    assert model.lm_head.weight is model.token_embedding.weight
    assert [p.numel() for p in model.parameters()] == [p.numel() for p in reference.parameters()]


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
