"""The regression statistics on small hand-built frames: verdicts, selectors, change points, prices, reports.

Real stores written by `tpubench run` are exercised in test_regression_cli.py; here the
inputs are constructed so that the right answer is known.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from reports import build_report, html, markdown
from reports.pytorch_benchmark import records
from tpubench.analysis import changepoints, compare, identity, prices
from tpubench.analysis.select import NoRunsMatch, SelectorError, select_runs
from tpubench.analysis.steps import job_steps
from tpubench.schema import RUNS, STEPS

RNG = np.random.default_rng(7)


@pytest.fixture(autouse=True)
def seeded_samples() -> None:
    """Each test draws the same samples whatever ran before it in its process: xdist hands
    tests out in any order, and one generator for the module made a test's data (and a
    verdict near its threshold) depend on that order."""
    global RNG
    RNG = np.random.default_rng(7)


def runs_frame(rows: list[dict]) -> pd.DataFrame:
    """Runs-table rows with every column of the schema (null where not given)."""
    defaults = {
        "workload": "gpt2",
        "size": "tiny",
        "mode": "infer",
        "dtype": "float32",
        "batch_size": 4,
        "seq_len": 128,
        "gen_len": 0,
        "backend": "cpu",
        "device": "AMD EPYC",
        "status": "ok",
        "suite": "llm",
        "host": "h",
        "git_sha": "abc123",
        "tags": "{}",
        "host_other_cpu_share": 0.01,
        "devices": 1,  # one device, as every row loads (store.upgrade fills rows from before --devices)
        "parallel": "none",
        "tp_size": 1,
        "hosts": 1,  # one host, as every row loads (store.upgrade fills it too)
    }
    frame = pd.DataFrame([{**defaults, **row} for row in rows])
    for name in RUNS.names:
        if name not in frame:
            frame[name] = None
    frame["started_at"] = pd.to_datetime(frame["started_at"], utc=True)
    return frame[RUNS.names]


def side(label: str, medians: list[float], spread: float = 0.01, n: int = 40, **extra) -> tuple[list[dict], list[dict]]:
    """Runs (one per median) and their measured steps, samples around each median."""
    runs, steps = [], []
    for index, median in enumerate(medians):
        run_id = f"{label}{index}"
        samples = median * (1 + spread * RNG.standard_normal(n))
        runs.append(
            {
                "run_id": run_id,
                "invocation_id": f"inv-{label}",
                "started_at": f"2026-11-{10 + index:02d}T00:00:00Z",
                "median_step_ms": float(np.median(samples)),
                "tokens_per_s": 512 / float(np.median(samples)) * 1000,
                **extra,
            }
        )
        steps += [{"run_id": run_id, "phase": "measure", "step": i, "step_ms": float(v)} for i, v in enumerate(samples)]
    return runs, steps


def steps_frame(rows: list[dict]) -> pd.DataFrame:
    frame = pd.DataFrame(rows)
    for name in STEPS.names:
        if name not in frame:
            frame[name] = None
    return frame


def compared(base: tuple, test: tuple, **settings) -> pd.DataFrame:
    return compare.compare_runs(
        runs_frame(base[0]),
        runs_frame(test[0]),
        steps_frame(base[1]),
        steps_frame(test[1]),
        compare.Settings(**settings),
    )


def step_row(frame: pd.DataFrame) -> dict:
    return frame[frame["metric"] == "step"].iloc[0].to_dict()


def test_same_code_repeated_is_unchanged():
    row = step_row(compared(side("a", [10.0, 10.1, 9.9, 10.0, 10.02]), side("b", [10.05, 9.95, 10.0, 9.98, 10.03])))
    assert row["verdict"] == "unchanged" and "within the 5% threshold (the whole CI)" in row["reason"]
    assert 1 / 1.05 < row["ci_low"] < 1 < row["ci_high"] < 1.05


def test_unchanged_needs_the_whole_ci_within_the_threshold():
    """Runs of 5, 10, 15, 20 and 25 ms on both nights: the medians agree, but a CI of about
    -50% .. +100% cannot tell a 20% slowdown from none. That is inconclusive, and the reason
    says about how many runs per side would decide it; never unchanged, never "no regression"."""
    spread = [5.0, 10.0, 15.0, 20.0, 25.0]
    frame = compared(side("a", spread), side("b", spread[::-1]))
    row = step_row(frame)
    assert row["verdict"] == "inconclusive" and "more than 1000 runs per side would be needed" in row["reason"]
    assert compare.overall_verdict(frame) == "inconclusive"
    # ±10% between runs: a handful more runs would do
    frame = compared(side("a", [9.0, 9.5, 10.0, 10.5, 11.0]), side("b", [9.1, 9.4, 10.0, 10.6, 10.9]))
    row = step_row(frame)
    assert 1 / 1.05 < row["ratio"] < 1.05 and (row["ci_low"] < 1 / 1.05 or row["ci_high"] > 1.05)
    assert row["verdict"] == "inconclusive", row["reason"]
    assert "within the 5% threshold, but its CI reaches beyond it" in row["reason"]
    needed = compare.runs_to_decide(row["ratio"], row["ci_low"], row["ci_high"], 5, 5, 0.05, 5)
    assert needed > 5 and f"about {needed} runs per side would decide it" in row["reason"]
    assert compare.overall_verdict(frame) == "inconclusive"
    # fewer runs than a verdict needs: not unchanged however tight the CI, and the reason says so
    few = step_row(compared(side("a", BASE[:3]), side("b", BASE[:3])))
    assert few["verdict"] == "inconclusive" and "3 vs 3 run(s): a verdict needs 5 runs per side" in few["reason"]


def test_runs_to_decide_scales_the_ci_as_one_over_root_runs():
    """A CI twice as wide as the room left to the threshold needs four times the runs."""
    room = math.log(1.05)
    assert compare.runs_to_decide(1.0, math.exp(-2 * room), math.exp(2 * room), 5, 5, 0.05, 5) == 20
    assert compare.runs_to_decide(1.0, 0.99, 1.01, 5, 5, 0.05, 5) == 5  # already narrow: the minimum
    assert compare.runs_to_decide(1.06, 1.0, 1.1, 5, 5, 0.05, 5) is None  # beyond: no number of runs


BASE = [10.0, 10.1, 9.9, 10.05, 9.95, 10.0]


def test_a_real_slowdown_over_repeats_regresses_and_says_why():
    frame = compared(side("a", BASE), side("b", [1.2 * m for m in BASE]))
    row = step_row(frame)
    assert row["verdict"] == "regressed"
    assert row["ratio"] == pytest.approx(1.2, rel=0.02)
    assert row["ci_low"] > 1 and row["p_value"] < 0.01
    assert "beyond the 5% threshold over 6 vs 6 run(s)" in row["reason"] and "step time +2" in row["reason"]
    throughput = frame[frame["metric"] == "throughput"].iloc[0]
    assert throughput["verdict"] == "regressed" and throughput["ratio"] < 1


def test_faster_is_improved():
    assert step_row(compared(side("a", BASE), side("b", [0.8 * m for m in BASE])))["verdict"] == "improved"


def test_five_runs_per_side_are_the_fewest_for_a_verdict():
    """A rank test over 4 vs 4 runs cannot reach p < 0.01 however clear the change; 5 vs 5 can."""
    four = step_row(compared(side("a", BASE[:4]), side("b", [1.2 * m for m in BASE[:4]])))
    assert four["verdict"] == "inconclusive" and "a verdict needs 5 runs per side" in four["reason"]
    assert step_row(compared(side("a", BASE[:5]), side("b", [1.2 * m for m in BASE[:5]])))["verdict"] == "regressed"


def test_at_five_runs_the_reason_says_a_rank_test_needs_perfect_separation():
    """At 5 vs 5 runs p < 0.01 is met only when every candidate run is slower
    than every baseline run (exact p = 2/252). One slow baseline run just above one fast
    candidate run keeps a +70% change inconclusive, and the reason says why, and that the CI,
    wholly beyond the threshold, makes it a likely regression."""
    base, test = [10.0, 10.1, 9.9, 10.05, 12.5], [17.0, 17.1, 16.9, 17.05, 12.4]
    row = step_row(compared(side("a", base, spread=0.002), side("b", test, spread=0.002)))
    assert row["verdict"] == "inconclusive" and row["p_value"] >= 0.01
    assert (
        "needs every candidate run slower than every baseline run (perfect separation: best p = 0.0079)"
        in (row["reason"])
    )
    assert row["ci_low"] >= 1.05 and "likely a regression: the whole CI lies beyond the 5% threshold" in row["reason"]
    # the floor itself, against scipy's exact test: the most out-of-order pairs with p < 0.01
    for n, m in ((3, 3), (4, 4), (5, 5), (4, 6), (6, 6), (7, 9)):
        allowed, best = compare.rank_test_floor(n, m, 0.01)
        for u in range(min(n * m, allowed + 3)):
            below = [min(n, max(0, u - n * j)) for j in range(m)]  # candidate j below this many baseline runs
            test_values = [n - k - 0.5 + 0.01 * j for j, k in enumerate(below)]
            p = stats.mannwhitneyu(test_values, np.arange(n, dtype=float), method="exact").pvalue
            assert (p < 0.01) == (u <= allowed), (n, m, u, p, allowed)
        assert best == pytest.approx(2 / math.comb(n + m, n))


def test_a_night_that_decided_nothing_is_inconclusive_never_no_regression():
    """2 vs 2 runs cannot show a regression, so a comparison of them reads
    "inconclusive", whether its step rows came out inconclusive or within the threshold."""
    slower = compared(side("a", BASE[:2]), side("b", [1.37 * m for m in BASE[:2]]))
    assert compare.overall_verdict(slower) == "inconclusive"
    assert "2 run(s) on a side, and a verdict needs 5 per side" in compare.overall_reason(slower)
    same = compared(side("a", BASE[:2]), side("b", BASE[:2]))
    assert step_row(same)["verdict"] == "inconclusive" and compare.overall_verdict(same) == "inconclusive"
    assert compare.overall_verdict(compared(side("a", BASE), side("b", BASE))) == "no regression"
    assert compare.overall_verdict(compared(side("a", BASE), side("b", [1.2 * m for m in BASE]))) == "regressed"
    report = build_report(runs_frame(side("b", BASE[:2])[0]), comparison=slower, baseline="night1")
    assert "**Inconclusive** (no regression shown" in markdown.render(report)
    assert "No regression" not in markdown.render(report) and "<b>Inconclusive</b>" in html.render(report)


def test_a_differing_environment_is_named_in_the_reason():
    """The slow night ran with OMP_NUM_THREADS=1 and a newer torch; say so."""
    base = side("a", BASE, env='{"TORCH_X": "1"}', torch_version="2.13.0")
    test = side("b", [1.2 * m for m in BASE], env='{"OMP_NUM_THREADS": "1", "TORCH_X": "1"}', torch_version="2.14.0")
    row = step_row(compared(base, test))
    assert "environment differs: OMP_NUM_THREADS unset → 1, torch_version 2.13.0 → 2.14.0" in row["reason"]
    assert row["env_diff"] == "OMP_NUM_THREADS unset → 1; torch_version 2.13.0 → 2.14.0"
    assert "environment differs" not in step_row(compared(side("a", BASE), side("b", BASE)))["reason"]


def test_across_backends_a_difference_is_not_a_regression():
    """A compiled backend's first step or another chip's speed is expected to
    differ: across backends the verdicts are worse/better, never regressed, so
    --fail-on-regression does not fail a GPU-against-TPU comparison."""
    eager = side("a", BASE, first_step_s=0.11)
    compiled = side("b", [2 * m for m in BASE], backend="cpu-compile", first_step_s=37.98)
    frame = compared(eager, compiled)
    verdicts = frame.set_index("metric")["verdict"]
    assert verdicts["first_step"] == verdicts["step"] == "worse" and "regressed" not in set(verdicts)
    assert frame.set_index("metric")["reason"]["first_step"].startswith("across backends, cpu (AMD EPYC) → cpu-compile")
    assert compare.overall_verdict(frame) == "no regression"


def test_one_stalled_run_does_not_decide_the_verdict():
    """Ranks over runs: one baseline run in ten stalled to 3x (another process took the CPU)
    neither hides a real 12% slowdown nor makes the night's spread look huge."""
    clean = [*BASE, 10.02, 9.97, 10.03, 9.98]
    row = step_row(compared(side("a", [*clean[:9], 30.0]), side("b", [1.12 * m for m in clean])))
    assert row["verdict"] == "regressed"
    assert row["spread_pct"] < 10


