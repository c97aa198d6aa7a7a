"""CPU backends: eager PyTorch and ``torch.compile`` (Inductor's C++ code generation)."""

from __future__ import annotations

import contextlib
import platform
import resource
from typing import TYPE_CHECKING

import psutil

from tpubench.backends import dynamo
from tpubench.backends.base import Availability, Backend, simulated_device_limit

if TYPE_CHECKING:
    import torch

    from tpubench.spec import RunSpec


def cpu_model() -> str:
    """The processor's marketing name, e.g. "AMD EPYC 7B13", from /proc/cpuinfo when present."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


class CpuBackend(Backend):
    name = "cpu"
    device_kind = "cpu"
    description = "PyTorch eager on the host CPU"

    def availability(self) -> Availability:
        import torch

        return Availability(
            True,
            device_name=cpu_model(),
            device_count=1,
            versions={"torch": torch.__version__},
            parallel_devices=simulated_device_limit(),
            memory_bytes=psutil.virtual_memory().available,
        )

    def device(self) -> torch.device:
        import torch

        return torch.device("cpu")

    def simulated_devices(self) -> bool:
        """A multi-device CPU run's ranks share the host's cores and memory (gloo on 127.0.0.1):
        it checks the plumbing and the numerics, never the speed of N devices."""
        return True

    def compile_count(self) -> int | None:
        return 0

    def memory_capacity_bytes(self) -> int:
        return psutil.virtual_memory().available

    def memory_in_use_bytes(self) -> int:
        """This worker's resident set before the model exists: Python, torch and the harness."""
        return psutil.Process().memory_info().rss

    def peak_memory_bytes(self) -> int:
        """Peak resident set of this worker's address space (Linux's VmHWM, in KiB).

        Not ``getrusage``'s ``ru_maxrss``: Linux carries that across ``exec``, so a worker
        started by a large process (a pytest-xdist worker held 630 MB) reported its parent's
        peak as its own. Elsewhere ``ru_maxrss`` is all there is.
        """
        with contextlib.suppress(OSError), open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    def extra_metrics(self) -> dict[str, object]:
        import torch

        return {"num_threads": torch.get_num_threads()}


class CpuCompileBackend(dynamo.InductorCompiled, CpuBackend):
    name = "cpu-compile"
    description = "torch.compile (Inductor) on the host CPU"
    attention_kernels = ("auto", "math", "flex")  # flex is fused only when compiled

    def use_attention(self, spec: RunSpec) -> None:
        """As every backend's, but a training run under flex attention is refused before it
        compiles for minutes: torch's FlexAttention has no backward on a CPU."""
        if spec.attention == "flex" and spec.mode == "train":
            from workloads.attention import AttentionUnsupported

            raise AttentionUnsupported("flex attention has no backward on a CPU (torch's FlexAttention); run infer")
        super().use_attention(spec)
