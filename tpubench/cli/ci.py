"""``tpubench ci``: the nightly regression job in one command, the same on a laptop as on a runner.

Run the suite ``--rounds`` times (round-robin, so repeats of one configuration are spread
over the job and meet different moments of a noisy host), compare with the baseline,
write the Markdown summary, the HTML report, the comparison as JSON and the parquet under
``--out``, and exit 1 on a regression. Why repeats: calibration on a shared host
(``benchmarks/regression_calibration.py``, docs/regressions.md, "Calibration") found that
between-process noise, not within-run noise, decides whether a verdict can be trusted,
and only repeated runs measure it.

How many: ``--rounds auto`` (the default) sizes the night from the baseline's own runs, a
noise model per series: as many rounds as its noisiest configuration needs to catch a 10%
slowdown 95% of the time, found by replaying comparisons drawn from that configuration's
own per-run statistics (:func:`tpubench.analysis.compare.runs_needed`). A quiet
accelerator runner needs the minimum of 5; this shared 2-core host about 50.

The baseline is checked before anything runs: a missing, empty or corrupt baseline is an
error (exit 2), never a green job.
"""

from __future__ import annotations

import json
import math
import os
import uuid
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import pandas as pd
import pyarrow as pa
import typer

from tpubench import store
from tpubench.analysis import compare, serving_compare
from tpubench.analysis.identity import CONFIG_KEYS, config_labels, spec_key
from tpubench.cli.common import BadInput, app, console, key_values, writable_dir, writable_results
from tpubench.cli.compare import (
    STATISTIC_HELP,
    Selection,
    ServingSelection,
    prices_from,
    select,
    select_serving,
    serving_comparison,
    serving_line,
    settings_from,
    write_report,
)
from tpubench.cli.planning import (
    DevicesOption,
    InputsOption,
    LossOption,
    ModelConfigOption,
    ModelOption,
    ParallelOption,
    PrecisionOption,
    ScalingOption,
    TaskOption,
    TpOption,
    WorkloadModuleOption,
    choose_runs,
    custom_model,
    device_options,
    plan_runs,
    precision_options,
    precision_runs,
    pythons,
    shape_options,
    use_workload_modules,
)
from tpubench.cli.run import local_backends, suite_progress
from tpubench.results_dir import DEFAULT_RESULTS_DIR
from tpubench.runner import SuiteRunner
from tpubench.spec import DTYPES, RunSpec
from tpubench.store import StoreError

#: rounds of a night without a baseline to size it by (its runs then size the next night)
FIRST_NIGHT_ROUNDS = 10
#: the most rounds ``--rounds auto`` runs, however noisy the baseline
MAX_ROUNDS = 60
DEFAULT_STEPS = 40
#: statuses that turn a job red even without a baseline to compare with
FAILED = compare.BAD_STATUSES
#: ``--fail-on-inconclusive``'s exit code: apart from 1 (regressed) and 2 (bad input)
INCONCLUSIVE_EXIT = 3
#: with ``--history``, tonight is also compared with the night this many nights before
CREEP_NIGHTS = 7


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


#: the tables of a serving sweep, which ``--serving`` copies into tonight's results
SERVING_TABLES = ("serving", "serving_requests")


