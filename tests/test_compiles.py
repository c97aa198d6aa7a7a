"""The ``compiles`` table: each compile, graph break, host read and fallback of
a run, with its step, cause and line, from real Dynamo and real torch_xla on PJRT CPU.

The Dynamo tests run ``cpu-compile-eager`` (tests/compile_workloads.py): cpu-compile's
capture with Dynamo's ``aot_eager`` backend, since an Inductor compile takes minutes on the
shared CI host; the Inductor ones are nightly. Workers run as ``tpubench run`` runs them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from compile_workloads import SHAPE_SCHEDULE, line_of

from tpubench import store
from tpubench.compiles.xla import parse_blocks, xla_cause
from tpubench.runner import SuiteRunner, plan


def run(results_dir: Path, workload: str, backend: str, mode: str = "train", python: str | None = None, **settings):
    """One run (warm-up 1, 3 measured steps) and its compiles rows, in step order."""
    specs = plan(
        [workload], backends=[backend], modes=[mode], **{"warmup": 1, "steps": 3, "timeout_s": 300, **settings}
    )
    [row] = SuiteRunner(results_dir, pythons={"xla": python} if python else {}).run(specs)
    events = store.load_compiles(results_dir, run_id=row["run_id"]).sort_values("seq")
    return row, events


def accounted(row: dict, events: pd.DataFrame, *layers: str) -> None:
    """The rows' seconds add up to the run's ``compile_s`` (within 5%), and the steps' too."""
    rows_s = events[events.layer.isin(layers) & events.compile_s.notna()].compile_s.sum()
    assert rows_s == pytest.approx(row["compile_s"], rel=0.05)
    assert row["compile_s_warmup"] + row["compile_s_measured"] == pytest.approx(row["compile_s"], rel=0.05)


@pytest.mark.slow
def test_dynamo_shape_change_recompiles_at_the_changed_steps_with_reason_and_line(
    compile_workloads: None, results_dir: Path
) -> None:
    row, events = run(results_dir, "recompile-shape", "cpu-compile-eager")
    assert row["status"] == "ok", row.get("error")
    forward = events[(events.event == "compile") & (events.layer == "dynamo")]
    assert list(forward.step) == [0, 2, 4]  # batches 8, 8, 12, 8, 16: step 3's batch of 8 is known
    assert list(forward.cause) == ["first_compile", "shape_change", "shape_change"]
    assert "size mismatch at index 0. expected 8, actual 12" in forward.raw.iloc[1]
    assert not forward.cause_inferred.any()  # Dynamo states its reason
    assert set(forward.source) == {line_of("CALL_LINE")}  # the workload's line that calls the model
    assert list(forward.compile_id) == ["0/0", "0/1", "0/2"]
    backward = events[events.layer == "aot_backward"]
    assert list(backward.step) == [0, 2, 4] and set(backward.cause) == {"lazy_backward"}
    assert 3 not in set(events.step)
    # one row per compilation-metrics record, one frame compile per distinct graph
    assert len(forward) == row["compile_count"] + row["recompiles_after_warmup"] == 3
    assert json.loads(row["recompile_causes"]) == {"shape_change": 2}
    assert row["graph_breaks"] == 0 and row["recompile_limit_hit"] is False
    accounted(row, events, "dynamo", "aot_backward")
    steps = store.load_steps(results_dir, run_id=row["run_id"]).sort_values("step")
    assert [s > 0 for s in steps.compile_s] == [True, False, True, False, True]


@pytest.mark.slow
def test_item_breaks_the_graph_then_recompiles_by_value_until_the_limit(
    compile_workloads: None, results_dir: Path
) -> None:
    row, events = run(results_dir, "item-in-step", "cpu-compile-eager")
    assert row["status"] == "ok", row.get("error")
    [graph_break] = events[events.event == "graph_break"].itertuples()
    assert graph_break.graph_break_id == "GB0124" and "Tensor.item()" in graph_break.raw
    assert graph_break.source == line_of("ITEM_LINE")
    resumed = events[(events.layer == "dynamo") & events.compile_id.str.startswith("1/")]
    assert resumed.cause.iloc[0] == "graph_break_resume"
    assert set(resumed.cause.iloc[1:]) == {"value_change"}  # the resumed frame guards on the float
    [limit] = events[events.event == "recompile_limit"].itertuples()
    assert limit.compile_id == "1/8" and limit.source == line_of("ITEM_LINE")
    assert row["recompile_limit_hit"] is True and json.loads(row["graph_break_ids"]) == {"GB0124": 1}
    # warm-up "settled" because the frame now runs eagerly; the warning says so
    assert row["recompiles_after_warmup"] == 0
    assert "recompile limit" in row["warnings"] and line_of("ITEM_LINE") in row["warnings"]


