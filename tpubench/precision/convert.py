"""A built model in its precision, through torchao's public API only (docs/precision.md).

The worker builds the model in bfloat16 and, before the backend prepares (compiles) it,
:func:`convert` swaps its linears: ``convert_to_float8_training`` with a
``Float8LinearConfig`` recipe (``tensorwise``, ``rowwise``) for fp8, ``quantize_`` with
``Int8WeightOnlyConfig``, ``Int8DynamicActivationInt8WeightConfig`` or
``Int4WeightOnlyConfig`` (tinygemm's packing) for the integer precisions, and torchao's MX
configs for mxfp8. Which linears a precision may take is decided here, with the rule torchao
states for it, so that each one left out has its reason (``skipped_linears``, ``conversion``);
which were converted is read back from the model afterwards, never assumed.

What the device cannot run is said by :func:`unavailable` before the model is built: the
run's row is ``unavailable`` with the reason, never a silent bf16 run. A model none of whose
linears can take the precision is unavailable too: it would run in bf16.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from tpubench.precision.choices import PRECISIONS

#: the divisor torchao's float8 requires of both dims of a linear (its ``_scaled_mm``'s)
FLOAT8_MULTIPLE = 16
#: MX scales one exponent per block of 32 elements along the reduced dim
MX_BLOCK = 32
#: Int4WeightOnlyConfig's default group: a weight's input dim must be a multiple of it
INT4_GROUP = 128
#: the compute capability each precision needs on CUDA (torch._scaled_mm's fp8 from Ada and
#: Hopper; MX's block-scaled tensor cores from Blackwell; tinygemm's int4 from Ampere)
CUDA_CAPABILITY = {"fp8": (8, 9), "fp8-rowwise": (8, 9), "mxfp8": (10, 0), "int4-wo": (8, 0)}
#: what each precision needs that a CPU lacks in torchao 0.18
CPU_LACKS = {
    "mxfp8": "mxfp8 needs an NVIDIA GPU of compute capability 10.0 (Blackwell) for MX block-scaled matmuls",
    "int4-wo": "int4-wo needs CUDA: torchao 0.18's Int4WeightOnlyConfig packs for tinygemm (CUDA) or the mslk "
    "kernels (a CUDA package), and its plain_int32 packing says it does not support device 'cpu' yet",
}


class Unconvertible(Exception):
    """No linear of the model can take the precision: the run would be a bf16 run."""


@dataclass
class Conversion:
    """What :func:`convert` did: the linears converted and those left out, with why."""

    precision: str
    api: str
    config: str
    converted: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)

    def columns(self) -> dict[str, Any]:
        """The runs table's ``converted_linears``, ``skipped_linears`` and ``conversion`` (JSON)."""
        detail = {
            "api": self.api,
            "config": self.config,
            "torchao": torchao_version(),
            "converted": self.converted,
            "skipped": self.skipped,
        }
        return {
            "converted_linears": len(self.converted),
            "skipped_linears": len(self.skipped),
            "conversion": json.dumps(detail, sort_keys=True),
        }


def torchao_version() -> str | None:
    with contextlib.suppress(ImportError):
        from importlib.metadata import version

        return version("torchao")
    return None


def unavailable(precision: str, device: torch.device) -> str | None:
    """Why this process's ``device`` cannot run ``precision`` ("fp8 needs compute capability
    8.9; this GPU is 8.0"), or None where it can. Plain precisions always can."""
    if PRECISIONS[precision].api is None:
        return None
    if importlib.util.find_spec("torchao") is None:
        return f"--precision {precision} needs torchao: pip install 'tpubench[precision]'"
    if device.type == "cpu":
        return CPU_LACKS.get(precision)
    if device.type == "cuda":
        need = CUDA_CAPABILITY.get(precision)
        have = torch.cuda.get_device_capability(device)
        if torch.version.hip is not None and precision in CUDA_CAPABILITY:
            return f"{precision} through torchao is not supported on ROCm builds here (CUDA compute capability rules)"
        if need and have < need:
            return f"{precision} needs compute capability {need[0]}.{need[1]}; this GPU is {have[0]}.{have[1]}"
        return None
    return f"--precision {precision} has no torchao path on {device.type} devices"


#: the loggers torchao's first import speaks through on a CPU build: its own ("Failed to load
#: ..._C_mxfp8...so", extension libraries a CPU cannot load) and torch's pytree registry (an
#: Enum registered as a constant, deprecated); harmless notes, not the user's business
IMPORT_LOGGERS = ("torchao", "torch.utils._pytree")