def load_serving(option: str, path: str) -> ServingSelection:
    """Every serving point of the store at ``path`` and its requests; none, or an unreadable
    store, is a BadInput naming ``option``."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            points = store.load_table(Path(path).expanduser(), "serving")
            requests = store.load_table(Path(path).expanduser(), "serving_requests")
        except (StoreError, OSError, ValueError) as error:
            raise BadInput(f"{option} {path}: no serving points in it ({error})") from error
    unreadable = [str(w.message) for w in caught if "unreadable results file" in str(w.message)]
    if unreadable:
        raise BadInput(f"{option} {path} is corrupt: {unreadable[0]}")
    if points.empty:
        raise BadInput(
            f"{option} {path}: no serving points in it (expected serving/date=*/*.parquet, "
            "which `tpubench serving --results` writes)"
        )
    return ServingSelection(str(path), points, requests)


def serving_baseline(baseline: str, results: str) -> ServingSelection | None:
    """The baseline's serving points: all of a results folder's, or those a selector picks
    from ``results``; None where it has none (a night from before serving points were kept)."""
    if not _looks_like_path(baseline):
        return select_serving(results, baseline)
    path = Path(baseline).expanduser()
    if not path.is_dir():
        raise BadInput(f"--baseline {baseline}: no such directory (the last green job's results folder)")
    try:
        return load_serving("--baseline", str(path))
    except BadInput:
        return None


def auto_rounds(base: Selection | None, specs: list[RunSpec], settings: compare.Settings, most: int) -> tuple[int, str]:
    """Rounds for tonight, and why: enough for every configuration of ``specs`` that the baseline
    measured to catch a :data:`compare.DETECT` slowdown (see the module doc)."""
    if base is None:
        return FIRST_NIGHT_ROUNDS, "no baseline to measure the noise from"
    spreads = compare.baseline_spread(base.runs, base.steps, settings)
    keys = [key for key in CONFIG_KEYS if key != "device"]
    planned = {spec_key(spec.to_json()) for spec in specs}
    # a dimension the workload does not take is NaN in the frame and None in the spec
    tonight = [
        tuple(None if value != value else value for value in row) in planned
        for row in spreads[keys].itertuples(index=False)
    ]
    spreads = spreads[tonight].dropna(subset=["spread"])
    if spreads.empty:
        return FIRST_NIGHT_ROUNDS, "the baseline has no configuration of tonight's with 3 ok runs"
    threshold = settings.metric(compare.METRICS[0]).threshold  # step time's
    needed = [compare.runs_needed(noise, compare.DETECT, settings, threshold, most) for noise in spreads["statistics"]]
    index = max(range(len(needed)), key=lambda i: needed[i] or math.inf)  # None: no number of rounds is enough
    worst = spreads.iloc[index]
    label = config_labels(spreads.iloc[[index]], backend=True).iloc[0]
    detect = f"a {100 * compare.DETECT:g}% slowdown"
    varies = f"{label}'s {worst['runs']} baseline runs vary ±{100 * worst['spread']:.0f}%"
    if needed[index] is not None:
        return needed[index], f"{varies}: enough to catch {detect} in {100 * settings.power:g}% of simulated nights"
    return most, f"{varies}: {most} rounds cannot catch {detect} reliably against them (the report says what they can)"


def parse_rounds(text: str, min_runs: int) -> int | None:
    """``--rounds``: ``auto`` (None), or a number of at least ``min_runs``: fewer runs per side
    can never give a verdict, so such a night could never fail (a real +37% slowdown came out
    "no regression" at 2 rounds)."""
    if text == "auto":
        return None
    if text.isdigit() and int(text) >= min_runs:
        return int(text)
    if text.isdigit():
        raise BadInput(
            f"--rounds {text}: a verdict needs {min_runs} runs per side, so fewer rounds could never show a "
            f"regression; give {min_runs} or more, or auto"
        )
    raise BadInput(f"--rounds expects a number ({min_runs} or more) or auto, got {text!r}")


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
    size: Annotated[
        list[str] | None, typer.Option(help="Size name(s), e.g. tiny or tiny,124m; repeatable (default: each one's).")
    ] = None,
    batch_size: Annotated[
        str | None, typer.Option(help="Batch size(s), e.g. 8 or 1,8,32 (default: each one's).")
    ] = None,
    seq_len: Annotated[str | None, typer.Option(help="Sequence length(s); for prefill/decode the prompt.")] = None,
    prompt_len: Annotated[str | None, typer.Option(help="Prompt length(s) for prefill/decode (= --seq-len).")] = None,
    gen_len: Annotated[str | None, typer.Option(help="Output tokens per sequence for decode, e.g. 128.")] = None,
    dtype: Annotated[
        str | None, typer.Option(help=f"One of {', '.join(DTYPES)} (default: float32, or --precision's).")
    ] = None,
    precision: PrecisionOption = None,
    rounds: Annotated[
        str,
        typer.Option(
            help="Runs of each configuration, round-robin: a number, or auto: as many as the baseline's "
            "between-run spread needs to catch a 10% slowdown 95% of the time (5 at least; "
            f"{FIRST_NIGHT_ROUNDS} without a baseline)."
        ),
    ] = "auto",
    max_rounds: Annotated[int, typer.Option(min=1, help="The most rounds auto runs.")] = MAX_ROUNDS,
    steps: Annotated[int, typer.Option(min=1, help="Measured steps per run.")] = DEFAULT_STEPS,
    warmup: Annotated[int, typer.Option(min=0, help="Minimum warm-up steps.")] = 3,
    timeout: Annotated[float, typer.Option(min=1, help="Seconds before a run's worker is killed.")] = 600.0,
    results: Annotated[str, typer.Option(help="Store a selector --baseline picks from.")] = str(DEFAULT_RESULTS_DIR),
    threshold: Annotated[float | None, typer.Option(help="Step-time threshold in percent.")] = None,
    statistic: Annotated[str, typer.Option(help=STATISTIC_HELP)] = "median",
    threads: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Intra-op threads of every run's worker (OMP_NUM_THREADS; recorded in each run's env). "
            "The calibration's CPU nightly uses 1 (docs/regressions.md, 'Calibration'). Default: the environment's.",
        ),
    ] = None,
    tag: Annotated[list[str] | None, typer.Option(help="KEY=VALUE stored with every run; repeatable.")] = None,
    python: Annotated[list[str] | None, typer.Option(help="BACKEND=INTERPRETER for that backend's workers.")] = None,
    prices: Annotated[Path | None, typer.Option(help="TOML of chip -> USD per hour.")] = None,
    history: Annotated[
        str | None,
        typer.Option(
            help="Store that keeps every night (a folder or s3://...): tonight's runs are appended to it, and "
            "tonight is also compared with the night --creep-nights before, to catch slow creep."
        ),
    ] = None,
    creep_nights: Annotated[
        int, typer.Option(min=1, help="With --history: how many nights back the creep check compares with.")
    ] = CREEP_NIGHTS,
    serving: Annotated[
        str | None,
        typer.Option(
            help="Tonight's serving points: a store that `tpubench serving --results STORE` wrote. They are copied "
            "into --out/results, compared with the baseline's serving points and gate the job as runs do "
            "(docs/regressions.md, 'Serving points')."
        ),
    ] = None,
    serving_only: Annotated[
        bool, typer.Option(help="Run no suite: compare and gate the --serving points only.")
    ] = False,
    fail_on_inconclusive: Annotated[
        bool,
        typer.Option(help=f"Exit {INCONCLUSIVE_EXIT} when nothing regressed but something could not be decided."),
    ] = False,
    image_size: Annotated[str | None, typer.Option(help="Image size(s) in pixels per side (vision).")] = None,
    latent_size: Annotated[str | None, typer.Option(help="Latent size(s) per side (diffusion).")] = None,
    devices: DevicesOption = None,
    parallel: ParallelOption = None,
    tp: TpOption = None,
    scaling: ScalingOption = None,
    model: ModelOption = None,
    inputs: InputsOption = None,
    loss: LossOption = None,
    model_config: ModelConfigOption = None,
    task: TaskOption = None,
    workload_module: WorkloadModuleOption = None,
) -> None:
    """The nightly job: run the suite, compare with the baseline, write the summary and report; exit 1 on regression.

    Exit codes: 0 no regression (or inconclusive, said loudly), 1 regressed (or slow creep with
    --history), 2 bad input, 3 inconclusive with --fail-on-inconclusive, 130 interrupted.
    """
    use_workload_modules(workload_module, model)
    numbers = precision_options(precision, dtype)
    choice = choose_runs(
        suite,
        workload,
        backend,
        mode,
        size,
        numbers["dtype"],
        custom_model(model, inputs, loss, model_config, task, suite, workload),
    )
    shape = {
        **shape_options(choice, batch_size, seq_len, prompt_len, gen_len, image_size, latent_size),
        **device_options(devices, parallel, tp, scaling),
    }
    settings = settings_from(threshold, statistic)
    fixed_rounds = parse_rounds(rounds, settings.min_runs)
    if fixed_rounds is None and max_rounds < settings.min_runs:
        raise BadInput(f"--max-rounds {max_rounds}: a verdict needs {settings.min_runs} runs per side; give more")
    price_table = prices_from(prices)
    if out.exists() and not out.is_dir():
        raise BadInput(f"--out {out}: not a directory")
    results_dir = out.resolve() / "results"
    if results_dir.is_dir() and store.parquet_files(results_dir, "runs"):
        raise BadInput(f"--out {out}: {results_dir} already holds runs; give the job an empty folder")
    if serving_only and serving is None:
        raise BadInput("--serving-only needs --serving STORE: tonight's serving points to compare")
    tonight_serving = load_serving("--serving", serving) if serving is not None else None
    base = load_baseline(baseline, results) if baseline and not serving_only else None
    base_serving = serving_baseline(baseline, results) if baseline and serving is not None else None
    if serving_only and baseline and base_serving is None:
        raise BadInput(f"--baseline {baseline}: no serving points in it to compare --serving with")
    if history is not None:
        history = str(writable_results(history, "--history"))
    if serving_only:
        assert tonight_serving is not None
        out_dir = writable_dir("--out", out)
        _serving_night(tonight_serving, base_serving, out_dir, settings, history, creep_nights, fail_on_inconclusive)
        return
    specs, notes = precision_runs(
        choice, plan_runs(choice, **numbers, warmup=warmup, steps=steps, timeout_s=timeout, **shape)
    )
    for note in notes:
        console.print(note, highlight=False)
    if not specs:
        raise BadInput("nothing to run: no chosen workload has the chosen sizes and modes")
    out_dir = writable_dir("--out", out)  # created only once the input is known good: a refusal leaves no folder
    if threads is not None:  # the workers' environment, and so their fork server's, is the parent's
        os.environ["OMP_NUM_THREADS"] = str(threads)
    runner = SuiteRunner(
        results_dir=results_dir, pythons=pythons(python), tags={"ci": "nightly", **key_values("--tag", tag)}
    )
    if not choice.backends:
        available = local_backends(runner)
        specs = [spec for spec in specs if spec.backend in available]
    if fixed_rounds is None:
        chosen_rounds, why = auto_rounds(base, specs, settings, max_rounds)
        why = f" (auto: {why})"
    else:
        chosen_rounds, why = fixed_rounds, ""
    planned = rounds_of(specs, chosen_rounds)
    console.print(
        f"tpubench ci: {len(specs)} configuration(s) x {chosen_rounds} round(s) = {len(planned)} runs{why}",
        highlight=False,
    )
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
    for line in _closing(comparison, failed, base is not None):
        console.print(line, highlight=False)
    verdicts = [] if comparison is None else [compare.overall_verdict(comparison)]
    if tonight_serving is not None:
        verdicts.append(_serving_step(tonight_serving, base_serving, out_dir, settings))
    crept = False
    if history is not None:
        crept = _history(history, results_dir, runner.invocation_id, creep_nights, settings, out_dir / "summary.md")
        if tonight_serving is not None:
            crept = _serving_creep(history, tonight_serving, creep_nights, settings, out_dir / "summary.md") or crept
    console.print(f"summary: {out_dir / 'summary.md'}; report: {out_dir / 'report.html'}; results: {results_dir}")
    regressed = report.regressed or "regressed" in verdicts
    if regressed or crept or (base is None and not failed.empty):
        raise typer.Exit(1)
    if fail_on_inconclusive and "inconclusive" in verdicts:
        raise typer.Exit(INCONCLUSIVE_EXIT)


def _serving_night(
    tonight: ServingSelection,
    base: ServingSelection | None,
    out_dir: Path,
    settings: compare.Settings,
    history: str | None,
    creep_nights: int,
    fail_on_inconclusive: bool = False,
) -> None:
    """``--serving-only``: no suite; tonight's serving points copied into results/, compared
    with the baseline's, the summary written; exit as a night of runs does."""
    summary = out_dir / "summary.md"
    summary.write_text("# tpubench ci: serving points\n")
    verdict = _serving_step(tonight, base, out_dir, settings)
    crept = False
    if history is not None:
        copied = store.append_store(out_dir / "results", history)
        console.print(f"history: {copied} file(s) appended to {history}", highlight=False)
        _compact(history)
        crept = _serving_creep(history, tonight, creep_nights, settings, summary)
    console.print(f"summary: {summary}; results: {out_dir / 'results'}", highlight=False)
    if verdict == "regressed" or crept:
        raise typer.Exit(1)
    if fail_on_inconclusive and verdict == "inconclusive":
        raise typer.Exit(INCONCLUSIVE_EXIT)


