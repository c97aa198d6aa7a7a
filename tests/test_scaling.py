"""The multi-device read side: time in collectives from traces (interval unions, exposed time, bus
bandwidth), per-device ops rows, and scaling over N (efficiency, baselines, MFU per device)
through `tpubench scaling`.

Traces here are synthetic Chrome traces and xplanes written with the formats' own encodings,
shaped like the real ones (reference multi-device.md §1.4, §4.2): a gloo rank's c10d ops with
the overlapping ``gloo:*`` annotations of gloo's worker threads, a CUDA rank's NCCL kernels,
PJRT CPU's one thread per virtual device, a TPU's async collectives. No GPU or TPU exists here.
Stored runs are synthetic rows with the contract's columns, written by the store's writer."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from helpers import in_process, one_error_line
from multi_device_rows import run_row, write_runs

from reports import build_report
from tpubench import peaks, store
from tpubench.analysis import collectives as intervals
from tpubench.analysis import scaling
from tpubench.analysis.prices import PRICES
from tpubench.traces import collectives as trace_collectives
from tpubench.traces import ingest, ops_rows
from tpubench.traces.timeline import OpTotals, TraceOps
from tpubench.traces.xplane import _messages


def spans(*pairs: tuple[float, float]) -> tuple[np.ndarray, np.ndarray]:
    return np.array([p[0] for p in pairs], dtype=float), np.array([p[1] for p in pairs], dtype=float)


# --- intervals -------------------------------------------------------------------------


def test_union_counts_overlapping_and_nested_events_once() -> None:
    # a c10d op (0-10), the gloo worker thread's annotation of the same collective (2-12),
    # record_param_comms nested in the op (1-3), and a separate collective later (20-25)
    events = spans((0, 10), (2, 12), (1, 3), (20, 25))
    assert sum(end - start for start, end in zip(*events, strict=True)) == 27  # the sum double counts
    assert intervals.covered(*events) == 17
    start, end = intervals.union(*events)
    assert start.tolist() == [0, 20] and end.tolist() == [12, 25]
    assert intervals.covered(*spans()) == 0.0


def test_exposed_is_the_collective_time_no_compute_overlaps() -> None:
    comm = spans((0, 10), (2, 12), (20, 30))
    compute = spans((5, 8), (6, 15), (18, 22), (40, 50))  # overlapping compute events count once too
    # collective union [0,12] + [20,30] = 22; compute covers [5,12] (7) and [20,22] (2) of it
    assert intervals.overlap(comm, compute) == 9
    assert intervals.exposed(comm, compute) == 13
    assert intervals.exposed(comm, spans()) == 22  # nothing hides it
    assert intervals.exposed(comm, spans((-1, 100))) == 0


@pytest.mark.parametrize(
    ("kind", "n", "factor"),
    [
        ("all_reduce", 8, 2 * 7 / 8),
        ("all_reduce", 2, 1.0),
        ("all_gather", 4, 3 / 4),
        ("reduce_scatter", 8, 7 / 8),
        ("all_to_all", 2, 1 / 2),
        ("broadcast", 8, 1.0),
        ("reduce", 8, 1.0),
        ("all_reduce", 1, 0.0),
    ],
)
def test_bus_bandwidth_factors_are_nccl_tests(kind: str, n: int, factor: float) -> None:
    assert intervals.busbw_factor(kind, n) == pytest.approx(factor)


def test_bus_bandwidth_of_one_collective() -> None:
    # nccl-tests: 1 GB all-reduce over 8 ranks in 10 ms -> algbw 100 GB/s, busbw 175 GB/s
    assert intervals.busbw_gbps("all_reduce", 8, 1e9, 10_000) == pytest.approx(175.0)
    assert intervals.busbw_gbps("all_gather", 8, 1e9, 0) is None
    with pytest.raises(ValueError, match="unknown collective"):
        intervals.busbw_factor("gossip", 8)


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("c10d::allreduce_", "all_reduce"),
        ("c10d::_reduce_scatter_base_", "reduce_scatter"),
        ("ncclDevKernel_AllGather_RING_LL", "all_gather"),
        ("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL", "reduce_scatter"),
        ("all-reduce-start.3", "all_reduce"),
        ("c10d::broadcast_", "broadcast"),
        ("aten::mm", None),
    ],
)
def test_the_collective_an_op_runs_from_its_name(name: str, kind: str | None) -> None:
    assert intervals.collective_kind(name) == kind


# --- Chrome traces ---------------------------------------------------------------------


def event(name: str, ts: float, dur: float, tid: int = 1, cat: str = "cpu_op", pid: int = 100, **args) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def chrome_trace(path: Path, events: list[dict], **top) -> Path:
    path.write_text(json.dumps({**top, "traceEvents": events}))
    return path


def gloo_rank_trace(path: Path) -> Path:
    """Two traced steps of an FSDP rank on gloo, laid out as torch.profiler records them:
    per step, FSDP's wrapper around a local copy and the c10d all-gather (with its sizes, as
    record_shapes gives them), gloo's worker thread doing the transfer, then a matmul."""
    events = []
    for step in range(2):
        t = step * 1000.0
        events += [
            event(f"ProfilerStep#{step}", t, 1000, cat="user_annotation"),
            event("FSDP::all_gather (0)", t, 300, cat="user_annotation"),
            event("fsdp::all_gather_copy_in", t, 50),  # a local copy: not a collective
            event(
                "c10d::_allgather_base_",
                t + 50,
                100,
                **{"Input Dims": [[8320], [4160], [], []], "Input type": ["float", "float", "", "Scalar"]},
            ),
            event("gloo:all_gather", t + 60, 240, tid=2, cat="user_annotation"),  # overlaps the c10d op
            event("aten::mm", t + 250, 500),  # compute overlapping the end of the transfer
            event("aten::view", t + 800, 100),  # data movement: neither
        ]
    return chrome_trace(path, events, distributedInfo={"backend": "gloo", "rank": 0, "world_size": 2})


