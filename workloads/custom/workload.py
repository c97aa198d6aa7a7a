"""A user's model as a :class:`workloads.Workload`: what both routes (factory, Hugging Face)
share once each has said how to build, feed and run the model.

Nothing here is analytic. FLOPs are counted (``counting.count_step``) on the meta device at
the run's own shape, once per shape and mode; where the model does not build or run on
meta, on the CPU at batch 1 and 2 and scaled to the batch (``counted_scaled``), or at the
run's batch where batch 1 cannot step (BatchNorm training). Memory is
the parameters and AdamW's state, plus the peak bytes a step creates, measured in the same
pass, so a run that cannot fit is refused before it is built, as for built-in workloads.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from workloads.base import (
    ALLOCATOR_HEADROOM,
    GENERATION_MODES,
    MODES,
    Batch,
    Generation,
    Shape,
    Workload,
    default_dtype,
)
from workloads.custom.counting import StepCount, count_step
from workloads.custom.loading import one_line
from workloads.custom.ref import ModelRef, ModelRefError

#: AdamW training keeps the weights, two moments and a foreach temporary of the weights' size;
#: the gradients are counted by the measured step, which creates them
TRAIN_WEIGHT_COPIES = 4


@dataclass(frozen=True)
class GenerationSteps:
    """How a decoder generates through its own static cache (see :class:`workloads.Generation`),
    and which tensors the cache holds (their bytes are what a decode step reads)."""

    allocate_cache: Callable[[int, int, torch.device, torch.dtype], Any]  # (batch, length, device, dtype)
    prefill: Callable[[nn.Module, Batch, Any], torch.Tensor]
    decode: Callable[[nn.Module, torch.Tensor, torch.Tensor, Any], torch.Tensor]
    cache_tensors: Callable[[Any], list[torch.Tensor]]


@dataclass(frozen=True)
class Measured:
    """One step's counted FLOPs and peak new bytes, and how they were obtained."""

    flops: float
    source: str  # "counted": at the run's shape (on meta, or the CPU); "counted_scaled": on the CPU at batch 1 and 2
    incomplete: tuple[str, ...]  # matmul-like ops that ran but counted 0 FLOPs
    peak_bytes: int
    attention: bool  # it ran attention, which the counter counts over the full S x S scores


@dataclass(eq=False)
class CustomModel:
    """The config object of a custom workload's one size ("default"): how to build the model,
    make its batch and run it, what it is (``identity``), and the counts made so far."""

    ref: ModelRef  # as it is stored: the overrides that differ from the defaults, and the task served
    family: str
    description: str
    build: Callable[[], nn.Module]  # on the CPU, under the caller's seed and default dtype
    make_batch: Callable[[Shape, torch.Generator], Batch]
    loss: Callable[[nn.Module, Batch], torch.Tensor]
    forward: Callable[[nn.Module, Batch], Any]
    dims: tuple[str, ...]
    takes: str  # what its inputs take, and how to give them more: said when a dimension does not apply
    default_shape: Mapping[str, Shape]
    identity: str  # what the model is: config or source, and overrides (hashed into model_hash)
    loss_source: Callable[[], str]  # after a train step has run: which loss it used
    max_seq_len: int = 2**31
    generation: GenerationSteps | None = None
    check_determinism: bool = False  # build twice and compare (factories may draw unseeded weights)
    counts: dict[Any, Measured] = field(default_factory=dict)
    meta_models: dict[torch.dtype, nn.Module] = field(default_factory=dict)

    @property
    def model_hash(self) -> str:
        return hashlib.sha256(self.identity.encode()).hexdigest()[:16]

    def meta_model(self, dtype: torch.dtype) -> nn.Module:
        """The model on the meta device (built once per dtype): free to build at any size."""
        if dtype not in self.meta_models:
            with torch.device("meta"), default_dtype(dtype):
                self.meta_models[dtype] = self.build()
        return self.meta_models[dtype]


