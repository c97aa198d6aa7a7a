"""Test-only workloads for runs over several hosts (tests/test_hosts.py).

Registered through ``TPUBENCH_WORKLOAD_MODULES=host_workloads``, so that every worker and
rank process of every host sees them.

- ``gpt2-losses``: gpt2 whose loss also appends each step's value (this rank's mean over its
  slice of the batch) to ``$TPUBENCH_TEST_LOSSES/<RANK>.jsonl``: a run's timed loop reads no
  loss, and the test compares the job's losses with one device's.
- ``fault-host1-killed``: the first rank of host 1 (``GROUP_RANK``, torchrun's host index)
  kills itself with SIGKILL in its second step, while every other rank waits for it in a
  collective.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
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


WORKLOADS = (
    replace(gpt2.WORKLOAD, name="gpt2-losses", loss=_recording(gpt2.WORKLOAD.loss)),
    replace(gpt2.WORKLOAD, name="fault-host1-killed", loss=_killed_on_host1(gpt2.WORKLOAD.loss)),
)
