"""A run's measured peak against its memory breakdown, for two standard models on CPU.

For each model one ``tpubench run`` as a user types it (a real worker, a real store), then
its row: the peak above the baseline (the worker's resident set before the model existed),
the exactly counted weights, gradients and AdamW state, the activations+temporaries the
peak leaves, and the admitting estimate. With ``--profile-memory`` the row's profiled step
is read too: the most each torch.profiler category held, and its ratio to the counted part.

On CPU the peak is the worker's peak resident set (VmHWM): it also holds what the allocator
keeps and what libraries map during the first steps, which the activations figure takes in.

    python benchmarks/memory_breakdown.py [--profile-memory] [--steps 2]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")  # like the CLI's parent
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tpubench import store  # noqa: E402
from tpubench.analysis import memory as analysis  # noqa: E402

MODELS = {
    "gpt2 124m": "--workload gpt2 --size 124m --batch-size 2 --seq-len 128",
    "resnet 50": "--workload resnet --size 50 --batch-size 4 --image-size 224",
}


def mib(value: float | None) -> str:
    return "-" if value is None else f"{value / 2**20:9.1f}"


def measure(name: str, args: str, results: Path, steps: int, profile: bool) -> None:
    line = f"run {args} --backend cpu --mode train --steps {steps} --warmup 1 --results {results}"
    line += " --profile-memory" if profile else ""
    done = subprocess.run([sys.executable, "-m", "tpubench", *line.split()], capture_output=True, text=True, cwd=ROOT)
    if done.returncode:
        print(f"{name}: tpubench run failed\n{done.stderr[-2000:]}")
        return
    runs = store.load_runs(results)
    row = runs.iloc[-1].to_dict()
    if row["status"] != "ok":
        print(f"{name}: {row['status']}: {row['error']}")
        return
    parts = analysis.run_parts(row)
    counted = (parts["weights"] or 0) + (parts["gradients"] or 0) + (parts["optimizer"] or 0)
    above = row["peak_mem_bytes"] - row["baseline_mem_bytes"]
    print(f"{name} (run {row['run_id']}, load average while measured {row['host_load_1m']:.1f})")
    print(f"  peak above baseline    {mib(above)} MiB   (peak {mib(row['peak_mem_bytes'])}, "
          f"baseline {mib(row['baseline_mem_bytes'])})")  # fmt: skip
    for part, (_, label) in analysis.PARTS.items():
        print(f"  {label:<26} {mib(parts[part])} MiB")
    total = counted + (parts["activations"] or 0)
    print(f"  sum of the parts       {mib(total)} MiB   (counted parts alone {mib(counted)}; activations are the rest)")
    print(f"  admitting estimate     {mib(row['estimated_mem_bytes'])} MiB")
    if profile:
        memory = store.load_memory(results, run_id=row["run_id"])
        peaks = analysis.timeline_peaks(memory)
        agreement = analysis.profiler_agreement(row, memory)
        print("  profiled step, most held per category (MiB): "
              + ", ".join(f"{c} {v / 2**20:.1f}" for c, v in peaks.items()))  # fmt: skip
        print("  profiler / counted: " + ", ".join(f"{r.part} {r.ratio:.4f}" for r in agreement.itertuples()))
        wide = analysis.timeline(memory)
        total = wide.drop(columns="t_ms").sum(axis=1)
        print(f"  profiled step's peak, all categories {mib(float(total.max()))} MiB (tensors alive at once; "
              f"the peak above baseline also holds the allocator's and libraries' pages)")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--profile-memory", action="store_true")
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.1f} (2-core CI machine shared with other work)")
    for name, model in MODELS.items():
        with tempfile.TemporaryDirectory(prefix="tpubench-memory-") as scratch:
            measure(name, model, Path(scratch), args.steps, args.profile_memory)


if __name__ == "__main__":
    main()
