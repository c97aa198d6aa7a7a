"""Serving metrics on known timings, sweep expansion, and decode runs end to end on the CPU."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import tpubench

from tpubench import store
from tpubench.runner import SuiteRunner, plan
from tpubench.serving.metrics import GenerationTiming, bandwidth_utilisation, serving_metrics


def test_vllm_metric_definitions_on_known_timings() -> None:
    # two generations of 5 tokens each (batch 2, prompt 10)
    runs = [
        GenerationTiming(ttft_ms=10.0, itl_ms=[2.0, 2.0, 2.0, 2.0], e2e_ms=18.0),
        GenerationTiming(ttft_ms=20.0, itl_ms=[3.0, 3.0, 3.0, 7.0], e2e_ms=36.0),
    ]
    metrics = serving_metrics(runs, batch_size=2, prompt_len=10, gen_len=5)
    assert metrics["ttft_p50_ms"] == pytest.approx(15.0)
    assert metrics["tpot_p50_ms"] == pytest.approx(((18 - 10) / 4 + (36 - 20) / 4) / 2)  # 2 and 4 ms
    assert metrics["itl_p50_ms"] == pytest.approx(2.5) and metrics["itl_p99_ms"] == pytest.approx(
        6.72
    )  # numpy linear interpolation
    assert metrics["output_tokens_per_s"] == pytest.approx(2 * 5 * 2 / 0.054)
    assert metrics["total_tokens_per_s"] == pytest.approx(2 * 15 * 2 / 0.054)


def test_one_output_token_has_no_tpot() -> None:
    metrics = serving_metrics([GenerationTiming(ttft_ms=4.0, e2e_ms=4.0)], 1, 8, 1)
    assert metrics["tpot_p50_ms"] is None and metrics["ttft_p99_ms"] == 4.0


def test_bandwidth_utilisation() -> None:
    assert bandwidth_utilisation(4.8e9, 1.0, 4.8e12) == pytest.approx(1.0)
    assert bandwidth_utilisation(4.8e9, 1.0, None) is None


def test_sweeps_expand_to_one_run_per_combination() -> None:
    specs = plan(["gpt2"], modes=["decode", "prefill"], batch_size=[1, 8, 32], seq_len=[128, 512], gen_len=[64, 128])
    decode = [(s.batch_size, s.seq_len, s.gen_len) for s in specs if s.mode == "decode"]
    prefill = [(s.batch_size, s.seq_len, s.gen_len) for s in specs if s.mode == "prefill"]
    assert len(decode) == 3 * 2 * 2 and len(set(decode)) == 12
    assert sorted(prefill) == sorted((b, p, 0) for b in (1, 8, 32) for p in (128, 512))  # no gen sweep


def test_prompt_plus_generation_beyond_the_context_is_refused() -> None:
    with pytest.raises(ValueError, match="prompt 1000 \\+ generation 100 exceeds gpt2/tiny's context of 1024"):
        plan(["gpt2"], modes=["decode"], seq_len=1000, gen_len=100)


def test_decode_run_stores_serving_metrics(results_dir: Path) -> None:
    specs = plan(["llama3"], modes=["decode"], batch_size=2, seq_len=16, gen_len=6, warmup=1, steps=3)
    [row] = SuiteRunner(results_dir).run(specs)
    assert row["status"] == "ok", row.get("stderr_tail")
    assert row["gen_len"] == 6 and 0 < row["ttft_p50_ms"] <= row["ttft_p99_ms"]
    assert 0 < row["tpot_p50_ms"] < row["median_step_ms"]
    assert row["output_tokens_per_s"] > 0 and row["decode_bytes_per_step"] > 0
    assert row["bandwidth_util"] is None and "no peak HBM bandwidth" in row["warnings"]  # a CPU has no entry
    steps = store.load_steps(results_dir, phase="measure")
    assert len(steps) == 3 and (steps.ttft_ms < steps.step_ms).all() and steps.tpot_ms.notna().all()


def test_tokens_per_s_of_a_decode_run_is_one_figure_everywhere(results_dir: Path, tmp_path: Path) -> None:
    """One gpt2 tiny decode run showed 23,396 tokens/s in the run summary (prompt plus
    output tokens), 2,643 in the report (output tokens) and 23,788 as total_tokens_per_s. Now
    tokens/s is output tokens per second, as serving tools mean it, in the store, the summary
    and the report alike; prompt plus output is total_tokens_per_s, and labelled so."""
    done = tpubench(
        "run --workload gpt2 --size tiny --backend cpu --mode decode --batch-size 2 --prompt-len 32 --gen-len 4 "
        "--steps 3 --warmup 1 --results",
        str(results_dir),
    )
    assert done.returncode == 0, done.stderr
    [row] = store.load_runs(results_dir).to_dict("records")
    assert row["tokens_per_s"] == row["output_tokens_per_s"]
    assert row["total_tokens_per_s"] == pytest.approx(row["output_tokens_per_s"] * (32 + 4) / 4)
    lines = done.stdout.splitlines()
    header = next(line for line in lines if "tokens/s" in line)
    cells = next(line for line in lines[lines.index(header) :] if line.lstrip().startswith("gpt2/tiny"))
    shown = cells[: header.index("tokens/s") + len("tokens/s")].split()[-1]  # right-aligned under its header
    assert shown == f"{row['output_tokens_per_s']:,.0f}", done.stdout
    markdown = tmp_path / "report.md"
    report = tpubench(
        "report --out", str(tmp_path / "r.html"), "--markdown", str(markdown), "--results", str(results_dir)
    )
    assert report.returncode == 0, report.stderr
    text = markdown.read_text()
    assert f"| {row['output_tokens_per_s']:,.0f} |" in text and "counts output (generated) tokens only" in text


def test_a_decode_batch_that_cannot_fit_is_refused_before_the_model_is_built(results_dir: Path) -> None:
    specs = plan(
        ["llama3"], sizes=["8b"], modes=["decode"], dtype="bfloat16", batch_size=512, seq_len=4096, gen_len=128
    )
    [row] = SuiteRunner(results_dir).run(specs)
    assert row["status"] == "skipped" and "GiB exceeds the" in row["error"]
    assert row["estimated_mem_bytes"] > 8e9 * 2  # more than the bf16 weights alone: the KV cache counts
    assert "peak_mem_bytes" not in row and "median_step_ms" not in row  # nothing was built or run
