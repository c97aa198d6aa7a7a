"""A report as one self-contained HTML file: tables plus plotly charts, with plotly.js inlined.

Inlining plotly.js (about 4.5 MB) is what makes the file work offline and as a CI artifact
opened from a download folder; the charts are built from the report's frames only.
"""

from __future__ import annotations

import html

import pandas as pd
import plotly.graph_objects as go
from plotly.offline import get_plotlyjs

from reports import BUSY_NOTE, DECODE_TOKENS_NOTE, RESULTS_HEADINGS, Report, results_table
from reports.markdown import VERDICT_MARK
from tpubench.analysis.compare import verdict_counts
from tpubench.analysis.identity import config_labels
from tpubench.analysis.nulls import is_missing

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; font-size: 0.9em; margin: 0.5em 0 1.5em; }
th, td { border-bottom: 1px solid #ddd; padding: 0.25em 0.6em; text-align: right; }
th { background: #f4f4f4; } td.text, th.text { text-align: left; }
.regressed { color: #b00020; font-weight: bold; } .improved { color: #1b7f3b; }
.inconclusive, .unpaired { color: #777; }
"""


def _table(frame: pd.DataFrame, columns: dict[str, str], text: tuple[str, ...] = (), css: str | None = None) -> str:
    """``frame``'s columns as an HTML table; ``css`` names a column whose value becomes each row's class."""
    head = "".join(f'<th class="{"text" if c in text else ""}">{html.escape(h)}</th>' for c, h in columns.items())
    body = []
    for _, row in frame.iterrows():
        cells = []
        for column in columns:
            value = row[column]
            if is_missing(value):
                shown = "-"
            elif isinstance(value, float):
                shown = f"{value:,.2f}"
            else:
                shown = str(value)
            cells.append(f'<td class="{"text" if column in text else ""}">{html.escape(shown)}</td>')
        body.append(f'<tr class="{html.escape(str(row[css])) if css else ""}">{"".join(cells)}</tr>')
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _figure(figure: go.Figure) -> str:
    figure.update_layout(template="plotly_white", height=380, margin={"l": 60, "r": 20, "t": 50, "b": 120})
    return figure.to_html(full_html=False, include_plotlyjs=False)


def backend_charts(summary: pd.DataFrame) -> list[str]:
    """Per workload, the median step of each backend and configuration with its CI as error bars."""
    charts = []
    ok = summary[summary["median_step_ms"].notna()].copy()
    if ok.empty:
        return charts
    ok["config"] = config_labels(ok, dtype=False)
    for workload, group in ok.groupby("workload", sort=True):
        figure = go.Figure()
        for backend, rows in group.groupby("backend", sort=True):
            figure.add_bar(
                name=backend,
                x=rows["config"],
                y=rows["median_step_ms"],
                error_y={
                    "type": "data",
                    "symmetric": False,
                    "array": (rows["ci_high_step_ms"] - rows["median_step_ms"]).fillna(0),
                    "arrayminus": (rows["median_step_ms"] - rows["ci_low_step_ms"]).fillna(0),
                },
            )
        figure.update_layout(title=f"{workload}: median step per backend (95% CI)", yaxis_title="ms", barmode="group")
        charts.append(_figure(figure))
    return charts


def cross_chart(cross: pd.DataFrame) -> str:
    """Speedup of each candidate backend over the reference one (above 1: faster)."""
    frame = cross.copy()
    frame["label"] = config_labels(frame, dtype=False) + " " + frame["base_backend"] + "→" + frame["test_backend"]
    figure = go.Figure(go.Bar(x=frame["label"], y=frame["speedup"], name="speedup"))
    figure.add_hline(y=1, line_dash="dot")
    figure.update_layout(title="Speedup over the reference backend (baseline step ÷ candidate step)")
    return _figure(figure)


def comparison_chart(comparison: pd.DataFrame) -> str:
    """Step-time ratio (candidate ÷ baseline) per pair with its 95% CI; the thresholds dotted."""
    steps = comparison[(comparison["metric"] == "step") & comparison["ratio"].notna()].copy()
    if steps.empty:
        return ""
    steps["label"] = config_labels(steps, dtype=False) + " " + steps["test_backend"]
    figure = go.Figure()
    for verdict, rows in steps.groupby("verdict"):
        figure.add_scatter(
            name=verdict,
            mode="markers",
            x=rows["label"],
            y=rows["ratio"],
            error_y={
                "type": "data",
                "symmetric": False,
                "array": (rows["ci_high"] - rows["ratio"]).fillna(0),
                "arrayminus": (rows["ratio"] - rows["ci_low"]).fillna(0),
            },
        )
    threshold = float(steps["threshold_pct"].iloc[0]) / 100
    for y, dash in ((1, "solid"), (1 + threshold, "dot"), (1 / (1 + threshold), "dot")):
        figure.add_hline(y=y, line_dash=dash, line_color="#999")
    figure.update_layout(title="Step time, candidate ÷ baseline (95% CI)", yaxis_title="ratio")
    return _figure(figure)


def render(report: Report) -> str:
    """The whole report as one HTML document."""
    parts = [
        f"<h1>{html.escape(report.title)}</h1>",
        "<p>"
        + html.escape(
            f"Generated {report.generated_at:%Y-%m-%d %H:%M} UTC; invocation(s) {', '.join(report.invocations) or '-'};"
            f" git {', '.join(report.git_shas) or '-'}; host {', '.join(report.hosts) or '-'}."
        )
        + "</p>",
    ]
    if report.comparison is not None:
        counts = ", ".join(f"{n} {v}" for v, n in verdict_counts(report.comparison).items() if n)
        word, _, why = report.headline.partition(" (")
        headline = f"<b>{html.escape(word)}</b>" + html.escape(f" ({why}" if why else "")
        against = html.escape(report.baseline or "the baseline")
        parts.append(
            f"<h2>Against the baseline</h2><p>{headline} against {against}: "
            f"{html.escape(counts or 'nothing compared')}.</p>"
        )
        parts.append(comparison_chart(report.comparison))
        frame = report.comparison.copy()
        frame["config"] = config_labels(frame, dtype=False)
        frame["change"] = frame["ratio"].map(lambda r: f"{100 * (r - 1):+.1f}%" if r == r and r is not None else "-")
        frame["p"] = frame["p_value"].map(lambda p: "-" if p is None or p != p else f"{p:.2g}")
        frame["shown_verdict"] = frame["verdict"].map(lambda v: f"{VERDICT_MARK.get(v, '')} {v}".strip())
        frame = frame.sort_values(
            "verdict",
            key=lambda s: s.map({"regressed": 0, "inconclusive": 1, "unpaired": 2, "improved": 3}).fillna(4),
            kind="stable",
        )
        parts.append(
            _table(
                frame,
                {
                    "config": "configuration",
                    "base_backend": "baseline backend",
                    "test_backend": "candidate backend",
                    "metric": "metric",
                    "base_value": "baseline",
                    "test_value": "candidate",
                    "change": "change",
                    "ci_low": "ratio CI low",
                    "ci_high": "ratio CI high",
                    "p": "p",
                    "shown_verdict": "verdict",
                    "reason": "why",
                },
                text=("config", "base_backend", "test_backend", "metric", "shown_verdict", "reason"),
                css="verdict",
            )
        )
    parts.append("<h2>Results</h2>")
    summary = report.summary
    parts.append(
        _table(
            results_table(summary),
            RESULTS_HEADINGS,
            text=("config", "backend", "device", "status"),
        )
        if not summary.empty
        else "<p>No runs.</p>"
    )
    if not summary.empty and (summary["host_busy_runs"] > 0).any():
        parts.append(f"<p>{html.escape(BUSY_NOTE)}</p>")
    if not summary.empty and (summary["mode"] == "decode").any():
        parts.append(f"<p>{html.escape(DECODE_TOKENS_NOTE)}</p>")
    parts.extend(backend_charts(report.summary))
    if not report.cross_backend.empty:
        cross = report.cross_backend.copy()
        cross["config"] = config_labels(cross, dtype=False)
        for side in ("base", "test"):
            cross[f"{side}_mfu_pct"] = cross[f"{side}_mfu"] * 100
        parts.append("<h2>Across backends</h2>")
        parts.append(cross_chart(report.cross_backend))
        parts.append(
            _table(
                cross,
                {
                    "config": "configuration",
                    "base_backend": "reference",
                    "test_backend": "backend",
                    "base_step_ms": "reference ms",
                    "test_step_ms": "ms",
                    "speedup": "speedup",
                    "base_mfu_pct": "reference MFU %",
                    "test_mfu_pct": "MFU %",
                    "base_tokens_per_usd": "reference tokens/$",
                    "test_tokens_per_usd": "tokens/$",
                    "cost_ratio": "cost ratio",
                    "caveat": "caveat",
                },
                text=("config", "base_backend", "test_backend", "caveat"),
            )
        )
    for label, ops in report.top_ops.items():
        parts.append(f"<h2>Top ops: {html.escape(label)}</h2>")
        parts.append(
            _table(
                ops,
                {"rank": "#", "op": "op", "category": "category", "self_us_per_step": "self µs/step", "self_pct": "%"},
                text=("op", "category"),
            )
        )
    return (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(report.title)}</title>"
        f"<style>{STYLE}</style><script>{get_plotlyjs()}</script></head><body>{''.join(parts)}</body></html>"
    )