def test_a_low_quantile_sees_through_contention():
    """Other processes only ever slow steps down: a few runs with a heavy right tail of slowed
    steps hide a 10% slowdown from the median but not from the minimum."""

    def contended(label: str, base_ms: float) -> tuple[list[dict], list[dict]]:
        runs, steps = side(label, [base_ms] * 6, spread=0.005)
        for step in steps:  # half the steps of each run slowed by 1-4x
            if step["step"] % 2:
                step["step_ms"] *= 1 + 3 * RNG.random()
        return runs, steps

    base, test = contended("a", 10.0), contended("b", 11.0)
    assert step_row(compared(base, test, statistic="min"))["verdict"] == "regressed"
    assert step_row(compared(base, test, statistic="min"))["reason"].startswith("min step time +10")
    with pytest.raises(ValueError, match="unknown statistic"):
        compared(base, test, statistic="mean")


def test_one_run_per_side_is_never_a_verdict():
    """The issue's case: identical runs gave 7.79 and 4.60 ms medians with tight samples. A test
    on one run's samples against another's is 'significant'; between-run noise is unknown."""
    row = step_row(compared(side("a", [4.60]), side("b", [7.79])))
    assert row["p_value"] < 1e-6
    assert row["verdict"] == "inconclusive"
    assert "runs per side" in row["reason"]


