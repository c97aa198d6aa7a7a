"""Collective ceilings: bus bandwidth by collective, message size and group size.

The process families (cpu, cuda, tpu) measure in N rank processes started the way a
multi-device run starts them (:mod:`tpubench.parallel.ranks`), talking through their
``torch.distributed`` backend (gloo on 127.0.0.1, nccl, TorchTPU's ``tpu_dist``). Every
sample starts after a barrier (untimed), so ranks enter the collective together; each rank
times its own call with the backend's timer, and the launcher keeps, per sample, the
slowest rank's time (:func:`merge`), as a multi-device run's step is its slowest rank's.

S, the message size, is nccl-tests' (doc/PERFORMANCE.md): the buffer each rank holds,
the output for all-gather and the input for reduce-scatter. ``algbw = S / t`` and
``busbw = algbw x factor(n)`` with :mod:`tpubench.analysis.collectives`' factors, the one
definition tpubench has; a row's rate columns are the bus bandwidth. torch_xla's
collectives run in one process under SPMD instead (:mod:`.xla_collective`), with the same
S and the same columns (:func:`bandwidth_columns`).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from tpubench.analysis.ceilings import size_label
from tpubench.analysis.collectives import busbw_factor
from tpubench.ceilings import COLLECTIVES, ITEMSIZE, CeilingSpec, collective_sizes, family
from tpubench.ceilings.device import DeviceFacts
from tpubench.ceilings.timing import Samples, failed_point, point_columns, sample
from tpubench.hostload import job_columns
from tpubench.parallel import PROCESS_FAMILIES


def operation(
    op: str, size: int, dtype: torch.dtype, itemsize: int, world: int, device: torch.device
) -> Callable[[], Any]:
    """One ``op`` over a message of ``size`` bytes (nccl-tests' S) on this rank."""
    elements = size // itemsize
    if op == "all_gather":
        out = torch.empty(elements, dtype=dtype, device=device)
        part = torch.ones(elements // world, dtype=dtype, device=device)
        return lambda: dist.all_gather_into_tensor(out, part)
    if op == "reduce_scatter":
        whole = torch.ones(elements, dtype=dtype, device=device)
        out = torch.empty(elements // world, dtype=dtype, device=device)
        return lambda: dist.reduce_scatter_tensor(out, whole)
    if op == "all_to_all":
        source = torch.ones(elements, dtype=dtype, device=device)
        out = torch.empty(elements, dtype=dtype, device=device)
        return lambda: dist.all_to_all_single(out, source)
    tensor = torch.ones(elements, dtype=dtype, device=device)
    if op == "broadcast":
        return lambda: dist.broadcast(tensor, 0)
    return lambda: dist.all_reduce(tensor)


def join_group(spec: CeilingSpec, facts: DeviceFacts) -> None:
    """Join the sweep's process group through the family's backend (torchrun's variables)."""
    if dist.is_initialized():
        return
    device_id = facts.device if facts.device.type == "cuda" else None
    timeout = timedelta(seconds=spec.timeout_s / 2)  # a dead peer fails the row before the runner's kill
    dist.init_process_group(PROCESS_FAMILIES[family(spec.backend)], timeout=timeout, device_id=device_id)


def largest_on_any_rank(value: float) -> float:
    """The largest ``value`` over the ranks: every rank then takes the same number of samples."""
    device = torch.device("cpu") if dist.get_backend() == "gloo" else torch.accelerator.current_accelerator()
    flag = torch.tensor([value], dtype=torch.float64 if device.type == "cpu" else torch.float32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return float(flag.item())


def walk_sizes(
    ops: tuple[str, ...],
    spec: CeilingSpec,
    facts: DeviceFacts,
    notes: list[str],
    timed_point: Callable[[str, int], Samples],
    measured: Callable[[str, int, Samples], dict[str, Any]],
) -> list[dict[str, Any]]:
    """Each collective at each message size, smallest first: ``timed_point(op, size)`` times a
    point, ``measured(op, size, samples)`` gives its row's columns. An op's walk stops at its
    first failure (a larger message fails too) or once one sample (``reps`` operations) takes
    over the sweep's limit (a larger one takes longer), which ``notes`` says. One walk for
    every family's collectives, so they leave out the same points for the same reasons."""
    dtype = spec.dtypes[0]
    limit = spec.sweep.sample_limit_s
    rows: list[dict[str, Any]] = []
    for op in ops:
        for size in collective_sizes(facts.kind, spec.full, spec.max_size):
            row = {"op": op, "dtype": dtype, "size_bytes": size, "shape": size_label(size), "bytes_per_op": float(size)}
            try:
                timed = timed_point(op, size)
            except Exception as error:
                rows.append({**row, **failed_point(error)})
                break
            rows.append({**row, **measured(op, size, timed), "status": "ok"})
            if float(np.median(timed.samples_s)) * timed.reps > limit:
                notes.append(f"collective {op}: sizes above {size} B left out, one sample took over {limit:g} s")
                break
    return rows


def measure(spec: CeilingSpec, facts: DeviceFacts, notes: list[str]) -> list[dict[str, Any]]:
    """This rank's rows: every collective at every message size, with its raw samples (the
    ranks' are merged into bandwidths by :func:`merge`)."""
    join_group(spec, facts)
    world = dist.get_world_size()
    torch_dtype, itemsize = getattr(torch, spec.dtypes[0]), ITEMSIZE[spec.dtypes[0]]

    def timed_point(op: str, size: int) -> Samples:
        run = operation(op, size, torch_dtype, itemsize, world, facts.device)
        return sample(run, facts.backend, spec.sweep, before=dist.barrier, agree=largest_on_any_rank)

    def raw(op: str, size: int, timed: Samples) -> dict[str, Any]:
        return {"_samples": timed.__dict__}

    return walk_sizes(COLLECTIVES, spec, facts, notes, timed_point, raw)


def merge(spec: CeilingSpec, ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """The sweep's result from its ranks' (all ok): per point and sample the slowest rank's
    time, then algbw and busbw from it."""
    base = dict(ranks[0])
    points = []
    for rows in zip(*(r["points"] for r in ranks), strict=True):
        row = {key: value for key, value in rows[0].items() if key != "_samples"}
        if row["status"] == "ok":
            each = [Samples(**r["_samples"]) for r in rows]
            slowest = Samples(
                first_s=max(s.first_s for s in each),
                warmup_s=[max(t) for t in zip(*(s.warmup_s for s in each), strict=True)],
                samples_s=[max(t) for t in zip(*(s.samples_s for s in each), strict=True)],
                reps=each[0].reps,
            )
            row |= bandwidth_columns(row["op"], spec.devices, row["size_bytes"], slowest)
        points.append(row)
    return {**base, "points": points, **job_columns(ranks)}  # one host load and host-busy warning for the sweep


def bandwidth_columns(op: str, group: int, size: int, samples: Samples) -> dict[str, Any]:
    """A collective point's columns: times, busbw as its rate (median, max, p10), and algbw."""
    factor = busbw_factor(op, group)
    columns = point_columns(samples, size * factor, "B/s")
    columns["busbw_factor"] = factor
    columns["algbw_median"] = size / columns["median_s"]
    return columns
