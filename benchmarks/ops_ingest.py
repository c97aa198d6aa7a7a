"""How fast, and in how much memory, traces of growing size become ops rows.

Two kinds of real traces, captured here by ``tpubench run --profile``:

- a torch.profiler Chrome trace of gpt2 tiny training on the CPU, its events repeated
  (each copy shifted past the previous one in time) up to each ``--chrome-mb`` size;
- xplanes of gpt2 tiny training on torch_xla's PJRT CPU device, one capture per
  ``--xplane-steps`` count, so that the largest holds thousands of real traced steps
  (needs ``--xla-python``, the torch_xla environment's interpreter).

Each file is ingested by :func:`tpubench.traces.ingest` in a fresh process, which reports
the seconds ingest took (imports excluded; wall clock, and the process's CPU time, which
other load on the machine inflates less) and its peak RSS (the whole process, the
interpreter and libraries included: VmHWM), with the peak before ingest began. Requirements (the issue): peak RSS
at most 2x the file's size, and at least 20 MB/s.

    python benchmarks/ops_ingest.py --xla-python ~/.cache/tpubench/venv-xla/bin/python
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

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


def measure(path: Path, steps: int) -> dict:
    """Ingest ``path`` in a fresh process: seconds, rows, its peak RSS and its peak before ingest."""
    child = subprocess.run(
        [sys.executable, "-c", CHILD, str(path), str(steps)], cwd=ROOT, capture_output=True, text=True
    )
    if child.returncode != 0:
        raise SystemExit(f"ingesting {path} failed ({child.returncode}): {child.stderr[-2000:]}")
    return json.loads(child.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chrome-mb", default="10,50,100,250,500", help="Chrome trace sizes, MB")
    parser.add_argument("--xplane-steps", default="200,2000,11500", help="traced steps per xplane capture")
    parser.add_argument("--xla-python", help="the torch_xla interpreter (without it: no xplanes)")
    parser.add_argument("--work", type=Path, help="keep captures here, and reuse those already there")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tpubench-ops-bench-") as scratch:
        work = args.work or Path(scratch)
        work.mkdir(parents=True, exist_ok=True)
        files: list[tuple[str, Path, int]] = []
        row = capture(work / "chrome", "cpu", 2, None, [])
        for size in (float(text) for text in args.chrome_mb.split(",")):
            target = work / f"chrome-{size:g}MB.json"
            copies = repeated_chrome_trace(store.inside_results(work / "chrome", row["trace_path"]), target, size)
            files.append((f"chrome trace, {copies} copies of 2 steps", target, 2 * copies))
        if args.xla_python:
            for steps in (int(text) for text in args.xplane_steps.split(",")):
                small = ["--batch-size", "1", "--seq-len", "16"]  # the same ops per step, executed sooner
                row = capture(work / f"xla-{steps}", "xla", steps, args.xla_python, small)
                [xplane] = store.inside_results(work / f"xla-{steps}", row["trace_path"]).rglob("*.xplane.pb")
                files.append((f"xplane, {steps} traced steps", xplane, steps))
        print(f"load average before measuring: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
        header = f"{'trace':36} {'MB':>7} {'s':>6} {'MB/s':>6} {'CPU s':>6} {'MB/CPU s':>8} {'peak RSS MB':>11}"
        print(f"{header} {'RSS/size':>8} {'before MB':>9} {'rows':>5}")
        for label, path, steps in files:
            size = path.stat().st_size
            found = measure(path, steps)
            print(
                f"{label:36} {size / MB:7.1f} {found['seconds']:6.2f} {size / MB / found['seconds']:6.1f} "
                f"{found['cpu_seconds']:6.2f} {size / MB / found['cpu_seconds']:8.1f} "
                f"{found['peak_rss_bytes'] / MB:11.0f} {found['peak_rss_bytes'] / size:8.2f} "
                f"{found['baseline_bytes'] / MB:9.0f} {found['rows']:5}",
                flush=True,
            )


if __name__ == "__main__":
    main()
