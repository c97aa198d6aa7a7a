"""Measured ceilings beside the data sheet, and MFU against them (``mfu_attained``).

Stateless functions over the ``ceilings`` table (:func:`tpubench.store.load_ceilings`) and
the runs table, shared by ``tpubench ceilings --show``, ``compare`` and the dashboard.

``mfu_attained`` is computed when runs are read, never stored: a run's achieved FLOP/s per
device over the matmul ceiling measured for its device and dtype. Measuring a ceiling later
(or again) then gives old runs the figure without rewriting their files, and the join names
the sweep it used (``ceiling_run_id``). Where no ceiling was measured for the device and
dtype the figure is null, never a guess. ``mfu`` (against the data sheet) stays as it is.

Which sweep: :func:`choose`, the one choice every reader takes and prints. A memory sweep
whose arrays never got past the last-level cache measures the cache, and never sets a
memory ceiling; of the sweeps that may, the quietest (other processes' share of the CPUs),
then the tightest samples, then the newest. Which point: among the chosen sweeps' ``ok``
matmul points of the run's device (matched by the chip :mod:`tpubench.peaks` knows it as,
else by its name, within its device kind) and dtype (a float32 run whose matmul precision
let TF32 in is held against ``tf32``), the one with the highest median rate: the headline
is the median of a point's samples (robust to a lucky sample), at the best shape; the max
is stored beside it. A run above its ceiling (``mfu_attained`` over 1) shows no figure: it
is flagged ``ceiling_low``, a ceiling measured low.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from tpubench import peaks
from tpubench.analysis.nulls import is_missing
from tpubench.analysis.prices import device_kind
from tpubench.hostload import is_busy
from tpubench.precision import choices as precisions

#: STREAM's arrays reach this many times the last-level cache (STREAM's rule: 4x)
LLC_MULTIPLE = 4
#: where the last-level cache is unknown (a TPU), a STREAM sweep goes to arrays of this size,
#: and a memory ceiling needs one
UNKNOWN_LLC_REACH = 2**30
#: STREAM's kernels: the device memory's bandwidth (host copies are a link's, not a roofline's)
STREAM_OPS = ("copy", "scale", "add", "triad")
#: what one sweep measures for a ceiling, and what the sweep a ceiling is read from is chosen by:
#: a sweep of several dtypes is a candidate for each of them
CHOICE_KEYS = ["backend", "device", "device_kind", "kind", "dtype", "devices"]
#: other processes' shares of the CPUs this close (0-5%, 5-10%...) count as equally quiet
QUIET_STEP = 0.05
#: :func:`choose`'s columns: the sweep chosen for each key, whether it may set a ceiling, how
#: many sweeps were candidates, and the sentence every reader prints about it
CHOICE_COLUMNS = [*CHOICE_KEYS, "run_id", "started_at", "ceiling", "sweeps", "choice"]
#: how the figures of a ceilings point are grouped into one line of ``--show``
SUMMARY_KEYS = ["backend", "device", "device_kind", "kind", "op", "dtype", "devices"]
SUMMARY_COLUMNS = [
    *SUMMARY_KEYS,
    "shape",
    "median_rate",
    "max_rate",
    "p10_rate",
    "rate_unit",
    "median_s",
    "datasheet",
    "ratio",
    "samples",
    "timing",
    "simulated",
    "run_id",
    "started_at",
    "ceiling",
    "choice",
    "point_sweeps",
    "point_low",
    "point_high",
]
#: the columns :func:`attach_attained` adds to a runs frame
ATTAINED_COLUMNS = ["mfu_attained", "ceiling_flops_per_s", "ceiling_run_id", "ceiling_choice", "ceiling_low"]
#: what a reader shows instead of ``mfu_attained`` where the run beat its ceiling (``ceiling_low``)
CEILING_LOW = "ceiling measured low"


def device_key(device: Any, kind: Any) -> str | None:
    """The device as ceilings and runs are matched on it: the chip :mod:`tpubench.peaks` knows
    it as (torch_xla's "TPU v5 lite" and TorchTPU's "TPU v5e" are one chip), else its name."""
    if not isinstance(device, str) or not device:
        return None
    peak = peaks.lookup(device, str(kind))
    return f"{kind}:{peak.chip if peak else device}"


def size_label(size: int) -> str:
    """Bytes in the binary unit that reads best: ``64 KiB``, ``128 MiB``."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            return f"{size / scale:g} {unit}"
    return f"{size} B"


