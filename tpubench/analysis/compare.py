"""Baseline against candidate: ratios with confidence intervals, significance, and a verdict per metric.

Stateless functions over the runs and steps tables (no I/O, no printing), shared by
``tpubench compare``, ``tpubench ci``, the reports and the dashboard.

Why a verdict needs more than a test on two runs' samples: on a shared host most noise
is *between* processes (three identical gpt2-tiny runs in a row had medians of 7.79,
4.60 and 4.71 ms while each run's own samples were tight), so a Mann-Whitney test of one
run's samples against another's calls that a regression. Calibration on this 2-core host
(``benchmarks/regression_calibration.py``) found the per-run median of identical runs
spread by 12-16% (sd of its log), and its steps' timing drifting over seconds even within
one process. The unit of replication is therefore the *run*, and a verdict needs all of:

1. at least :attr:`Settings.min_runs` runs per side (5: the fewest for which a rank test
   over runs can reach p < 0.01) and enough raw samples (:attr:`Settings.min_samples`);
2. the ratio of medians beyond the metric's threshold, with a 95% CI that excludes 1;
   the CI comes from a two-level bootstrap (runs, then samples within a run), so it
   carries the between-run spread;
3. a Mann-Whitney U test over the per-run statistics (one value per run, not the pooled
   steps), p below :attr:`Settings.alpha`.

A change that passes 2 but not 1 or 3 is ``inconclusive`` (more runs would tell), never a
regression. ``unchanged`` is shown, not assumed: it needs the whole CI within ±threshold
(an equivalence test, as TOST does) over at least ``min_runs`` runs per side; a ratio within
the threshold whose CI reaches beyond it is ``inconclusive`` too, and its reason says about
how many runs per side would decide it (:func:`runs_to_decide`). Each row also gives the
smallest change its runs could detect reliably (``detectable_pct``: 95% power at ``alpha``
for the measured between-run spread), so a report says when a night had too few runs to see
a 10% slowdown; it comes from replaying the verdict on draws from the runs' own statistics
(:func:`simulated_power`), because a shared host's per-run statistics are not normal.
Status, new recompilations and new CPU-fallback ops regress whatever the numbers say.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import cache, cached_property
from itertools import pairwise
from typing import Any

import numpy as np
import pandas as pd

from tpubench.analysis.compiles import top_cause
from tpubench.analysis.identity import CONFIG_KEYS, configurations
from tpubench.analysis.nulls import is_missing
from tpubench.analysis.precision import precision_of, quality_flag, quality_note
from tpubench.analysis.ranktest import mann_whitney_p, u_counts
from tpubench.analysis.steps import job_steps
from tpubench.hostload import BUSY_SHARE, is_busy

#: also shared, unless the two selections have none in common (GPU against TPU)
SIDE_KEYS = ("backend", "device")
#: what two runs must share to be compared: their configuration
#: (:data:`tpubench.analysis.identity.CONFIG_KEYS`) but for the sides compared.
#: ``model_hash`` (a user's model's config or source) keeps a changed model from pairing with
#: its old self; registered workloads' rows have it null, and pair as before; a run pairs only
#: with the same layout (device count, plan, tensor-parallel degree, scaling, hosts:
#: ``batch_size`` is its global batch), but a 1-device run under a plan that the other side
#: did not run at 1 device pairs with the other side's plain 1-device runs (:func:`pairs`)
PAIR_KEYS = tuple(key for key in CONFIG_KEYS if key not in SIDE_KEYS)
#: statuses that measured nothing: left out of comparisons
UNTIMED = frozenset({"unavailable", "skipped"})
#: a candidate in one of these, where the baseline was ok, has regressed
BAD_STATUSES = frozenset({"failed", "crashed", "mismatch", "oom", "timeout"})
VERDICTS = ("regressed", "improved", "worse", "better", "unchanged", "inconclusive", "unpaired")
#: what a regressed or improved verdict becomes across backends or devices: an expected
#: difference (a compiled backend's first step, another chip's speed), not a regression
ACROSS = {"regressed": "worse", "improved": "better"}
#: each side's verdict of a whole comparison (:func:`overall_verdict`)
OVERALL = ("regressed", "inconclusive", "no regression", "nothing compared")
#: runs columns naming the stack a run ran on; a difference is named in the reason
VERSION_COLUMNS = ("python_version", "torch_version", "tpubench_version", "host", "cpu_model")


@dataclass(frozen=True)
class Metric:
    """One compared quantity: where its values come from, which way is better, what change counts."""

    name: str
    label: str
    unit: str
    better: str  # "lower" or "higher"
    threshold: float  # relative change that counts (0.05: 5%)
    kind: str  # "sampled" (a steps column), "run" (a runs column, one value per run), "throughput"
    column: str
    min_delta: float = 0.0  # and an absolute change of at least this much, in ``unit``
    scale: float = 1.0  # column value x scale = value in ``unit``
    #: a time a busy host stretches (a run's cold first step, its compile), not a count: one
    #: value a run decides nothing, so a verdict needs runs on each side and a rank test
    timed: bool = False


#: the default step-time threshold: a verdict needs at least this change
STEP_THRESHOLD = 0.05
#: the slowdown a night must catch with Settings.power; ``tpubench ci --rounds auto`` runs enough for it
DETECT = 0.10

METRICS: tuple[Metric, ...] = (
    Metric("step", "step time", "ms", "lower", STEP_THRESHOLD, "sampled", "step_ms"),
    Metric("throughput", "throughput", "tokens/s", "higher", STEP_THRESHOLD, "throughput", "tokens_per_s"),
    Metric("ttft", "TTFT", "ms", "lower", STEP_THRESHOLD, "sampled", "ttft_ms"),
    Metric("tpot", "TPOT", "ms", "lower", STEP_THRESHOLD, "sampled", "tpot_ms"),
    # one cold compile per run, which varies far more than a step: looser, and 1 s at least
    Metric("first_step", "first step", "s", "lower", 0.5, "run", "first_step_s", min_delta=1.0, timed=True),
    Metric("compile", "compile time", "s", "lower", 0.5, "run", "compile_s", min_delta=1.0, timed=True),
    Metric("peak_mem", "peak memory", "MiB", "lower", 0.10, "run", "peak_mem_bytes", min_delta=32.0, scale=2**-20),
    # the peak's parts (tpubench.memory): counted exactly, so a change is the model's or the plan's
    *(
        Metric(f"mem_{part}", f"{label} memory", "MiB", "lower", 0.10, "run", column, min_delta=1.0, scale=2**-20)
        for part, label, column in (
            ("weights", "weights", "mem_weights_bytes"),
            ("grads", "gradients", "mem_grads_bytes"),
            ("optimizer", "optimizer state", "mem_optimizer_bytes"),
            ("activations", "activations", "mem_activations_bytes"),
        )
    ),
    # a counter's delta per token (tpubench.energy); null on both sides without a counter
    Metric("energy_per_token", "energy per token", "mJ", "lower", 0.10, "run", "joules_per_token", scale=1e3),
)
#: per-run statistics of the samples a sampled metric can compare, as quantiles
STATISTICS = {"median": 0.5, "p10": 0.1, "min": 0.0}
METRIC_NAMES = (*(m.name for m in METRICS), "status", "recompiles", "fallback_ops")


@dataclass(frozen=True)
class Settings:
    """What a verdict needs; the defaults are the ones calibration led to (see module doc)."""

    alpha: float = 0.01  # two-sided Mann-Whitney p over the per-run statistics below this
    min_samples: int = 5  # per side, for a sampled metric
    min_runs: int = 5  # per side, for a regressed or improved verdict on a sampled metric
    power: float = 0.95  # of the smallest detectable change that each row reports
    confidence: float = 0.95
    resamples: int = 1000
    seed: int = 0
    thresholds: Mapping[str, float] = field(default_factory=dict)  # metric name -> relative threshold
    #: each run's statistic of its samples: the median, or a low quantile, which contention
    #: (other processes taking the CPU) moves far less: it only ever slows steps down
    statistic: str = "median"

    @property
    def quantile(self) -> float:
        if self.statistic not in STATISTICS:
            raise ValueError(f"unknown statistic {self.statistic!r}; valid: {', '.join(STATISTICS)}")
        return STATISTICS[self.statistic]

    def metric(self, metric: Metric) -> Metric:
        return replace(metric, threshold=self.thresholds[metric.name]) if metric.name in self.thresholds else metric


COLUMNS = [
    *PAIR_KEYS,
    "base_backend",
    "test_backend",
    "base_device",
    "test_device",
    "metric",
    "unit",
    "better",
    "base_value",
    "test_value",
    "ratio",
    "ci_low",
    "ci_high",
    "p_value",
    "spread_pct",
    "detectable_pct",
    "threshold_pct",
    "base_runs",
    "test_runs",
    "base_samples",
    "test_samples",
    "host_busy_runs",
    "env_diff",
    "quality_ok",
    "verdict",
    "reason",
]


#: ``compare --by``: the columns a comparison lets differ between its sides, so that runs
#: pair across them (bf16 against fp8 of one configuration; a precision's dtype with it:
#: fp32 and bf16 are precisions too)
BY = {"precision": ("precision", "dtype"), "attention": ("attention",)}
#: the columns whose differing values a comparison row names in its reason
VARYING = ("precision", "dtype", "attention")


def pair_keys(baseline_runs: pd.DataFrame, candidate_runs: pd.DataFrame, by: str | None = None) -> list[str]:
    """:data:`PAIR_KEYS`, plus backend and device where the two selections share any value,
    less the columns ``by`` lets differ (:data:`BY`)."""
    keys = [key for key in PAIR_KEYS if key not in BY.get(by or "", ())]
    for column in SIDE_KEYS:
        if set(baseline_runs[column].dropna()) & set(candidate_runs[column].dropna()):
            keys.append(column)
    return keys


def _timed(runs: pd.DataFrame) -> pd.DataFrame:
    return runs[~runs["status"].isin(UNTIMED)]


def _group_positions(runs: pd.DataFrame, keys: list[str]) -> dict[tuple, np.ndarray]:
    """The row positions of ``runs`` by ``keys``, in sorted key order with nulls last, as
    ``groupby(dropna=False)`` orders them; a null key value (a dimension the workload does not
    take) is None, so that the same configuration finds itself in another frame (NaN equals
    nothing). Grouped in Python over the key columns' values: a side of a comparison has tens
    of runs, and pandas' groupby over 19 keys cost 15 ms of fixed overhead per call."""
    columns = [[None if pd.isna(value) else value for value in runs[key].tolist()] for key in keys]
    found: dict[tuple, list[int]] = {}
    for position, key in enumerate(zip(*columns, strict=True)):
        found.setdefault(key, []).append(position)
    ordered = sorted(found, key=lambda key: tuple((value is None, value) for value in key))
    return {key: np.asarray(found[key]) for key in ordered}


