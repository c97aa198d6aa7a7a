"""Users' own models on the harness's side: the words of ``--model`` (or the arguments of
:func:`tpubench.bench`) made into a :class:`~workloads.custom.ref.ModelRef`, and that
reference turned into a :class:`workloads.Workload` in the main process (where bad input
is one ``error:`` line before anything runs) and again in each worker.

What crosses into a worker is the reference, never a model object: each worker, in any
interpreter and on any Ray node, imports the user's module again. So a file path is made
absolute here (a worker's working directory is the checkout's), and a module name is
looked up from the user's working directory as ``python -m`` would, in every worker too.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workloads.custom.ref import ModelRef, ModelRefError

if TYPE_CHECKING:
    from tpubench.spec import RunSpec
    from workloads import Workload

HF_PREFIX = "hf:"


def importable_from(directory: str | Path) -> None:
    """Make ``directory``'s modules importable here and in every worker started after this
    (``PYTHONPATH`` reaches workers through :func:`tpubench.launch.process.worker_env`)."""
    path = str(Path(directory).resolve())
    if path not in sys.path:
        sys.path.insert(0, path)
    entries = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if path not in entries:
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [path, *entries]))


def _looks_like_path(text: str) -> bool:
    return text.endswith(".py") or text.startswith((".", "~", os.sep)) or os.sep in text


def callable_ref(text: str, option: str) -> str:
    """``pkg.mod:function`` as it is, or ``path/to/file.py:function`` with the path made
    absolute; a missing file or a malformed reference is a :class:`ModelRefError`."""
    where, sep, name = text.rpartition(":")
    if not sep or not where or not name or not name.replace(".", "").replace("_", "").isalnum():
        raise ModelRefError(
            f"{option} {text!r}: expected MODULE:FUNCTION or path/to/file.py:FUNCTION (or hf:MODEL for --model)"
        )
    if not _looks_like_path(where):
        return text
    path = Path(where).expanduser()
    if not path.is_file():
        raise ModelRefError(f"{option} {text!r}: no such file {str(path)!r}")
    return f"{path.resolve()}:{name}"


def parse_overrides(text: str | None) -> tuple[tuple[str, str], ...]:
    """``--model-config hidden_size=64,num_hidden_layers=2`` as ordered (key, value) pairs."""
    pairs = []
    for item in filter(None, (part.strip() for part in (text or "").split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ModelRefError(f"--model-config expects KEY=VALUE[,KEY=VALUE...], got {item!r}")
        pairs.append((key.strip(), value.strip()))
    return tuple(pairs)


def model_ref(
    model: str,
    *,
    inputs: str | None = None,
    loss: str | None = None,
    config: str | Iterable[tuple[str, Any]] | None = None,
    task: str | None = None,
) -> ModelRef:
    """The reference ``--model MODEL --inputs ... --loss ... --model-config ... --task ...`` names.

    ``hf:llama`` (a ``model_type``), ``hf:path/to/dir`` (a folder with ``config.json``, made
    absolute) or ``hf:org/name`` (a hub id in the local cache) is the Hugging Face route;
    anything else is a factory, ``pkg.mod:make_model`` or ``path/to/file.py:make_model``.
    """
    overrides = once_each(parse_overrides(config) if isinstance(config, str) or config is None else _pairs(config))
    if model.startswith(HF_PREFIX):
        target = model[len(HF_PREFIX) :].strip()
        if not target:
            raise ModelRefError("--model hf: needs a model_type (hf:llama), a folder with config.json, or a hub id")
        if inputs or loss:
            raise ModelRefError("--inputs and --loss apply to a factory (--model MODULE:FUNCTION), not to hf: models")
        path = Path(target).expanduser()
        if path.is_dir():
            target = str(path.resolve())
        elif target.startswith((".", "~", os.sep)):
            raise ModelRefError(f"--model {model!r}: no such directory {target!r} (a folder holding config.json)")
        return ModelRef("hf", target, overrides=overrides, task=task)
    if task:
        raise ModelRefError("--task applies to hf: models; a factory's model is whatever it returns")
    return ModelRef(
        "factory",
        callable_ref(model, "--model"),
        inputs=callable_ref(inputs, "--inputs") if inputs else None,
        loss=callable_ref(loss, "--loss") if loss else None,
        overrides=overrides,
    )


def once_each(pairs: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    """``pairs`` as they are, unless a key comes twice: which value the model would get is a
    guess (the last one), so ``hidden=128,hidden=64`` is refused rather than half kept."""
    values: dict[str, list[str]] = {}
    for key, value in pairs:
        values.setdefault(key, []).append(value)
    if twice := {key: given for key, given in values.items() if len(given) > 1}:
        said = "; ".join(
            f"{key} {len(given)} times ({', '.join(f'{key}={v}' for v in given)})" for key, given in twice.items()
        )
        raise ModelRefError(f"--model-config gives {said}; give each key once")
    return pairs


def _pairs(config: Iterable[tuple[str, Any]] | dict[str, Any]) -> tuple[tuple[str, str], ...]:
    items = config.items() if isinstance(config, dict) else config
    return tuple((str(key), str(value)) for key, value in items)


def reference_of(function: Callable[..., Any] | str, role: str) -> str:
    """``module:qualname`` of a function (or class) a worker can import again: one defined
    in a script run as ``__main__`` is named by the script's path. A lambda, a function
    defined inside another, or one typed into an interactive session has no such name."""
    if isinstance(function, str):
        return function
    name = getattr(function, "__qualname__", None)
    module = getattr(function, "__module__", None)
    if not callable(function) or name is None or module is None:
        raise ModelRefError(
            f"{role}: expected a function, a class or a 'module:function' string, got {type(function).__name__} "
            "(a model object cannot cross into the worker processes; pass the function that builds it)"
        )
    if "<lambda>" in name or "<locals>" in name or "." in name:
        raise ModelRefError(
            f"{role}: {name} is not importable by name (a lambda or a function defined inside another); "
            "define it at the top level of a module or script"
        )
    if module == "__main__":
        script = getattr(sys.modules["__main__"], "__file__", None)
        if not script:
            raise ModelRefError(
                f"{role}: {name} was defined in an interactive session, which the worker processes cannot import; "
                "put it in a .py file and import it from there"
            )
        return f"{Path(script).resolve()}:{name}"
    return f"{module}:{name}"


def module_root(function: Callable[..., Any] | str) -> Path | None:
    """The folder a function's module is imported from (the one holding its top package),
    which the workers need on their path too; None for a string or a script's function."""
    module = sys.modules.get(getattr(function, "__module__", None) or "")
    path = getattr(module, "__file__", None)
    if isinstance(function, str) or module is None or module.__name__ == "__main__" or not path:
        return None
    root = Path(path).resolve().parent
    for _ in range(module.__name__.count(".") + (Path(path).name == "__init__.py")):
        root = root.parent
    return root


