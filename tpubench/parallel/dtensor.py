"""The process families' mechanism: one rank per device, ``torch.distributed``.

Each rank built the whole model from the one seed on its own device (so every rank starts
from the same weights, as a checkpoint load would give it) and the whole global batch;
:func:`apply` then wraps or shards the model the way ``--parallel`` says and keeps the
rank's slice of the batch:

- dp: ``DistributedDataParallel``; every rank holds the whole model;
- fsdp: FSDP2 ``fully_shard`` on each of the plan's units, then on the root (a workload
  without a plan: the root only, one unit);
- tp: DTensor ``parallelize_module`` with the plan's colwise/rowwise layers; every rank
  takes the whole batch;
- fsdp_tp: TP on the mesh's ``tp`` axis, then ``fully_shard`` on its ``dp`` axis.

The same code serves gloo (cpu), nccl (cuda) and TorchTPU's ``tpu_dist``. Every rank does
the same device work in the same order: nothing here is guarded by ``if rank == 0``
(TorchTPU's mesh deadlocks on a rank-0-only materialising op).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn

from tpubench.parallel import PROCESS_FAMILIES, Layout, family, layout_of, ranks_env
from tpubench.spec import RunSpec
from workloads import ParallelPlan

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from tpubench.backends import Backend
    from workloads import Instance

#: a collective that waits longer than this share of the run's timeout raises (a peer died or
#: hangs): the rank's row then says so, before the runner's timeout kills the whole run
COLLECTIVE_TIMEOUT_SHARE = 0.5


def collective_timeout(spec: RunSpec) -> timedelta:
    """How long a rank waits in a collective (and at the rendezvous): shorter than the run."""
    return timedelta(seconds=spec.timeout_s * COLLECTIVE_TIMEOUT_SHARE)


def init_process_group(spec: RunSpec, backend: Backend) -> None:
    """Join this run's process group (once per process), talking through the family's
    communication backend on the rank's device; torchrun's variables say who is where."""
    if dist.is_initialized():
        return
    name = PROCESS_FAMILIES[family(spec.backend)]
    device = backend.device()
    # nccl binds the group to the rank's GPU up front (else it guesses from the rank number)
    device_id = device if device.type == "cuda" else None
    dist.init_process_group(name, timeout=collective_timeout(spec), device_id=device_id)


def device_mesh(layout: Layout, device: torch.device) -> DeviceMesh:
    """The run's mesh: 1-D for fsdp (``dp``) and tp (``tp``), (dp, tp) for fsdp_tp, where rank
    r sits at (r // tp, r % tp). Each axis is a process group of its own."""
    from torch.distributed.device_mesh import init_device_mesh

    if layout.parallel == "fsdp_tp":
        return init_device_mesh(device.type, (layout.dp, layout.tp), mesh_dim_names=("dp", "tp"))
    axis = "tp" if layout.parallel == "tp" else "dp"
    return init_device_mesh(device.type, (layout.devices,), mesh_dim_names=(axis,))


def apply(spec: RunSpec, backend: Backend, instance: Instance) -> Instance:
    """``instance`` split over the run's ranks: its model wrapped or sharded, its batch (and
    shape) this rank's slice, and its ``tp_size`` the degree its layers were split over."""
    if ranks_env() is None:
        raise RuntimeError("a multi-device run of a process family measures in rank processes (tpubench.launch.ranks)")
    layout = layout_of(spec)
    if spec.parallel == "tp" and layout.tp != spec.devices:
        raise ValueError(f"a tp run's tensor-parallel degree is its devices ({spec.devices}), not {layout.tp}")
    init_process_group(spec, backend)
    if dist.get_world_size() != spec.devices:
        raise RuntimeError(f"the process group has {dist.get_world_size()} ranks, the run {spec.devices} devices")
    plan = instance.workload.parallel
    model = instance.model
    if spec.parallel == "dp":  # no mesh: DDP all-reduces gradients over the default group
        from torch.nn.parallel import DistributedDataParallel

        model, dp_rank = DistributedDataParallel(model), dist.get_rank()
    else:
        mesh = device_mesh(layout, backend.device())
        if spec.parallel in ("tp", "fsdp_tp"):
            if plan is None or not plan.tp:
                raise ValueError(f"workload {instance.workload.name!r} has no tensor-parallel plan")
            tensor_parallel(model, plan, mesh["tp"])
        if spec.parallel in ("fsdp", "fsdp_tp"):
            fully_shard(model, plan, mesh["dp"])
        dp_rank = mesh["dp"].get_local_rank() if layout.dp > 1 else 0
    batch = {key: value.chunk(layout.dp)[dp_rank] for key, value in instance.batch.items()}
    shape = replace(instance.shape, batch_size=next(iter(batch.values())).shape[0])
    return replace(instance, model=model, batch=batch, shape=shape, tp_size=layout.tp)


def tensor_parallel(model: nn.Module, plan: ParallelPlan, mesh: DeviceMesh) -> None:
    """DTensor tensor parallelism from the plan: colwise layers split their output features,
    rowwise ones their input features and all-reduce their output."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
    layers = {name: styles[style]() for pattern, style in plan.tp.items() for name, _ in plan.modules(model, [pattern])}
    if not layers:
        raise ValueError(f"the tensor-parallel plan {dict(plan.tp)} matches no module of the model")
    parallelize_module(model, mesh, layers)


def fully_shard(model: nn.Module, plan: ParallelPlan | None, mesh: DeviceMesh) -> None:
    """FSDP2: each unit of the plan sharded on its own (its parameters gathered just before
    it runs and freed after), then the root, which takes every parameter left."""
    from torch.distributed.fsdp import fully_shard as shard

    for _, unit in plan.modules(model, plan.fsdp_units) if plan else ():
        shard(unit, mesh=mesh)
    shard(model, mesh=mesh)


def local_parameter_count(model: nn.Module) -> int:
    """The parameter elements this rank holds (a DTensor's local shard), each tensor once."""
    return sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel() for p in model.parameters())


def finish() -> None:
    """Leave the process group, once the rank is done with collectives."""
    if dist.is_initialized():
        dist.destroy_process_group()


def any_rank(changed: bool) -> bool:
    """Whether ``changed`` holds on any rank (``run_protocol``'s ``agree``): all ranks then
    take another warm-up step together. Every rank calls it at the same point."""
    flag = torch.tensor([int(changed)], device=collective_device())
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def collective_device() -> torch.device:
    """Where the default group's collectives take their tensors: the rank's GPU for nccl,
    its accelerator for TorchTPU, the host for gloo."""
    name = dist.get_backend()
    if name == "gloo":
        return torch.device("cpu")
    if name == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    accelerator = torch.accelerator.current_accelerator()
    return accelerator if accelerator is not None else torch.device("cpu")
