"""The roofline per op: is a slow op at its ceiling, or far below it, and what bounds it.

Stateless functions from DataFrames (a run's ``ops`` rows, :func:`tpubench.store.load_ops`)
to DataFrames, shared by ``tpubench roofline``, the reports and the dashboard's Ops page.

For each op (a row of the run's most device-side source; or each of its recorded input
shapes, ``by="shape"``) with FLOPs F and bytes B moved per step, and time t per step:

- arithmetic intensity I = F / B (FLOP per byte);
- achieved F / t (FLOP/s) and B / t (bytes/s);
- the ceiling at its intensity: min(peak FLOP/s, I * bandwidth), and the fraction of it
  reached, (F / t) / ceiling;
- the time it would take at its ceiling: max(F / peak, B / bandwidth), and what reaching
  it would save, t minus that;
- ``bound``: **overhead** when the op is too short or too small to load the chip: its
  measured time per call, or its time per call at the ceiling, is under
  :data:`OVERHEAD_US` (the order of one launch: a CUDA kernel launch, an eager op's
  dispatch), so launching and the host decide its time, not the chip; and ops whose
  figures say they do no work of their own (views and allocations, ``none: view``; calls
  that call other ops, ``nested``; host/runtime rows such as autograd's and the
  optimizer's annotations). Else **compute** when I is at or above the ridge point (peak
  ÷ bandwidth), **memory** below it. Null where F or B is unknown, or the device has no
  ceilings: no figure is guessed (:func:`line_of` names such an op "no ceiling" when it has
  FLOPs, "no formula" when it has none).

:func:`step_shares` splits the traced step into those lines and the time outside any op,
so that they add up to the step, for every reader alike.

The ceilings come from one place, :func:`ceilings_for`: a measured ceilings table when
one is given with rows for the device and dtype, else the data sheet (``tpubench.peaks``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pandas as pd

from tpubench import peaks
from tpubench.analysis.ops import SOURCE_PREFERENCE, of_source, primary_source

#: below this time per call (µs), at the ceiling or measured, an op is launch- or host-bound
OVERHEAD_US = 5.0
BOUNDS = ("compute", "memory", "overhead")
NO_CEILING = "no ceiling"  # an op with FLOPs and no bound: no ceilings for the device (or no bytes to place it)
NO_FORMULA = "no formula"  # an op without FLOPs and no bound: nothing counted its work
OUTSIDE = "outside any op"  # the traced step's time in none of the source's ops: host gaps, idle
OVERLAP = "ops overlapped"  # the ops' times add up to more than the step: threads ran at once (negative)
#: the lines of :func:`step_shares`, in order, and the part of the step each belongs to
SHARE_PARTS = {
    **dict.fromkeys(BOUNDS, "bound"),
    NO_CEILING: NO_CEILING,
    NO_FORMULA: NO_FORMULA,
    OUTSIDE: OUTSIDE,
    OVERLAP: OUTSIDE,
}
#: figure sources that say the op does no work of its own (tpubench.traces.counts)
NO_OWN_WORK = frozenset({"none: view", "nested"})
#: columns of a measured ceilings frame (the ``ceilings`` table), see :func:`ceilings_for`
MEASURED_COLUMNS = ("kind", "device", "dtype", "flops_per_s", "bytes_per_s")


@dataclass(frozen=True)
class RooflineCeilings:
    """The two roofs a run's ops are held against, and where they came from."""

    peak_flops: float | None  # FLOP/s of one device at the run's dtype
    bandwidth_bytes_per_s: float | None  # one device's memory bandwidth
    source: str  # "measured", "datasheet", or "none" (neither has the device)
    sweeps: str | None = None  # measured: the sweeps the roofs came from, and why those

    @property
    def ridge(self) -> float | None:
        """The intensity (FLOP/byte) where the two roofs meet: above it an op is compute-bound."""
        if self.peak_flops and self.bandwidth_bytes_per_s:
            return self.peak_flops / self.bandwidth_bytes_per_s
        return None

    def ceiling(self, intensity: float) -> float | None:
        """The attainable FLOP/s at ``intensity``: min(peak, intensity * bandwidth)."""
        if self.ridge is None:
            return None
        return min(self.peak_flops, intensity * self.bandwidth_bytes_per_s)  # type: ignore[operator]

    def describe(self) -> str:
        if self.ridge is None:
            return "no ceilings for this device (no data sheet entry, no measured ceilings)"
        return (
            f"{self.source} ceilings: {self.peak_flops / 1e12:,.3g} TFLOP/s, "
            f"{self.bandwidth_bytes_per_s / 1e9:,.4g} GB/s, ridge {self.ridge:,.3g} FLOP/byte"
            + (f" ({self.sweeps})" if self.sweeps else "")
        )


