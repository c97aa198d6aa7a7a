"""``transformers serve``: Hugging Face transformers' own OpenAI-compatible server.

The one engine that runs on a CPU-only host, so the test engine: run here (transformers
5.24, CPU) with ``--continuous-batching``, serving a tiny Llama saved locally. What it was
seen to do there: ``/health`` answers 200 once the preloaded model is up; it refuses
request fields it does not know with HTTP 422 (``ignore_eos`` among them); it logs that it
ignores ``stream_options`` and sends ``usage`` in its last streamed chunk regardless; it
has no version endpoint, so the version is its installed package's.
"""

from __future__ import annotations

from tpubench.backends.base import DEFAULT_WORKER_ENV
from tpubench.serving.engines.base import Engine

ENGINE = Engine(
    name="transformers",
    summary="transformers serve (FastAPI + uvicorn), continuous batching; CPU or one GPU",
    launcher=("transformers", "serve"),
    model_flag=None,
    modules=("transformers", "fastapi", "uvicorn"),
    install="pip install 'tpubench[serving]' (transformers[serving])",
    honours={"ignore_eos": False, "stream_options": False, "load_format_dummy": False},
    flags={"dtype": ("--dtype",), "quantization": ("--quantization",)},
    accelerator="device-flag",
    docs="https://huggingface.co/docs/transformers/serving",
    verified="CPU, transformers 5.24: started, readiness, version, ignore_eos refused (422), usage streamed",
    version_packages=("transformers",),
    default_args=("--continuous-batching",),
    # torch_tpu, where installed, must not autoload into a CPU or CUDA server
    env=DEFAULT_WORKER_ENV,
)
