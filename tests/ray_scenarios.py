"""Fault scenarios of ``--on ray`` on a real local Ray cluster, for tests/test_ray.py.

Run as ``python tests/ray_scenarios.py SCENARIO OUT`` inside a network namespace that has
only loopback (Ray then binds 127.0.0.1). Each scenario starts its own cluster with
``ray.cluster_utils.Cluster`` (Ray's own multi-node-on-one-host harness: one raylet per
node, so a node can really die), drives the real CLI or the launcher, and prints one JSON
object with what it saw; the test asserts on it and on the store under OUT.

- ``suite``: a tiny suite over cpu, tpu and cuda with a crashing workload (and the same suite
  run locally beside it), then ``env --on ray``.
- ``events``: the workers' phase events reach the driver's observer while runs are live.
- ``node-death``: the only node with CPUs is killed while a run hangs on it: the hanging
  run is a ``crashed`` row, the queued one an ``unavailable`` row, finished ones stay.
- ``ctrl-c``: SIGINT to the driver while a run hangs: queued runs are cancelled, the
  finished run is kept, and the hanging worker dies.
- ``hosts``: a run over two hosts, one raylet each, in one placement group.
- ``hosts-fault``: the same, host 1's rank killed: the row names host 1.
- ``own-model``: a cluster started without the user's modules on its path or in
  ``TPUBENCH_WORKLOAD_MODULES``; the driver, in the user's folder, runs ``--workload-module``
  and ``--model MODULE:FACTORY``, which the actors must take from the driver.

Every wait is for an event (a pid file, a row in the store, a process exit), with a deadline.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from ray.cluster_utils import Cluster

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
sys.path[:0] = [str(ROOT), str(TESTS)]
from helpers import default_sigint, wait_for  # noqa: E402  (after the path that finds it)

os.environ["TPUBENCH_WORKLOAD_MODULES"] = "fault_workloads"
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS), str(ROOT), os.environ.get("PYTHONPATH")]))
DEADLINE_S = 240


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(")")[-1].split()[0] != "Z"  # a zombie has died


def cli(line: str, address: str, out: Path) -> subprocess.Popen:
    """The CLI as a driver; PYTHONFAULTHANDLER makes it dump its stacks on SIGABRT (see :func:`finish`),
    and SIGINT is its default, whatever this process inherited (:func:`helpers.default_sigint`)."""
    argv = [sys.executable, "-m", "tpubench", *line.split(), "--on", "ray", "--ray-address", address]
    return subprocess.Popen(
        [*argv, "--results", str(out)],
        cwd=ROOT,
        env={**os.environ, "PYTHONFAULTHANDLER": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=default_sigint,
    )


def finish(driver: subprocess.Popen) -> str:
    """The driver's output once it has exited. A driver still running at the deadline gets
    SIGABRT, on which it dumps every thread's stack (PYTHONFAULTHANDLER) and dies, so the
    failure says where it hung."""
    try:
        output, _ = driver.communicate(timeout=DEADLINE_S)
        return output
    except subprocess.TimeoutExpired:
        driver.send_signal(signal.SIGABRT)
        output, _ = driver.communicate(timeout=60)
        raise SystemExit(f"scenario: the driver did not exit; its output and stacks:\n{stacks_first(output)}") from None


def stacks_first(output: str) -> str:
    """A hung driver's output for a failure message: every thread's stack whole (the innermost
    frames first, which say where it waits), then the tail of what it printed before; without
    the list of extension modules the dump ends with, which says nothing and pushed the
    innermost frames out of the message."""
    before, fatal, dump = output.partition("Fatal Python error")
    dump = re.sub(r"\n\s*Extension modules:.*", "", dump, flags=re.DOTALL)
    return f"{fatal}{dump}\n--- its output before ---\n{before[-2000:]}"


def stored_rows(out: Path) -> int:
    """Rows the driver has written so far (each write is atomic, so a read never sees half of one)."""
    from tpubench import store

    return len(store.load_runs(out)) if (out / "runs").is_dir() else 0


def events(out: Path) -> dict:
    from tpubench.launchers import ray as ray_launcher
    from tpubench.runner import SuiteRunner, plan

    class Recorder:
        def __init__(self) -> None:
            self.phases: dict[str, list[str]] = {}
            self.live: list[bool] = []  # was the run still without a row when its event came?
            self.finished: set[str] = set()

        def on_start(self, index: int, total: int, spec: object) -> None: ...

        def on_event(self, spec, event: dict) -> None:
            self.phases.setdefault(spec.run_id, []).append(event["phase"])
            self.live.append(spec.run_id not in self.finished)

        def on_finish(self, spec, row: dict) -> None:
            self.finished.add(spec.run_id)

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    try:
        runner = SuiteRunner(results_dir=out)
        runner.observer = recorder = Recorder()
        specs = plan(["fault-ok"], backends=["cpu"], modes=["infer"], batch_size=[1, 2], steps=5, warmup=1)
        rows = ray_launcher.run(runner, specs, cluster.address)
    finally:
        import ray

        ray.shutdown()  # this process is the driver: leave the cluster before taking it down
        cluster.shutdown()
    return {
        "statuses": [row["status"] for row in rows],
        "run_ids": [spec.run_id for spec in specs],
        "phases": recorder.phases,
        "all_live": all(recorder.live),
    }


#: two quick runs, then two that hang: on one CPU, Ray starts them in this order (one scheduling
#: class is dispatched first in, first out), so when the first hang starts, both quick runs are
#: done and the second hang is queued
HANG_SUITE = (
    "run --workload fault-ok --workload fault-hang --backend cpu --mode infer --steps 2 --warmup 1 "
    "--batch-size 1,2 --timeout 600"
)


def hang_pidfile(out: Path) -> Path:
    """Where the hanging worker writes its pid: set before the cluster starts, since Ray's
    workers inherit their raylet's environment, not the driver's."""
    os.environ["TPUBENCH_TEST_PIDFILE"] = str(out.parent / "hang.pid")
    return out.parent / "hang.pid"


def start_hanging_suite(cluster: Cluster, out: Path, pidfile: Path) -> tuple[subprocess.Popen, int]:
    """The CLI on ``cluster``, once its first hang has started and both quick rows are stored."""
    driver = cli(HANG_SUITE, cluster.address, out)
    wait_for(lambda: pidfile.exists() and pidfile.read_text().strip() != "", "the hanging run to start", DEADLINE_S)
    wait_for(lambda: stored_rows(out) == 2, "the quick runs' rows", DEADLINE_S)
    return driver, int(pidfile.read_text())


def interrupted(
    out: Path, head_cpus: int, node_cpus: int, interrupt: Callable[[Cluster, subprocess.Popen], None]
) -> dict:
    """The hanging suite on a fresh cluster (a head with ``head_cpus``, plus a node with
    ``node_cpus`` if any, ``cluster.worker_nodes``), ``interrupt``-ed once its first hang has
    started; the driver's exit code and output, once the hanging worker has died too."""
    pidfile = hang_pidfile(out)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": head_cpus, "include_dashboard": False})
    try:
        if node_cpus:
            cluster.add_node(num_cpus=node_cpus)
            cluster.wait_for_nodes()
        driver, hung = start_hanging_suite(cluster, out, pidfile)
        interrupt(cluster, driver)
        output = finish(driver)
        wait_for(lambda: not alive(hung), "the hanging worker to die", 60)
    finally:
        cluster.shutdown()
    return {"returncode": driver.returncode, "output": output[-3000:]}


