"""One run per device at a time, across every tpubench process on the host.

Two suites started side by side on one machine used to share its CPU and store
contended times as ``ok``. Before a worker starts, the runner takes an exclusive
``flock`` on the device's lock file and holds it until the worker has exited; a second
invocation waits its turn (and says so), and the row records how long it waited. The
lock dies with the process that holds it, so a killed suite never leaves a device locked.

Lock files live in ``TPUBENCH_LOCK_DIR`` (default ``~/.cache/tpubench/locks``); they are
kept between runs, like any lock file, and hold the pid of the current holder (and the run over
several hosts it is a host of; emptied on release).

A process that holds a device may take its lock again (a Ray actor holds it across its probe
and its run, and the run's executor takes it too): the inner ``with`` waits for nothing.

A multi-device run holds one lock per device, taken one after another in the order given
(the runner sorts them: two runs that need the same devices then queue on the first, and
never hold one each while waiting for the other).

Hosts of one run over several hosts that share a machine (a test, or hosts simulated on one
box) share its devices: each host's runner names the run (``job``), the holder's name is in
the lock file, and a host that finds the lock held by a host of its own run goes on without
it, and says so. Waiting instead deadlocked: host 1 held the CPU's lock while it waited for
host 0 to start the run, and host 0 waited for the lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

#: the devices this process holds, and how many ``with`` blocks hold each
_HELD: dict[str, int] = {}
#: how often a host of a run over several hosts looks again at a busy lock's holder (it waits
#: by polling, not in ``flock``, to see a host of its own run take the lock meanwhile)
POLL_S = 0.2


@dataclass(frozen=True)
class Job:
    """A run over several hosts, as its hosts' locks name it: ``key`` is equal on every host
    of the run (its rendezvous and what it runs), ``host`` is this host's index."""

    key: str
    host: int


@dataclass(frozen=True)
class Holder:
    """Who holds a lock, as its lock file says: a pid, and the run over several hosts it is a
    host of (None for any other run)."""

    pid: str
    job: Job | None

    @classmethod
    def read(cls, fd: int) -> Holder:
        pid, key, host = [*os.pread(fd, 4096, 0).decode(errors="replace").splitlines(), "", "", ""][:3]
        job = Job(key, int(host)) if key and host.isdigit() else None
        return cls(pid.strip() or "?", job)

    def write(self, fd: int) -> None:
        os.ftruncate(fd, 0)
        job = f"{self.job.key}\n{self.job.host}\n" if self.job else ""
        os.pwrite(fd, f"{self.pid}\n{job}".encode(), 0)


def lock_dir() -> Path:
    return Path(os.environ.get("TPUBENCH_LOCK_DIR") or Path.home() / ".cache" / "tpubench" / "locks")


@contextlib.contextmanager
def hold(
    devices: str | Sequence[str], on_wait: Callable[[str], None] = lambda message: None, job: Job | None = None
) -> Iterator[float]:
    """Hold the lock of ``devices`` (one name, or several taken in their order) for the
    ``with`` block; yields the seconds spent waiting for them.

    ``on_wait`` hears one message per busy device, before its wait begins, and one where a
    host of ``job`` (this host's run over several hosts) holds it: this host then shares it.
    """
    names = [devices] if isinstance(devices, str) else list(devices)
    with contextlib.ExitStack() as stack:
        yield sum(stack.enter_context(_hold_one(name, on_wait, job)) for name in names)


@contextlib.contextmanager
def _hold_one(device: str, on_wait: Callable[[str], None], job: Job | None) -> Iterator[float]:
    if device in _HELD:
        _HELD[device] += 1
        try:
            yield 0.0
        finally:
            _HELD[device] -= 1
        return
    directory = lock_dir()
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory / f"{device}.lock", os.O_RDWR | os.O_CREAT, 0o666)
    try:
        started = time.perf_counter()
        locked = _take(fd, device, on_wait, job)
        waited = time.perf_counter() - started
        if locked:
            Holder(str(os.getpid()), job).write(fd)
        _HELD[device] = 1  # held, or shared with a host of this run: a nested hold waits for nothing
        try:
            yield waited
        finally:
            del _HELD[device]
            if locked:  # no stale holder left behind: a host of a run reads it to decide to share
                os.ftruncate(fd, 0)
    finally:
        os.close(fd)


def _take(fd: int, device: str, on_wait: Callable[[str], None], job: Job | None) -> bool:
    """Take the lock of ``fd``, waiting for it where it is busy (said once through ``on_wait``);
    False where a host of ``job`` holds it, which this host then shares (said too)."""
    said = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            holder = Holder.read(fd)
        if job is not None and holder.job is not None and holder.job.key == job.key:
            on_wait(
                f"sharing the {device} with host {holder.job.host} of this run (pid {holder.pid}), which holds "
                "its lock on this machine: hosts of one run on one machine share its devices"
            )
            return False
        if not said:
            on_wait(f"waiting for the {device}: another tpubench run (pid {holder.pid}) is using it")
            said = True
        if job is None:
            fcntl.flock(fd, fcntl.LOCK_EX)
            return True
        time.sleep(POLL_S)  # a host of this run may take the lock meanwhile: look at its holder again
