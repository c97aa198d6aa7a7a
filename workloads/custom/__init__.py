"""Users' own models as workloads: a factory in their code, or a Hugging Face architecture
built from its config class with random weights (``tpubench run --model ...``).

A :class:`~workloads.custom.ref.ModelRef` names the model; :func:`resolve` turns it into
the same :class:`workloads.Workload` every built-in model declares, with FLOPs counted by
``FlopCounterMode`` and memory estimated where the user gives neither; :func:`dry_run`
runs its first step where that costs nothing, so a model that cannot run is an error
before any run starts.
"""

from __future__ import annotations

from workloads.base import Workload
from workloads.custom.ref import ROUTES, ModelRef, ModelRefError
from workloads.custom.workload import check_seeded, dry_run, workload_for

__all__ = ["ROUTES", "ModelRef", "ModelRefError", "check_seeded", "dry_run", "resolve"]


def resolve(ref: ModelRef) -> Workload:
    """The workload ``ref`` names; bad input is a :class:`ModelRefError` (one line, naming the
    valid choices). Importing the user's module or reading the config happens here."""
    if ref.route == "hf":
        from workloads.custom.hf import hf_model  # transformers only when a Hugging Face model is named

        return workload_for(hf_model(ref))
    from workloads.custom.factory import factory_model

    return workload_for(factory_model(ref))
