"""Multi-device runs, the parent's side: planning ``--devices``/``--parallel``/``--tp``/
``--scaling``, the checks that refuse a layout before anything runs, the rows of runs that
cannot have their devices or their plan, device locks and pinning, the layout columns, labels,
``compare``'s pairing and ``--resume`` over rows written before multi-device runs.

No multi-device measurement runs here (the ranks and SPMD tests do that); a GPU and a TPU
host cannot exist here, so their pinning is checked on the environment the runner builds.
"""

from __future__ import annotations

import fcntl
import os
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from helpers import in_process
from helpers import tpubench as cli

import tpubench
from tpubench import devicelock, store
from tpubench.analysis import compare
from tpubench.analysis.shapes import shape_labels
from tpubench.backends.cuda import CudaBackend
from tpubench.backends.tpu import TpuBackend
from tpubench.cli.info import parallel_choices
from tpubench.parallel import Layout
from tpubench.report import notes, summary_table
from tpubench.runner import SuiteRunner, lock_name, plan
from tpubench.schema import RUNS
from tpubench.spec import RunSpec
from tpubench.worker import device_estimate, layout_columns, per_device_columns
from workloads import ParallelPlan
from workloads.base import RUNTIME_BYTES, Shape

FAULTS = {"TPUBENCH_WORKLOAD_MODULES": "fault_workloads", "PYTHONPATH": str(Path(__file__).parent)}


def planned(**options) -> list[tuple[str, int, str | None]]:
    """gpt2's planned runs on the cpu backend as (label suffix, global batch, scaling)."""
    specs = plan(["gpt2"], backends=["cpu"], batch_size=4, **options)
    return [(spec.label().split()[-1], spec.batch_size, spec.scaling) for spec in specs]


def test_weak_scaling_grows_the_global_batch_and_strong_keeps_it() -> None:
    assert planned(modes=["train"], devices=[1, 2, 4], parallel="dp") == [
        ("dp1", 4, "weak"),
        ("dp2", 8, "weak"),
        ("dp4", 16, "weak"),
    ]
    # serving modes and tensor parallelism keep the batch they were given (strong) by default
    assert planned(modes=["infer"], devices=[2, 4], parallel="fsdp") == [("fsdp2", 4, "strong"), ("fsdp4", 4, "strong")]
    assert planned(modes=["train"], devices=[4], parallel="tp") == [("tp4", 4, "strong")]
    assert planned(modes=["train"], devices=[4], parallel="fsdp_tp", tp=2, scaling="weak") == [("fsdp2xtp2", 8, "weak")]
    one = plan(["gpt2"], backends=["cpu"], modes=["train"])[0]
    assert (one.devices, one.parallel, one.tp_size, one.scaling, one.label().split()[-1]) == (
        1,
        "none",
        1,
        None,
        "b4xs128",
    )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"devices": [2]}, "--devices 2 needs --parallel, the plan to split the run by: dp, fsdp, tp, fsdp_tp"),
        ({"devices": [2], "parallel": "sharded"}, "unknown --parallel 'sharded'; valid: none, dp, fsdp, tp, fsdp_tp"),
        ({"devices": [4], "parallel": "fsdp_tp"}, "--parallel fsdp_tp needs --tp K"),
        ({"devices": [2, 6], "parallel": "fsdp_tp", "tp": 4}, "--tp 4 does not divide --devices 2"),
        ({"devices": [4], "parallel": "tp", "tp": 2}, "--tp 2 must equal --devices (4)"),
        ({"devices": [4], "parallel": "dp", "tp": 2}, "--tp applies to --parallel fsdp_tp"),
        ({"devices": [1], "scaling": "weak"}, "--scaling applies to runs with --parallel"),
        ({"devices": [2], "parallel": "dp", "scaling": "linear"}, "unknown --scaling 'linear'; valid: weak, strong"),
        (
            {"devices": [8], "parallel": "dp", "scaling": "strong"},
            "batch size 4 is not divisible by the data-parallel degree 8",
        ),
    ],
)
def test_a_layout_that_cannot_be_is_refused_when_planned(options: dict, message: str) -> None:
    with pytest.raises(ValueError) as refused:
        plan(["gpt2"], backends=["cpu"], modes=["train"], batch_size=4, **options)
    assert message in str(refused.value)


