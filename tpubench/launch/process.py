"""Start a worker process, follow its events, and classify how it ended.

Each worker runs in its own process group with a deadline. Whatever happens to it (an
exception, an abort, a segfault, the kernel's OOM killer, a hang) the parent gets an
:class:`Outcome` and carries on. Ctrl-C (or SIGTERM) in the parent kills the worker's
group and propagates, so the suite can save what it has.

Workers start from a fork server (:mod:`tpubench.launch.zygote`) that has already imported
torch, unless their backend cannot be forked safely (TorchTPU loads its runtime at
import), in which case they are fresh interpreters. Either way a worker dies with its
parent: it holds the read end of a *lifeline* pipe whose write end only the parent has,
and exits (killing its own children) when that pipe closes. Everything a run writes to
disk outside the results (its log, compiler caches) lives in one scratch folder that is
removed on every exit path.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tpubench.backends.base import DEFAULT_WORKER_ENV
from tpubench.launch.zygote import PROJECT_ROOT, Zygote, ZygoteDied, zygote_for

STDERR_TAIL_LINES = 40
#: a worker that sent its result but does not exit (a runtime hanging in teardown) is
#: killed after this long, and its result is kept
RESULT_GRACE_S = 10.0


@dataclass
class Outcome:
    result: dict[str, Any] | None  # the worker's final message, if it sent one
    returncode: int | None
    timed_out: bool
    stderr_tail: str
    wall_s: float
    notes: list[str] = field(default_factory=list)  # what the parent had to do (a kill after the result)
    lost_log: str | None = None  # why there is no output: the worker's log was gone when it ended


def _tail(path: Path, lines: int = STDERR_TAIL_LINES) -> str | None:
    """The last ``lines`` of the worker's log; None when the log is gone: something removed the
    run's scratch folder while the worker ran (once under torch_xla with ``--profile``, where the
    FileNotFoundError ended the whole invocation, with no row and no summary)."""
    try:
        with open(path, "rb") as stream:
            stream.seek(0, os.SEEK_END)
            stream.seek(max(0, stream.tell() - 64 * 1024))
            text = stream.read().decode(errors="replace")
    except FileNotFoundError:
        return None
    return "\n".join(text.splitlines()[-lines:])


def worker_env(extra: dict[str, str]) -> dict[str, str]:
    """The parent's environment plus ``extra``, with this checkout importable from any interpreter."""
    env = {**os.environ, **extra}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROJECT_ROOT), env.get("PYTHONPATH")]))
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def prestart() -> None:
    """Start the fork server that this interpreter's CPU and CUDA workers will use, now.

    Its one-off import of torch (about 2 s) then overlaps the CLI's own start-up.
    """
    zygote_for(sys.executable, worker_env(DEFAULT_WORKER_ENV))


class _Worker:
    """A started worker, however it was started: its pid, its exit status, how to kill it."""

    def __init__(self, pid: int, popen: subprocess.Popen | None = None, zygote: Zygote | None = None):
        self.pid, self._popen, self._zygote = pid, popen, zygote

    def returncode(self) -> int | None:
        if self._popen is not None:
            return self._popen.poll()
        assert self._zygote is not None
        return self._zygote.returncodes.get(self.pid)

    def news_fd(self) -> int | None:
        """A descriptor that becomes readable when the worker's exit is known (zygote only)."""
        return None if self._zygote is None else self._zygote.fileno()

    def pump(self) -> None:
        """Take in the zygote's news (a child's exit status)."""
        assert self._zygote is not None
        self._zygote.pump()

    def wait(self, timeout: float | None = None) -> int | None:
        """The exit status, waiting at most ``timeout`` seconds for it (None: not yet)."""
        if self._popen is not None:
            try:
                return self._popen.wait(timeout)
            except subprocess.TimeoutExpired:
                return None
        assert self._zygote is not None
        end = None if timeout is None else time.perf_counter() + timeout
        with selectors.DefaultSelector() as selector:
            selector.register(self._zygote.fileno(), selectors.EVENT_READ)
            while (code := self.returncode()) is None:
                left = None if end is None else end - time.perf_counter()
                if left is not None and left <= 0:
                    return None
                if selector.select(left):
                    self.pump()
        return code

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(self.pid, signal.SIGKILL)  # in case it had not yet made its own group

    def release(self) -> None:
        """Close what the parent holds for it: stdin (a fresh interpreter's lifeline) and its status."""
        if self._popen is not None and self._popen.stdin is not None:
            with contextlib.suppress(OSError):
                self._popen.stdin.close()
        if self._zygote is not None:
            self._zygote.returncodes.pop(self.pid, None)


