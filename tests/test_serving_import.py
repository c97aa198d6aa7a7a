"""`tpubench import vllm-bench` and `tpubench import sglang`: files written here with the fields
`vllm bench serve --save-result --save-detailed` and `sglang.bench_serving --output-details`
write (vllm/benchmarks/serve.py, sglang/bench_serving.py) become serving points and requests
whose figures are the files' own; what a file lacks is null; bad input is one line, exit 2,
nothing written. And the serving analyses (tpubench/analysis/serving.py) over those points."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
from helpers import in_process, tpubench

from tpubench import store
from tpubench.analysis import serving
from tpubench.analysis.prices import PRICES

H100 = "NVIDIA H100 80GB HBM3"

#: a vLLM result as `vllm bench serve --save-result --save-detailed --goodput ttft:100 tpot:10
#: --metadata version=0.11.0 tp=2 --metric-percentiles 50,90,99 --percentile-metrics ttft,tpot,itl,e2el`
#: writes it (times in the per-request arrays in seconds); the third request failed
VLLM = {
    "date": "20261201-101500",
    "endpoint_type": "vllm",
    "backend": "vllm",
    "label": None,
    "model_id": "meta-llama/Llama-3.1-8B",
    "tokenizer_id": "meta-llama/Llama-3.1-8B",
    "num_prompts": 3,
    "version": "0.11.0",
    "tp": "2",
    "request_rate": 4.0,
    "burstiness": 1.0,
    "max_concurrency": 8,
    "duration": 2.5,
    "completed": 2,
    "failed": 1,
    "total_input_tokens": 200,
    "total_output_tokens": 30,
    "request_throughput": 0.8,
    "request_goodput": 0.4,
    "output_throughput": 12.0,
    "total_token_throughput": 92.0,
    "input_lens": [100, 100, 100],
    "output_lens": [11, 21, 0],
    "ttfts": [0.05, 0.07, 0.0],
    "itls": [[0.01, 0.02], [0.03], []],
    "latencies": [0.15, 0.27, 0.0],
    "start_times": [1000.25, 1000.5, 1001.0],
    "generated_texts": ["a", "b", ""],
    "errors": ["", "", "HTTP 500"],
    "max_output_tokens_per_s": 20.0,
    "max_concurrent_requests": 2,
    **{f"{stat}_{metric}_ms": value for metric, base in (("ttft", 60), ("tpot", 5), ("itl", 20), ("e2el", 210))
       for stat, value in (("mean", base), ("median", base + 0.5), ("std", 3.0), ("p50", base + 0.5),
                           ("p90", base * 1.5), ("p99", base * 2))},
}  # fmt: skip

#: SGLang's lines as `sglang.bench_serving --output-file F` appends them: a rate of inf (json
#: writes Infinity) with --output-details, and a rate of 4 without
SGLANG_LINE = {
    "backend": "sglang",
    "dataset_name": "random",
    "request_rate": math.inf,
    "max_concurrency": 64,
    "sharegpt_output_len": None,
    "random_input_len": 1024,
    "random_output_len": 128,
    "random_range_ratio": 1.0,
    "duration": 10.0,
    "completed": 2,
    "total_input_tokens": 2048,
    "total_output_tokens": 256,
    "total_output_tokens_retokenized": 255,
    "request_throughput": 0.2,
    "input_throughput": 204.8,
    "output_throughput": 25.6,
    "mean_e2e_latency_ms": 900.0,
    "median_e2e_latency_ms": 880.0,
    "std_e2e_latency_ms": 20.0,
    "p99_e2e_latency_ms": 990.0,
    "mean_ttft_ms": 100.0,
    "median_ttft_ms": 95.0,
    "std_ttft_ms": 5.0,
    "p99_ttft_ms": 120.0,
    "mean_tpot_ms": 6.3,
    "median_tpot_ms": 6.2,
    "std_tpot_ms": 0.1,
    "p99_tpot_ms": 6.6,
    "mean_itl_ms": 6.3,
    "median_itl_ms": 6.1,
    "std_itl_ms": 0.4,
    "p95_itl_ms": 7.0,
    "p99_itl_ms": 8.0,
    "concurrency": 0.18,
    "accept_length": None,
}
SGLANG_DETAILS = {
    "input_lens": [1024, 1024],
    "output_lens": [128, 128],
    "ttfts": [0.1, 0.09],
    "itls": [[0.006] * 3, [0.0065] * 2],
    "generated_texts": ["x", "y"],
    "errors": ["", ""],
}

#: the serving table's columns each tool's figure lands in
VLLM_FIGURES = {
    "duration_s": "duration",
    "completed": "completed",
    "failed": "failed",
    "total_input_tokens": "total_input_tokens",
    "total_output_tokens": "total_output_tokens",
    "request_throughput": "request_throughput",
    "request_goodput": "request_goodput",
    "output_throughput": "output_throughput",
    "total_token_throughput": "total_token_throughput",
    "max_concurrent_requests": "max_concurrent_requests",
    "request_rate": "request_rate",
    "burstiness": "burstiness",
    "max_concurrency": "max_concurrency",
    "num_prompts": "num_prompts",
    **{f"{metric}_{stat}_ms": f"{key}_{metric}_ms" for metric in ("ttft", "tpot", "itl", "e2el")
       for stat, key in (("mean", "mean"), ("p50", "median"), ("p90", "p90"), ("p99", "p99"))},
}  # fmt: skip
SGLANG_FIGURES = {
    "duration_s": "duration",
    "completed": "completed",
    "total_input_tokens": "total_input_tokens",
    "total_output_tokens": "total_output_tokens",
    "request_throughput": "request_throughput",
    "output_throughput": "output_throughput",
    "request_rate": "request_rate",
    "max_concurrency": "max_concurrency",
    "input_len": "random_input_len",
    "output_len": "random_output_len",
    "dataset": "dataset_name",
    **{f"{metric}_{stat}_ms": f"{key}_{name}_ms" for metric, name in (("ttft", "ttft"), ("tpot", "tpot"),
       ("itl", "itl"), ("e2el", "e2e_latency")) for stat, key in (("mean", "mean"), ("p50", "median"), ("p99", "p99"))},
}  # fmt: skip


def write_vllm(path: Path, *records: dict) -> Path:
    """As vLLM writes it: one json.dump per record, newline-separated with --append-result."""
    path.write_text("\n".join(json.dumps(record) for record in records))
    return path


def write_sglang(path: Path, *lines: dict) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def serving_rows(results: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    return store.load_table(results, "serving"), store.load_table(results, "serving_requests")


def test_a_vllm_result_is_stored_with_the_files_figures_and_requests(tmp_path: Path) -> None:
    """Through the real command: every figure equals the file's, each request's times are the
    file's seconds in ms, its TPOT vLLM's definition, the failed request's times null."""
    appended = {**VLLM, "request_rate": "inf", "max_concurrency": None, "input_lens": None}
    for key in ("ttfts", "itls", "latencies", "start_times", "errors", "output_lens", "generated_texts", "input_lens"):
        appended.pop(key)
    file = write_vllm(tmp_path / "vllm-4.0qps.json", VLLM, appended)
    slos = ("--goodput", "ttft:100", "--goodput", "tpot:10")  # repeatable, as tpubench serving's
    done = tpubench(f"import vllm-bench {file} --device", H100, *slos, "--results", str(tmp_path / "results"))
    assert done.returncode == 0, done.stderr
    assert "imported 2 serving points and 3 requests" in done.stdout
    points, requests = serving_rows(tmp_path / "results")
    first, second = points.sort_values("request_rate").to_dict("records")
    for column, key in VLLM_FIGURES.items():
        assert first[column] == VLLM[key], column
    assert second["request_rate"] == math.inf and pd.isna(second["max_concurrency"])
    for point in (first, second):
        assert point["source"] == "vllm-bench:vllm-4.0qps.json" and point["status"] == "ok"
        assert (point["engine"], point["engine_version"], point["tp_size"]) == ("vllm", "0.11.0", 2)
        assert point["model"] == "meta-llama/Llama-3.1-8B" and point["device"] == H100
        assert point["goodput_slos"] == "ttft:100 tpot:10"
        assert point["finished_at"] == pd.Timestamp("2026-12-01 10:15:00", tz="UTC")
        assert point["started_at"] == pd.Timestamp("2026-12-01 10:14:57.5", tz="UTC")
        price = 2 * PRICES["H100 SXM"].usd_per_chip_hour  # the table's, for the two devices of tp 2
        assert point["price_per_hour"] == price
        assert point["cost_per_m_output_tokens"] == pytest.approx(price / (12.0 * 3600) * 1e6)
    mine = requests[requests["run_id"] == first["run_id"]].sort_values("request").to_dict("records")
    assert [r["input_len"] for r in mine] == [100, 100, 100] and [r["output_len"] for r in mine] == [11, 21, 0]
    assert [r["ttft_ms"] for r in mine[:2]] == pytest.approx([50.0, 70.0])
    assert [r["e2el_ms"] for r in mine[:2]] == pytest.approx([150.0, 270.0])
    assert [r["tpot_ms"] for r in mine[:2]] == pytest.approx([(150 - 50) / 10, (270 - 70) / 20])
    assert list(mine[0]["itl_ms"]) == pytest.approx([10.0, 20.0]) and list(mine[1]["itl_ms"]) == pytest.approx([30.0])
    assert [r["send_s"] for r in mine] == pytest.approx([0.0, 0.25, 0.75])
    failed = mine[2]
    assert failed["error"] == "HTTP 500" and pd.isna(failed["ttft_ms"]) and pd.isna(failed["e2el_ms"])
    assert failed["itl_ms"] is None and pd.isna(failed["tpot_ms"])
    assert all(pd.isna(r["error"]) for r in mine[:2])
    assert not (requests["run_id"] == second["run_id"]).any()  # saved without --save-detailed


