"""Inductor's on-disk cache: private and cold by default, shared with --compile-cache."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from helpers import tpubench

from tpubench import store


# nightly: three cold Inductor compiles in three CLI processes, 80 s on CI's 2 cores; every CI
# cpu-compile run still starts from the private cold cache this checks (test_compiles.py)
@pytest.mark.nightly
def test_compiled_runs_ignore_a_warm_user_cache_unless_asked_to_share_one(
    compile_workloads: None, results_dir: Path, tmp_path: Path
) -> None:
    """On ``compile-clean`` (tests/compile_workloads.py: one Linear and a ReLU): the cache's
    behaviour does not depend on the graph, and Inductor compiles this one in a fraction of
    gpt2's time (three gpt2 compiles took this test to 104 s on the 2-core CI host)."""
    shared = tmp_path / "cache"
    args = ("run", "--workload", "compile-clean", "--backend", "cpu-compile", "--mode", "infer")
    args += ("--warmup", "1", "--steps", "2")

    def run(tag: str, *extra: str, env: dict[str, str] | None = None) -> None:
        result = tpubench(*args, "--results", str(results_dir), "--tag", f"run={tag}", *extra, env=env)
        assert result.returncode == 0, result.stdout + result.stderr

    run("cold", "--compile-cache", str(shared))
    run("warm", "--compile-cache", str(shared))
    # the user's own Inductor cache is now warm for this graph, and must not be used
    run("default", env={"TORCHINDUCTOR_CACHE_DIR": str(shared / "inductor")})

    runs = store.load_runs(results_dir)
    runs.index = [json.loads(tags)["run"] for tags in runs.tags]
    assert set(runs.status) == {"ok"}, runs.error
    assert runs.loc["cold", "compile_cache_misses"] >= 1 and runs.loc["cold", "compile_cache_hits"] == 0
    assert runs.loc["warm", "compile_cache_hits"] >= 1 and runs.loc["warm", "compile_cache_misses"] == 0
    assert runs.loc["default", "compile_cache_misses"] >= 1 and runs.loc["default", "compile_cache_hits"] == 0
    assert runs.loc["warm", "compile_cache"] == str(shared) and pd.isna(runs.loc["default", "compile_cache"])
    assert (shared / "inductor" / "fxgraph").is_dir()
    # the compiles table says the same per compile: compiled (miss) cold, loaded from disk warm
    compiles = store.load_compiles(results_dir, layer="dynamo", event="compile")
    cache = {tag: set(compiles[compiles.run_id == runs.loc[tag, "run_id"]].cache) for tag in ("cold", "warm")}
    assert cache == {"cold": {"miss"}, "warm": {"disk_hit"}}
