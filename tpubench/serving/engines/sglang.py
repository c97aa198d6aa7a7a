"""SGLang on NVIDIA GPUs: ``python -m sglang.launch_server --model-path MODEL``.

Read from SGLang's documentation and its server's routes, not yet run on a chip:
``/health`` answers 503 while the server starts and 200 once a one-token generation
succeeds; ``/get_server_info`` (``/server_info`` in newer releases) carries ``version``;
``ignore_eos`` is a sampling parameter its own benchmark sets; ``--load-format dummy``
serves random weights.
"""

from __future__ import annotations

from tpubench.backends.base import DEFAULT_WORKER_ENV
from tpubench.serving.engines.base import Engine

ENGINE = Engine(
    name="sglang",
    summary="SGLang (CUDA): python -m sglang.launch_server",
    launcher=("-m", "sglang.launch_server"),
    model_flag="--model-path",
    modules=("sglang",),
    install="pip install sglang (on a host with an NVIDIA GPU; https://docs.sglang.io/)",
    honours={"ignore_eos": True, "stream_options": True, "load_format_dummy": True},
    flags={"dtype": ("--dtype",), "tp_size": ("--tp-size", "--tp"), "quantization": ("--quantization",)},
    accelerator="cuda",
    docs="https://docs.sglang.io/basic_usage/native_api.html",
    version_paths=("/get_server_info", "/server_info"),
    version_packages=("sglang",),
    env=DEFAULT_WORKER_ENV,
)
