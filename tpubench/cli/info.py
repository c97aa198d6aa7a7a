"""``tpubench list`` and ``tpubench env``: what can run, and where."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from tpubench.backends import BACKENDS
from tpubench.cache_dir import keep, read_kept
from tpubench.cli.common import BadInput, app, choose, console
from tpubench.cli.planning import (
    InputsOption,
    LossOption,
    ModelConfigOption,
    ModelOption,
    TaskOption,
    WorkloadModuleOption,
    custom_model,
    pythons,
    select_workloads,
    use_workload_modules,
)
from tpubench.fingerprint import git_sha, host_facts
from tpubench.launchers import ray as ray_launcher
from tpubench.parallel.planning import missing_plan
from tpubench.results_dir import DEFAULT_RESULTS_DIR
from tpubench.runner import SuiteRunner
from tpubench.spec import PARALLEL_CHOICES, shape_label
from tpubench.version import __version__

if TYPE_CHECKING:
    from workloads import Workload


@app.command("list")
def list_workloads(
    suite: Annotated[str | None, typer.Option(help="Only this suite's workloads.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
    workload_module: WorkloadModuleOption = None,
    model: ModelOption = None,
    inputs: InputsOption = None,
    loss: LossOption = None,
    model_config: ModelConfigOption = None,
    task: TaskOption = None,
) -> None:
    """List the workloads with where each comes from (built-in, a plugin module, an installed
    package's entry point, --model), their suites, family, sizes, modes and default shapes,
    and each size's parameter count (counted on the meta device) beside the published one."""
    from workloads import BUILTIN_SOURCE, sources

    use_workload_modules(workload_module, model)
    custom = custom_model(model, inputs, loss, model_config, task, suite)
    chosen = select_workloads(suite, None)
    origin = sources()  # select_workloads has checked the registry
    if custom is not None:
        chosen.append(custom.workload)
        origin[custom.workload.name] = "--model"
    counts = built_in_counts([w for w in chosen if origin[w.name] == BUILTIN_SOURCE])
    entries = [
        {
            "name": w.name,
            "source": origin[w.name],
            "suite": w.suite,
            "suites": list(w.suites),
            "family": w.family,
            "description": w.description,
            "sizes": list(w.sizes),
            "default_size": w.default_size,
            "modes": list(w.modes),
            "dims": list(w.dims),
            "default_shape": {kind: {"batch_size": s.batch_size, **s.dims()} for kind, s in w.default_shape.items()},
            "parallel": parallel_choices(w),
            "parallel_plan": parallel_plan(w),
            "size_details": [size_entry(w, size, counts.get((w.name, size))) for size in w.sizes],
        }
        for w in chosen
    ]
    if as_json:
        print(json.dumps(entries, indent=2))
        return
    table = Table(title="tpubench workloads")
    headers = (
        "workload",
        "source",
        "suites",
        "family",
        "sizes (default*)",
        "modes",
        "parallel",
        "default shape (cpu / cuda / tpu)",
    )
    for header in headers:
        table.add_column(header)
    for entry in entries:
        sizes = ", ".join(f"{s}*" if s == entry["default_size"] else s for s in entry["sizes"])
        shapes = " / ".join(shape_label(s.pop("batch_size"), s, prefix="") for s in entry["default_shape"].values())
        suites = ", ".join(entry["suites"])
        modes = ", ".join(entry["modes"])
        parallel = ", ".join(entry["parallel"])
        table.add_row(entry["name"], entry["source"], suites, entry["family"], sizes, modes, parallel, shapes)
    console.print(table)
    console.print(sizes_table(entries))


def parallel_choices(workload: Workload) -> list[str]:
    """The ``--parallel`` plans a workload runs: dp and fsdp always (fsdp shards the whole
    model as one unit without a plan), tp and fsdp_tp with a tensor-parallel plan."""
    return [choice for choice in PARALLEL_CHOICES if choice != "none" and missing_plan(choice, workload) is None]


def parallel_plan(workload: Workload) -> dict[str, Any] | None:
    """The workload's plan as data (``Workload.parallel``), for ``--json``; None without one."""
    plan = workload.parallel
    if plan is None:
        return None
    return {"fsdp_units": list(plan.fsdp_units), "tp": dict(plan.tp), "tp_divides": list(plan.tp_divides)}


#: the in-place random fills torch.nn.init draws weights with
RANDOM_FILLS = ("normal_", "uniform_", "random_", "exponential_", "bernoulli_", "log_normal_", "cauchy_", "geometric_")


def _parameters_on_meta() -> Any:
    """A torch function mode under which a model is built with its uninitialised tensors
    (``torch.empty``: every ``nn.Linear``'s, ``nn.Embedding``'s ... weight) on the meta device,
    and ``torch.nn.init``'s functions and the random fills of :data:`RANDOM_FILLS` do nothing;
    what a model computes while it is built (a buffer of positions) is computed on the CPU.

    Why not ``with torch.device("meta")``: every computation on a meta tensor runs torch's
    Python reference implementations, whose first call imports torch._dynamo (about 6 s of
    ``tpubench list`` here, for a parameter count). ``tpubench list`` is tested to import no
    torch._dynamo."""
    import torch
    from torch.overrides import TorchFunctionMode

    fills = {getattr(torch.Tensor, name) for name in RANDOM_FILLS}

    class ParametersOnMeta(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
            kwargs = kwargs or {}
            if func in fills or getattr(func, "__module__", None) == "torch.nn.init":  # each fills in place
                return args[0] if args else kwargs.get("tensor")  # init.normal_(tensor=w)
            if func is torch.empty and kwargs.get("device") is None:
                return func(*args, **{**kwargs, "device": "meta"})
            return func(*args, **kwargs)

    return ParametersOnMeta()


def counted_params(workload: Workload, size: str) -> int:
    """The size's parameters, counted on a model built with its weights on the meta device (no
    memory, no init: :func:`_parameters_on_meta`)."""
    with _parameters_on_meta():
        model = workload.build_model(workload.config(size))
    return sum(p.numel() for p in model.parameters())


#: the cache folder's file of the built-ins' parameter counts (:func:`built_in_counts`)
PARAMS_FILE = "param-counts.json"


def built_in_counts(workloads: list[Workload]) -> dict[tuple[str, str], int]:
    """Every size's count of the built-in ``workloads``, kept between calls: building the 27
    sizes took 0.75 s of ``tpubench list``'s 3.2 s here, on top of ``import torch``'s 2.1.
    The kept counts are valid for the registry's source files and torch version they were
    counted with (any change to either counts again); an unreadable file is counted over."""
    import torch

    import workloads as registry

    digest = hashlib.sha256(torch.__version__.encode())
    folder = Path(registry.__file__).parent
    for path in sorted(folder.rglob("*.py")):
        digest.update(path.relative_to(folder).as_posix().encode() + path.read_bytes())
    key = digest.hexdigest()
    counts = read_kept(PARAMS_FILE, key)
    wanted = {f"{w.name}/{size}": (w, size) for w in workloads for size in w.sizes}
    missing = {name: counted_params(*what) for name, what in wanted.items() if not isinstance(counts.get(name), int)}
    if missing:
        counts.update(missing)
        keep(PARAMS_FILE, key, counts)
    return {(w.name, size): counts[name] for name, (w, size) in wanted.items()}


def size_entry(workload: Workload, size: str, params: int | None = None) -> dict[str, Any]:
    """One size: its suites, its parameter count (``params``, or :func:`counted_params`), and
    the published figure with its source where the size has one."""
    config = workload.config(size)
    published = workload.published.get(size)
    return {
        "size": size,
        "suites": list(workload.suites_of(size)),
        "params": counted_params(workload, size) if params is None else params,
        "active_params": workload.active_params(config) if workload.active_params else None,
        "published_params": published.params if published else None,
        "published_active_params": published.active_params if published else None,
        "published_source": published.source if published else None,
    }


def sizes_table(entries: list[dict[str, Any]]) -> Table:
    """Every size's parameters next to the published figure, and where that comes from."""
    table = Table(title="sizes: parameters (unique tensors) and the published figure")
    for header in ("workload", "size", "suites", "parameters", "published", "source"):
        table.add_column(header, justify="right" if header in ("parameters", "published") else "left")
    for entry in entries:
        for detail in entry["size_details"]:
            params = f"{detail['params']:,}" + (
                f" ({detail['active_params']:,} active)" if detail["active_params"] is not None else ""
            )
            published = f"{detail['published_params']:,}" if detail["published_params"] is not None else "-"
            if detail["published_active_params"] is not None:
                published += f" ({detail['published_active_params']:,} active)"
            table.add_row(
                entry["name"],
                detail["size"],
                ", ".join(detail["suites"]),
                params,
                published,
                detail["published_source"] or "",
            )
    return table


@app.command("env")
def show_env(
    python: Annotated[list[str] | None, typer.Option(help="BACKEND=INTERPRETER for that backend's workers.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
    on: Annotated[str, typer.Option(help="local, or ray: one probe per node kind of the Ray cluster.")] = "local",
    ray_address: Annotated[
        str | None, typer.Option(help="Ray cluster for --on ray (default: RAY_ADDRESS, auto).")
    ] = None,
) -> None:
    """Show every backend, available or not (and why), with device, versions and host."""
    choose("launcher (--on)", [on], ["local", "ray"])
    if on == "ray":
        show_fleet(pythons(python), ray_address, as_json)
        return
    probes = SuiteRunner(results_dir=DEFAULT_RESULTS_DIR, pythons=pythons(python)).probe_all(list(BACKENDS))
    info = {"tpubench_version": __version__, "git_sha": git_sha(), **host_facts(), "backends": flatten(probes)}
    if as_json:
        print(json.dumps(info, indent=2))
        return
    console.print(f"tpubench {info['tpubench_version']} (git {info['git_sha'] or 'n/a'}) on {info['host']}")
    console.print(f"cpu: {info['cpu_model']}; os: {info['os']}", highlight=False)
    console.print(backends_table(info["backends"]))


def flatten(probes: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Backend -> its availability with the interpreter's python and torch versions."""
    return {
        name: {
            **probe["backends"][name],
            "python": probe["executable"],
            "python_version": probe["python_version"],
            "torch_version": probe["torch_version"],
        }
        for name, probe in probes.items()
    }


def show_fleet(interpreters: dict[str, str], address: str | None, as_json: bool) -> None:
    """``env --on ray``: per node kind of the cluster, what its backends can do."""
    try:
        fleet = ray_launcher.probe_fleet(list(BACKENDS), interpreters, address)
    except (RuntimeError, ConnectionError) as error:
        raise BadInput(f"--on ray: {error}") from error
    ray_launcher.disconnect()
    kinds = [{**kind, "backends": flatten(kind.pop("probes"))} for kind in fleet]
    if as_json:
        print(json.dumps(kinds, indent=2))
        return
    for kind in kinds:
        nodes = ", ".join(kind["nodes"])
        console.print(f"node kind [{kind['kind']}]: {len(kind['nodes'])} node(s) ({nodes}); probed on {kind['host']}")
        console.print(backends_table(kind["backends"]))


def backends_table(backends: dict[str, dict[str, Any]]) -> Table:
    """One line per backend (device or reason), then its versions and interpreter: no borders
    and a wrapping last column, so it reads at 80 columns as well as at 200."""
    table = Table(box=None, show_header=True, pad_edge=False, title="backends", title_justify="left")
    table.add_column("backend", no_wrap=True)
    table.add_column("ok", no_wrap=True)
    table.add_column("device, or why not; versions; interpreter", overflow="fold")
    for name, entry in backends.items():
        details = [f"{entry['device_name']}{device_count(name, entry)}" if entry["available"] else entry["reason"]]
        versions = ", ".join(f"{k} {v}" for k, v in entry["versions"].items())
        details.append(versions or f"torch {entry['torch_version'] or '?'}")
        details.append(f"python {entry['python_version'] or '?'} at {entry['python']}")
        table.add_row(name, "yes" if entry["available"] else "no", "\n".join(details))
    return table


def device_count(backend: str, entry: dict[str, Any]) -> str:
    """What ``device_count`` counts, said in words: torch sees all the host's CPUs as one
    device (a bare ``x1`` read as one CPU core), a GPU or TPU host has one device per chip."""
    count = entry["device_count"]
    if not count:
        return ""
    if backend.startswith("cpu"):
        simulated = entry.get("parallel_devices") or 1
        return f" (one torch device over {os.cpu_count()} logical CPUs); --devices simulates up to {simulated}"
    return f" ({count} device{'s' if count != 1 else ''} on this host)"
