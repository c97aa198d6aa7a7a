"""The CUDA backends, end to end through real workers. Skipped where there is no NVIDIA GPU.

On a GPU host these run for real; benchmarks/gpu_check.py is the fuller GPU check.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tpubench import store
from tpubench.runner import SuiteRunner, plan

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine"),
]


@pytest.mark.parametrize("backend", ["cuda", "cuda-compile"])
def test_tiny_llm_runs_on_cuda(backend: str, results_dir: Path) -> None:
    specs = plan(["gpt2"], sizes=["tiny"], backends=[backend], dtype="bfloat16", warmup=2, steps=5)
    rows = SuiteRunner(results_dir).run(specs)
    assert [row["status"] for row in rows] == ["ok", "ok"], [row.get("error") for row in rows]
    for row in rows:
        assert row["device"] == torch.cuda.get_device_name(0)
        assert row["peak_mem_bytes"] > 0 and row["median_step_ms"] > 0
        assert row["recompiles_after_warmup"] == 0
    if backend == "cuda-compile":
        assert all(row["compile_count"] >= 1 for row in rows)
    assert len(store.load_runs(results_dir)) == 2
