"""The input checks of the commands that plan runs (``run``, ``ci``, ``env``, ``list``):
workloads, suites, backends and their interpreters.

They live apart from :mod:`tpubench.cli.common` because they need the workload registry,
which imports torch (1.8 s here): the commands that only read a store (``compare``,
``report``, ``regressions``, ``export``, ``ops``, ``trace``, ``dashboard``) never import
this module, so they start without torch. Here too the registry is imported only when a
workload is chosen, so that ``run --on ray`` can start the cluster's actors first (the
backend registry imports no torch).

A user's own model (``--model``, with ``--inputs``, ``--loss``, ``--model-config``,
``--task``) is resolved to a workload here, and dry-run at each planned shape and mode,
so that every bad reference or config is one ``error:`` line before any run.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

import typer

from tpubench.backends import BACKENDS
from tpubench.cli.common import BadInput, choose, int_list, key_values
from tpubench.precision import choices as precisions
from tpubench.runner import plan
from tpubench.spec import DTYPES, PARALLEL_CHOICES, SCALING_CHOICES, RunSpec

if TYPE_CHECKING:
    from workloads import Workload

PrecisionOption = Annotated[
    str | None,
    typer.Option(
        help=f"What the matmuls compute in: {', '.join(precisions.PRECISIONS)} (docs/precision.md). Sets the "
        "dtype (bf16, fp32: the plain dtypes; the others convert a bfloat16 model with torchao). Default: --dtype's.",
    ),
]

# the options of a user's model and of plugin modules, shared by ``run``, ``ci`` and ``list``
ModelOption = Annotated[
    str | None,
    typer.Option(
        "--model",
        help="Your model: MODULE:FACTORY, path/to/file.py:FACTORY, or hf:MODEL_TYPE, hf:path/to/dir, hf:HUB_ID "
        "(a local config; never downloads).",
    ),
]
InputsOption = Annotated[
    str | None, typer.Option(help="MODULE:FUNCTION making a batch: (batch_size, generator, **dims) -> dict or tuple.")
]
LossOption = Annotated[
    str | None, typer.Option(help="MODULE:FUNCTION (model, batch) -> scalar loss (default: output .loss, else mean).")
]
ModelConfigOption = Annotated[
    str | None, typer.Option(help="KEY=VALUE,... passed to the factory or set on the hf config.")
]
TaskOption = Annotated[
    str | None,
    typer.Option(help="hf: causal-lm, masked-lm, seq2seq-lm, image-classification, feature-extraction."),
]
WorkloadModuleOption = Annotated[
    list[str] | None,
    typer.Option(
        help="Import path of a module exposing WORKLOAD or WORKLOADS; repeatable (= TPUBENCH_WORKLOAD_MODULES)."
    ),
]

# the options of a multi-device run, shared by ``run`` and ``ci``
DevicesOption = Annotated[
    str | None,
    typer.Option(help="Devices per run (GPUs, TPU devices), e.g. 8 or 1,2,4,8: a sweep (default 1)."),
]
ParallelOption = Annotated[
    str | None,
    typer.Option(help=f"How a run splits over its devices: {', '.join(PARALLEL_CHOICES)} (required above 1 device)."),
]
TpOption = Annotated[
    int | None, typer.Option("--tp", min=1, help="Tensor-parallel degree of --parallel fsdp_tp (fsdp = devices / tp).")
]
ScalingOption = Annotated[
    str | None,
    typer.Option(
        help="weak: --batch-size per data-parallel rank (default for dp, fsdp training); "
        "strong: --batch-size is the global batch (default for tp and the serving modes)."
    ),
]


def use_workload_modules(modules: list[str] | None, model: str | None = None) -> None:
    """``--workload-module``: add the modules to ``TPUBENCH_WORKLOAD_MODULES``, which every
    worker inherits. These modules, and ``--model``'s, are found from the working directory
    as ``python -m`` finds a module, in every worker too (Ray's actors included: call this
    before they start)."""
    from tpubench.models import importable_from
    from workloads import PLUGIN_ENV, plugin_modules

    if modules or model:
        importable_from(os.getcwd())
    if modules:
        os.environ[PLUGIN_ENV] = ",".join(dict.fromkeys([*plugin_modules(), *(m.strip() for m in modules)]))


@dataclass(frozen=True)
class CustomModel:
    """A user's model, resolved: its workload and the reference every worker resolves again."""

    workload: Workload
    ref_json: str