def test_a_change_inside_the_between_run_noise_is_inconclusive():
    """Tight samples, but run medians that wander by 15%: a 10% shift is not shown, and the row
    says how large a change these runs could have shown."""
    wandering = [10.0, 11.5, 8.7, 10.8, 9.2, 11.9]
    row = step_row(compared(side("a", wandering), side("b", [1.1 * m for m in reversed(wandering)])))
    assert row["verdict"] == "inconclusive"
    assert "p >= 0.01" in row["reason"] and "vary ±" in row["reason"]
    assert row["detectable_pct"] > 10


def lognormal(sd: float, n: int = 200) -> np.ndarray:
    return np.exp(sd * np.random.default_rng(1).standard_normal(n))


def test_more_runs_detect_smaller_changes():
    """The detectable change shrinks with the runs: calibration's spread (0.157) needs about 50
    runs per side for 10%; five runs of a quiet chip detect less than 10%."""
    settings, noisy = compare.Settings(), lognormal(0.157)
    few, many = (compare.detectable_change(noisy, n, n, settings, 0.05) for n in (5, 50))
    assert few > 0.4 and 0.09 < many < 0.16
    assert compare.detectable_change(lognormal(0.02), 5, 5, settings, 0.05) < 0.10


def test_runs_in_several_modes_need_more_runs_than_their_robust_spread_says():
    """What calibration found on this host: per-run statistics in modes (most runs at one
    speed, a quarter a third slower, a few faster). The median absolute deviation sees only
    the main mode, a normal model with that spread promises a 10% catch from about ten runs,
    and the replayed comparisons (what the rank test really does with such runs) need many
    more, as the calibration's pairs did."""
    rng = np.random.default_rng(2)
    modes = rng.choice([1.0, 1.33, 0.85], p=[0.7, 0.25, 0.05], size=300) * np.exp(0.03 * rng.standard_normal(300))
    settings = compare.Settings()
    robust_sd = compare._mad_sd(np.log(modes))
    as_if_normal = compare.runs_needed(lognormal(robust_sd), 0.10, settings, 0.05, 200)
    as_measured = compare.runs_needed(modes, 0.10, settings, 0.05, 200)
    assert as_if_normal is not None and as_measured is not None
    assert as_measured > 2 * as_if_normal


def test_too_few_samples_is_inconclusive():
    row = step_row(compared(side("a", [10.0, 10.0], n=2), side("b", [20.0, 20.0], n=2)))
    assert row["verdict"] == "inconclusive" and "too few samples" in row["reason"]


def test_status_recompiles_and_fallbacks_always_regress():
    base = side("a", [10.0, 10.0], fallback_ops='{"aten::nonzero": 2}', recompiles_after_warmup=0)
    test_runs, test_steps = side("b", [10.0], fallback_ops='{"aten::nonzero": 2, "aten::bincount": 1}')
    test_runs[0]["recompiles_after_warmup"] = 3
    test_runs.append({"run_id": "b9", "status": "failed", "error": "RuntimeError: boom\ntrace"})
    frame = compared(base, (test_runs, test_steps))
    verdicts = frame.set_index("metric")["verdict"]
    assert verdicts["status"] == verdicts["recompiles"] == verdicts["fallback_ops"] == "regressed"
    reasons = frame.set_index("metric")["reason"]
    assert "ok -> failed in 1 of 2" in reasons["status"] and "boom" in reasons["status"]
    assert "aten::bincount" in reasons["fallback_ops"] and "aten::nonzero" not in reasons["fallback_ops"]


def test_a_status_bad_on_both_sides_is_still_not_ok_and_a_fixed_one_improved():
    base_runs, base_steps = side("a", [10.0, 10.0])
    base_runs.append({"run_id": "a9", "status": "oom", "error": None})
    still_runs, still_steps = side("b", [10.0])
    still_runs.append({"run_id": "b9", "status": "crashed", "error": None})
    still = compared((base_runs, base_steps), (still_runs, still_steps)).set_index("metric")
    assert still.loc["status", "verdict"] == "unchanged"
    assert still.loc["status", "reason"].startswith("still not ok: oom -> crashed")
    fixed = compared((base_runs, base_steps), side("c", [10.0, 10.0])).set_index("metric")
    assert fixed.loc["status", "verdict"] == "improved" and fixed.loc["status", "reason"].startswith("oom -> ok")


@pytest.mark.parametrize("quantile", [0.0, 0.1, 0.5])
@pytest.mark.parametrize("size", [1, 2, 7, 105])
def test_the_bootstrap_takes_numpys_quantiles_of_the_same_resamples(size: int, quantile: float) -> None:
    # ties too: a run's step times repeat at a timer's resolution
    values = np.round(np.random.default_rng(size).gamma(4.0, 2.5, size), 1)
    drawn = np.random.default_rng(0).integers(0, size, size=(1000, size))
    expected = np.quantile(values[drawn], quantile, axis=1)
    assert np.array_equal(compare._resampled_quantiles(values, drawn, quantile), expected)


