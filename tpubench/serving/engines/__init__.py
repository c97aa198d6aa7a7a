"""Serving engines, one module each: how to start one, when it is ready, what it honours.

``ENGINES`` maps the ``tpubench serving --engine`` choices to their :class:`~.base.Engine`.
Only ``transformers`` has been run here (CPU); the others' facts are read from their
documentation until they run on a chip (docs/serving.md says which).
"""

from __future__ import annotations

from tpubench.serving.engines import sglang, transformers, vllm, vllm_torchtpu, vllm_tpu
from tpubench.serving.engines.base import Engine

ENGINES: dict[str, Engine] = {
    module.ENGINE.name: module.ENGINE for module in (vllm, sglang, vllm_tpu, vllm_torchtpu, transformers)
}


def unknown(name: str) -> str | None:
    """The error for an engine name that is not a choice; None for a valid one."""
    if name in ENGINES:
        return None
    return f"unknown engine {name!r}; choose from {', '.join(ENGINES)}"
