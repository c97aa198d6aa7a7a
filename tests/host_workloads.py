"""Test-only workloads for runs over several hosts (tests/test_hosts.py).

Registered through ``TPUBENCH_WORKLOAD_MODULES=host_workloads``, so that every worker and
rank process of every host sees them.

- ``gpt2-losses``: gpt2 whose loss also appends each step's value (this rank's mean over its
  slice of the batch) to ``$TPUBENCH_TEST_LOSSES/<RANK>.jsonl``: a run's timed loop reads no
  loss, and the test compares the job's losses with one device's.
- ``fault-host1-killed``: the first rank of host 1 (``GROUP_RANK``, torchrun's host index)
  kills itself with SIGKILL in its second step, while every other rank waits for it in a
  collective.
- ``gpt2-gated``: gpt2 whose every rank, at its first loss (its process group up, the run
  started on every host), writes ``$TPUBENCH_TEST_GATE/reached-<RANK>`` and waits for
  ``$TPUBENCH_TEST_GATE/open``: a test then does something to a run known to be under way.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import time
from dataclasses import replace
from pathlib import Path

import torch

from workloads.llm import gpt2


def _recording(loss):
    def record(model, batch) -> torch.Tensor:
        value = loss(model, batch)
        folder = os.environ.get("TPUBENCH_TEST_LOSSES")
        if folder:
            with open(Path(folder) / f"{os.environ.get('RANK', 'solo')}.jsonl", "a") as out:
                out.write(json.dumps(value.item()) + "\n")
        return value

    return record


def _killed_on_host1(loss):
    calls = itertools.count()

    def killed(model, batch) -> torch.Tensor:
        if os.environ.get("GROUP_RANK") == "1" and os.environ.get("LOCAL_RANK") == "0" and next(calls) == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        return loss(model, batch)

    return killed


def _gated(loss):
    def gated(model, batch) -> torch.Tensor:
        gate = Path(os.environ["TPUBENCH_TEST_GATE"])
        (gate / f"reached-{os.environ.get('RANK', 'solo')}").touch()
        while not (gate / "open").exists():  # the test's event; the run's timeout bounds the wait
            time.sleep(0.05)
        return loss(model, batch)

    return gated


def job_losses(folder: Path) -> list[float]:
    """Per step, the mean of the ranks' recorded losses (equal slices: the global batch's loss)."""
    per_rank = [[json.loads(line) for line in path.read_text().splitlines()] for path in sorted(folder.glob("*.jsonl"))]
    assert per_rank and len({len(values) for values in per_rank}) == 1, [len(values) for values in per_rank]
    return [sum(step) / len(step) for step in zip(*per_rank, strict=True)]


def one_device_losses(steps: int, global_batch: int, seq_len: int = 32) -> list[float]:
    """gpt2 tiny trained ``steps`` steps on one device in this process, on the global batch:
    the worker's own step (tpubench.measure.make_step) on the model and batch it builds."""
    from tpubench.measure import make_step
    from workloads.base import Shape, build

    workload = WORKLOADS[0]  # records nothing where TPUBENCH_TEST_LOSSES is not set
    instance = build(workload, "tiny", device="cpu", shape=Shape(batch_size=global_batch, seq_len=seq_len))
    step = make_step(instance, instance.model, "train")
    found = []
    for _ in range(steps):  # each step's loss is the model's before that step's update
        found.append(workload.loss(instance.model, instance.batch).item())
        step()
    return found


WORKLOADS = (
    replace(gpt2.WORKLOAD, name="gpt2-losses", loss=_recording(gpt2.WORKLOAD.loss)),
    replace(gpt2.WORKLOAD, name="fault-host1-killed", loss=_killed_on_host1(gpt2.WORKLOAD.loss)),
    replace(gpt2.WORKLOAD, name="gpt2-gated", loss=_gated(gpt2.WORKLOAD.loss)),
)
