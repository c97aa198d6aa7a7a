"""Check tpubench's CPU ceilings against bare loops timed in this process.

    python benchmarks/ceilings_check.py [--results DIR] [--size 2048]

1. The float32 matmul ceiling at N^3 (default 2048^3) from ``tpubench ceilings`` (a worker,
   the device lock, the cache flush, the sample protocol) against a bare ``torch.mm(a, b,
   out=c)`` loop here, with the same thread count and no flush.
   The bare loop runs before and after the sweep, so its two figures bracket the sweep's load.
   The bare loops hold the CPU's device lock, as the sweep's worker does: other tpubench CPU
   runs on the host then wait for them too, and both measure under the same contention; the
   script runs in a session of its own, as a worker does (:func:`own_session`).
2. The STREAM triad at the sweep's largest arrays (4x the last-level cache) against numpy
   here. numpy has no fused triad: ``a = b + s c`` is two passes (``a = s c``, then
   ``a += b``) that move 5 arrays, not STREAM's 3; its bandwidth is counted with the 5 it
   really moves, so both figures are bytes moved per second.

The two should agree within 10 % on an idle host; the load average is printed beside
them, since a busy host (other processes on the cores) spreads both.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")  # like the CLI's parent: no TPU plugin here
import torch

from tpubench import devicelock
from tpubench.ceilings import CeilingSpec
from tpubench.runner import SuiteRunner, run_ceilings

SAMPLES = 10


def bare_mm(size: int) -> float:
    """Median FLOP/s of ``torch.mm`` at size^3 in this process, after two warm-up calls."""
    generator = torch.Generator().manual_seed(0)
    a, b = (torch.randn(size, size, generator=generator) for _ in range(2))
    c = torch.empty(size, size)
    for _ in range(2):
        torch.mm(a, b, out=c)
    times = []
    for _ in range(SAMPLES):
        start = time.perf_counter()
        torch.mm(a, b, out=c)
        times.append(time.perf_counter() - start)
    return 2 * size**3 / statistics.median(times)


def bare_triad(array_bytes: int) -> float:
    """Median bytes per second of numpy's two-pass triad over arrays of ``array_bytes``."""
    n = array_bytes // 8
    a, b, c = np.zeros(n), np.full(n, 2.0), np.ones(n)
    times = []
    for index in range(SAMPLES + 2):
        start = time.perf_counter()
        np.multiply(c, 0.999, out=a)
        np.add(a, b, out=a)
        if index >= 2:
            times.append(time.perf_counter() - start)
    return 5 * n * 8 / statistics.median(times)


def own_session() -> None:
    """Run this script in a session of its own, as tpubench starts each worker: with the
    kernel's autogroup scheduling (Linux's default on desktops and many servers) each session
    is one scheduling group, so on a busy host a loop in the shell's session got half the CPU
    time a worker got (5.8 against 10.6 GFLOP/s for the same loop here, load average 20)."""
    if os.getsid(0) != os.getpid():
        done = subprocess.run([sys.executable, *sys.argv], start_new_session=True)
        raise SystemExit(done.returncode)


def bare_torch_triad(array_bytes: int) -> float:
    """Median bytes per second (STREAM's 3 arrays) of torch's one-pass triad, the kernel the
    sweep times, in a bare loop: it tells the harness's cost apart from torch's against numpy's."""
    n = array_bytes // 4
    a, b, c = torch.zeros(n), torch.full((n,), 2.0), torch.ones(n)
    times = []
    for index in range(SAMPLES + 2):
        start = time.perf_counter()
        torch.add(b, c, alpha=0.999, out=a)
        if index >= 2:
            times.append(time.perf_counter() - start)
    return 3 * n * 4 / statistics.median(times)


def main() -> None:
    own_session()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", default=None, help="store for the ceilings rows (default: a temporary one)")
    parser.add_argument("--size", type=int, default=2048, help="matmul M=N=K to compare at")
    args = parser.parse_args()
    results = args.results or tempfile.mkdtemp(prefix="tpubench-ceilings-check-")
    print(f"load average before: {os.getloadavg()}")
    # the bare loops run before and after the sweep: on a shared host the load drifts, and the
    # two figures bracket the sweep's conditions
    with devicelock.hold("cpu"):  # as the sweep's worker holds it: other tpubench CPU runs wait for both
        mm_before = bare_mm(args.size)
    specs = [
        CeilingSpec("cpu", "matmul", dtypes=("float32",), max_size=args.size),
        CeilingSpec("cpu", "memory"),
    ]
    rows = run_ceilings(SuiteRunner(results), specs)
    square = [r for r in rows if r["kind"] == "matmul" and r["status"] == "ok" and r["m"] == args.size]
    triads = [r for r in rows if r["kind"] == "memory" and r["status"] == "ok" and r["op"] == "triad"]
    if not square or not triads:
        raise SystemExit(f"the sweep did not reach {args.size}^3 or a triad: {[r.get('error') for r in rows]}")
    torch.set_num_threads(square[0]["num_threads"])
    largest = max(triads, key=lambda r: r["size_bytes"])
    with devicelock.hold("cpu"):
        mm_after = bare_mm(args.size)
        triad = bare_triad(largest["size_bytes"])
        torch_triad = bare_torch_triad(largest["size_bytes"])
    print(f"load average after: {os.getloadavg()}")
    point = square[0]
    print(f"matmul float32 {args.size}^3 ({point['num_threads']} threads):")
    print(f"  tpubench ceiling  median {point['median_rate'] / 1e9:8.2f} GFLOP/s  max {point['max_rate'] / 1e9:8.2f}")
    print(f"  bare torch.mm     median {mm_before / 1e9:8.2f} GFLOP/s before, {mm_after / 1e9:8.2f} after")
    ratios = sorted(point["median_rate"] / mm for mm in (mm_before, mm_after))
    print(f"  ratio tpubench / bare: {ratios[0]:.3f} .. {ratios[1]:.3f}")
    arrays, cache = largest["size_bytes"] / 2**20, largest["llc_bytes"] / 2**20
    print(f"STREAM triad, arrays of {arrays:g} MiB (last-level cache {cache:g} MiB):")
    print(f"  tpubench triad    median {largest['median_rate'] / 1e9:8.2f} GB/s  max {largest['max_rate'] / 1e9:8.2f}")
    print(f"  bare numpy triad  median {triad / 1e9:8.2f} GB/s (two passes, 5 arrays counted)")
    print(f"  bare torch triad  median {torch_triad / 1e9:8.2f} GB/s (torch.add(b, c, alpha=s, out=a), 3 arrays)")
    print(f"  ratio tpubench / bare numpy: {largest['median_rate'] / triad:.3f}")
    print(f"  ratio tpubench / bare torch: {largest['median_rate'] / torch_triad:.3f}")
    print(f"rows: {results}")


if __name__ == "__main__":
    main()
