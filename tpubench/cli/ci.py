"""``tpubench ci``: the nightly regression job in one command, the same on a laptop as on a runner.

Run the suite ``--rounds`` times (round-robin, so repeats of one configuration are spread
over the job and meet different moments of a noisy host), compare with the baseline,
write the Markdown summary, the HTML report, the comparison as JSON and the parquet under
``--out``, and exit 1 on a regression. Why repeats: calibration on a shared host
(``benchmarks/regression_calibration.py``, README "Regressions and reports") found that
between-process noise, not within-run noise, decides whether a verdict can be trusted,
and only repeated runs measure it.

The baseline is checked before anything runs: a missing, empty or corrupt baseline is an
error (exit 2), never a green job.
"""

from __future__ import annotations

import json
import os
import uuid
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import pandas as pd
import typer

from tpubench import store
from tpubench.analysis import compare
from tpubench.backends import BACKENDS
from tpubench.cli.common import BadInput, app, choose, console, key_values, pythons, select_workloads, writable_dir
from tpubench.cli.compare import STATISTIC_HELP, Selection, prices_from, select, settings_from, write_report
from tpubench.cli.run import local_backends, suite_progress
from tpubench.runner import SuiteRunner, plan
from tpubench.spec import DTYPES, RunSpec
from tpubench.store import DEFAULT_RESULTS_DIR, StoreError
from workloads import GENERATION_MODES, MODES

#: repeats of each configuration; see README "Regressions and reports" for the calibration behind it
DEFAULT_ROUNDS = 3
DEFAULT_STEPS = 40
#: statuses that turn a job red even without a baseline to compare with
FAILED = compare.BAD_STATUSES


def _looks_like_path(text: str) -> bool:
    return os.sep in text or text.startswith((".", "~")) or Path(text).exists()


def load_baseline(baseline: str, results: str) -> Selection:
    """The baseline: every run of a results directory (the last green job's parquet), or the runs a
    selector picks from ``results``. Missing, empty or unreadable is a BadInput."""
    if not _looks_like_path(baseline):
        return select(results, baseline)
    path = Path(baseline).expanduser()
    if not path.is_dir():
        raise BadInput(f"--baseline {baseline}: no such directory (the last green job's results folder)")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            runs = store.load_runs(path)
            steps = store.load_steps(path, run_id=list(runs["run_id"]), phase="measure")
        except (StoreError, OSError, ValueError) as error:
            raise BadInput(f"--baseline {baseline}: cannot read it ({error})") from error
    unreadable = [str(w.message) for w in caught if "unreadable results file" in str(w.message)]
    if unreadable:
        raise BadInput(f"--baseline {baseline} is corrupt: {unreadable[0]}")
    if runs.empty:
        raise BadInput(f"--baseline {baseline}: no runs in it (expected runs/date=*/*.parquet)")
    if not (runs["status"] == "ok").any():
        raise BadInput(f"--baseline {baseline}: none of its {len(runs)} runs is ok; nothing to compare with")
    return Selection(str(path), runs, steps)


def rounds_of(specs: list[RunSpec], rounds: int) -> list[RunSpec]:
    """``specs`` ``rounds`` times over, round-robin, each repeat with its own run id."""
    return [replace(spec, run_id=uuid.uuid4().hex[:16]) for _ in range(rounds) for spec in specs]


