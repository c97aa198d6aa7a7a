"""The roofline per op: FLOPs and bytes from real traces, the ceilings, the bound, two runs
matched op by op, ``tpubench roofline`` and the Ops page's chart.

Figures come from traces recorded here: small torch.profiler sessions of known ops, and one
profiled gpt2 tiny train run per backend (cpu; xla on PJRT CPU where the torch_xla
environment is), shared by the module. Expected values are computed from the shapes, never
copied from an output. The tests that need the xla run (a profiled torch_xla run is minutes
on CI's 2 cores) run nightly.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from helpers import another_sweep, in_process, one_error_line, write_sweeps
from test_ops import copy_store, profiled, set_trace_path
from torch.utils.flop_counter import FlopCounterMode, flop_registry

from tpubench import store
from tpubench.analysis import ceilings as ceilings_analysis
from tpubench.analysis import roofline
from tpubench.traces import hlo, ingest

M, K, N = 64, 96, 48


def profile_chrome(tmp_path: Path, work, record_shapes: bool = True) -> Path:
    """A torch.profiler Chrome trace of ``work`` (called twice), as tpubench's profiler writes it."""
    work()
    activities = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=activities, record_shapes=record_shapes) as profiler:
        for _ in range(2):
            work()
    path = tmp_path / "trace.json"
    profiler.export_chrome_trace(str(path))
    return path


def by_op(rows: list[dict]) -> dict[str, dict]:
    return {row["op"]: row for row in rows if row["source"] == "aten"}


