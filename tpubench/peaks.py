"""Peak dense FLOP/s and memory bandwidth per chip: the one table MFU is read from.

Figures are per chip (per GPU), dense (no 2:4 sparsity), from the vendors' data sheets,
so they can be checked against them; each entry names its source. Where a data sheet
prints only sparse tensor figures and says dense ones are half, the entry holds the half.
A run drives one *device*, and a TPU v7 chip exposes its two TensorCores as two devices,
each with half the chip's compute and HBM; MFU and bandwidth utilisation therefore use
the per-device share. A figure the vendor does not publish is absent, and a device that
matches no entry gets ``None``: MFU is then null with a warning, never a guessed default.

A device matches only entries of the device kind its backend reports ("cpu", "cuda",
"tpu"), and only by one of the exact names its runtime prints for it (case and
punctuation aside): ``torch.cuda.get_device_name()`` for CUDA and ROCm builds, PJRT's
device kinds for torch_xla ("TPU v5 lite" is v5e, "TPU v5" is v5p, "TPU v6 lite" is
v6e, "TPU7x" is v7) and tpubench's own PCI detection for TorchTPU ("TPU v5e"...). So a
Xeon "E5-2686 v4" can never be a TPU v4, and an SKU whose figures differ from its
family's (A100 40 GB, H100 PCIe) never borrows another's. CPUs have no entries.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass

from tpubench.precision import choices
from tpubench.warning import TpubenchWarning

TERA = 1e12


@dataclass(frozen=True)
class Peak:
    """One chip's published peaks, and the device names its runtimes report for it."""

    chip: str
    kind: str  # the backend device kind that reports it: "cuda" (ROCm builds too) or "tpu"
    names: tuple[str, ...]  # device names exactly as the runtimes print them
    #: matmul dtype -> FLOP/s (int8: OP/s) per chip: "bfloat16", "float16", "float32", "tf32",
    #: "fp8", "int8" (the keys :mod:`tpubench.precision.choices` and the ceilings name)
    flops: dict[str, float]
    hbm_bytes_per_s: float  # per chip
    source: str  # the data sheet (URL) and the figures read from it
    devices_per_chip: int = 1  # devices the runtime exposes per chip; a run uses one

    def device_flops(self, dtype: str) -> float | None:
        """Peak FLOP/s of one device for ``dtype`` (a ``flops`` key), None where unpublished."""
        return self.flops[dtype] / self.devices_per_chip if dtype in self.flops else None

    @property
    def device_hbm_bytes_per_s(self) -> float:
        return self.hbm_bytes_per_s / self.devices_per_chip


A100_SHEET = (
    "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
    "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf: BF16 312, FP16 312, TF32 156 (dense), FP32 19.5 "
    "TFLOPS, INT8 624 TOPS (dense); no FP8"
)
AMPERE = {"bfloat16": 312 * TERA, "float16": 312 * TERA, "tf32": 156 * TERA, "float32": 19.5 * TERA, "int8": 624 * TERA}
# Hopper SXM (H100 SXM, H200): the H100 architecture whitepaper's dense H100 SXM5 peaks.
HOPPER_SXM = {
    "bfloat16": 989.4 * TERA,
    "float16": 989.4 * TERA,
    "tf32": 494.7 * TERA,
    "float32": 67 * TERA,
    "fp8": 1978.9 * TERA,
    "int8": 1978.9 * TERA,
}
HOPPER_SXM_SHEET = (
    "NVIDIA H100 Tensor Core GPU Architecture whitepaper "
    "(https://resources.nvidia.com/en-us-tensor-core/gtc22-whitepaper-hopper), H100 SXM5: "
    "dense BF16 989.4, FP16 989.4, TF32 494.7, FP8 1978.9 TFLOPS, INT8 1978.9 TOPS; FP32 67 TFLOPS"
)
# Hopper NVL boards (H100 NVL, H200 NVL): their data sheets print BF16 1,671 and TF32 835
# TFLOPS with sparsity ("one-half lower without sparsity"), and FP32 60 TFLOPS.
# FP16 1,671 and FP8 and INT8 3,341 with sparsity: halved likewise.
HOPPER_NVL = {
    "bfloat16": 835.5 * TERA,
    "float16": 835.5 * TERA,
    "tf32": 417.5 * TERA,
    "float32": 60 * TERA,
    "fp8": 1670.5 * TERA,
    "int8": 1670.5 * TERA,
}
# CDNA 3 (MI300X, MI325X), AMD's spec pages: dense BF16 1307.4, FP16 1307.4, TF32 653.7, FP8
# 2614.9, FP32 163.4 TFLOPS, INT8 2614.9 TOPS.
# Whether a ROCm build of torch runs float32 matmuls at precision "high" as TF32 depends on
# its version (older ones needed HIPBLASLT_ALLOW_TF32=1); such a run is held against TF32.
# One device per GPU is assumed (the SPX partition mode, AMD's default).
CDNA3 = {
    "bfloat16": 1307.4 * TERA,
    "float16": 1307.4 * TERA,
    "tf32": 653.7 * TERA,
    "float32": 163.4 * TERA,
    "fp8": 2614.9 * TERA,
    "int8": 2614.9 * TERA,
}
# TPUs publish no float32 matmul peak (the MXU runs float32 as several bf16 passes).
TPU_DOCS = "https://cloud.google.com/tpu/docs/"
# v5p and v6e have no fp8 rate of their own: their MXUs take fp8 inputs at the bf16 rate (only
# Ironwood, v7, doubles in fp8), so an fp8 run there is held against the bf16 figure.
TPU_FP8_AT_BF16 = "FP8 at the BF16 rate (no FP8 rate of its own; v7 is the first TPU to double in FP8)"

