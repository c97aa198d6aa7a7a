"""Users' own models (workloads.custom): a factory in a file outside the repository, and
Hugging Face architectures built from their config classes offline, resolved into workloads
whose FLOPs and memory are counted, not declared; and every bad input, as a ModelRefError.

Hugging Face models are built with ``HF_HUB_OFFLINE=1`` from config classes at tiny sizes;
nothing is downloaded. The CLI and worker tests of ``--model`` live with the CLI's tests.
"""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest
import torch
from helpers import tpubench

import workloads
from tpubench import store
from workloads.base import DIMENSIONS, Shape
from workloads.custom import ModelRef, ModelRefError, dry_run, resolve
from workloads.llm import gpt2, llama3

os.environ["HF_HUB_OFFLINE"] = "1"

FACTORY = """
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self, width=16, with_loss=False):
        super().__init__()
        self.embed = nn.Embedding(64, width)
        self.proj = nn.Linear(width, width)
        self.with_loss = with_loss

    def forward(self, tokens, scale=None):
        out = self.proj(self.embed(tokens))
        return {"loss": out.square().mean(), "hidden": out} if self.with_loss else out

    def get_example_inputs(self):
        return (torch.randint(0, 64, (3, 5)),)


def make_model(width=16, with_loss=False):
    return Net(width, with_loss)


def make_inputs(batch_size, generator, seq_len=12):
    return {"tokens": torch.randint(0, 64, (batch_size, seq_len), generator=generator)}


def make_any_inputs(batch_size, generator, **dims):
    return {"tokens": torch.randint(0, 64, (batch_size, dims.get("seq_len", 5)), generator=generator)}


class Plain(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)


def make_plain():
    return Plain()


def make_unseeded():
    import random

    net = Net()
    with torch.no_grad():
        net.proj.weight.fill_(random.random())
    return net


def make_not_a_module():
    return {"weights": torch.zeros(2)}


def sum_loss(model, batch):
    return model(**batch).sum()


NOT_CALLABLE = 3
"""

LLAMA_TINY = llama3.SIZES["tiny"]
#: llama3/tiny's dimensions as LlamaConfig fields (rope_theta differs: no shape or FLOP depends on it)
LLAMA_OVERRIDES = (
    ("hidden_size", str(LLAMA_TINY.d_model)),
    ("num_hidden_layers", str(LLAMA_TINY.n_layer)),
    ("num_attention_heads", str(LLAMA_TINY.n_head)),
    ("num_key_value_heads", str(LLAMA_TINY.n_kv_head)),
    ("intermediate_size", str(LLAMA_TINY.d_ff)),
    ("vocab_size", str(LLAMA_TINY.vocab_size)),
    ("max_position_embeddings", "256"),
)
GPT2_TINY = gpt2.SIZES["tiny"]
GPT2_OVERRIDES = (
    ("n_embd", str(GPT2_TINY.d_model)),
    ("n_layer", str(GPT2_TINY.n_layer)),
    ("n_head", str(GPT2_TINY.n_head)),
    ("n_inner", str(GPT2_TINY.d_ff)),
    ("vocab_size", str(GPT2_TINY.vocab_size)),
    ("n_positions", str(GPT2_TINY.max_seq_len)),
)
BERT_OVERRIDES = (
    ("hidden_size", "32"),
    ("num_hidden_layers", "2"),
    ("num_attention_heads", "4"),
    ("intermediate_size", "64"),
    ("vocab_size", "256"),
)


@pytest.fixture
def factory_file(tmp_path: Path) -> Path:
    """The factory module, in a folder outside the repository (and off sys.path)."""
    path = tmp_path / "user_models" / "my_model.py"
    path.parent.mkdir()
    path.write_text(textwrap.dedent(FACTORY))
    return path


def factory(path: Path, function: str = "make_model", **fields) -> ModelRef:
    return ModelRef("factory", f"{path}:{function}", **fields)


def train_and_infer(workload: workloads.Workload, **shape) -> float:
    instance = workloads.build(workload, **shape)
    loss = instance.loss()
    loss.backward()
    with torch.no_grad():
        instance.forward()
    return loss.item()


