"""What does capturing the ``compiles`` table cost? Prints step time and compile time with the
capture on against off, per backend, with the confidence interval of the difference.

The default capture is meant to be cheap (Dynamo's own records and hooks, ``PT_XLA_DEBUG_LEVEL=1``
on XLA, TorchTPU's counters); this checks it. Rounds alternate: each round runs one
``tpubench run`` with the capture on and one with ``--no-capture-compiles`` (the order flips
every round, so drift of a busy host hits both alike), each in its own worker as a user's run.

Step time: the measured steps of every run, the median over runs of each run's median, and a
95% hierarchical bootstrap interval (runs drawn, then each drawn run's steps, as
``tpubench compare`` does) of the on/off ratio. Requirement: the interval contains 1.0, or the
ratio's excess stays inside the run-to-run noise printed beside it.

Compile time: the runs' ``compile_s`` on against off (medians and their difference); and, in
fresh processes compiling one small model at batches 8, 8, 12, 8, 16 with tpubench's Dynamo
capture started or not, Dynamo's own records: frame compile seconds and the cost it reports
for its structured logging (``structured_logging_overhead_s``, summed over the compiles).

    python benchmarks/compile_capture_cost.py [--backends cpu-compile,xla] [--rounds 4] [--steps 20]
    (xla needs TPUBENCH_XLA_PYTHON, the torch_xla interpreter; PJRT_DEVICE=CPU is set for it)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tpubench import store  # noqa: E402 - needs the checkout on sys.path
from tpubench.analysis.compare import hierarchical_bootstrap  # noqa: E402

RESAMPLES = 4000


def run_once(results: Path, backend: str, capture: bool, args: argparse.Namespace) -> None:
    line = [
        sys.executable, "-m", "tpubench", "run", "--workload", args.workload, "--size", "tiny", "--backend", backend,
        "--mode", args.mode, "--steps", str(args.steps), "--warmup", str(args.warmup), "--results", str(results),
        "--tag", f"capture={'on' if capture else 'off'}",
    ]  # fmt: skip
    if not capture:
        line.append("--no-capture-compiles")
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    if backend.startswith("xla"):
        python = os.environ.get("TPUBENCH_XLA_PYTHON")
        if not python:
            raise SystemExit("xla needs TPUBENCH_XLA_PYTHON (the torch_xla interpreter)")
        line += ["--python", f"xla={python}"]
        env["PJRT_DEVICE"] = "CPU"
    done = subprocess.run(line, capture_output=True, text=True, env=env, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"tpubench run failed ({backend}, capture {capture}):\n{done.stderr[-2000:]}")


#: one process's compiles of a small model at batches 8, 8, 12, 8, 16 (two recompiles), with
#: tpubench's Dynamo capture started or not; prints Dynamo's own per-compile records' sums
DYNAMO_PROBE = """
import json, sys, torch
from torch._dynamo.utils import get_compilation_metrics
capture = None
if sys.argv[1] == "on":
    from tpubench.compiles.dynamo import DynamoCapture
    capture = DynamoCapture()
    capture.start()
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
compiled = torch.compile(model, backend=sys.argv[2])
for step, batch in enumerate((8, 8, 12, 8, 16)):
    if capture:
        capture.before_step(step, "warmup")
    compiled(torch.randn(batch, 64)).sum().backward()
    if capture:
        capture.after_step(step, "warmup")
