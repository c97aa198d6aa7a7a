"""What keeping an invocation's files current costs per run, as the invocation grows.

``tpubench run`` writes each run to its invocation's files as soon as it finishes (so a
crash loses at most the run in flight), which rewrites those files whole. This script
adds ``--runs`` synthetic runs, each with every ``runs`` column filled and ``--steps``
step rows (as a ``--steps 40 --warmup 3`` run has), through the real
:class:`tpubench.store.InvocationWriter` into a temporary local store, and prints the
time of one ``add`` at several points of the invocation, then the total. A long
``tpubench ci`` night has hundreds of runs; the calibration in
benchmarks/regression_calibration.py had thousands in one invocation before it split
them.

    python benchmarks/store_writes.py [--runs 2000] [--steps 43]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tpubench import store
from tpubench.schema import TABLES

WHEN = datetime(2026, 12, 1, tzinfo=UTC)


def value(field: pa.Field, index: int) -> object:
    """A plausible value of ``field``'s type, different per run."""
    kind = field.type
    if pa.types.is_string(kind):
        return f"{field.name}-{index}"
    if pa.types.is_boolean(kind):
        return index % 2 == 0
    if pa.types.is_integer(kind):
        return index
    if pa.types.is_floating(kind):
        return 1.5 + index
    if pa.types.is_timestamp(kind):
        return WHEN
    raise TypeError(f"no synthetic value for {field.name}: {kind}")


def run_rows(index: int, steps: int) -> tuple[dict, list[dict]]:
    run_id = f"run-{index:06d}"
    run = {f.name: value(f, index) for f in TABLES["runs"] if f.name != "schema_version"}
    run |= {"run_id": run_id, "invocation_id": "bench", "status": "ok"}
    step_rows = [
        {"run_id": run_id, "invocation_id": "bench", "step": step, "phase": "measure", "step_ms": 4.0 + step % 7}
        for step in range(steps)
    ]
    return run, step_rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--steps", type=int, default=43, help="step rows per run")
    args = parser.parse_args()
    marks = sorted({1, 10, 100, 500, 1000, 2000, 5000, args.runs} & set(range(1, args.runs + 1)))
    timings: list[float] = []
    with tempfile.TemporaryDirectory() as results:
        writer = store.InvocationWriter(results, "bench", WHEN)
        started = time.perf_counter()
        for index in range(1, args.runs + 1):
            run, steps = run_rows(index, args.steps)
            before = time.perf_counter()
            writer.add(run, steps)
            timings.append(time.perf_counter() - before)
            if index in marks:
                window = timings[max(0, index - 10) : index]  # the last few adds, not one noisy one
                took = statistics.median(window) * 1e3
                print(f"run {index:>5}: add took {took:8.1f} ms (median of the last {len(window)})")
        total = time.perf_counter() - started
        loaded = store.load_runs(results)
    assert len(loaded) == args.runs, "every run must be in the store"
    per_run = total / args.runs * 1e3
    print(f"{args.runs} runs x {args.steps} steps: {total:.1f} s of writes in all, {per_run:.1f} ms a run")


if __name__ == "__main__":
    main()
