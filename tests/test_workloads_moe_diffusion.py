"""mixtral and dit against their publications and reference implementations.

Parameter counts and FLOPs are checked on the meta device, where even 8x7b costs nothing
and SDPA decomposes into the bmm FlopCounterMode sees (the fused CPU kernel it does not).
mixtral is checked against Hugging Face's MixtralForCausalLM with copied weights; dit
against the layer names and shapes of facebookresearch/DiT's published model.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path

import pytest
import torch
from helpers import ROOT, measured_peak
from torch.utils.flop_counter import FlopCounterMode

from workloads.base import Shape, Workload
from workloads.diffusion import dit
from workloads.llm import decoder
from workloads.moe import mixtral

WORKLOADS = (mixtral.WORKLOAD, dit.WORKLOAD)
#: small shapes for the FLOP checks: 128 tokens route to 8 experts with capacity 40 (< tokens)
FLOP_SHAPES = {"mixtral": Shape(batch_size=2, seq_len=64), "dit": Shape(batch_size=2, latent_size=16)}


def unique_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def meta_model(workload: Workload, size: str) -> torch.nn.Module:
    with torch.device("meta"):
        return workload.build_model(workload.config(size))


def meta_batch(workload: Workload, size: str, shape: Shape) -> dict[str, torch.Tensor]:
    batch = workload.make_batch(workload.config(size), shape, torch.Generator().manual_seed(0))
    return {key: value.to("meta") for key, value in batch.items()}


@pytest.mark.parametrize(
    ("workload", "size"), [(w, size) for w in WORKLOADS for size in w.published], ids=lambda v: getattr(v, "name", v)
)
def test_the_parameter_count_is_the_published_one(workload: Workload, size: str) -> None:
    model, published = meta_model(workload, size), workload.published[size]
    assert unique_parameters(model) == published.params
    if published.active_params is not None:  # a token skips all but top_k of every layer's experts
        config = workload.config(size)
        experts = sum(
            p.numel() for name, p in model.named_parameters() if name.split(".")[-1] in ("gate", "up", "down")
        )
        skipped = experts * (config.n_experts - config.top_k) // config.n_experts
        assert unique_parameters(model) - skipped == published.active_params == workload.active_params(config)


@pytest.mark.parametrize(
    ("workload", "size"), [(w, size) for w in WORKLOADS for size in w.sizes], ids=lambda v: getattr(v, "name", v)
)
@pytest.mark.parametrize("mode", ["train", "infer"])
def test_analytic_flops_equal_the_flop_counter(workload: Workload, size: str, mode: str) -> None:
    shape = FLOP_SHAPES[workload.name]
    model, batch = meta_model(workload, size), meta_batch(workload, size, shape)
    with FlopCounterMode(display=False) as counter:
        if mode == "train":
            workload.loss(model, batch).backward()
        else:
            with torch.no_grad():
                workload.forward(model, batch)
    assert workload.flops(workload.config(size), shape, mode) == pytest.approx(counter.get_total_flops(), rel=0.01)


@pytest.mark.parametrize("size", ["tiny", "8x7b-2l"])
def test_mixtral_prefill_and_decode_flops_equal_the_flop_counter(size: str) -> None:
    """A prefill into the static cache and one decode step, each over the cache's full length."""
    config, batch_size, prompt, cache_len = mixtral.SIZES[size], 2, 16, 24
    generation = mixtral.WORKLOAD.generation
    model = meta_model(mixtral.WORKLOAD, size).eval()
    cache = decoder.KVCache.allocate(config, batch_size, cache_len, torch.device("meta"), torch.float32)
    batch = {"input_ids": torch.zeros(batch_size, prompt, dtype=torch.long, device="meta")}
    with torch.no_grad(), FlopCounterMode(display=False) as prefill:
        token = generation.prefill(model, batch, cache)
    position = torch.full((1,), prompt, dtype=torch.long, device="meta")
    with torch.no_grad(), FlopCounterMode(display=False) as decode:
        generation.decode(model, token, position, cache)
    assert generation.cached_flops(config, batch_size, prompt, cache_len) == prefill.get_total_flops()
    assert generation.cached_flops(config, batch_size, 1, cache_len) == decode.get_total_flops()


