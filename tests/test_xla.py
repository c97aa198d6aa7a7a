"""The XLA backends with real torch_xla on the PJRT CPU device (no chip is faked).

Workers run under the torch_xla interpreter (fixture ``xla_python``), the parent under
this one, exactly as ``tpubench run --python xla=...`` does.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest
from helpers import ROOT, in_process

from tpubench import store
from tpubench.runner import SuiteRunner, plan


def run_xla(
    results_dir: Path, python: str, workload: str = "gpt2", backend: str = "xla", mode: str = "train", **settings
) -> dict:
    specs = plan(
        [workload], backends=[backend], modes=[mode], **{"warmup": 1, "steps": 3, "timeout_s": 300, **settings}
    )
    [row] = SuiteRunner(results_dir, pythons={"xla": python}).run(specs)
    assert row["status"] == "ok", (row.get("error"), row.get("stderr_tail"))
    return row


@pytest.fixture(scope="module")
def verified_train(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """One gpt2 train run on xla with --verify, in a store of its own, and its row: the
    settling test reads its measurement, the verify test its verdict. --verify's reference
    and candidate workers run after the measured one, so the measurement is an unverified
    run's; one XLA train run (tens of seconds on the 2-core CI host) serves both."""
    python = os.environ.get("TPUBENCH_XLA_PYTHON")
    if not python or not os.access(python, os.X_OK):
        pytest.skip("TPUBENCH_XLA_PYTHON does not name a torch_xla interpreter (see .ci/run)")
    results_dir = tmp_path_factory.mktemp("verified") / "results"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PJRT_DEVICE", "CPU")
        return results_dir, run_xla(results_dir, python, mode="train", verify=True)


def test_train_compiles_settle_after_warmup_with_no_fallbacks(verified_train: tuple[Path, dict]) -> None:
    results_dir, row = verified_train
    assert row["device"] == "CPU (PJRT)"
    assert row["compile_count"] >= 2  # step 0, and step 1 once the optimizer state exists
    assert row["recompiles_after_warmup"] == 0
    assert row["warmup_steps"] >= 1 and row["compile_s"] > 0 and row["execute_s"] > 0
    assert row["fallback_op_count"] == 0 and json.loads(row["fallback_ops"]) == {}
    assert 0 < row["median_host_ms"] < row["median_step_ms"]  # tracing is part of the synchronised step
    steps = store.load_steps(results_dir)
    measured = steps[steps.phase == "measure"]
    assert measured.compile_count.nunique() == 1
    assert (steps.host_ms <= steps.step_ms).all()
    compiles = store.load_compiles(results_dir)  # a settled run: every compile during warm-up
    assert not (compiles.phase == "measured").any() and set(compiles.cause.dropna()) <= {"step_sync", "shape_change"}
    assert (compiles.cache == "miss").sum() == row["compile_count"] and row["executions_per_step"] == 1.0


@pytest.mark.nightly  # CI runs xla-compile in test_compiles.py and test_spmd.py; llama3 here took 60 CPU-s
def test_openxla_compile_backend_runs(results_dir: Path, xla_python: str) -> None:
    row = run_xla(results_dir, xla_python, workload="llama3", backend="xla-compile", mode="infer")
    assert row["compile_count"] >= 1 and row["recompiles_after_warmup"] == 0


SHAPE_CHANGE = textwrap.dedent("""
    import json
    import torch_xla
    from tpubench.backends.xla import XlaBackend
    from tpubench.measure import make_step, run_protocol
    from tpubench.spec import RunSpec
    from workloads import load

    backend = XlaBackend()
    instance = load("gpt2", "tiny", device=backend.device(), batch_size=4, seq_len=32)
    step = make_step(instance, instance.model, "train")
    spec = RunSpec("llm", "gpt2", "tiny", "xla", "train", "float32", 4, 32, warmup=1, steps=3)
    first = run_protocol(spec, backend, step)
    smaller = load("gpt2", "tiny", device=backend.device(), batch_size=2, seq_len=32).batch
    instance.batch.update(smaller)  # same model and optimizer, new batch shape
    second = run_protocol(spec, backend, step)
    print(json.dumps([first.compile_count, first.recompiles_after_warmup,
                      second.compile_count, second.recompiles_after_warmup]))
""")