def _serving_step(
    tonight: ServingSelection, base: ServingSelection | None, out_dir: Path, settings: compare.Settings
) -> str:
    """Copy tonight's serving points into ``out_dir``/results (the next night's baseline and
    the history get them with the runs), compare them with ``base``'s, write
    ``serving_comparison.json`` and the summary's section, print the verdict and what
    regressed; the serving verdict (one of :data:`serving_compare.OVERALL`)."""
    results_dir = out_dir / "results"
    store.append_store(tonight.selector, results_dir, SERVING_TABLES)
    if base is None:
        line = f"serving points: no baseline points, nothing compared ({len(tonight.points)} kept in {results_dir})"
        console.print(line, highlight=False)
        with (out_dir / "summary.md").open("a") as stream:
            stream.write(f"\n## Serving points\n\n{line}.\n")
        return "nothing compared"
    from reports.markdown import serving_markdown

    frame = serving_comparison(base, tonight, settings)
    (out_dir / "serving_comparison.json").write_text(json.dumps(serving_compare.records(frame), indent=1) + "\n")
    with (out_dir / "summary.md").open("a") as stream:
        stream.write(f"\n## Serving points\n\n{serving_markdown(frame)}\n")
    for line in _serving_closing(frame):
        console.print(line, highlight=False)
    return serving_compare.overall_verdict(frame)