def device_kind(backend: str, device: str | None) -> str:
    """The device kind a run's device name is listed under in the peak table ("cpu",
    "cuda", "tpu"): its backend's family, or for a plug-in backend its device name's."""
    family = str(backend).split("-")[0]
    if family in ("cpu", "cuda", "tpu"):
        return family
    name = str(device or "")
    return "cpu" if name.startswith("CPU") else "tpu" if name.startswith("TPU") else "cuda"


def ceilings_for(device: str, device_kind: str, dtype: str, measured: pd.DataFrame | None = None) -> RooflineCeilings:
    """The ceilings for one ``device`` (the runs table's device name) of ``device_kind``
    ("cpu", "cuda", "tpu") at ``dtype`` ("float32", "bfloat16"...).

    ``measured`` is a ceilings frame with columns ``kind`` ("matmul" or "memory"),
    ``device`` (as the runs table names it), ``dtype`` (a matmul row's; memory rows' may
    be null), ``flops_per_s`` (matmul rows: achieved FLOP/s) and ``bytes_per_s`` (memory
    rows: achieved bytes/s), and optionally ``sweep`` (where a row came from:
    :func:`tpubench.analysis.ceilings.roofline_frame` says which sweep and why). When it has a
    matmul row for (device, dtype) and a memory row for the device, both ceilings are the best
    measured (the highest rate: a ceiling is what the chip was seen to reach), ``source`` is
    "measured" and ``sweeps`` names the two rows' sweeps. Otherwise both come from
    the data sheet (``tpubench.peaks``, "datasheet"): the two are never mixed, so one
    chart's ridge point is one source's. ``source`` is "none" (figures None) where neither
    has the device, e.g. every CPU without measured ceilings.
    """
    if measured is not None and not measured.empty:
        missing = [column for column in MEASURED_COLUMNS if column not in measured.columns]
        if missing:
            raise ValueError(f"a measured ceilings frame lacks {', '.join(missing)}; it needs {MEASURED_COLUMNS}")
        here = measured[measured["device"] == device]
        matmul = here[(here["kind"] == "matmul") & (here["dtype"] == dtype)].dropna(subset=["flops_per_s"])
        memory = here[here["kind"] == "memory"].dropna(subset=["bytes_per_s"])
        if len(matmul) and len(memory):
            best = (
                matmul.loc[matmul["flops_per_s"].astype(float).idxmax()],
                memory.loc[memory["bytes_per_s"].astype(float).idxmax()],
            )
            sweeps = [row.get("sweep") for row in best if isinstance(row.get("sweep"), str)]
            figures = float(best[0]["flops_per_s"]), float(best[1]["bytes_per_s"])
            return RooflineCeilings(*figures, "measured", "; ".join(sweeps) or None)
    peak = peaks.lookup(device, device_kind)
    flops = peak.device_flops(dtype) if peak else None
    if peak is None or flops is None:
        return RooflineCeilings(None, None, "none")
    return RooflineCeilings(flops, peak.device_hbm_bytes_per_s, "datasheet")