def test_sglang_lines_are_stored_with_the_files_figures_and_nothing_it_lacks(tmp_path: Path) -> None:
    """SGLang names e2e latency its own way, has no p90, no total throughput and no goodput: those
    stay null; its per-request arrays have no end-to-end latency, so no TPOT either."""
    detailed = {**SGLANG_LINE, **SGLANG_DETAILS}
    second = {**SGLANG_LINE, "request_rate": 4.0, "completed": 0, "request_throughput": 0.0}
    file = write_sglang(tmp_path / "sglang_1206.jsonl", detailed, second)
    done = in_process("import sglang", file, "--model", "Qwen/Qwen3-8B", "--device", "TPU v6e", "--results",
                      tmp_path / "results")  # fmt: skip
    assert done.returncode == 0, done.stderr
    points, requests = serving_rows(tmp_path / "results")
    inf, four = points.sort_values("request_rate", ascending=False).to_dict("records")
    for column, key in SGLANG_FIGURES.items():
        assert inf[column] == SGLANG_LINE[key], column
    for column in ("ttft_p90_ms", "tpot_p90_ms", "itl_p90_ms", "e2el_p90_ms", "total_token_throughput",
                   "request_goodput", "failed", "burstiness", "cold_start_s"):  # fmt: skip
        assert pd.isna(inf[column]), column
    assert inf["engine"] == "sglang" and inf["source"] == "sglang:sglang_1206.jsonl" and inf["status"] == "ok"
    assert (four["status"], four["error"]) == ("failed", "no request completed")
    assert pd.isna(inf["price_per_hour"]) and pd.isna(inf["cost_per_m_output_tokens"])  # v6e: no price read
    assert len(requests) == 2 and set(requests["run_id"]) == {inf["run_id"]}
    assert sorted(requests["ttft_ms"]) == pytest.approx([90.0, 100.0])
    assert requests["e2el_ms"].isna().all() and requests["tpot_ms"].isna().all()