#: the prefixes a rate is shown with, largest first
PREFIXES = (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3))


def rate_text(value: Any, unit: Any) -> str:
    """A FLOP/s or B/s figure with the largest prefix that keeps it at or above 1 (``1.58
    TFLOP/s``, ``17.9 GB/s``), as ``--show`` and the Ceilings page print it; "-" where unknown."""
    if is_missing(value) or not isinstance(unit, str):
        return "-"
    prefix, scale = next(((p, s) for p, s in PREFIXES if value >= s), ("", 1.0))
    return f"{value / scale:,.3g} {prefix}{unit}"


def time_text(seconds: Any) -> str:
    """A latency's median time in microseconds; "-" where unknown."""
    return "-" if is_missing(seconds) else f"{seconds * 1e6:,.1f} us"


def across_text(line: Mapping[str, Any]) -> str:
    """How far the sweeps that measured a :func:`summary` line's best point spread: their
    count, lowest and highest headline (a ceiling measured on a busy host reads low); "-"
    where one sweep measured it."""
    count = line.get("point_sweeps")
    if is_missing(count) or count < 2:
        return "-"
    if line["kind"] == "latency":
        return f"{int(count)}: {time_text(line['point_low'])} to {time_text(line['point_high'])}"
    unit = line["rate_unit"]
    return f"{int(count)}: {rate_text(line['point_low'], unit)} to {rate_text(line['point_high'], unit)}"


def cache_reach(llc_bytes: Any) -> int:
    """Bytes per array from which a STREAM point measures the memory, not a cache:
    :data:`LLC_MULTIPLE` times the last-level cache, or where the cache is unknown the size a
    default sweep goes to there (:data:`UNKNOWN_LLC_REACH`)."""
    return UNKNOWN_LLC_REACH if is_missing(llc_bytes) or not llc_bytes else LLC_MULTIPLE * int(llc_bytes)


def past_cache(points: pd.DataFrame) -> pd.Series:
    """Whether each point is a STREAM kernel over arrays past the caches (:func:`cache_reach`):
    the points a memory ceiling and its data-sheet ratio may be read from."""
    stream = (points["kind"] == "memory") & points["op"].isin(STREAM_OPS)
    if not stream.any():  # nothing to test (a matmul sweep's rows may lack the memory columns)
        return stream
    reach = points["llc_bytes"].map(cache_reach).astype(float)
    return stream & (points["size_bytes"].astype(float) >= reach)


def sweeps(ceilings: pd.DataFrame) -> pd.DataFrame:
    """Each sweep's candidacy for each :data:`CHOICE_KEYS` it measured: when it started, the
    share of the CPUs other processes used while it ran (``other_cpu_share``), how spread its
    samples are (``spread``: the median over its points of (p90 - min) / median time), its
    largest STREAM array and the size that is past the caches (``largest``, ``reach``), and
    whether it may set a ceiling (``ceiling``): a memory sweep only where a STREAM array got
    past the caches, or the figure is a cache's (a ``--max-size`` below the reach)."""
    columns = [*CHOICE_KEYS, "run_id", "started_at", "other_cpu_share", "spread", "largest", "reach", "ceiling"]
    ok = ceilings[ceilings["status"] == "ok"]
    if ok.empty:
        return pd.DataFrame(columns=columns)
    stream = (ok["kind"] == "memory") & ok["op"].isin(STREAM_OPS)
    frame = ok.assign(
        _spread=(ok["p90_s"] - ok["min_s"]) / ok["median_s"],
        _largest=ok["size_bytes"].astype(float).where(stream),
        _reach=ok["llc_bytes"].map(cache_reach).astype(float).where(stream),
    )
    facts = (
        frame.groupby([*CHOICE_KEYS, "run_id"], dropna=False, sort=False)
        .agg(
            started_at=("started_at", "min"),
            other_cpu_share=("host_other_cpu_share", "max"),
            spread=("_spread", "median"),
            largest=("_largest", "max"),
            reach=("_reach", "max"),
        )
        .reset_index()
    )
    facts["ceiling"] = facts["largest"].isna() | (facts["largest"] >= facts["reach"])
    return facts[columns]


def _percent(share: Any) -> str:
    return "not measured" if is_missing(share) else f"{100 * share:.0f}%"


