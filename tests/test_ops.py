"""Per-op trace inspection on traces captured here: the ops table, its readers, ``tpubench ops``
and ``tpubench trace``.

Each trace comes from a real ``--profile`` run (gpt2 tiny on cpu, cpu-compile and xla on
PJRT CPU), captured once per module into one results store that the tests share and
copy before they damage anything. The readers are held against the libraries' own
views of the same traces: torch.profiler's ``key_averages`` and XProf's ``ProfileData``.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import random
import shutil
import socket
import subprocess
import urllib.request
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from helpers import ROOT, command, in_process, one_error_line, tpubench, wait_for

from tpubench import store, store_compact
from tpubench.analysis import ops as analysis
from tpubench.analysis.categories import CATEGORIES, categorize
from tpubench.runner import SuiteRunner, plan
from tpubench.traces import TraceError, ingest, read_trace
from tpubench.traces.chrome import read_chrome
from tpubench.traces.xplane import converted_hlo_stats, read_xplane
from tpubench.worker import ingest_trace


def profiled(results_dir: Path, backend: str, mode: str = "train", pythons: dict[str, str] | None = None) -> dict:
    specs = plan(["gpt2"], backends=[backend], modes=[mode], warmup=1, steps=2, profile_steps=2, timeout_s=300)
    [row] = SuiteRunner(results_dir, pythons=pythons or {}).run(specs)
    assert row["status"] == "ok", (row.get("error"), row.get("stderr_tail"))
    assert row["trace_path"].startswith(f"traces/{row['run_id']}")  # recorded relative to the store
    return {**row, "trace_file": results_dir / row["trace_path"]}  # where this test finds it


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One store for the module: every captured run goes here."""
    return tmp_path_factory.mktemp("ops") / "results"


@pytest.fixture(scope="module")
def cpu_run(results: Path) -> dict:
    return profiled(results, "cpu")


@pytest.fixture(scope="module")
def compile_run(results: Path) -> dict:
    return profiled(results, "cpu-compile", mode="infer")


@pytest.fixture(scope="module")
def xla_run(results: Path) -> dict:
    """gpt2 tiny infer on torch_xla's PJRT CPU device (the xla environment; skips without it):
    the readers need an HLO trace, not a backward, and infer compiles in half train's time."""
    python = os.environ.get("TPUBENCH_XLA_PYTHON")
    if not python or not os.access(python, os.X_OK):
        pytest.skip("TPUBENCH_XLA_PYTHON does not name a torch_xla interpreter (see .ci/run)")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PJRT_DEVICE", "CPU")
        return profiled(results, "xla", mode="infer", pythons={"xla": python})


def xplane_of(run: dict) -> Path:
    [path] = run["trace_file"].rglob("*.xplane.pb")
    return path


def copy_store(results: Path, destination: Path) -> Path:
    """A copy of the store, as a user copies one to another machine. Its runs record their
    traces relative to the store, so the copy reads its own traces, never the original's
    (the corrupt-trace tests below damage the copy's and expect the error)."""
    shutil.copytree(results, destination)
    return destination


def set_trace_path(results: Path, run_id: str, value: str) -> None:
    for path in (results / "runs").glob("date=*/*.parquet"):
        table = pq.read_table(path)
        recorded = zip(table["run_id"].to_pylist(), table["trace_path"].to_pylist(), strict=True)
        paths = [value if r == run_id else p for r, p in recorded]
        index = table.schema.get_field_index("trace_path")
        pq.write_table(table.set_column(index, "trace_path", pa.array(paths, pa.string())), path)