def test_verify_of_a_multi_device_run_of_ranks_is_planned_for_training_only() -> None:
    """Its train steps' stored losses answer --verify (tests/test_parity.py runs one); the
    ranks' infer outputs are not verified, so asking is refused rather than called a match."""
    layout = {"devices": [1, 2], "parallel": "dp", "verify": True, "batch_size": 4}
    assert len(plan(["gpt2"], backends=["cpu", "xla"], modes=["train"], **layout)) == 4
    with pytest.raises(ValueError) as refused:
        plan(["gpt2"], backends=["cpu", "xla"], modes=["train", "infer"], **layout)
    assert str(refused.value) == (
        "--verify checks a multi-device run of cpu by its training losses; its infer outputs are not verified "
        "yet: add --mode train, or verify at --devices 1"
    )
    assert len(plan(["gpt2"], backends=["xla"], modes=["train", "infer"], **layout)) == 4  # SPMD: verified whole
    assert len(plan(["gpt2"], backends=["cpu"], modes=["train"], **{**layout, "devices": [2]}, hosts=2)) == 1
    with pytest.raises(ValueError) as refused:  # xla's verify worker is one process: it cannot span hosts
        plan(["gpt2"], backends=["xla"], modes=["train"], **{**layout, "devices": [2]}, hosts=2)
    assert str(refused.value).startswith("--verify cannot check a run of xla over several hosts yet")


def test_a_tensor_parallel_degree_must_divide_every_dimension_the_plan_names() -> None:
    """A degree that splits a head is refused before anything runs, naming the degrees that work."""
    config = SimpleNamespace(n_head=6, d_ff=8)
    workload = replace(
        _toy(),
        sizes={"tiny": config},
        parallel=ParallelPlan(tp={"layer": "colwise"}, tp_divides=("n_head", "d_ff")),
    )
    assert [s.tp_size for s in plan([workload], backends=["cpu"], devices=[2], parallel="tp")] == [2, 2]
    with pytest.raises(ValueError) as refused:
        plan([workload], backends=["cpu"], devices=[4], parallel="tp")
    assert str(refused.value) == (
        "toy/tiny: the tensor-parallel degree 4 does not divide n_head = 6; degrees that divide n_head, d_ff: 1, 2"
    )
    # fsdp splits no layer: any degree
    assert len(plan([workload], backends=["cpu"], modes=["train"], devices=[4], parallel="fsdp")) == 1
    assert parallel_choices(workload) == ["dp", "fsdp", "tp", "fsdp_tp"]  # what `tpubench list` shows
    assert parallel_choices(_toy()) == ["dp", "fsdp"]


def tiny_model() -> torch.nn.Module:
    return torch.nn.Linear(4, 2)


def tiny_inputs(batch_size: int, generator: torch.Generator, **dims: int) -> tuple[torch.Tensor]:
    return (torch.randn(batch_size, 4, generator=generator),)


def test_bench_lays_a_users_model_out_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TPUBENCH_SIMULATED_DEVICES", "2")
    rows = tpubench.bench(tiny_model, tiny_inputs, modes=["train"], batch_size=2, devices=[4], parallel="dp")
    assert rows[["devices", "parallel", "scaling", "batch_size", "status"]].values.tolist() == [
        [4, "dp", "weak", 8, "unavailable"]
    ]
    with pytest.raises(ValueError, match="devices=2 needs parallel"):  # in bench's words, not the CLI's
        tpubench.bench(tiny_model, tiny_inputs, devices=2)


def _toy():
    """A plan-less workload (tests/fault_workloads.py's shape), built here without the plugin."""
    from fault_workloads import _workload

    return replace(_workload("toy", lambda: None), name="toy")


