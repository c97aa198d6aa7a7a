"""CUDA backends: eager PyTorch and ``torch.compile`` (Inductor/Triton) on an NVIDIA GPU.

Steps are timed with CUDA events recorded on the stream, so the figure is device time
between the events, read after a synchronisation.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from tpubench.backends import dynamo
from tpubench.backends.base import Availability, Backend, StepTimer
from tpubench.parallel import host_devices, ranks_env
from tpubench.spec import RunSpec

if TYPE_CHECKING:
    import torch
    from torch.profiler import ProfilerActivity


def visible_devices(environ: Mapping[str, str], devices: int) -> str:
    """``CUDA_VISIBLE_DEVICES`` for a run on ``devices`` GPUs: the first of those the user (or
    Ray) made visible, else GPUs 0 to N-1. Fewer than N visible stay fewer, and the runner
    reports the run ``unavailable``."""
    visible = [part.strip() for part in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if part.strip()]
    return ",".join(visible[:devices] if visible else (str(index) for index in range(devices)))


class CudaEventTimer(StepTimer):
    def __init__(self) -> None:
        import torch

        super().__init__(torch.cuda.synchronize)
        self._begin = torch.cuda.Event(enable_timing=True)
        self._end = torch.cuda.Event(enable_timing=True)

    def start(self) -> None:
        super().start()
        self._begin.record()

    def stop(self) -> float:
        self._end.record()
        self._synchronize()  # torch.cuda.synchronize, bound before the timed region
        return float(self._begin.elapsed_time(self._end))


class CudaBackend(Backend):
    name = "cuda"
    device_kind = "cuda"
    description = "PyTorch eager on an NVIDIA GPU"
    attention_kernels = ("auto", "flash", "efficient", "math", "cudnn")
    fused_attention_by_default = True  # SDPA picks flash, memory-efficient (float32 too) or cuDNN

    def availability(self) -> Availability:
        import torch

        if not torch.cuda.is_available():
            reason = "torch built without CUDA" if torch.version.cuda is None else "no CUDA device"
            return Availability(False, reason)
        return Availability(
            True,
            device_name=torch.cuda.get_device_name(0),
            device_count=torch.cuda.device_count(),
            parallel_devices=torch.cuda.device_count(),
            memory_bytes=torch.cuda.get_device_properties(0).total_memory,
            compute_capability="{}.{}".format(*torch.cuda.get_device_capability(0)),
            versions={
                "torch": torch.__version__,
                "cuda": str(torch.version.cuda),
                "cudnn": str(torch.backends.cudnn.version()),
            },
        )

    def worker_env_for(self, spec: RunSpec) -> dict[str, str]:
        """A multi-GPU run sees its N GPUs only (each rank then takes ``cuda:LOCAL_RANK``), so
        that the device locks name the GPUs it really uses."""
        env = self.worker_env
        if host_devices(spec) > 1:  # on several hosts, this host's share
            env["CUDA_VISIBLE_DEVICES"] = visible_devices(os.environ, host_devices(spec))
        return env

    def setup(self, spec: RunSpec) -> None:
        """A rank of a multi-device run works on its own GPU (of those the run is pinned to)."""
        import torch

        super().setup(spec)
        if ranks_env() is not None:
            torch.cuda.set_device(self.device())

    def device(self) -> torch.device:
        import torch

        ranks = ranks_env()
        return torch.device("cuda", ranks["local_rank"] if ranks else 0)

    def synchronize(self) -> None:
        import torch

        torch.cuda.synchronize()

    def timer(self) -> StepTimer:
        return CudaEventTimer()

    def profiler_activities(self) -> list[ProfilerActivity]:
        from torch.profiler import ProfilerActivity

        return [ProfilerActivity.CPU, ProfilerActivity.CUDA]

    def compile_count(self) -> int | None:
        return 0

    def memory_capacity_bytes(self) -> int:
        import torch

        free, _total = torch.cuda.mem_get_info()
        return free

    def reset_peak_memory(self) -> None:
        import torch

        torch.cuda.reset_peak_memory_stats()

    def peak_memory_bytes(self) -> int:
        import torch

        return torch.cuda.max_memory_allocated()

    def extra_metrics(self) -> dict[str, object]:
        import torch

        return {"float32_matmul_precision": torch.get_float32_matmul_precision()}


class CudaCompileBackend(dynamo.InductorCompiled, CudaBackend):
    name = "cuda-compile"
    description = "torch.compile (Inductor/Triton) on an NVIDIA GPU"
    attention_kernels = ("auto", "flash", "efficient", "math", "cudnn", "flex")