def test_a_gloo_ranks_collective_time_is_the_union_over_its_threads(tmp_path: Path) -> None:
    trace = gloo_rank_trace(tmp_path / "rank0.json")
    found = trace_collectives.columns(trace, profile_steps=2, devices=2, step_ms=2.0)
    # per step: c10d [50,150] u gloo thread [60,300] = 250 us (the sum, 340, double counts);
    # the copy and FSDP's wrapper are not communication; the matmul hides [250,300]
    assert found["collective_ms"] == pytest.approx(0.250)
    assert found["exposed_collective_ms"] == pytest.approx(0.200)
    assert found["collective_share"] == pytest.approx(0.125)
    assert found["exposed_collective_share"] == pytest.approx(0.100)


def test_a_cuda_ranks_collectives_are_its_nccl_kernels_with_bus_bandwidth(tmp_path: Path) -> None:
    events = [
        event(
            "c10d::allreduce_",
            0,
            20,
            **{"External id": 7, "Input Dims": [[[262144]]], "Input type": ["TensorList"]},
        ),
        event("record_param_comms", 1, 10, **{"External id": 8, "In msg nelems": 262144, "dtype": "Float"}),
        event("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 30, 100, cat="kernel", pid=0, tid=7, **{"External id": 8}),
        event("ampere_sgemm_128x64_nn", 0, 60, cat="kernel", pid=0, tid=8, **{"External id": 9}),
        event("Memcpy DtoD", 110, 40, cat="gpu_memcpy", pid=0, tid=8),
    ]
    trace = chrome_trace(tmp_path / "cuda.json", events, distributedInfo={"world_size": 4})
    found = trace_collectives.columns(trace, profile_steps=1, devices=4, step_ms=0.5)
    assert found["collective_ms"] == pytest.approx(0.100)  # the kernel, not the host-side ops
    assert found["exposed_collective_ms"] == pytest.approx(0.070)  # the gemm hides [30,60]; a memcpy hides nothing
    sizes = trace_collectives.chrome_comm_sizes(trace)
    assert sizes[("aten", "record_param_comms")].columns()["comm_bytes"] == 262144 * 4
    kernel = sizes[("kernel", "ncclDevKernel_AllReduce_Sum_f32_RING_LL")].columns()
    # 1 MiB in 100 us over 4 ranks: algbw 10.49 GB/s, x 2*3/4
    assert kernel["comm_bytes"] == 262144 * 4
    assert kernel["busbw_gbps"] == pytest.approx(262144 * 4 / 100e-6 * 1.5 / 1e9)


def test_ingest_puts_sizes_on_collective_rows_and_keeps_a_ranks_rows_as_they_are(tmp_path: Path) -> None:
    rows = {row["op"]: row for row in ingest(gloo_rank_trace(tmp_path / "rank0.json"), 2, devices=2)}
    gather = rows["c10d::_allgather_base_"]
    assert gather["category"] == "collective" and gather["comm_bytes"] == 8320 * 4  # the output: nccl-tests' S
    assert gather["busbw_gbps"] is None  # a gloo op's own time is not the transfer's
    assert gather["calls"] == 2 and gather["devices"] == 2  # a rank's trace holds its own device: no division
    assert gather["self_us_per_step"] == pytest.approx(100.0)
    assert "comm_bytes" not in rows["aten::mm"]


def test_a_corrupt_chrome_trace_is_a_trace_error(tmp_path: Path) -> None:
    from tpubench.traces import TraceError

    broken = tmp_path / "broken.json"
    broken.write_text('{"traceEvents": [{"ph": "X", "name": "c10d::allreduce_", "ts": 1')
    with pytest.raises(TraceError, match="corrupt or truncated"):
        trace_collectives.columns(broken, 1, 2, 1.0)


# --- XProf traces ----------------------------------------------------------------------


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field."""

    def varint(value: int) -> bytes:
        out = bytearray()
        while True:
            out.append((value & 0x7F) | (0x80 if value > 0x7F else 0))
            value >>= 7
            if not value:
                return bytes(out)

    return varint(number << 3 | 2) + varint(len(payload)) + payload


def xplane(path: Path, planes: dict[str, dict[str, list[tuple[str, float, float]]]], hlo_stat: bool) -> Path:
    """An XSpace of ``planes``: plane name -> line name -> (op name, start us, duration us)
    events, in xplane.proto's encoding; with ``hlo_stat`` every event carries an ``hlo_op``
    stat, as XLA's thunks on PJRT CPU's host threads do."""
    m = _messages()
    space = b""
    for plane_name, lines in planes.items():
        names = sorted({name for events in lines.values() for name, _, _ in events})
        ids = {name: i + 1 for i, name in enumerate(names)}
        header = m["PlaneHeader"](name=plane_name.encode())
        for name, i in ids.items():
            header.event_metadata.add(key=i, value=m["XEventMetadata"](id=i, name=name.encode()))
        header.stat_metadata.add(key=1, value=m["XStatMetadata"](id=1, name=b"hlo_op"))
        body = header.SerializeToString()
        for line_name, events in lines.items():
            block = m["EventBlock"]()
            for name, start, duration in events:
                added = block.events.add(
                    metadata_id=ids[name], offset_ps=int(start * 1e6), duration_ps=int(duration * 1e6)
                )
                if hlo_stat:
                    added.stats.add(metadata_id=1, str_value=name.encode())
            line = m["LineHeader"](name=line_name.encode(), timestamp_ns=1_000).SerializeToString()
            body += _field(3, line + block.SerializeToString())
        space += _field(1, body)
    path.write_bytes(space)
    return path


def pjrt_cpu_spmd(path: Path) -> Path:
    """Two traced steps of a 2-device SPMD dp step on PJRT CPU: each virtual device's thread
    runs a fusion then an all-reduce (a rendezvous wait), overlapping nothing."""
    threads = {}
    for device in range(2):
        events = []
        for step in range(2):
            t = step * 1000.0
            events += [("fusion.1", t, 300.0), ("all-reduce.2", t + 300, 200.0 + 100 * device)]
        threads[f"tf_XLAPjRtCpuClient/{device}"] = events
    return xplane(path / "plugins" / "profile" / "s1" / "host.xplane.pb", {"/host:CPU": threads}, hlo_stat=True)


def test_pjrt_cpu_spmd_collectives_are_per_device_per_step(tmp_path: Path) -> None:
    (tmp_path / "plugins" / "profile" / "s1").mkdir(parents=True)
    pjrt_cpu_spmd(tmp_path)
    found = trace_collectives.columns(tmp_path, profile_steps=2, devices=2, step_ms=1.0)
    assert found["collective_ms"] == pytest.approx(0.250)  # (200 + 300) / 2 devices
    assert found["exposed_collective_ms"] == pytest.approx(0.250)
    assert found["collective_share"] == pytest.approx(0.25)


def test_an_spmd_traces_ops_rows_are_per_device(tmp_path: Path) -> None:
    (tmp_path / "plugins" / "profile" / "s1").mkdir(parents=True)
    pjrt_cpu_spmd(tmp_path)
    rows = {row["op"]: row for row in ingest(tmp_path, traced_steps=2, devices=2)}
    reduce = rows["all-reduce.2"]
    # 2 devices x 2 steps = 4 events in the trace: 2 calls and 250 us per step on one device
    assert reduce["calls"] == 2 and reduce["category"] == "collective" and reduce["devices"] == 2
    assert reduce["self_time_us"] == pytest.approx(500.0) and reduce["self_us_per_step"] == pytest.approx(250.0)
    per_step_us = sum(row["self_us_per_step"] for row in rows.values())
    assert per_step_us == pytest.approx(550.0)  # one device's step holds it, where the sum of devices did not


def test_a_tpu_async_collective_spans_its_start_to_its_done(tmp_path: Path) -> None:
    ops = [
        ("all-reduce-start.3", 0.0, 5.0),
        ("fusion.7", 10.0, 50.0),  # compute the collective overlaps
        ("all-reduce-done.3", 95.0, 5.0),
        ("convolution.1", 100.0, 100.0),
    ]
    planes = {f"/device:TPU:{i}": {"XLA Ops": ops, "XLA Modules": [("jit_step", 0.0, 200.0)]} for i in range(4)}
    xplane(tmp_path / "tpu.xplane.pb", planes, hlo_stat=False)
    devices, planes = trace_collectives.xplane_devices(tmp_path / "tpu.xplane.pb")
    assert len(devices) == planes == 4  # one per device plane; the modules line is not an op line
    assert devices[0].collective_us() == pytest.approx(100.0)
    assert devices[0].exposed_us() == pytest.approx(50.0)
    # the device planes say how many devices the trace holds, whatever the run's N (a TorchTPU rank: its own)
    one = trace_collectives.columns(tmp_path / "tpu.xplane.pb", profile_steps=1, devices=8, step_ms=0.2)
    assert one["collective_ms"] == pytest.approx(0.1) and one["exposed_collective_share"] == pytest.approx(0.25)


def test_ops_rows_divide_by_the_devices_a_trace_holds() -> None:
    ops = [OpTotals("hlo", "all-reduce.1", calls=8, self_us=800.0, total_us=800.0, flops=80.0)]
    spmd = ops_rows(TraceOps("xplane events", ops, steps=2, step_time_us=1000.0), devices=4)[0]
    assert (spmd["calls"], spmd["self_time_us"], spmd["self_us_per_step"], spmd["flops"]) == (2, 200.0, 100.0, 20.0)
    assert spmd["self_pct"] == pytest.approx(20.0) and spmd["devices"] == 4
    planes = ops_rows(TraceOps("xprof hlo_stats", ops, 2, 1000.0, devices=2), devices=4)[0]
    assert planes["calls"] == 4  # the trace's two device planes hold two devices' ops
    rank = ops_rows(TraceOps("chrome trace", ops, 2, 1000.0, devices=1), devices=4)[0]
    assert rank["calls"] == 8 and rank["self_time_us"] == 800.0


# --- scaling formulas ------------------------------------------------------------------


def fsdp_weak(n: int, step_ms: float, **columns) -> dict:
    return (
        run_row(
            devices=n,
            parallel="fsdp",
            scaling="weak",
            batch_size=8 * n,
            per_device_batch_size=8,
            median_step_ms=step_ms,
        )
        | columns
    )


def test_weak_efficiency_is_throughput_per_device_against_one_device() -> None:
    runs = pd.DataFrame([run_row(median_step_ms=100.0), fsdp_weak(2, 110.0), fsdp_weak(4, 125.0), fsdp_weak(8, 160.0)])
    [(config, rows)] = scaling.configurations(runs)
    table = scaling.scaling_table(rows, config["scaling"])
    assert table["devices"].tolist() == [1, 2, 4, 8]
    assert table["efficiency"].tolist() == pytest.approx([1.0, 100 / 110, 100 / 125, 100 / 160])
    assert set(table["baseline_devices"]) == {1} and table["baseline_run_id"].nunique() == 1
    assert config["batch_key"] == 8  # weak scaling keeps the per-device batch


def test_strong_efficiency_is_speedup_times_n0_over_n() -> None:
    tp = [
        run_row(devices=n, parallel="tp", tp_size=n, scaling="strong", median_step_ms=ms)
        for n, ms in ((2, 60), (4, 40))
    ]
    [(config, rows)] = scaling.configurations(pd.DataFrame([run_row(median_step_ms=100.0), *tp]))
    table = scaling.scaling_table(rows, config["scaling"])
    assert table["efficiency"].tolist() == pytest.approx([1.0, 100 / 60 * 1 / 2, 100 / 40 * 1 / 4])
    assert config["batch_key"] == 8 and config["tp_key"] is None  # global batch; pure tp's degree is N


def test_an_oom_on_one_device_makes_the_smallest_n_that_ran_the_baseline() -> None:
    runs = pd.DataFrame([run_row(status="oom"), fsdp_weak(2, 100.0), fsdp_weak(4, 120.0)])
    [(config, rows)] = scaling.configurations(runs)
    table = scaling.scaling_table(rows, config["scaling"])
    oom, two, four = table.to_dict("records")
    assert oom["status"] == "oom" and pd.isna(oom["efficiency"]) and pd.isna(oom["step_ms"])
    assert two["baseline_devices"] == 2 and two["baseline_run_id"] == runs.iloc[1]["run_id"]
    assert four["efficiency"] == pytest.approx(100 / 120)


def test_without_a_baseline_that_ran_there_is_no_efficiency() -> None:
    [(config, rows)] = scaling.configurations(pd.DataFrame([fsdp_weak(2, 100.0, status="failed")]))
    table = scaling.scaling_table(rows, config["scaling"])
    assert table["efficiency"].isna().all() and table["baseline_devices"].isna().all()


def test_old_rows_without_devices_are_one_device_and_other_batches_are_other_configurations() -> None:
    old = run_row(median_step_ms=100.0) | {"devices": None, "parallel": None, "tp_size": None}
    other_batch = run_row(batch_size=4, median_step_ms=50.0)
    [(_, rows)] = scaling.configurations(pd.DataFrame([old, other_batch, fsdp_weak(2, 110.0)]))
    assert sorted(rows["devices"]) == [1, 2] and set(rows["batch_size"]) == {8, 16}


def test_mfu_per_device_is_global_flops_over_n_peaks() -> None:
    # 8 devices of 1 PFLOP/s, 4 PFLOP per step in 1 s: half of each device's peak
    assert scaling.mfu_per_device(4e15, 1000.0, 8, 1e15) == pytest.approx(0.5)
    row = fsdp_weak(8, 1000.0, flops_per_step=4e15, mfu=None, device="NVIDIA H100 80GB HBM3")
    peak = peaks.lookup(row["device"], "cuda").device_flops("bfloat16")
    assert scaling.row_mfu(scaling.normalised(pd.DataFrame([row])).iloc[0].to_dict()) == pytest.approx(
        4e15 / (8 * peak)
    )
    # a count that missed ops gives no MFU, as the run itself gave none (worker.throughput_columns)
    assert scaling.row_mfu({**row, "flops_incomplete": '{"aten::foo": 2}'}) is None


def test_the_run_index_gives_no_mfu_where_the_flop_count_missed_ops(tmp_path: Path) -> None:
    """The dashboard's Scaling page reads the kept run index (store_index.RUN_COLUMNS), which
    lacked ``flops_incomplete``: a run whose count missed ops got an MFU computed from its
    partial FLOPs there, where ``tpubench scaling`` and the run itself give none."""
    from tpubench import store_index

    missed = '["aten._grouped_mm"]'
    rows = [
        run_row(median_step_ms=100.0, flops_per_step=1e12, mfu=None, flops_incomplete=missed),
        fsdp_weak(2, 110.0, flops_per_step=2e12, mfu=None, flops_incomplete=missed),
    ]
    results = write_runs(tmp_path / "results", rows)
    index = store_index.read_index(results, "runs", store_index.RUN_COLUMNS)
    assert scaling.scaling_report(index)["mfu"].isna().all()
    assert scaling.scaling_report(store.load_runs(results))["mfu"].isna().all()


# --- tpubench scaling ------------------------------------------------------------------


@pytest.fixture
def scaling_store(tmp_path: Path):
    """A store with an H100 fsdp sweep (1 OOM'd, so 2 is the baseline; 4 simulated for the
    test's sake) and a TPU v5e sweep of the same configuration."""
    rows = [
        run_row(status="oom"),
        fsdp_weak(2, 100.0, collective_share=0.30, exposed_collective_share=0.10, rank_skew_pct=2.5),
        fsdp_weak(4, 125.0, simulated=True, peak_mem_bytes=3 * 2**30, peak_mem_bytes_min=2 * 2**30),
        fsdp_weak(2, 200.0, backend="tpu", device="TPU v5 lite"),
    ]
    return write_runs(tmp_path / "results", rows), rows


def test_scaling_prints_each_configuration_over_n_and_backends_at_equal_n(scaling_store) -> None:
    results, rows = scaling_store
    done = in_process("scaling --results", str(results))
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "gpt2/124m cuda train bfloat16 fsdp weak b8xs1024 per device" in out
    assert f"baseline: 2 devices, fsdp, 1 host, run {rows[1]['run_id']}" in out
    assert "80.0%" in out and "30% (10%)" in out and "3.00 / 2.00" in out and "oom" in out
    assert "4 *" in out and "* simulated" in out
    assert "backends at equal N" in out
    as_json = json.loads(in_process("scaling --json --results", str(results)).stdout)
    four = next(r for r in as_json["configurations"] if r["devices"] == 4)
    assert four["efficiency"] == pytest.approx(0.8) and four["baseline_devices"] == 2 and four["simulated"] is True
    cross = {r["backend"]: r for r in as_json["cross_backend"]}
    assert set(cross) == {"cuda", "tpu"}
    tpu_tokens = 8 * 1024 / 0.2
    assert cross["tpu"]["usd_per_million_tokens"] == pytest.approx(
        PRICES["TPU v5e"].usd_per_chip_hour / tpu_tokens / 3600 * 1e6
    )


def test_scaling_of_a_sweep_without_tokens_reads_it_in_samples(tmp_path: Path) -> None:
    """An image model's sweep has samples/s only: its table and the efficiency footnote say
    samples/s (the footnote said tokens/s under a samples/s table)."""
    images = {"workload": "resnet", "size": "50", "seq_len": None, "image_size": 224, "tokens_per_s": None}
    rows = [
        fsdp_weak(n, step, **images, tokens_per_s_per_device=None, samples_per_s_per_device=8 / (step / 1e3))
        for n, step in ((1, 100.0), (2, 125.0))
    ]
    out = in_process("scaling --results", str(write_runs(tmp_path / "results", rows))).stdout
    assert "samples/s/device" in out and "80.0%" in out
    assert "efficiency: weak, samples/s per device at N / at the baseline" in out and "tokens/s" not in out


def test_scaling_selects_runs_and_says_when_nothing_scales(scaling_store) -> None:
    results, _ = scaling_store
    done = in_process("scaling --json --select backend=tpu --results", str(results))
    assert [r["backend"] for r in json.loads(done.stdout)["configurations"]] == ["tpu"]
    done = in_process("scaling --select devices=1 --results", str(results))
    assert done.returncode == 0 and "no multi-device runs" in done.stdout and "--devices 1,2,4,8" in done.stdout


def cpu_run(devices: int, parallel: str, tokens_per_device: float, hosts: int = 1) -> dict:
    """A cpu gpt2/tiny train row as ``tpubench run --batch-size 4 --seq-len 32 --devices N
    --parallel P [--hosts H]`` writes it (the columns of such a real 2-host run on 127.0.0.1):
    ``devices`` the total over the hosts, weak scaling by default, so 4 per device and a global
    batch of 4N; gloo ranks on one machine simulated; its step gives ``tokens_per_device``."""
    columns = {
        "backend": "cpu", "device": "AMD EPYC", "size": "tiny", "dtype": "float32", "seq_len": 32,
        "scaling": "weak", "batch_size": 4 * devices, "global_batch_size": 4 * devices, "per_device_batch_size": 4,
        "hosts": hosts, "mesh": f"{parallel}={devices}", "parallel_impl": {"dp": "ddp", "fsdp": "fsdp2"}[parallel]
        if devices > 1 else None, "simulated": devices > 1, "host_skew_pct": 1.0 if hosts > 1 else None,
    }  # fmt: skip
    return run_row(devices=devices, parallel=parallel, median_step_ms=4 * 32 / tokens_per_device * 1e3, **columns)


def test_scaling_over_hosts_reads_each_plan_against_its_own_one_device_run(tmp_path: Path) -> None:
    """What a new user ran on one machine: dp and fsdp on 1 device, on 2 devices of
    one host and on 2 hosts of 1 device. 2-host runs read 100% against themselves (no 1-device
    row shared their host count), and the dp table took the fsdp 1-device run, the latest, as
    its baseline. Each plan's tables take that plan's 1-device run; the 2-host runs have their
    own tables, labelled with the hosts, N the total devices (2 hosts x 1)."""
    dp1, fsdp1 = cpu_run(1, "dp", 4080.0), cpu_run(1, "fsdp", 4100.0)  # fsdp's the later, as the user's
    rows = [
        dp1, fsdp1,
        cpu_run(2, "dp", 3000.0), cpu_run(2, "fsdp", 2500.0),
        cpu_run(2, "dp", 2766.0, hosts=2), cpu_run(2, "fsdp", 2034.0, hosts=2),
    ]  # fmt: skip
    results = write_runs(tmp_path / "results", rows)
    found = json.loads(in_process("scaling --json --results", str(results)).stdout)["configurations"]
    two = {(r["parallel"], r["hosts"]): r for r in found if r["devices"] == 2}
    by_hand = {("dp", 1): 3000 / 4080, ("dp", 2): 2766 / 4080, ("fsdp", 1): 2500 / 4100, ("fsdp", 2): 2034 / 4100}
    assert {key: row["efficiency"] for key, row in two.items()} == pytest.approx(by_hand)
    assert round(100 * two["dp", 2]["efficiency"], 1) == 67.8 and round(100 * two["fsdp", 2]["efficiency"], 1) == 49.6
    for (plan, _), row in two.items():
        assert row["baseline_run_id"] == {"dp": dp1, "fsdp": fsdp1}[plan]["run_id"] and row["baseline_devices"] == 1
    out = in_process("scaling --results", str(results)).stdout
    assert "gpt2/tiny cpu train float32 dp on 2 hosts weak b4xs32 per device" in out and "fsdp on 2 hosts" in out
    assert f"baseline: 1 device, dp, 1 host, run {dp1['run_id']}" in out
    assert "2 (2 hosts x 1) *" in out and "67.8%" in out and "49.6%" in out
    assert out.count("100.0%") == 4  # each table's N = 1 row, and only those


def test_report_keeps_each_plan_and_host_count_a_row_of_its_own(tmp_path: Path) -> None:
    """A new user's store: a dp 1-device run (249 ms) and an fsdp one (125 ms) came out of ``report`` as
    one row of median 187 ms labelled without a plan. Every reader keys and labels with
    tpubench.analysis.identity: the plan even at 1 device, and the hosts (``dp2 on 2 hosts``)."""
    rows = [
        cpu_run(1, "dp", 4 * 32 / 0.249),
        cpu_run(1, "fsdp", 4 * 32 / 0.125),
        cpu_run(2, "dp", 2766.0),
        cpu_run(2, "dp", 2766.0, hosts=2),
    ]
    results = write_runs(tmp_path / "results", rows)
    out, md = tmp_path / "report.html", tmp_path / "report.md"
    done = in_process("report --results", str(results), "--out", str(out), "--markdown", str(md))
    assert done.returncode == 0, done.stderr
    lines = [line for line in md.read_text().splitlines() if line.startswith("| gpt2/tiny")]
    labels = {line.split(" | ")[0].removeprefix("| "): line for line in lines}
    assert set(labels) == {
        "gpt2/tiny train 4x32 dp1",
        "gpt2/tiny train 4x32 fsdp1",
        "gpt2/tiny train 8x32 dp2",
        "gpt2/tiny train 8x32 dp2 on 2 hosts",
    }, lines
    assert " 249.00 " in labels["gpt2/tiny train 4x32 dp1"] and " 125.00 " in labels["gpt2/tiny train 4x32 fsdp1"]
    assert "187" not in md.read_text()
    summary = build_report(store.load_runs(results)).summary
    assert len(summary) == 4 and summary["runs"].tolist() == [1, 1, 1, 1]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ("--select nosuchcolumn=1", "nosuchcolumn"),
        ("--prices /nonexistent.toml", "cannot read price file"),
    ],
)
def test_scaling_bad_input_is_one_line(scaling_store, args: str, message: str) -> None:
    results, _ = scaling_store
    assert message in one_error_line(in_process(f"scaling {args} --results", str(results)))


