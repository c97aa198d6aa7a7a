"""Reading the ``compiles`` table: the analysis (summary, why table, graph diff, hints), the
``tpubench compiles`` command, and compare's named compile regressions.

The tables are synthetic but real: rows as the capture writes them (tests/compile_rows.py),
written through the store and loaded back, so the parquet round trip is part of the test.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from compile_rows import (
    ITEM_LINE,
    MISMATCH,
    SHAPE_LINE,
    limit_events,
    run_row,
    shape_change_events,
    write,
    xla_events,
)
from compile_workloads import line_of
from helpers import in_process, one_error_line

from tpubench import store
from tpubench.analysis import compare
from tpubench.analysis import compiles as analysis

X = analysis.TIMES


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One invocation: a shape-change cpu-compile run, a run that hit the recompile limit, two
    xla runs of one configuration (the second compiles a graph the first did not, and not one
    the first did), and an eager cpu run."""
    path = tmp_path_factory.mktemp("compiles") / "results"
    path.mkdir()
    runs = [
        run_row("shape0001", "inv-a"),
        run_row("limit0001", "inv-a", workload="item-step"),
        run_row("xlaa0001", "inv-a", backend="xla"),
        run_row("xlab0001", "inv-a", backend="xla"),
        run_row("eager0001", "inv-a", backend="cpu"),
    ]
    events = [
        *shape_change_events("shape0001", "inv-a"),
        *limit_events("limit0001", "inv-a"),
        *xla_events("xlaa0001", "inv-a", ["443bd531", "62f880e9", "36e8c557"]),
        *xla_events("xlab0001", "inv-a", ["443bd531", "62f880e9", "9abc0001"]),
    ]
    write(path, "inv-a", runs, events)
    return path


def loaded(results: Path) -> pd.DataFrame:
    return store.load_compiles(results)


def test_the_summary_names_each_fact_with_its_cause_line_and_cost(results: Path) -> None:
    events = analysis.run_events(loaded(results), "shape0001")
    assert list(events["step"]) == sorted(events["step"])
    lines = analysis.summary(events)
    assert lines[0] == (
        f"6 compiles (3 dynamo, 3 aot_backward), 42 s; after warm-up 2 (shape change {X}2 at {SHAPE_LINE}, "
        "1.9 s each), which brought 2 more (aot_backward, 0.95 s)"
    )
    assert any(line.startswith("hint (shape change): pad or bucket") for line in lines)
    assert f"1 graph break GB0124 at {ITEM_LINE} (Tensor.item(); hint: avoid .item()" in "\n".join(lines)
    assert not any("recompile limit" in line for line in lines)


def test_the_summary_warns_when_the_recompile_limit_was_hit(results: Path) -> None:
    lines = analysis.summary(analysis.run_events(loaded(results), "limit0001"))
    assert lines[0].startswith(f"8 compiles, 2.4 s; after warm-up 6 (value change {X}6 at {ITEM_LINE}, 0.2 s each)")
    warning = [line for line in lines if line.startswith("warning: hit the recompile limit")]
    assert len(warning) == 1 and ITEM_LINE in warning[0] and "no longer compiled" in warning[0]
    assert any("capture_scalar_outputs" in line for line in lines)


def test_the_summary_counts_host_reads_and_fallbacks_per_measured_step(results: Path) -> None:
    lines = analysis.summary(analysis.run_events(loaded(results), "xlaa0001"), measured_steps=3)
    assert lines[0].startswith("3 compiles, 1.5 s (and 1 graph(s) found in the in-memory cache); after warm-up 1 ")
    assert f"shape change (inferred) {X}1" not in lines[0] and "shape change (inferred) at workloads/x.py:6" in lines[0]
    assert f"host reads 1/step at {ITEM_LINE}" in lines
    assert any(line.startswith("CPU fallbacks 1/step (aten::histc)") for line in lines)


def test_an_eager_run_has_no_events_and_says_so(results: Path) -> None:
    events = analysis.run_events(loaded(results), "eager0001")
    assert events.empty
    assert analysis.summary(events) == ["0 compiles; after warm-up 0"]


