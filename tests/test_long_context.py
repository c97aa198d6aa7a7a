"""Long context: ``--attention`` forces a kernel, the row names the kernel that ran (read from a
traced step) and attention's share of the step, and a length that cannot fit is refused before
anything runs (docs/long-context.md)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from helpers import in_process, tpubench

from tpubench import store
from tpubench.analysis.identity import configurations

LENGTHS = (128, 512, 2048)


def attention_rows(results_dir: Path) -> pd.DataFrame:
    return store.load_runs(results_dir).sort_values("seq_len").reset_index(drop=True)


#: one intra-op thread: on a host that other work keeps busy (CI's two test workers on two
#: cores), a two-thread op waits at its barrier for a thread the other work took, so the big
#: matmuls' times, and with them the share, swung by half from try to try (2048 tokens read
#: 0.47 to 0.74); with one thread a busy host slows every op alike (0.173, 0.588, 0.885 in
#: three tries each: docs/long-context.md)
ONE_THREAD = {"OMP_NUM_THREADS": "1"}


def test_math_attention_names_its_kernel_and_its_share_grows_with_the_length(results_dir: Path) -> None:
    """SDPA's math path forced on the CPU: the trace names it, and attention's share of a step
    (its bmm and softmax counted as attention, forward ops nested in it) grows with the length,
    its S x S work against the projections' S."""
    lengths = ",".join(map(str, LENGTHS))
    result = tpubench(
        f"run --workload llama3 --backend cpu --mode infer --batch-size 1 --seq-len {lengths} --attention math "
        "--steps 1 --warmup 0 --results",
        str(results_dir),
        env=ONE_THREAD,
    )
    assert result.returncode == 0, result.stderr
    runs = attention_rows(results_dir)
    assert list(runs["status"]) == ["ok"] * 3, runs["error"].tolist()
    assert set(runs["attention"]) == {"math"} and set(runs["attention_kernel"]) == {"math"}
    assert set(runs["attention_kernel_source"]) == {"trace"}  # read from the ops, not from what was asked
    shares = runs["attention_share"].tolist()
    assert all(0 < share < 1 for share in shares), shares
    assert shares[0] + 0.1 < shares[1] and shares[1] + 0.1 < shares[2], shares
    assert "math attention" in result.stdout  # the run's label names the forced kernel
    added = runs["peak_mem_bytes"] - runs["baseline_mem_bytes"]  # the estimate counts the S x S scores it held
    assert (added <= runs["estimated_mem_bytes"]).all(), (added.tolist(), runs["estimated_mem_bytes"].tolist())


@pytest.mark.nightly
def test_flex_attention_runs_compiled_and_its_share_grows_with_the_length(results_dir: Path) -> None:
    """Flex attention under cpu-compile (Inductor's C++ template, forward only on a CPU): each
    length compiles for minutes on 2 busy cores, hence nightly."""
    lengths = ",".join(map(str, LENGTHS))
    result = tpubench(
        f"run --workload llama3 --backend cpu-compile --mode infer --batch-size 1 --seq-len {lengths} "
        "--attention flex --steps 1 --warmup 0 --results",
        str(results_dir),
        env=ONE_THREAD,
        timeout=3000,
    )
    assert result.returncode == 0, result.stderr
    runs = attention_rows(results_dir)
    assert list(runs["status"]) == ["ok"] * 3, runs["error"].tolist()
    assert set(runs["attention_kernel"]) == {"flex"}
    shares = runs["attention_share"].tolist()
    assert shares[0] < shares[1] < shares[2], shares


def test_a_forced_kernel_that_cannot_run_the_run_says_why(results_dir: Path) -> None:
    """Flex attention has no backward on a CPU: a training run forced onto it is an
    ``unavailable`` row that says so, before it compiles for minutes to find out."""
    result = tpubench(
        "run --workload llama3 --backend cpu-compile --mode train --batch-size 1 --seq-len 64 --attention flex "
        "--steps 1 --warmup 0 --results",
        str(results_dir),
    )
    assert result.returncode == 0, result.stderr
    [row] = store.load_runs(results_dir).to_dict("records")
    assert row["status"] == "unavailable" and row["attention"] == "flex"
    assert (
        row["error"] == "--attention flex: flex attention has no backward on a CPU (torch's FlexAttention); run infer"
    )