def _serving_closing(frame: pd.DataFrame) -> list[str]:
    """A serving comparison's last words: the verdict, and each point that regressed or decided nothing."""
    verdict = serving_compare.overall_verdict(frame)
    counts = serving_compare.verdict_counts(frame)
    tally = ", ".join(f"{n} {v}" for v, n in counts.items() if n)
    if verdict == "regressed":
        rows = serving_compare.regressions(frame)
        head = f"SERVING REGRESSED ({tally}):"
    elif verdict == "inconclusive":
        rows = serving_compare.undecided(frame)
        head = f"SERVING INCONCLUSIVE: no regression shown, and {len(rows)} gating row(s) decided nothing ({tally}):"
    else:
        return [serving_line(frame)]
    labels = serving_compare.serving_labels(rows)
    return [head, *(f"  {label}: {reason}" for label, reason in zip(labels, rows["reason"], strict=True))]


def _serving_creep(
    history: str, tonight: ServingSelection, nights: int, settings: compare.Settings, summary: Path
) -> bool:
    """Tonight's serving points against those of the night ``nights`` before in the history
    (a night: the UTC day a sweep started), added to ``summary``; whether that regressed."""
    try:
        points = store.load_table(history, "serving")
    except (StoreError, OSError, ValueError):
        return False
    days = pd.to_datetime(points["started_at"], utc=True).dt.strftime("%Y-%m-%d")
    mine = points["run_id"].isin(set(tonight.points["run_id"]))
    if not mine.any():
        return False
    earlier = sorted(set(days[~mine & (days < days[mine].min())]))
    if not earlier:
        return False
    reference = earlier[-nights] if len(earlier) >= nights else earlier[0]
    old = points[(days == reference) & ~mine]
    ids = [*old["run_id"], *tonight.points["run_id"]]
    requests = store.scan_table(history, "serving_requests", run_id=ids)
    frame = serving_compare.compare_points(old, points[mine], requests, settings)
    verdict = serving_compare.overall_verdict(frame)
    from reports.markdown import serving_markdown

    with summary.open("a") as stream:
        stream.write(f"\n## Slow creep of serving points: against {reference}\n\n{serving_markdown(frame)}\n")
    console.print(f"serving creep: {verdict.upper() if verdict == 'regressed' else verdict} against {reference}")
    labels = serving_compare.serving_labels(serving_compare.regressions(frame))
    for label, reason in zip(labels, serving_compare.regressions(frame)["reason"], strict=True):
        console.print(f"  {label}: {reason}", highlight=False)
    return verdict == "regressed"


