"""The dashboard on a store written by real `tpubench run`s of tiny workloads: every page through
Streamlit's AppTest, the URL state, the empty store, bad input and corrupt files; and the
whole thing served by `tpubench dashboard` and driven in headless Chromium."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import socket
import subprocess
import urllib.request
from datetime import date
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import ROOT, command, in_process, tpubench, wait_for
from multi_device_rows import run_row, write_runs
from streamlit.testing.v1 import AppTest

from dashboard import RESULTS_ENV, STORE_SEPARATOR, catalog, data
from tpubench import store, store_compact
from tpubench.analysis import ceilings as ceilings_analysis
from tpubench.analysis import compare
from tpubench.analysis.prices import PRICES

APP = ROOT / "dashboard" / "app.py"
TINY = "--workload gpt2 --size tiny --backend cpu --steps 5 --warmup 1"
#: where the browser test leaves its screenshots (gitignored)
SCREENSHOTS = ROOT / "tests" / "screenshots"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A failed run, a decode sweep, a data-parallel sweep over 1 and 2 (simulated) devices,
    then two nights of profiled train and infer runs (with an unavailable cuda backend asked
    for by name); oldest first, so the second night is the latest."""
    path = tmp_path_factory.mktemp("dashboard") / "results"
    faults = {"TPUBENCH_WORKLOAD_MODULES": "fault_workloads", "PYTHONPATH": str(ROOT / "tests")}
    night = f"{TINY} --backend cuda --mode infer --mode train --batch-size 2 --seq-len 32 --profile --profile-steps 2"
    lines = [
        ("--workload fault-raise --backend cpu --mode infer --steps 1", faults),
        (f"{TINY} --mode decode --batch-size 1,2 --prompt-len 16,32 --gen-len 4", None),
        (f"{TINY} --mode train --batch-size 2 --seq-len 32 --devices 1,2 --parallel dp", None),
        (f"{night} --tag night=1", None),
        (f"{night} --tag night=2", None),
    ]
    for line, env in lines:  # in this process: its fork server serves every run (helpers.in_process)
        done = in_process(f"run {line} --results", path, env=env, starts_runs=True)
        assert done.returncode == 0, done.stderr
    return path


def relabel(results: Path, **columns: object) -> None:
    """Rewrite ``columns`` of every ok run in ``results`` (the parquet, in place): another
    machine's runs, or runs measured on a busy host, from runs measured here."""
    for path in (results / "runs").glob("date=*/*.parquet"):
        table = pq.read_table(path)
        ok = [status == "ok" for status in table["status"].to_pylist()]
        for name, value in columns.items():
            index = table.schema.get_field_index(name)
            values = [value if keep else old for keep, old in zip(ok, table[name].to_pylist(), strict=True)]
            table = table.set_column(index, table.schema.field(index), pa.array(values, table[name].type))
        pq.write_table(table, path)


