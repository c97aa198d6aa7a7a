"""vllm-tpu: vLLM on TPUs through tpu-inference (JAX), started as ``vllm serve MODEL``.

Read from tpu-inference's quickstart, not yet run on a chip: installed with
``pip install vllm-tpu`` (Python 3.11 or newer; TPU v5e, v6e, v7x), served by vLLM's own
server, so readiness, version and request fields are vLLM's; the version adds the
tpu-inference package's. The first start compiles for the configured shapes. JAX holds the
chip, so a torch_tpu installed beside it must not autoload (``TORCH_DEVICE_BACKEND_AUTOLOAD=0``).
"""

from __future__ import annotations

from tpubench.backends.base import DEFAULT_WORKER_ENV
from tpubench.serving.engines.base import Engine
from tpubench.serving.engines.vllm import VLLM_FLAGS, VLLM_HONOURS

ENGINE = Engine(
    name="vllm-tpu",
    summary="vLLM on TPU through tpu-inference (JAX): vllm serve",
    launcher=("vllm", "serve"),
    model_flag=None,
    modules=("vllm", "tpu_inference"),
    install="pip install vllm-tpu (on a TPU VM, Python >= 3.11; https://docs.vllm.ai/projects/tpu/en/latest/getting_started/installation/)",
    honours=VLLM_HONOURS,
    flags=VLLM_FLAGS,
    accelerator="tpu",
    docs="https://docs.vllm.ai/projects/tpu/en/latest/getting_started/quickstart/",
    version_paths=("/version",),
    version_packages=("vllm", "tpu-inference"),
    env=DEFAULT_WORKER_ENV,
)