@pytest.mark.parametrize(
    ("tool", "content", "options", "said"),
    [
        ("vllm-bench", None, "", "no such file"),
        ("vllm-bench", "this is not json\n", "", "not JSON (line 1"),
        ("sglang", "[1, 2]", "", "line 1 is a JSON list"),
        ("sglang", "", "", "empty"),
        ("vllm-bench", json.dumps(SGLANG_LINE), "", "tpubench import sglang"),
        ("sglang", json.dumps(VLLM), "", "tpubench import vllm-bench"),
        ("vllm-bench", json.dumps({**VLLM, "completed": "two"}), "", "completed is 'two', not a number"),
        ("vllm-bench", json.dumps({**VLLM, "backend": "openai"}), "", "name it with --engine"),
        ("vllm-bench", json.dumps({**VLLM, "ttfts": [0.1]}), "", "per-request arrays differ in length"),
        ("sglang", json.dumps(SGLANG_LINE), "", "names no model; give it with --model"),
        ("vllm-bench", json.dumps(VLLM), "--model other/model", "--model says 'other/model'"),
        ("vllm-bench", json.dumps(VLLM), "--goodput ttft=100", "NAME one of ttft, tpot, e2el"),
        ("vllm-bench", json.dumps(VLLM), "--price-per-hour -1", "positive USD per hour"),
        ("vllm-bench", json.dumps(VLLM), "--tag nokey", "--tag expects KEY=VALUE"),
    ],
)
def test_bad_input_is_one_line_and_nothing_is_written(
    tmp_path: Path, tool: str, content: str | None, options: str, said: str
) -> None:
    file = tmp_path / "result.json"
    if content is not None:
        file.write_text(content)
    done = in_process(f"import {tool}", file, *options.split(), "--results", tmp_path / "results")
    assert done.returncode == 2, done.stdout
    assert done.stderr.startswith("error: ") and done.stderr.count("\n") == 1, done.stderr
    assert said in done.stderr
    assert not (tmp_path / "results" / "serving").exists()