@pytest.fixture(scope="module")
def merged(results: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """Two machines' stores and their merge, as docs/dashboard.md's 'Several machines' has it: machine A's
    is a copy of ``results`` plus a third night; machine B ran its own shape (another device
    kind's default) twice, one night before A's third, one after, and measured a matmul ceiling
    (of the CPU both share here, so A's runs read MFU against it). Returns (A, B, merged)."""
    root = tmp_path_factory.mktemp("machines")
    machine_a, machine_b = root / "a", root / "b"
    shutil.copytree(results, machine_a)
    done = in_process(
        "ceilings --backend cpu --kind matmul --max-size 128 --dtype float32 --results", machine_b, starts_runs=True
    )
    assert done.returncode == 0, done.stderr
    for target, line in (
        (machine_b, f"{TINY} --mode infer --batch-size 3 --seq-len 16 --tag night=1"),
        (machine_a, f"{TINY} --mode infer --batch-size 2 --seq-len 32 --tag night=3"),
        (machine_b, f"{TINY} --mode infer --batch-size 3 --seq-len 16 --tag night=2"),
    ):
        done = in_process(f"run {line} --results", target, starts_runs=True)
        assert done.returncode == 0, done.stderr
    relabel(machine_b, host="machine-b", device="Other CPU")
    (root / "merged").mkdir()
    subprocess.run(["cp", "-rn", f"{machine_a}/.", f"{machine_b}/.", str(root / "merged")], check=True)
    return machine_a, machine_b, root / "merged"


@pytest.fixture
def serve(monkeypatch: pytest.MonkeyPatch):
    """An AppTest of the dashboard over a store, opened at a page with query parameters, as a link would."""

    def open_at(results: Path | str, page: str | None = None, **params: str | list[str]) -> AppTest:
        monkeypatch.setenv(RESULTS_ENV, str(results))
        app = AppTest.from_file(str(APP), default_timeout=120)
        if page:
            app.switch_page(catalog.BY_TITLE[page].path)
        app.query_params.update(params)
        app.run()
        assert not app.exception, app.exception[0].value
        return app

    return open_at


def texts(app: AppTest) -> str:
    """Everything the page says in text elements (markdown, captions, alerts, code)."""
    kinds = ("markdown", "caption", "info", "warning", "error", "success", "code")
    parts = [element.value for kind in kinds for element in app.get(kind)]
    return "\n".join(str(part) for part in parts)


def frames(app: AppTest) -> list[pd.DataFrame]:
    return [element.value for element in app.dataframe]


def charts(app: AppTest) -> int:
    return len(app.get("plotly_chart"))


def runs_of(results: Path) -> pd.DataFrame:
    return store.load_runs(results).sort_values("started_at", ignore_index=True)


def test_overview_shows_the_latest_invocation_as_a_matrix_with_what_did_not_run(serve, results: Path) -> None:
    app = serve(results)
    assert app.title[0].value == "Overview"
    runs = runs_of(results)
    latest = runs[runs["invocation_id"] == runs["invocation_id"].iloc[-1]]
    assert app.selectbox(key="invocation").value == latest["invocation_id"].iloc[0]
    matrix, problems = frames(app)[0], frames(app)[-1]  # between them, the runs measured on a busy host if any
    device = latest.loc[latest["backend"] == "cpu", "device"].iloc[0]
    assert set(matrix.columns) == {f"cpu ({device})", "cuda (no device)"}
    assert set(matrix["cuda (no device)"]) == {"✗ unavailable"}
    busy = " ⚠"  # a cell whose runs met a busy host (this shared machine often is) is marked
    medians = matrix[f"cpu ({device})"].str.removesuffix(busy).str.replace(",", "")  # thousands separated
    assert medians.map(float).gt(0).all(), matrix  # median step in ms
    assert set(problems["status"]) == {"unavailable"} and problems["reason"].str.len().gt(0).all()
    assert charts(app) == 2  # the step times, and each run's memory by part
    app.radio(key="value").set_value("status").run()
    assert set(frames(app)[0][f"cpu ({device})"].str.removesuffix(busy)) == {"ok"}


def test_compare_gives_the_verdicts_of_tpubench_compare(serve, results: Path) -> None:
    app = serve(results, "Compare")
    nights = data.invocations(runs_of(results))["invocation_id"]
    assert f"invocation={nights.iloc[1]}" in texts(app) and f"invocation={nights.iloc[0]}" in texts(app)
    verdicts = frames(app)[-1]
    assert "step (ms)" in set(verdicts["metric"])
    # one run a side cannot show its own noise: never a regression on timing alone
    assert not (verdicts["metric"].eq("step (ms)") & verdicts["verdict"].eq("regressed")).any()
    # and so the page's headline says nothing was decided, never "no regression"
    assert "**Inconclusive** (no regression shown" in texts(app) and "No regression" not in texts(app)
    assert charts(app) == 2  # each side's step time, and the change with its CI
    app.toggle(key="all").set_value(True).run()
    every = frames(app)[-1]
    assert "peak_mem (MiB)" in set(every["metric"])
    # the library's comparison of the same two invocations, row for row
    runs, steps = store.load_runs(results), store.load_steps(results)
    sides = [runs[runs["invocation_id"] == night] for night in (nights.iloc[1], nights.iloc[0])]
    expected = compare.compare_runs(*sides, steps, steps)
    assert sorted(zip(every["metric"].str.split(" ").str[0], every["verdict"], every["p"].fillna(-1), strict=True)) == (
        sorted(zip(expected["metric"], expected["verdict"], expected["p_value"].fillna(-1), strict=True))
    )
    # a filter that hides a configuration leaves the other's rows as they were (their bootstraps
    # come from the cache kept per configuration, so they had better be the same rows)
    app.sidebar.multiselect(key="mode").set_value(["train"]).run()
    train = frames(app)[-1]
    assert set(train["configuration"]) == {c for c in every["configuration"] if " train " in f" {c} "}
    pd.testing.assert_frame_equal(
        train.reset_index(drop=True), every[every["configuration"].isin(train["configuration"])].reset_index(drop=True)
    )
    app.sidebar.multiselect(key="mode").set_value([]).run()
    app.radio(key="how").set_value("backends").run()
    # a GPU is the baseline where there is one
    assert app.selectbox(key="base_backend").value == "cuda" and app.selectbox(key="test_backend").value == "cpu"
    assert not app.exception


@pytest.mark.parametrize("how", ["merged", "two stores"])
def test_compare_pairs_the_latest_night_with_the_last_that_ran_its_configurations(
    serve, merged: tuple[Path, Path, Path], how: str
) -> None:
    """On a store merged from two machines, "the latest against the one before"
    compared machine B's night with machine A's, which ran other shapes on another device:
    nothing paired. Now B's latest pairs with B's night before, and the page says which
    invocation it passed over and why; the same over the two stores given as several --results."""
    machine_a, machine_b, merged_store = merged
    shown = merged_store if how == "merged" else STORE_SEPARATOR.join([str(machine_a), str(machine_b)])
    app = serve(shown, "Compare")
    b_nights = data.invocations(runs_of(machine_b))["invocation_id"]
    said = texts(app)
    assert f"invocation={b_nights.iloc[1]}" in said and f"invocation={b_nights.iloc[0]}" in said, said
    assert "Passed over 1 more recent invocation(s)" in said
    verdicts = frames(app)[-1]
    assert not verdicts["verdict"].eq("unpaired").all() and "step (ms)" in set(verdicts["metric"])
    command = app.get("code")[0].value
    assert (
        command.startswith("tpubench compare --baseline")
        and f"--results {machine_b if how != 'merged' else merged_store}" in command
    )
    assert app.get("code")[0].proto.wrap_lines  # never cut off at the page's edge
    if how == "two stores":
        assert f"`{machine_a}`" in app.sidebar.caption[0].value and f"`{machine_b}`" in app.sidebar.caption[0].value
        overview = serve(shown, "Overview", invocation=b_nights.iloc[0])
        assert any(column.startswith("cpu (Other CPU)") for column in frames(overview)[0].columns)


@pytest.mark.parametrize("page", [page.title for page in catalog.PAGES])
def test_every_page_reads_two_stores_one_with_ceilings(
    serve, results: Path, merged: tuple[Path, Path, Path], page: str
) -> None:
    """`tpubench dashboard --results A --results B` where B has ceilings: Overview, Ceilings and
    Ops raised "unhashable type: 'numpy.ndarray'" (the merge dropped duplicate rows by every
    column, the ceilings' lists of samples too). Every page opens (``serve`` fails on an
    exception); the Ceilings page shows B's sweep as `tpubench ceilings --show` does."""
    machine_b = merged[1]
    app = serve(STORE_SEPARATOR.join([str(results), str(machine_b)]), page)
    if page == "Ceilings":
        shown = ceilings_analysis.summary(store.scan_table(machine_b, "ceilings"))
        assert len(frames(app)[0]) == len(shown) > 0 and charts(app) == 1


def test_a_store_given_twice_reads_its_ceilings_once(merged: tuple[Path, Path, Path]) -> None:
    """Rows that two stores share (a store copied into another) count once, list columns and
    all; rows that differ only in their samples are both kept."""
    machine_b = str(merged[1])
    swept = store.scan_table(machine_b, "ceilings")
    twice = data._scan(STORE_SEPARATOR.join([machine_b, str(merged[2])]), "ceilings").frame
    assert len(twice) == len(swept) and twice["samples_s"].map(len).tolist() == swept["samples_s"].map(len).tolist()
    other = swept.assign(samples_s=swept["samples_s"].map(lambda samples: samples * 2))
    reads = {machine_b: swept, "other": other}
    both = data._scan(STORE_SEPARATOR.join(reads), "ceilings", read=lambda where, *_a, **_k: reads[where]).frame
    assert len(both) == 2 * len(swept)


def test_compare_reports_a_bad_selector_in_one_line(serve, results: Path) -> None:
    app = serve(results, "Compare", how="custom", baseline="sha=", candidate="nonsense~")
    assert not app.exception
    assert app.error and "nonsense~" in app.error[0].value
    app.text_input(key="baseline").set_value("tag.night=1").run()
    app.text_input(key="candidate").set_value("tag.night=2").run()
    assert not app.error and frames(app)[-1]["verdict"].notna().all()
    app.text_input(key="candidate").set_value("tag.night=1").run()
    assert "share" in app.error[0].value  # a run compared with itself


def test_trends_draws_each_series_with_its_runs(serve, results: Path) -> None:
    app = serve(results, "Trends")
    shown = app.multiselect(key="series").value
    assert shown and all("gpt2/tiny" in series for series in shown)
    assert charts(app) == 1
    assert "No change point" in texts(app)  # two nights: a shift must last three on each side
    app.selectbox(key="metric").set_value("tokens_per_s").run()
    assert charts(app) == 1 and not app.exception


def test_trends_follows_serving_series_with_their_change_points(serve, tmp_path: Path) -> None:
    """Trends on a store of serving sweeps alone: one series per configuration and load (the
    engine version not part of it), the change points of `tpubench regressions --serving`."""
    from test_serving_compare import write_sweep

    for night in range(8):
        write_sweep(tmp_path, seed=night, night=night, tpot_ms=10.0 if night < 4 else 12.0,
                    engine_version="0.11.0" if night < 4 else "0.12.0", requests_per_point=10)  # fmt: skip
    app = serve(tmp_path, "Trends", kind="serving", serving_window="all")
    assert app.multiselect(key="serving_series").options == [
        "tiny-llama random 64/32, vllm on NVIDIA H100, rate 4/s",
        "tiny-llama random 64/32, vllm on NVIDIA H100, rate inf, concurrency 8",
    ]
    assert charts(app) == 1
    changes = frames(app)[0]
    assert list(changes["direction"]) == ["regression"] * 2 and set(changes["engine version"]) == {"0.12.0"}
    app.radio(key="kind").set_value("runs").run()  # a store without runs says so
    assert not app.exception and "the store holds none" in texts(app)


def test_serving_shows_the_decode_sweep(serve, results: Path) -> None:
    app = serve(results, "Serving")
    assert app.selectbox(key="model").value == "gpt2/tiny"
    percentiles = frames(app)[0]
    assert sorted(zip(percentiles["batch"], percentiles["prompt"], strict=True)) == [(1, 16), (1, 32), (2, 16), (2, 32)]
    assert percentiles["TPOT p50 ms"].gt(0).all() and percentiles["output tokens/s"].gt(0).all()
    assert charts(app) == 3  # TPOT, tokens/s, TTFT; a CPU has no bandwidth peak, which the page says
    assert "no peak bandwidth" in texts(app)


def vllm_points(model: str) -> list[dict]:
    """`vllm bench serve` results at three rates (--goodput tpot:30), as --append-result writes them."""
    figures = {"duration": 10.0, "completed": 100, "failed": 0, "total_input_tokens": 10_000,
               "total_output_tokens": 4_000, "total_token_throughput": 1_400.0, "backend": "vllm", "model_id": model,
               "burstiness": 1.0}  # fmt: skip
    rates = ((1.0, 100.0, 10.0, 1.0), (4.0, 350.0, 20.0, 3.5), ("inf", 600.0, 60.0, 1.5))
    return [
        {**figures, "request_rate": rate, "output_throughput": tokens, "request_throughput": tokens / 40,
         "median_tpot_ms": tpot, "p99_tpot_ms": tpot * 1.5, "median_ttft_ms": 40.0, "p99_ttft_ms": 90.0,
         "request_goodput": good}
        for rate, tokens, tpot, good in rates
    ]  # fmt: skip


def sglang_point(model: str) -> dict:
    return {"backend": "sglang", "dataset_name": "random", "request_rate": 2.0, "max_concurrency": None,
            "duration": 10.0, "completed": 50, "total_input_tokens": 5_000, "total_output_tokens": 2_000,
            "request_throughput": 5.0, "input_throughput": 500.0, "output_throughput": 200.0,
            "mean_e2e_latency_ms": 900.0, "median_ttft_ms": 30.0, "p99_ttft_ms": 70.0, "median_tpot_ms": 8.0,
            "p99_tpot_ms": 12.0, "model_id": model}  # fmt: skip


def import_points(results: Path, folder: Path, model: str) -> None:
    """A vLLM result on an H100 (priced by the table) and an SGLang line on a TPU v5e, imported."""
    vllm, sglang = folder / "vllm.json", folder / "sglang.jsonl"
    vllm.write_text("\n".join(json.dumps(record) for record in vllm_points(model)))
    sglang.write_text(json.dumps(sglang_point(model)) + "\n")
    for line, file, device in (
        ("import vllm-bench", vllm, "NVIDIA H100 80GB HBM3"),
        ("import sglang", sglang, "TPU v5 lite"),
    ):
        done = in_process(line, file, "--device", device, "--goodput", "tpot:30", "--results", results)
        assert done.returncode == 0, done.stderr


def plotted(app: AppTest) -> list[dict]:
    return [json.loads(chart.proto.spec) for chart in app.get("plotly_chart")]


def test_serving_draws_each_engine_on_its_chip_beside_the_static_batch(serve, results: Path, tmp_path: Path) -> None:
    """Imported vLLM and SGLang points of gpt2/tiny beside the store's decode sweep: latency by
    output tok/s with a line per engine on a chip and a dashed static-batch line per decode shape
    (its points the decode runs' own tokens/s), the best goodput starred at the vLLM line's point of
    highest goodput (rate 4), the TPOT SLO drawn; by tok/s per dollar, the priced lines only (the
    CPU has no price); and the decode sweep's own charts and table as before."""
    store_dir = tmp_path / "results"
    shutil.copytree(results, store_dir)
    import_points(store_dir, tmp_path, "gpt2/tiny")
    app = serve(store_dir, "Serving")
    assert app.selectbox(key="model").value == "gpt2/tiny"
    curves, per_dollar, *decode = plotted(app)
    names = [trace["name"] for trace in curves["data"]]
    h100, v5e = "vllm on NVIDIA H100 80GB HBM3", "sglang on TPU v5 lite"
    static = [name for name in names if name.startswith("static batch: cpu on ")]
    assert {h100, v5e, "best goodput at the SLO"} <= set(names) and len(static) == 2  # prompt 16 and 32
    traces = {trace["name"]: trace for trace in curves["data"]}
    assert traces[h100]["x"] == [100.0, 350.0, 600.0] and traces[h100]["y"] == [10.0, 20.0, 60.0]
    assert traces[h100]["line"]["dash"] == "solid" and traces[static[0]]["line"]["dash"] == "dash"
    decode_runs = runs_of(results)
    decode_runs = decode_runs[(decode_runs["mode"] == "decode") & (decode_runs["status"] == "ok")]
    drawn = sorted(x for name in static for x in traces[name]["x"])
    assert drawn == pytest.approx(sorted(decode_runs["output_tokens_per_s"]))
    star = traces["best goodput at the SLO"]
    assert star["x"] == [350.0] and star["y"] == [20.0]  # rate 4: 3.5 req/s within the SLO
    assert curves["layout"]["shapes"][0]["y0"] == 30.0  # the tpot SLO, on a TPOT axis
    assert "No request of this point was kept" in texts(app)  # imported without --save-detailed
    priced = {trace["name"]: trace for trace in per_dollar["data"]}
    assert set(priced) == {h100, v5e, "best goodput at the SLO"}  # the CPU's static batch has no price
    assert priced[h100]["x"][0] == pytest.approx(100 * 3600 / PRICES["H100 SXM"].usd_per_chip_hour)
    assert priced[v5e]["x"] == pytest.approx([200 * 3600 / PRICES["TPU v5e"].usd_per_chip_hour])
    assert len(decode) == 3 and "no peak bandwidth" in texts(app)
    table = frames(app)[0]
    assert len(table) == 4 + len(decode_runs) and table["best goodput"].sum() == 1
    app.selectbox(key="latency").set_value("ttft_p99_ms").run()
    curves = plotted(app)[0]
    assert "shapes" not in curves["layout"] and {t["name"]: t for t in curves["data"]}[h100]["y"] == [90.0] * 3


def test_serving_points_without_runs_show_their_curves_and_cold_start(serve, tmp_path: Path) -> None:
    """A store of serving points only (no runs table: the sidebar has nothing to filter): the
    curves, the cold start of the sweeps that started their engine, one figure per sweep, and a
    point's requests."""
    results = tmp_path / "results"
    import_points(results, tmp_path, "meta-llama/Llama-3.1-8B")
    started = pd.Timestamp("2026-11-01T02:00:00Z").to_pydatetime()
    for index, cold in enumerate((41.0, 45.0)):
        writer = store.InvocationWriter(results, f"sweep-{index}", started, tables=("serving", "serving_requests"))
        point = {"run_id": f"p{index}", "invocation_id": f"sweep-{index}", "source": "tpubench", "status": "ok",
                 "engine": "vllm-tpu", "engine_version": "0.1", "model": "meta-llama/Llama-3.1-8B",
                 "device": "TPU v5 lite", "request_rate": 1.0, "output_throughput": 80.0 + index, "tpot_p50_ms": 12.0,
                 "cold_start_s": cold}  # fmt: skip
        request = {"run_id": f"p{index}", "invocation_id": f"sweep-{index}", "request": 0, "input_len": 8,
                   "output_len": 4, "send_s": 0.0, "ttft_ms": 5.0, "tpot_ms": 1.0, "e2el_ms": 8.0,
                   "itl_ms": [1.0, 1.0, 1.0]}  # fmt: skip
        writer.add_rows({"serving": [point], "serving_requests": [request]})
    app = serve(results, "Serving")
    assert not app.error and app.selectbox(key="model").value == "meta-llama/Llama-3.1-8B"
    curves, cold_start, _per_dollar = plotted(app)
    assert "vllm-tpu 0.1 on TPU v5 lite" in {trace["name"] for trace in curves["data"]}
    bars = cold_start["data"][0]
    assert bars["y"] == ["vllm-tpu 0.1 on TPU v5 lite"] and bars["x"] == [43.0]
    assert bars["error_x"]["array"] == [2.0] and bars["error_x"]["arrayminus"] == [2.0]
    app.selectbox(key="point").set_value("p1").run()  # a point's requests, as its sweep kept them
    kept = frames(app)[-1]
    assert kept[["request", "ttft_ms", "e2el_ms", "chunks"]].values.tolist() == [[0, 5.0, 8.0, 4]]


def test_ops_ranks_a_profiled_runs_ops_and_diffs_two_runs(serve, results: Path) -> None:
    app = serve(results, "Ops")
    run_id = app.selectbox(key="run").value
    assert f"tpubench trace {run_id} --open --results {results}" in texts(app)
    assert charts(app) == 3  # top ops, the treemap, and the roofline
    split = frames(app)[0]
    assert split["share of self time"].sum() == pytest.approx(1.0)
    app.selectbox(key="base").select_index(1).run()  # the newest other profiled run
    assert not app.exception and charts(app) == 5  # and the diff, and both runs on the roofline
    assert set(frames(app)[-2]["change"]) <= {"new", "missing", "slower", "faster", "same"}


def test_scaling_shows_each_configuration_over_n_and_backends_at_equal_n(serve, tmp_path: Path) -> None:
    """Synthetic multi-device rows (the multi-device columns, through the store's writer): an H100 fsdp
    sweep whose 1-device run ran out of memory, a simulated N = 4, and a TPU at N = 2."""
    results = write_runs(
        tmp_path / "results",
        [
            run_row(status="oom"),
            *(
                run_row(devices=n, parallel="fsdp", scaling="weak", batch_size=8 * n, median_step_ms=ms, **extra)
                for n, ms, extra in (
                    (2, 100.0, {"collective_share": 0.3, "exposed_collective_share": 0.1}),
                    (4, 125.0, {"simulated": True}),
                    (2, 200.0, {"backend": "tpu", "device": "TPU v5 lite"}),
                    (4, 150.0, {"hosts": 2}),
                )
            ),
        ],
    )
    app = serve(results, "Scaling")
    headings = [heading.value for heading in app.subheader]
    assert "gpt2/124m cuda train bfloat16 fsdp weak b8xs1024 per device" in headings
    # a sweep over 2 hosts is a table of its own, N the devices over both hosts
    hosts = frames(app)[headings.index("gpt2/124m cuda train bfloat16 fsdp on 2 hosts weak b8xs1024 per device")]
    assert list(hosts["N"]) == [1, 4] and list(hosts["devices/host"]) == [1, 2], hosts
    assert "Simulated: virtual CPU devices" in texts(app) and charts(app) == 2
    tables = frames(app)
    cuda = next(table for table in tables if "N" in table and list(table["N"]) == [1, 2, 4])
    assert "devices/host" not in cuda  # one host: no column for it
    assert list(cuda["status"]) == ["oom", "ok", "ok"] and list(cuda["baseline N"]) == [2, 2, 2]
    assert cuda["efficiency %"].tolist()[1:] == pytest.approx([100.0, 80.0])
    assert cuda["collectives % of step"].tolist()[1] == pytest.approx(30.0)
    cross = next(table for table in tables if "$/Mtoken" in table)
    assert set(cross["backend"]) == {"cuda", "tpu"}
    tpu = "gpt2/124m tpu train bfloat16 fsdp weak b8xs1024 per device"
    linked = serve(results, "Scaling", config=tpu)  # a link to one configuration shows it alone
    assert [heading.value for heading in linked.subheader] == [tpu]
    stale = serve(results, "Scaling", config="gone")  # a stale link falls back to all of them
    assert len(stale.subheader) == len(headings)


def test_scaling_without_multi_device_runs_says_how_to_make_some(serve, tmp_path: Path) -> None:
    app = serve(write_runs(tmp_path / "results", [run_row(), run_row(batch_size=4)]), "Scaling")
    assert "No multi-device configuration" in texts(app) and "--devices 1,2,4,8" in texts(app)


def test_compilation_lists_compile_facts_per_run(serve, results: Path) -> None:
    app = serve(results, "Compilation")
    assert "No run of this invocation compiled a graph" in texts(app)  # cpu is eager
    table = frames(app)[-1]
    assert set(table["backend"]) == {"cpu", "cuda"} and table["first step s"].notna().sum() == 2


def test_run_details_of_a_failed_run_show_its_error_and_output(serve, results: Path) -> None:
    runs = runs_of(results)
    failed = runs.loc[runs["status"] == "failed", "run_id"].iloc[0]
    app = serve(results, "Run details", run=failed)
    assert app.selectbox(key="run").value == failed
    said = texts(app)
    assert "deliberate failure in build_model" in said and "Traceback" in said
    assert app.query_params["run"] == failed


def test_run_details_of_an_ok_run_show_its_step_times(serve, results: Path) -> None:
    runs = runs_of(results)
    ok = runs.loc[(runs["status"] == "ok") & (runs["mode"] == "train"), "run_id"].iloc[-1]
    app = serve(results, "Run details", run=ok)
    # the histogram of raw step times, its losses beside another run's (one device, the same batch), the memory by part
    assert charts(app) == 3
    difference = re.search(r"Largest relative difference (\S+) at step", texts(app))
    assert difference and float(difference.group(1)) <= 1e-5  # two one-device cpu runs: the same losses
    config = frames(app)[0].set_index("field")["value"]
    assert config["run_id"] == ok and config["mode"] == "train"
    assert "tpubench trace" in texts(app)
    # raw floats and byte counts (103.67955499987147, 459210752) are formatted
    measured = frames(app)[1].set_index("field")["value"]
    assert measured["peak_mem_bytes"].endswith(" MiB") and measured["estimated_mem_bytes"].endswith(("MiB", "GiB"))
    # more than four significant figures (0.01811 has four)
    raw = measured[measured.str.fullmatch(r"-?(?:[1-9][\d,]*\.\d{5,}|0\.0*[1-9]\d{4,})")]
    assert raw.empty, raw.to_dict()
    assert not measured.str.fullmatch(r"\d{5,}").any(), measured  # counts have thousands separators
    assert measured["host_other_cpu_share"].endswith("%")


def test_run_details_show_a_multi_device_runs_smallest_peak_in_gib(serve, tmp_path: Path) -> None:
    """``peak_mem_bytes_min`` (the least-loaded device's peak) is bytes as ``peak_mem_bytes`` is;
    it was shown as a bare count of bytes."""
    row = run_row(devices=2, parallel="fsdp", scaling="weak", peak_mem_bytes=3 * 2**30, peak_mem_bytes_min=2 * 2**30)
    app = serve(write_runs(tmp_path / "results", [row]), "Run details", run=row["run_id"])
    measured = frames(app)[1].set_index("field")["value"]
    assert (measured["peak_mem_bytes"], measured["peak_mem_bytes_min"]) == ("3.00 GiB", "2.00 GiB")


def test_run_details_of_a_multi_device_run_show_its_layout(serve, results: Path) -> None:
    runs = runs_of(results)
    two = runs.loc[runs["devices"] == 2, "run_id"].iloc[-1]
    app = serve(results, "Run details", run=two)
    config = frames(app)[0].set_index("field")["value"]
    assert (config["parallel"], config["mesh"], config["comm_backend"], config["simulated"]) == (
        "dp",
        "dp=2",
        "gloo",
        "True",
    )
    assert (config["global_batch_size"], config["per_device_batch_size"]) == ("4", "2")  # weak: 2 per rank
    measured = frames(app)[1].set_index("field")["value"]
    assert measured["rank_skew_pct"] and measured["tokens_per_s_per_device"]
    # the histogram is the job's steps (each step's slowest rank), as its median is, not both ranks'
    drawn_charts = [json.loads(chart.proto.spec)["data"] for chart in app.get("plotly_chart")]
    (histogram,) = (data for data in drawn_charts if data and data[0]["type"] == "histogram")  # beside memory's
    steps = store.load_steps(results, run_id=[two], phase="measure")
    drawn = histogram[0]["x"]  # plotly's typed array: base64 of float64 values
    drawn = np.frombuffer(base64.b64decode(drawn["bdata"]), dtype=drawn["dtype"]) if "bdata" in drawn else drawn
    assert steps["rank"].nunique() == 2 and len(drawn) == steps["step"].nunique()
    assert sorted(drawn) == sorted(steps.groupby("step")["step_ms"].max())


def test_overview_marks_runs_measured_on_a_busy_host(serve, results: Path, tmp_path: Path) -> None:
    """Host-busy warnings named no run; the matrix marks the cell and lists the runs."""
    copy = tmp_path / "results"
    shutil.copytree(results, copy)
    relabel(copy, host_other_cpu_share=0.65)
    app = serve(copy, "Overview")
    matrix = frames(app)[0]
    cpu = next(column for column in matrix.columns if column.startswith("cpu ("))
    assert matrix[cpu].str.endswith("⚠").all()
    assert "marked ⚠ has runs measured on a busy host" in texts(app)
    busy = frames(app)[1]
    assert len(busy) == 2 and busy["other processes' CPU share (%)"].eq(65).all()


def test_a_link_restores_the_view_and_the_url_follows_the_widgets(serve, results: Path) -> None:
    app = serve(results, "Overview", backend="cpu", mode=["train", "infer"], value="tokens_per_s")
    assert app.sidebar.multiselect(key="backend").value == ["cpu"]
    assert app.sidebar.multiselect(key="mode").value == ["train", "infer"]
    assert app.radio(key="value").value == "tokens_per_s"
    assert app.query_params == {"backend": "cpu", "mode": ["train", "infer"], "value": "tokens_per_s"}
    assert all(column.startswith("cpu (") for column in frames(app)[0].columns)
    app.radio(key="value").set_value("median_step_ms").run()  # back to the default: left out of the URL
    app.sidebar.multiselect(key="workload").set_value(["gpt2"]).run()
    assert app.query_params == {"backend": "cpu", "mode": ["train", "infer"], "workload": "gpt2"}
    app.sidebar.date_input(key="dates").set_value((date(2020, 1, 1), date(2020, 1, 2))).run()
    assert app.query_params["dates"] == "2020-01-01..2020-01-02"
    assert "No runs match the filters" in texts(app)


def test_a_stale_link_falls_back_and_says_so(serve, results: Path) -> None:
    # a run id is looked up in the store, never used as a path
    app = serve(results, "Run details", run="../../etc/passwd", backend=["cpu", "no-such-backend"], dates="junk")
    assert "no run `../../etc/passwd`" in texts(app)
    assert app.sidebar.multiselect(key="backend").value == ["cpu"]
    assert app.sidebar.date_input(key="dates").value == ()
    assert app.selectbox(key="run").value in set(runs_of(results)["run_id"])


def test_compilation_of_a_compiled_run_draws_its_compile_count_per_step(
    serve, tmp_path: Path, compile_workloads: None
) -> None:
    """A real cpu-compile run of ``compile-clean`` (tests/compile_workloads.py: a Linear and a
    ReLU, which Inductor compiles in a fraction of gpt2's 50 CPU-seconds)."""
    results = tmp_path / "results"
    done = in_process(
        "run --workload compile-clean --backend cpu-compile --mode infer --steps 5 --warmup 1 --results",
        results,
        starts_runs=True,
    )
    assert done.returncode == 0, done.stderr
    app = serve(results, "Compilation")
    assert charts(app) == 2  # the compile cost per step (from the compiles table); first step and compile time
    timeline, times = (json.loads(chart.proto.spec)["layout"] for chart in app.get("plotly_chart"))
    assert timeline["title"]["text"].startswith("Compile cost per step")
    assert times["legend"]["title"]["text"] == "backend, bar"  # it read "backend,"
    table = frames(app)[-1].set_index("backend")
    assert table.loc["cpu-compile", "graphs compiled"] >= 1 and table.loc["cpu-compile", "compile s"] > 0


def test_compilation_says_why_each_run_compiled_and_run_details_lists_its_events(serve, tmp_path: Path) -> None:
    """On a synthetic compiles table written through the store: the four figures, the
    why table, the measured cause in place of a guess, the per-run timeline, and the events."""
    from compile_rows import SHAPE_LINE, limit_events, run_row, shape_change_events, step_rows, write

    results = tmp_path / "results"
    runs = [
        run_row("shape0001", "inv-c", recompiles_after_warmup=4, compile_count=6, compile_s_measured=4.75,
                graph_breaks=1, graph_break_ids='{"GB0124": 1}'),
        run_row("limit0001", "inv-c", workload="item-step", recompile_limit_hit=True, compile_count=8),
    ]  # fmt: skip
    events = [*shape_change_events("shape0001", "inv-c"), *limit_events("limit0001", "inv-c")]
    steps = step_rows("shape0001", "inv-c", {0: 37.5, 2: 2.375, 4: 2.375})
    write(results, "inv-c", runs, events, steps)
    app = serve(results, "Compilation")
    figures = {metric.label: metric.value for metric in app.metric}
    assert figures["Runs that recompiled after warm-up"] == "1" and figures["Runs with graph breaks"] == "1"
    assert figures["Runs that hit the recompile limit"] == "1" and figures["Compile s inside measured steps"] == "4.75"
    said = texts(app)
    assert f"shape change \N{MULTIPLICATION SIGN}2 at {SHAPE_LINE}" in said and "a shape or a Python value" not in said
    why = frames(app)[0]
    assert {"shape change", "value change", "graph break GB0124 (Tensor.item())"} <= set(why["cause"])
    timeline = json.loads(app.get("plotly_chart")[0].proto.spec)["data"]
    assert {"first compile", "shape change", "step time (ms)", "cache: miss"} <= {trace["name"] for trace in timeline}
    details = serve(results, "Run details", run="shape0001")
    listed = frames(details)[-1]
    assert len(listed) == len(shape_change_events("shape0001", "inv-c")) and "GB0124" in set(listed["graph_break_id"])


@pytest.mark.parametrize("page", [page.title for page in catalog.PAGES])
@pytest.mark.parametrize("kind", ["missing", "empty"])
def test_an_empty_store_says_how_to_fill_it(serve, tmp_path: Path, page: str, kind: str) -> None:
    results = tmp_path / "results"
    if kind == "empty":
        results.mkdir()
    app = serve(results, page)
    assert f"tpubench run --suite llm --results {results}" in texts(app)
    assert not app.error


def test_a_store_that_cannot_be_read_is_said_on_every_page(serve) -> None:
    for page in catalog.PAGES:
        app = serve("nosuchprotocol://bucket/results", page.title)  # fsspec knows no such file system
        assert "cannot be read" in app.error[0].value and "nosuchprotocol" in app.error[0].value


def test_a_corrupt_file_is_named_and_the_rest_works(serve, results: Path, tmp_path: Path) -> None:
    copy = tmp_path / "results"
    shutil.copytree(results, copy)
    partition = next((copy / "runs").iterdir())
    (partition / "torn.parquet").write_bytes(b"PAR1 not really parquet")
    for page in catalog.PAGES:
        app = serve(copy, page.title)
        assert any("torn.parquet" in warning.value for warning in app.warning), page.title
        assert app.title[0].value == page.title


def test_filters_keep_runs_by_column_tag_and_day() -> None:
    index = pd.DataFrame(
        {
            "backend": ["cpu", "cuda", "cpu"],
            "tag_pairs": [("night=1", "who=a"), ("night=2",), ("night=3", "who=b")],
            "started_at": pd.to_datetime(["2026-11-01 10:00", "2026-11-02 23:59", "2026-11-03 00:00"], utc=True),
        }
    )
    keep = lambda **chosen: list(data.Filters(**chosen).apply(index).index)  # noqa: E731
    assert keep() == [0, 1, 2]
    assert keep(columns=(("backend", ("cpu",)),)) == [0, 2]
    assert keep(tags=("night=1", "night=2")) == [0, 1]  # any value of a key
    assert keep(tags=("night=1", "who=b")) == []  # every key
    assert keep(since=date(2026, 11, 2), until=date(2026, 11, 2)) == [1]  # whole UTC days


def test_cli_rejects_bad_input_in_one_line(tmp_path: Path) -> None:
    """In this process (no server starts for input it refuses), then once as the real command:
    the process-level check of ``dashboard``'s refusals."""

    def refused(done: subprocess.CompletedProcess, message: str) -> None:
        assert done.returncode == 2, done.stderr
        assert done.stderr.startswith("error: ") and message in done.stderr, done.stderr
        assert done.stderr.count("\n") == 1 and "Traceback" not in done.stdout + done.stderr, done.stderr

    afile = tmp_path / "file"
    afile.write_text("")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for line, message in (
            ("dashboard --port 70000", "--port expects 1-65535"),
            (f"dashboard --results {afile}", "not a directory"),
            (f"dashboard --results {tmp_path} --results {afile}", "not a directory"),
            (f"dashboard --port {port}", f"cannot listen on 127.0.0.1:{port}"),
        ):
            refused(in_process(line), message)
    refused(tpubench("dashboard --port 70000"), "--port expects 1-65535")


#: the dashboard run by AppTest in a process of the command's interpreter flags; what it imported
APP_IN_PROCESS = """
import sys
from streamlit.testing.v1 import AppTest
app = AppTest.from_file(sys.argv[1], default_timeout=120).run()
print([element.value for element in app.exception], sys.modules["tpubench"].__file__)
"""


def test_the_dashboard_imports_its_own_packages_whatever_the_working_directory(tmp_path: Path) -> None:
    """Started from the parent of a clone named ``tpubench``, ``python -m streamlit`` put that
    folder first on sys.path, and it shadowed the package as a namespace without its names
    (an ImportError on every page that imported one)."""
    from tpubench.cli.dashboard import streamlit_command

    (tmp_path / "tpubench" / "dashboard").mkdir(parents=True)  # a clone's folders, as a namespace package sees them
    line = streamlit_command("127.0.0.1", 8501)
    flags = line[1 : line.index("-m")]
    # as installed (pip install -e): a package on PYTHONPATH would win over a namespace package anyway
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env[RESULTS_ENV] = str(tmp_path / "empty")
    done = subprocess.run(
        [line[0], *flags, "-c", APP_IN_PROCESS, str(APP)], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    exceptions, imported = done.stdout.strip().splitlines()[-1].rsplit(" ", 1)
    assert exceptions == "[]" and imported.endswith(os.path.join("tpubench", "__init__.py")), done.stdout


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as response:
            return response.read() == b"ok"
    except OSError:
        return False


@pytest.mark.slow
def test_every_page_in_a_real_browser(results: Path, merged: tuple[Path, Path, Path]) -> None:
    """`tpubench dashboard` over two stores, one with ceilings, serves every page to headless
    Chromium: content, no error box (Overview, Ops and Ceilings once raised over two stores with
    ceilings), a screenshot each, and not one request that leaves 127.0.0.1 (every page fetched
    its icon from fonts.gstatic.com)."""
    if not CHROMIUM.exists():
        pytest.skip("no /usr/bin/chromium (apt-get install -y chromium; .ci/run installs it)")
    from playwright.sync_api import sync_playwright

    port = _free_port()
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    log = (SCREENSHOTS / "server.log").open("w")
    server = subprocess.Popen(
        command(f"dashboard --port {port} --results", str(results), "--results", str(merged[1])),
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=ROOT,
    )
    outside: list[str] = []  # every request the browser made to anywhere but the dashboard's own server
    try:
        wait_for(lambda: _healthy(port) or server.poll() is not None, "the dashboard's health endpoint", 180)
        assert server.poll() is None, (SCREENSHOTS / "server.log").read_text()
        listening = subprocess.run(["ss", "-ltnp"], capture_output=True, text=True).stdout
        assert f"127.0.0.1:{port} " in listening and f"0.0.0.0:{port} " not in listening
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 2400})
            base = f"http://127.0.0.1:{port}"
            page.on(
                "request",
                lambda request: (
                    None
                    if request.url.startswith((f"{base}/", "data:", "blob:", "about:"))
                    else outside.append(request.url)
                ),
            )
            for index, info in enumerate(catalog.PAGES):
                path = "/" if index == 0 else f"/{info.url_path}"  # the home page lives at the root
                page.goto(f"{base}{path}?backend=cpu" if info.title != "Run details" else f"{base}{path}")
                page.wait_for_selector("[data-testid=stApp][data-test-script-state=notRunning]", timeout=120_000)
                page.get_by_role("heading", name=info.title, exact=True).wait_for()
                # the newest run may be one that measured nothing; machine B's store has ceilings
                if info.title != "Run details":  # a chart, or the error box that stands in its place
                    page.locator(".js-plotly-plot, [data-testid=stException]").first.wait_for(timeout=60_000)
                assert page.locator("[data-testid=stException]").count() == 0, info.title
                assert info.title == "Run details" or page.locator(".js-plotly-plot").count(), info.title
                if info.title == "Compare":  # the terminal command shows whole (it was once cut off)
                    code = page.locator("[data-testid=stCode] code").first
                    code.wait_for()
                    assert "tpubench compare" in code.inner_text()
                    assert code.evaluate("e => e.scrollWidth <= e.clientWidth + 1"), code.inner_text()
                page.screenshot(path=str(SCREENSHOTS / f"{index}-{info.url_path}.png"))
            assert page.get_by_text(str(merged[1])).count() > 0  # the sidebar names both stores
            page.goto(f"{base}/?backend=cpu")  # the filters survive a switch of page in the sidebar, URL included
            page.wait_for_selector("[data-testid=stApp][data-test-script-state=notRunning]", timeout=120_000)
            page.get_by_role("link", name="Trends").click()
            page.wait_for_function("() => location.pathname.endsWith('/trends') && location.search == '?backend=cpu'")
            page.get_by_role("heading", name="Trends", exact=True).wait_for()
            page.locator(".js-plotly-plot .scatterlayer .trace .points path").first.click(force=True)
            page.get_by_text("Open run").click()  # a point of a trend leads to its run
            page.get_by_role("heading", name="Run details", exact=True).wait_for()
            page.wait_for_function("() => /[?&]run=[0-9a-f]{16}/.test(location.search)")
            assert page.locator("[data-testid=stException]").count() == 0
            browser.close()
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()
    assert os.listdir(SCREENSHOTS)
    assert not outside, f"requests that left 127.0.0.1: {sorted(set(outside))}"


