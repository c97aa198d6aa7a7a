"""How much does tpubench's harness add to a step? Prints tpubench/bare median ratios.

For each tiny llm workload and mode on the CPU it makes two comparisons, both
interleaved (tpubench and bare blocks alternate, so drift hits both alike):

* in-worker (the requirement figure): in one process, on the same model and batch,
  blocks of tpubench's own timing protocol (``run_protocol`` with the cpu backend and a
  phase callback that serialises events, as the worker's does) alternate with blocks of
  a bare ``perf_counter`` loop. Same process, so the ratio isolates the harness's
  in-loop cost from process-to-process noise.
* end-to-end: real ``SuiteRunner`` runs, each in its worker process, alternate with
  fresh bare processes. On this CPU separate processes of the same loop differ by up
  to ~10%, so this ratio is printed with its spread, as a cross-check.

Requirement: in-worker ratio <= 1.02.

    python benchmarks/harness_overhead.py [--rounds 20] [--steps 20] [--process-rounds 6]
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


def in_worker_ratio(workload: str, mode: str, rounds: int, steps: int) -> tuple[float, float, float]:
    """(tpubench median, bare median, ratio) from alternating blocks in this process."""
    import io

    from tpubench.backends.cpu import CpuBackend
    from tpubench.measure import make_step, run_protocol
    from tpubench.spec import RunSpec
    from workloads import load

    instance = load(workload, "tiny")
    backend = CpuBackend()
    harness_step = make_step(instance, backend.prepare(instance.model), mode)
    bare_step = make_step(instance, instance.model, mode)  # the same ops, timed with nothing around them
    spec = RunSpec(
        "llm", workload, "tiny", "cpu", mode, "float32", instance.batch_size, instance.seq_len, warmup=1, steps=steps
    )
    sink = io.StringIO()

    def on_phase(phase: str, step: int, of: int) -> None:
        sink.write(json.dumps({"event": "phase", "phase": phase, "step": step, "of": of}) + "\n")

    ours, bare = [], []
    for round_index in range(rounds):
        for side in ("ours", "bare") if round_index % 2 == 0 else ("bare", "ours"):
            if side == "ours":
                ours.extend(run_protocol(spec, backend, harness_step, on_phase).measured_ms)
                continue
            bare_step()
            for _ in range(steps):
                start = time.perf_counter()
                bare_step()
                bare.append((time.perf_counter() - start) * 1e3)
    return statistics.median(ours), statistics.median(bare), statistics.median(ours) / statistics.median(bare)


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
    parser.add_argument("--rounds", type=int, default=20, help="in-worker alternations")
    parser.add_argument("--steps", type=int, default=20, help="steps per block")
    parser.add_argument("--process-rounds", type=int, default=6, help="end-to-end alternations (0: skip)")
    parser.add_argument("--bare", nargs=4, metavar=("WORKLOAD", "MODE", "WARMUP", "STEPS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.bare:
        workload, mode, warmup, steps = args.bare
        print(json.dumps(bare_loop(workload, mode, int(warmup), int(steps))))
        return

    header = f"{'workload':8} {'mode':5} {'tpubench ms':>11} {'bare ms':>8} {'ratio':>6}"
    print(f"{header}   end-to-end: ratio [min-max of per-round ratios]")
    worst = 0.0
    with tempfile.TemporaryDirectory() as results:
        for workload in ("gpt2", "llama3"):
            for mode in ("train", "infer"):
                ours_ms, bare_ms, ratio = in_worker_ratio(workload, mode, args.rounds, args.steps)
                worst = max(worst, ratio)
                line = f"{workload:8} {mode:5} {ours_ms:11.3f} {bare_ms:8.3f} {ratio:6.3f}"
                if args.process_rounds:
                    ours, bare = [], []
                    for _ in range(args.process_rounds):
                        ours.append(tpubench_median(workload, mode, 3, args.steps, Path(results)))
                        bare.append(bare_median(workload, mode, 3, args.steps))
                    per_round = [a / b for a, b in zip(ours, bare, strict=True)]
                    line += (
                        f"   {statistics.median(ours) / statistics.median(bare):.3f} "
                        f"[{min(per_round):.3f}-{max(per_round):.3f}]"
                    )
                print(line, flush=True)
    print(f"worst in-worker ratio {worst:.3f} (requirement <= 1.02): {'PASS' if worst <= 1.02 else 'FAIL'}")


if __name__ == "__main__":
    main()
