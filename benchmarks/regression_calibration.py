"""Calibrate `tpubench compare`'s verdicts on real repeated runs on this machine: A/A and A/B.

Every pair is a set of rounds; each round runs, in a shuffled order, one run of each
variant of the ``calib-mlp`` workload (benchmarks/calibration_workload.py): ``A`` and
``A2`` (identical code and config, size ``base``) and ``+10%``, ``+20%`` (``--slowdowns``,
of 5, 10, 20; sizes ``plus10``...: that much more matmul work on the same shape; compared
with the size left out of the pairing keys, as a code change would be). Baseline and candidate therefore run
interleaved, in one invocation, in the same minutes.

Then, for every pair and for each r in ``--at`` (the first r rounds of each side):

- A/A: ``compare_runs(A, A2)``; a ``regressed`` step-time verdict is a false alarm
  (requirement: at most 1 in 20 pairs at the default settings);
- A/B: ``compare_runs(A, +x%)``; ``regressed`` is a detection (requirement at +10%: 95%);
- A/A: how many pairs are shown ``unchanged`` (the whole CI within the threshold) and how
  many stay ``inconclusive`` (a night that could not tell);
- both: how many ``inconclusive`` verdicts the reason calls "likely a regression" (the whole
  CI beyond the threshold, the rank test short of p < 0.01), to weigh making that a verdict;
- the same with the naive rule (Mann-Whitney p < 0.01 on the raw samples of one run per
  side and a ratio beyond 5%), to show what the between-run noise does to it.

It prints the false-alarm rate, the detection rate per slowdown, the smallest slowdown
detected in at least 95% of pairs, what ``--rounds auto``'s replay predicts for a 10%
slowdown at each size (``compare.simulated_power`` on each pair's A runs, averaged), the
host load before and after, and the share of CPU other processes took during the runs
(``host_other_cpu_share``).

    python benchmarks/regression_calibration.py [--pairs 20] [--rounds 50] [--steps 40] [--threads 1] [--out DIR]
    python benchmarks/regression_calibration.py --analyse DIR     # the figures of an earlier run
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
import uuid
from dataclasses import replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")  # like the CLI's parent
os.environ["TPUBENCH_WORKLOAD_MODULES"] = "calibration_workload"
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))
sys.path[:0] = [str(ROOT), str(HERE)]

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from scipy import stats  # noqa: E402

from tpubench import store  # noqa: E402
from tpubench.analysis.compare import (  # noqa: E402
    DETECT,
    PAIR_KEYS,
    STEP_THRESHOLD,
    Settings,
    compare_runs,
    simulated_power,
)
from tpubench.runner import SuiteRunner, plan  # noqa: E402

SLOWDOWNS = (5, 10, 20)  # percent: the calibration workload's plusN sizes
#: everything but the size: the plusN sizes stand for a slower build of the same configuration
KEYS = [key for key in PAIR_KEYS if key != "size"] + ["backend", "device"]
REQUIRED_DETECTION = 0.95
LABELS = "labels.json"


def loadavg() -> str:
    return Path("/proc/loadavg").read_text().strip()


def collect(out: Path, pairs: int, rounds: int, steps: int, seed: int, slowdowns: list[int]) -> None:
    """Run every pair's rounds into the store at ``out``; labels.json maps run ids to (pair, round, variant).

    Each pair is an invocation of its own (an invocation's file is rewritten whole at each
    run, so thousands of runs in one would cost more and more between runs), and labels are
    saved per pair: a stopped collection resumes after its last complete pair.
    """
    variants = {"A": "base", "A2": "base", **{f"+{x}%": f"plus{x}" for x in slowdowns}}
    specs = {
        size: plan(["calib-mlp"], sizes=[size], backends=["cpu"], modes=["infer"], steps=steps, warmup=3)[0]
        for size in set(variants.values())
    }
    labels: dict[str, dict] = json.loads((out / LABELS).read_text()) if (out / LABELS).exists() else {}
    per_pair = pd.Series([label["pair"] for label in labels.values()], dtype=int).value_counts()
    complete = set(per_pair[per_pair == rounds * len(variants)].index)
    labels = {run_id: label for run_id, label in labels.items() if label["pair"] in complete}
    first = max(complete) + 1 if complete else 0
    shuffle = random.Random(seed + first)
    total = (pairs - first) * rounds * len(variants)
    started = time.monotonic()
    for pair in range(first, pairs):
        runner = SuiteRunner(results_dir=out, tags={"calibration": "regression"})
        for round_ in range(rounds):
            order = list(variants)
            shuffle.shuffle(order)
            for variant in order:
                run = replace(specs[variants[variant]], run_id=uuid.uuid4().hex[:16])
                (row,) = runner.run([run])
                if row["status"] != "ok":
                    raise SystemExit(f"calibration run failed: {row['status']}: {row.get('error')}")
                labels[run.run_id] = {"pair": pair, "round": round_, "variant": variant}
        (out / LABELS).write_text(json.dumps(labels))
        done = (pair + 1 - first) * rounds * len(variants)
        print(f"  pair {pair + 1}/{pairs}: {done}/{total} runs, {time.monotonic() - started:.0f} s", flush=True)


def naive_regressed(base: pd.DataFrame, test: pd.DataFrame) -> bool:
    """The naive rule: one run per side, Mann-Whitney on its raw samples, ratio beyond 5%."""
    b, t = base["step_ms"].to_numpy(), test["step_ms"].to_numpy()
    return bool(np.median(t) / np.median(b) > 1.05 and stats.mannwhitneyu(t, b).pvalue < 0.01)


def analyse(out: Path, settings: Settings, at: list[int]) -> dict:
    labels = pd.DataFrame.from_dict(json.loads((out / LABELS).read_text()), orient="index")
    runs = store.load_runs(out).set_index("run_id").join(labels, how="inner").reset_index()
    steps = store.load_steps(out, phase="measure")
    rounds = int(runs["round"].max()) + 1
    per_pair = runs.groupby("pair")["run_id"].count()
    complete = per_pair[per_pair == per_pair.max()].index  # a collection still running has a partial pair
    runs = runs[runs["pair"].isin(complete)]
    runs = runs.assign(pair=runs["pair"].rank(method="dense").astype(int) - 1)
    pairs = int(runs["pair"].max()) + 1
    by_run = {run_id: group for run_id, group in steps.groupby("run_id")}

    def steps_of(chosen: pd.DataFrame) -> pd.DataFrame:  # not all 4000 runs' steps per comparison
        return pd.concat([by_run[run_id] for run_id in chosen["run_id"]], ignore_index=True)

    statistic = runs["run_id"].map(lambda run_id: float(np.quantile(by_run[run_id]["step_ms"], settings.quantile)))
    candidates = ["A2", *(v for v in sorted(set(runs["variant"]) - {"A", "A2"}, key=lambda v: float(v[1:-1])))]
    figures: dict = {
        "pairs": pairs,
        "rounds": rounds,
        "runs": len(runs),
        "host_other_cpu_share_median": float(runs["host_other_cpu_share"].median()),
        "host_busy_runs": int((runs["host_other_cpu_share"] > 0.2).sum()),
        "step_ms_A": float(statistic[runs["variant"] == "A"].median()),
        "between_run_sd_A": float(np.log(statistic[runs["variant"] == "A"]).std()),
        "by_rounds": {},
    }
    for r in sorted({r for r in at if r <= rounds} | {rounds}):
        counts = {
            variant: {"regressed": 0, "improved": 0, "unchanged": 0, "inconclusive": 0, "likely": 0, "naive": 0}
            for variant in candidates
        }
        for pair in range(pairs):
            chosen = runs[(runs["pair"] == pair) & (runs["round"] < r)]
            base = chosen[chosen["variant"] == "A"]
            for variant in candidates:
                test = chosen[chosen["variant"] == variant]
                frame = compare_runs(base, test, steps_of(base), steps_of(test), settings, keys=KEYS)
                step = frame[frame["metric"] == "step"].iloc[0]
                if step["verdict"] in counts[variant]:
                    counts[variant][step["verdict"]] += 1
                # inconclusive, but its whole CI beyond the threshold: the reason's "likely a regression"
                counts[variant]["likely"] += "likely a regression" in step["reason"]
                first_base = base.loc[base["round"] == 0, "run_id"].iloc[0]
                first_test = test.loc[test["round"] == 0, "run_id"].iloc[0]
                counts[variant]["naive"] += naive_regressed(by_run[first_base], by_run[first_test])
        figures["by_rounds"][r] = counts
        # what --rounds auto predicts for r runs per side: the replayed power of a 10% slowdown
        # on each pair's own A runs, averaged over the pairs (set beside the detections above)
        noise = [statistic[(runs["pair"] == pair) & (runs["variant"] == "A")].to_numpy() for pair in range(pairs)]
        replayed = [simulated_power(values, r, r, DETECT, settings, STEP_THRESHOLD) for values in noise]
        figures.setdefault("replayed", {})[r] = float(np.mean(replayed))
    return figures


def report(figures: dict, settings: Settings) -> None:
    pairs = figures["pairs"]
    print(
        f"[{settings.statistic}] {figures['runs']} runs, {pairs} pairs x {figures['rounds']} rounds; calib-mlp infer "
        f"{settings.statistic} step {figures['step_ms_A']:.2f} ms; between-run sd of log {settings.statistic} of A "
        f"{figures['between_run_sd_A']:.3f}; "
        f"other processes' CPU share median {100 * figures['host_other_cpu_share_median']:.0f}% "
        f"({figures['host_busy_runs']} of {figures['runs']} runs host-busy)"
    )
    print(
        f"settings: step threshold {100 * STEP_THRESHOLD:g}%, alpha {settings.alpha} (Mann-Whitney over runs), "
        f"at least {settings.min_runs} runs per side"
    )
    print(
        "runs/side  A/A false regressions  A/A false improvements  A/A unchanged  A/A inconclusive  "
        "A/A 'likely a regression'  "
        + "  ".join(f"detected {v} (+likely)" for v in next(iter(figures["by_rounds"].values())) if v != "A2")
        + f"  replayed power of +{100 * DETECT:g}%"
    )
    smallest = {}
    for r, counts in figures["by_rounds"].items():
        aa = counts["A2"]
        cells = [f"{r:>9}", f"{aa['regressed']:>3}/{pairs} (naive {aa['naive']}/{pairs})"]
        cells.append(f"{aa['improved']:>3}/{pairs}")
        cells.append(f"{aa['unchanged']:>3}/{pairs}")
        cells.append(f"{aa['inconclusive']:>3}/{pairs}")
        cells.append(f"{aa.get('likely', 0):>3}/{pairs}")
        for variant, found in counts.items():
            if variant != "A2":
                cells.append(
                    f"{found['regressed']:>3}/{pairs} (+{found.get('likely', 0)}; naive {found['naive']}/{pairs})"
                )
                if found["regressed"] >= REQUIRED_DETECTION * pairs and variant not in smallest:
                    smallest[variant] = r
        cells.append(f"{figures['replayed'][r]:.2f}")
        print("  ".join(cells))
    reliable = [v for v in smallest if v != "A2"]
    print(
        "smallest slowdown detected in >= 95% of pairs: "
        + (", ".join(f"{v} from {smallest[v]} run(s) per side" for v in reliable) or "none at these settings")
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--at", default="1,2,3,5,10,20,30,40,50", help="runs per side to evaluate")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--slowdowns", default="10,20", help=f"percent, of {', '.join(map(str, SLOWDOWNS))}: the A/B variants"
    )
    parser.add_argument("--out", type=Path, help="keep the runs here (default: a temporary directory)")
    parser.add_argument("--analyse", type=Path, help="only analyse the runs an earlier call kept here")
    parser.add_argument("--statistics", default="median,min", help="per-run statistics to evaluate")
    parser.add_argument(
        "--threads",
        type=int,
        help="intra-op threads of each run (OMP_NUM_THREADS), as the nightly's CPU leg pins them; "
        "default: the environment's (torch then uses every core)",
    )
    args = parser.parse_args()
    if args.threads:  # before the first run starts the fork server, whose torch reads it once
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
    if args.analyse:
        out = args.analyse
    else:
        out = args.out or Path(tempfile.mkdtemp(prefix="tpubench-calibration-"))
        threads = os.environ.get("OMP_NUM_THREADS", "every core")
        print(f"load before: {loadavg()}  ({os.cpu_count()} CPUs, threads: {threads}); runs in {out}", flush=True)
        collect(out, args.pairs, args.rounds, args.steps, args.seed, [int(x) for x in args.slowdowns.split(",")])
        print(f"load after: {loadavg()}", flush=True)
    for statistic in args.statistics.split(","):
        settings = Settings(statistic=statistic)
        report(analyse(out, settings, [int(r) for r in args.at.split(",")]), settings)


if __name__ == "__main__":
    main()