@pytest.fixture(scope="module")
def known_ops(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """One trace of an mm, a same-shape add, a layer norm and causal attention of known shapes."""
    a, b = torch.randn(M, K), torch.randn(K, N)
    x, y = torch.randn(8, 256), torch.randn(8, 256)
    weight, bias = torch.randn(256), torch.randn(256)
    q = k = v = torch.randn(2, 4, 16, 32)

    def work() -> None:
        torch.mm(a, b)
        torch.add(x, y)
        F.layer_norm(x, (256,), weight, bias)
        F.scaled_dot_product_attention(q, k, v, is_causal=True)

    return by_op(ingest(profile_chrome(tmp_path_factory.mktemp("known"), work), 2))


def test_an_mm_of_known_shape_counts_2mnk_flops_and_its_operands_once(known_ops: dict[str, dict]) -> None:
    mm = known_ops["aten::mm"]
    assert mm["calls"] == 2
    assert mm["flops"] == 2 * (2 * M * N * K)
    assert mm["bytes_accessed"] == 2 * (M * K + K * N + M * N) * 4  # float32
    assert (mm["flops_source"], mm["bytes_source"]) == ("flop_counter", "shapes")
    [shape] = json.loads(mm["shapes"])
    assert shape["dims"] == [[M, K], [K, N]] and shape["counted_calls"] == 2


def test_an_add_on_float32_has_intensity_one_twelfth(known_ops: dict[str, dict]) -> None:
    add = known_ops["aten::add"]
    assert add["flops_source"] == "elementwise"
    assert add["flops"] / add["bytes_accessed"] == pytest.approx(1 / 12)  # 1 FLOP per 4 + 4 bytes read, 4 written


def test_a_layer_norm_gets_the_flop_counters_figure_which_is_none(known_ops: dict[str, dict]) -> None:
    """FlopCounterMode has no formula for a layer norm: it counts nothing, and so does the row
    (null, never 0), while its bytes still come from the shapes."""
    with FlopCounterMode(display=False) as counter:
        F.layer_norm(torch.randn(8, 256), (256,), torch.randn(256), torch.randn(256))
    assert counter.get_total_flops() == 0 and torch.ops.aten.native_layer_norm not in flop_registry
    norm = known_ops["aten::native_layer_norm"]
    assert norm["flops"] is None and norm["flops_source"] is None
    # input, weight, bias; output, mean and rstd (8 rows of 1 each)
    assert norm["bytes_accessed"] == 2 * (8 * 256 + 256 + 256 + 8 * 256 + 8 + 8) * 4
    assert known_ops["aten::layer_norm"]["flops_source"] == "nested"  # its work is in native_layer_norm's row


def test_cpu_flash_attention_counts_as_the_counter_counts_attention(known_ops: dict[str, dict]) -> None:
    """The CPU kernel is not in the counter's registry; it gets the formula of the op it
    implements: QKᵀ and AV over the whole score matrix, causal or not (``full``)."""
    attention = known_ops["aten::_scaled_dot_product_flash_attention_for_cpu"]
    batch, heads, seq, dim = 2, 4, 16, 32
    assert attention["flops"] == 2 * (2 * 2 * batch * heads * seq * seq * dim)
    assert attention["flops_source"] == "flop_counter"


def test_a_trace_without_shapes_gets_no_figures(tmp_path: Path) -> None:
    a, b = torch.randn(M, K), torch.randn(K, N)
    rows = by_op(ingest(profile_chrome(tmp_path, lambda: torch.mm(a, b), record_shapes=False), 2))
    assert rows["aten::mm"]["flops"] is None and rows["aten::mm"]["shapes"] is None


def hlo_module(name: str) -> bytes:
    """An HloProto as an xplane's metadata plane carries it: a dot, an add, a fusion of a
    multiply and a reduce, a fusion of a dot and an add, and a transpose (f32, 4x8 by 8x3)."""
    messages = hlo._messages()
    f32 = 11

    def shape(*dims: int):
        return messages["ShapeProto"](element_type=f32, dimensions=list(dims))

    def instruction(id: int, opcode: str, dims: tuple[int, ...], operands=(), called=(), **extra):
        return messages["HloInstructionProto"](
            name=f"{opcode}.{id}", opcode=opcode, shape=shape(*dims), id=id, operand_ids=list(operands),
            called_computation_ids=list(called), **extra,
        )  # fmt: skip

    contract = messages["DotDimensionNumbers"](lhs_contracting_dimensions=[1], rhs_contracting_dimensions=[0])
    lhs, rhs = instruction(1, "parameter", (4, 8)), instruction(2, "parameter", (8, 3))
    scaled = messages["HloComputationProto"](
        name="scaled", id=10,
        instructions=[instruction(11, "parameter", (4, 8)), instruction(12, "multiply", (4, 8), (11, 11)),
                      instruction(13, "reduce", (4,), (12,))],
    )  # fmt: skip
    biased = messages["HloComputationProto"](
        name="biased", id=20,
        instructions=[instruction(21, "parameter", (4, 8)), instruction(22, "parameter", (8, 3)),
                      instruction(23, "dot", (4, 3), (21, 22), dot_dimension_numbers=contract),
                      instruction(24, "add", (4, 3), (23, 23))],
    )  # fmt: skip
    entry = messages["HloComputationProto"](
        name="main", id=1,
        instructions=[lhs, rhs, instruction(3, "dot", (4, 3), (1, 2), dot_dimension_numbers=contract),
                      instruction(4, "add", (4, 3), (3, 3)), instruction(5, "fusion", (4,), (1,), (10,)),
                      instruction(6, "fusion", (4, 3), (1, 2), (20,)), instruction(7, "transpose", (8, 4), (1,))],
    )  # fmt: skip
    module = messages["HloModuleProto"](name=name, computations=[scaled, biased, entry], entry_computation_id=1)
    return messages["HloProto"](hlo_module=module).SerializeToString()


def test_an_xla_runs_dots_and_elementwise_flops_come_from_sources_of_their_own() -> None:
    """docs/roofline.md lists XLA's elementwise FLOPs apart from its dots, which add up to the
    run's flops_per_step; one source ("hlo shapes") for both summed them instead."""
    module = hlo.parse_modules({"SyncTensorsGraph.1(0)": hlo_module("m")})["SyncTensorsGraph.1"]
    found = {name: module.count(name) for name in ("dot.3", "add.4", "fusion.5", "fusion.6", "transpose.7")}
    assert {name: (c.flops, c.flops_source) for name, c in found.items()} == {
        "dot.3": (2 * 4 * 3 * 8, "hlo dot"),
        "add.4": (4 * 3, "hlo elementwise"),
        "fusion.5": (4 * 8 + 4 * 8, "hlo elementwise"),  # a multiply per element, a reduce per input element
        "fusion.6": (2 * 4 * 3 * 8 + 4 * 3, "hlo dot+elementwise"),
        "transpose.7": (0, "hlo data movement"),
    }


# --- the ceilings -----------------------------------------------------------------------


def measured_frame(device: str, flops: float, bandwidth: float, dtype: str = "float32") -> pd.DataFrame:
    return pd.DataFrame(
        [
            {"kind": "matmul", "device": device, "dtype": dtype, "flops_per_s": flops, "bytes_per_s": None},
            {"kind": "matmul", "device": device, "dtype": dtype, "flops_per_s": flops / 2, "bytes_per_s": None},
            {"kind": "memory", "device": device, "dtype": None, "flops_per_s": None, "bytes_per_s": bandwidth},
        ]
    )


def test_ceilings_come_from_measurements_when_given_else_the_data_sheet_never_mixed() -> None:
    h100 = "NVIDIA H100 80GB HBM3"
    sheet = roofline.ceilings_for(h100, "cuda", "bfloat16")
    assert (sheet.source, sheet.peak_flops, sheet.bandwidth_bytes_per_s) == ("datasheet", 989.4e12, 3.35e12)
    measured = roofline.ceilings_for(h100, "cuda", "bfloat16", measured_frame(h100, 700e12, 3e12, "bfloat16"))
    assert (measured.source, measured.peak_flops, measured.bandwidth_bytes_per_s) == ("measured", 700e12, 3e12)
    assert measured.ridge == pytest.approx(700e12 / 3e12)
    only_matmul = measured_frame(h100, 700e12, 3e12, "bfloat16").iloc[:2]
    assert roofline.ceilings_for(h100, "cuda", "bfloat16", only_matmul).source == "datasheet"
    other_dtype = roofline.ceilings_for(h100, "cuda", "float32", measured_frame(h100, 700e12, 3e12, "bfloat16"))
    assert other_dtype.source == "datasheet" and other_dtype.peak_flops == 67e12
    cpu = roofline.ceilings_for("AMD EPYC", "cpu", "float32")
    assert cpu.source == "none" and cpu.ridge is None
    with pytest.raises(ValueError, match="lacks"):
        roofline.ceilings_for("AMD EPYC", "cpu", "float32", pd.DataFrame({"kind": ["matmul"]}))


# --- real profiled runs -----------------------------------------------------------------


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("roofline") / "results"


@pytest.fixture(scope="module")
def cpu_run(results: Path) -> dict:
    return profiled(results, "cpu")


@pytest.fixture(scope="module")
def xla_run(results: Path) -> dict:
    python = os.environ.get("TPUBENCH_XLA_PYTHON")
    if not python or not os.access(python, os.X_OK):
        pytest.skip("TPUBENCH_XLA_PYTHON does not name a torch_xla interpreter (see .ci/run)")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PJRT_DEVICE", "CPU")
        return profiled(results, "xla", pythons={"xla": python})


def table_of(results: Path, run: dict, ceilings: roofline.RooflineCeilings | None = None, by: str = "shape"):
    ops = store.load_ops(results, run_id=run["run_id"])
    found = ceilings or roofline.ceilings_for(run["device"], "cpu", run["dtype"])
    return roofline.roofline(ops, found, by=by)


def test_a_cpu_runs_matmul_and_attention_flops_add_up_to_its_flops_per_step(results: Path, cpu_run: dict) -> None:
    """The flop counter's figures per op against the run's analytic count (matmuls and
    attention, ``attention_flops`` full): they agree but for flash attention's backward,
    which the counter counts as 2.5 forwards (it recomputes the scores) where the analytic
    train count takes 2; the elementwise FLOPs are extra, and listed apart."""
    counted = roofline.counted_flops(table_of(results, cpu_run)).set_index("flops_source")
    assert counted.loc["flop_counter", "flops_per_step"] == pytest.approx(cpu_run["flops_per_step"], rel=0.05)
    assert counted.loc["elementwise", "flops_per_step"] > 0
    assert counted.loc[roofline.NO_FORMULA, "ops"] > 0  # softmax, gelu...: no formula, no figure
    assert pd.isna(counted.loc[roofline.NO_FORMULA, "flops_per_step"])


@pytest.mark.nightly
def test_an_xla_runs_dots_add_up_to_its_flops_per_step(results: Path, xla_run: dict) -> None:
    table = table_of(results, xla_run)
    assert set(table["source"]) == {"hlo"}
    dots = table[table["key"].str.startswith("matmul ")]
    assert dots["flops_per_step"].sum() == pytest.approx(xla_run["flops_per_step"], rel=0.05)
    assert set(dots["flops_source"]) == {"hlo dot"}
    elementwise = roofline.counted_flops(table).set_index("flops_source").loc["hlo elementwise", "flops_per_step"]
    assert elementwise > 0  # listed apart from the dots
    ops = store.load_ops(results, run_id=xla_run["run_id"])
    shares = roofline.step_shares(ops, roofline.ceilings_for(xla_run["device"], "cpu", xla_run["dtype"]))
    assert shares["time_share"].sum() == pytest.approx(1.0)  # the ops' 56% and the step's rest, outside any op
    assert shares.set_index("line").loc[roofline.OUTSIDE, "time_share"] > 0
    assert table["flops_source"].isna().any()  # exponentials, tanh: uncounted, not zero


def test_matmuls_are_labelled_by_their_intensity_against_the_ceilings_used(results: Path, cpu_run: dict) -> None:
    """Ceilings whose ridge lies among the run's matmul intensities, and slow enough that no
    matmul fits under the overhead floor: each label follows from the numbers."""
    base = table_of(results, cpu_run, roofline.RooflineCeilings(None, None, "none"))
    matmuls = base[base["key"].str.startswith("matmul ") & base["intensity"].notna()]
    ridge = float(matmuls["intensity"].median())
    bandwidth = 1e9  # bytes/s: a matmul's megabytes take milliseconds
    ceilings = roofline.ceilings_for(
        cpu_run["device"], "cpu", "float32", measured_frame(cpu_run["device"], ridge * bandwidth, bandwidth)
    )
    assert ceilings.source == "measured" and ceilings.ridge == pytest.approx(ridge)
    table = table_of(results, cpu_run, ceilings)
    matmuls = table[table["key"].str.startswith("matmul ") & table["intensity"].notna()]
    for row in matmuls.to_dict("records"):
        ideal = max(row["flops_per_step"] / ceilings.peak_flops, row["bytes_per_step"] / bandwidth) * 1e6
        assert row["ideal_us_per_step"] == pytest.approx(ideal)
        expected = "compute" if row["intensity"] >= ridge else "memory"
        calls = row["calls_per_step"]
        if min(row["time_us_per_step"], ideal) / calls < roofline.OVERHEAD_US:
            expected = "overhead"
        assert row["bound"] == expected, row
        ceiling = min(ceilings.peak_flops, row["intensity"] * bandwidth)
        assert row["ceiling_fraction"] == pytest.approx(
            row["flops_per_step"] / (row["time_us_per_step"] * 1e-6) / ceiling
        )
    assert {"compute", "memory"} <= set(matmuls["bound"])
    shares = roofline.step_shares(store.load_ops(results, run_id=cpu_run["run_id"]), ceilings).set_index("line")
    assert shares["time_share"].sum() == pytest.approx(1.0)
    assert shares.loc[["compute", "memory"], "ops"].tolist() == [
        int((table["bound"] == bound).sum()) for bound in ("compute", "memory")
    ]  # the step's lines are the table's points, per op and shape
    assert roofline.NO_CEILING not in shares.index  # every op with FLOPs and bytes has a bound here
    fix = roofline.fix_first(table)
    assert fix["saving_us_per_step"].is_monotonic_decreasing and (fix["saving_us_per_step"] >= 0).all()


@pytest.mark.nightly
def test_two_runs_pair_a_cpu_runs_matmuls_with_an_xla_runs(results: Path, cpu_run: dict, xla_run: dict) -> None:
    paired = roofline.pair(table_of(results, cpu_run), table_of(results, xla_run))
    matched = paired[paired["a_op"].notna() & paired["b_op"].notna()]
    assert len(matched) >= 5 and matched["key"].str.startswith("matmul ").all()
    assert set(",".join(matched["a_op"]).replace(" ", "").split(",")) <= {"aten::mm", "aten::addmm", "aten::bmm"}
    assert matched["b_op"].str.contains("dot").all()
    # the same products: the same FLOPs per step on both sides
    assert matched["a_flops_per_step"].tolist() == pytest.approx(matched["b_flops_per_step"].tolist())


# --- the command ------------------------------------------------------------------------


def test_roofline_command_gives_the_table_and_summary_as_json(results: Path, cpu_run: dict, tmp_path: Path) -> None:
    ceilings = tmp_path / "ceilings.csv"
    measured_frame(cpu_run["device"], 5e10, 1e10).to_csv(ceilings, index=False)
    done = in_process(f"roofline {cpu_run['run_id']} --json --ceilings {ceilings} --results", str(results))
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["ceilings"]["source"] == "measured" and found["ceilings"]["ridge"] == pytest.approx(5.0)
    assert {row["bound"] for row in found["by_bound"]} <= {*roofline.SHARE_PARTS}
    assert sum(row["time_share"] for row in found["by_bound"]) == pytest.approx(1.0)
    assert found["fix_first"] and found["ops"][0]["time_us_per_step"] >= found["ops"][-1]["time_us_per_step"]
    shown = in_process(f"roofline {cpu_run['run_id']} --results", str(results))
    assert shown.returncode == 0 and "aten::mm" in shown.stdout
    assert "aten ops against no ceilings for this device" in shown.stdout


def test_roofline_reads_the_stores_measured_ceilings(results: Path, cpu_run: dict, tmp_path: Path) -> None:
    """Without --ceilings, the ceilings `tpubench ceilings` stored for the run's device are the
    roof (this CPU has no data sheet entry, so without them there is none): the best matmul
    point of the run's dtype and the best STREAM point past the caches, as `ceilings --show`
    reads them, from the sweeps it names. A memory sweep limited to 1 MiB (--max-size) measures
    a cache: it sets no roof, and the run has none; an older sweep with arrays past the caches
    (its rows as a sweep without --max-size writes them) sets it, and the output names it."""
    measured = copy_store(results, tmp_path / "measured")
    for line in ("--kind matmul --max-size 128", "--kind memory --max-size 1048576"):
        done = in_process(f"ceilings --backend cpu {line} --dtype float32 --results", measured, starts_runs=True)
        assert done.returncode == 0, done.stderr
    done = in_process(f"roofline {cpu_run['run_id']} --json --results", str(measured))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["ceilings"]["source"] == "none"  # a 1 MiB copy is no memory ceiling
    shown = in_process(f"roofline {cpu_run['run_id']} --results", str(measured))
    assert "note: no measured memory roof: memory from cpu sweep" in " ".join(shown.stdout.split())

    points = store.load_ceilings(measured)
    limited = points[points["kind"] == "memory"]
    write_sweeps(measured, another_sweep(limited, "full-sweep", -60, past_cache=4.0))
    points = store.load_ceilings(measured)
    best = ceilings_analysis.roofline_frame(points).groupby("kind")[["flops_per_s", "bytes_per_s"]].max()
    reach = ceilings_analysis.cache_reach(limited["llc_bytes"].iloc[0])
    past = points[(points["run_id"] == "full-sweep") & (points["size_bytes"] == reach)]
    assert best.loc["memory", "bytes_per_s"] == pytest.approx(past["median_rate"].max())
    done = in_process(f"roofline {cpu_run['run_id']} --json --results", str(measured))
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)["ceilings"]
    assert found["source"] == "measured" and "memory from cpu sweep full-sweep" in found["sweeps"]
    assert found["ridge"] == pytest.approx(best.loc["matmul", "flops_per_s"] / best.loc["memory", "bytes_per_s"])
    shown = in_process(f"roofline {cpu_run['run_id']} --results", str(measured))
    assert "memory from cpu sweep full-sweep" in " ".join(shown.stdout.split())