def test_a_length_that_cannot_fit_is_one_error_line(results_dir: Path) -> None:
    """Math attention's S x S scores at 128K tokens cannot fit this host: refused before any
    run, with the longest length that fits; nothing is stored."""
    result = tpubench(
        "run --workload llama3 --backend cpu --mode train --seq-len 2048,131072 --attention math --results",
        str(results_dir),
    )
    assert result.returncode == 2, result.stdout
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("error: 1 run(s) cannot fit: llama3/tiny cpu train float32 b4xs131072")
    assert "the longest that fits is --seq-len" in line and "math attention holds the S x S scores" in line
    assert not store.Location(results_dir).exists() or store.load_runs(results_dir).empty


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (
            "--backend cpu --attention flash",
            "--attention flash has no kernel on backend cpu (valid there: cpu: auto, math)",
        ),
        ("--backend cpu --attention flex", "--attention flex has no kernel on backend cpu"),
        (
            "--backend cpu --attention fast",
            "unknown --attention 'fast'; valid: auto, flash, efficient, math, flex, cudnn",
        ),
    ],
)
def test_an_attention_kernel_a_backend_lacks_is_refused(tmp_path: Path, args: str, says: str) -> None:
    result = in_process(f"run --workload llama3 {args} --results", tmp_path / "results")
    assert result.returncode == 2
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("error: ") and says in line


def test_rows_from_before_the_option_read_as_auto() -> None:
    """A store's rows without the column (or with it null) are the backend's own choice: the
    same configuration as a run today without --attention."""
    old = pd.DataFrame([{"workload": "gpt2", "size": "tiny", "backend": "cpu", "mode": "infer", "dtype": "float32"}])
    assert configurations(old)["attention"].tolist() == ["auto"]
    assert store.upgrade(old.assign(attention=[None]), "runs")["attention"].tolist() == ["auto"]


@pytest.mark.parametrize(
    ("workload", "size", "shape"), [("bert", "base", {"seq_len": 8192}), ("dit", "xl2", {"latent_size": 128})]
)
def test_an_encoders_and_a_dits_estimate_count_the_scores_only_where_the_kernel_holds_them(
    workload: str, size: str, shape: dict
) -> None:
    """bert and DiT take ``--attention`` as llama3 does: a fused kernel (flash, flex) holds a
    log-sum-exp per query and head, not their two S x S tensors per head and layer, so the
    longest length that fits under a fused kernel is not refused on the math path's count."""
    from importlib import import_module

    import torch

    from workloads import get_workload
    from workloads.attention import estimating
    from workloads.base import Shape

    chosen = get_workload(workload)
    config, run_shape = chosen.config(size), Shape(batch_size=1, **shape)
    estimates = {}
    for held in (True, False):
        with estimating(held):
            estimates[held] = chosen.estimate_memory_bytes(config, run_shape, "train", torch.bfloat16)
    heads = getattr(config, "n_head", None) or config.heads
    tokens = shape.get("seq_len") or config.tokens(shape["latent_size"])
    layers = getattr(config, "n_layer", None) or config.depth
    held_scores = layers * 2 * heads * tokens * tokens * 2  # two per head and layer, in bf16's two bytes
    fused = layers * heads * tokens * 4  # a float32 log-sum-exp per query and head
    headroom = import_module(chosen.estimate_memory_bytes.__module__).ALLOCATOR_HEADROOM  # DiT has its own
    assert estimates[True] - estimates[False] == pytest.approx((held_scores - fused) * headroom, rel=1e-6)
    assert estimates[False] < estimates[True] / 2  # at these lengths the scores are most of it
