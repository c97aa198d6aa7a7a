"""What ``--on ray`` costs and what it buys, on a local Ray cluster on this machine.

1. Orchestration cost: the tiny llm suite on the CPU (gpt2 and llama3, train and infer),
   run locally and with ``--on ray`` against an already started one-node cluster, both
   timed as whole commands (requirement: ray <= 1.25 x local), each started on a quiet
   host (see :func:`wait_quiet`). The cluster's start-up is timed apart; joining it, the
   actor's process and its fork server are inside the ``--on ray`` figure.
2. Scheduling throughput: a test-only workload whose build sleeps (``fault-slow``, 10 s:
   device-bound, like a run waiting on its chip), eight runs on a cluster of 1, 2 and 4
   raylets; runs per minute must grow with the nodes. Each raylet gets its own device-lock
   folder, as separate hosts would have.

Ray binds this machine's interface address, and nothing here may talk to any address
but loopback, so (as root) the script re-runs itself in a network namespace with only
``lo``, where Ray uses 127.0.0.1.

    python benchmarks/ray_overhead.py [--repeat 3] [--orchestration-only]
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
SUITE = "run --suite llm --size tiny --backend cpu --steps 10"
SLOW_RUNS = 8
#: the host counts as quiet once its CPUs are this idle over a window (Ray's raylet and GCS
#: idle at a few percent of one core)
QUIET_BUSY_PCT = 15.0
QUIET_WINDOW_S = 0.5
QUIET_MOST_S = 30.0


def wait_quiet() -> None:
    """Wait until the host's CPUs are idle.

    A finished ``--on ray`` invocation leaves work behind: Ray kills its actor, whose fork
    server goes with it, and starts fresh idle workers (each an ``import ray``). Left to
    run, that work lands in whichever command is timed next, and when that is the local
    one, Ray looks cheaper than it is. So every timed command starts on a quiet host.
    """
    import psutil

    started = time.perf_counter()
    while psutil.cpu_percent(interval=QUIET_WINDOW_S) > QUIET_BUSY_PCT:
        if time.perf_counter() - started > QUIET_MOST_S:
            print(f"  (host still busy after {QUIET_MOST_S:.0f} s; timing anyway)")
            return


def tpubench(line: str, *extra: str) -> float:
    """Seconds for one CLI invocation, started on a quiet host."""
    wait_quiet()
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "tpubench", *line.split(), *extra], check=True, cwd=ROOT, stdout=subprocess.DEVNULL
    )
    return time.perf_counter() - started


def orchestration(repeat: int) -> None:
    """``repeat`` interleaved pairs (local, then ``--on ray``): one pair's ratio moves by 0.2
    between minutes on this host, so the median of several is the figure."""
    from ray.cluster_utils import Cluster

    started = time.perf_counter()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    print(f"ray cluster start-up: {time.perf_counter() - started:.1f} s (excluded below)")
    pairs: list[tuple[float, float]] = []  # (local, --on ray) seconds
    try:
        with tempfile.TemporaryDirectory() as scratch:
            tpubench(SUITE, "--results", f"{scratch}/warm", "--on", "ray", "--ray-address", cluster.address)
            for index in range(repeat):
                local = tpubench(SUITE, "--results", f"{scratch}/local{index}")
                ray_line = ("--results", f"{scratch}/ray{index}", "--on", "ray", "--ray-address", cluster.address)
                on_ray = tpubench(SUITE, *ray_line)
                pairs.append((local, on_ray))
                print(f"tiny suite (4 runs): local {local:.1f} s, --on ray {on_ray:.1f} s, ratio {on_ray / local:.2f}")
    finally:
        cluster.shutdown()
    ratios = [on_ray / local for local, on_ray in pairs]
    local, on_ray = (statistics.median(walls) for walls in zip(*pairs, strict=True))
    print(f"median wall: local {local:.2f} s, --on ray {on_ray:.2f} s ({on_ray - local:+.2f} s)")
    print(
        f"median ratio of {repeat}: {statistics.median(ratios):.2f} (range {min(ratios):.2f}-{max(ratios):.2f}; "
        "requirement <= 1.25)"
    )


def throughput(nodes: int) -> float:
    """Runs per minute of SLOW_RUNS device-bound runs on ``nodes`` raylets."""
    from ray.cluster_utils import Cluster

    with tempfile.TemporaryDirectory() as scratch:
        cluster = Cluster()
        for node in range(nodes):
            locks = {"TPUBENCH_LOCK_DIR": f"{scratch}/locks-{node}"}
            cluster.add_node(num_cpus=1, env_vars=locks)
        cluster.wait_for_nodes()
        try:
            line = "run --workload fault-slow --backend cpu --mode infer --steps 1 --warmup 0"
            started = time.perf_counter()
            # eight runs: the same workload at eight batch sizes
            tpubench(
                line,
                "--batch-size",
                ",".join(str(b) for b in range(1, SLOW_RUNS + 1)),
                "--results",
                f"{scratch}/r",
                "--on",
                "ray",
                "--ray-address",
                cluster.address,
            )
            wall = time.perf_counter() - started
        finally:
            cluster.shutdown()
    return SLOW_RUNS / wall * 60


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="interleaved local/ray pairs")
    parser.add_argument("--orchestration-only", action="store_true", help="skip the scheduling throughput")
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)  # the re-run in the namespace
    args = parser.parse_args()  # before the re-run, so a mistyped option fails here and at once
    if not args.inside:
        if os.geteuid() != 0:
            sys.exit("needs root for a loopback-only network namespace (unshare -n)")
        arguments = " ".join(shlex.quote(argument) for argument in sys.argv[1:])
        script = f"ip link set lo up && exec {sys.executable} {Path(__file__).resolve()} --inside {arguments}"
        sys.exit(subprocess.run(["unshare", "-n", "bash", "-c", script]).returncode)
    os.environ.update(
        RAY_AUTH_MODE="disabled",
        RAY_USAGE_STATS_ENABLED="0",
        TPUBENCH_WORKLOAD_MODULES="fault_workloads",
        TPUBENCH_TEST_SLOW_S="10",
        PYTHONPATH=os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")])),
    )
    print(f"cpu count {os.cpu_count()}, load {os.getloadavg()[0]:.2f}")
    orchestration(args.repeat)
    if args.orchestration_only:
        return
    for nodes in (1, 2, 4):
        print(f"{SLOW_RUNS} device-bound runs (10 s each) on {nodes} node(s): {throughput(nodes):.1f} runs/minute")


if __name__ == "__main__":
    main()
