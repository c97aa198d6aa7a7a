"""The timing protocol: cold first step, warm-up until compilation settles, measured steps.

Runs inside a worker process. Every timed region is bracketed by the backend's timer,
which drains the device before starting and after stopping; nothing inside the loop
reads a value back to the host, so the only synchronisation is the one timing needs.
Within a step, the host time until the step function returns is read apart from the
synchronised time, before the backend's ``after_step`` (XLA's graph cut and launch).

A training step returns its loss as a device tensor; the protocol keeps every step's and
reads them to the host only after the last step's timer and the compile count are read, so
storing the loss adds no synchronisation, and no graph, to any timed region.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from tpubench.backends import Backend
from tpubench.compiles import Capture
from tpubench.compiles.dynamo import describe_stance_error
from tpubench.energy import Reading, Window
from tpubench.hostload import HostLoad
from tpubench.hostmeter import HostLoadMeter
from tpubench.serving.metrics import GenerationTiming
from tpubench.spec import RunSpec
from workloads import Instance

PhaseCallback = Callable[[str, int, int], None]


class RecompileError(RuntimeError):
    """``--fail-on-recompile``: the backend compiled during a measured step. It carries the
    steps timed so far, so that the failed run keeps the compile events that explain it."""

    def __init__(self, message: str, records: list[StepRecord]):
        super().__init__(message)
        self.records = records


@dataclass
class StepRecord:
    step: int
    phase: str  # "first", "warmup" or "measure"
    step_ms: float  # synchronised: the device finished the step
    host_ms: float  # until the step function returned, before the backend's sync
    compile_count: int | None  # cumulative, after the step
    compile_s: float | None = None  # seconds compiled during the step (captured; None: unknown)
    executions: int | None = None  # XLA: graph executions during the step
    host_reads: int | None = None  # XLA: device-to-host transfers during the step
    loss: float | None = None  # train: the loss the step computed (before its update); read after the loop


@dataclass
class Measurement:
    first_step_s: float
    first_step_compiles: int | None  # 0: every graph of the first step came from a compile cache
    warmup_steps: int
    compile_count: int | None  # after warm-up: the graphs a settled run needs
    recompiles_after_warmup: int | None
    compile_s: float | None
    warmup_settled: bool
    records: list[StepRecord] = field(default_factory=list)
    host_load: HostLoad | None = None  # what else the host did during the measured steps
    energy: Reading | None = None  # the energy counter's delta over the measured steps (and any added)

    @property
    def measured_ms(self) -> list[float]:
        return [r.step_ms for r in self.records if r.phase == "measure"]

    @property
    def measured_host_ms(self) -> list[float]:
        return [r.host_ms for r in self.records if r.phase == "measure"]


def make_step(instance: Instance, model: torch.nn.Module, mode: str) -> Callable[[], Any]:
    """One training step (forward, backward, AdamW) or one inference forward under no_grad.

    The inference step returns its output so the caller can keep it alive until the
    device has computed it; the training step returns its loss, detached and unread (a
    device tensor: :func:`run_protocol` reads it after the timed steps).
    A workload with a ``batch_schedule`` gets its n-th batch at its n-th call.
    """
    workload = instance.workload
    next_batch = batch_feed(instance)
    if mode == "train":
        model.train()
        optimizer = torch.optim.AdamW(instance.model.parameters(), lr=1e-4)

        def train_step() -> torch.Tensor:
            loss = workload.loss(model, next_batch())
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            return loss.detach()

        return train_step
    if mode == "infer":
        model.eval()

        def infer_step() -> Any:
            with torch.no_grad():
                return workload.forward(model, next_batch())

        return infer_step
    raise ValueError(f"unknown mode {mode!r}; valid: train, infer")


def batch_feed(instance: Instance) -> Callable[[], Any]:
    """The batch of each call: the instance's own, or, for a workload with a
    ``batch_schedule`` (test workloads that change shape on purpose), one batch per listed
    batch size, built up front on the instance's device, the last one repeated."""
    schedule = instance.workload.batch_schedule
    if not schedule:
        return lambda: instance.batch
    device = next(iter(instance.batch.values())).device
    config = instance.workload.config(instance.size)
    generator = torch.Generator().manual_seed(0)
    make = instance.workload.make_batch
    built = {
        size: {
            key: value.to(device)
            for key, value in make(config, replace(instance.shape, batch_size=size), generator).items()
        }
        for size in dict.fromkeys(schedule)
    }
    calls = iter(range(1 << 62))

    def feed() -> Any:
        return built[schedule[min(next(calls), len(schedule) - 1)]]

    return feed


