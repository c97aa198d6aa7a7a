"""A real engine end to end: ``tpubench serving --engine transformers`` on this CPU, serving a
tiny Llama built here (tpubench/serving/engines/tiny_model.py), swept at two rates and two
concurrencies. One engine for the module: the command starts it once, and the tests read
what it stored and what it left running."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import psutil
import pytest
from helpers import tpubench
from safetensors import safe_open

from tpubench import store
from tpubench.backends.cpu import cpu_model
from tpubench.serving.engines import tiny_model

PROMPTS, OUTPUT_LEN = 4, 8
#: a KV cache of 1,024 tokens: on a CPU, continuous batching's default takes a share of the
#: host's memory (14 GB here, zeroed by the first request: 44 s of wall time under load)
ENGINE_ARGS = "--device cpu --cb-num-blocks 64 --cb-block-size 16"


class Sweep:
    def __init__(self, done, model: Path, points: pd.DataFrame, requests: pd.DataFrame):
        self.done, self.model, self.points, self.requests = done, model, points, requests


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Sweep:
    work = tmp_path_factory.mktemp("serving-engine")
    model = tiny_model.build(work / "tiny-llama")
    results = work / "results"
    done = tpubench(
        f"serving --engine transformers --model {model} --engine-arg '{ENGINE_ARGS}' --request-rate 1,4 "
        f"--max-concurrency 2,4 --num-prompts {PROMPTS} --input-len 8 --output-len {OUTPUT_LEN} --warmups 1 "
        f"--ready-timeout 300 --results {results}",
        env={"HF_HUB_OFFLINE": "1"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    points = store.load_table(results, "serving").sort_values(["max_concurrency", "request_rate"])
    return Sweep(done, model, points.reset_index(drop=True), store.load_table(results, "serving_requests"))


def test_every_point_is_ok_and_says_which_engine_on_which_chip(sweep: Sweep) -> None:
    import transformers

    points = sweep.points
    assert list(zip(points["max_concurrency"], points["request_rate"], strict=True)) == [
        (2, 1.0),
        (2, 4.0),
        (4, 1.0),
        (4, 4.0),
    ]
    assert points["status"].eq("ok").all() and points["error"].isna().all()
    assert points["completed"].eq(PROMPTS).all() and points["failed"].eq(0).all()
    assert points["engine"].eq("transformers").all()
    assert points["engine_version"].eq(transformers.__version__).all()
    assert points["device"].eq(cpu_model()).all() and points["device_count"].eq(1).all()
    assert points["cold_start_s"].nunique() == 1 and points["cold_start_s"].iloc[0] > 0  # one start
    assert json.loads(points["honoured"].iloc[0]) == {
        "ignore_eos": False,
        "load_format_dummy": False,
        "stream_options": False,
    }
    assert json.loads(points["engine_args"].iloc[0]) == ENGINE_ARGS.split()
    with safe_open(sweep.model / "model.safetensors", "pt") as weights:  # the library's reading, not ours
        parameters = sum(math.prod(weights.get_slice(name).get_shape()) for name in weights.keys())  # noqa: SIM118
    assert points["param_count"].eq(parameters).all()
    assert f"transformers ready after {points['cold_start_s'].iloc[0]:.1f} s (cold start)" in sweep.done.stdout


def test_output_tokens_are_the_servers_usage_not_its_chunks(sweep: Sweep) -> None:
    requests = sweep.requests
    # the tiny model never ends early (its EOS row is zero), so the server's usage is max_tokens
    assert requests["output_len"].eq(OUTPUT_LEN).all() and requests["error"].isna().all()
    assert sweep.points["total_output_tokens"].eq(PROMPTS * OUTPUT_LEN).all()
    # a chunk is not a token: the byte-level tokenizer holds back partial characters, so some
    # answers come in fewer text-bearing chunks than the tokens usage counts
    chunks = requests["itl_ms"].map(len) + 1
    assert (chunks <= requests["output_len"]).all() and (chunks < requests["output_len"]).any()


def test_throughput_grows_with_the_rate(sweep: Sweep) -> None:
    """At rate 1 the 4 requests arrive over 4 s; at rate 4 over 1 s. Two at a time, the engine
    keeps up with rate 4 better than with rate 1 while a request takes under 4 s (about 0.2 s on
    2 idle cores, 2 s at a load average of 20). One at a time it would stop at 4/3 s, which a
    load average of 20 passed (0.58 req/s at both rates)."""
    for concurrency, points in sweep.points.groupby("max_concurrency"):
        points = points.sort_values("request_rate")
        slow, fast = points["request_throughput"]
        e2el_s = points["e2el_mean_ms"].iloc[-1] / 1000
        assert fast > slow, f"concurrency {concurrency}: {slow:.2f} then {fast:.2f} req/s, mean E2EL {e2el_s:.2f} s"


def test_littles_law_holds(sweep: Sweep) -> None:
    """Requests in flight on average, counted from each request's own send time and latency on
    a 1 ms grid over the point, against request throughput x mean end-to-end latency."""
    for point in sweep.points.itertuples():
        requests = sweep.requests[sweep.requests["run_id"] == point.run_id]
        grid = np.arange(0.0, point.duration_s, 0.001)
        starts = requests["send_s"].to_numpy()[:, None]
        ends = starts + requests["e2el_ms"].to_numpy()[:, None] / 1000
        in_flight = ((grid >= starts) & (grid < ends)).sum(axis=0).mean()
        expected = point.request_throughput * point.e2el_mean_ms / 1000
        assert in_flight == pytest.approx(expected, rel=0.15), (point.request_rate, point.max_concurrency)


def test_the_engine_and_its_children_are_gone(sweep: Sweep) -> None:
    left = []
    for process in psutil.process_iter(["cmdline"]):
        if str(sweep.model) in " ".join(process.info["cmdline"] or []):
            left.append(process)
    assert not left
