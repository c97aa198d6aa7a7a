"""``--on ray``: one Ray task per run, each on a node with the accelerator its backend needs.

Ray already schedules work onto TPU chips and GPUs, so tpubench does not grow a scheduler
of its own. Each run spec becomes a task that asks for its device (``resources={"TPU": 1}``
for TorchTPU and XLA-on-TPU backends, ``num_gpus=1`` for CUDA, one CPU otherwise); on the
node Ray picks, the task probes its interpreter and measures through the same
:class:`~tpubench.runner.Executor` as a local run: the same isolated worker process, timeout,
crash classification, device lock and ``--python`` mapping. Ray sets ``TPU_VISIBLE_CHIPS``
or ``CUDA_VISIBLE_DEVICES`` for the task, which pins the worker (and names its lock).

Rows come back to the driver, which writes the invocation's files as a local run does.
Tasks are never retried (``max_retries=0``): a retried measurement would mix with a first
try. A backend that no node can serve gives ``unavailable`` rows at once instead of tasks
that wait for ever; a task whose node dies gives a ``crashed`` row.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from tpubench.backends import get_backend
from tpubench.runner import Executor, SuiteRunner, facts_for, probe, python_for, row_for
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
#: Ray worker processes play the parent's part: like the CLI, no TPU plugin autoloads into them
TASK_ENV = {"env_vars": {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}}


def run_on_node(spec_json: dict[str, Any], results: str, pythons: dict[str, str]) -> dict[str, Any]:
    """The Ray task: probe this node's interpreter for the backend, then measure like a local run."""
    import ray

    spec = RunSpec.from_json(spec_json)
    key = (python_for(pythons, spec.backend), spec.backend)
    if key not in _PROBES:
        _PROBES[key] = probe(key[0], [spec.backend])
    probed = _PROBES[key]
    result = Executor(results, pythons).run(spec, probed["backends"][spec.backend], lambda event: None)
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

    task = ray.remote(max_retries=0, runtime_env=TASK_ENV)(probe_node)
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


def _unservable(spec: RunSpec, options: dict[str, Any]) -> dict[str, Any]:
    now = datetime.now(UTC)
    asked = {k: v for k, v in options.items() if k != "num_cpus"} or {"num_cpus": options["num_cpus"]}
    return {
        "status": "unavailable",
        "error": f"no node in the Ray cluster offers what {spec.backend} needs ({asked})",
        "started_at": now,
        "finished_at": now,
    }


def run(runner: SuiteRunner, specs: Sequence[RunSpec], address: str | None = None) -> list[dict[str, Any]]:
    """Run ``specs`` as Ray tasks and write each row as it arrives; returns the rows.

    The fingerprint of each row is the one its node's probe gave, so rows of one invocation
    may come from different hosts (the ``host`` and ``ray_node_id`` columns say which).
    """
    ray = connect(address)
    task = ray.remote(max_retries=0, retry_exceptions=False, runtime_env=TASK_ENV)(run_on_node)
    nodes = node_resources(ray)
    pending: dict[Any, RunSpec] = {}
    rows: list[dict[str, Any]] = []
    ready: list[tuple[RunSpec, dict[str, Any], dict[str, Any] | None]] = []
    for index, spec in enumerate(specs):
        options = requirements(spec.backend)
        runner.observer.on_start(index, len(specs), spec)
        if not servable(options, nodes):
            ready.append((spec, _unservable(spec, options), None))
            continue
        pending[task.options(**options).remote(spec.to_json(), str(runner.results_dir), runner.pythons)] = spec
    try:
        while ready or pending:
            while ready:
                spec, result, fact = ready.pop(0)
                if fact is None:  # decided in the driver: the driver's own facts describe the row
                    fact = facts_for(runner.probe_all([spec.backend])[spec.backend], spec.backend)
                row, steps, ops = row_for(spec, runner.invocation_id, runner.tags, fact, result)
                runner.write(row, steps, ops)
                rows.append(row)
                runner.observer.on_finish(spec, row)
            if not pending:
                break
            [done], _ = ray.wait(list(pending), num_returns=1)
            spec = pending.pop(done)
            try:
                answer = ray.get(done)
                ready.append((spec, answer["result"], answer["fact"]))
            except ray.exceptions.RayError as error:
                ready.append((spec, _lost(spec, error), None))
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: cancel what is queued, keep what finished
        for ref in pending:
            ray.cancel(ref, force=True)
        runner.interrupted = True
    return rows