def test_pages_open_on_the_latest_invocation_with_something_to_show(serve, tmp_path: Path) -> None:
    """Two nights of a compiled gpt2, then a cpu run of a new configuration: Compare opened on
    the cpu night ("nothing would pair") and Compilation on "no run of this invocation compiled
    a graph". Both now open on the latest night with something to show, and say which newer
    invocation they passed over and why."""
    results = tmp_path / "results"
    nights = ["inv-night1", "inv-night2", "inv-cpu"]
    started = pd.Timestamp("2026-11-01T02:00:00Z").to_pydatetime()
    for day, invocation in enumerate(nights):
        writer = store.InvocationWriter(results, invocation, started + pd.Timedelta(days=day))
        compiled = invocation != "inv-cpu"
        for index in range(2):
            columns = {"backend": "cuda-compile", "compile_count": 3} if compiled else {"backend": "cpu"}
            when = started + pd.Timedelta(days=day, minutes=index)
            writer.add(run_row(invocation_id=invocation, started_at=when, **columns))
    app = serve(results, "Compare")
    said = texts(app)
    assert "invocation=inv-night1" in said and "invocation=inv-night2" in said, said
    assert "Opened on `inv-night2`" in said and "`inv-cpu`" in said and "nothing would pair" not in said
    app = serve(results, "Compilation")
    assert app.selectbox(key="invocation").value == "inv-night2"
    said = texts(app)
    assert "Opened on `inv-night2`" in said and "`inv-cpu`" in said and "compiled nothing" in said
    assert "No run of this invocation compiled a graph" not in said


