"""Compare: two selections of runs (last night against the night before, one backend against
another, or any two selectors), with the verdicts, CIs and cost figures of ``tpubench compare``."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard import charts, data, state, ui
from tpubench.analysis import compare
from tpubench.analysis.ceilings import attained_text
from tpubench.analysis.identity import config_labels
from tpubench.analysis.select import SelectorError

HOW = {
    "nights": "The latest invocation against the one before",
    "backends": "One backend against another",
    "custom": "Any two selections (selectors)",
}
SELECTOR_HELP = (
    "Comma-separated terms, all required: `latest`, `previous` (the invocation before it), `invocation=ID`, "
    "`sha=ABC`, `date=`/`since=`/`until=YYYY-MM-DD`, "
    "`tag.KEY=VALUE`, `COLUMN=VALUE`, `COLUMN!=VALUE`, `COLUMN~TEXT` (e.g. `backend=cuda,latest`). "
    "They pick among the runs the sidebar's filters keep."
)
#: the verdict table's order: what needs attention first
VERDICT_ORDER = ("regressed", "improved", "inconclusive", "worse", "better", "unchanged", "unpaired")
#: backends a cross-backend comparison starts from, in order of preference: a GPU against a TPU
BASE_PREFERENCE = ("cuda", "cuda-compile", "cpu", "cpu-compile")
TEST_PREFERENCE = ("tpu", "tpu-compile", "xla", "xla-compile")


def _first(preferred: tuple[str, ...], present: list[str], avoid: str | None = None) -> str:
    return next((b for b in preferred if b in present and b != avoid), next(b for b in present if b != avoid))


def selectors(view: ui.View) -> tuple[str, str] | None:
    """The baseline and candidate selectors the user's choice of comparison stands for."""
    how = st.radio(
        "Compare", list(HOW), format_func=HOW.__getitem__, horizontal=True, key=state.bind("how", "nights", choices=HOW)
    )
    if how == "nights":
        nights = data.last_two_nights(view.runs)
        if nights is None:
            st.info("The filtered runs come from one invocation only: there is no earlier one to compare with.")
            return None
        if nights.before is None:
            st.info(
                f"No earlier invocation ran any configuration of the latest, `{nights.latest}` (same workload, "
                "shape, backend and device), so nothing would pair: in a store merged from several machines each "
                "ran its own. Pick a machine's runs with the sidebar's Device filter, or compare any two "
                "selections."
            )
            return None
        if nights.skipped:
            st.caption(
                f"Opened on `{nights.latest}`, the latest invocation with an earlier one to compare with: "
                f"the {len(nights.skipped)} newer one(s) ({', '.join(f'`{n}`' for n in nights.skipped)}) ran "
                "configurations no earlier invocation ran (same workload, shape, layout, backend and device), so "
                "nothing of theirs would pair."
            )
        if nights.passed_over:
            st.caption(
                f"Passed over {len(nights.passed_over)} more recent invocation(s) "
                f"({', '.join(f'`{n}`' for n in nights.passed_over)}): none ran a configuration of the latest "
                "(same workload, shape, backend and device), as another machine's runs in a merged store do not."
            )
        return f"invocation={nights.before}", f"invocation={nights.latest}"
    if how == "backends":
        present = sorted(view.runs["backend"].unique())
        if len(present) < 2:
            st.info(f"The filtered runs have one backend ({present[0]}); a comparison across backends needs two.")
            return None
        left, right = st.columns(2)
        base_default = _first(BASE_PREFERENCE, present)
        base = left.selectbox(
            "Baseline backend", present, key=state.bind("base_backend", base_default, choices=present)
        )
        test_default = _first(TEST_PREFERENCE, present, avoid=base)
        test = right.selectbox(
            "Candidate backend", present, key=state.bind("test_backend", test_default, choices=present)
        )
        return f"backend={base},latest", f"backend={test},latest"
    left, right = st.columns(2)
    base = left.text_input("Baseline", key=state.bind("baseline", ""), help=SELECTOR_HELP, placeholder="sha=1a2b3c")
    test = right.text_input("Candidate", key=state.bind("candidate", "latest"), help=SELECTOR_HELP)
    if not base.strip() or not test.strip():
        st.info("Type a selector for each side, e.g. baseline `sha=1a2b3c` and candidate `latest`.")
        return None
    return base, test


