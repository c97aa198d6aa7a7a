"""``tpubench compact``: the per-invocation files merged per table and month, keeping every row.

Real parquet written by the store's own writer, the real CLI and real processes: a writer
storing runs while compactions run, and compactions SIGKILLed at random moments.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from helpers import ROOT, in_process, tpubench

from tpubench import store
from tpubench.schema import RUNS, TABLES

#: invocations of the module's store, over three months
INVOCATIONS = 200
FIRST = datetime(2026, 6, 1, 3, 0, tzinfo=UTC)  # 200 invocations: to the end of August
#: modification time of the store's files: older than any --older-than the tests give
OLD = time.time() - 3 * 86400


def write_invocation(results: Path, index: int, when: datetime, runs: int = 2) -> None:
    """One invocation's files as `tpubench run` leaves them: runs and steps always; ops,
    compiles, memory and ceilings for some."""
    invocation = f"{when:%Y%m%dT%H%M%S}-{index:06x}"
    tables: dict[str, list[dict]] = {"runs": [], "steps": [], "ops": [], "compiles": [], "memory": []}
    for number in range(runs):
        run_id = f"{invocation}-r{number}"
        ids = {"run_id": run_id, "invocation_id": invocation}
        tables["runs"].append(
            {**ids, "status": "ok", "backend": "cpu", "workload": "gpt2", "mode": "train", "started_at": when,
             "median_step_ms": 1.0 + index + number / 10, "tags": f'{{"night": "{index}"}}'}
        )  # fmt: skip
        tables["steps"] += [{**ids, "step": step, "phase": "measure", "step_ms": 1.0 + step} for step in range(3)]
        if index % 3 == 0:
            tables["ops"] += [{**ids, "op": f"op{op}", "self_time_us": float(op)} for op in range(2)]
        if index % 4 == 0:
            tables["compiles"].append({"run_id": run_id, "seq": 0, "event": "compile"})
        if index % 5 == 0:
            tables["memory"].append({"run_id": run_id, "rank": 0, "category": "params", "bytes": 10})
    if index % 50 == 0:
        tables["ceilings"] = [{"run_id": f"{invocation}-c", "invocation_id": invocation, "kind": "matmul",
                               "samples_s": [0.1, 0.2]}]  # fmt: skip
    for table, rows in tables.items():  # the writer's layout and schema, written once (the writer fsyncs each run)
        if rows:
            path = store.partition_dir(results, table, when) / f"{invocation}.parquet"
            path.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(store.to_table(rows, table), path)


def make_store(path: Path, invocations: int, every_hours: float = 11.0) -> Path:
    for index in range(invocations):
        write_invocation(path, index, FIRST + timedelta(hours=every_hours * index))
    for file in path.rglob("*.parquet"):
        os.utime(file, (OLD, OLD))
    return path


def frames(results: Path) -> dict[str, pd.DataFrame]:
    """Every table, its rows in an order that does not depend on the files they came from."""
    found = {}
    for table in TABLES:
        frame = store.load_table(results, table)
        order = sorted(range(len(frame)), key=lambda i: repr(tuple(frame.iloc[i])))
        found[table] = frame.iloc[order].reset_index(drop=True)
    return found


def assert_same(expected: dict[str, pd.DataFrame], results: Path) -> None:
    for table, frame in frames(results).items():
        pd.testing.assert_frame_equal(frame, expected[table], obj=table)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, pd.DataFrame]]:
    """A store of :data:`INVOCATIONS` invocations, and its frames before any compaction."""
    path = make_store(tmp_path_factory.mktemp("store") / "results", INVOCATIONS)
    return path, frames(path)


def copy_store(source: Path, target: Path) -> Path:
    shutil.copytree(source, target, copy_function=shutil.copy2)  # modification times kept
    return target


def test_200_invocations_compacted_give_the_same_frames_and_every_reader_reads_them(
    built: tuple[Path, dict[str, pd.DataFrame]], tmp_path: Path
) -> None:
    results = copy_store(built[0], tmp_path / "results")
    before = {table: len(store.parquet_files(results, table)) for table in TABLES}
    assert before["runs"] == INVOCATIONS

    done = tpubench("compact --older-than 0 --results", str(results))
    assert done.returncode == 0, done.stderr
    assert "runs: 200 file(s) -> 3 (3 month(s) rewritten, 400 rows" in done.stdout
    assert_same(built[1], results)
    for table in ("runs", "steps", "ops", "compiles", "memory"):
        files = store.parquet_files(results, table)
        assert len(files) == 3 and all(store.is_compacted(path) for path in files), (table, files)
    # nothing else is left in the table folders: no covered file, no empty partition, no debris
    assert sorted(p.name for p in (results / "runs").iterdir()) == [
        "_compacted", "date=2026-06", "date=2026-07", "date=2026-08"]  # fmt: skip

    # pandas, pyarrow datasets and DuckDB read the folders as docs/schema.md says, every row once
    runs = pd.read_parquet(results / "runs")
    assert sorted(runs.run_id) == sorted(built[1]["runs"].run_id)
    assert set(runs["date"].astype(str)) == {"2026-06", "2026-07", "2026-08"}
    assert ds.dataset(results / "steps", partitioning="hive").count_rows() == len(built[1]["steps"])
    glob = f"read_parquet('{results}/ops/*/*.parquet', hive_partitioning=true, union_by_name=true)"
    assert duckdb.sql(f"select count(*) from {glob}").fetchall() == [(len(built[1]["ops"]),)]
    # scan_table's invocation filter still finds an invocation inside a compacted file
    invocation = built[1]["runs"].invocation_id.iloc[7]
    assert len(store.scan_table(results, "runs", ["run_id"], invocation_id=[invocation])) == 2

    # idempotent: nothing new, nothing rewritten
    kept = {path: os.stat(path).st_ino for path in store.parquet_files(results, "steps")}
    again = in_process("compact --older-than 0 --results", results)
    assert again.returncode == 0 and "steps: 3 file(s) -> 3 (0 month(s) rewritten" in again.stdout
    assert {path: os.stat(path).st_ino for path in store.parquet_files(results, "steps")} == kept

    # a later night is merged into its month's compacted file, and the frames still match
    write_invocation(results, 999, datetime(2026, 7, 30, 3, 0, tzinfo=UTC))
    assert len(store.parquet_files(results, "runs")) == 4
    assert in_process("compact --older-than 0 --table runs --results", results).returncode == 0
    assert len(store.parquet_files(results, "runs")) == 3
    assert len(store.load_runs(results)) == len(built[1]["runs"]) + 2


def test_an_old_store_loads_and_compacts_on_request(tmp_path: Path) -> None:
    """Files of schema version 0 and 1 (columns missing, a decode row's old tokens/s) merged
    with current ones: the loaded frame, upgrade included, is the same."""
    results = make_store(tmp_path / "results", 3, every_hours=1)
    old_schema = pa.schema([field for field in RUNS if field.name not in ("mfu", "tags", "devices", "seed")])
    rows = [
        {"run_id": "v0", "invocation_id": "old0", "status": "ok", "schema_version": 0, "median_step_ms": 2.0},
        {"run_id": "v1", "invocation_id": "old1", "status": "ok", "schema_version": 1, "mode": "decode",
         "tokens_per_s": 900.0, "output_tokens_per_s": 300.0},
    ]  # fmt: skip
    for row in rows:
        path = results / "runs" / "date=2026-06-01" / f"{row['invocation_id']}.parquet"
        pq.write_table(pa.Table.from_pylist([row], schema=old_schema), path)
        os.utime(path, (OLD, OLD))
    expected = frames(results)
    assert expected["runs"].set_index("run_id").loc["v1", "tokens_per_s"] == 300.0
    assert in_process("compact --results", results).returncode == 0  # the default --older-than: 1h
    assert [Path(p).name.startswith("compacted-") for p in store.parquet_files(results, "runs")] == [True]
    assert_same(expected, results)


WRITER = textwrap.dedent("""
    import sys
    from datetime import UTC, datetime
    from tpubench import store
    # 10 runs in one invocation, its file rewritten after each, and 10 invocations of one run,
    # all in a month the compactions are rewriting
    when = datetime(2026, 7, 5, 3, 0, tzinfo=UTC)
    writer = store.InvocationWriter(sys.argv[1], "live-long", when)
    for i in range(10):
        writer.add({"run_id": f"long{i}", "invocation_id": "live-long", "status": "ok"})
        store.InvocationWriter(sys.argv[1], f"live-{i}", when).add(
            {"run_id": f"short{i}", "invocation_id": f"live-{i}", "status": "ok"})
        print(i, flush=True)
""")
COMPACTOR = textwrap.dedent("""
    import sys
    from pathlib import Path
    from tpubench import store_compact
    rounds = 0
    while not Path(sys.argv[2]).exists() or rounds < 2:
        store_compact.compact(sys.argv[1], older_than_s=600)
        rounds += 1
        print(rounds, flush=True)
""")


def test_a_writer_storing_20_runs_while_compactions_run_loses_none(tmp_path: Path) -> None:
    results = make_store(tmp_path / "results", 20, every_hours=100)
    before = len(store.load_runs(results))
    done = tmp_path / "writer-done"
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    compactor = subprocess.Popen(
        [sys.executable, "-c", COMPACTOR, str(results), str(done)], stdout=subprocess.PIPE, text=True, env=environment
    )
    try:  # the writer starts with the first compaction, which merges the month it writes into
        writer = subprocess.run(
            [sys.executable, "-c", WRITER, str(results)], capture_output=True, text=True, env=environment, timeout=120
        )
        assert writer.returncode == 0, writer.stderr
        done.touch()
        assert compactor.wait(timeout=120) == 0
    finally:
        compactor.kill()
        compactor.wait()
    runs = store.load_runs(results)
    written = {f"long{i}" for i in range(10)} | {f"short{i}" for i in range(10)}
    assert sorted(runs.run_id[runs.run_id.isin(written)]) == sorted(written)  # each once
    assert len(runs) == before + 20
    # once they are old enough, the writer's files join their month like any other
    for path in results.rglob("live-*.parquet"):
        os.utime(path, (OLD, OLD))
    assert in_process("compact --results", results).returncode == 0
    assert len(store.parquet_files(results, "runs")) == 3 and len(store.load_runs(results)) == len(runs)


KILLED = textwrap.dedent("""
    import sys, time
    from tpubench import store_compact
    print("start", flush=True)
    started = time.perf_counter()
    store_compact.compact(sys.argv[1], older_than_s=0)
    print(time.perf_counter() - started, flush=True)
""")


def kill_loop(base: Path, work: Path, expected: dict[str, pd.DataFrame], tries: int, seed: int) -> None:
    """Compact a copy of ``base`` ``tries`` times, SIGKILLed a random moment after it started
    (within the time a whole compaction takes), each time on the store the last one left."""
    rng = random.Random(seed)
    results = copy_store(base, work)
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    probe = copy_store(base, work.with_name("probe"))
    timed = subprocess.run([sys.executable, "-c", KILLED, str(probe)], env=environment, capture_output=True, text=True)
    whole = float(timed.stdout.split()[-1])  # from its start to its end, imports left out
    for attempt in range(tries):
        if attempt % 3 == 0:  # new small files now and then: a later compaction has work again
            write_invocation(results, 5000 + attempt, FIRST + timedelta(days=rng.randrange(90)))
            expected = frames(results)
        process = subprocess.Popen(
            [sys.executable, "-c", KILLED, str(results)], stdout=subprocess.PIPE, text=True, env=environment
        )
        assert process.stdout.readline().strip() == "start"
        try:
            process.wait(timeout=rng.uniform(0, whole))
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGKILL)
        process.wait()
        process.stdout.close()
        assert_same(expected, results)  # every row once, whichever moment it died at
    assert subprocess.run([sys.executable, "-c", KILLED, str(results)], env=environment).returncode == 0
    assert_same(expected, results)
    leftovers = [
        p for p in results.rglob("*")
        if p.is_file() and ((p.name.startswith(".") and p.name != ".tpubench-compact.lock") or p.suffix == ".tmp")
    ]  # fmt: skip
    assert not leftovers
    for table in TABLES:  # the crashed ones' outputs and covered files are gone: what a glob reads is the store
        listed = sorted(str(p) for p in (results / table).glob("date=*/*.parquet"))
        assert listed == store.parquet_files(results, table), table


def test_a_compaction_killed_at_random_moments_leaves_every_row_once(tmp_path: Path) -> None:
    base = make_store(tmp_path / "base", 16, every_hours=130)
    kill_loop(base, tmp_path / "results", frames(base), tries=4, seed=1)


@pytest.mark.nightly
def test_a_compaction_killed_at_random_moments_many_times(tmp_path: Path) -> None:
    base = make_store(tmp_path / "base", 200, every_hours=11)
    kill_loop(base, tmp_path / "results", frames(base), tries=60, seed=2)


def test_bad_input_is_one_error_line_and_changes_nothing(tmp_path: Path) -> None:
    (tmp_path / "not-a-store").mkdir()
    (tmp_path / "not-a-store" / "notes.txt").write_text("hello")
    (tmp_path / "file").write_text("x")
    results = make_store(tmp_path / "results", 2, every_hours=1)
    snapshot = sorted(str(p) for p in tmp_path.rglob("*"))
    cases = {
        f"compact --results {tmp_path / 'not-a-store'}": "not a results store",
        f"compact --results {tmp_path / 'missing'}": "no such directory",
        f"compact --results {tmp_path / 'file'}": "not a directory",
        f"compact --results {results / 'runs'}": "is the runs/ folder of a results store",
        f"compact --results {results} --table nonsense": "unknown table 'nonsense'; valid: runs, steps",
        f"compact --results {results} --older-than soon": "--older-than expects a duration",
    }
    for line, message in cases.items():
        done = in_process(line)
        assert done.returncode == 2 and done.stderr.startswith("error: ") and message in done.stderr, (line, done)
        assert len(done.stderr.strip().splitlines()) == 1 and not done.stdout
    assert sorted(str(p) for p in tmp_path.rglob("*")) == snapshot
    real = tpubench("compact --results", str(tmp_path / "not-a-store"))
    assert real.returncode == 2 and real.stderr.startswith("error:") and "Traceback" not in real.stderr


def test_a_store_that_cannot_be_written_is_refused(tmp_path: Path) -> None:
    results = make_store(tmp_path / "results", 2, every_hours=1)
    if os.geteuid() == 0:
        pytest.skip("root writes into a read-only folder")
    results.chmod(0o555)
    try:
        done = in_process("compact --older-than 0 --results", results)
    finally:
        results.chmod(0o755)
    assert done.returncode == 2 and "cannot write there" in done.stderr
    assert len(store.parquet_files(results, "runs")) == 2
