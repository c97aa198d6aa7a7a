"""The input checks of the commands that plan runs (``run``, ``ci``, ``env``, ``list``):
workloads, suites, backends and their interpreters.

They live apart from :mod:`tpubench.cli.common` because they need the workload registry,
which imports torch (1.8 s here): the commands that only read a store (``compare``,
``report``, ``regressions``, ``export``, ``ops``, ``trace``, ``dashboard``) never import
this module, so they start without torch. Here too the registry is imported only when a
workload is chosen, so that ``run --on ray`` can start the cluster's actors first (the
backend registry imports no torch).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tpubench.backends import BACKENDS
from tpubench.cli.common import BadInput, choose, int_list, key_values
from tpubench.runner import plan
from tpubench.spec import DTYPES, RunSpec

if TYPE_CHECKING:
    from workloads import Workload


def pythons(pairs: list[str] | None) -> dict[str, str]:
    """``--python BACKEND=INTERPRETER`` pairs; the interpreter must exist and run."""
    pythons = key_values("--python", pairs)
    choose("backend", list(pythons), list(BACKENDS))
    for backend, interpreter in pythons.items():
        found = shutil.which(interpreter)
        if found is None:
            raise BadInput(f"--python {backend}={interpreter}: no such executable")
        pythons[backend] = found
    return pythons


def select_workloads(suite: str | None, names: list[str] | None) -> list[Workload]:
    from workloads import registry, suites

    known, grouped = registry(), suites()
    if suite is not None and suite not in grouped:
        raise BadInput(f"unknown suite {suite!r}; valid: {', '.join(grouped)}")
    pool = grouped[suite] if suite else list(known)
    chosen = choose("workload", names, pool) or pool
    return [known[name] for name in chosen]


@dataclass(frozen=True)
class Choice:
    """What a planning command was asked to run, each name checked against its registry."""

    workloads: list[Workload]
    backends: list[str]  # empty: every backend (the caller keeps the available ones)
    modes: list[str]
    sizes: list[str]
    suite: str | None = None  # without --size, a suite of sizes (mlperf) picks each workload's own


def choose_runs(
    suite: str | None,
    workloads: list[str] | None,
    backends: list[str] | None,
    modes: list[str] | None,
    sizes: list[str] | None,
    dtype: str,
) -> Choice:
    """The options ``run`` and ``ci`` share, checked; ``sizes`` items may be comma lists (a sweep)."""
    from workloads import GENERATION_MODES, MODES

    chosen = select_workloads(suite, workloads)
    chosen_backends = choose("backend", backends, list(BACKENDS))
    chosen_modes = choose("mode", modes, list(MODES + GENERATION_MODES))
    choose("dtype", [dtype], list(DTYPES))
    all_sizes = list(dict.fromkeys(size for workload in chosen for size in workload.sizes))
    chosen_sizes = choose("size", [s.strip() for item in sizes or [] for s in item.split(",")], all_sizes)
    return Choice(workloads=chosen, backends=chosen_backends, modes=chosen_modes, sizes=chosen_sizes, suite=suite)


def plan_runs(choice: Choice, **options: Any) -> list[RunSpec]:
    """:func:`tpubench.runner.plan` over ``choice``; a shape it refuses is bad input.

    Without ``--size``, ``--suite`` runs each workload at the sizes the suite tags
    (``--suite mlperf``: those matching an MLPerf reference), or its default size.
    """
    from workloads import suite_sizes

    sizes: list[str] | dict[str, list[str] | None] = choice.sizes
    if choice.suite and not sizes:
        sizes = {w.name: suite_sizes(choice.suite, w) for w in choice.workloads}
    try:
        return plan(
            choice.workloads,
            sizes=sizes,
            backends=choice.backends or list(BACKENDS),
            modes=choice.modes,
            **options,
        )
    except ValueError as error:
        raise BadInput(str(error)) from error


def shape_options(
    choice: Choice,
    batch_size: str | None,
    seq_len: str | None,
    prompt_len: str | None,
    gen_len: str | None,
    image_size: str | None = None,
    latent_size: str | None = None,
) -> dict[str, list[int] | None]:
    """``--batch-size``, ``--seq-len``/``--prompt-len``, ``--image-size``, ``--latent-size`` and
    ``--gen-len`` (comma lists: sweeps), checked the same way for ``run`` and ``ci``, as
    :func:`plan_runs` options (None: the workload's default)."""
    if seq_len is not None and prompt_len is not None:
        raise BadInput("--seq-len and --prompt-len are the same setting; give one")
    shape = {
        "batch_size": int_list("--batch-size", batch_size),
        "seq_len": int_list("--prompt-len" if prompt_len else "--seq-len", prompt_len or seq_len),
        "image_size": int_list("--image-size", image_size),
        "latent_size": int_list("--latent-size", latent_size),
        "gen_len": int_list("--gen-len", gen_len),
    }
    if gen_len is not None and "decode" not in choice.modes:
        raise BadInput("--gen-len applies to decode runs only; add --mode decode")
    return shape