#: the rate each kind of a measured ceilings row must give: a positive, finite number
MEASURED_RATES = {"matmul": "flops_per_s", "memory": "bytes_per_s"}
_RATE_UNITS = {"flops_per_s": "FLOP/s", "bytes_per_s": "bytes/s"}


def measured_problem(frame: pd.DataFrame) -> str | None:
    """What makes ``frame`` unusable as measured ceilings (:func:`ceilings_for`), in one
    sentence naming the first bad row (numbered from 1, as a CSV's data rows are) and what
    it needs; None when every row is usable. A ceiling is a rate the chip was seen to reach:
    a negative, zero, infinite or non-numeric one would place every op against a roof that
    does not exist (a ridge of -41.7 FLOP/byte, fractions of -408518101525%), and a kind
    other than matmul or memory would be silently ignored."""
    missing = [column for column in MEASURED_COLUMNS if column not in frame.columns]
    if missing:
        return f"lacks the columns {', '.join(missing)}; valid: {', '.join(MEASURED_COLUMNS)}"
    if frame.empty:
        return "has no rows; it needs a matmul row and a memory row per device"
    for number, row in enumerate(frame.to_dict("records"), start=1):
        kind = row["kind"]
        if kind not in MEASURED_RATES:
            return f"row {number} has kind {kind!r}; valid: {', '.join(MEASURED_RATES)}"
        column = MEASURED_RATES[kind]
        value = row[column]
        try:
            rate = float(value)
        except (TypeError, ValueError):
            rate = None
        if rate is None or not np.isfinite(rate) or rate <= 0:
            shown, unit = f"{rate:g}" if rate is not None else repr(value), _RATE_UNITS[column]
            return f"row {number} ({kind}) has {column} {shown}; a ceiling is a positive number of {unit}"
    return None


def _time_column(rows: pd.DataFrame) -> pd.Series:
    """Each row's time over all traced steps: a CUDA run's aten rows by the kernel time they
    launched (``device_time_us``), every other row by its self time."""
    device = rows["device_time_us"] if "device_time_us" in rows else pd.Series(np.nan, index=rows.index)
    use_device = (rows["source"] == "aten") & device.notna()
    return rows["self_time_us"].where(~use_device, device)


def roofline_source(ops: pd.DataFrame) -> str:
    """The source a run's roofline is drawn from: the most device-side one whose rows have
    FLOPs. A CUDA eager run's kernels have none (only Inductor's can), while its aten rows
    have them from their shapes and the time of the kernels they launched."""
    for source in SOURCE_PREFERENCE:
        rows = ops[ops["source"] == source]
        if len(rows) and rows["flops"].notna().any():
            return source
    return primary_source(ops)


