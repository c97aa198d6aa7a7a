"""Helpers shared by the tests."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

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
