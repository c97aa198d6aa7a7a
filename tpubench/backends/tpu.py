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

import errno
import glob
import hashlib
import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tpubench import peaks
from tpubench.backends import dynamo
from tpubench.backends.base import Availability, Backend
from tpubench.parallel import host_devices
from tpubench.spec import RunSpec
from tpubench.warning import TpubenchWarning

if TYPE_CHECKING:
    import torch
    from torch import nn

    from tpubench.compiles import Capture

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
#: one chip per run (torch_xla's ``configure_one_chip_topology`` sets the same three)
PIN_DEFAULTS = {"TPU_VISIBLE_CHIPS": "0", "TPU_CHIPS_PER_PROCESS_BOUNDS": "1,1,1", "TPU_PROCESS_BOUNDS": "1,1,1"}
#: how long a worker waits for a busy chip before starting anyway, and the backoff's steps
CHIP_WAIT_LIMIT_S, CHIP_WAIT_FIRST_S, CHIP_WAIT_STEP_S = 60.0, 0.05, 2.0
#: what libtpu says when a chip is held: the VFIO group's EBUSY, and its lockfile check
CHIP_BUSY_MARKERS = ("Device or resource busy", "already in use by process with pid")


def google_pci_devices(root: Path = Path("/")) -> list[Path]:
    """sysfs folders of this host's Google PCI functions (TPUs, but also the gVNIC network card
    of every Google Cloud VM), in PCI address order; no runtime touched.

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


def pci_device_id(device_dir: Path) -> str | None:
    """The PCI device id (``0x0063``) in a function's sysfs folder; None where unreadable."""
    try:
        return device_dir.joinpath("device").read_text().strip()
    except OSError:
        return None


@dataclass(frozen=True)
class TpuPciDevice:
    """One TPU PCI function TorchTPU can open: a whole chip, or on v7 one of its two TensorCores."""

    address: str  # PCI address, e.g. 0000:00:04.0
    chip: str  # generation, e.g. TPU v5e
    vfio_group: Path  # /dev/vfio/<IOMMU group>, the file a TPU process holds open


def tpu_pci_devices(root: Path = Path("/")) -> list[TpuPciDevice]:
    """The TPU devices TorchTPU counts here, in PCI address order.

    As TorchTPU's ``hardware._scan_pci_tpus`` does: Google functions with a TPU device id (not
    the gVNIC's), each counted once if its IOMMU group is exposed under /dev/vfio. On v7 each
    TensorCore is its own function, so this is already the runtime's device count.
    """
    found = []
    for device_dir in google_pci_devices(root):
        chip = PCI_DEVICE_TO_CHIP.get(pci_device_id(device_dir) or "")
        try:
            group = root / "dev/vfio" / device_dir.joinpath("iommu_group").resolve().name
        except OSError:
            continue
        if chip and group.exists():
            found.append(TpuPciDevice(device_dir.name, chip, group))
    return found


