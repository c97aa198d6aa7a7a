"""The precision and long-context check, for a lent NVIDIA machine: torchao precisions on a GPU.

Three parts, most important first, each run in its own worker with a timeout through the same
``SuiteRunner`` as ``tpubench run``, the store written after every run so that a session cut
short still returns what finished:

1. llama3 1b training on cuda-compile in bf16, fp8 (tensorwise) and fp8-rowwise: tokens/s of
   each beside bf16's, against torchao's published +25% (tensorwise) and +10% (rowwise) for
   Llama3-8B on 8 H100s, and each row's MFU against its own precision's peak;
2. llama3 1b inference (infer, and batch-1 decode where torchao's int8 weight-only claims
   1.6x) on cuda-compile in bf16, int8-wo and int4-wo, with each row's quality columns;
3. llama3 1b infer at 2K, 8K and 32K tokens with ``--attention flash`` and ``cudnn`` on cuda:
   the kernel each row read from its trace, attention's share, tokens/s by length.

    python benchmarks/gpu_precision_check.py --results /tmp/results --export "$OUT" [--budget-s 420]

``--cpu-smoke`` runs the same plan at tiny sizes on cpu and cpu-compile (SDPA's math path,
128 and 512 tokens), to check the script here, where no GPU is: it measures nothing a GPU
reader needs. ``--export`` writes flat parquet as ``gpu_check.py --export`` does.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")  # as the tpubench command

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]

from gpu_check import export  # noqa: E402  (benchmarks/ on the path first)

#: torchao's published Llama3-8B training speed-ups over bf16 on 8 H100s (its float8 README)
PUBLISHED_FP8 = {"fp8": 7690 / 6150 - 1, "fp8-rowwise": 6768 / 6150 - 1}
TRAIN_PRECISIONS = ("bf16", "fp8", "fp8-rowwise")
INFER_PRECISIONS = ("bf16", "int8-wo", "int4-wo")
LENGTHS = (2048, 8192, 32768)
KERNELS = ("flash", "cudnn")


def plans(smoke: bool) -> list[tuple[str, dict]]:
    """(what, plan options) in priority order; ``smoke``: the same at tiny sizes on the CPU."""
    size = "tiny" if smoke else "1b"
    compiled, eager = ("cpu-compile", "cpu") if smoke else ("cuda-compile", "cuda")
    common = {"sizes": [size], "warmup": 3, "steps": 10 if smoke else 20, "timeout_s": 300}
    found = [
        (f"train {p}", {**common, "backends": [compiled], "modes": ["train"], "precision": p}) for p in TRAIN_PRECISIONS
    ]
    inference = {**common, "backends": [compiled], "modes": ["infer", "decode"], "batch_size": 1}
    found += [(f"infer {p}", {**inference, "precision": p}) for p in INFER_PRECISIONS]
    lengths = (128, 512) if smoke else LENGTHS
    for kernel in ("math",) if smoke else KERNELS:
        found.append(
            (
                f"context {kernel}",
                {**common, "backends": [eager], "modes": ["infer"], "batch_size": 1, "seq_len": list(lengths),
                 "attention": kernel, "trace_attention": True},
            )
        )  # fmt: skip
    return found


def line(row: dict) -> str:
    if row["status"] != "ok":
        return f"{row['status']}: {row.get('error')}"
    quality = row.get("quality_flag") or ""
    share = row.get("attention_share")
    return (
        f"{row['tokens_per_s']:,.0f} tok/s, median {row['median_step_ms']:.2f} ms, MFU {row.get('mfu') or 0:.1%} "
        f"({row.get('mfu_peak') or 'no peak'})"
        + (f", kernel {row.get('attention_kernel')}, share {share:.2f}" if share is not None else "")
        + (f", quality: {quality}" if quality else "")
    )


def speedups(rows: list[dict]) -> None:
    """Each converted precision's tokens/s over bf16's, per mode, beside torchao's figure."""
    base = {r["mode"]: r["tokens_per_s"] for r in rows if r["precision"] == "bf16" and r["status"] == "ok"}
    for row in rows:
        if row["precision"] == "bf16" or row["status"] != "ok" or row["mode"] not in base:
            continue
        gain = row["tokens_per_s"] / base[row["mode"]] - 1
        published = PUBLISHED_FP8.get(row["precision"]) if row["mode"] == "train" else None
        said = f" (torchao, Llama3-8B on 8xH100: {published:+.0%})" if published is not None else ""
        print(f"  {row['precision']} {row['mode']}: {gain:+.1%} tokens/s over bf16{said}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, required=True)
    parser.add_argument("--export", type=Path, help="also write flat parquet of the store here")
    parser.add_argument("--budget-s", type=float, default=420.0, help="stop starting new parts after this")
    parser.add_argument("--cpu-smoke", action="store_true", help="the same plan at tiny sizes on the CPU")
    args = parser.parse_args()

    from tpubench.runner import SuiteRunner, plan

    started = time.monotonic()
    runner = SuiteRunner(args.results, tags={"check": "gpu-precision"})
    rows: list[dict] = []
    for what, options in plans(args.cpu_smoke):
        if time.monotonic() - started > args.budget_s:
            print(f"budget spent; not starting {what}", flush=True)
            continue
        precision = options.get("precision", "bf16")
        dtype = "bfloat16" if precision != "fp32" else "float32"
        for row in runner.run(plan(["llama3"], dtype=dtype, **options)):
            rows.append(row)
            shape = f"b{row.get('batch_size')}xs{row.get('seq_len')}"
            print(f"{what} {row['backend']} {row['mode']} {shape}: {line(row)}", flush=True)
    print("speed-ups over bf16:", flush=True)
    speedups([r for r in rows if r.get("attention") in (None, "auto")])
    if args.export and args.results.is_dir():
        export(args.results, args.export)


if __name__ == "__main__":
    main()
