"""Start a serving engine, wait until it is ready, and stop it with nothing left behind.

An engine is a server process tpubench does not control from inside (vLLM, SGLang,
``transformers serve``), so it is handled from outside, the way :mod:`.process` handles a
worker: it runs in a process group of its own with its output in a kept log file; readiness
is its ready path answering 200, polled while the process is watched, so an engine that
dies while loading is an error at once, with its log's tail, not a wait for the timeout.
The time from spawn to ready is the cold start (engine start, weight load, compile).
Stopping sends SIGTERM to the whole group and to every descendant seen (a child that made a
session of its own included), then SIGKILL to whatever is left after a grace period; the
context manager stops it on every exit path, Ctrl-C and exceptions included. Where the
kernel allows, the engine also gets SIGTERM when the process that started it dies.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from tpubench.backends.cpu import cpu_model
from tpubench.backends.tpu import tpu_pci_devices
from tpubench.serving.engines.base import HOST, Engine, flag_value

LOG_TAIL_LINES = 40
#: seconds between two readiness polls; the engine's exit is seen within this too
POLL_S = 0.1
#: how long an engine has to exit after SIGTERM before the rest of its group is killed
STOP_GRACE_S = 15.0
#: how long :meth:`RunningEngine.alive` waits for a running engine's exit to show
ALIVE_GRACE_S = 1.0
#: how long one readiness or version request may take
REQUEST_TIMEOUT_S = 2.0
PR_SET_PDEATHSIG = 1


class EngineError(RuntimeError):
    """The engine did not become ready: it exited, or its readiness timeout passed."""

    def __init__(self, message: str, log_tail: str):
        super().__init__(message)
        self.log_tail = log_tail


def free_port() -> int:
    """A TCP port on 127.0.0.1 free now (the engine binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((HOST, 0))
        return probe.getsockname()[1]


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` of a log file (its last 64 KiB read), "" where there is none."""
    try:
        with open(path, "rb") as stream:
            stream.seek(0, os.SEEK_END)
            stream.seek(max(0, stream.tell() - 64 * 1024))
            text = stream.read().decode(errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def _die_with_parent() -> None:
    """In the engine, before exec: SIGTERM when the process that started it dies (Linux), so
    that a SIGKILLed tpubench does not leave a server holding a GPU."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _get(url: str) -> tuple[int, bytes] | None:
    """One GET: its status and body; None where nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=REQUEST_TIMEOUT_S) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, b""
    except (OSError, ValueError):  # refused, reset, timed out, or a half-started server's garbage
        return None


@dataclass
class RunningEngine:
    """A started engine: where it listens, how long it took to be ready, and how to stop it."""

    engine: Engine
    model: str
    engine_args: list[str]
    port: int
    log_path: Path
    process: subprocess.Popen
    spawned_at: float  # time.perf_counter() at spawn
    cold_start_s: float | None = None
    version: str | None = None
    device: str | None = None
    host: str = field(default_factory=socket.gethostname)

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def url(self) -> str:
        """The OpenAI-compatible API's root, as ``--url`` takes it."""
        return f"{self.base_url}/v1"

    @property
    def honoured(self) -> dict[str, bool]:
        return dict(self.engine.honours)

    def alive(self) -> bool:
        """Whether the engine still runs. Asked after a connection broke, which an engine that
        crashed breaks a moment before its exit is seen: a running one gets
        :data:`ALIVE_GRACE_S` to show its exit."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(ALIVE_GRACE_S)
        return self.process.returncode is None

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        return log_tail(self.log_path, lines)

    def wait_ready(self, timeout_s: float) -> float:
        """Poll the ready path until it answers 200; returns the cold start (spawn to ready).

        Raises :class:`EngineError` when the engine exits first or ``timeout_s`` (from spawn)
        passes; the caller stops it."""
        ready_url = self.base_url + self.engine.ready_path
        deadline = self.spawned_at + timeout_s
        while True:
            answer = _get(ready_url)
            if answer is not None and answer[0] == 200:
                if self.process.poll() is not None:  # another server on the port answered: ours is gone
                    break
                self.cold_start_s = time.perf_counter() - self.spawned_at
                return self.cold_start_s
            left = deadline - time.perf_counter()
            if left <= 0:
                raise EngineError(
                    f"engine {self.engine.name} was not ready within {timeout_s:g} s "
                    f"({ready_url} did not answer 200; log: {self.log_path})",
                    self.log_tail(),
                )
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(min(POLL_S, left))  # returns at once if it exits
            if self.process.poll() is not None:
                break
        raise EngineError(
            f"engine {self.engine.name} exited with code {self.process.returncode} before it was ready "
            f"(log: {self.log_path})",
            self.log_tail(),
        )

    def read_version(self) -> str | None:
        """The engine's version, from the first of its version paths that gives one (else its
        installed package's), with its platform plugin's."""
        served = None
        for path in self.engine.version_paths:
            answer = _get(self.base_url + path)
            if answer is not None and answer[0] == 200:
                with contextlib.suppress(ValueError, AttributeError):
                    served = json.loads(answer[1]).get("version")
            if served:
                break
        return self.engine.version(str(served) if served else None)

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM to the group and every descendant, SIGKILL to what is left after ``grace_s``;
        returns once none of them is running. Safe to call twice."""
        if self.process.returncode is not None and not _group_alive(self.process.pid):
            return
        try:
            family = [psutil.Process(self.process.pid), *psutil.Process(self.process.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            family = []
        _signal_all(self.process.pid, family, signal.SIGTERM)
        deadline = time.perf_counter() + grace_s
        while time.perf_counter() < deadline and (_running(family) or _group_alive(self.process.pid)):
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(POLL_S)
        _signal_all(self.process.pid, _running(family), signal.SIGKILL)
        self.process.wait()
        psutil.wait_procs(_running(family), timeout=grace_s)

    def __enter__(self) -> RunningEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _running(processes: Sequence[psutil.Process]) -> list[psutil.Process]:
    """Those still running (a zombie has stopped; its parent reaps it)."""
    alive = []
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                alive.append(process)
    return alive


def _group_alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` other than a zombie is left."""
    for process in psutil.process_iter(["status"]):
        with contextlib.suppress(psutil.NoSuchProcess, ProcessLookupError, PermissionError):
            if os.getpgid(process.pid) == pgid and process.info["status"] != psutil.STATUS_ZOMBIE:
                return True
    return False


def _signal_all(pgid: int, processes: Sequence[psutil.Process], signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.send_signal(signum)


def start(
    engine: Engine,
    model: str,
    engine_args: Sequence[str],
    log_path: Path,
    ready_timeout_s: float,
    *,
    port: int | None = None,
    env: Mapping[str, str] | None = None,
) -> RunningEngine:
    """Start ``engine`` serving ``model`` and return it once ready (a context manager that stops it).

    The log at ``log_path`` is appended to and kept. Raises :class:`EngineError` (the engine
    already stopped) when it exits before it is ready or ``ready_timeout_s`` passes; on
    Ctrl-C or any other exception while waiting it is stopped too.
    """
    port = port or free_port()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    environment = {**(os.environ if env is None else env), **engine.env}
    device = local_chip(engine, engine_args, environment)
    with open(log_path, "ab") as log:
        log.write(f"$ {' '.join(engine.argv(model, port, engine_args))}\n".encode())
        log.flush()
        spawned_at = time.perf_counter()
        process = subprocess.Popen(
            engine.argv(model, port, engine_args),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=environment,
            start_new_session=True,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )
    running = RunningEngine(engine, model, list(engine_args), port, log_path, process, spawned_at, device=device)
    try:
        running.wait_ready(ready_timeout_s)
        running.version = running.read_version()
    except BaseException:
        running.stop()
        raise
    return running


def local_chip(engine: Engine, engine_args: Sequence[str], env: Mapping[str, str]) -> str | None:
    """The chip the engine will serve on, read from this host without touching the device: a
    TPU's generation from the PCI bus, a GPU's name from ``nvidia-smi``, else the CPU's model.
    None where the engine's kind of chip is not found here."""
    kind = engine.accelerator
    if kind == "device-flag":
        wanted = (flag_value(engine_args, ("--device",)) or "auto").lower()
        kind = "cpu" if wanted == "cpu" or (wanted == "auto" and not Path("/dev/nvidiactl").exists()) else "cuda"
    if kind == "cpu":
        return cpu_model()
    if kind == "tpu":
        found = tpu_pci_devices()
        return found[0].chip if found else None
    return _gpu_name(env)


def _gpu_name(env: Mapping[str, str]) -> str | None:
    """The first visible NVIDIA GPU's name, as ``torch.cuda.get_device_name`` gives it (both
    read the driver's name), from ``nvidia-smi``; None without one."""
    visible = env.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip() or "0"
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader", "-i", visible],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    name = done.stdout.strip().splitlines()[0].strip() if done.returncode == 0 and done.stdout.strip() else ""
    return name or None