def points(ops: pd.DataFrame, source: str | None = None, by: str = "op") -> pd.DataFrame:
    """The roofline's points of one run, before any ceiling: one per op of ``source``
    (default: :func:`roofline_source`), or with ``by="shape"`` one per op and
    recorded input shapes where the trace recorded them (``ops.shapes``).

    Columns: op, source, category, shape (the inputs, ``by="shape"``), key (what
    :func:`pair` matches on, :data:`MATCHING`), calls, time_us (all traced steps), flops,
    bytes (totals; null where not counted), flops_source, bytes_source, traced_steps,
    step_time_us.
    """
    if by not in ("op", "shape"):
        raise ValueError(f"by must be 'op' or 'shape', got {by!r}")
    rows = of_source(ops, source or roofline_source(ops)).copy()
    rows["time_us"] = _time_column(rows)
    for column in ("flops_source", "bytes_source", "shapes"):
        if column not in rows:
            rows[column] = None
    keep = ["op", "source", "category", "calls", "time_us", "flops_source", "bytes_source"]
    keep += ["traced_steps", "step_time_us"]
    base = rows[keep].assign(flops=rows["flops"], bytes=rows["bytes_accessed"], shape=None, key=None)
    base["key"] = base["source"] + ":" + base["op"]
    if by == "op":
        return base.reset_index(drop=True)
    exploded = []
    device = rows["device_time_us"] if "device_time_us" in rows else pd.Series(np.nan, index=rows.index)
    for row, shapes, on_device in zip(base.to_dict("records"), rows["shapes"], device.notna(), strict=True):
        entries = json.loads(shapes) if isinstance(shapes, str) else None
        if not entries or on_device:
            exploded.append(row)  # one point: no shapes recorded (or a CUDA op, timed by its kernels)
            continue
        for entry in entries:
            leaf = entry["counted_calls"]
            exploded.append(
                row
                | {
                    "shape": entry["inputs"],
                    "key": matching_key(row["op"], row["source"], entry),
                    "calls": entry["calls"],
                    "time_us": entry["self_us"],
                    "flops": entry["flops"] * leaf if entry["flops"] is not None and leaf else None,
                    "bytes": entry["bytes"] * leaf if entry["bytes"] is not None and leaf else None,
                    "flops_source": entry["flops_source"] if leaf else "nested",
                    "bytes_source": entry["bytes_source"] if leaf else "nested",
                }
            )
    return pd.DataFrame(exploded, columns=[*base.columns])


def roofline(ops: pd.DataFrame, ceilings: RooflineCeilings, source: str | None = None, by: str = "op") -> pd.DataFrame:
    """Every op against ``ceilings``: the module docstring's figures, per traced step.

    Columns: op, shape, category, source, calls_per_step, time_us_per_step, time_share
    (of the traced step), flops_per_step, bytes_per_step, intensity (FLOP/byte),
    achieved_flops_per_s, achieved_bytes_per_s, ceiling_flops_per_s, ceiling_fraction,
    ideal_us_per_step (at the ceiling), saving_us_per_step, bound (compute, memory,
    overhead, or null: :func:`line_of`), flops_source, bytes_source; largest time first.
    """
    found = points(ops, source, by)
    steps = found["traced_steps"].astype(float).where(found["traced_steps"] > 0)
    step_us = found["step_time_us"] / steps
    frame = pd.DataFrame(
        {
            "op": found["op"],
            "shape": found["shape"],
            "key": found["key"],
            "category": found["category"],
            "source": found["source"],
            "calls_per_step": found["calls"] / steps,
            "time_us_per_step": found["time_us"] / steps,
            "flops_per_step": found["flops"].astype(float) / steps,
            "bytes_per_step": found["bytes"].astype(float) / steps,
            "flops_source": found["flops_source"],
            "bytes_source": found["bytes_source"],
        }
    )
    frame["time_share"] = frame["time_us_per_step"] / step_us
    seconds = frame["time_us_per_step"] * 1e-6
    flops, moved = frame["flops_per_step"], frame["bytes_per_step"]
    counted = flops.notna() & moved.notna() & (moved > 0)
    frame["intensity"] = (flops / moved).where(counted)
    frame["achieved_flops_per_s"] = (flops / seconds).where(seconds > 0)
    frame["achieved_bytes_per_s"] = (moved / seconds).where(seconds > 0)
    if ceilings.ridge is not None:
        peak, bandwidth = ceilings.peak_flops, ceilings.bandwidth_bytes_per_s
        frame["ceiling_flops_per_s"] = np.minimum(peak, frame["intensity"] * bandwidth)
        frame["ceiling_fraction"] = frame["achieved_flops_per_s"] / frame["ceiling_flops_per_s"]
        ideal = np.maximum(flops / peak, moved / bandwidth) * 1e6
        frame["ideal_us_per_step"] = ideal.where(flops.notna() & moved.notna())
        frame["saving_us_per_step"] = (frame["time_us_per_step"] - frame["ideal_us_per_step"]).clip(lower=0)
    else:
        for column in ("ceiling_flops_per_s", "ceiling_fraction", "ideal_us_per_step", "saving_us_per_step"):
            frame[column] = np.nan
    frame["bound"] = _bounds(frame, ceilings)
    columns = [
        "op",
        "shape",
        "key",
        "category",
        "source",
        "calls_per_step",
        "time_us_per_step",
        "time_share",
        "flops_per_step",
        "bytes_per_step",
        "intensity",
        "achieved_flops_per_s",
        "achieved_bytes_per_s",
        "ceiling_flops_per_s",
        "ceiling_fraction",
        "ideal_us_per_step",
        "saving_us_per_step",
        "bound",
        "flops_source",
        "bytes_source",
    ]
    return frame[columns].sort_values(["time_us_per_step", "op"], ascending=[False, True]).reset_index(drop=True)