@pytest.mark.slow
def test_fail_on_recompile_fails_the_run_with_the_reason(compile_workloads: None, results_dir: Path) -> None:
    """The failed run keeps its events, the refused compile last, for ``tpubench compiles`` to show."""
    from helpers import in_process

    row, events = run(results_dir, "recompile-shape", "cpu-compile-eager", fail_on_recompile=True)
    assert row["status"] == "failed"
    assert row["error"].startswith("RecompileError: compiled after warm-up, at step 2: dynamo shape_change at ")
    assert line_of("CALL_LINE") in row["error"] and "size mismatch at index 0. expected 8, actual 12" in row["error"]
    assert row["capture_compiles"] is True
    assert list(zip(events.step, events.event, events.cause, strict=True)) == [
        (0, "compile", "first_compile"),
        (0, "compile", "lazy_backward"),
        (2, "compile_failed", "shape_change"),
    ]
    refused = events.iloc[-1]
    assert refused.source == line_of("CALL_LINE") and "size mismatch at index 0" in refused.raw
    shown = in_process(f"compiles {row['run_id']} --results", str(results_dir))
    assert shown.returncode == 0, shown.stderr
    assert f"1 failed compile(s) at {line_of('CALL_LINE')}" in shown.stdout


@pytest.mark.slow
def test_a_clean_workload_has_no_events_after_warmup_and_capture_can_be_off(
    compile_workloads: None, results_dir: Path
) -> None:
    row, events = run(results_dir, "compile-clean", "cpu-compile-eager")
    assert row["status"] == "ok" and row["capture_compiles"] is True
    assert not (events.phase == "measured").any() and json.loads(row["recompile_causes"]) == {}
    assert row["compile_s_measured"] == 0
    off, events = run(results_dir, "compile-clean", "cpu-compile-eager", capture_compiles=False)
    assert off["status"] == "ok" and off["capture_compiles"] is False and events.empty
    assert off.get("graph_breaks") is None and off["compile_s"] > 0  # the backend's own totals stay


@pytest.mark.slow
def test_xla_shape_change_is_a_new_graph_hash_at_the_sync_inferred(
    compile_workloads: None, results_dir: Path, xla_python: str
) -> None:
    row, events = run(results_dir, "recompile-shape", "xla", python=xla_python)
    assert row["status"] == "ok", row.get("error")
    compiled = events[(events.event == "compile") & (events.cache == "miss")]
    assert set(compiled.step) == {0, 1, 2, 4}  # step 1: AdamW's state makes a second graph
    changed = compiled[compiled.step.isin([2, 4])]
    assert list(changed.cause) == ["shape_change", "shape_change"] and changed.cause_inferred.all()
    assert compiled.graph_id.is_unique and compiled.graph_id.notna().all()
    [hit] = events[events.step == 3].itertuples()  # batch 8 again: found compiled in memory
    assert hit.cache == "memory_hit"
    assert len(compiled) == row["compile_count"] + row["recompiles_after_warmup"]  # == UncachedCompile
    assert row["compile_events_dropped"] == 0
    accounted(row, events, "xla")
    assert row["executions_per_step"] == 1.0 and row["host_reads_per_step"] == 0.0


@pytest.mark.slow
def test_xla_item_is_one_host_read_compile_and_a_host_read_per_step(
    compile_workloads: None, results_dir: Path, xla_python: str
) -> None:
    row, events = run(results_dir, "item-in-step", "xla", python=xla_python)
    assert row["status"] == "ok", row.get("error")
    [read] = events[(events.event == "compile") & (events.cause == "host_read")].itertuples()
    assert read.source == line_of("ITEM_LINE") and read.step == 0
    assert row["executions_per_step"] == 2.0 and row["host_reads_per_step"] == 1.0
    assert json.loads(row["missing_lowerings"]) == {}  # a .item() is a host read, not a missing lowering
    assert row["recompiles_after_warmup"] == 0
    measured = events[events.phase == "measured"]
    assert set(measured.event) == {"host_read"} and set(measured.op) == {"aten::_local_scalar_dense"}


