"""Reports of a set of runs: one data model, rendered as self-contained HTML or as Markdown.

:func:`build_report` gathers the sections as DataFrames (from :mod:`tpubench.analysis`, no
rendering); :func:`reports.html.render` and :func:`reports.markdown.render` only format them,
so the CI job summary (Markdown), the report a person opens (HTML) and the dashboard show
the same figures.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

import pandas as pd

from tpubench.analysis import compare
from tpubench.analysis.identity import CONFIG_KEYS, config_labels, configurations
from tpubench.hostload import BUSY_SHARE, is_busy

#: the backend a cross-backend table measures others against, in order of preference
REFERENCE_BACKENDS = ("cuda", "cuda-compile", "cpu", "cpu-compile")


#: one row per configuration (:data:`tpubench.analysis.identity.CONFIG_KEYS`), then its figures
SUMMARY_COLUMNS = [
    *CONFIG_KEYS,
    "runs",
    "status",
    "median_step_ms",
    "ci_low_step_ms",
    "ci_high_step_ms",
    "tokens_per_s",
    "mfu",
    "mfu_attained",
    "ceiling_low_runs",
    "peak_mem_mib",
    "host_busy_runs",
]


#: the results table both renderers show: column -> heading
RESULTS_HEADINGS = {
    "config": "configuration",
    "backend": "backend",
    "device": "device",
    "status": "status",
    "runs": "runs",
    "median_step_ms": "median ms",
    "ci_low_step_ms": "CI low",
    "ci_high_step_ms": "CI high",
    "tokens_per_s": "tokens/s",
    "mfu_pct": "MFU %",
    "peak_mem_mib": "peak MiB",
    "host_busy_runs": "host busy runs",
}


def results_table(summary: pd.DataFrame) -> pd.DataFrame:
    """``summary`` with the two columns the results table adds: the configuration's label
    and MFU in percent; the status of a row with runs measured on a busy host says so."""
    busy = summary["host_busy_runs"].fillna(0) > 0
    marked = summary["status"].where(~busy, summary["status"] + " " + BUSY_MARK)
    return summary.assign(config=config_labels(summary, dtype=False), mfu_pct=summary["mfu"] * 100, status=marked)


#: a results row with runs measured while other processes used the CPUs, and what it means
BUSY_MARK = "⚠ host busy"
DECODE_TOKENS_NOTE = (
    "tokens/s of a decode row counts output (generated) tokens only, as serving benchmarks do; prompt plus "
    "output tokens per second is `total_tokens_per_s` in the store."
)
BUSY_NOTE = (
    f"{BUSY_MARK}: other processes used more than {100 * BUSY_SHARE:.0f}% of the CPUs while that many of the "
    "row's runs were measured (host busy runs); their step times may be inflated."
)


@dataclass
class Report:
    """Everything a report shows; each section a DataFrame (empty when it does not apply)."""

    title: str
    generated_at: datetime
    invocations: list[str]
    git_shas: list[str]
    hosts: list[str]
    summary: pd.DataFrame
    comparison: pd.DataFrame | None = None  # against the baseline: compare.compare_runs
    baseline: str | None = None  # how the baseline was chosen
    cross_backend: pd.DataFrame = field(default_factory=pd.DataFrame)
    top_ops: dict[str, pd.DataFrame] = field(default_factory=dict)  # run label -> analysis.ops.top_ops

    @property
    def regressed(self) -> bool:
        return self.comparison is not None and bool((self.comparison["verdict"] == "regressed").any())

    @property
    def headline(self) -> str:
        """The comparison in a few words, as both renderers open it: "Regressed", "Inconclusive
        (why)", "No regression" or "Nothing compared" (:func:`compare.overall_verdict`)."""
        if self.comparison is None:
            return ""
        verdict = compare.overall_verdict(self.comparison).capitalize()
        why = compare.overall_reason(self.comparison)
        return f"{verdict} ({why})" if why else verdict


#: the runs' figures a summary pools (``mfu_attained``: against the measured ceiling, where the
#: runs were read with one, :mod:`tpubench.analysis.ceilings`)
SUMMED = ("median_step_ms", "ci_low_step_ms", "ci_high_step_ms", "tokens_per_s", "mfu", "mfu_attained")


