"""The suite runner: plans runs, probes backends, runs each in a worker, stores every row.

One invocation probes each worker interpreter once (versions, device, availability),
then runs its specs one at a time, each in a fresh worker process. Unavailable backends
and failed workers become rows like any other; finished rows are on disk before the
next run starts, so Ctrl-C or a crash of the parent keeps them.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from itertools import product
from pathlib import Path
from typing import Any, Protocol

from tpubench import devicelock, store, verify
from tpubench.backends import get_backend
from tpubench.fingerprint import fingerprint, fingerprint_hash
from tpubench.process import DEFAULT_WORKER_ENV, classify, run_worker, worker_env
from tpubench.spec import KEY_FIELDS, RunSpec
from workloads import MODES, Workload, get_workload

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
    sizes: Sequence[str] | None = None,
    backends: Sequence[str] = ("cpu",),
    modes: Sequence[str] | None = None,
    dtype: str = "float32",
    batch_size: int | Sequence[int] | None = None,
    seq_len: int | Sequence[int] | None = None,
    gen_len: int | Sequence[int] | None = None,
    **settings: Any,
) -> list[RunSpec]:
    """Every combination of workload, size, backend, mode and shape, in that nesting order.

    Each workload runs at its default size unless ``sizes`` names others, and in train and
    infer modes unless ``modes`` says otherwise; sizes and modes a workload does not define
    are skipped for it. Shapes default per device kind; a list of batch sizes, sequence
    (prompt) lengths or generation lengths is a sweep, one run per combination (generation
    lengths only apply to decode). ``settings`` are the remaining :class:`RunSpec` fields.
    A prompt plus generation beyond a model's context is a ValueError.
    """
    specs = []
    for workload in (get_workload(w) if isinstance(w, str) else w for w in workloads):
        for size, backend, mode in product(sizes or [workload.default_size], backends, modes or MODES):
            if size not in workload.sizes or mode not in workload.modes:
                continue
            shape = workload.shape_for(get_backend(backend).device_kind)
            gens = _as_list(gen_len) if mode == "decode" else [0]
            for batch, seq, gen in product(_as_list(batch_size), _as_list(seq_len), gens):
                prompt, generated = seq or shape.seq_len, DEFAULT_GEN_LEN if gen is None else gen
                _check_context(workload, size, prompt, generated)
                specs.append(
                    RunSpec(
                        suite=workload.suite,
                        workload=workload.name,
                        size=size,
                        backend=backend,
                        mode=mode,
                        dtype=dtype,
                        batch_size=batch or shape.batch_size,
                        seq_len=prompt,
                        gen_len=generated,
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
        last_line = (outcome.stderr_tail.strip().splitlines() or ["no output"])[-1]
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


@dataclass
class SuiteRunner:
    results_dir: Path
    pythons: dict[str, str] = field(default_factory=dict)  # backend -> interpreter for its workers
    tags: dict[str, str] = field(default_factory=dict)
    resume: bool = False
    observer: RunObserver = field(default_factory=_Silent)
    invocation_id: str = field(default_factory=lambda: f"{datetime.now(UTC):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:8]}")
    interrupted: bool = False
    resumed: list[RunSpec] = field(default_factory=list)
    _probes: dict[str, dict[str, Any]] = field(default_factory=dict, init=False, repr=False)
    _writer: store.InvocationWriter | None = field(default=None, init=False, repr=False)

    def python_for(self, backend: str) -> str:
        """The interpreter for ``backend``'s workers: its own entry, else its family's
        (``xla`` covers ``xla-compile``), else this one."""
        family = backend.split("-")[0]
        return self.pythons.get(backend) or self.pythons.get(family) or sys.executable

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

    def _resume_key(self, spec: RunSpec, fact: dict[str, Any]) -> tuple:
        """What a stored ``ok`` row must match for ``--resume`` to skip ``spec``: the run's
        identity, the environment, and the settings that shape the measurement."""
        return (*spec.key(), fingerprint_hash(fact), spec.warmup, spec.steps, json.dumps(self.tags, sort_keys=True))

    def _already_done(self) -> set[tuple]:
        if not self.resume or not Path(self.results_dir).is_dir():
            return set()
        done = store.load_runs(self.results_dir, status="ok")
        columns = [*KEY_FIELDS, "fingerprint", "warmup_min_steps", "measured_steps", "tags"]
        return set(done[columns].itertuples(index=False, name=None))

    def run(self, specs: Sequence[RunSpec]) -> list[dict[str, Any]]:
        """Run ``specs`` in order and return their rows (also written to the store).

        Calling it again on the same runner continues the same invocation and file.
        """
        if self._writer is None:
            self._writer = store.InvocationWriter(self.results_dir, self.invocation_id, datetime.now(UTC))
        probes = self.probe_all([spec.backend for spec in specs])
        facts = {}
        for backend, probe_result in probes.items():
            backend_env = worker_env(get_backend(backend).worker_env)
            facts[backend] = fingerprint(probe_result, backend, backend_env)
        done = self._already_done()
        rows: list[dict[str, Any]] = []
        for index, spec in enumerate(specs):
            fact = facts[spec.backend]
            if self._resume_key(spec, fact) in done:
                self.resumed.append(spec)
                continue
            self.observer.on_start(index, len(specs), spec)
            try:
                row, steps, ops = self._run_one(spec, probes[spec.backend]["backends"][spec.backend], fact)
                self._writer.add(row, steps, ops)
            except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the finished runs are on disk
                self.interrupted = True
                break
            rows.append(row)
            self.observer.on_finish(spec, row)
        return rows

    def _verify(self, spec: RunSpec) -> dict[str, Any]:
        """Compare ``spec``'s outputs with the CPU float32 reference, each computed in its own worker."""
        reference = replace(
            spec,
            backend=verify.REFERENCE_BACKEND,
            dtype=verify.REFERENCE_DTYPE,
            init_dtype=spec.dtype,  # the candidate's very weights, computed in float32
            verify=False,
            profile_steps=0,
            compile_cache=None,
        )
        import torch  # only --verify reads tensors in the parent

        found = {}
        with tempfile.TemporaryDirectory(prefix="tpubench-verify-") as scratch:
            for role, run in (("reference", reference), ("candidate", spec)):
                path = os.path.join(scratch, f"{role}.pt")
                backend = get_backend(run.backend)
                outcome = run_worker(
                    {"kind": "verify", "spec": run.to_json(), "output": path},
                    python=self.python_for(run.backend),
                    env=worker_env(backend.worker_env),
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
        columns = verify.compare(found["reference"], found["candidate"], spec.dtype)
        if columns["verified"] == "mismatch":
            columns["status"] = "mismatch"
            columns["error"] = (
                f"outputs differ from the cpu float32 reference: max relative error "
                f"{columns['max_rel_err']:.3g} (tolerance {columns['verify_tolerance']:g})"
                + ("; generated tokens differ" if columns["tokens_match"] is False else "")
            )
        return columns

    def _run_one(
        self, spec: RunSpec, availability: dict[str, Any], fact: dict[str, Any]
    ) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
        """The run's row, its steps rows and its ops rows (a profiled run's trace, read by the worker)."""
        started_at = datetime.now(UTC)
        if spec.profile_steps:
            spec = replace(spec, trace_dir=str((Path(self.results_dir) / "traces" / spec.run_id).resolve()))
        backend = get_backend(spec.backend)
        if not availability["available"]:
            result = {"status": "unavailable", "error": availability["reason"]}
        else:

            def on_wait(message: str) -> None:
                self.observer.on_event(spec, {"event": "phase", "phase": "wait", "step": 0, "of": 0, "detail": message})

            with devicelock.hold(backend.device_kind, on_wait) as waited:
                started_at = datetime.now(UTC)
                result = backend.run_on_device(  # a TPU waits for its chip, and retries once if busy
                    lambda: classify(
                        run_worker(
                            {"kind": "run", "spec": spec.to_json()},
                            python=self.python_for(spec.backend),
                            env=worker_env(backend.worker_env),
                            timeout_s=spec.timeout_s,
                            on_event=lambda event: self.observer.on_event(spec, event),
                            fork=backend.forkable,
                        ),
                        spec.timeout_s,
                    ),
                    on_wait,
                )
                if spec.verify and result["status"] == "ok":
                    result.update(self._verify(spec))
            result["device_wait_s"] = waited
        steps = [
            {"run_id": spec.run_id, "invocation_id": self.invocation_id, **step} for step in result.pop("steps", [])
        ]
        ops = [{"run_id": spec.run_id, "invocation_id": self.invocation_id, **op} for op in result.pop("ops", [])]
        row = {
            "run_id": spec.run_id,
            "invocation_id": self.invocation_id,
            "started_at": started_at,
            "finished_at": datetime.now(UTC),
            "suite": spec.suite,
            "workload": spec.workload,
            "size": spec.size,
            "backend": spec.backend,
            "device": fact["device"] or None,
            "mode": spec.mode,
            "dtype": spec.dtype,
            "batch_size": spec.batch_size,
            "seq_len": spec.seq_len,
            "gen_len": spec.gen_len,
            "warmup_min_steps": spec.warmup,
            **{
                key: fact[key]
                for key in (
                    "host",
                    "cpu_model",
                    "device_count",
                    "python_executable",
                    "python_version",
                    "torch_version",
                    "tpubench_version",
                    "git_sha",
                )
            },
            "backend_versions": json.dumps(fact["backend_versions"], sort_keys=True),
            "env": json.dumps(fact["env"], sort_keys=True),
            "fingerprint": fingerprint_hash(fact),
            "tags": json.dumps(self.tags, sort_keys=True),
            **result,
        }
        return row, steps, ops