def as_h100_run(results: Path, run_id: str, precision: str) -> None:
    """The run's row rewritten as a bf16 cuda run on an H100 in ``precision`` (no GPU here: only
    the row's backend, device, dtype and precision change; its ops stay the CPU trace's)."""
    for path in (results / "runs").glob("date=*/*.parquet"):
        frame = pd.read_parquet(path)
        mine = frame["run_id"] == run_id
        changed = ["backend", "device", "dtype", "precision"]
        frame.loc[mine, changed] = ["cuda", "NVIDIA H100 80GB HBM3", "bfloat16", precision]
        frame.to_parquet(path, index=False)


@pytest.mark.parametrize(("precision", "peak"), [("fp8", "fp8"), ("int8-wo", "bfloat16"), ("bf16", "bfloat16")])
def test_a_converted_runs_roofline_takes_the_peak_its_matmuls_ran_at(
    results: Path, cpu_run: dict, tmp_path: Path, precision: str, peak: str
) -> None:
    """An fp8 run's matmuls ran on fp8 tensor cores: its roof is the H100's fp8 peak, twice its
    bf16 one, as its MFU's is; int8 weight-only multiplies in bf16 and keeps the bf16 roof."""
    converted = copy_store(results, tmp_path / precision)
    as_h100_run(converted, cpu_run["run_id"], precision)
    done = in_process(f"roofline {cpu_run['run_id']} --json --results", str(converted))
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)["ceilings"]
    sheet = roofline.ceilings_for("NVIDIA H100 80GB HBM3", "cuda", peak)
    assert found["source"] == "datasheet" and found["ridge"] == pytest.approx(sheet.ridge)


