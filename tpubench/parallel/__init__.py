"""Multi-device runs: how a run's devices are laid out, and how each backend family splits
a model over them.

``--parallel`` names the math (dp, fsdp, tp, fsdp_tp); each backend family implements it
with its own idiomatic mechanism, from the workload's one :class:`workloads.ParallelPlan`:

- the process families (cpu, cuda, tpu and their ``-compile`` twins) run N rank processes
  that talk through ``torch.distributed`` (gloo on 127.0.0.1, nccl, TorchTPU's
  ``tpu_dist``), with DDP, FSDP2 and DTensor tensor parallelism (:mod:`.dtensor`); the
  processes themselves are started by :mod:`tpubench.launch.ranks`, a layer above;
- the xla family runs one process over N PJRT devices with SPMD partition specs
  (:mod:`.spmd`): torch_xla's multiprocess mode is the legacy path, and aborts on CPU.

The plan is data the layers above read (backends, the worker, the launcher): this module is
torch-free and imports none of its submodules, so the parent plans and labels runs with it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from tpubench.spec import RunSpec

#: the process families and the ``torch.distributed`` backend their ranks talk through
PROCESS_FAMILIES = {"cpu": "gloo", "cuda": "nccl", "tpu": "tpu_dist"}
#: the families that run one process over all devices with SPMD
SPMD_FAMILIES = {"xla": "xla"}


def family(backend: str) -> str:
    """``cuda-compile`` -> ``cuda``: the backends that share a mechanism."""
    return backend.split("-")[0]


@dataclass(frozen=True)
class Layout:
    """A run's devices as a (data-parallel, tensor-parallel) mesh."""

    devices: int
    parallel: str
    tp: int = 1

    @property
    def dp(self) -> int:
        """The data-parallel degree (dp and fsdp ranks; the fsdp axis of fsdp_tp)."""
        return self.devices // self.tp

    @property
    def mesh(self) -> str | None:
        """``dp=4``, ``fsdp=8``, ``tp=4``, ``fsdp=2,tp=2``; None for one device."""
        if self.parallel == "none":
            return None
        if self.parallel == "fsdp_tp":
            return f"fsdp={self.dp},tp={self.tp}"
        return f"{self.parallel}={self.devices}"


def layout_of(spec: RunSpec) -> Layout:
    return Layout(spec.devices, spec.parallel, spec.tp_size)


def implementation(spec: RunSpec) -> str | None:
    """What carries the plan out (the ``parallel_impl`` column): ``ddp``, ``fsdp2``,
    ``dtensor-tp``, ``fsdp2+dtensor-tp`` or ``xla-spmd``; None for a one-device run."""
    if spec.parallel == "none" or spec.devices == 1:
        return None
    if family(spec.backend) in SPMD_FAMILIES:
        return "xla-spmd"
    return {"dp": "ddp", "fsdp": "fsdp2", "tp": "dtensor-tp", "fsdp_tp": "fsdp2+dtensor-tp"}[spec.parallel]


def comm_backend(spec: RunSpec) -> str | None:
    """How the devices talk (the ``comm_backend`` column); None for a one-device run."""
    if spec.devices == 1:
        return None
    name = family(spec.backend)
    return PROCESS_FAMILIES.get(name) or SPMD_FAMILIES.get(name)


def spec_columns(spec: RunSpec) -> dict[str, Any]:
    """The layout columns a run's spec decides (every row has them, one that failed or was
    refused before measuring too): hosts, what carries the plan out, the mesh, how the
    devices talk, the global batch and each device's share of it."""
    layout = layout_of(spec)
    return {
        "hosts": spec.hosts,
        "parallel_impl": implementation(spec),
        "mesh": layout.mesh,
        "comm_backend": comm_backend(spec),
        "global_batch_size": spec.batch_size,
        "per_device_batch_size": spec.batch_size // layout.dp,
    }


def host_devices(spec: RunSpec) -> int:
    """The devices each host of the run drives (``--devices`` is the total over ``--hosts``)."""
    return spec.devices // spec.hosts


def is_multi_process(spec: RunSpec) -> bool:
    """Whether the run's worker launches rank processes (rather than measuring itself)."""
    return spec.devices > 1 and family(spec.backend) in PROCESS_FAMILIES


def ranks_env() -> dict[str, int] | None:
    """This process's rank, local rank and world size when it is one rank of a multi-device
    run (torchrun's variables, which :mod:`.ranks` sets), else None."""
    if "TPUBENCH_RANK" not in os.environ:
        return None
    return {
        name: int(os.environ[var])
        for name, var in (("rank", "RANK"), ("local_rank", "LOCAL_RANK"), ("world", "WORLD_SIZE"))
    }
