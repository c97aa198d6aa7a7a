"""Runs that would share a device wait for it, and a busy host is written into the row."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
import pytest
from helpers import ROOT, command, wait_for

from tpubench import devicelock, store


def test_a_run_waits_for_a_device_another_process_holds(results_dir: Path, tmp_path: Path, monkeypatch) -> None:
    """This test holds the cpu lock itself; the CLI must say it waits, and start only after
    the lock is released."""
    monkeypatch.setenv("TPUBENCH_LOCK_DIR", str(tmp_path / "locks"))
    argv = command(f"run --workload gpt2 --backend cpu --mode infer --steps 2 --warmup 0 --results {results_dir}")
    with devicelock.hold("cpu"):
        process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
        assert process.stdout is not None
        output = []
        for line in process.stdout:  # the event: the CLI reports that it is waiting
            output.append(line)
            if "waiting for the cpu" in line:
                break
        else:
            pytest.fail("".join(output))
        assert f"pid {os.getpid()}" in line
        released = datetime.now(UTC)
    rest, _ = process.communicate(timeout=300)
    assert process.returncode == 0, rest
    [row] = store.load_runs(results_dir).to_dict("records")
    assert row["status"] == "ok" and row["started_at"] >= pd.Timestamp(released)
    assert row["device_wait_s"] > 0


def test_the_holder_may_take_its_lock_again_and_others_still_wait(tmp_path: Path, monkeypatch) -> None:
    """A Ray task holds the device across its probe and its run, whose executor takes the lock
    too: the inner hold is free, and another process still waits until the outer one ends."""
    monkeypatch.setenv("TPUBENCH_LOCK_DIR", str(tmp_path / "locks"))
    try_lock = (
        "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR)\n"
        "try:\n    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\nexcept BlockingIOError:\n    sys.exit(3)"
    )

    def another_process_gets_it() -> bool:
        done = subprocess.run([sys.executable, "-c", try_lock, str(tmp_path / "locks" / "cpu.lock")])
        return done.returncode == 0

    with devicelock.hold("cpu"):
        with devicelock.hold("cpu") as waited:
            assert waited == 0.0
        assert not another_process_gets_it()  # the inner block's end released nothing
    assert another_process_gets_it()


#: holds the cpu's lock as host 1 of run ``argv[1]`` (none: another run) until its stdin closes
HOLD_AS = (
    "import sys\nfrom tpubench import devicelock\n"
    "job = devicelock.Job(sys.argv[1], 1) if sys.argv[1] else None\n"
    "with devicelock.hold('cpu', job=job):\n    print('held', flush=True)\n    sys.stdin.read()\n"
)


@pytest.mark.parametrize("holder", ["host 1 of this run", "host 1 of another run", "a run on one host"])
def test_a_host_shares_the_lock_a_host_of_its_own_run_holds(tmp_path: Path, monkeypatch, holder: str) -> None:
    """Host 0 of a run over several hosts finds the cpu's lock held: by a host of its own run
    (two hosts on one machine), it shares it at once and says so, where waiting deadlocked the
    two; by anything else, it waits as any run does, and holds the lock once it is free."""
    import threading

    monkeypatch.setenv("TPUBENCH_LOCK_DIR", str(tmp_path / "locks"))
    key = {"host 1 of this run": "run-a", "host 1 of another run": "run-b", "a run on one host": ""}[holder]
    process = subprocess.Popen(
        [sys.executable, "-c", HOLD_AS, key], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    said: list[str] = []
    held = threading.Event()

    def host_0() -> None:
        with devicelock.hold("cpu", said.append, devicelock.Job("run-a", 0)):
            held.set()

    try:
        assert process.stdout is not None and process.stdout.readline() == "held\n"  # the event: it holds the lock
        thread = threading.Thread(target=host_0, daemon=True)
        thread.start()
        if key == "run-a":
            assert held.wait(30), said
            assert said == [
                f"sharing the cpu with host 1 of this run (pid {process.pid}), which holds its lock on this machine: "
                "hosts of one run on one machine share its devices"
            ]
        else:
            wait_for(lambda: said, "host 0 to say it waits")
            assert said == [f"waiting for the cpu: another tpubench run (pid {process.pid}) is using it"]
            assert not held.is_set()
            process.stdin.close()  # the holder lets go: host 0 takes the lock
            assert held.wait(30)
        thread.join(30)
        if not process.stdin.closed:
            process.stdin.close()
        assert process.wait(30) == 0
    finally:
        process.kill()
        process.wait()
    assert (tmp_path / "locks" / "cpu.lock").read_text() == ""  # no holder named once it is free


def test_two_concurrent_suites_never_measure_at_the_same_time(results_dir: Path, tmp_path: Path) -> None:
    env = {**os.environ, "TPUBENCH_LOCK_DIR": str(tmp_path / "locks")}
    suites = [
        subprocess.Popen(
            command(
                f"run --workload gpt2 --workload llama3 --backend cpu --mode infer --steps 5 --warmup 1 "
                f"--tag suite={i} --results {results_dir}"
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env=env,
        )
        for i in range(2)
    ]
    for process in suites:
        assert process.wait(timeout=600) == 0, process.stdout.read()
    runs = store.load_runs(results_dir).sort_values("started_at")
    assert len(runs) == 4 and runs.invocation_id.nunique() == 2 and set(runs.status) == {"ok"}
    assert (runs.started_at < runs.finished_at).all()
    # one device, one run at a time: each row's times are stamped while its process holds the
    # device's lock, so every run ended before the next began, whichever suite it was in
    assert (runs.started_at.iloc[1:].to_numpy() > runs.finished_at.iloc[:-1].to_numpy()).all(), runs[
        ["invocation_id", "started_at", "finished_at", "device_wait_s"]
    ]


BURN = "import time\nend = time.time() + 600\nwhile time.time() < end: pass\n"


def test_a_busy_host_is_recorded_and_warned_about(results_dir: Path, tmp_path: Path) -> None:
    """Real busy loops compete with the measured steps: the row says so, and (seven
    warnings named no run) the summary marks the row, the warning names its run, and the
    report marks the row and says what the mark means."""
    burners = [subprocess.Popen([sys.executable, "-c", BURN]) for _ in range(os.cpu_count() or 1)]
    try:
        result = subprocess.run(
            command(f"run --workload gpt2 --backend cpu --mode infer --steps 40 --warmup 1 --results {results_dir}"),
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=600,
        )
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
    assert result.returncode == 0, result.stderr
    [row] = store.load_runs(results_dir).to_dict("records")
    assert row["host_other_cpu_share"] > 0.2 and row["host_load_1m"] >= 0
    assert "host busy: other processes used" in row["warnings"]
    assert "ok, host busy" in result.stdout
    said = " ".join(result.stdout.split())  # a long line wraps at the console's width
    assert "[warning] gpt2/tiny cpu infer 4x128: host busy: other processes used" in said, result.stdout
    markdown = tmp_path / "report.md"
    report = subprocess.run(
        command("report --out", str(tmp_path / "r.html"), "--markdown", str(markdown), "--results", str(results_dir)),
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert report.returncode == 0, report.stderr
    [line] = [line for line in markdown.read_text().splitlines() if line.startswith("| gpt2/tiny")]
    assert "| ok ⚠ host busy |" in line and line.rstrip(" |").endswith("| 1")
    assert "⚠ host busy: other processes used more than 20% of the CPUs" in markdown.read_text()
