"""Test-only workloads that misbehave on purpose, to check the runner's isolation.

Registered through ``TPUBENCH_WORKLOAD_MODULES=fault_workloads`` (see conftest.py), so
every worker process sees them too. Each fault fires while the worker builds the model.
"""

from __future__ import annotations

import ctypes
import os
import signal
import time
from dataclasses import replace

import torch
from torch import nn

from workloads.base import Shape, Workload


class _Linear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)


def _workload(name: str, fault) -> Workload:
    def build_model(config: int) -> nn.Module:
        fault()
        return _Linear()

    return Workload(
        name=name,
        suites=("faults",),
        family="test",
        description=f"test-only: {name}",
        sizes={"tiny": 0},
        default_size="tiny",
        default_shape={"cpu": Shape(2, 1)},
        build_model=build_model,
        make_batch=lambda config, shape, generator: {"x": torch.randn(shape.batch_size, 8, generator=generator)},
        loss=lambda model, batch: model(batch["x"]).square().mean(),
        forward=lambda model, batch: model(batch["x"]),
        flops=lambda config, shape, mode: (6 if mode == "train" else 2) * shape.batch_size * 64.0,
        estimate_memory_bytes=lambda config, shape, mode, dtype: 1024,
    )


def _raise() -> None:
    raise RuntimeError("deliberate failure in build_model")


def _oom() -> None:
    raise MemoryError("deliberate out-of-memory")


def _segfault() -> None:
    ctypes.string_at(0)


def _hang() -> None:
    """Hang; first announce this worker's pid in $TPUBENCH_TEST_PIDFILE (if set), so a
    test can wait for the hang to begin instead of sleeping."""
    if path := os.environ.get("TPUBENCH_TEST_PIDFILE"):
        with open(path + ".tmp", "w") as stream:
            stream.write(str(os.getpid()))
        os.replace(path + ".tmp", path)
    time.sleep(3600)


def _hang_at_exit() -> None:
    """Hang in interpreter teardown, after the result was sent (a runtime stuck in shutdown)."""
    import atexit

    atexit.register(time.sleep, 3600)


def _lose_log() -> None:
    """Remove this worker's scratch folder (its TMPDIR), and the log in it, as happened once to
    a torch_xla run with --profile."""
    import shutil

    shutil.rmtree(os.environ["TMPDIR"])


def _lose_log_and_abort() -> None:
    _lose_log()
    os.abort()


def _slow() -> None:
    time.sleep(float(os.environ.get("TPUBENCH_TEST_SLOW_S", "3")))


WORKLOADS = (
    _workload("fault-ok", lambda: None),
    _workload("fault-abort", os.abort),
    _workload("fault-segfault", _segfault),
    _workload("fault-raise", _raise),
    _workload("fault-oom", _oom),
    _workload("fault-hang", _hang),
    _workload("fault-hang-at-exit", _hang_at_exit),
    _workload("fault-slow", _slow),
    _workload("fault-lose-log", _lose_log),
    _workload("fault-lose-log-abort", _lose_log_and_abort),
)


def _bincount_loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """A loss through ``torch.bincount``, which XLA cannot lower: it falls back to the CPU."""
    counts = torch.bincount(batch["ids"], minlength=8).to(batch["x"].dtype)
    return (model(batch["x"]) * counts).square().mean()


FALLBACK = Workload(
    name="xla-fallback",
    suites=("faults",),
    family="test",
    description="test-only: uses torch.bincount",
    sizes={"tiny": 0},
    default_size="tiny",
    default_shape={"cpu": Shape(8, 1)},
    build_model=lambda config: _Linear(),
    make_batch=lambda config, shape, generator: {
        "x": torch.randn(shape.batch_size, 8, generator=generator),
        "ids": torch.randint(0, 8, (shape.batch_size,), generator=generator),
    },
    loss=_bincount_loss,
    forward=lambda model, batch: _bincount_loss(model, batch),
    flops=lambda config, shape, mode: (6 if mode == "train" else 2) * shape.batch_size * 64.0,
    estimate_memory_bytes=lambda config, shape, mode, dtype: 1024,
)

WORKLOADS = (*WORKLOADS, FALLBACK)


def _force_tpu_init() -> None:
    """What any worker does that brings TorchTPU's runtime up: on a host with no chip, the
    library itself aborts (SIGABRT). TPU_SKIP_MDS_QUERY=1 keeps it from polling the cloud
    metadata server for minutes first."""
    os.environ["TPU_SKIP_MDS_QUERY"] = "1"
    import torch_tpu._loader

    torch_tpu._loader._init_device("tpu")
    torch.zeros(1, device="tpu")


def _report_environment() -> None:
    """Write what this worker's torch looks like to $TPUBENCH_TEST_REPORT (a JSON file)."""
    import json

    import torch._dynamo

    report = {
        "autoload": os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD"),
        "allow_rnn": torch._dynamo.config.allow_rnn,
        "trace_autograd_ops": getattr(torch._dynamo.config, "trace_autograd_ops", None),
        "has_torch_tpu_module": hasattr(torch, "tpu"),
        "tpu_compile_backend": "tpu" in torch._dynamo.list_backends(),
    }
    with open(os.environ["TPUBENCH_TEST_REPORT"], "w") as stream:
        json.dump(report, stream)


WORKLOADS = (*WORKLOADS, _workload("tpu-force-init", _force_tpu_init), _workload("env-report", _report_environment))


def _on_rank_one_at_second_step(fault):
    """A workload whose rank 1 (of a multi-device run) faults in its second step, while its
    peers wait for it in a collective; other ranks and one-device runs never fault."""
    calls = iter(range(1 << 30))

    def loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        if os.environ.get("RANK") == "1" and next(calls) == 1:
            fault()
        return model(batch["x"]).square().mean()

    return loss


def _rank_workload(name: str, fault) -> Workload:
    return replace(_workload(name, lambda: None), loss=_on_rank_one_at_second_step(fault))


def _raise_in_step() -> None:
    raise RuntimeError("deliberate failure on rank 1")


def _kill_in_step() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


WORKLOADS = (
    *WORKLOADS,
    _rank_workload("fault-rank1-raise", _raise_in_step),
    _rank_workload("fault-rank1-killed", _kill_in_step),
)
