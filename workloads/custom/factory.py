"""The factory route: ``--model pkg.mod:make_model`` or ``/path/file.py:make_model``.

The contract: ``make_model(**overrides) -> nn.Module``, called on the CPU under
tpubench's seed, touching neither a device nor the network (it is also called on the meta
device, to count FLOPs and memory for free). Inputs come from ``--inputs
mod:make_inputs`` (``make_inputs(batch_size, generator, **dims) -> dict | tuple``: it gets
the dimensions the user gave, ``--seq-len``, ``--image-size`` or ``--latent-size``, where it
takes them, by name or through ``**dims``; a parameter named for one, with its default,
puts that dimension in the default shape), else from the model's ``get_example_inputs()``
(TorchBench's convention, a fixed batch). The loss is ``--loss mod:fn(model, batch)``, else
the output's ``.loss``, else the mean of the output's floating tensors (synthesised, and the
row says so). Floating inputs are cast to the model's dtype, so a bfloat16 run works with
float32 inputs.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from workloads.base import DIMENSIONS, Batch, Shape
from workloads.custom.loading import load_function, one_line, parse_overrides, same_value, source_digest
from workloads.custom.ref import ModelRef, ModelRefError
from workloads.custom.workload import CustomModel, dtype_of

#: a dimension's default when ``make_inputs`` gives its parameter none
DIMENSION_DEFAULTS = {"seq_len": 128, "image_size": 224, "latent_size": 32}
#: default batch sizes by device kind (small: a user's model is of unknown size)
BATCH_DEFAULTS = {"cpu": 2, "cuda": 8, "tpu": 8}
POSITIONAL = "arg"  # a tuple of inputs is stored as arg0, arg1...: a batch is a dict of tensors

LOSS_SOURCES = {"user": "user loss", "model": "model .loss", "synthesised": "synthesised: mean of outputs"}


def factory_model(ref: ModelRef) -> CustomModel:
    make_model = load_function(ref.target, "factory")
    make_inputs = load_function(ref.inputs, "inputs function") if ref.inputs else None
    user_loss = load_function(ref.loss, "loss function") if ref.loss else None
    overrides = parse_overrides(ref.overrides)

    def build() -> nn.Module:
        try:
            module = make_model(**overrides)
        except TypeError as error:
            if overrides and "keyword argument" in str(error):
                accepted = ", ".join(inspect.signature(make_model).parameters) or "none"
                raise ModelRefError(
                    f"factory {ref.target} does not take {one_line(error)}; its parameters: {accepted}"
                ) from error
            raise
        if not isinstance(module, nn.Module):
            raise ModelRefError(f"factory {ref.target} returned a {type(module).__name__}, not a torch.nn.Module")
        return module

    probe = probe_model(build, ref)
    if make_inputs is not None:
        inputs = FromMakeInputs(make_inputs)
    elif callable(getattr(probe, "get_example_inputs", None)):
        inputs = FromExamples(build, probe)
    else:
        raise ModelRefError(
            f"no inputs for {ref.target}: give --inputs mod:make_inputs(batch_size, generator, **dims), "
            f"or a get_example_inputs() method on {type(probe).__name__}"
        )
    seen: dict[str, str] = {}

    def loss(module: nn.Module, batch: Batch) -> torch.Tensor:
        if user_loss is not None:
            seen["source"] = "user"
            return user_loss(module, user_form(cast(batch, module)))
        out = call(module, batch)
        if (model_loss := output_loss(out)) is not None:
            seen["source"] = "model"
            return model_loss
        seen["source"] = "synthesised"
        return mean_of_outputs(out, ref)

    functions = [f for f in (make_model, make_inputs, user_loss) if f is not None]
    references = (ref.target, ref.inputs, ref.loss)
    return CustomModel(
        ref=without_defaults(make_model, ref, overrides),
        family="custom",
        description=f"{type(probe).__name__} from {ref.target}",
        build=build,
        make_batch=inputs.make_batch,
        loss=loss,
        forward=call,
        dims=inputs.dims,
        takes=inputs.takes,
        default_shape=inputs.default_shape(),
        identity=json.dumps(
            {
                "source": source_digest(functions),
                "functions": [reference.rpartition(":")[2] if reference else None for reference in references],
                "config": effective_config(make_model, overrides),
            },
            sort_keys=True,
            default=lambda value: type(value).__qualname__,  # an object's repr may hold its address
        ),
        loss_source=lambda: LOSS_SOURCES[seen.get("source", "user" if user_loss else "model")],
        check_determinism=True,
    )


def without_defaults(make_model: Callable[..., Any], ref: ModelRef, overrides: dict[str, Any]) -> ModelRef:
    """``ref`` less the overrides equal to ``make_model``'s defaults: it names the same model,
    and the labels drawn from it show only what differs from the defaults."""
    try:
        parameters = inspect.signature(make_model).parameters
    except (TypeError, ValueError):
        return ref
    empty = inspect.Parameter.empty
    defaults = {key: getattr(parameters.get(key), "default", empty) for key in overrides}
    kept = tuple((key, text) for key, text in ref.overrides if not same_value(defaults[key], overrides[key]))
    return replace(ref, overrides=kept)


def effective_config(make_model: Callable[..., Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """The arguments ``make_model`` builds with: the overrides and its defaults for the rest,
    so that ``hidden=64`` given and ``hidden=64`` by default are one model."""
    try:
        bound = inspect.signature(make_model).bind_partial(**overrides)
    except (TypeError, ValueError):  # no signature to read, or one the overrides miss: build() says which
        return dict(overrides)
    bound.apply_defaults()
    return dict(bound.arguments)


def probe_model(build: Callable[[], nn.Module], ref: ModelRef) -> nn.Module:
    """The model built once to see what it is: on meta (free), else on the CPU under a seed."""
    try:
        with torch.device("meta"):
            return build()
    except ModelRefError:
        raise
    except Exception:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            try:
                return build()
            except ModelRefError:
                raise
            except Exception as error:
                raise ModelRefError(f"factory {ref.target} fails: {type(error).__name__}: {one_line(error)}") from error


class FromMakeInputs:
    """Inputs from the user's ``make_inputs(batch_size, generator, **dims)``: it takes the
    dimensions it names, or every one through ``**dims``; those it names are in the default
    shape (at their defaults), the others reach it only when given."""

    def __init__(self, make_inputs: Callable[..., Any]):
        self.make_inputs = make_inputs
        signature = inspect.signature(make_inputs)
        parameters = signature.parameters
        named = tuple(name for name in DIMENSIONS if name in parameters)
        any_dims = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
        self.dims = DIMENSIONS if any_dims else named
        self.defaults = {
            name: parameters[name].default
            if parameters[name].default is not inspect.Parameter.empty
            else DIMENSION_DEFAULTS[name]
            for name in named
        }
        takes = ", ".join(named) or "no dimension"
        name = getattr(make_inputs, "__name__", "make_inputs")
        self.takes = f"{name}{signature} takes {takes}; name the dimension among its parameters, or take **dims"

    def default_shape(self) -> dict[str, Shape]:
        return {kind: Shape(batch, **self.defaults) for kind, batch in BATCH_DEFAULTS.items()}

    def make_batch(self, shape: Shape, generator: torch.Generator) -> Batch:
        return as_batch(self.make_inputs(shape.batch_size, generator, **shape.dims()), "make_inputs")


class FromExamples:
    """Inputs from the model's ``get_example_inputs()``: one fixed batch, under tpubench's seed."""

    dims: tuple[str, ...] = ()
    takes = (
        "its inputs are get_example_inputs()'s fixed batch, without dimensions; "
        "give --inputs MODULE:make_inputs(batch_size, generator, **dims) to set them"
    )

    def __init__(self, build: Callable[[], nn.Module], probe: nn.Module):
        self.build, self.probe = build, probe
        self.example = self.examples(0)
        self.batch_size = next(iter(self.example.values())).shape[0] if self.example else 1

    def examples(self, seed: int) -> Batch:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            batch = as_batch(self.probe.get_example_inputs(), "get_example_inputs()")
            if any(t.is_meta for t in batch.values()):  # made on the model's device: a real build's
                torch.manual_seed(seed)
                batch = as_batch(self.build().get_example_inputs(), "get_example_inputs()")
        return batch

    def default_shape(self) -> dict[str, Shape]:
        return {kind: Shape(self.batch_size) for kind in BATCH_DEFAULTS}

    def make_batch(self, shape: Shape, generator: torch.Generator) -> Batch:
        if shape.batch_size != self.batch_size:
            raise ModelRefError(
                f"get_example_inputs() gives a batch of {self.batch_size}, not {shape.batch_size}; "
                "drop --batch-size, or give --inputs mod:make_inputs to choose it"
            )
        return self.examples(generator.initial_seed())


def as_batch(inputs: Any, source: str) -> Batch:
    """The user's inputs as a batch: a dict of tensors as given, a tuple as ``arg0, arg1...``."""
    if isinstance(inputs, torch.Tensor):
        inputs = (inputs,)
    if isinstance(inputs, Mapping):
        batch = dict(inputs)
    elif isinstance(inputs, (tuple, list)):
        batch = {f"{POSITIONAL}{i}": value for i, value in enumerate(inputs)}
    else:
        raise ModelRefError(f"{source} returned a {type(inputs).__name__}; return a dict or tuple of tensors")
    if not_tensors := [k for k, v in batch.items() if not isinstance(v, torch.Tensor)]:
        raise ModelRefError(f"{source} returned non-tensor inputs ({', '.join(not_tensors)}); return only tensors")
    return batch


