"""The GPU check, for a lent NVIDIA machine: the llm suite on cuda and cuda-compile in bf16.

Runs through the same ``SuiteRunner`` as ``tpubench run`` (the CLI is bypassed only
because the device image's packages are fixed), most important runs first, each in its
own worker with a timeout, writing the parquet store after every run, so a cut-short
session still returns what finished. gpt2 124m on cuda is also profiled through the
harness's own ``--profile`` path (3 traced steps after the measured ones), so the check
covers tpubench's CUDA trace capture too.

    python benchmarks/gpu_check.py --results /tmp/results --export "$OUT" [--budget-s 300] [--only-cache-check]

Then (budget allowing) the compile cache's persistence check, which PJRT CPU and this
host's Inductor cannot give: gpt2 tiny on cuda-compile (and on xla with PJRT_DEVICE=CUDA
when ``--xla-python`` names a torch_xla interpreter) runs twice with one
``--compile-cache``; the second run's ``compiles`` rows must all say ``disk_hit``, which it
prints per run as ``cache states: {...}`` and exports as ``compiles.parquet``.

Then the memory and energy check (``--only-memory-energy-check`` runs it alone, well under a
minute): gpt2 124m train on cuda with ``--profile-memory``, printing the counted parts, the
activations the peak leaves, torch.profiler's categories against the counted parts, and the
NVML energy columns (``energy_source`` must be ``nvml_counter``; it needs nvidia-ml-py, the
``[gpu]`` extra, in the device image: without it the row says ``none`` and why).

Then the ceilings (``--only-ceilings`` runs them alone): ``tpubench ceilings --backend cuda
--backend cuda-compile`` for bfloat16, float16, tf32 and fp8 through the real CLI, printing each
matmul ceiling beside the data sheet, and the bfloat16 one beside mamf-finder's published best
on an H100 SXM (794.5 of 989 TFLOP/s, 80% of the sheet).

``--export`` writes the store's tables as flat ``runs.parquet`` and ``steps.parquet``,
and the traces gzipped, into a folder: the device tool returns no folder whose name has
an ``=``, which the store's date partitions have. On the H200 the whole plan took about
440 s.
"""

from __future__ import annotations

import argparse
import gzip
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

# like the tpubench command: an installed TPU plugin must not load into this process
os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# (workload, size, backend, modes) in priority order.
PLAN = [
    ("gpt2", "tiny", "cuda", ("train", "infer")),
    ("llama3", "tiny", "cuda", ("train", "infer")),
    ("gpt2", "124m", "cuda", ("train", "infer")),  # profiled
    ("gpt2", "124m", "cuda-compile", ("train", "infer")),
    ("llama3", "1b", "cuda", ("train", "infer")),
    ("gpt2", "tiny", "cuda-compile", ("train", "infer")),
    ("llama3", "tiny", "cuda-compile", ("train", "infer")),
    ("llama3", "1b", "cuda-compile", ("train", "infer")),
]


PROFILED = ("gpt2", "124m", "cuda")
PROFILE_STEPS = 3
#: the ceilings check: both CUDA backends, each tensor-core dtype of an H100/H200
CEILING_BACKENDS = ("cuda", "cuda-compile")
CEILING_DTYPES = ("bfloat16", "float16", "tf32", "fp8")
#: mamf-finder's best bfloat16 matmul on an H100 SXM over its data sheet (stas00/ml-engineering)
MAMF_FINDER_SHARE = 794.5 / 989
#: the persistent-cache check: (workload, size, backend), each run twice with one --compile-cache
CACHE_CHECK = [("gpt2", "tiny", "cuda-compile"), ("gpt2", "tiny", "xla")]


def export(results: Path, out: Path) -> None:
    """Flat copies of the runs and steps tables, and every trace gzipped, for the device tool."""
    from tpubench import store

    out.mkdir(parents=True, exist_ok=True)
    store.load_runs(results).to_parquet(out / "runs.parquet")
    store.load_steps(results).to_parquet(out / "steps.parquet")
    store.load_compiles(results).to_parquet(out / "compiles.parquet")
    store.load_memory(results).to_parquet(out / "memory.parquet")
    store.load_ceilings(results).to_parquet(out / "ceilings.parquet")
    for trace in (results / "traces").glob("*/trace.json"):
        with open(trace, "rb") as source, gzip.open(out / f"trace-{trace.parent.name}.json.gz", "wb") as target:
            shutil.copyfileobj(source, target)


def cache_check(results: Path, xla_python: str | None) -> None:
    """Each CACHE_CHECK config twice with one --compile-cache: cold, then warm from disk.

    On a GPU (Inductor's FX-graph cache; XLA's persistent cache, which PJRT CPU cannot
    load) the warm run's compile rows should all be ``disk_hit``. Prints each run's cache
    states and first-step compiles for the reader to judge; nothing is asserted here.
    """
    import tempfile

    from tpubench import store
    from tpubench.runner import SuiteRunner, plan

    if xla_python:
        os.environ.setdefault("PJRT_DEVICE", "CUDA")
    runner = SuiteRunner(results, pythons={"xla": xla_python} if xla_python else {}, tags={"check": "compile-cache"})
    for workload, size, backend in CACHE_CHECK:
        if backend.startswith("xla") and not xla_python:
            print(f"cache check: {backend} skipped (no --xla-python)", flush=True)
            continue
        cache = tempfile.mkdtemp(prefix="tpubench-cache-check-")
        for attempt in ("cold", "warm"):
            specs = plan(
                [workload], sizes=[size], backends=[backend], modes=["infer"], dtype="bfloat16", warmup=1, steps=3,
                timeout_s=240, compile_cache=cache,
            )  # fmt: skip
            for row in runner.run(specs):
                compiles = store.load_compiles(results, run_id=row["run_id"], event="compile")
                states = compiles[compiles.cache.notna()].groupby("cache").size().to_dict()
                print(
                    f"cache check {backend} {attempt}: {row['status']}, first-step compiles "
                    f"{row.get('first_step_compiles')}, compile_s {row.get('compile_s')}, cache states: {states}",
                    flush=True,
                )