# --- the category table ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "op", "category"),
    [
        # aten ops and annotations of the cpu and cpu-compile traces captured below
        ("aten", "aten::mm", "matmul"),
        ("aten", "aten::addmm", "matmul"),
        ("aten", "aten::_scaled_dot_product_flash_attention_for_cpu", "attention"),
        ("aten", "aten::_scaled_dot_product_flash_attention_for_cpu_backward", "attention"),
        ("aten", "aten::native_layer_norm", "normalization"),
        ("aten", "aten::native_layer_norm_backward", "normalization"),
        ("aten", "aten::gelu", "elementwise"),
        ("aten", "aten::gelu_backward", "elementwise"),
        ("aten", "aten::addcdiv_", "elementwise"),
        ("aten", "aten::_log_softmax", "reduction"),
        ("aten", "aten::nll_loss_forward", "reduction"),
        ("aten", "aten::sum", "reduction"),
        ("aten", "aten::copy_", "data movement"),
        ("aten", "aten::embedding_dense_backward", "data movement"),
        ("aten", "aten::empty_strided", "data movement"),
        ("aten", "Optimizer.step#AdamW.step", "host/runtime"),
        ("aten", "autograd::engine::evaluate_function: NativeLayerNormBackward0", "host/runtime"),
        ("aten", "ScaledDotProductFlashAttentionForCpuBackward0", "host/runtime"),
        ("aten", "aten::_local_scalar_dense", "host/runtime"),
        ("aten", "cudaLaunchKernel", "host/runtime"),
        ("aten", "aten::convolution", "convolution"),
        ("aten", "c10d::allreduce_", "collective"),
        # an FSDP2 run's (gloo, 2 ranks): the collectives, and the local copies around the all-gather
        ("aten", "c10d::_allgather_base_", "collective"),
        ("aten", "c10d::_reduce_scatter_base_", "collective"),
        ("aten", "gloo:all_gather", "collective"),
        ("aten", "FSDP::all_gather (0)", "other"),  # a wrapper: the c10d/gloo ops inside are the communication
        ("aten", "fsdp::all_gather_copy_in", "data movement"),
        ("aten", "fsdp::all_gather_copy_out", "data movement"),
        ("aten", "FSDP::all_gather_copy_out (blocks.0)", "data movement"),
        ("aten", "## Call CompiledFxGraph f3bno2vpfwn7yc34rnhifvutreeal72p7uzh3qd55njb63lv4vko ##", "other"),
        # HLO instructions of the PJRT CPU xplane, and TPU names with XProf's category
        ("hlo", "dot.710", "matmul"),
        ("hlo", "reduce-window.17.clone", "reduction"),
        ("hlo", "reduce_log_fusion", "reduction"),
        ("hlo", "copy.87", "data movement"),
        ("hlo", "bitcast_gather_fusion", "data movement"),
        ("hlo", "wrapped_scatter", "data movement"),
        ("hlo", "subtract_exponential_fusion.clone", "elementwise"),
        ("hlo", "select_bitcast_fusion", "elementwise"),
        ("hlo", "all-reduce.3", "collective"),
        ("hlo", "all-gather-start.1", "collective"),
        ("hlo", "call.5", "other"),
        # CUDA kernels as PyTorch's CUDA builds name them
        ("kernel", "ampere_sgemm_128x64_tn", "matmul"),
        ("kernel", "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_cublas", "matmul"),
        ("kernel", "nvjet_tst_128x256_64x4_2x1_v_bz_coopA_TNT", "matmul"),
        ("kernel", "sm80_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nchw", "convolution"),
        ("kernel", "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 64, 4>>", "attention"),
        (
            "kernel",
            "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float>",
            "normalization",
        ),
        (
            "kernel",
            "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper>>",
            "reduction",
        ),
        ("kernel", "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl>", "elementwise"),
        ("kernel", "Memcpy HtoD (Pageable -> Device)", "data movement"),
        ("kernel", "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "collective"),
        ("kernel", "triton_poi_fused_add_0", "elementwise"),
        ("kernel", "triton_red_fused__log_softmax_1", "reduction"),
        ("kernel", "triton_per_fused_native_layer_norm_0", "normalization"),
        ("kernel", "triton_tem_fused_addmm_0", "matmul"),
        # Inductor's C++ kernels, as a profiled cpu-compile run names them: after the ops they fuse
        ("aten", "graph_0_cpp_fused_add_embedding_native_layer_norm_slice_0", "normalization"),
        ("aten", "graph_0_cpp_fused_gelu_view_2", "elementwise"),
        ("aten", "cpp_fused__softmax_add_div_3", "reduction"),
        ("aten", "graph_1_cpp_fused_clone_view_4", "data movement"),
    ],
)
def test_the_category_table_puts_the_same_work_in_the_same_bucket(source: str, op: str, category: str) -> None:
    assert categorize(source, op) == category