def test_the_why_table_groups_an_invocation_by_cause_and_line(results: Path) -> None:
    why = analysis.why_table(loaded(results))
    assert list(why.columns) == analysis.WHY_COLUMNS
    top = why.iloc[0]  # the most compiles after warm-up: the value guard of the limit run
    assert (top["cause"], top["source"], top["after_warmup"], top["runs"]) == ("value change", ITEM_LINE, 6, 1)
    shape = why[(why["cause"] == "shape change") & (why["source"] == SHAPE_LINE)].iloc[0]
    assert (shape["compiles"], shape["after_warmup"], shape["compile_s"]) == (2, 2, pytest.approx(3.8))
    assert shape["reported_by"] == "the backend"
    xla = why[(why["cause"] == "shape change") & (why["source"] == "workloads/x.py:6")].iloc[0]
    assert (xla["runs"], xla["compiles"], xla["reported_by"]) == (2, 4, "tpubench (inferred)")
    assert "unknown" not in set(why["cause"])  # an in-memory cache hit is not a compile
    breaks = why[why["cause"].str.startswith("graph break GB0124")].iloc[0]
    assert (breaks["graph_breaks"], breaks["source"]) == (1, ITEM_LINE) and "capture_scalar_outputs" in breaks["hint"]
    assert analysis.why_table(loaded(results).iloc[0:0]).empty


def test_diff_graphs_names_the_graphs_new_and_gone(results: Path) -> None:
    compiles = loaded(results)
    base, test = (analysis.run_events(compiles, run) for run in ("xlaa0001", "xlab0001"))
    diff = analysis.diff_graphs(base, test)
    assert list(diff.columns) == analysis.DIFF_COLUMNS
    assert diff[["change", "graph_id", "step"]].values.tolist() == [["new", "9abc0001", 2], ["gone", "36e8c557", 2]]
    assert analysis.diff_graphs(base, base).empty


def test_hints_cover_the_common_graph_breaks_and_link_the_rest() -> None:
    assert analysis.graph_break_name("GB0124") == "Tensor.item()"
    assert "torch.where" in analysis.graph_break_hint("GB0170")
    assert analysis.graph_break_hint("GB0431").endswith("/gb/gb0431.html")
    assert analysis.cause_hint("first_compile") == ""


def test_top_cause_is_what_a_compile_regression_names(results: Path) -> None:
    compiles = loaded(results)
    assert analysis.top_cause(analysis.run_events(compiles, "shape0001")) == f"shape change {X}2 at {SHAPE_LINE}"
    assert analysis.top_cause(analysis.run_events(compiles, "eager0001")) is None


@pytest.mark.parametrize(("before", "after", "said"), [(0, 2, "none in the baseline"), (1, 2, "1 in the baseline")])
def test_compare_names_a_compile_regression_with_its_cause_and_line(
    results: Path, before: int, after: int, said: str
) -> None:
    compiles = loaded(results)
    base, test = (
        store.to_table([run_row(run_id, invocation, recompiles_after_warmup=n)], "runs").to_pandas()
        for run_id, invocation, n in (("base0001", "inv-0", before), ("shape0001", "inv-a", after))
    )
    empty = store.to_table([], "steps").to_pandas()
    frame = compare.compare_runs(base, test, empty, empty, compiles=compiles)
    row = frame[frame["metric"] == "recompiles"].iloc[0]
    assert row["verdict"] == "regressed"
    assert row["reason"].startswith(f"2 compilation(s) after warm-up, {said}: shape change {X}2 at {SHAPE_LINE}")
    same = compare.compare_runs(test.assign(run_id="other001"), test, empty, empty, compiles=compiles)
    assert "recompiles" not in set(same["metric"])  # as many as the baseline: not a regression


# --- the command ---------------------------------------------------------------------


def test_compiles_prints_the_events_then_the_summary(results: Path) -> None:
    shown = in_process("compiles shape", "--results", str(results))
    assert shown.returncode == 0, shown.stderr
    assert "shape0001" in shown.stdout and MISMATCH in shown.stdout
    assert f"after warm-up 2 (shape change {X}2 at {SHAPE_LINE}" in shown.stdout
    assert "GB0124" in shown.stdout


def test_compiles_json_gives_the_events_and_the_summary(results: Path) -> None:

    shown = in_process("compiles limit0001 --json", "--results", str(results))
    assert shown.returncode == 0, shown.stderr
    found = json.loads(shown.stdout)
    assert found["run_id"] == "limit0001" and len(found["events"]) == 9
    assert any(line.startswith("warning: hit the recompile limit") for line in found["summary"])


