"""Peak dense FLOP/s and memory bandwidth per chip: the one table MFU is read from.

Figures are per chip (per GPU), dense (no 2:4 sparsity), from the vendors' data sheets,
so they can be checked against them. A run drives one *device*, and a TPU v7 chip exposes
its two TensorCores as two devices, each with half the chip's compute and HBM; MFU and
bandwidth utilisation therefore use the per-device share. A figure the vendor does not
publish is absent, and a device that matches no entry gets ``None``: MFU is then null
with a warning, never a guessed default.

Device names are matched as the runtimes report them: CUDA's marketing names, PJRT's
device kinds for torch_xla ("TPU v5 lite" is v5e, "TPU v5" is v5p, "TPU v6 lite" is
v6e, "TPU7x" is v7) and tpubench's own PCI detection for TorchTPU ("TPU v5e"...).
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass

from tpubench import TpubenchWarning

TERA = 1e12


@dataclass(frozen=True)
class Peak:
    chip: str
    flops: dict[str, float]  # dtype -> FLOP/s per chip ("bfloat16", "float32", "tf32")
    hbm_bytes_per_s: float  # per chip
    devices_per_chip: int = 1  # devices the runtime exposes per chip; a run uses one

    def device_flops(self, dtype: str) -> float | None:
        """Peak FLOP/s of one device for ``dtype`` (a ``flops`` key), None where unpublished."""
        return self.flops[dtype] / self.devices_per_chip if dtype in self.flops else None

    @property
    def device_hbm_bytes_per_s(self) -> float:
        return self.hbm_bytes_per_s / self.devices_per_chip


# (pattern matched against the device name, case-insensitive) -> figures.
# More specific patterns come first ("H100 NVL" style variants are not distinguished:
# the SXM figures are used, which overstates a PCIe card's peak and so understates MFU).
PEAKS: tuple[tuple[str, Peak], ...] = (
    # NVIDIA A100 SXM 80GB data sheet: BF16 312, TF32 156, FP32 19.5 TFLOP/s, 2039 GB/s.
    (r"\bA100\b", Peak("A100", {"bfloat16": 312 * TERA, "tf32": 156 * TERA, "float32": 19.5 * TERA}, 2.039 * TERA)),
    # NVIDIA H100 SXM data sheet: BF16 989.4, TF32 494.7, FP32 67 TFLOP/s, 3.35 TB/s.
    (r"\bH100\b", Peak("H100", {"bfloat16": 989.4 * TERA, "tf32": 494.7 * TERA, "float32": 67 * TERA}, 3.35 * TERA)),
    # NVIDIA H200 SXM data sheet: same tensor cores as H100 SXM; 4.8 TB/s HBM3e.
    (r"\bH200\b", Peak("H200", {"bfloat16": 989.4 * TERA, "tf32": 494.7 * TERA, "float32": 67 * TERA}, 4.8 * TERA)),
    # NVIDIA HGX B200 data sheet, per GPU: BF16 2.25 PFLOP/s, TF32 1.1 PFLOP/s dense,
    # FP32 75 TFLOP/s, 7.7 TB/s.
    (r"\bB200\b", Peak("B200", {"bfloat16": 2250 * TERA, "tf32": 1100 * TERA, "float32": 75 * TERA}, 7.7 * TERA)),
    # Google Cloud TPU system architecture pages, per chip, BF16 and HBM bandwidth.
    # TPUs publish no float32 matmul peak (the MXU runs float32 as several bf16 passes).
    (r"v5\s*(lite|e)|v5litepod", Peak("TPU v5e", {"bfloat16": 197 * TERA}, 0.819 * TERA)),
    (r"\bv5p?\b", Peak("TPU v5p", {"bfloat16": 459 * TERA}, 2.765 * TERA)),  # after v5e: PJRT says "TPU v5"
    (r"v6\s*e|v6 lite|trillium", Peak("TPU v6e", {"bfloat16": 918 * TERA}, 1.64 * TERA)),
    (r"\bv4\b(?!\s*lite)", Peak("TPU v4", {"bfloat16": 275 * TERA}, 1.2 * TERA)),  # "v4 lite" (v4i) is another chip
    # Ironwood (PJRT: "TPU7x") exposes its two TensorCores as two devices (TorchTPU's hardware
    # table; one device addresses 96 of the chip's 192 GiB).
    (r"\bv7x?\b|tpu\s*7x|ironwood", Peak("TPU v7", {"bfloat16": 2307 * TERA}, 7.37 * TERA, devices_per_chip=2)),
)


def lookup(device_name: str) -> Peak | None:
    for pattern, peak in PEAKS:
        if re.search(pattern, device_name, flags=re.IGNORECASE):
            return peak
    return None


def peak_flops(device_name: str, dtype: str, float32_matmul_precision: str = "highest") -> float | None:
    """Peak FLOP/s of one ``device_name`` device for ``dtype``; ``None`` (with a warning) when unknown.

    A float32 run whose matmul precision is not "highest" runs on TF32 tensor cores, so
    it is held against the TF32 peak.
    """
    peak = lookup(device_name)
    key = "tf32" if dtype == "float32" and float32_matmul_precision != "highest" else dtype
    flops = peak.device_flops(key) if peak else None
    if flops is None:
        warnings.warn(
            f"no peak {key} FLOP/s known for device {device_name!r}; MFU left null", TpubenchWarning, stacklevel=2
        )
    return flops


def mfu(
    flops_per_step: float, step_seconds: float, device_name: str, dtype: str, float32_matmul_precision: str = "highest"
) -> float | None:
    """Model FLOPs utilisation: achieved FLOP/s over one device's peak for that dtype."""
    peak = peak_flops(device_name, dtype, float32_matmul_precision)
    if peak is None or step_seconds <= 0:
        return None
    return flops_per_step / step_seconds / peak
