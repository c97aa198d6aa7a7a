"""Measured ceilings beside the data sheet, and MFU against them (``mfu_attained``).

Stateless functions over the ``ceilings`` table (:func:`tpubench.store.load_ceilings`) and
the runs table, shared by ``tpubench ceilings --show``, ``compare`` and the dashboard.

``mfu_attained`` is computed when runs are read, never stored: a run's achieved FLOP/s per
device over the matmul ceiling measured for its device and dtype. Measuring a ceiling later
(or again) then gives old runs the figure without rewriting their files, and the join names
the sweep it used (``ceiling_run_id``). Where no ceiling was measured for the device and
dtype the figure is null, never a guess. ``mfu`` (against the data sheet) stays as it is.

Which ceiling: among the ``ok`` matmul points of the run's device (matched by the chip
:mod:`tpubench.peaks` knows it as, else by its name, within its device kind) and dtype (a
float32 run whose matmul precision let TF32 in is held against ``tf32``), those of the most
recent sweep, and of these the point with the highest median rate: the headline is the
median of a point's samples (robust to a lucky sample), at the best shape; the max is stored
beside it.
"""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

from tpubench import peaks
from tpubench.analysis.prices import device_kind

#: STREAM's arrays reach this many times the last-level cache (STREAM's rule: 4x)
LLC_MULTIPLE = 4
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
]
#: the columns :func:`attach_attained` adds to a runs frame
ATTAINED_COLUMNS = ["mfu_attained", "ceiling_flops_per_s", "ceiling_run_id"]


def device_key(device: Any, kind: Any) -> str | None:
    """The device as ceilings and runs are matched on it: the chip :mod:`tpubench.peaks` knows
    it as (torch_xla's "TPU v5 lite" and TorchTPU's "TPU v5e" are one chip), else its name."""
    if not isinstance(device, str) or not device:
        return None
    peak = peaks.lookup(device, str(kind))
    return f"{kind}:{peak.chip if peak else device}"


def latest_points(ceilings: pd.DataFrame) -> pd.DataFrame:
    """The ``ok`` points of each (backend, device, kind, op, dtype, group size) from the most
    recent sweep that measured them: a sweep run again replaces its predecessor's figures."""
    ok = ceilings[ceilings["status"] == "ok"]
    if ok.empty:
        return ok
    newest = ok.groupby(SUMMARY_KEYS, dropna=False)["started_at"].transform("max")
    return ok[ok["started_at"] == newest]


def datasheet(kind: str, op: str, dtype: str, device: Any, device_kind_: str) -> float | None:
    """The data sheet's figure for a point (:mod:`tpubench.peaks`): peak FLOP/s of one device
    for a matmul, its HBM bandwidth for a STREAM kernel; None where unpublished (a CPU, a
    collective, a host copy)."""
    peak = peaks.lookup(device, device_kind_) if isinstance(device, str) else None
    if peak is None:
        return None
    if kind == "matmul":
        return peak.device_flops(dtype)
    if kind == "memory" and op in ("copy", "scale", "add", "triad"):
        return peak.device_hbm_bytes_per_s
    return None


def beyond_cache(points: pd.DataFrame) -> pd.DataFrame:
    """STREAM points whose arrays are at least :data:`LLC_MULTIPLE` times the last-level cache,
    where the figure is the memory's (HBM, DRAM), not a cache's: the ones a memory ceiling and
    its data-sheet ratio are read from. Other kinds' points, and memory points where the cache
    is unknown or no point went past it, come back as they are."""
    memory = points["kind"] == "memory"
    past = memory & (points["size_bytes"] >= LLC_MULTIPLE * points["llc_bytes"])
    if not memory.any() or not past.any():
        return points
    return points[~memory | past]


def summary(ceilings: pd.DataFrame) -> pd.DataFrame:
    """One line per (backend, device, kind, op, dtype, group size) of the latest sweep: its best
    point (highest median rate, for STREAM among the arrays past the caches: :func:`beyond_cache`;
    for latency the lowest median time), that point's median, max and p10, and the data
    sheet's figure with the ratio measured / data sheet. Columns: :data:`SUMMARY_COLUMNS`."""
    points = latest_points(ceilings)
    lines = []
    for _, group in points.groupby(SUMMARY_KEYS, dropna=False, sort=True):
        rated = beyond_cache(group[group["median_rate"].notna()])
        timed = group[group["median_s"].notna()]
        if rated.empty and timed.empty:
            continue
        best = rated.loc[rated["median_rate"].idxmax()] if not rated.empty else timed.loc[timed["median_s"].idxmin()]
        sheet = datasheet(best["kind"], best["op"], best["dtype"], best["device"], best["device_kind"])
        rate = best["median_rate"]
        lines.append(
            {
                **{column: best[column] for column in SUMMARY_COLUMNS if column in best.index},
                "datasheet": sheet,
                "ratio": rate / sheet if sheet and pd.notna(rate) else None,
            }
        )
    return pd.DataFrame(lines, columns=SUMMARY_COLUMNS)