def test_compiles_of_two_runs_diffs_their_graphs(results: Path) -> None:
    shown = in_process("compiles xlaa0001 xlab0001", "--results", str(results))
    assert shown.returncode == 0, shown.stderr
    assert "new" in shown.stdout and "9abc0001" in shown.stdout and "36e8c557" in shown.stdout


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("compiles nope0000", "unknown run 'nope0000'"),
        ("compiles eager0001", "backend cpu does not compile"),
        ("compiles shape0001 xlaa0001", "not two runs of one configuration"),
        ("compiles shape0001 xlaa0001 --explain", "--explain takes one run"),
        ("compiles shape0001 --python xla=python3", "--python is for --explain's worker"),
        ("compiles a b c", "give one run, or two runs"),
    ],
)
def test_bad_input_is_one_error_line(results: Path, line: str, message: str) -> None:
    assert message in one_error_line(in_process(line, "--results", str(results)))


def test_compare_and_regressions_name_the_cause_from_the_store(tmp_path: Path) -> None:
    """The commands load the candidate's compile events: the reason of a compile regression
    names its cause and line; a change point in the compile count names them too."""
    results = tmp_path / "results"
    invocations = [f"inv-{night}" for night in range(6)]
    for night, invocation in enumerate(invocations):
        late = 2 if night >= 3 else 0
        run = run_row(
            f"run{night}000", invocation, recompiles_after_warmup=late, compile_count=1 + late, git_sha=f"sha{night}"
        )
        run["started_at"] = run["started_at"].replace(hour=night)
        events = shape_change_events(run["run_id"], invocation) if late else []
        write(results, invocation, [run], events)
    compared = in_process(
        "compare --baseline invocation=inv-2 --candidate invocation=inv-3 --json --results", str(results)
    )
    assert compared.returncode == 0, compared.stderr
    rows = {row["metric"]: row for row in json.loads(compared.stdout)["comparison"]}
    assert rows["recompiles"]["reason"].endswith(f"none in the baseline: shape change {X}2 at {SHAPE_LINE}")
    found = in_process("regressions --metric compile_count --json --results", str(results))
    assert found.returncode == 0, found.stderr
    points = json.loads(found.stdout)
    assert [(p["invocation_id"], p["cause"]) for p in points] == [("inv-3", f"shape change {X}2 at {SHAPE_LINE}")]


@pytest.mark.parametrize(
    ("extra", "why"),
    [
        ({"capture_compiles": False}, "it ran with --no-capture-compiles"),
        # a run that ended early has no capture columns: not a run from before they were recorded
        ({"capture_compiles": None, "status": "timeout"}, "its status is timeout: it ended before its capture"),
        ({"capture_compiles": None}, "it ran before tpubench recorded them"),
    ],
)
def test_a_run_without_events_says_why(tmp_path: Path, extra: dict, why: str) -> None:
    results = tmp_path / "results"
    write(results, "inv-b", [run_row("nocap001", "inv-b", **extra)], [])
    said = one_error_line(in_process("compiles nocap001 --results", str(results)))
    assert why in said


# --- --explain -----------------------------------------------------------------------

#: three syncs of torch_xla 2.9's XLA_SAVE_TENSORS_FILE under XLA_IR_DEBUG=1 (batches 8, 8, 12 of
#: the research note's xla_dump.py), cut to the nodes that matter; the second graph's weights
#: were made elsewhere (location differs) and still hash the same
DUMP = """
[ScheduleSyncTensorsGraph]
TensorsGraphInfo:
  sync (/venv/lib/python3.11/site-packages/torch_xla/torch_xla.py:87)
  <module> (/tmp/xla_dump.py:8)

## BEGIN_GRAPH
IR {
  %0 = f32[] prim::Constant(), location=<module>@xla_dump.py:6, xla_shape=f32[]
  %1 = f32[8,16]{1,0} aten::expand(%0), location=<module>@xla_dump.py:6, xla_shape=f32[8,16]{1,0}
  %2 = f32[4,16]{1,0} xla::device_data(), location=convert@module.py:1357, xla_shape=f32[4,16]{1,0}
}

Graph Hash: 467e4d91f67cfc569e5d0b977e9a0c7b

## END_GRAPH
"""
DUMP += DUMP.replace("convert@module.py:1357", "forward@linear.py:134")
DUMP += DUMP.split("## END_GRAPH")[0].replace("8,16", "12,16").replace("467e4d91", "6b3dcf9f") + "## END_GRAPH\n"


