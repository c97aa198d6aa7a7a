"""Serving points in `tpubench compare` and `tpubench ci`: verdicts with intervals over the
per-request samples, on stores of real parquet written by the store's own writer."""

from __future__ import annotations

import json
import math
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from helpers import in_process

from tpubench import store
from tpubench.analysis import serving_compare
from tpubench.analysis.compare import Settings

#: requests per point: enough for a verdict over requests (serving_compare.MIN_REQUESTS)
REQUESTS = 400
OUTPUT_LEN = 32
#: two loads per sweep: a finite rate the server keeps up with, and everything at once
LOADS = ((4.0, None), (math.inf, 8))


def write_sweep(
    results: Path,
    *,
    tpot_ms: float = 10.0,
    ttft_ms: float = 40.0,
    seed: int = 0,
    night: int = 0,
    engine_version: str = "0.11.0",
    failed: int = 0,
    requests_per_point: int = REQUESTS,
) -> str:
    """One sweep (an invocation) of :data:`LOADS` points into ``results``, through the store's
    writer: each request's TPOT and TTFT drawn log-normal (10% spread) about the given
    medians, its E2EL and the point's throughputs consistent with them as the client computes
    them. Returns the invocation id."""
    rng = np.random.default_rng(seed)
    count = requests_per_point
    invocation = f"night{night}-{uuid.uuid4().hex[:6]}"
    started = datetime(2026, 12, 1, 3, tzinfo=UTC) + timedelta(days=night)
    writer = store.InvocationWriter(results, invocation, started, tables=("serving", "serving_requests"))
    for index, (rate, concurrency) in enumerate(LOADS):
        run_id = uuid.uuid4().hex[:16]
        tpot = tpot_ms * rng.lognormal(0, 0.1, count)
        ttft = ttft_ms * rng.lognormal(0, 0.1, count)
        e2el = ttft + tpot * (OUTPUT_LEN - 1)
        send = np.arange(count) / rate if math.isfinite(rate) else _slots(e2el / 1000, concurrency)
        duration = float(np.max(send + e2el / 1000))
        requests = [
            {
                "run_id": run_id,
                "invocation_id": invocation,
                "request": i,
                "input_len": 64,
                "output_len": OUTPUT_LEN,
                "send_s": float(send[i]),
                "ttft_ms": float(ttft[i]),
                "tpot_ms": float(tpot[i]),
                "e2el_ms": float(e2el[i]),
                "itl_ms": [float(tpot[i])] * (OUTPUT_LEN - 1),
                "error": None,
            }
            for i in range(count)
        ]
        requests += [
            {"run_id": run_id, "invocation_id": invocation, "request": count + i, "error": "HTTP 500"}
            for i in range(failed)
        ]
        point = {
            "run_id": run_id,
            "invocation_id": invocation,
            "started_at": started + timedelta(minutes=index),
            "source": "tpubench",
            "status": "ok",
            "engine": "vllm",
            "engine_version": engine_version,
            "model": "tiny-llama",
            "device": "NVIDIA H100",
            "dtype": "bfloat16",
            "tp_size": 1,
            "dataset": "random",
            "input_len": 64,
            "output_len": OUTPUT_LEN,
            "num_prompts": count,
            "request_rate": rate,
            "burstiness": 1.0,
            "max_concurrency": concurrency,
            "ignore_eos": True,
            "completed": count,
            "failed": failed,
            "duration_s": duration,
            "total_output_tokens": count * OUTPUT_LEN,
            "tpot_p50_ms": float(np.median(tpot)),
            "ttft_p50_ms": float(np.median(ttft)),
            "request_throughput": count / duration,
            "output_throughput": count * OUTPUT_LEN / duration,
            "tags": json.dumps({"night": str(night)}),
        }
        writer.add_rows({"serving": [point], "serving_requests": requests})
    return invocation