def matmul_ceilings(ceilings: pd.DataFrame) -> pd.DataFrame:
    """Per (device, dtype) the matmul ceiling MFU is held against: the highest median rate of
    the most recent sweep of any backend on that device (columns ``device_key``, ``dtype``,
    ``ceiling_flops_per_s``, ``ceiling_run_id``, ``ceiling_shape``, ``ceiling_backend``)."""
    columns = ["device_key", "dtype", "ceiling_flops_per_s", "ceiling_run_id", "ceiling_shape", "ceiling_backend"]
    ok = ceilings[(ceilings["kind"] == "matmul") & (ceilings["status"] == "ok") & ceilings["median_rate"].notna()]
    if ok.empty:
        return pd.DataFrame(columns=columns)
    ok = ok.assign(device_key=[device_key(d, k) for d, k in zip(ok["device"], ok["device_kind"], strict=True)])
    newest = ok.groupby(["device_key", "dtype"])["started_at"].transform("max")
    latest = ok[ok["started_at"] == newest]
    best = latest.loc[latest.groupby(["device_key", "dtype"])["median_rate"].idxmax()]
    return pd.DataFrame(
        {
            "device_key": best["device_key"],
            "dtype": best["dtype"],
            "ceiling_flops_per_s": best["median_rate"].astype(float),
            "ceiling_run_id": best["run_id"],
            "ceiling_shape": best["shape"],
            "ceiling_backend": best["backend"],
        }
    ).reset_index(drop=True)


def matmul_dtype(dtype: Any, backend_metrics: Any) -> Any:
    """The ceiling dtype a run's matmuls ran in: ``tf32`` for a float32 run whose matmul
    precision was not "highest" (TF32 tensor cores), else its dtype."""
    if dtype != "float32" or not isinstance(backend_metrics, str):
        return dtype
    try:
        precision = json.loads(backend_metrics).get("float32_matmul_precision", "highest")
    except (ValueError, AttributeError):
        return dtype
    return "tf32" if precision != "highest" else dtype


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
            "dtype": [matmul_dtype(d, m) for d, m in zip(frame["dtype"], metrics, strict=True)],
        },
        index=frame.index,
    )
    joined = keys.merge(table, on=["device_key", "dtype"], how="left")
    joined.index = frame.index
    devices = frame["devices"].fillna(1).astype(float) if "devices" in frame else 1.0
    achieved = frame["flops_per_step"].astype(float) / (frame["median_step_ms"].astype(float) / 1e3) / devices
    incomplete = frame["flops_incomplete"].notna() if "flops_incomplete" in frame else False
    attained = (achieved / joined["ceiling_flops_per_s"]).where(~incomplete & (frame["median_step_ms"] > 0))
    frame["mfu_attained"] = attained.astype(float)
    frame["ceiling_flops_per_s"] = joined["ceiling_flops_per_s"].where(attained.notna())
    frame["ceiling_run_id"] = joined["ceiling_run_id"].where(attained.notna())
    return frame


def curves(ceilings: pd.DataFrame, kind: str) -> pd.DataFrame:
    """A ceilings kind's points for plotting, one line per device: size (matmul: M=N=K of the
    square sweep; memory and collectives: bytes) against the median rate, with ``series``
    naming the line (backend, device, op, dtype, group size)."""
    points = latest_points(ceilings)
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


#: STREAM's kernels: the device memory's bandwidth (host copies are a link's, not a roofline's)
STREAM_OPS = ("copy", "scale", "add", "triad")


def roofline_frame(ceilings: pd.DataFrame) -> pd.DataFrame:
    """The measured ceilings in the shape :func:`tpubench.analysis.roofline.ceilings_for`
    reads: per device, each matmul dtype's points (``flops_per_s``, the median rate) and the
    STREAM points past the caches (``bytes_per_s``; :func:`beyond_cache`), of the latest sweep
    of each. ``ceilings_for`` takes the best of them, as ``--show`` does."""
    columns = ["kind", "device", "dtype", "flops_per_s", "bytes_per_s"]
    points = latest_points(ceilings)
    if points.empty:
        return pd.DataFrame(columns=columns)
    rated = points[points["median_rate"].notna()]
    matmul = rated[rated["kind"] == "matmul"]
    memory = beyond_cache(rated[(rated["kind"] == "memory") & rated["op"].isin(STREAM_OPS)])
    return pd.concat(
        [
            pd.DataFrame(
                {
                    "kind": "matmul",
                    "device": matmul["device"],
                    "dtype": matmul["dtype"],
                    "flops_per_s": matmul["median_rate"],
                    "bytes_per_s": None,
                }
            ),
            pd.DataFrame(
                {
                    "kind": "memory",
                    "device": memory["device"],
                    "dtype": memory["dtype"],
                    "flops_per_s": None,
                    "bytes_per_s": memory["median_rate"],
                }
            ),
        ],
        ignore_index=True,
    )[columns]