def test_dit_xl2_forward_flops_are_the_papers() -> None:
    """XL/2 at 256 px: 118.6 GMACs ("Gflops") in the paper, counted here at 2 FLOPs a MAC.

    diffusers' port counts 237.33 GFLOPs: it repeats the timestep and label embedder in
    every block, which facebookresearch/DiT computes once.
    """
    shape = Shape(batch_size=1, latent_size=32)
    model, batch = meta_model(dit.WORKLOAD, "xl2"), meta_batch(dit.WORKLOAD, "xl2", shape)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        dit.forward(model, batch)
    assert counter.get_total_flops() == dit.flops(dit.SIZES["xl2"], shape, "infer") == 237_242_843_136
    assert counter.get_total_flops() / 2 / 1e9 == pytest.approx(118.6, abs=0.05)


def published_dit_layer_shapes(config: dit.DiTConfig) -> dict[str, tuple[int, ...]]:
    """The state dict of facebookresearch/DiT ``models.py``'s ``DiT`` for ``config``, from its layer
    definitions: timm's PatchEmbed (a conv), Attention (``qkv_bias=True``) and Mlp, the
    adaLN ``Sequential(SiLU, Linear)``, and the label table with its extra null class."""
    d, p, hidden = config.hidden, config.patch, config.mlp_ratio * config.hidden
    shapes = {
        "pos_embed": (1, (config.max_latent // p) ** 2, d),
        "x_embedder.proj.weight": (d, 4, p, p),
        "x_embedder.proj.bias": (d,),
        "t_embedder.mlp.0.weight": (d, 256),
        "t_embedder.mlp.0.bias": (d,),
        "t_embedder.mlp.2.weight": (d, d),
        "t_embedder.mlp.2.bias": (d,),
        "y_embedder.embedding_table.weight": (config.num_classes + 1, d),
    }
    for block in range(config.depth):
        for name, shape in {
            "attn.qkv.weight": (3 * d, d),
            "attn.qkv.bias": (3 * d,),
            "attn.proj.weight": (d, d),
            "attn.proj.bias": (d,),
            "mlp.fc1.weight": (hidden, d),
            "mlp.fc1.bias": (hidden,),
            "mlp.fc2.weight": (d, hidden),
            "mlp.fc2.bias": (d,),
            "adaLN_modulation.1.weight": (6 * d, d),
            "adaLN_modulation.1.bias": (6 * d,),
        }.items():
            shapes[f"blocks.{block}.{name}"] = shape
    out = p * p * 8  # learn_sigma: ε and Σ for each of the 4 latent channels
    shapes |= {
        "final_layer.linear.weight": (out, d),
        "final_layer.linear.bias": (out,),
        "final_layer.adaLN_modulation.1.weight": (2 * d, d),
        "final_layer.adaLN_modulation.1.bias": (2 * d,),
    }
    return shapes


@pytest.mark.parametrize("size", list(dit.SIZES))
def test_dit_has_the_published_models_layers(size: str) -> None:
    """Same keys, shapes and order as the published checkpoints, so they load as they are; the
    position table is a frozen parameter, counted as the publication counts it."""
    model = meta_model(dit.WORKLOAD, size)
    expected = published_dit_layer_shapes(dit.SIZES[size])
    assert {key: tuple(value.shape) for key, value in model.state_dict().items()} == expected
    assert unique_parameters(model) == sum(math.prod(shape) for shape in expected.values())
    assert [name for name, p in model.named_parameters() if not p.requires_grad] == ["pos_embed"]


def test_dit_position_table_is_dits_sincos_grid() -> None:
    """``get_2d_sincos_pos_embed``: per patch (row r, column c), the first half of the width is
    [sin(c ω), cos(c ω)] and the second [sin(r ω)], cos(r ω)], ω = 10000^(-i / (d/4))."""
    config = dit.SIZES["tiny"]
    model = dit.DiT(config)
    d, grid = config.hidden, config.max_latent // config.patch
    omega = 1.0 / 10000 ** (torch.arange(d // 4, dtype=torch.float64) / (d / 4))
    row, column = 3, 5
    expected = torch.cat([(column * omega).sin(), (column * omega).cos(), (row * omega).sin(), (row * omega).cos()])
    torch.testing.assert_close(model.pos_embed[0, row * grid + column].double(), expected, rtol=0, atol=1e-6)


def test_dit_smaller_latents_use_the_tables_corner_and_larger_ones_are_refused() -> None:
    config = dit.SIZES["tiny"]
    model = dit.DiT(config).eval()
    batch = dit.make_batch(config, Shape(batch_size=2, latent_size=8), torch.Generator().manual_seed(0))
    assert dit.forward(model, batch).shape == (2, 8, 8, 8)
    grid, small = config.max_latent // config.patch, 8 // config.patch  # the corner is a smaller grid's table
    corner = model.pos_embed.view(grid, grid, -1)[:small, :small].reshape(small * small, -1)
    torch.testing.assert_close(corner, dit.sincos_table(config.hidden, small).float())
    with pytest.raises(ValueError, match="at most 32"):
        dit.make_batch(config, Shape(batch_size=2, latent_size=64), torch.Generator())


def test_dit_loss_trains_the_noise_prediction() -> None:
    """A few AdamW steps on one batch lower the ε-MSE: the loss reaches the weights."""
    torch.manual_seed(0)
    config = dit.SIZES["tiny"]
    model = dit.DiT(config)
    batch = dit.make_batch(config, Shape(batch_size=4, latent_size=8), torch.Generator().manual_seed(0))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(5):
        loss = dit.loss(model, batch)
        losses.append(loss.item())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    assert losses[-1] < losses[0]


# ---- mixtral against Hugging Face's MixtralForCausalLM ---------------------------------------

REFERENCE = mixtral.MoEConfig(
    n_layer=2, n_head=4, n_kv_head=2, d_model=64, d_ff=96, vocab_size=512, max_seq_len=256, n_experts=4, top_k=2
)


def hf_mixtral(config: mixtral.MoEConfig) -> torch.nn.Module:
    """transformers' Mixtral at ``config``, from its config class only (offline), eager experts."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    transformers = pytest.importorskip("transformers")
    options = {"attn_implementation": "eager"}
    if hasattr(transformers.MixtralConfig(), "_experts_implementation"):  # transformers >= 5
        options["experts_implementation"] = "eager"
    hf_config = transformers.MixtralConfig(
        vocab_size=config.vocab_size,
        hidden_size=config.d_model,
        intermediate_size=config.d_ff,
        num_hidden_layers=config.n_layer,
        num_attention_heads=config.n_head,
        num_key_value_heads=config.kv_heads,
        max_position_embeddings=config.max_seq_len,
        num_local_experts=config.n_experts,
        num_experts_per_tok=config.top_k,
        rms_norm_eps=1e-5,
        router_aux_loss_coef=mixtral.AUX_LOSS_COEF,
        tie_word_embeddings=False,
        **options,
    )
    assert hf_config.rope_parameters["rope_theta"] == config.rope_theta
    torch.manual_seed(0)
    return transformers.MixtralForCausalLM(hf_config).eval()


def copy_weights(theirs: torch.nn.Module, ours: mixtral.Mixtral) -> None:
    """Hugging Face's state dict into ours; every one of its tensors is used exactly once."""
    state = dict(theirs.state_dict())
    take = state.pop
    d_ff = ours.config.d_ff
    with torch.no_grad():
        ours.token_embedding.weight.copy_(take("model.embed_tokens.weight"))
        for index, block in enumerate(ours.blocks):
            prefix = f"model.layers.{index}."
            block.attention_norm.weight.copy_(take(prefix + "input_layernorm.weight"))
            block.ffn_norm.weight.copy_(take(prefix + "post_attention_layernorm.weight"))
            for name in ("q", "k", "v", "o"):
                getattr(block.attention, name).weight.copy_(take(f"{prefix}self_attn.{name}_proj.weight"))
            block.experts.router.weight.copy_(take(prefix + "mlp.gate.weight"))
            gate_up = take(prefix + "mlp.experts.gate_up_proj")  # (E, 2 d_ff, d): gate rows, then up rows
            block.experts.gate.copy_(gate_up[:, :d_ff].transpose(1, 2))
            block.experts.up.copy_(gate_up[:, d_ff:].transpose(1, 2))
            block.experts.down.copy_(take(prefix + "mlp.experts.down_proj").transpose(1, 2))
        ours.norm.weight.copy_(take("model.norm.weight"))
        ours.lm_head.weight.copy_(take("lm_head.weight"))
    assert not state, f"Hugging Face tensors not copied: {sorted(state)}"


def reference_pair(capacity_factor: float) -> tuple[torch.nn.Module, mixtral.Mixtral, torch.Tensor]:
    from dataclasses import replace

    theirs = hf_mixtral(REFERENCE)
    ours = mixtral.Mixtral(replace(REFERENCE, capacity_factor=capacity_factor)).eval()
    copy_weights(theirs, ours)
    ids = torch.randint(0, REFERENCE.vocab_size, (2, 48), generator=torch.Generator().manual_seed(1))
    return theirs, ours, ids


def test_mixtral_matches_transformers_when_no_token_drops() -> None:
    """With capacity_factor = experts / top_k every expert has a slot for every token: the logits
    and the load-balancing loss are Hugging Face's, to 1e-5 in float32."""
    theirs, ours, ids = reference_pair(REFERENCE.n_experts / REFERENCE.top_k)
    with torch.no_grad():
        expected = theirs(ids, output_router_logits=True)
        logits, balance = ours(ids, return_balance=True)
    torch.testing.assert_close(logits, expected.logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(balance, expected.aux_loss, rtol=1e-5, atol=1e-6)


def test_mixtral_drops_choices_past_an_experts_capacity() -> None:
    """At capacity factor 1 (an even share each) some choices find their expert full: the logits
    then differ from the reference's, which never drops (so the test above can fail)."""
    theirs, ours, ids = reference_pair(1.0)
    with torch.no_grad():
        assert not torch.allclose(ours(ids), theirs(ids).logits, rtol=1e-5, atol=1e-5)


def test_mixtral_cached_generation_equals_the_full_forward() -> None:
    """Greedy tokens through the static KV cache (prefill, then a decode step per token) are
    the argmax of the full forward over the grown sequence, when no choice drops."""
    from dataclasses import replace

    torch.manual_seed(0)
    config = replace(mixtral.SIZES["tiny"], capacity_factor=2.0)
    model, generation = mixtral.Mixtral(config).eval(), mixtral.WORKLOAD.generation
    ids = torch.randint(0, config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(2))
    cache = generation.allocate_cache(config, 2, 16, torch.device("cpu"), torch.float32)
    position = torch.full((1,), 12, dtype=torch.long)
    with torch.no_grad():
        tokens = [generation.prefill(model, {"input_ids": ids}, cache)]
        for _ in range(3):
            tokens.append(generation.decode(model, tokens[-1], position, cache))
        sequence = ids
        for token in tokens:
            assert torch.equal(model(sequence)[:, -1:].argmax(dim=-1), token)
            sequence = torch.cat([sequence, token], dim=1)


# ---- memory ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "size", "shape"),
    [
        ("mixtral", "tiny", {"batch_size": 2, "seq_len": 64}),
        ("mixtral", "tiny", {"batch_size": 4, "seq_len": 256}),
        ("dit", "tiny", {"batch_size": 4, "latent_size": 8}),
        ("dit", "s2", {"batch_size": 4, "latent_size": 32}),
    ],
)
@pytest.mark.parametrize("mode", ["train", "infer"])
def test_the_memory_estimate_covers_the_measured_peak(name: str, size: str, shape: dict, mode: str) -> None:
    """What a fresh CPU process adds to its resident set over two steps, as a run measures it."""
    found = measured_peak(name, size, mode, shape)
    assert found["added"] <= found["estimate"], found


def test_mixtral_8x7b_training_is_refused_with_its_estimate() -> None:
    """The full model cannot train on one chip: weights, gradients and AdamW alone are 747 GB."""
    config = mixtral.SIZES["8x7b"]
    estimate = mixtral.estimate_memory_bytes(config, Shape(batch_size=4, seq_len=2048), "train", torch.float32)
    assert estimate >= 16 * mixtral.total_params(config) > 740e9


# ---- torch_xla on the PJRT CPU device --------------------------------------------------------


def test_tiny_sizes_run_on_xla_with_no_fallbacks_and_no_recompiles(xla_python: str) -> None:
    """Train and infer settle after their first steps (train: step 0, then step 1 with the
    optimizer state). A generation compiles its prefill and one decode graph reused at every
    position; the second generation's prefill compiles once more (the first one's graph also
    held the lazily created cache and position; llama3 measures the same), the third nothing."""
    result = subprocess.run(
        [xla_python, str(ROOT / "tests" / "xla_moe_diffusion_steps.py")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=900,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout.splitlines()[-1])
    assert set(found) == {"mixtral/train", "mixtral/infer", "mixtral/decode", "dit/train", "dit/infer"}
    for case, run in found.items():
        assert run["fallbacks"] == {}, case
        compiles = run["compiles"]
        if case.endswith("/decode"):
            first, second, third = (
                compiles[i : i + len(compiles) // 3] for i in range(0, len(compiles), len(compiles) // 3)
            )
            assert len(set(first[1:])) == 1 and first[1] > first[0], (case, compiles)  # one decode graph, reused
            assert set(third) == {second[-1]}, (case, compiles)
        else:
            warmup = 2 if case.endswith("/train") else 1
            assert set(compiles[warmup - 1 :]) == {warmup}, (case, compiles)


@pytest.mark.parametrize(
    ("workload", "mode", "shape"),
    [
        # CI keeps mixtral's decode run, the only XLA generation through the harness in CI; the
        # other modes are nightly. In CI, test_tiny_sizes_run_on_xla_with_no_fallbacks_and_no_recompiles
        # checks both families' train, infer and decode steps on XLA (fallbacks, compiles settling),
        # and test_xla.py and the vision workloads' train runs take the harness's XLA train path
        pytest.param("mixtral", "train", {"batch_size": 2, "seq_len": 32}, marks=pytest.mark.nightly),
        pytest.param("mixtral", "infer", {"batch_size": 2, "seq_len": 32}, marks=pytest.mark.nightly),
        pytest.param("mixtral", "prefill", {"batch_size": 2, "seq_len": 32, "gen_len": 4}, marks=pytest.mark.nightly),
        ("mixtral", "decode", {"batch_size": 2, "seq_len": 32, "gen_len": 4}),
        pytest.param("dit", "train", {"batch_size": 2, "latent_size": 8}, marks=pytest.mark.nightly),
        pytest.param("dit", "infer", {"batch_size": 2, "latent_size": 8}, marks=pytest.mark.nightly),
    ],
)
def test_tiny_sizes_run_through_the_harness_on_xla(
    results_dir: Path, xla_python: str, workload: str, mode: str, shape: dict
) -> None:
    """``tpubench run --backend xla`` rows: no op ran on the CPU, nothing compiled after warm-up."""
    from tpubench.runner import SuiteRunner, plan

    specs = plan([workload], backends=["xla"], modes=[mode], warmup=2, steps=3, timeout_s=600, **shape)
    [row] = SuiteRunner(results_dir, pythons={"xla": xla_python}).run(specs)
    assert row["status"] == "ok", (row.get("error"), row.get("stderr_tail"))
    assert row["fallback_op_count"] == 0 and json.loads(row["fallback_ops"]) == {}
    assert row["recompiles_after_warmup"] == 0
