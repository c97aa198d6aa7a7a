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

import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
    import pandas as pd

Factory = Callable[..., Any] | str


def bench(
    model_or_factory: Factory,
    inputs: Factory | None = None,
    loss: Factory | None = None,
    *,
    backends: Sequence[str] = ("cpu",),
    modes: Sequence[str] = ("train", "infer"),
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
    dtype: str = "float32",
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
    ``tpubench run --devices`` does (docs/multi-device.md). ``options`` are the remaining
    :class:`tpubench.spec.RunSpec` settings (``steps``, ``warmup``, ``timeout_s``,
    ``verify``...). The rows are written to the store only when ``results`` names one.
    Bad input raises :class:`workloads.custom.ModelRefError` (a ``ValueError``) before
    anything runs.
    """
    import pandas as pd

    from tpubench.runner import SuiteRunner, plan

    for given in (model_or_factory, inputs, loss):  # where the workers will import it from
        if given is not None:
            importable_from(module_root(given) or Path.cwd())
    ref = model_ref(
        reference_of(model_or_factory, "model"),
        inputs=reference_of(inputs, "inputs") if inputs is not None else None,
        loss=reference_of(loss, "loss") if loss is not None else None,
        config=model_config,
        task=task,
    )
    workload = resolve(ref)
    check_dims(workload, {"seq_len": seq_len, "image_size": image_size, "latent_size": latent_size})
    specs = plan(
        [workload],
        backends=backends,
        modes=modes,
        dtype=dtype,
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
    specs = prepared(workload, specs)
    with tempfile.TemporaryDirectory(prefix="tpubench-bench-") as scratch:
        runner = SuiteRunner(results_dir=results or scratch, pythons=dict(pythons or {}), tags=dict(tags or {}))
        rows = runner.run(specs)
    return pd.DataFrame(rows)
