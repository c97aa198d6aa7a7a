"""How fast, and in how much memory, traces of growing size become ops rows.

Two kinds of real traces, captured here by ``tpubench run --profile``:

- a torch.profiler Chrome trace of gpt2 tiny training on the CPU (shapes recorded, so
  ingest counts FLOPs and bytes), its events repeated (each copy shifted past the previous
  one in time) up to each ``--chrome-mb`` size;
- xplanes of gpt2 tiny training on torch_xla's PJRT CPU device, one capture per
  ``--xplane-steps`` count, so that the largest holds thousands of real traced steps
  (needs ``--xla-python``, the torch_xla environment's interpreter).

Each file is ingested by :func:`tpubench.traces.ingest` in a fresh process, ``--repeat``
times, which reports the seconds ingest took (imports excluded; wall clock, and the
process's CPU time, which other load on the machine inflates less) and its peak RSS (the
whole process, the interpreter and libraries included: VmHWM), with the peak before ingest
began. The table gives each file's median and its fastest repeat; the raw repeats follow as
JSON. Counts of recorded shapes are kept in a fresh cache folder, filled by one ingest of
the smallest Chrome trace first, whose time (torch imported, every shape counted) is printed
as the first use's; the measured ingests read kept counts, as every ingest of a model's
traces after its first does.

``--baseline DIR`` measures another checkout's tpubench (a worktree of main) in the same
loop, each file alternately with this one's, so that the two see the same load.

Requirements, checked on each file's fastest repeat, the script exiting 1 when
one is missed: a Chrome trace of about 12 MB in at most 0.5 s; at least 40 MB/s, and a peak
RSS at most the file's size, for the largest Chrome trace when it is 400 MB or more; at
least 20 MB/s for every trace.

``--record DIR`` stores each file's repeats (this checkout's) as rows of a tpubench store
(:mod:`benchmarks.record`: workload ``tpubench-self/ops_ingest``, the file as its size), before
the requirements are checked.

    python benchmarks/ops_ingest.py --xla-python ~/.cache/tpubench/venv-xla/bin/python
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

import record  # noqa: E402

from tpubench import store  # noqa: E402

MB = 1e6

#: run in the measuring child: ingest one file; report the time it took and the process's
#: peak RSS before and after it. VmHWM is this process's own high-water mark: getrusage's
#: ru_maxrss would carry over the forking parent's, which has pandas and pyarrow loaded.
CHILD = """
import json, sys, time
from tpubench.traces import ingest
import ijson, google.protobuf, numpy  # the readers' libraries, loaded before the clock starts

def peak_rss():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:"))

before = peak_rss()
start, cpu = time.perf_counter(), time.process_time()
rows = ingest(sys.argv[1], int(sys.argv[2]))
seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
print(json.dumps({"seconds": seconds, "cpu_seconds": cpu, "rows": len(rows), "baseline_bytes": before,
                  "peak_rss_bytes": peak_rss()}))