def _bounds(frame: pd.DataFrame, ceilings: RooflineCeilings) -> pd.Series:
    """The module docstring's rule, row by row: overhead first, then the ridge point."""
    calls = frame["calls_per_step"].where(frame["calls_per_step"] > 0)
    per_call = frame["time_us_per_step"] / calls
    ideal_per_call = frame["ideal_us_per_step"] / calls
    no_own_work = frame["flops_source"].isin(NO_OWN_WORK) | (frame["category"] == "host/runtime")
    overhead = no_own_work | (per_call < OVERHEAD_US) | (ideal_per_call < OVERHEAD_US)
    ridge = ceilings.ridge
    placed = frame["intensity"].notna() & (ridge is not None)
    bound = np.select(
        [overhead, placed & (frame["intensity"] >= (ridge or 0.0)), placed],
        ["overhead", "compute", "memory"],
        default=None,
    )
    return pd.Series(bound, index=frame.index, dtype=object)


#: a fraction of the ceiling above this is not a measurement to believe (see :func:`above_ceiling`)
ABOVE_CEILING = 1.05


def above_ceiling(table: pd.DataFrame) -> str | None:
    """Why some ops read faster than their ceiling, when they do: either the ceilings are
    too low (a datasheet's for another SKU, a measurement that did not load the chip), or
    the trace's time for those ops is shorter than their work. XLA's CPU runtime runs large
    dots asynchronously on its Eigen thread pool, and the thunk's event on the PJRT CPU
    trace then covers the launch, not the work. None when every op is at or below its
    ceiling."""
    over = table[table["ceiling_fraction"] > ABOVE_CEILING]
    if over.empty:
        return None
    names = ", ".join(dict.fromkeys(over["op"]))
    return (
        f"{len(over)} op(s) read above their ceiling (up to {over['ceiling_fraction'].max():.1f}x: {names[:120]}): "
        "the ceilings are too low for this device, or the trace times those ops shorter than their work (XLA's "
        "CPU runtime runs large dots asynchronously, so a PJRT CPU trace's event covers the launch); read their "
        "fractions as bounds, not measurements"
    )


def line_of(table: pd.DataFrame) -> pd.Series:
    """Each row's line in :func:`step_shares`: its bound, else :data:`NO_CEILING` when it has
    FLOPs (counted, but nothing to hold them against), else :data:`NO_FORMULA`. An op with
    FLOPs is never "uncounted"."""
    unbound = np.where(table["flops_per_step"].notna(), NO_CEILING, NO_FORMULA)
    return table["bound"].where(table["bound"].notna(), pd.Series(unbound, index=table.index))


