"""What does ``record_shapes`` cost a profiled step? The roofline counts FLOPs and bytes from
the shapes torch.profiler records; tpubench's profiler records them (``record_shapes=True``
in tpubench/backends/base.py), so this checks what that costs against a profile without them
and against no profiler at all.

Rounds alternate the three (no profiler, profiled without shapes, profiled with shapes) so
that drift of a busy host hits all alike; each prints per-step wall time over ``--steps``
steps, the Chrome export's time and the trace's size, then the medians and the load average.

    python benchmarks/record_shapes_cost.py [--workload gpt2] [--size tiny] [--rounds 4] [--steps 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")  # an installed torch_tpu must not load

import torch
from torch.profiler import ProfilerActivity, profile

import workloads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="gpt2")
    parser.add_argument("--size", default="tiny")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    instance = workloads.load(args.workload, args.size, device="cpu")

    def step() -> None:
        instance.loss().backward()

    def plain() -> tuple[float, float, int]:
        start = time.perf_counter()
        for _ in range(args.steps):
            step()
        return (time.perf_counter() - start) / args.steps * 1e3, 0.0, 0

    def traced(shapes: bool) -> tuple[float, float, int]:
        start = time.perf_counter()
        with profile(activities=[ProfilerActivity.CPU], record_shapes=shapes) as profiler:
            for _ in range(args.steps):
                step()
        exported = time.perf_counter()
        with tempfile.TemporaryDirectory() as scratch:
            path = os.path.join(scratch, "trace.json")
            profiler.export_chrome_trace(path)
            size = os.path.getsize(path)
        return (exported - start) / args.steps * 1e3, (time.perf_counter() - exported) * 1e3, size

    for _ in range(2):
        step()
    kinds = {
        "no profiler": plain,
        "record_shapes=False": lambda: traced(False),
        "record_shapes=True": lambda: traced(True),
    }
    found: dict[str, list[tuple[float, float, int]]] = {name: [] for name in kinds}
    for _ in range(args.rounds):
        for name, measure in kinds.items():
            found[name].append(measure())
    print(f"{args.workload}/{args.size} train on the CPU, torch {torch.__version__}, load average {os.getloadavg()}")
    for name, rounds in found.items():
        steps = [round(r[0]) for r in rounds]
        median = statistics.median(r[0] for r in rounds)
        export = statistics.median(r[1] for r in rounds)
        print(
            f"{name:>20}: ms/step {steps}, median {median:,.0f}; export {export:,.0f} ms; trace {rounds[-1][2]:,} bytes"
        )


if __name__ == "__main__":
    main()
