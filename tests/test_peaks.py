"""The peak table: device names as the runtimes print them, matched within their device kind."""

from __future__ import annotations

import pytest

from tpubench import peaks
from tpubench.backends.cpu import CpuBackend, cpu_model
from tpubench.backends.tpu import PCI_DEVICE_TO_CHIP

KINDS = ("cpu", "cuda", "tpu")

# /proc/cpuinfo model names of cloud CPUs; the Xeons' "v4"/"v5" once matched TPU entries.
CPU_NAMES = [
    "Intel(R) Xeon(R) CPU E5-2686 v4 @ 2.30GHz",
    "Intel(R) Xeon(R) CPU E3-1240 v5 @ 3.50GHz",
    "Intel(R) Xeon(R) CPU @ 2.20GHz",
    "Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz",
    "INTEL(R) XEON(R) PLATINUM 8568Y+",
    "AMD EPYC 7B13",
    "AMD EPYC 9B14",
    "AMD EPYC 7R13 Processor",
    "AMD EPYC 9654 96-Core Processor",
]

# torch.cuda.get_device_name() (ROCm builds answer through torch.cuda too) -> entry or None
CUDA_NAMES = [
    ("NVIDIA A100-SXM4-40GB", "A100 SXM4 40GB"),
    ("NVIDIA A100-SXM4-80GB", "A100 SXM4 80GB"),
    ("NVIDIA A100-PCIE-40GB", "A100 PCIe 40GB"),
    ("NVIDIA A100 80GB PCIe", "A100 PCIe 80GB"),
    ("NVIDIA H100 80GB HBM3", "H100 SXM"),
    ("NVIDIA H100 PCIe", "H100 PCIe"),
    ("NVIDIA H100 NVL", "H100 NVL"),
    ("NVIDIA H200", "H200 SXM"),
    ("NVIDIA H200 NVL", "H200 NVL"),
    ("NVIDIA B200", "B200"),
    ("NVIDIA L4", "L4"),
    ("NVIDIA L40S", "L40S"),
    ("AMD Instinct MI300X", "MI300X"),
    ("AMD Instinct MI300X VF", "MI300X"),  # SR-IOV passthrough of a whole GPU (Azure)
    ("AMD Instinct MI325X", "MI325X"),
    ("NVIDIA A10G", None),  # no published data sheet
    ("NVIDIA A100-SXM4-40GB MIG 1g.5gb", None),  # a MIG slice has a fraction of the GPU
    ("NVIDIA GH200 480GB", None),  # not an H200
    ("NVIDIA L40", None),  # not an L40S
    ("NVIDIA A10", None),
    ("AMD Instinct MI300A", None),
    ("Tesla T4", None),
]

# PJRT device kinds (torch_xla) and TorchTPU's names as tpubench's tpu backend reports them
TPU_NAMES = [
    ("TPU v4", "TPU v4"),
    ("TPU v5 lite", "TPU v5e"),
    ("TPU v5", "TPU v5p"),
    ("TPU v6 lite", "TPU v6e"),
    ("TPU7x", "TPU v7"),
    *((name, name) for name in PCI_DEVICE_TO_CHIP.values()),  # TorchTPU: "TPU v5e", "TPU v7"...
    ("TPU v4 lite", None),  # v4i, an inference chip
    ("TPU v3", None),
    ("TPU (PCI device 0x0099)", None),  # a generation the PCI table does not know
]


@pytest.mark.parametrize("name", CPU_NAMES)
def test_a_cpu_name_matches_nothing_of_any_kind(name: str) -> None:
    assert all(peaks.lookup(name, kind) is None for kind in KINDS)


def test_this_hosts_cpu_has_no_peak() -> None:
    assert peaks.lookup(cpu_model(), CpuBackend.device_kind) is None


