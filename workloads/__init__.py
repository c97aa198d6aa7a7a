"""The workload registry: every benchmark model, by name, and the suites that group them.

One module per model declares a ``WORKLOAD``; adding a model means adding a module and
one line to ``_BUILTIN``. A workload's ``suites`` are tags (the first is its primary
suite), and single sizes may carry more (``size_suites``: ``mlperf`` marks the sizes that
match an MLPerf reference model), so one workload can sit in several suites. Extra
modules named in ``TPUBENCH_WORKLOAD_MODULES`` (comma-separated import paths, each
exposing ``WORKLOAD`` or ``WORKLOADS``; ``--workload-module`` sets it) and the entry points
of installed packages in the group ``tpubench.workloads`` are registered too, so users,
plugin packages and tests add workloads without editing this package; the variable reaches
every worker process. Each workload's provider is kept (:func:`sources`), and two providers
of one name are an error naming both: a later one silently replacing an earlier one would
measure a different model under a known name.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from importlib import metadata
from types import ModuleType

from workloads.base import (
    DIMENSIONS,
    GENERATION_MODES,
    MODES,
    Generation,
    Instance,
    ParallelPlan,
    Published,
    Shape,
    Workload,
    build,
)
from workloads.diffusion import dit
from workloads.encoder import bert
from workloads.llm import gpt2, llama3
from workloads.moe import mixtral
from workloads.vision import resnet, vit

__all__ = [
    "DIMENSIONS",
    "GENERATION_MODES",
    "MODES",
    "Generation",
    "Instance",
    "ParallelPlan",
    "Published",
    "Shape",
    "Workload",
    "build",
    "get_workload",
    "load",
    "registry",
    "sources",
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
#: the entry-point group an installed package declares its workloads in
ENTRY_POINT_GROUP = "tpubench.workloads"
BUILTIN_SOURCE = "built-in"


class RegistryError(ValueError):
    """A plugin that cannot be registered (it does not import, declares no workload, or
    reuses a name): one line naming it, shown by the CLI as ``error: ...``."""


def plugin_modules() -> list[str]:
    """The module names in ``TPUBENCH_WORKLOAD_MODULES``, in order."""
    return [name for name in (m.strip() for m in os.environ.get(PLUGIN_ENV, "").split(",")) if name]


def _declared(value: object, provider: str) -> list[Workload]:
    """The workloads ``value`` declares: a Workload, a sequence of them, or a module with
    ``WORKLOADS`` or ``WORKLOAD``."""
    if isinstance(value, ModuleType):
        value = getattr(value, "WORKLOADS", None) or getattr(value, "WORKLOAD", None)
    found = [value] if isinstance(value, Workload) else list(value) if isinstance(value, (list, tuple)) else []
    if not found or not all(isinstance(w, Workload) for w in found):
        raise RegistryError(f"{provider} declares no workload (expected WORKLOAD, WORKLOADS or a Workload)")
    return found


def _providers() -> Iterator[tuple[str, Workload]]:
    """(provider, workload) for every declared workload: built-ins, modules, entry points."""
    for workload in _BUILTIN:
        yield BUILTIN_SOURCE, workload
    for module_name in plugin_modules():
        provider = f"module {module_name}"
        try:
            module = importlib.import_module(module_name)
        except Exception as error:  # the user's code: any failure is theirs to read, in one line
            raise RegistryError(f"workload {provider} does not import: {type(error).__name__}: {error}") from error
        for workload in _declared(module, provider):
            yield provider, workload
    for entry in metadata.entry_points(group=ENTRY_POINT_GROUP):
        distribution = f"{entry.dist.name} {entry.dist.version}" if entry.dist else "an unknown distribution"
        provider = f"entry point {entry.name} ({entry.value}) of {distribution}"
        try:
            value = entry.load()
        except Exception as error:
            raise RegistryError(f"{provider} does not load: {type(error).__name__}: {error}") from error
        for workload in _declared(value, provider):
            yield provider, workload


def _registered() -> tuple[dict[str, Workload], dict[str, str]]:
    found: dict[str, Workload] = {}
    origin: dict[str, str] = {}
    for provider, workload in _providers():
        if workload.name in found:
            raise RegistryError(
                f"workload {workload.name!r} is provided twice: by {origin[workload.name]} and by {provider}; "
                "rename one of them"
            )
        found[workload.name], origin[workload.name] = workload, provider
    return found, origin


def registry() -> dict[str, Workload]:
    """All workloads by name: the built-in ones, then plugin modules', then entry points'."""
    return _registered()[0]


def sources() -> dict[str, str]:
    """Each workload's provider: ``built-in``, ``module pkg.mod``, or ``entry point NAME
    (pkg.mod:WORKLOAD) of DISTRIBUTION VERSION``."""
    return _registered()[1]


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
