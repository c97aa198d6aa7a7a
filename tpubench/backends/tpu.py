"""TorchTPU backends: native ``tpu`` device, eager (``tpu``) or ``torch.compile(backend="tpu")``.

Three facts shape this module (see shared/reference/tpu-backends.md):

* importing ``torch_tpu`` changes torch process-wide (dynamo settings, a compile backend),
  so detection never imports it: it reads the PCI bus and package metadata, as TorchTPU's
  own ``hardware`` module does;
* forcing the runtime up without a chip aborts the process (SIGABRT) or hangs on the
  cloud metadata server, so only a worker on a host with a chip touches the device, and
  off-TPU workers get ``TPU_SKIP_MDS_QUERY=1``;
* compile statistics come from private APIs (``torch.tpu._get_cache_stats``), read
  behind a version gate: missing means null plus a warning, never a crash.
"""

from __future__ import annotations

import glob
import importlib.metadata
import importlib.util
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tpubench import TpubenchWarning, peaks
from tpubench.backends import dynamo
from tpubench.backends.base import Availability, Backend
from tpubench.spec import RunSpec

GOOGLE_PCI_VENDOR = "0x1ae0"
#: PCI device id -> chip, as TorchTPU's hardware table has it (devices per chip: tpubench.peaks)
PCI_DEVICE_TO_CHIP = {
    "0x005e": "TPU v4",
    "0x0062": "TPU v5p",
    "0x0063": "TPU v5e",
    "0x006f": "TPU v6e",
    "0x0076": "TPU v7",
}
EAGER_MODES = ("defer_never", "defer_and_fuse")


def google_pci_devices(root: Path = Path("/")) -> list[Path]:
    """sysfs folders of the Google (TPU) devices on this host's PCI bus; no runtime touched.

    ``root`` is the file-system root, so the tests can hand in a fake sysfs with a chip.
    """
    found = []
    for vendor_path in sorted(glob.glob(str(root / "sys/bus/pci/devices/*/vendor"))):
        try:
            if Path(vendor_path).read_text().strip() == GOOGLE_PCI_VENDOR:
                found.append(Path(vendor_path).parent)
        except OSError:
            continue
    return found


def tpu_chips(root: Path = Path("/")) -> list[str]:
    """The TPU chips TorchTPU can use here, by generation (``TPU v5e``...).

    A chip counts only when its IOMMU group is exposed under /dev/vfio, TorchTPU's own test.
    """
    chips = []
    for device_dir in google_pci_devices(root):
        try:
            device_id = device_dir.joinpath("device").read_text().strip()
            group = device_dir.joinpath("iommu_group").resolve().name
        except OSError:
            continue
        if (root / "dev/vfio" / group).exists():
            chips.append(PCI_DEVICE_TO_CHIP.get(device_id, f"TPU (PCI device {device_id})"))
    return chips


def tpu_devices(chips: list[str]) -> int:
    """Devices the runtime exposes for ``chips``: a v7 chip shows its two TensorCores as two."""
    return sum(peak.devices_per_chip if (peak := peaks.lookup(chip, "tpu")) else 1 for chip in chips)


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def tpu_cache_stats() -> dict[str, int] | None:
    """TorchTPU's compile-cache counters, or None (with a warning) where this version lacks them."""
    reader = getattr(getattr(torch, "tpu", None), "_get_cache_stats", None)
    if reader is None:
        warnings.warn(
            f"torch.tpu._get_cache_stats is missing in torch_tpu {_version('torch_tpu')}; compile counts left null",
            TpubenchWarning,
            stacklevel=2,
        )
        return None
    stats = reader()
    return {key: int(getattr(stats, key)) for key in ("num_compilations", "num_cache_reqs", "num_cache_hits")}


class TpuBackend(Backend):
    name = "tpu"
    device_kind = "tpu"
    description = "TorchTPU eager on the native tpu device"

    eager_mode = "defer_never"  # TorchTPU's default; --tpu-eager-mode sets it per run

    @property
    def worker_env(self) -> dict[str, str]:  # type: ignore[override]
        """Autoload on (it registers the device); off-TPU, never wait on a metadata server."""
        env = {"TORCH_DEVICE_BACKEND_AUTOLOAD": "1"}
        if not tpu_chips():
            env["TPU_SKIP_MDS_QUERY"] = "1"
        return env

    def availability(self) -> Availability:
        if importlib.util.find_spec("torch_tpu") is None:
            return Availability(False, f"torch_tpu not installed for {sys.executable}")
        # from package metadata, chip or not, so `tpubench env` shows what is installed
        versions = {"torch": torch.__version__, "torch_tpu": _version("torch_tpu") or "?"}
        versions |= {name: version for name in ("libtpu", "tpu-info") if (version := _version(name))}
        chips = tpu_chips()
        if not chips:
            return Availability(False, "no TPU chip on this host", versions=versions)
        return Availability(True, device_name=chips[0], device_count=tpu_devices(chips), versions=versions)

    def setup(self, spec: RunSpec) -> None:
        self.eager_mode = spec.tpu_eager_mode or self.eager_mode
        if self.eager_mode not in EAGER_MODES:
            raise ValueError(f"unknown TPU eager mode {self.eager_mode!r}; valid: {', '.join(EAGER_MODES)}")

    def device(self) -> torch.device:
        return torch.device("tpu")

    def prepare(self, model: nn.Module) -> nn.Module:
        torch.tpu.eager_mode = getattr(torch.tpu.EagerMode, self.eager_mode.upper())
        return model

    def synchronize(self) -> None:
        torch.accelerator.synchronize()

    def compile_count(self) -> int | None:
        stats = tpu_cache_stats()
        return None if stats is None else stats["num_compilations"]

    def memory_capacity_bytes(self) -> int | None:
        get_info = getattr(torch.accelerator, "get_memory_info", None)
        return None if get_info is None else int(get_info()[0])

    def reset_peak_memory(self) -> None:
        torch.accelerator.reset_peak_memory_stats()

    def peak_memory_bytes(self) -> int:
        return int(torch.accelerator.max_memory_allocated())

    def extra_metrics(self) -> dict[str, Any]:
        return {"tpu_eager_mode": self.eager_mode, "tpu_cache_stats": tpu_cache_stats()}

    def profile(self, step: Callable[[], Any], steps: int, logdir: str) -> str:
        """TorchTPU's profiler: an xplane trace in XProf's layout under ``logdir``."""
        from torch_tpu._internal.profiler import profile, xprof_trace_handler

        with profile(on_trace_ready=xprof_trace_handler(logdir)):
            self.run_traced_steps(step, steps)
        return logdir


class TpuCompileBackend(TpuBackend):
    name = "tpu-compile"
    description = 'torch.compile(backend="tpu", dynamic=False) on the native tpu device'

    def prepare(self, model: nn.Module) -> nn.Module:
        return dynamo.compile_model(super().prepare(model), backend="tpu")