def _span(values: pd.Series) -> str:
    low, high = values.min(), values.max()
    return _percent(low) if low == high else f"{_percent(low)}-{_percent(high)}"


def _choice(best: pd.Series, candidates: pd.DataFrame) -> str:
    """The sentence every reader prints about a chosen sweep: which one, and why it."""
    head = f"sweep {best['run_id']} ({pd.Timestamp(best['started_at']):%Y-%m-%d %H:%M})"
    if not best["ceiling"]:
        return (
            f"{head}: not a ceiling but a cache's figure: no sweep has an array past {LLC_MULTIPLE}x the "
            f"last-level cache ({size_label(int(best['reach']))}; the largest is {size_label(int(best['largest']))}); "
            "a memory sweep without --max-size measures one"
        )
    eligible = candidates[candidates["ceiling"]]
    others = eligible[eligible["run_id"] != best["run_id"]]
    share = best["other_cpu_share"]
    # as quiet as the chosen one (where it was not measured, neither was any other's: it ranks last)
    peers = others[others["_quiet"].isna()] if is_missing(share) else others[others["_quiet"] == best["_quiet"]]
    load = "host load not measured" if is_missing(share) else f"other processes on {_percent(share)} of the CPUs"
    left_out = len(candidates) - len(eligible)
    if others.empty:
        why = "the only sweep past the caches" if left_out else "the only sweep"
    elif peers.empty:
        why = (
            f"the quietest of {len(eligible)} sweeps: other processes used {_percent(share)} of the CPUs, "
            f"{_span(others['other_cpu_share'])} in the others"
        )
    elif (best["spread"] < peers["spread"]).all():
        why = (
            f"of {len(peers) + 1} sweeps as quiet ({load}), "
            f"the tightest samples: (p90 - min) / median {_percent(best['spread'])}, "
            f"{_span(peers['spread'])} in the others"
        )
    else:
        why = f"the newest of {len(peers) + 1} sweeps as quiet and as tight"
    if left_out:
        why += (
            f"; {left_out} sweep(s) with no array past {LLC_MULTIPLE}x the last-level cache "
            f"({size_label(int(best['reach']))}) left out: a cache's figure"
        )
    if is_busy(share):
        why += f"; measured on a busy host: other processes used {_percent(share)} of the CPUs"
    return f"{head}: {why}"


def choose(ceilings: pd.DataFrame) -> pd.DataFrame:
    """The sweep each :data:`CHOICE_KEYS` (a backend's device, a kind, a dtype, a group size)
    reads its ceiling from, the one choice ``tpubench ceilings --show``, the roofline, every
    ``mfu_attained`` reader and the Ceilings page take. Of the sweeps that may set a ceiling
    (:func:`sweeps`; a memory sweep must have a STREAM array past the caches), the quietest: the
    lowest share of the CPUs used by other processes (shares within :data:`QUIET_STEP` are
    equal; unmeasured last), then the tightest samples, then the newest. A sweep on a busy
    host measures low (five CPU sweeps in 15 minutes read 326 to 1,575 GFLOP/s bf16), and the
    newest is not the one to believe. Where no sweep may set it, the best of the rest is
    returned with ``ceiling`` false: a cache's figure, which no reader takes as a ceiling.
    ``choice`` says which sweep and why. Columns: :data:`CHOICE_COLUMNS`."""
    facts = sweeps(ceilings)
    if facts.empty:
        return pd.DataFrame(columns=CHOICE_COLUMNS)
    facts = facts.assign(_quiet=np.floor(facts["other_cpu_share"].astype(float) / QUIET_STEP))
    ranked = facts.sort_values(
        ["ceiling", "_quiet", "spread", "started_at"], ascending=[False, True, True, False], na_position="last"
    )
    lines = []
    for _, candidates in ranked.groupby(CHOICE_KEYS, dropna=False, sort=True):
        best = candidates.iloc[0]
        lines.append(
            {
                **{key: best[key] for key in CHOICE_KEYS},
                "run_id": best["run_id"],
                "started_at": best["started_at"],
                "ceiling": bool(best["ceiling"]),
                "sweeps": len(candidates),
                "choice": _choice(best, candidates),
            }
        )
    return pd.DataFrame(lines, columns=CHOICE_COLUMNS)


