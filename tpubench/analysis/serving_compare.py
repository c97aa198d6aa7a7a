"""Serving points, baseline against candidate: median TPOT, median TTFT and output throughput,
each with a ratio, a confidence interval from the per-request samples, a p-value and a verdict.

Stateless functions over the ``serving`` and ``serving_requests`` tables, shared by
``tpubench compare``, ``tpubench ci`` and the regression history, in the words and with the
thresholds :mod:`tpubench.analysis.compare` uses for runs (5% by default, as vLLM-TorchTPU's
own CI gates on median TPOT and tokens/s).

Points pair on :data:`tpubench.analysis.identity.SERVING_KEYS` (the engine and what it served
on which chip, under which load), the engine and the chip only when the two selections share
one (otherwise each baseline engine or chip meets each candidate one, and a difference is
``worse``/``better``, never a regression). The engine's version is not a key: a new release
against the last is the comparison wanted, and a reason names the versions when they differ.

The unit of replication. A serving point is one engine session under one load: its requests
are its samples, and several points of one configuration on a side (a night's repeats) are
pooled as runs are.

- With :attr:`Settings.min_runs` points a side or more, the rule for runs holds unchanged:
  the CI from a two-level bootstrap (points, then requests within each), the p-value from a
  Mann-Whitney test over the per-point statistics, and a verdict needs the ratio beyond the
  threshold, the CI excluding no change and p below alpha.
- With fewer (the usual night: one sweep, one point per load) the requests are the unit: the
  CI from the bootstrap of requests (two-level where a side holds two or more points), the
  p-value from a Mann-Whitney test over the requests (TPOT, TTFT) or from the bootstrap
  itself (output throughput: one value per point). Such a CI carries none of the noise
  *between* engine sessions, which calibration found is what misleads on runs, so a verdict
  asks more of it: at least :data:`MIN_REQUESTS` completed requests a side, and the whole CI
  beyond the threshold, not merely excluding no change. ``unchanged`` needs the whole CI
  within the threshold, as for runs (an equivalence test).

Output throughput's interval. A point's output throughput is one figure, total output tokens
over the point's duration; by Little's law it is the mean number of requests in flight times
Σ output tokens ÷ Σ end-to-end latency. Each bootstrap replicate draws the point's completed
requests with replacement and recomputes Σ tokens ÷ Σ E2EL, the measured mean in flight held
as it was (the stored throughput is the centre exactly): the interval carries the spread of
the requests' lengths and latencies, not that of the arrival process.

TTFT is reported always but gates only where it measures the server, not its queue: at a
finite request rate that both sides kept up with (request throughput at least
:data:`KEPT_UP` of the offered rate). At rate inf, or past saturation, TTFT is mostly time
spent waiting behind other requests' prefills (vLLM-TorchTPU's CI leaves it out for this
reason): a change there reads ``worse``/``better``, and the reason says why it did not gate.

A failed point, or failed requests where the baseline had none, regresses whatever the
latencies say. Points without per-request rows on a side (a result file imported without
them) are compared by their own stored figures, one value a point, with no interval: as a
timing measured once per run, a verdict then needs :attr:`Settings.min_runs` points a side.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from tpubench.analysis.compare import (
    STEP_THRESHOLD,
    Settings,
    hierarchical_bootstrap,
    runs_to_decide,
)
from tpubench.analysis.identity import SERVING_KEYS, serving_lines, serving_load_labels
from tpubench.analysis.nulls import is_missing
from tpubench.analysis.ranktest import mann_whitney_p

#: also shared, unless the two selections have none in common (vLLM on an H100 against
#: vLLM-TorchTPU on a TPU): then each baseline side meets each candidate side
SIDE_KEYS = ("engine", "device")
#: what two points must share to pair: their configuration but for the sides compared
PAIR_KEYS = tuple(key for key in SERVING_KEYS if key not in SIDE_KEYS)
#: completed requests a side that a verdict over requests needs (one point a side)
MIN_REQUESTS = 30
#: a load kept up with: request throughput at least this share of the offered rate (a run of
#: N requests at rate r lasts N/r plus the last request's latency, so a little under 1)
KEPT_UP = 0.9
#: what a regressed or improved verdict becomes where it does not gate: across engines or
#: chips, and TTFT under a load the server did not keep up with
NOT_GATING = {"regressed": "worse", "improved": "better"}
VERDICTS = ("regressed", "improved", "worse", "better", "unchanged", "inconclusive", "unpaired")
OVERALL = ("regressed", "inconclusive", "no regression", "nothing compared")


@dataclass(frozen=True)
class ServingMetric:
    """One compared quantity of a serving point."""

    name: str  # also the key of its threshold in Settings.thresholds (``--threshold``)
    label: str
    unit: str
    better: str  # "lower" or "higher"
    column: str  # the serving_requests column (latencies) or serving column (throughput)
    stored: str  # the serving column of the point's own figure, for points without requests


SERVING_METRICS = (
    ServingMetric("tpot", "median TPOT", "ms", "lower", "tpot_ms", "tpot_p50_ms"),
    ServingMetric("ttft", "median TTFT", "ms", "lower", "ttft_ms", "ttft_p50_ms"),
    ServingMetric("throughput", "output throughput", "tokens/s", "higher", "output_throughput", "output_throughput"),
)

COLUMNS = [
    *PAIR_KEYS,
    *(f"{side}_{key}" for key in SIDE_KEYS for side in ("base", "test")),
    "base_engine_version",
    "test_engine_version",
    "metric",
    "unit",
    "better",
    "base_value",
    "test_value",
    "ratio",
    "ci_low",
    "ci_high",
    "p_value",
    "tested_over",
    "threshold_pct",
    "base_points",
    "test_points",
    "base_requests",
    "test_requests",
    "gates",
    "verdict",
    "reason",
]


def pair_keys(baseline: pd.DataFrame, candidate: pd.DataFrame) -> list[str]:
    """:data:`PAIR_KEYS`, plus the engine and the chip where the two selections share one."""
    keys = list(PAIR_KEYS)
    for column in SIDE_KEYS:
        if set(baseline[column].dropna()) & set(candidate[column].dropna()):
            keys.append(column)
    return keys


def _groups(points: pd.DataFrame, keys: list[str]) -> dict[tuple, pd.DataFrame]:
    """``points`` by ``keys``, a null value read as None so that it finds itself in the other
    frame (no concurrency limit, no quantization)."""
    if not keys:
        return {(): points} if len(points) else {}
    return {
        tuple(None if pd.isna(value) else value for value in (key if isinstance(key, tuple) else (key,))): group
        for key, group in points.groupby(keys, dropna=False, sort=True)
    }


def _order(key: tuple) -> tuple:
    return tuple(str(value) for value in key)


def requests_by_point(requests: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Each point's completed requests (those without an error)."""
    done = requests[requests["error"].isna()] if "error" in requests else requests
    return {run_id: group for run_id, group in done.groupby("run_id")}


