"""Energy over a run's measured steps, from a hardware counter, or nothing.

"What does it cost" needs joules per token measured the same way on both sides: a
counter's delta over a steady window of steps. Sources:

- ``nvml_counter``: a CUDA device's total-energy counter (``nvmlDeviceGetTotalEnergyConsumption``,
  mJ since the driver loaded; Volta and later) through ``nvidia-ml-py`` (the ``[gpu]`` extra).
  The board's energy, read before the first measured step and after the last.
- ``rapl``: on a CPU run, Linux powercap's RAPL package counters
  (``/sys/class/powercap/intel-rapl:N/energy_uj``, µJ), summed over the host's packages
  (the package's energy, not DRAM's; subzones are parts of their package). A counter wraps
  at its ``max_energy_range_uj``; a window shorter than one wrap period (minutes at
  hundreds of watts) is read correctly across one wrap.
- ``none``: no counter readable (no powercap here, a counter readable only by root, no
  NVML), and every TPU: neither torch_xla, TorchTPU, libtpu's monitoring metrics nor
  tpu-info expose chip power or energy. An estimate (a datasheet power x time) is never
  stored as a measurement.

A counter updates at its own period, and a window shorter than it reads a stale delta (zero,
or one update's worth). When the measured steps take less than :data:`MIN_WINDOW_S`, the
window is extended with further steps of the same kind (not timed, not stored as steps)
until it is long enough, and the energy per step divides by every step in the window.
"""

from __future__ import annotations

import glob
import os
import re
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

NVML, RAPL, NONE = "nvml_counter", "rapl", "none"
SOURCES = (NVML, RAPL, NONE)
#: the shortest window read from a counter, in seconds: NVML's energy counter and RAPL's
#: update within milliseconds to ~100 ms; a second keeps a stale last update under ~10%
MIN_WINDOW_S = 1.0
#: the powercap zones read: the packages (``intel-rapl:0``; AMD's RAPL uses the same name)
RAPL_ROOT = "/sys/class/powercap"
_PACKAGE = re.compile(r"^intel-rapl:\d+$")


@dataclass(frozen=True)
class Reading:
    """A counter's delta over a window of ``steps`` steps."""

    joules: float
    seconds: float
    steps: int
    source: str


class Meter(ABC):
    """A cumulative energy counter: :meth:`joules` since some origin, in joules."""

    source: str

    @abstractmethod
    def joules(self) -> float: ...


class Window:
    """One window of a meter: opened before the measured steps, closed after them."""

    def __init__(self, meter: Meter):
        self.meter = meter
        self._start_j = 0.0
        self._start_s = 0.0

    def open(self) -> None:
        self._start_j, self._start_s = self.meter.joules(), time.perf_counter()

    def long_enough(self) -> bool:
        return time.perf_counter() - self._start_s >= MIN_WINDOW_S

    def close(self, steps: int) -> Reading:
        joules, now = self.meter.joules(), time.perf_counter()
        return Reading(joules - self._start_j, now - self._start_s, steps, self.meter.source)


class NvmlMeter(Meter):
    """One CUDA device's total-energy counter (mJ), found by the device's UUID so that
    ``CUDA_VISIBLE_DEVICES`` renumbering cannot pick another GPU."""

    source = NVML

    def __init__(self, device_index: int):
        import pynvml
        import torch

        pynvml.nvmlInit()
        self._nvml = pynvml
        uuid = str(getattr(torch.cuda.get_device_properties(device_index), "uuid", "") or "")
        if uuid:
            self._handle = pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
        else:
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(device_index)
        self.joules()  # a GPU before Volta raises NVMLError_NotSupported here

    def joules(self) -> float:
        return self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle) / 1e3


@dataclass(frozen=True)
class RaplZone:
    name: str
    energy_path: str
    max_range_uj: int


class RaplMeter(Meter):
    """The host's RAPL package counters, summed, each unwrapped across its wrap-arounds.

    Each read is compared with the zone's previous one: a smaller value means the counter
    passed ``max_energy_range_uj`` and restarted from 0, so the delta is
    ``max_range - before + after``.
    """

    source = RAPL

    def __init__(self, zones: list[RaplZone]):
        self.zones = zones
        self._last = {zone.name: read_uj(zone.energy_path) for zone in zones}
        self._total_uj = 0

    def joules(self) -> float:
        for zone in self.zones:
            now = read_uj(zone.energy_path)
            self._total_uj += uj_delta(self._last[zone.name], now, zone.max_range_uj)
            self._last[zone.name] = now
        return self._total_uj / 1e6


def uj_delta(before: int, after: int, max_range_uj: int) -> int:
    """µJ between two reads of a counter that wraps to 0 at ``max_range_uj`` (one wrap at most)."""
    return after - before if after >= before else max_range_uj - before + after


def read_uj(path: str) -> int:
    with open(path) as file:
        return int(file.read().strip())


def rapl_zones(root: str = RAPL_ROOT) -> list[RaplZone]:
    """The package zones under ``root`` whose counter this process can read (since Linux
    5.10 ``energy_uj`` is readable by root only); empty where there are none."""
    zones = []
    for folder in sorted(glob.glob(os.path.join(root, "*"))):
        if not _PACKAGE.match(os.path.basename(folder)):
            continue
        energy = os.path.join(folder, "energy_uj")
        try:
            read_uj(energy)
            max_range = read_uj(os.path.join(folder, "max_energy_range_uj"))
        except (OSError, ValueError):
            continue
        try:
            with open(os.path.join(folder, "name")) as file:
                label = file.read().strip()
        except OSError:
            label = ""
        zones.append(RaplZone(f"{os.path.basename(folder)}:{label}", energy, max_range))
    return zones


def meter_for(
    device_type: str, device_index: int | None = None, rapl_root: str = RAPL_ROOT
) -> tuple[Meter | None, str]:
    """The meter of a run on a ``device_type`` device (``cuda``, ``cpu``: the eager and the
    compiled backends alike), and why there is none where one should be.

    ``cuda``: NVML (needs the ``[gpu]`` extra); ``cpu``: RAPL where readable; anything else
    (``xla``, even on PJRT CPU, whose runs measure the XLA path; ``tpu``): none, as no TPU
    energy source is public.
    """
    if device_type == "cuda":
        try:
            return NvmlMeter(device_index or 0), ""
        except ImportError:
            return None, "energy not measured: nvidia-ml-py is not installed (pip install 'tpubench[gpu]')"
        except Exception as error:  # NVMLError: no driver, a pre-Volta GPU, no permission
            return None, f"energy not measured: NVML's energy counter is not readable ({type(error).__name__}: {error})"
    if device_type == "cpu":
        zones = rapl_zones(rapl_root)
        return (RaplMeter(zones), "") if zones else (None, "")
    return None, ""


def columns(reading: Reading | None, tokens_per_step: int | None, samples_per_step: int) -> dict[str, Any]:
    """The runs table's energy columns: per step, per token (or per sample), average power,
    the source and the window; all null but ``energy_source = none`` without a reading."""
    if reading is None or reading.steps <= 0 or reading.seconds <= 0:
        return {"energy_source": NONE}
    per_step = reading.joules / reading.steps
    return {
        "energy_source": reading.source,
        "energy_j": per_step,
        "joules_per_token": per_step / tokens_per_step if tokens_per_step else None,
        "joules_per_sample": per_step / samples_per_step if samples_per_step else None,
        "avg_power_w": reading.joules / reading.seconds,
        "energy_window_s": reading.seconds,
        "energy_steps": reading.steps,
    }