@pytest.mark.nightly
def test_roofline_command_pairs_two_runs(results: Path, cpu_run: dict, xla_run: dict) -> None:
    done = in_process(f"roofline {cpu_run['run_id']} {xla_run['run_id']} --json --results", str(results))
    assert done.returncode == 0, done.stderr
    keys = [row["key"] for row in json.loads(done.stdout) if row["a_op"] and row["b_op"]]
    assert keys and all(key.startswith("matmul ") for key in keys)


def test_the_step_shares_add_up_to_the_step_and_say_no_ceiling_for_an_op_with_flops(
    results: Path, cpu_run: dict
) -> None:
    """The lines of the traced step (ops with a bound, with FLOPs but no ceiling, without a
    formula, and the time outside any op) add up to 100% of it; on a CPU without ceilings
    an aten::mm, which has FLOPs, is "no ceiling", never "uncounted". Before, the CLI's
    lines summed to 99% with no line for the rest and called the matmuls uncounted."""
    done = in_process(f"roofline {cpu_run['run_id']} --json --results", str(results))
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    lines = {row["bound"]: row for row in found["by_bound"]}
    assert sum(row["time_share"] for row in lines.values()) == pytest.approx(1.0, abs=1e-9)
    ops = store.load_ops(results, run_id=cpu_run["run_id"])
    first = ops.iloc[0]
    step_us = first["step_time_us"] / first["traced_steps"]
    outside = step_us - ops["self_time_us"].sum() / first["traced_steps"]  # one source here: aten
    assert set(ops["source"]) == {"aten"} and outside > 0
    assert lines[roofline.OUTSIDE]["time_us_per_step"] == pytest.approx(outside)
    assert roofline.OUTSIDE in lines and roofline.NO_FORMULA in lines and "uncounted" not in lines
    assert {"compute", "memory"}.isdisjoint(lines)  # no ceilings for this CPU
    mm = next(row for row in found["ops"] if row["op"] == "aten::mm")
    assert mm["flops_per_step"] > 0 and mm["bound"] is None
    shown = in_process(f"roofline {cpu_run['run_id']} --results", str(results)).stdout
    [mm_line] = [line for line in shown.splitlines() if "aten::mm " in line]
    assert "no ceiling" in mm_line and "uncounted" not in shown
    assert f"outside any op {100 * lines[roofline.OUTSIDE]['time_share']:.1f}%" in shown


