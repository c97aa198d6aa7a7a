"""Scaling: each multi-device configuration over N (throughput and MFU per device, scaling
efficiency against its baseline, collective share, memory per device, rank skew), and backends
at equal N with the cost of a million tokens, as ``tpubench scaling`` shows them
(:mod:`tpubench.analysis.scaling`)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard import charts, data, state, ui
from tpubench.analysis import scaling
from tpubench.analysis.prices import load_prices

ALL = "all configurations"
SHOWN = {
    "devices": "N",
    "devices_per_host": "devices/host",
    "backend": "backend",
    "status": "status",
    "step_ms": "step ms",
    "tokens_per_s_per_device": "tokens/s/device",
    "samples_per_s_per_device": "samples/s/device",
    "mfu": "MFU %",
    "efficiency": "efficiency %",
    "baseline_devices": "baseline N",
    "baseline_parallel": "baseline plan",
    "collective_share": "collectives % of step",
    "exposed_collective_share": "exposed %",
    "peak_mem_bytes": "peak GiB/device (max)",
    "peak_mem_bytes_min": "(min)",
    "rank_skew_pct": "rank skew %",
    "simulated": "simulated",
}
PERCENT = ("mfu", "efficiency", "collective_share", "exposed_collective_share")


CROSS = {
    "configuration": "configuration",
    "devices": "N",
    "devices_per_host": "devices/host",
    "backend": "backend",
    "device": "device",
    "step_ms": "step ms",
    "tokens_per_s_per_device": "tokens/s/device",
    "mfu": "MFU %",
    "efficiency": "efficiency %",
    "exposed_collective_share": "exposed collectives %",
    "usd_per_device_hour": "$/device-hour",
    "usd_per_million_tokens": "$/Mtoken",
    "joules_per_token": "J/token (measured)",
    "simulated": "simulated",
}


def readable(report: pd.DataFrame, names: dict[str, str]) -> pd.DataFrame:
    """``names``' columns of a report as the page shows them: percentages, GiB, a link per run;
    a column no row has a value in (samples/s where tokens/s is given) left out."""
    table = report[[column for column in names if column in report]].copy()
    for column in PERCENT:
        if column in table:
            table[column] = 100 * table[column].astype("Float64")
    for column in ("peak_mem_bytes", "peak_mem_bytes_min"):
        if column in table:
            table[column] = table[column].astype("Float64") / 2**30
    table = table.dropna(axis="columns", how="all").rename(columns=names)
    table["run"] = "run_details?run=" + report["run_id"]
    return table


def main() -> None:
    view = ui.page_view()
    if view is None:
        return
    st.title("Scaling")
    runs = view.runs  # the index holds what the scaling views read (store_index.RUN_COLUMNS)
    # a configuration's rows share its identity's columns: the sidebar's choice of those keeps whole ones
    report = data.per_group(
        view.results, view.index, runs, view.filters, "scaling", scaling.IDENTITY, scaling.scaling_report
    )
    if report.empty:
        st.info("No multi-device configuration among the runs the filters keep. A sweep over N that fills this page:")
        st.code(scaling.SWEEP_HINT, language="bash")
        return
    names = [ALL, *dict.fromkeys(report["configuration"])]
    chosen = st.selectbox("Configuration", names, key=state.bind("config", ALL, choices=names))
    shown = report if chosen == ALL else report[report["configuration"] == chosen]
    note = scaling.efficiency_note(shown)
    st.caption(
        f"The latest run of each configuration at each N. {note[:1].upper()}{note[1:]}. "
        "The baseline is the configuration's 1-device run under its plan, else a plain 1-device run (never "
        "another plan's), else the smallest N that ran. Runs over several hosts have tables of their own "
        '("on 2 hosts"), N the devices over all hosts. Collectives: time per device per step in collectives '
        "(the union of their intervals) as a share of the step; exposed: the part no compute overlapped."
    )
    left, right = st.columns(2)
    left.plotly_chart(
        charts.scaling_chart(shown, "efficiency", "efficiency", "Scaling efficiency by N"), key="scaling-efficiency"
    )
    throughput = scaling.throughput_column(shown)
    right.plotly_chart(
        charts.scaling_chart(shown, throughput, SHOWN[throughput], f"{SHOWN[throughput]} by N"),
        key="scaling-throughput",
    )
    for configuration, rows in shown.groupby("configuration", sort=False):
        st.subheader(str(configuration))
        hosts = rows["hosts"].max() > 1  # devices per host: only where the table spans hosts
        shown_columns = {
            column: name
            for column, name in SHOWN.items()
            if column != "backend" and (hosts or column != "devices_per_host")  # the backend: in the heading
        }
        ui.table(readable(rows, shown_columns).style.format(precision=2, thousands=",", na_rep="-"), links=("run",))
    if shown["simulated"].fillna(False).astype(bool).any():
        st.warning(scaling.SIMULATED_NOTE[0].upper() + scaling.SIMULATED_NOTE[1:] + ".")
    cross = scaling.cross_backend(shown, runs, load_prices())
    if not cross.empty:
        st.subheader("Backends at equal N")
        st.caption(
            "Cost of a million tokens: the device's price per hour (tpubench/analysis/prices.py) over its tokens "
            "per hour. Energy per token: a counter's delta over the measured steps (NVML on CUDA, RAPL on CPU), "
            "shown only where every backend of the row group measured it; TPUs have no public energy counter."
        )
        ui.table(readable(cross, CROSS).style.format(precision=3, thousands=",", na_rep="-"), links=("run",))


main()