def node_death(out: Path) -> dict:
    """The head has no CPUs (it hosts only the driver); the one node that has one is killed,
    raylet and workers, while a run hangs on it."""

    def kill_the_node(cluster: Cluster, driver: subprocess.Popen) -> None:
        (node,) = cluster.worker_nodes
        cluster.remove_node(node, allow_graceful=False)

    return interrupted(out, head_cpus=0, node_cpus=1, interrupt=kill_the_node)


def ctrl_c(out: Path) -> dict:
    """SIGINT to the driver while the first hang runs and the second waits for the CPU."""
    return interrupted(
        out, head_cpus=1, node_cpus=0, interrupt=lambda cluster, driver: driver.send_signal(signal.SIGINT)
    )


def suite(out: Path) -> dict:
    """A tiny suite with a crashing workload over cpu, tpu and cuda, on one node that declares
    ``TPU: 4`` (so TPU placement is exercised; the node then says it has no chip) and no GPU;
    then ``env --on ray``. Once the cluster is up, the same suite runs locally beside the Ray
    one (results in ``local`` beside ``out``), on the same host's CPU lock. Returns the
    commands' exit codes and output."""
    line = (
        "run --workload fault-ok --workload fault-segfault --backend cpu --backend tpu --backend cuda "
        "--mode infer --steps 2 --warmup 1"
    )
    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 2, "resources": {"TPU": 4}, "include_dashboard": False}
    )
    try:
        local = subprocess.Popen(
            [sys.executable, "-m", "tpubench", *line.split(), "--results", str(out.with_name("local"))],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        run_output = finish(driver := cli(line, cluster.address, out))
        local_output = finish(local)
        env = subprocess.run(
            [sys.executable, "-m", "tpubench", "env", "--on", "ray", "--ray-address", cluster.address, "--json"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=DEADLINE_S,
        )
    finally:
        cluster.shutdown()
    return {
        "returncode": driver.returncode,
        "output": run_output[-3000:],
        "env_returncode": env.returncode,
        "env": env.stdout,
        "local_returncode": local.returncode,
        "local_output": local_output[-3000:],
    }


OWN_MODEL = """
import dataclasses

import torch
from torch import nn

from workloads.llm import gpt2

WORKLOAD = dataclasses.replace(gpt2.WORKLOAD, name="gpt2-mine")


def make_model():
    return nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 4))


def make_inputs(batch_size, generator, **dims):
    return (torch.randn(batch_size, 16, generator=generator),)
"""


def own_model(out: Path) -> dict:
    """Plugin modules and a user's module reach the actors from the driver, not from the nodes."""
    user = out.parent / "user"
    user.mkdir(parents=True, exist_ok=True)
    (user / "mine.py").write_text(OWN_MODEL)
    os.environ.pop("TPUBENCH_WORKLOAD_MODULES", None)  # the cluster's nodes know neither
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    quick = ["--backend", "cpu", "--mode", "infer", "--steps", "2", "--warmup", "1", "--results", str(out)]
    outputs = []
    try:
        for chosen in (["--workload-module", "mine", "--workload", "gpt2-mine"], ["--model", "mine:make_model"]):
            extra = ["--inputs", "mine:make_inputs"] if "--model" in chosen else []
            argv = [sys.executable, "-m", "tpubench", "run", *chosen, *extra, *quick, "--on", "ray"]
            driver = subprocess.Popen(
                [*argv, "--ray-address", cluster.address],
                cwd=user,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                preexec_fn=default_sigint,
            )
            outputs.append(finish(driver)[-3000:])
    finally:
        cluster.shutdown()
    return {"outputs": outputs}


def hosts(out: Path) -> dict:
    """Two raylets on this machine, each with a custom resource of its own (``hostA``,
    ``hostB``) and its own device-lock folder (two machines would have one each); the CLI
    runs ``gpt2-losses`` over ``--hosts 2 --devices 4`` (two gloo ranks per host) for dp,
    then fsdp. The ranks record their losses under OUT/losses-<plan>; the raylets' workers
    inherit that folder from their raylet, so it is set before the cluster starts."""
    os.environ["TPUBENCH_WORKLOAD_MODULES"] = "fault_workloads,host_workloads"
    outputs, nodes = {}, {}
    for plan in ("dp", "fsdp"):
        losses = out.parent / f"losses-{plan}"
        losses.mkdir(parents=True, exist_ok=True)
        os.environ["TPUBENCH_TEST_LOSSES"] = str(losses)
        locks = {name: out.parent / f"locks-{plan}-{name}" for name in ("hostA", "hostB")}
        os.environ["TPUBENCH_LOCK_DIR"] = str(locks["hostA"])
        head = {"num_cpus": 2, "resources": {"hostA": 1}, "include_dashboard": False}
        cluster = Cluster(initialize_head=True, head_node_args=head)
        try:
            os.environ["TPUBENCH_LOCK_DIR"] = str(locks["hostB"])
            cluster.add_node(num_cpus=2, resources={"hostB": 1})
            cluster.wait_for_nodes()
            line = (
                "run --workload gpt2-losses --size tiny --backend cpu --mode train --batch-size 2 --seq-len 32 "
                f"--warmup 1 --steps 2 --hosts 2 --devices 4 --parallel {plan} --timeout 400"
            )
            outputs[plan] = finish(cli(line, cluster.address, out))[-3000:]
        finally:
            cluster.shutdown()
        # each host took its device lock in its own node's folder: the hosts ran on both nodes
        nodes[plan] = sorted(name for name, folder in locks.items() if folder.is_dir() and any(folder.iterdir()))
    return {"outputs": outputs, "nodes": nodes}


def hosts_fault(out: Path) -> dict:
    """Two raylets as in :func:`hosts`; host 1's first rank is SIGKILLed in its second step."""
    os.environ["TPUBENCH_WORKLOAD_MODULES"] = "fault_workloads,host_workloads"
    os.environ["TPUBENCH_LOCK_DIR"] = str(out.parent / "locks-a")
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    try:
        os.environ["TPUBENCH_LOCK_DIR"] = str(out.parent / "locks-b")
        cluster.add_node(num_cpus=2)
        cluster.wait_for_nodes()
        line = (
            "run --workload fault-host1-killed --size tiny --backend cpu --mode train --batch-size 2 --seq-len 32 "
            "--warmup 1 --steps 2 --hosts 2 --devices 4 --parallel dp --timeout 400"
        )
        output = finish(cli(line, cluster.address, out))[-3000:]
    finally:
        cluster.shutdown()
    return {"output": output}


SCENARIOS = {
    "suite": suite,
    "events": events,
    "node-death": node_death,
    "ctrl-c": ctrl_c,
    "own-model": own_model,
    "hosts": hosts,
    "hosts-fault": hosts_fault,
}

if __name__ == "__main__":
    scenario, out = sys.argv[1], Path(sys.argv[2])
    print(json.dumps(SCENARIOS[scenario](out)))