def test_a_factory_file_with_make_inputs_runs_and_reports_a_synthesised_loss(factory_file: Path) -> None:
    ref = factory(factory_file, inputs=f"{factory_file}:make_inputs", overrides=(("width", "8"),))
    workload = resolve(ref)
    assert workload.dims == ("seq_len",)
    assert workload.shape_for("cpu") == Shape(2, seq_len=12)  # make_inputs's default seq_len
    config = workload.config("default")
    loss = train_and_infer(workload, batch_size=3, seq_len=7)
    assert workload.build_model(config).proj.in_features == 8  # the override reached make_model
    shape = Shape(3, seq_len=7)
    # the forward is one (3*7, 8) x (8, 8) matmul; train adds its two backward matmuls
    assert workload.flops(config, shape, "infer") == 2 * 21 * 8 * 8
    assert workload.flops(config, shape, "train") == 3 * 2 * 21 * 8 * 8
    columns = workload.row_columns(config, shape, "train")
    assert columns["loss_source"] == "synthesised: mean of outputs"
    assert columns["flops_source"] == "counted" and columns["flops_incomplete"] is None
    assert json.loads(columns["model_ref"])["target"] == ref.target
    assert loss == pytest.approx(workloads.build(workload, batch_size=3, seq_len=7).loss().item())  # seeded


def test_the_outputs_own_loss_is_used_and_a_changed_source_changes_the_hash(factory_file: Path) -> None:
    ref = factory(factory_file, inputs=f"{factory_file}:make_inputs", overrides=(("with_loss", "true"),))
    workload = resolve(ref)
    config = workload.config("default")
    train_and_infer(workload)
    assert workload.row_columns(config, workload.shape_for("cpu"), "train")["loss_source"] == "model .loss"
    user = resolve(factory(factory_file, inputs=f"{factory_file}:make_inputs", loss=f"{factory_file}:sum_loss"))
    assert user.row_columns(user.config("default"), user.shape_for("cpu"), "train")["loss_source"] == "user loss"
    before = config.model_hash
    factory_file.write_text(factory_file.read_text() + "\n# edited\n")
    assert resolve(ref).config("default").model_hash != before


def test_make_inputs_gets_the_dimensions_given_through_its_dims(factory_file: Path) -> None:
    workload = resolve(factory(factory_file, inputs=f"{factory_file}:make_any_inputs"))
    assert workload.dims == DIMENSIONS  # **dims takes any dimension...
    assert workload.shape_for("cpu") == Shape(2)  # ...and none reaches it unless given
    config = workload.config("default")
    assert workload.make_batch(config, workload.shape("cpu", 3, seq_len=7), torch.Generator())["tokens"].shape == (3, 7)
    assert workload.make_batch(config, workload.shape("cpu"), torch.Generator())["tokens"].shape == (2, 5)


def test_get_example_inputs_fixes_the_batch(factory_file: Path) -> None:
    workload = resolve(factory(factory_file))
    assert workload.dims == () and workload.shape_for("cpu") == Shape(3)
    train_and_infer(workload)
    with pytest.raises(ModelRefError, match="batch of 3, not 5"):
        dry_run(workload, Shape(5), "train")


def test_a_model_without_inputs_is_an_error(factory_file: Path) -> None:
    with pytest.raises(ModelRefError, match=r"no inputs for .*--inputs .*get_example_inputs"):
        resolve(factory(factory_file, "make_plain"))


def test_a_factory_drawing_unseeded_weights_is_an_error(factory_file: Path) -> None:
    workload = resolve(factory(factory_file, "make_unseeded", inputs=f"{factory_file}:make_inputs"))
    with pytest.raises(ModelRefError, match="unseeded weights"):
        workloads.build(workload)


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("{dir}/missing.py:make_model", "does not exist"),
        ("{dir}/my_model.py:make_nothing", "'make_nothing' not found .* make_model"),
        ("{dir}/my_model.py:NOT_CALLABLE", "is a int, not a callable"),
        ("{dir}/my_model.py:make_not_a_module", "returned a dict, not a torch.nn.Module"),
        ("no_such_package_xyz.models:make_model", "does not import: ModuleNotFoundError"),
        ("{dir}/my_model.py", "not a function reference"),
    ],
)
def test_bad_factory_references_are_errors(factory_file: Path, target: str, message: str) -> None:
    ref = ModelRef("factory", target.format(dir=factory_file.parent), inputs=f"{factory_file}:make_inputs")
    with pytest.raises(ModelRefError, match=message):
        resolve(ref)


