"""Check tpubench's CPU ceilings against bare loops timed in this process.

    python benchmarks/ceilings_check.py [--results DIR] [--size 2048] [--rounds 3]

1. The float32 matmul ceiling at N^3 (default 2048^3) from ``tpubench ceilings`` (a worker,
   the device lock, the cache flush, the sample protocol) against a bare ``torch.mm(a, b,
   out=c)`` loop here, with the same thread count and no flush.
2. The STREAM triad ``a = b + s c`` at the sweep's largest arrays (at least 4x the last-level
   cache) against a bare numpy triad over the same kind of memory, on the same threads, with
   every array it moves counted:

   - numpy has no fused triad. ``a = b + s * c`` allocates a temporary for ``s * c`` and a
     fresh ``a`` on every call (page faults inside the timed region, and 5 arrays moved);
     with ``out=`` it is two passes, ``a = s c`` then ``a += b``, which move 5 arrays
     (STREAM's count for the two passes) where the fused kernel moves 3. Counted so, the two
     passes still read about 10 % faster than the fused kernel on the same memory: the
     write-allocate of ``a`` costs the fused kernel 1 array in 4 and the two passes 1 in 6,
     and STREAM's count leaves it out of both. Rather than a factor for that, a bare torch
     loop of the same two passes runs beside numpy's: numpy against torch at the same form
     is the library's difference, torch's two passes against its fused kernel the form's.
   - The same memory: numpy asks for transparent huge pages on large arrays
     (``madvise(MADV_HUGEPAGE)``), torch's allocator does not (unless
     ``THP_MEM_ALLOC_ENABLE=1``), so under ``transparent_hugepage=madvise`` numpy's own
     arrays sit on 2 MiB pages and the sweep's on 4 KiB ones (torch's fused triad read 14 %
     faster on huge pages here). The bare triads run over arrays torch allocated and first
     touched as the sweep's are; numpy views them.
   - The same threads: numpy's ufuncs run on one thread, the sweep's kernel on the worker's
     (``num_threads``); numpy's triad splits the arrays over as many Python threads (numpy
     releases the GIL in its loops). On a busy 2-core host one thread is not the same
     measurement as two: a 2-thread kernel waits for its slower half, a 1-thread loop gets
     a whole core.

The bare loops run right before and right after each sweep (the matmul's, then the
memory's up to the triad's arrays), so their figures bracket the moment it measured: on a
2-vCPU cloud VM the memory bandwidth drifts by 20 % from second to second even when the
host is idle. They hold the CPU's device lock, as the sweep's worker does (other tpubench
CPU runs then wait for them too), and the script runs in a session of its own, as a worker
does (:func:`own_session`). ``--rounds`` comparisons (3) run one after another; the summary
is the median over them of each ratio to its bracket's mean. The figures should agree
within 10 % on an idle host; the load average is printed beside them, since a busy host
(other processes on the cores) spreads both.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")  # like the CLI's parent: no TPU plugin here
import torch

from tpubench import devicelock
from tpubench.ceilings import CeilingSpec, memory_sizes
from tpubench.ceilings.device import cpu_llc_bytes
from tpubench.ceilings.memory import SCALAR
from tpubench.runner import SuiteRunner, run_ceilings

SAMPLES = 10


def median_time(run: Callable[[], object]) -> float:
    """Median seconds of ``run`` over :data:`SAMPLES` calls, after two warm-up calls."""
    for _ in range(2):
        run()
    times = []
    for _ in range(SAMPLES):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bare_mm(size: int) -> float:
    """Median FLOP/s of ``torch.mm`` at size^3 in this process."""
    generator = torch.Generator().manual_seed(0)
    a, b = (torch.randn(size, size, generator=generator) for _ in range(2))
    c = torch.empty(size, size)
    return 2 * size**3 / median_time(lambda: torch.mm(a, b, out=c))


def stream_arrays(array_bytes: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """STREAM's a, b, c in float32, allocated and first touched as the sweep's are (``torch.full``)."""
    n = array_bytes // 4
    return torch.full((n,), 1.0), torch.full((n,), 2.0), torch.full((n,), 0.0)


def bare_torch_triad(array_bytes: int) -> float:
    """Bytes per second (STREAM's 3 arrays) of the sweep's kernel, ``torch.add(b, c,
    alpha=s, out=a)``, in a bare loop: the harness's cost apart from the kernel's."""
    a, b, c = stream_arrays(array_bytes)
    return 3 * array_bytes / median_time(lambda: torch.add(b, c, alpha=SCALAR, out=a))


def bare_torch_two_pass(array_bytes: int) -> float:
    """Bytes per second (5 arrays) of numpy's form in torch: ``a = s c``, then ``a += b``."""
    a, b, c = stream_arrays(array_bytes)

    def triad() -> None:
        torch.mul(c, SCALAR, out=a)
        a.add_(b)

    return 5 * array_bytes / median_time(triad)


def bare_numpy_triad(array_bytes: int, threads: int) -> float:
    """Bytes per second (the 5 arrays its two passes move) of numpy's triad with ``out=``
    (``a = s c``, then ``a += b``) over torch-allocated arrays, split over ``threads`` threads."""
    a, b, c = (t.numpy() for t in stream_arrays(array_bytes))
    n, scalar = a.size, np.float32(SCALAR)

    def part(bounds: tuple[int, int]) -> None:
        part_a, part_b, part_c = (x[bounds[0] : bounds[1]] for x in (a, b, c))
        np.multiply(part_c, scalar, out=part_a)
        np.add(part_a, part_b, out=part_a)

    parts = [(k * n // threads, (k + 1) * n // threads) for k in range(threads)]
    with ThreadPoolExecutor(threads) as pool:
        rate = 5 * array_bytes / median_time(lambda: list(pool.map(part, parts)))
    assert np.allclose(a, 2.0), "the triad wrote b + s c (c is 0) over all of a"
    return rate


def own_session() -> None:
    """Run this script in a session of its own, as tpubench starts each worker: with the
    kernel's autogroup scheduling (Linux's default on desktops and many servers) each session
    is one scheduling group, so on a busy host a loop in the shell's session got half the CPU
    time a worker got (5.8 against 10.6 GFLOP/s for the same loop here, load average 20)."""
    if os.getsid(0) != os.getpid():
        done = subprocess.run([sys.executable, *sys.argv], start_new_session=True)
        raise SystemExit(done.returncode)


def transparent_hugepages() -> str:
    """The kernel's THP mode (``always``, ``madvise``, ``never``), or ``unknown``."""
    path = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    text = path.read_text() if path.exists() else ""
    return next((word.strip("[]") for word in text.split() if word.startswith("[")), "unknown")


def bracketed(
    bare: Callable[[], dict[str, float]], spec: CeilingSpec, results: str
) -> tuple[dict[str, float], dict[str, float], list[dict]]:
    """``bare`` (under the CPU's device lock, as the sweep's worker holds it: other tpubench
    CPU runs wait for both), the sweep of ``spec`` in its worker, then ``bare`` again: the
    two bare figures bracket the moment the sweep measured."""
    with devicelock.hold("cpu"):
        before = bare()
    rows = run_ceilings(SuiteRunner(results), [spec])
    with devicelock.hold("cpu"):
        after = bare()
    return before, after, rows


def ok_point(rows: list[dict], **match: object) -> dict:
    """The ok row whose columns have the ``match`` values."""
    found = [r for r in rows if r["status"] == "ok" and all(r[key] == value for key, value in match.items())]
    if not found:
        raise SystemExit(f"the sweep measured no {match}: {[r.get('error') for r in rows if r.get('error')]}")
    return found[0]


def spread(measured: float, before: float, after: float) -> str:
    """``measured`` over the two bare figures, as ``low .. high``."""
    low, high = sorted((measured / before, measured / after))
    return f"{low:.3f} .. {high:.3f}"


def main() -> None:
    own_session()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", default=None, help="store for the ceilings rows (default: a temporary one)")
    parser.add_argument("--size", type=int, default=2048, help="matmul M=N=K to compare at")
    parser.add_argument("--rounds", type=int, default=3, help="comparisons to make, one after another")
    args = parser.parse_args()
    results = args.results or tempfile.mkdtemp(prefix="tpubench-ceilings-check-")
    threads = torch.get_num_threads()
    array_bytes = memory_sizes(cpu_llc_bytes(), False, None)[-1]  # the sweep's largest arrays, by its own rule
    print(
        f"load average {os.getloadavg()}; {threads} threads; matmul float32 {args.size}^3; STREAM triad float32 "
        f"over arrays of {array_bytes / 2**20:g} MiB (last-level cache {(cpu_llc_bytes() or 0) / 2**20:g} MiB); "
        f"transparent huge pages: {transparent_hugepages()}. Rates are medians; bare figures before / after each sweep."
    )
    summary: dict[str, list[float]] = {"mm": [], "torch": [], "numpy": [], "same_form": []}
    for index in range(1, args.rounds + 1):
        before, after, rows = bracketed(
            lambda: {"mm": bare_mm(args.size)},
            CeilingSpec("cpu", "matmul", dtypes=("float32",), max_size=args.size),
            results,
        )
        mm = ok_point(rows, m=args.size)["median_rate"]
        print(
            f"round {index} matmul: tpubench {mm / 1e9:.1f} GFLOP/s, bare torch.mm {before['mm'] / 1e9:.1f} / "
            f"{after['mm'] / 1e9:.1f}; ratio {spread(mm, before['mm'], after['mm'])}"
        )

        def triads() -> dict[str, float]:
            return {
                "torch": bare_torch_triad(array_bytes),
                "numpy": bare_numpy_triad(array_bytes, threads),
                "two_pass": bare_torch_two_pass(array_bytes),
            }

        before_t, after_t, rows = bracketed(triads, CeilingSpec("cpu", "memory", max_size=array_bytes), results)
        point = ok_point(rows, op="triad", size_bytes=array_bytes)
        if point["num_threads"] != threads:
            raise SystemExit(f"the sweep ran on {point['num_threads']} threads, the bare loops on {threads}")
        triad = point["median_rate"]
        print(
            f"round {index} triad: tpubench {triad / 1e9:.2f} GB/s; bare torch triad {before_t['torch'] / 1e9:.2f} / "
            f"{after_t['torch'] / 1e9:.2f}, ratio {spread(triad, before_t['torch'], after_t['torch'])}; "
            f"bare numpy triad {before_t['numpy'] / 1e9:.2f} / {after_t['numpy'] / 1e9:.2f}, "
            f"ratio {spread(triad, before_t['numpy'], after_t['numpy'])}; torch's two passes "
            f"{before_t['two_pass'] / 1e9:.2f} / {after_t['two_pass'] / 1e9:.2f}"
        )
        # each round's ratio against the mean of its bracket, for the summary over rounds
        summary["mm"].append(mm / statistics.mean((before["mm"], after["mm"])))
        for key in ("torch", "numpy"):
            summary[key].append(triad / statistics.mean((before_t[key], after_t[key])))
        summary["same_form"].append(
            statistics.mean((before_t["numpy"], after_t["numpy"]))
            / statistics.mean((before_t["two_pass"], after_t["two_pass"]))
        )
    print(f"load average {os.getloadavg()}")
    print("median over rounds of the ratio to the bracket's mean:")
    print(f"  matmul, tpubench / bare torch.mm:              {statistics.median(summary['mm']):.3f}")
    print(f"  triad, tpubench / bare torch triad:            {statistics.median(summary['torch']):.3f}")
    print(f"  triad, tpubench / bare numpy triad (5 arrays): {statistics.median(summary['numpy']):.3f}")
    print(f"  numpy / torch, both in numpy's two passes:     {statistics.median(summary['same_form']):.3f}")
    print(f"rows: {results}")


if __name__ == "__main__":
    main()
