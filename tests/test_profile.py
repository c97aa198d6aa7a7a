"""--profile on the CPU backend: a torch.profiler trace after the measured steps."""

from __future__ import annotations

import json
from pathlib import Path

from tpubench import store
from tpubench.runner import SuiteRunner, plan


def test_profile_writes_a_chrome_trace_apart_from_the_measured_steps(results_dir: Path) -> None:
    specs = plan(["gpt2"], modes=["train"], warmup=1, steps=2, profile_steps=2)
    [row] = SuiteRunner(results_dir).run(specs)
    assert row["status"] == "ok", row.get("error")
    assert row["trace_path"] == f"traces/{row['run_id']}/trace.json"  # relative: the store can move
    trace = results_dir / row["trace_path"]
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(event.get("name") == "aten::mm" for event in events)
    assert len(store.load_steps(results_dir, phase="measure")) == 2


def test_profiling_a_decode_run_keeps_its_steps_table_to_the_timed_generations(results_dir: Path) -> None:
    specs = plan(["gpt2"], modes=["decode"], batch_size=1, seq_len=16, gen_len=4, warmup=1, steps=2, profile_steps=2)
    [row] = SuiteRunner(results_dir).run(specs)
    assert row["status"] == "ok", row.get("error")
    assert (results_dir / row["trace_path"]).is_file()
    steps = store.load_steps(results_dir)
    assert len(steps) == row["warmup_steps"] + 3 and steps.ttft_ms.notna().all()
