"""Shapes with named dimensions, end to end, on the test-only image and latent workloads
(tests/shape_workloads.py): the CLI's sweeps and errors, the worker, the store, compare,
--resume, the summary, the report and HUD export, and every dashboard page."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import ROOT, in_process, tpubench
from streamlit.testing.v1 import AppTest

from dashboard import RESULTS_ENV, catalog
from tpubench import store
from tpubench.cli.planning import choose_runs, plan_runs

SHAPES = {"TPUBENCH_WORKLOAD_MODULES": "shape_workloads", "PYTHONPATH": str(ROOT / "tests")}
VISION = "--workload toy-vision --backend cpu --batch-size 2 --steps 3 --warmup 1"


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """Side a: toy-vision train and infer at 16 and 24 px; side b: its infer runs again, and
    toy-latent at its default latent size. The store, and what each run command printed."""
    path = tmp_path_factory.mktemp("shapes") / "results"
    lines = [
        f"{VISION} --mode train --mode infer --image-size 16,24 --tag side=a",
        f"{VISION} --workload toy-latent --mode infer --image-size 16,24 --tag side=b",
    ]
    outputs = []
    for line in lines:  # in this process: its fork server serves every run (helpers.in_process)
        done = in_process(f"run {line} --results", path, env={**SHAPES, "COLUMNS": "200"}, starts_runs=True)
        assert done.returncode == 0, done.stderr
        outputs.append(done.stdout)
    return path, outputs


@pytest.fixture
def results(written: tuple[Path, list[str]]) -> Path:
    return written[0]


def test_rows_store_each_workloads_own_dimensions(results: Path) -> None:
    runs = store.load_runs(results).set_index(["workload", "mode", "image_size"], drop=False).sort_index()
    assert (runs["status"] == "ok").all(), runs["error"].tolist()
    vision = runs.loc["toy-vision"]
    assert sorted(vision["image_size"].unique()) == [16, 24]
    assert vision["seq_len"].isna().all() and vision["latent_size"].isna().all() and vision["tokens_per_s"].isna().all()
    [latent] = runs.loc["toy-latent"].to_dict("records")
    assert latent["latent_size"] == 4 and latent["image_size"] != latent["image_size"]  # NaN: not an image workload
    # the analytic FLOPs at each size, and how they were counted
    infer16 = runs.loc[("toy-vision", "infer", 16)].iloc[0]
    assert infer16["flops_per_step"] == 2 * 2 * (16 * 16 * 3 * 9 * 8 + 8 * 10)
    assert set(runs["flops_source"]) == {"analytic"} and set(runs["attention_flops"]) == {"full"}
    assert set(runs["param_count"]) == {3 * 9 * 8 + 8 + 8 * 10 + 10, 4 * 9 * 8 + 8 + 8 * 10 + 10}
    assert runs["active_param_count"].isna().all()


def test_labels_and_the_summary_name_the_dimension(written: tuple[Path, list[str]]) -> None:
    side_a, side_b = written[1]
    assert "toy-vision/tiny cpu train float32 b2xi16: ok" in side_a
    assert "toy-vision/tiny cpu infer float32 b2xi24: ok" in side_a
    assert "toy-latent/tiny cpu infer float32 b2xl4: ok" in side_b
    assert " 2xi16 " in side_a and " 2xi24 " in side_a and " 2xl4 " in side_b  # the summary's shape column


def test_compare_pairs_on_the_image_size(results: Path) -> None:
    done = tpubench("compare --baseline tag.side=a --candidate tag.side=b --json --results", str(results), env=SHAPES)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert "image_size" in found["paired_on"] and "latent_size" in found["paired_on"]
    steps = [row for row in found["comparison"] if row["metric"] == "step"]
    assert sorted(row["image_size"] for row in steps) == [16, 24]  # infer at 16 with 16, 24 with 24
    assert all(row["base_runs"] == row["test_runs"] == 1 for row in steps)
    table = tpubench("compare --baseline tag.side=a --candidate tag.side=b --results", str(results), env=SHAPES)
    assert "toy-vision/tiny infer float32 2xi16" in table.stdout and "2xi24" in table.stdout


def test_resume_matches_the_image_size(results: Path) -> None:
    again = f"run {VISION} --mode infer --image-size 16,32 --tag side=b --resume --steps 3 --results"
    done = tpubench(again, str(results), env=SHAPES)
    assert done.returncode == 0, done.stderr
    assert "--resume: skipped 1 run(s)" in done.stdout and "b2xi32: ok" in done.stdout  # 16 was done, 32 was not


def test_report_and_hud_export_carry_the_dimensions(results: Path, tmp_path: Path) -> None:
    markdown, hud = tmp_path / "r.md", tmp_path / "hud.json"
    done = tpubench(
        "report --select tag.side=a --results", str(results), "--out", tmp_path / "r.html", "--markdown", markdown
    )
    assert done.returncode == 0, done.stderr
    assert "toy-vision/tiny infer 2xi16" in markdown.read_text()
    done = tpubench("export --format pytorch-benchmark --select tag.side=a --results", str(results), "--out", hud)
    assert done.returncode == 0, done.stderr
    extra = [r["benchmark"]["extra_info"] for r in json.loads(hud.read_text()) if r["metric"]["name"] == "step_ms"]
    assert sorted(e["image_size"] for e in extra) == ["16", "16", "24", "24"] and all("seq_len" not in e for e in extra)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (
            "--workload toy-vision --seq-len 64",
            "--seq-len does not apply to toy-vision; workloads with it: gpt2, llama3, bert, mixtral",
        ),
        (
            "--workload gpt2 --image-size 224",
            "--image-size does not apply to gpt2; workloads with it: resnet, vit, toy-vision",
        ),
        ("--workload toy-vision --latent-size 32", "--latent-size does not apply to toy-vision"),
        ("--workload toy-vision --image-size 0,224", "--image-size expects positive integers"),
        ("--workload vit --image-size 256", "vit/tiny: vit takes --image-size 224 (its position table), not 256"),
    ],
)
def test_a_dimension_no_chosen_workload_takes_is_one_error_line(tmp_path: Path, line: str, message: str) -> None:
    done = in_process(f"run {line} --backend cpu --results", str(tmp_path / "r"), env=SHAPES)
    assert done.returncode == 2, done.stdout
    assert done.stderr.startswith("error: ") and message in done.stderr and len(done.stderr.splitlines()) == 1


def test_a_dimension_applies_to_the_workloads_that_take_it(shape_workloads: None) -> None:
    choice = choose_runs(None, ["gpt2", "toy-vision"], ["cpu"], ["infer"], None, "float32")
    specs = plan_runs(choice, seq_len=[32, 64], image_size=[24])
    assert sorted(spec.label() for spec in specs) == [
        "gpt2/tiny cpu infer float32 b4xs32",
        "gpt2/tiny cpu infer float32 b4xs64",
        "toy-vision/tiny cpu infer float32 b2xi24",
    ]


def test_a_suite_of_sizes_picks_each_workloads_own(shape_workloads: None) -> None:
    """``--suite mlperf`` runs each MLPerf reference size, not the workloads' default tiny; a size
    tag works the same for any workload."""
    mlperf = plan_runs(choose_runs("mlperf", None, ["cpu"], ["infer"], None, "bfloat16"), dtype="bfloat16")
    assert [(spec.workload, spec.size) for spec in mlperf] == [
        ("llama3", "8b"),
        ("resnet", "50"),
        ("bert", "large"),
        ("mixtral", "8x7b"),
    ]
    tagged = plan_runs(choose_runs("toy-benchmark", None, ["cpu"], ["infer"], None, "float32"))
    assert [(spec.workload, spec.size, spec.suite) for spec in tagged] == [("toy-vision", "small", "toys")]
    whole = plan_runs(choose_runs("toy-images", None, ["cpu"], ["infer"], None, "float32"))
    assert [(spec.workload, spec.size) for spec in whole] == [("toy-vision", "tiny")]  # a workload tag: its default


def test_list_shows_suites_dimensions_and_published_counts() -> None:
    done = in_process("list --json", env=SHAPES)  # the real process: test_regression_cli's list test
    assert done.returncode == 0, done.stderr
    entries = {entry["name"]: entry for entry in json.loads(done.stdout)}
    vision = entries["toy-vision"]
    assert vision["suites"] == ["toys", "toy-images"] and vision["dims"] == ["image_size"]
    assert vision["default_shape"]["cpu"] == {"batch_size": 2, "image_size": 16}
    small = vision["size_details"][1]
    assert small["suites"] == ["toys", "toy-images", "toy-benchmark"]
    assert small["params"] == small["published_params"] == 3 * 9 * 16 + 16 + 16 * 10 + 10
    assert small["published_source"] == "test-only: counted by hand"
    table = in_process("list --suite toys", env={**SHAPES, "COLUMNS": "200"})
    assert "2xi16 / 4xi32" in table.stdout and "counted by hand" in table.stdout


@pytest.mark.parametrize("page", ["Overview", "Compare", "Trends", "Run details"])
def test_every_dashboard_page_labels_the_image_size(results: Path, monkeypatch: pytest.MonkeyPatch, page: str) -> None:
    monkeypatch.setenv(RESULTS_ENV, str(results))
    app = AppTest.from_file(str(ROOT / "dashboard" / "app.py"), default_timeout=120)
    app.switch_page(catalog.BY_TITLE[page].path)
    if page == "Compare":
        app.query_params.update(how="custom", baseline="tag.side=a", candidate="tag.side=b")
    if page == "Run details":  # an image run (the latest may be the latent one)
        runs = store.load_runs(results)
        app.query_params.update(run=runs.loc[runs["workload"] == "toy-vision", "run_id"].iloc[0])
    app.run()
    assert not app.exception, app.exception[0].value
    shown = [str(frame.value.to_csv()) for frame in app.dataframe] + [str(box.options) for box in app.selectbox]
    shown += [str(box.value) for box in app.multiselect]
    said = "\n".join(shown)
    expected = {"Overview": "2xi", "Compare": "2xi16", "Trends": "2xi", "Run details": "image_size"}[page]
    assert expected in said, said[:2000]


def test_an_image_too_large_for_the_device_is_refused_with_its_estimate(tmp_path: Path) -> None:
    """The memory check asks the workload for its estimate at the run's Shape, image or text alike."""
    results = tmp_path / "results"
    done = tpubench(f"run {VISION} --mode train --image-size 100000 --results", str(results), env=SHAPES)
    assert done.returncode == 0, done.stderr
    [row] = store.load_runs(results).to_dict("records")
    assert row["status"] == "skipped" and row["image_size"] == 100000
    assert "GiB exceeds the" in row["error"] and row["estimated_mem_bytes"] > 2**40