def test_unpaired_configurations_are_listed():
    base = side("a", [10.0, 10.0])
    other_runs, other_steps = side("b", [10.0, 10.0], batch_size=8)
    frame = compared(base, (other_runs, other_steps))
    assert list(frame["verdict"]) == ["unpaired", "unpaired"]
    assert {"only in the baseline", "only in the candidate"} <= {r.split(" (")[0] for r in frame["reason"]}


def test_unavailable_runs_are_left_out():
    base = side("a", [10.0, 10.0])
    frame = compared(base, ([{"run_id": "x", "status": "unavailable"}], []))
    assert list(frame["verdict"]) == ["unpaired"]  # the baseline's configuration, nothing to compare with


def test_backend_pairs_only_when_the_selections_share_one():
    base = runs_frame(side("a", [10.0])[0])
    same = runs_frame(side("b", [10.0])[0])
    tpu = runs_frame(side("c", [10.0], backend="xla", device="TPU v5 lite")[0])
    assert "backend" in compare.pair_keys(base, same)
    assert {"backend", "device"}.isdisjoint(compare.pair_keys(base, tpu))


def test_run_level_metrics_need_an_absolute_change_too():
    metric = next(m for m in compare.METRICS if m.name == "peak_mem")
    mib = 2**20
    assert compare.run_verdict(np.array([1.0]), np.array([3.0]), metric)["verdict"] == "unchanged"  # +200%, 2 bytes
    assert compare.run_verdict(np.array([100.0 * mib]), np.array([200.0 * mib]), metric)["verdict"] == "regressed"
    assert compare.run_verdict(np.array([]), np.array([200.0 * mib]), metric) is None


def test_a_timed_run_level_metric_needs_runs_a_side_and_a_rank_test():
    """One cold first step on a busy host is seconds slower: from one run a side it is never a
    regression (nor unchanged); over five runs a side that all moved, it is."""
    metric = next(m for m in compare.METRICS if m.name == "first_step")
    one = compare.run_verdict(np.array([10.0]), np.array([20.0]), metric)
    assert one["verdict"] == "inconclusive" and "a timing needs 5 runs a side" in one["reason"]
    assert compare.run_verdict(np.array([10.0]), np.array([10.5]), metric)["verdict"] == "inconclusive"
    base, slower = np.array([10.0, 10.2, 9.9, 10.1, 10.3]), np.array([20.0, 20.4, 19.8, 20.1, 20.6])
    regressed = compare.run_verdict(base, slower, metric)
    assert regressed["verdict"] == "regressed" and regressed["p_value"] < 0.01
    overlapping = np.array([10.0, 10.1, 30.0, 31.0, 32.0])  # three slow runs of five: the host, or the code
    assert compare.run_verdict(base, overlapping, metric)["verdict"] == "inconclusive"
    assert compare.run_verdict(base, base + 0.1, metric)["verdict"] == "unchanged"
    assert compare.run_verdict(np.array([0.01] * 5), np.array([0.03] * 5), metric)["verdict"] == "unchanged"  # 20 ms


def test_a_run_level_reason_names_which_threshold_a_change_crossed():
    """A change counts only beyond both thresholds; one crossed and not the other is said so
    (a first step 48% quicker by 0.03 s read "within the 50% and 1 s thresholds")."""
    metrics = {m.name: m for m in compare.METRICS}
    five = np.ones(5)

    def reason(name: str, base: float, test: float) -> str:
        found = compare.run_verdict(base * five, test * five, metrics[name])
        assert found["verdict"] == "unchanged", found
        return found["reason"]

    assert reason("first_step", 0.066, 0.034).endswith("beyond the 50% threshold, not the 1 s one")
    assert reason("first_step", 10.0, 12.0).endswith("beyond the 1 s threshold, not the 50% one")
    assert reason("first_step", 10.0, 10.1).endswith("within the 50% and 1 s thresholds")
    assert reason("energy_per_token", 1.0, 1.05).endswith("within the 10% threshold")  # no absolute one
    regressed = compare.run_verdict(five * 100.0, five * 200.0, metrics["peak_mem"])
    assert regressed["reason"].endswith("beyond the 10% and 32 MiB thresholds (one value per run: no test)")


def test_cross_backend_speedup_mfu_and_tokens_per_dollar():
    gpu = runs_frame([{"run_id": "g", "backend": "cuda", "device": "NVIDIA H100 80GB HBM3", "median_step_ms": 10.0,
                       "tokens_per_s": 1000.0, "mfu": 0.4}])  # fmt: skip
    tpu = runs_frame([{"run_id": "t", "backend": "xla", "device": "TPU v5 lite", "median_step_ms": 20.0,
                       "tokens_per_s": 500.0, "mfu": 0.5}])  # fmt: skip
    row = compare.cross_backend(gpu, tpu, prices.PRICES).iloc[0]
    assert row["speedup"] == pytest.approx(0.5)
    assert row["base_tokens_per_usd"] == pytest.approx(1000 * 3600 / 3.99)
    assert row["test_tokens_per_usd"] == pytest.approx(500 * 3600 / 1.20)
    assert row["cost_ratio"] == pytest.approx((500 / 1.20) / (1000 / 3.99))


def test_a_speedup_from_runs_on_a_busy_host_carries_the_caveat():
    """A cross-backend speed-up computed from a single run measured on a busy host
    read as firmly as any other."""
    gpu = runs_frame([{"run_id": "g", "backend": "cuda", "device": "NVIDIA H100 80GB HBM3", "median_step_ms": 10.0,
                       "tokens_per_s": 1000.0, "host_other_cpu_share": 0.65}])  # fmt: skip
    tpu = runs_frame([{"run_id": "t", "backend": "xla", "device": "TPU v5 lite", "median_step_ms": 20.0,
                       "tokens_per_s": 500.0, "host_other_cpu_share": 0.01}])  # fmt: skip
    row = compare.cross_backend(gpu, tpu, prices.PRICES).iloc[0]
    assert row["caveat"].startswith("host busy during 1 of 1 baseline run(s)") and "speed-up" in row["caveat"]
    quiet = compare.cross_backend(gpu.assign(host_other_cpu_share=0.01), tpu, prices.PRICES).iloc[0]
    assert quiet["caveat"] is None
    from reports.markdown import cross_markdown

    assert "host busy during 1 of 1 baseline run(s)" in cross_markdown(compare.cross_backend(gpu, tpu, prices.PRICES))