def resolve(ref: ModelRef) -> Workload:
    """The reference's workload (``workloads.custom.resolve``); bad input is a ModelRefError."""
    from workloads.custom import resolve as resolve_ref

    return resolve_ref(ref)


def stored_ref(workload: Workload) -> str:
    """The JSON of a user's model's reference as its runs carry it and its rows store it: the
    overrides that differ from the defaults, and the task the model serves (the same model
    as the reference given, which labels then show by what sets it apart)."""
    return workload.config(workload.default_size).ref.to_json()


def check_dims(workload: Workload, given: Mapping[str, Any]) -> None:
    """A dimension given (``--image-size``) that a user's model's inputs do not take is a
    ModelRefError naming what they take and how to take more (``make_inputs``'s signature),
    where the planner's own message could only name the registered workloads taking it."""
    from workloads.base import DIMENSIONS
    from workloads.custom.workload import CustomModel

    model = workload.config(workload.default_size)
    unknown = [name for name in DIMENSIONS if given.get(name) is not None and name not in workload.dims]
    if unknown and isinstance(model, CustomModel):
        options = ", ".join("--" + name.replace("_", "-") for name in unknown)
        raise ModelRefError(f"{options} does not apply to {workload.name}: {model.takes}")


def prepared(workload: Workload, specs: list[RunSpec]) -> list[RunSpec]:
    """``specs`` of a user's model, each dry-run here at its shape and mode (a config that
    cannot run, such as a bare T5 without ``decoder_start_token_id``, or a factory whose
    weights are unseeded, is a ModelRefError before any run) and given the model's hash."""
    from workloads import Shape
    from workloads.custom import check_seeded, dry_run

    check_seeded(workload)
    config = workload.config(workload.default_size)
    done = []
    for spec in specs:
        shape = Shape(spec.batch_size, **spec.dims())
        dry_run(workload, shape, spec.mode)  # counted once per shape and mode, and kept
        model_hash = workload.row_columns(config, shape, spec.mode)["model_hash"] if workload.row_columns else None
        done.append(replace(spec, model_hash=model_hash))
    return done


class WorkloadUnavailable(LookupError):
    """The run's workload cannot be made in this interpreter (its module does not import
    here, or a plugin fails): the run's row is ``unavailable``, naming the interpreter."""


def workload_for(spec: RunSpec) -> Workload:
    """The workload a worker measures: the spec's model reference resolved again here, or
    the registry's workload of that name."""
    from workloads import RegistryError, get_workload

    try:
        if spec.model_ref:
            return resolve(ModelRef.from_json(spec.model_ref))
        return get_workload(spec.workload)
    except (ModelRefError, RegistryError) as error:
        raise WorkloadUnavailable(f"{spec.workload} cannot be loaded by {sys.executable}: {error}") from error