def chosen_points(ceilings: pd.DataFrame) -> pd.DataFrame:
    """The ``ok`` points of each key's chosen sweep (:func:`choose`), with its ``ceiling`` and
    ``choice``. A sweep's run id and dtype name the key: one sweep is one backend's device, kind
    and group size."""
    choice = choose(ceilings)
    ok = ceilings[ceilings["status"] == "ok"]
    return ok.merge(choice[["run_id", "dtype", "ceiling", "choice"]], on=["run_id", "dtype"], how="inner")


def datasheet(kind: str, op: str, dtype: str, device: Any, device_kind_: str) -> float | None:
    """The data sheet's figure for a point (:mod:`tpubench.peaks`): peak FLOP/s of one device
    for a matmul, its HBM bandwidth for a STREAM kernel; None where unpublished (a CPU, a
    collective, a host copy)."""
    peak = peaks.lookup(device, device_kind_) if isinstance(device, str) else None
    if peak is None:
        return None
    if kind == "matmul":
        return peak.device_flops(dtype)
    if kind == "memory" and op in STREAM_OPS:
        return peak.device_hbm_bytes_per_s
    return None


def best_point(points: pd.DataFrame) -> pd.Series | None:
    """The point a line's headline is read from: the highest median rate (for STREAM among the
    arrays past the caches where any are, :func:`past_cache`; else the figure is a cache's), for
    latency the lowest median time; None where nothing was measured."""
    rated = points[points["median_rate"].notna()]
    past = rated[past_cache(rated)]
    if len(past):
        rated = past
    if len(rated):
        return rated.loc[rated["median_rate"].idxmax()]
    timed = points[points["median_s"].notna()]
    return timed.loc[timed["median_s"].idxmin()] if len(timed) else None


def _key(values: Any) -> tuple:
    return tuple(None if is_missing(value) else value for value in values)


def summary(ceilings: pd.DataFrame) -> pd.DataFrame:
    """One line per (backend, device, kind, op, dtype, group size) from its chosen sweep
    (:func:`choose`, whose ``choice`` says which and why): its best point (:func:`best_point`),
    that point's median, max and p10, and the data sheet's figure with the ratio measured /
    data sheet. ``ceiling`` is false where the figure is a cache's (no STREAM array past the
    caches); such a line has no ratio. ``point_sweeps``, ``point_low`` and ``point_high`` are
    how many sweeps measured the same point and the lowest and highest of their headlines
    (rate; latency: median time). Columns: :data:`SUMMARY_COLUMNS`."""
    points = chosen_points(ceilings)
    points = points.assign(_past=past_cache(points))
    ok = ceilings[ceilings["status"] == "ok"]
    headline = ok["median_rate"].where(ok["median_rate"].notna(), ok["median_s"])
    same = {
        _key(key): (group["run_id"].nunique(), headline[group.index].min(), headline[group.index].max())
        for key, group in ok.groupby([*SUMMARY_KEYS, "shape"], dropna=False)
    }
    lines = []
    for _, group in points.groupby(SUMMARY_KEYS, dropna=False, sort=True):
        best = best_point(group)
        if best is None:
            continue
        stream = best["kind"] == "memory" and best["op"] in STREAM_OPS
        ceiling = bool(best["ceiling"]) and (not stream or bool(best["_past"]))
        sheet = datasheet(best["kind"], best["op"], best["dtype"], best["device"], best["device_kind"])
        rate = best["median_rate"]
        count, low, high = same.get(_key([*(best[k] for k in SUMMARY_KEYS), best["shape"]]), (1, None, None))
        lines.append(
            {
                **{column: best[column] for column in SUMMARY_COLUMNS if column in best.index},
                "datasheet": sheet,
                "ratio": rate / sheet if ceiling and sheet and pd.notna(rate) else None,
                "ceiling": ceiling,
                "point_sweeps": count,
                "point_low": low,
                "point_high": high,
            }
        )
    return pd.DataFrame(lines, columns=SUMMARY_COLUMNS)