def test_price_file_overrides_and_rejects_unknown_chips(tmp_path, monkeypatch):
    good = tmp_path / "prices.toml"
    good.write_text('"TPU v6e" = 2.5\n"H100 SXM" = 3.0\n')
    table = prices.load_prices(good)
    assert table["TPU v6e"].usd_per_chip_hour == 2.5 and table["H100 SXM"].usd_per_chip_hour == 3.0
    monkeypatch.setenv(prices.ENV, str(good))
    assert prices.device_price("TPU v6 lite", "tpu", prices.load_prices()) == 2.5
    assert prices.device_price("AMD EPYC", "cpu", table) is None
    bad = tmp_path / "bad.toml"
    bad.write_text('"TPU v99" = 1.0\n')
    with pytest.raises(prices.PriceError, match="unknown chip 'TPU v99'"):
        prices.load_prices(bad)


def test_every_default_price_names_a_source_and_a_known_chip():
    from tpubench import peaks

    chips = {peak.chip for peak in peaks.PEAKS}
    for chip, price in prices.PRICES.items():
        assert chip in chips and price.usd_per_chip_hour > 0 and "20" in price.source


# --- selectors ----------------------------------------------------------------------------


@pytest.fixture
def store_runs() -> pd.DataFrame:
    return runs_frame(
        [
            {
                "run_id": "r1",
                "invocation_id": "20261101-aaaa",
                "started_at": "2026-11-01T10:00Z",
                "tags": '{"rel": "1"}',
            },
            {"run_id": "r2", "invocation_id": "20261102-bbbb", "started_at": "2026-11-02T10:00Z", "git_sha": "def456"},
            {
                "run_id": "r3",
                "invocation_id": "20261103-cccc",
                "started_at": "2026-11-03T10:00Z",
                "backend": "xla",
                "device": "TPU v5 lite",
            },
        ]
    )


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("latest", ["r3"]),
        ("backend=cpu,latest", ["r2"]),
        ("previous", ["r2"]),
        ("backend=cpu,previous", ["r1"]),
        ("tag.rel=1", ["r1"]),
        ("invocation=20261102", ["r2"]),
        ("sha=def", ["r2"]),
        ("date=2026-11-01", ["r1"]),
        ("since=2026-11-02", ["r2", "r3"]),
        ("until=2026-11-02,backend!=xla", ["r1", "r2"]),
        ("device~tpu", ["r3"]),
        ("batch_size=4,backend=cpu", ["r1", "r2"]),
    ],
)
def test_selectors(store_runs, selector, expected):
    assert list(select_runs(store_runs, selector)["run_id"]) == expected


def test_a_selector_matching_nothing_names_the_values_that_exist(store_runs):
    with pytest.raises(NoRunsMatch, match=r"no runs match backend=cuda; backend has: xla, cpu"):
        select_runs(store_runs, "backend=cuda")
    with pytest.raises(NoRunsMatch, match=r"tag 'nightly'.*tags: rel"):
        select_runs(store_runs, "tag.nightly=1")
    # one invocation ran xla: none came before it
    with pytest.raises(NoRunsMatch, match=r"no runs match previous after backend=xla; invocation has: 20261103-cccc$"):
        select_runs(store_runs, "previous,backend=xla")


@pytest.mark.parametrize("selector", ["", "colour=red", "date~2026", "since=yesterday", "backend"])
def test_malformed_selectors_are_rejected(store_runs, selector):
    with pytest.raises(SelectorError):
        select_runs(store_runs, selector)


# --- change points ------------------------------------------------------------------------


def history(values: list[float], **extra) -> pd.DataFrame:
    return runs_frame(
        [
            {
                "run_id": f"r{i}",
                "invocation_id": f"inv{i:02d}",
                "started_at": pd.Timestamp("2026-11-01", tz="UTC") + pd.Timedelta(days=i),
                "git_sha": f"sha{i:02d}",
                "median_step_ms": v,
                **extra,
            }
            for i, v in enumerate(values)
        ]
    )


def test_a_persisting_shift_is_found_and_named():
    values = list(10 * (1 + 0.01 * RNG.standard_normal(8))) + list(11.5 * (1 + 0.01 * RNG.standard_normal(6)))
    found = changepoints.change_points(history(values))
    assert len(found) == 1
    row = found.iloc[0]
    assert (row["invocation_id"], row["git_sha"], row["direction"]) == ("inv08", "sha08", "regression")
    assert row["change_pct"] == pytest.approx(15, abs=2)


def test_a_clean_step_is_found_after_three_invocations_on_each_side():
    """`regressions` says a shift must last 3 invocations per side, but a rank
    test over 3 vs 3 points cannot reach p < 0.01 (best 0.1): a clean step (10 -> 20 ms, 1%
    noise) was first found at 5 + 5. The test on the log values finds it at 3 + 3, and not at 3 + 2."""
    rng = np.random.default_rng(3)
    for _ in range(20):
        values = np.r_[10 * (1 + 0.01 * rng.standard_normal(3)), 20 * (1 + 0.01 * rng.standard_normal(3))]
        assert changepoints.detect(values, changepoints.ChangePointSettings()) == [3]
        assert changepoints.detect(values[:5], changepoints.ChangePointSettings()) == []
    found = changepoints.change_points(history(list(values)))
    assert (found["points_before"].iloc[0], found["points_after"].iloc[0]) == (3, 3)
    assert found["p_value"].iloc[0] < 0.01


@pytest.mark.parametrize("seed", range(20))
def test_noise_one_bad_night_and_a_fresh_shift_are_not_change_points(seed):
    flat = list(10 * (1 + 0.02 * np.random.default_rng(seed).standard_normal(14)))
    assert changepoints.change_points(history(flat)).empty
    spike = [*flat[:8], 15.0, *flat[9:]]
    assert changepoints.change_points(history(spike)).empty
    fresh = [*flat[:12], 13.0, 13.1]  # two nights: not yet persisted (3 needed)
    assert changepoints.change_points(history(fresh)).empty