@pytest.mark.slow
def test_xla_compile_keeps_fallback_counts_across_dynamo_recompiles(
    compile_workloads: None, results_dir: Path, xla_python: str
) -> None:
    """torch_xla's dynamo bridge clears the counters at each compile: a histc counted
    before the recompiles at steps 2 and 4 must still be in the run's totals."""
    row, events = run(results_dir, "histc-fallback", "xla-compile", mode="infer", python=xla_python)
    assert row["status"] == "ok", row.get("error")
    per_step = events[events.event == "fallback"].groupby("step")["count"].sum()
    assert list(per_step.index) == list(range(len(SHAPE_SCHEDULE)))  # counted in every step
    assert json.loads(row["fallback_ops"])["aten::histc"] == per_step.sum() >= len(SHAPE_SCHEDULE)
    assert json.loads(row["missing_lowerings"]) == {"aten::histc": per_step.sum()}
    dynamo = events[(events.layer == "dynamo") & (events.event == "compile")]
    assert list(dynamo.step) == [0, 2, 4] and list(dynamo.cause) == ["first_compile", "shape_change", "shape_change"]
    lowered = events[(events.layer == "xla") & events.compile_id.notna()]
    assert set(lowered.compile_id) == set(dynamo.compile_id)  # each Dynamo compile joined to its XLA compiles
    assert dynamo.graph_id.isin(lowered.graph_id).all()
    reads = events[(events.event == "compile") & (events.cause == "host_read")]
    # the fallback's read cut the graph in the workload's forward (under Dynamo, the frame
    # torch_xla sees is the forward's being compiled: its ``def`` line, not the histc line)
    assert len(reads) == 3 and reads.source.str.startswith("tests/compile_workloads.py:").all()
    accounted(row, events, "xla")


@pytest.mark.parametrize(
    ("reason", "cause"),
    [
        ("0/0: ___stack0 == 2.4869", "value_change"),
        ("0/0: L['n'] == 7", "value_change"),
        ("0/0: ___stack0 == False", "value_change"),  # a bool read on the host, as docs/compiles.md says
        ("0/0: L['flag'] != None", "value_change"),
        ("0/0: L['mode'] == 'train'", "value_change"),
        ("0/0: tensor 'x' size mismatch at index 0. expected 8, actual 12", "shape_change"),
        ("0/0: ___check_type_id(L['x'], 94251)", "other_guard"),
    ],
)
def test_a_dynamo_guard_is_named_by_what_it_checks(reason: str, cause: str) -> None:
    from tpubench.compiles.dynamo import reason_cause

    assert reason_cause(reason, "forward") == cause


def test_pt_xla_debug_blocks_parse_into_cause_hash_and_frames() -> None:
    text = "\n".join(
        [
            "Compilation Analysis: " + "=" * 20,
            "Compilation Analysis: Compilation Cause",
            "Compilation Analysis:   most likely user code trying to access tensor value before torch_xla.sync",
            "Compilation Analysis: Graph Info: ",
            "Compilation Analysis:   Graph Hash: 84594db917a3b2b45a5226f3a309486a",
            "Compilation Analysis:   Number of Graph Inputs: 3",
            "Compilation Analysis:   Number of Graph Outputs: 1",
            "Compilation Analysis: Python Frame Triggered Execution: ",
            "Compilation Analysis:   forward (/w/model.py:13)",
            "Compilation Analysis:   <module> (/w/train.py:40)",
            "Compilation Analysis: " + "-" * 20,
            "Compilation Analysis: " + "=" * 20,
            "Post Compilation Analysis: Graph input size: 0.000001 GB",
            "Compilation Analysis: " + "=" * 20,  # a block still being written: left for later
            "Compilation Analysis: Compilation Cause",
        ]
    )
    [block] = parse_blocks(text)
    assert block.graph_hash == "84594db917a3b2b45a5226f3a309486a" and (block.inputs, block.outputs) == (3, 1)
    assert block.frames == [("/w/model.py", 13), ("/w/train.py", 40)]
    assert xla_cause(block.cause) == "host_read"
    assert xla_cause("user torch_xla.sync") == "step_sync"
    assert xla_cause("dynamo is compiling a FX graph to HLO") == "unknown"  # joined to Dynamo's cause later


