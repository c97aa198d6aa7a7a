"""The Ray actor of ``--on ray``: one process per device of a node, measuring its runs in turn.

Kept apart from :mod:`tpubench.launchers.ray` (the driver's side) so that an actor's
process imports nothing heavy before its constructor runs: the constructor starts the fork
server first, whose ``import torch`` is the one slow start-up of the actor (the actor itself
never imports torch: the runner and the backends' declarations do not need it).
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tpubench.launch.process import worker_env
from tpubench.launch.zygote import zygote_for
from tpubench.parallel import host_devices
from tpubench.spec import RunSpec

#: an actor forwards a run's step-by-step progress at most this often (phase changes always)
EVENT_INTERVAL_S = 0.25


def thinned(emit: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    """The worker's event callback inside an actor: phase changes always, step updates a few
    times a second (the display needs no more, and every event crosses the network)."""
    last: dict[str, Any] = {"phase": None, "at": 0.0}

    def forward(event: dict[str, Any]) -> None:
        now = time.monotonic()
        if event.get("phase") == last["phase"] and now - last["at"] < EVENT_INTERVAL_S:
            return
        last.update(phase=event.get("phase"), at=now)
        emit(event)

    return forward


def launch_environment() -> dict[str, str] | None:
    """This process's environment as it was started, before Ray's worker code changed it;
    None where the kernel does not say (``/proc`` is Linux's)."""
    try:
        raw = Path("/proc/self/environ").read_bytes()
    except OSError:
        return None
    pairs = (entry.split(b"=", 1) for entry in raw.split(b"\0") if b"=" in entry)
    return {key.decode(errors="replace"): value.decode(errors="replace") for key, value in pairs}


#: the driver's settings an actor takes on, however its node was started: the plugin modules
#: (``workloads.PLUGIN_ENV``, which ``--workload-module`` sets) and the import path where
#: ``--model``'s module is found (the driver's working directory, put there by the CLI)
FORWARDED_ENV = ("TPUBENCH_WORKLOAD_MODULES", "PYTHONPATH")


def forwarded_environment() -> dict[str, str]:
    """The driver's values of :data:`FORWARDED_ENV`, for its actors."""
    return {name: os.environ[name] for name in FORWARDED_ENV if os.environ.get(name)}


def take_environment(forwarded: dict[str, str]) -> None:
    """Take on the driver's plugin modules, and put its import path ahead of this node's own."""
    for name, value in forwarded.items():
        if name == "PYTHONPATH":
            entries = [*value.split(os.pathsep), *os.environ.get(name, "").split(os.pathsep)]
            value = os.pathsep.join(dict.fromkeys(filter(None, entries)))
        os.environ[name] = value


def lift_ray_thread_cap() -> None:
    """Undo the ``OMP_NUM_THREADS`` Ray sets for an actor whose node's environment sets none.

    Ray caps an actor's intra-op threads at the CPUs it asked for (one), so that many tasks
    on a node do not oversubscribe it. A run here should measure in the environment a local
    run has, which uses every core: with Ray's cap, the CPU rows of ``--on ray`` measured a
    tiny gpt2's training step 35-40% slower than the same run locally. Only one CPU run
    measures on a host at a time (the host's device lock); accelerator runs on one node's
    chips run at once and share its cores for their host-side work, as their rows'
    ``host_other_cpu_share`` says. A value the node itself sets (``OMP_NUM_THREADS=4 ray
    start ...``) is the cluster's choice, and stays.
    """
    launched = launch_environment()
    if launched is not None and "OMP_NUM_THREADS" not in launched:
        os.environ.pop("OMP_NUM_THREADS", None)


class DeviceWorker:
    """A Ray actor that owns one device of one node, a chip, a GPU or the host's CPU, and
    measures the runs it is given there in turn, through the same :class:`Executor` as a
    local run.

    One process per device, not one per run: each process keeps its probe and its fork
    server (the one-off ``import torch`` a worker forks from) for all the runs of the
    invocation, as the local runner does. One task per run had every Ray worker process
    boot a fork server of its own, and those boots, serialised by the device lock, cost a
    tiny suite seconds on a one-node cluster. Ray still does the placement: the actor asks
    for the device's resources, Ray sets ``TPU_VISIBLE_CHIPS`` or ``CUDA_VISIBLE_DEVICES``
    for its process, and no two actors share a chip.
    """

    def __init__(
        self,
        results: str,
        pythons: dict[str, str],
        prestart: tuple[str, dict[str, str]] | None,
        forwarded: dict[str, str] | None = None,
    ):
        """``prestart``: the interpreter and worker environment of the first run this actor will
        get, whose fork server boots at once, while the driver still plans. ``forwarded``: the
        driver's :data:`FORWARDED_ENV`, which this actor's workers inherit."""
        lift_ray_thread_cap()  # before the fork server copies this environment
        take_environment(forwarded or {})
        if prestart:
            zygote_for(prestart[0], worker_env(prestart[1]))
        self.results, self.pythons = results, pythons
        self.probes: dict[tuple[str, str], dict[str, Any]] = {}  # (interpreter, backend): a node's answer is fixed

    def node_id(self) -> str:
        """Where Ray placed this actor; answering it also says the actor has started."""
        import ray

        return ray.get_runtime_context().get_node_id()

    def rendezvous_address(self) -> str:
        """``HOST:PORT`` for a run over several hosts whose host 0 this actor is: its node's
        address and a port free there now, where this actor's worker will hold the rendezvous."""
        import socket

        import ray

        from tpubench.parallel.hosts import join_address

        host = ray.util.get_node_ip_address()
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
            probe.bind((host, 0))
            return join_address(host, probe.getsockname()[1])

    def measure(self, spec_json: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """A streaming generator: ``{"event": ...}`` items while the run goes, then one
        ``{"answer": ...}``. Events ride on the call's own return stream, so no extra process
        carries them; the measurement runs in a thread so that the generator can hand its
        events over while it runs."""
        events: queue.Queue[dict[str, Any] | None] = queue.Queue()
        outcome: dict[str, Any] = {}

        def measure() -> None:
            try:
                outcome["answer"] = self._measure(RunSpec.from_json(spec_json), thinned(events.put))
            except BaseException as error:  # re-raised below, in the call's own thread
                outcome["error"] = error
            finally:
                events.put(None)

        thread = threading.Thread(target=measure, name="tpubench-measure", daemon=True)
        thread.start()
        while (event := events.get()) is not None:
            yield {"event": event}
        thread.join()
        if "error" in outcome:
            raise outcome["error"]
        yield {"answer": outcome["answer"]}

    def _measure(self, spec: RunSpec, forward: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
        """Probe this node's interpreter for the backend (once), then measure like a local run.

        The device lock is held from before the probe: a first probe may boot a fork server
        (an import of torch), which on a host where another run is measuring would take the
        CPU from that measurement.
        """
        from tpubench import devicelock
        from tpubench.backends import get_backend
        from tpubench.runner import Executor, facts_for, lock_job, lock_name, probe, python_for, wait_reporter

        backend = get_backend(spec.backend)
        # the ones Executor.run takes: every device of the run, pinned as its worker will be
        lock = lock_name(backend.device_kind, worker_env(backend.worker_env_for(spec)), host_devices(spec))
        with devicelock.hold(lock, wait_reporter(forward), lock_job(spec)) as waited:
            key = (python_for(self.pythons, spec.backend), spec.backend)
            if key not in self.probes:
                self.probes[key] = probe(key[0], [spec.backend])
            probed = self.probes[key]
            result = Executor(self.results, self.pythons).run(spec, probed["backends"][spec.backend], forward)
        if "device_wait_s" in result:  # measured: the wait for the device came before the probe
            result["device_wait_s"] = waited
        result["ray_node_id"] = self.node_id()
        return {"result": result, "fact": facts_for(probed, spec.backend)}