def _start(
    request: dict[str, Any], python: str, env: dict[str, str], scratch: str, channel_fd: int, log_fd: int, fork: bool
) -> tuple[_Worker, int | None]:
    """Start the worker; returns it and, for a fresh interpreter, the lifeline's write end."""
    if fork:
        lifeline_read, lifeline_write = os.pipe()
        try:
            zygote = zygote_for(python, env)
            pid = zygote.start(request, env, scratch, [channel_fd, log_fd, lifeline_read])
            return _Worker(pid, zygote=zygote), lifeline_write
        except ZygoteDied:
            os.close(lifeline_write)  # fall back to a fresh interpreter below
        finally:
            os.close(lifeline_read)
    process = subprocess.Popen(
        [python, "-m", "tpubench.launch.serve", "--channel-fd", str(channel_fd)],
        stdin=subprocess.PIPE,
        stdout=log_fd,
        stderr=subprocess.STDOUT,
        pass_fds=(channel_fd,),
        env={**env, "TMPDIR": scratch},
        cwd=PROJECT_ROOT,
        start_new_session=True,
    )
    assert process.stdin is not None
    try:
        # the request is the first line; stdin then stays open as the lifeline
        process.stdin.write(json.dumps({**request, "scratch": scratch}).encode() + b"\n")
        process.stdin.flush()
    except BrokenPipeError:
        pass  # the worker died before reading; its exit status says why
    return _Worker(process.pid, popen=process), None


def run_worker(
    request: dict[str, Any],
    *,
    python: str,
    env: dict[str, str],
    timeout_s: float,
    on_event: Callable[[dict[str, Any]], None] = lambda event: None,
    fork: bool = True,
) -> Outcome:
    """Run one worker request (a probe, a run, a --verify output) and wait at most ``timeout_s``.

    ``fork`` starts it from the fork server for ``python`` and ``env``; otherwise (or if
    that server cannot start) as ``python -m tpubench.launch.serve``.
    """
    started = time.perf_counter()
    scratch = tempfile.mkdtemp(prefix="tpubench-run-")
    log_path = Path(scratch) / "worker.log"
    read_fd, write_fd = os.pipe()
    lifeline: int | None = None
    worker: _Worker | None = None
    try:
        with open(log_path, "wb") as log:
            worker, lifeline = _start(request, python, env, scratch, write_fd, log.fileno(), fork)
        os.close(write_fd)
        write_fd = -1
        try:
            result, timed_out, notes = _follow(read_fd, worker, started + timeout_s, on_event)
            returncode = worker.wait()
        except ZygoteDied as error:
            result, timed_out, notes, returncode = None, False, [str(error)], None
        except BaseException:
            worker.kill()
            raise
        tail = _tail(log_path)
        lost = (
            None
            if tail is not None
            else f"the worker's log was gone when it ended ({scratch} was removed while it ran)"
        )
        return Outcome(result, returncode, timed_out, tail or "", time.perf_counter() - started, notes, lost)
    finally:
        for fd in (read_fd, write_fd, lifeline):
            if fd is not None and fd >= 0:
                os.close(fd)
        if worker is not None:
            worker.release()
        shutil.rmtree(scratch, ignore_errors=True)


def _follow(
    read_fd: int, worker: _Worker, deadline: float, on_event: Callable[[dict[str, Any]], None]
) -> tuple[dict[str, Any] | None, bool, list[str]]:
    """Read events until the worker has exited, its deadline passes, or it hangs after its result.

    Returns (result, timed out, notes). A worker that sent its result keeps it even if it
    then hangs (a runtime stuck in teardown): it is killed :data:`RESULT_GRACE_S` later.
    """
    result: dict[str, Any] | None = None
    result_at = 0.0
    buffer = b""
    with selectors.DefaultSelector() as selector:
        selector.register(read_fd, selectors.EVENT_READ, "channel")
        if (news := worker.news_fd()) is not None:
            selector.register(news, selectors.EVENT_READ, "news")
        while True:
            until = deadline if result is None else min(deadline, result_at + RESULT_GRACE_S)
            remaining = until - time.perf_counter()
            if remaining <= 0:
                break
            events = selector.select(timeout=min(remaining, 1.0))
            if not events and worker.returncode() is not None:
                return result, False, []  # exited; a grandchild may still hold the channel open
            for key, _ in events:
                if key.data == "news":
                    worker.pump()
                    continue
                chunk = os.read(read_fd, 65536)
                if not chunk:  # the worker closed the channel: it is exiting
                    if worker.wait(max(until - time.perf_counter(), 0.0)) is not None:
                        return result, False, []
                    break
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    event = json.loads(line)
                    if event["event"] == "result":
                        result, result_at = event["result"], time.perf_counter()
                    else:
                        on_event(event)
            else:
                continue
            break
    worker.kill()
    if result is None:
        return None, True, []
    return result, False, [f"the worker sent its result but had not exited {RESULT_GRACE_S:g} s later; killed"]


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
    if outcome.lost_log and outcome.result is None:
        row["error"] += f"; {outcome.lost_log}, so its output is lost"
    notes = [*outcome.notes, *([outcome.lost_log] if outcome.lost_log and row["status"] == "ok" else [])]
    if notes:
        row["warnings"] = "\n".join(filter(None, [row.get("warnings"), *notes]))
    if row["status"] != "ok":
        row["stderr_tail"] = outcome.stderr_tail if outcome.lost_log is None else f"({outcome.lost_log})"
    return row
