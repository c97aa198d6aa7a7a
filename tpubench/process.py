"""Start a worker process, follow its events, and classify how it ended.

Each worker runs in its own process group with a deadline. Whatever happens to it (an
exception, an abort, a segfault, the kernel's OOM killer, a hang) the parent gets an
:class:`Outcome` and carries on. Ctrl-C in the parent kills the worker's group and
propagates, so the suite can save what it has.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROJECT_ROOT = Path(__file__).resolve().parent.parent
STDERR_TAIL_LINES = 40


@dataclass
class Outcome:
    result: dict[str, Any] | None  # the worker's final message, if it sent one
    returncode: int | None
    timed_out: bool
    stderr_tail: str
    wall_s: float


def _tail(path: Path, lines: int = STDERR_TAIL_LINES) -> str:
    with open(path, "rb") as stream:
        stream.seek(0, os.SEEK_END)
        stream.seek(max(0, stream.tell() - 64 * 1024))
        text = stream.read().decode(errors="replace")
    return "\n".join(text.splitlines()[-lines:])


def worker_env(extra: dict[str, str]) -> dict[str, str]:
    """The parent's environment plus ``extra``, with this checkout importable from any interpreter."""
    env = {**os.environ, **extra}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROJECT_ROOT), env.get("PYTHONPATH")]))
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def run_worker(
    request: dict[str, Any],
    *,
    python: str,
    env: dict[str, str],
    timeout_s: float,
    on_event: Callable[[dict[str, Any]], None] = lambda event: None,
) -> Outcome:
    """Run ``python -m tpubench.worker`` on ``request`` and wait at most ``timeout_s``."""
    read_fd, write_fd = os.pipe()
    started = time.perf_counter()
    with tempfile.NamedTemporaryFile(prefix="tpubench-worker-", suffix=".log", delete=False) as log:
        log_path = Path(log.name)
    try:
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                [python, "-m", "tpubench.worker", "--channel-fd", str(write_fd)],
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
                pass_fds=(write_fd,),
                env=env,
                cwd=PROJECT_ROOT,
                start_new_session=True,
            )
        os.close(write_fd)
        try:
            process.stdin.write(json.dumps(request).encode())
            process.stdin.close()
        except BrokenPipeError:
            pass  # the worker died before reading; its exit status says why
        try:
            result, timed_out = _follow(read_fd, process, started + timeout_s, on_event)
        except BaseException:
            _kill_group(process)
            raise
        if timed_out:
            _kill_group(process)
        returncode = process.wait()
        return Outcome(result, returncode, timed_out, _tail(log_path), time.perf_counter() - started)
    finally:
        os.close(read_fd)
        log_path.unlink(missing_ok=True)


def _follow(
    read_fd: int, process: subprocess.Popen, deadline: float, on_event: Callable[[dict[str, Any]], None]
) -> tuple[dict[str, Any] | None, bool]:
    """Read events until the channel closes (worker exited) or the deadline passes."""
    result = None
    buffer = b""
    with selectors.DefaultSelector() as selector:
        selector.register(read_fd, selectors.EVENT_READ)
        while True:
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                return result, True
            if not selector.select(timeout=min(remaining, 1.0)):
                if process.poll() is not None and not selector.select(timeout=0):
                    return result, False  # exited; a grandchild may still hold the pipe open
                continue
            chunk = os.read(read_fd, 65536)
            if not chunk:
                return result, False
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                event = json.loads(line)
                if event["event"] == "result":
                    result = event["result"]
                else:
                    on_event(event)


def _kill_group(process: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def classify(outcome: Outcome, timeout_s: float) -> dict[str, Any]:
    """The run-row fields for an outcome: the worker's own result, or why there is none."""
    if outcome.timed_out:
        row = {"status": "timeout", "error": f"no result within {timeout_s:g} s; worker killed"}
    elif outcome.result is not None:
        row = dict(outcome.result)
    elif outcome.returncode is not None and outcome.returncode < 0:
        name = signal.Signals(-outcome.returncode).name
        hint = " (the kernel's OOM killer sends SIGKILL)" if name == "SIGKILL" else ""
        row = {"status": "crashed", "error": f"worker killed by {name}{hint}"}
    else:
        row = {"status": "crashed", "error": f"worker exited with code {outcome.returncode} and no result"}
    if row["status"] != "ok":
        row["stderr_tail"] = outcome.stderr_tail
    return row