records = list(get_compilation_metrics())
print(json.dumps({
    "compiles": len(records),
    "frame_s": sum(r.entire_frame_compile_time_s or 0.0 for r in records),
    "logging_s": sum(r.structured_logging_overhead_s or 0.0 for r in records),
    "events": len(capture.events) if capture else 0,
}))
"""


def dynamo_overhead(rounds: int, backend: str) -> None:
    """Dynamo's compile seconds and its ``structured_logging_overhead_s`` with the capture on
    against off, in fresh processes (alternating), for the same compiles."""
    found: dict[str, list[dict]] = {"on": [], "off": []}
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "PYTHONPATH": str(ROOT)}
    for round_ in range(rounds):
        for side in ("on", "off") if round_ % 2 == 0 else ("off", "on"):
            done = subprocess.run(
                [sys.executable, "-c", DYNAMO_PROBE, side, backend], capture_output=True, text=True, env=env, cwd=ROOT
            )
            if done.returncode != 0:
                raise SystemExit(f"the Dynamo probe failed:\n{done.stderr[-2000:]}")
            found[side].append(json.loads(done.stdout.strip().splitlines()[-1]))
    for side in ("on", "off"):
        frame = [r["frame_s"] for r in found[side]]
        logging = [r["logging_s"] for r in found[side]]
        records = "/".join(str(r["compiles"]) for r in found[side])
        events = "/".join(str(r["events"]) for r in found[side])
        print(
            f"dynamo ({backend}) capture {side}: compile records per process {records}, events {events}; "
            f"frame compile s median {np.median(frame):.3f} (runs {', '.join(f'{v:.3f}' for v in frame)}); "
            f"structured_logging_overhead_s median {np.median(logging):.5f}"
        )


def report(backend: str, results: Path) -> None:
    runs = store.load_runs(results, backend=backend, status="ok")
    runs["capture"] = runs["tags"].map(lambda text: json.loads(text)["capture"])
    steps = store.load_steps(results, run_id=list(runs["run_id"]), phase="measure")
    samples = {run_id: group["step_ms"].to_numpy() for run_id, group in steps.groupby("run_id")}
    sides = {side: [samples[r] for r in runs.loc[runs["capture"] == side, "run_id"]] for side in ("on", "off")}
    rng = np.random.default_rng(0)
    ratio = hierarchical_bootstrap(sides["on"], RESAMPLES, rng) / hierarchical_bootstrap(sides["off"], RESAMPLES, rng)
    low, high = np.percentile(ratio, [2.5, 97.5])
    medians = {side: [float(np.median(values)) for values in sides[side]] for side in sides}
    point = np.median(medians["on"]) / np.median(medians["off"])
    noise = float(np.std(np.log(medians["off"]), ddof=1)) if len(medians["off"]) > 1 else float("nan")
    print(
        f"{backend}: step median on {np.median(medians['on']):.3f} ms, off {np.median(medians['off']):.3f} ms "
        f"({len(sides['on'])}+{len(sides['off'])} runs); on/off {point:.4f}, 95% CI [{low:.4f}, {high:.4f}]"
        f" ({'contains' if low <= 1 <= high else 'excludes'} 1.0); run-to-run noise (sd of log medians, off) "
        f"{100 * noise:.1f}%"
    )
    compile_s = {side: runs.loc[runs["capture"] == side, "compile_s"].dropna() for side in ("on", "off")}
    if not compile_s["on"].empty and not compile_s["off"].empty:
        on, off = float(compile_s["on"].median()), float(compile_s["off"].median())
        print(
            f"{backend}: compile_s median on {on:.3f} s, off {off:.3f} s, difference {on - off:+.3f} s "
            f"({100 * (on / off - 1):+.1f}%; per-run values on {sorted(round(v, 3) for v in compile_s['on'])}, "
            f"off {sorted(round(v, 3) for v in compile_s['off'])})"
        )
    compiles = store.load_compiles(results, run_id=list(runs.loc[runs["capture"] == "on", "run_id"]))
    off = store.load_compiles(results, run_id=list(runs.loc[runs["capture"] == "off", "run_id"]))
    print(f"{backend}: {len(compiles)} compile events captured over the 'on' runs, {len(off)} over the 'off' runs")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default="cpu-compile,xla", help="comma-separated")
    parser.add_argument("--workload", default="gpt2")
    parser.add_argument("--mode", default="train")
    parser.add_argument("--rounds", type=int, default=4, help="on/off pairs per backend")
    parser.add_argument("--steps", type=int, default=20, help="measured steps per run")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--probe-rounds", type=int, default=4, help="on/off pairs of the in-process Dynamo probe")
    parser.add_argument("--probe-backend", default="inductor", help="torch.compile backend of the Dynamo probe")
    args = parser.parse_args()
    if args.probe_rounds:
        dynamo_overhead(args.probe_rounds, args.probe_backend)
    with tempfile.TemporaryDirectory(prefix="tpubench-capture-cost-") as scratch:
        results = Path(scratch) / "results"
        for backend in args.backends.split(","):
            for round_ in range(args.rounds):
                for capture in (True, False) if round_ % 2 == 0 else (False, True):
                    run_once(results, backend, capture, args)
            report(backend, results)


if __name__ == "__main__":
    main()
