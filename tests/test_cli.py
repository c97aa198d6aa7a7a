"""The real CLI in subprocesses: listing, environment, bad input, runs end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT, command, tpubench

from tpubench import store


def test_list_json_describes_every_workload() -> None:
    result = tpubench("list", "--json")
    assert result.returncode == 0, result.stderr
    entries = {entry["name"]: entry for entry in json.loads(result.stdout)}
    assert entries["llama3"]["sizes"] == ["tiny", "1b", "3b", "8b"]
    assert entries["gpt2"]["modes"] == ["train", "infer", "prefill", "decode"]
    assert entries["gpt2"]["default_shape"]["cuda"] == {"batch_size": 8, "seq_len": 1024}


def test_list_table_and_suite_filter() -> None:
    result = tpubench("list", "--suite", "llm", env={"COLUMNS": "200"})
    assert result.returncode == 0 and "llama3" in result.stdout and "1.5b" in result.stdout


def test_env_marks_each_backend_available_or_says_why() -> None:
    result = tpubench("env", "--json")
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    backends = info["backends"]
    assert set(backends) >= {"cpu", "cpu-compile", "cuda", "cuda-compile"}
    assert backends["cpu"]["available"] and backends["cpu"]["device_name"]
    assert backends["cpu"]["torch_version"] and info["host"] and info["cpu_model"]
    if not backends["cuda"]["available"]:
        assert backends["cuda"]["reason"] in ("no CUDA device", "torch built without CUDA")


def test_python_m_tpubench_is_the_same_command() -> None:
    module = subprocess.run([sys.executable, "-m", "tpubench", "--help"], capture_output=True, text=True, cwd=ROOT)
    assert module.returncode == 0 and "run" in module.stdout and "env" in module.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "--suite", "vision2"], "unknown suite 'vision2'; valid: llm"),
        (["run", "--workload", "bert"], "unknown workload 'bert'; valid: gpt2, llama3"),
        (["run", "--backend", "tpu9"], "unknown backend 'tpu9'; valid: cpu, cpu-compile, cuda, cuda-compile"),
        (["run", "--mode", "serve"], "unknown mode 'serve'; valid: train, infer, prefill, decode"),
        (["run", "--size", "70b"], "unknown size '70b'; valid: tiny, 124m"),
        (["run", "--dtype", "int8"], "unknown dtype 'int8'; valid: float32, bfloat16"),
        (["run", "--steps", "0"], "--steps"),
        (["run", "--timeout", "-5"], "--timeout"),
        (["run", "--tag", "novalue"], "--tag expects KEY=VALUE"),
        (["run", "--workload", "gpt2", "--seq-len", "4096"], "exceeds gpt2/tiny's context of 1024"),
        (["list", "--suite", "nope"], "unknown suite 'nope'"),
        (["run", "--batch-size", "1,8,x"], "--batch-size expects positive integers separated by commas"),
        (["run", "--gen-len", "12,,3"], "--gen-len expects positive integers"),
        (["run", "--mode", "decode", "--prompt-len", "1000", "--gen-len", "100"], "exceeds gpt2/tiny's context"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(args: list[str], message: str) -> None:
    result = tpubench(*args)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], result.stderr
    assert "Traceback" not in result.stdout + result.stderr


@pytest.mark.slow
def test_run_llm_suite_end_to_end(results_dir: Path) -> None:
    """The README's command at tiny size: every llm workload, cpu and cpu-compile, both modes."""
    result = tpubench(
        "run --suite llm --size tiny --steps 3 --results",
        str(results_dir),
        "--tag",
        "purpose=test",
        env={"COLUMNS": "200"},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "tpubench results" in result.stdout and "median ms" in result.stdout
    runs = store.load_runs(results_dir)
    assert len(runs) == 8
    assert set(runs.status) == {"ok"}, runs[["workload", "backend", "mode", "error"]]
    assert set(runs.backend) == {"cpu", "cpu-compile"} and set(runs["mode"]) == {"train", "infer"}
    assert (runs.median_step_ms > 0).all() and (runs.tokens_per_s > 0).all()
    assert (runs.p10_step_ms <= runs.median_step_ms).all() and (runs.median_step_ms <= runs.p90_step_ms).all()
    assert runs.mfu.isna().all()  # a CPU has no entry in the peak table, and each row says so
    assert runs.warnings.str.contains("no peak float32 FLOP/s known").all()
    assert (runs.peak_mem_bytes > 0).all() and (runs.flops_per_step > 0).all()
    assert json.loads(runs.tags[0]) == {"purpose": "test"}
    assert runs.fingerprint.nunique() == 1  # cpu and cpu-compile share an interpreter and device
    compiled = runs[runs.backend == "cpu-compile"]
    assert (compiled.compile_count >= 1).all() and (compiled.recompiles_after_warmup == 0).all()
    assert (compiled.compile_s > 0).all()
    # each compiled run had a private, empty Inductor cache: nothing came from disk
    assert compiled.compile_cache.isna().all() and (compiled.compile_cache_hits == 0).all()
    assert (compiled.compile_cache_misses >= 1).all()
    assert (compiled.first_step_s * 1e3 > compiled.median_step_ms).all()
    steps = store.load_steps(results_dir)
    measured = steps[steps.phase == "measure"].groupby("run_id").size()
    assert (measured == 3).all() and len(measured) == 8
    assert (steps[steps.phase == "first"].groupby("run_id").size() == 1).all()


def test_resume_skips_runs_already_stored_with_the_same_fingerprint(results_dir: Path) -> None:
    args = [
        "run --workload gpt2 --backend cpu --mode infer --steps 2 --results",
        str(results_dir),
    ]
    assert tpubench(*args).returncode == 0
    again = tpubench(*args, "--resume")
    assert again.returncode == 0 and "skipped 1 run" in again.stdout
    assert len(store.load_runs(results_dir)) == 1
    other_shape = tpubench(*args, "--resume", "--batch-size", "2")
    assert other_shape.returncode == 0
    assert len(store.load_runs(results_dir)) == 2


def test_oversized_run_is_skipped_with_its_estimate(results_dir: Path) -> None:
    result = tpubench(
        "run --workload llama3 --size 8b --backend cpu --mode train --batch-size 64 --seq-len 4096 --results",
        str(results_dir),
        env={"COLUMNS": "200"},
    )
    assert result.returncode == 0, result.stderr
    [row] = store.load_runs(results_dir).to_dict("records")
    assert row["status"] == "skipped"
    assert "GiB exceeds the" in row["error"] and row["estimated_mem_bytes"] > 100 * 2**30


def test_two_suites_writing_to_one_directory_lose_nothing(fault_workloads: None, results_dir: Path) -> None:
    suites = [
        subprocess.Popen(
            command(
                f"run --backend cpu --mode infer --steps 2 --workload fault-ok --workload fault-ok --workload gpt2 "
                f"--tag suite={i} --results",
                str(results_dir),
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=ROOT,
        )
        for i in range(2)
    ]
    for process in suites:
        assert process.wait(timeout=300) == 0, process.stderr.read()
    runs = store.load_runs(results_dir)
    assert len(runs) == 4  # --workload fault-ok twice is one workload: 2 runs per suite
    assert runs.invocation_id.nunique() == 2 and set(runs.status) == {"ok"}
