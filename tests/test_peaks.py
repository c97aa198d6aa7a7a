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
