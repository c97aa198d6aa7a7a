"""The workload registry: every benchmark model, by name, and the suites that group them.

One module per model declares a ``WORKLOAD``; adding a model means adding a module and
one line to ``_BUILTIN``. A workload's ``suites`` are tags (the first is its primary
suite), and single sizes may carry more (``size_suites``: ``mlperf`` marks the sizes that
match an MLPerf reference model), so one workload can sit in several suites. Extra
modules named in ``TPUBENCH_WORKLOAD_MODULES`` (comma-separated import paths, each
exposing ``WORKLOAD`` or ``WORKLOADS``) are registered too, so users and tests add
workloads without editing this package; the variable reaches every worker process.
"""

from __future__ import annotations

import importlib
import os

from workloads import gpt2, llama3
from workloads.base import (
    DIMENSIONS,
    GENERATION_MODES,
    MODES,
    Generation,
    Instance,
    Published,
    Shape,
    Workload,
    build,
)
from workloads.diffusion import dit
from workloads.encoder import bert
from workloads.moe import mixtral
from workloads.vision import resnet, vit

__all__ = [
    "DIMENSIONS",
    "GENERATION_MODES",
    "MODES",
    "Generation",
    "Instance",
    "Published",
    "Shape",
    "Workload",
    "build",
    "get_workload",
    "load",
    "registry",
    "suite_sizes",
    "suites",
]

_BUILTIN = (
    gpt2.WORKLOAD,
    llama3.WORKLOAD,
    resnet.WORKLOAD,
    vit.WORKLOAD,
    bert.WORKLOAD,
    mixtral.WORKLOAD,
    dit.WORKLOAD,
)
PLUGIN_ENV = "TPUBENCH_WORKLOAD_MODULES"


def registry() -> dict[str, Workload]:
    """All workloads by name: the built-in ones, then any plugin modules'."""
    found = {w.name: w for w in _BUILTIN}
    for module_name in filter(None, (m.strip() for m in os.environ.get(PLUGIN_ENV, "").split(","))):
        module = importlib.import_module(module_name)
        extra = getattr(module, "WORKLOADS", None) or (module.WORKLOAD,)
        found.update({w.name: w for w in extra})
    return found


def suites() -> dict[str, list[str]]:
    """Suite -> the workloads in it: those tagged whole, and those with a size tagged."""
    grouped: dict[str, list[str]] = {}
    for workload in registry().values():
        tags = workload.suites + tuple(tag for size in workload.sizes for tag in workload.size_suites.get(size, ()))
        for tag in dict.fromkeys(tags):
            grouped.setdefault(tag, []).append(workload.name)
    return grouped


def suite_sizes(suite: str, workload: Workload) -> list[str] | None:
    """The sizes ``suite`` selects of ``workload``: None (its default size) when the whole
    workload is in the suite, else the sizes tagged with it (``--suite mlperf``)."""
    if suite in workload.suites:
        return None
    return [size for size in workload.sizes if suite in workload.size_suites.get(size, ())]


def get_workload(name: str) -> Workload:
    workloads = registry()
    if name not in workloads:
        raise KeyError(f"unknown workload {name!r}; valid: {', '.join(workloads)}")
    return workloads[name]


def load(name: str, size: str | None = None, **kwargs) -> Instance:
    """Build a registered workload by name; see :func:`workloads.base.build` for options.

    >>> inst = load("gpt2", "tiny", device="cpu")
    >>> inst.loss().backward()
    """
    return build(get_workload(name), size, **kwargs)
