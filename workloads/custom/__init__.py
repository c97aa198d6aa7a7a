"""Users' own models as workloads: a factory in their code, or a Hugging Face architecture
built from its config class with random weights (``tpubench run --model ...``).

A :class:`~workloads.custom.ref.ModelRef` names the model; :func:`resolve` turns it into
the same :class:`workloads.Workload` every built-in model declares, with FLOPs counted by
``FlopCounterMode`` and memory estimated where the user gives neither.
"""

from workloads.custom.ref import ROUTES, ModelRef, ModelRefError

__all__ = ["ROUTES", "ModelRef", "ModelRefError"]
