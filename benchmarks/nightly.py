"""tpubench watches itself: run the project's benchmark scripts at sizes that fit a CI machine
and store their figures in one invocation of a tpubench store, which ``tpubench compare`` reads
like any other (docs/benchmarks.md, "tpubench watches itself"; the nightly workflow's
``self-benchmarks`` job runs this).

Each script runs in its own process with ``--record STORE``, in the invocation this script
names (``TPUBENCH_SELF_INVOCATION``), so ``--candidate latest`` selects the whole night. A
script that fails or misses its requirement does not stop the others; this script exits 1
when any did, after all have stored their figures.

    python benchmarks/nightly.py --store selfbench [--sizes ci|tiny] [--only startup]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

import record  # noqa: E402

#: each script's arguments at each size: ``ci`` for a CI machine's night (about 25 minutes on
#: two cores), ``tiny`` to check the wiring in seconds (its figures are not worth comparing)
SIZES: dict[str, dict[str, list[str]]] = {
    "ci": {
        "ops_ingest": ["--chrome-mb", "12,100", "--repeat", "5"],
        "dashboard_speed": ["--repeat", "5"],  # its default store: 400 nights, 10,000 runs
        "startup": ["--repeat", "5"],
        "harness_overhead": ["--rounds", "10", "--process-rounds", "5"],
        "run_overhead": ["--repeat", "5", "--starts", "10"],
    },
    "tiny": {
        "ops_ingest": ["--chrome-mb", "1", "--repeat", "2"],
        "dashboard_speed": ["--nights", "2", "--repeat", "2", "--page", "Overview"],
        "startup": ["--repeat", "2"],
        "harness_overhead": ["--rounds", "2", "--steps", "2", "--process-rounds", "0"],
        "run_overhead": ["--repeat", "1", "--starts", "2"],
    },
}
SCRIPTS = tuple(SIZES["ci"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", required=True, help="the tpubench store the figures join (a folder or s3://...)")
    parser.add_argument("--sizes", default="ci", choices=sorted(SIZES), help="benchmark sizes (default: ci)")
    parser.add_argument("--only", action="append", choices=SCRIPTS, help="run this script only (repeatable)")
    args = parser.parse_args()
    invocation = record.new_invocation()
    env = {**os.environ, record.INVOCATION_ENV: invocation, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    failed = []
    with tempfile.TemporaryDirectory(prefix="tpubench-nightly-") as scratch:
        for script in args.only or SCRIPTS:
            argv = [sys.executable, str(HERE / f"{script}.py"), *SIZES[args.sizes][script], "--record", args.store]
            if script == "dashboard_speed":  # a store of its own, built fresh
                argv += ["--store", str(Path(scratch) / "dashboard-store")]
            print(f"== {script}: {' '.join(argv[1:])}", flush=True)
            started = time.perf_counter()
            code = subprocess.run(argv, env=env, check=False).returncode
            print(f"== {script}: exit {code} after {time.perf_counter() - started:.0f} s", flush=True)
            if code:
                failed.append(f"{script} (exit {code})")
    print(f"invocation {invocation} in {args.store}")
    if failed:
        print(f"failed or missed a requirement: {', '.join(failed)}")
        raise SystemExit(1)
    print("every script met its requirements")


if __name__ == "__main__":
    main()
