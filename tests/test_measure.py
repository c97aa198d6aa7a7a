"""The timing protocol: first step apart, warm-up until compilation settles, raw samples kept.

The backend here is a test double whose compile count follows a script: that count is
the protocol's input, and the protocol (not the backend) is what is under test.
"""

from __future__ import annotations

import time
from typing import ClassVar

import torch

from tpubench.backends import StepTimer
from tpubench.backends.cpu import CpuBackend
from tpubench.measure import make_step, run_protocol
from tpubench.spec import RunSpec
from workloads import load


class ScriptedCompiles(CpuBackend):
    """Reports compile counts from a script, one entry per completed step."""

    def __init__(self, counts: list[int]):
        self.counts, self.calls, self.steps = counts, 0, 0

    def timer(self) -> StepTimer:
        backend = self

        class Counting(StepTimer):
            def stop(self) -> float:
                backend.steps += 1
                return super().stop()

        return Counting(self.synchronize)

    def compile_count(self) -> int:
        return self.counts[min(self.steps, len(self.counts) - 1)]


def spec(**overrides) -> RunSpec:
    fields = dict(
        suite="llm",
        workload="gpt2",
        size="tiny",
        backend="cpu",
        mode="infer",
        dtype="float32",
        batch_size=2,
        seq_len=8,
        warmup=2,
        steps=4,
    )
    return RunSpec(**{**fields, **overrides})


def test_warmup_runs_until_the_compile_count_stops_changing() -> None:
    # before, then after the first step and each following step: compiles on steps 1..4
    backend = ScriptedCompiles([0, 1, 2, 3, 4, 4, 4, 4, 4, 4, 4, 4])
    measured = run_protocol(spec(), backend, lambda: None)
    phases = [r.phase for r in measured.records]
    assert phases == ["first"] + ["warmup"] * 4 + ["measure"] * 4
    assert measured.compile_count == 4 and measured.recompiles_after_warmup == 0
    assert measured.warmup_settled


def test_at_least_the_requested_warmup_when_nothing_compiles() -> None:
    measured = run_protocol(spec(warmup=3), ScriptedCompiles([0]), lambda: None)
    assert measured.warmup_steps == 3 and len(measured.measured_ms) == 4


def test_recompiles_after_warmup_are_counted() -> None:
    counts = [0, 1, 1, 1, 2, 3, 3, 3]  # settles after warm-up, then compiles twice while measured
    measured = run_protocol(spec(warmup=2, steps=4), ScriptedCompiles(counts), lambda: None)
    assert measured.compile_count == 1
    assert measured.recompiles_after_warmup == 2


def test_warmup_gives_up_after_max_warmup() -> None:
    measured = run_protocol(spec(max_warmup=5), ScriptedCompiles(list(range(100))), lambda: None)
    assert measured.warmup_steps == 5 and not measured.warmup_settled


def test_first_step_is_timed_alone_and_samples_are_raw() -> None:
    delays = iter([0.2])  # only the first (cold) step is slow

    def step() -> None:
        time.sleep(next(delays, 0.0))

    measured = run_protocol(spec(warmup=1, steps=3), ScriptedCompiles([0]), step)
    assert measured.first_step_s >= 0.2
    assert len(measured.measured_ms) == 3 and all(ms < 100 for ms in measured.measured_ms)
    assert [r.phase for r in measured.records] == ["first", "warmup", "measure", "measure", "measure"]


def test_train_step_updates_the_weights_and_infer_does_not() -> None:
    instance = load("gpt2", "tiny", batch_size=2, seq_len=8)
    before = instance.model.lm_head.weight.detach().clone()
    make_step(instance, instance.model, "infer")()
    assert torch.equal(before, instance.model.lm_head.weight)
    make_step(instance, instance.model, "train")()
    assert not torch.equal(before, instance.model.lm_head.weight)


def test_first_step_compiles_tells_a_warm_first_step_from_a_cold_one() -> None:
    cold = run_protocol(spec(), ScriptedCompiles([0, 3, 3, 3, 3]), lambda: None)
    warm = run_protocol(spec(), ScriptedCompiles([2]), lambda: None)  # graphs already there: a cache served them
    assert (cold.first_step_compiles, warm.first_step_compiles) == (3, 0)


class Watched(torch.Tensor):
    """A loss whose reads to the host are logged: the protocol may read it only after the
    last timed step and the final compile count."""

    log: ClassVar[list[str]] = []

    def cpu(self, *args, **kwargs) -> torch.Tensor:
        Watched.log.append("read")
        return self.as_subclass(torch.Tensor).cpu(*args, **kwargs)


class Logged(ScriptedCompiles):
    def timer(self) -> StepTimer:
        timer = super().timer()
        stop = timer.stop

        def logged_stop() -> float:
            Watched.log.append("stop")
            return stop()

        timer.stop = logged_stop
        return timer

    def compile_count(self) -> int:
        Watched.log.append("count")
        return super().compile_count()


def test_a_train_steps_loss_is_stored_and_read_only_after_the_timed_steps() -> None:
    Watched.log = []
    values = iter(range(100))

    def train_step() -> torch.Tensor:
        return torch.tensor(float(next(values))).as_subclass(Watched)

    measured = run_protocol(spec(mode="train", warmup=1, steps=3), Logged([0]), train_step)
    assert [r.loss for r in measured.records] == [0.0, 1.0, 2.0, 3.0, 4.0]  # every step's, by step
    reads = [i for i, event in enumerate(Watched.log) if event == "read"]
    last_timed = max(i for i, event in enumerate(Watched.log) if event in ("stop", "count"))
    assert len(reads) == 5 and min(reads) > last_timed, Watched.log
    inferred = run_protocol(spec(mode="infer", warmup=1, steps=2), Logged([0]), train_step)
    assert all(r.loss is None for r in inferred.records)  # an output that is no loss is not stored


def test_the_train_step_returns_its_loss_before_the_update() -> None:
    instance = load("gpt2", "tiny", batch_size=2, seq_len=8)
    expected = instance.workload.loss(instance.model, instance.batch).item()
    step = make_step(instance, instance.model, "train")
    first, second = step(), step()
    assert first.item() == expected and not first.requires_grad and second.item() < first.item()