def pin_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables that give a TPU worker one chip, the user's own values first.

    Without them the runtime opens every chip of the VM and libtpu takes its host-wide
    ``/tmp/libtpu_lockfile``; with chips-per-process bounds that are a subset of the host,
    libtpu skips that lock (``TryAcquireTpuLock``), so runs on different chips can share a VM.
    ``TPU_VISIBLE_CHIPS=3 tpubench run ...`` picks chip 3. They reach the row through the
    ``env`` fingerprint.
    """
    return {name: environ.get(name, default) for name, default in PIN_DEFAULTS.items()}


def host_devices_per_chip(root: Path = Path("/")) -> int:
    """Devices per chip of this host's TPUs (two on v7, where each TensorCore is a device; one
    where the peak table does not know the chip, or there is none)."""
    found = tpu_pci_devices(root)
    peak = peaks.lookup(found[0].chip, "tpu") if found else None
    return peak.devices_per_chip if peak else 1


def chips_env(environ: Mapping[str, str], devices: int, devices_per_chip: int = 1) -> dict[str, str]:
    """The launcher's variables for a TorchTPU run on ``devices`` devices: ``TPU_VISIBLE_CHIPS``
    lists their chips (two devices per chip on v7), the first of the user's
    ``TPU_VISIBLE_CHIPS``, else chips 0, 1, ...; the one-chip bounds of :data:`PIN_DEFAULTS`
    are left out. TorchTPU pins each rank itself (one device per rank process, from
    ``LOCAL_RANK``: :mod:`tpubench.launch.ranks`); this list is what the runner locks and
    what the ranks are given. Read from TorchTPU's code, not yet run on a chip."""
    chips = -(-devices // devices_per_chip)
    visible = [part.strip() for part in environ.get("TPU_VISIBLE_CHIPS", "").split(",") if part.strip()]
    return {"TPU_VISIBLE_CHIPS": ",".join(visible[:chips] if visible else (str(i) for i in range(chips)))}


def pinned_groups(devices: list[TpuPciDevice], visible_chips: str) -> list[Path]:
    """The VFIO groups a worker pinned to ``visible_chips`` (``TPU_VISIBLE_CHIPS``) opens.

    Chip ``i`` is taken to be the ``i``-th chip in PCI address order (libtpu's numbering, not
    documented), holding ``devices_per_chip`` consecutive functions (two on v7). A value that
    is not a list of chip indexes gives every group, so the wait errs towards waiting.
    """
    peak = peaks.lookup(devices[0].chip, "tpu") if devices else None
    per_chip = peak.devices_per_chip if peak else 1
    try:
        chips = [int(chip) for chip in visible_chips.split(",")]
    except ValueError:
        return [device.vfio_group for device in devices]
    return [device.vfio_group for chip in chips for device in devices[chip * per_chip : (chip + 1) * per_chip]]


def chip_holder(groups: list[Path]) -> str | None:
    """What keeps ``groups`` (a chip's /dev/vfio files) from being opened now; None when nothing does.

    A TPU process holds its chip's VFIO groups open, and the kernel refuses a second open of
    a group (EBUSY) until the holder's last descriptor is closed, which after a kill can take
    seconds. Like libtpu's own ``FindLibtpuProcess``, look for a process with the file open
    first (that names it), then try the open itself, which also sees other users' processes.
    """
    if not groups:  # no chip here (or none pinned): nothing to wait for
        return None
    targets = {os.path.realpath(group) for group in groups}
    for fd_dir in glob.glob("/proc/[0-9]*/fd"):
        try:
            held = {os.readlink(os.path.join(fd_dir, fd)) for fd in os.listdir(fd_dir)} & targets
        except OSError:  # another user's process, or one that just exited
            continue
        if held:
            return f"process {fd_dir.split('/')[2]} has {', '.join(sorted(held))} open"
    for group in groups:
        try:
            os.close(os.open(group, os.O_RDWR | os.O_CLOEXEC))
        except OSError as error:
            if error.errno == errno.EBUSY:
                return f"{group}: {error.strerror}"
    return None


def wait_for_chip(groups: list[Path], on_wait: Callable[[str], None], limit_s: float = CHIP_WAIT_LIMIT_S) -> float:
    """Wait, with a backoff bounded by ``limit_s``, until :func:`chip_holder` finds nothing.

    Returns the seconds waited (0.0 when the chip was free). ``on_wait`` hears what held the
    chip once, when the wait begins. After ``limit_s`` the worker starts anyway and says why
    it failed, if it does.
    """
    started = time.perf_counter()
    holder = chip_holder(groups)
    if holder is None:
        return 0.0
    on_wait(f"waiting for the TPU chip: {holder}")
    delay = CHIP_WAIT_FIRST_S
    while holder is not None and (waited := time.perf_counter() - started) < limit_s:
        time.sleep(min(delay, limit_s - waited))
        delay = min(2 * delay, CHIP_WAIT_STEP_S)
        holder = chip_holder(groups)
    return time.perf_counter() - started


def chip_was_busy(result: dict[str, Any]) -> bool:
    """Whether a failed worker failed because its chip was still held (libtpu's own messages)."""
    if result.get("status") not in ("failed", "crashed"):
        return False
    text = f"{result.get('error') or ''}\n{result.get('stderr_tail') or ''}"
    return any(marker in text for marker in CHIP_BUSY_MARKERS)


def run_when_chip_free(
    groups: list[Path], start: Callable[[], dict[str, Any]], on_wait: Callable[[str], None]
) -> dict[str, Any]:
    """Start a TPU worker (``start`` returns its row fields) once ``groups`` are free; if it
    still finds the chip busy, wait again and start it once more. The row gets ``chip_wait_s``."""
    waited = wait_for_chip(groups, on_wait)
    result = start()
    if chip_was_busy(result):
        first_error = result.get("error")
        waited += wait_for_chip(groups, on_wait)
        result = start()
        note = f"the TPU chip was busy at the first start ({first_error}); started once more"
        result["warnings"] = "\n".join(filter(None, [result.get("warnings"), note]))
    return {**result, "chip_wait_s": waited}


@cache
def find_tcmalloc() -> str | None:
    """The path of this host's tcmalloc (``libtcmalloc_minimal`` preferred), from the dynamic
    linker's cache; None where none is installed (e.g. ``apt install libtcmalloc-minimal4``)."""
    ldconfig = shutil.which("ldconfig") or "/sbin/ldconfig"
    try:
        listing = subprocess.run([ldconfig, "-p"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    found = re.findall(r"^\s*(libtcmalloc(?:_minimal)?\.so[.\d]*) \(.*\) => (\S+)$", listing, re.MULTILINE)
    ranked = sorted(found, key=lambda entry: "minimal" not in entry[0])  # libtcmalloc_minimal first
    return ranked[0][1] if ranked else None


def tcmalloc_env(environ: Mapping[str, str], library: str | None) -> dict[str, str]:
    """``LD_PRELOAD`` with tcmalloc for a TorchTPU worker, or nothing if it is loaded already
    or absent.

    TorchTPU's eager runtime allocates on its Python dispatch thread and frees on runtime
    threads; under glibc's allocator the arenas' locks contend (torch_tpu warns at import:
    ``<TorchTpu/Performance/TcMalloc/>``). The variable is recorded in the ``env`` fingerprint.
    """
    preload = environ.get("LD_PRELOAD", "")
    if library is None or "tcmalloc" in preload:
        return {}
    return {"LD_PRELOAD": f"{preload}:{library}" if preload else library}


def free_memory_bytes(info: tuple[int, int]) -> int | None:
    """Free device memory from ``torch.accelerator.get_memory_info()``'s (free, total), or None if unknown.

    TorchTPU 0.2.0 (``TpuAllocator::getMemoryInfo``) answers (limit - in use, limit) from the
    allocator's stats, (-in use, 0) when the runtime reports no limit and (0, 0) when it cannot
    read the stats: a total of 0 or less means unknown, not full.
    """
    free, total = info
    return free if total > 0 else None


def compile_cache_env(compile_cache: str | None) -> dict[str, str]:
    """TorchTPU's compilation-cache variables for ``--compile-cache DIR``, read when it first compiles.

    TorchTPU 0.2.0 has a tier-2 cache in ``/dev/shm/torch_tpu_cache`` (named by
    ``TORCH_TPU_TIER2_COMPILATION_CACHE``; off for one process unless named) and, on top of
    it, a tier-3 cache on disk under ``TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT``. With DIR, tier
    3 lives in ``DIR/tpu`` and tier 2 gets a name of DIR's own, so a new DIR starts cold; without
    it both are off, so every run's first step is a cold compile, as on the other backends.
    """
    if not compile_cache:
        return {"TORCH_TPU_TIER2_COMPILATION_CACHE": "disabled"}
    root = os.path.abspath(os.path.join(compile_cache, "tpu"))
    name = "tpubench-" + hashlib.sha256(root.encode()).hexdigest()[:12]
    return {"TORCH_TPU_TIER2_COMPILATION_CACHE": name, "TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT": root}


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def tpu_cache_stats() -> dict[str, int] | None:
    """TorchTPU's compile-cache counters, or None (with a warning) where this version lacks them."""
    import torch

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
    forkable = False  # with autoload on, `import torch` loads torch_tpu and libtpu: start fresh
    attention_kernels = ("auto", "math", "flash")

    def use_attention(self, spec: RunSpec) -> None:
        """``flash`` is ``unavailable``: TorchTPU's Pallas attention kernels have no public entry
        point tpubench can call yet (torch_tpu 0.2); ``auto`` runs its own lowering of SDPA."""
        if spec.attention == "flash":
            from workloads.attention import AttentionUnsupported

            raise AttentionUnsupported("TorchTPU exposes no flash attention kernel tpubench can call (torch_tpu 0.2)")
        super().use_attention(spec)

    eager_mode = "defer_never"  # TorchTPU's default; --tpu-eager-mode sets it per run
    root = Path("/")  # where the PCI bus and /dev/vfio are read: a fake sysfs in the tests

    @property
    def worker_env(self) -> dict[str, str]:  # type: ignore[override]
        """Autoload on (it registers the device), one chip, tcmalloc where the host has it;
        off-TPU, never wait on a metadata server."""
        env = {"TORCH_DEVICE_BACKEND_AUTOLOAD": "1", **pin_env(os.environ), **tcmalloc_env(os.environ, find_tcmalloc())}
        if not tpu_pci_devices(self.root):
            env["TPU_SKIP_MDS_QUERY"] = "1"
        return env

    def worker_env_for(self, spec: RunSpec) -> dict[str, str]:
        """One chip, or for a multi-chip run its N chips (:func:`chips_env`)."""
        env = self.worker_env
        if host_devices(spec) > 1:  # on several hosts, this host's share
            for name in PIN_DEFAULTS:
                env.pop(name, None)
            env |= chips_env(os.environ, host_devices(spec), host_devices_per_chip(self.root))
        return env

    def run_on_device(self, start: Callable[[], dict[str, Any]], on_wait: Callable[[str], None]) -> dict[str, Any]:
        """Start the worker once its chip can be opened, and once more if it found it busy."""
        groups = pinned_groups(tpu_pci_devices(self.root), self.worker_env["TPU_VISIBLE_CHIPS"])
        return run_when_chip_free(groups, start, on_wait)

    def availability(self) -> Availability:
        import torch

        if importlib.util.find_spec("torch_tpu") is None:
            return Availability(False, f"torch_tpu not installed for {sys.executable}")
        # from package metadata, chip or not, so `tpubench env` shows what is installed
        versions = {"torch": torch.__version__, "torch_tpu": _version("torch_tpu") or "?"}
        versions |= {name: version for name in ("libtpu", "tpu-info") if (version := _version(name))}
        devices = tpu_pci_devices(self.root)
        if not devices:
            return Availability(False, "no TPU chip on this host", versions=versions)
        return Availability(
            True,
            device_name=devices[0].chip,
            device_count=len(devices),
            versions=versions,
            parallel_devices=len(devices),
        )

    def setup(self, spec: RunSpec) -> None:
        """The eager mode, and the compile cache (TorchTPU reads it when it first compiles)."""
        self.eager_mode = spec.tpu_eager_mode or self.eager_mode
        if self.eager_mode not in EAGER_MODES:
            raise ValueError(f"unknown TPU eager mode {self.eager_mode!r}; valid: {', '.join(EAGER_MODES)}")
        os.environ.update(compile_cache_env(spec.compile_cache))

    def device(self) -> torch.device:
        import torch

        return torch.device("tpu")

    def prepare(self, model: nn.Module) -> nn.Module:
        import torch

        torch.tpu.eager_mode = getattr(torch.tpu.EagerMode, self.eager_mode.upper())
        dump = getattr(torch.tpu, "_set_dump_on_cache_miss", None)
        if os.environ.get("TPUBENCH_TPU_DUMP_ON_MISS") and dump is not None:  # `tpubench compiles --explain` only
            dump(True)  # StableHLO of each cache miss (torch_tpu 0.2.0, read from its wheel; not seen on a chip)
        return model

    def synchronize(self) -> None:
        import torch

        torch.accelerator.synchronize()

    def compile_count(self) -> int | None:
        stats = tpu_cache_stats()
        return None if stats is None else stats["num_compilations"]

    def memory_capacity_bytes(self) -> int | None:
        import torch

        get_info = getattr(torch.accelerator, "get_memory_info", None)
        return None if get_info is None else free_memory_bytes(get_info())

    def reset_peak_memory(self) -> None:
        import torch

        torch.accelerator.reset_peak_memory_stats()

    def peak_memory_bytes(self) -> int | None:
        """The allocator's peak; None for 0, which TorchTPU reports when it has no stats (a run allocates)."""
        import torch

        return int(torch.accelerator.max_memory_allocated()) or None

    def extra_metrics(self) -> dict[str, Any]:
        return {"tpu_eager_mode": self.eager_mode, "tpu_cache_stats": tpu_cache_stats()}

    def compile_capture(self, spec: RunSpec) -> Capture | None:
        from tpubench.compiles.tpu import TpuCapture

        return TpuCapture(tpu_cache_stats)

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

    def compile_capture(self, spec: RunSpec) -> Capture | None:
        """Dynamo's records (with the seconds) and TorchTPU's counters."""
        from tpubench.compiles import Captures
        from tpubench.compiles.dynamo import DynamoCapture
        from tpubench.compiles.tpu import TpuCapture

        return Captures(DynamoCapture(shared_cache=bool(spec.compile_cache)), TpuCapture(tpu_cache_stats))
