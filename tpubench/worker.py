"""What a worker process does to measure a run in itself: admit, build, time, summarise.

The process around it is started by :mod:`tpubench.launch` (:mod:`tpubench.launch.serve` for
a run's worker, :mod:`tpubench.launch.rank` for one rank of a multi-device run); this module
starts no process. It writes JSON lines to the channel: ``phase`` events while it works and
one final ``result``. stdout and stderr are free for the libraries' own chatter; the parent
keeps their tail for failed rows. A worker dies with its parent: when the lifeline (stdin,
or a pipe from the zygote) reaches end of file, it kills its own children, removes its
scratch folder and exits (:func:`watch_parent`).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
import warnings
from dataclasses import asdict, replace
from typing import Any

import numpy as np
import psutil
import torch

from tpubench import ceilings, compiles, energy, memory, parallel, peaks, verify
from tpubench.backends import Backend, get_backend
from tpubench.ceilings import sweep
from tpubench.hostload import busy_warning
from tpubench.measure import (
    Measurement,
    RecompileError,
    StepRecord,
    make_generation_step,
    make_step,
    run_protocol,
)
from tpubench.models import WorkloadUnavailable, workload_for
from tpubench.parallel import dtensor, planning, spmd
from tpubench.precision import choices, convert, quality
from tpubench.serving.metrics import GenerationTiming, bandwidth_utilisation, serving_metrics
from tpubench.spec import RunSpec
from tpubench.stats import summarize
from tpubench.warning import TpubenchWarning
from workloads import GENERATION_MODES, Instance, Shape, Workload, build
from workloads.attention import AttentionUnsupported, estimating
from workloads.base import SEED, runtime_bytes

#: backend metrics that have columns of their own; the rest go to ``backend_metrics`` (JSON)
BACKEND_COLUMNS = (
    "execute_s",
    "cached_compiles",
    "fallback_ops",
    "compile_cache_hits",
    "compile_cache_misses",
    "compile_cache_load_failures",
    "tpu_eager_mode",
)

#: how every row's FLOPs are counted (the contract of ``Workload.flops``): analytic, from the
#: config and shape, 2 per multiply-add; attention over the full S x S score matrix even when
#: causal, as torchprime counts it (MaxText halves causal attention, so its MFU reads lower)
FLOPS_SOURCE = {"flops_source": "analytic", "attention_flops": "full"}


class Channel:
    """Line-delimited JSON to the parent, flushed per message so progress is live."""

    def __init__(self, fd: int):
        self._stream = os.fdopen(fd, "w", buffering=1)

    def send(self, event: str, **payload: Any) -> None:
        self._stream.write(json.dumps({"event": event, **payload}) + "\n")


def probe(backends: list[str]) -> dict[str, Any]:
    """This interpreter's versions and each backend's availability, without running a model."""
    found = {}
    for name in backends:
        try:
            found[name] = asdict(get_backend(name).availability())
        except Exception as error:  # a broken runtime makes a backend unavailable, not the probe fail
            found[name] = {
                "available": False,
                "reason": f"{type(error).__name__}: {error}",
                "device_name": "",
                "device_count": 0,
                "versions": {},
            }
    return {
        "executable": sys.executable,
        "python_version": platform.python_version(),
        "torch_version": torch.__version__,
        "backends": found,
    }


def is_oom(error: BaseException) -> bool:
    return isinstance(error, (MemoryError, torch.OutOfMemoryError)) or "out of memory" in str(error).lower()


def measure(spec: RunSpec, channel: Channel) -> dict[str, Any]:
    """One run in this process, in phases: admit, build, time, summarise, then (optionally) trace.

    A multi-device run of a process family measures in N rank processes, each running this
    function; :mod:`tpubench.launch.ranks` starts them and merges their rows.
    """
    backend = get_backend(spec.backend)
    backend.setup(spec)
    availability = backend.availability()
    if not availability.available:
        return {"status": "unavailable", "error": availability.reason}
    try:
        workload = workload_for(spec)
    except WorkloadUnavailable as error:  # e.g. the user's module is not installed in this interpreter
        return {"status": "unavailable", "error": str(error)}
    try:
        backend.use_attention(spec)
    except AttentionUnsupported as error:  # a kernel this device or mode lacks, said before any build
        return {"status": "unavailable", "error": f"--attention {spec.attention}: {error}"}
    config = workload.config(spec.size)
    identity = identity_columns(workload, config, spec)
    device = (availability.device_name, backend.device_kind)  # peaks match within the device kind
    row = {
        "device": availability.device_name,
        "seed": SEED,  # what the model and batch are drawn from: runs of one seed train alike
        **identity,
        **layout_columns(spec, device, backend.simulated_devices()),
        **admit(spec, backend, availability.device_name, workload, config),
    }
    if row.get("status") == "skipped":
        return row

    if why := convert.unavailable(spec.precision, backend.device()):
        return {**row, "status": "unavailable", "error": why}

    capture = backend.compile_capture(spec) if spec.capture_compiles else None
    if capture:
        capture.start()
    channel.send("phase", phase="build", step=0, of=1)
    dtype = getattr(torch, spec.dtype)
    instance = build(workload, spec.size, device=backend.device(), dtype=dtype, shape=shape_of(spec))
    try:
        reference, converted = convert_model(spec, instance)
    except convert.Unconvertible as error:
        return {**row, "status": "unavailable", "error": str(error)}
    row |= converted
    instance = apply_plan(spec, backend, instance)
    sharded = spec.devices > 1 and parallel.family(spec.backend) in parallel.SPMD_FAMILIES
    counter = memory.PartsCounter(instance.model, backend.device().type, sharded)
    backend.reset_peak_memory()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        window = energy_window(backend)
        model = backend.prepare(instance.model)
        timings: list[GenerationTiming] = []
        if spec.mode in GENERATION_MODES:
            step = make_generation_step(instance, model, spec.mode, spec.gen_len, backend, timings)
        else:
            step = make_step(instance, model, spec.mode)
        try:
            measured = run_protocol(
                spec,
                backend,
                step,
                lambda phase, i, n: channel.send("phase", phase=phase, step=i, of=n),
                capture,
                agreement(spec),
                window,
            )
        except RecompileError as error:  # the failed run keeps the compile events that explain it
            return {
                **row,
                **compile_columns(spec, capture, error.records),
                "status": "failed",
                "error": f"{type(error).__name__}: {error}",
                "warnings": "\n".join(capture.notes) if capture and capture.notes else None,
            }
        except Exception as error:  # a forced attention kernel that cannot run this shape says why
            if (why := attention_refusal(spec, error, caught)) is None:
                raise
            return {**row, "status": "unavailable", "error": why}
        if spec.mode == "prefill":  # a prefill step is the time to first token
            timings = [GenerationTiming(ttft_ms=r.step_ms, e2e_ms=r.step_ms) for r in measured.records]
        extra = backend.extra_metrics()  # read before profiling, so that traced steps count in no figure
        row |= timing_columns(measured)
        peak = backend.peak_memory_bytes()
        row |= backend_columns(extra, peak)
        row |= memory.breakdown(counter.finish(), peak, row.get("baseline_mem_bytes"), sharded)
        if backend.device().type == "tpu":  # TorchTPU; unverified without a chip: kept as text beside the peak
            row["backend_metrics"] = with_metric(
                row["backend_metrics"], "tpu_hbm_usage_summary", memory.tpu_hbm_summary()
            )
        precision = extra.get("float32_matmul_precision", "highest")
        row |= throughput_columns(spec, workload, config, device, row["median_step_ms"], precision, identity)
        row |= serving_columns(workload, config, spec, device, timings[-spec.steps :])
        row |= per_device_columns(row, spec.devices)
        row |= energy.columns(measured.energy, tokens_per_step(spec), spec.batch_size)
    if spec.profile_memory:  # after every figure is read: the profiler's own memory is in none
        channel.send("phase", phase="profile memory", step=0, of=1)
        row["memory"] += memory.profile_timeline(
            step, backend.device(), backend.profiler_activities(), backend.synchronize, counter.held()
        )
    trace_path = None
    if spec.profile_steps and spec.trace_dir:
        channel.send("phase", phase="profile", step=0, of=spec.profile_steps)
        if capture:  # the traced steps' compiles: after the measured ones, phase "profiled"
            capture.before_step(len(measured.records), "profile")
        trace_path = backend.profile(step, spec.profile_steps, spec.trace_dir)
        channel.send("phase", phase="ingest", step=0, of=1)
        row |= ingest_trace(trace_path, spec.profile_steps, spec.devices, row["median_step_ms"])
    if workload.attention:
        traced = attention_trace_steps(row.get("median_step_ms"))
        row |= attention_columns(spec, backend, step, trace_path, capture, len(measured.records), channel, traced)
    row |= compile_columns(spec, capture, measured.records)
    quality_found, quality_note = quality_columns(spec, instance, backend, reference, measured.records)
    row |= quality_found
    return {
        **row,
        "status": "ok",
        "compile_cache": spec.compile_cache,
        "trace_path": trace_path,
        **parameter_columns(workload, config, instance.model),
        "warnings": run_notes(caught, measured, [*(capture.notes if capture else []), *quality_note]),
        "steps": step_rows(measured.records, timings[: len(measured.records)], spec.gen_len),  # not profiled ones
    }


def convert_model(spec: RunSpec, instance: Instance) -> tuple[torch.Tensor | None, dict[str, Any]]:
    """A converted precision's model (in place, before the backend prepares it) and its
    conversion columns, with the bf16 logits taken first for an inference run's quality
    (:mod:`tpubench.precision.quality`); nothing for a plain precision. Raises
    :class:`convert.Unconvertible` where no linear can take the precision."""
    if not choices.is_converted(spec.precision):
        return None, {}
    reference = quality.logits(instance, instance.model) if spec.mode != "train" else None
    return reference, convert.convert(instance.model, spec.precision, spec.mode).columns()


def quality_columns(
    spec: RunSpec, instance: Instance, backend: Backend, reference: torch.Tensor | None, records: list[StepRecord]
) -> tuple[dict[str, Any], list[str]]:
    """A converted run's divergence from bf16 (:mod:`tpubench.precision.quality`), after
    every figure is read, and a note for the row's warnings where it could not be measured:
    a reference that does not fit beside the run costs the columns, never the run."""
    if not choices.is_converted(spec.precision):
        return {}, []
    try:
        if spec.mode == "train":
            return quality.train_columns(instance.workload, spec.size, shape_of(spec), backend, records), []
        return quality.inference_columns(reference, instance), []
    except Exception as error:  # the reference's own OOM or a torchao gap: the timings stand
        if not is_oom(error):
            traceback.print_exc()
        note = f"quality against bf16 not measured: {type(error).__name__}: {error}"
        return {"reference_precision": choices.REFERENCE}, [note]


#: what the steps traced for the attention columns (where the run traced none) add up to, at
#: least: a share read from a few milliseconds is the noise of whatever else the host ran then
#: (a tiny llama3 at 128 tokens read 0.17 to 0.38 from three 5 ms steps on a busy 2-core host,
#: 0.17 from fifty), so short steps are traced by the many
ATTENTION_TRACE_S = 0.5
#: the fewest and the most steps traced for them
ATTENTION_TRACE_STEPS = (3, 50)


def attention_trace_steps(step_ms: float | None) -> int:
    """Steps to trace for the attention columns: enough for :data:`ATTENTION_TRACE_S` at the
    run's median step, within :data:`ATTENTION_TRACE_STEPS`."""
    fewest, most = ATTENTION_TRACE_STEPS
    if not step_ms or step_ms <= 0:
        return fewest
    return max(fewest, min(most, math.ceil(ATTENTION_TRACE_S * 1e3 / step_ms)))