def test_scaling_of_a_missing_store_is_one_line(tmp_path: Path) -> None:
    assert "does not exist" in one_error_line(in_process("scaling --results", str(tmp_path / "none")))


def test_the_store_keeps_the_contract_columns_the_scaling_view_reads(scaling_store) -> None:
    results, _ = scaling_store
    runs = store.load_runs(results)
    assert runs["simulated"].tolist().count(True) == 1 and runs["rank_skew_pct"].notna().sum() == 1


# --- --on ray --------------------------------------------------------------------------


def test_a_ray_actor_for_runs_on_n_devices_asks_for_n_of_them_on_one_node() -> None:
    """The resource request only (no cluster): the actor of an N-device run holds N chips or
    GPUs of one node, so its ranks or its mesh share nothing with another run."""
    from tpubench.launchers import ray as fleet

    assert fleet.kind_requirements("tpu", 4) == {"num_cpus": 1, "resources": {"TPU": 4}}
    assert fleet.kind_requirements("cuda", 8) == {"num_cpus": 1, "num_gpus": 8}
    assert fleet.kind_requirements("cuda") == {"num_cpus": 1, "num_gpus": 1}
    assert fleet.kind_requirements("cpu", 4) == {"num_cpus": 1}  # simulated devices share the host
    v6e_8, h100x4 = {"CPU": 180, "TPU": 8}, {"CPU": 64, "GPU": 4}
    assert fleet.capacity(fleet.kind_requirements("tpu", 4), v6e_8) == 2
    assert fleet.capacity(fleet.kind_requirements("tpu", 8), v6e_8) == 1
    assert fleet.servable(fleet.requirements("cuda", 4), [h100x4])
    assert not fleet.servable(fleet.requirements("cuda", 8), [h100x4, h100x4])  # 8 GPUs, but not on one node


