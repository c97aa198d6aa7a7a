"""``--on ray``: one Ray task per run, each on a node with the accelerator its backend needs.

Ray already schedules work onto TPU chips and GPUs, so tpubench does not grow a scheduler
of its own. Each run spec becomes a task that asks for its device (``resources={"TPU": 1}``
for TorchTPU and XLA-on-TPU backends, ``num_gpus=1`` for CUDA, one CPU otherwise); on the
node Ray picks, the task probes its interpreter and measures through the same
:class:`~tpubench.runner.Executor` as a local run: the same isolated worker process, timeout,
crash classification, device lock and ``--python`` mapping. Ray sets ``TPU_VISIBLE_CHIPS``
or ``CUDA_VISIBLE_DEVICES`` for the task, which pins the worker (and names its lock).

Rows come back to the driver, which writes the invocation's files as a local run does;
the workers' phase events (build, compile, warm-up, measure) come back live on each task's
own return stream (a streaming generator task), so the progress display follows the runs
as it does locally. Tasks are never retried (``max_retries=0``): a retried measurement
would mix with a first try. A backend that no node can serve gives ``unavailable`` rows at
once instead of tasks that wait for ever, and so do queued runs that only a node that has
since died could serve; a task whose node dies gives a ``crashed`` row.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

from tpubench import devicelock
from tpubench.backends import get_backend
from tpubench.process import worker_env
from tpubench.runner import (
    Executor,
    SuiteRunner,
    facts_for,
    lock_name,
    probe,
    python_for,
    row_for,
    wait_reporter,
)
from tpubench.spec import RunSpec

#: what a task of each device kind asks Ray for, besides one CPU
DEVICE_RESOURCES: dict[str, dict[str, Any]] = {
    "cpu": {},
    "cuda": {"num_gpus": 1},
    "tpu": {"resources": {"TPU": 1}},
}
#: Ray's name for each requirement in a node's resources
RESOURCE_NAMES = {"num_gpus": "GPU"}


def _import_ray() -> Any:
    try:
        import ray
    except ImportError as error:
        raise RuntimeError("--on ray needs Ray: pip install -e '.[ray]'") from error
    return ray


def connect(address: str | None) -> Any:
    """Join the cluster at ``address`` (default ``RAY_ADDRESS``, else ``auto``); returns ``ray``."""
    ray = _import_ray()
    if not ray.is_initialized():
        ray.init(address=address or os.environ.get("RAY_ADDRESS") or "auto", log_to_driver=False)
    return ray


def requirements(backend: str) -> dict[str, Any]:
    """The Ray task options for a run of ``backend``."""
    return {"num_cpus": 1, **DEVICE_RESOURCES[get_backend(backend).device_kind]}


def node_resources(ray: Any) -> list[dict[str, float]]:
    """Each alive node's total resources."""
    return [node["Resources"] for node in ray.nodes() if node.get("Alive")]


def servable(options: dict[str, Any], nodes: list[dict[str, float]]) -> bool:
    """Whether some node alone offers everything ``options`` asks for."""
    wanted = {"CPU": options.get("num_cpus", 0)}
    for key, value in options.items():
        if key in RESOURCE_NAMES:
            wanted[RESOURCE_NAMES[key]] = value
    wanted |= options.get("resources", {})
    return any(all(node.get(name, 0) >= amount for name, amount in wanted.items()) for node in nodes)


#: the Ray worker process's probes, by (interpreter, backend): a node's answer does not change
_PROBES: dict[tuple[str, str], dict[str, Any]] = {}


#: a task forwards a run's step-by-step progress at most this often (phase changes always)
EVENT_INTERVAL_S = 0.25
#: how often the driver looks up, between items of the tasks' streams, whether the nodes changed
POLL_S = 0.25


