"""What ``tpubench compact`` costs on a big store, and what it saves its readers.

Takes the synthetic store of ``benchmarks/dashboard_speed.py`` (``--store DIR``, built there
with ``--nights`` if missing: 4,000 nights are 100,000 runs, 12.3M step rows, 10.1M op rows,
in about 16,000 files), copies it by hard links (compaction writes new files and unlinks the
old ones, never edits one, so the original is left as it was), and runs the real command on
the copy in a child process: ``tpubench compact --older-than 0``. Printed: its wall time and
its peak resident memory (its processes' together, sampled every 20 ms), each table's files before and after, the
rows of every table before and after (from the files' footers: they must be equal), then what
a reader gains (every runs file's index columns read, and the number of files, before and
after), the cost of a second compaction (nothing to do) and of a night's compaction (one new
invocation merged into its month, what ``tpubench ci --history`` does after each night).
Requirement: the whole store compacted in <= 120 s; the script exits 1 when it is missed.
``--record DIR`` stores the figures as rows of a tpubench store (:mod:`benchmarks.record`).

    python benchmarks/store_compact.py --store /tmp/tpubench-store-100k --nights 4000 [--record DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import dashboard_speed  # benchmarks/: this script's folder is on sys.path
import psutil
import pyarrow.parquet as pq
import record

from tpubench import store

REQUIREMENT_S = 120.0
ROOT = Path(__file__).resolve().parent.parent


def rows(path: Path) -> dict[str, int]:
    """Each table's rows, from the live files' footers."""
    return {
        table: sum(pq.read_metadata(file).num_rows for file in store.parquet_files(path, table))
        for table in store.TABLES
    }


def compact(path: Path) -> tuple[float, float, str]:
    """``tpubench compact --older-than 0`` on ``path`` in a child: (wall s, peak memory MB, its
    output). The memory is the resident sets of the child and its workers together, sampled
    every 20 ms (``ru_maxrss`` would not do: Linux keeps it across ``exec``, so a child's
    starts at this process's)."""
    with tempfile.TemporaryFile("w+") as output:
        started = time.perf_counter()
        child = subprocess.Popen(
            [sys.executable, "-m", "tpubench", "compact", "--older-than", "0", "--results", str(path)],
            stdout=output,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        peak = 0
        watched = psutil.Process(child.pid)
        while child.poll() is None:
            with contextlib.suppress(psutil.Error):
                tree = [watched, *watched.children(recursive=True)]
                peak = max(peak, sum(process.memory_info().rss for process in tree))
            time.sleep(0.02)
        wall = time.perf_counter() - started
        output.seek(0)
        text = output.read()
    if child.returncode:
        raise SystemExit(f"tpubench compact failed ({child.returncode}): {text}")
    return wall, peak / 1e6, text


def add_night(path: Path) -> None:
    """One more night's invocation, written as dashboard_speed's are, in the store's last month."""
    when = datetime(2026, 11, 30, 23, 0, tzinfo=UTC)
    invocation = f"{when:%Y%m%dT%H%M%S}-tonight"
    rng = dashboard_speed.np.random.default_rng(1)
    tables: dict[str, list[dict]] = {"runs": [], "steps": [], "ops": [], "compiles": []}
    for config in dashboard_speed.nightly_configs():
        made = dashboard_speed.run_row(config, 4000, when, rng)
        for table, items in zip(tables, ([made[0]], *made[1:]), strict=True):
            tables[table] += [{**item, "invocation_id": invocation} for item in items]
    location = store.Location(path)
    paths = store.InvocationWriter(path, invocation, when).paths
    for table, items in tables.items():
        location.write_table(store.to_table(items, table), paths[table])


def read_index(path: Path) -> float:
    """Seconds to read every runs file's index columns (what the dashboard's first page reads)."""
    started = time.perf_counter()
    store.scan_table(path, "runs", ["run_id", "started_at", "workload", "backend", "status", "median_step_ms"])
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", type=Path, default=Path("/tmp/tpubench-store-100k"), help="the store to copy")
    parser.add_argument("--nights", type=int, default=4000, help="nights of a store built here if --store is missing")
    parser.add_argument("--record", help="store the figures in this tpubench store (docs/benchmarks.md)")
    args = parser.parse_args()
    if not (args.store / "runs").is_dir():
        print(f"building {args.nights * len(dashboard_speed.nightly_configs()):,} runs in {args.store} ...")
        dashboard_speed.build(args.store, args.nights)
    started = datetime.now(UTC)
    with tempfile.TemporaryDirectory(prefix="tpubench-compact-", dir=args.store.parent) as scratch:
        copy = Path(scratch) / "store"
        shutil.copytree(args.store, copy, copy_function=os.link)
        files = {table: len(store.parquet_files(copy, table)) for table in store.TABLES}
        counted = rows(copy)
        print(
            f"store {args.store}: {sum(files.values()):,} files; "
            + ", ".join(f"{n:,} {table} rows" for table, n in counted.items() if n)
            + f"; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
        )
        index_before = read_index(copy)
        wall, peak_mb, output = compact(copy)
        print(output.rstrip())
        after = {table: len(store.parquet_files(copy, table)) for table in store.TABLES}
        kept = rows(copy)
        print(f"compaction of the whole store: {wall:.1f} s wall, peak memory {peak_mb:,.0f} MB (its processes' RSS)")
        print(f"files: {sum(files.values()):,} -> {sum(after.values()):,}; rows kept: {kept == counted}")
        index_after = read_index(copy)
        print(
            f"reading the runs index: {files['runs']:,} files {index_before:.2f} s"
            f" -> {after['runs']} files {index_after:.2f} s"
        )
        again, _, _ = compact(copy)
        print(f"a second compaction (nothing to merge): {again:.1f} s")
        add_night(copy)
        tonight, _, _ = compact(copy)
        print(f"a night's compaction (one invocation merged into its month's files): {tonight:.1f} s")
    if args.record:
        figures = {
            "compact 100k-run store" if args.nights == 4000 else f"compact {args.nights} nights": ("wall", [wall]),
            "compact nothing new": ("wall", [again]),
            "compact one night": ("wall", [tonight]),
        }
        print("stored:", ", ".join(record.write(args.record, "store_compact", figures, started)))
    record.verdict(
        [
            (f"whole store compacted in <= {REQUIREMENT_S:g} s: {wall:.1f} s", wall <= REQUIREMENT_S),
            ("every table's rows kept", kept == counted),
        ]
    )


if __name__ == "__main__":
    main()
