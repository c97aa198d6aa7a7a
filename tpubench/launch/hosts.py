"""A run over several hosts: each host's worker is its host's agent, as torchrun's is.

Every host runs the run's worker (started by ``tpubench run`` under the user's launcher, or
by a Ray actor); with ``--hosts`` above one, that worker first meets the others at a
c10d ``TCPStore`` on host 0 (``--master``, :mod:`tpubench.parallel.hosts`), the rendezvous
torchrun's c10d backend uses, then starts its own host's ranks (:mod:`.ranks`) or, for
torch_xla, measures its host's share of the SPMD mesh itself. The ranks use the same store
for their process group (``TORCHELASTIC_USE_AGENT_STORE``: the agent on host 0 hosts it, as
torchrun's agent does), so one port on host 0 serves the whole run.

The store carries, under ``tpubench/``:

- ``join/K``: host K joined (its name and address, and what it runs). Host 0 waits for
  every host, each at most the join timeout (:func:`join_timeout`): a host that never comes
  fails the run with "host K did not join"; a host that runs another benchmark fails it too.
- ``joined/K``: how many processes joined as host K (an atomic count). A second one (two
  processes given one ``--node-rank``) leaves at once and ends the run, whose row names the
  index given twice; once their ranks met, gloo only said "Connection reset by peer".
- ``start``: host 0's answer (its run id, every host's address), or why the run stops.
- ``result/K``: host K's outcome: its ranks' results, or its failure (the rank that died or
  raised first, when, and its output's tail). Host 0 merges them into the job's row.
- ``end``: the job is over. Each agent watches it from a thread; a host whose ranks fail
  sets it, and every other host kills its own ranks at once, instead of waiting in a
  collective for its timeout. A host whose rendezvous connection breaks (host 0 died)
  stops the same way.
- ``status``: the row's status as host 0 wrote it: the other hosts end their run with it.

Nothing is retried: a host that fails fails the run, and the row names it (``failed_host``).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from tpubench.parallel.hosts import parse_master
from tpubench.spec import RunSpec

#: without --join-timeout, the hosts wait for each other this share of the run's timeout
JOIN_SHARE = 0.5
#: once a host has failed, how long host 0 waits for the others' reports before it calls a
#: silent host dead
SETTLE_S = 15.0
#: how long host 0 keeps its store up for the other hosts to read the row's status
BYE_S = 10.0
#: the spec fields that differ from host to host: the rest must match for the hosts to run together
HOST_FIELDS = ("node_rank", "master", "run_id", "trace_dir", "compile_cache", "join_timeout_s")
PREFIX = "tpubench/"
#: a wait for host 0 that ended this much before its timeout ended because the store went away
WAIT_SLACK_S = 1.0


class HostFailure(Exception):
    """The run cannot go on: ``row`` is what its row says (status, error, failed_host)."""

    def __init__(self, status: str, error: str, failed_host: int | None, *, from_host0: bool = False):
        super().__init__(error)
        self.row = {"status": status, "error": error, "failed_host": failed_host}
        self.from_host0 = from_host0  # host 0 said so (another host then ends as host 0's row says)

    def result(self, spec: RunSpec) -> dict[str, Any]:
        """The run's result on this host: host 0's row, or another host's word on it."""
        if spec.node_rank == 0:
            return self.row
        return {**self.row, "host_row": 0, "node_rank": spec.node_rank, "host0_answered": self.from_host0}


def join_timeout(spec: RunSpec) -> float:
    """How long the hosts wait for each other: ``--join-timeout``, else half the run's timeout."""
    return spec.join_timeout_s if spec.join_timeout_s is not None else spec.timeout_s * JOIN_SHARE


def identity(spec: RunSpec) -> dict[str, Any]:
    """What every host of the run must agree on: the spec without its host-specific fields."""
    return {key: value for key, value in spec.to_json().items() if key not in HOST_FIELDS}


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def route_address(host: str, port: int) -> str:
    """This machine's address on the way to ``host`` (a UDP socket's connect sends nothing)."""
    if is_loopback(host):
        return host
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((host, port))
            return probe.getsockname()[0]
    except OSError:
        return socket.gethostname()


def first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