def test_series_are_separate():
    one = history([10.0] * 7 + [12.0] * 7)
    other = history([5.0] * 14, backend="cpu-compile")
    found = changepoints.change_points(pd.concat([one, other], ignore_index=True))
    assert list(found["backend"]) == ["cpu"]


def two_rank_side(label: str, medians: list[float], n: int = 30) -> tuple[list[dict], list[dict]]:
    """Runs of two rank processes: rank 1 takes twice rank 0's time on every step, so the job
    (per step, its slowest rank) runs at rank 1's pace, and its median is rank 1's."""
    runs, steps = side(label, medians, n=n, devices=2, parallel="dp", tp_size=1)
    slow = [{**row, "rank": 1} for row in steps]
    fast = [{**row, "rank": 0, "step_ms": row["step_ms"] / 2} for row in steps]
    return runs, fast + slow


def test_a_multi_rank_run_is_compared_by_its_slowest_rank_per_step():
    """Each rank's samples are stored, but the job waits for its slowest rank: against the same
    configuration at the slow rank's pace it is unchanged, by every statistic. Mixing the ranks'
    samples would show a fast rank's steps as the job's (a third faster at the median, twice as
    fast at the minimum)."""
    for statistic in ("median", "min"):
        base = two_rank_side("a", BASE)
        test = side("b", BASE, devices=2, parallel="dp", tp_size=1)
        row = step_row(compared(base, test, statistic=statistic))
        assert row["verdict"] == "unchanged", (statistic, row["reason"])
        assert row["ratio"] == pytest.approx(1.0, rel=0.03)
    spread = compare.baseline_spread(runs_frame(base[0]), steps_frame(base[1]), compare.Settings())
    assert spread["statistics"].iloc[0] == pytest.approx(BASE, rel=0.02)  # each run's median: rank 1's


def test_job_steps_leaves_one_process_runs_as_they_are():
    rows = side("a", [10.0], n=5)[1]
    frame = steps_frame(rows)
    pd.testing.assert_frame_equal(job_steps(frame), frame)
    merged = job_steps(steps_frame(two_rank_side("b", [10.0], n=5)[1]))
    assert len(merged) == 5 and merged["rank"].isna().all()


# --- reports and export ---------------------------------------------------------------------


def test_reports_render_the_same_figures():
    base, test = side("a", BASE), side("b", [1.2 * m for m in BASE])
    comparison = compared(base, test)
    runs = runs_frame(test[0])
    report = build_report(runs, comparison=comparison, baseline="tag.night=1")
    assert report.regressed
    text = markdown.render(report)
    assert "**Regressed** against tag.night=1" in text and "| gpt2/tiny infer float32 4x128 |" in text
    page = html.render(report)
    assert page.startswith("<!DOCTYPE html>") and "Plotly.newPlot" in page and "regressed" in page
    assert "cdn.plot.ly" not in page.split("</script>", 1)[1]  # plotly.js is inlined once, not fetched


def test_pytorch_benchmark_records_follow_the_v3_schema():
    runs_rows, steps_rows = side("a", [10.0], n=12)
    runs = runs_frame(runs_rows)
    runs["mode"], runs["torch_version"], runs["backend_versions"] = "train", "2.13.0", '{"cuda": "12.8"}'
    found = records(runs, steps_frame(steps_rows))
    step = next(r for r in found if r["metric"]["name"] == "step_ms")
    assert set(step) == {"benchmark", "model", "metric", "runners", "dependencies"}
    assert step["benchmark"]["mode"] == "training" and step["model"]["name"] == "gpt2/tiny"
    assert len(step["metric"]["benchmark_values"]) == 12
    assert all(isinstance(v, str) for v in step["benchmark"]["extra_info"].values())
    assert step["dependencies"]["cuda"] == {"version": "12.8"}
    json.dumps(found)  # plain JSON


def test_pytorch_benchmark_records_of_a_multi_rank_run_carry_the_job_and_its_layout():
    """One sample per measured step (the slowest rank's), and the layout in the benchmark's
    extra_info: two devices are another series than one."""
    runs_rows, steps_rows = two_rank_side("a", [10.0], n=12)
    runs = runs_frame(runs_rows)
    runs["mesh"], runs["scaling"] = "dp=2", "weak"
    found = records(runs, steps_frame(steps_rows))
    step = next(r for r in found if r["metric"]["name"] == "step_ms")
    slowest = [row["step_ms"] for row in steps_rows if row["rank"] == 1]
    assert step["metric"]["benchmark_values"] == pytest.approx(slowest)
    extra = step["benchmark"]["extra_info"]
    assert (extra["devices"], extra["parallel"], extra["mesh"], extra["scaling"]) == ("2", "dp", "dp=2", "weak")
    one_device = records(runs_frame(side("b", [10.0], n=3)[0]), steps_frame(side("b", [10.0], n=3)[1]))
    assert "devices" not in one_device[0]["benchmark"]["extra_info"]  # one device's records stay as they were
    # a 1-device run under a plan, and a run over hosts, are series of their own
    fsdp1 = records(runs_frame(side("c", [10.0], parallel="fsdp")[0]), steps_frame([]))[0]["benchmark"]["extra_info"]
    assert (fsdp1["devices"], fsdp1["parallel"]) == ("1", "fsdp") and "hosts" not in fsdp1
    runs["hosts"] = 2
    assert records(runs, steps_frame(steps_rows))[0]["benchmark"]["extra_info"]["hosts"] == "2"


def test_reports_show_top_ops_of_profiled_runs():
    runs = runs_frame(side("a", [10.0])[0])
    ops = pd.DataFrame(
        {
            "run_id": "a0",
            "source": "aten",
            "op": ["aten::mm", "aten::add", "aten::gelu"],
            "category": ["matmul", "elementwise", "elementwise"],
            "framework_op": None,
            "calls": [10, 20, 5],
            "self_time_us": [900.0, 50.0, 40.0],
            "total_time_us": [900.0, 50.0, 40.0],
            "self_us_per_step": [450.0, 25.0, 20.0],
            "self_pct": [45.0, 2.5, 2.0],
            "flops": None,
            "achieved_flops_per_s": None,
            "bound_by": None,
        }
    )
    report = build_report(runs, ops=ops, top=2)
    ((label, top),) = report.top_ops.items()
    assert label == "gpt2/tiny infer 4x128 cpu (a0)" and list(top["op"][:2]) == ["aten::mm", "aten::add"]
    assert top["op"].iloc[-1].startswith("others (1 ops)")
    assert "## Top ops: gpt2/tiny infer 4x128 cpu (a0)" in markdown.render(report)


