"""Serving-style figures (TTFT, TPOT, output tokens/s) for the llm workloads on cpu and xla.

Runs ``decode`` mode through the real runner (one worker per run, static KV cache,
greedy), at tiny and 124m (gpt2) / tiny (llama3), and prints the table. XLA runs use the
torch_xla interpreter given with ``--xla-python`` on ``PJRT_DEVICE=CPU``.

    python benchmarks/serving.py --xla-python ~/.cache/tpubench/venv-xla/bin/python
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

# The parent only plans and stores: an installed torch_tpu must not load into it.
os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tpubench.runner import SuiteRunner, plan  # noqa: E402

CASES = [("gpt2", "tiny"), ("llama3", "tiny"), ("gpt2", "124m")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--xla-python", help="torch_xla interpreter; without it only cpu runs")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--gen-len", type=int, default=32)
    parser.add_argument("--generations", type=int, default=5, help="measured generations per run")
    args = parser.parse_args()
    os.environ.setdefault("PJRT_DEVICE", "CPU")
    backends = ["cpu", "xla"] if args.xla_python else ["cpu"]
    pythons = {"xla": args.xla_python} if args.xla_python else {}
    print(
        f"decode, batch {args.batch_size}, prompt {args.prompt_len}, {args.gen_len} output tokens, "
        f"{args.generations} generations; p50 (p99) in ms"
    )
    print(
        f"{'workload':8} {'size':5} {'backend':8} {'TTFT':>16} {'TPOT':>16} {'ITL p99':>8} {'out tok/s':>10} "
        f"{'total tok/s':>11}"
    )
    with tempfile.TemporaryDirectory() as results:
        runner = SuiteRunner(Path(results), pythons=pythons)
        for workload, size in CASES:
            specs = plan(
                [workload],
                sizes=[size],
                backends=backends,
                modes=["decode"],
                batch_size=args.batch_size,
                seq_len=args.prompt_len,
                gen_len=args.gen_len,
                warmup=2,
                steps=args.generations,
                timeout_s=900,
            )
            for row in runner.run(specs):
                if row["status"] != "ok":
                    print(f"{workload:8} {size:5} {row['backend']:8} {row['status']}: {row['error']}")
                    continue
                print(
                    f"{workload:8} {size:5} {row['backend']:8} "
                    f"{row['ttft_p50_ms']:8.2f} ({row['ttft_p99_ms']:6.2f}) "
                    f"{row['tpot_p50_ms']:8.2f} ({row['tpot_p99_ms']:6.2f}) {row['itl_p99_ms']:8.2f} "
                    f"{row['output_tokens_per_s']:10.1f} {row['total_tokens_per_s']:11.1f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
