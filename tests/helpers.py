"""Helpers shared by the tests."""

from __future__ import annotations

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
