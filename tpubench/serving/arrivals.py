"""When each request of a load point is sent: vLLM's arrival process (``vllm bench serve``).

At a finite ``rate`` (requests/s) the gaps between requests are gamma-distributed with shape
``burstiness`` and scale 1/(rate x burstiness), so their mean is 1/rate at any burstiness and
their coefficient of variation 1/sqrt(burstiness): 1 is a Poisson process, below 1 burstier,
above 1 steadier. The cumulative times are then rescaled so that the last request goes at
exactly n/rate, as vLLM does to keep throughputs of different seeds comparable (a raw sum of
gamma gaps misses it by a percent or two). At an infinite rate every request goes at t=0.
The same seed gives the same times.
"""

from __future__ import annotations

import math

import numpy as np


def check_rate(rate: float) -> None:
    """ValueError unless ``rate`` is a positive number of requests per second (inf allowed)."""
    if math.isnan(rate) or rate <= 0:
        raise ValueError(f"a request rate is a positive number of requests/s or inf, got {rate:g}")


def arrival_times(count: int, rate: float, burstiness: float = 1.0, seed: int = 0) -> list[float]:
    """Each request's send time in seconds since the point's start, in order."""
    check_rate(rate)
    if math.isnan(burstiness) or burstiness <= 0:
        raise ValueError(f"burstiness is a positive number (1: Poisson), got {burstiness:g}")
    if count <= 0:
        return []
    if math.isinf(rate):
        return [0.0] * count
    if math.isinf(burstiness):  # a gamma of infinite shape: a fixed gap
        gaps = np.full(count, 1.0 / rate)
    else:
        gaps = np.random.default_rng(seed).gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=count)
    times = np.cumsum(gaps)
    return (times * (count / rate / times[-1])).tolist()