def test_runs_needed_is_the_fewest_runs_with_the_power():
    settings, noisy = compare.Settings(), lognormal(0.157, 60)
    n = compare.runs_needed(noisy, 0.10, settings, 0.05, 200)
    assert n is not None
    assert compare.simulated_power(noisy, 60, n, 0.10, settings, 0.05) >= settings.power
    assert compare.simulated_power(noisy, 60, n - 1, 0.10, settings, 0.05) < settings.power
    quiet = lognormal(0.01, 5)
    assert compare.runs_needed(quiet, 0.10, settings, 0.05, 60) == settings.min_runs  # a quiet chip: the minimum
    assert compare.runs_needed(noisy, 0.10, settings, 0.05, 10) is None  # ten runs cannot, against this noise


def test_ci_sizes_a_night_by_the_baseline_noise():
    """--rounds auto: a quiet baseline needs the minimum, a noisy one more, capped; none: the first night's."""
    from tpubench.cli.ci import FIRST_NIGHT_ROUNDS, auto_rounds
    from tpubench.cli.compare import Selection
    from tpubench.runner import plan

    specs = plan(["gpt2"], sizes=["tiny"], backends=["cpu"], modes=["infer"], steps=10)
    specs = [replace(spec, batch_size=4, seq_len=128) for spec in specs]

    def baseline(medians: list[float]) -> Selection:
        runs, steps = side("a", medians)
        return Selection("night1", runs_frame(runs), steps_frame(steps))

    settings = compare.Settings()
    assert auto_rounds(None, specs, settings, 60)[0] == FIRST_NIGHT_ROUNDS
    quiet, why = auto_rounds(baseline([10.0 + 0.01 * i for i in range(10)]), specs, settings, 60)
    assert quiet == settings.min_runs and "enough to catch a 10% slowdown" in why
    noisy = [10 * float(np.exp(0.05 * z)) for z in RNG.standard_normal(20)]
    rounds, _ = auto_rounds(baseline(noisy), specs, settings, 60)
    assert settings.min_runs < rounds < 60
    capped, why = auto_rounds(baseline([10.0, 14.0, 7.0, 12.0, 8.5]), specs, settings, 60)
    assert capped == 60 and "cannot catch" in why


def test_a_count_metric_with_zeros_has_change_points_not_a_crash():
    """`regressions --metric recompiles_after_warmup` crashed in ruptures (log 0 = -inf): a count
    that is 0 for six nights, then 2, is a change point from 0 to 2; a flat zero series has none."""
    frame = history([10.0] * 12)
    frame["recompiles_after_warmup"] = [0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2]
    found = changepoints.change_points(frame, "recompiles_after_warmup")
    assert len(found) == 1
    row = found.iloc[0]
    assert (row["invocation_id"], row["before"], row["after"]) == ("inv06", 0.0, 2.0)
    assert row["change_pct"] == math.inf and row["direction"] == "regression"
    frame["recompiles_after_warmup"] = 0
    assert changepoints.change_points(frame, "recompiles_after_warmup").empty


def _configurations() -> pd.DataFrame:
    """gpt2 on one device and on two (dp), and two models under one hf:bert reference (two
    model hashes): four configurations, each with three nights of one run."""
    rows = []
    for night in range(3):
        common = {"invocation_id": f"night{night}", "started_at": f"2026-11-{10 + night:02d}T00:00:00Z"}
        rows += [
            {**common, "run_id": f"one{night}", "median_step_ms": 10.0},
            {**common, "run_id": f"two{night}", "median_step_ms": 6.0, "devices": 2, "parallel": "dp",
             "scaling": "weak"},
            *(
                {**common, "run_id": f"{model}{night}", "workload": "hf:bert", "size": "default", "model_hash": model,
                 "median_step_ms": ms}
                for model, ms in (("aaaa1111bbbb", 3.0), ("cccc2222dddd", 30.0))
            ),
        ]  # fmt: skip
    return runs_frame(rows)


def test_every_reader_keeps_a_configuration_apart_from_another_layout_or_model():
    """Summaries, reports, regressions/Trends and the HUD export group by one identity (the run
    key of tpubench.spec plus the device): 1- and 2-device runs of one model are two figures, and
    two models under one reference two series, each labelled apart."""
    runs = _configurations()
    summary = build_report(runs).summary
    assert len(summary) == 4 and sorted(summary["median_step_ms"]) == [3.0, 6.0, 10.0, 30.0]
    points = changepoints.series_points(runs)
    assert points.groupby(list(changepoints.SERIES_KEYS), dropna=False).ngroups == 4
    labels = set(identity.config_labels(summary, backend=True))
    assert len(labels) == 4 and "gpt2/tiny infer float32 4x128 dp2 cpu (AMD EPYC)" in labels
    assert "hf:bert infer float32 4x128 cpu (AMD EPYC) model aaaa1111" in labels  # one size: no /default
    page = markdown.render(build_report(runs))
    assert "dp2" in page and "model cccc2222" in page
    hud = records(runs, steps_frame([]))
    assert {r["benchmark"]["extra_info"].get("model_hash") for r in hud if r["metric"]["name"] == "step_ms"} == {
        None,
        "aaaa1111bbbb",
        "cccc2222dddd",
    }


