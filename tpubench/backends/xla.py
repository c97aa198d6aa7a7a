"""PyTorch/XLA backends: lazy-tensor execution (``xla``) and ``torch.compile(backend="openxla")``.

The PJRT device comes from ``PJRT_DEVICE`` (TPU on a TPU VM, CPU here, CUDA on a GPU), so
the same code measures a TPU and this machine's CPU. torch_xla pins its own torch, so
these workers usually run under another interpreter (``--python xla=...``); nothing here
imports torch_xla until a worker calls a method.

Figures come from ``torch_xla.debug.metrics`` counters and metric tuples, never from the
text report (which rounds seconds wrongly). ``aten::*`` counters are ops that fell back
to the CPU: on a TPU those are migration blockers.

A multi-device run is one process over N PJRT devices in SPMD mode (:mod:`tpubench.parallel.spmd`):
``CPU_NUM_DEVICES=N`` virtual devices on PJRT CPU, N chips of the host on a TPU.
"""

from __future__ import annotations

import math
import os
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tpubench.backends import dynamo
from tpubench.backends.base import FORCED_ATTENTION, Availability, Backend, simulated_device_limit
from tpubench.backends.cpu import CpuBackend
from tpubench.backends.tpu import (
    chips_env,
    google_pci_devices,
    host_devices_per_chip,
    pci_device_id,
    pin_env,
    pinned_groups,
    run_when_chip_free,
    tpu_pci_devices,
)
from tpubench.parallel import host_devices
from tpubench.spec import RunSpec
from tpubench.warning import TpubenchWarning

if TYPE_CHECKING:
    import torch
    from torch import nn

    from tpubench.compiles import Capture
    from tpubench.compiles.xla import CounterTotals

#: metrics counters reported per run, and the columns they become
CACHE_COUNTERS = {
    "compile_cache_hits": "PersistentCacheHit",
    "compile_cache_misses": "PersistentCacheMiss",
    "compile_cache_load_failures": "PersistentCacheDeserializeFailure",
}

#: the PCI device ids torch_xla 2.9 takes for TPU chips (``torch_xla._internal.tpu._TPU_PCI_DEVICE_IDS``):
#: v2/v3, v4, v5e, v6e, two test parts (0x0062 is v5p) and v7. Google's gVNIC (0x0042) is not one.
XLA_TPU_PCI_DEVICE_IDS = frozenset({"0x0027", "0x005e", "0x0063", "0x006f", "0x0056", "0x0062", "0x0076"})

#: ``TPU_CHIPS_PER_PROCESS_BOUNDS`` of a process that owns the first N chips of a host, as
#: vLLM's TPU backend and pytorch/xla#7714 set them (1 and 4 chips seen there; 2 and 8 by
#: the same x-then-y rule, a v5e-8/v6e-8 host being 2 x 4). Read from code, unverified on a chip.
CHIPS_PER_PROCESS_BOUNDS = {1: "1,1,1", 2: "1,2,1", 4: "2,2,1", 8: "2,4,1"}

#: why a multi-device xla run has no peak memory
SPMD_MEMORY_NOTE = (
    "peak memory left null: torch_xla gives no per-device memory under SPMD "
    "(get_memory_info refuses the SPMD virtual device)"
)


def _pjrt_device(root: Path = Path("/")) -> str:
    """PJRT_DEVICE, or what torch_xla picks when it is unset: TPU where a TPU chip is on the PCI
    bus (``tpu.num_available_chips``: Google's vendor id and a TPU device id), else CPU."""
    if "PJRT_DEVICE" in os.environ:
        return os.environ["PJRT_DEVICE"].upper()
    chips = [d for d in google_pci_devices(root) if pci_device_id(d) in XLA_TPU_PCI_DEVICE_IDS]
    return "TPU" if chips else "CPU"


