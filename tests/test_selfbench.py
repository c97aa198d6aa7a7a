"""tpubench watches itself: a benchmark script's figures become rows that ``tpubench compare``
pairs across nights and judges with its usual statistics (benchmarks/record.py,
docs/benchmarks.md "tpubench watches itself").

The fast tests write figures through the scripts' own writer and read them with the real CLI
in a subprocess; the nightly one runs the job's command (benchmarks/nightly.py) twice at tiny
sizes, real scripts in real processes, and compares the two nights.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from datetime import UTC, datetime

import pytest
from helpers import ROOT, tpubench

from tpubench import store

SPEC = importlib.util.spec_from_file_location("selfbench_record", ROOT / "benchmarks" / "record.py")
record = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(record)

NOISE = [1.0, 1.02, 0.98, 1.01, 0.99]  # five repeats: a verdict needs five runs a side


def night(results, day: int, monkeypatch, slower: float = 1.0) -> str:
    """One night's figures of two scripts in one invocation; ``tpubench list`` ``slower``x."""
    started = datetime(2026, 12, day, 3, tzinfo=UTC)
    invocation = record.new_invocation(started)
    monkeypatch.setenv(record.INVOCATION_ENV, invocation)
    startup = {
        "tpubench --version": ("wall", [0.1 * x for x in NOISE]),
        "tpubench list": ("wall", [3.0 * x * slower for x in NOISE]),
    }
    record.write(results, "startup", startup, started)
    record.write(
        results, "harness_overhead", {"cpu gpt2 train in-worker": ("ratio", [1.01 * x for x in NOISE])}, started
    )
    return invocation


def test_each_repeat_is_a_run_with_its_sample_in_one_invocation_file(tmp_path, monkeypatch):
    invocation = night(tmp_path, 1, monkeypatch)
    runs, steps = store.load_runs(tmp_path), store.load_steps(tmp_path)
    assert len(store.parquet_files(tmp_path, "runs")) == 1  # both scripts in the invocation's one file
    assert set(runs["invocation_id"]) == {invocation} and set(runs["status"]) == {"ok"}
    assert len(runs) == 15 and set(runs["backend"]) == {"cpu"} and set(runs["suite"]) == {"tpubench-self"}
    listed = runs[runs["size"] == "tpubench list"]
    assert set(listed["workload"]) == {"tpubench-self/startup"} and set(listed["mode"]) == {"wall"}
    assert set(listed["dtype"]) == {"ms"} and set(runs.loc[runs["mode"] == "ratio", "dtype"]) == {"x"}
    samples = steps.set_index("run_id").loc[listed["run_id"], "step_ms"]
    assert sorted(samples) == pytest.approx(sorted(3000.0 * x for x in NOISE))  # seconds stored as ms
    assert set(steps["phase"]) == {"measure"}
    ratio = runs[runs["mode"] == "ratio"]
    assert sorted(ratio["median_step_ms"]) == pytest.approx(sorted(1.01 * x for x in NOISE))  # a ratio as it is


def test_compare_pairs_two_nights_and_a_real_slowdown_fails_it(tmp_path, monkeypatch):
    night(tmp_path, 1, monkeypatch)
    night(tmp_path, 2, monkeypatch, slower=1.3)
    done = tpubench(
        "compare --baseline previous --candidate latest --json --fail-on-regression", "--results", str(tmp_path)
    )
    assert done.returncode == 1, done.stdout + done.stderr  # a red night
    rows = {row["size"]: row for row in json.loads(done.stdout)["comparison"]}
    assert set(rows) == {"tpubench --version", "tpubench list", "cpu gpt2 train in-worker"}
    assert {row["base_runs"] for row in rows.values()} == {5} == {row["test_runs"] for row in rows.values()}
    slow = rows["tpubench list"]
    assert slow["verdict"] == "regressed" and slow["ratio"] == pytest.approx(1.3)
    assert slow["ci_low"] > 1.05  # an interval, beyond the threshold
    assert rows["tpubench --version"]["verdict"] == rows["cpu gpt2 train in-worker"]["verdict"] == "unchanged"
    table = tpubench(
        "compare --baseline previous --candidate latest --all", "--results", str(tmp_path), env={"COLUMNS": "250"}
    )
    assert table.returncode == 0, table.stdout + table.stderr  # labelled as any configuration is
    assert "tpubench-self/startup/tpubench list wall ms 1" in table.stdout
    assert "tpubench-self/harness_overhead/cpu gpt2 train in-worker ratio x 1" in table.stdout


def test_an_unknown_figure_mode_is_refused(tmp_path):
    with pytest.raises(ValueError, match="valid: wall, ratio"):
        record.rows("startup", {"x": ("ms", [1.0])}, "20261201T030000-00000000", datetime.now(UTC))


@pytest.mark.nightly
def test_the_nightly_command_stores_nights_that_compare_pairs(tmp_path):
    results = tmp_path / "selfbench"
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, "benchmarks/nightly.py", "--store", str(results), "--sizes", "tiny"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=1200,
        )
        assert done.returncode in (0, 1), done.stdout[-3000:] + done.stderr[-3000:]  # 1: a tiny size missed a bar
    runs = store.load_runs(results)
    assert runs["invocation_id"].nunique() == 2
    assert set(runs["workload"]) == {
        f"tpubench-self/{script}"
        for script in ("ops_ingest", "dashboard_speed", "startup", "harness_overhead", "run_overhead")
    }
    done = tpubench("compare --baseline previous --candidate latest --json --all", "--results", str(results))
    assert done.returncode == 0, done.stderr
    comparison = json.loads(done.stdout)["comparison"]
    assert comparison and all(row["verdict"] != "unpaired" for row in comparison)
    assert {(row["workload"], row["size"]) for row in comparison} == set(
        zip(runs["workload"], runs["size"], strict=True)
    )