def compare_points(
    baseline: pd.DataFrame,
    candidate: pd.DataFrame,
    requests: pd.DataFrame,
    settings: Settings | None = None,
    keys: list[str] | None = None,
) -> pd.DataFrame:
    """One row per (paired configuration, metric): each side's value, the ratio (candidate ÷
    baseline), its CI, a p-value, the verdict and why (see the module doc). ``requests`` holds
    both sides' ``serving_requests`` rows. Points on one side only are ``unpaired`` rows.
    Columns: :data:`COLUMNS`."""
    settings = settings or Settings()
    keys = pair_keys(baseline, candidate) if keys is None else keys
    samples = requests_by_point(requests)
    base_groups, test_groups = _groups(baseline, keys), _groups(candidate, keys)
    rows: list[dict[str, Any]] = []
    for key in sorted(set(base_groups) | set(test_groups), key=_order):
        identity = dict(zip(keys, key, strict=True))
        base, test = base_groups.get(key), test_groups.get(key)
        if base is None or test is None:
            present = base if test is None else test
            for _, side in _groups(present, [c for c in SIDE_KEYS if c not in keys]).items():
                rows.append(_unpaired(identity, side, "candidate" if test is None else "baseline"))
            continue
        rest = [c for c in SIDE_KEYS if c not in keys]
        for base_side in _groups(base, rest).values():
            for test_side in _groups(test, rest).values():
                rows.extend(_compare_pair(identity, base_side, test_side, samples, settings))
    return pd.DataFrame(rows, columns=COLUMNS)


