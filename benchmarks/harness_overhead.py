"""How much does tpubench's harness add to a step? Prints tpubench/bare median ratios.

For each tiny llm workload and mode, on the CPU (``--backend cpu``) or through torch_xla
(``--backend xla``, run with the torch_xla interpreter and ``PJRT_DEVICE=CPU``), it makes
two comparisons, both interleaved (tpubench and bare blocks alternate, so drift hits both
alike):

* in-worker (the requirement figure): in one process, on the same model and batch,
  blocks of tpubench's own timing protocol (``run_protocol`` with the backend and a phase
  callback that serialises events, as the worker's does) alternate with blocks of a bare
  loop written directly against torch / torch_xla (step, then ``torch_xla.sync()`` and
  ``wait_device_ops()`` on XLA, timed with ``perf_counter``). Same process, so the ratio
  isolates the harness's cost from process-to-process noise.
* end-to-end: real ``SuiteRunner`` runs, each in its worker process, alternate with
  fresh bare processes. On this CPU separate processes of the same loop differ by up
  to ~10%, so this ratio is printed with its spread, as a cross-check.

Requirement: in-worker ratio <= 1.02 (the ratio of the pooled medians), on every workload and
mode; the script prints ``met`` or ``NOT MET`` and exits 1 when it is missed. ``--record DIR``
stores each round's ratio (its tpubench block's median over its bare block's), in-worker and
end-to-end, as rows of a tpubench store first (:mod:`benchmarks.record`: workload
``tpubench-self/harness_overhead``).

    python benchmarks/harness_overhead.py [--rounds 20] [--steps 20] [--process-rounds 6] [--record DIR]
    PJRT_DEVICE=CPU .venv-xla/bin/python benchmarks/harness_overhead.py --backend xla
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

# As in tpubench's workers: an installed torch_tpu must not load into this process.
os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

import record  # noqa: E402
import torch  # noqa: E402 - after the autoload switch

from tpubench.backends import get_backend  # noqa: E402 - needs the checkout on sys.path
from tpubench.measure import make_step, run_protocol  # noqa: E402
from tpubench.runner import SuiteRunner, plan  # noqa: E402
from tpubench.spec import RunSpec  # noqa: E402
from workloads import Instance, get_workload, load  # noqa: E402


def bare_device(backend: str) -> tuple[torch.device, Callable[[], None]]:
    """The device and the end-of-step wait, written directly against torch / torch_xla."""
    if backend.startswith("xla"):
        import torch_xla
        import torch_xla.core.xla_model as xm

        def wait() -> None:
            torch_xla.sync()
            xm.wait_device_ops()

        return torch_xla.device(), wait
    return torch.device("cpu"), lambda: None


def bare_step(instance: Instance, mode: str) -> Callable[[], Any]:
    """The same work as tpubench's step, with its own optimizer and nothing around it."""
    if mode == "train":
        optimizer = torch.optim.AdamW(instance.model.parameters(), lr=1e-4)

        def train() -> None:
            instance.loss().backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        return train

    def infer() -> Any:
        with torch.no_grad():
            return instance.forward()

    return infer


def bare_samples(step: Callable[[], Any], wait: Callable[[], None], steps: int) -> list[float]:
    samples = []
    for _ in range(steps):
        start = time.perf_counter()
        output = step()
        wait()
        samples.append((time.perf_counter() - start) * 1e3)
        del output
    return samples


def tiny(workload: str, backend: str, device: torch.device) -> Instance:
    """The tiny size at the shape tpubench's plan gives ``backend`` (PJRT CPU: CPU-sized)."""
    shape = get_workload(workload).shape_for(get_backend(backend).device_kind)
    return load(workload, "tiny", device=device, batch_size=shape.batch_size, seq_len=shape.seq_len)


def bare_process(backend: str, workload: str, mode: str, warmup: int, steps: int) -> list[float]:
    device, wait = bare_device(backend)
    instance = tiny(workload, backend, device)
    step = bare_step(instance, mode)
    bare_samples(step, wait, warmup + 1)
    return bare_samples(step, wait, steps)


