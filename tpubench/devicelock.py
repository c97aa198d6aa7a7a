"""One run per device at a time, across every tpubench process on the host.

Two suites started side by side on one machine used to share its CPU and store
contended times as ``ok``. Before a worker starts, the runner takes an exclusive
``flock`` on the device's lock file and holds it until the worker has exited; a second
invocation waits its turn (and says so), and the row records how long it waited. The
lock dies with the process that holds it, so a killed suite never leaves a device locked.

Lock files live in ``TPUBENCH_LOCK_DIR`` (default ``~/.cache/tpubench/locks``); they are
kept between runs, like any lock file, and hold the pid of the current holder.

A process that holds a device may take its lock again (a Ray actor holds it across its probe
and its run, and the run's executor takes it too): the inner ``with`` waits for nothing.

A multi-device run holds one lock per device, taken one after another in the order given
(the runner sorts them: two runs that need the same devices then queue on the first, and
never hold one each while waiting for the other).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

#: the devices this process holds, and how many ``with`` blocks hold each
_HELD: dict[str, int] = {}


def lock_dir() -> Path:
    return Path(os.environ.get("TPUBENCH_LOCK_DIR") or Path.home() / ".cache" / "tpubench" / "locks")


@contextlib.contextmanager
def hold(devices: str | Sequence[str], on_wait: Callable[[str], None] = lambda message: None) -> Iterator[float]:
    """Hold the lock of ``devices`` (one name, or several taken in their order) for the
    ``with`` block; yields the seconds spent waiting for them.

    ``on_wait`` hears one message per busy device, before its wait begins.
    """
    names = [devices] if isinstance(devices, str) else list(devices)
    with contextlib.ExitStack() as stack:
        yield sum(stack.enter_context(_hold_one(name, on_wait)) for name in names)


@contextlib.contextmanager
def _hold_one(device: str, on_wait: Callable[[str], None]) -> Iterator[float]:
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
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            on_wait(f"waiting for the {device}: another tpubench run (pid {holder}) is using it")
            fcntl.flock(fd, fcntl.LOCK_EX)
        waited = time.perf_counter() - started
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        _HELD[device] = 1
        try:
            yield waited
        finally:
            del _HELD[device]
    finally:
        os.close(fd)