def step_shares(ops: pd.DataFrame, ceilings: RooflineCeilings, source: str | None = None) -> pd.DataFrame:
    """Where one traced step went, in parts that add up to all of it: the ops with a bound
    (compute, memory, overhead), the ops with FLOPs but no bound (:data:`NO_CEILING`), the ops
    with neither (:data:`NO_FORMULA`), and the time in none of ``source``'s ops
    (:data:`OUTSIDE`: host gaps between ops, Python, idle), the step less the ops' time.

    One table for ``tpubench roofline`` and the dashboard's Ops page alike, so both read the
    same figures: the ops are taken per op and recorded shapes (``by="shape"``, each point
    with its own bound, as the chart draws them) whatever table a reader shows beside it.
    Overhead holds the short ops with or without FLOPs (their time per call decides it, not
    their work). Where the ops' times add up to more than the step (ops on several threads at
    once, :func:`tpubench.analysis.ops.overlapping_threads`), the last line is
    :data:`OVERLAP`, negative, so that the lines still sum to the step.

    Columns: line, part (bound, no ceiling, no formula, outside any op), ops,
    time_us_per_step, time_share (of the traced step; the lines sum to 1). Lines without ops
    are left out; the outside line is always there. time_share is null throughout where
    the trace does not know its step's time.
    """
    table = roofline(ops, ceilings, source, by="shape")
    lines = line_of(table)
    grouped = table.groupby(lines).agg(ops=("op", "size"), time_us_per_step=("time_us_per_step", "sum"))
    grouped = grouped.reindex([line for line in SHARE_PARTS if line in grouped.index])
    steps = table["time_us_per_step"] / table["time_share"]
    step_us = float(steps.dropna().iloc[0]) if steps.notna().any() else np.nan
    outside = step_us - float(table["time_us_per_step"].sum())
    rest = pd.DataFrame({"ops": [0], "time_us_per_step": [outside]}, index=[OVERLAP if outside < 0 else OUTSIDE])
    frame = pd.concat([grouped, rest]).rename_axis("line").reset_index()
    frame.insert(1, "part", frame["line"].map(SHARE_PARTS))
    frame["ops"] = frame["ops"].astype(int)
    frame["time_share"] = frame["time_us_per_step"] / step_us
    return frame


def fix_first(table: pd.DataFrame, n: int = 10) -> pd.DataFrame:
    """What to fix first: the ops whose reaching their ceiling would save the most time per
    step, ranked. Columns: rank, op, shape, bound, time_us_per_step, ideal_us_per_step,
    saving_us_per_step, saving_share (of the traced step), ceiling_fraction."""
    counted = table[table["saving_us_per_step"].notna()].copy()
    step_us = (table["time_us_per_step"] / table["time_share"]).dropna()
    step = float(step_us.iloc[0]) if len(step_us) else np.nan
    counted["saving_share"] = counted["saving_us_per_step"] / step
    ranked = counted.sort_values(["saving_us_per_step", "op"], ascending=[False, True]).head(n)
    ranked.insert(0, "rank", range(1, len(ranked) + 1))
    columns = ["rank", "op", "shape", "bound", "time_us_per_step", "ideal_us_per_step", "saving_us_per_step"]
    return ranked[[*columns, "saving_share", "ceiling_fraction"]].reset_index(drop=True)


def counted_flops(table: pd.DataFrame) -> pd.DataFrame:
    """FLOPs per step by where they came from (``flops_source``, :data:`NO_FORMULA` where
    null): ops, flops_per_step, largest first. So that a per-op sum is read against the
    run's ``flops_per_step`` for what it is (that counts matmuls and attention, as the flop
    counter does), and the elementwise FLOPs apart from them. Time is :func:`step_shares`'
    question, answered there once."""
    labelled = table.assign(flops_source=table["flops_source"].fillna(NO_FORMULA))
    return (
        labelled.groupby("flops_source")
        .agg(ops=("op", "size"), flops_per_step=("flops_per_step", lambda s: s.sum(min_count=1)))
        .reset_index()
        .sort_values(["flops_per_step", "flops_source"], ascending=[False, True], ignore_index=True)
    )