def test_ops_that_overlap_in_time_give_a_negative_line_and_the_step_still_adds_up() -> None:
    """Two threads' ops that ran at once add up to more than the step: the last line says so,
    negative, rather than a share above 100% with nothing to read it by."""
    common = {"source": "aten", "traced_steps": 1, "step_time_us": 100.0, "calls": 1, "shapes": None}
    ops = pd.DataFrame(
        [
            {"op": "aten::mm", "category": "matmul", "self_time_us": 70.0, "flops": 2e9, "bytes_accessed": 6e6,
             "flops_source": "flop_counter", "bytes_source": "shapes", **common},
            {"op": "aten::softmax", "category": "elementwise", "self_time_us": 50.0, "flops": None,
             "bytes_accessed": 1e6, "flops_source": None, "bytes_source": "shapes", **common},
        ]
    )  # fmt: skip
    shares = roofline.step_shares(ops, roofline.RooflineCeilings(None, None, "none")).set_index("line")
    assert shares["time_share"].to_dict() == pytest.approx(
        {roofline.NO_CEILING: 0.7, roofline.NO_FORMULA: 0.5, roofline.OVERLAP: -0.2}
    )
    assert shares.loc[roofline.OVERLAP, "part"] == roofline.OUTSIDE


def test_bad_input_is_one_line_that_says_how_to_record_a_trace(results: Path, cpu_run: dict, tmp_path: Path) -> None:
    # a run without a trace: the run as an unprofiled run stores it (no trace_path, no ops rows)
    untraced = copy_store(results, tmp_path / "untraced")
    set_trace_path(untraced, cpu_run["run_id"], None)
    shutil.rmtree(untraced / "ops")
    line = one_error_line(in_process(f"roofline {cpu_run['run_id']} --results", str(untraced)))
    assert "has no trace" in line and "--profile" in line
    # a trace without shapes: the run's own trace, its recorded shapes taken out, ingested again
    copy = copy_store(results, tmp_path / "copy")
    trace = copy / cpu_run["trace_path"]
    events = json.loads(trace.read_text())
    for event in events["traceEvents"]:
        for name in ("Input Dims", "Input type", "Input Strides", "Concrete Inputs"):
            (event.get("args") or {}).pop(name, None)
    trace.write_text(json.dumps(events))
    assert in_process(f"ops --ingest {cpu_run['run_id']} --results", str(copy)).returncode == 0
    line = one_error_line(in_process(f"roofline {cpu_run['run_id']} --results", str(copy)))
    assert "no recorded shapes" in line and "--profile" in line and "tpubench ops --ingest" in line
    for args, said in (
        ("a b c", "give one run, or two"),
        (f"{cpu_run['run_id']} --by kernel", "valid: op, shape"),
        ("nosuchrun", "unknown run"),
        (f"{cpu_run['run_id']} --ceilings {tmp_path / 'none.csv'}", "no such file"),
    ):
        assert said in one_error_line(in_process(f"roofline {args} --results", str(results)))