def test_a_one_device_run_keeps_its_plan_and_pairs_with_plain_runs_only_where_its_plan_has_none():
    """--devices 1,2 --parallel fsdp's 1-device runs apply no plan (tpubench.parallel.apply),
    but they are the runs the user asked for under fsdp: every reader keys and labels them
    with it (``fsdp1``), so a dp and an fsdp 1-device run never pool. Compare pairs
    them with plain 1-device runs where the other side has no fsdp one, saying so, and pairs
    plan with plan where both sides have it."""
    plain = side("a", BASE)
    fsdp = side("b", BASE, parallel="fsdp", scaling="weak")
    frame = compared(plain, fsdp)
    assert "unpaired" not in set(frame["verdict"]) and step_row(frame)["verdict"] == "unchanged"
    assert "1-device runs of plan none against plan fsdp" in step_row(frame)["reason"]
    keyed = identity.configurations(runs_frame(fsdp[0]))
    assert set(keyed["parallel"]) == {"fsdp"} and keyed["scaling"].isna().all()
    assert set(identity.config_labels(runs_frame(fsdp[0]))) == {"gpt2/tiny infer float32 4x128 fsdp1"}
    # both plans on both sides: dp with dp, fsdp with fsdp, never across (dp 2x slower throughout)
    both = lambda label, scale: (  # noqa: E731
        *(part_dp + part_fsdp for part_dp, part_fsdp in zip(
            side(f"{label}dp", [scale * m for m in BASE], parallel="dp"), side(f"{label}fsdp", BASE, parallel="fsdp"),
            strict=True,
        )),
    )  # fmt: skip
    frame = compared(both("a", 2.0), both("b", 2.0))
    steps = frame[frame["metric"] == "step"]
    assert sorted(steps["parallel"]) == ["dp", "fsdp"] and set(steps["verdict"]) == {"unchanged"}
    assert steps["base_value"].max() / steps["base_value"].min() == pytest.approx(2.0, rel=0.05)


@pytest.mark.parametrize("ties", [False, True])
def test_the_rank_test_gives_scipys_p_values(ties):
    """Verdicts take their p-value from tpubench.analysis.ranktest (numpy; scipy.stats cost
    compare a second of start-up): the same p as scipy's mannwhitneyu(method="auto"), exact and
    asymptotic, one pair of samples or one per row."""
    from tpubench.analysis.ranktest import mann_whitney_p

    rng = np.random.default_rng(3)
    for n_test, n_base in ((1, 1), (2, 5), (5, 5), (8, 9), (9, 9), (12, 40), (50, 50)):
        for _ in range(10):
            test, base = rng.normal(0.3, 1, n_test), rng.normal(0, 1, n_base)
            if ties:
                test, base = test.round(1), base.round(1)
            expected = stats.mannwhitneyu(test, base, method="auto").pvalue
            assert mann_whitney_p(test, base) == pytest.approx(expected, abs=1e-12), (n_test, n_base)
        rows_test, rows_base = rng.normal(0.3, 1, (50, n_test)), rng.normal(0, 1, (50, n_base))
        expected = stats.mannwhitneyu(rows_test, rows_base, axis=1, method="auto").pvalue
        assert mann_whitney_p(rows_test, rows_base) == pytest.approx(expected, abs=1e-12)


def test_one_frame_of_both_sides_steps_counts_each_sample_once():
    """The nightly's creep check reads both nights' steps as one frame and passes it as both
    sides'; each sample must count once, as with each side's own frame (twice over, the
    bootstrap and the rank tests would see twice the evidence)."""
    base, test = side("a", [10.0, 10.4, 9.7, 10.1, 10.3], spread=0.05), side("b", [10.5, 10.9, 10.2, 10.6, 10.8])
    apart = compared(base, test)
    together = steps_frame(base[1] + test[1])
    frame = compare.compare_runs(runs_frame(base[0]), runs_frame(test[0]), together, together, compare.Settings())
    pd.testing.assert_frame_equal(frame, apart)
    doubled = compare.compare_runs(
        runs_frame(base[0]), runs_frame(test[0]), together, together.copy(), compare.Settings()
    )  # two frames of the same rows: the old behaviour, which this guards against
    assert (
        step_row(doubled)["ci_high"] - step_row(doubled)["ci_low"]
        < step_row(apart)["ci_high"] - step_row(apart)["ci_low"]
    )


def test_configurations_group_in_the_order_pandas_groups_them_nulls_last():
    """compare groups a side's runs in Python (:func:`compare._groups`), not by pandas' groupby,
    for speed: the same groups, in the same order (sorted, a null key value last and read as
    None), each with its own rows, or the rows of a comparison would come out reordered."""
    rows = [
        {"run_id": f"r{i}", "workload": workload, "seq_len": seq_len, "backend": backend, "device": device}
        for i, (workload, seq_len, backend, device) in enumerate(
            [
                ("llama3", 512, "cuda", "H100"),
                ("gpt2", None, "cpu", None),
                ("gpt2", 128, "cpu", "EPYC"),
                ("bert", 128, "tpu", "v5e"),
                ("gpt2", None, "cpu", None),
                ("gpt2", 128, "cpu", None),
                ("gpt2", 64, "cuda", "H100"),
            ]
        )
    ]
    frame = runs_frame(rows)
    keys = ["workload", "seq_len", "device"]
    ours = compare._groups(frame, keys)
    pandas_order = [
        tuple(None if pd.isna(value) else value for value in key) for key, _ in frame.groupby(keys, dropna=False)
    ]
    assert list(ours) == pandas_order
    assert pandas_order[1:3] == [("gpt2", 64.0, "H100"), ("gpt2", 128.0, "EPYC")]  # a real ordering to compare
    for key, group in frame.groupby(keys, dropna=False):
        normal = tuple(None if pd.isna(value) else value for value in key)
        assert list(ours[normal]["run_id"]) == list(group["run_id"])


def test_a_label_is_the_same_made_once_or_again_and_each_layout_has_its_own():
    """config_labels keeps each configuration's label once made (identity._LABELLED); a label
    given from there is the one made afresh, and rows that differ only in a column a label
    reads (the devices, a column a frame lacks) never share one."""
    frame = runs_frame(
        [
            {"run_id": "a", "seq_len": 128},
            {"run_id": "b", "seq_len": None, "workload": "bert"},
            {"run_id": "c", "devices": 2, "parallel": "fsdp"},
            {"run_id": "d", "precision": "fp8", "dtype": "bfloat16"},
        ]
    )
    identity._LABELLED.clear()
    for options in ({}, {"dtype": False}, {"backend": True}):
        made = identity.config_labels(frame, **options)
        kept = identity.config_labels(frame, **options)
        assert kept.tolist() == made.tolist()
        identity._LABELLED.clear()
        assert identity.config_labels(frame.iloc[::-1], **options).tolist() == made.tolist()[::-1]
    labels = identity.config_labels(frame).tolist()
    assert len(set(labels)) == 4 and "fsdp2" in labels[2] and "fp8" in labels[3]
    without = identity.config_labels(frame.drop(columns=["devices", "parallel"])).tolist()
    assert without[2] != labels[2] and without[2] == without[0]  # no layout column: one device, no plan
