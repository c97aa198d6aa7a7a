"""``--on ray`` on a real local Ray cluster, inside a network namespace that has only loopback.

Ray binds this machine's interface address even when told 127.0.0.1, and no test may talk
to any address but loopback; in a namespace with only ``lo``, Ray uses 127.0.0.1. Each
scenario (tests/ray_scenarios.py) starts its own cluster with ``ray.cluster_utils.Cluster``
and stops only its own processes (``ray stop`` would stop every Ray on the machine). The
suite's node declares ``TPU: 4`` so that TPU placement is exercised: its tpu rows are then
``unavailable`` (no chip here), which is the honest answer. Needs root (``unshare -n``).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from helpers import ROOT

from tpubench import store

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="install the [ray] extra"),
    pytest.mark.skipif(os.geteuid() != 0, reason="unshare -n needs root"),
]


def test_a_suite_on_ray_gives_the_rows_a_local_run_gives(tmp_path: Path) -> None:
    """The scenario runs the same suite locally beside the Ray one, on the same host's CPU
    lock (this session's TPUBENCH_LOCK_DIR, which the cluster's actors inherit)."""
    on_ray, local = tmp_path / "ray", tmp_path / "local"
    seen = scenario("suite", on_ray)  # one suite line, on Ray and locally (ray_scenarios.py)
    assert seen["returncode"] == 0 and seen["env_returncode"] == 0, seen["output"]
    assert seen["local_returncode"] == 0, seen["local_output"]
    fleet = json.loads(seen["env"][seen["env"].index("[\n") :])
    assert len(fleet) == 1 and "TPU 4" in fleet[0]["kind"] and fleet[0]["backends"]["cpu"]["available"]

    remote_rows = store.load_runs(on_ray).set_index(["workload", "backend"]).sort_index()
    local_rows = store.load_runs(local).set_index(["workload", "backend"]).sort_index()
    assert list(remote_rows.index) == list(local_rows.index)
    assert (remote_rows.status == local_rows.status).all(), remote_rows.status
    assert remote_rows.loc[("fault-ok", "cpu"), "status"] == "ok"
    assert "SIGSEGV" in remote_rows.loc[("fault-segfault", "cpu"), "error"]
    # a declared TPU resource places the run; the node then says it has no chip
    assert remote_rows.loc[("fault-ok", "tpu"), "error"] == "no TPU chip on this host"
    # no node has a GPU: unavailable at once, never queued
    assert "no node in the Ray cluster offers" in remote_rows.loc[("fault-ok", "cuda"), "error"]
    ok = remote_rows.loc[("fault-ok", "cpu")]
    assert ok.ray_node_id and ok.median_step_ms > 0 and ok.invocation_id == remote_rows.invocation_id.iloc[0]
    # the same columns are filled as in a local run, plus where it ran
    filled = [{c for c, v in rows.loc[("fault-ok", "cpu")].items() if is_set(v)} for rows in (remote_rows, local_rows)]
    assert filled[0] - filled[1] == {"ray_node_id"} and filled[1] - filled[0] == set()
    # with the host's threads, as locally: Ray caps an actor at OMP_NUM_THREADS=1 unless told
    threads = [
        json.loads(rows.loc[("fault-ok", "cpu"), "backend_metrics"])["num_threads"]
        for rows in (remote_rows, local_rows)
    ]
    envs = [
        json.loads(rows.loc[("fault-ok", "cpu"), "env"]).get("OMP_NUM_THREADS") for rows in (remote_rows, local_rows)
    ]
    assert threads[0] == threads[1] and envs[0] == envs[1], (threads, envs)
    # a Ray actor and a local runner take the same lock, and each row's times lie inside its
    # process's hold of it: the CPU runs of both suites never overlap
    cpu = pd.concat([remote_rows, local_rows]).xs("cpu", level="backend").sort_values("started_at")
    assert len(cpu) == 4 and (cpu.started_at < cpu.finished_at).all()
    assert (cpu.started_at.iloc[1:].to_numpy() > cpu.finished_at.iloc[:-1].to_numpy()).all(), cpu[
        ["invocation_id", "started_at", "finished_at", "device_wait_s"]
    ]


def is_set(value: object) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def scenario(name: str, out: Path) -> dict:
    """One of tests/ray_scenarios.py's scenarios, in a loopback-only namespace; what it saw."""
    script = Path(__file__).with_name("ray_scenarios.py")
    inner = f"ip link set lo up && exec {shlex.quote(sys.executable)} {shlex.quote(str(script))} {name} {out}"
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "COLUMNS": "200"}
    done = subprocess.run(
        ["unshare", "-n", "bash", "-c", inner], capture_output=True, text=True, timeout=600, cwd=ROOT, env=env
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-10000:]  # a hang's stacks (finish)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_worker_phase_events_reach_the_driver_live(tmp_path: Path) -> None:
    seen = scenario("events", tmp_path / "out")
    assert seen["statuses"] == ["ok", "ok"]
    for run_id in seen["run_ids"]:
        # a run may first wait for the cpu (the other task holds it), and a phase may send
        # several step updates: the phases, in order, are what a local run shows
        phases = [p for p in seen["phases"][run_id] if p != "wait"]
        assert [p for i, p in enumerate(phases) if i == 0 or p != phases[i - 1]] == [
            "build",
            "compile",
            "warmup",
            "measure",
        ]
    assert seen["all_live"]  # every event came before its run's row