@app.command("ci")
def ci_command(
    out: Annotated[Path, typer.Option(help="Folder for results/, summary.md, report.html, comparison.json.")],
    baseline: Annotated[
        str | None,
        typer.Option(
            help="The last green job's results folder, or a selector over --results; "
            "without it the job only runs and reports (the first night)."
        ),
    ] = None,
    suite: Annotated[str | None, typer.Option(help="Suite to run (default: every workload).")] = None,
    workload: Annotated[list[str] | None, typer.Option(help="Workload name; repeatable.")] = None,
    backend: Annotated[list[str] | None, typer.Option(help="Backend; repeatable (default: all available).")] = None,
    mode: Annotated[list[str] | None, typer.Option(help="Mode; repeatable (default: train, infer).")] = None,
    size: Annotated[list[str] | None, typer.Option(help="Size name; repeatable (default: each workload's).")] = None,
    dtype: Annotated[str, typer.Option(help=f"One of {', '.join(DTYPES)}.")] = "float32",
    rounds: Annotated[int, typer.Option(min=1, help="Runs of each configuration, round-robin.")] = DEFAULT_ROUNDS,
    steps: Annotated[int, typer.Option(min=1, help="Measured steps per run.")] = DEFAULT_STEPS,
    warmup: Annotated[int, typer.Option(min=0, help="Minimum warm-up steps.")] = 3,
    timeout: Annotated[float, typer.Option(min=1, help="Seconds before a run's worker is killed.")] = 600.0,
    results: Annotated[str, typer.Option(help="Store a selector --baseline picks from.")] = str(DEFAULT_RESULTS_DIR),
    threshold: Annotated[float | None, typer.Option(help="Step-time threshold in percent.")] = None,
    statistic: Annotated[str, typer.Option(help=STATISTIC_HELP)] = "median",
    tag: Annotated[list[str] | None, typer.Option(help="KEY=VALUE stored with every run; repeatable.")] = None,
    python: Annotated[list[str] | None, typer.Option(help="BACKEND=INTERPRETER for that backend's workers.")] = None,
    prices: Annotated[Path | None, typer.Option(help="TOML of chip -> USD per hour.")] = None,
) -> None:
    """The nightly job: run the suite, compare with the baseline, write the summary and report; exit 1 on regression."""
    chosen_workloads = select_workloads(suite, workload)
    chosen_backends = choose("backend", backend, list(BACKENDS))
    chosen_modes = choose("mode", mode, list(MODES + GENERATION_MODES))
    choose("dtype", [dtype], list(DTYPES))
    all_sizes = list(dict.fromkeys(s for w in chosen_workloads for s in w.sizes))
    chosen_sizes = choose("size", size, all_sizes)
    settings = settings_from(threshold, statistic)
    price_table = prices_from(prices)
    out_dir = writable_dir("--out", out)
    results_dir = out_dir / "results"
    if results_dir.exists() and any(results_dir.glob("runs/date=*/*.parquet")):
        raise BadInput(f"--out {out}: {results_dir} already holds runs; give the job an empty folder")
    base = load_baseline(baseline, results) if baseline else None
    try:
        specs = plan(
            chosen_workloads,
            sizes=chosen_sizes,
            backends=chosen_backends or list(BACKENDS),
            modes=chosen_modes,
            dtype=dtype,
            warmup=warmup,
            steps=steps,
            timeout_s=timeout,
        )
    except ValueError as error:
        raise BadInput(str(error)) from error
    if not specs:
        raise BadInput("nothing to run: no chosen workload has the chosen sizes and modes")
    runner = SuiteRunner(
        results_dir=results_dir, pythons=pythons(python), tags={"ci": "nightly", **key_values("--tag", tag)}
    )
    if not chosen_backends:
        available = local_backends(runner)
        specs = [spec for spec in specs if spec.backend in available]
    planned = rounds_of(specs, rounds)
    console.print(f"tpubench ci: {len(specs)} configuration(s) x {rounds} round(s) = {len(planned)} runs")
    with suite_progress(runner, len(planned), console):
        runner.run(planned)
    if runner.interrupted:
        console.print("interrupted: no verdict")
        raise typer.Exit(130)
    candidate_runs = store.load_runs(results_dir)
    candidate_steps = store.load_steps(results_dir, phase="measure")
    comparison = None
    if base is not None:
        comparison = compare.compare_runs(base.runs, candidate_runs, base.steps, candidate_steps, settings)
        (out_dir / "comparison.json").write_text(
            json.dumps(json.loads(comparison.to_json(orient="records")), indent=1) + "\n"
        )
    report = write_report(
        out_dir / "report.html",
        candidate_runs,
        str(results_dir),
        title=f"tpubench ci: invocation {runner.invocation_id}",
        comparison=comparison,
        baseline=base.selector if base else None,
        markdown=out_dir / "summary.md",
        prices=price_table,
    )
    failed = candidate_runs[candidate_runs["status"].isin(FAILED)]
    for line in _closing(report.regressed, comparison, failed, base is not None):
        console.print(line, markup=False, highlight=False)
    console.print(f"summary: {out_dir / 'summary.md'}; report: {out_dir / 'report.html'}; results: {results_dir}")
    if report.regressed or (base is None and not failed.empty):
        raise typer.Exit(1)


def _closing(regressed: bool, comparison: pd.DataFrame | None, failed: pd.DataFrame, compared: bool) -> list[str]:
    """The job's last words: the verdict and what it rests on."""
    if not compared:
        lines = ["no baseline: nothing compared (this job's results/ can be the next one's --baseline)"]
        if not failed.empty:
            lines.append(f"FAILED: {len(failed)} run(s) did not finish ok: {', '.join(sorted(set(failed['status'])))}")
        return lines
    assert comparison is not None
    counts = compare.verdict_counts(comparison)
    tally = ", ".join(f"{n} {verdict}" for verdict, n in counts.items() if n)
    if regressed:
        lines = [f"REGRESSED ({tally}):"]
        for row in compare.regressions(comparison).to_dict("records"):
            lines.append(f"  {row['workload']}/{row['size']} {row['test_backend']} {row['mode']}: {row['reason']}")
        return lines
    return [f"no regression ({tally})"]