def test_compare_opens_on_a_device_sweep_and_pairs_its_one_device_runs_with_plain_ones(serve, tmp_path: Path) -> None:
    """A night of plain 1-device runs, then a ``--devices 1,2 --parallel fsdp`` sweep: the
    sweep's 1-device runs keep their plan (tpubench.analysis.identity) but pair with plain ones
    where the other night ran none under it, so Compare opens on the sweep against the plain
    night and pairs them, as Scaling takes a plain run for N = 1 where its plan has none; only
    the 2-device configuration, which the plain night did not run, is unpaired."""
    results = tmp_path / "results"
    started = pd.Timestamp("2026-11-01T02:00:00Z").to_pydatetime()
    layouts = {
        "inv-plain": [{}, {}],
        "inv-sweep": [{"parallel": "fsdp", "scaling": "weak"}] * 2
        + [{"devices": 2, "parallel": "fsdp", "scaling": "weak"}],
    }
    for day, (invocation, rows) in enumerate(layouts.items()):
        writer = store.InvocationWriter(results, invocation, started + pd.Timedelta(days=day))
        for index, layout in enumerate(rows):
            when = started + pd.Timedelta(days=day, minutes=index)
            writer.add(run_row(invocation_id=invocation, started_at=when, **layout))
    app = serve(results, "Compare")
    said = texts(app)
    assert "--baseline 'invocation=inv-plain' --candidate 'invocation=inv-sweep'" in said, said
    assert "nothing would pair" not in said and "1 configuration(s) ran on one side only" in said, said


