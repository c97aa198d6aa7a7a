"""vLLM on NVIDIA GPUs: ``vllm serve MODEL``.

Read from vLLM's documentation and its server's routes, not yet run on a chip: ``/health``
answers 200 once the engine is up (503 if it died), ``/version`` gives ``{"version": ...}``,
``ignore_eos`` is one of its extra sampling parameters, ``stream_options.include_usage``
puts ``usage`` in the last streamed chunk, and ``--load-format dummy`` serves random
weights without fetching any.
"""

from __future__ import annotations

from tpubench.backends.base import DEFAULT_WORKER_ENV
from tpubench.serving.engines.base import Engine

#: what vLLM and its two TPU platform plugins share
VLLM_HONOURS = {"ignore_eos": True, "stream_options": True, "load_format_dummy": True}
VLLM_FLAGS = {
    "dtype": ("--dtype",),
    "tp_size": ("--tensor-parallel-size", "-tp"),
    "quantization": ("--quantization", "-q"),
}

ENGINE = Engine(
    name="vllm",
    summary="vLLM (CUDA): vllm serve",
    launcher=("vllm", "serve"),
    model_flag=None,
    modules=("vllm",),
    install="pip install vllm (on a host with an NVIDIA GPU; https://docs.vllm.ai/en/latest/getting_started/installation/)",
    honours=VLLM_HONOURS,
    flags=VLLM_FLAGS,
    accelerator="cuda",
    docs="https://docs.vllm.ai/en/latest/serving/openai_compatible_server.html",
    version_paths=("/version",),
    version_packages=("vllm",),
    env=DEFAULT_WORKER_ENV,
)