def _history(
    history: str, results_dir: Path, invocation: str, nights: int, settings: compare.Settings, summary: Path
) -> bool:
    """Append tonight to the ``history`` store, compare tonight with the night ``nights`` before
    it there (slow creep: 1% a night never fails a night-to-night comparison, 7% over a week
    does), add that to ``summary``, and say whether it regressed."""
    from reports.markdown import comparison_markdown

    try:
        copied = store.append_store(results_dir, history)
        past = store.load_runs(history)
    except (StoreError, OSError, ValueError) as error:
        console.print(f"history: could not append tonight to {history}: {error}", highlight=False)
        return False
    tonight = past[past["invocation_id"] == invocation]
    starts = past.groupby("invocation_id")["started_at"].min().sort_values()
    earlier = [i for i in starts.index if i != invocation and starts[i] < tonight["started_at"].min()]
    console.print(
        f"history: {copied} file(s) appended to {history}, which now holds {len(starts)} night(s)",
        highlight=False,
    )
    _compact(history)
    if not earlier:
        return False
    reference = earlier[-nights] if len(earlier) >= nights else earlier[0]
    back = len(earlier) - earlier.index(reference)
    old = past[past["invocation_id"] == reference]
    steps = store.load_steps(history, run_id=[*old["run_id"], *tonight["run_id"]], phase="measure")
    creep = compare.compare_runs(old, tonight, steps, steps, settings)
    verdict = compare.overall_verdict(creep)
    when = f"{starts[reference]:%Y-%m-%d %H:%M} UTC"
    with summary.open("a") as stream:
        stream.write(
            f"\n## Slow creep: against {back} night(s) back\n\n**{verdict.capitalize()}** against invocation "
            f"{reference} ({when}): {comparison_markdown(creep)}\n"
        )
    console.print(
        f"creep: {verdict.upper() if verdict == 'regressed' else verdict} against invocation {reference} "
        f"({back} night(s) back, {when})",
        highlight=False,
    )
    for label, row in _labels(compare.regressions(creep)):
        console.print(f"  {label}: {row['reason']}", highlight=False)
    return verdict == "regressed"