def attention_refusal(spec: RunSpec, error: Exception, caught: list[warnings.WarningMessage]) -> str | None:
    """Why the forced ``--attention`` kernel could not run this run's shape, from the error
    its first step raised (SDPA's "No available kernel" with the warnings that say why, flex
    attention's missing CPU backward, a mask a kernel does not take); None for any other error,
    or where nothing was forced (``auto``)."""
    if spec.attention == "auto":
        return None
    text = f"{type(error).__name__}: {error}"
    if isinstance(error, AttentionUnsupported):
        return f"--attention {spec.attention}: {error}"
    if "No available kernel" in str(error):
        reasons = [str(w.message) for w in caught if "attention" in str(w.message).lower()]
        return f"--attention {spec.attention} cannot run this shape: " + "; ".join(dict.fromkeys(reasons or [text]))
    if isinstance(error, NotImplementedError) and "attention" in str(error).lower():
        return f"--attention {spec.attention} cannot run this run: {text}"
    return None


def attention_columns(
    spec: RunSpec,
    backend: Backend,
    step: Any,
    trace_path: str | None,
    capture: compiles.Capture | None,
    measured_steps: int,
    channel: Channel,
    trace_steps: int,
) -> dict[str, Any]:
    """The attention kernel that ran and attention's share of a step (docs/long-context.md).

    From the run's trace where it took one (``--profile``), else from ``trace_steps`` more
    steps traced for it (:func:`attention_trace_steps`) after every figure is read
    (``--attention`` given: ``spec.trace_attention``); without a
    trace, the kernel is the SDPA backend or flex that was forced (source ``forced``), and the
    share is unknown (null). A trace that cannot be read costs these columns, never the run."""
    from tpubench.traces import attention as traced

    columns: dict[str, Any] = {}
    if spec.attention != "auto":
        columns |= {"attention_kernel": spec.attention, "attention_kernel_source": "forced"}
    scratch = None
    try:
        if trace_path is None and spec.trace_attention:
            channel.send("phase", phase="trace attention", step=0, of=trace_steps)
            if capture:
                capture.before_step(measured_steps, "profile")
            scratch = tempfile.mkdtemp(prefix="tpubench-attention-")
            trace_path = backend.profile(step, trace_steps, scratch)
        if trace_path is not None:
            found = traced.read(trace_path)
            if found.kernel is not None:
                columns |= {"attention_kernel": found.kernel, "attention_kernel_source": "trace"}
            columns["attention_share"] = found.share
    except traced.TraceError as error:  # said on stderr, which a run's log keeps
        print(f"attention kernel and share not read from the trace: {error}", file=sys.stderr)
    finally:
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)
    return columns


