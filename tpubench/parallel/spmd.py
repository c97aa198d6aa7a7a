"""The xla family's multi-device runs: one process over N PJRT devices, with GSPMD.

torch_xla's SPMD mode (``xr.use_spmd()``, turned on by ``XlaBackend.setup`` before any XLA
tensor exists) makes the process see one virtual device. We annotate tensors with
partition specs over a mesh, and XLA's partitioner splits each step's graph over the
devices and inserts the collectives. The model code stays the same: the partitioner
reshards around reshapes, so neither gpt2's fused ``qkv`` nor llama3's global head count
needs to change, as they must for DTensor (tests/test_spmd.py checks the losses and tokens).

The mesh is ``(dp, tp)`` with axes ``("fsdp", "tp")``, one layout for every plan:

- ``dp``: the batch's dim 0 on "fsdp" (an ``(N, 1)`` mesh); every weight replicated, so
  the partitioner all-reduces the gradients.
- ``fsdp``: as dp, plus every parameter's dim 0 on "fsdp". FSDP2 wraps the plan's units
  and then the root, which takes every parameter the units left, so every parameter ends
  up sharded whether or not the workload has a plan; the units only group FSDP2's
  all-gathers, and under GSPMD XLA schedules those itself. A parameter whose dim 0 the
  degree does not divide stays replicated (XLA would pad it).
- ``tp``: the plan's column-wise ``nn.Linear`` weights ``("tp", None)`` and their biases
  ``("tp",)``, row-wise weights ``(None, "tp")`` (Megatron's split, as DTensor's
  ``ColwiseParallel``/``RowwiseParallel``); the batch replicated (a ``(1, N)`` mesh).
- ``fsdp_tp``: both: column-wise ``("tp", "fsdp")``, row-wise ``("fsdp", "tp")``, every
  other parameter's dim 0 on "fsdp", the batch on "fsdp".

:func:`partition_specs` is torch_xla-free, so the layout is checked without a device.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tpubench.parallel import layout_of
from tpubench.spec import RunSpec

if TYPE_CHECKING:
    import torch
    from torch import nn

    from tpubench.backends import Backend
    from workloads import Instance, ParallelPlan

#: the mesh's axis names: data (and FSDP) parallel, then tensor parallel
AXES = ("fsdp", "tp")

PartitionSpec = tuple[str | None, ...]


def mesh_shape(spec: RunSpec) -> tuple[int, int]:
    """``(dp, tp)``: ``(N, 1)`` for dp and fsdp, ``(1, N)`` for tp, ``(N / K, K)`` for fsdp_tp."""
    layout = layout_of(spec)
    if spec.parallel == "tp":
        return 1, spec.devices
    if spec.parallel in ("dp", "fsdp"):
        return spec.devices, 1
    if spec.devices % layout.tp:
        raise ValueError(f"tp degree {layout.tp} does not divide {spec.devices} devices")
    return layout.dp, layout.tp


def tp_styles(model: nn.Module, plan: ParallelPlan) -> dict[str, str]:
    """The plan's ``colwise``/``rowwise`` style of each module it names, by module name.

    A glob that names no module, or a module that is not an ``nn.Linear``, is the plan's
    error, raised rather than run as a silently replicated model.
    """
    from torch import nn

    styles: dict[str, str] = {}
    for pattern, style in plan.tp.items():
        if style not in ("colwise", "rowwise"):
            raise ValueError(f"tensor-parallel style {style!r} for {pattern!r}; valid: colwise, rowwise")
        matched = plan.modules(model, [pattern])
        if not matched:
            raise ValueError(f"the parallel plan's {pattern!r} names no module of {type(model).__name__}")
        for name, module in matched:
            if not isinstance(module, nn.Linear):
                raise ValueError(f"the parallel plan's {pattern!r} names {name}, a {type(module).__name__}")
            if styles.setdefault(name, style) != style:
                raise ValueError(f"the parallel plan makes {name} both {styles[name]} and {style}")
    return styles


def partition_specs(
    model: nn.Module, plan: ParallelPlan | None, parallel: str, dp: int, tp: int
) -> dict[str, PartitionSpec]:
    """The partition spec of each sharded parameter, by parameter name; the rest replicate.

    See the module docstring for the layout of each plan. A tied weight is one parameter,
    named once (``named_parameters`` removes duplicates), so it is annotated once.
    """
    styles = tp_styles(model, plan) if parallel in ("tp", "fsdp_tp") and plan is not None else {}
    if parallel in ("tp", "fsdp_tp") and not styles:
        raise ValueError(f"--parallel {parallel} needs the workload's tensor-parallel plan, and it has none")
    sharded_fsdp = parallel in ("fsdp", "fsdp_tp")
    specs: dict[str, PartitionSpec] = {}
    for name, param in model.named_parameters():
        module, _, kind = name.rpartition(".")
        style = styles.get(module)
        fsdp = "fsdp" if sharded_fsdp else None
        if style == "colwise":
            specs[name] = ("tp", fsdp) if kind == "weight" else ("tp",)
        elif style == "rowwise" and kind == "weight":
            specs[name] = (fsdp, "tp")
        elif sharded_fsdp and param.dim() >= 1 and param.shape[0] % dp == 0:
            specs[name] = ("fsdp", *(None,) * (param.dim() - 1))
    return specs


def input_spec(tensor: torch.Tensor, dp: int) -> PartitionSpec | None:
    """The batch's dim 0 on "fsdp" when the mesh has data-parallel devices; None: replicated."""
    if dp == 1 or tensor.dim() == 0:
        return None
    if tensor.shape[0] % dp:
        raise ValueError(f"the global batch of {tensor.shape[0]} does not split over {dp} data-parallel devices")
    return ("fsdp", *(None,) * (tensor.dim() - 1))


def apply(spec: RunSpec, backend: Backend, instance: Instance) -> Instance:
    """Annotate ``instance``'s parameters and batch in place with their partition specs on
    a ``(dp, tp)`` mesh of all the process's devices, and return it.

    The optimizer is made after this (``make_step``), from the same annotated parameters,
    so its state takes their shardings at the first step.
    """
    import numpy as np
    import torch_xla.distributed.spmd as xs
    import torch_xla.runtime as xr

    if not xr.is_spmd():
        raise RuntimeError("XLA SPMD is off: XlaBackend.setup turns it on for a multi-device run")
    found = xr.global_runtime_device_count()
    if found != spec.devices:
        raise RuntimeError(f"{spec.devices} devices asked for, torch_xla sees {found} (CPU_NUM_DEVICES on PJRT CPU)")
    dp, tp = mesh_shape(spec)
    mesh = xs.Mesh(np.arange(spec.devices), (dp, tp), AXES)
    params = dict(instance.model.named_parameters())
    for name, partition in partition_specs(instance.model, instance.workload.parallel, spec.parallel, dp, tp).items():
        xs.mark_sharding(params[name], mesh, partition)
    for tensor in instance.batch.values():
        if (partition := input_spec(tensor, dp)) is not None:
            xs.mark_sharding(tensor, mesh, partition)
    return instance