def test_a_block_still_being_written_is_read_whole_next_time(tmp_path: Path) -> None:
    from tpubench.compiles.xla import CounterTotals, XlaCapture

    rule, path = "Compilation Analysis: " + "=" * 20, tmp_path / "pt_xla_debug.txt"
    block = [rule, "Compilation Analysis: Compilation Cause", "Compilation Analysis:   user torch_xla.sync"]
    post = ["Post Compilation Analysis: " + "=" * 20, "Post Compilation Analysis: Graph input size: 0.1 GB"]
    path.write_text("\n".join([*block, rule, *post, *post[:1], *block]) + "\n")  # the second block half-written
    capture = XlaCapture(CounterTotals(), str(path))
    assert len(capture._read_blocks()) == 1
    with open(path, "a") as stream:
        stream.write("Compilation Analysis:   Graph Hash: ab12\n" + rule + "\n")
    [second] = capture._read_blocks()
    assert second.graph_hash == "ab12" and second.cause == "user torch_xla.sync"


def test_stores_without_a_compiles_table_load_empty(results_dir: Path) -> None:
    (results_dir / "runs").mkdir()
    frame = store.load_compiles(results_dir)
    assert frame.empty and "cause_inferred" in frame.columns


def test_torchtpu_counters_become_compile_rows_per_step() -> None:
    """TorchTPU's counters (faked here: no chip) as rows: a step that compiled gets one row
    counting its executables; a step that compiled nothing gets none."""
    from tpubench.compiles.tpu import TpuCapture

    counts = iter([0, 0, 2, 3, 3])  # before and after the build, then after steps 0, 1 and 2
    capture = TpuCapture(lambda: {"num_compilations": next(counts), "num_cache_reqs": 0, "num_cache_hits": 0})
    capture.start()
    for step, phase in enumerate(["first", "warmup", "measure"]):
        capture.before_step(step, phase)
        capture.after_step(step, phase)
    assert [(e.step, e.phase, e.layer, e.cause, e.count) for e in capture.events] == [
        (0, "warmup", "tpu", "unknown", 2),
        (1, "warmup", "tpu", "unknown", 1),
    ]


@pytest.mark.nightly
def test_inductor_shape_change_has_the_same_rows_as_aot_eager(compile_workloads: None, results_dir: Path) -> None:
    row, events = run(results_dir, "recompile-shape", "cpu-compile")
    assert row["status"] == "ok", row.get("error")
    forward = events[(events.event == "compile") & (events.layer == "dynamo")]
    assert list(forward.step) == [0, 2, 4] and list(forward.cause) == ["first_compile", "shape_change", "shape_change"]
    assert set(forward.cache) == {"miss"}  # a private, empty FX-graph cache
    accounted(row, events, "dynamo", "aot_backward")


@pytest.mark.nightly
def test_xla_fail_on_recompile_names_the_cause(compile_workloads: None, results_dir: Path, xla_python: str) -> None:
    row, _ = run(results_dir, "recompile-shape", "xla", python=xla_python, fail_on_recompile=True)
    assert row["status"] == "failed" and "compiled after warm-up, at step 4: xla shape_change" in row["error"]


def test_the_users_line_is_found_by_package_folders_not_by_a_path_part(tmp_path: Path) -> None:
    """A clone in a folder named ``tpubench`` keeps its workloads' lines; the harness's own
    frames, torch's and the adapter around a user's factory are never the user's line."""
    import torch

    import tpubench
    from tpubench.compiles import user_source

    clone = tmp_path / "tpubench" / "workloads" / "gpt2.py"
    harness = Path(tpubench.__file__).parent / "measure.py"
    adapter = Path(tpubench.__file__).parent.parent / "workloads" / "custom" / "factory.py"
    torch_frame = Path(torch.__file__).parent / "nn" / "modules" / "module.py"
    frames = [(str(harness), 1), (str(clone), 88), (str(adapter), 198), (str(torch_frame), 1775)]
    assert user_source(frames) == f"{clone}:88"
    assert user_source([(str(harness), 1), (str(adapter), 198)]) is None
