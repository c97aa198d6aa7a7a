"""Memory by part and energy per step: what a run's row and memory table say, checked against
figures known exactly.

A user's MLP of P float32 parameters trained with AdamW holds 4P bytes of weights, 4P of
gradients and 8P of optimizer state (two moments; AdamW's ``step`` counters are host
tensors, so they count on a CPU run only). Real CLI runs in real worker processes, real
parquet; the XLA run is torch_xla on the PJRT CPU device; the FSDP run is two gloo ranks on
127.0.0.1. No GPU exists here, so NVML is not exercised (benchmarks/gpu_check.py does on a
GPU); the RAPL reader is checked on a powercap tree laid out as the kernel lays it out,
because this machine has none.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from helpers import ROOT

from tpubench import energy, store
from tpubench.analysis import changepoints, compare
from tpubench.analysis import memory as analysis

MLP = """
import torch
from torch import nn


def make_model():
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 11))


def make_inputs(batch_size, generator, **dims):
    return (torch.randn(batch_size, 16, generator=generator),)
"""
#: the MLP's parameters: 16 x 64 + 64, then 64 x 11 + 11, in four tensors
P, TENSORS = 16 * 64 + 64 + 64 * 11 + 11, 4
QUICK = "--mode train --steps 2 --warmup 1 --batch-size 4"


def cli(line: str, folder: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """The real CLI in ``folder``, where the user's ``mlp.py`` lives."""
    return subprocess.run(
        [sys.executable, "-m", "tpubench", *line.split()],
        capture_output=True,
        text=True,
        cwd=folder,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        timeout=600,
    )


@pytest.fixture
def user(tmp_path: Path) -> Path:
    (tmp_path / "mlp.py").write_text(MLP)
    return tmp_path


def one_run(results: Path) -> tuple[dict, pd.DataFrame]:
    [row] = store.load_runs(results).to_dict("records")
    assert row["status"] == "ok", (row["error"], row["stderr_tail"])
    return row, store.load_memory(results, run_id=row["run_id"])


def test_cpu_counts_weights_gradients_and_adamw_state_exactly_and_the_profiler_agrees(user: Path) -> None:
    found = cli(f"run --model mlp.py:make_model --inputs mlp.py:make_inputs --backend cpu {QUICK} "
                "--profile-memory --results r", user)  # fmt: skip
    assert found.returncode == 0, found.stderr
    row, memory = one_run(user / "r")
    assert (row["mem_weights_bytes"], row["mem_grads_bytes"]) == (4 * P, 4 * P)
    assert row["mem_optimizer_bytes"] == 8 * P + 4 * TENSORS  # exp_avg, exp_avg_sq, a float32 step each
    above = row["peak_mem_bytes"] - row["baseline_mem_bytes"]
    assert row["mem_activations_bytes"] == above - 16 * P - 4 * TENSORS  # the measured peak's rest
    assert row["memory_breakdown_source"] == "counted"
    ranks = analysis.per_rank(memory)
    assert ranks[["weights", "gradients", "peak"]].iloc[0].tolist() == [4 * P, 4 * P, row["peak_mem_bytes"]]
    agreement = analysis.profiler_agreement(row, memory).set_index("part")["ratio"]
    assert agreement.between(0.95, 1.05).all(), agreement  # torch.profiler's categories, one step
    assert set(analysis.timeline(memory).columns) >= {"t_ms", "parameter", "gradient", "optimizer_state"}
    shown = cli(f"memory {row['run_id'][:8]} --results r", user)
    assert shown.returncode == 0, shown.stderr
    assert "optimizer state" in shown.stdout and "profiler / counted" in shown.stdout
    if not energy.rapl_zones():  # this machine: no readable powercap, so no energy figure
        assert row["energy_source"] == "none"
        assert all(pd.isna(row[c]) for c in ("energy_j", "joules_per_token", "joules_per_sample", "avg_power_w"))


@pytest.mark.nightly  # the same parts as the cpu test above, on XLA's device: 66 s on the 2-core CI host
def test_xla_counts_the_same_parts_on_the_device(user: Path, xla_python: str) -> None:
    """On torch_xla the step counters stay on the host: optimizer state is the moments alone."""
    found = cli(f"run --model mlp.py:make_model --inputs mlp.py:make_inputs --backend xla --python xla={xla_python} "
                f"{QUICK} --results r", user)  # fmt: skip
    assert found.returncode == 0, found.stderr
    row, _ = one_run(user / "r")
    assert (row["mem_weights_bytes"], row["mem_grads_bytes"], row["mem_optimizer_bytes"]) == (4 * P, 4 * P, 8 * P)
    assert row["memory_breakdown_source"] == "counted" and row["energy_source"] == "none"


