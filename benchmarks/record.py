"""A benchmark script's figures as rows of a tpubench store, so that tpubench's own speed is
compared, charted and judged by the same readers and statistics as any model's.

The mapping (docs/benchmarks.md, "tpubench watches itself"):

- each **repeat** of a figure is one ``runs`` row (status ``ok``) with its value as the one
  ``measure`` sample in ``steps``: repeats are the unit of replication, as runs are for a model
  (``tpubench compare`` tests per-run statistics and gives a verdict from 5 runs a side), and
  each repeat is a fresh measurement (a fresh process, a fresh page render, a fresh block);
- the script is the workload, ``tpubench-self/<script>`` (suite ``tpubench-self``), and the
  figure's name its size (``chrome 12MB``, ``tpubench --version``), so that a figure pairs with
  the same figure of another night through :mod:`tpubench.analysis.identity`'s configuration;
- the mode names what a figure is, the dtype its stored unit: ``wall`` for a time, stored in
  milliseconds (``ms``) as a step time is; ``ratio`` for a ratio (tpubench's time over a bare
  loop's), stored as the ratio itself (``x``). Both are lower-is-better, as a step time is, so
  compare's direction is right. Batch size 1 (one measurement a sample): every reader's label
  needs a shape, and reads ``tpubench-self/startup/tpubench list wall ms 1``;
- backend ``cpu``, device ``host``: the runner's CPU model is in ``cpu_model``, not in the
  identity, so that nights on two runner machines still pair (compare names the difference).

One invocation may hold several scripts' figures (``benchmarks/nightly.py`` runs five, one
after another): ``TPUBENCH_SELF_INVOCATION`` names it, and each script adds its rows to the
invocation's files (the store's rule: one file per invocation, named by it, which readers pick
files by), rewritten whole with the store's atomic writer and schema version.
"""

from __future__ import annotations

import os
import platform
import secrets
import socket
import subprocess
import sys
import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import pyarrow as pa  # noqa: E402

from tpubench import store  # noqa: E402
from tpubench.version import __version__  # noqa: E402

SUITE = "tpubench-self"
#: mode -> (what a figure's repeats are given in, the unit stored: the dtype column)
UNITS = {"wall": ("s", "ms"), "ratio": ("x", "x")}
INVOCATION_ENV = "TPUBENCH_SELF_INVOCATION"


def new_invocation(now: datetime | None = None) -> str:
    """An invocation id in the store's form: its start, then random hex."""
    return f"{(now or datetime.now(UTC)):%Y%m%dT%H%M%S}-{secrets.token_hex(4)}"


def _git_sha() -> str | None:
    done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False)
    return done.stdout.strip() or None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def rows(
    script: str,
    figures: Mapping[str, tuple[str, Sequence[float]]],
    invocation: str,
    started: datetime,
) -> dict[str, list[dict]]:
    """The runs and steps rows of ``figures``: name -> (mode, repeats), repeats in seconds for
    ``wall`` (stored as milliseconds) and as they are for ``ratio``. Pure, for the tests."""
    unknown = {mode for mode, _ in figures.values()} - set(UNITS)
    if unknown:
        raise ValueError(f"unknown figure modes {sorted(unknown)}; valid: {', '.join(UNITS)}")
    finished = datetime.now(UTC)
    common = {
        "invocation_id": invocation,
        "started_at": started,
        "finished_at": finished,
        "suite": SUITE,
        "workload": f"{SUITE}/{script}",
        "backend": "cpu",
        "device": "host",
        "batch_size": 1,
        "status": "ok",
        "warmup_steps": 0,
        "measured_steps": 1,
        "host": socket.gethostname(),
        "cpu_model": _cpu_model(),
        "python_executable": sys.executable,
        "python_version": platform.python_version(),
        "tpubench_version": __version__,
        "git_sha": _git_sha(),
        "host_load_1m": os.getloadavg()[0],
    }
    found: dict[str, list[dict]] = {"runs": [], "steps": []}
    for name, (mode, repeats) in figures.items():
        for value in repeats:
            sample = float(value) * (1000.0 if mode == "wall" else 1.0)
            run_id = uuid.uuid4().hex
            run = {"run_id": run_id, "size": name, "mode": mode, "dtype": UNITS[mode][1], "median_step_ms": sample}
            found["runs"].append({**common, **run})
            step = {"run_id": run_id, "invocation_id": invocation, "step": 0, "rank": 0, "phase": "measure"}
            found["steps"].append({**step, "step_ms": sample})
    return found


def write(
    results: str | Path,
    script: str,
    figures: Mapping[str, tuple[str, Sequence[float]]],
    started: datetime,
) -> list[str]:
    """Store ``figures`` (see :func:`rows`) in ``results``, added to the runs and steps files of
    the invocation ``TPUBENCH_SELF_INVOCATION`` names (a new one without it), in the date
    partition of the invocation's start. Not for two writers of one invocation at once."""
    invocation = os.environ.get(INVOCATION_ENV) or new_invocation(started)
    began = datetime.strptime(invocation.split("-", 1)[0], "%Y%m%dT%H%M%S").replace(tzinfo=UTC)
    location = store.Location(results)
    written = []
    for table, table_rows in rows(script, figures, invocation, started).items():
        path = location.join(table, store.partition(began), f"{invocation}.parquet")
        fresh = store.to_table(table_rows, table)
        kept = location.read_table(path).cast(fresh.schema) if location.fs.exists(path) else fresh.schema.empty_table()
        location.write_table(pa.concat_tables([kept, fresh]), path)
        written.append(location.display(path))
    return written


def verdict(checks: Sequence[tuple[str, bool]]) -> None:
    """Print each requirement as ``met`` or ``NOT MET``; exit 1 when one is missed (after the
    figures were stored), so that the nightly job fails on it."""
    for text, met in checks:
        print(f"{'met' if met else 'NOT MET'}: {text}", flush=True)
    if not all(met for _, met in checks):
        raise SystemExit(1)