def in_worker_ratio(
    backend_name: str, workload: str, mode: str, rounds: int, steps: int
) -> tuple[float, float, list[float]]:
    """(tpubench median, bare median, each round's ratio of its blocks' medians) from
    alternating blocks in this process."""
    backend = get_backend(backend_name)
    device, wait = bare_device(backend_name)
    instance = tiny(workload, backend_name, device)
    harness_step = make_step(instance, backend.prepare(instance.model), mode)
    plain_step = bare_step(instance, mode)
    spec = RunSpec(
        "llm",
        workload,
        "tiny",
        backend_name,
        mode,
        "float32",
        instance.batch_size,
        **instance.shape.dims(),
        warmup=1,
        steps=steps,
    )
    sink = io.StringIO()

    def on_phase(phase: str, step: int, of: int) -> None:
        sink.write(json.dumps({"event": "phase", "phase": phase, "step": step, "of": of}) + "\n")

    ours: list[float] = []
    bare: list[float] = []
    per_round: list[float] = []
    bare_samples(plain_step, wait, 3)  # the bare side's own compile and warm-up
    for round_index in range(rounds):
        blocks: dict[str, list[float]] = {}
        for side in ("ours", "bare") if round_index % 2 == 0 else ("bare", "ours"):
            if side == "ours":
                blocks[side] = run_protocol(spec, backend, harness_step, on_phase).measured_ms
            else:
                bare_samples(plain_step, wait, 1)
                blocks[side] = bare_samples(plain_step, wait, steps)
        ours.extend(blocks["ours"])
        bare.extend(blocks["bare"])
        per_round.append(statistics.median(blocks["ours"]) / statistics.median(blocks["bare"]))
    return statistics.median(ours), statistics.median(bare), per_round


def end_to_end(backend: str, workload: str, mode: str, rounds: int, steps: int) -> tuple[float, list[float]]:
    """Median ratio and per-round ratios of real worker runs against fresh bare processes."""
    ours, bare = [], []
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}  # as tpubench gives its workers
    with tempfile.TemporaryDirectory() as results:
        runner = SuiteRunner(Path(results))
        for _ in range(rounds):
            specs = plan([workload], sizes=["tiny"], backends=[backend], modes=[mode], warmup=3, steps=steps)
            [row] = runner.run(specs)
            if row["status"] != "ok":
                raise RuntimeError(f"tpubench run failed: {row['error']}")
            ours.append(row["median_step_ms"])
            command = [sys.executable, __file__, "--bare", backend, workload, mode, "3", str(steps)]
            output = subprocess.run(command, capture_output=True, text=True, check=True, env=env).stdout
            bare.append(statistics.median(json.loads(output.splitlines()[-1])))
    per_round = [a / b for a, b in zip(ours, bare, strict=True)]
    return statistics.median(ours) / statistics.median(bare), per_round


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="cpu", choices=["cpu", "xla"])
    parser.add_argument("--rounds", type=int, default=20, help="in-worker alternations")
    parser.add_argument("--steps", type=int, default=20, help="steps per block")
    parser.add_argument("--process-rounds", type=int, default=6, help="end-to-end alternations (0: skip)")
    parser.add_argument("--record", help="store each round's ratio in this tpubench store (docs/benchmarks.md)")
    parser.add_argument("--bare", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    started = datetime.now(UTC)
    if args.bare:
        backend, workload, mode, warmup, steps = args.bare
        print(json.dumps(bare_process(backend, workload, mode, int(warmup), int(steps))))
        return

    print(
        f"backend {args.backend}: {'workload':8} {'mode':5} {'tpubench ms':>11} {'bare ms':>8} {'ratio':>6}"
        "   end-to-end: ratio [min-max of per-round ratios]"
    )
    worst = (0.0, "")
    figures: dict[str, tuple[str, list[float]]] = {}
    for workload in ("gpt2", "llama3"):
        for mode in ("train", "infer"):
            ours_ms, bare_ms, rounds = in_worker_ratio(args.backend, workload, mode, args.rounds, args.steps)
            ratio = ours_ms / bare_ms
            worst = max(worst, (ratio, f"{workload} {mode}"))
            figures[f"{args.backend} {workload} {mode} in-worker"] = ("ratio", rounds)
            line = f"backend {args.backend}: {workload:8} {mode:5} {ours_ms:11.3f} {bare_ms:8.3f} {ratio:6.3f}"
            if args.process_rounds:
                median_ratio, per_round = end_to_end(args.backend, workload, mode, args.process_rounds, args.steps)
                figures[f"{args.backend} {workload} {mode} end-to-end"] = ("ratio", per_round)
                line += f"   {median_ratio:.3f} [{min(per_round):.3f}-{max(per_round):.3f}]"
            print(line, flush=True)
    if args.record:
        print("stored:", ", ".join(record.write(args.record, "harness_overhead", figures, started)))
    requirement = f"in-worker ratio <= 1.02 on every workload: the worst {worst[0]:.3f} ({worst[1]})"
    record.verdict([(requirement, worst[0] <= 1.02)])


if __name__ == "__main__":
    main()
