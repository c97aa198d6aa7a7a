"""``--on ray``: each run on a node with the accelerators its backend needs, one actor per device
(or per group of N devices for a run on N).

Ray already schedules work onto TPU chips and GPUs, so tpubench does not grow a scheduler
of its own. For each device kind a suite needs, the driver starts actors
(:class:`~tpubench.launchers.ray_actor.DeviceWorker`) that ask Ray for that device:
``resources={"TPU": 1}`` for TorchTPU and XLA-on-TPU backends, ``num_gpus=1`` for CUDA,
one CPU otherwise; one actor per chip or GPU the cluster offers, and one per host for the
CPU. A run on N devices (``--devices N``) goes to an actor that asks for N of them at once
(``{"TPU": N}``, ``num_gpus=N``), so that its ranks or its SPMD mesh live on one node's
devices that nothing else holds. Ray places them and sets ``TPU_VISIBLE_CHIPS`` or
``CUDA_VISIBLE_DEVICES`` for each, which pins its workers (and names their lock), so no two
runs share a chip. Each run is
one call on an idle actor of its kind: the actor probes its interpreter once and measures
through the same :class:`~tpubench.runner.Executor` as a local run (the same isolated
worker process, timeout, crash classification, device lock and ``--python`` mapping),
forking its workers from one fork server for the whole invocation, as a local run does.

Rows come back to the driver, which writes the invocation's files as a local run does;
the workers' phase events (build, compile, warm-up, measure) come back live on each call's
own return stream (a streaming generator), so the progress display follows the runs as it
does locally. Nothing is retried (``max_restarts=0``, ``max_task_retries=0``): a retried
measurement would mix with a first try. A backend that no node can serve gives
``unavailable`` rows at once instead of runs that wait for ever, and so do queued runs
that only a node that has since died could serve; a run whose node dies gives a
``crashed`` row.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from tpubench.backends import get_backend
from tpubench.launch.hosts import join_timeout
from tpubench.launchers.ray_actor import DeviceWorker, forwarded_environment
from tpubench.parallel import host_devices
from tpubench.runner import SuiteRunner, facts_for, python_for, row_for, unavailable
from tpubench.spec import RunSpec

#: what an actor of each device kind asks Ray for, besides one CPU
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


#: Ray's setting for how often a process reports its tasks' states to the dashboard
TASK_EVENTS_ENV = "RAY_task_events_report_interval_ms"


def connect(address: str | None) -> Any:
    """Join the cluster at ``address`` (default ``RAY_ADDRESS``, else ``auto``); returns ``ray``.

    The driver does not report its own task events (the states of the calls it makes to its
    actors) to Ray's dashboard, unless ``RAY_task_events_report_interval_ms`` says otherwise:
    leaving the cluster waits for the reporter's next flush, 0.27 s of every invocation here
    (0.03 s without it), and tpubench's own progress and rows say what each call did. The
    actors, which measure, still report theirs.
    """
    os.environ.setdefault(TASK_EVENTS_ENV, "0")  # read when the driver's core worker starts
    ray = _import_ray()
    if not ray.is_initialized():
        ray.init(address=address or os.environ.get("RAY_ADDRESS") or "auto", log_to_driver=False)
    return ray


def disconnect() -> None:
    """Leave the cluster now, once the results are in. Left to Ray's exit hook, leaving sleeps
    0.5 s first so that worker logs can finish printing, and this driver asks for none
    (``log_to_driver=False``): half a second off every invocation's exit."""
    import ray

    if ray.is_initialized():
        ray.shutdown()


def kind_requirements(kind: str, devices: int = 1) -> dict[str, Any]:
    """What an actor of device ``kind`` asks Ray for, for runs on ``devices`` devices: that
    many chips or GPUs on one node (a CPU run's simulated devices share the host's CPU)."""
    options: dict[str, Any] = {"num_cpus": 1}
    for key, value in DEVICE_RESOURCES[kind].items():
        options[key] = (
            {name: amount * devices for name, amount in value.items()} if key == "resources" else value * devices
        )
    return options


def requirements(backend: str, devices: int = 1) -> dict[str, Any]:
    """What a run of ``backend`` on ``devices`` devices needs of a node: its actor's options."""
    return kind_requirements(get_backend(backend).device_kind, devices)


