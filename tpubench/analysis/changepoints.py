"""Change points in the history of each series: which invocation (and git sha) shifted a metric.

A series is one configuration (:mod:`tpubench.analysis.identity`: workload, size, mode,
dtype, backend, device, shape, layout, a user's model's hash) over time; each invocation
contributes one point, the median of its runs' medians. Detection is ruptures' PELT on the
log values (a multiplicative shift is a step there), and every change it proposes must then
pass Welch's t-test between the log values of the segments either side, a minimum relative
shift, and a minimum segment length on both sides, with that many invocations after it
measured nearer the new level than the old, so a single slow night is never reported and a
shift is reported only once it has persisted.

Why Welch's t on the logs and not a rank test: a rank test over 3 points against 3 can never
reach p < 0.01 (its best two-sided p is 0.1; 5 against 5 is the fewest that can), so with
Mann-Whitney a clean step (10 -> 20 ms, 1% noise) was first found after 5 + 5 invocations
while the command promised 3. The t-test on the logs finds it at 3 + 3, and an outlier
inside a segment widens that segment's variance, which makes the test more cautious, never
less. On 400 synthetic 30-night series without a shift per noise model (2026-12-02), false
alarms were, t-test against rank test: 0 vs 0 at 2% log-normal noise, 42 vs 40 at 5% (the
5% minimum shift is then inside the noise), 19 vs 51 and 28 vs 56 with heavy-tailed (t3)
noise of 5% and 12%.

Why ruptures: it is small (numpy and scipy), maintained, and exact (PELT); it has no
significance test of its own, hence the test afterwards. Apache Otava (the Hunter/
E-divisive line of work, with a test built in) would fit, but 0.8.0 pins numpy 2.2 and
scipy < 1.17 and pulls cloud SDKs, which a plain install of tpubench must not do.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
import pandas as pd
import ruptures
from scipy import stats

from tpubench.analysis.identity import CONFIG_KEYS, SERVING_KEYS, configurations

#: what makes a series: one configuration (:mod:`tpubench.analysis.identity`) measured over
#: time; a user's model changed under one reference (a new ``model_hash``) or another layout
#: (2 devices rather than 1) is another series
SERIES_KEYS = CONFIG_KEYS
#: metrics where a larger value is worse
LOWER_IS_BETTER = (
    *("median_step_ms", "ttft_p50_ms", "tpot_p50_ms", "first_step_s", "compile_s", "peak_mem_bytes"),
    *("recompiles_after_warmup", "compile_count", "first_step_compiles", "graph_breaks"),  # counts: fewer is better
    # the memory parts (tpubench.memory) and the energy a step or token takes (tpubench.energy)
    *("mem_weights_bytes", "mem_grads_bytes", "mem_optimizer_bytes", "mem_activations_bytes"),
    *("energy_j", "joules_per_token", "joules_per_sample", "avg_power_w"),
)

#: what a change point says beyond its series' keys
CHANGE_COLUMNS = [
    "metric",
    "started_at",
    "invocation_id",
    "git_sha",
    "before",
    "after",
    "change_pct",
    "p_value",
    "points_before",
    "points_after",
    "direction",
]
COLUMNS = [*SERIES_KEYS, *CHANGE_COLUMNS]
#: the serving points' columns a history can follow (``tpubench regressions --serving``)
SERVING_METRICS = (
    *(f"{latency}_{stat}_ms" for latency in ("tpot", "ttft", "itl", "e2el") for stat in ("p50", "p90", "p99", "mean")),
    "output_throughput",
    "request_throughput",
    "total_token_throughput",
    "request_goodput",
    "cold_start_s",
)


@dataclass(frozen=True)
class ChangePointSettings:
    min_points: int = 3  # a segment must last this many invocations (a shift must persist)
    alpha: float = 0.01  # Welch's t-test p between the two segments' log values
    min_change: float = 0.05  # relative shift of the segment medians
    penalty: float | None = None  # PELT's penalty on log values; None: 2 x noise variance x log(n) (BIC-like)


def series_points(runs: pd.DataFrame, metric: str = "median_step_ms") -> pd.DataFrame:
    """One point per (series, invocation): the median of the invocation's ok runs, in time order.

    Columns: the series keys, invocation_id, git_sha, started_at (the invocation's first run)
    and value.
    """
    ok = configurations(runs[(runs["status"] == "ok") & runs[metric].notna()])
    grouped = ok.groupby([*SERIES_KEYS, "invocation_id"], dropna=False, sort=False)
    points = grouped.agg(started_at=("started_at", "min"), git_sha=("git_sha", "first"), value=(metric, "median"))
    return points.reset_index().sort_values([*SERIES_KEYS, "started_at"], na_position="first").reset_index(drop=True)


def _noise_variance(values: np.ndarray) -> float:
    """Robust variance of the points around their level: from the median absolute successive
    difference, which a few steps barely move (a plain variance would count the shifts)."""
    diffs = np.abs(np.diff(values))
    sigma = 1.4826 * float(np.median(diffs)) / math.sqrt(2) if diffs.size else 0.0
    return max(sigma**2, 1e-8)


def log_scale(values: np.ndarray, counts: bool) -> np.ndarray:
    """The log values the tests work on: ``log(x)`` for a positive series, and ``log(1 + x)``
    for a count that can be 0 (``recompiles_after_warmup``, ``graph_breaks``), whose log would
    be -inf at every zero."""
    return np.log1p(values) if counts else np.log(values)


def is_count(values: np.ndarray) -> bool:
    """Whether a series has zeros and so is tested as a count (:func:`log_scale`); a negative
    value fits neither scale and is a ValueError."""
    if (values < 0).any():
        raise ValueError("change points need a metric that is never negative")
    return bool((values == 0).any())


def segment_p(before: np.ndarray, after: np.ndarray, counts: bool = False) -> float:
    """Two-sided p of Welch's t-test between two segments' log values (see the module doc);
    1.0 where neither segment varies and their levels are equal."""
    if np.ptp(before) == 0 and np.ptp(after) == 0:  # both constant (a count): certain either way
        return 0.0 if before[0] != after[0] else 1.0
    with warnings.catch_warnings():  # one constant segment: scipy warns of precision, the p stands
        warnings.filterwarnings("ignore", "Precision loss", RuntimeWarning)
        p_value = stats.ttest_ind(log_scale(before, counts), log_scale(after, counts), equal_var=False).pvalue
    if math.isnan(p_value):  # both segments constant: a shift is certain, no shift is none
        return 0.0 if np.median(before) != np.median(after) else 1.0
    return float(p_value)


def relative_change(before: np.ndarray, after: np.ndarray) -> float:
    """The shift of the segment medians, relative to the one before: infinite from a median of
    0 (a count that appeared: "0 -> 2 recompiles" has no finite percentage)."""
    old, new = float(np.median(before)), float(np.median(after))
    if old == 0:
        return math.inf if new > 0 else 0.0
    return new / old - 1


def detect(values: np.ndarray, settings: ChangePointSettings) -> list[int]:
    """Indices where a new segment starts in ``values`` (a positive series, or a count with
    zeros: :func:`log_scale`), tested as described above."""
    if values.size < 2 * settings.min_points:
        return []
    counts = is_count(values)
    logs = log_scale(values, counts)
    penalty = settings.penalty or 2 * _noise_variance(logs) * math.log(values.size)
    proposed = ruptures.Pelt(model="l2", min_size=settings.min_points, jump=1).fit(logs).predict(pen=penalty)
    bounds = [0, *proposed]  # proposed ends with len(values)
    kept: list[int] = []
    for left, middle, right in zip(bounds, bounds[1:], bounds[2:], strict=False):
        before, after = values[left:middle], values[middle:right]
        if min(before.size, after.size) < settings.min_points:
            continue
        change = relative_change(before, after)
        p_value = segment_p(before, after, counts)
        # persisted: min_points invocations measured nearer the new level than the old (PELT may
        # start a fresh two-night shift at a high-noise point just before it), on the tested scale
        midpoint = np.expm1 if counts else np.exp
        midpoint = midpoint((log_scale(np.median(before), counts) + log_scale(np.median(after), counts)) / 2)
        shifted = int(np.sum(after > midpoint if change > 0 else after < midpoint))
        if abs(change) >= settings.min_change and p_value < settings.alpha and shifted >= settings.min_points:
            kept.append(middle)
    return kept


def change_points(
    runs: pd.DataFrame, metric: str = "median_step_ms", settings: ChangePointSettings | None = None
) -> pd.DataFrame:
    """Every tested change point of every series of ``runs`` (a runs-table frame) for ``metric``.

    One row per change: the series, the first invocation after the shift (``started_at``,
    ``invocation_id``, ``git_sha``: where to look), the medians of the points before and after
    (in the segments either side), the change in percent, the p-value (:func:`segment_p`), the
    points on each side and ``direction`` ("regression" or "improvement", by the metric's
    better direction). Columns: :data:`COLUMNS`.
    """
    return series_changes(series_points(runs, metric), list(SERIES_KEYS), metric, settings)


def serving_series_points(points: pd.DataFrame, metric: str = "tpot_p50_ms") -> pd.DataFrame:
    """One point per (serving configuration, sweep): the median of the sweep's ok points of
    that configuration (:data:`identity.SERVING_KEYS`), in time order, with the engine
    version it ran (not a key: a new release shifting the series is what to find)."""
    ok = points[(points["status"] == "ok") & points[metric].notna()]
    grouped = ok.groupby([*SERVING_KEYS, "invocation_id"], dropna=False, sort=False)
    found = grouped.agg(
        started_at=("started_at", "min"),
        git_sha=("git_sha", "first"),
        engine_version=("engine_version", "first"),
        value=(metric, "median"),
    )
    return found.reset_index().sort_values([*SERVING_KEYS, "started_at"], na_position="first").reset_index(drop=True)


def serving_change_points(
    points: pd.DataFrame, metric: str = "tpot_p50_ms", settings: ChangePointSettings | None = None
) -> pd.DataFrame:
    """:func:`change_points` over serving points (a ``serving``-table frame): one series per
    serving configuration, each change naming the sweep, git sha and engine version after it.
    Columns: :data:`identity.SERVING_KEYS`, ``engine_version``, :data:`CHANGE_COLUMNS`."""
    found = serving_series_points(points, metric)
    return series_changes(found, list(SERVING_KEYS), metric, settings, ("engine_version",))


def series_changes(
    points: pd.DataFrame,
    keys: list[str],
    metric: str,
    settings: ChangePointSettings | None = None,
    named: tuple[str, ...] = (),
) -> pd.DataFrame:
    """The tested change points of each series of ``points`` (one value per invocation, in
    time order: :func:`series_points`), the series being ``keys``; ``named`` columns of the
    first point after a change are kept beside ``git_sha``."""
    settings = settings or ChangePointSettings()
    rows = []
    worse_up = metric in LOWER_IS_BETTER or metric.endswith(("_ms", "_s", "_bytes"))
    for key, series in points.groupby(keys, dropna=False, sort=False):
        values = series["value"].to_numpy(dtype=float)
        starts = detect(values, settings)
        bounds = [0, *starts, values.size]
        for index, start in enumerate(starts):
            before, after = values[bounds[index] : start], values[start : bounds[index + 2]]
            point = series.iloc[start]
            change = relative_change(before, after)
            rows.append(
                {
                    **dict(zip(keys, key, strict=True)),
                    **{column: point[column] for column in named},
                    "metric": metric,
                    "started_at": point["started_at"],
                    "invocation_id": point["invocation_id"],
                    "git_sha": point["git_sha"],
                    "before": float(np.median(before)),
                    "after": float(np.median(after)),
                    "change_pct": 100 * change,
                    "p_value": segment_p(before, after, is_count(values)),
                    "points_before": before.size,
                    "points_after": after.size,
                    "direction": "regression" if (change > 0) == worse_up else "improvement",
                }
            )
    return pd.DataFrame(rows, columns=[*keys, *named, *CHANGE_COLUMNS])
