"""Summary statistics of per-step samples.

Step times are skewed (a preempted step is slow, never fast), so the headline is the
median with a bootstrap confidence interval rather than a mean with a normal-theory one.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats


@dataclass(frozen=True)
class Summary:
    median: float
    p10: float
    p90: float
    mean: float
    std: float
    ci_low: float | None
    ci_high: float | None
    n: int

    def as_columns(self, quantity: str, unit: str) -> dict[str, float | None]:
        """``median_{quantity}_{unit}``-style columns (``median_step_ms``), units in the name."""
        return {f"{key}_{quantity}_{unit}": value for key, value in asdict(self).items() if key != "n"}


def summarize(samples: list[float], confidence: float = 0.95, seed: int = 0) -> Summary:
    """Median, p10/p90, mean, std (ddof=1) and a percentile-bootstrap CI of the median.

    The CI is None when it cannot be estimated: fewer than two samples, or all equal.
    """
    values = np.asarray(samples, dtype=float)
    if values.size == 0:
        raise ValueError("no samples to summarize")
    ci_low = ci_high = None
    if values.size >= 2 and np.ptp(values) > 0:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # scipy warns on nearly degenerate resamples
            result = stats.bootstrap(
                (values,),
                np.median,
                confidence_level=confidence,
                n_resamples=2000,
                method="percentile",
                random_state=np.random.default_rng(seed),  # `rng=` needs scipy >= 1.15
            )
        low, high = result.confidence_interval
        if math.isfinite(low) and math.isfinite(high):
            ci_low, ci_high = float(low), float(high)
    return Summary(
        median=float(np.median(values)),
        p10=float(np.percentile(values, 10)),
        p90=float(np.percentile(values, 90)),
        mean=float(values.mean()),
        std=float(values.std(ddof=1)) if values.size >= 2 else 0.0,
        ci_low=ci_low,
        ci_high=ci_high,
        n=int(values.size),
    )
