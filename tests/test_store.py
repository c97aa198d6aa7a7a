"""The parquet store: layout, atomic writes, concurrent writers, corrupt files, old schemas."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import warnings
from datetime import UTC, datetime
from pathlib import Path

import duckdb
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from tpubench import store
from tpubench.schema import RUNS, SCHEMA_VERSION

WHEN = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def run_row(run_id: str, **fields) -> dict:
    return {
        "run_id": run_id,
        "invocation_id": "inv",
        "started_at": WHEN,
        "workload": "gpt2",
        "size": "tiny",
        "backend": "cpu",
        "mode": "train",
        "status": "ok",
        "median_step_ms": 1.5,
        **fields,
    }


def test_layout_is_one_file_per_invocation_per_table_in_date_partitions(results_dir: Path) -> None:
    writer = store.InvocationWriter(results_dir, "inv", WHEN)
    writer.add(run_row("a"), [{"run_id": "a", "step": 0, "phase": "first", "step_ms": 3.0}])
    writer.add(run_row("b", status="failed"))
    files = sorted(p.relative_to(results_dir).as_posix() for p in results_dir.rglob("*") if p.is_file())
    assert files == ["runs/date=2026-11-29/inv.parquet", "steps/date=2026-11-29/inv.parquet"]
    runs = store.load_runs(results_dir)
    assert list(runs.run_id) == ["a", "b"]
    assert set(runs.schema_version) == {SCHEMA_VERSION}
    assert list(store.load_runs(results_dir, status="failed").run_id) == ["b"]
    assert list(store.load_runs(results_dir, run_id=["a", "zzz"]).run_id) == ["a"]
    assert store.load_steps(results_dir).step_ms.tolist() == [3.0]


def test_pandas_pyarrow_and_duckdb_read_the_store(results_dir: Path) -> None:
    for invocation in ("one", "two"):
        store.InvocationWriter(results_dir, invocation, WHEN).add(run_row(invocation, invocation_id=invocation))
    frame = pd.read_parquet(results_dir / "runs")
    assert sorted(frame.run_id) == ["one", "two"]
    assert set(frame["date"].astype(str)) == {"2026-11-29"}  # the Hive partition column
    dataset = ds.dataset(results_dir / "runs", format="parquet", partitioning="hive")
    assert dataset.count_rows() == 2
    glob = (results_dir / "runs" / "*" / "*.parquet").as_posix()
    rows = duckdb.sql(
        f"select count(*) from read_parquet('{glob}', hive_partitioning=true, union_by_name=true) where status = 'ok'"
    ).fetchall()
    assert rows == [(2,)]


def test_unknown_columns_are_rejected_on_write(results_dir: Path) -> None:
    with pytest.raises(ValueError, match="not in the runs schema"):
        store.InvocationWriter(results_dir, "inv", WHEN).add(run_row("a", median_ms=1.0))


def test_a_rejected_run_leaves_the_invocation_as_it_was(results_dir: Path) -> None:
    """A run whose step rows do not fit the schema is refused whole: neither its run row nor
    its steps reach the files, and the invocation goes on with the next run."""
    writer = store.InvocationWriter(results_dir, "inv", WHEN)
    writer.add(run_row("a"), [{"run_id": "a", "step": 0, "phase": "measure", "step_ms": 1.0}])
    with pytest.raises(ValueError, match="not in the steps schema"):
        writer.add(run_row("b"), [{"run_id": "b", "step": 0, "phase": "measure", "millis": 2.0}])
    writer.add(run_row("c"), [{"run_id": "c", "step": 0, "phase": "measure", "step_ms": 3.0}])
    assert list(store.load_runs(results_dir).run_id) == ["a", "c"]
    steps = store.load_steps(results_dir)
    assert list(steps.run_id) == ["a", "c"] and list(steps.step_ms) == [1.0, 3.0]


def test_a_corrupt_file_is_named_and_skipped(results_dir: Path) -> None:
    store.InvocationWriter(results_dir, "good", WHEN).add(run_row("good"))
    bad = results_dir / "runs" / "date=2026-11-29" / "bad.parquet"
    good_bytes = (results_dir / "runs" / "date=2026-11-29" / "good.parquet").read_bytes()
    bad.write_bytes(good_bytes[: len(good_bytes) // 2])  # truncated mid-file
    with pytest.warns(UserWarning, match="bad.parquet"):
        runs = store.load_runs(results_dir)
    assert list(runs.run_id) == ["good"]


def test_files_from_an_older_schema_still_load(results_dir: Path) -> None:
    old_schema = pa.schema([field for field in RUNS if field.name not in ("mfu", "tags")])
    old = pa.Table.from_pylist([{**run_row("old"), "schema_version": 0}], schema=old_schema)
    path = store.partition_dir(results_dir, "runs", WHEN) / "old.parquet"
    path.parent.mkdir(parents=True)
    pq.write_table(old, path)
    store.InvocationWriter(results_dir, "new", WHEN).add(run_row("new", mfu=0.5))
    runs = store.load_runs(results_dir).set_index("run_id")
    assert pd.isna(runs.loc["old", "mfu"]) and runs.loc["new", "mfu"] == 0.5
    assert runs.loc["old", "median_step_ms"] == 1.5


def test_a_version_1_decode_row_reads_tokens_per_s_as_output_tokens(results_dir: Path) -> None:
    """Schema 2: a decode run's tokens_per_s is output tokens per second. Version 1 stored
    prompt plus output tokens under that name; its rows are converted as they load, by both
    readers, a train row's left as it was."""
    rows = [
        run_row("d", mode="decode", tokens_per_s=23396.0, output_tokens_per_s=2643.0, total_tokens_per_s=23788.0),
        run_row("t", mode="train", tokens_per_s=5000.0),
    ]
    table = store.to_table(rows, "runs")
    table = table.set_column(
        table.schema.get_field_index("schema_version"), "schema_version", pa.array([1, 1], pa.int32())
    )
    path = store.partition_dir(results_dir, "runs", WHEN) / "v1.parquet"
    path.parent.mkdir(parents=True)
    pq.write_table(table, path)
    for runs in (
        store.load_runs(results_dir),
        store.scan_table(results_dir, "runs", ["run_id", "tokens_per_s"]),
        store.scan_table(results_dir, "runs"),
    ):
        tokens = runs.set_index("run_id")["tokens_per_s"]
        assert (tokens["d"], tokens["t"]) == (2643.0, 5000.0)
    assert list(store.scan_table(results_dir, "runs", ["run_id", "tokens_per_s"]).columns) == ["run_id", "tokens_per_s"]