def cast(batch: Batch, module: nn.Module) -> Batch:
    dtype = dtype_of(module)
    return {k: v.to(dtype) if v.is_floating_point() else v for k, v in batch.items()}


def user_form(batch: Batch) -> dict[str, torch.Tensor] | tuple[torch.Tensor, ...]:
    """The batch as ``make_inputs`` returned it: a tuple when its keys are ``arg0, arg1...``."""
    keys = list(batch)
    if keys == [f"{POSITIONAL}{i}" for i in range(len(keys))]:
        return tuple(batch.values())
    return batch


def call(module: nn.Module, batch: Batch) -> Any:
    inputs = user_form(cast(batch, module))
    return module(*inputs) if isinstance(inputs, tuple) else module(**inputs)


def output_loss(out: Any) -> torch.Tensor | None:
    """The output's own scalar ``.loss`` (a ModelOutput, a dict or an object), if it has one."""
    found = out.get("loss") if isinstance(out, Mapping) else getattr(out, "loss", None)
    return found if isinstance(found, torch.Tensor) and found.numel() == 1 else None


def floating_tensors(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out] if out.is_floating_point() else []
    values = out.values() if isinstance(out, Mapping) else out if isinstance(out, (tuple, list)) else ()
    return [t for value in values for t in floating_tensors(value)]


def mean_of_outputs(out: Any, ref: ModelRef) -> torch.Tensor:
    """The synthesised loss: the mean over the output's floating tensors of each one's mean."""
    tensors = floating_tensors(out)
    if not tensors:
        raise ModelRefError(
            f"{ref.target}'s output ({type(out).__name__}) has no .loss and no floating tensor; give --loss mod:fn"
        )
    return torch.stack([t.float().mean() for t in tensors]).mean()