def terminal_command(
    view: ui.View, base_selector: str, test_selector: str, base: pd.DataFrame, test: pd.DataFrame
) -> str:
    """``tpubench compare`` with the same selectors, on the store(s) that hold each side."""
    test_store = data.store_of(view.results, view.index, test["run_id"]) or data.stores(view.results)[0]
    base_store = data.store_of(view.results, view.index, base["run_id"]) or data.stores(view.results)[0]
    command = f"tpubench compare --baseline '{base_selector}' --candidate '{test_selector}' --results {test_store}"
    return command + (f" --baseline-results {base_store}" if base_store != test_store else "")


def verdict_table(frame: pd.DataFrame, show_all: bool) -> pd.DataFrame:
    """The comparison's rows worth reading (every step-time row and every verdict but unchanged),
    as ``tpubench compare`` prints them."""
    shown = frame if show_all else frame[(frame["metric"] == "step") | (frame["verdict"] != "unchanged")]
    order = shown["verdict"].map({verdict: rank for rank, verdict in enumerate(VERDICT_ORDER)})
    shown = shown.assign(order=order).sort_values("order", kind="stable")
    base_backend, test_backend = shown["base_backend"].astype("string"), shown["test_backend"].astype("string")
    backend = test_backend.fillna(base_backend)
    differs = (base_backend != test_backend).fillna(False)
    unit = shown["unit"].astype("string").fillna("")
    return pd.DataFrame(
        {
            "configuration": config_labels(shown),
            "backend": backend.where(~differs, base_backend + " → " + test_backend),
            "metric": shown["metric"].astype("string") + unit.map(lambda u: f" ({u})" if u else ""),
            "baseline": pd.to_numeric(shown["base_value"]),
            "candidate": pd.to_numeric(shown["test_value"]),
            "change %": 100 * (pd.to_numeric(shown["ratio"]) - 1),
            "95% CI %": [
                "-" if pd.isna(low) else f"{100 * (low - 1):+.1f} … {100 * (high - 1):+.1f}"
                for low, high in zip(shown["ci_low"], shown["ci_high"], strict=True)
            ],
            "p": pd.to_numeric(shown["p_value"]),
            "verdict": shown["verdict"],
            "why": shown["reason"],
        }
    )


def _verdict_style(cell: object) -> str:
    colour = charts.VERDICT_COLOURS.get(str(cell))
    return f"color: {colour}; font-weight: 600" if colour and cell != "unchanged" else ""


def attained_column(cross: pd.DataFrame, side: str) -> list[str]:
    """A side's MFU of measured ceiling as every reader shows it (a ceiling its runs beat reads
    as measured low, never as a figure: :func:`tpubench.analysis.ceilings.attained_text`)."""
    low = cross.get(f"{side}_ceiling_low", pd.Series(False, index=cross.index))
    return [attained_text(v, flag) for v, flag in zip(cross[f"{side}_mfu_attained"], low, strict=True)]


def cross_table(cross: pd.DataFrame) -> pd.DataFrame:
    percent = lambda v: None if pd.isna(v) else 100 * v  # noqa: E731
    return pd.DataFrame(
        {
            "configuration": config_labels(cross),
            "baseline": cross["base_backend"] + " (" + cross["base_device"].fillna("?") + ")",
            "candidate": cross["test_backend"] + " (" + cross["test_device"].fillna("?") + ")",
            "baseline ms": cross["base_step_ms"],
            "candidate ms": cross["test_step_ms"],
            "speedup x": cross["speedup"],
            "MFU baseline %": cross["base_mfu"].map(percent),
            "MFU candidate %": cross["test_mfu"].map(percent),
            "MFU of measured ceiling baseline": attained_column(cross, "base"),
            "MFU of measured ceiling candidate": attained_column(cross, "test"),
            "tokens/s baseline": cross["base_tokens_per_s"],
            "tokens/s candidate": cross["test_tokens_per_s"],
            "USD/h baseline": cross["base_usd_per_hour"],
            "USD/h candidate": cross["test_usd_per_hour"],
            "tokens per USD baseline": cross["base_tokens_per_usd"],
            "tokens per USD candidate": cross["test_tokens_per_usd"],
            "cost ratio": cross["cost_ratio"],
            "caveat": cross["caveat"].fillna(""),
        }
    )