def _head(identity: dict[str, Any], base: pd.DataFrame | None, test: pd.DataFrame | None) -> dict[str, Any]:
    row: dict[str, Any] = {key: identity.get(key) for key in PAIR_KEYS}
    for column in (*SIDE_KEYS, "engine_version"):
        for prefix, side in (("base", base), ("test", test)):
            row[f"{prefix}_{column}"] = _side_value(side[column]) if side is not None else None
    return row


def _side_value(values: pd.Series) -> Any:
    """A side's value of a column: the one value its points share, ``a|b`` where they differ."""
    known = sorted({str(v) for v in values if not is_missing(v)})
    if not known:
        return None
    return values.dropna().iloc[0] if len(known) == 1 else "|".join(known)


def _unpaired(identity: dict[str, Any], points: pd.DataFrame, missing: str) -> dict[str, Any]:
    present = "baseline" if missing == "candidate" else "candidate"
    base, test = (points, None) if present == "baseline" else (None, points)
    return {
        **_head(identity, base, test),
        "metric": "-",
        "verdict": "unpaired",
        "gates": False,
        "base_points": len(points) if base is not None else 0,
        "test_points": len(points) if test is not None else 0,
        "reason": f"only in the {present} ({len(points)} point(s)): no {missing} point with this configuration",
    }


def _compare_pair(
    identity: dict[str, Any],
    base: pd.DataFrame,
    test: pd.DataFrame,
    samples: Mapping[str, pd.DataFrame],
    settings: Settings,
) -> list[dict[str, Any]]:
    head = _head(identity, base, test)
    rows = [{**head, **event} for event in _events(base, test)]
    base_ok, test_ok = base[base["status"] == "ok"], test[test["status"] == "ok"]
    across = head["base_engine"] != head["test_engine"] or head["base_device"] != head["test_device"]
    if not (base_ok.empty or test_ok.empty):
        ttft_gates, ttft_why = ttft_gates_at(base_ok, test_ok)
        for metric in SERVING_METRICS:
            found = metric_verdict(base_ok, test_ok, samples, metric, settings)
            if found is None:
                continue
            gates = metric.name != "ttft" or ttft_gates
            if not gates:
                found["verdict"] = NOT_GATING.get(found["verdict"], found["verdict"])
                found["reason"] = f"{found['reason']}; not gating: {ttft_why}"
            rows.append(
                {
                    **head,
                    "metric": metric.name,
                    "unit": metric.unit,
                    "better": metric.better,
                    "threshold_pct": 100 * _threshold(metric, settings),
                    "base_points": len(base_ok),
                    "test_points": len(test_ok),
                    "gates": gates,
                    **found,
                }
            )
    versions = {str(head["base_engine_version"]), str(head["test_engine_version"])}
    version_text = (
        f"; engine version {head['base_engine_version']} → {head['test_engine_version']}" if len(versions) > 1 else ""
    )
    sides = (
        f"{head['base_engine']} ({head['base_device']}) → {head['test_engine']} ({head['test_device']})"
        if across
        else ""
    )
    for row in rows:
        row["reason"] = f"{row.get('reason', '')}{version_text}"
        if across:
            row["verdict"] = NOT_GATING.get(row["verdict"], row["verdict"])
            row["gates"] = False
            row["reason"] = f"across engines or chips, {sides}: a difference, not a regression; {row['reason']}"
    return rows


