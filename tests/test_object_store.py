"""Results in object storage, against a real S3-compatible server (moto's) on 127.0.0.1.

Not a mock of the client: s3fs talks HTTP to a server this test starts, and the CLI, the
store, pandas and DuckDB all go through it. The endpoint reaches every process through
fsspec's environment configuration (``FSSPEC_S3_ENDPOINT_URL``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import warnings
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb
import pandas as pd
import pytest
from helpers import ROOT, in_process, tpubench, wait_for

from tpubench import store

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("s3fs") is None or shutil.which("moto_server") is None,
    reason="install the [cloud] extra and moto[server]",
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def accepting(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture(scope="module")
def s3() -> Iterator[str]:
    """A moto S3 server on 127.0.0.1 with one bucket; yields the bucket's URL."""
    port = free_port()
    server = subprocess.Popen(
        [shutil.which("moto_server"), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    saved = dict(os.environ)
    os.environ.update(
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION="us-east-1",
        FSSPEC_S3_ENDPOINT_URL=f"http://127.0.0.1:{port}",
    )
    try:
        wait_for(lambda: accepting(port), "the S3 server's port", timeout=60)
        import fsspec

        fsspec.config.set_conf_env(fsspec.config.conf)  # this process read the environment at import
        fs = fsspec.filesystem("s3", skip_instance_cache=True)
        fs.mkdir("tpubench-results")
        yield "s3://tpubench-results"
    finally:
        server.kill()
        server.wait()
        os.environ.clear()
        os.environ.update(saved)


def test_a_run_writes_to_the_bucket_and_every_reader_reads_it(s3: str) -> None:
    results = f"{s3}/nightly"
    result = tpubench(
        f"run --workload gpt2 --backend cpu --mode infer --steps 2 --warmup 1 --profile --results {results}"
    )
    assert result.returncode == 0, result.stderr
    [row] = store.load_runs(results).to_dict("records")
    assert row["status"] == "ok" and row["median_step_ms"] > 0
    assert len(store.load_steps(results, run_id=row["run_id"], phase="measure")) == 2
    location = store.Location(results)
    assert row["trace_path"].startswith(f"{results}/traces/{row['run_id']}/")
    assert location.fs.exists(row["trace_path"])  # uploaded from the worker's staging folder
    assert not [p for p in Path(os.environ.get("TMPDIR", "/tmp")).glob("tpubench-trace-*")]

    # pandas through fsspec (pyarrow's own S3 client would ask AWS where the bucket is)
    frame = pd.read_parquet(location.join("runs"), filesystem=location.fs)
    assert list(frame.run_id) == [row["run_id"]]
    connection = duckdb.connect()
    connection.register_filesystem(location.fs)
    count = connection.sql(f"select count(*) from read_parquet('{results}/runs/*/*.parquet', hive_partitioning=true)")
    assert count.fetchall() == [(1,)]


def test_a_bucket_that_cannot_be_written_is_refused_before_anything_runs(s3: str) -> None:
    result = in_process("run --workload gpt2 --backend cpu --mode infer --results s3://no-such-bucket/x")
    assert result.returncode == 2 and result.stderr.startswith("error: --results s3://no-such-bucket/x: cannot write")


WRITER = textwrap.dedent("""
    import sys
    from datetime import UTC, datetime
    from tpubench import store
    writer = store.InvocationWriter(sys.argv[1], "victim", datetime(2026, 12, 1, tzinfo=UTC))
    big = "x" * 2_000_000
    i = 0
    while True:
        writer.add({"run_id": f"r{i}", "status": "ok", "error": big, "stderr_tail": big})
        print(i, flush=True)
        i += 1
""")


@pytest.mark.parametrize("uploads_before_kill", [1, 3])
def test_an_upload_cut_short_leaves_no_readable_partial_file(s3: str, uploads_before_kill: int) -> None:
    """SIGKILL a writer mid-upload (each file carries MBs): readers see the last whole file."""
    results = f"{s3}/torn-{uploads_before_kill}"
    process = subprocess.Popen([sys.executable, "-c", WRITER, results], stdout=subprocess.PIPE, text=True)
    for _ in range(uploads_before_kill):
        assert process.stdout.readline(), "the writer died before its announced uploads"
    process.send_signal(signal.SIGKILL)
    process.wait()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no object may be unreadable
        runs = store.load_runs(results)
    assert len(runs) >= uploads_before_kill


def test_report_and_ops_read_the_bucket_like_a_directory(s3: str, tmp_path: Path) -> None:
    results = f"{s3}/shared"
    line = "run --workload gpt2 --backend cpu --mode infer --steps 2 --warmup 1 --profile --results"
    assert tpubench(line, results).returncode == 0
    report = tmp_path / "report.html"
    made = tpubench("report --results", results, "--out", str(report))
    assert made.returncode == 0, made.stderr
    assert "gpt2" in report.read_text()
    [run_id] = store.load_runs(results).run_id
    ops = tpubench(f"ops {run_id} --json --results", results)
    assert ops.returncode == 0, ops.stderr
    assert run_id in ops.stdout or '"op"' in ops.stdout


def test_compare_and_the_dashboard_read_the_bucket_like_a_directory(s3: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from streamlit.testing.v1 import AppTest

    from dashboard import RESULTS_ENV

    results = f"{s3}/nights"
    line = "run --workload gpt2 --size tiny --backend cpu --mode infer --steps 3 --warmup 1 --results"
    for night in ("1", "2"):
        done = tpubench(line, results, "--tag", f"night={night}")
        assert done.returncode == 0, done.stderr
    compared = tpubench("compare --baseline tag.night=1 --candidate tag.night=2 --json --results", results)
    assert compared.returncode == 0, compared.stderr
    comparison = json.loads(compared.stdout)["comparison"]
    assert {row["workload"] for row in comparison} == {"gpt2"} and "step" in {row["metric"] for row in comparison}

    monkeypatch.setenv(RESULTS_ENV, results)  # what `tpubench dashboard --results s3://...` sets
    app = AppTest.from_file(str(ROOT / "dashboard" / "app.py"), default_timeout=120)
    app.run()
    assert not app.exception and not app.error, (app.exception or app.error)[0].value
    assert app.title[0].value == "Overview"
    latest = store.load_runs(results).sort_values("started_at")["invocation_id"].iloc[-1]
    assert app.selectbox(key="invocation").value == latest


def test_a_bucket_store_compacts_atomically_and_every_reader_reads_it(s3: str) -> None:
    """In a bucket the commit is the manifest's one PUT: the frames are the same after, pandas
    and DuckDB read the compacted layout through fsspec, and a second compaction does nothing."""
    results = f"{s3}/compacted"
    for night in range(6):
        when = datetime(2026, 10, 1, 3, tzinfo=UTC) + timedelta(days=9 * night)  # October and November
        invocation = f"night{night}"
        writer = store.InvocationWriter(results, invocation, when)
        for number in range(2):
            run_id = f"{invocation}-{number}"
            ids = {"run_id": run_id, "invocation_id": invocation}
            writer.add({**ids, "status": "ok", "started_at": when}, steps=[{**ids, "step": 0, "step_ms": 1.0 + night}])
    before = {
        table: store.load_table(results, table).sort_values("run_id", ignore_index=True) for table in ("runs", "steps")
    }
    done = in_process("compact --older-than 0 --results", results)
    assert done.returncode == 0, done.stderr
    assert "runs: 6 file(s) -> 2 (2 month(s) rewritten, 12 rows" in done.stdout
    for table, frame in before.items():
        pd.testing.assert_frame_equal(store.load_table(results, table).sort_values("run_id", ignore_index=True), frame)
    location = store.Location(results)
    names = sorted(path.rsplit("/", 1)[-1] for path in location.fs.find(location.join("runs")))
    assert [name.split("-")[0] for name in names if not name.endswith(".json")] == [
        "compacted"
    ] * 2  # nothing covered left
    assert len(names) == 3
    assert len(pd.read_parquet(location.join("runs"), filesystem=location.fs)) == 12
    connection = duckdb.connect()
    connection.register_filesystem(location.fs)
    count = connection.sql(f"select count(*) from read_parquet('{results}/steps/*/*.parquet', hive_partitioning=true)")
    assert count.fetchall() == [(12,)]
    again = in_process("compact --older-than 0 --results", results)
    assert again.returncode == 0 and "runs: 2 file(s) -> 2 (0 month(s) rewritten" in again.stdout


def test_compacting_a_bucket_without_write_access_is_refused_and_changes_nothing(s3: str) -> None:
    """A bucket whose policy denies writes (moto enforces it): one error line, exit 2."""
    import boto3

    client = boto3.client("s3", endpoint_url=os.environ["FSSPEC_S3_ENDPOINT_URL"])
    client.create_bucket(Bucket="read-only-results")
    results = "s3://read-only-results/store"
    store.InvocationWriter(results, "only", datetime(2026, 10, 1, tzinfo=UTC)).add({"run_id": "r", "status": "ok"})
    denied = {"Effect": "Deny", "Principal": "*", "Action": ["s3:PutObject", "s3:DeleteObject"],
              "Resource": "arn:aws:s3:::read-only-results/*"}  # fmt: skip
    client.put_bucket_policy(
        Bucket="read-only-results", Policy=json.dumps({"Version": "2012-10-17", "Statement": [denied]})
    )
    location = store.Location(results)
    listed = sorted(location.fs.find(location.root))
    done = in_process("compact --older-than 0 --results", results)
    assert done.returncode == 2 and done.stderr.startswith(f"error: --results {results}: cannot write there")
    assert len(done.stderr.strip().splitlines()) == 1
    location.fs.invalidate_cache()
    assert sorted(location.fs.find(location.root)) == listed
    missing = in_process("compact --results s3://no-such-bucket/x")
    assert missing.returncode == 2 and "not a results store" in missing.stderr


def test_the_run_index_of_a_bucket_reads_only_new_objects(s3: str, opened: list[str]) -> None:
    """The index kept between processes works in a bucket as on a disk: the same rows as a full
    read, and a later process opens only the objects written since (their identity is the
    listing's size and ETag: no request per object)."""
    from tpubench import store_index

    results = f"{s3}/indexed"
    when = datetime(2026, 12, 1, tzinfo=UTC)
    for night in ("one", "two"):
        store.InvocationWriter(results, night, when).add({"run_id": night, "invocation_id": night, "status": "ok"})
    columns = store_index.RUN_COLUMNS
    frame = store_index.read_index(results, "runs", columns).drop(columns=store_index.FILE)
    expected = store.scan_table(results, "runs", columns)
    pd.testing.assert_frame_equal(frame.sort_values("run_id", ignore_index=True), expected)
    store.InvocationWriter(results, "three", when).add({"run_id": "three", "invocation_id": "three", "status": "ok"})
    opened.clear()  # the reads above are not the one this test counts
    store_index.forget()
    assert sorted(store_index.read_index(results, "runs", columns)["run_id"]) == ["one", "three", "two"]
    assert [path.rsplit("/", 1)[-1] for path in opened] == ["three.parquet"]


def test_a_buckets_files_are_read_with_one_request_each(s3: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bucket's small files are fetched whole, one GET each, with the same rows: pyarrow's
    reader made two in turn for a file over 64 KiB (its footer, then the rest). Files held at
    once are bounded (store.FETCHED_BYTES). An object gone since the listing is named in a
    warning and the others are read."""
    results = f"{s3}/one-get"
    when = datetime(2026, 12, 1, tzinfo=UTC)
    for night in ("one", "two", "three"):  # 4,000 runs: a file of about 130 KiB
        rows = [{"run_id": f"{night}-{i}", "invocation_id": night, "status": "ok", "mfu": i / 7} for i in range(4000)]
        store.InvocationWriter(results, night, when).add_rows({"runs": rows})
    location = store.Location(results)
    paths = store.parquet_files(results, "runs")
    gets: list[str] = []
    location.fs.s3.meta.events.register("before-send.s3.GetObject", lambda request, **_: gets.append(request.url))
    found = store.scan_files(location, "runs", paths, ["run_id", "mfu"], with_file=True).to_pandas()
    assert len(gets) == 3
    assert len(found) == 12000 and found["mfu"].sum() == pytest.approx(3 * sum(i / 7 for i in range(4000)))
    assert (found["__file"].str.rsplit("/", n=1).str[-1] == found["run_id"].str.split("-").str[0] + ".parquet").all()
    monkeypatch.setattr(store, "FETCHED_BYTES", sum(location.fs.sizes(paths[:2])))  # two files at a time
    fetches: list[int] = []
    cat = location.fs.cat
    monkeypatch.setattr(location.fs, "cat", lambda paths, **kwargs: fetches.append(len(paths)) or cat(paths, **kwargs))
    in_batches = store.scan_files(location, "runs", paths, ["run_id", "mfu"], with_file=True).to_pandas()
    pd.testing.assert_frame_equal(in_batches, found)
    assert fetches == [2, 1] and len(gets) == 6
    location.fs.rm(paths[0])  # its listing is kept: the read still asks for it
    with pytest.warns(store.StoreWarning, match=f"skipping unreadable results file s3://{paths[0]}"):
        found = store.scan_table(results, "runs", ["invocation_id"], paths=paths)
    assert sorted(set(found["invocation_id"])) == sorted(path.rsplit("/", 1)[-1][:-8] for path in paths[1:])