def test_generic_hlo_names_fall_back_to_the_framework_op_then_xprofs_category() -> None:
    assert categorize("hlo", "fusion.12", "convolution fusion") == "matmul"  # a TPU matmul
    assert categorize("hlo", "convolution.4", "convolution", framework_op="aten__addmm") == "matmul"
    assert categorize("hlo", "convolution.4", "convolution") == "convolution"
    assert categorize("hlo", "fusion.3", "loop fusion") == "elementwise"
    assert categorize("hlo", "fusion.7", "data formatting") == "data movement"
    assert categorize("hlo", "fusion.9") == "other"
    with pytest.raises(ValueError, match="unknown trace source"):
        categorize("cuda", "x")


# --- readers against the libraries' own views ----------------------------------------


def test_chrome_reader_agrees_with_key_averages(tmp_path: Path) -> None:
    """torch.profiler's own per-op table of the same session is the reference."""
    import workloads

    instance = workloads.load("gpt2", "tiny", device="cpu", batch_size=2, seq_len=32)
    instance.loss().backward()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
        for _ in range(2):
            instance.loss().backward()
    profiler.export_chrome_trace(str(tmp_path / "trace.json"))
    mine = {op.op: op for op in read_chrome(tmp_path / "trace.json").ops}
    reference = {event.key: event for event in profiler.key_averages()}
    assert set(mine) == set(reference)
    for name, event in reference.items():
        assert mine[name].calls == event.count, name
        assert mine[name].self_us == pytest.approx(event.self_cpu_time_total, abs=1e-3), name
        assert mine[name].total_us == pytest.approx(event.cpu_time_total, abs=1e-3), name


def test_gzipped_chrome_trace_reads_the_same(cpu_run: dict, tmp_path: Path) -> None:
    packed = tmp_path / "trace.json.gz"
    packed.write_bytes(gzip.compress(cpu_run["trace_file"].read_bytes()))
    assert ingest(packed, 2) == ingest(cpu_run["trace_file"], 2)


def test_xplane_reader_agrees_with_profile_data(xla_run: dict) -> None:
    """XProf's ProfileData (the whole XSpace in memory) is the reference for the streamed reader."""
    from xprof.profile_data import ProfileData

    calls: dict[str, int] = defaultdict(int)
    total: dict[str, float] = defaultdict(float)
    own: dict[str, float] = defaultdict(float)
    for plane in ProfileData.from_file(str(xplane_of(xla_run))).planes:
        for line in plane.lines:
            events = [
                (e.name, e.start_ns, e.start_ns + e.duration_ns, e.duration_ns)
                for e in line.events
                if any(key == "hlo_op" for key, _ in e.stats)
            ]
            for name, _, _, duration in events:
                calls[name] += 1
                total[name] += duration / 1e3
                own[name] += duration / 1e3
            for i, (_, start, end, duration) in enumerate(events):  # each op's innermost container
                parents = [j for j, (_, s, e, _) in enumerate(events) if j != i and s <= start and end <= e]
                if parents:
                    parent = min(parents, key=lambda j: (events[j][3], j))
                    own[events[parent][0]] -= duration / 1e3
    found = read_xplane(xplane_of(xla_run))
    assert found.tool == "xplane events" and found.steps == 2
    mine: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    for op in found.ops:
        mine[op.op][0] += op.calls
        mine[op.op][1] += op.total_us
        mine[op.op][2] += op.self_us
    assert set(mine) == set(calls)
    for name in calls:
        assert mine[name][0] == calls[name], name
        assert mine[name][1] == pytest.approx(total[name], abs=1e-3), name
        assert mine[name][2] == pytest.approx(own[name], abs=1e-3), name
    assert any(op.self_us < op.total_us for op in found.ops)  # nesting (call.*) was exercised


def test_xprof_converter_reads_a_link_and_leaves_the_trace_folder_alone(xla_run: dict) -> None:
    """PJRT CPU has no device plane, so hlo_stats is empty here; its cache files must not
    land beside the trace."""
    folder = xplane_of(xla_run).parent
    before = sorted(path.name for path in folder.iterdir())
    assert converted_hlo_stats(xplane_of(xla_run)) == []
    assert sorted(path.name for path in folder.iterdir()) == before