def matmul_ceilings(ceilings: pd.DataFrame) -> pd.DataFrame:
    """Per (device, dtype) the matmul ceiling MFU is held against: the highest median rate
    among the chosen sweeps (:func:`choose`) of every backend on that device (columns
    ``device_key``, ``dtype``, ``ceiling_flops_per_s``, ``ceiling_run_id``, ``ceiling_shape``,
    ``ceiling_backend``, ``ceiling_choice``: the backend and why its sweep)."""
    columns = [
        "device_key",
        "dtype",
        "ceiling_flops_per_s",
        "ceiling_run_id",
        "ceiling_shape",
        "ceiling_backend",
        "ceiling_choice",
    ]
    points = chosen_points(ceilings[ceilings["kind"] == "matmul"])
    ok = points[points["median_rate"].notna()]
    if ok.empty:
        return pd.DataFrame(columns=columns)
    ok = ok.assign(device_key=[device_key(d, k) for d, k in zip(ok["device"], ok["device_kind"], strict=True)])
    best = ok.loc[ok.groupby(["device_key", "dtype"])["median_rate"].idxmax()]
    return pd.DataFrame(
        {
            "device_key": best["device_key"],
            "dtype": best["dtype"],
            "ceiling_flops_per_s": best["median_rate"].astype(float),
            "ceiling_run_id": best["run_id"],
            "ceiling_shape": best["shape"],
            "ceiling_backend": best["backend"],
            "ceiling_choice": best["backend"] + " matmul " + best["dtype"] + " " + best["choice"],
        }
    ).reset_index(drop=True)


def matmul_dtype(dtype: Any, backend_metrics: Any, precision: Any = None) -> Any:
    """The ceiling dtype a run's matmuls ran in, as its own MFU's peak was chosen
    (:func:`tpubench.peaks.matmul_key`), from a stored row: a converted precision's (``fp8`` for
    fp8 and fp8-rowwise, whose ceiling ``torch._scaled_mm`` measures; ``bfloat16`` for the
    weight-only ones; ``int8``, which no ceiling measures yet, for int8-dq), ``tf32`` for a
    float32 run whose matmul precision (in ``backend_metrics``) was not "highest", else its dtype."""
    highest = "highest"
    if dtype == "float32" and isinstance(backend_metrics, str):
        with contextlib.suppress(ValueError, AttributeError):
            highest = json.loads(backend_metrics).get("float32_matmul_precision", "highest")
    return peaks.matmul_key(dtype, highest, precision if precisions.is_converted(precision) else None)


def attach_attained(runs: pd.DataFrame, ceilings: pd.DataFrame) -> pd.DataFrame:
    """``runs`` with :data:`ATTAINED_COLUMNS`: ``mfu_attained`` is the run's FLOP/s per device
    (``flops_per_step`` / median step / devices, as ``mfu`` counts it) over the matmul ceiling of
    its device and dtype (:func:`matmul_ceilings`), whose sweep ``ceiling_run_id`` names. Null
    where no ceiling was measured, the run has no step time, or its FLOP count is incomplete."""
    return attach_ceilings(runs, matmul_ceilings(ceilings))


def attach_ceilings(runs: pd.DataFrame, table: pd.DataFrame) -> pd.DataFrame:
    """:func:`attach_attained` against ``table``, the ceilings' :func:`matmul_ceilings`: for a
    reader that holds that table and attaches it to one set of runs after another (the
    dashboard, on every rerun)."""
    frame = runs.copy()
    if frame.empty:
        return frame.assign(**{column: pd.Series(dtype=object) for column in ATTAINED_COLUMNS})
    kinds = [
        device_kind(b, d if isinstance(d, str) else None)
        for b, d in zip(frame["backend"], frame["device"], strict=True)
    ]
    metrics = frame["backend_metrics"] if "backend_metrics" in frame else pd.Series(None, index=frame.index)
    keys = pd.DataFrame(
        {
            "device_key": [device_key(d, k) for d, k in zip(frame["device"], kinds, strict=True)],
            "dtype": [
                matmul_dtype(d, m, p)
                for d, m, p in zip(frame["dtype"], metrics, precisions.filled(frame)["precision"], strict=True)
            ],
        },
        index=frame.index,
    )
    joined = keys.merge(table, on=["device_key", "dtype"], how="left")
    joined.index = frame.index
    devices = frame["devices"].fillna(1).astype(float) if "devices" in frame else 1.0
    achieved = frame["flops_per_step"].astype(float) / (frame["median_step_ms"].astype(float) / 1e3) / devices
    incomplete = frame["flops_incomplete"].notna() if "flops_incomplete" in frame else False
    attained = (achieved / joined["ceiling_flops_per_s"]).where(~incomplete & (frame["median_step_ms"] > 0))
    # a run cannot beat what its device reaches: a ceiling it beats was measured low (a busy
    # host, a sweep too small), and the ratio is no figure to show
    low = attained > 1
    frame["mfu_attained"] = attained.where(~low).astype(float)
    for column in ("ceiling_flops_per_s", "ceiling_run_id", "ceiling_choice"):
        frame[column] = joined[column].where(attained.notna())
    frame["ceiling_low"] = low
    return frame