def energy_window(backend: Backend) -> energy.Window | None:
    """The energy counter's window over the measured steps (:mod:`tpubench.energy`), or None
    where no counter is readable; a counter that should be there and is not is a note."""
    device = backend.device()
    index = device.index
    if device.type == "cuda" and index is None:
        index = torch.cuda.current_device()
    meter, why_not = energy.meter_for(device.type, index)
    if why_not:
        warnings.warn(why_not, TpubenchWarning, stacklevel=2)
    return energy.Window(meter) if meter else None


def tokens_per_step(spec: RunSpec) -> int | None:
    """Tokens one measured step processes: the prompt's for train, infer and prefill, the
    generated ones for decode; None for a workload without a sequence."""
    if spec.seq_len is None:
        return None
    return spec.batch_size * (spec.gen_len if spec.mode == "decode" else spec.seq_len)


def with_metric(metrics: str, key: str, value: Any) -> str:
    """``backend_metrics`` (JSON) with ``key`` added, unless ``value`` is None."""
    if value is None:
        return metrics
    return json.dumps({**json.loads(metrics), key: value}, sort_keys=True)


def apply_plan(spec: RunSpec, backend: Backend, instance: Instance) -> Instance:
    """Split ``instance`` (built whole, on this process's device, from the one seed) over the
    run's devices with its family's mechanism: SPMD partition specs for xla, DDP, FSDP2 or
    DTensor in a rank of the process families. Unchanged for a one-device run."""
    if spec.devices == 1 or spec.parallel == "none":
        return instance
    if parallel.family(spec.backend) in parallel.SPMD_FAMILIES:
        return spmd.apply(spec, backend, instance)
    return dtensor.apply(spec, backend, instance)


