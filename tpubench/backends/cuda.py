"""CUDA backends: eager PyTorch and ``torch.compile`` (Inductor/Triton) on an NVIDIA GPU.

Steps are timed with CUDA events recorded on the stream, so the figure is device time
between the events, read after a synchronisation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tpubench.backends import dynamo
from tpubench.backends.base import Availability, Backend, StepTimer
from tpubench.parallel import ranks_env

if TYPE_CHECKING:
    import torch
    from torch.profiler import ProfilerActivity

    from tpubench.spec import RunSpec


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

    def availability(self) -> Availability:
        import torch

        if not torch.cuda.is_available():
            reason = "torch built without CUDA" if torch.version.cuda is None else "no CUDA device"
            return Availability(False, reason)
        return Availability(
            True,
            device_name=torch.cuda.get_device_name(0),
            device_count=torch.cuda.device_count(),
            versions={
                "torch": torch.__version__,
                "cuda": str(torch.version.cuda),
                "cudnn": str(torch.backends.cudnn.version()),
            },
        )

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