def _events(base: pd.DataFrame, test: pd.DataFrame) -> list[dict[str, Any]]:
    """Rows for what regresses whatever the latencies: a point that failed where the baseline's
    did not, and failed requests where the baseline had none."""
    common = {"base_points": len(base), "test_points": len(test), "unit": "", "better": "", "gates": True}
    found = []
    base_bad = sorted(set(base["status"]) - {"ok"})
    test_bad = test[test["status"] != "ok"]
    if len(test_bad) and not base_bad:
        error = next((str(e).splitlines()[0][:200] for e in test_bad["error"] if not is_missing(e) and e), None)
        found.append(
            {
                **common,
                "metric": "status",
                "verdict": "regressed",
                "reason": f"ok -> {test_bad['status'].iloc[0]} in {len(test_bad)} of {len(test)} point(s)"
                + (f": {error}" if error else ""),
            }
        )
    elif base_bad and not len(test_bad):
        found.append({**common, "metric": "status", "verdict": "improved", "reason": f"{', '.join(base_bad)} -> ok"})
    base_failed, test_failed = (int(side["failed"].fillna(0).sum()) for side in (base, test))
    if test_failed and not base_failed:
        sent = int(test["completed"].fillna(0).sum()) + test_failed
        found.append(
            {
                **common,
                "metric": "failed_requests",
                "base_value": 0.0,
                "test_value": float(test_failed),
                "verdict": "regressed",
                "reason": f"{test_failed} of {sent} request(s) failed, none in the baseline",
            }
        )
    return found


def _threshold(metric: ServingMetric, settings: Settings) -> float:
    return settings.thresholds.get(metric.name, STEP_THRESHOLD)


def ttft_gates_at(base: pd.DataFrame, test: pd.DataFrame) -> tuple[bool, str]:
    """Whether TTFT gates for a pair of sides (see the module doc), and why not when it does not."""
    rates = pd.concat([base["request_rate"], test["request_rate"]]).astype(float)
    if rates.isna().any() or np.isinf(rates).any():
        return False, "at rate inf every request is sent at once, so TTFT is mostly queueing behind other prefills"
    for name, side in (("baseline", base), ("candidate", test)):
        achieved = side["request_throughput"].astype(float) / side["request_rate"].astype(float)
        if achieved.isna().any() or (achieved < KEPT_UP).any():
            return False, (
                f"the {name} served {achieved.min():.0%} of the offered rate, past saturation, where TTFT is "
                "mostly queueing"
            )
    return True, ""


def _point_samples(points: pd.DataFrame, samples: Mapping[str, pd.DataFrame], column: str) -> list[np.ndarray]:
    """Per point, its completed requests' values of ``column`` (points without any left out)."""
    found = []
    for run_id in points["run_id"]:
        if run_id in samples:
            values = samples[run_id][column].to_numpy(dtype=float, na_value=np.nan)
            values = values[~np.isnan(values)]
            if values.size:
                found.append(values)
    return found


def _throughput_replicates(
    points: pd.DataFrame, samples: Mapping[str, pd.DataFrame], resamples: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, int] | None:
    """Each point's output throughput, ``resamples`` bootstrap replicates of each (one row per
    point: see the module doc), and the requests they rest on; None without any."""
    values, rows, used = [], [], 0
    for run_id, stored in zip(points["run_id"], points["output_throughput"].astype(float), strict=True):
        requests = samples.get(run_id)
        if requests is None or np.isnan(stored):
            continue
        tokens = requests["output_len"].to_numpy(dtype=float, na_value=np.nan)
        latency = requests["e2el_ms"].to_numpy(dtype=float, na_value=np.nan)
        known = ~(np.isnan(tokens) | np.isnan(latency))
        tokens, latency = tokens[known], latency[known]
        if not tokens.size or latency.sum() <= 0 or tokens.sum() <= 0:
            continue
        drawn = rng.integers(0, tokens.size, size=(resamples, tokens.size))
        rate = tokens[drawn].sum(axis=1) / latency[drawn].sum(axis=1)
        values.append(stored)
        rows.append(stored * rate / (tokens.sum() / latency.sum()))
        used += tokens.size
    if not values:
        return None
    return np.array(values), np.array(rows), used