# --- the ops table ----------------------------------------------------------------------


def test_a_profiled_cpu_run_has_ops_rows(results: Path, cpu_run: dict) -> None:
    rows = store.load_ops(results, run_id=cpu_run["run_id"])
    assert set(rows["source"]) == {"aten"} and set(rows["tool"]) == {"chrome trace"}
    assert set(rows["category"]) <= set(CATEGORIES)
    assert (rows["traced_steps"] == 2).all() and rows["invocation_id"].notna().all()
    mm = rows[rows["op"] == "aten::mm"].iloc[0]
    assert mm["category"] == "matmul" and mm["calls"] > 0
    assert mm["self_us_per_step"] == pytest.approx(mm["self_time_us"] / 2)
    assert (rows["self_time_us"] <= rows["total_time_us"] + 1e-6).all()
    # one thread: self times do not overlap, and Python between ops is in no op
    assert 50 < rows["self_pct"].sum() <= 100 + 1e-6
    [run] = store.load_runs(results, run_id=cpu_run["run_id"]).to_dict("records")
    assert run["profile_steps"] == 2 and pd.isna(run["ops_error"])


def test_a_profiled_xla_run_has_hlo_rows(results: Path, xla_run: dict) -> None:
    rows = store.load_ops(results, run_id=xla_run["run_id"])
    assert set(rows["source"]) == {"hlo"} and set(rows["tool"]) == {"xplane events"}
    assert (rows["traced_steps"] == 2).all() and rows["module"].str.startswith("SyncTensorsGraph").all()
    assert set(rows[rows["op"].str.startswith("dot.")]["category"]) == {"matmul"}


def test_ingest_rebuilds_the_rows_the_worker_wrote(results: Path, cpu_run: dict, tmp_path: Path) -> None:
    copy = copy_store(results, tmp_path / "results")
    before = store.load_ops(copy, run_id=cpu_run["run_id"])
    result = tpubench("ops --ingest", cpu_run["run_id"], "--results", str(copy))
    assert result.returncode == 0, result.stderr
    assert f"{len(before)} ops rows" in result.stdout
    after = store.load_ops(copy, run_id=cpu_run["run_id"])
    columns = [c for c in before.columns if c != "schema_version"]
    key = ["source", "op", "framework_op"]
    pd.testing.assert_frame_equal(
        before[columns].sort_values(key).reset_index(drop=True), after[columns].sort_values(key).reset_index(drop=True)
    )
    assert len(store.load_ops(copy)) == len(store.load_ops(results))  # other runs' rows kept


def test_ingest_into_a_compacted_store_rewrites_the_months_file(results: Path, cpu_run: dict, tmp_path: Path) -> None:
    """Once the invocation's ops file was compacted, ingest replaces the run's rows in its
    month's compacted file (a new one, committed by a manifest), never beside them."""
    copy = copy_store(results, tmp_path / "results")
    store_compact.compact(copy, older_than_s=0)
    before = store.load_ops(copy)
    assert all(store.is_compacted(path) for path in store.parquet_files(copy, "ops"))
    done = in_process("ops --ingest", cpu_run["run_id"], "--results", copy)
    assert done.returncode == 0, done.stderr  # before: "no runs file for invocation", the runs file compacted
    after = store.load_ops(copy)
    assert len(after) == len(before)  # the run's rows replaced, not added twice
    assert all(store.is_compacted(path) for path in store.parquet_files(copy, "ops"))
    assert len(store.load_ops(copy, run_id=cpu_run["run_id"])) == (before["run_id"] == cpu_run["run_id"]).sum()


def test_top_ops_account_for_all_time_and_categories_for_all_of_it(results: Path, cpu_run: dict) -> None:
    rows = store.load_ops(results, run_id=cpu_run["run_id"])
    top = analysis.top_ops(rows, n=5)
    assert list(top["rank"][:5]) == [1, 2, 3, 4, 5] and top["op"].iloc[-1].startswith("others")
    assert top["self_time_us"].sum() == pytest.approx(rows["self_time_us"].sum())
    assert top["self_time_us"].iloc[:5].is_monotonic_decreasing
    split = analysis.category_breakdown(rows)
    assert split["share"].sum() == pytest.approx(1.0) and split["self_time_us"].is_monotonic_decreasing
    same = analysis.diff_ops(rows, rows)
    assert set(same["change"]) == {"same"} and (same["delta_us_per_step"] == 0).all()