# NVIDIA A10G (AWS G5) has no entry: neither NVIDIA nor AWS publishes a data sheet with its
# tensor peaks (they differ from the A10's), so it stays null rather than borrow a figure.
PEAKS: tuple[Peak, ...] = (
    Peak(
        "A100 SXM4 40GB",
        "cuda",
        ("NVIDIA A100-SXM4-40GB",),
        AMPERE,
        1.555 * TERA,
        f"{A100_SHEET}; A100 40GB SXM 1,555 GB/s",
    ),
    Peak(
        "A100 SXM4 80GB",
        "cuda",
        ("NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM-80GB"),
        AMPERE,
        2.039 * TERA,
        f"{A100_SHEET}; A100 80GB SXM 2,039 GB/s",
    ),
    Peak(
        "A100 PCIe 40GB",
        "cuda",
        ("NVIDIA A100-PCIE-40GB",),
        AMPERE,
        1.555 * TERA,
        f"{A100_SHEET}; A100 40GB PCIe 1,555 GB/s",
    ),
    Peak(
        "A100 PCIe 80GB",
        "cuda",
        ("NVIDIA A100 80GB PCIe",),
        AMPERE,
        1.935 * TERA,
        f"{A100_SHEET}; A100 80GB PCIe 1,935 GB/s",
    ),
    Peak(
        "H100 SXM",
        "cuda",
        ("NVIDIA H100 80GB HBM3",),
        HOPPER_SXM,
        3.35 * TERA,
        f"{HOPPER_SXM_SHEET}; https://www.nvidia.com/en-us/data-center/h100/: H100 SXM 3.35 TB/s",
    ),
    Peak(
        "H100 PCIe",
        "cuda",
        ("NVIDIA H100 PCIe",),
        {
            "bfloat16": 756.5 * TERA,
            "float16": 756.5 * TERA,
            "tf32": 378 * TERA,
            "float32": 51 * TERA,
            "fp8": 1513 * TERA,
            "int8": 1513 * TERA,
        },
        2.0 * TERA,
        "NVIDIA H100 data sheet / H100 PCIe product brief PB-11133-001, H100 PCIe: BF16 and FP16 1,513, TF32 756, "
        "FP8 3,026 TFLOPS and INT8 3,026 TOPS with sparsity (one-half lower without), FP32 51 TFLOPS, 2,000 GB/s",
    ),
    Peak(
        "H100 NVL",
        "cuda",
        ("NVIDIA H100 NVL",),
        HOPPER_NVL,
        3.9 * TERA,
        "https://www.nvidia.com/en-us/data-center/h100/, H100 NVL: BF16 and FP16 1,671, TF32 835, FP8 3,341 "
        "TFLOPS and INT8 3,341 TOPS with sparsity (one-half lower without), FP32 60 TFLOPS, 3.9 TB/s",
    ),
    Peak(
        "H200 SXM",
        "cuda",
        ("NVIDIA H200",),
        HOPPER_SXM,
        4.8 * TERA,
        f"{HOPPER_SXM_SHEET} (the same GH100 compute); https://www.nvidia.com/en-us/data-center/h200/: "
        "H200 SXM 4.8 TB/s",
    ),
    Peak(
        "H200 NVL",
        "cuda",
        ("NVIDIA H200 NVL",),
        HOPPER_NVL,
        4.8 * TERA,
        "https://www.nvidia.com/en-us/data-center/h200/, H200 NVL: BF16 and FP16 1,671, TF32 835, FP8 3,341 "
        "TFLOPS and INT8 3,341 TOPS with sparsity (one-half lower without), FP32 60 TFLOPS, 4.8 TB/s",
    ),
    Peak(
        "B200",
        "cuda",
        ("NVIDIA B200",),
        {
            "bfloat16": 2250 * TERA,
            "float16": 2250 * TERA,
            "tf32": 1100 * TERA,
            "float32": 75 * TERA,
            "fp8": 4500 * TERA,
            "int8": 4500 * TERA,
        },
        7.7 * TERA,
        "https://www.nvidia.com/en-us/data-center/hgx/, HGX B200 per GPU: FP16/BF16 4.5, TF32 2.2 and FP8/FP6 "
        "9 PFLOPS, INT8 9 POPS with sparsity (halved here), FP32 75 TFLOPS, 7.7 TB/s",
    ),
    Peak(
        "L4",
        "cuda",
        ("NVIDIA L4",),
        {
            "bfloat16": 121 * TERA,
            "float16": 121 * TERA,
            "tf32": 60 * TERA,
            "float32": 30.3 * TERA,
            "fp8": 242.5 * TERA,
            "int8": 242.5 * TERA,
        },
        0.3 * TERA,
        "https://www.nvidia.com/en-us/data-center/l4/ (L4 data sheet): BF16 and FP16 242, TF32 120, FP8 485 "
        "TFLOPS and INT8 485 TOPS with sparsity (one-half lower without), FP32 30.3 TFLOPS, 300 GB/s",
    ),
    Peak(
        "L40S",
        "cuda",
        ("NVIDIA L40S",),
        {
            "bfloat16": 362.05 * TERA,
            "float16": 362.05 * TERA,
            "tf32": 183 * TERA,
            "float32": 91.6 * TERA,
            "fp8": 733 * TERA,
            "int8": 733 * TERA,
        },
        0.864 * TERA,
        "https://www.nvidia.com/en-us/data-center/l40s/ (L40S data sheet): dense BF16 and FP16 362.05, TF32 183, "
        "FP8 733 TFLOPS, INT8 733 TOPS, FP32 91.6 TFLOPS, 864 GB/s",
    ),
    Peak(
        "MI300X",
        "cuda",
        ("AMD Instinct MI300X", "AMD Instinct MI300X VF"),
        CDNA3,
        5.3 * TERA,
        "https://www.amd.com/en/products/accelerators/instinct/mi300/mi300x.html: peak BF16 and FP16 1307.4, "
        "TF32 653.7, FP8 2614.9, FP32 163.4 TFLOPS, INT8 2614.9 TOPS (dense), 5.3 TB/s",
    ),
    Peak(
        "MI325X",
        "cuda",
        ("AMD Instinct MI325X", "AMD Instinct MI325X VF"),
        CDNA3,
        6.0 * TERA,
        "https://www.amd.com/en/products/accelerators/instinct/mi300/mi325x.html: peak BF16 and FP16 1307.4, "
        "TF32 653.7, FP8 2614.9, FP32 163.4 TFLOPS, INT8 2614.9 TOPS (dense), 6 TB/s",
    ),
    Peak(
        "TPU v4",
        "tpu",
        ("TPU v4",),
        {"bfloat16": 275 * TERA},
        1.2 * TERA,
        f"{TPU_DOCS}v4: 275 TFLOPs BF16 and 1,200 GBps HBM per chip",
    ),  # "TPU v4 lite" (v4i, an inference chip) is another chip: no entry
    Peak(
        "TPU v5e",
        "tpu",
        ("TPU v5 lite", "TPU v5e"),
        {"bfloat16": 197 * TERA, "int8": 393 * TERA},
        0.819 * TERA,
        f"{TPU_DOCS}v5e: 197 TFLOPs BF16, 393 TOPs INT8 (the page's figure, not twice 197) and 819 GBps HBM per chip",
    ),
    Peak(
        "TPU v5p",
        "tpu",
        ("TPU v5", "TPU v5p"),
        {"bfloat16": 459 * TERA, "int8": 918 * TERA, "fp8": 459 * TERA},
        2.765 * TERA,
        f"{TPU_DOCS}v5p: 459 TFLOPs BF16, 918 TOPs INT8 and 2,765 GBps HBM per chip; {TPU_FP8_AT_BF16}",
    ),
    Peak(
        "TPU v6e",
        "tpu",
        ("TPU v6 lite", "TPU v6e"),
        {"bfloat16": 918 * TERA, "int8": 1836 * TERA, "fp8": 918 * TERA},
        1.64 * TERA,
        f"{TPU_DOCS}v6e: 918 TFLOPs BF16, 1,836 TOPs INT8 and 1,640 GBps HBM per chip; {TPU_FP8_AT_BF16}",
    ),
    # Ironwood exposes its two TensorCores as two devices (TorchTPU's hardware table; one
    # device addresses 96 of the chip's 192 GiB).
    Peak(
        "TPU v7",
        "tpu",
        ("TPU7x", "TPU v7"),
        {"bfloat16": 2307 * TERA, "fp8": 4614 * TERA},
        7.37 * TERA,
        f"{TPU_DOCS}tpu7x: 2,307 TFLOPs BF16 and 4,614 TFLOPs FP8 per chip; Google's Ironwood announcement: "
        "7.37 TB/s HBM per chip",
        devices_per_chip=2,
    ),
)