def _groups(runs: pd.DataFrame, keys: list[str]) -> dict[tuple, pd.DataFrame]:
    """``runs`` by ``keys`` (:func:`_group_positions`)."""
    return {key: runs.iloc[positions] for key, positions in _group_positions(runs, keys).items()}


def _sides(runs: pd.DataFrame, keys: list[str]) -> list[tuple[tuple, pd.DataFrame]]:
    """``runs`` split by the side columns not in ``keys`` (one part when all are keys)."""
    rest = [c for c in SIDE_KEYS if c not in keys]
    return list(_groups(runs, rest).items()) if rest else [((), runs)]


class _Configured:
    """A side's runs, its configurations' row positions, and each configuration's frame, read
    by :func:`configurations` and cut out when a pair first needs one: in one reordering, then
    a slice per configuration (a frame cut per configuration costs 3 ms each, at 150 columns).
    A reader whose pairs come from its cache (the dashboard, as its filters change) keys them
    on the run ids and never cuts the frames: 30 ms of every Compare rerun."""

    def __init__(self, runs: pd.DataFrame, keys: list[str]) -> None:
        self.runs = runs
        groups = _group_positions(configurations(runs, keep=()), keys)
        self.keys, self.positions = list(groups), list(groups.values())

    @cached_property
    def frames(self) -> list[pd.DataFrame]:
        ordered = configurations(self.runs).take(np.concatenate([*self.positions, np.zeros(0, dtype=int)]))
        bounds = np.cumsum([0, *(len(positions) for positions in self.positions)])
        return [ordered.iloc[start:stop] for start, stop in pairwise(bounds)]

    def sides(self) -> dict[tuple, Side]:
        return {key: Side(self, index) for index, key in enumerate(self.keys)}


@dataclass(frozen=True)
class Side:
    """One side's runs of a configuration (the ``index``-th of the side's), as
    :func:`configurations` reads them."""

    configured: _Configured
    index: int

    @property
    def frame(self) -> pd.DataFrame:
        return self.configured.frames[self.index]

    def run_ids(self) -> tuple[str, ...]:
        positions = self.configured.positions[self.index]
        return tuple(sorted(self.configured.runs["run_id"].to_numpy()[positions]))


