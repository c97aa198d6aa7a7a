"""The environment fingerprint stored with every run, and the hash ``--resume`` compares.

Two runs with equal fingerprints ran the same code (git sha), the same stack (python,
torch and backend versions) on the same host and device, under the same
performance-relevant environment variables.
"""

from __future__ import annotations

import hashlib
import json
import platform
import socket
import subprocess
from functools import cache
from pathlib import Path

from tpubench.version import __version__

#: Variables that change what a run measures: XLA/PJRT/TPU runtime flags, threading,
#: compiler and allocator settings (LD_PRELOAD: tcmalloc for TorchTPU), device visibility.
PERF_ENV_PREFIXES = (
    "LD_PRELOAD",
    "TCMALLOC_",
    "XLA_",
    "PJRT_",
    "LIBTPU_",
    "TPU_",
    "TORCH_",
    "TORCHINDUCTOR_",
    "PYTORCH_",
    "OMP_",
    "MKL_",
    "KMP_",
    "OPENBLAS_",
    "CUDA_",
    "NCCL_",
)


def perf_env(env: dict[str, str]) -> dict[str, str]:
    return {key: value for key, value in sorted(env.items()) if key.startswith(PERF_ENV_PREFIXES)}


@cache
def git_sha() -> str | None:
    """The commit of the tree tpubench runs from, suffixed ``+dirty`` when edited; None outside git."""
    root = Path(__file__).resolve().parent.parent
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{sha}+dirty" if dirty else sha


def host_facts() -> dict[str, str]:
    from tpubench.backends.cpu import cpu_model

    return {"host": socket.gethostname(), "cpu_model": cpu_model(), "os": platform.platform()}


def fingerprint(probe: dict, backend: str, env: dict[str, str]) -> dict:
    """Everything about where ``backend`` runs, from the parent's facts and its interpreter's probe."""
    availability = probe["backends"][backend]
    return {
        **host_facts(),
        "device": availability["device_name"],
        "device_count": availability["device_count"],
        "python_executable": probe["executable"],
        "python_version": probe["python_version"],
        "torch_version": probe["torch_version"],
        "backend_versions": availability["versions"],
        "tpubench_version": __version__,
        "git_sha": git_sha(),
        "env": perf_env(env),
    }


def fingerprint_hash(facts: dict) -> str:
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:16]
