"""Runner isolation with real worker processes: every failure becomes a row, the suite goes on."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pandas as pd
import psutil
import pytest
from helpers import command, default_sigint, tpubench, wait_for

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


@pytest.mark.parametrize(
    ("signum", "exit_code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGKILL, -signal.SIGKILL)]
)
def test_stopping_the_suite_keeps_finished_rows_and_leaves_nothing_behind(
    fault_workloads: None, results_dir: Path, tmp_path: Path, signum: int, exit_code: int
) -> None:
    """Ctrl-C, SIGTERM or SIGKILL to the CLI while a worker hangs: finished runs stay on
    disk, the worker and the fork server die with the CLI, and no temporary file remains."""
    scratch, pidfile = tmp_path / "tmp", tmp_path / "worker.pid"
    scratch.mkdir()
    argv = command(
        "run --workload fault-ok --workload fault-hang --workload fault-ok --backend cpu --mode infer --steps 1 "
        "--results",
        str(results_dir),
    )
    env = {**os.environ, "COLUMNS": "200", "TMPDIR": str(scratch), "TPUBENCH_TEST_PIDFILE": str(pidfile)}
    process = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, preexec_fn=default_sigint
    )
    try:
        worker_pid = int(wait_for(lambda: pidfile.exists() and pidfile.read_text(), "the hanging worker to start"))
        helpers = psutil.Process(process.pid).children(recursive=True)  # fork server, worker
        assert worker_pid in {child.pid for child in helpers}
        process.send_signal(signum)
        output, _ = process.communicate(timeout=60)
    finally:  # a failure here must not leave a suite running (it would hold the device lock)
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == exit_code, output
    if signum != signal.SIGKILL:
        assert "interrupted: finished runs were saved" in output
    _, alive = psutil.wait_procs(helpers, timeout=30)
    assert not alive, f"outlived the CLI: {[p.cmdline() for p in alive]}"
    wait_for(lambda: not any(scratch.iterdir()), f"no temporary files in {scratch}", timeout=30)
    runs = store.load_runs(results_dir)
    assert list(runs.workload) == ["fault-ok"] and list(runs.status) == ["ok"]


def test_repeated_run_calls_continue_one_invocation(fault_workloads: None, results_dir: Path) -> None:
    runner = SuiteRunner(results_dir)
    runner.run(specs_for(["fault-ok"]))
    runner.run(specs_for(["fault-ok"]))
    runs = store.load_runs(results_dir)
    assert len(runs) == 2 and runs.invocation_id.nunique() == 1
    assert len(list(results_dir.glob("runs/*/*.parquet"))) == 1


def test_a_worker_that_hangs_after_its_result_keeps_its_row(fault_workloads: None, results_dir: Path) -> None:
    """A worker stuck in teardown after sending its result: the row is ok, with a note, and
    the worker is killed after the grace period rather than at the run's timeout."""
    [row] = SuiteRunner(results_dir).run(specs_for(["fault-hang-at-exit"], timeout_s=120.0))
    assert row["status"] == "ok"
    assert "sent its result but had not exited" in row["warnings"]
    assert row["finished_at"] - row["started_at"] < pd.Timedelta(seconds=60)


def test_a_worker_whose_log_is_removed_gives_rows_that_say_so(fault_workloads: None, results_dir: Path) -> None:
    """A worker whose scratch folder (its log with it) is removed while it runs, as a torch_xla
    run with --profile once had: `tpubench run` died with a FileNotFoundError from the log's
    tail, with no row and no summary. Now the run that finished keeps its row with a warning,
    the one that crashed is a crashed row whose error says the log was gone, and the
    invocation goes on to its summary."""
    names = ["fault-lose-log", "fault-lose-log-abort", "fault-ok"]
    workloads = " ".join(f"--workload {name}" for name in names)
    done = tpubench(f"run {workloads} --backend cpu --mode infer --steps 2 --warmup 1 --results", str(results_dir))
    assert "Traceback" not in done.stderr and "tpubench results" in done.stdout, done.stderr[-3000:]
    rows = store.load_runs(results_dir).set_index("workload")
    assert rows.loc[names, "status"].tolist() == ["ok", "crashed", "ok"], rows[["status", "error"]]
    assert "worker's log was gone" in rows.loc["fault-lose-log", "warnings"]
    crashed = rows.loc["fault-lose-log-abort"]
    assert crashed["error"].startswith("worker killed by SIGABRT") and "worker's log was gone" in crashed["error"]
    assert "worker's log was gone" in crashed["stderr_tail"]
