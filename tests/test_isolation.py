"""Runner isolation with real worker processes: every failure becomes a row, the suite goes on."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from helpers import command

from tpubench import store
from tpubench.runner import SuiteRunner, plan


def specs_for(names: list[str], timeout_s: float = 60.0):
    return plan(names, modes=["infer"], warmup=1, steps=2, timeout_s=timeout_s)


def test_each_failure_gets_its_status_and_the_others_succeed(fault_workloads: None, results_dir: Path) -> None:
    names = [
        "fault-ok",
        "fault-abort",
        "fault-ok",
        "fault-segfault",
        "fault-raise",
        "fault-oom",
        "fault-hang",
        "fault-ok",
    ]
    specs = specs_for(names, timeout_s=15.0)
    rows = SuiteRunner(results_dir).run(specs)
    statuses = [row["status"] for row in rows]
    assert statuses == ["ok", "crashed", "ok", "crashed", "failed", "oom", "timeout", "ok"]
    by_name = dict(zip(names, rows, strict=True))
    assert "SIGABRT" in by_name["fault-abort"]["error"]
    assert "SIGSEGV" in by_name["fault-segfault"]["error"]
    assert by_name["fault-raise"]["error"] == "RuntimeError: deliberate failure in build_model"
    assert "deliberate failure" in by_name["fault-raise"]["stderr_tail"]  # the worker's traceback
    assert "Traceback" in by_name["fault-oom"]["stderr_tail"]
    assert "no result within 15 s" in by_name["fault-hang"]["error"]
    for row in rows:
        assert (row["status"] == "ok") == (row.get("stderr_tail") is None)

    stored = store.load_runs(results_dir)
    assert sorted(stored["status"]) == sorted(statuses)
    ok_ids = set(stored[stored.status == "ok"].run_id)
    steps = store.load_steps(results_dir)
    assert set(steps.run_id) == ok_ids
    assert len(steps[steps.phase == "measure"]) == 2 * len(ok_ids)


def test_unavailable_backend_is_a_row_not_an_error(results_dir: Path) -> None:
    specs = plan(["gpt2"], backends=["cuda"], modes=["infer"], steps=1)
    runner = SuiteRunner(results_dir)
    if runner.probe_all(["cuda"])["cuda"]["backends"]["cuda"]["available"]:
        pytest.skip("this machine has a CUDA device")
    [row] = runner.run(specs)
    assert row["status"] == "unavailable"
    assert row["error"] in ("no CUDA device", "torch built without CUDA")


def test_a_missing_interpreter_makes_its_backends_unavailable(results_dir: Path) -> None:
    specs = plan(["gpt2"], modes=["infer"], steps=1)
    [row] = SuiteRunner(results_dir, pythons={"cpu": "/nonexistent/python"}).run(specs)
    assert row["status"] == "unavailable"
    assert "/nonexistent/python" in row["error"]


def test_ctrl_c_keeps_the_finished_rows(fault_workloads: None, results_dir: Path) -> None:
    """SIGINT to the CLI mid-suite: exit 130, finished runs on disk, the worker killed too."""
    argv = command(
        "run --workload fault-ok --workload fault-hang --workload fault-ok --backend cpu --mode infer --steps 1 "
        "--results",
        str(results_dir),
    )
    process = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, "COLUMNS": "200"}
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if list(results_dir.glob("runs/*/*.parquet")):
            break
        time.sleep(0.2)
    time.sleep(2)  # the hanging worker is now started
    process.send_signal(signal.SIGINT)
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 130, output
    assert "interrupted" in output
    runs = store.load_runs(results_dir)
    assert list(runs.workload) == ["fault-ok"] and list(runs.status) == ["ok"]
    leftover = subprocess.run(["pgrep", "-f", "tpubench.worker"], capture_output=True, text=True).stdout
    assert not leftover.strip()


def test_repeated_run_calls_continue_one_invocation(fault_workloads: None, results_dir: Path) -> None:
    runner = SuiteRunner(results_dir)
    runner.run(specs_for(["fault-ok"]))
    runner.run(specs_for(["fault-ok"]))
    runs = store.load_runs(results_dir)
    assert len(runs) == 2 and runs.invocation_id.nunique() == 1
    assert len(list(results_dir.glob("runs/*/*.parquet"))) == 1