@pytest.mark.parametrize(
    ("command", "line", "message"),
    [
        (
            "run",
            "--devices 2",
            "error: --devices 2 needs --parallel, the plan to split the run by: dp, fsdp, tp, fsdp_tp",
        ),
        (
            "run",
            "--devices 2 --parallel sharded",
            "error: unknown --parallel 'sharded'; valid: none, dp, fsdp, tp, fsdp_tp",
        ),
        ("ci", "--devices 4 --parallel fsdp_tp --tp 3", "error: --tp 3 does not divide --devices 4"),
    ],
)
def test_the_cli_refuses_a_bad_layout_in_one_line(tmp_path: Path, command: str, line: str, message: str) -> None:
    where = "--out" if command == "ci" else "--results"
    done = in_process(f"{command} --workload gpt2 --backend cpu {line} {where}", str(tmp_path / "r"))
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.startswith(message) and len(done.stderr.splitlines()) == 1
    assert not list(tmp_path.rglob("*.parquet"))  # nothing ran


def test_too_many_devices_is_unavailable_and_tp_without_a_plan_is_skipped(tmp_path: Path) -> None:
    """With 2 simulated devices: the 4-device run never starts a worker (unavailable, in the
    parent), the 2-device tp run of a workload without a plan is skipped before any rank."""
    env = {**FAULTS, "TPUBENCH_SIMULATED_DEVICES": "2"}
    line = "run --workload fault-ok --backend cpu --mode train --devices 2,4 --parallel tp --results"
    done = cli(line, str(tmp_path), env=env)
    assert done.returncode == 0, done.stderr
    runs = store.load_runs(tmp_path).set_index("devices")
    assert list(runs["status"].sort_index()) == ["skipped", "unavailable"]
    assert runs.loc[2, "error"].startswith("fault-ok has no tensor-parallel plan (Workload.parallel.tp)")
    assert runs.loc[4, "error"] == (
        f"4 devices needed; cpu has 2 here ({runs.loc[4, 'cpu_model']}; "
        "simulated devices: TPUBENCH_SIMULATED_DEVICES sets how many)"
    )
    assert set(runs["parallel"]) == {"tp"} and list(runs["tp_size"].sort_index()) == [2, 4]
    # rows that never measured still say how they were laid out
    assert list(runs["mesh"].sort_index()) == ["tp=2", "tp=4"] and set(runs["comm_backend"]) == {"gloo"}
    assert "[skipped] fault-ok/tiny cpu train tp2: fault-ok has no tensor-parallel plan" in done.stdout


