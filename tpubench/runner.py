"""The suite runner: plans runs, probes backends, runs each in a worker, stores every row.

One invocation probes each worker interpreter once (versions, device, availability),
then runs its specs one at a time, each in a fresh worker process. Unavailable backends
and failed workers become rows like any other; finished rows are on disk before the
next run starts, so Ctrl-C or a crash of the parent keeps them.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from itertools import product
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from tpubench import devicelock
from tpubench.backends import get_backend
from tpubench.backends.base import DEFAULT_WORKER_ENV, SIMULATED_DEVICES_ENV
from tpubench.fingerprint import fingerprint, fingerprint_hash
from tpubench.launch import hosts
from tpubench.launch.process import classify, run_worker, worker_env
from tpubench.parallel import host_devices, is_multi_process, planning, spec_columns
from tpubench.results_dir import is_remote
from tpubench.spec import DIMENSIONS, KEY_FIELDS, RunSpec

if TYPE_CHECKING:
    from tpubench.backends import Backend
    from tpubench.ceilings import CeilingSpec
    from tpubench.store import InvocationWriter
    from workloads import Workload

PROBE_TIMEOUT_S = 180.0


class RunObserver(Protocol):
    """What a front end (the CLI's progress display) hears from the runner."""

    def on_start(self, index: int, total: int, spec: RunSpec) -> None: ...
    def on_event(self, spec: RunSpec, event: dict[str, Any]) -> None: ...
    def on_finish(self, spec: RunSpec, row: dict[str, Any]) -> None: ...


class _Silent:
    def on_start(self, index: int, total: int, spec: RunSpec) -> None: ...
    def on_event(self, spec: RunSpec, event: dict[str, Any]) -> None: ...
    def on_finish(self, spec: RunSpec, row: dict[str, Any]) -> None: ...


DEFAULT_GEN_LEN = 128


def _as_list(value: int | Sequence[int] | None) -> list[int | None]:
    if value is None:
        return [None]
    return [value] if isinstance(value, int) else list(value)


def plan(
    workloads: Sequence[Workload | str],
    *,
    sizes: Sequence[str] | Mapping[str, Sequence[str] | None] | None = None,
    backends: Sequence[str] = ("cpu",),
    modes: Sequence[str] | None = None,
    dtype: str = "float32",
    batch_size: int | Sequence[int] | None = None,
    seq_len: int | Sequence[int] | None = None,
    image_size: int | Sequence[int] | None = None,
    latent_size: int | Sequence[int] | None = None,
    gen_len: int | Sequence[int] | None = None,
    devices: int | Sequence[int] | None = None,
    parallel: str = "none",
    tp: int | None = None,
    scaling: str | None = None,
    **settings: Any,
) -> list[RunSpec]:
    """Every combination of workload, size, backend, mode, shape and device count, in that
    nesting order.

    Each workload runs at its default size unless ``sizes`` names others (a mapping gives
    each workload its own; None there means the default), and in train and infer modes
    unless ``modes`` says otherwise; sizes and modes a workload does not define are
    skipped for it. Shapes default per device kind; a list of batch sizes, sequence
    (prompt) lengths, image or latent sizes or generation lengths is a sweep, one run per
    combination (generation lengths only apply to decode). A dimension applies to the
    workloads that take it (``Workload.dims``); one that none of them takes is a
    ValueError, as is a prompt plus generation beyond a model's context.

    ``devices`` (a sweep, default 1) with ``parallel`` (dp, fsdp, tp, fsdp_tp; required above
    one device), ``tp`` (fsdp_tp's tensor-parallel degree) and ``scaling`` lay each run out
    over its devices (:mod:`tpubench.parallel.planning`): ``batch_size`` is then per
    data-parallel rank under weak scaling (the default for dp and fsdp training) and global
    under strong, and the specs hold the global batch. A layout the workload cannot take (a
    degree that does not divide its heads or the batch) is a ValueError too. ``settings`` are
    the remaining :class:`RunSpec` fields.
    """
    from workloads import MODES, get_workload, registry  # the registry imports torch: only planning needs it

    chosen = [get_workload(w) if isinstance(w, str) else w for w in workloads]
    given = {"seq_len": seq_len, "image_size": image_size, "latent_size": latent_size}
    for name, value in given.items():
        if value is not None and chosen and not any(name in workload.dims for workload in chosen):
            option = "--" + name.replace("_", "-")
            takers = ", ".join(w.name for w in registry().values() if name in w.dims) or "none"
            raise ValueError(
                f"{option} does not apply to {', '.join(w.name for w in chosen)}; workloads with it: {takers}"
            )
    layouts = planning.layouts([n for n in _as_list(devices) if n is not None] or [1], parallel, tp)
    if settings.get("verify") and any(layout.devices > 1 for layout in layouts):
        planning.check_verifiable(backends, modes or MODES, settings.get("hosts", 1))
    specs = []
    for workload in chosen:
        wanted = sizes.get(workload.name) if isinstance(sizes, Mapping) else sizes
        for size, backend, mode in product(wanted or [workload.default_size], backends, modes or MODES):
            if size not in workload.sizes or mode not in workload.modes:
                continue
            kind = get_backend(backend).device_kind
            sweeps = [_as_list(value) if name in workload.dims else [None] for name, value in given.items()]
            gens = _as_list(gen_len) if mode == "decode" else [0]
            for batch, *dims, gen, layout in product(_as_list(batch_size), *sweeps, gens, layouts):
                shape = workload.shape(kind, batch, **dict(zip(given, dims, strict=True)))
                run_scaling = planning.scaling_for(layout, mode, scaling)
                shape = replace(shape, batch_size=planning.global_batch(shape.batch_size, layout, run_scaling))
                generated = DEFAULT_GEN_LEN if gen is None else gen
                if shape.seq_len is not None:
                    _check_context(workload, size, shape.seq_len, generated)
                if error := workload.shape_error(workload.config(size), shape):
                    raise ValueError(f"{workload.name}/{size}: {error}")
                if error := planning.tp_error(workload, size, workload.config(size), layout):
                    raise ValueError(error)
                specs.append(
                    RunSpec(
                        suite=workload.suite,
                        workload=workload.name,
                        size=size,
                        backend=backend,
                        mode=mode,
                        dtype=dtype,
                        batch_size=shape.batch_size,
                        **shape.dims(),
                        gen_len=generated,
                        devices=layout.devices,
                        parallel=layout.parallel,
                        tp_size=layout.tp,
                        scaling=run_scaling,
                        **settings,
                    )
                )
    return specs


def _check_context(workload: Workload, size: str, prompt: int, generated: int) -> None:
    context = workload.max_seq_len(workload.config(size))
    if prompt + generated > context:
        what = f"prompt {prompt} + generation {generated}" if generated else f"--seq-len {prompt}"
        raise ValueError(f"{what} exceeds {workload.name}/{size}'s context of {context}")


def probe(python: str, backends: list[str]) -> dict[str, Any]:
    """Ask ``python`` which of ``backends`` it can run; a failed probe marks them unavailable."""
    env = worker_env(DEFAULT_WORKER_ENV)
    try:
        outcome = run_worker({"kind": "probe", "backends": backends}, python=python, env=env, timeout_s=PROBE_TIMEOUT_S)
    except OSError as error:
        outcome_result, reason = None, f"cannot start {python}: {error}"
    else:
        outcome_result = outcome.result
        last_line = (outcome.stderr_tail.strip().splitlines() or [outcome.lost_log or "no output"])[-1]
        reason = f"probe with {python} failed: {last_line}"
    if outcome_result is not None:
        return outcome_result
    unavailable = {"available": False, "reason": reason, "device_name": "", "device_count": 0, "versions": {}}
    return {
        "executable": python,
        "python_version": None,
        "torch_version": None,
        "backends": {name: unavailable for name in backends},
    }


def python_for(pythons: dict[str, str], backend: str) -> str:
    """The interpreter for ``backend``'s workers: its own entry, else its family's
    (``xla`` covers ``xla-compile``), else this one."""
    family = backend.split("-")[0]
    return pythons.get(backend) or pythons.get(family) or sys.executable


#: the variable that pins a worker to its devices, per device kind (Ray and the TPU backends set them)
PIN_VARIABLES = {"tpu": "TPU_VISIBLE_CHIPS", "cuda": "CUDA_VISIBLE_DEVICES"}


def lock_name(device_kind: str, env: dict[str, str], devices: int = 1) -> list[str]:
    """The device locks a worker with ``env`` takes, one per device it drives, in the order
    they are taken (sorted, so two runs that share devices never hold one each and wait
    for the other): its kind and the chip or GPU it is pinned to where one is (Ray and the
    TPU backends pin a run; a multi-device run is pinned to its N devices by
    ``Backend.worker_env_for``), else the first ones, as the runtime numbers them (an unpinned
    CUDA worker uses GPU 0), so runs on different chips of one host can proceed side by
    side. The host's CPU is one device, whatever the number of ranks sharing it. Fewer
    names than ``devices`` means the pin leaves too few devices."""
    variable = PIN_VARIABLES.get(device_kind)
    if variable is None:
        return [device_kind]
    # unpinned, a runtime numbers the host's devices from 0: a run uses the first ones
    pinned = [part.strip() for part in env.get(variable, "").split(",") if part.strip()]
    chosen = pinned[:devices] if pinned else [str(index) for index in range(devices)]
    return [f"{device_kind}-{device}" for device in sorted(chosen, key=_device_order)]


def lock_job(spec: RunSpec) -> devicelock.Job | None:
    """The run over several hosts that ``spec`` is this host's share of, as the device locks
    name it (:class:`tpubench.devicelock.Job`): its rendezvous and what it runs, equal on every
    host of the run, so that hosts of one run on one machine share its devices instead of
    each waiting for the other. None for a run on one host."""
    if spec.hosts == 1:
        return None
    what = hashlib.sha256(json.dumps(hosts.identity(spec), sort_keys=True).encode()).hexdigest()[:16]
    return devicelock.Job(f"{spec.master} {what}", spec.node_rank)


def _device_order(device: str) -> tuple[int, int | str]:
    """GPU and chip indexes in numeric order (2 before 10), other ids (GPU UUIDs) after them."""
    return (0, int(device)) if device.isdigit() else (1, device)


def unavailable(reason: str) -> dict[str, Any]:
    """The result of a run that cannot start here: no worker ran, so it started and finished now."""
    now = datetime.now(UTC)
    return {"status": "unavailable", "error": reason, "started_at": now, "finished_at": now}


def too_few_devices(spec: RunSpec, backend: Backend, availability: dict[str, Any], locks: list[str]) -> str | None:
    """Why ``spec`` cannot have its devices here (None: it can): more than the backend has
    (``Availability.parallel_devices``: GPUs, chips, or the simulated limit of the CPU
    families), or more than the user's pin (``CUDA_VISIBLE_DEVICES``, ``TPU_VISIBLE_CHIPS``)
    leaves. Such a run gets an ``unavailable`` row, like a backend missing from this host."""
    needed = host_devices(spec)  # on several hosts, each host's share
    if needed == 1:
        return None
    have = availability.get("parallel_devices") or 1
    if needed > have:
        what = availability.get("device_name") or spec.backend
        if backend.simulated_devices():
            what += f"; simulated devices: {SIMULATED_DEVICES_ENV} sets how many"
        return f"{needed} devices needed; {spec.backend} has {have} here ({what})"
    if backend.device_kind == "cuda" and len(locks) < needed:  # a TPU pin counts chips, not devices
        return f"{needed} devices needed; the pin to {', '.join(locks)} leaves {len(locks)}"
    return None


def wait_reporter(on_event: Callable[[dict[str, Any]], None]) -> Callable[[str], None]:
    """A device wait's message as the ``wait`` phase event a front end shows on its own line."""
    return lambda message: on_event({"event": "phase", "phase": "wait", "step": 0, "of": 0, "detail": message})


@dataclass
class Executor:
    """Runs one spec on the machine it is called on: the device lock, the isolated worker,
    --verify, and the trace's upload to object storage. The local runner and the Ray actors
    (:mod:`tpubench.launchers.ray_actor`) both measure through it, so a fleet run is the same
    measurement as a local one."""

    results: str
    pythons: dict[str, str] = field(default_factory=dict)  # backend -> interpreter for its workers

    def run(
        self, spec: RunSpec, availability: dict[str, Any], on_event: Callable[[dict[str, Any]], None]
    ) -> dict[str, Any]:
        """The run's result fields (with ``started_at``, ``finished_at``, ``steps``, ``ops``)."""
        if not availability["available"]:
            return unavailable(availability["reason"])
        backend = get_backend(spec.backend)
        env = worker_env(backend.worker_env_for(spec))
        locks = lock_name(backend.device_kind, env, host_devices(spec))
        if reason := too_few_devices(spec, backend, availability, locks):
            return unavailable(reason)
        staging = None
        # the store (pandas, pyarrow: 0.4 s to import) is imported only to place a finished
        # run's trace, so that a Ray actor measures without it while its fork server boots
        if spec.profile_steps:
            trace_root = Path(self.results) / "traces" if not is_remote(self.results) else None
            staging = None if trace_root else tempfile.mkdtemp(prefix="tpubench-trace-")
            spec = replace(spec, trace_dir=str(((trace_root or Path(staging)) / spec.run_id).resolve()))
        on_wait = wait_reporter(on_event)
        try:
            with devicelock.hold(locks, on_wait, lock_job(spec)) as waited:
                # started_at and finished_at are stamped while this process holds the device's
                # lock: the rows of one device never overlap, and the wait before is device_wait_s
                started_at = datetime.now(UTC)
                result = backend.run_on_device(  # a TPU waits for its chip, and retries once if busy
                    lambda: classify(
                        run_worker(
                            {"kind": "run", "spec": spec.to_json()},
                            python=python_for(self.pythons, spec.backend),
                            env=env,
                            timeout_s=spec.timeout_s,
                            on_event=on_event,
                            fork=backend.forkable,
                        ),
                        spec.timeout_s,
                    ),
                    on_wait,
                )
                if spec.verify and result["status"] == "ok" and "host_row" not in result:  # host 0 verifies
                    result.update(self._verify(spec, result))
                finished_at = datetime.now(UTC)  # before the lock's release lets the next run stamp its start
            if result.get("trace_path"):  # the device is free again while the trace uploads
                result["trace_path"] = self._place_trace(spec, staging, result["trace_path"])
        finally:
            if staging:
                shutil.rmtree(staging, ignore_errors=True)
        return {**result, "device_wait_s": waited, "started_at": started_at, "finished_at": finished_at}

    def _place_trace(self, spec: RunSpec, staging: str | None, path: str) -> str:
        """The trace's path for the row: uploaded from ``staging`` to object storage, or the
        local one relative to the results folder."""
        from tpubench import store

        if staging:
            return store.upload_trace(self.results, spec.run_id, spec.trace_dir, path)
        return store.recorded_path(self.results, path)

    def _verify(self, spec: RunSpec, result: dict[str, Any]) -> dict[str, Any]:
        """Compare ``spec``'s outputs with the CPU float32 reference, each computed in its own
        worker. A run of rank processes (train only: :func:`planning.check_verifiable`) is
        compared by the losses its steps stored, the job's (the ranks' mean), against one
        device's on the global batch: its outputs lie in its ranks."""
        import torch  # only --verify reads tensors in the parent

        from tpubench import verify

        ranked = is_multi_process(spec)
        reference = replace(
            spec,
            backend=verify.REFERENCE_BACKEND,
            dtype=verify.REFERENCE_DTYPE,
            precision=None,  # the reference's: float32's own
            init_dtype=spec.dtype,  # the candidate's very weights, computed in float32
            verify=False,
            profile_steps=0,
            compile_cache=None,
            **(verify.ONE_DEVICE if ranked else {}),
        )
        roles = (("reference", reference),) if ranked else (("reference", reference), ("candidate", spec))
        found = {"candidate": verify.stored_losses(result["steps"])} if ranked else {}
        with tempfile.TemporaryDirectory(prefix="tpubench-verify-") as scratch:
            for role, run in roles:
                path = os.path.join(scratch, f"{role}.pt")
                backend = get_backend(run.backend)
                outcome = run_worker(
                    {"kind": "verify", "spec": run.to_json(), "output": path},
                    python=python_for(self.pythons, run.backend),
                    env=worker_env(backend.worker_env_for(run)),
                    timeout_s=spec.timeout_s,
                    fork=backend.forkable,
                )
                result = classify(outcome, spec.timeout_s)
                if result["status"] != "ok":
                    return {
                        "verified": "error",
                        "warnings": f"--verify: the {role} run {result['status']}: {result.get('error')}",
                    }
                found[role] = torch.load(path)
        if ranked:  # the losses both have; the shards' parameter count is not the model's
            losses = min(len(found["candidate"]["loss"]), len(found["reference"]["loss"]))
            if not losses:
                return {"verified": "error", "warnings": "--verify: the run's steps stored no loss to compare"}
            found = {role: {"loss": outputs["loss"][:losses]} for role, outputs in found.items()}
        columns = verify.compare(found["reference"], found["candidate"], spec.dtype)
        note = columns.pop("verify_note", None)
        if columns["verified"] == "mismatch":
            columns["status"] = "mismatch"
            what = "the job's losses" if ranked else "outputs"
            columns["error"] = (
                f"{what} differ from the cpu float32 reference: max relative error "
                f"{columns['max_rel_err']:.3g} (tolerance {columns['verify_tolerance']:g})"
                + ("; generated tokens differ" if columns["tokens_match"] is False else "")
                + (f"; {note}" if note else "")
            )
        return columns


#: the fingerprint's facts that are columns of their own
FACT_COLUMNS = (
    "host",
    "cpu_model",
    "device_count",
    "python_executable",
    "python_version",
    "torch_version",
    "tpubench_version",
    "git_sha",
)


def row_for(
    spec: RunSpec, invocation_id: str, tags: dict[str, str], fact: dict[str, Any], result: dict[str, Any]
) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """The run's row and its rows of the steps, ops, compiles and memory tables, from the
    spec, where it ran and its result."""
    result = dict(result)
    ids = {"run_id": spec.run_id, "invocation_id": invocation_id}
    steps = [{**ids, **step} for step in result.pop("steps", [])]
    ops = [{**ids, **op} for op in result.pop("ops", [])]
    compiles = [{**ids, **event} for event in result.pop("compiles", [])]
    memory = [{**ids, **part} for part in result.pop("memory", [])]
    row = {
        **ids,
        "suite": spec.suite,
        "workload": spec.workload,
        "size": spec.size,
        "backend": spec.backend,
        "device": fact["device"] or None,
        "mode": spec.mode,
        "dtype": spec.dtype,
        "precision": spec.precision,
        "batch_size": spec.batch_size,
        **{name: getattr(spec, name) for name in DIMENSIONS},
        "gen_len": spec.gen_len,
        "devices": spec.devices,
        "parallel": spec.parallel,
        "tp_size": spec.tp_size,
        "scaling": spec.scaling,
        "attention": spec.attention,
        **spec_columns(spec),  # the worker's own (chips, simulated) come with its result
        # a user's model, as planned: a run that failed before saying what it measured keeps them
        "model_ref": spec.model_ref,
        "model_hash": spec.model_hash,
        "warmup_min_steps": spec.warmup,
        **{key: fact[key] for key in FACT_COLUMNS},
        "backend_versions": json.dumps(fact["backend_versions"], sort_keys=True),
        "env": json.dumps(fact["env"], sort_keys=True),
        "fingerprint": fingerprint_hash(fact),
        "tags": json.dumps(tags, sort_keys=True),
        **result,
    }
    return row, steps, ops, compiles, memory


def facts_for(probe_result: dict[str, Any], backend: str) -> dict[str, Any]:
    """The environment fingerprint of ``backend``'s runs, from its interpreter's probe."""
    return fingerprint(probe_result, backend, worker_env(get_backend(backend).worker_env))


@dataclass
class SuiteRunner:
    results_dir: str | Path
    pythons: dict[str, str] = field(default_factory=dict)  # backend -> interpreter for its workers
    tags: dict[str, str] = field(default_factory=dict)
    resume: bool = False
    observer: RunObserver = field(default_factory=_Silent)
    invocation_id: str = field(default_factory=lambda: f"{datetime.now(UTC):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:8]}")
    interrupted: bool = False
    resumed: list[RunSpec] = field(default_factory=list)
    _probes: dict[str, dict[str, Any]] = field(default_factory=dict, init=False, repr=False)
    _writer: InvocationWriter | None = field(default=None, init=False, repr=False)

    @property
    def executor(self) -> Executor:
        return Executor(str(self.results_dir), self.pythons)

    def python_for(self, backend: str) -> str:
        return python_for(self.pythons, backend)

    def probe_all(self, backends: Sequence[str]) -> dict[str, dict[str, Any]]:
        """Each backend's probe, one probe per distinct interpreter, once per invocation."""
        by_python: dict[str, list[str]] = {}
        for backend in dict.fromkeys(backends):
            if backend not in self._probes:
                by_python.setdefault(self.python_for(backend), []).append(backend)
        for python, names in by_python.items():
            result = probe(python, names)
            self._probes.update(dict.fromkeys(names, result))
        return {backend: self._probes[backend] for backend in backends}

    def resume_key(self, spec: RunSpec, fact: dict[str, Any]) -> tuple:
        """What a stored ``ok`` row must match for ``--resume`` to skip ``spec``: the run's
        identity, the environment, and the settings that shape the measurement."""
        return (*spec.key(), fingerprint_hash(fact), spec.warmup, spec.steps, json.dumps(self.tags, sort_keys=True))

    def already_done(self) -> set[tuple]:
        """The resume keys of the store's ``ok`` rows (empty without --resume)."""
        from tpubench import store

        if not self.resume or not store.Location(self.results_dir).exists():
            return set()
        done = store.load_runs(self.results_dir, status="ok")
        columns = [*KEY_FIELDS, "fingerprint", "warmup_min_steps", "measured_steps", "tags"]
        # a dimension a row's workload does not take (or an older row lacks) is null: None, as in the spec
        done = done.reindex(columns=columns)  # store.upgrade gave rows from before --devices one device
        done = done[columns].astype(object).where(done[columns].notna(), None)
        return set(done.itertuples(index=False, name=None))

    def open_store(self) -> InvocationWriter:
        """This invocation's writer, made on first use: its import of the store (pandas and
        pyarrow, 0.4 s of CPU) waits until a row is to be written, or until a caller with
        runs measuring elsewhere knows the cores are otherwise idle."""
        if self._writer is None:
            from tpubench.store import InvocationWriter

            self._writer = InvocationWriter(self.results_dir, self.invocation_id, datetime.now(UTC))
        return self._writer

    def write(
        self,
        row: dict[str, Any],
        steps: list[dict[str, Any]],
        ops: list[dict[str, Any]],
        compiles: Sequence[dict[str, Any]] = (),
        memory: Sequence[dict[str, Any]] = (),
    ) -> None:
        """Add a finished run to this invocation's files (rewritten at once)."""
        self.open_store().add(row, steps, ops, compiles, memory)

    def run(self, specs: Sequence[RunSpec]) -> list[dict[str, Any]]:
        """Run ``specs`` in order and return their rows (also written to the store).

        Calling it again on the same runner continues the same invocation and file.
        """
        probes = self.probe_all([spec.backend for spec in specs])
        facts = {backend: facts_for(probe_result, backend) for backend, probe_result in probes.items()}
        done = self.already_done()
        executor = self.executor
        rows: list[dict[str, Any]] = []
        for index, spec in enumerate(specs):
            fact = facts[spec.backend]
            if self.resume_key(spec, fact) in done:
                self.resumed.append(spec)
                continue
            self.observer.on_start(index, len(specs), spec)
            try:
                availability = probes[spec.backend]["backends"][spec.backend]
                result = executor.run(spec, availability, lambda event, spec=spec: self.observer.on_event(spec, event))
                row, *tables = row_for(spec, self.invocation_id, self.tags, fact, result)
                if spec.node_rank == 0:  # on several hosts, host 0 writes the row; the others follow it
                    self.write(row, *tables)
            except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the finished runs are on disk
                self.interrupted = True
                break
            rows.append(row)
            self.observer.on_finish(spec, row)
        return rows


# --- ceilings ---------------------------------------------------------------------------


def run_ceiling(
    spec: CeilingSpec, availability: dict[str, Any], python: str, on_event: Callable[[dict[str, Any]], None]
) -> dict[str, Any]:
    """One ceilings sweep in its own worker, under the device locks of its devices, as a run
    (:class:`Executor`): the worker's result (``points``: one row each), or why it has none."""
    if not availability["available"]:
        return unavailable(availability["reason"])
    backend = get_backend(spec.backend)
    env = worker_env(backend.worker_env_for(spec.run_spec()))
    locks = lock_name(backend.device_kind, env, spec.devices)
    with devicelock.hold(locks, wait_reporter(on_event)) as waited:
        started_at = datetime.now(UTC)
        result = backend.run_on_device(
            lambda: classify(
                run_worker(
                    {"kind": "ceiling", "spec": spec.to_json()},
                    python=python,
                    env=env,
                    timeout_s=spec.timeout_s,
                    on_event=on_event,
                    fork=backend.forkable,
                ),
                spec.timeout_s,
            ),
            wait_reporter(on_event),
        )
    return {**result, "device_wait_s": waited, "started_at": started_at, "finished_at": datetime.now(UTC)}


#: what a ceilings worker says of its whole sweep, copied onto each of its points' rows
SWEEP_COLUMNS = (
    "device",
    "device_kind",
    "simulated",
    "llc_bytes",
    "timing",
    "num_threads",
    "host_load_1m",
    "host_other_cpu_share",
    "worker_wall_s",
    "device_wait_s",
    "started_at",
    "finished_at",
)


def ceiling_rows(
    spec: CeilingSpec, invocation_id: str, tags: dict[str, str], fact: dict[str, Any], result: dict[str, Any]
) -> list[dict[str, Any]]:
    """The ceilings table's rows of one sweep: a row per point, or one row saying why the
    sweep measured nothing (unavailable, failed, timed out)."""
    common = {
        "run_id": spec.run_id,
        "invocation_id": invocation_id,
        "kind": spec.kind,
        "backend": spec.backend,
        "devices": spec.devices,
        **{key: result.get(key) for key in SWEEP_COLUMNS},
        **{key: fact[key] for key in FACT_COLUMNS},
        "device": result.get("device") or fact["device"] or None,
        "backend_versions": json.dumps(fact["backend_versions"], sort_keys=True),
        "env": json.dumps(fact["env"], sort_keys=True),
        "fingerprint": fingerprint_hash(fact),
        "tags": json.dumps(tags, sort_keys=True),
    }
    if result["status"] != "ok" or not result.get("points"):
        status = result["status"] if result["status"] != "ok" else "skipped"
        error = result.get("error") or "the sweep has no point (--max-size below its smallest size?)"
        return [{**common, "status": status, "error": error, "warnings": result.get("warnings")}]
    sweep_notes = result.get("warnings")
    rows = []
    for point in result["points"]:
        notes = "\n".join(filter(None, [point.pop("warnings", None), sweep_notes])) or None
        rows.append({**common, **point, "warnings": notes})
    return rows


def run_ceilings(
    runner: SuiteRunner,
    specs: Sequence[CeilingSpec],
    on_start: Callable[[CeilingSpec], None] = lambda spec: None,
    on_event: Callable[[CeilingSpec, dict[str, Any]], None] = lambda spec, event: None,
) -> list[dict[str, Any]]:
    """Measure ``specs`` one at a time, each in its worker, and write their rows to the
    ``ceilings`` table of ``runner``'s store, under its invocation, after each sweep."""
    from tpubench.store import InvocationWriter

    probes = runner.probe_all([spec.backend for spec in specs])
    writer = InvocationWriter(runner.results_dir, runner.invocation_id, datetime.now(UTC), tables=("ceilings",))
    rows: list[dict[str, Any]] = []
    for spec in specs:
        on_start(spec)
        try:
            availability = probes[spec.backend]["backends"][spec.backend]
            result = run_ceiling(spec, availability, runner.python_for(spec.backend), lambda e, s=spec: on_event(s, e))
            fresh = ceiling_rows(
                spec, runner.invocation_id, runner.tags, facts_for(probes[spec.backend], spec.backend), result
            )
            writer.add_rows({"ceilings": fresh})
        except KeyboardInterrupt:
            runner.interrupted = True
            break
        rows += fresh
    return rows