def custom_model(
    model: str | None,
    inputs: str | None,
    loss: str | None,
    model_config: str | None,
    task: str | None,
    suite: str | None = None,
    workloads: list[str] | None = None,
) -> CustomModel | None:
    """``--model`` and its companions as a resolved workload (None without ``--model``), which
    runs on its own: with ``--suite`` or ``--workload`` too it is an error."""
    from tpubench.models import model_ref, resolve, stored_ref
    from workloads.custom.ref import ModelRefError

    if model is None:
        given = [
            name
            for name, value in (
                ("--inputs", inputs),
                ("--loss", loss),
                ("--model-config", model_config),
                ("--task", task),
            )
            if value is not None
        ]
        if given:
            raise BadInput(f"{', '.join(given)} describe(s) a model of yours: add --model")
        return None
    if suite or workloads:
        raise BadInput(
            "--model measures your model on its own; it does not combine with --workload or --suite "
            "(run those in a separate invocation)"
        )
    try:
        workload = resolve(model_ref(model, inputs=inputs, loss=loss, config=model_config, task=task))
        return CustomModel(workload, stored_ref(workload))
    except ModelRefError as error:
        raise BadInput(str(error)) from error


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
    from workloads import RegistryError, registry, suites

    try:
        known, grouped = registry(), suites()
    except RegistryError as error:
        raise BadInput(str(error)) from error
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
    model_ref: str | None = None  # --model: the reference (JSON) every run's worker resolves


def choose_runs(
    suite: str | None,
    workloads: list[str] | None,
    backends: list[str] | None,
    modes: list[str] | None,
    sizes: list[str] | None,
    dtype: str,
    custom: CustomModel | None = None,
) -> Choice:
    """The options ``run`` and ``ci`` share, checked; ``sizes`` items may be comma lists (a sweep).
    ``custom`` (``--model``, see :func:`custom_model`) is the one workload."""
    from workloads import GENERATION_MODES, MODES

    chosen = [custom.workload] if custom else select_workloads(suite, workloads)
    chosen_backends = choose("backend", backends, list(BACKENDS))
    chosen_modes = choose("mode", modes, list(MODES + GENERATION_MODES))
    choose("dtype", [dtype], list(DTYPES))
    all_sizes = list(dict.fromkeys(size for workload in chosen for size in workload.sizes))
    chosen_sizes = choose("size", [s.strip() for item in sizes or [] for s in item.split(",")], all_sizes)
    return Choice(
        workloads=chosen,
        backends=chosen_backends,
        modes=chosen_modes,
        sizes=chosen_sizes,
        suite=suite,
        model_ref=custom.ref_json if custom else None,
    )


def precision_options(precision: str | None, dtype: str | None, verify: bool = False) -> dict[str, str]:
    """``--precision`` and ``--dtype`` as :func:`plan_runs` options, checked: a precision sets
    its base dtype, a dtype alone its plain precision, neither float32 (the default before
    ``--precision``). ``--verify`` (a float32 reference of the unconverted model) says nothing
    of a converted precision, whose check is its quality columns: refused with one."""
    try:
        precision, dtype = precisions.resolve(precision, dtype)
    except ValueError as error:
        raise BadInput(str(error)) from error
    if verify and precisions.is_converted(precision):
        raise BadInput(
            f"--verify compares the unconverted model with a float32 reference; --precision {precision}'s own "
            "check is its quality columns against bf16 (docs/precision.md): drop --verify"
        )
    return {"precision": precision, "dtype": dtype}


def precision_runs(choice: Choice, specs: list[RunSpec]) -> tuple[list[RunSpec], list[str]]:
    """The planned runs a converted precision can take, and a note for each mode or backend
    left out (:func:`tpubench.precision.choices.runnable`); one the user named is bad input."""
    try:
        return precisions.runnable(specs, choice.modes, choice.backends)
    except ValueError as error:
        raise BadInput(str(error)) from error


def plan_runs(choice: Choice, **options: Any) -> list[RunSpec]:
    """:func:`tpubench.runner.plan` over ``choice``; a shape it refuses is bad input.

    Without ``--size``, ``--suite`` runs each workload at the sizes the suite tags
    (``--suite mlperf``: those matching an MLPerf reference), or its default size. A user's
    model is dry-run at each planned shape and mode, here in the main process.
    """
    from tpubench.models import check_dims, prepared
    from workloads import suite_sizes

    sizes: list[str] | dict[str, list[str] | None] = choice.sizes
    if choice.suite and not sizes:
        sizes = {w.name: suite_sizes(choice.suite, w) for w in choice.workloads}
    if choice.model_ref:
        options["model_ref"] = choice.model_ref
    try:
        if choice.model_ref:
            check_dims(choice.workloads[0], options)
        specs = plan(
            choice.workloads,
            sizes=sizes,
            backends=choice.backends or list(BACKENDS),
            modes=choice.modes,
            **options,
        )
        if choice.model_ref:
            specs = prepared(choice.workloads[0], specs)
    except ValueError as error:  # ModelRefError among them
        raise BadInput(str(error)) from error
    return specs


def device_options(devices: str | None, parallel: str | None, tp: int | None, scaling: str | None) -> dict[str, Any]:
    """``--devices``, ``--parallel``, ``--tp`` and ``--scaling`` as :func:`plan_runs` options,
    the names checked here; what the layouts may be is checked by planning them."""
    choose("--parallel", [parallel] if parallel else None, list(PARALLEL_CHOICES))
    choose("--scaling", [scaling] if scaling else None, list(SCALING_CHOICES))
    return {
        "devices": int_list("--devices", devices),
        "parallel": parallel or "none",
        "tp": tp,
        "scaling": scaling,
    }


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