@pytest.mark.slow
def test_diff_by_op_between_eager_and_compiled(results: Path, cpu_run: dict, compile_run: dict) -> None:
    """Both runs are aten traces: compared op by op, Inductor's graph call is new."""
    eager = store.load_ops(results, run_id=cpu_run["run_id"])
    compiled = store.load_ops(results, run_id=compile_run["run_id"])
    assert compiled["op"].str.startswith("## Call CompiledFxGraph").any()
    compared = analysis.diff_ops(eager, compiled)
    assert {"new", "missing"} <= set(compared["change"])
    graph = compared[compared["op"].str.startswith("## Call CompiledFxGraph")].iloc[0]
    assert graph["change"] == "new" and graph["test_us_per_step"] > 0
    assert compared["delta_us_per_step"].abs().is_monotonic_decreasing


@pytest.mark.slow
def test_inductors_fused_kernels_land_in_the_categories_of_their_ops(
    results: Path, cpu_run: dict, compile_run: dict
) -> None:
    """A compiled run's fused kernels were one `## Call CompiledFxGraph` row in
    'other', so against eager, elementwise read 99% faster and normalization missing. A
    profiled cpu-compile run names each kernel; they land where their ops do."""
    eager = store.load_ops(results, run_id=cpu_run["run_id"])
    compiled = store.load_ops(results, run_id=compile_run["run_id"])
    kernels = compiled[compiled["op"].str.contains("cpp_fused_")]
    assert not kernels.empty and "normalization" in set(kernels["category"]), sorted(compiled["op"])
    graph = compiled[compiled["op"].str.startswith(analysis.GRAPH_CALL)]
    assert graph["self_time_us"].sum() < kernels["self_time_us"].sum()  # the wrapper, not the kernels
    compared = analysis.diff_ops(eager, compiled, by="category").set_index("category")
    assert compared.loc["normalization", "change"] != "missing" and compared.loc["normalization", "test_pct"] > 0
    assert analysis.unsplit_graphs(compiled) is None
    older = compiled[~compiled["op"].str.contains("cpp_fused_")]  # a trace taken before kernels were named
    assert "does not split" in (analysis.unsplit_graphs(older) or "")
    shown = in_process(
        "ops --diff-by category --results", str(results), "--diff", cpu_run["run_id"], compile_run["run_id"]
    )
    assert shown.returncode == 0 and "does not split" not in shown.stdout, shown.stdout


def test_ops_states_the_profilers_overhead_beside_the_table(results: Path, cpu_run: dict) -> None:
    """A traced step of 598 ms against a median of 265 ms was left unexplained."""
    shown = in_process("ops", cpu_run["run_id"], "--results", str(results))
    assert shown.returncode == 0, shown.stderr
    traced = analysis.traced_step_ms(store.load_ops(results, run_id=cpu_run["run_id"]))
    said = " ".join(shown.stdout.split())  # rich wraps long lines
    assert f"a traced step took {traced:,.2f} ms against the run's untraced median of" in said
    assert f"{cpu_run['median_step_ms']:,.2f} ms" in said


def test_diff_across_sources_is_by_category(results: Path, cpu_run: dict, xla_run: dict) -> None:
    result = tpubench("ops --json --diff", cpu_run["run_id"], xla_run["run_id"], "--results", str(results))
    assert result.returncode == 0, result.stderr
    compared = pd.DataFrame(json.loads(result.stdout))
    assert "category" in compared and set(compared["category"]) <= set(CATEGORIES)
    matmul = compared.set_index("category").loc["matmul"]
    assert matmul["base_us_per_step"] > 0 and matmul["test_us_per_step"] > 0
    table = in_process("ops --diff", cpu_run["run_id"], xla_run["run_id"], "--results", str(results))
    assert table.returncode == 0 and "by category" in table.stdout and "matmul" in table.stdout
    by_op = in_process("ops --diff-by op --diff", cpu_run["run_id"], xla_run["run_id"], "--results", str(results))
    assert "different sources (aten vs hlo)" in one_error_line(by_op)


