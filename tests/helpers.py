"""Helpers shared by the tests."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shlex
import signal
import subprocess
import sys
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

ROOT = Path(__file__).resolve().parent.parent


def command(line: str, *args: str) -> list[str]:
    """``python -m tpubench`` with ``line`` split as a shell would, then ``args`` as they are
    (paths, which may hold spaces)."""
    return [sys.executable, "-m", "tpubench", *shlex.split(line), *args]


def tpubench(
    line: str, *args: str, env: dict[str, str] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess:
    """Run the real CLI in a subprocess, as a user would: ``tpubench("run --backend cpu", path)``."""
    return subprocess.run(
        command(line, *args),
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=timeout,
        cwd=ROOT,
    )


#: where this repository's own modules live: the modules :func:`in_process` keeps imported
OWN_PACKAGES = tuple(str(ROOT / name) for name in ("tpubench", "workloads", "reports", "dashboard"))
#: where the interpreter's modules live (the standard library, site-packages)
INTERPRETER_DIRS = tuple(dict.fromkeys((sys.prefix, sys.base_prefix, sys.exec_prefix)))


def in_process(
    line: str,
    *args: str | Path,
    env: Mapping[str, str] | None = None,
    cwd: str | Path = ROOT,
    starts_runs: bool = False,
) -> subprocess.CompletedProcess:
    """The CLI's entry point run in this process, like ``tpubench(line, *args)`` without a new
    interpreter, which imports torch and the registry again (5-8 CPU-seconds a call on CI's
    2 cores): for what a command says, above all the input it refuses before anything runs.
    Not for a command that starts runs: a process left running when it returns (a worker's
    fork server) is an error here, CPU no test measures. One subprocess test per command
    keeps checking the real process (its exit status, its one line, no traceback).
    ``starts_runs=True`` is for a fixture's runs, whose command is not what the test checks
    (a store to read): the runs fork from this process's fork server
    (:func:`tpubench.launch.zygote.zygote_for`), started once and kept for the next call with
    the same interpreter and environment, as the runner's own tests keep it; a CLI and a
    fork server started per call cost 5 CPU-seconds before a tiny run's first step. The fork
    server is the one process the call may leave running.

    The call leaves this process as it found it, as a subprocess would: ``os.environ``
    (``env`` is applied for the call only; the CLI sets TORCH_DEVICE_BACKEND_AUTOLOAD,
    TPUBENCH_WORKLOAD_MODULES, PYTHONPATH, OMP_NUM_THREADS), ``sys.path``, the working
    directory (``cwd``, the checkout as for :func:`tpubench`), the warning filters, the
    registered backends, and the modules of the user's code it imported (a ``my_model`` of
    one test's folder must not be the next test's). Tables are drawn as when piped: to
    ``COLUMNS``, 200 unless ``env`` sets it (tests/conftest.py).
    """
    import psutil

    from tpubench import backends
    from tpubench.cli import main
    from tpubench.cli.common import console, console_width

    saved_env, saved_path, saved_cwd, saved_argv = dict(os.environ), list(sys.path), os.getcwd(), sys.argv
    saved_backends, saved_modules, saved_width = dict(backends.BACKENDS), set(sys.modules), console._width
    children = {child.pid for child in psutil.Process().children(recursive=True)}
    out, err, argv = io.StringIO(), io.StringIO(), ["tpubench", *shlex.split(line), *map(os.fspath, args)]
    try:
        os.environ.update({"COLUMNS": "200", **(env or {})})
        os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")  # as tpubench.console's main
        # pytest's name of the test running, a new value in each test: in the workers' environment,
        # which keys the fork server kept for the next call, it started one per test (2 CPU-s each)
        os.environ.pop("PYTEST_CURRENT_TEST", None)
        console.width = console_width(dict(os.environ), tty=False)  # fixed when the CLI was imported
        os.chdir(cwd)
        sys.argv = argv
        with (
            warnings.catch_warnings(),  # main() replaces showwarning; a fresh registry shows each warning again
            contextlib.redirect_stdout(out),
            contextlib.redirect_stderr(err),
        ):
            _fresh_interpreter_warnings()
            try:
                main()
                code: int | str | None = 0
            except SystemExit as exited:
                code = exited.code
    finally:
        sys.argv = saved_argv
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        sys.path[:] = saved_path
        backends.BACKENDS.clear()
        backends.BACKENDS.update(saved_backends)
        console._width = saved_width
        for name in set(sys.modules) - saved_modules:
            where = getattr(sys.modules[name], "__file__", None)
            if where and not where.startswith(OWN_PACKAGES + INTERPRETER_DIRS):
                del sys.modules[name]  # the user's model, a test's plugin module: imported afresh next time
    started = [child for child in psutil.Process().children(recursive=True) if child.pid not in children]
    if starts_runs:
        from tpubench.launch import zygote

        kept = {server.process.pid for server in zygote._ZYGOTES.values() if server.alive()}
        started = [child for child in started if child.pid not in kept]
    assert not started, (
        f"{' '.join(argv)} left {started} running: not a command for in_process, which is for those that start "
        "nothing (a worker's fork server here is CPU no test measures, and a process the test leaks)"
    )
    if isinstance(code, str):  # as tpubench.console's exit: the message on stderr, status 1
        err.write(code + "\n")
        code = 1
    return subprocess.CompletedProcess(argv, code or 0, out.getvalue(), err.getvalue())


def one_error_line(result: subprocess.CompletedProcess) -> str:
    """The one ``error:`` line of a refusal (exit 2), which it returns for the test to read."""
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def _fresh_interpreter_warnings() -> None:
    """A new interpreter's warning filters, not pytest's: the deprecations a subprocess never
    shows would be extra lines on stderr."""
    warnings.resetwarnings()
    for category in (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning):
        warnings.simplefilter("ignore", category)


#: one step's peak as a worker measures it: a fresh process, CpuBackend's baseline before the
#: model exists and its peak after two steps (the second is the first with the optimizer's state)
PEAK_SCRIPT = """
import json, sys
import torch
from tpubench.backends.cpu import CpuBackend
from tpubench.measure import make_step
from workloads import get_workload
from workloads.base import Shape, build

