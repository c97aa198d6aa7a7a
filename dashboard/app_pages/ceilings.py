"""Ceilings: what each device reaches (``tpubench ceilings``), as curves by size and beside
the data sheet: matmul FLOP/s by matrix size per dtype, STREAM bandwidth by array size, bus
bandwidth by message size; one line per device (:mod:`tpubench.analysis.ceilings`)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard import charts, data, state, ui
from tpubench.analysis import ceilings as ceilings_analysis
from tpubench.analysis.ceilings import across_text, rate_text, time_text

#: each kind's curve: its x axis and the unit its rate is shown in
AXES = {
    "matmul": ("M = N = K", "TFLOP/s", 1e12),
    "memory": ("bytes per array", "GB/s", 1e9),
    "collective": ("message bytes (S)", "bus GB/s", 1e9),
}
HINT = "tpubench ceilings --backend cpu --results {results}"


def curve(points: pd.DataFrame, kind: str, title: str) -> object:
    """Median rate by size, one line per series (backend, device, op, dtype, group size), log x
    axis; built by :func:`dashboard.charts.lines` (Plotly Express cost ten times as much)."""
    label, unit, scale = AXES[kind]
    frame = points.assign(rate=points["median_rate"] / scale, best=points["max_rate"] / scale)
    return charts.lines(
        frame, "size", "rate", "series", {"size": label, "rate": f"median {unit}", "series": ""}, title,
        hover={"best": (f"max {unit}", ":.4g")}, log_x=True, legend={"orientation": "h", "y": -0.25},
    )  # fmt: skip


def summary_table(lines: pd.DataFrame) -> pd.DataFrame:
    """``tpubench ceilings --show``'s table (``lines``: :func:`tpubench.analysis.ceilings.summary`): each line's
    best point beside the data sheet, its rates in GFLOP/s, TFLOP/s or GB/s as ``--show`` prints them, and
    how far the sweeps of that point spread."""
    records = lines.to_dict("records")
    latency = [line["kind"] == "latency" for line in records]
    return pd.DataFrame(
        {
            "backend": lines["backend"],
            "device": lines["device"],
            "kind": lines["kind"],
            "op": lines["op"],
            "dtype": lines["dtype"],
            "N": lines["devices"],
            "best at": lines["shape"],
            "median": [
                (time_text(line["median_s"]) if slow else rate_text(line["median_rate"], line["rate_unit"]))
                + ("" if line["ceiling"] else " (a cache's)")
                for line, slow in zip(records, latency, strict=True)
            ],
            "max": [
                "-" if slow else rate_text(line["max_rate"], line["rate_unit"])
                for line, slow in zip(records, latency, strict=True)
            ],
            "data sheet": [rate_text(line["datasheet"], line["rate_unit"]) for line in records],
            "measured / data sheet %": lines["ratio"].astype("Float64") * 100,
            "across sweeps": [across_text(line) for line in records],
            "simulated": lines["simulated"],
        },
        index=lines.index,
    )


def choices(lines: pd.DataFrame) -> list[str]:
    """Each line's sweep and why it (:func:`tpubench.analysis.ceilings.choose`), once per sweep and key."""
    return list(
        dict.fromkeys(
            f"{line['backend']} {line['kind']} {line['dtype']}"
            + (f" x{int(line['devices'])}" if line["devices"] > 1 else "")
            + f": {line['choice']}"
            for line in lines.to_dict("records")
        )
    )


def main() -> None:
    view = ui.store_view()
    if view is None:
        return
    st.title("Ceilings")
    read = data.ceilings_read(view.results)  # not the rows: the analyses below are kept
    ui.warn_skipped(read.skipped)
    if not read.measured:
        if view.problem == "empty":
            ui.empty_state(view)
        st.info("No ceilings measured in this store yet. Measure this host's devices, then reload:")
        st.code(HINT.format(results=data.stores(view.results)[0]), language="bash")
        return
    st.caption(
        "Medians of each point's samples (hover: the max), from the quietest sweep of each device, kind and dtype "
        "(the fewest other processes on the CPUs, then the tightest samples); a memory sweep whose arrays never got "
        f"past {ceilings_analysis.LLC_MULTIPLE}x the last-level cache measures the cache and sets no ceiling. A run's "
        "MFU of measured ceiling (Overview, Compare) is its FLOP/s per device over the best matmul median of its "
        "device and dtype. Simulated devices (gloo ranks or PJRT CPU devices sharing the host) show the plumbing, "
        "not a link."
    )
    lines = data.ceilings_summary(view.results)
    ui.table(summary_table(lines).style.format(precision=1, thousands=",", na_rep="-"))
    with st.expander("Which sweep each line is read from, and why", expanded=not lines["ceiling"].all()):
        for choice in choices(lines):
            st.caption(choice)
    matmul = data.ceilings_curves(view.results, "matmul")
    if not matmul.empty:
        dtypes = sorted(matmul["dtype"].unique())
        st.subheader("Matmul FLOP/s by matrix size")
        for column, dtype in zip(st.columns(len(dtypes)), dtypes, strict=True):
            shown = matmul[matmul["dtype"] == dtype]
            column.plotly_chart(curve(shown, "matmul", dtype), key=f"ceilings-matmul-{dtype}")
    memory = data.ceilings_curves(view.results, "memory")
    if not memory.empty:
        st.subheader("Memory bandwidth by transfer size")
        ops = list(dict.fromkeys(memory["op"]))
        default = "triad" if "triad" in ops else ops[0]
        op = st.selectbox("Kernel", ops, key=state.bind("kernel", default, choices=ops))
        st.plotly_chart(curve(memory[memory["op"] == op], "memory", f"STREAM {op}"), key="ceilings-memory")
    collective = data.ceilings_curves(view.results, "collective")
    if not collective.empty:
        st.subheader("Bus bandwidth by message size")
        ops = list(dict.fromkeys(collective["op"]))
        op = st.selectbox("Collective", ops, key=state.bind("collective", ops[0], choices=ops))
        st.plotly_chart(curve(collective[collective["op"] == op], "collective", op), key="ceilings-collective")


main()
