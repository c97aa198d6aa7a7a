"""The precisions a run may take, and what each means, torch-free (docs/precision.md).

A precision names the numbers a run's matmuls compute in. ``bf16`` and ``fp32`` are the
plain dtypes (``--dtype bfloat16`` and ``float32``, the only runs before ``--precision``);
the others build the model in bfloat16 (their base ``dtype``) and then convert its linears
through torchao's public API: float8 training (``fp8`` tensorwise, ``fp8-rowwise``), MX
float8 (``mxfp8``), and ``quantize_``'s int8 and int4 configs, inference only. ``matmul``
is the key of :mod:`tpubench.peaks` and the ceilings that MFU is held against: a
weight-only precision dequantises its weights and multiplies in bfloat16, so it is held
against the bf16 peak; int8 dynamic quantisation multiplies in int8.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc


@dataclass(frozen=True)
class Precision:
    """One ``--precision`` choice."""

    name: str
    dtype: str  # the dtype the model is built in (and its unconverted parts compute in)
    matmul: str  # the peak (tpubench.peaks) and ceiling dtype its converted matmuls run at
    api: str | None  # torchao's public API that applies it; None: a plain dtype
    modes: tuple[str, ...] | None = None  # the modes it applies to; None: every mode
    #: the backend families that have a torchao path for it (xla and TorchTPU run none)
    families: tuple[str, ...] = ("cpu", "cuda", "xla", "tpu")


INFERENCE_MODES = ("infer", "prefill", "decode")
TORCHAO_FAMILIES = ("cpu", "cuda")
FLOAT8_TRAINING = "torchao.float8.convert_to_float8_training"
QUANTIZE = "torchao.quantization.quantize_"

PRECISIONS: dict[str, Precision] = {
    p.name: p
    for p in (
        Precision("bf16", "bfloat16", "bfloat16", None),
        Precision("fp32", "float32", "float32", None),
        Precision("fp8", "bfloat16", "fp8", FLOAT8_TRAINING, families=TORCHAO_FAMILIES),
        Precision("fp8-rowwise", "bfloat16", "fp8", FLOAT8_TRAINING, families=TORCHAO_FAMILIES),
        # MX float8 runs on the fp8 tensor cores (Blackwell): held against the fp8 peak
        Precision("mxfp8", "bfloat16", "fp8", QUANTIZE, families=TORCHAO_FAMILIES),
        Precision("int8-wo", "bfloat16", "bfloat16", QUANTIZE, INFERENCE_MODES, TORCHAO_FAMILIES),
        Precision("int8-dq", "bfloat16", "int8", QUANTIZE, INFERENCE_MODES, TORCHAO_FAMILIES),
        Precision("int4-wo", "bfloat16", "bfloat16", QUANTIZE, INFERENCE_MODES, TORCHAO_FAMILIES),
    )
}
#: the precision a run of a plain dtype computes in: what a row from before ``--precision`` reads as
PLAIN = {"float32": "fp32", "bfloat16": "bf16"}
#: what every low precision's quality is measured against (the quality columns)
REFERENCE = "bf16"


def plain(dtype: str) -> str | None:
    """The precision of a plain ``dtype`` run (``bfloat16`` -> ``bf16``), None for another."""
    return PLAIN.get(dtype)


def of_row(precision: Any, dtype: Any) -> Any:
    """A stored row's precision: its own, or for a row from before ``--precision`` (null) its
    dtype's plain one; null where neither is known."""
    if isinstance(precision, str) and precision:
        return precision
    return PLAIN.get(dtype) if isinstance(dtype, str) else None


def filled(frame: Any) -> Any:
    """A runs DataFrame with each row's ``precision`` (:func:`of_row`): its own, or for a row
    from before ``--precision`` (null, or a store without the column) its dtype's plain one,
    bfloat16 -> bf16, float32 -> fp32, so that it pairs and resumes with the runs written
    since. ``frame`` itself where nothing is missing, else a copy."""
    if "dtype" not in frame.columns:
        return frame
    # in Arrow, not a Python call per row, nor a copy of every column: over a year of a
    # fleet's runs (100,000 rows) those cost 0.15 s of each fresh read of the runs index
    dtypes = pa.array(frame["dtype"], pa.string(), from_pandas=True)
    plain_of = pc.take(pa.array(list(PLAIN.values())), pc.index_in(dtypes, value_set=pa.array(list(PLAIN))))
    if "precision" in frame.columns:
        own = pa.array(frame["precision"], pa.string(), from_pandas=True)
        named = pc.fill_null(pc.not_equal(own, ""), False)
        if pc.all(named).as_py() is not False:  # every row names its own (or there is none)
            return frame
        plain_of = pc.if_else(named, own, plain_of)
    frame = frame.copy(deep=False)  # the new column replaces the old one: the caller's frame keeps its own
    frame["precision"] = plain_of.to_numpy(zero_copy_only=False)
    return frame