name, size, mode, shape = sys.argv[1], sys.argv[2], sys.argv[3], Shape(**json.loads(sys.argv[4]))
workload = get_workload(name)
backend = CpuBackend()
baseline = backend.memory_in_use_bytes()
instance = build(workload, size, device="cpu", shape=shape)
step = make_step(instance, instance.model, mode)
for _ in range(2):
    step()
estimate = workload.memory_bytes(workload.config(size), shape, mode, torch.float32)
print(json.dumps({"added": backend.peak_memory_bytes() - baseline, "estimate": estimate}))
"""


def measured_peak(workload: str, size: str, mode: str, shape: dict[str, int]) -> dict[str, int]:
    """What a registered workload's step adds to a fresh CPU process at its peak, and its estimate."""
    done = subprocess.run(
        [sys.executable, "-c", PEAK_SCRIPT, workload, size, mode, json.dumps(shape)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def wait_for(condition, what: str, timeout: float = 120.0, interval: float = 0.05):
    """Poll ``condition`` until it returns something truthy (an event: a file, a pid gone)."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := condition():
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


def default_sigint() -> None:
    """A ``preexec_fn`` that handles SIGINT as a terminal's Ctrl-C is. A shell's background job
    (a CI runner, nohup, ``pytest &``) starts with SIGINT ignored, which its children inherit,
    and Python then installs no KeyboardInterrupt handler: a test that interrupts a CLI it
    started would otherwise wait for an exit that never comes."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def another_sweep(
    sweep: pd.DataFrame,
    run_id: str,
    minutes: float,
    *,
    slower: float = 1.0,
    other_cpu_share: float | None = None,
    past_cache: float | None = None,
) -> pd.DataFrame:
    """The rows a real ceilings sweep (``sweep``, one ``run_id``) would have had as another
    sweep of the same points: ``minutes`` later (earlier if negative), every sample ``slower``
    times longer (rates that much lower), other processes on ``other_cpu_share`` of the CPUs.
    With ``past_cache`` (a memory sweep), each kernel also gets the point a sweep without
    --max-size adds: arrays past 4x the last-level cache the rows name, each byte
    ``past_cache`` times slower than at the sweep's largest array (DRAM beside a cache)."""
    import pandas as pd

    from tpubench.analysis.ceilings import cache_reach, size_label

    shift = pd.Timedelta(minutes=minutes)
    frame = sweep.assign(
        run_id=run_id,
        invocation_id=f"inv-{run_id}",
        started_at=sweep["started_at"] + shift,
        finished_at=sweep["finished_at"] + shift,
        host_other_cpu_share=other_cpu_share,
        samples_s=[[t * slower for t in samples] for samples in sweep["samples_s"]],
        **{column: sweep[column] * slower for column in ("median_s", "min_s", "p90_s")},
        **{column: sweep[column] / slower for column in ("median_rate", "max_rate", "p10_rate")},
    )
    if past_cache is None:
        return frame
    largest = frame.loc[frame.groupby(["op", "dtype"])["size_bytes"].idxmax()]
    reach = largest["llc_bytes"].map(cache_reach)
    grow = reach / largest["size_bytes"]  # bytes moved grow by this, time by it x past_cache
    past = largest.assign(
        size_bytes=reach,
        shape=reach.map(size_label),
        bytes_per_op=largest["bytes_per_op"] * grow,
        samples_s=[[t * g * past_cache for t in s] for s, g in zip(largest["samples_s"], grow, strict=True)],
        **{column: largest[column] * grow * past_cache for column in ("median_s", "min_s", "p90_s")},
        **{column: largest[column] / past_cache for column in ("median_rate", "max_rate", "p10_rate")},
    )
    return pd.concat([frame, past], ignore_index=True)


def write_sweeps(results: Path, *sweeps: pd.DataFrame) -> None:
    """Store the sweeps' rows as `tpubench ceilings` does: one file of the ceilings table per invocation."""
    import pandas as pd
    import pyarrow as pa

    from tpubench import store

    for invocation, sweep in pd.concat(sweeps, ignore_index=True).groupby("invocation_id"):
        started = sweep["started_at"].min().to_pydatetime()
        writer = store.InvocationWriter(results, invocation, started, tables=("ceilings",))
        table = pa.Table.from_pandas(sweep, schema=store.TABLES["ceilings"], preserve_index=False)
        store.Location(results).write_table(table, writer.paths["ceilings"])
