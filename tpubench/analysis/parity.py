"""Loss parity: two training runs of one workload, seed and batch, step by step.

Every train step stores the loss it computed (``steps.loss``; a run of several rank processes
stores each rank's, and the job's loss is their mean: :func:`tpubench.analysis.steps.job_steps`).
Two runs that start from the same seeded weights and take the same batches compute the same
losses, up to the rounding of their devices, dtypes and reduction orders: a dp or fsdp run
against one device, a GPU run against a TPU run. This module lines the two curves up by step
(step 0 is the first step, before any update; the warm-up steps follow, then the measured
ones) and gives their largest relative difference, ``|B - A| / |A|`` with A the reference.
``tpubench parity`` and the dashboard's Run details page show the same frame.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

from tpubench.analysis.nulls import is_missing
from tpubench.analysis.steps import job_steps
from tpubench.spec import DIMENSIONS

#: what two runs must share for their losses to be the same computation: the model (a user's
#: by its hash), the seed its weights and batches are drawn from, and the global batch's shape.
#: The backend, device, dtype and layout may differ: they are what parity checks.
SAME = ("workload", "size", "model_hash", "seed", "batch_size", *DIMENSIONS)
#: the columns of :func:`parity`'s frame
COLUMNS = ("step", "phase_a", "phase_b", "loss_a", "loss_b", "rel_diff")


class ParityError(ValueError):
    """Two runs whose losses cannot be compared; the message says why, in one line."""


@dataclass(frozen=True)
class Parity:
    """Two runs' losses by step (:data:`COLUMNS`), and where they differ most."""

    frame: pd.DataFrame
    max_rel_diff: float
    step_of_max: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "max_rel_diff": self.max_rel_diff,
            "step_of_max": self.step_of_max,
            "steps": self.frame.astype(object).where(self.frame.notna(), None).to_dict("records"),
        }


def refusal(run_a: dict[str, Any], run_b: dict[str, Any]) -> str | None:
    """Why two runs' losses are not comparable (None: they are): a run that is not a train
    run, one that did not finish ok (it measured nothing), or a difference in :data:`SAME`,
    named with both values."""
    for name, run in (("A", run_a), ("B", run_b)):
        if run.get("mode") != "train":
            return f"run {name} ({run.get('run_id')}) is a {run.get('mode')} run: only training stores a loss"
        if run.get("status") != "ok":
            why = f" ({run['error']})" if not is_missing(run.get("error")) and run.get("error") else ""
            return f"run {name} ({run.get('run_id')}) is {run.get('status')}{why}: it stored no loss"
    for column in SAME:
        a, b = run_a.get(column), run_b.get(column)
        if not (is_missing(a) and is_missing(b)) and (is_missing(a) or is_missing(b) or a != b):
            return f"the runs differ in {column} ({_text(a)} against {_text(b)}): their losses are not one computation"
    return None


def _text(value: Any) -> str:
    if is_missing(value):
        return "none"
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def run_losses(steps: pd.DataFrame, run_id: str) -> pd.DataFrame:
    """``run_id``'s loss per step (every phase), the job's where its ranks each stored one;
    columns ``step``, ``phase``, ``loss``, ordered by step, steps without a loss left out."""
    mine = steps[steps["run_id"] == run_id]
    if "loss" not in mine.columns:
        return pd.DataFrame(columns=["step", "phase", "loss"])
    job = job_steps(mine)
    job = job[job["loss"].notna()]
    return job[["step", "phase", "loss"]].sort_values("step", kind="stable").reset_index(drop=True)


def parity(run_a: dict[str, Any], run_b: dict[str, Any], steps: pd.DataFrame) -> Parity:
    """The two runs' losses side by side on the steps both stored, and their largest relative
    difference (``|B - A| / |A|``); a :class:`ParityError` when the runs are not comparable
    (:func:`refusal`), either has no stored loss, or they share no step."""
    if why := refusal(run_a, run_b):
        raise ParityError(why)
    curves = {}
    for name, run in (("a", run_a), ("b", run_b)):
        curve = run_losses(steps, run["run_id"])
        if curve.empty:
            why = "it was stored before tpubench kept losses (schema version 3)"
            raise ParityError(f"run {name.upper()} ({run['run_id']}) has no stored loss: {why}")
        curves[name] = curve.rename(columns={"phase": f"phase_{name}", "loss": f"loss_{name}"})
    frame = curves["a"].merge(curves["b"], on="step", how="inner")
    if frame.empty:
        raise ParityError("the runs share no step with a stored loss")
    frame["rel_diff"] = (frame["loss_b"] - frame["loss_a"]).abs() / frame["loss_a"].abs()
    at = int(frame["rel_diff"].idxmax())
    return Parity(frame[list(COLUMNS)], float(frame.loc[at, "rel_diff"]), int(frame.loc[at, "step"]))
