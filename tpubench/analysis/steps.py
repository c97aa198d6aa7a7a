"""The job's per-step samples, from a steps table that keeps every rank's.

A run of several rank processes stores each rank's samples (``rank`` set): every rank times
its own steps, and a reader may want to see how they spread. The job, though, moves at its
slowest rank's pace, and the run's statistics (``median_step_ms`` and the rest) are the
per-step slowest rank's (:mod:`tpubench.launch.ranks`). A reader that samples a run's
steps (a comparison's test, its noise model, an export) takes :func:`job_steps`, so that a
two-rank run gives one sample per step, not two that mix a fast rank with a slow one.
"""

from __future__ import annotations

import pandas as pd

#: per step, the slowest rank's: the times the job waited for
SLOWEST = ("step_ms", "host_ms", "ttft_ms", "tpot_ms", "compile_count", "compile_s")
#: per step, the ranks' mean: each rank's loss is over its equal slice of the batch, so their
#: mean is the job's loss over the global batch (as --verify takes it: tpubench.verify.stored_losses)
MEAN = ("loss",)
#: what identifies one step of one run
STEP_KEYS = ["run_id", "phase", "step"]


def job_steps(steps: pd.DataFrame) -> pd.DataFrame:
    """``steps`` with each multi-rank step collapsed into one row: the largest time any rank
    took (:data:`SLOWEST`), the ranks' mean loss (:data:`MEAN`; null if a rank's is), rank 0's
    other columns (its XLA counters), ``rank`` null. Rows
    of one process (``rank`` null, or a frame without the column) pass through unchanged."""
    if "rank" not in steps.columns or not steps["rank"].notna().any():
        return steps
    ranked = steps["rank"].notna()
    ordered = steps[ranked].sort_values("rank", kind="stable")
    rules = {
        column: "max" if column in SLOWEST else "mean" if column in MEAN else "first"
        for column in steps.columns
        if column not in STEP_KEYS
    }
    groups = ordered.groupby(STEP_KEYS, as_index=False, sort=False, dropna=False)
    merged = groups.agg(rules)  # built-in reductions: a year of nights is a million step rows
    for column in [column for column in MEAN if column in steps.columns]:
        # a mean over some ranks is those ranks' slices, not the job's batch: null unless every rank has one
        counted = groups[column].count()[column].to_numpy()
        merged.loc[counted < groups.size()["size"].to_numpy(), column] = None
    merged["rank"] = pd.array([pd.NA] * len(merged), dtype="Int64")
    single = steps[~ranked].astype({"rank": "Int64"})
    return pd.concat([single, merged[steps.columns]], ignore_index=True) if len(single) else merged[steps.columns]
