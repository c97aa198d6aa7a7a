"""Collective ceilings on torch_xla: XLA's own collectives over N PJRT devices, under SPMD.

torch_xla's multi-device path is one process over all its devices (:mod:`tpubench.parallel.spmd`;
its multiprocess mode is legacy and aborts on PJRT CPU), so a collective sweep is one worker
in SPMD mode (``XlaBackend.setup`` turns it on for a group of more than one device;
``CPU_NUM_DEVICES=N`` virtual devices on PJRT CPU, N chips on a TPU host) over a 1-D mesh of
the group. Each device holds nccl-tests' buffer of S bytes (all-gather: its S/n part of the
output; reduce-scatter: the whole input), and each operation is XLA's collective on it:

- ``all_reduce``, ``reduce_scatter`` and ``all_gather`` in a manual-sharding region
  (``xs.enable_manual_sharding``, as ``shard_map`` is in JAX), with the SPMD collectives
  (``_xla_spmd_all_reduce``, ``_xla_spmd_reduce_scatter``, ``xm.all_gather`` with a channel
  and global device ids) over the whole group;
- ``all_to_all`` as GSPMD's resharding of an (n, n, S/n) array from dimension 0 to dimension
  1 and back, which the partitioner lowers to one all-to-all each way (torch_xla's
  ``xm.all_to_all`` has no channel, so it is cross-replica and refused under SPMD);
- ``broadcast`` as torch_xla runs it: ``xm.collective_broadcast`` (and ``dist.broadcast`` on
  XLA) multiplies the tensor by a device-data scale, 1 on the root and 0 elsewhere, and
  all-reduces it. SPMD has no root device and no per-device ordinal, so the scale is a
  ``(n, 1)`` array sharded over the group, 1 in the root's row: in the manual-sharding region
  each device multiplies its block by its own scale, then the all-reduce. Its rate is the
  broadcast's (busbw factor 1, nccl-tests'), and it costs what an all-reduce costs: what a
  torch_xla user's broadcast costs.

A timed sample is :data:`~tpubench.ceilings.device.GRAPH_REPS` operations traced into one
graph (the host's tracing and dispatch divided by their number), between the backend's
``wait_device_ops`` on both sides. Each operation takes the one before's output as its
input (all-reduce and all-to-all: all of it; all-gather: the first S/n of it; reduce-scatter:
written into the first S/n of the next input), so XLA can neither merge two nor run them at
once: they are in sequence, as nccl-tests' iterations on one stream. What the chaining adds
(an S/n slice or write per operation, and for reduce-scatter one copy of the S-byte input per
sample) is local memory traffic, not counted in S. The rows' rates are bus bandwidth by
:mod:`tpubench.analysis.collectives`' factors, as for the process families.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from tpubench.ceilings import ITEMSIZE, CeilingSpec
from tpubench.ceilings.collective import bandwidth_columns, walk_sizes
from tpubench.ceilings.device import DeviceFacts
from tpubench.ceilings.timing import Samples, sample

#: the collectives measured under SPMD, in the order of :data:`tpubench.ceilings.COLLECTIVES`
SPMD_COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")
#: the root of a broadcast: the first device of the group
ROOT = 0
#: the mesh's one axis: the whole group
AXIS = "group"


def sharded_zeros(shape: tuple[int, ...], dtype: torch.dtype, mesh: Any, partition: tuple[str | None, ...]) -> Any:
    """A device array of zeros split over the group by ``partition``, materialised before the
    sweep times anything (device data, not a constant XLA could fold into the graph)."""
    import torch_xla
    import torch_xla.distributed.spmd as xs

    tensor = torch.zeros(shape, dtype=dtype).to(torch_xla.device())
    xs.mark_sharding(tensor, mesh, partition)
    torch_xla.sync()
    return tensor


def operation(op: str, size: int, dtype: torch.dtype, itemsize: int, world: int, reps: int) -> Callable[[], Any]:
    """``reps`` chained ``op`` over messages of ``size`` bytes (nccl-tests' S) on each of the
    ``world`` devices, traced into the current graph: a function of no arguments returning the
    last output (the backend's ``after_step`` then runs the graph)."""
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.distributed.spmd as xs

    mesh = xs.Mesh(np.arange(world), (world,), (AXIS,))
    groups = [list(range(world))]
    elements = size // itemsize
    if op == "all_to_all":
        # each device holds (1, n, S/n) of it, S bytes; resharded on dimension 1 it holds (n, 1, S/n)
        whole = sharded_zeros((world, world, elements // world), dtype, mesh, (AXIS, None, None))

        def all_to_all() -> Any:
            current = whole
            for index in range(reps):
                spec = (None, AXIS, None) if index % 2 == 0 else (AXIS, None, None)
                current = xs.annotate_custom_sharding(current.clone(), mesh, spec).global_tensor
            return current

        return all_to_all

    # manual sharding: each device's (rows, columns) block is its local tensor
    rows, columns = {"all_gather": (1, elements // world), "reduce_scatter": (world, elements // world)}.get(
        op, (1, elements)
    )
    whole = sharded_zeros((world * rows, columns), dtype, mesh, (AXIS, None))
    first = torch.zeros(1, dtype=torch.long).to(torch_xla.device())  # the row reduce-scatter writes into
    scale = None
    if op == "broadcast":  # its scale, device data as collective_broadcast's is: each device's row, 1 on the root
        scale = sharded_zeros((world, 1), dtype, mesh, (AXIS, None))
        scale[ROOT] = 1
        torch_xla.sync()

    def collective(local: Any, channel: int, local_scale: Any) -> Any:
        if op == "all_reduce":
            return torch_xla._XLAC._xla_spmd_all_reduce(xm.REDUCE_SUM, local, 1.0, groups)
        if op == "broadcast":  # local_scale: this device's row of the scale
            return torch_xla._XLAC._xla_spmd_all_reduce(xm.REDUCE_SUM, local * local_scale, 1.0, groups)
        if op == "reduce_scatter":
            return torch_xla._XLAC._xla_spmd_reduce_scatter(xm.REDUCE_SUM, local, 1.0, 0, world, groups)
        return xm.all_gather(
            local, dim=1, groups=groups, pin_layout=False, channel_id=channel, use_global_device_ids=True
        )

    def chained() -> Any:
        local = xs.enable_manual_sharding(whole, (AXIS, None), mesh=mesh).global_tensor
        local_scale = None if scale is None else xs.enable_manual_sharding(scale, (AXIS, None), mesh=mesh).global_tensor
        output = local
        for index in range(reps):
            output = collective(local, index + 1, local_scale)
            if op in ("all_reduce", "broadcast"):
                local = output
            elif op == "all_gather":
                local = output[:, :columns]
            else:  # reduce_scatter: its S/n output into the next input's first row
                local = local.index_copy(0, first, output)
        full = (world * output.shape[0], output.shape[1])
        return xs.disable_manual_sharding(output, (AXIS, None), full, mesh=mesh).global_tensor

    return chained


def measure(spec: CeilingSpec, facts: DeviceFacts, notes: list[str]) -> list[dict[str, Any]]:
    """Every SPMD collective at every message size over the worker's group of devices."""
    import torch_xla.runtime as xr

    world = xr.global_runtime_device_count()
    if world != spec.devices:
        raise RuntimeError(f"a group of {spec.devices} asked for, torch_xla sees {world} devices")
    torch_dtype, itemsize = getattr(torch, spec.dtypes[0]), ITEMSIZE[spec.dtypes[0]]
    notes.append(
        f"collective: broadcast is torch_xla's collective_broadcast, an all-reduce of the tensor scaled "
        f"by 1 on device {ROOT} and 0 elsewhere: it costs an all-reduce"
    )

    def timed_point(op: str, size: int) -> Samples:
        run = operation(op, size, torch_dtype, itemsize, world, facts.reps)
        return sample(run, facts.backend, spec.sweep, reps=facts.reps)

    def measured(op: str, size: int, timed: Samples) -> dict[str, Any]:
        return bandwidth_columns(op, world, size, timed)

    return walk_sizes(SPMD_COLLECTIVES, spec, facts, notes, timed_point, measured)
