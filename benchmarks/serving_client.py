"""What the serving client costs: its own CPU time per request and per chunk, and the highest
request rate it sustains, against our test server at its fastest (no delays).

The client must not limit what it measures. Its CPU time (``time.process_time`` of this
process; the server runs in its own) is taken over whole points of ``tpubench serving``'s
client (:func:`tpubench.serving.client.run_point`):

* per request: points of 1-token answers (one chunk each) at ``--concurrency``, CPU over requests;
* per chunk: points of ``--tokens``-token answers, the extra CPU over the 1-token points divided
  by the extra chunks; once from a server that writes every chunk at once (the chunks of a
  read share its timing) and once from one that spaces them ``--gap-ms`` apart (every chunk
  its own read: what a real engine's decode steps give);
* the highest sustained rate: Poisson points at rising rates, each sustained while the client
  sends on time (its median send lateness under 5 ms) and completes 90% of the rate, with the
  share of a core the client and the server each used (the one near 100% is the limit).

Goals (printed ``met`` or ``NOT MET``, the script exiting 1 when one is missed): at most 1 ms
of client CPU per request and 0.1 ms per chunk. The highest sustained rate is printed, not
judged: on a small host the Python test server gives out first. ``--record DIR`` stores the
repeats (:mod:`benchmarks.record`: workload ``tpubench-self/serving_client``).

    python benchmarks/serving_client.py [--requests 400] [--repeat 3] [--record DIR]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import psutil

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

import record  # noqa: E402

from tpubench.serving import arrivals, client, datasets  # noqa: E402
from tpubench.serving.testserver import TestServer  # noqa: E402

RATES = (100, 200, 400, 800, 1600, 3200, 6400)


def cpu_of_point(url: str, count: int, tokens: int, concurrency: int) -> tuple[float, int, client.PointResult]:
    """Client CPU seconds over one point, its chunks, and the point."""
    prompts = datasets.prompts("random", count, 16, tokens)
    before = time.process_time()
    result = client.run_point(url, "tpubench-test", prompts, [0.0] * count, max_concurrency=concurrency)
    spent = time.process_time() - before
    failed = [r.error for r in result.records if r.error]
    if failed:
        raise SystemExit(f"{len(failed)} requests failed: {failed[0]}")
    return spent, sum(len(r.itl_ms) + 1 for r in result.records), result


def sustained(server: TestServer, count: int, concurrency: int) -> tuple[float | None, list[str]]:
    """The highest of :data:`RATES` the client keeps up with, and a line per rate tried, with the
    share of a core the client and the server each used: the one near 100% is the limit."""
    best, lines = None, []
    prompts = datasets.prompts("random", count, 16, 4)
    serving = psutil.Process(server.process.pid)
    for rate in RATES:
        times = arrivals.arrival_times(count, rate, seed=0)
        ours, theirs = time.process_time(), sum(serving.cpu_times()[:2])
        result = client.run_point(server.url, "tpubench-test", prompts, times, max_concurrency=concurrency)
        ours, theirs = time.process_time() - ours, sum(serving.cpu_times()[:2]) - theirs
        late_ms = statistics.median(1e3 * (r.send_s - t) for r, t in zip(result.records, times, strict=True))
        done = sum(r.error is None for r in result.records) / result.duration_s
        kept_up = late_ms < 5 and done >= 0.9 * rate
        lines.append(
            f"  rate {rate:>5}/s: {done:7.0f} req/s done, median send {late_ms:6.2f} ms late: {kept_up}; "
            f"CPU client {100 * ours / result.duration_s:3.0f}%, server {100 * theirs / result.duration_s:3.0f}%"
        )
        if not kept_up:
            break
        best = rate
    return best, lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=400, help="requests per point")
    parser.add_argument("--tokens", type=int, default=64, help="tokens per answer of the per-chunk points")
    parser.add_argument("--gap-ms", type=float, default=1.0, help="the spaced server's gap between chunks")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--record", help="store the repeats in this tpubench store (docs/benchmarks.md)")
    args = parser.parse_args()
    started = datetime.now(UTC)
    print(f"load before: {Path('/proc/loadavg').read_text().strip()}")
    work = Path(tempfile.mkdtemp(prefix="tpubench-serving-client-"))
    figures: dict[str, list[float]] = {"cpu per request": [], "cpu per chunk (batched)": [], "cpu per chunk": []}
    with TestServer(work) as fast, TestServer(work, "--gap-s", str(args.gap_ms / 1e3)) as spaced:
        cpu_of_point(fast.url, 50, 4, args.concurrency)  # warm: connections, imports
        for _ in range(args.repeat):
            one, _, _ = cpu_of_point(fast.url, args.requests, 1, args.concurrency)
            figures["cpu per request"].append(one / args.requests)
            for name, url in (("cpu per chunk (batched)", fast.url), ("cpu per chunk", spaced.url)):
                many, chunks, _ = cpu_of_point(url, args.requests, args.tokens, args.concurrency)
                figures[name].append((many - one) / (chunks - args.requests))
        best, lines = sustained(fast, args.requests, args.concurrency)
    median = {name: statistics.median(values) for name, values in figures.items()}
    print(
        f"{args.requests} requests a point at concurrency {args.concurrency}, {args.repeat} repeats, median "
        f"client CPU (this process; the server runs in its own):"
    )
    print(f"  per request (1-token answers): {1e3 * median['cpu per request']:.3f} ms")
    print(f"  per chunk, {args.tokens}-token answers written at once: {1e3 * median['cpu per chunk (batched)']:.4f} ms")
    print(f"  per chunk, {args.tokens}-token answers {args.gap_ms:g} ms apart: {1e3 * median['cpu per chunk']:.4f} ms")
    print("highest sustained request rate (Poisson arrivals, 4-token answers):")
    print("\n".join(lines))
    print(
        f"  sustained: {best if best is not None else 'none of'} req/s"
        + (" (the last rate tried)" if best == RATES[-1] else "")
    )
    print(f"load after: {Path('/proc/loadavg').read_text().strip()}")
    if args.record:
        stored = {name: ("wall", values) for name, values in figures.items()}
        print("stored:", ", ".join(record.write(args.record, "serving_client", stored, started)))
    record.verdict(
        [
            (
                f"client CPU per request <= 1 ms: {1e3 * median['cpu per request']:.3f} ms",
                median["cpu per request"] <= 1e-3,
            ),
            (
                f"client CPU per chunk <= 0.1 ms: {1e3 * median['cpu per chunk']:.4f} ms",
                median["cpu per chunk"] <= 1e-4,
            ),
        ]
    )


if __name__ == "__main__":
    main()