def _over_points(per_point: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A side's replicates: points drawn with replacement, the median over the drawn points'
    replicates (the plain bootstrap with one point)."""
    count, resamples = per_point.shape
    chosen = rng.integers(0, count, size=(resamples, count))
    return np.median(per_point[chosen, np.arange(resamples)[:, None]], axis=1)


def metric_verdict(
    base: pd.DataFrame,
    test: pd.DataFrame,
    samples: Mapping[str, pd.DataFrame],
    metric: ServingMetric,
    settings: Settings,
) -> dict[str, Any] | None:
    """Values, ratio, CI, p-value, verdict and reason of one metric for two sides' ok points;
    None where neither side has a sample of it (TPOT of one-token answers)."""
    rng = np.random.default_rng(settings.seed)
    if metric.name == "throughput":
        found = [_throughput_replicates(side, samples, settings.resamples, rng) for side in (base, test)]
        if found[0] is None or found[1] is None:
            return _stored_verdict(base, test, metric, settings)
        (base_values, base_reps, n_base), (test_values, test_reps, n_test) = found  # type: ignore[misc]
        base_value, test_value = float(np.median(base_values)), float(np.median(test_values))
        replicates = _over_points(test_reps, rng) / _over_points(base_reps, rng)
        per_point = (base_values, test_values)
        pooled = None
    else:
        base_runs, test_runs = (_point_samples(side, samples, metric.column) for side in (base, test))
        if not base_runs or not test_runs:
            return _stored_verdict(base, test, metric, settings)
        n_base, n_test = sum(r.size for r in base_runs), sum(r.size for r in test_runs)
        per_point = (np.array([np.median(r) for r in base_runs]), np.array([np.median(r) for r in test_runs]))
        base_value, test_value = float(np.median(per_point[0])), float(np.median(per_point[1]))
        replicates = hierarchical_bootstrap(test_runs, settings.resamples, rng) / hierarchical_bootstrap(
            base_runs, settings.resamples, rng
        )
        pooled = (np.concatenate(base_runs), np.concatenate(test_runs))
    common = {"base_value": base_value, "test_value": test_value, "base_requests": n_base, "test_requests": n_test}
    if base_value <= 0 or test_value <= 0:
        return {**common, "verdict": "inconclusive", "reason": f"{metric.label} {base_value:g} -> {test_value:g}"}
    if min(n_base, n_test) < MIN_REQUESTS and min(per_point[0].size, per_point[1].size) < settings.min_runs:
        return {
            **common,
            "ratio": test_value / base_value if base_value else None,
            "verdict": "inconclusive",
            "reason": f"too few completed requests ({n_base} vs {n_test}; a verdict needs {MIN_REQUESTS} a side)",
        }
    tail = 100 * (1 - settings.confidence) / 2
    ci_low, ci_high = (float(v) for v in np.percentile(replicates, [tail, 100 - tail]))
    by_points = min(per_point[0].size, per_point[1].size) >= settings.min_runs
    if by_points:
        tested, p_value = "points", float(mann_whitney_p(per_point[1], per_point[0]))
    elif pooled is not None:
        tested, p_value = "requests", float(mann_whitney_p(pooled[1], pooled[0]))
    else:  # one throughput per point: the bootstrap's own two-sided p, which cannot go below 1/resamples
        tested = "requests (bootstrap)"
        tail_share = min(np.mean(replicates <= 1), np.mean(replicates >= 1))
        p_value = float(min(1.0, max(2 * tail_share, 1 / settings.resamples)))
    ratio = test_value / base_value
    return {
        **common,
        "ratio": ratio,
        "ci_low": ci_low,
        "ci_high": ci_high,
        "p_value": p_value,
        "tested_over": tested,
        **_decide(ratio, ci_low, ci_high, p_value, by_points, per_point, metric, settings),
    }


def _stored_verdict(
    base: pd.DataFrame, test: pd.DataFrame, metric: ServingMetric, settings: Settings
) -> dict[str, Any] | None:
    """A metric of points without per-request rows on a side (an import of a result file that
    kept none): the points' own figures, one value a point, which allow no interval. As for a
    timing measured once per run, a verdict needs :attr:`Settings.min_runs` points a side and
    a Mann-Whitney p below alpha; None where a side lacks the figure too."""
    values = [side[metric.stored].to_numpy(dtype=float, na_value=np.nan) for side in (base, test)]
    base_values, test_values = (v[~np.isnan(v)] for v in values)
    if not base_values.size or not test_values.size:
        return None
    base_value, test_value = float(np.median(base_values)), float(np.median(test_values))
    ratio = test_value / base_value if base_value > 0 else None
    found: dict[str, Any] = {
        "base_value": base_value,
        "test_value": test_value,
        "ratio": ratio,
        "base_requests": 0,
        "test_requests": 0,
        "tested_over": "points (stored figures)",
    }
    threshold = _threshold(metric, settings)
    change = f"{metric.label} {base_value:.3g} -> {test_value:.3g} {metric.unit}" + (
        f" ({_percent(ratio)})" if ratio else ""
    )
    why = "no per-request samples on a side (a result file imported without them): the points' own figures"
    counts = f"{base_values.size} vs {test_values.size} point(s)"
    if ratio is None or min(base_values.size, test_values.size) < settings.min_runs:
        return {
            **found,
            "verdict": "inconclusive",
            "reason": f"{change}; {why}, and {counts} of one figure each cannot tell a change from noise: "
            f"a verdict needs {settings.min_runs} points a side",
        }
    p_value = float(mann_whitney_p(test_values, base_values))
    worse = ratio > 1 if metric.better == "lower" else ratio < 1
    beyond = ratio >= 1 + threshold or ratio <= 1 / (1 + threshold)
    if beyond and p_value < settings.alpha:
        verdict = "regressed" if worse else "improved"
    else:
        verdict = "inconclusive" if beyond else "unchanged"
    where = "beyond" if beyond else "within"
    reason = f"{change}, {where} the {100 * threshold:g}% threshold, Mann-Whitney p {p_value:.2g} over {counts}; {why}"
    return {**found, "p_value": p_value, "verdict": verdict, "reason": reason}


def _percent(ratio: float) -> str:
    return f"{100 * (ratio - 1):+.1f}%"


def _decide(
    ratio: float,
    ci_low: float,
    ci_high: float,
    p_value: float,
    by_points: bool,
    per_point: tuple[np.ndarray, np.ndarray],
    metric: ServingMetric,
    settings: Settings,
) -> dict[str, str]:
    """The verdict and its reason (the rule in the module doc)."""
    threshold = _threshold(metric, settings)
    bound = 1 + threshold
    n_base, n_test = per_point[0].size, per_point[1].size
    over = f"{n_base} vs {n_test} point(s)" + ("" if by_points else ", requests as the unit")
    change = f"{metric.label} {_percent(ratio)} (CI {_percent(ci_low)} .. {_percent(ci_high)}, p={p_value:.2g}, {over})"
    percent = f"the {100 * threshold:g}% threshold"
    worse = ratio > 1 if metric.better == "lower" else ratio < 1
    beyond = ratio >= bound or ratio <= 1 / bound
    significant = p_value < settings.alpha and (ci_low > 1 or ci_high < 1)
    clears = ci_low >= bound if ratio > 1 else ci_high <= 1 / bound
    if beyond and significant and (by_points or clears):
        verdict = "regressed" if worse else "improved"
        return {"verdict": verdict, "reason": f"{change}, beyond {percent}"}
    if beyond:
        why = []
        if p_value >= settings.alpha:
            why.append(f"p >= {settings.alpha:g}")
        if not (ci_low > 1 or ci_high < 1):
            why.append("the CI includes no change")
        if not by_points and not clears:
            why.append(
                f"with fewer than {settings.min_runs} points a side the interval carries no noise between engine "
                f"sessions, so a verdict needs the whole CI beyond {percent}"
            )
        return {"verdict": "inconclusive", "reason": f"{change}: not shown ({'; '.join(why)}); more points would tell"}
    within = 1 / bound < ci_low and ci_high < bound
    if within:
        return {"verdict": "unchanged", "reason": f"{change}, within {percent} (the whole CI)"}
    needed = runs_to_decide(ratio, ci_low, ci_high, n_base, n_test, threshold, settings.min_runs)
    more = f"; about {needed} points a side would decide it" if needed is not None and by_points else ""
    return {
        "verdict": "inconclusive",
        "reason": f"{change}: within {percent}, but its CI reaches beyond it, so no change is not shown{more}",
    }


def verdict_counts(comparison: pd.DataFrame) -> dict[str, int]:
    """How many rows got each verdict (every verdict named)."""
    counts = comparison["verdict"].value_counts()
    return {verdict: int(counts.get(verdict, 0)) for verdict in VERDICTS}


def regressions(comparison: pd.DataFrame) -> pd.DataFrame:
    """The regressed rows."""
    return comparison[comparison["verdict"] == "regressed"].reset_index(drop=True)


def undecided(comparison: pd.DataFrame) -> pd.DataFrame:
    """The gating rows that decided nothing (a TTFT that does not gate is not among them)."""
    gating = comparison["gates"].fillna(False).astype(bool)
    return comparison[gating & (comparison["verdict"] == "inconclusive")].reset_index(drop=True)


def overall_verdict(comparison: pd.DataFrame) -> str:
    """A whole serving comparison in one of :data:`OVERALL`, as
    :func:`tpubench.analysis.compare.overall_verdict` reads runs."""
    if (comparison["verdict"] == "regressed").any():
        return "regressed"
    if comparison.empty or (comparison["verdict"] == "unpaired").all():
        return "nothing compared"
    return "inconclusive" if not undecided(comparison).empty else "no regression"


def combined_verdict(*verdicts: str) -> str:
    """The verdict of several comparisons (runs and serving points): the worst of them, in
    :data:`OVERALL` order; "nothing compared" only when none compared anything."""
    return min(verdicts, key=OVERALL.index) if verdicts else "nothing compared"


def serving_labels(frame: pd.DataFrame) -> pd.Series:
    """Each row's point in words, from :func:`identity.serving_lines` and
    :func:`identity.serving_load_labels`: ``tiny-llama random 64→16, vllm 0.11.0 on NVIDIA
    H100, rate 4/s, concurrency 8`` (``base → test`` for an engine or chip that differs).
    Takes a points frame or a comparison frame (its ``test_`` side, else its ``base_`` side)."""
    if frame.empty:
        return pd.Series([], index=frame.index, dtype=object)
    if "engine" in frame:
        lines = serving_lines(frame).tolist()
    else:
        lines = [_pair_line(row) for row in frame.astype(object).where(frame.notna(), None).to_dict("records")]
    loads = serving_load_labels(frame)
    labels = []
    for row, line, load in zip(frame.to_dict("records"), lines, loads, strict=True):
        lengths = "/".join("?" if is_missing(row.get(k)) else str(int(row[k])) for k in ("input_len", "output_len"))
        model = f"{row.get('model')} {row.get('dataset') or ''} {lengths}".replace("  ", " ")
        labels.append(f"{model}, {line}, {load}")
    return pd.Series(labels, index=frame.index, dtype=object)


def series_labels(points: pd.DataFrame) -> pd.Series:
    """Each point's series in a history (:data:`identity.SERVING_KEYS`, the engine version
    left out: a new release is a point of the same series, where its change shows)."""
    return serving_labels(points.assign(engine_version=None))


def _pair_line(row: dict[str, Any]) -> str:
    """A comparison row's chart line: its side's, or ``baseline's → candidate's`` where they differ."""
    base = _side_line(row, "base") if row["base_engine"] is not None else None
    test = _side_line(row, "test") if row["test_engine"] is not None else None
    if base is None or test is None or base == test:
        return str(test or base)
    return f"{base} → {test}"


def _side_line(row: dict[str, Any], side: str) -> str:
    point = {
        "engine": row[f"{side}_engine"],
        "engine_version": row[f"{side}_engine_version"],
        "device": row[f"{side}_device"],
        "tp_size": row["tp_size"],
        "quantization": row["quantization"],
    }
    return str(serving_lines(pd.DataFrame([point])).iloc[0])


def records(comparison: pd.DataFrame) -> list[dict[str, Any]]:
    """The comparison as JSON records, each with its point's label."""
    frame = comparison.assign(point=serving_labels(comparison))
    return json.loads(frame.to_json(orient="records"))
