"""The interface every backend implements: where a model runs and how its time is read.

Everything device-specific lives behind this interface (optimum-benchmark's backend idea),
so a workload runs unchanged on every chip. The parent (and a Ray actor) only reads a
backend's declarations (its device kind, worker environment, whether its workers fork), so
the backend modules import torch and the device runtimes inside the methods a worker calls,
never at import: planning and dispatching stay free of the 1 s ``import torch``.
"""

from __future__ import annotations

import contextlib
import os
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tpubench.spec import RunSpec

if TYPE_CHECKING:  # torch is imported where a worker uses it: the registry stays light for the parent
    import torch
    from torch import nn
    from torch.profiler import ProfilerActivity

    from tpubench.compiles import Capture


#: the ``--attention`` choices that are one of SDPA's backends, forced with ``sdpa_kernel``
SDPA_KERNELS = {
    "flash": "FLASH_ATTENTION",
    "efficient": "EFFICIENT_ATTENTION",
    "math": "MATH",
    "cudnn": "CUDNN_ATTENTION",
}
#: the kernel forced for the rest of this worker process (:meth:`Backend.use_attention`)
FORCED_ATTENTION = contextlib.ExitStack()

#: how many devices a multi-device run may simulate where devices are simulated (gloo ranks
#: sharing the host's CPUs, PJRT's virtual CPU devices); above it, runs are ``unavailable``
#: what every worker but TorchTPU's runs with: an installed TPU plugin must not autoload (the
#: launcher's fork server starts with it too, before any backend is chosen)
DEFAULT_WORKER_ENV = {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
SIMULATED_DEVICES_ENV = "TPUBENCH_SIMULATED_DEVICES"
DEFAULT_SIMULATED_DEVICES = 8


def simulated_device_limit() -> int:
    """The most devices a simulated multi-device run may have (``TPUBENCH_SIMULATED_DEVICES``,
    default 8): a cap on how many ranks or virtual devices share this host's cores."""
    text = os.environ.get(SIMULATED_DEVICES_ENV, str(DEFAULT_SIMULATED_DEVICES))
    if not text.strip().isdigit() or int(text) < 1:
        raise ValueError(f"{SIMULATED_DEVICES_ENV}={text!r}: expected a positive integer")
    return int(text)


@dataclass(frozen=True)
class Availability:
    available: bool
    reason: str = ""
    device_name: str = ""
    device_count: int = 0
    versions: dict[str, str] = field(default_factory=dict)
    #: devices one multi-device run may use here (GPUs, TPU devices; where devices are
    #: simulated, :func:`simulated_device_limit`); a run asking for more is ``unavailable``
    parallel_devices: int = 1
    #: memory of one device in bytes (a CPU: what the host has available), where known, so
    #: that a sweep that cannot fit is refused before it starts (``tpubench ceilings``)
    memory_bytes: int | None = None
    #: a CUDA GPU's compute capability ("9.0"), which decides its tensor-core dtypes (TF32, fp8)
    compute_capability: str | None = None


class StepTimer:
    """Host wall-clock timing with the device drained on both sides of the timed region."""

    def __init__(self, synchronize: Callable[[], None]):
        self._synchronize = synchronize
        self._start = 0.0

    def start(self) -> None:
        self._synchronize()
        self._start = time.perf_counter()

    def lap(self) -> float:
        """Host milliseconds since :meth:`start`, without waiting for the device.

        Read when the step function returns, it is the host's tracing/dispatch time: when
        it is close to the full step time, Python (not the chip) is the bottleneck.
        """
        return (time.perf_counter() - self._start) * 1e3

    def stop(self) -> float:
        """Milliseconds since :meth:`start`, after waiting for the device."""
        self._synchronize()
        return (time.perf_counter() - self._start) * 1e3


class Backend(ABC):
    """One way of running a model: a device plus an execution mode (eager or compiled)."""

    name: str
    device_kind: str  # "cpu", "cuda" or "tpu": selects the default shapes and the device lock
    description: str
    #: whether workers may be forked from the zygote, which has imported torch with this
    #: backend's environment; False where importing torch brings a device runtime up
    forkable: bool = True
    #: the ``--attention`` kernels it can force (:data:`tpubench.spec.ATTENTION_CHOICES`), checked
    #: before anything runs; ``auto`` is its own choice
    attention_kernels: tuple[str, ...] = ("auto", "math")
    #: whether ``auto`` runs a fused attention kernel whatever the shape, so that the memory
    #: estimate counts O(S) attention activations for it (else the S x S scores: an estimate
    #: must not fall below the peak)
    fused_attention_by_default: bool = False

    @property
    def worker_env(self) -> dict[str, str]:
        """Variables set in this backend's worker before Python starts. Non-TPU workers turn
        off torch's device-backend autoload so an installed TPU plugin cannot alter them."""
        return dict(DEFAULT_WORKER_ENV)

    def worker_env_for(self, spec: RunSpec) -> dict[str, str]:
        """The worker environment of one run: :attr:`worker_env` plus what the run's devices
        need before Python starts (the N virtual devices of a multi-device PJRT CPU run,
        the GPUs or chips it is pinned to)."""
        return self.worker_env

    def simulated_devices(self) -> bool:
        """Whether a multi-device run here only simulates its devices (gloo ranks sharing the
        host's CPUs, PJRT's virtual CPU devices): its rows are marked, their timings mean nothing."""
        return False

    def run_on_device(self, start: Callable[[], dict[str, Any]], on_wait: Callable[[str], None]) -> dict[str, Any]:
        """In the parent: start this backend's worker (``start`` returns its row fields).

        A device that stays held for a while after its last user exits (a TPU chip) waits
        and retries here, telling ``on_wait`` why; others just start.
        """
        return start()

    @abstractmethod
    def availability(self) -> Availability:
        """Whether this backend can run here, probed without side effects on the device."""

    @abstractmethod
    def device(self) -> torch.device: ...

    def setup(self, spec: RunSpec) -> None:
        """Configure the runtime from the run's settings before anything touches the device
        (a persistent compile cache, an eager mode)."""

    def use_attention(self, spec: RunSpec) -> None:
        """Force the run's ``--attention`` kernel for the rest of this process, which measures
        one run: SDPA's backend through ``torch.nn.attention.sdpa_kernel``, flex attention
        through :func:`workloads.attention.use`. ``auto`` changes nothing. Raises
        :class:`workloads.attention.AttentionUnsupported` where this device cannot run it."""
        choice = spec.attention
        if choice == "auto":
            return
        if choice == "flex":
            from workloads import attention

            if spec.mode in ("prefill", "decode"):
                raise attention.AttentionUnsupported(attention.FLEX_NO_CACHE)
            FORCED_ATTENTION.enter_context(attention.use(attention.flex))
            return
        from torch.nn.attention import SDPBackend, sdpa_kernel

        FORCED_ATTENTION.enter_context(sdpa_kernel(getattr(SDPBackend, SDPA_KERNELS[choice])))

    @classmethod
    def holds_attention_scores(cls, choice: str) -> bool:
        """Whether attention under ``choice`` holds the S x S scores (SDPA's math path; ``auto``
        where the backend's own choice is not always fused), which the memory estimate counts
        (:func:`workloads.attention.estimating`)."""
        return choice == "math" or (choice == "auto" and not cls.fused_attention_by_default)

    def prepare(self, model: nn.Module) -> nn.Module:
        """Wrap the model for execution (``torch.compile`` and friends). Eager: unchanged."""
        return model

    def synchronize(self) -> None:
        """Block until all queued device work is done (a host-synchronous device has none)."""

    def after_step(self) -> None:
        """Called after each step inside the timed region: a lazy backend launches its graph here."""

    def timer(self) -> StepTimer:
        return StepTimer(self.synchronize)

    def profiler_activities(self) -> list[ProfilerActivity]:
        from torch.profiler import ProfilerActivity

        return [ProfilerActivity.CPU]

    def profile(self, step: Callable[[], Any], steps: int, logdir: str) -> str:
        """Trace ``steps`` extra steps (each with its ``after_step``) with torch.profiler.

        Returns the path of a Chrome-format trace that Perfetto and chrome://tracing open.
        """
        from torch.profiler import profile

        with profile(activities=self.profiler_activities(), record_shapes=True) as profiler:
            self.run_traced_steps(step, steps)
        os.makedirs(logdir, exist_ok=True)
        path = os.path.join(logdir, "trace.json")
        profiler.export_chrome_trace(path)
        return path

    def run_traced_steps(self, step: Callable[[], Any], steps: int) -> None:
        """The steps a profiler records: each with its ``after_step``, then a drain of the device."""
        for _ in range(steps):
            output = step()
            self.after_step()
            del output
        self.synchronize()

    def step_finished(self) -> None:
        """Called after each timed step, outside its timed region: bookkeeping that must see
        every step (torch_xla's counters, which xla-compile's bridge resets on each compile)."""

    def compile_capture(self, spec: RunSpec) -> Capture | None:
        """What records this backend's compiles for the ``compiles`` table (tpubench/compiles/);
        None where nothing compiles. Called after :meth:`setup`, before the model is built."""
        return None

    def compile_count(self) -> int | None:
        """Graphs compiled so far in this process; None where the notion does not apply."""
        return None

    def compile_seconds(self) -> float | None:
        """Time spent compiling so far in this process; None where nothing compiles."""
        return None

    def memory_capacity_bytes(self) -> int | None:
        """Memory a run may use on this device, to refuse runs that cannot fit."""
        return None

    def memory_in_use_bytes(self) -> int | None:
        """What the device already holds before the model is built (the worker process
        itself, on a CPU); ``peak_memory_bytes`` includes it, the estimate does not."""
        return None

    def reset_peak_memory(self) -> None:
        """Start a new peak-memory window (a fresh worker process has none to reset)."""

    def peak_memory_bytes(self) -> int | None:
        return None

    def extra_metrics(self) -> dict[str, Any]:
        """Backend-specific figures stored with the run (e.g. the float32 matmul precision)."""
        return {}