@pytest.mark.nightly
def test_xla_spmd_counts_each_devices_shard_and_leaves_only_activations_unknown(user: Path, xla_python: str) -> None:
    """torch_xla gives no per-device memory under SPMD: the parts are the shards' sizes. fsdp
    splits dim 0 where the degree divides it (64 rows) and replicates the rest (11 rows)."""
    found = cli(f"run --model mlp.py:make_model --inputs mlp.py:make_inputs --backend xla --python xla={xla_python} "
                f"{QUICK} --devices 2 --parallel fsdp --results r", user)  # fmt: skip
    assert found.returncode == 0, found.stderr
    row, _ = one_run(user / "r")
    per_device = 4 * (32 * 16 + 32 + 11 * 64 + 11)
    assert (row["mem_weights_bytes"], row["mem_grads_bytes"]) == (per_device, per_device)
    assert row["mem_optimizer_bytes"] == 2 * per_device
    assert row["memory_breakdown_source"] == "counted_shards"
    assert pd.isna(row["mem_activations_bytes"]) and pd.isna(row["peak_mem_bytes"])


def test_fsdp_over_two_gloo_ranks_holds_half_on_each(user: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    found = cli(f"run --model mlp.py:make_model --inputs mlp.py:make_inputs --backend cpu {QUICK} --devices 2 "
                "--parallel fsdp --profile-memory --results r", user, {"GLOO_SOCKET_IFNAME": "lo"})  # fmt: skip
    assert found.returncode == 0, found.stderr
    row, memory = one_run(user / "r")
    ranks = analysis.per_rank(memory).set_index("rank")
    assert list(ranks.index) == [0, 1]
    row_bytes = 4 * (16 + 1 + 64 + 1)  # one dim-0 row of each tensor: FSDP2 pads an uneven split
    for part, whole in (("weights", 4 * P), ("gradients", 4 * P), ("optimizer", 8 * P)):
        for rank in (0, 1):
            held = ranks.loc[rank, part] - (4 * TENSORS if part == "optimizer" else 0)
            assert abs(held - whole / 2) <= row_bytes * (2 if part == "optimizer" else 1), (part, rank, held)
    fullest = ranks["peak"].idxmax()
    assert row["mem_weights_bytes"] == ranks.loc[fullest, "weights"]  # the row: the rank that decides the fit
    assert analysis.breakdown_rank(memory) == fullest
    fsdp_profiled_step_names_its_rank_and_its_optimizer_state(user, row, memory, monkeypatch)


def fsdp_profiled_step_names_its_rank_and_its_optimizer_state(
    user: Path, row: dict, memory: pd.DataFrame, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--profile-memory on FSDP (the run above): each rank's optimizer state is a category of
    its own, equal to that rank's counted state (the profiler cannot see through DTensor,
    and called it unknown, so the step had none); the weights read above the shard by
    design (FSDP's all-gathered copies), said so, with no claim of agreement; the memory
    command, its JSON and Run details name the rank they show."""
    ranks = analysis.per_rank(memory).set_index("rank")
    for rank in (0, 1):
        agreement = analysis.profiler_agreement(row, memory, rank).set_index("part")
        assert agreement.loc["optimizer", "counted"] == ranks.loc[rank, "optimizer"]  # this rank's, not the row's
        assert agreement.loc["optimizer", "ratio"] == 1.0
        assert agreement.loc["weights", "ratio"] > 2  # the shard, the all-gather buffer, the unsharded copies
    shown = cli(f"memory {row['run_id']} --results r", user)
    assert shown.returncode == 0, shown.stderr
    assert "one profiled step of rank 0" in shown.stdout and "profiler / counted, rank 0:" in shown.stdout
    assert "optimizer 1.000x" in shown.stdout and "all-gathers" in shown.stdout and "within" not in shown.stdout
    said = json.loads(cli(f"memory {row['run_id']} --json --results r", user).stdout)
    assert said["breakdown_rank"] == int(ranks["peak"].idxmax()) and set(said["profiler_agreement"]) == {"0", "1"}
    assert "all-gathers" in said["profiler_note"]
    from streamlit.testing.v1 import AppTest

    from dashboard import RESULTS_ENV, catalog

    monkeypatch.setenv(RESULTS_ENV, str(user / "r"))
    details = AppTest.from_file(str(ROOT / "dashboard" / "app.py"), default_timeout=120)
    details.switch_page(catalog.BY_TITLE["Run details"].path)
    details.query_params.update(run=row["run_id"])
    details.run()
    assert not details.exception, details.exception[0].value
    titles = [json.loads(chart.proto.spec)["layout"]["title"]["text"] for chart in details.get("plotly_chart")]
    assert "One profiled step by category (MiB), rank 0" in titles
    captions = "\n".join(str(caption.value) for caption in details.get("caption"))
    assert "Profiler / counted, rank 0:" in captions and "optimizer 1.000x" in captions


def test_profile_memory_on_a_backend_without_allocator_events_is_refused_before_anything_runs(user: Path) -> None:
    found = cli("run --model mlp.py:make_model --inputs mlp.py:make_inputs --backend xla --profile-memory "
                "--results r", user)  # fmt: skip
    assert found.returncode == 2 and found.stderr.count("\n") == 1, found.stderr
    assert found.stderr.startswith("error: --profile-memory works on backends cpu, cuda only, not xla")
    assert not (user / "r").exists()


def powercap(root: Path, zone: str, energy_uj: int, max_uj: int, name: str = "package-0") -> Path:
    """A RAPL zone as Linux lays it out under /sys/class/powercap."""
    folder = root / zone
    folder.mkdir(parents=True)
    (folder / "energy_uj").write_text(f"{energy_uj}\n")
    (folder / "max_energy_range_uj").write_text(f"{max_uj}\n")
    (folder / "name").write_text(f"{name}\n")
    return folder


def test_rapl_packages_are_summed_and_a_wrapped_counter_unwrapped(tmp_path: Path) -> None:
    max_uj = 262_143_328_850
    zero = powercap(tmp_path, "intel-rapl:0", max_uj - 1_000_000, max_uj)  # 1 J before its wrap
    one = powercap(tmp_path, "intel-rapl:1", 5_000_000, max_uj, "package-1")
    powercap(tmp_path, "intel-rapl:0:0", 7, max_uj, "core")  # a subzone: part of package 0
    powercap(tmp_path, "intel-rapl-mmio:0", 9, max_uj)  # the same package through MMIO
    meter, why_not = energy.meter_for("cpu", rapl_root=str(tmp_path))
    assert why_not == "" and isinstance(meter, energy.RaplMeter)
    assert [zone.name for zone in meter.zones] == ["intel-rapl:0:package-0", "intel-rapl:1:package-1"]
    start = meter.joules()
    (zero / "energy_uj").write_text("2000000\n")  # wrapped: 1 J to the top, then 2 J
    (one / "energy_uj").write_text("9000000\n")  # 4 J
    assert meter.joules() - start == pytest.approx(7.0)
    (zero / "energy_uj").write_text("2500000\n")
    assert meter.joules() - start == pytest.approx(7.5)
    reading = energy.Reading(joules=7.5, seconds=2.5, steps=10, source=energy.RAPL)
    columns = energy.columns(reading, tokens_per_step=64, samples_per_step=4)
    assert columns["energy_j"] == pytest.approx(0.75) and columns["avg_power_w"] == pytest.approx(3.0)
    assert columns["joules_per_token"] == pytest.approx(0.75 / 64) and columns["energy_source"] == "rapl"


def test_unreadable_or_absent_counters_give_no_energy(tmp_path: Path) -> None:
    zone = powercap(tmp_path, "intel-rapl:0", 1, 10)
    zone.joinpath("energy_uj").chmod(0)  # root-only since Linux 5.10
    if os.access(zone / "energy_uj", os.R_OK):  # root reads it anyway
        zone.joinpath("energy_uj").unlink()
    assert energy.meter_for("cpu", rapl_root=str(tmp_path)) == (None, "")
    assert energy.meter_for("xla") == (None, "") and energy.meter_for("tpu") == (None, "")
    assert energy.columns(None, 64, 4) == {"energy_source": "none"}
    assert energy.uj_delta(10, 3, 10) == 3 and energy.uj_delta(3, 10, 10) == 7


def test_compare_takes_the_memory_parts_and_energy_per_token_as_metrics() -> None:
    names = {m.name: m.column for m in compare.METRICS}
    for column in (
        "mem_weights_bytes",
        "mem_grads_bytes",
        "mem_optimizer_bytes",
        "mem_activations_bytes",
        "joules_per_token",
    ):
        assert column in names.values()
        assert column in changepoints.LOWER_IS_BETTER  # regressions --metric: a rise is the regression


def test_a_store_from_before_the_breakdown_loads_with_its_columns_null(tmp_path: Path) -> None:
    old = [f for f in store.TABLES["runs"] if not f.name.startswith(("mem_", "memory_", "energy_", "joules_"))]
    old = [f for f in old if f.name != "avg_power_w"]
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = tmp_path / "runs" / "date=2026-01-01"
    folder.mkdir(parents=True)
    pq.write_table(
        pa.Table.from_pylist([{"run_id": "old", "status": "ok"}], schema=pa.schema(old)), folder / "a.parquet"
    )
    runs = store.load_runs(tmp_path)
    assert runs["mem_weights_bytes"].isna().all() and runs["energy_source"].isna().all()
    assert store.load_memory(tmp_path).empty
    assert analysis.stacked(runs).empty


def stored_breakdowns(results: Path) -> str:
    """Two stored runs of one configuration on two backends with their breakdowns, the first
    with a profiled step (the read side's input: rows written by the store's own writer)."""
    from multi_device_rows import START, run_row

    writer = store.InvocationWriter(results, "inv-memory", START)
    parts = {"mem_weights_bytes": 4 * 2**20, "mem_grads_bytes": 4 * 2**20, "mem_optimizer_bytes": 8 * 2**20}
    first = run_row(**parts, mem_activations_bytes=2**20, memory_breakdown_source="counted", backend="cpu",
                    invocation_id="inv-memory", peak_mem_bytes=2**30, baseline_mem_bytes=2**30 - 17 * 2**20,
                    estimated_mem_bytes=20 * 2**20, energy_source="none")  # fmt: skip
    breakdown = [
        {"kind": "breakdown", "category": name, "bytes": value, "source": "counted"}
        for name, value in (("weights", 4 * 2**20), ("gradients", 4 * 2**20), ("optimizer", 8 * 2**20))
    ]
    timeline = [
        {"kind": "timeline", "t_us": float(t), "category": category, "bytes": value}
        for t, held in enumerate(((4, 8, 0), (4, 8, 4), (4, 8, 0)))
        for category, value in zip(("parameter", "optimizer_state", "gradient"), held, strict=True)
    ]
    writer.add(
        first, memory=[{"run_id": first["run_id"], "invocation_id": "inv-memory", **r} for r in breakdown + timeline]
    )
    second = run_row(**parts, memory_breakdown_source="counted_shards", backend="xla", invocation_id="inv-memory")
    writer.add(second)
    return first["run_id"]


def test_the_dashboard_stacks_each_runs_parts_and_draws_the_profiled_step(tmp_path: Path, monkeypatch) -> None:
    from streamlit.testing.v1 import AppTest

    from dashboard import RESULTS_ENV, catalog

    run_id = stored_breakdowns(tmp_path)
    monkeypatch.setenv(RESULTS_ENV, str(tmp_path))
    overview = AppTest.from_file(str(ROOT / "dashboard" / "app.py"), default_timeout=120)
    overview.run()
    assert not overview.exception, overview.exception[0].value
    titles = [json.loads(chart.proto.spec)["layout"]["title"]["text"] for chart in overview.get("plotly_chart")]
    assert "Memory by part (GiB per device)" in titles
    details = AppTest.from_file(str(ROOT / "dashboard" / "app.py"), default_timeout=120)
    details.switch_page(catalog.BY_TITLE["Run details"].path)
    details.query_params.update(run=run_id)
    details.run()
    assert not details.exception, details.exception[0].value
    titles = [json.loads(chart.proto.spec)["layout"]["title"]["text"] for chart in details.get("plotly_chart")]
    assert "One profiled step by category (MiB)" in titles and "Memory by part (GiB), estimate marked" in titles
    measured = {
        row["field"]: row["value"] for df in (e.value for e in details.dataframe) for row in df.to_dict("records")
    }
    assert measured["mem_optimizer_bytes"] == "8.0 MiB" and measured["energy_source"] == "none"


def test_energy_per_token_stands_beside_price_only_when_both_sides_measured_it() -> None:
    from test_compare import runs_frame

    from tpubench.analysis import prices

    gpu = runs_frame([{"run_id": "g", "backend": "cuda", "device": "NVIDIA H100 80GB HBM3", "median_step_ms": 10.0,
                       "tokens_per_s": 1e3, "energy_source": "nvml_counter", "joules_per_token": 0.002}])  # fmt: skip
    cpu = runs_frame([{"run_id": "c", "backend": "cpu", "median_step_ms": 20.0, "tokens_per_s": 500.0,
                       "energy_source": "rapl", "joules_per_token": 0.01}])  # fmt: skip
    tpu = runs_frame([{"run_id": "t", "backend": "xla", "device": "TPU v5 lite", "median_step_ms": 20.0,
                       "tokens_per_s": 500.0, "energy_source": "none"}])  # fmt: skip
    both = compare.cross_backend(gpu, cpu, prices.PRICES).iloc[0]
    assert (both["base_joules_per_token"], both["test_joules_per_token"]) == (0.002, 0.01)
    one = compare.cross_backend(gpu, tpu, prices.PRICES).iloc[0]
    assert pd.isna(one["base_joules_per_token"]) and pd.isna(one["test_joules_per_token"])