def _normalised(device_name: str) -> str:
    """Lower case, punctuation and spacing folded: "A100-PCIE-40GB" and "a100 pcie 40gb" agree."""
    return " ".join(re.findall(r"[a-z0-9]+", device_name.lower()))


_BY_NAME: dict[tuple[str, str], Peak] = {(peak.kind, _normalised(name)): peak for peak in PEAKS for name in peak.names}


def lookup(device_name: str, device_kind: str) -> Peak | None:
    """The entry for ``device_name`` among ``device_kind``'s entries ("cpu", "cuda", "tpu"), or None.

    Only an exact name matches, never a substring, so an unlisted SKU gets no figures
    rather than a relative's.
    """
    return _BY_NAME.get((device_kind, _normalised(device_name)))


def matmul_key(dtype: str, float32_matmul_precision: str = "highest", precision: str | None = None) -> str:
    """The ``flops`` key a run's matmuls are held against: its precision's
    (:mod:`tpubench.precision.choices`: ``fp8`` for fp8 and fp8-rowwise, ``int8`` for int8-dq,
    ``bfloat16`` for the weight-only ones, which multiply in bf16), else its dtype's; a
    float32 run whose matmul precision is not "highest" runs on TF32 tensor cores: ``tf32``."""
    known = choices.PRECISIONS.get(precision) if precision else None
    key = known.matmul if known else dtype
    return "tf32" if key == "float32" and float32_matmul_precision != "highest" else key


