"""Helpers shared by the tests."""

from __future__ import annotations

import os
import shlex
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