def _slots(seconds: np.ndarray, concurrency: int) -> np.ndarray:
    """Send times of requests sent at once through a semaphore of ``concurrency``: each as a
    slot frees (the client's --max-concurrency), so that Little's law holds."""
    free = np.zeros(concurrency)
    send = np.empty(seconds.size)
    for index, duration in enumerate(seconds):
        slot = int(np.argmin(free))
        send[index] = free[slot]
        free[slot] += duration
    return send


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A baseline sweep, and three candidates in stores of their own: the same distributions
    (another seed), TPOT 20% slower, and TTFT 50% slower."""
    root = tmp_path_factory.mktemp("serving")
    made = {
        "base": {"seed": 1, "night": 0},
        "same": {"seed": 2, "night": 1},
        "slower": {"seed": 3, "night": 1, "tpot_ms": 12.0, "engine_version": "0.12.0"},
        "late": {"seed": 4, "night": 1, "ttft_ms": 60.0},
    }
    for name, options in made.items():
        write_sweep(root / name, **options)
    return {name: root / name for name in made}


def compared(stores: dict[str, Path], candidate: str) -> pd.DataFrame:
    frames = [
        (store.load_table(stores[side], "serving"), store.load_table(stores[side], "serving_requests"))
        for side in ("base", candidate)
    ]
    requests = pd.concat([frames[0][1], frames[1][1]], ignore_index=True)
    return serving_compare.compare_points(frames[0][0], frames[1][0], requests, Settings())


def row(frame: pd.DataFrame, metric: str, rate: float) -> dict:
    chosen = frame[(frame["metric"] == metric) & (frame["request_rate"] == rate)]
    assert len(chosen) == 1, frame[["metric", "request_rate", "verdict"]]
    return chosen.iloc[0].to_dict()


def test_a_twenty_percent_slower_tpot_regresses_with_an_interval_that_excludes_no_change(stores):
    frame = compared(stores, "slower")
    for rate, _ in LOADS:
        tpot = row(frame, "tpot", rate)
        assert tpot["verdict"] == "regressed", tpot["reason"]
        assert 1.15 < tpot["ratio"] < 1.25 and 1 < tpot["ci_low"] <= tpot["ratio"] <= tpot["ci_high"] < 1.3
        assert tpot["p_value"] < 1e-6 and tpot["tested_over"] == "requests"
        assert tpot["base_requests"] == tpot["test_requests"] == REQUESTS
        assert "engine version 0.11.0 → 0.12.0" in tpot["reason"]
    # at rate inf the point is closed-loop: tokens/s falls with TPOT, and its interval says so
    throughput = row(frame, "throughput", math.inf)
    assert throughput["verdict"] == "regressed" and throughput["ci_high"] < 1 / 1.05, throughput["reason"]
    # at 4 requests/s the arrivals set the pace: the same tokens/s, shown within the threshold
    steady = row(frame, "throughput", 4.0)
    assert steady["verdict"] == "unchanged" and steady["ci_low"] < 1 < steady["ci_high"], steady["reason"]
    assert serving_compare.overall_verdict(frame) == "regressed"


def test_the_same_distributions_are_unchanged(stores):
    frame = compared(stores, "same")
    assert set(frame["verdict"]) == {"unchanged"}, frame[["metric", "request_rate", "reason"]].to_string()
    assert (frame["ci_low"] < frame["ci_high"]).all() and serving_compare.overall_verdict(frame) == "no regression"


def test_ttft_gates_only_at_a_rate_the_server_kept_up_with(stores):
    frame = compared(stores, "late")
    kept_up = row(frame, "ttft", 4.0)
    assert kept_up["verdict"] == "regressed" and kept_up["gates"], kept_up["reason"]
    at_once = row(frame, "ttft", math.inf)
    assert at_once["verdict"] == "worse" and not at_once["gates"]
    assert "not gating: at rate inf" in at_once["reason"]


def test_throughputs_interval_is_centred_on_the_stored_figure_and_narrows_with_requests():
    """Output throughput is one figure a point: its replicates (Little's law over resampled
    requests) have the stored figure as their centre, and a point of 4x the requests gives an
    interval about half as wide."""
    widths = []
    for size in (100, 400):
        rng = np.random.default_rng(0)
        e2el = rng.lognormal(np.log(300), 0.3, size)
        requests = pd.DataFrame({"run_id": "p", "output_len": 32.0, "e2el_ms": e2el, "error": None})
        point = pd.DataFrame({"run_id": ["p"], "output_throughput": [1234.0]})
        found = serving_compare._throughput_replicates(
            point, serving_compare.requests_by_point(requests), 2000, np.random.default_rng(1)
        )
        assert found is not None
        _, replicates, used = found
        assert used == size and abs(np.median(replicates) / 1234.0 - 1) < 0.01
        widths.append(np.subtract(*np.percentile(replicates, [97.5, 2.5])))
    assert 0.4 < widths[1] / widths[0] < 0.6


def test_failed_requests_regress_whatever_the_latencies(tmp_path, stores):
    write_sweep(tmp_path / "failing", seed=2, night=1, failed=5)
    base = store.load_table(stores["base"], "serving")
    test = store.load_table(tmp_path / "failing", "serving")
    requests = pd.concat(
        [store.load_table(path, "serving_requests") for path in (stores["base"], tmp_path / "failing")]
    )
    frame = serving_compare.compare_points(base, test, requests)
    failed = frame[frame["metric"] == "failed_requests"]
    assert len(failed) == 2 and set(failed["verdict"]) == {"regressed"}
    assert f"5 of {REQUESTS + 5} request(s) failed, none in the baseline" in failed["reason"].iloc[0]
    # the failed requests carry no latencies: the rest compare as the same distributions
    assert set(frame.loc[frame["metric"] == "tpot", "verdict"]) == {"unchanged"}


def test_compare_prints_a_serving_section_with_the_points_named(stores, tmp_path):
    markdown = tmp_path / "compare.md"
    done = in_process(
        "compare --baseline latest --candidate latest --baseline-results",
        stores["base"],
        "--results",
        stores["slower"],
        "--markdown",
        markdown,
        "--fail-on-regression",
    )
    assert done.returncode == 1, done.stdout + done.stderr
    text = " ".join(done.stdout.split())
    assert "serving points: baseline -> candidate" in text and "serving points: regressed" in text
    assert "runs: none compared" in text  # a store of serving points only
    assert "tiny-llama random 64/32, vllm 0.11.0 on NVIDIA" in text and "median TPOT +2" in text
    assert "## Serving points\n\n**Regressed**" in markdown.read_text()

    found = json.loads(
        in_process(
            "compare --baseline latest --candidate latest --json --baseline-results",
            stores["base"],
            "--results",
            stores["same"],
        ).stdout
    )
    assert found["verdict"] == "no regression" and found["serving"]["verdict"] == "no regression"
    assert {r["metric"] for r in found["serving"]["comparison"]} == {"tpot", "ttft", "throughput"}
    points = {r["point"] for r in found["serving"]["comparison"]}
    assert points == {
        "tiny-llama random 64/32, vllm 0.11.0 on NVIDIA H100, rate 4/s",
        "tiny-llama random 64/32, vllm 0.11.0 on NVIDIA H100, rate inf, concurrency 8",
    }


def test_ci_gates_on_serving_points(stores, tmp_path):
    """Serving-only nights: a first night without a baseline keeps its sweep in results/ and
    the history; a night whose TPOT is 20% slower exits 1 with the point named, and so does
    its creep check against the history; a night of the same distributions exits 0."""
    history = tmp_path / "history"
    first = in_process("ci --serving-only --serving", stores["base"], "--history", history, "--out", tmp_path / "n0")
    assert first.returncode == 0 and "no baseline points, nothing compared" in first.stdout, first.stdout
    assert len(store.load_table(tmp_path / "n0" / "results", "serving")) == len(LOADS)

    slower = in_process(
        "ci --serving-only --serving", stores["slower"], "--baseline", tmp_path / "n0" / "results",
        "--history", history, "--out", tmp_path / "slower",
    )  # fmt: skip
    assert slower.returncode == 1, slower.stdout + slower.stderr
    text = " ".join(slower.stdout.split())
    assert "SERVING REGRESSED" in text and "rate 4/s: median TPOT +" in text
    assert "vllm 0.11.0 on NVIDIA H100 → vllm 0.12.0 on NVIDIA H100" in text
    assert "serving creep: REGRESSED against 2026-12-01" in text
    summary = (tmp_path / "slower" / "summary.md").read_text()
    assert "## Serving points\n\n**Regressed**" in summary and "## Slow creep of serving points" in summary
    assert len(store.load_table(history, "serving")) == 2 * len(LOADS)

    same = in_process(
        "ci --serving-only --serving", stores["same"], "--baseline", stores["base"], "--out", tmp_path / "same"
    )
    assert same.returncode == 0, same.stdout + same.stderr
    assert "serving points: no regression" in same.stdout
    rows = json.loads((tmp_path / "same" / "serving_comparison.json").read_text())
    assert {r["verdict"] for r in rows} == {"unchanged"}


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--serving-only"], "--serving-only needs --serving"),
        (["--serving", "{tmp}/nope"], "--serving {tmp}/nope: no serving points in it"),
    ],
)
def test_ci_refuses_serving_input_it_cannot_use(tmp_path, extra, message):
    out = tmp_path / "night"
    done = in_process("ci", *(arg.format(tmp=tmp_path) for arg in extra), "--out", out)
    assert done.returncode == 2 and message.format(tmp=tmp_path) in done.stderr, done.stderr
    assert not out.exists()


def test_regressions_follows_each_serving_configurations_history(tmp_path):
    """Eight nightly sweeps whose TPOT steps up 20% from the fifth, with a new engine version:
    `regressions --serving` names that sweep and version, once per load; runs' regressions
    say the store holds serving series."""
    history = tmp_path / "history"
    invocations = [
        write_sweep(
            history,
            seed=night,
            night=night,
            tpot_ms=10.0 if night < 4 else 12.0,
            engine_version="0.11.0" if night < 4 else "0.12.0",
            requests_per_point=40,
        )
        for night in range(8)
    ]
    done = in_process("regressions --serving --json --fail-on-regression --results", history)
    assert done.returncode == 1, done.stdout + done.stderr
    found = json.loads(done.stdout)
    assert len(found) == len(LOADS) and {row["invocation_id"] for row in found} == {invocations[4]}
    assert {(row["direction"], row["engine_version"], row["metric"]) for row in found} == {
        ("regression", "0.12.0", "tpot_p50_ms")
    }
    assert all(15 < row["change_pct"] < 25 for row in found)
    throughput = in_process("regressions --serving --metric output_throughput --results", history)
    assert throughput.returncode == 0 and "change point(s) in 2 serving series" in throughput.stdout
    bad = in_process("regressions --serving --metric median_step_s --results", history)
    assert bad.returncode == 2 and "is not a serving figure; valid: tpot_p50_ms" in bad.stderr


def test_points_without_requests_compare_by_their_own_figures(tmp_path):
    """Points imported without per-request rows: one figure a point allows no interval, so one
    point a side is inconclusive and says why; five a side 20% slower regress. With their
    requests, five points a side are tested over points, as runs are."""
    for side, tpot in (("base", 10.0), ("test", 12.0)):
        for night in range(5):
            write_sweep(tmp_path / side, tpot_ms=tpot, seed=night, night=night, requests_per_point=40)
    base, test = (store.load_table(tmp_path / side, "serving") for side in ("base", "test"))
    none = store.TABLES["serving_requests"].empty_table().to_pandas()
    one = serving_compare.compare_points(base.iloc[:2], test.iloc[:2], none)
    tpot = one[one["metric"] == "tpot"].iloc[0]
    assert tpot["verdict"] == "inconclusive" and "no per-request samples on a side" in tpot["reason"]
    assert tpot["tested_over"] == "points (stored figures)" and pd.isna(tpot["ci_low"])
    five = serving_compare.compare_points(base, test, none)
    assert set(five.loc[five["metric"] == "tpot", "verdict"]) == {"regressed"}
    assert set(five["base_points"]) == {5}
    # with their requests, five points a side are the unit, as five runs a side are
    requests = pd.concat([store.load_table(tmp_path / side, "serving_requests") for side in ("base", "test")])
    by_points = serving_compare.compare_points(base, test, requests)
    tpot = by_points[by_points["metric"] == "tpot"]
    assert set(tpot["verdict"]) == {"regressed"} and set(tpot["tested_over"]) == {"points"}
    assert (tpot["ci_low"] > 1.1).all() and (tpot["test_requests"] == 200).all()