def test_a_ceilings_file_whose_rate_is_no_ceiling_is_one_error_line(
    results: Path, cpu_run: dict, tmp_path: Path
) -> None:
    """A negative, zero, infinite or non-numeric rate, or a kind the reader would ignore, is
    refused before anything is read against it (it gave a ridge of -41.7 FLOP/byte and
    fractions of -408518101525.8%, or a traceback), naming the row and what it needs."""
    for name, flops, bandwidth, said in (
        ("negative", "-5e10", "1.2e9", "row 1 (matmul) has flops_per_s -5e+10; a ceiling is a positive number"),
        ("text", "abc", "1.2e9", "row 1 (matmul) has flops_per_s 'abc'"),
        ("zero", "5e10", "0", "row 2 (memory) has bytes_per_s 0; a ceiling is a positive number of bytes/s"),
        ("infinite", "inf", "1.2e9", "row 1 (matmul) has flops_per_s inf"),
    ):
        path = tmp_path / f"{name}.csv"
        device = cpu_run["device"]
        path.write_text(
            "kind,device,dtype,flops_per_s,bytes_per_s\n"
            f"matmul,{device},float32,{flops},\nmemory,{device},,,{bandwidth}\n"
        )
        line = one_error_line(in_process(f"roofline {cpu_run['run_id']} --ceilings {path} --results", str(results)))
        assert said in line, line
    path = tmp_path / "kind.csv"
    path.write_text(f"kind,device,dtype,flops_per_s,bytes_per_s\nmatmull,{cpu_run['device']},float32,5e10,\n")
    line = one_error_line(in_process(f"roofline {cpu_run['run_id']} --ceilings {path} --results", str(results)))
    assert "row 1 has kind 'matmull'; valid: matmul, memory" in line, line


