"""A report as GitHub-flavoured Markdown: what a CI job writes to ``$GITHUB_STEP_SUMMARY``.

The verdict comes first (a reader of a red job wants to know why in one line), then the
regressions and what could not be decided, then the summary table.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from reports import BUSY_NOTE, DECODE_TOKENS_NOTE, RESULTS_HEADINGS, Report, results_table
from tpubench.analysis.ceilings import attained_text
from tpubench.analysis.compare import verdict_counts
from tpubench.analysis.identity import config_labels
from tpubench.analysis.serving_compare import overall_verdict as serving_verdict
from tpubench.analysis.serving_compare import serving_labels
from tpubench.analysis.serving_compare import verdict_counts as serving_counts

VERDICT_MARK = {
    "regressed": "🔴",
    "improved": "🟢",
    "worse": "▽",
    "better": "△",
    "inconclusive": "⚪",
    "unpaired": "·",
    "unchanged": "",
}


def _cell(value: Any, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and value != value) or value is pd.NA:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def table(frame: pd.DataFrame, columns: dict[str, str], digits: dict[str, int] | None = None) -> str:
    """``frame``'s ``columns`` (name -> header) as a Markdown table."""
    digits = digits or {}
    lines = ["| " + " | ".join(columns.values()) + " |", "|" + "---|" * len(columns)]
    for _, row in frame.iterrows():
        lines.append("| " + " | ".join(_cell(row[c], digits.get(c, 2)) for c in columns) + " |")
    return "\n".join(lines)


def comparison_markdown(comparison: pd.DataFrame, show_unchanged: bool = False) -> str:
    """The comparison's verdict line and the rows that are not ``unchanged`` (all with ``show_unchanged``)."""
    counts = verdict_counts(comparison)
    line = ", ".join(f"{n} {verdict}" for verdict, n in counts.items() if n)
    shown = comparison if show_unchanged else comparison[comparison["verdict"] != "unchanged"]
    if shown.empty:
        return f"{line or 'nothing compared'}."
    frame = shown.copy()
    frame["config"] = config_labels(frame)
    frame["backends"] = frame.apply(
        lambda r: (
            r["test_backend"]
            if r["base_backend"] == r["test_backend"]
            else f"{r['base_backend']} → {r['test_backend']}"
        ),
        axis=1,
    )
    frame["verdict"] = frame["verdict"].map(lambda v: f"{VERDICT_MARK.get(v, '')} {v}".strip())
    frame["change"] = frame["ratio"].map(lambda r: f"{100 * (r - 1):+.1f}%" if r == r and r is not None else "-")
    columns = {
        "config": "configuration",
        "backends": "backend",
        "metric": "metric",
        "base_value": "baseline",
        "test_value": "candidate",
        "change": "change",
        "verdict": "verdict",
        "reason": "why",
    }
    return f"{line}.\n\n" + table(frame, columns)


def serving_markdown(comparison: pd.DataFrame, show_unchanged: bool = False) -> str:
    """A serving comparison (:mod:`tpubench.analysis.serving_compare`): its verdict, the tally,
    and the rows that are not ``unchanged`` (all with ``show_unchanged``), each point named."""
    counts = serving_counts(comparison)
    line = f"**{serving_verdict(comparison).capitalize()}**: " + (
        ", ".join(f"{n} {verdict}" for verdict, n in counts.items() if n) or "nothing compared"
    )
    shown = comparison if show_unchanged else comparison[comparison["verdict"] != "unchanged"]
    if shown.empty:
        return f"{line}."
    frame = shown.copy()
    frame["point"] = serving_labels(frame)
    frame["verdict"] = frame["verdict"].map(lambda v: f"{VERDICT_MARK.get(v, '')} {v}".strip())
    frame["change"] = frame["ratio"].map(lambda r: f"{100 * (r - 1):+.1f}%" if r == r and r is not None else "-")
    frame["ci"] = [
        "-" if low is None or low != low else f"{100 * (low - 1):+.1f}% .. {100 * (high - 1):+.1f}%"
        for low, high in zip(frame["ci_low"], frame["ci_high"], strict=True)
    ]
    columns = {
        "point": "point",
        "metric": "metric",
        "base_value": "baseline",
        "test_value": "candidate",
        "change": "change",
        "ci": "95% CI",
        "verdict": "verdict",
        "reason": "why",
    }
    return f"{line}.\n\n" + table(frame, columns)