def test_ops_of_an_spmd_run_are_per_device_and_say_so(tmp_path: Path) -> None:
    """`tpubench ops` on the rows ingest gives a 4-device SPMD run: calls and shares of one device."""
    ops = [
        OpTotals("hlo", "all-reduce.1", calls=8, self_us=800.0, total_us=800.0),
        OpTotals("hlo", "dot.2", calls=8, self_us=2400.0, total_us=2400.0),
    ]
    rows = ops_rows(TraceOps("xplane events", ops, steps=2, step_time_us=2000.0), devices=4)
    run = run_row(backend="xla", device="CPU:0", devices=4, parallel="dp", scaling="weak", batch_size=32)
    writer = store.InvocationWriter(tmp_path / "results", "inv-ops", run["started_at"])
    writer.add(run, ops=[{"run_id": run["run_id"], "invocation_id": "inv-ops", **row} for row in rows])
    done = in_process(f"ops {run['run_id']} --results", str(tmp_path / "results"))
    as_json = json.loads(in_process(f"ops {run['run_id']} --json --results", str(tmp_path / "results")).stdout)
    assert done.returncode == 0, done.stderr
    assert "per device of 4" in done.stdout
    shares = {row["op"]: row["self_pct"] for row in as_json if row["rank"] is not None}
    assert shares == {"dot.2": pytest.approx(30.0), "all-reduce.1": pytest.approx(10.0)}  # of one device's step
    assert {row["op"]: row["calls"] for row in as_json if row["rank"] is not None} == {"dot.2": 2, "all-reduce.1": 2}