@dataclass(frozen=True)
class Pair:
    """One configuration of a comparison: its key values and its runs on each side (None on a
    side that did not run it: an unpaired configuration)."""

    identity: dict[str, Any]
    base_side: Side | None
    test_side: Side | None

    @property
    def base(self) -> pd.DataFrame | None:
        return None if self.base_side is None else self.base_side.frame

    @property
    def test(self) -> pd.DataFrame | None:
        return None if self.test_side is None else self.test_side.frame

    def run_ids(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """Each side's run ids, sorted: what the pair's rows depend on, so a cache can key on
        them (read without cutting the sides' frames out)."""
        ids = lambda side: () if side is None else side.run_ids()  # noqa: E731
        return ids(self.base_side), ids(self.test_side)


def pairs(baseline_runs: pd.DataFrame, candidate_runs: pd.DataFrame, keys: list[str]) -> list[Pair]:
    """The configurations of two selections, paired on ``keys``, in the order
    :func:`compare_runs` reports them; runs that measured nothing are left out.

    A 1-device configuration under a plan (``--devices 1,2 --parallel fsdp``'s N = 1) that the
    other side did not run pairs with the other side's plain 1-device runs of the same
    computation, where there are some (:mod:`tpubench.analysis.identity`: the plan applies to
    nothing on one device), so a sweep's night still compares with a night of plain runs;
    the pair keeps the plan's key and its reason names both plans (:func:`_annotated`)."""
    base_groups, test_groups = (_Configured(_timed(runs), keys).sides() for runs in (baseline_runs, candidate_runs))
    order = sorted(set(base_groups) | set(test_groups), key=lambda k: tuple(str(v) for v in k))
    found = {key: [base_groups.get(key), test_groups.get(key)] for key in order}
    if {"devices", "parallel"} <= set(keys):
        devices, plan = keys.index("devices"), keys.index("parallel")
        taken = set()  # (plain key, side) that served a plan's 1-device configuration
        for key, sides in found.items():
            absent = [side is None for side in sides]
            if key[devices] != 1 or key[plan] == "none" or absent.count(True) != 1:
                continue
            missing = absent.index(True)
            plain = (*key[:plan], "none", *key[plan + 1 :])
            partner = found.get(plain, [None, None])[missing]
            if partner is not None:
                sides[missing] = partner
                taken.add((plain, missing))
        for plain, side in taken:  # a plain configuration that paired only as a partner is no unpaired row
            if found[plain][1 - side] is None:
                del found[plain]
    return [Pair(dict(zip(keys, key, strict=True)), base, test) for key, (base, test) in found.items()]


def samples_by_run(steps: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Each run's measured samples (a multi-rank run's are its job's: :func:`job_steps`)."""
    steps = job_steps(steps)
    steps = steps[steps["phase"] == "measure"]
    return {run_id: group for run_id, group in steps.groupby("run_id")}


def compare_pair(
    pair: Pair,
    keys: list[str],
    samples: Mapping[str, pd.DataFrame],
    settings: Settings,
    compiles: pd.DataFrame | None = None,
) -> list[dict[str, Any]]:
    """The rows of :func:`compare_runs` for one configuration. A pair's rows depend on its own
    runs and samples only (each verdict seeds its own generator), so a reader that compares
    overlapping selections (the dashboard, as its filters change) can reuse them."""
    if pair.base is None or pair.test is None:
        present = pair.base if pair.test is None else pair.test
        missing = "candidate" if pair.test is None else "baseline"
        return [_unpaired(pair.identity, side, missing) for _, side in _sides(present, keys)]
    return [
        row
        for _, base_side in _sides(pair.base, keys)
        for _, test_side in _sides(pair.test, keys)
        for row in _compare_pair(pair.identity, base_side, test_side, samples, settings, compiles)
    ]


def compare_runs(
    baseline_runs: pd.DataFrame,
    candidate_runs: pd.DataFrame,
    baseline_steps: pd.DataFrame,
    candidate_steps: pd.DataFrame,
    settings: Settings | None = None,
    keys: list[str] | None = None,
    compiles: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """One row per (pair, metric): values, ratio (candidate / baseline), CI, p-value, verdict and why.

    Runs pair on ``keys`` (default :func:`pair_keys`); several runs of one configuration on a
    side (repeats) are pooled. A configuration on one side only gives an ``unpaired`` row, so
    nothing is left out silently. Runs that measured nothing (unavailable, skipped) are left
    out. The steps frames are :func:`tpubench.store.load_steps` rows (phase ``measure`` is used;
    a multi-rank run's samples are its job's, per step the slowest rank's: :func:`job_steps`);
    one frame holding both sides' steps may be passed as both. ``compiles`` (the candidate
    runs' rows of the compiles table, when captured) lets a compile regression name its cause
    and source line. Columns: :data:`COLUMNS`.
    """
    settings = settings or Settings()
    keys = keys or pair_keys(_timed(baseline_runs), _timed(candidate_runs))  # backend and device: as stored
    # one store's steps, passed as both sides' (the nightly's creep check does), count once:
    # twice over, every sample would be drawn twice and the tests would see twice the evidence
    same = baseline_steps is candidate_steps
    samples = samples_by_run(
        baseline_steps if same else pd.concat([baseline_steps, candidate_steps], ignore_index=True)
    )
    rows = [
        row
        for pair in pairs(baseline_runs, candidate_runs, keys)
        for row in compare_pair(pair, keys, samples, settings, compiles)
    ]
    return pd.DataFrame(rows, columns=COLUMNS)


def _identity(identity: dict[str, Any], base: pd.DataFrame | None, test: pd.DataFrame | None) -> dict[str, Any]:
    row = {key: identity.get(key) for key in PAIR_KEYS}
    for column in SIDE_KEYS:
        row[f"base_{column}"] = base[column].iloc[0] if base is not None else None
        row[f"test_{column}"] = test[column].iloc[0] if test is not None else None
    return row


def _unpaired(identity: dict[str, Any], runs: pd.DataFrame, missing: str) -> dict[str, Any]:
    present = "baseline" if missing == "candidate" else "candidate"
    row = _identity(identity, runs if present == "baseline" else None, runs if present == "candidate" else None)
    row.update(
        metric="-",
        verdict="unpaired",
        reason=f"only in the {present} ({len(runs)} run(s)): no {missing} run with this configuration",
        base_runs=len(runs) if present == "baseline" else 0,
        test_runs=len(runs) if present == "candidate" else 0,
    )
    return row


def _compare_pair(
    identity: dict[str, Any],
    base: pd.DataFrame,
    test: pd.DataFrame,
    samples: Mapping[str, pd.DataFrame],
    settings: Settings,
    compiles: pd.DataFrame | None = None,
) -> list[dict[str, Any]]:
    head = _identity(identity, base, test)
    rows = [{**head, **event} for event in _events(base, test, compiles)]
    base_ok, test_ok = _measured(base), _measured(test)
    if not (base_ok.empty or test_ok.empty):
        rows.extend(_metric_rows(head, base_ok, test_ok, samples, settings))
    return _annotated(rows, base, test, head)


def _measured(runs: pd.DataFrame) -> pd.DataFrame:
    """The runs that measured a step time: ``runs`` itself when all did, as they mostly do
    (filtering a run frame's 150 columns by row is a comparison's costliest pandas step)."""
    measured = runs["median_step_ms"].notna()
    return runs if measured.all() else runs[measured]


def _floats(values: pd.Series) -> np.ndarray:
    """A column's values as floats, NaN where null."""
    return values.to_numpy(dtype=float, na_value=np.nan)


def _known(values: np.ndarray) -> np.ndarray:
    return values[~np.isnan(values)]


def _annotated(rows: list[dict[str, Any]], base: pd.DataFrame, test: pd.DataFrame, head: dict) -> list[dict]:
    """``rows`` with what differs between the two sides' environments named in each reason,
    and, across backends or devices, regression words swapped for difference words."""
    differences = environment_differences(base, test)
    env_text = f"; environment differs: {', '.join(differences)}" if differences else ""
    plans = [set(side["parallel"]) if "parallel" in side else {"none"} for side in (base, test)]
    if plans[0] != plans[1]:  # a plan's 1-device runs against plain ones (pairs)
        named = [" and ".join(sorted(map(str, plan))) for plan in plans]
        env_text += f"; 1-device runs of plan {named[0]} against plan {named[1]} (no plan applies to one device)"
    env_text += "".join(f"; {name} {before} → {after}" for name, before, after in _varying(base, test))
    quality = quality_note(test)  # a faster candidate that no longer computes the same model says so
    env_text += f"; {quality}" if quality else ""
    across = head["base_backend"] != head["test_backend"] or head["base_device"] != head["test_device"]
    sides = f"{head['base_backend']} ({head['base_device']}) → {head['test_backend']} ({head['test_device']})"
    flag = quality_flag(test)
    for row in rows:
        row["env_diff"] = "; ".join(differences) or None
        row["quality_ok"] = flag
        row["reason"] = f"{row.get('reason', '')}{env_text}"
        if across:
            row["verdict"] = ACROSS.get(row["verdict"], row["verdict"])
            row["reason"] = f"across backends, {sides}: a difference, not a regression; {row['reason']}"
    return rows


def _varying(base: pd.DataFrame, test: pd.DataFrame) -> list[tuple[str, str, str]]:
    """The :data:`VARYING` columns whose values differ between the sides (``compare --by``
    paired across them): each with both sides' values in words."""
    found = []
    for column in VARYING:
        if column == "precision":
            values = [set(precision_of(side).dropna()) for side in (base, test)]
        elif column in base and column in test:
            values = [set(side[column].dropna()) for side in (base, test)]
        else:
            continue
        if values[0] != values[1]:
            found.append((column, *(" and ".join(sorted(map(str, side))) or "-" for side in values)))
    return found


def _json_column(runs: pd.DataFrame, column: str) -> list[dict[str, Any]]:
    """Each run's JSON object in ``column`` (an empty one where it is null or unreadable)."""
    found = []
    for text in runs[column].tolist() if column in runs else []:
        try:
            value = json.loads(text) if isinstance(text, str) and text else {}
        except ValueError:
            value = {}
        found.append(value if isinstance(value, dict) else {})
    return found


def _side_value(values: list[Any]) -> str:
    """One side's values of a setting as a reason shows them: ``unset``, the value, or ``a|b``
    when its runs differ among themselves."""
    shown = sorted({"unset" if is_missing(v) else str(v) for v in values})
    return "|".join(shown) if shown else "unset"


def environment_differences(base: pd.DataFrame, test: pd.DataFrame) -> list[str]:
    """What differs between the environments two sides' runs recorded, as ``NAME before → after``:
    the performance-relevant variables (the ``env`` column: threads, XLA and allocator flags,
    see :mod:`tpubench.fingerprint`; ``unset`` where a side lacks one), the backend's versions,
    python, torch, tpubench, the host and its CPU. The git sha is left out (a different build
    is what a comparison is for). Why: a night that ran with ``OMP_NUM_THREADS=1`` was 37%
    slower, and its verdict said nothing of why."""
    differences = []
    for column in ("env", "backend_versions"):
        base_maps, test_maps = _json_column(base, column), _json_column(test, column)
        for key in sorted({k for m in base_maps + test_maps for k in m}):
            before = _side_value([m.get(key) for m in base_maps])
            after = _side_value([m.get(key) for m in test_maps])
            if before != after:
                differences.append(f"{key} {before} → {after}")
    for column in VERSION_COLUMNS:
        if column in base and column in test:
            before, after = _side_value(base[column].tolist()), _side_value(test[column].tolist())
            if before != after:
                differences.append(f"{column} {before} → {after}")
    return differences


def _metric_rows(
    head: dict[str, Any],
    base_ok: pd.DataFrame,
    test_ok: pd.DataFrame,
    samples: Mapping[str, pd.DataFrame],
    settings: Settings,
) -> list[dict[str, Any]]:
    """One row per measured metric of a pair whose sides both have ok runs."""
    rows: list[dict[str, Any]] = []
    busy = sum(int(np.sum(_floats(side["host_other_cpu_share"]) > BUSY_SHARE)) for side in (base_ok, test_ok))
    step_row: dict[str, Any] | None = None
    for metric in (settings.metric(m) for m in METRICS):
        common = {
            **head,
            "metric": metric.name,
            "unit": metric.unit,
            "better": metric.better,
            "threshold_pct": 100 * metric.threshold,
            "base_runs": len(base_ok),
            "test_runs": len(test_ok),
            "host_busy_runs": busy,
        }
        if metric.kind == "sampled":
            base_samples = _samples_of(base_ok, samples, metric.column)
            test_samples = _samples_of(test_ok, samples, metric.column)
            if not base_samples and not test_samples:
                continue  # e.g. TPOT of a train run
            found = sampled_verdict(base_samples, test_samples, metric, settings, busy)
            if metric.name == "step":
                step_row = found
        elif metric.kind == "throughput":
            if step_row is None:
                continue
            found = _throughput(base_ok, test_ok, step_row, metric)
            if found is None:
                continue
        else:
            found = run_verdict(_run_values(base_ok, metric), _run_values(test_ok, metric), metric, settings)
            if found is None:
                continue
        rows.append({**common, **found})
    return rows


def _samples_of(runs: pd.DataFrame, samples: Mapping[str, pd.DataFrame], column: str) -> list[np.ndarray]:
    """Per run, its measured samples of ``column`` (runs without any are left out)."""
    found = []
    for run_id in runs["run_id"]:
        if run_id in samples:
            values = _known(_floats(samples[run_id][column]))
            if values.size:
                found.append(values)
    return found


def _run_values(runs: pd.DataFrame, metric: Metric) -> np.ndarray:
    if metric.column not in runs:  # a frame from before the column existed
        return np.array([])
    return _known(_floats(runs[metric.column])) * metric.scale


def _run_statistics(runs: list[np.ndarray], quantile: float) -> np.ndarray:
    return np.array([np.quantile(r, quantile) for r in runs])


def hierarchical_bootstrap(
    runs: list[np.ndarray], resamples: int, rng: np.random.Generator, quantile: float = 0.5
) -> np.ndarray:
    """``resamples`` bootstrap replicates of the median over runs of each run's ``quantile``
    (0.5: its median): runs are drawn with replacement, then each drawn run's samples. With
    one run it is the plain bootstrap of that run's statistic (and knows nothing of
    between-run noise)."""
    per_run = np.empty((len(runs), resamples))
    for index, values in enumerate(runs):
        drawn = rng.integers(0, values.size, size=(resamples, values.size))
        per_run[index] = _resampled_quantiles(values, drawn, quantile)
    chosen = rng.integers(0, len(runs), size=(resamples, len(runs)))
    return np.median(per_run[chosen, np.arange(resamples)[:, None]], axis=1)


def _resampled_quantiles(values: np.ndarray, drawn: np.ndarray, quantile: float) -> np.ndarray:
    """``np.quantile(values[drawn], quantile, axis=1)``, the same numbers four times as fast.

    Why: a resample's quantile is a function of its values' ranks, so the draws become ranks
    (as int32, which sorts quicker than floats), each resample's ranks are sorted, and only
    the two order statistics the quantile interpolates between are looked up; numpy's own
    interpolation of those two gives its exact result. Partitioning every resample's float
    values was most of a comparison's time (1,000 resamples of each run's 100-400 steps)."""
    order = np.argsort(values, kind="stable")
    ranks = np.empty(values.size, dtype=np.int32)
    ranks[order] = np.arange(values.size, dtype=np.int32)
    drawn_ranks = ranks[drawn]
    drawn_ranks.sort(axis=1)
    position = quantile * (values.size - 1)
    below = int(position)
    bracket = values[order][drawn_ranks[:, [below, min(below + 1, values.size - 1)]]]
    return np.quantile(bracket, position - below, axis=1)


def between_run_sd(base: np.ndarray, test: np.ndarray) -> float | None:
    """Between-run spread of two sides' per-run statistics: the sd of their log, from the median
    absolute deviation of each side about its own median (one stalled run must not make the
    whole night look noisy); None unless each side has two runs."""
    if base.size < 2 or test.size < 2:
        return None
    return _mad_sd(np.log(base), np.log(test))


def _residuals(base: np.ndarray, test: np.ndarray) -> np.ndarray:
    """Both sides' per-run statistics, each side divided by its own median: the between-run
    noise of the two, with whatever change lies between them taken out."""
    return np.concatenate([side / np.median(side) for side in (base, test)])


def _mad_sd(*groups: np.ndarray) -> float:
    """A robust sd: the median absolute deviation of each group about its own median, pooled,
    scaled to a normal sd."""
    deviations = np.concatenate([np.abs(group - np.median(group)) for group in groups])
    return float(np.median(deviations) / NORMAL_Q3)


#: the standard normal's upper quartile (scipy.stats.norm.ppf(0.75)): a MAD over it estimates an sd
NORMAL_Q3 = 0.6744897501960817
#: simulated nights per power estimate: a 95% power is then known to about ±1%
SIMULATIONS = 400


def simulated_power(
    noise: np.ndarray, n_base: int, n_test: int, change: float, settings: Settings, threshold: float
) -> float:
    """The share of simulated comparisons that call a ``change`` (0.10: 10% slower) a
    regression: ``n_base`` and ``n_test`` per-run statistics drawn from ``noise`` (measured
    per-run statistics, or their residuals), the test side ``change`` slower, judged like a
    verdict (the rank test over runs at ``settings.alpha`` and the ratio beyond ``threshold``).

    Why simulate rather than use a normal model: the per-run statistics of a shared host are
    not normal. Calibration found them in several modes (per-run minima clustered at 2.9, 3.4
    and 4.6 ms), which a robust sd sees as a spread of 6% and the rank test as far more: the
    normal model said 10 runs per side catch a 10% slowdown, and 10 caught it in 8 pairs of
    20. Drawing from the measured values themselves predicted the calibration's detection
    rates within a few pairs at every size (docs/regressions.md, "Calibration").
    """
    rng = np.random.default_rng(settings.seed)
    base = _smoothed_draws(noise, (SIMULATIONS, n_base), rng)
    test = _smoothed_draws(noise, (SIMULATIONS, n_test), rng) * (1 + change)
    p_values = mann_whitney_p(test, base)  # as the verdict does, one test per simulated night
    ratios = np.median(test, axis=1) / np.median(base, axis=1)
    return float(np.mean((p_values < settings.alpha) & (ratios > 1 + threshold)))


def _smoothed_draws(values: np.ndarray, shape: tuple[int, int], rng: np.random.Generator) -> np.ndarray:
    """A smoothed bootstrap: ``values`` drawn with replacement, each times a little log-normal
    jitter (Silverman's bandwidth), so that draws do not tie where real runs would not, which
    would weaken the rank test on a handful of runs."""
    logs = np.log(values)
    spread = min(np.std(logs), np.subtract(*np.percentile(logs, [75, 25])) / 1.349) if logs.size > 1 else 0.0
    bandwidth = 0.9 * spread * logs.size ** (-1 / 5)
    return np.exp(rng.choice(logs, size=shape) + bandwidth * rng.standard_normal(shape))


def detectable_change(noise: np.ndarray, n_base: int, n_test: int, settings: Settings, threshold: float) -> float:
    """The smallest relative change that ``n_base`` vs ``n_test`` runs whose per-run statistics
    vary like ``noise`` detect with probability ``settings.power`` (:func:`simulated_power`);
    1.0 when not even a doubling is."""
    if simulated_power(noise, n_base, n_test, 1.0, settings, threshold) < settings.power:
        return 1.0
    low, high = threshold, 1.0  # nothing under the threshold is ever a verdict
    while high - low > 0.0025:
        middle = (low + high) / 2
        if simulated_power(noise, n_base, n_test, middle, settings, threshold) >= settings.power:
            high = middle
        else:
            low = middle
    return high


def runs_needed(noise: np.ndarray, change: float, settings: Settings, threshold: float, most: int) -> int | None:
    """Candidate runs that detect a ``change`` (0.10: 10% slower) with ``settings.power``
    against a baseline whose ok runs had the per-run statistics ``noise``
    (:func:`simulated_power`): at least ``settings.min_runs``; None when ``most`` are not enough."""
    if simulated_power(noise, noise.size, most, change, settings, threshold) < settings.power:
        return None
    low, high = settings.min_runs, most
    while low < high:
        middle = (low + high) // 2
        if simulated_power(noise, noise.size, middle, change, settings, threshold) >= settings.power:
            high = middle
        else:
            low = middle + 1
    return low


def baseline_spread(runs: pd.DataFrame, steps: pd.DataFrame, settings: Settings) -> pd.DataFrame:
    """Per configuration (:data:`PAIR_KEYS`, backend, device) of ``runs``: its ok runs with measured
    steps (``runs``), their between-run spread (``spread``: sd of the log per-run statistic, from
    the median absolute deviation; NaN under three runs) and the per-run statistics themselves
    (``statistics``). What ``tpubench ci --rounds auto`` sizes a night by: the noise model of
    each series, from its last green night."""
    keys = [*PAIR_KEYS, *SIDE_KEYS]
    steps = job_steps(steps)
    measured = steps[steps["phase"] == "measure"].groupby("run_id")["step_ms"]
    statistic = measured.quantile(settings.quantile).rename("statistic")
    ok = configurations(runs[runs["status"] == "ok"]).join(statistic, on="run_id").dropna(subset=["statistic"])
    rows = []
    for key, group in ok.groupby(keys, dropna=False, sort=True):
        statistics = group["statistic"].to_numpy(dtype=float)
        spread = _mad_sd(np.log(statistics)) if statistics.size >= 3 else math.nan
        rows.append(
            {**dict(zip(keys, key, strict=True)), "runs": len(group), "spread": spread, "statistics": statistics}
        )
    return pd.DataFrame(rows, columns=[*keys, "runs", "spread", "statistics"])


def _worse(metric: Metric, ratio: float) -> bool:
    return ratio > 1 if metric.better == "lower" else ratio < 1


def _percent(ratio: float) -> str:
    return f"{100 * (ratio - 1):+.1f}%"


def sampled_verdict(
    base_runs: list[np.ndarray],
    test_runs: list[np.ndarray],
    metric: Metric,
    settings: Settings,
    busy_runs: int = 0,
) -> dict[str, Any]:
    """Values, ratio, CI, p-value, noise bound, verdict and reason for a per-step metric.

    ``base_runs``/``test_runs`` hold each run's raw samples. See the module doc for the rule.
    """
    n_base, n_test = sum(r.size for r in base_runs), sum(r.size for r in test_runs)
    q = settings.quantile
    found: dict[str, Any] = {"base_samples": n_base, "test_samples": n_test}
    if min(n_base, n_test) < settings.min_samples:
        reason = f"too few samples ({n_base} vs {n_test}; need {settings.min_samples})"
        found.update(verdict="inconclusive", reason=reason)
        if n_base and n_test:
            found.update(base_value=_over_runs(base_runs, q), test_value=_over_runs(test_runs, q))
            found["ratio"] = found["test_value"] / found["base_value"]
        return found
    base_statistics, test_statistics = _run_statistics(base_runs, q), _run_statistics(test_runs, q)
    base_value, test_value = float(np.median(base_statistics)), float(np.median(test_statistics))
    ratio = test_value / base_value
    rng = np.random.default_rng(settings.seed)
    replicates = hierarchical_bootstrap(test_runs, settings.resamples, rng, q) / hierarchical_bootstrap(
        base_runs, settings.resamples, rng, q
    )
    tail = 100 * (1 - settings.confidence) / 2
    ci_low, ci_high = (float(v) for v in np.percentile(replicates, [tail, 100 - tail]))
    if len(base_runs) >= 2 and len(test_runs) >= 2:  # runs are the unit of replication
        tested = "runs"
        p_value = float(mann_whitney_p(test_statistics, base_statistics))
    else:  # one run's steps against another's: shown, never a verdict (rule 1)
        tested = "steps"
        p_value = float(mann_whitney_p(np.concatenate(test_runs), np.concatenate(base_runs)))
    sd = between_run_sd(base_statistics, test_statistics)
    detectable = (
        None
        if sd is None
        else detectable_change(
            _residuals(base_statistics, test_statistics), len(base_runs), len(test_runs), settings, metric.threshold
        )
    )
    found.update(
        base_value=base_value,
        test_value=test_value,
        ratio=ratio,
        ci_low=ci_low,
        ci_high=ci_high,
        p_value=p_value,
        spread_pct=None if sd is None else 100 * sd,
        detectable_pct=None if detectable is None else 100 * detectable,
    )
    label = metric.label if settings.statistic == "median" else f"{settings.statistic} {metric.label}"
    runs = f"{len(base_runs)} vs {len(test_runs)} run(s)"
    change = f"{label} {_percent(ratio)} (CI {_percent(ci_low)} .. {_percent(ci_high)}, p={p_value:.2g} over {tested})"
    power = (
        ""
        if detectable is None
        else f"; runs vary ±{100 * sd:.0f}% between themselves, so {runs} detect "
        + (f"≥{100 * detectable:.0f}% reliably" if detectable < 1 else "nothing short of a doubling reliably")
    )
    busy = f"; host busy during {busy_runs} run(s)" if busy_runs else ""
    beyond = ratio >= 1 + metric.threshold or ratio <= 1 / (1 + metric.threshold)
    ci_excludes_one = ci_low > 1 or ci_high < 1
    significant = p_value < settings.alpha and ci_excludes_one
    enough_runs = min(len(base_runs), len(test_runs)) >= settings.min_runs
    if beyond and significant and enough_runs:
        found.update(
            verdict="regressed" if _worse(metric, ratio) else "improved",
            reason=f"{change}, beyond the {100 * metric.threshold:g}% threshold over {runs}{busy}",
        )
    elif beyond:
        why = []
        if not enough_runs:
            why.append(
                f"{runs}: a verdict needs {settings.min_runs} runs per side, since noise between runs is what misleads"
            )
        if p_value >= settings.alpha:
            floor = _rank_floor(len(base_runs), len(test_runs), ratio, settings) if enough_runs else ""
            why.append(f"p >= {settings.alpha:g}{floor}")
        if not ci_excludes_one:
            why.append("the CI includes no change")
        worse = _worse(metric, ratio)
        clears = ci_low >= 1 + metric.threshold if ratio > 1 else ci_high <= 1 / (1 + metric.threshold)
        likely = (
            f"; likely {'a regression' if worse else 'an improvement'}: the whole CI lies beyond the "
            f"{100 * metric.threshold:g}% threshold, and more runs would confirm it"
            if clears and enough_runs
            else "; more runs would tell"
        )
        found.update(verdict="inconclusive", reason=f"{change}: not shown ({'; '.join(why)}){likely}{power}{busy}")
    else:
        found.update(_equivalence(ratio, ci_low, ci_high, len(base_runs), len(test_runs), metric, settings))
        found["reason"] = f"{change}{found['reason']}{power}{busy}"
    return found


def _equivalence(
    ratio: float, ci_low: float, ci_high: float, n_base: int, n_test: int, metric: Metric, settings: Settings
) -> dict[str, str]:
    """The verdict of a change whose point estimate lies within the threshold, and the tail of
    its reason. ``unchanged`` only when the whole CI lies within ±threshold, over at least
    :attr:`Settings.min_runs` runs per side: an equivalence test (what TOST does), so that a
    night whose runs vary too much to tell a 20% change from none is ``inconclusive``, not
    ``unchanged`` (a model whose runs took 5 to 25 ms, the same both nights, read unchanged
    with a CI of -50% .. +100%). With fewer runs the CI does not yet carry the noise between
    runs, which is what misleads on a shared host."""
    bound = 1 + metric.threshold
    threshold = f"the {100 * metric.threshold:g}% threshold"
    within = 1 / bound < ci_low and ci_high < bound
    enough = min(n_base, n_test) >= settings.min_runs
    if within and enough:
        return {"verdict": "unchanged", "reason": f", within {threshold} (the whole CI)"}
    needed = runs_to_decide(ratio, ci_low, ci_high, n_base, n_test, metric.threshold, settings.min_runs)
    if needed is None:
        decide = f"no number of runs would decide it: the change lies on {threshold}"
    elif needed > MOST_RUNS_NAMED:
        decide = f"more than {MOST_RUNS_NAMED} runs per side would be needed to decide it"
    else:
        decide = f"about {needed} runs per side would decide it (the CI narrows as 1/√runs)"
    if not within:
        why = f"within {threshold}, but its CI reaches beyond it, so no change is not shown"
    else:
        why = f"within {threshold}, but {n_base} vs {n_test} run(s): a verdict needs {settings.min_runs} runs per side"
    return {"verdict": "inconclusive", "reason": f": {why}; {decide}"}


#: the most runs per side an inconclusive reason names (beyond it: "more than")
MOST_RUNS_NAMED = 1000


def runs_to_decide(
    ratio: float, ci_low: float, ci_high: float, n_base: int, n_test: int, threshold: float, min_runs: int
) -> int | None:
    """About how many runs per side would bring a CI around ``ratio`` within ±``threshold``,
    the CI's half-widths (in log space) shrinking as 1/√runs, as a bootstrap's over runs does:
    the variance of the log ratio goes as 1/n_base + 1/n_test, which N runs per side make 2/N.
    At least ``min_runs``; None when ``ratio`` itself is not within the threshold (no number of
    runs shows equivalence then)."""
    room = math.log1p(threshold)
    centre = math.log(ratio)
    if abs(centre) >= room:
        return None
    factor = max(math.log(ci_high) - centre, 0.0) / (room - centre)
    factor = max(factor, max(centre - math.log(ci_low), 0.0) / (room + centre))
    needed = 2 * factor**2 / (1 / n_base + 1 / n_test)
    return max(min_runs, math.ceil(needed - 1e-9))  # 20.000000001 is 20


@cache
def rank_test_floor(n_base: int, n_test: int, alpha: float) -> tuple[int, float]:
    """What a two-sided Mann-Whitney test over ``n_base`` vs ``n_test`` runs can show: the most
    of the ``n_base x n_test`` pairs of runs that may be out of order (a candidate run on the
    wrong side of a baseline run) with p still below ``alpha`` (-1: none can), and the best p
    there is (every pair in order), from the exact distribution of U without ties.

    Why: at the minimum of 5 runs per side p < 0.01 is met only by perfect separation (best
    p = 2/252 = 0.0079), so one noisy run turns any change, however large, inconclusive; a
    reason that says so tells the reader what more runs would buy.
    """
    p_values = 2 * np.cumsum(u_counts(n_base, n_test)) / math.comb(n_base + n_test, n_base)
    return int(np.sum(p_values < alpha)) - 1, float(min(1.0, p_values[0]))


def _rank_floor(n_base: int, n_test: int, ratio: float, settings: Settings) -> str:
    """The part of an inconclusive reason that says what the rank test over these runs needs."""
    allowed, best = rank_test_floor(n_base, n_test, settings.alpha)
    order = "slower" if ratio > 1 else "faster"
    runs = f"{n_base} vs {n_test} runs"
    if allowed < 0:
        return f": {runs} cannot reach it (best p = {best:.2g})"
    if allowed == 0:
        return (
            f": at {runs} it needs every candidate run {order} than every baseline run "
            f"(perfect separation: best p = {best:.2g}), so one noisy run hides any change"
        )
    return f": at {runs} it allows at most {allowed} of the {n_base * n_test} pairs of runs out of order"


def _over_runs(runs: list[np.ndarray], quantile: float) -> float:
    """A side's value: the median over its runs of each run's statistic."""
    return float(np.median(_run_statistics(runs, quantile)))


def _throughput(base: pd.DataFrame, test: pd.DataFrame, step: dict[str, Any], metric: Metric) -> dict[str, Any] | None:
    """Throughput is tokens per step ÷ the step time, so its values, ratio, CI and verdict mirror
    step time's (the same statistic, inverted). None for workloads without tokens (images)."""
    column = "output_tokens_per_s" if all(mode == "decode" for mode in base["mode"].tolist()) else metric.column
    if base[column].isna().all() and test[column].isna().all():
        return None

    def tokens_per_step(runs: pd.DataFrame) -> float | None:
        per_step = _known(_floats(runs[column]) * _floats(runs["median_step_ms"]) / 1000)
        return float(np.median(per_step)) if per_step.size else None

    found = {
        "p_value": step.get("p_value"),
        "spread_pct": step.get("spread_pct"),
        "detectable_pct": step.get("detectable_pct"),
        "base_samples": step.get("base_samples"),
        "test_samples": step.get("test_samples"),
        "verdict": step["verdict"],
        "reason": "mirrors step time (tokens per second = tokens per step ÷ step time)",
    }
    for prefix, runs in (("base", base), ("test", test)):
        tokens, step_ms = tokens_per_step(runs), step.get(f"{prefix}_value")
        found[f"{prefix}_value"] = tokens / (step_ms / 1000) if tokens and step_ms else None
    for mine, theirs in {"ratio": "ratio", "ci_low": "ci_high", "ci_high": "ci_low"}.items():
        value = step.get(theirs)
        found[mine] = 1 / value if value else None
    return found


def run_verdict(
    base: np.ndarray, test: np.ndarray, metric: Metric, settings: Settings | None = None
) -> dict[str, Any] | None:
    """Verdict for a quantity measured once per run (first step, compile time, peak memory).

    One value per run allows no test on samples, so the threshold is looser and an absolute
    change is required too. A timed quantity (:attr:`Metric.timed`) decides nothing from a
    few runs: one cold start on a busy host is seconds slower, so a change beyond the
    thresholds is a regression only over :attr:`Settings.min_runs` runs a side with a
    Mann-Whitney p below :attr:`Settings.alpha`, and inconclusive otherwise; so is a change
    within them over fewer runs (unchanged is shown, not assumed). None when either side
    lacks the quantity (compile time of eager).
    """
    settings = settings or Settings()
    if not base.size or not test.size:
        return None
    base_value, test_value = float(np.median(base)), float(np.median(test))
    found: dict[str, Any] = {"base_value": base_value, "test_value": test_value, "base_samples": 0, "test_samples": 0}
    if base_value <= 0:
        found.update(verdict="unchanged" if test_value <= metric.min_delta else "regressed")
        found["reason"] = f"{metric.label} {base_value:g} -> {test_value:g} {metric.unit}"
        return found
    ratio = test_value / base_value
    found["ratio"] = ratio
    relative = ratio >= 1 + metric.threshold or ratio <= 1 / (1 + metric.threshold)
    absolute = abs(test_value - base_value) >= metric.min_delta
    beyond = relative and absolute
    text = f"{metric.label} {base_value:.3g} -> {test_value:.3g} {metric.unit} ({_percent(ratio)})"
    where = _against_thresholds(metric, relative, absolute)
    if metric.timed and min(base.size, test.size) < settings.min_runs:
        found.update(
            verdict="inconclusive",
            reason=f"{text}, {where}, but {base.size} and {test.size} run(s) cannot tell a change from a "
            f"busy host's noise: a timing needs {settings.min_runs} runs a side",
        )
    elif metric.timed and beyond:
        p = float(mann_whitney_p(test, base))
        found["p_value"] = p
        decided = p < settings.alpha
        found.update(
            verdict=("regressed" if _worse(metric, ratio) else "improved") if decided else "inconclusive",
            reason=f"{text}, {where}, Mann-Whitney p {p:.2g} over the runs"
            + ("" if decided else f" (not below {settings.alpha:g}: the runs overlap)"),
        )
    elif beyond:
        found.update(
            verdict="regressed" if _worse(metric, ratio) else "improved",
            reason=f"{text}, {where} (one value per run: no test)",
        )
    else:
        found.update(verdict="unchanged", reason=f"{text}, {where}")
    return found


def _against_thresholds(metric: Metric, relative: bool, absolute: bool) -> str:
    """Where a once-per-run change lies against its metric's thresholds, in words. A change
    counts only beyond both, the relative one and :attr:`Metric.min_delta`; one crossed and
    not the other is named as such (a first step 48% quicker by 0.03 s read as "within the
    50% and 1 s thresholds")."""
    percent = f"{100 * metric.threshold:g}%"
    if not metric.min_delta:
        return f"{'beyond' if relative else 'within'} the {percent} threshold"
    delta = f"{metric.min_delta:g} {metric.unit}"
    if relative == absolute:
        return f"{'beyond' if relative else 'within'} the {percent} and {delta} thresholds"
    crossed, not_crossed = (percent, delta) if relative else (delta, percent)
    return f"beyond the {crossed} threshold, not the {not_crossed} one"


def _fallback_ops(runs: pd.DataFrame) -> set[str]:
    found: set[str] = set()
    for text in runs["fallback_ops"].tolist():
        if not is_missing(text) and text:
            found.update(json.loads(text))
    return found


def _events(base: pd.DataFrame, test: pd.DataFrame, compiles: pd.DataFrame | None = None) -> Iterable[dict[str, Any]]:
    """Rows for what regresses whatever the numbers: a worse status, new or more recompilations
    (named by their commonest cause and line when ``compiles`` holds the candidate's rows), new
    CPU fallbacks."""
    common = {"base_runs": len(base), "test_runs": len(test), "unit": "", "better": ""}
    # read as lists: filtering a run frame (150 columns) by row costs a comparison far more
    base_bad = sorted(set(base["status"].tolist()) & BAD_STATUSES)
    test_statuses = test["status"].tolist()
    test_bad = [status for status in test_statuses if status in BAD_STATUSES]
    if test_bad and not base_bad:
        status = test_bad[0]
        errors = [
            error
            for status_of, error in zip(test_statuses, test["error"].tolist(), strict=True)
            if status_of in BAD_STATUSES and not is_missing(error)
        ]
        yield {
            **common,
            "metric": "status",
            "verdict": "regressed",
            "reason": f"ok -> {status} in {len(test_bad)} of {len(test)} run(s)"
            + (f": {str(errors[0]).splitlines()[0][:200]}" if errors else ""),
        }
    elif base_bad and not test_bad:
        yield {**common, "metric": "status", "verdict": "improved", "reason": f"{', '.join(base_bad)} -> ok"}
    elif base_bad:
        yield {
            **common,
            "metric": "status",
            "verdict": "unchanged",
            "reason": f"still not ok: {', '.join(base_bad)} -> {', '.join(sorted(set(test_bad)))}",
        }
    base_recompiles = base["recompiles_after_warmup"].fillna(0).max()
    test_recompiles = test["recompiles_after_warmup"].fillna(0).max()
    if test_recompiles > 0 and not test_recompiles <= base_recompiles:
        before = f"{int(base_recompiles)} in the baseline" if base_recompiles > 0 else "none in the baseline"
        why = None
        if compiles is not None and not compiles.empty:
            why = top_cause(compiles[compiles["run_id"].isin(test["run_id"])])
        yield {
            **common,
            "metric": "recompiles",
            "base_value": float(base_recompiles),
            "test_value": float(test_recompiles),
            "verdict": "regressed",
            "reason": f"{int(test_recompiles)} compilation(s) after warm-up, {before}" + (f": {why}" if why else ""),
        }
    new_fallbacks = _fallback_ops(test) - _fallback_ops(base)
    if new_fallbacks:
        yield {
            **common,
            "metric": "fallback_ops",
            "verdict": "regressed",
            "reason": f"new CPU-fallback op(s): {', '.join(sorted(new_fallbacks))}",
        }


def verdict_counts(comparison: pd.DataFrame) -> dict[str, int]:
    """How many rows of a :func:`compare_runs` frame got each verdict (every verdict named)."""
    counts = comparison["verdict"].value_counts()
    return {verdict: int(counts.get(verdict, 0)) for verdict in VERDICTS}


def undecided(comparison: pd.DataFrame, min_runs: int | None = None) -> pd.DataFrame:
    """The rows of a :func:`compare_runs` frame that decided nothing: ``inconclusive`` ones, and
    per-step rows (step time, TTFT, TPOT) with fewer than ``min_runs`` runs on a side (default
    :attr:`Settings.min_runs`), which could not have shown a regression whatever they measured."""
    min_runs = Settings().min_runs if min_runs is None else min_runs
    sampled = comparison["metric"].isin([m.name for m in METRICS if m.kind == "sampled"])
    few = sampled & (comparison[["base_runs", "test_runs"]].min(axis=1) < min_runs)
    return comparison[(comparison["verdict"] == "inconclusive") | few].reset_index(drop=True)


def overall_verdict(comparison: pd.DataFrame, min_runs: int | None = None) -> str:
    """A whole comparison in one of :data:`OVERALL`: ``regressed`` when any row regressed;
    ``inconclusive`` when none did but some row decided nothing (:func:`undecided`), so a night
    of too few runs never reads "no regression"; ``nothing compared`` when no configuration
    paired; else ``no regression``. The headline of ``tpubench ci``, the reports and the dashboard."""
    if (comparison["verdict"] == "regressed").any():
        return "regressed"
    if comparison.empty or (comparison["verdict"] == "unpaired").all():
        return "nothing compared"
    if not undecided(comparison, min_runs).empty:
        return "inconclusive"
    return "no regression"


def overall_reason(comparison: pd.DataFrame, min_runs: int | None = None) -> str:
    """Why :func:`overall_verdict` is ``inconclusive``, in words ("" otherwise)."""
    if overall_verdict(comparison, min_runs) != "inconclusive":
        return ""
    min_runs = Settings().min_runs if min_runs is None else min_runs
    rows = undecided(comparison, min_runs)
    fewest = int(rows[["base_runs", "test_runs"]].min(axis=1).min())
    text = f"no regression shown, and {len(rows)} row(s) decided nothing"
    if fewest < min_runs:
        text += f": {fewest} run(s) on a side, and a verdict needs {min_runs} per side"
    return text + "; more runs would tell"


def regressions(comparison: pd.DataFrame) -> pd.DataFrame:
    """The regressed rows of a :func:`compare_runs` frame."""
    return comparison[comparison["verdict"] == "regressed"].reset_index(drop=True)


CROSS_COLUMNS = [
    *PAIR_KEYS,
    "base_backend",
    "test_backend",
    "base_device",
    "test_device",
    "base_step_ms",
    "test_step_ms",
    "speedup",
    "base_mfu",
    "test_mfu",
    "base_mfu_attained",
    "test_mfu_attained",
    "base_ceiling_low",
    "test_ceiling_low",
    "base_tokens_per_s",
    "test_tokens_per_s",
    "base_usd_per_hour",
    "test_usd_per_hour",
    "base_tokens_per_usd",
    "test_tokens_per_usd",
    "cost_ratio",
    "base_joules_per_token",
    "test_joules_per_token",
    "caveat",
]


def busy_caveat(base: pd.DataFrame, test: pd.DataFrame) -> str | None:
    """What a speed-up rests on when runs of either side were measured on a busy host (other
    processes used the CPUs: :func:`tpubench.hostload.is_busy`); None when neither was."""
    parts = []
    for name, runs in (("baseline", base), ("candidate", test)):
        busy = int(runs["host_other_cpu_share"].map(is_busy).sum())
        if busy:
            parts.append(f"host busy during {busy} of {len(runs)} {name} run(s)")
    if not parts:
        return None
    return "; ".join(parts) + ": its step times may be inflated, and the speed-up with them"


def _median_or_none(values: pd.Series | None) -> float | None:
    """The median of the known values; None where the column is absent or all null."""
    return float(values.median()) if values is not None and values.notna().any() else None


def _energy_pair(base: pd.DataFrame, test: pd.DataFrame) -> dict[str, float | None]:
    """Each side's median measured joules per token, both or neither: an estimate never
    stands in for a side without a counter (energy_source none)."""
    found = {}
    for prefix, runs in (("base", base), ("test", test)):
        if "joules_per_token" not in runs:
            return {}
        measured = runs.loc[runs["energy_source"].isin(["nvml_counter", "rapl"]), "joules_per_token"].dropna()
        found[f"{prefix}_joules_per_token"] = float(measured.median()) if len(measured) else None
    return found if all(value is not None for value in found.values()) else {}


def cross_backend(baseline_runs: pd.DataFrame, candidate_runs: pd.DataFrame, prices: Mapping[str, Any]) -> pd.DataFrame:
    """GPU against TPU (any two backends or devices): per configuration, each side's median step,
    the speedup (baseline step ÷ candidate step), MFU (and ``mfu_attained`` where the runs
    carry it: :func:`tpubench.analysis.ceilings.attach_attained`), tokens/s, the device's price per hour
    (:mod:`tpubench.analysis.prices`) and tokens per dollar; ``cost_ratio`` is the candidate's
    tokens per dollar over the baseline's (above 1: the candidate is cheaper per token).
    Beside the price, each side's measured energy per token (a counter's delta,
    :mod:`tpubench.energy`), only when both sides measured it. Only ok runs count; repeats
    are pooled by their median. Columns: :data:`CROSS_COLUMNS`.
    """
    from tpubench.analysis.prices import device_kind, device_price

    def side(runs: pd.DataFrame, prefix: str) -> dict[str, Any]:
        backend, device = runs["backend"].iloc[0], runs["device"].iloc[0]
        tokens = runs["output_tokens_per_s"] if (runs["mode"] == "decode").all() else runs["tokens_per_s"]
        tokens_per_s = float(tokens.median()) if tokens.notna().any() else None
        price = device_price(device, device_kind(backend, device), prices)
        # a run above its measured ceiling says the ceiling was measured low: no side's figure then
        low = bool(runs["ceiling_low"].eq(True).any()) if "ceiling_low" in runs else False
        return {
            f"{prefix}_step_ms": float(runs["median_step_ms"].median()),
            f"{prefix}_mfu": float(runs["mfu"].median()) if runs["mfu"].notna().any() else None,
            # against the measured ceiling, where the runs were read with one (analysis.ceilings)
            f"{prefix}_mfu_attained": None if low else _median_or_none(runs.get("mfu_attained")),
            f"{prefix}_ceiling_low": low,
            f"{prefix}_tokens_per_s": tokens_per_s,
            f"{prefix}_usd_per_hour": price,
            f"{prefix}_tokens_per_usd": tokens_per_s * 3600 / price if price and tokens_per_s else None,
        }

    ok = [
        configurations(runs[(runs["status"] == "ok") & runs["median_step_ms"].notna()])
        for runs in (baseline_runs, candidate_runs)
    ]
    keys = list(PAIR_KEYS)
    base_groups, test_groups = _groups(ok[0], keys), _groups(ok[1], keys)
    rows = []
    for key in sorted(set(base_groups) & set(test_groups), key=lambda k: tuple(str(v) for v in k)):
        identity = dict(zip(keys, key, strict=True))
        for _, base in _sides(base_groups[key], keys):
            for _, test in _sides(test_groups[key], keys):
                row = {**_identity(identity, base, test), **side(base, "base"), **side(test, "test")}
                row["speedup"] = row["base_step_ms"] / row["test_step_ms"]
                base_per_usd, test_per_usd = row["base_tokens_per_usd"], row["test_tokens_per_usd"]
                row["cost_ratio"] = test_per_usd / base_per_usd if base_per_usd and test_per_usd else None
                row["caveat"] = busy_caveat(base, test)
                row |= _energy_pair(base, test)
                rows.append(row)
    return pd.DataFrame(rows, columns=CROSS_COLUMNS)