#: how :func:`pair` matches two runs' ops, said beside every paired table
MATCHING = (
    "matmuls by (batch, the two free dimensions in either order, contracted size), across sources "
    "(an aten::mm and an HLO dot of the same product pair); every other op by source, name and input shapes"
)
#: aten matmuls: the recorded inputs that are the two operands
_MATMUL_OPERANDS = {"aten::mm": (0, 1), "aten::bmm": (0, 1), "aten::addmm": (1, 2), "aten::baddbmm": (1, 2)}


def matching_key(op: str, source: str, entry: dict) -> str:
    """The key two runs' points are matched on (:data:`MATCHING`): ``matmul BxMxNxK`` with
    m ≤ n for a matmul whose shapes are known (a dot's from its HLO, an aten matmul's from
    its recorded inputs), else ``source:op inputs``."""
    dims = entry.get("matmul")
    operands = _MATMUL_OPERANDS.get(op)
    if dims is None and operands is not None and len(entry.get("dims") or []) > max(operands):
        lhs, rhs = (entry["dims"][i] for i in operands)
        if len(lhs) == len(rhs) and len(lhs) in (2, 3) and lhs[-1] == rhs[-2]:
            dims = [lhs[0] if len(lhs) == 3 else 1, lhs[-2], rhs[-1], lhs[-1]]
    if dims is not None:
        batch, m, n, k = dims
        return f"matmul {batch}x{min(m, n)}x{max(m, n)}x{k}"
    return f"{source}:{op} {entry.get('inputs') or ''}".rstrip()


def _by_key(table: pd.DataFrame) -> pd.DataFrame:
    """A run's points summed per matching key: the ops (names joined), time, FLOPs, bytes,
    and the fraction of the ceiling as Σ time at the ceiling ÷ Σ time (for one op the same
    as achieved ÷ ceiling); the bound of the key's longest op."""
    ordered = table.sort_values("time_us_per_step", ascending=False)
    grouped = ordered.groupby("key", sort=False).agg(
        op=("op", lambda names: ", ".join(dict.fromkeys(names))),
        calls_per_step=("calls_per_step", "sum"),
        time_us_per_step=("time_us_per_step", "sum"),
        time_share=("time_share", "sum"),
        flops_per_step=("flops_per_step", lambda s: s.sum(min_count=1)),
        bytes_per_step=("bytes_per_step", lambda s: s.sum(min_count=1)),
        ideal_us_per_step=("ideal_us_per_step", lambda s: s.sum(min_count=len(s))),
        bound=("bound", "first"),
    )
    grouped["ceiling_fraction"] = grouped["ideal_us_per_step"] / grouped["time_us_per_step"]
    grouped["intensity"] = grouped["flops_per_step"] / grouped["bytes_per_step"]
    return grouped


def pair(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """Two runs' roofline tables (``by="shape"``, each against its own ceilings) op against
    op, matched on :func:`matching_key`. Columns: key, then a_/b_ op, calls_per_step,
    time_us_per_step, time_share, flops_per_step, intensity, ceiling_fraction, bound, and
    ratio (b time ÷ a time); matched keys first, then by the larger time."""
    joined = _by_key(a).add_prefix("a_").join(_by_key(b).add_prefix("b_"), how="outer")
    joined["ratio"] = joined["b_time_us_per_step"] / joined["a_time_us_per_step"]
    joined["matched"] = joined["a_op"].notna() & joined["b_op"].notna()
    joined["larger"] = joined[["a_time_us_per_step", "b_time_us_per_step"]].max(axis=1)
    joined = joined.sort_values(["matched", "larger"], ascending=[False, False]).reset_index(names="key")
    fields = ["op", "calls_per_step", "time_us_per_step", "time_share", "flops_per_step", "intensity"]
    fields += ["ceiling_fraction", "bound"]
    columns = ["key", *(f"{side}_{field}" for field in fields for side in ("a", "b")), "ratio"]
    return (
        joined[columns]
        .astype({"a_op": object, "b_op": object, "a_bound": object, "b_bound": object})
        .where(joined[columns].notna(), None)
    )