def main() -> None:
    view = ui.page_view()
    if view is None:
        return
    st.title("Compare")
    chosen = selectors(view)
    if chosen is None:
        return
    base_selector, test_selector = chosen
    statistic = st.selectbox(
        "Each run's statistic",
        list(compare.STATISTICS),
        key=state.bind("statistic", "median", choices=list(compare.STATISTICS)),
        help="What each run contributes: its median step, or a low quantile (p10, min), which other processes "
        "taking the CPU move far less.",
    )
    try:
        base = data.select(view.results, view.runs, base_selector)
        test = data.select(view.results, view.runs, test_selector)
    except SelectorError as error:
        st.error(f"{error}")
        return
    shared = set(base["run_id"]) & set(test["run_id"])
    if shared:
        st.error(f"The two selections share {len(shared)} run(s); a run cannot be compared with itself.")
        return
    st.caption(
        f"Baseline `{base_selector}` ({len(base)} runs) against candidate `{test_selector}` ({len(test)} runs). "
        "The same in a terminal (on the whole store, without the sidebar's filters):"
    )
    st.code(terminal_command(view, base_selector, test_selector, base, test), language="bash", wrap_lines=True)
    pairs = lambda runs: tuple(zip(runs["invocation_id"], runs["run_id"], strict=True))  # noqa: E731
    result = data.comparison(view.results, pairs(base), pairs(test), statistic)
    ui.warn_skipped(result.skipped)
    why = compare.overall_reason(result.frame)
    st.markdown(f"**{compare.overall_verdict(result.frame).capitalize()}**" + (f" ({why})" if why else ""))
    counts = compare.verdict_counts(result.frame)
    for column, (verdict, n) in zip(st.columns(len(counts)), counts.items(), strict=True):
        column.metric(verdict, n)
    unpaired = result.frame[result.frame["verdict"] == "unpaired"]
    st.caption(
        f"Paired on {', '.join(result.keys)}."
        + (
            f" {len(unpaired)} configuration(s) ran on one side only and cannot be paired (the unpaired rows "
            "below say which side lacks each)."
            if not unpaired.empty
            else ""
        )
    )
    if not result.cross.empty:
        st.subheader("Across backends: speed and cost")
        st.plotly_chart(charts.speedup_chart(result.cross), key="compare-speedup")
        ui.table(cross_table(result.cross).style.format(precision=2, thousands=","))
        st.caption(
            "Tokens per USD = tokens/s x 3600 ÷ USD per device-hour (`tpubench/analysis/prices.py`, or a TOML file "
            "in `$TPUBENCH_PRICES`); empty where the device has no price. Cost ratio above 1: the candidate is "
            "cheaper per token."
        )
    st.subheader("Step time")
    if not result.base_summary.empty and not result.test_summary.empty:
        st.plotly_chart(charts.side_bars(result.base_summary, result.test_summary), key="compare-sides")
    step_rows = result.frame[(result.frame["metric"] == "step") & result.frame["ratio"].notna()]
    if not step_rows.empty:
        st.plotly_chart(charts.ratio_chart(step_rows), key="compare-ratio")
    st.subheader("Verdicts")
    show_all = st.toggle("Show unchanged rows of every metric", key=state.bind("all", False, "bool"))
    table = verdict_table(result.frame, show_all)
    ui.table(table.style.format(precision=2, thousands=",").map(_verdict_style, subset=["verdict"]))
    st.caption(
        "A regression needs five runs or more on each side, a change beyond the threshold with a CI that excludes "
        "no change, and a significant Mann-Whitney test over the runs' medians; otherwise it is inconclusive "
        "(docs/regressions.md)."
    )


main()