@contextlib.contextmanager
def quiet_import() -> Iterator[None]:
    """torchao's import and conversion, with :data:`IMPORT_LOGGERS` held to errors."""
    loggers = [logging.getLogger(name) for name in IMPORT_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def linears(model: nn.Module) -> dict[str, nn.Linear]:
    return {name: module for name, module in model.named_modules() if isinstance(module, nn.Linear)}


def tied(model: nn.Module) -> dict[str, str]:
    """Each linear whose weight another module also holds (a tied LM head), and that module."""
    owners: dict[int, list[str]] = {}
    for name, module in model.named_modules():
        for param in module.parameters(recurse=False):
            owners.setdefault(id(param), []).append(name)
    found = {}
    for name, module in linears(model).items():
        others = [owner for owner in owners.get(id(module.weight), []) if owner != name]
        if others:
            found[name] = others[0]
    return found


def rule(precision: str, model: nn.Module) -> Callable[[str, nn.Linear], str | None]:
    """The reason a linear cannot take ``precision``, or None: torchao's stated requirement
    (float8: both dims multiples of 16; MX: of 32; int4: the input dim a multiple of its
    group of 128), and for quantize_'s tensor subclasses a weight tied to another module,
    which quantizing would untie (a second copy of the embedding, another model)."""
    shared = tied(model) if PRECISIONS[precision].api.endswith("quantize_") else {}

    def reason(name: str, linear: nn.Linear) -> str | None:
        out_dim, in_dim = linear.weight.shape
        if precision in ("fp8", "fp8-rowwise") and (in_dim % FLOAT8_MULTIPLE or out_dim % FLOAT8_MULTIPLE):
            return f"dims {in_dim}x{out_dim} not divisible by {FLOAT8_MULTIPLE} (torchao float8's requirement)"
        if precision == "mxfp8" and (in_dim % MX_BLOCK or out_dim % MX_BLOCK):
            return f"dims {in_dim}x{out_dim} not divisible by MX's block of {MX_BLOCK}"
        if precision == "int4-wo" and in_dim % INT4_GROUP:
            return f"input dim {in_dim} not divisible by int4's group of {INT4_GROUP}"
        if name in shared:
            return f"weight tied to {shared[name]}: quantizing it would untie them"
        return None

    return reason


def convert(model: nn.Module, precision: str, mode: str) -> Conversion:
    """Convert ``model``'s linears (in place) to ``precision`` for ``mode``; raise
    :class:`Unconvertible` where none can take it. Plain precisions change nothing."""
    chosen = PRECISIONS[precision]
    if chosen.api is None:
        return Conversion(precision, "none", "none")
    reason = rule(precision, model)
    skipped = {name: why for name, linear in linears(model).items() if (why := reason(name, linear))}
    if len(skipped) == len(linears(model)):
        raise Unconvertible(
            f"no linear of this model can take {precision} ({len(skipped)} left out: "
            f"{'; '.join(sorted(set(skipped.values())))}): it would run in bf16"
        )
    before = {name: (type(linear), type(linear.weight)) for name, linear in linears(model).items()}
    with quiet_import():
        api, config = apply(model, precision, mode, lambda module, name: isinstance(module, nn.Linear)
                            and name not in skipped)  # fmt: skip
    after = dict(model.named_modules())
    converted = [
        name
        for name, kinds in before.items()
        if name not in skipped and (type(after[name]), type(after[name].weight)) != kinds
    ]
    for name in before:  # torchao's own filters may leave one out that our rule let through
        if name not in skipped and name not in converted:
            skipped[name] = "left unconverted by torchao"
    return Conversion(precision, api, config, converted, skipped)


def apply(model: nn.Module, precision: str, mode: str, wanted: Callable[[nn.Module, str], bool]) -> tuple[str, str]:
    """torchao's API for ``precision`` over the linears ``wanted`` takes; returns the API's
    name and its config as text (for ``conversion``)."""
    if precision in ("fp8", "fp8-rowwise"):
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

        recipe = "tensorwise" if precision == "fp8" else "rowwise"
        config = Float8LinearConfig.from_recipe_name(recipe)
        convert_to_float8_training(model, config=config, module_filter_fn=wanted)
        return "torchao.float8.convert_to_float8_training", f"Float8LinearConfig.from_recipe_name({recipe!r})"
    from torchao.quantization import quantize_

    config = quantize_config(precision, mode)
    quantize_(model, config, filter_fn=lambda module, name: wanted(module, name))
    return "torchao.quantization.quantize_", repr(config)


def quantize_config(precision: str, mode: str) -> Any:
    """``quantize_``'s config for an integer or MX precision."""
    from torchao.quantization import (
        Int4WeightOnlyConfig,
        Int8DynamicActivationInt8WeightConfig,
        Int8WeightOnlyConfig,
    )

    if precision == "int8-wo":
        return Int8WeightOnlyConfig()
    if precision == "int8-dq":
        return Int8DynamicActivationInt8WeightConfig()
    if precision == "int4-wo":  # tinygemm's packing: built into torch's CUDA kernels, no extra package
        return Int4WeightOnlyConfig(group_size=INT4_GROUP, int4_packing_format="tile_packed_to_4d")
    if precision == "mxfp8":  # prototype configs: training swaps the weights, inference quantizes both sides
        if mode == "train":
            from torchao.prototype.moe_training.config import MXFP8TrainingOpConfig, MXFP8TrainingRecipe

            return MXFP8TrainingOpConfig.from_recipe(MXFP8TrainingRecipe.MXFP8_RCEIL)
        from torchao.prototype.mx_formats import MXDynamicActivationMXWeightConfig

        return MXDynamicActivationMXWeightConfig()
    raise ValueError(f"no quantize_ config for {precision!r}")
