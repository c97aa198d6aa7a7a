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


def test_math_attention_names_its_kernel_and_its_share_grows_with_the_length(results_dir: Path) -> None:
    """SDPA's math path forced on the CPU: the trace names it, and attention's share of a step
    (its bmm and softmax counted as attention, forward ops nested in it) grows with the length
    once its S x S work outgrows the projections' S."""
    lengths = ",".join(map(str, LENGTHS))
    result = tpubench(
        f"run --workload llama3 --backend cpu --mode infer --batch-size 1 --seq-len {lengths} --attention math "
        "--steps 1 --warmup 0 --results",
        str(results_dir),
    )
    assert result.returncode == 0, result.stderr
    runs = attention_rows(results_dir)
    assert list(runs["status"]) == ["ok"] * 3, runs["error"].tolist()
    assert set(runs["attention"]) == {"math"} and set(runs["attention_kernel"]) == {"math"}
    assert set(runs["attention_kernel_source"]) == {"trace"}  # read from the ops, not from what was asked
    shares = runs["attention_share"].tolist()
    assert all(0 < share < 1 for share in shares), shares
    # at 2048 tokens the S x S work dominates: well above both shorter lengths. Below 512 a tiny
    # model's step is its ops' fixed costs, and the math path runs some 20 ops a layer, so 128
    # and 512 read alike (measured 0.25 and 0.23, then 0.34 and 0.28: docs/long-context.md)
    assert shares[2] > max(shares[:2]) + 0.1, shares
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
        timeout=3000,
    )
    assert result.returncode == 0, result.stderr
    runs = attention_rows(results_dir)
    assert list(runs["status"]) == ["ok"] * 3, runs["error"].tolist()
    assert set(runs["attention_kernel"]) == {"flex"}
    shares = runs["attention_share"].tolist()
    # 2048 tokens against both shorter lengths; 128 against 512 within the noise of a busy
    # host (measured 0.044 and 0.037: the flex kernel is a few percent of either step)
    assert shares[0] < shares[2] and shares[1] < shares[2] and shares[1] > shares[0] - 0.02, shares


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
