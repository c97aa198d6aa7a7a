"""Price per device-hour, for cost-normalised throughput (tokens per dollar) across GPUs and TPUs.

Prices change monthly and differ by cloud, region and commitment, so this table is a
documented default, not the truth: every entry says where its figure was read and when,
and users override or extend it with a TOML file (``tpubench compare --prices FILE``,
or ``TPUBENCH_PRICES=FILE``)::

    # USD per chip-hour, keyed by the chip names of tpubench/peaks.py
    "TPU v6e" = 2.70
    "H100 SXM" = 3.00

Keys are chip names of the peak table (:mod:`tpubench.peaks`), so a device matches a price
exactly as it matches its peak FLOP/s: by the name its runtime prints, never by a guess. A
chip that exposes two devices (TPU v7) is charged half its chip-hour per device. A device
without an entry gets no cost figures (null), never a borrowed price. Only figures read
from a page in this project's sessions are here; a chip we could not read a price for has
no entry.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path

from tpubench import peaks

ENV = "TPUBENCH_PRICES"


@dataclass(frozen=True)
class Price:
    usd_per_chip_hour: float
    source: str  # where and when the figure was read


PRICES: dict[str, Price] = {
    "TPU v5e": Price(
        1.20,
        "cloud.google.com/tpu/pricing: TPU v5e on-demand, USD 1.20 per chip-hour (us-west4), as carried by "
        "SkyPilot's GCP catalogue (tpu-v5litepod-1); read 2026-11-30",
    ),
    # RunPod's Secure Cloud (per-second billing, no commitment), as transcribed with its read date
    # by the data-receipts project's vendors.json (109-gpu-pricing), read 2026-11-09.
    "H100 SXM": Price(3.99, "runpod.io/pricing, Secure Cloud H100 SXM 80 GB: USD 3.99/GPU-hour; 2026-11-09"),
    "H100 PCIe": Price(2.89, "runpod.io/pricing, Secure Cloud H100 PCIe 80 GB: USD 2.89/GPU-hour; 2026-11-09"),
    "H100 NVL": Price(3.19, "runpod.io/pricing, Secure Cloud H100 NVL 94 GB: USD 3.19/GPU-hour; 2026-11-09"),
    "A100 SXM4 80GB": Price(1.79, "runpod.io/pricing, Secure Cloud A100 SXM 80 GB: USD 1.79/GPU-hour; 2026-11-09"),
    "A100 PCIe 80GB": Price(1.79, "runpod.io/pricing, Secure Cloud A100 PCIe 80 GB: USD 1.79/GPU-hour; 2026-11-09"),
}


class PriceError(ValueError):
    """A price file that cannot be read or names a chip the peak table does not know."""


def load_prices(path: str | Path | None = None) -> dict[str, Price]:
    """The default table updated by ``path`` (or ``$TPUBENCH_PRICES``): a TOML table of chip -> USD/hour."""
    table = dict(PRICES)
    path = path or os.environ.get(ENV)
    if not path:
        return table
    try:
        with open(path, "rb") as stream:
            overrides = tomllib.load(stream)
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise PriceError(f"cannot read price file {path}: {error}") from error
    chips = {peak.chip for peak in peaks.PEAKS}
    for chip, value in overrides.items():
        if chip not in chips:
            raise PriceError(f"price file {path}: unknown chip {chip!r}; chips: {', '.join(sorted(chips))}")
        if not isinstance(value, int | float) or value <= 0:
            raise PriceError(f"price file {path}: {chip} = {value!r} is not a positive USD per hour")
        table[chip] = Price(float(value), f"{path}")
    return table


def device_kind(backend: str, device: str | None) -> str:
    """The peak table's device kind of a stored run: its backend family's, or for ``xla*``
    (whose PJRT device may be a TPU, a GPU or the CPU) the one its device name shows."""
    family = backend.split("-")[0]
    if family in ("cpu", "cuda", "tpu"):
        return family
    name = device or ""
    return "cpu" if name.startswith("CPU") else "tpu" if name.startswith("TPU") else "cuda"


def device_price(device: str | None, device_kind: str, prices: dict[str, Price]) -> float | None:
    """USD per hour of one ``device`` of ``device_kind`` (per device: a v7 chip's half), or None."""
    peak = peaks.lookup(device, device_kind) if device else None
    if peak is None or peak.chip not in prices:
        return None
    return prices[peak.chip].usd_per_chip_hour / peak.devices_per_chip
