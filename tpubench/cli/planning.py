"""The input checks of the commands that plan runs (``run``, ``ci``, ``env``, ``list``):
workloads, suites, backends and their interpreters.

They live apart from :mod:`tpubench.cli.common` because they need the workload and backend
registries, which import torch (1.8 s here): the commands that only read a store
(``compare``, ``report``, ``regressions``, ``export``, ``ops``, ``trace``, ``dashboard``)
never import this module, so they start without torch.
"""

from __future__ import annotations

import shutil

from tpubench.backends import BACKENDS
from tpubench.cli.common import BadInput, choose, key_values
from workloads import Workload, registry, suites


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
    known, grouped = registry(), suites()
    if suite is not None and suite not in grouped:
        raise BadInput(f"unknown suite {suite!r}; valid: {', '.join(grouped)}")
    pool = grouped[suite] if suite else list(known)
    chosen = choose("workload", names, pool) or pool
    return [known[name] for name in chosen]