def parameter_checksum(model: nn.Module) -> str:
    """A hash of every parameter's and buffer's bytes, in state-dict order."""
    digest = hashlib.sha1()
    for name, tensor in model.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def build_checked(model: CustomModel) -> nn.Module:
    """Build the model; a factory is built twice from the same RNG state and must give the same
    weights, or backends would compare different models."""
    if not model.check_determinism:
        return model.build()
    state = torch.get_rng_state()
    built = model.build()
    if any(tensor.is_meta for tensor in built.state_dict().values()):  # no values to compare (``tpubench list``)
        return built
    first = parameter_checksum(built)
    del built  # one model at a time: the second build must not double the peak
    torch.set_rng_state(state)
    built = model.build()
    if parameter_checksum(built) != first:
        raise ModelRefError(
            f"factory {model.ref.target} draws unseeded weights: two builds from tpubench's seed differ; "
            "draw them from torch's global RNG (torch.randn, nn.init), not numpy/random/time"
        )
    return built


def check_seeded(workload: Workload) -> None:
    """Refuse a factory that draws unseeded weights before any run, as bad input: its two
    builds from one seed are compared here, in the planning process, where otherwise every
    worker would find the same thing and the invocation would end in failed rows."""
    model = workload.config(workload.default_size)
    if isinstance(model, CustomModel) and model.check_determinism:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            build_checked(model)


def batch_on(model: CustomModel, shape: Shape, device: torch.device | str) -> Batch:
    return {k: v.to(device) for k, v in model.make_batch(shape, torch.Generator().manual_seed(0)).items()}


def run_step(model: CustomModel, module: nn.Module, batch: Batch, mode: str) -> None:
    """One step as the harness runs it (without the optimizer update, which has no matmuls)."""
    if mode == "train":
        module.train()
        model.loss(module, batch).backward()
        module.zero_grad(set_to_none=True)
        return
    module.eval()
    with torch.no_grad():
        if mode == "infer":
            model.forward(module, batch)
        else:  # prefill: the prompt into a static cache of its length; decode: then one token more
            prompt = batch["input_ids"]
            steps = model.generation
            length = prompt.shape[1] + (mode == "decode")
            cache = steps.allocate_cache(prompt.shape[0], length, prompt.device, dtype_of(module))
            token = steps.prefill(module, batch, cache)
            if mode == "decode":
                steps.decode(module, token, torch.full((1,), prompt.shape[1], device=prompt.device), cache)


def dtype_of(module: nn.Module) -> torch.dtype:
    return next((p.dtype for p in module.parameters() if p.is_floating_point()), torch.get_default_dtype())


def measure(model: CustomModel, shape: Shape, mode: str, dtype: torch.dtype = torch.float32) -> Measured:
    """Count one ``mode`` step at ``shape`` (cached): on meta, else on the CPU (:func:`measure_on_cpu`).

    Some ops run on meta only in bfloat16 (``torch._grouped_mm``, HF's default MoE experts):
    a float32 step that fails on meta is counted in bfloat16 there, its FLOPs being the same
    and its bytes scaled to float32's, rather than building a model of any size on the CPU.
    On the CPU, attention is forced onto SDPA's math path, whose matmuls the counter sees;
    FLOPs and peak bytes are extrapolated along the line through batch 1 and 2 (what does
    not grow with the batch, like gradients, stays once).
    A model that runs on neither is a ModelRefError: its config cannot serve a first step.
    """
    key = (shape, mode, dtype)
    if key in model.counts:
        return model.counts[key]
    try:
        measured = measure_on_meta(model, shape, mode, dtype)
    except ModelRefError:
        raise
    except Exception as meta_error:
        try:
            half = measure_on_meta(model, shape, mode, torch.bfloat16)
            scale = dtype.itemsize / torch.bfloat16.itemsize
            measured = replace(half, peak_bytes=int(half.peak_bytes * scale))
        except ModelRefError:
            raise
        except Exception:
            measured = measure_on_cpu(model, shape, mode, dtype, meta_error)
    model.counts[key] = measured
    return measured


def measure_on_meta(model: CustomModel, shape: Shape, mode: str, dtype: torch.dtype) -> Measured:
    module = model.meta_model(dtype)
    batch = batch_on(model, shape, "meta")
    count = count_step(lambda: run_step(model, module, batch, mode))
    return Measured(count.flops, "counted", count.incomplete, count.peak_bytes, count.attention)


