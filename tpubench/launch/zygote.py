"""A fork server for worker processes: pay for ``import torch`` once, not once per run.

Starting ``python -m tpubench.launch.serve`` costs about 2 s here before a single step runs
(torch, numpy and the backends are imported), so a tiny suite spent most of its time
starting interpreters. The zygote imports the worker's modules once, computes nothing,
and forks a child per run: each run still gets its own process (its own memory, its own
Dynamo and allocator state, its own crash), started from the same pristine, import-only
state a fresh interpreter would reach.

Protocol, over one ``AF_UNIX``/``SOCK_SEQPACKET`` socket (one JSON message per packet):
the parent sends ``{"request", "env", "scratch"}`` with three file descriptors (the event
channel's write end, the log file, the lifeline's read end); the zygote forks and answers
``{"started": pid}``, and later ``{"exited": pid, "returncode": n}`` (negative: the
signal that killed it, as :class:`subprocess.Popen` reports it).

The zygote never touches a device, so forking it is safe for CPU, CUDA (CUDA is not
initialised before the fork) and torch_xla (imported in the child). When its socket
closes (the parent exited or was killed) it kills its children's process groups,
removes their scratch folders and exits.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

PROJECT_ROOT = Path(__file__).resolve().parents[2]  # the checkout: tpubench/launch/zygote.py
MAX_MESSAGE = 1 << 20


class ZygoteDied(RuntimeError):
    """The fork server went away (it could not start, or was killed)."""


class Zygote:
    """The parent's handle on one fork server: one interpreter, one environment."""

    def __init__(self, python: str, env: dict[str, str]):
        self.python = python
        self._sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.process = subprocess.Popen(
                [python, "-m", "tpubench.launch.zygote", str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                env=env,
                cwd=PROJECT_ROOT,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,  # each child's output goes to its own log
                start_new_session=True,  # a Ctrl-C on the terminal reaches the parent only
            )
        finally:
            theirs.close()
        self.returncodes: dict[int, int] = {}  # exited children the parent has not collected yet

    def fileno(self) -> int:
        """Readable when the zygote has news (a child exited), for the parent's select loop."""
        return self._sock.fileno()

    def alive(self) -> bool:
        return self.process.poll() is None

    def start(self, request: dict[str, Any], env: dict[str, str], scratch: str, fds: list[int]) -> int:
        """Fork a worker for ``request`` with ``fds`` (channel, log, lifeline); its pid."""
        message = json.dumps({"request": request, "env": env, "scratch": scratch}).encode()
        try:
            socket.send_fds(self._sock, [message], fds)
            while True:
                reply = self._receive()
                if "started" in reply:
                    return int(reply["started"])
        except OSError as error:
            raise ZygoteDied(f"fork server for {self.python} is gone: {error}") from error

    def pump(self) -> None:
        """Read one message (call when :meth:`fileno` is readable)."""
        self._receive()

    def _receive(self) -> dict[str, Any]:
        data = self._sock.recv(MAX_MESSAGE)
        if not data:
            raise ZygoteDied(f"fork server for {self.python} exited")
        reply = json.loads(data)
        if "exited" in reply:
            self.returncodes[int(reply["exited"])] = int(reply["returncode"])
        return reply

    def close(self) -> None:
        """Closing the socket is the zygote's signal to exit."""
        self._sock.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


_ZYGOTES: dict[tuple, Zygote] = {}
MAX_ZYGOTES = 2  # one per interpreter in a normal suite; tests that change the environment make more


def zygote_for(python: str, env: dict[str, str]) -> Zygote:
    """The running zygote for this interpreter and environment, started if needed."""
    key = (python, tuple(sorted(env.items())))
    zygote = _ZYGOTES.get(key)
    if zygote is not None and zygote.alive():
        return zygote
    if zygote is not None:
        _ZYGOTES.pop(key).close()
    while len(_ZYGOTES) >= MAX_ZYGOTES:
        _ZYGOTES.pop(next(iter(_ZYGOTES))).close()
    _ZYGOTES[key] = Zygote(python, env)
    return _ZYGOTES[key]


@atexit.register
def close_all() -> None:
    while _ZYGOTES:
        _ZYGOTES.popitem()[1].close()


# --- the server side: runs as ``python -m tpubench.launch.zygote FD`` -------------------------------


def _preload() -> None:
    """Import what every worker imports. A failure here is left for the child to report."""
    with contextlib.suppress(Exception):
        import tpubench.launch.serve  # noqa: F401


def _child(message: dict[str, Any], fds: list[int], inherited: list[int]) -> None:
    """In the forked child: become a worker with its own session, log and environment."""
    channel_fd, log_fd, lifeline_fd = fds
    code = 1
    try:
        os.setsid()  # its own process group, which the parent kills on a timeout
        for fd in inherited:
            os.close(fd)
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(log_fd)
        os.environ.clear()
        os.environ.update(message["env"])
        os.environ["TMPDIR"] = message["scratch"]
        tempfile.tempdir = None  # re-read TMPDIR: temporary files go to the run's scratch folder
        from tpubench.launch import serve

        serve.serve(message["request"], channel_fd, lifeline_fd, message["scratch"])
        code = 0
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(BaseException):
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _send(sock: socket.socket, **message: Any) -> None:
    with contextlib.suppress(OSError):  # the parent is gone; the next recv says so
        sock.send(json.dumps(message).encode())


def serve(sock_fd: int) -> None:
    """Fork a worker per request until the parent closes the socket."""
    _preload()
    sock = socket.socket(fileno=sock_fd)
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)  # wakes the select below
    children: dict[int, str] = {}  # pid -> scratch folder
    with selectors.DefaultSelector() as selector:
        selector.register(sock, selectors.EVENT_READ)
        selector.register(wake_read, selectors.EVENT_READ)
        while True:
            for key, _ in selector.select():
                if key.fileobj is not sock:
                    os.read(wake_read, 4096)
                    continue
                try:
                    data, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, 3)
                except OSError:
                    data, fds = b"", []
                if not data:
                    _shutdown(children)
                    # nothing to flush (its output is /dev/null): skip tearing torch down, which
                    # the parent would wait for (about 0.5 s here)
                    os._exit(0)
                message = json.loads(data)
                pid = os.fork()
                if pid == 0:
                    _child(message, fds, [sock.fileno(), wake_read, wake_write])
                for fd in fds:
                    os.close(fd)
                children[pid] = message["scratch"]
                _send(sock, started=pid)
            _reap(sock, children)


def _reap(sock: socket.socket, children: dict[int, str]) -> None:
    while children:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            return
        children.pop(pid, None)
        _send(sock, exited=pid, returncode=os.waitstatus_to_exitcode(status))


def _shutdown(children: dict[int, str]) -> None:
    """The parent is gone: no worker outlives it, and no scratch folder either."""
    for pid, scratch in children.items():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    serve(int(sys.argv[1]))