def test_explain_finds_the_first_ir_node_that_changed_and_its_line() -> None:
    from tpubench import explain

    graphs = explain.parse_graphs(DUMP)
    assert [(g.index, g.hash[:8], g.frame, len(g.nodes)) for g in graphs] == [
        (0, "467e4d91", "xla_dump.py:8", 3),
        (1, "467e4d91", "xla_dump.py:8", 3),
        (2, "6b3dcf9f", "xla_dump.py:8", 3),
    ]
    found = explain.recompiles(graphs)  # graph 1 is the same hash: a cache hit, no compile
    assert [(f["graph"], f["compared_with"]) for f in found] == [(2, 0)]
    assert found[0]["change"] == "f32[8,16] \N{RIGHTWARDS ARROW} f32[12,16] aten::expand at xla_dump.py:6"
    same = explain.parse_graphs(DUMP.replace("467e4d91", "0badc0de", 1))[:2]
    assert explain.first_difference(same[0], same[1]).startswith("same IR, different parameter sequence")


@pytest.mark.slow
def test_explain_on_xla_names_the_shape_that_changed_the_step_and_the_line(
    tmp_path: Path, xla_python: str, compile_workloads: None
) -> None:
    """A real diagnostic re-run under torch_xla (PJRT CPU) of the recompile-shape workload
    (batches 8, 8, 12, 8, 16 from the harness): step 2's graph differs from step 1's in its
    input's shape, first used at torch's Linear line; the re-run leaves no row in the store."""
    results = tmp_path / "results"
    run = run_row("xlashape01", "inv-x", backend="xla", warmup_min_steps=1, measured_steps=2)
    write(results, "inv-x", [run], [])
    shown = in_process("compiles xlashape01 --explain", "--python", f"xla={xla_python}", "--results", str(results))
    assert shown.returncode == 0, shown.stderr
    assert "timings are not comparable" in shown.stdout
    arrow = "\N{RIGHTWARDS ARROW}"
    assert (
        "(step 2, " in shown.stdout and f"f32[8,16] {arrow} f32[12,16] xla::device_data at linear.py:" in shown.stdout
    )
    assert len(store.load_runs(results)) == 1 and store.load_compiles(results).empty