def test_a_model_that_does_not_build_on_meta_is_counted_on_the_cpu_and_scaled(tmp_path: Path) -> None:
    path = tmp_path / "data_dependent.py"
    path.write_text(
        textwrap.dedent(
            """
            import torch
            from torch import nn

            class Gate(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.proj = nn.Linear(8, 8)
                    self.offset = float(torch.zeros(1).sum())  # a host read: no meta build either

                def forward(self, x):
                    return self.proj(x) + self.offset if x.sum().item() > -1e9 else x

            def make_model():
                return Gate()

            def make_inputs(batch_size, generator):
                return (torch.randn(batch_size, 8, generator=generator),)
            """
        )
    )
    workload = resolve(ModelRef("factory", f"{path}:make_model", inputs=f"{path}:make_inputs"))
    config = workload.config("default")
    assert workload.flops(config, Shape(4), "infer") == 4 * 2 * 8 * 8
    assert workload.row_columns(config, Shape(4), "infer")["flops_source"] == "counted_scaled"
    assert workload.estimate_memory_bytes(config, Shape(4), "train", torch.float32) > 4 * (8 * 8 + 8) * 4
    train_and_infer(workload)


OFF_META = """
import torch
from torch import nn


class Normed(nn.Module):
    \"\"\"BatchNorm (no training step at batch 1) and a host read (no step on meta).\"\"\"

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.norm = nn.BatchNorm1d(8)

    def forward(self, x):
        return self.norm(self.proj(x)) / float(x.abs().max())


class Batch3(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x):
        if x.shape[0] != 3 or float(x.abs().max()) < 0:
            raise ValueError(f"takes a batch of 3, not {x.shape[0]}")
        return self.proj(x)


def make_inputs(batch_size, generator):
    return (torch.randn(batch_size, 8, generator=generator),)
"""


def test_a_model_that_cannot_train_at_batch_1_is_counted_at_the_runs_batch(tmp_path: Path) -> None:
    path = tmp_path / "off_meta.py"
    path.write_text(OFF_META)
    normed = resolve(ModelRef("factory", f"{path}:Normed", inputs=f"{path}:make_inputs"))
    config = normed.config("default")
    dry_run(normed, Shape(4), "train")
    # the step's matmuls: the forward, and the weight's gradient (the input needs none)
    assert normed.flops(config, Shape(4), "train") == 2 * (2 * 4 * 8 * 8) == 2 * normed.flops(config, Shape(2), "train")
    assert normed.row_columns(config, Shape(4), "train")["flops_source"] == "counted"
    with pytest.raises(ModelRefError, match=r"fails its first train step at batch_size=1: ValueError: Expected more"):
        dry_run(normed, Shape(1), "train")
    batch3 = resolve(ModelRef("factory", f"{path}:Batch3", inputs=f"{path}:make_inputs"))
    with pytest.raises(ModelRefError) as refused:  # each failure names the batch it happened at
        dry_run(batch3, Shape(4), "infer")
    assert str(refused.value).endswith(
        "at batch_size=4: ValueError: takes a batch of 3, not 4 "
        "(at batch_size=1: ValueError: takes a batch of 3, not 1)"
    )


def hf(target: str, overrides: tuple = (), task: str | None = None) -> workloads.Workload:
    return resolve(ModelRef("hf", target, overrides=overrides, task=task))


def test_hf_tiny_llama_trains_infers_and_generates_through_its_static_cache() -> None:
    workload = hf("llama", LLAMA_OVERRIDES)
    assert workload.modes == ("train", "infer", "prefill", "decode")
    train_and_infer(workload, batch_size=2, seq_len=16)
    instance = workloads.build(workload, batch_size=2, seq_len=16)
    greedy = instance.greedy(instance.model, 16 + 6)
    with torch.no_grad():
        first = torch.cat(list(greedy.tokens(6)), dim=1)
        again = torch.cat(list(greedy.tokens(6)), dim=1)  # the cache is reused: the same tokens
        # the same greedy tokens without a cache: the static cache changes nothing but the cost
        ids = instance.batch["input_ids"]
        for _ in range(6):
            ids = torch.cat([ids, instance.model(input_ids=ids).logits[:, -1:].argmax(-1)], dim=1)
    assert first.shape == (2, 6) and torch.equal(first, again)
    assert torch.equal(first, ids[:, 16:])
    for mode in ("prefill", "decode"):  # a prompt and one decode step, on meta
        dry_run(workload, Shape(2, seq_len=16), mode)


