"""Ingest's fast path gives every ``ops`` row what the slow one gave: the FLOPs, bytes and
per-shape figures of recorded Chrome traces, row by row, against the rows tpubench gave them
before the fast path (tests/data/ops_rows.json.gz, recorded by tests/data/record_ops_rows.py);
counted with torch, then from the kept counts in a fresh interpreter that never imports it.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT

from tpubench.traces import ingest

DATA = Path(__file__).parent / "data"
TRACES = {"gpt2_tiny_train_cpu.json.gz": 2, "gloo_fsdp2_rank0.json.gz": 2}  # as record_ops_rows.py ingests them


@pytest.fixture(scope="module")
def recorded() -> dict[str, list[dict]]:
    with gzip.open(DATA / "ops_rows.json.gz", "rt") as found:
        return json.load(found)["rows"]


def as_recorded(rows: list[dict]) -> list[dict]:
    """Rows as the recording wrote them (JSON: tuples are lists), so that == compares every value."""
    return json.loads(json.dumps(rows, sort_keys=True))


def mismatches(rows: list[dict], expected: list[dict]) -> list[str]:
    """Each row, by position, whose value of some column differs, with both values: a
    readable failure instead of two 90-row lists."""
    found = [
        f"{row.get('source')} {row.get('op')}: {column} {row.get(column)!r} != {want.get(column)!r}"
        for row, want in zip(rows, expected, strict=False)
        for column in sorted(set(row) | set(want))
        if row.get(column) != want.get(column)
    ]
    return found + ([f"{len(rows)} rows, recorded {len(expected)}"] if len(rows) != len(expected) else [])


@pytest.mark.parametrize("trace", TRACES)
def test_every_ops_row_is_the_one_recorded_before_the_fast_path_counted_then_kept(
    trace: str, recorded: dict[str, list[dict]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TPUBENCH_CACHE_DIR", str(tmp_path))
    expected = recorded[trace]
    assert sum(row["flops"] is not None for row in expected) >= 20  # the figures this holds are there
    counted = as_recorded(ingest(DATA / trace, TRACES[trace]))
    assert mismatches(counted, expected) == []
    kept = json.loads((tmp_path / "shape-counts.json").read_text())["counts"]
    assert len(kept) >= 20
    assert as_recorded(ingest(DATA / trace, TRACES[trace])) == expected  # now from the kept counts


def test_kept_counts_serve_a_fresh_interpreter_without_torch(recorded: dict[str, list[dict]], tmp_path: Path) -> None:
    """The second ingest of a model's trace reads its counts from the cache folder: no torch
    import (2.6 s here), and the same rows."""
    trace = "gpt2_tiny_train_cpu.json.gz"
    env = {**os.environ, "TPUBENCH_CACHE_DIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    script = (
        "import json, sys\nfrom tpubench.traces import ingest\n"
        f"rows = ingest({str(DATA / trace)!r}, {TRACES[trace]})\n"
        "print(json.dumps({'torch': 'torch' in sys.modules, 'rows': rows}))"
    )
    runs = [json.loads(subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                                      check=True, cwd=ROOT).stdout) for _ in range(2)]  # fmt: skip
    assert [run["torch"] for run in runs] == [True, False]  # counted, then kept
    for run in runs:
        assert mismatches(as_recorded(run["rows"]), recorded[trace]) == []


def test_counts_kept_for_another_torch_or_counting_code_are_counted_again(
    recorded: dict[str, list[dict]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kept file whose key is not this torch build's and this counts.py's is not read: its
    figures (doubled here) would be another build's."""
    monkeypatch.setenv("TPUBENCH_CACHE_DIR", str(tmp_path))
    trace = "gloo_fsdp2_rank0.json.gz"
    ingest(DATA / trace, TRACES[trace])
    path = tmp_path / "shape-counts.json"
    kept = json.loads(path.read_text())
    doubled = {
        text: [value * 2 if isinstance(value, float) else value for value in entry]
        for text, entry in kept["counts"].items()
    }
    path.write_text(json.dumps({"key": "another torch", "counts": doubled}))
    assert as_recorded(ingest(DATA / trace, TRACES[trace])) == recorded[trace]
    path.write_text(json.dumps({"key": kept["key"], "counts": doubled}))  # the same key: read, so the test can fail
    assert as_recorded(ingest(DATA / trace, TRACES[trace])) != recorded[trace]