RECORDED = Path(__file__).parent / "data" / "gloo_fsdp2_rank0.json.gz"


def test_a_recorded_gloo_fsdp2_trace_counts_each_collective_once() -> None:
    """A real trace (tests/data/record_gloo_fsdp2.py): the c10d ops on the main thread and
    the gloo annotations on two worker threads overlap, so their union is less than their sum;
    the all-gather's size comes from the recorded shapes (the larger unit's 8320 floats)."""
    events = json.loads(gzip.decompress(RECORDED.read_bytes()))["traceEvents"]
    comm = [e for e in events if e.get("ph") == "X" and trace_collectives.host_kind(e["name"]) == "comm"]
    assert len({e["tid"] for e in comm}) == 3  # the main thread and gloo's two workers
    summed_ms = sum(e["dur"] for e in comm) / 2 / 1e3
    found = trace_collectives.columns(RECORDED, profile_steps=2, devices=2, step_ms=20.0)
    assert 0 < found["exposed_collective_ms"] <= found["collective_ms"] < summed_ms
    assert found["collective_ms"] > max(e["dur"] for e in comm) / 1e3 / 2  # not a single event's time
    rows = {row["op"]: row for row in ingest(RECORDED, 2, devices=2)}
    assert rows["c10d::_allgather_base_"]["calls"] == 8 and rows["c10d::_allgather_base_"]["devices"] == 2
    sizes = trace_collectives.chrome_comm_sizes(RECORDED)[("aten", "c10d::_allgather_base_")]
    assert sizes.calls == 8 and sizes.bytes == 4 * (8320 + 2064) * 4  # four all-gathers of each unit per 2 steps