def test_scan_table_reads_only_what_it_is_asked_for_and_agrees_with_load_table(results_dir: Path) -> None:
    old_schema = pa.schema([field for field in RUNS if field.name != "mfu"])
    path = store.partition_dir(results_dir, "runs", WHEN) / "old.parquet"
    path.parent.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist([run_row("o", invocation_id="old")], schema=old_schema), path)
    for invocation in ("one", "two"):
        writer = store.InvocationWriter(results_dir, invocation, WHEN)
        writer.add(run_row(f"{invocation}-a", invocation_id=invocation, mfu=0.5))
        writer.add(run_row(f"{invocation}-b", invocation_id=invocation, backend="cuda", status="failed"))
    scanned = store.scan_table(results_dir, "runs", ["run_id", "mfu"], invocation_id=["two", "old"], backend="cpu")
    assert list(scanned.columns) == ["run_id", "mfu"]
    assert sorted(scanned.run_id) == ["o", "two-a"]  # filters applied in the reader; old files get new columns null
    assert pd.isna(scanned.set_index("run_id").loc["o", "mfu"])
    everything = store.scan_table(results_dir, "runs").sort_values("run_id", ignore_index=True)
    pd.testing.assert_frame_equal(everything, store.load_runs(results_dir).sort_values("run_id", ignore_index=True))
    bad = path.with_name("bad.parquet")
    bad.write_bytes(path.read_bytes()[:100])  # a torn file: the others are still read
    with pytest.warns(UserWarning, match="bad.parquet"):
        assert len(store.scan_table(results_dir, "runs", ["run_id"], status="failed")) == 2
    with pytest.raises(ValueError, match="cannot read or filter"):
        store.scan_table(results_dir, "runs", ["no_such_column"])


def test_missing_results_directory_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(store.StoreError, match="does not exist"):
        store.load_runs(tmp_path / "nope")


WRITER = textwrap.dedent("""
    import sys
    from datetime import UTC, datetime
    from tpubench import store
    writer = store.InvocationWriter(sys.argv[1], "victim", datetime(2026, 11, 29, tzinfo=UTC))
    big = "x" * 200_000
    i = 0
    while True:
        writer.add({"run_id": f"r{i}", "status": "ok", "error": big, "stderr_tail": big})
        print(i, flush=True)  # announces each completed write: the test kills in the next one
        i += 1
""")


@pytest.mark.parametrize("writes_before_kill", [1, 2, 5, 9])
def test_killing_a_writer_mid_write_leaves_no_corrupt_file(results_dir: Path, writes_before_kill: int) -> None:
    """SIGKILL a process that rewrites its invocation file in a loop, right after its Nth write.

    The kill lands while the writer is serialising or writing write N+1 (each takes tens
    of ms: the rows carry 400 kB), so the old file must still be whole.
    """
    process = subprocess.Popen([sys.executable, "-c", WRITER, str(results_dir)], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    for _ in range(writes_before_kill):
        assert process.stdout.readline(), "the writer died before its announced writes"
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    path = results_dir / "runs" / "date=2026-11-29" / "victim.parquet"
    table = pq.read_table(path)  # never torn: raises if it were
    assert table.num_rows >= writes_before_kill
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no file may be reported unreadable
        runs = store.load_runs(results_dir)
    assert len(runs) == table.num_rows
    assert len(pd.read_parquet(results_dir / "runs")) == table.num_rows  # pandas skips temp files too