def render(report: Report) -> str:
    """The whole report as Markdown."""
    parts = [f"# {report.title}"]
    facts = [
        f"generated {report.generated_at:%Y-%m-%d %H:%M} UTC",
        f"invocation(s) {', '.join(report.invocations) or '-'}",
        f"git {', '.join(report.git_shas) or '-'}",
        f"host {', '.join(report.hosts) or '-'}",
    ]
    parts.append("; ".join(facts) + ".")
    if report.comparison is not None:
        word, _, why = report.headline.partition(" (")
        verdict = f"**{word}**" + (f" ({why}" if why else "")
        parts.append(f"## Against the baseline\n\n{verdict} against {report.baseline or 'the baseline'}: ")
        parts[-1] += comparison_markdown(report.comparison)
    if not report.summary.empty:
        parts.append(
            "## Results\n\n"
            + table(
                results_table(report.summary),
                RESULTS_HEADINGS,
                {"tokens_per_s": 0, "peak_mem_mib": 0, "mfu_pct": 1},
            )
        )
        if (report.summary["host_busy_runs"] > 0).any():
            parts[-1] += f"\n\n{BUSY_NOTE}"
        if (report.summary["mode"] == "decode").any():
            parts[-1] += f"\n\n{DECODE_TOKENS_NOTE}"
    if not report.cross_backend.empty:
        cross = report.cross_backend.copy()
        cross["config"] = config_labels(cross, dtype=False)
        parts.append("## Across backends\n\n" + cross_markdown(cross))
    for label, ops in report.top_ops.items():
        parts.append(
            f"## Top ops: {label}\n\n"
            + table(
                ops,
                {"rank": "#", "op": "op", "category": "category", "self_us_per_step": "self µs/step", "self_pct": "%"},
                {"self_us_per_step": 1, "self_pct": 1},
            )
        )
    return "\n\n".join(parts) + "\n"


def cross_markdown(cross: pd.DataFrame) -> str:
    """The cross-backend table (speedup, MFU, tokens per dollar) as Markdown."""
    frame = cross.copy()
    if "config" not in frame:
        frame["config"] = config_labels(frame, dtype=False)
    frame["pair"] = frame["base_backend"] + " → " + frame["test_backend"]
    for side in ("base", "test"):
        frame[f"{side}_mfu_pct"] = frame[f"{side}_mfu"] * 100
        attained = frame.get(f"{side}_mfu_attained", pd.Series(None, index=frame.index, dtype=float))
        low = frame.get(f"{side}_ceiling_low", pd.Series(False, index=frame.index))
        frame[f"{side}_att_pct"] = [attained_text(v, flag) for v, flag in zip(attained, low, strict=True)]
    return table(
        frame,
        {
            "config": "configuration",
            "pair": "baseline → candidate",
            "base_step_ms": "baseline ms",
            "test_step_ms": "candidate ms",
            "speedup": "speedup",
            "base_mfu_pct": "MFU % (base)",
            "test_mfu_pct": "MFU % (cand)",
            "base_att_pct": "MFU of measured ceiling (base)",
            "test_att_pct": "MFU of measured ceiling (cand)",
            "base_tokens_per_usd": "tokens/$ (base)",
            "test_tokens_per_usd": "tokens/$ (cand)",
            "cost_ratio": "cost ratio",
            "caveat": "caveat",
        },
        {
            "speedup": 2,
            "base_tokens_per_usd": 0,
            "test_tokens_per_usd": 0,
            "base_mfu_pct": 1,
            "test_mfu_pct": 1,
        },
    )