def test_hf_tiny_llamas_counted_flops_equal_llama3_tinys_analytic_flops() -> None:
    """Hugging Face's LlamaForCausalLM at llama3/tiny's dimensions, counted on meta, against the
    built-in formula: train and infer are equal to the FLOP, and so is a decode step.

    The one difference is the prefill: transformers keeps only the last position's logits
    (``logits_to_keep=1``, as its ``generate`` does) and attends over the prompt's keys only,
    where the built-in projects every position and attends over the whole static cache.
    """
    workload = hf("llama", LLAMA_OVERRIDES)
    config = workload.config("default")
    for shape in (Shape(2, seq_len=128), Shape(3, seq_len=40)):
        for mode in ("train", "infer"):
            assert workload.flops(config, shape, mode) == llama3.WORKLOAD.flops(LLAMA_TINY, shape, mode)
    cached_flops, builtin = workload.generation.cached_flops, llama3.WORKLOAD.generation.cached_flops
    assert cached_flops(config, 2, 1, 48) == builtin(LLAMA_TINY, 2, 1, 48)
    prompt, cache_len, d, vocab = 32, 48, LLAMA_TINY.d_model, LLAMA_TINY.vocab_size
    unkept_logits = 2 * 2 * (prompt - 1) * d * vocab
    unattended_keys = LLAMA_TINY.n_layer * 4 * 2 * prompt * (cache_len - prompt) * d
    assert cached_flops(config, 2, prompt, cache_len) == builtin(LLAMA_TINY, 2, prompt, cache_len) - (
        unkept_logits + unattended_keys
    )


def test_hf_tiny_gpt2s_counted_flops_equal_gpt2_tinys_analytic_flops() -> None:
    workload = hf("gpt2", GPT2_OVERRIDES)
    shape = Shape(2, seq_len=64)
    for mode in ("train", "infer"):
        assert workload.flops(workload.config("default"), shape, mode) == gpt2.WORKLOAD.flops(GPT2_TINY, shape, mode)


def test_hf_tiny_bert_is_a_masked_lm_that_trains_and_infers() -> None:
    workload = hf("bert", BERT_OVERRIDES)
    assert "BertForMaskedLM" in workload.description and workload.modes == ("train", "infer")
    loss = train_and_infer(workload, batch_size=2, seq_len=16)
    assert loss == pytest.approx(torch.log(torch.tensor(256.0)).item(), rel=0.1)  # random weights: ~uniform
    assert workload.estimate_memory_bytes(workload.config("default"), Shape(2, seq_len=16), "train", torch.float32) > 0


def test_a_local_config_folder_is_a_model(tmp_path: Path) -> None:
    from transformers import AutoConfig

    AutoConfig.for_model("bert", **{k: int(v) for k, v in BERT_OVERRIDES}).save_pretrained(tmp_path)
    workload = hf(str(tmp_path), (("num_hidden_layers", "1"),))
    assert workload.build_model(workload.config("default")).config.num_hidden_layers == 1
    assert workload.name == f"hf:{tmp_path.name}(masked-lm,num_hidden_layers=1)"  # a folder by its name


def test_an_hf_models_stored_reference_holds_its_task_and_only_the_config_that_differs() -> None:
    workload = hf("bert", (*BERT_OVERRIDES, ("hidden_act", "gelu")))
    ref = workload.config("default").ref
    assert ref.task == "masked-lm" and ref.overrides == BERT_OVERRIDES  # gelu is BertConfig's default
    assert workload.name == "hf:bert(masked-lm," + ",".join(f"{key}={value}" for key, value in BERT_OVERRIDES) + ")"
    same = hf("bert", BERT_OVERRIDES, task="fill-mask").config("default")
    assert same.ref == ref and same.model_hash == workload.config("default").model_hash


def test_uncounted_matmuls_are_reported_not_hidden() -> None:
    """Mixtral's default experts run ``torch._grouped_mm``, which the counter counts as 0."""
    overrides = (*LLAMA_OVERRIDES, ("num_local_experts", "4"), ("num_experts_per_tok", "2"))
    grouped = hf("mixtral", overrides)
    columns = grouped.row_columns(grouped.config("default"), Shape(1, seq_len=8), "infer")
    assert "aten._grouped_mm" in json.loads(columns["flops_incomplete"])
    assert columns["flops_source"] == "counted"  # on meta, in bfloat16 (grouped_mm's only meta dtype)
    eager = hf("mixtral", (*overrides, ("experts_implementation", "eager")))
    assert eager.row_columns(eager.config("default"), Shape(1, seq_len=8), "infer")["flops_incomplete"] is None


