"""``tpubench compare``, ``regressions``, ``report`` and ``export``: results against results.

Thin: runs come from :mod:`tpubench.store`, selections from :mod:`tpubench.analysis.select`,
verdicts from :mod:`tpubench.analysis.compare`, change points from
:mod:`tpubench.analysis.changepoints`, documents from :mod:`reports`; this module checks
input, picks and prints.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import pandas as pd
import typer
from rich.table import Table
from rich.text import Text

from tpubench import store, store_index
from tpubench.analysis import compare, serving_compare
from tpubench.analysis.ceilings import attach_attained, attained_text
from tpubench.analysis.compiles import COMPILE_METRICS, change_point_causes
from tpubench.analysis.identity import CONFIG_KEYS, SERVING_KEYS, config_labels, configurations
from tpubench.analysis.nulls import is_missing
from tpubench.analysis.prices import Price, PriceError, load_prices
from tpubench.analysis.select import SelectorError, parse_selector, select_runs
from tpubench.analysis.shapes import whole_numbers
from tpubench.cli.common import BadInput, app, choose, console
from tpubench.results_dir import DEFAULT_RESULTS_DIR
from tpubench.schema import RUNS, SERVING
from tpubench.store import StoreError

VERDICT_STYLE = {"regressed": "bold red", "improved": "green", "inconclusive": "yellow", "unpaired": "dim"}
SELECTOR_HELP = (
    "Runs to use: comma-separated terms, all required: latest, previous, invocation=ID, sha=ABC, "
    "date=/since=/until=DATE, tag.KEY=VALUE, COLUMN=VALUE, COLUMN!=VALUE, COLUMN~TEXT (e.g. backend=cuda, device~TPU)."
)


@dataclass
class Selection:
    """Runs picked by a selector and their measured steps."""

    selector: str
    runs: pd.DataFrame
    steps: pd.DataFrame
    compiles: pd.DataFrame | None = None  # the runs' compile events, where captured


@dataclass
class ServingSelection:
    """Serving points picked by a selector, and their requests."""

    selector: str
    points: pd.DataFrame
    requests: pd.DataFrame


def select_serving(results: str, selector: str) -> ServingSelection | None:
    """The serving points of ``results`` that ``selector`` picks (the selector's terms read the
    ``serving`` table's columns: ``engine=vllm``, ``tag.night=3``), with their requests; None
    where the store holds none, or the selector picks none (a runs column, ``backend=cuda``,
    picks no serving point, and is no error for a store of runs)."""
    try:
        points = store.load_table(results, "serving")
    except StoreError:
        return None
    if points.empty:
        return None
    try:
        chosen = select_runs(points, selector, SERVING.names)
    except SelectorError:
        return None
    wanted = {"run_id": list(chosen["run_id"]), "invocation_id": sorted(set(chosen["invocation_id"]))}
    return ServingSelection(selector, chosen, store.scan_table(results, "serving_requests", **wanted))


def serving_comparison(
    baseline: ServingSelection, candidate: ServingSelection, settings: compare.Settings
) -> pd.DataFrame:
    """The serving points' comparison; overlapping selections are a BadInput, as for runs."""
    shared = set(baseline.points["run_id"]) & set(candidate.points["run_id"])
    if shared:
        raise BadInput(
            f"--baseline {baseline.selector!r} and --candidate {candidate.selector!r} share {len(shared)} serving "
            "point(s); a point cannot be compared with itself"
        )
    requests = pd.concat([baseline.requests, candidate.requests], ignore_index=True)
    return serving_compare.compare_points(baseline.points, candidate.points, requests, settings)


def serving_table(comparison: pd.DataFrame, show_all: bool) -> tuple[Table, int]:
    """A serving comparison's rows worth reading (every TPOT row and every verdict but
    unchanged; all with ``show_all``) as a rich table, and how many were left out."""
    shown = (
        comparison
        if show_all
        else comparison[(comparison["metric"] == "tpot") | (comparison["verdict"] != "unchanged")]
    )
    table = Table(title="serving points: baseline -> candidate")
    for header in ("point", "metric", "baseline", "candidate", "change", "95% CI", "p", "verdict", "why"):
        table.add_column(header, justify="right" if header in ("baseline", "candidate", "change", "p") else "left")
    labels = serving_compare.serving_labels(shown)
    for label, row in zip(labels, shown.astype(object).where(shown.notna(), None).to_dict("records"), strict=True):
        ci = "-" if row["ci_low"] is None else f"{_change(row['ci_low'])}..{_change(row['ci_high'])}"
        table.add_row(
            label,
            f"{row['metric']} ({row['unit']})" if row["unit"] else row["metric"],
            _number(row["base_value"]),
            _number(row["test_value"]),
            _change(row["ratio"]),
            ci,
            "-" if row["p_value"] is None else f"{row['p_value']:.2g}",
            Text(row["verdict"], style=VERDICT_STYLE.get(row["verdict"], "")),
            row["reason"],
        )
    return table, len(comparison) - len(shown)


def serving_line(comparison: pd.DataFrame) -> str:
    """A serving comparison in one line: its verdict, why where undecided, and the tally."""
    verdict = serving_compare.overall_verdict(comparison)
    undecided = len(serving_compare.undecided(comparison))
    why = (
        f" ({undecided} gating row(s) decided nothing; more points or requests would tell)"
        if verdict == "inconclusive"
        else ""
    )
    counts = serving_compare.verdict_counts(comparison)
    return f"serving points: {verdict}{why}; " + ", ".join(f"{n} {v}" for v, n in counts.items() if n)


def load_all_runs(results: str) -> pd.DataFrame:
    """Every run of the store at ``results``; a missing store is a BadInput."""
    try:
        return store.load_runs(results)
    except StoreError as error:
        raise _missing(error) from error


def _missing(error: StoreError) -> BadInput:
    hint = "; `tpubench run --results DIR` creates one" if "does not exist" in str(error) else ""
    return BadInput(f"{error}{hint}")


def run_index(results: str, extra: Sequence[str] = (), only: Sequence[str] | None = None) -> pd.DataFrame:
    """Every run of the store at ``results``, the index's columns only (and ``extra``), as
    :mod:`tpubench.store_index` keeps them between commands: a selector picks runs from it,
    and only the picked runs are read whole (:func:`select`). With ``only``, just those
    columns (:func:`selector_columns`). A missing store is a BadInput."""
    try:
        return store_index.read_index(results, "runs", (*store_index.RUN_COLUMNS, *extra), only)
    except StoreError as error:
        raise _missing(error) from error


#: what any selector reads besides the columns its terms name: ``latest``/``previous``
#: (``invocation_id``, ``started_at``), dates (``started_at``), ``tag.KEY`` (``tags``)
SELECTOR_COLUMNS = ("run_id", "invocation_id", "started_at", "tags")


def selector_columns(*selectors: str) -> list[str] | None:
    """The index's columns that ``selectors`` read (a column the index lacks is read with
    it by :func:`select`); None where one cannot be parsed: its error is :func:`select`'s
    to report."""
    try:
        fields = [term.field for selector in selectors for term in parse_selector(selector)]
    except SelectorError:
        return None
    named = (field for field in fields if field in store_index.RUN_COLUMNS)
    return list(dict.fromkeys([*SELECTOR_COLUMNS, *named]))


def select(results: str, selector: str, runs: pd.DataFrame | None = None) -> Selection:
    """The runs of ``results`` that ``selector`` picks, whole, with their measure-phase steps.

    ``runs`` is what to pick from: the store's :func:`run_index` by default (read here), or
    one already read. A selector may name a column the index lacks: then an index with it is
    read (and kept). The picked runs are read whole from their invocations' files only, as
    are their steps and compile events: a year of nights is as quick to compare as the last
    two."""
    return select_each(results, [selector], runs)[0]


def select_each(results: str, selectors: Sequence[str], runs: pd.DataFrame | None = None) -> list[Selection]:
    """:func:`select` for each of ``selectors`` in the store at ``results``, the runs all of
    them pick read together: one scan of each table, where ``--baseline previous --candidate
    latest`` read the month's files of a compacted store twice over."""
    runs = run_index(results) if runs is None else runs
    picked = [_pick(results, selector, runs) for selector in selectors]
    wanted = {
        "run_id": sorted({run for chosen in picked for run in chosen["run_id"]}),
        "invocation_id": sorted({invocation for chosen in picked for invocation in chosen["invocation_id"]}),
    }

    def read(table: str, **more: Any) -> pd.DataFrame:  # the chosen invocations' files only
        paths = store_index.files_for(results, table, wanted["invocation_id"])
        return store.scan_table(results, table, paths=paths, **wanted, **more)

    def of(frame: pd.DataFrame, chosen: pd.DataFrame) -> pd.DataFrame:  # one selection's rows, in the read's order
        return frame if len(picked) == 1 else frame[frame["run_id"].isin(chosen["run_id"])].reset_index(drop=True)

    whole = read("runs").drop_duplicates("run_id") if any(store_index.FILE in c.columns for c in picked) else None
    steps, compiles = read("steps", phase="measure"), read("compiles")
    found = []
    for selector, chosen in zip(selectors, picked, strict=True):
        if store_index.FILE in chosen.columns:  # index rows: the picked runs' every column
            chosen = chosen[["run_id"]].merge(whole, on="run_id", how="left")
        found.append(Selection(selector, chosen, of(steps, chosen), of(compiles, chosen)))
    return found


def _pick(results: str, selector: str, runs: pd.DataFrame) -> pd.DataFrame:
    """The rows of ``runs`` that ``selector`` picks; a term naming a column ``runs`` lacks
    reads an index with it."""
    try:
        terms = parse_selector(selector)
        extra = [term.field for term in terms if term.field in RUNS.names and term.field not in runs.columns]
        if extra:
            runs = run_index(results, extra)
        return select_runs(runs, terms)
    except SelectorError as error:
        raise BadInput(f"{selector!r} in {results}: {error}") from error


def with_attained(runs: pd.DataFrame, results: str) -> pd.DataFrame:
    """``runs`` with ``mfu_attained`` against the ceilings measured in the store at ``results``
    (null for every run where it has none: docs/ceilings.md)."""
    return attach_attained(runs, store.scan_table(results, "ceilings"))


def prices_from(path: Path | None) -> dict[str, Price]:
    try:
        return load_prices(path)
    except PriceError as error:
        raise BadInput(str(error)) from error


STATISTIC_HELP = (
    "Each run's statistic of its step samples: median, p10 or min (a low quantile resists other processes "
    "taking the CPU; see docs/regressions.md, 'Calibration')."
)


def settings_from(threshold: float | None, statistic: str = "median") -> compare.Settings:
    """The comparison settings: ``--threshold PCT`` for step time (and what mirrors it), ``--statistic``."""
    if statistic not in compare.STATISTICS:
        raise BadInput(f"unknown --statistic {statistic!r}; valid: {', '.join(compare.STATISTICS)}")
    if threshold is None:
        return compare.Settings(statistic=statistic)
    if not 0 < threshold < 100:
        raise BadInput(f"--threshold expects a percentage between 0 and 100, got {threshold:g}")
    shared = threshold / 100
    thresholds = {"step": shared, "throughput": shared, "ttft": shared, "tpot": shared}
    return compare.Settings(thresholds=thresholds, statistic=statistic)


def _number(value: Any, digits: int = 2) -> str:
    if is_missing(value):
        return "-"
    return f"{value:,.{digits}f}"


def _change(ratio: Any) -> str:
    return "-" if ratio is None or ratio != ratio else f"{100 * (ratio - 1):+.1f}%"


def comparison_table(comparison: pd.DataFrame, show_all: bool) -> tuple[Table, int]:
    """The rows worth reading (every step-time row and every verdict but unchanged; all with
    ``show_all``) as a rich table, and how many were left out."""
    shown = (
        comparison
        if show_all
        else comparison[(comparison["metric"] == "step") | (comparison["verdict"] != "unchanged")]
    )
    table = Table(title="baseline -> candidate", show_lines=False)
    for header, justify in (
        ("configuration", "left"),
        ("backend", "left"),
        ("metric", "left"),
        ("baseline", "right"),
        ("candidate", "right"),
        ("change", "right"),
        ("95% CI", "right"),
        ("p", "right"),
        ("verdict", "left"),
        ("why", "left"),
    ):
        table.add_column(header, justify=justify, overflow="fold")
    labels = config_labels(shown)
    for label, row in zip(labels, shown.astype(object).where(shown.notna(), None).to_dict("records"), strict=True):
        backend = row["test_backend"] or row["base_backend"]
        if row["base_backend"] and row["test_backend"] and row["base_backend"] != row["test_backend"]:
            backend = f"{row['base_backend']} -> {row['test_backend']}"
        ci = (
            "-"
            if row["ci_low"] is None or row["ci_low"] != row["ci_low"]
            else f"{_change(row['ci_low'])}..{_change(row['ci_high'])}"
        )
        table.add_row(
            label,
            str(backend),
            f"{row['metric']} ({row['unit']})" if row["unit"] else row["metric"],
            _number(row["base_value"]),
            _number(row["test_value"]),
            _change(row["ratio"]),
            ci,
            "-" if row["p_value"] is None or row["p_value"] != row["p_value"] else f"{row['p_value']:.2g}",
            _verdict(row),
            row["reason"],
        )
    return table, len(comparison) - len(shown)


def _verdict(row: dict[str, Any]) -> Text:
    """The verdict, and beside it the quality flag of a candidate that no longer computes the
    same model (``quality_ok`` false: faster, but not the model; its reason says by how much)."""
    text = Text(row["verdict"], style=VERDICT_STYLE.get(row["verdict"], ""))
    if row.get("quality_ok") is False:
        text.append(" QUALITY OFF", style="bold red")
    return text


def cross_table(cross: pd.DataFrame) -> Table:
    table = Table(title="across backends (speedup = baseline step / candidate step)")
    energy = [_energy(row) for row in cross.to_dict("records")]
    measured = any(text != "-" for text in energy)  # the column only where some pair measured energy
    for header in (
        "configuration",
        "baseline -> candidate",
        "baseline ms",
        "candidate ms",
        "speedup",
        "MFU base",
        "MFU cand",
        "MFU att. base",
        "MFU att. cand",
        "tokens/$ base",
        "tokens/$ cand",
        "cost ratio",
        *(["mJ/token"] if measured else []),
        "caveat",
    ):
        table.add_column(header, justify="left" if header.startswith(("config", "baseline ->", "caveat")) else "right")
    for label, row, joules in zip(config_labels(cross), cross.to_dict("records"), energy, strict=True):
        caveat = row.get("caveat")
        table.add_row(
            label,
            f"{row['base_backend']} ({row['base_device']}) -> {row['test_backend']} ({row['test_device']})",
            _number(row["base_step_ms"]),
            _number(row["test_step_ms"]),
            _number(row["speedup"]),
            "-" if pd.isna(row["base_mfu"]) else f"{100 * row['base_mfu']:.1f}%",
            "-" if pd.isna(row["test_mfu"]) else f"{100 * row['test_mfu']:.1f}%",
            attained_text(row["base_mfu_attained"], row.get("base_ceiling_low")),
            attained_text(row["test_mfu_attained"], row.get("test_ceiling_low")),
            _number(row["base_tokens_per_usd"], 0),
            _number(row["test_tokens_per_usd"], 0),
            _number(row["cost_ratio"]),
            *([joules] if measured else []),
            "" if caveat is None or pd.isna(caveat) else str(caveat),  # NaN where no pair has one
        )
    return table


def _energy(row: dict[str, Any]) -> str:
    """Measured energy per token, baseline -> candidate, in mJ; "-" unless both sides measured it."""
    base, test = row.get("base_joules_per_token"), row.get("test_joules_per_token")
    if base is None or test is None or pd.isna(base) or pd.isna(test):
        return "-"
    return f"{base * 1e3:.3g} -> {test * 1e3:.3g}"


def _records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """``frame`` as JSON records, whole-number columns as integers (``seq_len`` 128, not 128.0)."""
    return json.loads(whole_numbers(frame).to_json(orient="records", date_format="iso"))


def run_comparison(
    baseline: Selection, candidate: Selection, settings: compare.Settings, by: str | None = None
) -> tuple[pd.DataFrame, list[str]]:
    """The comparison frame and the pairing keys (less the columns ``by`` lets differ:
    :data:`compare.BY`); overlapping selections are a BadInput."""
    shared = set(baseline.runs["run_id"]) & set(candidate.runs["run_id"])
    if shared:
        raise BadInput(
            f"--baseline {baseline.selector!r} and --candidate {candidate.selector!r} share {len(shared)} run(s); "
            "a run cannot be compared with itself"
        )
    keys = compare.pair_keys(baseline.runs, candidate.runs, by)
    frame = compare.compare_runs(
        baseline.runs, candidate.runs, baseline.steps, candidate.steps, settings, keys, candidate.compiles
    )
    return frame, keys


#: the pairing keys that say how a run was spread over devices (docs/multi-device.md)
LAYOUT_KEYS = ("devices", "parallel", "tp_size", "scaling")


@app.command("compare")
def compare_command(
    baseline: Annotated[str, typer.Option(help=f"Baseline runs. {SELECTOR_HELP}")],
    candidate: Annotated[str, typer.Option(help="Candidate runs (same selector syntax).")],
    results: Annotated[str, typer.Option(help="Results directory.")] = str(DEFAULT_RESULTS_DIR),
    baseline_results: Annotated[
        str | None, typer.Option(help="Results directory of the baseline (default: --results).")
    ] = None,
    threshold: Annotated[
        float | None, typer.Option(help=f"Step-time threshold in percent (default {100 * compare.STEP_THRESHOLD:g}).")
    ] = None,
    statistic: Annotated[str, typer.Option(help=STATISTIC_HELP)] = "median",
    prices: Annotated[Path | None, typer.Option(help="TOML of chip -> USD per hour, over the built-in table.")] = None,
    show_all: Annotated[bool, typer.Option("--all", help="Every metric row, unchanged ones too.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Everything as JSON on stdout.")] = False,
    markdown: Annotated[Path | None, typer.Option(help="Also write the comparison as Markdown to this file.")] = None,
    fail_on_regression: Annotated[bool, typer.Option(help="Exit 1 when anything regressed.")] = False,
    by: Annotated[
        str | None,
        typer.Option(
            help=f"Pair runs across this setting ({', '.join(compare.BY)}): e.g. --by precision "
            "--baseline precision=bf16 --candidate precision=fp8; a candidate that no longer computes the same "
            "model is flagged (quality_ok)."
        ),
    ] = None,
) -> None:
    """Compare candidate runs with baseline runs: ratio, CI, significance and a verdict per metric.
    Serving points the selectors pick are compared too, in a section of their own."""
    if by is not None:
        choose("--by", [by], list(compare.BY))
    settings = settings_from(threshold, statistic)
    price_table = prices_from(prices)
    markdown = _output_file("--markdown", markdown)
    base_store = baseline_results or results
    serving_sides = select_serving(base_store, baseline), select_serving(results, candidate)
    paired = serving_sides[0] is not None and serving_sides[1] is not None
    try:
        if base_store == results:  # picked from the index's columns the selectors read, then read together
            candidate_runs = run_index(results, only=selector_columns(candidate, baseline))
            chosen_candidate, chosen_baseline = select_each(results, [candidate, baseline], candidate_runs)
        else:
            chosen_candidate = select(results, candidate, run_index(results, only=selector_columns(candidate)))
            chosen_baseline = select(base_store, baseline, run_index(base_store, only=selector_columns(baseline)))
    except BadInput as error:
        if not paired:
            raise
        runs_skipped = f"runs: none compared ({error})"  # serving points only: the selectors pick no runs
        frame, keys = pd.DataFrame(columns=compare.COLUMNS), []
    else:
        runs_skipped = None
        frame, keys = run_comparison(chosen_baseline, chosen_candidate, settings, by)
    serving = None
    if paired:
        try:
            serving = serving_comparison(*serving_sides, settings)  # type: ignore[arg-type]
        except BadInput as error:
            if runs_skipped is not None:
                raise
            if not as_json:  # runs were what the selectors meant: points both sides pick compare with nothing
                console.print(f"serving points: none compared ({error})", highlight=False)
    cross = pd.DataFrame(columns=compare.CROSS_COLUMNS)
    ceilings_read: list[str] = []
    if runs_skipped is None and not set(compare.SIDE_KEYS) <= set(keys):
        sides = with_attained(chosen_baseline.runs, base_store), with_attained(chosen_candidate.runs, results)
        cross = compare.cross_backend(*sides, price_table)
        ceilings_read = list(dict.fromkeys(pd.concat([side["ceiling_choice"] for side in sides]).dropna()))
    counts = compare.verdict_counts(frame)
    verdict = compare.overall_verdict(frame)
    if serving is not None:
        verdict = serving_compare.combined_verdict(
            *([] if runs_skipped else [verdict]), serving_compare.overall_verdict(serving)
        )
    if markdown is not None:
        from reports.markdown import comparison_markdown, cross_markdown, serving_markdown

        text = f"# tpubench compare\n\nBaseline `{baseline}`, candidate `{candidate}`: " + (
            comparison_markdown(frame) if runs_skipped is None else f"{runs_skipped}."
        )
        if not cross.empty:
            text += "\n\n## Across backends\n\n" + cross_markdown(cross)
        if serving is not None:
            text += "\n\n## Serving points\n\n" + serving_markdown(serving)
        markdown.write_text(text + "\n")
    if as_json:
        found = {
            "baseline": baseline,
            "candidate": candidate,
            "paired_on": keys,
            "verdict": verdict,
            "counts": counts,
            "comparison": _records(frame),
            "cross_backend": _records(cross),
        }
        if serving is not None:
            found["serving"] = {
                "verdict": serving_compare.overall_verdict(serving),
                "paired_on": serving_compare.pair_keys(serving_sides[0].points, serving_sides[1].points),
                "counts": serving_compare.verdict_counts(serving),
                "comparison": serving_compare.records(serving),
            }
        print(json.dumps(found, indent=1))
    else:
        if runs_skipped is None:
            _print_runs(frame, keys, counts, cross, ceilings_read, show_all, markdown)
        else:
            console.print(runs_skipped, highlight=False)
        if serving is not None:
            table, hidden = serving_table(serving, show_all)
            console.print(table)
            if hidden:
                console.print(f"({hidden} unchanged serving row(s) not shown; --all shows them)")
            console.print(serving_line(serving), highlight=False)
    regressed = counts["regressed"] or (serving is not None and (serving["verdict"] == "regressed").any())
    if fail_on_regression and regressed:
        raise typer.Exit(1)


def _print_runs(
    frame: pd.DataFrame,
    keys: list[str],
    counts: dict[str, int],
    cross: pd.DataFrame,
    ceilings_read: list[str],
    show_all: bool,
    markdown: Path | None,
) -> None:
    """The runs' part of ``compare``'s terminal output: the table, the cross-backend table, the verdict line."""
    table, hidden = comparison_table(frame, show_all)
    console.print(table)
    if hidden:
        console.print(f"({hidden} unchanged row(s) of other metrics not shown; --all shows them)")
    if not cross.empty:
        console.print(cross_table(cross))
        for choice in ceilings_read:  # which measured ceiling "MFU att." divides by, and why that sweep
            console.print(f"MFU att. against {choice}", highlight=False)
    why = compare.overall_reason(frame)
    # the keys some compared run sets: a dimension no workload here takes is not news, nor
    # is the layout of one-device runs
    one_device = "devices" in frame.columns and (frame["devices"] == 1).all()
    shown = [
        key
        for key in keys
        if (key not in frame.columns or frame[key].notna().any()) and not (one_device and key in LAYOUT_KEYS)
    ]
    console.print(
        f"{compare.overall_verdict(frame)}{f' ({why})' if why else ''}; paired on {', '.join(shown)}; "
        + ", ".join(f"{n} {verdict}" for verdict, n in counts.items() if n)
        + (f"; markdown: {markdown}" if markdown else "")
    )


@app.command("regressions")
def regressions_command(
    results: Annotated[str, typer.Option(help="Results directory.")] = str(DEFAULT_RESULTS_DIR),
    since: Annotated[str | None, typer.Option(help="Only invocations from this UTC date on (YYYY-MM-DD).")] = None,
    select_runs_: Annotated[str | None, typer.Option("--select", help=f"Only these runs. {SELECTOR_HELP}")] = None,
    metric: Annotated[str, typer.Option(help="Runs column to follow (median_step_ms, ttft_p50_ms...).")] = (
        "median_step_ms"
    ),
    min_points: Annotated[int, typer.Option(min=2, help="Invocations a shift must last on each side.")] = 3,
    as_json: Annotated[bool, typer.Option("--json", help="The change points as JSON.")] = False,
    fail_on_regression: Annotated[bool, typer.Option(help="Exit 1 when a change point is a regression.")] = False,
    serving: Annotated[
        bool,
        typer.Option(
            "--serving",
            help="Follow the serving points instead of runs: one series per serving configuration, "
            "--metric a serving column (default tpot_p50_ms).",
        ),
    ] = False,
) -> None:
    """Change points in each series' history, and the invocation and git sha that introduced each."""
    from tpubench.analysis import changepoints  # ruptures and scipy: only the command that needs them
    from tpubench.schema import RUNS

    if serving:
        _serving_regressions(results, since, select_runs_, metric, min_points, as_json, fail_on_regression)
        return
    numeric = [f.name for f in RUNS if f.type in ("double", "int64") and f.name not in compare.PAIR_KEYS]
    if metric not in numeric:
        raise BadInput(f"--metric {metric!r} is not a numeric runs column; valid: {', '.join(numeric)}")
    terms = ",".join(filter(None, [select_runs_, f"since={since}" if since else None]))
    runs = select(results, terms).runs if terms else load_all_runs(results)
    settings = changepoints.ChangePointSettings(min_points=min_points)
    found = changepoints.change_points(runs, metric, settings)
    if metric in COMPILE_METRICS and not found.empty:  # what compiled after warm-up, and where
        compiles = store.load_compiles(results, invocation_id=list(found["invocation_id"]))
        found["cause"] = change_point_causes(found, configurations(runs), compiles, CONFIG_KEYS)
    series = configurations(runs[runs["status"] == "ok"]).groupby(list(CONFIG_KEYS), dropna=False).ngroups
    if as_json:
        print(json.dumps(_records(found), indent=1))
    else:
        if not found.empty:
            table = Table(title=f"change points in {metric}")
            for header in (
                "series",
                "backend",
                "device",
                "from",
                "invocation",
                "git sha",
                "before",
                "after",
                "change",
                "p",
                "",
            ):
                table.add_column(header)
            for label, row in zip(config_labels(found), found.to_dict("records"), strict=True):
                table.add_row(
                    label,
                    row["backend"],
                    str(row["device"]),
                    f"{pd.Timestamp(row['started_at']):%Y-%m-%d %H:%M}",
                    row["invocation_id"],
                    str(row["git_sha"]),
                    _number(row["before"]),
                    _number(row["after"]),
                    f"{row['change_pct']:+.1f}%",
                    f"{row['p_value']:.2g}",
                    Text(
                        row["direction"] + (f": {row['cause']}" if row.get("cause") else ""),
                        style="bold red" if row["direction"] == "regression" else "green",
                    ),
                )
            console.print(table)
        console.print(
            f"{len(found)} change point(s) in {series} series "
            f"(a shift must last {min_points} invocations on each side, p < {settings.alpha} in Welch's t-test "
            "on the log values, "
            f">= {100 * settings.min_change:g}%)"
        )
        serving_series = _serving_series(results)
        if serving_series:
            console.print(f"the store also holds {serving_series} serving series: --serving follows them")
    if fail_on_regression and (found["direction"] == "regression").any():
        raise typer.Exit(1)


def _serving_series(results: str) -> int:
    """How many serving configurations the store at ``results`` holds."""
    points = store.load_table(results, "serving")
    return 0 if points.empty else points.groupby(list(SERVING_KEYS), dropna=False).ngroups


def _serving_regressions(
    results: str,
    since: str | None,
    selector: str | None,
    metric: str,
    min_points: int,
    as_json: bool,
    fail_on_regression: bool,
) -> None:
    """``tpubench regressions --serving``: change points in each serving configuration's history."""
    from tpubench.analysis import changepoints

    metric = "tpot_p50_ms" if metric == "median_step_ms" else metric
    if metric not in changepoints.SERVING_METRICS:
        raise BadInput(f"--metric {metric!r} is not a serving figure; valid: {', '.join(changepoints.SERVING_METRICS)}")
    try:
        points = store.load_table(results, "serving")
    except StoreError as error:
        raise BadInput(str(error)) from error
    terms = ",".join(filter(None, [selector, f"since={since}" if since else None]))
    if terms and not points.empty:
        try:
            points = select_runs(points, terms, SERVING.names)
        except SelectorError as error:
            raise BadInput(f"{terms!r} in {results}: {error}") from error
    settings = changepoints.ChangePointSettings(min_points=min_points)
    found = changepoints.serving_change_points(points, metric, settings)
    if as_json:
        print(json.dumps(_records(found), indent=1))
    else:
        if not found.empty:
            table = Table(title=f"change points in serving {metric}")
            for header in ("point", "from", "invocation", "git sha", "before", "after", "change", "p", ""):
                table.add_column(header)
            labels = serving_compare.serving_labels(found)
            for label, row in zip(labels, found.to_dict("records"), strict=True):
                table.add_row(
                    label,
                    f"{pd.Timestamp(row['started_at']):%Y-%m-%d %H:%M}",
                    row["invocation_id"],
                    "-" if is_missing(row["git_sha"]) else str(row["git_sha"]),
                    _number(row["before"]),
                    _number(row["after"]),
                    f"{row['change_pct']:+.1f}%",
                    f"{row['p_value']:.2g}",
                    Text(row["direction"], style="bold red" if row["direction"] == "regression" else "green"),
                )
            console.print(table)
        series = 0 if points.empty else points.groupby(list(SERVING_KEYS), dropna=False).ngroups
        console.print(
            f"{len(found)} change point(s) in {series} serving series (one point per sweep; a shift must last "
            f"{min_points} sweeps on each side, p < {settings.alpha} in Welch's t-test on the log values, "
            f">= {100 * settings.min_change:g}%)"
        )
    if fail_on_regression and (found["direction"] == "regression").any():
        raise typer.Exit(1)


def write_report(
    out: Path,
    runs: pd.DataFrame,
    results: str,
    *,
    title: str,
    comparison: pd.DataFrame | None,
    baseline: str | None,
    markdown: Path | None,
    prices: dict[str, Price],
) -> Any:
    """Build the report of ``runs`` and write it as HTML to ``out`` (and Markdown to ``markdown``)."""
    from reports import build_report, html
    from reports import markdown as md

    ops = store.load_ops(results, run_id=list(runs["run_id"])) if runs["trace_path"].notna().any() else None
    report = build_report(runs, title=title, comparison=comparison, baseline=baseline, ops=ops, prices=prices)
    out.write_text(html.render(report), encoding="utf-8")
    if markdown is not None:
        markdown.write_text(md.render(report), encoding="utf-8")
    return report


def _output_file(option: str, path: Path | None) -> Path | None:
    if path is None:
        return None
    if path.is_dir():
        raise BadInput(f"{option} {path}: is a directory; give a file name")
    if not path.parent.is_dir():
        raise BadInput(f"{option} {path}: folder {path.parent} does not exist")
    return path


@app.command("report")
def report_command(
    out: Annotated[Path, typer.Option(help="The HTML file to write (self-contained, works offline).")],
    results: Annotated[str, typer.Option(help="Results directory.")] = str(DEFAULT_RESULTS_DIR),
    invocation: Annotated[str | None, typer.Option(help="The invocation to report (default: the latest).")] = None,
    select_runs_: Annotated[str | None, typer.Option("--select", help=f"Runs to report. {SELECTOR_HELP}")] = None,
    baseline: Annotated[str | None, typer.Option(help="Compare with these runs (selector).")] = None,
    baseline_results: Annotated[
        str | None, typer.Option(help="Results directory of the baseline (default: --results).")
    ] = None,
    markdown: Annotated[Path | None, typer.Option(help="Also write the report as Markdown here.")] = None,
    prices: Annotated[Path | None, typer.Option(help="TOML of chip -> USD per hour, over the built-in table.")] = None,
) -> None:
    """Write an HTML report (and optionally Markdown): results, charts, regressions, top ops."""
    out_path = _output_file("--out", out)
    md_path = _output_file("--markdown", markdown)
    assert out_path is not None
    if invocation and select_runs_:
        raise BadInput("--invocation and --select both choose the runs; give one")
    selector = select_runs_ or (f"invocation={invocation}" if invocation else "latest")
    all_runs = run_index(results)
    chosen = select(results, selector, all_runs)
    comparison = None
    if baseline:
        base_store = baseline_results or results
        base = select(base_store, baseline, all_runs if base_store == results else None)
        comparison, _ = run_comparison(base, chosen, compare.Settings())
    report = write_report(
        out_path,
        chosen.runs,
        results,
        title=f"tpubench report: {selector}",
        comparison=comparison,
        baseline=baseline,
        markdown=md_path,
        prices=prices_from(prices),
    )
    console.print(
        f"report: {out_path} ({len(chosen.runs)} runs"
        + (", regressed" if report.regressed else "")
        + ")"
        + (f"; markdown: {md_path}" if md_path else "")
    )


EXPORT_FORMATS = ("pytorch-benchmark",)


@app.command("export")
def export_command(
    out: Annotated[Path, typer.Option(help="The JSON file to write ('-': stdout).")],
    export_format: Annotated[str, typer.Option("--format", help=f"One of {', '.join(EXPORT_FORMATS)}.")] = (
        "pytorch-benchmark"
    ),
    results: Annotated[str, typer.Option(help="Results directory.")] = str(DEFAULT_RESULTS_DIR),
    select_runs_: Annotated[
        str | None, typer.Option("--select", help=f"Runs to export (default: all). {SELECTOR_HELP}")
    ] = None,
) -> None:
    """Export runs as PyTorch OSS benchmark database v3 records (for the PyTorch HUD)."""
    from reports.pytorch_benchmark import records

    if export_format not in EXPORT_FORMATS:
        raise BadInput(f"unknown --format {export_format!r}; valid: {', '.join(EXPORT_FORMATS)}")
    if str(out) != "-":
        _output_file("--out", out)
    if select_runs_:
        chosen = select(results, select_runs_)
        runs, steps = chosen.runs, chosen.steps
    else:
        runs = load_all_runs(results)
        steps = store.load_steps(results, phase="measure")
    found = records(runs, steps)
    text = json.dumps(found, indent=1)
    if str(out) == "-":
        print(text)
    else:
        out.write_text(text + "\n")
        console.print(f"{len(found)} record(s) from {int((runs['status'] == 'ok').sum())} ok run(s): {out}")