def _compact(history: str) -> None:
    """Merge the history's files of earlier nights into their months' files, so that a store
    that gains a night's files every night never needs a manual ``tpubench compact``: its
    readers open a few files per table and month, not one per night. Tonight's files, an hour
    old at most, wait for the next night (the command's default ``--older-than``). A failure
    is said and does not fail the night: the store is as it was, only less compact."""
    from tpubench import store_compact
    from tpubench.cli.compact import DEFAULT_OLDER_THAN, parse_duration

    try:
        done = store_compact.compact(history, older_than_s=parse_duration(DEFAULT_OLDER_THAN))
    except (StoreError, OSError, ValueError, pa.ArrowException) as error:
        console.print(f"history: could not compact {history}: {error}", highlight=False)
        return
    changed = [f"{item.table} {item.files_before} -> {item.files_after}" for item in done if item.months]
    if changed:
        console.print(f"history: compacted earlier nights' files ({', '.join(changed)} files)", highlight=False)


def _labels(rows: pd.DataFrame) -> list[tuple[str, dict]]:
    """Each comparison row with its configuration's label, its backend and device too."""
    return list(zip(config_labels(rows, backend=True), rows.to_dict("records"), strict=True))


def _closing(comparison: pd.DataFrame | None, failed: pd.DataFrame, compared: bool) -> list[str]:
    """The job's last words: the verdict and what it rests on."""
    if not compared:
        lines = ["no baseline: nothing compared (this job's results/ can be the next one's --baseline)"]
        if not failed.empty:
            lines.append(f"FAILED: {len(failed)} run(s) did not finish ok: {', '.join(sorted(set(failed['status'])))}")
        return lines
    assert comparison is not None
    counts = compare.verdict_counts(comparison)
    tally = ", ".join(f"{n} {verdict}" for verdict, n in counts.items() if n)
    verdict = compare.overall_verdict(comparison)
    if verdict == "regressed":
        lines = [f"REGRESSED ({tally}):"]
        for label, row in _labels(compare.regressions(comparison)):
            lines.append(f"  {label}: {row['reason']}")
        return lines
    if verdict == "inconclusive":
        lines = [f"INCONCLUSIVE: {compare.overall_reason(comparison)} ({tally}):"]
        for label, row in _labels(compare.undecided(comparison)):
            if row["metric"] == "step":
                lines.append(f"  {label}: {row['reason']}")
        return lines
    return [f"{verdict} ({tally})"]