@pytest.mark.parametrize(
    ("target", "overrides", "task", "message"),
    [
        ("lama", (), None, "unknown model_type 'lama' .*did you mean llama"),
        ("vit", (), "causal-lm", "cannot serve causal-lm; it can: image-classification"),
        ("bert", (), "speech", "unknown task 'speech'; valid: text-generation \\(causal-lm\\)"),
        ("google/not-cached-model", (), None, "not in the local Hugging Face cache.*hf:<model_type>.*config.json"),
        ("bert", (("hiden_size", "8"),), None, "hiden_size \\(did you mean hidden_size"),
        ("/no/such/folder", (), None, "holds no config.json"),
    ],
)
def test_bad_hugging_face_references_are_errors(target: str, overrides: tuple, task: str | None, message: str) -> None:
    with pytest.raises(ModelRefError, match=message):
        hf(target, overrides, task)


def test_a_config_that_fails_its_first_forward_is_caught_by_the_dry_run() -> None:
    """A bare T5Config has no decoder_start_token_id: the labels cannot be shifted."""
    small = (("d_model", "16"), ("d_kv", "4"), ("d_ff", "32"), ("num_layers", "1"), ("vocab_size", "64"))
    workload = hf("t5", small)
    with pytest.raises(ModelRefError, match=r"fails its first train step.*decoder_start_token_id"):
        dry_run(workload, Shape(1, seq_len=8), "train")
    fixed = hf("t5", (*small, ("decoder_start_token_id", "0")))
    dry_run(fixed, Shape(1, seq_len=8), "train")


def test_hf_vision_and_feature_extraction_models_take_their_own_inputs() -> None:
    vit = hf(
        "vit",
        (
            ("hidden_size", "32"),
            ("num_hidden_layers", "1"),
            ("num_attention_heads", "2"),
            ("intermediate_size", "64"),
            ("image_size", "32"),
            ("patch_size", "8"),
        ),
    )
    assert vit.dims == ("image_size",) and vit.shape_for("cpu") == Shape(2, image_size=32)
    assert "ViTForImageClassification" in vit.description
    train_and_infer(vit)
    features = hf("llama", LLAMA_OVERRIDES, task="feature-extraction")
    assert features.modes == ("train", "infer") and "LlamaModel" in features.description
    train_and_infer(features, batch_size=1, seq_len=8)
    columns = features.row_columns(features.config("default"), Shape(1, seq_len=8), "train")
    assert columns["loss_source"] == "synthesised: mean of outputs"


@pytest.mark.nightly
@pytest.mark.parametrize("mode", ["train", "infer"])
def test_the_counted_memory_estimate_covers_the_real_peak(tmp_path: Path, mode: str) -> None:
    """Hugging Face GPT-2 124M (``GPT2Config()``) through a real worker: the estimate (weights,
    AdamW's state and the step's peak bytes measured on meta) must cover what the run added
    to its process, and not by much (measured on torch 2.13 CPU: 1.42x train, 1.57x infer,
    the fixed 128-192 MiB for autograd and libraries included)."""
    (tmp_path / "hf_gpt2_plugin.py").write_text(
        "from dataclasses import replace\n"
        "from workloads.custom import ModelRef, resolve\n"
        "WORKLOAD = replace(resolve(ModelRef('hf', 'gpt2')), name='hf-gpt2')\n"
    )
    env = {"TPUBENCH_WORKLOAD_MODULES": "hf_gpt2_plugin", "PYTHONPATH": str(tmp_path)}
    results = tmp_path / "results"
    args = f"--mode {mode} --batch-size 2 --seq-len 128 --steps 1 --warmup 0 --results {results}"
    result = tpubench(f"run --workload hf-gpt2 --backend cpu {args}", env=env, timeout=900)
    assert result.returncode == 0, result.stderr
    [row] = store.load_runs(results).to_dict("records")
    assert row["status"] == "ok", row["error"]
    added = row["peak_mem_bytes"] - row["baseline_mem_bytes"]
    assert added <= row["estimated_mem_bytes"] <= 1.75 * added, (added, row["estimated_mem_bytes"])
