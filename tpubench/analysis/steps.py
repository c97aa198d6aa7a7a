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
#: what identifies one step of one run
STEP_KEYS = ["run_id", "phase", "step"]


def job_steps(steps: pd.DataFrame) -> pd.DataFrame:
    """``steps`` with each multi-rank step collapsed into one row: the largest time any rank
    took (:data:`SLOWEST`), rank 0's other columns (its XLA counters), ``rank`` null. Rows
    of one process (``rank`` null, or a frame without the column) pass through unchanged."""
    if "rank" not in steps.columns or not steps["rank"].notna().any():
        return steps
    ranked = steps["rank"].notna()
    ordered = steps[ranked].sort_values("rank", kind="stable")
    rules = {column: "max" if column in SLOWEST else "first" for column in steps.columns if column not in STEP_KEYS}
    merged = ordered.groupby(STEP_KEYS, as_index=False, sort=False, dropna=False).agg(rules)
    merged["rank"] = pd.array([pd.NA] * len(merged), dtype="Int64")
    single = steps[~ranked].astype({"rank": "Int64"})
    return pd.concat([single, merged[steps.columns]], ignore_index=True) if len(single) else merged[steps.columns]
