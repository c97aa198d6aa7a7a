"""Summary statistics of step samples."""

from __future__ import annotations

import numpy as np
import pytest

from tpubench.stats import summarize


def test_known_samples() -> None:
    summary = summarize([1.0, 2.0, 3.0, 4.0, 100.0])
    assert summary.median == 3.0
    assert summary.mean == 22.0
    assert summary.p10 == pytest.approx(1.4)
    assert summary.p90 == pytest.approx(61.6)
    assert summary.std == pytest.approx(np.std([1, 2, 3, 4, 100], ddof=1))
    assert summary.n == 5


def test_bootstrap_ci_brackets_the_median_and_narrows_with_more_samples() -> None:
    rng = np.random.default_rng(1)
    small = summarize(list(10 + rng.standard_normal(10)))
    large = summarize(list(10 + rng.standard_normal(1000)))
    for summary in (small, large):
        assert summary.ci_low <= summary.median <= summary.ci_high
    assert (large.ci_high - large.ci_low) < (small.ci_high - small.ci_low)
    assert large.ci_low < 10 < large.ci_high


def test_degenerate_samples_have_no_ci() -> None:
    assert summarize([5.0]).ci_low is None
    constant = summarize([2.0, 2.0, 2.0])
    assert (constant.ci_low, constant.ci_high, constant.std) == (None, None, 0.0)


def test_columns_carry_units() -> None:
    columns = summarize([1.0, 2.0]).as_columns("step", "ms")
    assert set(columns) == {
        "median_step_ms",
        "p10_step_ms",
        "p90_step_ms",
        "mean_step_ms",
        "std_step_ms",
        "ci_low_step_ms",
        "ci_high_step_ms",
    }


def test_no_samples_is_an_error() -> None:
    with pytest.raises(ValueError):
        summarize([])
