"""vLLM-TorchTPU: vLLM's PyTorch-native TPU platform plugin (``torch_tpu``), ``vllm serve MODEL``.

Read from vllm-torchtpu's installation and quickstart pages, not yet run on a chip:
``pip install vllm-torchtpu`` (vLLM plus the ``vllm-torchtpu-core`` plugin, Python 3.12),
served by vLLM's own server, so readiness, version and request fields are vLLM's; the
version adds the plugin's. The first start compiles XLA/Pallas graphs
(``VLLM_XLA_CACHE_PATH`` keeps them across starts), so its cold start is the one to watch.
TorchTPU must load in this engine: ``TORCH_DEVICE_BACKEND_AUTOLOAD=1``, as tpubench's own TorchTPU
workers have it (the CLI sets 0 for itself).
"""

from __future__ import annotations

from tpubench.serving.engines.base import Engine
from tpubench.serving.engines.vllm import VLLM_FLAGS, VLLM_HONOURS

ENGINE = Engine(
    name="vllm-torchtpu",
    summary="vLLM on TPU through TorchTPU (torch_tpu, PyTorch-native): vllm serve",
    launcher=("vllm", "serve"),
    model_flag=None,
    modules=("vllm", "vllm_torchtpu"),
    install="pip install vllm-torchtpu (on a TPU VM, Python 3.12; https://github.com/vllm-project/vllm-torchtpu)",
    honours=VLLM_HONOURS,
    flags=VLLM_FLAGS,
    accelerator="tpu",
    docs="https://github.com/vllm-project/vllm-torchtpu/blob/main/docs/getting_started/quickstart.md",
    version_paths=("/version",),
    version_packages=("vllm", "vllm-torchtpu-core"),
    env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "1"},
)