def summary_table(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per configuration (:mod:`tpubench.analysis.identity`: a 2-device run is not a
    1-device one, nor one user's model another's): repeats pooled (median of run medians, the
    CI's outer bounds), the worst status, and how many runs saw a busy host."""
    keys = list(CONFIG_KEYS)
    if runs.empty:
        return pd.DataFrame(columns=SUMMARY_COLUMNS)
    read = {*keys, "status", "peak_mem_bytes", "host_other_cpu_share", "ceiling_low", *SUMMED}
    frame = configurations(runs, keep=read)  # not a copy of 150 columns
    # grouped aggregations over columns, not a Python loop over the groups, and by one number
    # per configuration rather than by its 18 columns (a MultiIndex of them cost as much as the
    # figures): the dashboard calls this on every rerun of the Overview and Compare
    config = frame.groupby(keys, dropna=False, sort=True).ngroup().to_numpy()
    figures = pd.DataFrame(
        {
            **{column: pd.to_numeric(frame[column]) if column in frame else float("nan") for column in SUMMED},
            "peak_mem_mib": pd.to_numeric(frame["peak_mem_bytes"]) / 2**20,
        },
        index=frame.index,
    )
    grouped = figures.groupby(config, sort=True)
    medians = grouped[["median_step_ms", "tokens_per_s", "mfu", "mfu_attained", "peak_mem_mib"]].median()
    table = frame.loc[~pd.Series(config, index=frame.index).duplicated(), keys]  # each configuration's first row
    table = table.set_axis(config[~pd.Series(config).duplicated().to_numpy()]).sort_index()
    table = table.fillna({key: float("nan") for key in keys if table[key].dtype == object})  # None, as groupby gave
    status = frame["status"].where(frame["status"] != "ok")  # the first run not ok names the group's status
    table = table.assign(
        runs=grouped.size(),
        status=status.groupby(config, sort=True).first().reindex(table.index).fillna("ok"),
        median_step_ms=medians["median_step_ms"],
        ci_low_step_ms=grouped["ci_low_step_ms"].min(),
        ci_high_step_ms=grouped["ci_high_step_ms"].max(),
        tokens_per_s=medians["tokens_per_s"],  # decode: output tokens (schema 2)
        mfu=medians["mfu"],
        mfu_attained=medians["mfu_attained"] if "mfu_attained" in frame else None,
        # runs above their measured ceiling: it was measured low, and the cell says so, no figure
        ceiling_low_runs=frame.get("ceiling_low", pd.Series(False, index=frame.index))
        .eq(True)
        .astype("int64")
        .groupby(config, sort=True)
        .sum(),
        peak_mem_mib=medians["peak_mem_mib"],
        host_busy_runs=frame["host_other_cpu_share"].map(is_busy).astype("int64").groupby(config, sort=True).sum(),
    )
    return table.reset_index(drop=True)[SUMMARY_COLUMNS]


def _cross_backend(runs: pd.DataFrame, prices: dict) -> pd.DataFrame:
    """Every other backend against the reference one (a GPU where there is one), per configuration."""
    ok = runs[runs["status"] == "ok"]
    present = list(dict.fromkeys(ok["backend"]))
    if len(present) < 2:
        return pd.DataFrame(columns=compare.CROSS_COLUMNS)
    reference = next((b for b in REFERENCE_BACKENDS if b in present), present[0])
    others = ok[ok["backend"] != reference]
    return compare.cross_backend(ok[ok["backend"] == reference], others, prices)


def build_report(
    runs: pd.DataFrame,
    *,
    title: str = "tpubench report",
    comparison: pd.DataFrame | None = None,
    baseline: str | None = None,
    ops: pd.DataFrame | None = None,
    prices: dict | None = None,
    top: int = 10,
) -> Report:
    """The report of ``runs`` (a runs-table frame): summary, cross-backend table, the comparison
    against a baseline if given (:func:`tpubench.analysis.compare.compare_runs`), and the top
    ``top`` ops of each profiled run whose ops rows ``ops`` holds."""
    from tpubench.analysis.prices import PRICES

    top_ops: dict[str, pd.DataFrame] = {}
    if ops is not None and not ops.empty:
        from tpubench.analysis.ops import top_ops as rank

        for run_id, rows in ops.groupby("run_id"):
            run = runs[runs["run_id"] == run_id]
            if run.empty:
                continue
            label = f"{config_labels(run.iloc[[0]], dtype=False).iloc[0]} {run['backend'].iloc[0]} ({run_id[:8]})"
            top_ops[label] = rank(rows, n=top)
    return Report(
        title=title,
        generated_at=datetime.now(UTC),
        invocations=sorted(runs["invocation_id"].dropna().unique()),
        git_shas=sorted(runs["git_sha"].dropna().unique()),
        hosts=sorted(runs["host"].dropna().unique()),
        summary=summary_table(runs),
        comparison=comparison,
        baseline=baseline,
        cross_backend=_cross_backend(runs, prices if prices is not None else PRICES),
        top_ops=top_ops,
    )