def test_a_gzipped_trace_counts_the_same(tmp_path: Path) -> None:
    a, b = torch.randn(M, K), torch.randn(K, N)
    plain = profile_chrome(tmp_path, lambda: torch.mm(a, b))
    packed = tmp_path / "trace.json.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    assert ingest(packed, 2) == ingest(plain, 2)


# --- the dashboard ----------------------------------------------------------------------


def ops_page(results: Path, run_id: str, monkeypatch: pytest.MonkeyPatch):
    """The dashboard's Ops page over ``results``, at ``run_id``, as a link opens it."""
    from streamlit.testing.v1 import AppTest

    from dashboard import RESULTS_ENV, catalog

    monkeypatch.setenv(RESULTS_ENV, str(results))
    app = AppTest.from_file(str(Path(__file__).parents[1] / "dashboard" / "app.py"), default_timeout=120)
    app.switch_page(catalog.BY_TITLE["Ops"].path)
    app.query_params.update({"run": run_id})
    app.run()
    assert not app.exception, app.exception
    return app


def roofline_figures(app) -> list[dict]:
    figures = [json.loads(chart.proto.spec) for chart in app.get("plotly_chart")]
    return [figure for figure in figures if figure["layout"]["title"]["text"].startswith("Roofline")]


def test_the_ops_page_draws_the_roofline_and_says_which_ceilings(
    results: Path, cpu_run: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = ops_page(results, cpu_run["run_id"], monkeypatch)
    said = "\n".join(str(element.value) for kind in ("caption", "warning") for element in app.get(kind))
    assert f"`{cpu_run['run_id']}`: no ceilings for this device" in said  # a CPU: no data sheet, none measured
    [chart] = roofline_figures(app)
    assert chart["layout"]["xaxis"]["type"] == "log" and chart["layout"]["yaxis"]["type"] == "log"
    sizes = [size for trace in chart["data"] for size in trace["marker"]["size"]]
    assert len(set(sizes)) > 1  # sized by time


def test_the_ops_page_shows_the_same_step_shares_as_the_command(
    results: Path, cpu_run: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One table of the step for the CLI and the page: the same lines, the same shares (the
    page split by shape and the CLI by op, and its "uncounted" was everything but the
    counted ops, 46% where the CLI said 39%)."""
    done = in_process(f"roofline {cpu_run['run_id']} --json --results", str(results))
    assert done.returncode == 0, done.stderr
    command = pd.DataFrame(json.loads(done.stdout)["by_bound"])
    app = ops_page(results, cpu_run["run_id"], monkeypatch)
    [page] = [frame.value for frame in app.dataframe if "line" in frame.value.columns]
    assert page["line"].tolist() == command["bound"].tolist()
    assert page["ops"].tolist() == command["ops"].tolist()
    assert page["% of step"].tolist() == pytest.approx(command["time_share"].tolist())
    assert page["% of step"].sum() == pytest.approx(1.0)
    said = "\n".join(str(element.value) for element in app.get("caption"))
    assert "uncounted" not in said


def test_a_filter_change_on_the_ops_page_makes_no_roofline_again(
    results: Path, cpu_run: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The picked run's roofline and step shares are kept by run: a sidebar filter that keeps
    the run (its backend) reruns the page without making them again."""
    import streamlit as st

    st.cache_data.clear()
    made = []
    real = roofline.roofline
    monkeypatch.setattr(roofline, "roofline", lambda *args, **kwargs: made.append(1) or real(*args, **kwargs))
    app = ops_page(results, cpu_run["run_id"], monkeypatch)
    first = len(made)
    app.sidebar.multiselect(key="backend").set_value([cpu_run["backend"]]).run()
    assert not app.exception, app.exception
    assert any("line" in frame.value.columns for frame in app.dataframe)  # the step shares still shown
    assert first > 0 and len(made) == first


@pytest.mark.nightly
def test_the_ops_page_puts_two_runs_on_one_roofline(
    results: Path, cpu_run: dict, xla_run: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = ops_page(results, xla_run["run_id"], monkeypatch)
    app.selectbox(key="base").set_value(cpu_run["run_id"]).run()
    assert not app.exception, app.exception
    pair = roofline_figures(app)[-1]
    assert {trace["marker"]["symbol"] for trace in pair["data"]} == {"circle", "diamond"}  # both runs
    paired = app.dataframe[-1].value
    assert paired["key"].str.startswith("matmul ").any() and paired["a_op"].notna().any()


def test_a_cuda_runs_roofline_takes_its_aten_ops_timed_by_their_kernels() -> None:
    """A CUDA eager run's kernel rows have no FLOPs (only Inductor's can) and its aten rows
    have them from their shapes: the roofline takes the aten rows, each at the kernel time it
    launched, not its host time (rows as a CUDA trace gives them; this host has no GPU)."""
    common = {"traced_steps": 1, "step_time_us": 1000.0, "category": "matmul", "calls": 1, "shapes": None}
    ops = pd.DataFrame(
        [
            {"source": "kernel", "op": "sm90_gemm", "self_time_us": 80.0, "device_time_us": 80.0, "flops": None,
             "bytes_accessed": None, "flops_source": None, "bytes_source": None, **common},
            {"source": "aten", "op": "aten::mm", "self_time_us": 15.0, "device_time_us": 80.0, "flops": 2e9,
             "bytes_accessed": 6e6, "flops_source": "flop_counter", "bytes_source": "shapes", **common},
        ]
    )  # fmt: skip
    assert roofline.roofline_source(ops) == "aten"
    [row] = roofline.roofline(ops, roofline.ceilings_for("NVIDIA H100 80GB HBM3", "cuda", "float32")).to_dict("records")
    assert row["time_us_per_step"] == 80.0 and row["achieved_flops_per_s"] == pytest.approx(2e9 / 80e-6)
    assert row["bound"] == "compute"  # 333 FLOP/byte against a ridge of 67e12 / 3.35e12 = 20