def points_frame(rows: list[dict]) -> pd.DataFrame:
    """Serving rows as the store reads them: every column, the rest null."""
    return store.to_table(rows, "serving").to_pandas()


def test_curves_price_goodput_and_cold_start_per_engine_and_chip() -> None:
    """Two engines on two chips: a line each, ordered by throughput; the H100's points priced
    from the table, a stored price kept, a chip without one unpriced; each line's goodput marker
    is its highest goodput; one cold start per sweep."""
    base = {"status": "ok", "model": "m", "engine_version": "1", "burstiness": 1.0, "goodput_slos": "tpot:50"}
    rows = [
        {**base, "run_id": "a1", "invocation_id": "s1", "engine": "vllm", "device": H100, "request_rate": 4.0,
         "output_throughput": 400.0, "request_throughput": 4.0, "request_goodput": 3.0, "tpot_p50_ms": 20.0,
         "cold_start_s": 30.0},
        {**base, "run_id": "a0", "invocation_id": "s1", "engine": "vllm", "device": H100, "request_rate": 1.0,
         "output_throughput": 100.0, "request_throughput": 1.0, "request_goodput": 1.0, "tpot_p50_ms": 10.0,
         "cold_start_s": 30.0},
        {**base, "run_id": "a2", "invocation_id": "s2", "engine": "vllm", "device": H100, "request_rate": 16.0,
         "output_throughput": 900.0, "request_throughput": 9.0, "request_goodput": 2.0, "tpot_p50_ms": 80.0,
         "cold_start_s": 50.0},
        {**base, "run_id": "b0", "invocation_id": "s3", "engine": "vllm-tpu", "device": "TPU v9z",
         "request_rate": 1.0, "output_throughput": 50.0, "request_throughput": 0.5, "tpot_p50_ms": 12.0,
         "price_per_hour": 2.0, "tp_size": 4},
        {**base, "run_id": "c0", "invocation_id": "s4", "engine": "sglang", "device": "Chip X", "request_rate": 1.0,
         "output_throughput": 10.0, "status": "failed"},
    ]  # fmt: skip
    points = points_frame(rows)
    lines = serving.curves(points, PRICES)
    assert list(lines["run_id"]) == ["a0", "a1", "a2", "b0"]  # the failed point is no curve's
    assert set(lines["line"]) == {f"vllm 1 on {H100}", "vllm-tpu 1 on TPU v9z tp4"}
    h100 = PRICES["H100 SXM"].usd_per_chip_hour
    assert lines.loc[0, "usd_per_hour"] == h100
    assert lines.loc[0, "output_tokens_per_usd"] == pytest.approx(100 * 3600 / h100)
    assert lines.loc[0, "cost_per_m_output_tokens"] == pytest.approx(h100 / (100 * 3600) * 1e6)
    assert lines.loc[3, "usd_per_hour"] == 2.0  # stored: all its devices' hour
    unpriced = serving.curves(points_frame([{**rows[3], "price_per_hour": None}]), PRICES)
    assert unpriced["cost_per_m_output_tokens"].isna().all()  # no entry for TPU v9z: no borrowed price
    marked = serving.goodput_points(lines)
    assert list(marked["run_id"]) == ["a1"] and marked.loc[0, "good_share"] == pytest.approx(0.75)
    assert serving.slo_bound(lines, "tpot_p99_ms") == 50.0 and serving.slo_bound(lines, "ttft_p50_ms") is None
    starts = serving.cold_starts(points).set_index("line")
    assert starts.loc[f"vllm 1 on {H100}", ["sweeps", "median_s", "min_s", "max_s"]].tolist() == [2, 40.0, 30.0, 50.0]
    assert len(starts) == 1  # the others measured none (imported points)