def test_ops_shares_over_the_step_name_the_overlapping_threads_and_the_union() -> None:
    """A gloo rank's trace: the worker thread's gloo op and the main thread's wait both count
    their self time, so the shares pass 100%; the note points at the union (collective_ms)."""
    from tpubench.analysis import ops as ops_analysis

    rows = pd.DataFrame(
        {"source": "aten", "op": ["gloo:all_gather", "FSDP::all_gather", "aten::mm"], "self_pct": [40.0, 30.0, 50.0]}
    )
    note = ops_analysis.overlapping_threads(rows, {"collective_ms": 12.5, "collective_share": 0.41})
    assert note.startswith("the shares add up to 120% of the step") and "12.50 ms per step (41.0%" in note
    assert "counted once" not in ops_analysis.overlapping_threads(rows, {"collective_ms": None})
    assert ops_analysis.overlapping_threads(rows.iloc[1:], {}) is None  # 80%: one thread's time, as usual


def test_fsdp_wrappers_are_not_counted_as_communication() -> None:
    """FSDP2's annotations (``FSDP::all_gather (0)``) enclose the all-gather they issue: the
    ops' collective share counts the c10d/gloo ops inside, never the wrappers (docs/scaling.md),
    so it no longer reads about twice the collectives' union."""
    rows = ingest(RECORDED, 2, devices=2)
    wrappers = {row["op"]: row["category"] for row in rows if row["op"].startswith("FSDP::")}
    assert "FSDP::all_gather (0)" in wrappers and "collective" not in set(wrappers.values())
    assert wrappers["FSDP::all_gather_copy_out (0)"] == "data movement"
    assert {row["category"] for row in rows if row["op"] == "c10d::_allgather_base_"} == {"collective"}