def is_converted(precision: Any) -> bool:
    """Whether ``precision`` converts the model (anything but a plain dtype)."""
    known = PRECISIONS.get(precision) if isinstance(precision, str) else None
    return known is not None and known.api is not None


def label(precision: Any, dtype: Any) -> str:
    """The precision as labels name it: "" where it is ``dtype``'s plain one (the dtype says
    it), else its name (``fp8``), so that old labels read as they always did."""
    found = of_row(precision, dtype)
    return "" if found is None or found == PLAIN.get(dtype) else str(found)


def resolve(precision: str | None, dtype: str | None, default_dtype: str = "float32") -> tuple[str, str]:
    """``(precision, dtype)`` from ``--precision`` and ``--dtype``: a precision sets its base
    dtype; a dtype alone its plain precision; neither, ``default_dtype``. A ValueError names the
    valid choices, or the contradiction (``--precision fp8`` builds in bfloat16)."""
    if precision is None:
        dtype = dtype or default_dtype
        if dtype not in PLAIN:
            raise ValueError(f"unknown dtype {dtype!r}; valid: {', '.join(PLAIN)}")
        return PLAIN[dtype], dtype
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; valid: {', '.join(PRECISIONS)}")
    base = PRECISIONS[precision].dtype
    if dtype is not None and dtype != base:
        raise ValueError(
            f"--precision {precision} computes in {base} (its base dtype); --dtype {dtype} contradicts it: drop --dtype"
        )
    return precision, base


def mode_refusal(precision: str, mode: str) -> str | None:
    """Why ``precision`` never runs in ``mode`` (bad input where the mode was named), or None."""
    chosen = PRECISIONS[precision]
    if chosen.modes is None or mode in chosen.modes:
        return None
    trains = ", ".join(p.name for p in PRECISIONS.values() if p.modes is None)
    modes = ", ".join(chosen.modes)
    return f"--precision {precision} quantizes for inference: modes {modes}, not {mode} (train in {trains})"


def backend_refusal(precision: str, backend: str) -> str | None:
    """Why ``precision`` never runs on ``backend`` (no torchao path there), or None. What only
    the device can say (an A100 has no fp8) is an ``unavailable`` row instead
    (:mod:`tpubench.precision.convert`)."""
    chosen = PRECISIONS[precision]
    if backend.split("-")[0] in chosen.families:
        return None
    return (
        f"--precision {precision} has no torchao path on the {backend} backend; it runs on "
        f"{', '.join(chosen.families)} backends"
    )


def runnable(
    specs: list[Any], named_modes: Collection[str], named_backends: Collection[str]
) -> tuple[list[Any], list[str]]:
    """The planned runs (:class:`tpubench.spec.RunSpec`) their precision can take, and a note for
    each mode or backend left out. A mode or backend the user named (``--mode train`` with
    ``int8-wo``, ``--backend xla`` with ``fp8``) is a ValueError instead, as is a converted
    precision over several devices: bad input, said before anything runs."""
    kept, notes = [], []
    for spec in specs:
        refusals = (
            (mode_refusal(spec.precision, spec.mode), spec.mode in named_modes),
            (backend_refusal(spec.precision, spec.backend), spec.backend in named_backends),
        )
        for why, named in refusals:
            if why and named:
                raise ValueError(why)
        if spec.devices > 1 and is_converted(spec.precision):
            raise ValueError(
                f"--precision {spec.precision} runs on one device: converting a model split over "
                f"{spec.devices} devices (torchao's float8 with FSDP2 or tensor parallelism) is not built yet"
            )
        if whys := [why for why, _ in refusals if why]:
            notes += [f"note: {why}: left out" for why in whys]
        else:
            kept.append(spec)
    return kept, list(dict.fromkeys(notes))