def thinned(emit: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    """The worker's event callback inside a task: phase changes always, step updates a few
    times a second (the display needs no more, and every event crosses the network)."""
    last: dict[str, Any] = {"phase": None, "at": 0.0}

    def forward(event: dict[str, Any]) -> None:
        now = time.monotonic()
        if event.get("phase") == last["phase"] and now - last["at"] < EVENT_INTERVAL_S:
            return
        last.update(phase=event.get("phase"), at=now)
        emit(event)

    return forward


def run_on_node(spec_json: dict[str, Any], results: str, pythons: dict[str, str]) -> Iterator[dict[str, Any]]:
    """The Ray task, a streaming generator: ``{"event": ...}`` items while the run goes, then one
    ``{"answer": ...}``. Events ride on the task's own return stream, so no extra process (a
    queue actor cost about 3 s per invocation here) carries them. The measurement runs in a
    thread so that this generator can hand its events over while it runs."""
    events: queue.Queue[dict[str, Any] | None] = queue.Queue()
    outcome: dict[str, Any] = {}

    def measure() -> None:
        try:
            outcome["answer"] = _measure(spec_json, results, pythons, thinned(events.put))
        except BaseException as error:  # re-raised below, in the task's own thread
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


def _measure(
    spec_json: dict[str, Any], results: str, pythons: dict[str, str], forward: Callable[[dict[str, Any]], None]
) -> dict[str, Any]:
    """Probe this node's interpreter for the backend, then measure like a local run.

    The device lock is held from before the probe: a probe boots the task's fork server
    (an import of torch), which on a host where another task is measuring would take the
    CPU from that measurement.
    """
    import ray

    spec = RunSpec.from_json(spec_json)
    backend = get_backend(spec.backend)
    lock = lock_name(backend.device_kind, worker_env(backend.worker_env))  # the one Executor.run takes
    with devicelock.hold(lock, wait_reporter(forward)) as waited:
        key = (python_for(pythons, spec.backend), spec.backend)
        if key not in _PROBES:
            _PROBES[key] = probe(key[0], [spec.backend])
        probed = _PROBES[key]
        result = Executor(results, pythons).run(spec, probed["backends"][spec.backend], forward)
    if "device_wait_s" in result:  # measured: the wait for the device came before the probe
        result["device_wait_s"] = waited
    result["ray_node_id"] = ray.get_runtime_context().get_node_id()
    return {"result": result, "fact": facts_for(probed, spec.backend)}


def probe_node(backends: list[str], pythons: dict[str, str]) -> dict[str, Any]:
    """The probe task: what this node can run, as ``tpubench env`` shows it."""
    import socket

    import ray

    runner = SuiteRunner(results_dir=".", pythons=pythons)
    return {
        "host": socket.gethostname(),
        "ray_node_id": ray.get_runtime_context().get_node_id(),
        "probes": runner.probe_all(backends),
    }


def node_kind(resources: dict[str, float]) -> str:
    """A node's kind, from what it offers: ``CPU 8, TPU 4`` (memory and node ids left out)."""
    skip = ("memory", "object_store_memory")
    kept = {k: v for k, v in resources.items() if k not in skip and not k.startswith(("node:", "accelerator_type"))}
    return ", ".join(f"{name} {value:g}" for name, value in sorted(kept.items()))


def probe_fleet(backends: list[str], pythons: dict[str, str], address: str | None = None) -> list[dict[str, Any]]:
    """One probe per node kind, on a node of that kind: which backends the fleet can run."""
    ray = connect(address)
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    task = ray.remote(max_retries=0)(probe_node)
    kinds: dict[str, list[dict[str, Any]]] = {}
    for node in ray.nodes():
        if node.get("Alive"):
            kinds.setdefault(node_kind(node["Resources"]), []).append(node)
    refs = {
        kind: task.options(
            num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(members[0]["NodeID"], soft=False)
        ).remote(backends, pythons)
        for kind, members in kinds.items()
    }
    return [
        {"kind": kind, "nodes": [m["NodeManagerAddress"] for m in kinds[kind]], **ray.get(ref)}
        for kind, ref in refs.items()
    ]


def _lost(spec: RunSpec, error: BaseException) -> dict[str, Any]:
    """Row fields for a task that produced nothing: its node died, or Ray gave up on it."""
    now = datetime.now(UTC)
    return {
        "status": "crashed",
        "error": f"Ray task lost: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}",
        "started_at": now,
        "finished_at": now,
    }


def _unservable(spec: RunSpec, options: dict[str, Any], since: str = "") -> dict[str, Any]:
    now = datetime.now(UTC)
    asked = {k: v for k, v in options.items() if k != "num_cpus"} or {"num_cpus": options["num_cpus"]}
    return {
        "status": "unavailable",
        "error": f"no node in the Ray cluster offers what {spec.backend} needs ({asked}){since}",
        "started_at": now,
        "finished_at": now,
    }


def run(runner: SuiteRunner, specs: Sequence[RunSpec], address: str | None = None) -> list[dict[str, Any]]:
    """Run ``specs`` as Ray tasks and write each row as it arrives; returns the rows.

    The fingerprint of each row is the one its node's probe gave, so rows of one invocation
    may come from different hosts (the ``host`` and ``ray_node_id`` columns say which).
    """
    ray = connect(address)
    task = ray.remote(max_retries=0, retry_exceptions=False, num_returns="streaming")(run_on_node)
    nodes = node_resources(ray)
    pending: dict[Any, RunSpec] = {}  # each run's stream of events and answer
    rows: list[dict[str, Any]] = []
    ready: list[tuple[RunSpec, dict[str, Any], dict[str, Any] | None]] = []
    for index, spec in enumerate(specs):
        options = requirements(spec.backend)
        runner.observer.on_start(index, len(specs), spec)
        if not servable(options, nodes):
            ready.append((spec, _unservable(spec, options), None))
            continue
        pending[task.options(**options).remote(spec.to_json(), str(runner.results_dir), runner.pythons)] = spec

    def write_ready() -> None:
        while ready:
            spec, result, fact = ready.pop(0)
            if fact is None:  # decided in the driver: the driver's own facts describe the row
                fact = facts_for(runner.probe_all([spec.backend])[spec.backend], spec.backend)
            row, steps, ops = row_for(spec, runner.invocation_id, runner.tags, fact, result)
            runner.write(row, steps, ops)
            rows.append(row)
            runner.observer.on_finish(spec, row)

    def take(stream: Any) -> None:
        """The next item of a stream ``ray.wait`` found ready: an event, the answer, or the error."""
        spec = pending[stream]
        try:
            item = ray.get(next(stream))
        except StopIteration:
            item = {"error": RuntimeError("the task ended without a result")}
        except ray.exceptions.RayError as error:
            item = {"error": error}
        if "event" in item:
            runner.observer.on_event(spec, item["event"])
            return
        del pending[stream]
        if "error" in item:
            ready.append((spec, _lost(spec, item["error"]), None))
        else:
            ready.append((spec, item["answer"]["result"], item["answer"]["fact"]))

    try:
        while ready or pending:
            write_ready()
            if not pending:
                break
            done, _ = ray.wait(list(pending), num_returns=1, timeout=POLL_S)
            if done:
                take(done[0])
                continue
            current = node_resources(ray)
            if current != nodes:
                ready += _stranded(ray, pending, current)
                nodes = current
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: keep what finished, cancel the rest
        runner.interrupted = True
        for stream in list(pending):
            while stream in pending and ray.wait([stream], timeout=0)[0]:
                take(stream)
        for stream in pending:
            ray.cancel(stream, force=True)
        write_ready()
    return rows


def _stranded(ray: Any, pending: dict[Any, RunSpec], nodes: list[dict[str, float]]) -> list[tuple]:
    """Runs that none of ``nodes`` (the alive ones) can serve any more, since the nodes that could
    have died: cancelled, with ``unavailable`` rows, instead of tasks Ray would wait on for ever."""
    stranded = []
    for ref, spec in list(pending.items()):
        options = requirements(spec.backend)
        if not servable(options, nodes):
            ray.cancel(ref, force=True)
            del pending[ref]
            stranded.append((spec, _unservable(spec, options, " any more: the nodes that did have died"), None))
    return stranded