def measure_on_cpu(model: CustomModel, shape: Shape, mode: str, dtype: torch.dtype, meta_error: Exception) -> Measured:
    """Count the step on a CPU build: at batch 1 and 2, and along their line to the run's
    batch (``counted_scaled``); where it cannot step at batch 1 (BatchNorm training wants
    two values per channel), at the run's own batch, exactly (``counted``). A model that
    cannot step at the run's batch either is a ModelRefError naming the batch that failed."""
    failures: list[tuple[int, Exception]] = []
    module: nn.Module | None = None
    for batches in [(1, 2), (shape.batch_size,)] if shape.batch_size > 1 else [(1,)]:
        counts: list[StepCount] = []
        for batch_size in batches:
            try:
                if module is None:
                    with default_dtype(dtype), torch.random.fork_rng(devices=[]):
                        torch.manual_seed(0)
                        module = model.build()
                batch = batch_on(model, Shape(batch_size, **shape.dims()), "cpu")
                with sdpa_kernel(SDPBackend.MATH):
                    counts.append(count_step(lambda batch=batch, module=module: run_step(model, module, batch, mode)))
            except ModelRefError:
                raise
            except Exception as error:
                failures.append((batch_size, error))
                break
        if len(counts) == 1:
            [at] = counts
            return Measured(at.flops, "counted", at.incomplete, at.peak_bytes, at.attention)
        if len(counts) == 2:
            one, two = counts
            grown = shape.batch_size - 1
            peak = one.peak_bytes + max(0, two.peak_bytes - one.peak_bytes) * grown
            incomplete = tuple(sorted(set(one.incomplete) | set(two.incomplete)))
            flops = one.flops + (two.flops - one.flops) * grown
            return Measured(flops, "counted_scaled", incomplete, int(peak), one.attention or two.attention)
    raise cannot_step(model, shape, mode, failures, meta_error) from failures[-1][1]


def cannot_step(
    model: CustomModel, shape: Shape, mode: str, failures: list[tuple[int, Exception]], meta_error: Exception
) -> ModelRefError:
    """The error of a step that failed at every batch tried: the last (the run's batch), then
    any other failure that said something else, and the meta device's."""
    batch_size, error = failures[-1]
    said, others = {str(error)}, []
    for other_batch, other in failures[:-1]:
        if str(other) not in said:
            said.add(str(other))
            others.append(f"at batch_size={other_batch}: {type(other).__name__}: {one_line(other)}")
    if str(meta_error) not in said:
        others.append(f"on meta: {type(meta_error).__name__}: {one_line(meta_error)}")
    return ModelRefError(
        f"{model.ref.label} fails its first {mode} step at {describe(Shape(batch_size, **shape.dims()))}: "
        f"{type(error).__name__}: {one_line(error)}" + (f" ({'; '.join(others)})" if others else "")
    )


def describe(shape: Shape) -> str:
    return ", ".join(f"{k}={v}" for k, v in {"batch_size": shape.batch_size, **shape.dims()}.items())


def weight_bytes(model: CustomModel, dtype: torch.dtype) -> int:
    """Unique parameter and buffer bytes of the model built in ``dtype`` (a tied tensor once):
    on meta, or, for a model that cannot be built there, on the CPU."""
    try:
        module = model.meta_model(dtype)
    except ModelRefError:
        raise
    except Exception:
        with default_dtype(dtype), torch.random.fork_rng(devices=[]):
            module = model.build()
    tensors = {id(t): t for t in (*module.parameters(), *module.buffers())}
    return sum(t.numel() * t.element_size() for t in tensors.values())


def estimate_memory_bytes(model: CustomModel, shape: Shape, mode: str, dtype: torch.dtype) -> int:
    """The tensors a run holds at its peak (``Workload.memory_bytes`` adds the runtime): the
    weights (four copies to train: AdamW's
    two moments and its temporary), plus the peak bytes the measured step created (for train
    these include the gradients; for prefill/decode the static cache of the shape's length)."""
    copies = TRAIN_WEIGHT_COPIES if mode == "train" else 1
    step = measure(model, shape, mode, dtype)
    needed = copies * weight_bytes(model, dtype) + step.peak_bytes
    return int(needed * ALLOCATOR_HEADROOM)