@pytest.mark.parametrize(
    ("kind", "name", "chip"), [("cuda", *c) for c in CUDA_NAMES] + [("tpu", *t) for t in TPU_NAMES]
)
def test_runtime_device_names_map_to_their_entry_or_none(kind: str, name: str, chip: str | None) -> None:
    peak = peaks.lookup(name, kind)
    assert (peak.chip if peak else None) == chip
    other = "tpu" if kind == "cuda" else "cuda"
    assert peaks.lookup(name, other) is None  # a GPU never matches a TPU entry, nor the reverse


def test_every_listed_name_finds_its_own_entry() -> None:
    # a name listed twice would silently shadow one entry
    for peak in peaks.PEAKS:
        assert peak.source and peak.names
        assert all(peaks.lookup(name, peak.kind) is peak for name in peak.names)


def test_skus_of_one_family_keep_their_own_figures() -> None:
    a100 = {name: peaks.lookup(name, "cuda") for name, _ in CUDA_NAMES[:4]}
    assert [p.hbm_bytes_per_s for p in a100.values()] == pytest.approx([1.555e12, 2.039e12, 1.555e12, 1.935e12])
    assert len({p.flops["bfloat16"] for p in a100.values()}) == 1  # the same tensor cores
    # the PCIe H100 has fewer SMs than the SXM part: 756.5 dense BF16 TFLOP/s is 100%
    assert peaks.mfu(756.5e12, 1.0, "NVIDIA H100 PCIe", "cuda", "bfloat16") == pytest.approx(1.0)
    assert peaks.lookup("NVIDIA H100 PCIe", "cuda").hbm_bytes_per_s == pytest.approx(2.0e12)
    assert (
        peaks.lookup("NVIDIA H200 NVL", "cuda").flops["bfloat16"]
        < peaks.lookup("NVIDIA H200", "cuda").flops["bfloat16"]
    )


def test_names_match_whatever_the_case_and_punctuation() -> None:
    assert peaks.lookup("nvidia a100 pcie 40gb", "cuda").chip == "A100 PCIe 40GB"
    assert peaks.lookup("tpu v5-lite", "tpu").chip == "TPU v5e"


def test_mfu_is_achieved_over_peak() -> None:
    # 989.4 TFLOP of work in one second on an H200 in bf16 is 100%.
    assert peaks.mfu(989.4e12, 1.0, "NVIDIA H200", "cuda", "bfloat16") == pytest.approx(1.0)
    assert peaks.mfu(67e12, 2.0, "NVIDIA H200", "cuda", "float32") == pytest.approx(0.5)
    # TF32 matmuls are held against the TF32 peak.
    assert peaks.mfu(494.7e12, 1.0, "NVIDIA H200", "cuda", "float32", "high") == pytest.approx(1.0)


def test_unknown_device_or_dtype_gives_none_and_a_warning() -> None:
    with pytest.warns(UserWarning, match="no peak bfloat16"):
        assert peaks.mfu(1e12, 1.0, "AMD EPYC 7B13", "cpu", "bfloat16") is None
    with pytest.warns(UserWarning, match="no peak bfloat16 FLOP/s known for device 'Intel"):
        assert peaks.mfu(1e12, 1.0, "Intel(R) Xeon(R) CPU E5-2686 v4 @ 2.30GHz", "cpu", "bfloat16") is None
    with pytest.warns(UserWarning, match="no peak float32"):
        assert peaks.mfu(1e12, 1.0, "TPU v5p", "tpu", "float32") is None


def test_a_v7_run_is_held_against_one_of_its_chips_two_devices() -> None:
    # a run drives one device: half a v7 chip's 2307 TFLOP/s and 7.37 TB/s
    assert peaks.mfu(2307e12 / 2, 1.0, "TPU7x", "tpu", "bfloat16") == pytest.approx(1.0)
    assert peaks.lookup("TPU v7", "tpu").device_hbm_bytes_per_s == pytest.approx(7.37e12 / 2)
    assert peaks.lookup("TPU v5e", "tpu").device_hbm_bytes_per_s == pytest.approx(0.819e12)