@dataclass
class HostGroup:
    """One host's side of a multi-host run's rendezvous (host 0 also hosts the store)."""

    spec: RunSpec
    store: Any = None
    run_id: str = ""
    addresses: list[str] = field(default_factory=list)
    _watcher: threading.Thread | None = None
    _signal: tuple[int, int] | None = None

    @property
    def rank(self) -> int:
        return self.spec.node_rank

    @property
    def hosts(self) -> int:
        return self.spec.hosts

    @property
    def master(self) -> tuple[str, int]:
        assert self.spec.master, "a multi-host run's spec names host 0 (tpubench.parallel.hosts.place)"
        return parse_master(self.spec.master)

    def _client(self, timeout: timedelta) -> Any:
        from torch.distributed import TCPStore

        host, port = self.master
        return TCPStore(host, port, is_master=False, timeout=timeout)

    def _connect(self, timeout: float) -> Any:
        """The rendezvous store: host 0 listens (on the loopback address itself when that is
        what the hosts were told, else on every interface, as torchrun's store does); the
        other hosts connect, for at most ``timeout`` seconds."""
        from torch.distributed import TCPStore

        host, port = self.master
        wait = timedelta(seconds=timeout)
        if self.rank != 0:
            return self._join_store(timeout)
        fd = None
        try:
            if is_loopback(host):
                listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
                try:
                    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    listener.bind((host, port))
                except OSError:
                    listener.close()
                    raise
                fd = listener.detach()  # the store's server owns it from here, and closes it
            return TCPStore(host, port, is_master=True, wait_for_workers=False, timeout=wait, master_listen_fd=fd)
        except (RuntimeError, OSError) as error:
            reason = f"host 0 cannot listen at {self.spec.master}: {first_line(error)}"
            raise HostFailure("failed", reason, 0) from error

    def _join_store(self, timeout: float) -> Any:
        """Another host: a connection to host 0's store of this run. Host 0 keeps a finished
        run's store up while its hosts read the row's status (:meth:`announce`), at the same
        address: a host that comes to the next run of the invocation that early waits for that
        store to go (its ``closing`` mark says it is done), then connects again."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                store = self._client(timedelta(seconds=max(deadline - time.monotonic(), 0.001)))
            except RuntimeError as error:
                raise HostFailure(
                    "failed",
                    f"host 0 at {self.spec.master} did not answer within {timeout:g} s (is it running the same "
                    f"command, and is its port reachable from here?): {first_line(error)}",
                    0,
                ) from error
            if not store.check([self.key("closing")]):
                return store
            with contextlib.suppress(RuntimeError):  # returns when the store goes away
                store.wait([self.key("gone")], timedelta(seconds=max(deadline - time.monotonic(), 0.001)))
            del store

    def key(self, name: str) -> str:
        return PREFIX + name

    def wait(self, name: str, timeout: float) -> bool:
        """Whether ``name`` was set within ``timeout`` seconds (False: not, or the store went away)."""
        try:
            self.store.wait([self.key(name)], timedelta(seconds=max(timeout, 0.001)))
            return True
        except RuntimeError:
            return False

    def get(self, name: str) -> Any:
        return json.loads(self.store.get(self.key(name)))

    def set(self, name: str, value: Any) -> None:
        self.store.set(self.key(name), json.dumps(value))

    # --- the rendezvous ------------------------------------------------------------------

    def join(self) -> None:
        """Meet the other hosts; a HostFailure if one does not come in time, runs something
        else, or host 0 cannot be reached. Starts the watcher of ``end``."""
        timeout = join_timeout(self.spec)
        started = time.monotonic()
        self.store = self._connect(timeout)
        if self.rank != 0 and self.store.add(self.key(f"joined/{self.rank}"), 1) > 1:
            reason = twice(self.rank, self.hosts)
            with contextlib.suppress(RuntimeError):  # the run ends: host 0's row names this index
                self.set("end", {"host": self.rank, "error": reason})
            raise HostFailure("failed", reason, self.rank)
        host, port = self.master
        mine = {"host": socket.gethostname(), "address": host if self.rank == 0 else route_address(host, port)}
        self.set(f"join/{self.rank}", {**mine, "spec": identity(self.spec)})
        if self.rank == 0:
            self._gather_joins(started + timeout, timeout)
        else:
            if not self.wait("start", started + timeout - time.monotonic()):
                raise HostFailure("failed", silence(time.monotonic() - started, timeout, "did not start the run"), 0)
            try:
                start = self.get("start")
                if "error" in start:
                    self.set(f"bye/{self.rank}", True)
            except RuntimeError as error:
                raise HostFailure("failed", f"host 0 stopped answering: {first_line(error)}", 0) from error
            if "error" in start:
                raise HostFailure("failed", start["error"], start.get("failed_host"), from_host0=True)
            self.run_id, self.addresses = start["run_id"], start["addresses"]
        self._watch()

    def _gather_joins(self, deadline: float, timeout: float) -> None:
        for other in range(1, self.hosts):
            if not self.wait(f"join/{other}", deadline - time.monotonic()):
                missing = [k for k in range(1, self.hosts) if not self.store.check([self.key(f"join/{k}")])]
                late = ", ".join(f"host {k}" for k in missing)
                reason = f"{late} did not join within {timeout:g} s"
                self.stop_start(reason, missing[0])
        if doubled := self.joined_twice():
            self.stop_start(twice(doubled[0], self.hosts), doubled[0])
        joined = [self.get(f"join/{k}") for k in range(self.hosts)]
        for other, seen in enumerate(joined):
            if seen["spec"] != joined[0]["spec"]:
                differ = sorted(k for k in seen["spec"] if seen["spec"].get(k) != joined[0]["spec"].get(k))
                what = ", ".join(differ)
                self.stop_start(f"host {other} runs another benchmark than host 0 (it differs in {what})", other)
        self.run_id, self.addresses = self.spec.run_id, [seen["address"] for seen in joined]
        self.set("start", {"run_id": self.run_id, "addresses": self.addresses})

    def joined_twice(self) -> list[int]:
        """The host indexes that more than one process joined as."""
        return [k for k in range(1, self.hosts) if self.store.add(self.key(f"joined/{k}"), 0) > 1]

    def stop_start(self, reason: str, host: int) -> None:
        """Host 0: tell the hosts that joined that the run stops, and why; then fail it."""
        self.set("start", {"error": reason, "failed_host": host})
        deadline = time.monotonic() + BYE_S  # the hosts that joined read why before the store goes
        for other in range(1, self.hosts):
            if self.store.check([self.key(f"join/{other}")]):
                self.wait(f"bye/{other}", deadline - time.monotonic())
        raise HostFailure("failed", reason, host)

    def _watch(self) -> None:
        """A thread that waits for ``end`` on a connection of its own, and then makes
        :attr:`end_fd` readable (also when the store goes away: host 0 died)."""
        self._signal = os.pipe()
        watcher = self._client(timedelta(seconds=join_timeout(self.spec)))
        watcher.set_timeout(timedelta(days=7))  # as long as the run takes: the runner's timeout bounds it

        def watch() -> None:
            with contextlib.suppress(RuntimeError):
                watcher.wait([self.key("end")])
            assert self._signal is not None
            os.write(self._signal[1], b"x")

        self._watcher = threading.Thread(target=watch, name="tpubench-hosts-end", daemon=True)
        self._watcher.start()

    @property
    def end_fd(self) -> int | None:
        """Readable once the job is over (a host failed, or host 0 went away)."""
        return self._signal[0] if self._signal else None

    def ended_by(self) -> dict[str, Any]:
        """Why the job ended, for a host whose watcher woke it: the failed host's word, or
        that host 0's store went away."""
        try:
            return self.get("end")
        except RuntimeError as error:
            return {"host": 0, "error": f"host 0 stopped answering: {first_line(error)}"}

    # --- the outcome -----------------------------------------------------------------------

    def report(self, outcome: dict[str, Any]) -> None:
        """This host's outcome for host 0; a failure ends the job on every host."""
        failed = outcome.get("status") != "ok"
        with contextlib.suppress(RuntimeError):  # host 0 gone: the row is not ours to write
            self.set(f"result/{self.rank}", outcome)
            if failed and not outcome.get("aborted"):
                self.set("end", {"host": self.rank, "error": outcome.get("error")})

    def gather(self, own: dict[str, Any], collective_timeout: float) -> dict[int, dict[str, Any] | None]:
        """Host 0: every host's outcome (None: it sent none in time). The others report as
        their ranks finish, which the collectives keep together; once some host failed,
        the rest have :data:`SETTLE_S` to say how they ended."""
        outcomes: dict[int, dict[str, Any] | None] = {0: own}
        failed = own.get("status") != "ok"
        deadline = time.monotonic() + (SETTLE_S if failed else collective_timeout)
        for other in range(1, self.hosts):
            outcome = self.get(f"result/{other}") if self.wait(f"result/{other}", deadline - time.monotonic()) else None
            outcomes[other] = outcome
            if not failed and (outcome is None or outcome.get("status") != "ok"):
                failed, deadline = True, min(deadline, time.monotonic() + SETTLE_S)
        return outcomes

    def announce(self, row: dict[str, Any]) -> None:
        """Host 0: the row's status for the other hosts; the job is over (the watchers
        wake); then the store stays up until they have read it, :data:`BYE_S` at most."""
        keep = ("status", "error", "failed_host", "failed_rank")
        self.set("closing", True)  # before the status: a host that has read it may come back for the next run
        self.set("status", {key: row.get(key) for key in keep})
        if not self.store.check([self.key("end")]):
            self.set("end", {"host": None})
        deadline = time.monotonic() + BYE_S
        for other in range(1, self.hosts):
            self.wait(f"bye/{other}", deadline - time.monotonic())

    def follow_host0(self, timeout: float) -> dict[str, Any]:
        """Another host: the status host 0 gave the row, as this host's result; where it gave
        none, how long this host waited for it (:func:`silence`)."""
        answered = False
        started = time.monotonic()
        if self.wait("status", timeout):
            try:
                status, answered = self.get("status"), True
                self.set(f"bye/{self.rank}", True)
            except RuntimeError as error:
                status = {"status": "failed", "error": f"host 0 stopped answering: {first_line(error)}"}
        else:
            error = silence(time.monotonic() - started, timeout, "gave no status for the run")
            status = {"status": "failed", "error": error}
        return {**status, "host_row": 0, "node_rank": self.rank, "host0_answered": answered}

    def close(self) -> None:
        """Leave: the watcher woken (by ``end``, or by the store going away), its signal closed."""
        if self._watcher is not None:
            if self.rank == 0 and self.store is not None:
                with contextlib.suppress(RuntimeError):
                    if not self.store.check([self.key("end")]):
                        self.set("end", {"host": None})
            self._watcher.join(timeout=5)
        self.store = None  # host 0: its server goes with its last reference
        if self._signal:
            for fd in self._signal:
                os.close(fd)
            self._signal = None