def test_ceilings_draws_each_kind_and_runs_show_mfu_of_the_measured_ceiling(serve, tmp_path: Path) -> None:
    """A store with a cpu ceilings sweep and a run: the Ceilings page's table and curves, and
    the Overview's cells of MFU against the measured matmul ceiling (the run's device and dtype).
    The table gives rates as `ceilings --show` prints them (GFLOP/s, GB/s), not raw figures; a
    memory sweep of 1 MiB arrays is a cache's figure, which its closing line, the table and
    the sweep's reason say; the Overview names the sweep its cells divide by."""
    from tpubench.analysis import ceilings as analysis

    path = tmp_path / "results"
    for line in ("--kind matmul --max-size 128", "--kind memory --max-size 1048576"):
        done = in_process(f"ceilings --backend cpu {line} --dtype float32 --results", path, starts_runs=True)
        assert done.returncode == 0, done.stderr
    assert "a cache's figure: no array reached" in " ".join(done.stdout.split()), done.stdout  # not "best"
    done = in_process(f"run {TINY} --mode infer --steps 2 --results", path, starts_runs=True)
    assert done.returncode == 0, done.stderr
    app = serve(path, "Ceilings")
    assert app.title[0].value == "Ceilings"
    table = frames(app)[0]
    assert {("matmul", "mm"), ("memory", "triad")} <= set(zip(table["kind"], table["op"], strict=True))
    assert table["median"].str.fullmatch(r"[\d.,]+ [kMGT]?(FLOP|B)/s( \(a cache's\))?").all(), table["median"]
    assert table.loc[table["kind"] == "memory", "median"].str.endswith("(a cache's)").all()
    assert "not a ceiling but a cache's figure" in texts(app)
    assert charts(app) == 2  # matmul float32, STREAM triad
    overview = serve(path)
    overview.radio(key="value").set_value("mfu_attained").run()
    cells = frames(overview)[0].iloc[:, 0].str.removesuffix(" ⚠")
    attached = analysis.attach_attained(store.load_runs(path), store.load_ceilings(path))
    if attached["ceiling_low"].any():  # the run beat a 128^3 ceiling that a busy host measured low
        assert (cells == analysis.CEILING_LOW).all(), cells
    else:
        assert cells.str.replace(",", "").map(float).gt(0).all(), cells  # thousands separated
    assert "Against cpu matmul float32 sweep" in texts(overview)