# --- the commands -------------------------------------------------------------------------


def test_ops_shows_the_top_ops_as_a_table_json_and_csv(results: Path, cpu_run: dict) -> None:
    run_id = cpu_run["run_id"]
    table = tpubench("ops --top 5", run_id, "--results", str(results), env={"COLUMNS": "200"})
    assert table.returncode == 0, table.stderr
    assert "aten::mm" in table.stdout and "others" in table.stdout and "by category" in table.stdout
    records = json.loads(in_process("ops --json --top 5", run_id[:8], "--results", str(results)).stdout)
    assert [r["rank"] for r in records] == [1, 2, 3, 4, 5, None]
    as_csv = in_process("ops --csv --category matmul --by total", run_id, "--results", str(results))
    frame = pd.read_csv(io.StringIO(as_csv.stdout))
    assert set(frame["category"]) == {"matmul"} and frame["total_time_us"].is_monotonic_decreasing
    listing = in_process("ops --json --results", str(results))
    assert run_id in {r["run_id"] for r in json.loads(listing.stdout)}


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("ops 0123456789abcdef", "unknown run '0123456789abcdef'"),
        ("ops --top 0 x", "--top expects a positive number"),
        ("ops --by calls x", "unknown --by 'calls'; valid: self, total"),
        ("ops --category gemm x", "unknown --category 'gemm'; valid: matmul"),
        ("ops --source cuda x", "unknown --source 'cuda'; valid: hlo, aten, kernel"),
        ("ops --json --csv x", "--json and --csv exclude each other"),
        ("ops x --ingest y", "give one of RUN_ID"),
        ("trace 0123456789abcdef", "unknown run"),
        ("trace x --port 70000", "--port expects 1-65535"),
    ],
)
def test_bad_input_is_one_line(results: Path, cpu_run: dict, line: str, message: str) -> None:
    error = one_error_line(in_process(line, "--results", str(results)))
    assert message in error
    if "unknown run" in message:
        assert "`tpubench ops` lists the profiled runs" in error


def test_a_missing_results_directory_is_one_line(tmp_path: Path) -> None:
    assert "does not exist" in one_error_line(in_process("ops x --results", str(tmp_path / "none")))


def test_a_run_without_a_trace_says_how_to_capture_one(results_dir: Path) -> None:
    """A backend this host lacks gives a row (unavailable) with no trace."""
    [row] = SuiteRunner(results_dir).run(plan(["gpt2"], backends=["cuda"], modes=["infer"], profile_steps=2))
    for line in ("ops", "trace", "ops --ingest"):
        error = one_error_line(in_process(line, row["run_id"], "--results", str(results_dir)))
        assert "has no trace; capture one with `tpubench run --workload gpt2 --size tiny --backend cuda" in error


