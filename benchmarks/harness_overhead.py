"""How much does tpubench's harness add to a step? Prints tpubench/bare median ratios.

For each tiny llm workload and mode on the CPU, it alternates (interleaves) rounds of

* tpubench: a real ``SuiteRunner`` run, in its worker process, with the full protocol;
* bare: a fresh process running the same model and batch in a plain loop timed with
  ``time.perf_counter`` and nothing else,

and compares the median of the per-round medians. Both sides build the model through
``workloads.load`` with the same seed, shape and thread count. Requirement: ratio <= 1.02.

    python benchmarks/harness_overhead.py [--rounds 5] [--steps 30]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def bare_loop(workload: str, mode: str, warmup: int, steps: int) -> list[float]:
    """The reference: the same step as tpubench's, with no harness around it."""
    import torch

    from workloads import load

    instance = load(workload, "tiny")
    if mode == "train":
        optimizer = torch.optim.AdamW(instance.model.parameters(), lr=1e-4)

        def step() -> None:
            instance.loss().backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    else:
        instance.model.eval()

        def step() -> None:
            with torch.no_grad():
                instance.forward()

    for _ in range(warmup + 1):
        step()
    samples = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        samples.append((time.perf_counter() - start) * 1e3)
    return samples


def bare_median(workload: str, mode: str, warmup: int, steps: int) -> float:
    command = [sys.executable, __file__, "--bare", workload, mode, str(warmup), str(steps)]
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}  # as tpubench gives its workers
    output = subprocess.run(command, capture_output=True, text=True, check=True, env=env).stdout
    return statistics.median(json.loads(output))


def tpubench_median(workload: str, mode: str, warmup: int, steps: int, results: Path) -> float:
    from tpubench.runner import SuiteRunner, plan
    from workloads import get_workload

    specs = plan([get_workload(workload)], ["tiny"], ["cpu"], [mode], "float32", None, None, warmup=warmup, steps=steps)
    [row] = SuiteRunner(results).run(specs)
    if row["status"] != "ok":
        raise RuntimeError(f"tpubench run failed: {row['error']}")
    return row["median_step_ms"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--bare", nargs=4, metavar=("WORKLOAD", "MODE", "WARMUP", "STEPS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.bare:
        workload, mode, warmup, steps = args.bare
        print(json.dumps(bare_loop(workload, mode, int(warmup), int(steps))))
        return

    print(f"{'workload':10} {'mode':6} {'tpubench ms':>12} {'bare ms':>9} {'ratio':>7}")
    worst = 0.0
    with tempfile.TemporaryDirectory() as results:
        for workload in ("gpt2", "llama3"):
            for mode in ("train", "infer"):
                ours, bare = [], []
                for _ in range(args.rounds):
                    ours.append(tpubench_median(workload, mode, args.warmup, args.steps, Path(results)))
                    bare.append(bare_median(workload, mode, args.warmup, args.steps))
                ratio = statistics.median(ours) / statistics.median(bare)
                worst = max(worst, ratio)
                print(
                    f"{workload:10} {mode:6} {statistics.median(ours):12.3f} {statistics.median(bare):9.3f} "
                    f"{ratio:7.3f}"
                )
    print(f"worst ratio {worst:.3f} (requirement <= 1.02): {'PASS' if worst <= 1.02 else 'FAIL'}")


if __name__ == "__main__":
    main()