@pytest.mark.slow
def test_explain_on_xla_names_the_users_line_where_the_shape_came_in(
    tmp_path: Path, xla_python: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the user's code makes the shape (a slice of the batch), the changed node is named
    at that line."""
    from conftest import TESTS_DIR
    from explain_workloads import SLICE_LINE

    monkeypatch.setenv("TPUBENCH_WORKLOAD_MODULES", "explain_workloads")
    monkeypatch.setenv("PYTHONPATH", str(TESTS_DIR))
    monkeypatch.syspath_prepend(str(TESTS_DIR))
    results = tmp_path / "results"
    run = run_row("xlaslice01", "inv-x", backend="xla", workload="explain-shape", batch_size=16)
    write(results, "inv-x", [{**run, "warmup_min_steps": 1, "measured_steps": 2}], [])
    shown = in_process("compiles xlaslice01 --explain", "--python", f"xla={xla_python}", "--results", str(results))
    assert shown.returncode == 0, shown.stderr
    assert f"f32[8,16] \N{RIGHTWARDS ARROW} f32[12,16] xla::select at explain_workloads.py:{SLICE_LINE}" in shown.stdout


def test_explain_rebuilds_a_users_model_from_its_reference(tmp_path: Path) -> None:
    """A ``--model`` run's workload names a factory in no registry: the re-run's
    spec carries the stored reference, which the worker resolves (``workload_for``) as the
    run's worker did; a re-run whose model hashes otherwise (the file changed) says so."""
    from tpubench import explain
    from tpubench.models import workload_for
    from workloads import Shape
    from workloads.custom.ref import ModelRef

    model = tmp_path / "dyn_model.py"
    model.write_text(
        "import torch\n\n\ndef make_model():\n    return torch.nn.Linear(16, 4)\n\n\n"
        "def make_inputs(batch_size, generator, **dims):\n"
        "    return (torch.randn(batch_size, 16, generator=generator),)\n"
    )
    ref = ModelRef("factory", f"{model}:make_model", inputs=f"{model}:make_inputs")
    results = tmp_path / "results"
    run = run_row("mine0001", "inv-m", workload=f"{model}:make_model", size="default", model_ref=ref.to_json(),
                  model_hash="0123456789abcdef")  # fmt: skip
    write(results, "inv-m", [run], [])
    [stored] = store.load_runs(results).to_dict("records")
    spec = explain.spec_of(stored)
    workload = workload_for(spec)
    assert workload.name == "dyn_model:make_model"  # its name without the path, as the run stored it
    assert workload.row_columns(workload.config("default"), Shape(2), "infer")["model_ref"] == ref.to_json()
    assert explain.changed_model(spec, {"model_hash": "0123456789abcdef"}) is None
    note = explain.changed_model(spec, {"model_hash": "fedcba9876543210"})
    assert note.startswith("note: the model changed since the run (hash 0123456789ab, now fedcba987654)")


def test_explain_reads_dynamos_reasons_from_its_structured_trace() -> None:
    """Lines of a real TORCH_TRACE log (torch 2.13, cpu-compile, batch 8 then 12), cut short."""
    from tpubench import explain

    trace = (
        'V1202 12:45:19.314000 16369 torch/_dynamo/guards.py:5400] {"artifact": {"name": "recompile_reasons", '
        '"encoding": "json"}, "frame_id": 0, "frame_compile_id": 1, "attempt": 0, "has_payload": "3ad6"}\n'
        "\t0/0: tensor 'args[0]' size mismatch at index 0. expected 8, actual 12\n"
        'V1202 12:45:19.315000 16369 torch/_dynamo/convert_frame.py:303] {"dynamo_start": {"stack": []}}\n'
    )
    assert explain.trace_reasons(trace) == [
        "0/1 recompiled because 0/0: tensor 'args[0]' size mismatch at index 0. expected 8, actual 12"
    ]


def test_compiles_without_a_run_lists_the_runs_with_events(results: Path) -> None:
    shown = in_process("compiles --json --results", str(results))
    assert shown.returncode == 0, shown.stderr
    listed = {row["run_id"]: row for row in json.loads(shown.stdout)}
    assert set(listed) == {"shape0001", "limit0001", "xlaa0001", "xlab0001"}
    assert (listed["shape0001"]["after_warmup"], listed["shape0001"]["graph_breaks"]) == (2, 1)
    assert listed["limit0001"]["limit_hit"] is True


@pytest.mark.slow
def test_compiles_of_a_real_run_names_the_shape_change_and_its_line(tmp_path: Path, compile_workloads: None) -> None:
    """A real cpu-compile run (Dynamo through aot_eager: the same records at a fraction of
    Inductor's compile time) of batches 8, 8, 12, 8, 16, read back by the command."""
    from helpers import tpubench

    results = tmp_path / "results"
    line = "run --workload recompile-shape --backend cpu-compile-eager --mode train --steps 3 --warmup 2 --results"
    done = tpubench(line, str(results))
    assert done.returncode == 0, done.stderr
    run_id = store.load_runs(results)["run_id"].iloc[0]
    shown = in_process(f"compiles {run_id[:6]} --json --results", str(results))
    assert shown.returncode == 0, shown.stderr
    found = json.loads(shown.stdout)
    where = line_of("CALL_LINE")
    assert f"after warm-up 1 (shape change at {where}, " in found["summary"][0]
    forward = [e for e in found["events"] if e["layer"] == "dynamo" and e["event"] == "compile"]
    assert [(e["step"], e["cause"]) for e in forward] == [
        (0, "first_compile"),
        (2, "shape_change"),
        (4, "shape_change"),
    ]
    assert "size mismatch at index 0. expected 8, actual 12" in forward[1]["raw"]


def test_a_rare_graph_break_is_named_by_the_backends_text() -> None:
    assert analysis.graph_break_name("GB0431", "Unsupported method call\nmore") == "Unsupported method call"
    assert analysis.graph_break_name("GB0431") == "GB0431"