def test_a_failed_ingest_keeps_the_run_and_says_how_to_retry(results: Path, cpu_run: dict, tmp_path: Path) -> None:
    truncated = tmp_path / "trace.json"
    data = cpu_run["trace_file"].read_bytes()
    truncated.write_bytes(data[: len(data) // 2])
    columns = ingest_trace(str(truncated), 2, 1, 10.0)  # what the worker adds to the run's row
    assert columns["profile_steps"] == 2 and "ops" not in columns
    assert columns["ops_error"].startswith("TraceError: corrupt or truncated Chrome trace")
    copy = tmp_path / "results"
    store.InvocationWriter(copy, "inv", datetime.now(UTC)).add(
        {"run_id": "r1", "invocation_id": "inv", "status": "ok", "trace_path": str(truncated), **columns}
    )
    shutil.copy(truncated, copy / "trace.json")
    set_trace_path(copy, "r1", "trace.json")
    error = one_error_line(in_process("ops r1 --results", str(copy)))
    assert "could not be read (TraceError: corrupt or truncated" in error and "tpubench ops --ingest r1" in error


def test_a_corrupt_trace_is_one_error_and_the_store_is_untouched(results: Path, cpu_run: dict, tmp_path: Path) -> None:
    copy = copy_store(results, tmp_path / "results")
    trace = copy / "traces" / cpu_run["run_id"] / "trace.json"
    trace.write_bytes(trace.read_bytes()[:100_000])
    files = {path: path.read_bytes() for path in copy.rglob("*.parquet")}
    error = one_error_line(in_process("ops --ingest", cpu_run["run_id"], "--results", str(copy)))
    assert "corrupt or truncated Chrome trace" in error and "the store is unchanged" in error
    assert {path: path.read_bytes() for path in copy.rglob("*.parquet")} == files


def test_truncated_or_garbage_xplanes_are_trace_errors(xla_run: dict, tmp_path: Path) -> None:
    data = xplane_of(xla_run).read_bytes()
    damaged = tmp_path / "damaged.xplane.pb"
    for cut in (5, len(data) // 3, len(data) // 2, len(data) - 7):
        damaged.write_bytes(data[:cut])
        with pytest.raises(TraceError, match=r"truncated|corrupt"):
            read_trace(damaged)
    noise = random.Random(11)
    for _ in range(20):
        damaged.write_bytes(bytes(noise.randrange(256) for _ in range(4096)))
        with pytest.raises(TraceError):
            read_trace(damaged)


@pytest.mark.parametrize("recorded", ["../../etc/passwd", "/etc/passwd", "traces/../../outside.json"])
def test_a_trace_path_outside_the_results_is_refused(
    results: Path, cpu_run: dict, tmp_path: Path, recorded: str
) -> None:
    copy = copy_store(results, tmp_path / "results")
    set_trace_path(copy, cpu_run["run_id"], recorded)
    for line in ("ops --ingest", "trace"):
        error = one_error_line(in_process(line, cpu_run["run_id"], "--results", str(copy)))
        assert "is outside the results directory" in error and "refused" in error


def test_a_symlink_out_of_the_results_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "results"
    (root / "traces").mkdir(parents=True)
    (root / "traces" / "link").symlink_to("/etc")
    with pytest.raises(store.StoreError, match="outside the results directory"):
        store.inside_results(root, "traces/link/passwd")
    assert store.inside_results(root, "traces/run/trace.json") == (root / "traces/run/trace.json").resolve()


def test_trace_prints_the_path_and_the_viewer(results: Path, cpu_run: dict) -> None:
    result = in_process("trace", cpu_run["run_id"], "--results", str(results))
    assert result.returncode == 0, result.stderr
    assert f"trace: {cpu_run['trace_file'].resolve()}" in result.stdout and "ui.perfetto.dev" in result.stdout


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def serving(results: Path, run_id: str, port: int) -> subprocess.Popen:
    viewer = subprocess.Popen(
        command("trace --open --port", str(port), "--results", str(results), run_id),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
    )

    def listening() -> bool:
        assert viewer.poll() is None, viewer.stdout.read()
        with socket.socket() as client:
            return client.connect_ex(("127.0.0.1", port)) == 0

    wait_for(listening, f"the viewer on port {port}")
    listeners = [c for c in psutil.Process(viewer.pid).net_connections("inet") if c.status == psutil.CONN_LISTEN]
    assert listeners and {c.laddr.ip for c in listeners} == {"127.0.0.1"}
    return viewer


def test_trace_open_serves_a_chrome_trace_to_perfetto_on_loopback(results: Path, cpu_run: dict) -> None:
    port = free_port()
    viewer = serving(results, cpu_run["run_id"], port)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/trace.json", timeout=30) as response:
            assert response.headers["Access-Control-Allow-Origin"] == "https://ui.perfetto.dev"
            assert response.read() == cpu_run["trace_file"].read_bytes()
    finally:
        viewer.terminate()
        output = viewer.communicate(timeout=30)[0]
    assert f"https://ui.perfetto.dev/#!/?url=http://127.0.0.1:{port}/trace.json" in output
    # Perfetto fetches only from 127.0.0.1:9001: a link on another port will not load, and says so
    assert f"the link below will not load with --port {port}" in output and "Open trace file" in output


def test_trace_open_serves_xprof_on_loopback(results: Path, xla_run: dict) -> None:
    port = free_port()
    viewer = serving(results, xla_run["run_id"], port)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/data/plugin/profile/runs", timeout=60) as response:
            body = response.read()
            if response.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
    finally:
        viewer.terminate()
        viewer.communicate(timeout=30)
    assert xplane_of(xla_run).parent.name in json.loads(body)