def rows_by_run(out: Path) -> dict[tuple[str, int], dict]:
    runs = store.load_runs(out)
    return {(row["workload"], int(row["batch_size"])): row for row in runs.to_dict("records")}


def test_a_dead_node_gives_a_crashed_row_and_strands_nothing(tmp_path: Path) -> None:
    """The only node with CPUs dies while a run hangs on it and another waits for it."""
    seen = scenario("node-death", tmp_path / "out")
    assert seen["returncode"] == 0, seen["output"]
    rows = rows_by_run(tmp_path / "out")
    assert rows[("fault-ok", 1)]["status"] == rows[("fault-ok", 2)]["status"] == "ok"
    lost = rows[("fault-hang", 1)]
    # the driver hears of it as its actor's loss (ActorDiedError, or ActorUnavailableError
    # before Ray's control store has marked the node dead), which the row names
    assert lost["status"] == "crashed" and lost["error"].startswith("Ray task lost: ")
    assert "Actor" in lost["error"]
    stranded = rows[("fault-hang", 2)]
    assert stranded["status"] == "unavailable" and "any more" in stranded["error"]


def test_ctrl_c_cancels_the_queue_and_keeps_what_finished(tmp_path: Path) -> None:
    seen = scenario("ctrl-c", tmp_path / "out")
    assert seen["returncode"] == 130, seen["output"]
    assert "interrupted: finished runs were saved" in seen["output"]
    assert set(rows_by_run(tmp_path / "out")) == {("fault-ok", 1), ("fault-ok", 2)}


@pytest.mark.nightly
def test_plugin_modules_and_a_users_module_reach_the_actors_from_the_driver(tmp_path: Path) -> None:
    seen = scenario("own-model", tmp_path / "out")
    runs = store.load_runs(tmp_path / "out").set_index("workload")
    assert set(runs.index) == {"gpt2-mine", "mine:make_model"}, seen["outputs"]
    assert set(runs["status"]) == {"ok"}, runs["error"].tolist()
    assert runs["ray_node_id"].notna().all()
    assert runs.loc["mine:make_model", "model_hash"] and pd.isna(runs.loc["gpt2-mine", "model_hash"])


@pytest.mark.nightly
def test_a_run_over_two_hosts_places_one_actor_per_node_and_trains_as_one_device(tmp_path: Path) -> None:
    """``--hosts 2 --devices 4 --on ray`` on two raylets: one actor per node (a STRICT_SPREAD
    placement group), two gloo ranks under each, meeting at host 0's actor; dp and fsdp give
    one device's losses (and so --devices 4 on one host's: tests/test_ranks.py), and the
    rows say hosts=2."""
    from host_workloads import job_losses, one_device_losses

    seen = scenario("hosts", tmp_path / "out")
    runs = store.load_runs(tmp_path / "out").set_index("parallel")
    assert set(runs.index) == {"dp", "fsdp"}, seen["outputs"]
    for plan in ("dp", "fsdp"):
        row = runs.loc[plan]
        assert row["status"] == "ok", (row["error"], row["stderr_tail"], seen["outputs"][plan])
        assert (row["hosts"], row["devices"]) == (2, 4) and row["host_skew_pct"] >= 0 and row["ray_node_id"]
        assert seen["nodes"][plan] == ["hostA", "hostB"]
        found = job_losses(tmp_path / f"losses-{plan}")
        assert found == pytest.approx(one_device_losses(len(found), global_batch=8), rel=1e-5), plan


@pytest.mark.nightly
def test_a_host_whose_rank_dies_on_ray_fails_the_run_and_the_row_names_it(tmp_path: Path) -> None:
    seen = scenario("hosts-fault", tmp_path / "out")
    (row,) = store.load_runs(tmp_path / "out").to_dict("records")
    assert (row["status"], row["failed_host"], row["failed_rank"]) == ("crashed", 1, 2), seen["output"]
    assert row["error"] == "host 1: rank 2 killed by SIGKILL" and row["hosts"] == 2
