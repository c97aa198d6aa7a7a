"""The peak FLOP/s table and MFU."""

from __future__ import annotations

import pytest

from tpubench import peaks


@pytest.mark.parametrize(
    ("device", "chip"),
    [
        ("NVIDIA H200", "H200"),
        ("NVIDIA H100 80GB HBM3", "H100"),
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA B200", "B200"),
        ("TPU v5 lite", "TPU v5e"),
        ("TPU v5p", "TPU v5p"),
        ("TPU v6e", "TPU v6e"),
        ("TPU v4", "TPU v4"),
        ("TPU v7", "TPU v7"),
        # PJRT's device kinds, as torch_xla reports them
        ("TPU v5", "TPU v5p"),
        ("TPU v6 lite", "TPU v6e"),
        ("TPU7x", "TPU v7"),
    ],
)
def test_device_names_map_to_chips(device: str, chip: str) -> None:
    assert peaks.lookup(device).chip == chip


def test_mfu_is_achieved_over_peak() -> None:
    # 989.4 TFLOP of work in one second on an H200 in bf16 is 100%.
    assert peaks.mfu(989.4e12, 1.0, "NVIDIA H200", "bfloat16") == pytest.approx(1.0)
    assert peaks.mfu(67e12, 2.0, "NVIDIA H200", "float32") == pytest.approx(0.5)
    # TF32 matmuls are held against the TF32 peak.
    assert peaks.mfu(494.7e12, 1.0, "NVIDIA H200", "float32", "high") == pytest.approx(1.0)


def test_unknown_device_or_dtype_gives_none_and_a_warning() -> None:
    with pytest.warns(UserWarning, match="no peak bfloat16"):
        assert peaks.mfu(1e12, 1.0, "AMD EPYC 7B13", "bfloat16") is None
    with pytest.warns(UserWarning, match="no peak float32"):
        assert peaks.mfu(1e12, 1.0, "TPU v5p", "float32") is None


def test_an_unlisted_chip_is_not_mistaken_for_a_relative() -> None:
    assert peaks.lookup("TPU v4 lite") is None  # v4i, an inference chip, is not a v4


def test_a_v7_run_is_held_against_one_of_its_chips_two_devices() -> None:
    # a run drives one device: half a v7 chip's 2307 TFLOP/s and 7.37 TB/s
    assert peaks.mfu(2307e12 / 2, 1.0, "TPU7x", "bfloat16") == pytest.approx(1.0)
    assert peaks.lookup("TPU v7").device_hbm_bytes_per_s == pytest.approx(7.37e12 / 2)
    assert peaks.lookup("TPU v5e").device_hbm_bytes_per_s == pytest.approx(0.819e12)