def generation_for(model: CustomModel) -> Generation:
    """The workload's prefill/decode through the model's own static cache, with its FLOPs and
    bytes counted on meta like the rest."""
    steps = model.generation
    cached: dict[Any, Any] = {}

    def cached_flops(config: CustomModel, batch_size: int, new_tokens: int, cache_len: int) -> float:
        key = ("flops", batch_size, new_tokens, cache_len)
        if key not in cached:
            module = config.meta_model(torch.float32).eval()
            tokens = torch.zeros(batch_size, new_tokens, dtype=torch.long, device="meta")

            def step() -> None:
                with torch.no_grad():
                    cache = steps.allocate_cache(batch_size, cache_len, torch.device("meta"), torch.float32)
                    steps.prefill(module, {"input_ids": tokens}, cache)

            cached[key] = count_step(step).flops
        return cached[key]

    def decode_bytes(config: CustomModel, batch_size: int, cache_len: int, dtype: torch.dtype) -> float:
        key = ("bytes", batch_size, cache_len, dtype)
        if key not in cached:
            module = config.meta_model(dtype).eval()
            with torch.no_grad():
                cache = steps.allocate_cache(batch_size, cache_len, torch.device("meta"), dtype)
                steps.prefill(module, {"input_ids": torch.zeros(batch_size, 1, dtype=torch.long, device="meta")}, cache)
            kv = sum(t.numel() * t.element_size() for t in steps.cache_tensors(cache))
            cached[key] = float(weight_bytes(config, dtype) + kv)
        return cached[key]

    def allocate(config: CustomModel, batch_size: int, length: int, device: torch.device, dtype: torch.dtype) -> Any:
        return steps.allocate_cache(batch_size, length, device, dtype)

    return Generation(allocate, steps.prefill, steps.decode, cached_flops, decode_bytes)


def row_columns(model: CustomModel, shape: Shape, mode: str) -> dict[str, Any]:
    """Identity and provenance columns for every row of this model (see docs/schema.md)."""
    counted_mode = "train" if mode == "train" else "infer"
    measured = measure(model, shape, counted_mode)
    return {
        "model_ref": model.ref.to_json(),
        "model_hash": model.model_hash,
        "flops_source": measured.source,
        "flops_incomplete": json.dumps(list(measured.incomplete)) if measured.incomplete else None,
        "attention_flops": "full" if measured.attention else None,  # none to count in an MLP or a CNN
        "loss_source": model.loss_source() if mode == "train" else None,
    }


def workload_for(model: CustomModel) -> Workload:
    """The :class:`workloads.Workload` of a custom model: one size, "default"."""
    return Workload(
        name=model.ref.name,
        suites=("custom",),
        family=model.family,
        description=model.description,
        sizes={"default": model},
        default_size="default",
        default_shape=model.default_shape,
        build_model=build_checked,
        make_batch=lambda config, shape, generator: config.make_batch(shape, generator),
        loss=model.loss,
        forward=model.forward,
        flops=lambda config, shape, mode: measure(config, shape, "train" if mode == "train" else "infer").flops,
        estimate_memory_bytes=estimate_memory_bytes,
        dims=model.dims,
        modes=MODES + (GENERATION_MODES if model.generation else ()),
        max_seq_len=lambda config: config.max_seq_len,
        generation=generation_for(model) if model.generation else None,
        row_columns=row_columns,
    )


def dry_run(workload: Workload, shape: Shape, mode: str) -> None:
    """Run ``mode``'s first step at ``shape`` where it costs nothing (meta; else the CPU at
    batch 1 and 2, or at the shape's batch), so a config that cannot serve it is an error
    before any run starts."""
    model = workload.config(workload.default_size)
    if isinstance(model, CustomModel):  # a built-in or plugin workload declares its own counts
        measure(model, shape, mode if mode in (*MODES, *GENERATION_MODES) else "infer")