def _wanted(options: dict[str, Any]) -> dict[str, float]:
    """Ray options as the resource amounts a node must offer: ``{"CPU": 1, "TPU": 1}``."""
    wanted = {"CPU": options.get("num_cpus", 0)}
    for key, value in options.items():
        if key in RESOURCE_NAMES:
            wanted[RESOURCE_NAMES[key]] = value
    return wanted | options.get("resources", {})


def servable(options: dict[str, Any], nodes: list[dict[str, float]]) -> bool:
    """Whether some node alone offers everything ``options`` asks for."""
    wanted = _wanted(options)
    return any(all(node.get(name, 0) >= amount for name, amount in wanted.items()) for node in nodes)


#: how often the driver looks up, between items of the actors' streams, whether the nodes changed
POLL_S = 0.25


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


def _lost(spec: RunSpec, error: BaseException, node_died: bool) -> dict[str, Any]:
    """Row fields for a run that produced nothing: its node died, or Ray gave up on it."""
    now = datetime.now(UTC)
    first_line = str(error).splitlines()[0] if str(error) else ""
    where = "its node died: " if node_died else ""
    return {
        "status": "crashed",
        "error": f"Ray task lost: {where}{type(error).__name__}: {first_line}",
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


@dataclass
class Pool:
    """One device kind's actors of one size (starting, idle, busy) and the runs still waiting
    for one: the runs on ``devices`` devices of ``kind``."""

    kind: str
    devices: int = 1
    queue: deque[RunSpec] = field(default_factory=deque)
    starting: dict[Any, Any] = field(default_factory=dict)  # the actor's node_id() call -> actor
    idle: list[tuple[Any, str]] = field(default_factory=list)  # (actor, node id)
    busy: dict[Any, tuple[Any, str, RunSpec]] = field(default_factory=dict)  # stream -> (actor, node id, run)

    def actors(self) -> list[Any]:
        return [*self.starting.values(), *(a for a, _ in self.idle), *(a for a, _, _ in self.busy.values())]


def placements(kind: str, nodes: list[dict[str, Any]], wanted: int | None, devices: int = 1) -> list[Any]:
    """Where the actors of ``kind`` go (``wanted`` at most; None: no limit): one per host for
    the CPU (the host's CPU lock lets only one run measure there at a time, so a second actor
    would only wait), one per group of ``devices`` chips or GPUs a node offers otherwise,
    left to Ray to place."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    options = kind_requirements(kind, devices)
    if kind == "cpu":
        hosts = [node["NodeID"] for node in nodes if servable(options, [node["Resources"]])]
        return [NodeAffinitySchedulingStrategy(host, soft=False) for host in hosts[:wanted]]
    units = sum(capacity(options, node["Resources"]) for node in nodes)
    return ["DEFAULT"] * (units if wanted is None else min(units, wanted))


def capacity(options: dict[str, Any], resources: dict[str, float]) -> int:
    """How many actors asking ``options`` fit on a node with ``resources``."""
    wanted = _wanted(options)
    return int(min((resources.get(name, 0) // amount for name, amount in wanted.items() if amount), default=0))


class FleetRun:
    """The driver's side of one ``--on ray`` invocation: queues each device kind's runs,
    starts that kind's actors, hands each idle actor the next run, and turns what comes
    back (events, answers, lost actors, dead nodes) into rows."""

    def __init__(self, ray: Any, results: str, pythons: dict[str, str]):
        self.ray, self.results, self.pythons = ray, results, pythons
        self.worker = ray.remote(max_restarts=0, max_task_retries=0)(DeviceWorker)
        self.nodes = alive_nodes(ray)
        self.pools: dict[tuple[str, int], Pool] = {}  # (device kind, devices per run) -> its actors
        self.rows: list[dict[str, Any]] = []
        self.ready: list[tuple[RunSpec, dict[str, Any], dict[str, Any] | None]] = []
        self.runner: SuiteRunner | None = None
        self.spread: list[RunSpec] = []  # runs over several hosts (:meth:`run_hosts`)
        self.host_actors: list[Any] = []  # the actors of the run over several hosts going on

    def warm(self, backends: Sequence[str]) -> None:
        """Start the actors the runs of ``backends`` will need, before those runs are planned:
        an actor's fork server (its ``import torch``) then boots while the driver still imports
        and plans, as a local run's does. A kind that gets no run lets its actors go."""
        for name in backends:
            kind = get_backend(name).device_kind
            if (kind, 1) not in self.pools:
                self.pools[kind, 1] = pool = Pool(kind)
                self.start_actors(pool, name, wanted=None)

    def run(self, runner: SuiteRunner, specs: Sequence[RunSpec]) -> list[dict[str, Any]]:
        self.runner = runner
        resources = [node["Resources"] for node in self.nodes]
        for index, spec in enumerate(specs):
            runner.observer.on_start(index, len(specs), spec)
            if spec.hosts > 1:  # after the one-host runs, each with its own placement group
                self.spread.append(spec)
                continue
            options = requirements(spec.backend, spec.devices)
            if not servable(options, resources):
                self.ready.append((spec, _unservable(spec, options), None))
                continue
            kind = get_backend(spec.backend).device_kind
            self.pools.setdefault((kind, spec.devices), Pool(kind, spec.devices)).queue.append(spec)
        try:
            for pool in self.pools.values():
                if not pool.actors() and pool.queue:
                    self.start_actors(pool, pool.queue[0].backend, wanted=len(pool.queue))
                self.dispatch(pool)  # a warmed kind that got no runs lets its actors go here
            # now, while the first runs wait for their fork servers: at the first row, the
            # store's import would take a core from the next run's measured steps on a
            # one-node cluster (the driver's host measured busy for half of a gpt2 infer run)
            runner.open_store()
            self.loop()
            for spec in self.spread:
                self.run_hosts(spec)
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM: keep what finished, cancel the rest
            runner.interrupted = True
            for pool in self.pools.values():
                pool.queue.clear()
                for stream in list(pool.busy):
                    while stream in pool.busy and self.ray.wait([stream], timeout=0)[0]:
                        self.take(pool, stream)
            self.write_ready()
        finally:  # runs still going (Ctrl-C): a killed actor's fork server kills their workers
            for pool in self.pools.values():
                for actor, _, _ in pool.busy.values():
                    self.ray.kill(actor)
            for actor in self.host_actors:
                self.ray.kill(actor)
        return self.rows

    def run_hosts(self, spec: RunSpec) -> None:
        """A run over ``spec.hosts`` hosts: a placement group of one bundle per host, each on a
        node of its own (``STRICT_SPREAD``) and asking for that host's chips or GPUs; one actor
        per bundle measures its host's share through the same executor as any run, the
        first one's node holding the rendezvous (:mod:`tpubench.launch.hosts`). Host 0's
        answer is the row; the actors and the group go when it is in."""
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        kind = get_backend(spec.backend).device_kind
        options = kind_requirements(kind, host_devices(spec))
        bundle = {name: amount for name, amount in _wanted(options).items() if amount}
        self.release_idle()  # the one-host runs are done: their idle actors hold what the bundles need
        self.nodes = alive_nodes(self.ray)
        fit = [node for node in self.nodes if servable(options, [node["Resources"]])]
        if len(fit) < spec.hosts:
            reason = f"{spec.hosts} hosts needed, each offering {bundle}; the Ray cluster has {len(fit)} such node(s)"
            self.ready.append((spec, unavailable(reason), None))
            self.write_ready()
            return
        group = placement_group([bundle] * spec.hosts, strategy="STRICT_SPREAD")
        try:
            wait = join_timeout(spec)
            if not self.ray.wait([group.ready()], timeout=wait)[0]:
                reason = f"the Ray cluster did not reserve {spec.hosts} hosts of {bundle} within {wait:g} s"
                self.ready.append((spec, unavailable(reason), None))
                return
            backend = get_backend(spec.backend)
            prestart = (python_for(self.pythons, spec.backend), backend.worker_env) if backend.forkable else None
            self.host_actors = [
                self.worker.options(
                    **options,
                    scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=k),
                ).remote(self.results, self.pythons, prestart, forwarded_environment())
                for k in range(spec.hosts)
            ]
            master = self.ray.get(self.host_actors[0].rendezvous_address.remote())
            streams = {
                actor.measure.remote(replace(spec, node_rank=k, master=master).to_json()): k
                for k, actor in enumerate(self.host_actors)
            }
            answers = self.follow_hosts(spec, streams)
            if "answer" in answers[0]:
                self.ready.append((spec, answers[0]["answer"]["result"], answers[0]["answer"]["fact"]))
            else:
                lost = _lost(spec, answers[0]["error"], node_died=False)
                self.ready.append((spec, {**lost, "error": f"host 0: {lost['error']}", "failed_host": 0}, None))
        finally:
            for actor in self.host_actors:
                self.ray.kill(actor)
            self.host_actors = []
            remove_placement_group(group)
            self.write_ready()

    def follow_hosts(self, spec: RunSpec, streams: dict[Any, int]) -> dict[int, dict[str, Any]]:
        """Every host's answer (or the error its call ended with); host 0's events reach the
        progress display as they come."""
        answers: dict[int, dict[str, Any]] = {}
        while streams:
            done, _ = self.ray.wait(list(streams), num_returns=1)
            stream = done[0]
            host = streams[stream]
            try:
                item = self.ray.get(next(stream))
            except StopIteration:
                item = {"error": RuntimeError("the actor's call ended without a result")}
            except self.ray.exceptions.RayError as error:
                item = {"error": error}
            if "event" in item:
                if host == 0:
                    assert self.runner is not None
                    self.runner.observer.on_event(spec, item["event"])
                continue
            del streams[stream]
            answers[host] = item
        return answers

    def release_idle(self) -> None:
        """Let every idle actor go (their runs are done), so that their resources serve others."""
        for pool in self.pools.values():
            for actor in [*pool.starting.values(), *(a for a, _ in pool.idle)]:
                self.ray.kill(actor)
            pool.starting.clear()
            pool.idle.clear()

    def loop(self) -> None:
        known = [node["NodeID"] for node in self.nodes]
        while True:
            self.write_ready()
            waiting = {ref: pool for pool in self.pools.values() for ref in [*awaited(pool), *pool.busy]}
            if not waiting:
                return
            done, _ = self.ray.wait(list(waiting), num_returns=1, timeout=POLL_S)
            if done:
                pool, ref = waiting[done[0]], done[0]
                if ref in pool.starting:
                    self.started(pool, ref)
                else:
                    self.take(pool, ref)
                continue
            self.nodes = alive_nodes(self.ray)
            if [node["NodeID"] for node in self.nodes] != known:
                known = [node["NodeID"] for node in self.nodes]
                for pool in self.pools.values():
                    self.after_node_change(pool)

    def start_actors(self, pool: Pool, first: str, wanted: int | None) -> None:
        """Actors for ``pool`` (``wanted`` of them at most; None: as many as the cluster offers),
        their fork servers booted for backend ``first``; or ``unavailable`` rows for its queue
        if no alive node can serve it."""
        self.nodes = alive_nodes(self.ray)  # after a death, not the nodes of before
        if not self.servable(pool):
            self.strand(pool)
            return
        backend = get_backend(first)
        prestart = (python_for(self.pythons, first), backend.worker_env) if backend.forkable else None
        for strategy in placements(pool.kind, self.nodes, wanted, pool.devices):
            options = {**kind_requirements(pool.kind, pool.devices), "scheduling_strategy": strategy}
            actor = self.worker.options(**options).remote(self.results, self.pythons, prestart, forwarded_environment())
            pool.starting[actor.node_id.remote()] = actor

    def servable(self, pool: Pool) -> bool:
        """Whether some alive node can still host an actor of ``pool``'s kind and size."""
        return servable(kind_requirements(pool.kind, pool.devices), [node["Resources"] for node in self.nodes])

    def strand(self, pool: Pool) -> None:
        """``unavailable`` rows for ``pool``'s queue, which only nodes that have died could serve,
        instead of runs Ray would keep waiting for; its starting actors go too."""
        for actor in pool.starting.values():
            self.ray.kill(actor)
        pool.starting.clear()
        while pool.queue:
            spec = pool.queue.popleft()
            since = " any more: the nodes that did have died"
            self.ready.append((spec, _unservable(spec, requirements(spec.backend, spec.devices), since), None))

    def started(self, pool: Pool, ref: Any) -> None:
        actor = pool.starting.pop(ref)
        try:
            pool.idle.append((actor, self.ray.get(ref)))
        except self.ray.exceptions.RayError:  # it died before it started (its node went): drop it
            self.refill(pool)
            return
        self.dispatch(pool)

    def dispatch(self, pool: Pool) -> None:
        """The next runs to the idle actors; a drained pool lets its actors go while other kinds
        still wait, so that their resources serve those. The last ones end with the driver's
        Ray job (killing them here would add a quarter of a second to every invocation's exit)."""
        while pool.idle and pool.queue:
            actor, node = pool.idle.pop()
            spec = pool.queue.popleft()
            pool.busy[actor.measure.remote(spec.to_json())] = (actor, node, spec)
        if not pool.queue and any(other.queue for other in self.pools.values()):
            for actor in [*pool.starting.values(), *(a for a, _ in pool.idle)]:
                self.ray.kill(actor)
            pool.starting.clear()
            pool.idle.clear()

    def refill(self, pool: Pool) -> None:
        """New actors for a pool that has runs waiting but no actor left (they died)."""
        if pool.queue and not pool.actors():
            self.start_actors(pool, pool.queue[0].backend, wanted=len(pool.queue))

    def take(self, pool: Pool, stream: Any) -> None:
        """The next item of a stream ``ray.wait`` found ready: an event, the answer, or the error."""
        actor, node, spec = pool.busy[stream]
        try:
            item = self.ray.get(next(stream))
        except StopIteration:
            item = {"error": RuntimeError("the actor's call ended without a result")}
        except self.ray.exceptions.RayError as error:
            item = {"error": error}
        if "event" in item:
            self.runner.observer.on_event(spec, item["event"])
            return
        del pool.busy[stream]
        if "answer" in item:
            self.ready.append((spec, item["answer"]["result"], item["answer"]["fact"]))
            pool.idle.append((actor, node))
        else:
            error = item["error"]
            node_died = node not in {n["NodeID"] for n in alive_nodes(self.ray)}
            self.ready.append((spec, _lost(spec, error, node_died), None))
            if not isinstance(error, self.ray.exceptions.RayActorError):
                pool.idle.append((actor, node))  # the call failed, the actor did not
        self.dispatch(pool)
        self.refill(pool)

    def after_node_change(self, pool: Pool) -> None:
        """Idle actors on nodes that died go; a queue no alive node can serve any more gets
        ``unavailable`` rows, where Ray would wait for ever."""
        alive = {node["NodeID"] for node in self.nodes}
        pool.idle = [(actor, node) for actor, node in pool.idle if node in alive]
        if pool.queue and not self.servable(pool):
            self.strand(pool)
        self.refill(pool)

    def write_ready(self) -> None:
        assert self.runner is not None, "rows are written once run() has its runner"
        while self.ready:
            spec, result, fact = self.ready.pop(0)
            if fact is None:  # decided in the driver: the driver's own facts describe the row
                fact = facts_for(self.runner.probe_all([spec.backend])[spec.backend], spec.backend)
            row, *tables = row_for(spec, self.runner.invocation_id, self.runner.tags, fact, result)
            self.runner.write(row, *tables)
            self.rows.append(row)
            self.runner.observer.on_finish(spec, row)


def awaited(pool: Pool) -> list[Any]:
    """The starting actors of ``pool`` worth waiting for: none once its queue is empty.

    An actor that Ray has not placed yet may never start: a one-node cluster with two CPUs
    and a ``TPU: 4`` gets three actors (one for the CPU, two for the chips), and the third
    waits for a CPU that the two idle ones keep once every queue is empty (idle actors end
    with the job, :meth:`FleetRun.dispatch`). Waiting for it hung the driver for good
    whenever the chips' runs happened to finish after the CPU's last one had started.
    """
    return list(pool.starting) if pool.queue else []


def alive_nodes(ray: Any) -> list[dict[str, Any]]:
    return [node for node in ray.nodes() if node.get("Alive")]


def run(runner: SuiteRunner, specs: Sequence[RunSpec], address: str | None = None) -> list[dict[str, Any]]:
    """Run ``specs`` on the Ray cluster, one actor per device they need, and write each row
    as it arrives; returns the rows.

    The fingerprint of each row is the one its node's probe gave, so rows of one invocation
    may come from different hosts (the ``host`` and ``ray_node_id`` columns say which).
    """
    return FleetRun(connect(address), str(runner.results_dir), runner.pythons).run(runner, specs)
