"""The read side of precision and long context over a real parquet store: ``tpubench compare
--by precision`` pairs bf16 with a converted precision and flags a candidate that no longer
computes the same model, and the "Precision & context" page puts each chip's best precision
side by side and draws tokens/s against sequence length per chip and attention kernel.

The rows are written by the store's own writer (the run side is tests/test_precision.py and
tests/test_long_context.py): an H100 and a TPU v5e at bf16 and int8 weight-only, the H100
at int4 weight-only too (fastest, but 20% off in its logits), and a long-context sweep."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import streamlit as st
from helpers import ROOT, in_process
from multi_device_rows import START, run_row
from streamlit.testing.v1 import AppTest

from dashboard import RESULTS_ENV, catalog
from tpubench import store, store_index
from tpubench.analysis import precision
from tpubench.analysis.prices import load_prices

H100, V5E = "NVIDIA H100 80GB HBM3", "TPU v5 lite"
#: (backend, device, precision, median step ms, quality columns)
INFER = [
    ("cuda", H100, "bf16", 40.0, {}),
    ("cuda", H100, "int8-wo", 25.0, {"quality_ok": True, "logits_rel_error": 0.02, "top1_agreement": 0.99}),
    ("cuda", H100, "int4-wo", 20.0, {"quality_ok": False, "logits_rel_error": 0.2, "top1_agreement": 0.7}),
    ("tpu", V5E, "bf16", 60.0, {}),
    ("tpu", V5E, "int8-wo", 45.0, {"quality_ok": True, "logits_rel_error": 0.03, "top1_agreement": 0.98}),
]
#: (backend, device, attention kernel that ran, sequence length, tokens/s)
LENGTHS = [
    ("cuda", H100, "flash", 2048, 9000.0),
    ("cuda", H100, "flash", 8192, 7000.0),
    ("cuda", H100, "flash", 32768, 3900.0),
    ("cuda", H100, "math", 2048, 6000.0),
    ("cuda", H100, "math", 8192, 2000.0),
    ("tpu", V5E, "auto", 2048, 5000.0),
    ("tpu", V5E, "auto", 8192, 4200.0),
]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("precision") / "results"
    writer = store.InvocationWriter(path, "inv-precision", START)
    rng = np.random.default_rng(3)
    for backend, device, kind, step_ms, quality in INFER:
        for _ in range(5):  # five runs a side: the fewest for a verdict
            row = run_row(
                invocation_id="inv-precision",
                workload="llama3",
                size="1b",
                mode="infer",
                backend=backend,
                device=device,
                precision=kind,
                median_step_ms=step_ms,
                mfu=0.4,
                mfu_peak=f"{kind} dense",
                reference_precision=None if kind == "bf16" else "bf16",
                **quality,
            )
            samples = step_ms * (1 + 0.01 * rng.standard_normal(20))
            steps = [
                {"run_id": row["run_id"], "invocation_id": "inv-precision", "phase": "measure", "step": i, "step_ms": v}
                for i, v in enumerate(samples.tolist())
            ]
            writer.add(row, steps)
    for backend, device, kernel, length, tokens in LENGTHS:
        writer.add(
            run_row(
                invocation_id="inv-precision",
                workload="llama3",
                size="1b",
                batch_size=1,
                backend=backend,
                device=device,
                seq_len=length,
                median_step_ms=length / tokens * 1e3,
                attention=kernel if kernel != "auto" else "auto",
                attention_kernel=None if kernel == "auto" else kernel,
                attention_kernel_source=None if kernel == "auto" else "trace",
            )
        )
    return path


def test_compare_by_precision_pairs_bf16_with_int4_and_flags_its_quality(results: Path) -> None:
    done = in_process(
        "compare --baseline precision=bf16,backend=cuda --candidate precision=int4-wo,backend=cuda --by precision "
        "--json --results",
        results,
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert "precision" not in found["paired_on"] and "dtype" not in found["paired_on"]
    [step] = [row for row in found["comparison"] if row["metric"] == "step"]
    assert step["verdict"] == "improved" and step["ratio"] == pytest.approx(0.5, rel=0.05)
    assert step["quality_ok"] is False
    assert "precision bf16 → int4-wo" in step["reason"]
    assert "quality: no longer computes the same model (logits error 20.0% from bf16, top-1 70%)" in step["reason"]
    shown = in_process(
        "compare --baseline precision=bf16,backend=cuda --candidate precision=int4-wo,backend=cuda --by precision "
        "--results",
        results,
    )
    assert "QUALITY OFF" in shown.stdout


def test_compare_by_precision_keeps_a_faithful_candidate_unflagged(results: Path) -> None:
    done = in_process(
        "compare --baseline precision=bf16,backend=tpu --candidate precision=int8-wo,backend=tpu --by precision "
        "--json --results",
        results,
    )
    [step] = [row for row in json.loads(done.stdout)["comparison"] if row["metric"] == "step"]
    assert step["quality_ok"] is True and "quality:" not in step["reason"]


def test_an_unknown_by_is_one_error_line(results: Path) -> None:
    done = in_process("compare --baseline latest --candidate latest --by colour --results", results)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == ["error: unknown --by 'colour'; valid: precision, attention"]


def test_each_chips_best_precision_is_the_fastest_that_still_computes_the_model(results: Path) -> None:
    runs = store.load_runs(results)
    table = precision.best_precision(runs, load_prices())
    table = table[table["mode"] == "infer"]  # the long-context sweep trains, one precision per length
    best = table[table["best"]].set_index("device")
    assert best.loc[H100, "precision"] == "int8-wo" and best.loc[V5E, "precision"] == "int8-wo"
    h100 = table[table["device"] == H100].set_index("precision")
    assert h100.loc["int4-wo", "tokens_per_s"] > h100.loc["int8-wo", "tokens_per_s"]  # faster, yet not the best
    assert h100.loc["int4-wo", "quality_ok"] is False and not h100.loc["int4-wo", "best"]
    assert h100.loc["bf16", "usd_per_m_tokens"] > h100.loc["int8-wo", "usd_per_m_tokens"] > 0


def test_the_page_shows_the_best_precisions_and_the_length_curves(results: Path, monkeypatch) -> None:
    """From the kept run index alone: reading the runs files of every run shown took 4 s of
    CPU at 100,000 runs."""
    monkeypatch.setenv(RESULTS_ENV, str(results))
    store_index.read_index(str(results), "runs", store_index.RUN_COLUMNS)  # kept, as a server's first page keeps it

    def no_file(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"the page opened a parquet file: {args[1:3]}")

    monkeypatch.setattr(store, "scan_files", no_file)
    app = AppTest.from_file(str(ROOT / "dashboard" / "app.py"), default_timeout=120)
    app.switch_page(catalog.BY_TITLE["Precision & context"].path)
    app.run()
    assert not app.exception, app.exception[0].value
    [table] = [element.value for element in app.dataframe]
    flags = dict(zip(table["device"] + " " + table["precision"], table["flag"], strict=True))
    assert flags[f"{H100} int8-wo"] == "best" and flags[f"{V5E} int8-wo"] == "best"
    assert flags[f"{H100} int4-wo"] == "QUALITY OFF: not the same model"
    [chart] = app.get("plotly_chart")
    lines = {trace["name"] for trace in json.loads(chart.proto.spec)["data"]}
    assert lines == {
        f"{H100} (cuda) · flash · batch 1",
        f"{H100} (cuda) · math · batch 1",
        f"{V5E} (tpu) · auto · batch 1",
    }


def test_a_backend_filter_keeps_rows_of_the_table_made_once(results: Path, monkeypatch) -> None:
    """A choice of the groups' own columns (a backend) keeps rows of the analysis made over
    every run, cached, rather than making it again: over 100,000 runs that was most of the
    page's filter change. The rows are those of the analysis of the filtered runs."""
    monkeypatch.setenv(RESULTS_ENV, str(results))
    st.cache_data.clear()
    made = []
    real = precision.best_precision
    monkeypatch.setattr(precision, "best_precision", lambda runs, prices: made.append(len(runs)) or real(runs, prices))
    app = AppTest.from_file(str(ROOT / "dashboard" / "app.py"), default_timeout=120)
    app.switch_page(catalog.BY_TITLE["Precision & context"].path)
    app.run()
    app.sidebar.multiselect(key="backend").set_value(["cuda"])
    app.run()
    assert not app.exception, app.exception[0].value
    [table] = [element.value for element in app.dataframe]
    runs = store.load_runs(results)
    expected = real(runs[runs["backend"] == "cuda"], load_prices())
    assert len(made) == 1
    assert list(table["device"] + " " + table["precision"]) == list(expected["device"] + " " + expected["precision"])
    assert list(table["tokens/s"]) == pytest.approx(list(expected["tokens_per_s"]))
