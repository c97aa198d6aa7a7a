"""TorchTPU's launch environment (tpubench.parallel.torchtpu_env) against TorchTPU's own code.

Fake host lists and job indexes (``TPU_WORKER_HOSTNAMES``, ``JOB_COMPLETION_INDEX``) go
to the real ``set_tpu_launch_env`` of the installed torch_tpu, in a child process
(tests/torchtpu_rules.py: importing torch_tpu costs about 15 s), and to tpubench's pure
functions; both must decide the same variables. No chip is opened: the multi-host path
reads only the environment, and the single-host one (nightly) fakes the PCI scan.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tpubench.launch.ranks import free_port
from tpubench.parallel import torchtpu_env
from tpubench.parallel.torchtpu_env import LaunchEnvError, launch_env

RULES = Path(__file__).resolve().parent / "torchtpu_rules.py"
needs_torch_tpu = pytest.mark.skipif(importlib.util.find_spec("torch_tpu") is None, reason="torch_tpu not installed")

TOPOLOGIES = ["2,2,1", "4,4,1", "4x4x4", "8,4,2", "2,2,1,2"]
#: (coords, slice topology, JOB_COMPLETION_INDEX) -> NODE_RANK
NODE_RANKS = [
    [[0, 0, 0], "4,4,1", None],
    [[2, 0, 0], "4,4,1", None],
    [[0, 2, 0], "4,4,1", None],
    [[3, 3, 0], "4,4,1", "0"],
    [[2, 2, 3], "4x4x4", None],
    [[9, 9, 0], "4,4,1", "5"],
    [[9, 9, 0], "4,4,1", None],
    [None, "4,4,1", "3"],
    [None, None, None],
]


def torchtpu(env: dict[str, str], cases: dict) -> dict:
    """What the installed torch_tpu decides in ``env`` (plus this one, minus TPU variables)."""
    clean = {key: value for key, value in os.environ.items() if not key.startswith(("TPU_", "TORCH_TPU_", "JOB_"))}
    for key in ("NNODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT"):
        clean.pop(key, None)
    clean |= {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "TPU_SKIP_MDS_QUERY": "1", **env}
    done = subprocess.run(
        [sys.executable, str(RULES), json.dumps(cases)], env=clean, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def ours(env: dict[str, str], nproc: int, **given) -> dict:
    try:
        return {"env": launch_env(env, nproc, session_id=lambda: "session", pick_port=free_port, **given)}
    except LaunchEnvError as error:
        return {"error": str(error)}


def without_session(found: dict) -> dict:
    return {key: value for key, value in found.get("env", {}).items() if key != "TORCH_TPU_XPROF_SESSION_ID"}


@needs_torch_tpu
def test_a_job_of_four_hosts_by_completion_index_matches_torch_tpu() -> None:
    """Kubernetes' indexed job on four hosts of four chips: every rank's address, the host
    count, this host's rank, the master; and the slice's host order and node ranks by chip
    coordinates, case by case."""
    env = {"TPU_WORKER_HOSTNAMES": "h0,h1,h2,h3", "JOB_COMPLETION_INDEX": "2"}
    real = torchtpu(env, {"nproc_per_node": 4, "topologies": TOPOLOGIES, "node_ranks": NODE_RANKS})
    mine = ours(env, 4)
    assert without_session(mine) == without_session(real["launch"])
    assert mine["env"]["NODE_RANK"] == "2" and mine["env"]["TORCH_TPU_SLICEBUILDER_ADDRESSES"].count(",") == 15
    assert "TORCH_TPU_XPROF_SESSION_ID" in real["launch"]["env"]
    for topology in TOPOLOGIES:
        assert [list(host) for host in torchtpu_env.host_coordinates(topology)] == real["hosts"][topology]
    for case, expected in zip(NODE_RANKS, real["node_ranks"], strict=True):
        try:
            found = torchtpu_env.node_rank(*case)
        except LaunchEnvError:
            found = "error"
        assert found == expected, case


def test_variables_already_set_are_kept_and_contradictions_are_errors() -> None:
    env = {
        "TPU_WORKER_HOSTNAMES": "a,b",
        "JOB_COMPLETION_INDEX": "1",
        "MASTER_PORT": "1234",
        "TORCH_TPU_BASE_PORT": "9000",
    }
    found = launch_env(env, 2, session_id=lambda: "s", pick_port=free_port)
    assert found == {
        "TORCH_TPU_XPROF_SESSION_ID": "s",
        "TORCH_TPU_SLICEBUILDER_ADDRESSES": "a:9000,a:9001,b:9000,b:9001",
        "NNODES": "2",
        "NODE_RANK": "1",
        "MASTER_ADDR": "a",
    }
    with pytest.raises(LaunchEnvError, match="nnodes is 3, but TPU_WORKER_HOSTNAMES names 2 hosts"):
        launch_env(env, 2, nnodes=3, pick_port=free_port)
    with pytest.raises(LaunchEnvError, match="no NODE_RANK"):
        launch_env({"TPU_WORKER_HOSTNAMES": "a,b"}, 2, pick_port=free_port)
    with pytest.raises(LaunchEnvError, match="TPU_WORKER_HOSTNAMES must list"):
        launch_env({"JOB_COMPLETION_INDEX": "0"}, 2, pick_port=free_port)


def test_one_host_gets_free_local_ports_and_its_generations_topology() -> None:
    ports = iter(range(5000, 5100))
    found = launch_env({}, 4, chip="TPU v6e", host_devices=8, pick_port=lambda: next(ports), session_id=lambda: "s")
    assert found["TORCH_TPU_SLICEBUILDER_ADDRESSES"] == "localhost:5000,localhost:5001,localhost:5002,localhost:5003"
    assert found["TORCH_TPU_TOPOLOGY"] == "2,2,1" and "NODE_RANK" not in found
    with pytest.raises(LaunchEnvError, match="no TPU v6e topology of 2 devices; valid: 1, 4, 8"):
        launch_env({}, 2, chip="TPU v6e", host_devices=8, pick_port=free_port)
    with pytest.raises(LaunchEnvError, match="no TPU chip"):
        launch_env({}, 2, pick_port=free_port)


@needs_torch_tpu
@pytest.mark.nightly
@pytest.mark.parametrize(
    ("env", "nproc", "chip", "devices"),
    [
        ({}, 4, "TPU v6e", 8),  # one host, half its chips
        ({}, 2, "TPU v4", 8),
        ({"TPU_WORKER_HOSTNAMES": "solo"}, 8, "TPU v6e", 8),  # one name is one host (the variable is ambient)
        ({"TPU_WORKER_HOSTNAMES": "a,b", "TORCH_TPU_DEVICES_PER_HOST": "2"}, 4, None, 0),  # no NODE_RANK: error
        ({"TPU_WORKER_HOSTNAMES": "a,b", "JOB_COMPLETION_INDEX": "1", "TORCH_TPU_BASE_PORT": "9000"}, 4, None, 0),
    ],
)
def test_more_scenarios_match_torch_tpu(env: dict[str, str], nproc: int, chip: str | None, devices: int) -> None:
    cases = {"nproc_per_node": nproc, **({"single_host_chip": {"chip": chip, "devices": devices}} if chip else {})}
    real = torchtpu(env, cases)["launch"]
    mine = ours(env, nproc, chip=chip, host_devices=devices)
    assert ("error" in mine) == ("error" in real), (mine, real)
    if "error" in real:
        return
    local = [key for key, value in real["env"].items() if value.startswith("localhost:")]
    for found in (mine, real):  # free ports differ from run to run: their number and form must not
        for key in local:
            found["env"][key] = ",".join(address.split(":")[0] for address in found["env"][key].split(","))
    assert without_session(mine) == without_session(real)


def hosts_case(env: dict[str, str], nproc: int) -> dict:
    """What tpubench gives one host's ranks of a run over the hosts ``env`` describes: the
    host's index and host 0 as tpubench.parallel.hosts finds them, then
    torchtpu_env.hosts_launch_env (what tpubench.launch.ranks passes to the ranks)."""
    from tpubench.parallel import hosts

    place = hosts.place(2, None, None, env)
    master = hosts.parse_master(place.master)
    found = torchtpu_env.hosts_launch_env(
        env, nproc, hosts=2, node_rank=place.node_rank, master=master, pick_port=free_port, session_id=lambda: "s"
    )
    return {key: value for key, value in found.items() if key != "TORCH_TPU_XPROF_SESSION_ID"}


@needs_torch_tpu
@pytest.mark.parametrize(
    "host",
    [pytest.param(0, marks=pytest.mark.nightly), 1],
)
def test_a_simulated_two_host_slice_gets_torch_tpus_own_launch_environment(host: int) -> None:
    """A TPU VM slice of two hosts (``TPU_WORKER_HOSTNAMES`` with two names, ``TPU_WORKER_ID``
    0 or 1): tpubench's variables for the host's two ranks are those the installed torch_tpu's
    ``set_tpu_launch_env`` computes there. TorchTPU derives ``NODE_RANK`` from chip coordinates
    or ``JOB_COMPLETION_INDEX``, never ``TPU_WORKER_ID``: tpubench hands it the index it found,
    as a variable already set, which ``set_tpu_launch_env`` keeps."""
    env = {"TPU_WORKER_HOSTNAMES": "t1k-w0,t1k-w1", "TPU_WORKER_ID": str(host)}
    mine = hosts_case(env, 2)
    real = torchtpu({**env, "NODE_RANK": str(host)}, {"nproc_per_node": 2})["launch"]
    assert "error" not in real, real
    expected = {"NODE_RANK": str(host)} | without_session(real)
    assert mine == expected
    assert mine["MASTER_ADDR"] == "t1k-w0" and mine["MASTER_PORT"] == "29500" and mine["NNODES"] == "2"
    assert mine["TORCH_TPU_SLICEBUILDER_ADDRESSES"] == "t1k-w0:8070,t1k-w0:8071,t1k-w1:8070,t1k-w1:8071"


@needs_torch_tpu
@pytest.mark.nightly
def test_an_indexed_job_of_two_hosts_gets_torch_tpus_own_launch_environment() -> None:
    """Kubernetes' index instead: here TorchTPU derives NODE_RANK itself, and agrees."""
    env = {"TPU_WORKER_HOSTNAMES": "pod-0.svc,pod-1.svc", "JOB_COMPLETION_INDEX": "1"}
    real = torchtpu(env, {"nproc_per_node": 4})["launch"]
    assert hosts_case(env, 4) == without_session(real)


def test_hosts_without_tpu_worker_hostnames_list_the_joined_hosts() -> None:
    """Ray or Slurm on TPU hosts: the slice's host names come from the rendezvous."""
    found = torchtpu_env.hosts_launch_env(
        {}, 1, hosts=2, node_rank=1, master=("10.0.0.5", 4000), addresses=["10.0.0.5", "10.0.0.6"],
        pick_port=free_port, session_id=lambda: "run-id",
    )  # fmt: skip
    assert found == {
        "NNODES": "2",
        "NODE_RANK": "1",
        "MASTER_ADDR": "10.0.0.5",
        "MASTER_PORT": "4000",
        "TPU_WORKER_HOSTNAMES": "10.0.0.5,10.0.0.6",
        "TORCH_TPU_XPROF_SESSION_ID": "run-id",
        "TORCH_TPU_SLICEBUILDER_ADDRESSES": "10.0.0.5:8070,10.0.0.6:8070",
    }