"""


def capture(results: Path, backend: str, steps: int, python: str | None, shape: list[str]) -> dict:
    """One profiled gpt2 tiny training run's row: captured now, or earlier into ``--work``."""
    if (results / "runs").is_dir():
        earlier = store.load_runs(results, backend=backend, profile_steps=steps, status="ok")
        if len(earlier):
            return earlier.iloc[-1].to_dict()
    command = [sys.executable, "-m", "tpubench", "run", "--workload", "gpt2", "--mode", "train", "--backend", backend]
    command += [*shape, "--warmup", "1", "--steps", "2", "--profile", "--profile-steps", str(steps)]
    command += ["--timeout", "7200", "--results", str(results)]
    if python:
        command += ["--python", f"xla={python}"]
    env = {**os.environ, "PJRT_DEVICE": "CPU", "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    subprocess.run(command, check=True, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
    runs = store.load_runs(results, backend=backend, profile_steps=steps)
    row = runs.sort_values("started_at").iloc[-1].to_dict()
    if row["status"] != "ok":
        raise SystemExit(f"the {backend} capture failed: {row['error']}")
    return row


def repeated_chrome_trace(source: Path, target: Path, size_mb: float) -> int:
    """Write ``source``'s events again and again, each copy shifted after the last, until
    ``target`` holds ``size_mb``; returns the number of copies."""
    trace = json.loads(source.read_text())
    events = [event for event in trace["traceEvents"] if event.get("ph") == "X"]
    start = min(event["ts"] for event in events)
    span = max(event["ts"] + event.get("dur", 0) for event in events) - start + 1000.0
    header = {key: value for key, value in trace.items() if key != "traceEvents"}
    copies = 0
    with open(target, "w") as out:
        out.write(json.dumps(header)[:-1] + ', "traceEvents": [\n')
        first = True
        while out.tell() < size_mb * MB:
            for event in events:
                shifted = {**event, "ts": event["ts"] + copies * span}
                out.write(("" if first else ",\n") + json.dumps(shifted, indent=2))
                first = False
            copies += 1
        out.write("\n]}\n")
    return copies


def measure(path: Path, steps: int, checkout: Path, cache: Path) -> dict:
    """Ingest ``path`` in a fresh process with ``checkout``'s tpubench and the kept counts in
    ``cache``: seconds, CPU seconds, rows, its peak RSS and its peak before ingest."""
    env = {**os.environ, "PYTHONPATH": str(checkout), "TPUBENCH_CACHE_DIR": str(cache)}
    child = subprocess.run(
        [sys.executable, "-c", CHILD, str(path), str(steps)], cwd=checkout, env=env, capture_output=True, text=True
    )
    if child.returncode != 0:
        raise SystemExit(f"ingesting {path} with {checkout} failed ({child.returncode}): {child.stderr[-2000:]}")
    return json.loads(child.stdout)


def chrome_file(work: Path, source: Path, size: float) -> tuple[str, Path, int]:
    """The Chrome trace of ``size`` MB, written now or earlier into ``--work``."""
    target, copies_file = work / f"chrome-{size:g}MB.json", work / f"chrome-{size:g}MB.copies"
    if not (target.exists() and copies_file.exists()):
        copies_file.write_text(str(repeated_chrome_trace(source, target, size)))
    copies = int(copies_file.read_text())
    return f"chrome trace, {copies} copies of 2 steps", target, 2 * copies


def fastest(repeats: list[dict]) -> dict:
    return min(repeats, key=lambda found: found["seconds"])


def line(label: str, size: int, repeats: list[dict]) -> str:
    """One row of the table: the median repeat's seconds and MB/s, the fastest's, CPU and memory."""
    seconds = statistics.median(found["seconds"] for found in repeats)
    best, cpu = fastest(repeats), statistics.median(found["cpu_seconds"] for found in repeats)
    peak = max(found["peak_rss_bytes"] for found in repeats)
    return (
        f"{label:40} {size / MB:7.1f} {seconds:6.2f} {size / MB / seconds:6.1f} {best['seconds']:6.2f} "
        f"{size / MB / best['seconds']:6.1f} {cpu:6.2f} {size / MB / cpu:8.1f} {peak / MB:8.0f} {peak / size:8.2f} "
        f"{best['baseline_bytes'] / MB:9.0f} {best['rows']:5}"
    )


def requirements(files: list[tuple[str, Path, int]], measured: dict[Path, list[dict]]) -> list[tuple[str, bool]]:
    """Each requirement that applies to these files, and whether the fastest repeat meets it."""
    checks = []
    chrome = sorted((path.stat().st_size, path) for label, path, _ in files if label.startswith("chrome"))
    if chrome and chrome[0][0] <= 15 * MB:
        size, path = chrome[0]
        best = fastest(measured[path])
        checks.append(
            (f"a {size / MB:.0f} MB Chrome trace in <= 0.5 s: {best['seconds']:.2f} s", best["seconds"] <= 0.5)
        )
    if chrome and chrome[-1][0] >= 400 * MB:
        size, path = chrome[-1]
        best, peak = fastest(measured[path]), max(found["peak_rss_bytes"] for found in measured[path])
        rate = size / MB / best["seconds"]
        checks.append((f"a {size / MB:.0f} MB Chrome trace at >= 40 MB/s: {rate:.1f} MB/s", rate >= 40))
        checks.append((f"its peak RSS <= its size: {peak / size:.2f}x", peak <= size))
    slowest = min((path.stat().st_size / MB / fastest(measured[path])["seconds"], label) for label, path, _ in files)
    checks.append((f"every trace at >= 20 MB/s: the slowest {slowest[0]:.1f} MB/s ({slowest[1]})", slowest[0] >= 20))
    return checks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chrome-mb", default="10,50,100,250,500", help="Chrome trace sizes, MB")
    parser.add_argument("--xplane-steps", default="200,2000,11500", help="traced steps per xplane capture")
    parser.add_argument("--xla-python", help="the torch_xla interpreter (without it: no xplanes)")
    parser.add_argument("--work", type=Path, help="keep captures here, and reuse those already there")
    parser.add_argument("--repeat", type=int, default=3, help="fresh-process ingests per file (default 3)")
    parser.add_argument("--baseline", type=Path, help="another checkout (a worktree of main) measured alongside")
    parser.add_argument("--record", help="store each file's repeats in this tpubench store (docs/benchmarks.md)")
    args = parser.parse_args()
    started = datetime.now(UTC)
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    if args.baseline and not (args.baseline / "tpubench" / "traces").is_dir():
        parser.error(f"--baseline {args.baseline} is not a tpubench checkout")
    with tempfile.TemporaryDirectory(prefix="tpubench-ops-bench-") as scratch:
        work = args.work or Path(scratch)
        work.mkdir(parents=True, exist_ok=True)
        files: list[tuple[str, Path, int]] = []
        row = capture(work / "chrome", "cpu", 2, None, [])
        source = store.inside_results(work / "chrome", row["trace_path"])
        files += [chrome_file(work, source, float(text)) for text in args.chrome_mb.split(",")]
        if args.xla_python:
            for steps in (int(text) for text in args.xplane_steps.split(",")):
                small = ["--batch-size", "1", "--seq-len", "16"]  # the same ops per step, executed sooner
                row = capture(work / f"xla-{steps}", "xla", steps, args.xla_python, small)
                [xplane] = store.inside_results(work / f"xla-{steps}", row["trace_path"]).rglob("*.xplane.pb")
                files.append((f"xplane, {steps} traced steps", xplane, steps))
        cache = Path(scratch) / "cache"  # kept shape counts: empty, then filled by the first ingest
        checkouts = {"": ROOT} | ({"main: ": args.baseline.resolve()} if args.baseline else {})
        smallest = min((path.stat().st_size, path, steps) for label, path, steps in files if label.startswith("chrome"))
        first = measure(smallest[1], smallest[2], ROOT, cache)
        print(
            f"first use ({smallest[0] / MB:.0f} MB Chrome trace, no kept counts): {first['seconds']:.2f} s, "
            f"{first['cpu_seconds']:.2f} CPU s, peak RSS {first['peak_rss_bytes'] / MB:.0f} MB"
        )
        print(f"load average before measuring: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
        header = f"{'trace (median of ' + str(args.repeat) + ')':40} {'MB':>7} {'s':>6} {'MB/s':>6} {'best s':>6}"
        print(f"{header} {'MB/s':>6} {'CPU s':>6} {'MB/CPU s':>8} {'peak MB':>8} {'RSS/size':>8} {'before MB':>9} rows")
        measured: dict[str, dict[Path, list[dict]]] = {name: {} for name in checkouts}
        for label, path, steps in files:
            for _ in range(args.repeat):
                for name, checkout in checkouts.items():
                    measured[name].setdefault(path, []).append(measure(path, steps, checkout, cache))
            for name in checkouts:
                print(line(name + label, path.stat().st_size, measured[name][path]), flush=True)
        print(f"load average after: {os.getloadavg()[0]:.1f}")
        print(
            "raw repeats:",
            json.dumps({name: {str(p): r for p, r in found.items()} for name, found in measured.items()}),
        )
        if args.record:
            figures = {
                path.stem if label.startswith("chrome") else f"xplane-{steps}-steps": (
                    "wall",
                    [found["seconds"] for found in measured[""][path]],
                )
                for label, path, steps in files
            }
            print("stored:", ", ".join(record.write(args.record, "ops_ingest", figures, started)))
        record.verdict(requirements(files, measured[""]))


if __name__ == "__main__":
    main()