def test_ceilings_draws_a_collective_sweep_beside_its_picker(serve, tmp_path: Path) -> None:
    """A store whose ceilings include a collective sweep (rows as `tpubench ceilings --kind
    collective` writes them): its bus-bandwidth curve draws under the collective picker. The
    picker and the chart once shared the key "collective", and the page raised instead."""
    started = pd.Timestamp("2026-12-01 10:00", tz="UTC").to_pydatetime()
    writer = store.InvocationWriter(tmp_path, "inv-ceilings", started, tables=("ceilings",))
    rows = [
        {"run_id": "sweep", "invocation_id": "inv-ceilings", "started_at": started, "kind": "collective",
         "op": op, "dtype": "float32", "backend": "cpu", "device": "CPU", "device_kind": "cpu", "devices": 2,
         "shape": f"{size} B", "size_bytes": size, "bytes_per_op": float(size), "status": "ok",
         "median_s": size / 1e9, "median_rate": 1e9, "max_rate": 1.1e9, "p10_rate": 0.9e9, "rate_unit": "B/s"}
        for op in ("all_reduce", "all_gather") for size in (2**16, 2**20)
    ]  # fmt: skip
    store.Location(tmp_path).write_table(store.to_table(rows, "ceilings"), writer.paths["ceilings"])
    app = serve(tmp_path, "Ceilings")
    assert app.selectbox(key="collective").value in ("all_gather", "all_reduce")
    assert charts(app) == 1
    assert set(frames(app)[0]["op"]) == {"all_reduce", "all_gather"}