def tpu_subset_env(environ: dict[str, str] | os._Environ, chips: int) -> dict[str, str]:
    """The variables that give one torch_xla process ``chips`` chips of a TPU host: the first
    of the user's ``TPU_VISIBLE_CHIPS``, else chips 0 to N-1, as TorchTPU's launcher lists
    them (:func:`tpu.chips_env`), with the bounds of a process owning them.

    Read from vLLM's TPU backend and pytorch/xla#7714, unverified on a chip (docs/multi-device.md).
    """
    return {
        **chips_env(environ, chips),
        "TPU_CHIPS_PER_PROCESS_BOUNDS": CHIPS_PER_PROCESS_BOUNDS.get(chips, f"1,{chips},1"),
        "TPU_PROCESS_BOUNDS": "1,1,1",
    }


class XlaBackend(Backend):
    name = "xla"
    description = "PyTorch/XLA lazy tensors on the PJRT device (PJRT_DEVICE: TPU, CPU or CUDA)"
    attention_kernels = ("auto", "math", "flash")  # auto: XLA's lowering of SDPA, which holds the scores

    root = Path("/")  # where the PCI bus and /dev/vfio are read: a fake sysfs in the tests
    counters: CounterTotals | None = None  # torch_xla's counters over the run's steps (set up by setup)
    debug_file: str | None = None  # where PT_XLA_DEBUG writes its compilation analyses
    cache_dir: str | None = None  # the persistent compilation cache, if any

    @property
    def device_kind(self) -> str:  # type: ignore[override]
        """Default shapes follow the PJRT device: CPU-sized on PJRT_DEVICE=CPU."""
        return {"CPU": "cpu", "CUDA": "cuda", "GPU": "cuda"}.get(_pjrt_device(self.root), "tpu")

    @property
    def worker_env(self) -> dict[str, str]:  # type: ignore[override]
        """On a TPU, one chip per run, as for TorchTPU (:func:`tpu.pin_env`)."""
        pinned = pin_env(os.environ) if _pjrt_device(self.root) == "TPU" else {}
        return {**super().worker_env, **pinned}

    def worker_env_for(self, spec: RunSpec) -> dict[str, str]:
        """A multi-device run's devices, which PJRT reads once, at start: ``CPU_NUM_DEVICES``
        virtual devices on PJRT CPU (``--xla_force_host_platform_device_count`` gives one),
        the run's chips on a TPU (:func:`tpu_subset_env`)."""
        env = self.worker_env
        local = host_devices(spec)  # on several hosts, this host's share of the mesh
        if local == 1:
            return env
        pjrt = _pjrt_device(self.root)
        if pjrt == "CPU":
            return {**env, "CPU_NUM_DEVICES": str(local)}
        if pjrt == "TPU":
            return {**env, **tpu_subset_env(os.environ, self._chips(local))}
        return env

    def simulated_devices(self) -> bool:
        """PJRT CPU's devices are threads sharing the host's cores: their timings mean nothing."""
        return _pjrt_device(self.root) == "CPU"

    def _chips(self, devices: int) -> int:
        """The chips that hold ``devices`` PJRT devices (two per chip on v7)."""
        return math.ceil(devices / host_devices_per_chip(self.root))

    def run_on_device(self, start: Callable[[], dict[str, Any]], on_wait: Callable[[str], None]) -> dict[str, Any]:
        """On a TPU, start the worker once its chip can be opened, and once more if it found it busy."""
        if _pjrt_device(self.root) != "TPU":
            return start()
        groups = pinned_groups(tpu_pci_devices(self.root), self.worker_env["TPU_VISIBLE_CHIPS"])
        return run_when_chip_free(groups, start, on_wait)

    def availability(self) -> Availability:
        import torch

        try:
            import torch_xla
            import torch_xla.core.xla_model as xm
            import torch_xla.runtime as xr
        except ImportError as error:
            return Availability(False, f"torch_xla not installed for {sys.executable} ({error})")
        try:
            device = torch_xla.device()
            # the SPMD virtual device has no kind: a multi-device run names the PCI chip
            kind = self._spmd_device_kind() if xr.is_spmd() else xm.xla_device_kind(device)
            count = xr.global_runtime_device_count()
        except Exception as error:  # PJRT raises plain RuntimeErrors when it cannot start
            return Availability(False, f"PJRT could not start {_pjrt_device()} for {sys.executable}: {error}")
        versions = {"torch": torch.__version__, "torch_xla": torch_xla.__version__, "pjrt_device": _pjrt_device()}
        try:
            import libtpu

            versions["libtpu"] = libtpu.__version__
        except (ImportError, AttributeError):
            pass
        name = "CPU (PJRT)" if kind.lower() == "cpu" else kind
        devices = self._parallel_devices(count)
        return Availability(
            True,
            device_name=name,
            device_count=count,
            versions=versions,
            parallel_devices=devices,
            memory_bytes=self.memory_capacity_bytes(),
        )

    def _spmd_device_kind(self) -> str:
        """The device kind in SPMD mode, where torch_xla 2.9 knows only the virtual device:
        "cpu" on PJRT CPU, the chip's PCI name on a TPU (a name :mod:`tpubench.peaks` knows)."""
        pjrt = _pjrt_device(self.root)
        chips = tpu_pci_devices(self.root) if pjrt == "TPU" else []
        return chips[0].chip if chips else pjrt.lower()

    def _parallel_devices(self, count: int) -> int:
        """The devices one run may use: PJRT CPU simulates up to :func:`simulated_device_limit`;
        a TPU host offers all its chips' devices, although this probe saw only its pinned one."""
        pjrt = _pjrt_device(self.root)
        if pjrt == "CPU":
            return simulated_device_limit()
        if pjrt == "TPU":
            return len(tpu_pci_devices(self.root)) or count
        return count

    def use_attention(self, spec: RunSpec) -> None:
        """``flash``: torch_xla's Pallas flash attention kernel (``custom_kernel.flash_attention``),
        which runs on a TPU only; elsewhere the run is ``unavailable``. Read from torch_xla's
        code, unverified on a chip (docs/long-context.md)."""
        if spec.attention != "flash":
            return super().use_attention(spec)
        from workloads import attention

        if _pjrt_device(self.root) != "TPU":
            raise attention.AttentionUnsupported(
                f"flash attention on xla is torch_xla's Pallas kernel, which needs a TPU; this PJRT device is "
                f"{_pjrt_device(self.root)}"
            )
        from torch_xla.experimental.custom_kernel import flash_attention

        def pallas_flash(q: Any, k: Any, v: Any, mask: Any, causal: bool) -> Any:
            if mask is not None:
                raise attention.AttentionUnsupported("torch_xla's flash attention takes no KV cache's mask")
            return flash_attention(q, k, v, causal=causal)

        FORCED_ATTENTION.enter_context(attention.use(pallas_flash))
        return None

    def setup(self, spec: RunSpec) -> None:
        """Turn on SPMD for a multi-device run, XLA's persistent compilation cache and, to
        capture compiles, PT_XLA_DEBUG's analyses (torch_xla reads them once: they must
        precede any XLA computation, and SPMD any XLA tensor or runtime query)."""
        from tpubench.compiles.xla import CounterTotals, debug_env

        if spec.capture_compiles:
            variables = debug_env()
            os.environ.update(variables)
            self.debug_file = variables["PT_XLA_DEBUG_FILE"]
        if spec.devices > 1:
            import torch_xla.runtime as xr

            xr.use_spmd()
        if spec.compile_cache:
            import torch_xla.runtime as xr

            self.cache_dir = os.path.join(spec.compile_cache, "xla")
            xr.initialize_cache(self.cache_dir, readonly=False)
        self.counters = CounterTotals()
        self.counters.start()

    def step_finished(self) -> None:
        if self.counters is not None:
            self.counters.sample()

    def compile_capture(self, spec: RunSpec) -> Capture | None:
        from tpubench.compiles.xla import CounterTotals, XlaCapture

        return XlaCapture(self.counters or CounterTotals(), self.debug_file, self.cache_dir)

    def device(self) -> torch.device:
        import torch_xla

        return torch_xla.device()

    def after_step(self) -> None:
        """Cut the lazy graph and launch it: one ``torch_xla.sync()`` per step."""
        import torch_xla

        torch_xla.sync()

    def synchronize(self) -> None:
        import torch_xla.core.xla_model as xm

        xm.wait_device_ops()

    def compile_count(self) -> int:
        """XLA compilations that missed the in-memory cache: new graphs, not cache lookups."""
        import torch_xla.debug.metrics as met

        return met.counter_value("UncachedCompile") or 0

    def compile_seconds(self) -> float:
        import torch_xla.debug.metrics as met

        data = met.metric_data("CompileTime")
        return data[1] / 1e9 if data else 0.0

    def memory_capacity_bytes(self) -> int | None:
        info = self._memory_info()
        if info is None:
            return CpuBackend().memory_capacity_bytes() if _pjrt_device() == "CPU" else None
        return info.get("bytes_limit")

    def memory_in_use_bytes(self) -> int | None:
        """What the device holds before the model exists, measured as the peak is: the
        allocator's bytes in use, or on PJRT CPU the worker's resident set. None under SPMD,
        which has no per-device figure."""
        import torch_xla.runtime as xr

        if xr.is_spmd():
            return None
        info = self._memory_info()
        if info is None:
            return CpuBackend().memory_in_use_bytes() if _pjrt_device() == "CPU" else None
        return info.get("bytes_used")

    def peak_memory_bytes(self) -> int | None:
        """The device allocator's peak; on PJRT CPU (no allocator stats) the worker's peak RSS.
        Null under SPMD, with a note: no per-device figure exists, and the worker's RSS on PJRT
        CPU would be all the devices' together."""
        import torch_xla.runtime as xr

        if xr.is_spmd():
            warnings.warn(SPMD_MEMORY_NOTE, TpubenchWarning, stacklevel=2)
            return None
        info = self._memory_info()
        if info is None:
            return CpuBackend().peak_memory_bytes() if _pjrt_device() == "CPU" else None
        return info.get("peak_bytes_used")

    def _memory_info(self) -> dict[str, int] | None:
        import torch_xla.core.xla_model as xm

        try:
            return xm.get_memory_info(self.device())
        except RuntimeError:  # "GetAllocatorStats is not supported" on PJRT CPU
            return None

    def extra_metrics(self) -> dict[str, Any]:
        """Totals over the run's steps (:class:`CounterTotals`), not the counters' values at
        the end: xla-compile's bridge clears the counters on every Dynamo compile."""
        import torch_xla.debug.metrics as met

        from tpubench.compiles.xla import CounterTotals

        if self.counters is None:  # a backend used without setup (a test's own protocol)
            self.counters = CounterTotals()
        self.counters.sample()
        totals = self.counters.totals
        execute = met.metric_data("ExecuteTime")
        return {
            "execute_s": execute[1] / 1e9 if execute else 0.0,
            "cached_compiles": totals.get("CachedCompile", 0),
            "fallback_ops": self.counters.fallbacks(),
            **{column: totals.get(counter, 0) for column, counter in CACHE_COUNTERS.items()},
        }

    def profile(self, step: Callable[[], Any], steps: int, logdir: str) -> str:
        """An xplane trace of ``steps`` extra steps, each in a StepTrace, in XProf's layout.

        Leaving a StepTrace cuts and launches the step's graph, so it replaces ``after_step``.
        """
        import torch_xla.debug.profiler as xp

        xp.start_trace(logdir)
        try:
            for index in range(steps):
                with xp.StepTrace("train_step", step_num=index):
                    output = step()
                del output
            self.synchronize()
        finally:
            xp.stop_trace()
        return logdir


class XlaCompileBackend(XlaBackend):
    name = "xla-compile"
    description = 'torch.compile(backend="openxla") on the PJRT device'

    def prepare(self, model: nn.Module) -> nn.Module:
        return dynamo.compile_model(model, backend="openxla")

    def compile_capture(self, spec: RunSpec) -> Capture | None:
        """XLA's compiles (whose seconds are the run's ``compile_s``), joined to Dynamo's."""
        from tpubench.compiles.dynamo import DynamoCapture
        from tpubench.compiles.xla import XlaCompileCaptures

        xla = super().compile_capture(spec)
        assert xla is not None
        return XlaCompileCaptures(xla, DynamoCapture(shared_cache=bool(spec.compile_cache), seconds_layer=False))
