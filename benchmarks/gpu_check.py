"""The GPU check, for a lent NVIDIA machine: the llm suite on cuda and cuda-compile in bf16.

Runs through the same ``SuiteRunner`` as ``tpubench run`` (the CLI is bypassed only
because the device image's packages are fixed), most important runs first, each in its
own worker with a timeout, writing the parquet store after every run, so a cut-short
session still returns what finished. Then captures one ``torch.profiler`` trace of gpt2
124m train on cuda (3 steps after 3 warm-up steps) as a gzipped Chrome trace for Perfetto,
plus the top ops table.

    python benchmarks/gpu_check.py --results /tmp/results --export "$OUT" [--budget-s 300]

``--export`` writes the store's two tables as flat ``runs.parquet`` and ``steps.parquet``,
and the trace, into a folder: the device tool returns no folder whose name has an ``=``,
which the store's date partitions have. On the H200 the whole plan took about 440 s.
"""

from __future__ import annotations

import argparse
import gzip
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# (workload, size, backend, modes) in priority order.
PLAN = [
    ("gpt2", "tiny", "cuda", ("train", "infer")),
    ("llama3", "tiny", "cuda", ("train", "infer")),
    ("gpt2", "124m", "cuda", ("train", "infer")),
    ("gpt2", "124m", "cuda-compile", ("train", "infer")),
    ("llama3", "1b", "cuda", ("train", "infer")),
    ("gpt2", "tiny", "cuda-compile", ("train", "infer")),
    ("llama3", "tiny", "cuda-compile", ("train", "infer")),
    ("llama3", "1b", "cuda-compile", ("train", "infer")),
]


def capture_trace(out: Path) -> None:
    """3 profiled steps of gpt2 124m bf16 train on cuda, after 3 unprofiled warm-up steps."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from workloads import load

    instance = load("gpt2", "124m", device="cuda", dtype=torch.bfloat16)
    optimizer = torch.optim.AdamW(instance.model.parameters(), lr=1e-4)

    def step() -> None:
        instance.loss().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as profiler:
        for _ in range(3):
            step()
        torch.cuda.synchronize()
    out.mkdir(parents=True, exist_ok=True)
    raw = out / "gpt2-124m-train-cuda.json"
    profiler.export_chrome_trace(str(raw))
    with open(raw, "rb") as source, gzip.open(f"{raw}.gz", "wb") as target:
        shutil.copyfileobj(source, target)
    raw.unlink()
    table = profiler.key_averages().table(sort_by="cuda_time_total", row_limit=30)
    (out / "gpt2-124m-train-cuda-top-ops.txt").write_text(table)
    print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, required=True)
    parser.add_argument("--export", type=Path, help="also write flat runs/steps parquet and the trace here")
    parser.add_argument("--budget-s", type=float, default=300.0, help="stop starting new runs after this")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--trace-only", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.trace_only:
        capture_trace(args.trace_only)
        return

    from tpubench.runner import SuiteRunner, plan

    started = time.monotonic()
    runner = SuiteRunner(args.results, tags={"check": "gpu"})
    for workload, size, backend, modes in PLAN:
        if time.monotonic() - started > args.budget_s:
            print(f"budget spent; not starting {workload}/{size} on {backend}", flush=True)
            continue
        specs = plan(
            [workload],
            sizes=[size],
            backends=[backend],
            modes=list(modes),
            dtype="bfloat16",
            warmup=3,
            steps=args.steps,
            timeout_s=240,
        )
        for row in runner.run(specs):
            figures = (
                f"median {row['median_step_ms']:.2f} ms, {row['tokens_per_s']:,.0f} tok/s, "
                f"MFU {row['mfu'] or 0:.1%}, first {row['first_step_s']:.1f} s, "
                f"compiles {row['compile_count']}"
                if row["status"] == "ok"
                else row.get("error")
            )
            print(f"{workload}/{size} {backend} {row['mode']}: {row['status']}: {figures}", flush=True)
    out = args.export or args.results
    if args.export and args.results.is_dir():  # nothing ran: nothing to export
        from tpubench import store

        args.export.mkdir(parents=True, exist_ok=True)
        store.load_runs(args.results).to_parquet(args.export / "runs.parquet")
        store.load_steps(args.results).to_parquet(args.export / "steps.parquet")
    trace = subprocess.run(
        [sys.executable, __file__, "--results", str(args.results), "--trace-only", str(out / "trace")],
        timeout=180,
    )
    print(f"trace capture exit code {trace.returncode}")


if __name__ == "__main__":
    main()