def test_decode_runs_are_static_batch_points_of_their_model() -> None:
    """A decode run is a point of its workload/size, or of the hub id it loaded with hf:, a line
    per backend, device and shape, output tok/s its throughput; train runs and failed runs none."""
    base = {"status": "ok", "mode": "decode", "backend": "cuda", "device": H100, "seq_len": 128, "gen_len": 32,
            "invocation_id": "i", "devices": 1, "tpot_p50_ms": 5.0, "ttft_p50_ms": 9.0,
            "tokens_per_s": 100.0}  # fmt: skip
    runs = pd.DataFrame(
        [
            {**base, "run_id": "r2", "workload": "gpt2", "size": "tiny", "batch_size": 8, "output_tokens_per_s": 800.0},
            {**base, "run_id": "r1", "workload": "gpt2", "size": "tiny", "batch_size": 1, "output_tokens_per_s": 120.0},
            {**base, "run_id": "r3", "workload": "hf:Llama-3.1-8B", "size": "default", "batch_size": 1,
             "model_ref": json.dumps({"route": "hf", "target": "meta-llama/Llama-3.1-8B"})},
            {**base, "run_id": "r4", "workload": "gpt2", "size": "tiny", "batch_size": 2, "mode": "train"},
            {**base, "run_id": "r5", "workload": "gpt2", "size": "tiny", "batch_size": 4, "status": "failed"},
        ]
    )  # fmt: skip
    batch = serving.static_batch(runs, PRICES)
    assert list(batch["run_id"]) == ["r1", "r2", "r3"]
    assert list(batch["model"]) == ["gpt2/tiny", "gpt2/tiny", "meta-llama/Llama-3.1-8B"]
    assert list(batch["output_throughput"]) == [120.0, 800.0, 100.0]  # tokens_per_s where no output figure
    assert set(batch["kind"]) == {"static batch"} and list(batch["load"]) == ["batch 1", "batch 8", "batch 1"]
    assert batch.loc[0, "line"] == f"static batch: cuda on {H100}, prompt 128, 32 generated"
    assert batch.loc[0, "usd_per_hour"] == PRICES["H100 SXM"].usd_per_chip_hour
    points = points_frame([{"run_id": "p", "model": "meta-llama/Llama-3.1-8B", "status": "ok", "engine": "vllm"}])
    assert serving.models(points, runs) == ["meta-llama/Llama-3.1-8B", "gpt2/tiny"]
