"""Planning a multi-device run: the layouts ``--devices``/``--parallel``/``--tp`` ask for, the
global batch each scaling gives, and the degrees a workload cannot take.

Every check here runs in the parent, before anything runs, and raises ``ValueError`` with one
line that names the valid choices (the CLI prints it as ``error:`` and exits 2): a degree that
does not divide a model's heads or a batch fails the same way on every backend, instead of as
a failed row after minutes of start-up. Torch-free, like :mod:`tpubench.parallel`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tpubench.parallel import PROCESS_FAMILIES, SPMD_FAMILIES, Layout, family
from tpubench.spec import PARALLEL_CHOICES, SCALING_CHOICES

if TYPE_CHECKING:
    from workloads import Workload

#: the plans that split layers, and so need the workload's tensor-parallel plan
TENSOR_PARALLEL = ("tp", "fsdp_tp")
#: the modes that serve a fixed batch: scaling them keeps the batch (strong) by default
SERVING_MODES = ("infer", "prefill", "decode")


def layouts(devices: Sequence[int], parallel: str, tp: int | None) -> list[Layout]:
    """One :class:`Layout` per device count of the sweep; a ValueError for a combination
    that cannot be laid out.

    ``--parallel`` is required above one device: the plan decides what each device holds
    and computes, so it is never guessed. ``tp`` is the tensor-parallel degree of
    ``fsdp_tp`` (it must divide each device count; the data-parallel degree is the
    quotient); for ``tp`` it is the device count itself, so ``--tp`` may only repeat it.
    A one-device run of a plan (``--devices 1,2,4 --parallel dp``) is that plan's baseline.
    """
    if parallel not in PARALLEL_CHOICES:
        raise ValueError(f"unknown --parallel {parallel!r}; valid: {', '.join(PARALLEL_CHOICES)}")
    if bad := [n for n in devices if n < 1]:
        raise ValueError(f"--devices expects positive integers, got {bad[0]}")
    if parallel == "none":
        if more := [n for n in devices if n > 1]:
            plans = ", ".join(PARALLEL_CHOICES[1:])
            raise ValueError(f"--devices {more[0]} needs --parallel, the plan to split the run by: {plans}")
        if tp not in (None, 1):
            raise ValueError("--tp applies to --parallel fsdp_tp (and tp, where it equals --devices)")
        return [Layout(n, "none") for n in devices]
    if parallel in ("dp", "fsdp"):
        if tp not in (None, 1):
            raise ValueError(f"--tp applies to --parallel fsdp_tp (and tp, where it equals --devices), not {parallel}")
        return [Layout(n, parallel) for n in devices]
    if parallel == "tp":
        if tp is not None and (other := [n for n in devices if n != tp]):
            raise ValueError(
                f"--parallel tp splits every layer over all the run's devices: --tp {tp} must equal "
                f"--devices ({other[0]}); leave --tp out, or use --parallel fsdp_tp for a 2-D mesh"
            )
        return [Layout(n, "tp", n) for n in devices]
    if tp is None:
        raise ValueError("--parallel fsdp_tp needs --tp K, the tensor-parallel degree (fsdp = devices / K)")
    if bad := [n for n in devices if n % tp]:
        raise ValueError(
            f"--tp {tp} does not divide --devices {bad[0]} (fsdp_tp lays devices out as fsdp x tp); "
            f"valid --devices for --tp {tp}: multiples of {tp}"
        )
    return [Layout(n, "fsdp_tp", tp) for n in devices]


def scaling_for(layout: Layout, mode: str, scaling: str | None) -> str | None:
    """The run's scaling: as asked, else weak for data-parallel (dp, fsdp) training, strong
    for tensor parallelism and the serving modes (their batch is what is served); None for
    a run with no plan."""
    if scaling is not None and scaling not in SCALING_CHOICES:
        raise ValueError(f"unknown --scaling {scaling!r}; valid: {', '.join(SCALING_CHOICES)}")
    if layout.parallel == "none":
        if scaling is not None:
            raise ValueError("--scaling applies to runs with --parallel (how their batch grows with --devices)")
        return None
    if scaling is not None:
        return scaling
    return "weak" if layout.parallel in ("dp", "fsdp") and mode not in SERVING_MODES else "strong"


def global_batch(batch_size: int, layout: Layout, scaling: str | None) -> int:
    """The batch one step consumes over all devices (``RunSpec.batch_size``).

    Weak scaling: ``batch_size`` is each data-parallel rank's, so the global batch is
    ``batch_size x dp``. Strong: ``batch_size`` is the global batch, which the data-parallel
    ranks split evenly (a ValueError otherwise). Tensor-parallel ranks share their batch.
    """
    if scaling == "weak":
        return batch_size * layout.dp
    if batch_size % layout.dp:
        raise ValueError(
            f"batch size {batch_size} is not divisible by the data-parallel degree {layout.dp} of "
            f"{layout.devices} devices ({layout.mesh}); with --scaling strong the batch is global: "
            f"use a multiple of {layout.dp}, or --scaling weak (the batch per data-parallel rank)"
        )
    return batch_size


def tp_error(workload: Workload, size: str, config: Any, layout: Layout) -> str | None:
    """Why ``workload``/``size`` cannot be split ``layout.tp`` ways (None: it can): the degree
    must divide every config dimension its plan names (heads, KV heads, the MLP width), so
    that each rank holds whole heads. A workload without a tensor-parallel plan is not
    refused here: its runs get a ``skipped`` row that says so (:func:`missing_plan`)."""
    plan = workload.parallel
    if layout.tp == 1 or plan is None or not plan.tp:
        return None
    sizes = {}
    for name in plan.tp_divides:
        value = getattr(config, name, None)
        if not isinstance(value, int):
            return f"{workload.name}'s parallel plan names {name!r}, which its {size} config lacks"
        sizes[name] = value
    if not (bad := [name for name, value in sizes.items() if value % layout.tp]):
        return None
    common = math.gcd(*sizes.values())
    valid = ", ".join(str(d) for d in range(1, common + 1) if common % d == 0)
    shown = ", ".join(f"{name} = {sizes[name]}" for name in bad)
    return (
        f"{workload.name}/{size}: the tensor-parallel degree {layout.tp} does not divide {shown}; "
        f"degrees that divide {', '.join(sizes)}: {valid}"
    )


def missing_plan(parallel: str, workload: Workload) -> str | None:
    """Why ``workload`` cannot run ``parallel`` (None: it can): tensor parallelism needs the
    workload's plan of which layers split column- and row-wise. Such a run is ``skipped``
    with this reason, not refused, so a sweep over every workload runs the others."""
    if parallel not in TENSOR_PARALLEL or (workload.parallel is not None and workload.parallel.tp):
        return None
    return (
        f"{workload.name} has no tensor-parallel plan (Workload.parallel.tp), so --parallel {parallel} "
        "cannot split its layers; dp and fsdp run it"
    )


def check_verifiable(backends: Sequence[str], modes: Sequence[str], hosts: int = 1) -> None:
    """``--verify`` of a multi-device run: XLA's SPMD run is verified sharded, in its one
    process (on one host: its verify worker cannot span hosts). The rank processes of the
    other families, on one host or several, are verified by the losses their train steps
    stored (the job's, the mean over ranks) against the CPU float32 reference's on the global
    batch; their infer, prefill and decode outputs lie in the ranks and are not verified, so
    asking for those is a ValueError rather than a verdict on something else."""
    if hosts > 1 and (spmd := [backend for backend in backends if family(backend) in SPMD_FAMILIES]):
        raise ValueError(
            f"--verify cannot check a run of {', '.join(spmd)} over several hosts yet (its verify worker is one "
            "process): verify at --hosts 1"
        )
    ranked = [backend for backend in backends if family(backend) in PROCESS_FAMILIES]
    if ranked and (unverified := [mode for mode in modes if mode != "train"]):
        raise ValueError(
            f"--verify checks a multi-device run of {', '.join(ranked)} by its training losses; its "
            f"{', '.join(unverified)} outputs are not verified yet: add --mode train, or verify at --devices 1"
        )
