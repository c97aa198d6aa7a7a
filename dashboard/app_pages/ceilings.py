"""Ceilings: what each device reaches (``tpubench ceilings``), as curves by size and beside
the data sheet: matmul FLOP/s by matrix size per dtype, STREAM bandwidth by array size, bus
bandwidth by message size; one line per device (:mod:`tpubench.analysis.ceilings`)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard import charts, data, state, ui

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
    best point beside the data sheet."""
    return pd.DataFrame(
        {
            "backend": lines["backend"],
            "device": lines["device"],
            "kind": lines["kind"],
            "op": lines["op"],
            "dtype": lines["dtype"],
            "N": lines["devices"],
            "best at": lines["shape"],
            "median": lines["median_rate"],
            "max": lines["max_rate"],
            "unit": lines["rate_unit"],
            "median µs": lines["median_s"] * 1e6,
            "data sheet": lines["datasheet"],
            "measured / data sheet %": lines["ratio"].astype("Float64") * 100,
            "simulated": lines["simulated"],
        }
    )


def main() -> None:
    view = ui.store_view()
    if view is None:
        return
    st.title("Ceilings")
    loaded = data.ceilings(view.results)
    ui.warn_skipped(loaded.skipped)
    frame = loaded.frame
    if frame.empty or not (frame["status"] == "ok").any():
        if view.problem == "empty":
            ui.empty_state(view)
        st.info("No ceilings measured in this store yet. Measure this host's devices, then reload:")
        st.code(HINT.format(results=data.stores(view.results)[0]), language="bash")
        return
    st.caption(
        "Medians of each point's samples (hover: the max), from the latest sweep of each device. A run's "
        "MFU of measured ceiling (Overview, Compare) is its FLOP/s per device over the best matmul median of its "
        "device and dtype. Simulated devices (gloo ranks or PJRT CPU devices sharing the host) show the plumbing, "
        "not a link."
    )
    ui.table(summary_table(data.ceilings_summary(view.results)).style.format(precision=3, thousands=",", na_rep="-"))
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