@pytest.mark.nightly  # 26 s on the 2-core CI host; CI checks an XLA shape change in the harness in
# test_compiles.py (test_xla_shape_change_is_a_new_graph_hash_at_the_sync_inferred)
def test_a_new_batch_shape_adds_exactly_one_compilation(xla_python: str) -> None:
    """Same model and optimizer, batch 4 then 2: one new train-step graph, then stable again."""
    result = subprocess.run(
        [xla_python, "-c", SHAPE_CHANGE],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        env={**__import__("os").environ, "PYTHONPATH": str(ROOT)},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    first_count, first_recompiles, second_count, second_recompiles = json.loads(result.stdout.splitlines()[-1])
    assert first_recompiles == 0 and second_recompiles == 0
    assert second_count == first_count + 1


def test_cpu_fallback_ops_are_recorded(fault_workloads: None, results_dir: Path, xla_python: str) -> None:
    row = run_xla(results_dir, xla_python, workload="xla-fallback")
    fallbacks = json.loads(row["fallback_ops"])
    assert "aten::bincount" in fallbacks and row["fallback_op_count"] >= fallbacks["aten::bincount"] > 0


def test_profile_writes_an_xplane_trace_with_step_annotations(results_dir: Path, xla_python: str) -> None:
    from xprof.profile_data import ProfileData

    row = run_xla(results_dir, xla_python, mode="infer", profile_steps=2)
    assert row["trace_path"] == f"traces/{row['run_id']}"  # relative to the store, which can move
    trace_dir = results_dir / row["trace_path"]
    [xplane] = trace_dir.glob("plugins/profile/*/*.xplane.pb")
    assert xplane.stat().st_size > 0
    names = {
        event.name
        for plane in ProfileData.from_file(str(xplane)).planes
        for line in plane.lines
        for event in line.events
    }
    assert "train_step" in names  # the StepTrace annotation of each traced step
    assert len(store.load_steps(results_dir, phase="measure")) == 3  # traced steps are not measured ones


def test_compile_cache_is_used_on_the_second_cold_start(results_dir: Path, xla_python: str, tmp_path: Path) -> None:
    cache = str(tmp_path / "cache")
    cold = run_xla(results_dir, xla_python, mode="infer", compile_cache=cache)
    warm = run_xla(results_dir, xla_python, mode="infer", compile_cache=cache)
    assert cold["compile_cache"] == cache and cold["compile_cache_misses"] == cold["compile_count"]
    assert warm["compile_cache_misses"] == 0
    # Entries found on disk: loaded (a hit) or, on PJRT CPU, found but not deserialisable.
    assert warm["compile_cache_hits"] + warm["compile_cache_load_failures"] == warm["compile_count"]
    if warm["compile_cache_hits"]:
        assert warm["compile_s"] < cold["compile_s"]
    # per graph: the warm run found each of the cold run's graphs on disk by its hash
    compiles = store.load_compiles(results_dir, event="compile", layer="xla")
    cold_graphs = compiles[(compiles.run_id == cold["run_id"]) & (compiles.cache == "miss")]
    warm_graphs = compiles[(compiles.run_id == warm["run_id"]) & (compiles.cache != "memory_hit")]
    assert set(warm_graphs.graph_id) == set(cold_graphs.graph_id)
    assert set(warm_graphs.cache) <= {"disk_hit", "load_failed"}  # PJRT CPU cannot load: load_failed


def test_missing_torch_xla_is_unavailable_and_names_the_interpreter(results_dir: Path) -> None:
    import sys

    specs = plan(["gpt2"], backends=["xla"], modes=["infer"], steps=1)
    [row] = SuiteRunner(results_dir).run(specs)  # this interpreter has no torch_xla
    if row["status"] == "ok":
        pytest.skip("torch_xla is importable in the test interpreter")
    assert row["status"] == "unavailable"
    assert "torch_xla not installed" in row["error"] and sys.executable in row["error"]


def test_unwritable_compile_cache_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = in_process("run", "--backend", "cpu", "--compile-cache", str(blocker / "cache"))
    assert result.returncode == 2
    assert (
        result.stderr.startswith("error: --compile-cache") and "cannot write there (Not a directory)" in result.stderr
    )


def greedy_tokens(python: str, backend: str, *workloads: str) -> dict:
    result = subprocess.run(
        [python, str(ROOT / "tests" / "greedy_tokens.py"), backend, *workloads],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.splitlines()[-1])


@pytest.mark.nightly  # two workloads' prefill and decode graphs on XLA: 80 s on the 2-core CI host
def test_xla_decode_gives_the_cpu_tokens_and_compiles_nothing_new_after_the_first_step(xla_python: str) -> None:
    """One greedy generation per backend (an XLA generation costs tens of seconds here, so
    its tokens and its compile counts are checked from the same one)."""
    import sys

    reference = greedy_tokens(sys.executable, "cpu")
    assert greedy_tokens(sys.executable, "cpu-compile", "gpt2")["gpt2"]["tokens"] == reference["gpt2"]["tokens"]
    xla = greedy_tokens(xla_python, "xla")
    for workload in ("gpt2", "llama3"):
        assert xla[workload]["tokens"] == reference[workload]["tokens"], workload  # identical in float32
        compiles = xla[workload]["compiles"]  # after the prefill token, then after each decode step
        assert compiles[1] > compiles[0], workload  # the decode graph is compiled once...
        assert len(set(compiles[1:])) == 1, (workload, compiles)  # ...and reused at every position


def test_verify_xla_against_the_cpu_reference(verified_train: tuple[Path, dict]) -> None:
    """Also the tied LM head: ``Module.to`` gave it a matrix of its own on xla (one parameter
    more, 1,052,160 elements against 790,016 on the CPU), training updated two matrices and
    the losses drifted from the second step. The row counts what the CPU build has, and
    --verify compares three steps' losses and the count."""
    _, row = verified_train
    assert row["param_count"] == 790_016  # the CPU build's (test_registry)
    assert row["verified"] == "match" and row["max_rel_err"] <= 1e-3, row.get("error")
