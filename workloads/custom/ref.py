"""A reference to a user's model: what ``--model`` and ``tpubench.bench`` name, and what
crosses into every worker process (a reference, never a pickled module).

The CLI parses the user's words into a :class:`ModelRef` once, in the main process; the
runner stores its JSON in the run spec; each worker (in any interpreter, on any host)
turns it back into a :class:`workloads.Workload` with :func:`workloads.custom.resolve`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import PurePath

#: how a model is reached: a factory in the user's code, or a Hugging Face architecture
ROUTES = ("factory", "hf")


class ModelRefError(ValueError):
    """Bad input in a model reference: the message is one line that names the valid choices,
    shown by the CLI as ``error: ...`` with exit 2 before anything runs."""


@dataclass(frozen=True)
class ModelRef:
    """A user's model, by reference.

    ``route`` is ``factory`` or ``hf``. ``target`` is, for ``factory``, ``pkg.mod:make_model``
    or an absolute ``/path/to/file.py:make_model``; for ``hf``, a ``model_type`` (``llama``),
    an absolute path to a folder holding ``config.json``, or a hub id found in the local
    cache. ``inputs`` and ``loss`` are optional ``module:function`` references (factory
    route); ``overrides`` are ``--model-config`` pairs, as given; ``task`` is an
    optimum-benchmark task name (hf route; None: inferred from the config).
    """

    route: str
    target: str
    inputs: str | None = None
    loss: str | None = None
    overrides: tuple[tuple[str, str], ...] = ()
    task: str | None = None

    def __post_init__(self) -> None:
        if self.route not in ROUTES:
            raise ModelRefError(f"unknown model route {self.route!r}; valid: {', '.join(ROUTES)}")

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ModelRef:
        data = json.loads(text)
        data["overrides"] = tuple(tuple(pair) for pair in data.get("overrides", ()))
        return cls(**data)

    @property
    def label(self) -> str:
        """What ``--model`` said: ``hf:llama``, ``mypkg.models:make_model``."""
        return f"hf:{self.target}" if self.route == "hf" else self.target

    @property
    def name(self) -> str:
        """The model's name in rows (their ``workload``) and so in every label: what it is,
        without the path it was reached by, then its task and overrides:
        ``bench_mine:make_model`` for ``bench_mine:make_model`` and
        ``/abs/bench_mine.py:make_model`` alike (runs of one file pair wherever the checkout
        is), ``bench_mine:make_model(hidden=128)``, ``hf:bert(masked-lm,num_hidden_layers=2)``,
        ``hf:<folder name>``. Of the reference a model is stored under (its overrides those
        that differ from the defaults), so two configs never read as one; ``model_hash``
        tells apart two models that share a name."""
        if self.route == "hf":
            base = f"hf:{PurePath(self.target).name}" if PurePath(self.target).is_absolute() else self.label
        else:
            module, _, function = self.target.rpartition(":")
            if module.endswith(".py") or "/" in module:
                path = PurePath(module)
                module = path.parent.name if path.stem == "__init__" else path.stem
            base = f"{module.rpartition('.')[2]}:{function}"
        said = [self.task] if self.task else []
        said += [f"{key}={value}" for key, value in self.overrides]
        return f"{base}({','.join(said)})" if said else base