def memory_energy_check(results: Path, steps: int) -> None:
    """gpt2 124m train on cuda with --profile-memory: the breakdown, the profiler's agreement
    with the counted parts, and NVML's energy columns, printed for the reader to judge."""
    from tpubench import store
    from tpubench.analysis import memory
    from tpubench.runner import SuiteRunner, plan

    runner = SuiteRunner(results, tags={"check": "memory-energy"})
    specs = plan(
        ["gpt2"], sizes=["124m"], backends=["cuda"], modes=["train"], dtype="bfloat16", warmup=3, steps=steps,
        timeout_s=240, profile_memory=True,
    )  # fmt: skip
    for row in runner.run(specs):
        if row["status"] != "ok":
            print(f"memory/energy check: {row['status']}: {row.get('error')}", flush=True)
            continue
        parts = {part: row.get(column) for part, (column, _) in memory.PARTS.items()}
        print(f"memory check: peak {row['peak_mem_bytes']}, parts {parts}, source {row['memory_breakdown_source']}")
        rows = store.load_memory(results, run_id=row["run_id"])
        agreement = memory.profiler_agreement(row, rows)
        print(f"memory check: profiler / counted {agreement.to_dict('records')}", flush=True)
        energy = {key: row.get(key) for key in ("energy_source", "energy_j", "joules_per_token", "avg_power_w",
                                                "energy_window_s", "energy_steps")}  # fmt: skip
        print(f"energy check: {energy}; notes: {row.get('warnings')}", flush=True)


def ceilings_check(results: Path, timeout_s: float) -> None:
    """``tpubench ceilings`` on both CUDA backends through the real CLI, then each matmul
    ceiling beside the data sheet, and bfloat16's beside mamf-finder's share of it."""
    import pandas as pd

    from tpubench import store
    from tpubench.analysis import ceilings

    command = [sys.executable, "-m", "tpubench", "ceilings", "--results", str(results), "--tag", "check=gpu"]
    command += [flag for backend in CEILING_BACKENDS for flag in ("--backend", backend)]
    command += [flag for dtype in CEILING_DTYPES for flag in ("--dtype", dtype)]
    print(f"ceilings check: {' '.join(command[1:])}", flush=True)
    try:
        done = subprocess.run(command, timeout=timeout_s, check=False)
        print(f"ceilings check: exit {done.returncode}", flush=True)
    except subprocess.TimeoutExpired:
        print(f"ceilings check: still running after {timeout_s:.0f} s; what finished was stored", flush=True)
    lines = ceilings.summary(store.load_ceilings(results))
    for line in lines[lines["kind"] == "matmul"].to_dict("records"):
        ratio = f"{line['ratio']:.1%} of the data sheet" if pd.notna(line["ratio"]) else "no data-sheet entry"
        print(
            f"ceiling {line['backend']} {line['dtype']}: {line['median_rate'] / 1e12:,.1f} TFLOP/s median "
            f"(max {line['max_rate'] / 1e12:,.1f}) at {line['shape']}, {ratio}"
            + (f"; mamf-finder's H100 SXM: {MAMF_FINDER_SHARE:.1%}" if line["dtype"] == "bfloat16" else ""),
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, required=True)
    parser.add_argument("--export", type=Path, help="also write flat runs/steps parquet and the trace here")
    parser.add_argument("--budget-s", type=float, default=300.0, help="stop starting new runs after this")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--only-cache-check", action="store_true", help="run only the persistent-cache check")
    parser.add_argument("--only-memory-energy-check", action="store_true", help="run only the memory/energy check")
    parser.add_argument("--only-ceilings", action="store_true", help="run only tpubench ceilings on cuda")
    parser.add_argument("--xla-python", help="a torch_xla interpreter: adds xla (PJRT_DEVICE=CUDA) to the cache check")
    args = parser.parse_args()

    from tpubench.runner import SuiteRunner, plan

    started = time.monotonic()
    runner = SuiteRunner(args.results, tags={"check": "gpu"})
    if args.only_memory_energy_check or args.only_ceilings:
        if args.only_memory_energy_check:
            memory_energy_check(args.results, args.steps)
        if args.only_ceilings:
            ceilings_check(args.results, args.budget_s)
        if args.export:
            export(args.results, args.export)
        return
    for workload, size, backend, modes in [] if args.only_cache_check else PLAN:
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
            profile_steps=PROFILE_STEPS if (workload, size, backend) == PROFILED else 0,
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
    if time.monotonic() - started < args.budget_s or args.only_cache_check:
        cache_check(args.results, args.xla_python)
    if time.monotonic() - started < args.budget_s and not args.only_cache_check:
        memory_energy_check(args.results, args.steps)
    left = args.budget_s - (time.monotonic() - started)
    if left > 0 and not args.only_cache_check:
        ceilings_check(args.results, left)
    if args.export and args.results.is_dir():  # nothing ran: nothing to export
        export(args.results, args.export)


if __name__ == "__main__":
    main()