def test_each_device_has_its_lock_taken_in_numeric_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert lock_name("cuda", {"CUDA_VISIBLE_DEVICES": "10,2,3"}, 2) == ["cuda-2", "cuda-10"]
    assert lock_name("cuda", {}, 2) == ["cuda-0", "cuda-1"]
    assert lock_name("cuda", {}) == ["cuda-0"]  # an unpinned CUDA worker uses GPU 0
    assert lock_name("tpu", {"TPU_VISIBLE_CHIPS": "1,0"}, 2) == ["tpu-0", "tpu-1"]
    assert lock_name("cpu", {}, 4) == ["cpu"]  # the host's CPU is one device, however many ranks
    monkeypatch.setenv("TPUBENCH_LOCK_DIR", str(tmp_path))
    with devicelock.hold(["cuda-0", "cuda-1"]):
        for name in ("cuda-0", "cuda-1"):  # another open of the file: as another process would
            fd = os.open(tmp_path / f"{name}.lock", os.O_RDWR)
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.close(fd)
        with devicelock.hold("cuda-1") as waited:  # this process holds it: re-entered, no wait
            assert waited == 0.0
    fd = os.open(tmp_path / "cuda-1.lock", os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released with the block
    os.close(fd)


def test_a_multi_device_worker_is_pinned_to_its_devices(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No GPU or TPU here: the environment the runner gives their workers is what is checked."""
    spec = RunSpec("llm", "gpt2", "tiny", "cuda", "train", "float32", 8, devices=2, parallel="dp")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert CudaBackend().worker_env_for(spec)["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert "CUDA_VISIBLE_DEVICES" not in CudaBackend().worker_env_for(replace(spec, devices=1))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,3,7")  # the user's (or Ray's) choice comes first
    assert CudaBackend().worker_env_for(spec)["CUDA_VISIBLE_DEVICES"] == "5,3"
    tpu = TpuBackend()
    tpu.root = tmp_path  # no chip: v5e-like, one device per chip
    monkeypatch.delenv("TPU_VISIBLE_CHIPS", raising=False)
    env = tpu.worker_env_for(replace(spec, backend="tpu", devices=4))
    assert env["TPU_VISIBLE_CHIPS"] == "0,1,2,3"
    assert "TPU_CHIPS_PER_PROCESS_BOUNDS" not in env and "TPU_PROCESS_BOUNDS" not in env  # each rank's own
    assert tpu.worker_env_for(replace(spec, backend="tpu", devices=1))["TPU_VISIBLE_CHIPS"] == "0"


def test_layout_columns_say_how_the_devices_were_used() -> None:
    spec = RunSpec("llm", "gpt2", "tiny", "xla", "train", "bfloat16", 16, devices=8, parallel="fsdp_tp", tp_size=2)
    assert layout_columns(spec, ("TPU7x", "tpu"), simulated=False) == {
        "chips": 4,  # v7: two devices per chip
        "hosts": 1,
        "parallel_impl": "xla-spmd",
        "mesh": "fsdp=4,tp=2",
        "comm_backend": "xla",
        "global_batch_size": 16,
        "per_device_batch_size": 4,
        "simulated": False,
    }
    gloo = replace(spec, backend="cpu", devices=2, parallel="dp", tp_size=1)
    columns = layout_columns(gloo, ("AMD EPYC", "cpu"), simulated=True)
    assert (columns["chips"], columns["parallel_impl"], columns["comm_backend"], columns["simulated"]) == (
        2,
        "ddp",
        "gloo",
        True,
    )
    assert layout_columns(replace(gloo, devices=1, parallel="none"), ("AMD EPYC", "cpu"), True)["simulated"] is False
    assert per_device_columns({"samples_per_s": 80.0, "tokens_per_s": None}, 4) == {
        "samples_per_s_per_device": 20.0,
        "tokens_per_s_per_device": None,
    }


def test_the_memory_estimate_is_per_device() -> None:
    """Per-sample bytes follow each device's share of the batch; weights and optimizer state
    are divided by the sharding degree (fsdp: dp, tp: tp), the runtime's fixed bytes stay whole."""
    state, per_sample = 400 * 2**20, 10 * 2**20
    workload = replace(
        _toy(), estimate_memory_bytes=lambda config, shape, mode, dtype: state + per_sample * shape.batch_size
    )
    shape, runtime = Shape(8), RUNTIME_BYTES["train"]

    def estimate(layout: Layout) -> int:
        return device_estimate(workload, 0, shape, "train", torch.float32, layout)

    assert estimate(Layout(1, "none")) == runtime + state + 8 * per_sample
    assert estimate(Layout(4, "dp")) == runtime + state + 2 * per_sample
    assert estimate(Layout(4, "fsdp")) == runtime + state // 4 + 2 * per_sample
    assert estimate(Layout(4, "tp", 4)) == runtime + state // 4 + 8 * per_sample
    assert estimate(Layout(4, "fsdp_tp", 2)) == runtime + state // 4 + 4 * per_sample


def test_labels_and_the_summary_show_the_layout() -> None:
    row = {
        "workload": "gpt2",
        "size": "tiny",
        "backend": "cpu",
        "mode": "train",
        "batch_size": 8,
        "seq_len": 128,
        "gen_len": 0,
        "status": "failed",
        "error": "boom",
        "devices": 4.0,  # as a stored row loads
        "parallel": "fsdp_tp",
        "tp_size": 2.0,
        "simulated": True,
    }
    assert notes([row]) == ["[failed] gpt2/tiny cpu train fsdp2xtp2: boom"]
    table, _ = summary_table([row, {**row, "devices": 1, "parallel": "none", "tp_size": 1, "simulated": False}])
    devices = next(column for column in table.columns if column.header == "devices")
    assert list(devices.cells) == ["-", "fsdp2xtp2"]  # one device first
    status = next(column for column in table.columns if column.header == "status")
    assert [str(cell) for cell in status.cells] == ["failed", "failed, simulated"]
    # the reports' and the dashboard's labels: one shape, two layouts, two labels
    frame = pd.DataFrame([row, {**row, "devices": 1, "parallel": "none", "tp_size": 1}, {**row, "parallel": None}])
    assert shape_labels(frame).tolist() == ["8x128 fsdp2xtp2", "8x128", "8x128"]


def old_runs_file(results: Path, rows: list[dict]) -> None:
    """``rows`` in a runs file as written before multi-device runs (no layout columns)."""
    layout = {"devices", "chips", "hosts", "parallel", "parallel_impl", "mesh", "comm_backend", "tp_size", "scaling"}
    layout |= {"global_batch_size", "per_device_batch_size", "simulated", "peak_mem_bytes_min", "failed_rank"}
    layout |= {"host_skew_pct", "failed_host"}
    layout |= {"samples_per_s_per_device", "tokens_per_s_per_device", "rank_skew_pct"}
    layout |= {"collective_ms", "collective_share", "exposed_collective_ms", "exposed_collective_share"}
    schema = pa.schema([field for field in RUNS if field.name not in layout])
    path = store.partition_dir(results, "runs", pd.Timestamp("2026-11-01", tz="UTC")) / "old.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(
        pa.Table.from_pylist([{k: v for k, v in r.items() if k in schema.names} for r in rows], schema), path
    )


def test_compare_pairs_an_old_row_with_one_device_and_never_across_layouts(tmp_path: Path) -> None:
    base = {"workload": "gpt2", "size": "tiny", "backend": "cpu", "device": "x", "mode": "train", "dtype": "float32"}
    base |= {"batch_size": 8, "seq_len": 128, "gen_len": 0, "status": "ok", "median_step_ms": 10.0}
    old_runs_file(tmp_path, [{**base, "run_id": "old", "schema_version": 2}])
    new = [
        {**base, "run_id": "one", "devices": 1, "parallel": "none", "tp_size": 1},
        {**base, "run_id": "dp2", "devices": 2, "parallel": "dp", "tp_size": 1, "scaling": "strong"},
        {**base, "run_id": "weak", "devices": 2, "parallel": "dp", "tp_size": 1, "scaling": "weak"},
    ]
    store.InvocationWriter(tmp_path, "new", pd.Timestamp("2026-11-02", tz="UTC")).add(new[0])
    runs = store.load_runs(tmp_path)
    assert runs.set_index("run_id").loc["old", ["devices", "parallel", "tp_size"]].tolist() == [1, "none", 1]
    steps = pd.DataFrame(columns=["run_id", "phase", "step_ms"])
    old, one = runs[runs.run_id == "old"], runs[runs.run_id == "one"]
    assert set(compare.compare_runs(old, one, steps, steps)["verdict"]) != {"unpaired"}
    multi = pd.DataFrame(new[1:]).reindex(columns=runs.columns)
    verdicts = compare.compare_runs(multi.iloc[:1], multi.iloc[1:], steps, steps)
    assert list(verdicts["verdict"]) == ["unpaired", "unpaired"]  # strong and weak are two configurations


def test_resume_takes_a_row_from_before_devices_for_one_device(tmp_path: Path, fault_workloads: None) -> None:
    specs = plan(["fault-ok"], backends=["cpu"], modes=["train"], steps=1, warmup=0)
    first = SuiteRunner(results_dir=tmp_path)
    [row] = first.run(specs)
    assert row["status"] == "ok" and (row["devices"], row["parallel"], row["simulated"]) == (1, "none", False)
    written = next(tmp_path.glob("runs/*/*.parquet"))
    rows = pq.read_table(written).to_pylist()
    written.unlink()
    old_runs_file(tmp_path, rows)  # the same row, as a store from before multi-device runs holds it
    again = SuiteRunner(results_dir=tmp_path, resume=True)
    assert again.run(specs) == [] and again.resumed == specs