def peak_flops(
    device_name: str,
    device_kind: str,
    dtype: str,
    float32_matmul_precision: str = "highest",
    precision: str | None = None,
) -> float | None:
    """Peak FLOP/s of one ``device_name`` device for what its matmuls ran in (:func:`matmul_key`);
    ``None`` (with a warning) when unknown."""
    peak = lookup(device_name, device_kind)
    key = matmul_key(dtype, float32_matmul_precision, precision)
    flops = peak.device_flops(key) if peak else None
    if flops is None:
        warnings.warn(
            f"no peak {key} FLOP/s known for device {device_name!r}; MFU left null", TpubenchWarning, stacklevel=2
        )
    return flops


def describe(device_name: str, device_kind: str, key: str) -> str | None:
    """The peak a row's ``mfu`` divided by, in words (``mfu_peak``): ``fp8 dense 1978.9 TFLOP/s
    per device, H100 SXM data sheet`` (the entry's ``source`` names the sheet); None where
    there is none."""
    peak = lookup(device_name, device_kind)
    flops = peak.device_flops(key) if peak else None
    if peak is None or flops is None:
        return None
    share = f" (one of its {peak.devices_per_chip} devices)" if peak.devices_per_chip > 1 else ""
    unit = "TOP/s" if key == "int8" else "TFLOP/s"
    return f"{key} dense {flops / TERA:g} {unit} per device{share}, {peak.chip} data sheet"


def mfu(
    flops_per_step: float,
    step_seconds: float,
    device_name: str,
    device_kind: str,
    dtype: str,
    float32_matmul_precision: str = "highest",
    precision: str | None = None,
) -> float | None:
    """Model FLOPs utilisation: achieved FLOP/s over one device's peak for what its matmuls ran in."""
    peak = peak_flops(device_name, device_kind, dtype, float32_matmul_precision, precision)
    if peak is None or step_seconds <= 0:
        return None
    return flops_per_step / step_seconds / peak