def make_generation_step(
    instance: Instance,
    model: torch.nn.Module,
    mode: str,
    gen_len: int,
    backend: Backend,
    timings: list[GenerationTiming],
) -> Callable[[], Any]:
    """One prefill (mode ``prefill``) or one whole greedy generation of ``gen_len`` tokens.

    The KV cache is allocated once, at prompt + generated length, and reused: every
    generation overwrites the positions it reads. In ``decode`` mode each token is timed
    on its own with the backend's timer (prefill = TTFT, each decode step = one ITL) and
    appended to ``timings``; the protocol's own timer around the call gives end to end.
    """
    model.eval()
    greedy = instance.greedy(model, instance.seq_len + (gen_len if mode == "decode" else 0))

    def prefill_step() -> torch.Tensor:
        with torch.no_grad():
            return greedy.prefill()

    if mode == "prefill":
        return prefill_step

    def generate() -> torch.Tensor:
        timer = backend.timer()
        with torch.no_grad():
            greedy.reset()
            timer.start()
            token = greedy.prefill()
            backend.after_step()
            timing = GenerationTiming(ttft_ms=timer.stop())
            for _ in range(gen_len - 1):
                timer.start()
                token = greedy.decode(token)
                backend.after_step()
                timing.itl_ms.append(timer.stop())
        timing.e2e_ms = timing.ttft_ms + sum(timing.itl_ms)
        timings.append(timing)
        return token

    return generate