def silence(waited: float, timeout: float, what: str) -> str:
    """Why a wait of at most ``timeout`` seconds for host 0 got no answer after ``waited``: it
    ran out, or host 0's store went away first, and then the error says how long this host
    actually waited (it once said "within 315 s" after under 50)."""
    if waited >= timeout - WAIT_SLACK_S:
        return f"host 0 {what} within {timeout:g} s"
    return f"host 0 stopped answering after {waited:.0f} s and {what}"


def twice(host: int, hosts: int) -> str:
    """Why a run stops whose host index ``host`` two processes were given."""
    return (
        f"two processes joined as host {host}: each host needs its own index, 0 to {hosts - 1} (--node-rank, or "
        "the launcher's variable)"
    )


def print_tail(host: int, rank: int | None, tail: str) -> None:
    """Another host's failed rank's output, into host 0's worker log (the row's stderr tail)."""
    if tail:
        who = f"host {host}, rank {rank}" if rank is not None else f"host {host}"
        print(f"--- {who}'s output ---\n{tail}", file=sys.stderr, flush=True)


def culprit(outcomes: dict[int, dict[str, Any] | None]) -> dict[str, Any]:
    """The failed row of a multi-host run: the host whose rank died (a dead rank's peers
    raise, they do not die), else a host that sent nothing (its agent died with it), else the
    host whose rank raised first (the wall clock it failed at), not counting hosts that only
    stopped because another failed."""
    died = [(k, o) for k, o in outcomes.items() if o is not None and o.get("status") == "crashed"]
    silent = [k for k, o in outcomes.items() if o is None]
    raised = sorted(
        ((k, o) for k, o in outcomes.items() if o is not None and o.get("status") != "ok" and not o.get("aborted")),
        key=lambda item: item[1].get("at", 0.0),
    )
    if died:
        host, outcome = died[0]
    elif silent:
        host = silent[0]
        return {"status": "crashed", "error": f"host {host} stopped answering: it sent no result", "failed_host": host}
    elif raised:
        host, outcome = raised[0]
    else:  # every host stopped for another's failure, which none reported: host 0's own word
        host, outcome = next((k, o) for k, o in outcomes.items() if o is not None and o.get("status") != "ok")
    row = {k: v for k, v in outcome.items() if k not in ("at", "tail", "aborted", "ranks")}
    if row.get("status") in ("skipped", "unavailable"):  # said alike by every host: not a host's fault
        return row
    print_tail(host, row.get("failed_rank"), outcome.get("tail") or "")
    error = row.get("error") or ""
    return {**row, "error": error if error.startswith("host ") else f"host {host}: {error}", "failed_host": host}