def agreement(spec: RunSpec) -> Any:
    """``run_protocol``'s ``agree``: whether any rank's compile count changed in a warm-up
    step, so that every rank takes the same number of steps (a rank that stops early
    leaves the others waiting in a collective). None outside a rank process."""
    return dtensor.any_rank if parallel.is_multi_process(spec) else None


def tensor_parallel_refusal(spec: RunSpec) -> str | None:
    """Why a tp or fsdp_tp run cannot split its workload (it has no tensor-parallel plan),
    found before any rank or model is started; None for every other run."""
    if spec.parallel not in planning.TENSOR_PARALLEL:
        return None
    try:
        workload = workload_for(spec)
    except WorkloadUnavailable:  # said by the run itself, as for any run
        return None
    return planning.missing_plan(spec.parallel, workload)


def layout_columns(spec: RunSpec, device: tuple[str, str], simulated: bool) -> dict[str, Any]:
    """How the run is laid out over its devices: the spec's layout (:func:`parallel.spec_columns`),
    chips (a TPU v7 chip is two devices), and whether the devices were only simulated
    (``simulated``: the backend's :meth:`Backend.simulated_devices`, for a run of more than
    one device).

    ``device`` is the device's name and kind, which select its chip in :mod:`tpubench.peaks`.
    """
    peak = peaks.lookup(*device)
    per_chip = peak.devices_per_chip if peak else 1
    return {
        **parallel.spec_columns(spec),
        "chips": -(-spec.devices // per_chip),
        "simulated": spec.devices > 1 and simulated,
    }


def per_device_columns(row: dict[str, Any], devices: int) -> dict[str, Any]:
    """Throughput per device (torchtitan's tokens/s per GPU, MaxText's per chip): the run's
    global samples and tokens per second over its ``devices``."""
    return {
        f"{name}_per_device": row[name] / devices if row.get(name) is not None else None
        for name in ("samples_per_s", "tokens_per_s")
    }


def ingest_trace(trace_path: str, profile_steps: int, devices: int, step_ms: float) -> dict[str, Any]:
    """The trace's rows of the ``ops`` table (popped by the runner like ``steps``), per
    device, ``profile_steps``, and on a multi-device run the time in collectives
    (:mod:`tpubench.traces.collectives`). A trace that cannot be read costs its rows, never
    the run: the error goes in ``ops_error``, and ``tpubench ops --ingest RUN_ID`` can try again."""
    from tpubench.traces import collectives, ingest

    columns: dict[str, Any] = {"profile_steps": profile_steps}
    try:
        columns["ops"] = ingest(trace_path, profile_steps, devices=devices)
        if devices > 1:
            columns |= collectives.columns(trace_path, profile_steps, devices, step_ms)
    except Exception as error:  # a reader's bug or a corrupt trace: the run's timings stand
        traceback.print_exc()
        columns["ops_error"] = f"{type(error).__name__}: {error}"
    return columns


def compile_columns(spec: RunSpec, capture: compiles.Capture | None, records: list[StepRecord]) -> dict[str, Any]:
    """The runs table's compile columns, and the run's ``compiles`` rows (popped by the
    runner like ``steps``). Without a capture (capture off, or a backend that compiles
    nothing) the columns stay null."""
    if capture is None:  # turned off, or an eager backend with nothing to capture (null)
        return {"capture_compiles": False if not spec.capture_compiles else None}
    capture.finish()
    columns = {
        "capture_compiles": True,
        **compiles.run_columns(capture.events, records),
        **capture.columns(),
    }
    for key in ("graph_break_ids", "recompile_causes", "missing_lowerings"):
        if isinstance(columns.get(key), dict):
            columns[key] = json.dumps(columns[key], sort_keys=True)
    return {**columns, "compiles": compiles.rows(capture.events)}


def shape_of(spec: RunSpec) -> Shape:
    """The run's input shape: its batch and the dimensions its workload takes."""
    return Shape(spec.batch_size, **spec.dims())


def parameter_columns(workload: Workload, config: Any, model: torch.nn.Module) -> dict[str, Any]:
    """The model's unique parameter elements (a tied or shared tensor once), those that
    train (a frozen embedding does not), and for a mixture of experts those each token uses
    (``Workload.active_params``)."""
    active = workload.active_params(config) if workload.active_params else None
    return {
        "param_count": sum(p.numel() for p in model.parameters()),
        "trainable_param_count": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "active_param_count": active,
    }


#: the identity of a user's model in its rows (``Workload.row_columns``); null for registered
#: workloads, whose name and size are their identity
IDENTITY_COLUMNS = ("model_ref", "model_hash", "flops_source", "flops_incomplete", "loss_source")


def identity_columns(workload: Workload, config: Any, spec: RunSpec) -> dict[str, Any]:
    """What the workload says about the model it measured: its reference and hash, how its
    FLOPs were counted (and which ops were not), where its loss comes from, so that
    ``compare`` pairs a model only with itself and an incomplete count gives no MFU."""
    columns = dict.fromkeys(IDENTITY_COLUMNS) | FLOPS_SOURCE
    if not workload.attention:
        columns["attention_flops"] = None
    if workload.row_columns is not None:
        columns |= workload.row_columns(config, shape_of(spec), spec.mode)
    return columns


def admit(spec: RunSpec, backend: Backend, device_name: str, workload: Workload, config: Any) -> dict[str, Any]:
    """The memory estimate (per device: :func:`device_estimate`), and a ``skipped`` status
    when the run cannot fit on the device. Simulated devices share this host's memory, so
    all of theirs must fit in it together (:func:`run_estimate`).
    """
    estimate = run_estimate(spec, backend.holds_attention_scores(spec.attention), workload, config)
    shared = spec.devices if spec.devices > 1 and backend.simulated_devices() else 1
    capacity = backend.memory_capacity_bytes()
    columns = {"estimated_mem_bytes": estimate, "baseline_mem_bytes": backend.memory_in_use_bytes()}
    if capacity is None or estimate * shared <= capacity:
        return columns
    each = f" per device, x {shared} simulated devices sharing the host," if shared > 1 else ""
    return {
        **columns,
        "status": "skipped",
        "error": f"estimated {estimate / 2**30:.1f} GiB{each} exceeds the {capacity / 2**30:.1f} GiB "
        f"available on {device_name or spec.backend}",
    }


def run_estimate(spec: RunSpec, holds_scores: bool, workload: Workload, config: Any) -> int:
    """What one device of ``spec`` holds (:func:`device_estimate`), its attention counted as
    holding the S x S scores or not (``holds_scores``: :meth:`Backend.holds_attention_scores`).
    For prefill and decode the sequence is the whole static cache, prompt plus generated tokens.
    The worker's admission and ``tpubench run``'s check before anything runs both use it."""
    shape = shape_of(spec)
    if spec.gen_len:
        shape = replace(shape, seq_len=spec.seq_len + spec.gen_len)
    with estimating(holds_scores):
        return device_estimate(workload, config, shape, spec.mode, getattr(torch, spec.dtype), parallel.layout_of(spec))


def device_estimate(
    workload: Workload, config: Any, shape: Shape, mode: str, dtype: torch.dtype, layout: parallel.Layout
) -> int:
    """What one device of the run holds, by the workload's estimate (its whole figure for one
    device). A rough split for more: the estimate at batch 1 and 2 gives the part that grows
    with the batch (activations, logits, the KV cache: each device holds its share of the
    global batch) and the part that does not (weights, gradients, AdamW moments), which fsdp
    divides by the data-parallel degree, tp by the tensor-parallel one and fsdp_tp by both;
    the runtime's allowance stays whole. Tensor parallelism also splits some activations,
    which this leaves whole, so a tp estimate errs high."""
    if layout.devices == 1:
        return workload.memory_bytes(config, shape, mode, dtype)
    tensors = workload.estimate_memory_bytes
    one, two = (tensors(config, replace(shape, batch_size=batch), mode, dtype) for batch in (1, 2))
    per_sample = max(two - one, 0)
    state = one - per_sample
    shards = {"dp": 1, "fsdp": layout.dp, "tp": layout.tp, "fsdp_tp": layout.devices}[layout.parallel]
    return runtime_bytes(mode) + state // shards + per_sample * (shape.batch_size // layout.dp)


def timing_columns(measured: Measurement) -> dict[str, Any]:
    """Step-time statistics of the measured steps, and how compilation and warm-up went."""
    return {
        "first_step_s": measured.first_step_s,
        "first_step_compiles": measured.first_step_compiles,
        "warmup_steps": measured.warmup_steps,
        "measured_steps": len(measured.measured_ms),
        "compile_count": measured.compile_count,
        "compile_s": measured.compile_s,
        "recompiles_after_warmup": measured.recompiles_after_warmup,
        **summarize(measured.measured_ms).as_columns("step", "ms"),
        "median_host_ms": float(np.median(measured.measured_host_ms)),
        "host_load_1m": measured.host_load.load_1m if measured.host_load else None,
        "host_other_cpu_share": measured.host_load.other_cpu_share if measured.host_load else None,
    }


def backend_columns(extra: dict[str, Any], peak_mem_bytes: int | None) -> dict[str, Any]:
    """Peak memory and the backend's own figures: those with columns, the rest as JSON."""
    columns = {key: extra[key] for key in BACKEND_COLUMNS if key in extra}
    if "fallback_ops" in columns:
        columns["fallback_op_count"] = sum(columns["fallback_ops"].values())
        columns["fallback_ops"] = json.dumps(columns["fallback_ops"], sort_keys=True)
    rest = {key: value for key, value in extra.items() if key not in BACKEND_COLUMNS}
    return {**columns, "peak_mem_bytes": peak_mem_bytes, "backend_metrics": json.dumps(rest, sort_keys=True)}


def throughput_columns(
    spec: RunSpec,
    workload: Workload,
    config: Any,
    device: tuple[str, str],
    median_step_ms: float,
    precision: str,
    identity: dict[str, Any],
) -> dict[str, Any]:
    """Samples and tokens per second at the median step time, the step's FLOPs, and MFU.

    A multi-device run's FLOPs are the global step's (its ``batch_size`` is the global batch),
    and MFU is per device: global FLOPs / (step time x devices x one device's peak), as
    torchtitan and torchprime count it.

    ``device`` is the device's name and kind, which select its peak in :mod:`tpubench.peaks`.
    ``precision`` is torch's float32 matmul precision: anything but "highest" lets float32
    matmuls use TF32, so MFU is taken against the TF32 peak. Tokens per second only for
    workloads with a sequence. How the FLOPs were counted goes with them (``identity``:
    :data:`FLOPS_SOURCE`, or the workload's own word); a count that missed ops
    (``flops_incomplete``) gives no MFU rather than a wrong one.
    """
    step_s = median_step_ms / 1e3
    flops = step_flops(workload, config, spec)
    mfu = peaks.mfu(flops / spec.devices, step_s, *device, spec.dtype, precision, spec.precision)
    key, chip = peaks.matmul_key(spec.dtype, precision, spec.precision), peaks.lookup(*device)
    if identity["flops_incomplete"]:
        warnings.warn(
            f"MFU left null: the FLOP count missed ops {identity['flops_incomplete']}", TpubenchWarning, stacklevel=2
        )
        mfu = None
    tokens = spec.batch_size * spec.seq_len if spec.seq_len is not None else None  # none without a sequence
    return {
        "samples_per_s": spec.batch_size / step_s,
        # decode: output tokens per second, as serving tools mean it (set by serving_columns)
        **({} if spec.mode == "decode" else {"tokens_per_s": tokens / step_s if tokens is not None else None}),
        "flops_per_step": flops,
        "mfu": mfu,
        # the peak MFU divided by: the precision's (fp8 dense on an H100), named
        "peak_flops_per_s": chip.device_flops(key) if chip else None,
        "mfu_peak": peaks.describe(*device, key),
    }


def run_notes(
    caught: list[warnings.WarningMessage],
    measured: Measurement,
    capture_notes: list[str] = (),  # type: ignore[assignment]
) -> str | None:
    """tpubench's own warnings (no peak for this device, a missing private API, a recompile
    limit hit) for the row."""
    notes = list(dict.fromkeys(str(w.message) for w in caught if issubclass(w.category, TpubenchWarning)))
    notes += capture_notes
    if not measured.warmup_settled:
        notes.append(f"compile count still changing after {measured.warmup_steps} warm-up steps")
    if measured.host_load and (busy := busy_warning(measured.host_load)):
        notes.append(busy)
    return "\n".join(notes) or None


def step_rows(records: list[StepRecord], timings: list[GenerationTiming], gen_len: int) -> list[dict[str, Any]]:
    """The steps table's rows; a decode run's steps are whole generations, with their TTFT and TPOT."""
    rows = [asdict(record) for record in records]
    if timings:  # one timing per generation, in the order the records were taken
        for row, timing in zip(rows, timings, strict=True):
            row["ttft_ms"] = timing.ttft_ms
            row["tpot_ms"] = timing.tpot_ms(gen_len)
    return rows


def step_flops(workload: Workload, config: Any, spec: RunSpec) -> float:
    """FLOPs of one measured step: a train/infer step, a prefill, or a whole generation."""
    if spec.mode == "prefill":  # a prompt pass into a cache of the prompt's length: for the built-in
        # decoders the same count as an infer step, but a Hugging Face model's prefill computes
        # the LM head for the last position only (``logits_to_keep=1``)
        return workload.generation.cached_flops(config, spec.batch_size, spec.seq_len, spec.seq_len)
    if spec.mode == "decode":  # the prefill and each decode step attend over the whole static cache
        cache_len, cached_flops = spec.seq_len + spec.gen_len, workload.generation.cached_flops
        prefill = cached_flops(config, spec.batch_size, spec.seq_len, cache_len)
        return prefill + (spec.gen_len - 1) * cached_flops(config, spec.batch_size, 1, cache_len)
    return workload.flops(config, shape_of(spec), spec.mode)


def serving_columns(
    workload: Workload, config: Any, spec: RunSpec, device: tuple[str, str], timings: list[GenerationTiming]
) -> dict[str, Any]:
    """Decode runs: vLLM-style latency percentiles, token throughputs and bandwidth utilisation."""
    if spec.mode == "prefill":
        return {
            key: value
            for key, value in serving_metrics(timings, spec.batch_size, spec.seq_len, 1).items()
            if key.startswith("ttft")
        }
    if spec.mode != "decode":
        return {}
    metrics = serving_metrics(timings, spec.batch_size, spec.seq_len, spec.gen_len)
    moved = workload.generation.decode_bytes(
        config, spec.batch_size, spec.seq_len + spec.gen_len, getattr(torch, spec.dtype)
    )
    peak = peaks.lookup(*device)
    if peak is None:
        warnings.warn(
            f"no peak HBM bandwidth known for device {device[0]!r}; bandwidth utilisation left null",
            TpubenchWarning,
            stacklevel=2,
        )
    # the devices of a multi-device run share the bytes, and each reads its part at its own peak
    bandwidth = peak.device_hbm_bytes_per_s * spec.devices if peak else None
    utilisation = bandwidth_utilisation(moved, metrics["tpot_p50_ms"], bandwidth)
    # tokens/s means output tokens per second everywhere (serving tools' sense): one figure, not
    # a second definition (prompt plus output tokens is total_tokens_per_s, labelled as such)
    tokens = metrics["output_tokens_per_s"]
    return {**metrics, "tokens_per_s": tokens, "decode_bytes_per_step": moved, "bandwidth_util": utilisation}


def verify_outputs(spec: RunSpec, path: str) -> dict[str, Any]:
    """Compute ``spec``'s outputs for --verify and save them to ``path`` (torch.save)."""
    try:
        backend = get_backend(spec.backend)
        backend.setup(spec)
        backend.use_attention(spec)  # the candidate's kernel: --verify checks what was measured
        workload = workload_for(spec)
        instance = build(
            workload,
            spec.size,
            device=backend.device(),
            dtype=getattr(torch, spec.dtype),
            shape=shape_of(spec),
            init_dtype=getattr(torch, spec.init_dtype or spec.dtype),
        )
        if not parallel.is_multi_process(spec):  # SPMD: verify the sharded computation itself
            instance = apply_plan(spec, backend, instance)
        torch.save(verify.outputs(spec, backend, instance), path)
    except Exception as error:
        traceback.print_exc()
        return {"status": "failed", "error": f"{type(error).__name__}: {error}"}
    return {"status": "ok"}


def measure_ceiling(spec: ceilings.CeilingSpec, channel: Channel) -> dict[str, Any]:
    """A ceilings sweep (:mod:`tpubench.ceilings`) in this process: the whole sweep, or one
    rank's part of a collective's (whose launcher, :mod:`tpubench.launch.serve`, merges the
    ranks' results per sample into the slowest rank's)."""
    started = time.perf_counter()
    try:
        result = sweep.measure(spec, channel)
    except Exception as error:
        traceback.print_exc()
        result = {"status": "oom" if is_oom(error) else "failed", "error": f"{type(error).__name__}: {error}"}
    result["worker_wall_s"] = time.perf_counter() - started
    return result


def watch_parent(lifeline_fd: int, scratch: str | None) -> None:
    """Die with the parent: when ``lifeline_fd`` reaches end of file (the parent exited or was
    killed, so nobody will read this run), kill this worker's children, remove its scratch
    folder and exit. A daemon thread, so a step busy in native code does not delay it."""

    def wait_for_eof() -> None:
        with contextlib.suppress(OSError):
            while os.read(lifeline_fd, 4096):
                pass
        for child in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.Error):
                child.kill()
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=wait_for_eof, name="tpubench-lifeline", daemon=True).start()
