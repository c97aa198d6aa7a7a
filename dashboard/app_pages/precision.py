"""Precision & context: each chip at its best precision side by side (tokens/s, MFU against that
precision's own peak, the cost of a million tokens, the quality flag), and tokens/s against
sequence length per chip and attention kernel (:mod:`tpubench.analysis.precision`)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard import charts, data, ui
from tpubench.analysis import precision
from tpubench.analysis.prices import load_prices

PRECISION_HINT = (
    "tpubench run --workload llama3 --size 1b --mode train --dtype bfloat16 --precision bf16\n"
    "tpubench run --workload llama3 --size 1b --mode train --dtype bfloat16 --precision fp8"
)
LENGTH_HINT = "tpubench run --workload llama3 --size 1b --mode train --seq-len 2048,8192,32768 --attention flash"
BEST = {
    "workload": "workload",
    "size": "size",
    "mode": "mode",
    "device": "device",
    "backend": "backend",
    "precision": "precision",
    "runs": "runs",
    "tokens_per_s": "tokens/s",
    "mfu": "MFU %",
    "mfu_peak": "MFU against",
    "usd_per_m_tokens": "$/Mtoken",
    "quality": "quality vs bf16",
    "flag": "flag",
}
LABELS = {"seq_len": "sequence length (tokens)", "tokens_per_s": "tokens/s", "line": "chip · kernel"}


def quality_flag(row: pd.Series) -> str:
    """A row's flag in words: the chip's best, or a faster run that no longer computes the model."""
    if row["quality_ok"] is False:
        return "QUALITY OFF: not the same model"
    return "best" if row["best"] else ""


def best_table(view: ui.View) -> pd.DataFrame:
    """:func:`precision.best_precision` of the view's runs, as the page shows it."""
    prices = load_prices()
    table = data.per_group(
        view.results,
        view.index,
        view.runs,
        view.filters,
        f"best precision {sorted(prices.items())!r}",  # a price file changed: made again
        (*precision.WORKLOAD_KEYS, *precision.CHIP_KEYS, "precision"),
        lambda runs: precision.best_precision(runs, prices),
    )
    if table.empty:
        return table
    table = table.assign(mfu=100 * table["mfu"].astype("Float64"), flag=table.apply(quality_flag, axis=1))
    return table[list(BEST)].rename(columns=BEST)


def main() -> None:
    view = ui.page_view()
    if view is None:
        return
    st.title("Precision & context")
    if not (view.runs["status"] == "ok").any():
        st.info("No ok run matches the filters.")
        return
    # the index holds what the analyses read (store_index.RUN_COLUMNS): no runs file is opened, and a
    # chip's or a workload's choice keeps whole groups of the analyses made once (data.per_group)
    st.subheader("Each chip at its precisions")
    st.caption(
        "Median tokens/s of the ok runs of each configuration, chip and precision, fastest first; MFU divides by "
        "the peak of the precision the matmuls ran in (MFU against). $/Mtoken: the device's price per hour "
        "(tpubench/analysis/prices.py) over its tokens per hour. A converted run (fp8, int8, int4) is checked "
        "against bf16 of the same seed and inputs: one that no longer computes the same model is flagged and is "
        "never a chip's best, however fast."
    )
    table = best_table(view)
    if table.empty:
        st.info("No run with tokens/s among them. Runs at several precisions fill this table:")
        st.code(PRECISION_HINT, language="bash")
    else:
        ui.table(table.style.format(precision=2, thousands=",", na_rep="-"))
    st.subheader("Tokens/s against sequence length")
    curves = data.per_group(
        view.results,
        view.index,
        view.runs,
        view.filters,
        "tokens by length",
        tuple(precision.LENGTH_COLUMNS[:-2]),
        precision.tokens_by_length,
    )
    lengths = curves.groupby(precision.LENGTH_COLUMNS[:-3], dropna=False)["seq_len"]
    curves = curves[lengths.transform("nunique") > 1] if not curves.empty else curves
    if curves.empty:
        st.info("No configuration ran at several sequence lengths. A long-context sweep that draws this chart:")
        st.code(LENGTH_HINT, language="bash")
        return
    st.caption(
        "One line per chip and attention kernel: the kernel that ran, read from a traced step where the run "
        "traced one, else the one forced (auto: the backend's own choice). Attention grows with the square of "
        "the length, so a chip that leads at 2K can trail at 32K."
    )
    for (workload, size, mode), model in curves.groupby(["workload", "size", "mode"], sort=True):
        model = model.assign(
            line=model["device"]
            + " ("
            + model["backend"]
            + ") · "
            + model["kernel"].astype(str)
            + " · batch "
            + model["batch_size"].astype(str)
        )
        st.plotly_chart(
            charts.lines(
                model.sort_values(["line", "seq_len"]),
                "seq_len",
                "tokens_per_s",
                "line",
                LABELS,
                f"{workload}/{size} {mode}: tokens/s by sequence length",
                log_x=True,
            ),
            key=f"length-{workload}-{size}-{mode}",
        )


main()
