"""The fixed cost of a run: wall time of a tiny CPU suite against the time spent inside its workers.

Isolation gives every run its own process; this script measures what that costs.

1. ``tpubench run --suite llm --size tiny --backend cpu`` as a user types it, ``--repeat``
   times: the command's wall time, the sum of its rows' ``worker_wall_s`` (time inside
   the workers, from the first build to the result), and their ratio
   (requirement <= 2.0 on the median, goal 1.1: printed ``met`` or ``NOT MET``, the script
   exiting 1 when it is missed).
2. The start-up cost of one worker, interleaved: a probe request answered by a worker forked
   from the zygote against one answered by a fresh ``python -m tpubench.launch.serve``.

``--record DIR`` stores each invocation's ratio and each worker start's seconds as rows of a
tpubench store (:mod:`benchmarks.record`: workload ``tpubench-self/run_overhead``).

    python benchmarks/run_overhead.py [--repeat 3] [--starts 10] [--record DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")  # like the CLI's parent
ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

import record  # noqa: E402

from tpubench import store  # noqa: E402
from tpubench.backends.base import DEFAULT_WORKER_ENV  # noqa: E402
from tpubench.launch.process import run_worker, worker_env  # noqa: E402

COMMAND = "run --suite llm --size tiny --backend cpu"


def suite_ratio(results: Path) -> tuple[float, float, int]:
    """(wall s, sum of worker_wall_s, runs) of one suite invocation into ``results``."""
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "tpubench", *COMMAND.split(), "--results", str(results)],
        check=True,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
    )
    wall = time.perf_counter() - started
    runs = store.load_runs(results)
    return wall, float(runs.worker_wall_s.sum()), len(runs)


def start_cost(fork: bool) -> float:
    """Seconds for a worker to start, answer a probe of the cpu backend and exit."""
    started = time.perf_counter()
    outcome = run_worker(
        {"kind": "probe", "backends": ["cpu"]},
        python=sys.executable,
        env=worker_env(DEFAULT_WORKER_ENV),
        timeout_s=120,
        fork=fork,
    )
    assert outcome.result is not None, outcome.stderr_tail
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3, help="suite invocations")
    parser.add_argument("--starts", type=int, default=10, help="worker starts of each kind")
    parser.add_argument("--record", help="store every repeat in this tpubench store (docs/benchmarks.md)")
    args = parser.parse_args()
    if args.repeat < 1 or args.starts < 2:
        parser.error("--repeat must be at least 1 and --starts at least 2")
    started = datetime.now(UTC)

    print(f"tpubench {COMMAND}  (cpu count {os.cpu_count()}, load {os.getloadavg()[0]:.2f})")
    print(f"{'invocation':>10} {'wall s':>8} {'in workers s':>13} {'runs':>5} {'wall/workers':>13}")
    ratios = []
    for i in range(args.repeat):
        with tempfile.TemporaryDirectory() as results:
            wall, inside, runs = suite_ratio(Path(results))
        ratios.append(wall / inside)
        print(f"{i + 1:>10} {wall:>8.2f} {inside:>13.2f} {runs:>5} {wall / inside:>13.2f}")
    print(f"median wall/workers: {statistics.median(ratios):.2f}  (requirement <= 2.0, goal 1.1)")

    start_cost(True)  # start the zygote: its one-off import is not a per-run cost
    forked, fresh = [], []
    for _ in range(args.starts):  # interleaved, so drift in the machine's load hits both
        forked.append(start_cost(True))
        fresh.append(start_cost(False))
    for name, samples in (("forked from the zygote", forked), ("fresh interpreter", fresh)):
        deciles = statistics.quantiles(samples, n=10)
        median = statistics.median(samples)
        spread = f"p10 {deciles[0] * 1e3:.0f}, p90 {deciles[-1] * 1e3:.0f}"
        print(f"worker start + probe, {name}: median {median * 1e3:.0f} ms ({spread})")
    if args.record:
        figures = {
            "suite wall/workers": ("ratio", ratios),
            "worker start, forked": ("wall", forked),
            "worker start, fresh": ("wall", fresh),
        }
        print("stored:", ", ".join(record.write(args.record, "run_overhead", figures, started)))
    median = statistics.median(ratios)
    record.verdict([(f"a tiny CPU suite's wall/workers <= 2.0 (goal 1.1): {median:.2f}", median <= 2.0)])


if __name__ == "__main__":
    main()
