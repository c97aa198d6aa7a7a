"""``tpubench.bench``: benchmark your own model from a notebook or a script, through the same
isolated workers as ``tpubench run --model``.

A worker is a separate process (another interpreter for ``--python``, another host for
Ray), so what crosses to it is a reference to the function that builds the model, never
the model: a function of an importable module is named ``module:function``, one defined
in the script being run by the script's path. A script that calls :func:`bench` at its
top level must do so under ``if __name__ == "__main__":``, since each worker imports the
script again to find the factory.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tpubench.spec import PARALLEL_CHOICES, SCALING_CHOICES
from tpubench.warning import TpubenchWarning

if TYPE_CHECKING:
    import pandas as pd

Factory = Callable[..., Any] | str

#: torch's switch for its device-plugin autoload (the ``torch.backends`` entry points, torch_tpu's among them)
AUTOLOAD = "TORCH_DEVICE_BACKEND_AUTOLOAD"
#: what a user's process can do about a torch_tpu that its own ``import torch`` loaded
AUTOLOADED = (
    "torch_tpu was loaded into this process by `import torch` (its `torch.backends` entry point autoloads "
    "it): tpubench measures in its workers and needs no TorchTPU here, where it costs start-up time and, "
    "on a TPU host, can hold the chip a tpu run needs; start Python with TORCH_DEVICE_BACKEND_AUTOLOAD=0 "
    "(docs/install-and-backends.md)"
)


#: the CLI's options whose argument of :func:`bench` has another name
_ARGUMENTS = {"backend": "backends", "mode": "modes", "python": "pythons", "tag": "tags"}
#: the options whose words are their values (``--parallel tp``), which read as ``parallel='tp'``
_CHOICES = {"parallel": PARALLEL_CHOICES, "scaling": SCALING_CHOICES}
_OPTION = re.compile(r"--([a-z][a-z-]*)(?: (\d+\b|'[^']*'|[a-z_]+\b))?")


def api_words(message: str) -> str:
    """A planning or model error, written in the CLI's words (``--devices 2 needs --parallel``),
    in :func:`bench`'s: its arguments (``devices=2 needs parallel``), so that the fix it asks
    for is one the caller can make."""

    def argument(match: re.Match[str]) -> str:
        name = match.group(1).replace("-", "_")
        name, value = _ARGUMENTS.get(name, name), match.group(2)
        if value is None:
            return name
        if value[0].isdigit() or value.startswith("'"):
            return f"{name}={value}"
        return f"{name}={value!r}" if value in _CHOICES.get(name, ()) else f"{name} {value}"

    return _OPTION.sub(argument, message)


def _torch_without_device_plugins() -> None:
    """Import torch, if this process has not, with device plugins' autoload off.

    :func:`bench` imports torch here, in the user's process, to resolve the model and dry-run
    it; torch_tpu's entry point would load TorchTPU with it, and on a host without a chip the
    dry run's backward then polls the cloud metadata server for minutes. The variable is put
    back after the import (torch reads it only then), so the user's own child processes keep
    their environment; a value the user set is left alone."""
    if "torch" in sys.modules or AUTOLOAD in os.environ:
        return
    os.environ[AUTOLOAD] = "0"
    try:
        import torch  # noqa: F401  (imported for its side effect: no plugin loads with it)
    finally:
        del os.environ[AUTOLOAD]


def _quiet_autoloaded_torch_tpu() -> None:
    """When the user's own ``import torch`` loaded torch_tpu before :func:`bench` could keep
    it out, keep the dry run's backward (which starts the device runtime of every registered
    backend) off the metadata server on a host without a chip, as tpubench's off-TPU
    workers are (``TPU_SKIP_MDS_QUERY``), and say how to keep it out next time."""
    if "torch_tpu" not in sys.modules:
        return
    from tpubench.backends.tpu import tpu_pci_devices

    if not tpu_pci_devices():
        os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    warnings.warn(AUTOLOADED, TpubenchWarning, stacklevel=3)


def bench(
    model_or_factory: Factory,
    inputs: Factory | None = None,
    loss: Factory | None = None,
    *,
    backends: Sequence[str] | None = None,
    modes: Sequence[str] | None = None,
    batch_size: int | Sequence[int] | None = None,
    seq_len: int | Sequence[int] | None = None,
    image_size: int | Sequence[int] | None = None,
    latent_size: int | Sequence[int] | None = None,
    devices: int | Sequence[int] | None = None,
    parallel: str = "none",
    tp: int | None = None,
    scaling: str | None = None,
    model_config: dict[str, Any] | Iterable[tuple[str, Any]] | None = None,
    task: str | None = None,
    dtype: str | None = None,
    precision: str | None = None,
    results: str | Path | None = None,
    pythons: dict[str, str] | None = None,
    tags: dict[str, str] | None = None,
    **options: Any,
) -> pd.DataFrame:
    """Measure a model on ``backends`` in ``modes``; one row per run, as ``tpubench run`` stores it.

    ``model_or_factory``: a function (or class) that returns an ``nn.Module``, a
    ``"module:function"`` or ``"path/to/file.py:function"`` string, or ``"hf:llama"``,
    ``"hf:/path/to/dir"``. ``inputs`` makes a batch, ``(batch_size, generator, **dims) ->
    dict | tuple``; ``loss`` is ``(model, batch) -> scalar``. ``model_config`` goes to the
    factory as keyword arguments (hf: onto the config). ``devices`` (a sweep), ``parallel``
    (dp, fsdp, tp, fsdp_tp), ``tp`` and ``scaling`` spread each run over several devices, as
    ``tpubench run --devices`` does (docs/multi-device.md). ``backends`` default to the CPU,
    ``modes`` to train and infer. ``precision`` (``fp8``, ``int8-wo``...: docs/precision.md)
    sets the dtype it builds in, as ``--precision`` does; without it ``dtype`` (default
    float32). A mode or backend it cannot take is left out with a warning, or a ValueError
    where ``modes`` or ``backends`` named it. ``options`` are the remaining
    :class:`tpubench.spec.RunSpec` settings (``steps``, ``warmup``, ``timeout_s``,
    ``verify``...). The rows are written to the store only when ``results`` names one.
    Bad input (an unknown backend too) raises :class:`workloads.custom.ModelRefError` (a
    ``ValueError``) before anything runs, naming these arguments (``devices=2 needs
    parallel``), not the CLI's options.
    """
    _torch_without_device_plugins()
    _quiet_autoloaded_torch_tpu()
    import pandas as pd

    from tpubench.models import (
        check_dims,
        importable_from,
        model_ref,
        module_root,
        prepared,
        reference_of,
        resolve,
        stored_ref,
    )
    from tpubench.precision import choices as precisions
    from tpubench.runner import SuiteRunner, plan
    from workloads.custom.ref import ModelRefError

    for given in (model_or_factory, inputs, loss):  # where the workers will import it from
        if given is not None:
            importable_from(module_root(given) or Path.cwd())
    try:
        ref = model_ref(
            reference_of(model_or_factory, "model"),
            inputs=reference_of(inputs, "inputs") if inputs is not None else None,
            loss=reference_of(loss, "loss") if loss is not None else None,
            config=model_config,
            task=task,
        )
        workload = resolve(ref)
        check_dims(workload, {"seq_len": seq_len, "image_size": image_size, "latent_size": latent_size})
        precision, dtype = precisions.resolve(precision, dtype)
        try:
            specs = plan(
                [workload],
                backends=backends or ("cpu",),
                modes=modes or ("train", "infer"),
                dtype=dtype,
                precision=precision,
                batch_size=batch_size,
                seq_len=seq_len,
                image_size=image_size,
                latent_size=latent_size,
                devices=devices,
                parallel=parallel,
                tp=tp,
                scaling=scaling,
                model_ref=stored_ref(workload),
                **options,
            )
        except KeyError as error:  # an unknown backend: bad input, like the rest
            raise ValueError(error.args[0]) from None
        specs, notes = precisions.runnable(prepared(workload, specs), modes or (), backends or ())
    except ValueError as error:  # ModelRefError among them
        raise ModelRefError(api_words(str(error))) from None
    for note in notes:  # a mode or backend the precision cannot take, left out
        warnings.warn(api_words(note.removeprefix("note: ")), TpubenchWarning, stacklevel=2)
    with tempfile.TemporaryDirectory(prefix="tpubench-bench-") as scratch:
        runner = SuiteRunner(results_dir=results or scratch, pythons=dict(pythons or {}), tags=dict(tags or {}))
        rows = runner.run(specs)
    return pd.DataFrame(rows)