def test_the_index_reads_a_runs_file_again_only_when_it_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The index is kept file by file: an unchanged file is not read again, a new or rewritten
    one is, a removed one's runs leave, and an unreadable one is named on every read."""
    reads: list[list[str]] = []
    scan = store.scan_files

    def counting(location, table, paths, *args, **kwargs):
        reads.append(sorted(Path(path).name for path in paths))
        return scan(location, table, paths, *args, **kwargs)

    monkeypatch.setattr(store, "scan_files", counting)

    def write(invocation: str, *statuses: str) -> None:
        writer = store.InvocationWriter(tmp_path, invocation, run_row()["started_at"])
        for status in statuses:
            writer.add(run_row(invocation_id=invocation, status=status))

    def index() -> data.Loaded:
        return data._scan(str(tmp_path), "runs", data.INDEX_COLUMNS, read=data._indexed)

    data.forget_indexed()
    write("inv-a", "ok", "ok")
    write("inv-b", "ok")
    write("inv-c", "ok")
    assert len(index().frame) == 4 and reads == [["inv-a.parquet", "inv-b.parquet", "inv-c.parquet"]]
    assert len(index().frame) == 4 and len(reads) == 1  # nothing changed: nothing read
    write("inv-a", "ok", "failed")  # rewritten whole, as the writer does
    write("inv-d", "oom")
    frame = index().frame
    assert reads[-1] == ["inv-a.parquet", "inv-d.parquet"]
    assert sorted(frame["status"]) == ["failed", "ok", "ok", "ok", "oom"]
    next(tmp_path.glob("runs/*/inv-b.parquet")).unlink()
    assert set(index().frame["invocation_id"]) == {"inv-a", "inv-c", "inv-d"}
    next(tmp_path.glob("runs/*/inv-c.parquet")).write_bytes(b"not parquet")
    for _ in range(2):  # not remembered: named again on the next read
        loaded = index()
        assert set(loaded.frame["invocation_id"]) == {"inv-a", "inv-d"} and "inv-c.parquet" in loaded.skipped[0]
    next(tmp_path.glob("runs/*/inv-c.parquet")).unlink()
    # compacted: a file of many invocations, read once; a night written after it is read alone
    store_compact.compact(tmp_path, older_than_s=0)
    [compacted] = store.parquet_files(tmp_path, "runs")
    assert store.is_compacted(compacted)
    assert sorted(index().frame["status"]) == ["failed", "ok", "oom"] and reads[-1] == [Path(compacted).name]
    write("inv-e", "ok")
    assert sorted(index().frame["status"]) == ["failed", "ok", "ok", "oom"] and reads[-1] == ["inv-e.parquet"]
    data.forget_indexed()
