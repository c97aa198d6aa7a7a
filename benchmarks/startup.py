"""How long each read-only ``tpubench`` command takes to start and finish, beside Python's floor.

Each command runs as a user runs it (``python -m tpubench ...`` in a fresh process), ``--repeat``
times; the table gives the median wall time of each next to ``python -c pass`` (the
interpreter), ``python -c "import torch"`` (what any command that touches a model pays) and
the read libraries' imports (pandas, pyarrow.parquet, typer and rich: what any command that
reads a store pays), so a figure reads against what it cannot beat. The store is synthetic, written through the real
writer (:mod:`benchmarks.dashboard_speed`'s nights): 4 nights of 25 runs, 100 runs with their
steps; ``compare`` compares the last night with the one before.

Requirements, checked on the medians (each printed ``met`` or ``NOT MET``, the script exiting 1
when one is missed): ``--version`` <= 0.3 s; ``compare`` on the 100-run store <= 1 s; ``list``
<= one torch import + 0.5 s. ``--record DIR`` stores every command's repeats as rows of a
tpubench store first (:mod:`benchmarks.record`: workload ``tpubench-self/startup``).
Read-only commands import torch, Dynamo, scipy, streamlit and Ray only when their work needs them
(tests/test_regression_cli.py checks ``--version`` and ``compare`` with ``-X importtime``).

    python benchmarks/startup.py [--repeat 5] [--store DIR] [--record DIR]
"""

from __future__ import annotations

import argparse
import compileall
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

import record  # noqa: E402
from dashboard_speed import nightly_configs, run_row  # noqa: E402

from tpubench import store  # noqa: E402

NIGHTS = 4  # x 25 runs: a 100-run store


def build(path: Path) -> list[str]:
    """A store of :data:`NIGHTS` nights under ``path`` (runs and steps; no ops); the invocations, oldest first."""
    rng = np.random.default_rng(0)
    first = datetime(2026, 12, 1, 2, 0, tzinfo=UTC)
    invocations = []
    for night in range(NIGHTS):
        started = first + timedelta(days=night)
        invocation = f"{started:%Y%m%dT%H%M%S}-{night:08x}"
        writer = store.InvocationWriter(path, invocation, started)
        rows: dict[str, list[dict]] = {"runs": [], "steps": []}
        for index, config in enumerate(nightly_configs()):
            run, steps, _, _ = run_row(config, night, started + timedelta(minutes=index), rng)  # and ops, compiles
            for item in (run, *steps):
                item["invocation_id"] = invocation
            rows["runs"].append(run)
            rows["steps"].extend(steps)
        location = store.Location(path)
        for table, table_rows in rows.items():
            location.write_table(store.to_table(table_rows, table), writer.paths[table])
        invocations.append(invocation)
    return invocations


def wall(argv: list[str], repeat: int) -> list[float]:
    """The wall times of ``repeat`` runs of ``argv`` (each must exit 0)."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        done = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"})
        times.append(time.perf_counter() - started)
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} exited {done.returncode}: {done.stderr[-2000:]}")
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--store", type=Path, help="write the synthetic store here (default: a temporary folder)")
    parser.add_argument("--record", help="store every command's repeats in this tpubench store (docs/benchmarks.md)")
    args = parser.parse_args()
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    started = datetime.now(UTC)
    # what a user's second command costs: the first writes tpubench's bytecode (pip writes it at
    # install). Under PYTHONDONTWRITEBYTECODE=1, as on our CI hosts, nothing ever would, and each
    # command would compile the package's modules from source (25 ms of compare's)
    for package in ("tpubench", "workloads", "reports"):
        compileall.compile_dir(HERE.parent / package, quiet=1)
    path = args.store or Path(tempfile.mkdtemp(prefix="tpubench-startup-"))
    invocations = build(path)
    results = ["--results", str(path)]
    out = Path(tempfile.mkdtemp(prefix="tpubench-startup-out-"))
    python = [sys.executable]
    tpubench = [*python, "-m", "tpubench"]
    commands = {
        'python -c pass': [*python, "-c", "pass"],
        'python -c "import torch"': [*python, "-c", "import torch"],
        # what a command that reads a store cannot do without: its table library, parquet, the CLI
        "python -c <read libraries>": [*python, "-c", "import pandas, pyarrow.parquet, typer, rich.table"],
        "tpubench --version": [*tpubench, "--version"],
        "tpubench list": [*tpubench, "list"],
        "tpubench env": [*tpubench, "env"],
        "tpubench compare (100 runs)": [
            *tpubench, "compare", "--baseline", f"invocation={invocations[-2]}",
            "--candidate", f"invocation={invocations[-1]}", *results,
        ],
        "tpubench regressions": [*tpubench, "regressions", *results],
        "tpubench report": [*tpubench, "report", "--out", str(out / "report.html"), *results],
        "tpubench ops": [*tpubench, "ops", *results],
        "tpubench compiles": [*tpubench, "compiles", *results],
        "tpubench scaling": [*tpubench, "scaling", *results],
    }  # fmt: skip
    print(f"load before: {Path('/proc/loadavg').read_text().strip()}; {args.repeat} runs each, median wall time")
    floor: dict[str, float] = {}
    repeats: dict[str, list[float]] = {}
    for name, argv in commands.items():
        repeats[name] = wall(argv, args.repeat)
        seconds = statistics.median(repeats[name])
        if name.startswith("python"):
            floor[name] = seconds
            print(f"{name:<30} {seconds:6.2f} s", flush=True)
            continue
        over_python = seconds - floor["python -c pass"]
        over_torch = seconds - floor['python -c "import torch"']
        over_reading = seconds - floor["python -c <read libraries>"]
        print(
            f"{name:<30} {seconds:6.2f} s  (python +{over_python:.2f} s, import torch {over_torch:+.2f} s, "
            f"read libraries {over_reading:+.2f} s)",
            flush=True,
        )
    print(f"load after: {Path('/proc/loadavg').read_text().strip()}")
    if args.record:
        figures = {name: ("wall", times) for name, times in repeats.items()}
        print("stored:", ", ".join(record.write(args.record, "startup", figures, started)))
    median = {name: statistics.median(times) for name, times in repeats.items()}
    torch_floor = median['python -c "import torch"']
    record.verdict(
        [
            (f"tpubench --version <= 0.3 s: {median['tpubench --version']:.2f} s", median["tpubench --version"] <= 0.3),
            (
                f"tpubench compare (100 runs) <= 1 s: {median['tpubench compare (100 runs)']:.2f} s",
                median["tpubench compare (100 runs)"] <= 1.0,
            ),
            (
                f"tpubench list <= import torch + 0.5 s ({torch_floor + 0.5:.2f} s): {median['tpubench list']:.2f} s",
                median["tpubench list"] <= torch_floor + 0.5,
            ),
        ]
    )


if __name__ == "__main__":
    main()
