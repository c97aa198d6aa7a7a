"""``tpubench run --attention``: the kernel a long-context sweep forces, checked before anything runs.

A kernel a named backend cannot force is one ``error:`` line (``--attention flash`` on a
CPU); without ``--backend``, the backends that cannot are left out with a note. A sweep with
``--attention`` is also checked against each device's memory by the same estimate the
worker admits runs with, attention's activations counted as the kernel holds them
(:func:`tpubench.worker.run_estimate`): a length that cannot fit is one ``error:`` line
naming the longest that does, rather than a sweep that stops at its first OOM.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Annotated, Any

import typer

from tpubench.backends import BACKENDS
from tpubench.cli.common import BadInput, choose
from tpubench.spec import ATTENTION_CHOICES, RunSpec

if TYPE_CHECKING:
    from tpubench.runner import SuiteRunner

AttentionOption = Annotated[
    str | None,
    typer.Option(
        help=f"Attention kernel to force: {', '.join(ATTENTION_CHOICES)} (auto: the backend's choice). "
        "Records the kernel that ran and attention's share of a step (one more traced step).",
    ),
]
#: the search step of the longest length that fits: a multiple of every kernel's block size
LENGTH_STEP = 128


def attention_settings(attention: str | None, backends: list[str]) -> dict[str, Any]:
    """``--attention`` as :class:`RunSpec` settings, the name checked, and refused where a named
    backend cannot force it."""
    if attention is None:
        return {}
    choose("--attention", [attention], list(ATTENTION_CHOICES))
    cannot = [name for name in backends if attention not in BACKENDS[name].attention_kernels]
    if cannot:
        valid = "; ".join(f"{name}: {', '.join(BACKENDS[name].attention_kernels)}" for name in cannot)
        raise BadInput(f"--attention {attention} has no kernel on backend {', '.join(cannot)} (valid there: {valid})")
    return {"attention": attention, "trace_attention": True}


def with_attention(specs: list[RunSpec]) -> tuple[list[RunSpec], list[str]]:
    """The runs whose backend can force their kernel, and a note for each backend left out
    (only unnamed backends are: a named one was refused by :func:`attention_settings`)."""
    kept = [spec for spec in specs if spec.attention in BACKENDS[spec.backend].attention_kernels]
    dropped = sorted({spec.backend for spec in specs} - {spec.backend for spec in kept})
    notes = [f"note: --attention {specs[0].attention} has no kernel on backend {name}: left out" for name in dropped]
    return kept, notes


def refuse_what_cannot_fit(specs: list[RunSpec], runner: SuiteRunner) -> None:
    """One ``error:`` line for the runs of a ``--attention`` sweep whose estimate exceeds their
    device's memory (as the probe reads it), each with the longest ``--seq-len`` that fits;
    nothing is refused where the memory is not known, or on simulated devices (the worker's
    own check, which counts them together, applies)."""
    from tpubench import worker
    from tpubench.models import workload_for

    refused = []
    probes = runner.probe_all(sorted({spec.backend for spec in specs}))
    for spec in specs:
        capacity = probes[spec.backend]["backends"][spec.backend].get("memory_bytes")
        if capacity is None or spec.seq_len is None or spec.devices > 1:
            continue
        workload = workload_for(spec)
        config = workload.config(spec.size)
        holds = BACKENDS[spec.backend].holds_attention_scores(spec.attention)
        estimate = worker.run_estimate(spec, holds, workload, config)
        if estimate <= capacity:
            continue
        fits = longest_fitting(spec, holds, workload, config, capacity)
        longest = f"the longest that fits is --seq-len {fits}" if fits else "no length fits"
        kernel = " (math attention holds the S x S scores: a fused kernel holds O(S))" if holds else ""
        refused.append(
            f"{spec.label()}: estimated {estimate / 2**30:.1f} GiB exceeds the {capacity / 2**30:.1f} GiB "
            f"of {spec.backend}'s device; {longest}{kernel}"
        )
    if refused:
        raise BadInput(f"{len(refused)} run(s) cannot fit: " + "; ".join(refused))


def longest_fitting(spec: RunSpec, holds: bool, workload: Any, config: Any, capacity: int) -> int | None:
    """The longest multiple of :data:`LENGTH_STEP` below ``spec.seq_len`` whose estimate fits."""
    from tpubench import worker

    low, high = 0, spec.seq_len // LENGTH_STEP  # in steps; the estimate grows with the length
    while low < high:
        middle = (low + high + 1) // 2
        shorter = replace(spec, seq_len=middle * LENGTH_STEP)
        if worker.run_estimate(shorter, holds, workload, config) <= capacity:
            low = middle
        else:
            high = middle - 1
    return low * LENGTH_STEP or None