def attained_text(value: Any, low: Any = False) -> str:
    """How every reader shows a run's ``mfu_attained``: a percentage; :data:`CEILING_LOW`
    where the run beat its ceiling (``ceiling_low``), never the ratio; "-" where no ceiling
    was measured."""
    if not is_missing(low) and bool(low):
        return CEILING_LOW
    return "-" if is_missing(value) else f"{100 * value:.1f}%"


def curves(ceilings: pd.DataFrame, kind: str) -> pd.DataFrame:
    """A ceilings kind's points for plotting, one line per device: size (matmul: M=N=K of the
    square sweep; memory and collectives: bytes) against the median rate, with ``series``
    naming the line (backend, device, op, dtype, group size); each line's points are its chosen
    sweep's (:func:`choose`), the sweep its ceiling is read from."""
    points = chosen_points(ceilings)
    points = points[(points["kind"] == kind) & points["median_rate"].notna()]
    if kind == "matmul":
        points = points[(points["m"] == points["n"]) & (points["n"] == points["k"])]
        x = points["m"]
    else:
        x = points["size_bytes"]
    series = [
        f"{backend} {device or '?'} {op} {dtype}" + (f" x{int(n)}" if kind == "collective" else "")
        for backend, device, op, dtype, n in zip(
            points["backend"], points["device"], points["op"], points["dtype"], points["devices"], strict=True
        )
    ]
    return pd.DataFrame(
        {
            "series": pd.Series(series, index=points.index, dtype=object),
            "op": points["op"],
            "dtype": points["dtype"],
            "devices": points["devices"],
            "size": x.astype(float),
            "median_rate": points["median_rate"],
            "max_rate": points["max_rate"],
            "rate_unit": points["rate_unit"],
        }
    ).sort_values(["series", "size"])


def roofline_frame(ceilings: pd.DataFrame) -> pd.DataFrame:
    """The measured ceilings in the shape :func:`tpubench.analysis.roofline.ceilings_for`
    reads: per device, each matmul dtype's points (``flops_per_s``, the median rate) and the
    STREAM points past the caches (``bytes_per_s``; :func:`past_cache`), of the sweeps
    :func:`choose` picks, with ``sweep`` saying which and why. A memory sweep without an array
    past the caches gives a row without a figure (``bytes_per_s`` null) whose ``sweep`` says
    so: a cache's figure never sets the memory roof. ``ceilings_for``
    takes the best of them, as ``--show`` does."""
    columns = ["kind", "device", "dtype", "flops_per_s", "bytes_per_s", "sweep"]
    points = chosen_points(ceilings)
    if points.empty:
        return pd.DataFrame(columns=columns)
    rated = points[points["median_rate"].notna()]
    matmul = rated[rated["kind"] == "matmul"]
    memory = rated[past_cache(rated) & rated["ceiling"]]
    # a device's memory sweeps that measured only a cache: one row each without a figure, so
    # that a roofline without a measured memory roof can say why
    cache = rated[(rated["kind"] == "memory") & rated["op"].isin(STREAM_OPS) & ~rated["ceiling"]]
    cache = cache.drop_duplicates(["device", "run_id", "dtype"]).assign(median_rate=np.nan)
    memory = pd.concat([memory, cache])

    def sweep(found: pd.DataFrame, kind: str) -> pd.Series:
        return kind + " from " + found["backend"] + " " + found["choice"]

    return pd.concat(
        [
            pd.DataFrame(
                {
                    "kind": "matmul",
                    "device": matmul["device"],
                    "dtype": matmul["dtype"],
                    "flops_per_s": matmul["median_rate"],
                    "bytes_per_s": None,
                    "sweep": sweep(matmul, "matmul"),
                }
            ),
            pd.DataFrame(
                {
                    "kind": "memory",
                    "device": memory["device"],
                    "dtype": memory["dtype"],
                    "flops_per_s": None,
                    "bytes_per_s": memory["median_rate"],
                    "sweep": sweep(memory, "memory"),
                }
            ),
        ],
        ignore_index=True,
    )[columns]
