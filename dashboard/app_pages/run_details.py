"""Run details: one run's configuration, environment fingerprint, raw step times, warnings, the
error and stderr tail of a run that did not finish ok, and a train run's losses beside another's."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import streamlit as st

from dashboard import catalog, charts, data, ui
from tpubench.analysis import compiles as analysis
from tpubench.analysis import memory as memory_analysis
from tpubench.analysis import parity
from tpubench.analysis.steps import job_steps
from tpubench.spec import DIMENSIONS

CONFIG = (
    "run_id", "invocation_id", "started_at", "finished_at", "suite", "workload", "size", "backend", "device", "mode",
    "dtype", "batch_size", "seq_len", "image_size", "latent_size", "gen_len", "warmup_min_steps", "warmup_steps",
    "measured_steps", "tpu_eager_mode", "compile_cache", "profile_steps", "verified", "max_rel_err",
    "verify_tolerance", "tags", "devices", "chips", "parallel", "parallel_impl", "mesh", "comm_backend", "scaling",
    "global_batch_size", "per_device_batch_size", "simulated", "failed_rank",
)  # fmt: skip
RESULTS = (
    "median_step_ms", "p10_step_ms", "p90_step_ms", "mean_step_ms", "std_step_ms", "ci_low_step_ms",
    "ci_high_step_ms", "median_host_ms", "samples_per_s", "tokens_per_s", "total_tokens_per_s", "ttft_p50_ms",
    "tpot_p50_ms", "itl_p50_ms", "bandwidth_util", "mfu", "flops_per_step", "flops_source", "attention_flops",
    "first_step_s", "compile_count", "compile_s", "recompiles_after_warmup", "peak_mem_bytes", "estimated_mem_bytes",
    "param_count", "active_param_count", "worker_wall_s", "device_wait_s", "host_load_1m", "host_other_cpu_share",
    "tokens_per_s_per_device", "samples_per_s_per_device", "collective_ms", "collective_share",
    "exposed_collective_ms", "exposed_collective_share", "rank_skew_pct", "peak_mem_bytes_min",
    "mem_weights_bytes", "mem_grads_bytes", "mem_optimizer_bytes", "mem_activations_bytes",
    "memory_breakdown_source", "energy_source", "energy_j", "joules_per_token", "joules_per_sample", "avg_power_w",
    "energy_window_s", "energy_steps",
)  # fmt: skip
ENVIRONMENT = (
    "host", "ray_node_id", "cpu_model", "device_count", "python_executable", "python_version", "torch_version",
    "tpubench_version", "git_sha", "fingerprint",
)  # fmt: skip


#: fields read as a share (shown in percent)
SHARES = frozenset({"mfu", "bandwidth_util", "host_other_cpu_share", "collective_share", "exposed_collective_share"})
#: what a column's name alone does not say: which tokens a rate counts
LABELS = {
    "tokens_per_s": "tokens_per_s (decode: output tokens)",
    "total_tokens_per_s": "total_tokens_per_s (prompt + output)",
}


def shown_value(name: str, value: object) -> str:
    """A field as a reader takes it in: bytes in MiB/GiB, shares in percent, times and rates
    to four significant figures with thousands separators, counts with separators. The
    stored value keeps its full precision (``tpubench run --json``, the parquet)."""
    if isinstance(value, pd.Timestamp):
        return f"{value:%Y-%m-%d %H:%M:%S} UTC"
    if isinstance(value, (bool, str)) or not isinstance(value, (int, float)):
        return str(value)
    if name.removesuffix("_min").endswith("_bytes"):  # peak_mem_bytes_min: the least-loaded device's peak
        return f"{value / 2**30:,.2f} GiB" if value >= 2**30 else f"{value / 2**20:,.1f} MiB"
    if name in SHARES:
        return f"{100 * value:.1f}%"
    if name == "max_rel_err" or name == "verify_tolerance":
        return f"{value:.2e}"
    if name == "flops_per_step":
        return f"{value:.3g}"
    if isinstance(value, int) or (float(value).is_integer() and abs(value) >= 1):
        return f"{int(value):,}"
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"


def fields(run: pd.Series, names: tuple[str, ...]) -> pd.DataFrame:
    """``names`` of ``run`` that have a value, as a two-column table of text."""
    shown = [(name, run[name]) for name in names if name in run and pd.notna(run[name]) and run[name] != ""]
    return pd.DataFrame(
        {
            "field": [LABELS.get(name, name) for name, _ in shown],
            "value": [
                shown_value(name, value.item() if isinstance(value, np.generic) else value) for name, value in shown
            ],
        }
    )


#: the columns of a run's compile events, in the order ``tpubench compiles`` prints them
EVENT_COLUMNS = (
    "step", "phase", "event", "layer", "cause", "cause_inferred", "source", "graph_break_id", "graph_id",
    "compile_id", "compile_s", "cache", "op", "count", "raw",
)  # fmt: skip


def compile_events(results: str, invocation: str, run: pd.Series) -> None:
    """The run's compiles, graph breaks, host reads and fallbacks, with the summary of
    ``tpubench compiles RUN_ID`` above them."""
    loaded = data.compiles(results, (invocation,), (run["run_id"],))
    ui.warn_skipped(loaded.skipped)
    if loaded.frame.empty:
        return
    events = analysis.run_events(loaded.frame, run["run_id"])
    st.markdown("**Compile events**")
    measured = int(run["measured_steps"]) if pd.notna(run["measured_steps"]) else None
    st.code("\n".join(analysis.summary(events, measured)), language=None)
    ui.table(events[list(EVENT_COLUMNS)].astype({"step": "Int64", "count": "Int64"}))


def memory_section(results: str, invocation: str, run: pd.Series) -> None:
    """The run's memory by part (per rank) beside its admitting estimate, and with
    --profile-memory its profiled step by category (``tpubench memory RUN_ID``'s figures)."""
    if pd.isna(run.get("memory_breakdown_source")):
        return
    loaded = data.memory(results, invocation, run["run_id"])
    ui.warn_skipped(loaded.skipped)
    st.markdown("**Memory by part**")
    ranks = memory_analysis.per_rank(loaded.frame)
    if ranks.empty:  # the row's own columns
        bars = memory_analysis.stacked(pd.DataFrame([run]), pd.Series(["this run"], index=[run.name]))
    else:
        rows = ranks.assign(
            run_id=run["run_id"] + "-" + ranks["rank"].astype(str),
            **{column: ranks[part] for part, (column, _) in memory_analysis.PARTS.items()},
            estimated_mem_bytes=run["estimated_mem_bytes"],
        )
        bars = memory_analysis.stacked(rows, "rank " + ranks["rank"].astype(str))
    st.plotly_chart(charts.memory_bars(bars, "Memory by part (GiB), estimate marked"), key="run-memory")
    st.caption(
        f"Source: {run['memory_breakdown_source']}. Weights, gradients and optimizer state are counted from the "
        "torch objects; activations + temporaries are the measured peak above the baseline less them. The marker "
        "is the estimate that admitted the run (docs/memory-and-energy.md)."
    )
    rank = memory_analysis.timeline_rank(loaded.frame)
    wide = memory_analysis.timeline(loaded.frame, rank)
    if not wide.empty:
        of_rank = f", rank {rank}" if len(ranks) > 1 else ""
        title = f"One profiled step by category (MiB){of_rank}"
        st.plotly_chart(charts.memory_timeline(wide, title), key="run-memory-timeline")
        agreement = memory_analysis.profiler_agreement(run.to_dict(), loaded.frame, rank)
        note = memory_analysis.profiler_note(run.to_dict())
        command = f"tpubench memory {run['run_id']} --json"
        every = f". Rank {rank}, the lowest; `{command}` has every rank's" if of_rank else ""
        st.caption(
            f"Profiler / counted{of_rank}: {memory_analysis.agreement_text(agreement)}{every}"
            + (f". Note: {note}." if note else ".")
        )


#: the index's columns two runs must share for the page to offer them as a pair (the seed, not
#: in the index, is checked by :func:`tpubench.analysis.parity.parity` once both are read)
PAIRED = ("workload", "size", "mode", "model_hash", "batch_size", *DIMENSIONS)


def parity_partners(index: pd.DataFrame, run: pd.Series) -> pd.DataFrame:
    """The other ok runs of ``index`` whose losses ``run``'s can be set beside: same model,
    mode and global batch. One-device runs first (the usual reference), newest first within."""
    same = (index["status"] == "ok") & (index["run_id"] != run["run_id"])
    for column in PAIRED:
        value = run[column]
        same &= index[column].isna() if pd.isna(value) else index[column] == value
    found = index[same].iloc[::-1]
    return pd.concat([found[found["devices"] == 1], found[found["devices"] != 1]])


def loss_parity(view: ui.View, run: pd.Series) -> None:
    """A train run's losses step by step beside another run's (``tpubench parity A B``'s view,
    the other run as A, the reference), and their largest relative difference."""
    if run["mode"] != "train" or run["status"] != "ok":
        return
    st.markdown("**Loss parity**")
    partners = parity_partners(view.index, run)
    if partners.empty:
        st.caption("No other ok train run of this model and global batch to set its losses beside.")
        return
    labels = dict(zip(partners["run_id"], data.run_label(partners), strict=True))
    other = st.selectbox("Against (A, the reference)", list(labels), format_func=labels.__getitem__, key="parity")
    invocations = tuple(sorted({run["invocation_id"], *partners.loc[partners["run_id"] == other, "invocation_id"]}))
    pair = data.runs(view.results, invocations, (other, run["run_id"]))
    steps = data.steps(
        view.results, invocations, (other, run["run_id"]), None, ("run_id", "step", "phase", "rank", "loss")
    )
    ui.warn_skipped(pair.skipped + steps.skipped)
    rows = {row["run_id"]: row for row in pair.frame.to_dict("records")}
    try:
        found = parity.parity(rows[other], rows[run["run_id"]], steps.frame)
    except parity.ParityError as error:
        st.info(str(error))
        return
    names = data.run_label(pair.frame.set_index("run_id").loc[[other, run["run_id"]]].reset_index())
    st.plotly_chart(charts.loss_curves(found.frame, names.iloc[0], names.iloc[1]), key="run-parity")
    ui.table(found.frame.rename(columns={"rel_diff": "|B - A| / |A|"}))
    st.caption(
        f"Largest relative difference {found.max_rel_diff:.2e} at step {found.step_of_max}, over "
        f"{len(found.frame)} steps both stored. A multi-rank run's loss is the mean of its ranks' (each over its "
        f"slice of the batch). In a terminal: `tpubench parity run={other} run={run['run_id']}`."
    )


def main() -> None:
    view = ui.page_view()
    if view is None:
        return
    st.title("Run details")
    run_id = ui.run_picker(view.runs, view.index, "Run")
    if run_id is None:
        return
    invocation = ui.invocation_of(view, run_id)
    loaded = data.runs(view.results, (invocation,), (run_id,))
    ui.warn_skipped(loaded.skipped)
    if loaded.frame.empty:
        st.warning(f"Run `{run_id}` could not be read from the store.")
        return
    run = loaded.frame.iloc[0]
    status = run["status"]
    (st.success if status == "ok" else st.error)(
        f"**{status}** · {data.series_label(loaded.frame).iloc[0]} · started {run['started_at']:%Y-%m-%d %H:%M} UTC"
    )
    if status != "ok":
        if pd.notna(run["error"]) and run["error"]:
            st.markdown("**Error**")
            st.code(run["error"], language=None)
        if pd.notna(run["stderr_tail"]) and run["stderr_tail"]:
            st.markdown("**The worker's output, last lines**")
            st.code(run["stderr_tail"], language=None)
    if pd.notna(run["warnings"]) and run["warnings"]:
        for line in str(run["warnings"]).splitlines():
            st.warning(line)
    if pd.notna(run["median_step_ms"]):
        steps = data.steps(
            view.results, (invocation,), (run_id,), "measure", ("run_id", "phase", "step", "rank", "step_ms")
        )
        ui.warn_skipped(steps.skipped)
        if not steps.frame.empty:
            # a multi-rank run's job: per step its slowest rank's time, which the median, p10 and
            # p90 drawn over it are; every rank's samples would be twice the steps, half of them faster
            job = job_steps(steps.frame)
            st.plotly_chart(
                charts.step_histogram(job, run["median_step_ms"], run["p10_step_ms"], run["p90_step_ms"]),
                key="run-histogram",
            )
    left, middle, right = st.columns(3)
    left.markdown("**Configuration**")
    ui.table(fields(run, CONFIG), where=left, height="content")
    middle.markdown("**Results**")
    measured = fields(run, RESULTS)
    if measured.empty:
        middle.caption(f"Nothing measured: the run is {status}.")
    else:
        ui.table(measured, where=middle, height="content")
    right.markdown("**Environment fingerprint**")
    ui.table(fields(run, ENVIRONMENT), where=right, height="content")
    loss_parity(view, run)
    memory_section(view.results, invocation, run)
    compile_events(view.results, invocation, run)
    for column, title in (("backend_versions", "Backend versions"), ("env", "Environment variables")):
        if pd.notna(run[column]) and run[column]:
            with st.expander(title):
                st.json(json.loads(run[column]))
    if pd.notna(run["trace_path"]):
        st.page_link(
            catalog.BY_TITLE["Ops"].path,
            label="This run's ops",
            icon=":material/bar_chart:",
            query_params={"run": run_id},
        )
        st.caption("Open its trace in its viewer (on 127.0.0.1):")
        st.code(ui.trace_command(view, run_id), language="bash")


main()