def run_protocol(
    spec: RunSpec,
    backend: Backend,
    step: Callable[[], Any],
    on_phase: PhaseCallback = lambda phase, i, n: None,
    capture: Capture | None = None,
    agree: Callable[[bool], bool] | None = None,
    energy: Window | None = None,
) -> Measurement:
    """Time ``step`` per the protocol in this module's docstring and return every sample.

    ``capture`` (:mod:`tpubench.compiles`) is told of each step before and after its timed
    region, so its bookkeeping is never part of a step's time. ``energy`` (:mod:`tpubench.energy`)
    is opened before the first measured step and closed after the last, with more steps of the
    same kind (untimed) while the window is shorter than its counter needs. With
    ``spec.fail_on_recompile`` a compile during a measured step raises :class:`RecompileError`.
    A train step's output (its loss, a device tensor) is kept and read into ``StepRecord.loss``
    after the final compile count: reading it earlier would sync the device inside the loop.
    """
    timer = backend.timer()
    records: list[StepRecord] = []
    losses: dict[int, Any] = {}  # step -> the train step's unread loss tensor
    keep_loss = spec.mode == "train"

    def timed(phase: str, index: int) -> int | None:
        if capture:
            capture.before_step(index, phase)
        timer.start()
        output = step()  # held until the device is done: a lazy backend skips dead outputs
        host = timer.lap()
        backend.after_step()
        elapsed = timer.stop()
        if keep_loss and isinstance(output, torch.Tensor):
            losses[index] = output
        del output
        backend.step_finished()
        count = backend.compile_count()
        record = StepRecord(index, phase, elapsed, host, count)
        if capture:
            facts = capture.after_step(index, phase)
            record.compile_s, record.executions, record.host_reads = facts.compile_s, facts.executions, facts.host_reads
        records.append(record)
        return count

    before = backend.compile_count()
    on_phase("compile", 0, 1)
    after_first = timed("first", 0)
    first_step_s = records[0].step_ms / 1e3

    changed, previous, warm = after_first != before, after_first, 0
    if agree is not None:
        changed = agree(changed)
    while (warm < spec.warmup or changed) and warm < spec.max_warmup:
        on_phase("warmup", warm, max(spec.warmup, warm + 1))
        warm += 1
        count = timed("warmup", warm)
        changed, previous = count != previous, count
        if agree is not None:
            changed = agree(changed)
    settled_count = previous
    if capture:
        capture.after_warmup(spec.fail_on_recompile)

    meter = HostLoadMeter()
    if energy is not None:  # the device is idle: the last warm-up step's timer drained it
        energy.open()
    for i in range(spec.steps):
        on_phase("measure", i, spec.steps)
        try:
            count = timed("measure", warm + 1 + i)
        except RuntimeError as error:  # Dynamo's fail_on_recompile stance raises from inside the step
            described = describe_stance_error(error) if spec.fail_on_recompile else None
            if described is None:
                raise
            if capture:  # the step's events before the refused compile (its graph breaks), then the refusal
                capture.after_step(warm + 1 + i, "measure")
                capture.compile_refused(warm + 1 + i, "measure", error)
            message = f"compiled after warm-up, at step {warm + 1 + i}: {described}"
            raise RecompileError(message, records) from error
        if spec.fail_on_recompile and count != previous:
            raise RecompileError(recompile_message(warm + 1 + i, capture), records)
        previous = count
    host_load = meter.stop()
    reading = None
    if energy is not None:
        added = 0

        def short() -> bool:  # every rank adds the same steps, or a collective waits forever
            needed = not energy.long_enough()
            return agree(needed) if agree is not None else needed

        while short():
            output = step()
            backend.after_step()
            backend.synchronize()
            del output
            backend.step_finished()
            added += 1
        reading = energy.close(spec.steps + added)

    final_count = backend.compile_count()
    recompiles = None if settled_count is None or final_count is None else final_count - settled_count
    read_losses(records, losses)
    return Measurement(
        first_step_s=first_step_s,
        first_step_compiles=None if before is None or after_first is None else after_first - before,
        warmup_steps=warm,
        compile_count=settled_count,
        recompiles_after_warmup=recompiles,
        compile_s=backend.compile_seconds(),
        warmup_settled=not changed,
        records=records,
        host_load=host_load,
        energy=reading,
    )


def read_losses(records: list[StepRecord], losses: dict[int, Any]) -> None:
    """Each record's loss from the step's kept tensor, read to the host one by one: every
    tensor is already computed (its step's timer drained the device), so each read is a
    transfer, never a graph (a ``torch.stack`` would compile one more on XLA). A rank's loss
    is its own, over its slice of the batch: :func:`tpubench.analysis.steps.job_steps` gives
    the job's, the mean over ranks."""
    for record in records:
        tensor = losses.get(record.step)
        if tensor is not None and tensor.numel() == 1:  # a user's loss that is no scalar is no loss to store
            record.loss = float(tensor.cpu())  # cast on the host: a cast on XLA is a graph


def recompile_message(step: int, capture: Capture | None) -> str:
    """``--fail-on-recompile``'s error: the step, and the compile's cause and line where captured."""
    found = [e for e in (capture.events_so_far() if capture else []) if e.step == step and e.event == "compile"]
    found = [e for e in found if e.cache != "memory_hit"]
    if not found:
        return f"compiled after warm-up, at step {step} (cause not captured)"
    described = "; ".join(
        f"{e.layer} {e.cause or 'unknown'} at {e.source or 'an unknown line'}" + (f" ({e.raw})" if e.raw else "")
        for e in found
    )
    return f"compiled after warm-up, at step {step}: {described}"
