"""Compaction: a table's many small files merged into one file per month (``tpubench compact``).

The store writes one file per invocation and table, which is what keeps concurrent writers
apart and a crash's loss to one run; but a year of a fleet's nights is 20,000 files, and every
file costs a reader an open (a request, in a bucket). Compaction merges, per table and month,
the invocations' files untouched for ``older_than`` seconds (so never a file a running
invocation still rewrites) and the month's earlier compacted file into
``TABLE/date=YYYY-MM/compacted-<commit>.parquet``, as Delta Lake's OPTIMIZE or Iceberg's
rewrite_data_files do.

The commit is one manifest per table (``TABLE/_compacted/<commit>.json``), written whole by
one rename on a local disk and by one PUT in a bucket, which has no rename: before it,
:func:`tpubench.store.parquet_files` lists the old files and ignores the new ones; after it,
the new ones and not the files they cover. Only then are the covered files removed. A
compaction killed at any moment leaves either state, plus debris that readers ignore and the
next compaction removes (:func:`clean`). Local compactions of one store take turns (a lock
file); in a bucket, run one at a time (the nightly job is the one that compacts).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import multiprocessing
import os
import signal
import time
import uuid
import warnings
from collections import defaultdict
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tpubench import store
from tpubench.schema import TABLES

#: the lock file of a local store's compactions (a hidden file: no reader's glob sees it)
LOCK = ".tpubench-compact.lock"
#: a bucket has no lock: an uncommitted compacted file younger than this may be a running
#: compaction's, so only older ones are removed as debris
BUCKET_GRACE_S = 3600.0
#: the format of a manifest, stored in it
MANIFEST_FORMAT = 1
#: a bucket's files read at once while merging a month
READERS = 8
#: processes compacting tables at once on a local store (each table is its own commit)
MAX_WORKERS = 4


@dataclass(frozen=True)
class Compacted:
    """What compacting one table did."""

    table: str
    files_before: int
    files_after: int
    months: int
    rows: int
    bytes_written: int
    seconds: float
    skipped: tuple[str, ...] = ()


def month_of(relative: str) -> str:
    """``YYYY-MM`` of a file's partition folder (``date=YYYY-MM-DD`` or a compacted ``date=YYYY-MM``)."""
    return relative.split("/", 1)[0].removeprefix("date=")[:7]


def is_store(location: store.Location) -> bool:
    """Whether ``location`` holds a results store: at least one table's folder."""
    if location.remote:
        try:
            names = {path.rstrip("/").rsplit("/", 1)[-1] for path in location.fs.ls(location.root, detail=False)}
        except (FileNotFoundError, PermissionError, OSError):
            return False
        return bool(names & set(TABLES))
    return any(Path(location.root, table).is_dir() for table in TABLES)


@contextlib.contextmanager
def locked(location: store.Location) -> Iterator[None]:
    """Hold the store's compaction lock (local stores; the kernel releases it if we die)."""
    if location.remote:
        yield
        return
    with open(Path(location.root) / LOCK, "a+b") as stream:
        fcntl.flock(stream.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(stream.fileno(), fcntl.LOCK_UN)


def compact(
    results: str | Path,
    tables: Sequence[str] = tuple(TABLES),
    older_than_s: float = 3600.0,
    now: float | None = None,
) -> list[Compacted]:
    """Compact ``tables`` of the store ``results``: per month, the invocations' files last
    written ``older_than_s`` or more ago, with the month's compacted file. Idempotent: a month
    with nothing new to merge is left as it is."""
    location = store.Location(results)
    cutoff = (time.time() if now is None else now) - older_than_s
    with locked(location):
        workers = min(len(tables), os.cpu_count() or 1, MAX_WORKERS)
        if workers < 2 or location.remote:
            return [compact_table(location, table, cutoff) for table in tables]
        # tables are independent (a commit each), and reading a disk's small files is CPU: one
        # process per core. Forked, they hold the lock with us, and die with us (a SIGKILL too)
        context = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(workers, mp_context=context, initializer=_die_with_parent) as pool:
            done = pool.map(compact_table, [location] * len(tables), tables, [cutoff] * len(tables))
            return list(done)


def _die_with_parent() -> None:
    """Have the kernel end this worker when the process that started it dies (Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def compact_table(location: store.Location, table: str, cutoff: float) -> Compacted:
    started = time.perf_counter()
    clean(location, store.table_state(location, table))
    state = store.table_state(location, table)
    before = state.live
    by_month: dict[str, list[str]] = defaultdict(list)
    for path in before:
        by_month[month_of(state.relative(path))].append(path)
    plans = {}
    for month, paths in by_month.items():
        small = [path for path in paths if not store.is_compacted(path) and state.stat(path)[1] <= cutoff]
        earlier = [path for path in paths if store.is_compacted(path)]
        if small:  # every file old enough joins its month's compacted file, a month's only one too
            plans[month] = sorted(earlier) + sorted(small)  # an invocation's newer version last
    if not plans:
        return Compacted(table, len(before), len(before), 0, 0, 0, time.perf_counter() - started)
    commit = new_commit()
    outputs: dict[str, dict] = {}
    rows = written = 0
    skipped = []
    for month, inputs in sorted(plans.items()):
        covers = {}
        for path in inputs:  # each version's identity before it is read: a newer version stays live
            relative = state.relative(path)
            if store.is_compacted(relative):
                covers |= covers_of(state, path)
            else:
                covers[relative] = store.signature(*state.stat(path))
        merged, unread = merge(location, inputs)
        for path in unread:
            covers.pop(state.relative(path))
        if merged is None:
            continue
        relative = f"date={month}/{store.COMPACTED_PREFIX}{commit}.parquet"
        written += write_output(location, location.join(table, *relative.split("/")), merged)
        outputs[relative] = {"rows": merged.num_rows, "covers": covers}
        rows += merged.num_rows
    changed = changed_since(location, table, outputs)
    for relative in changed:  # a writer replaced a file while it was merged: that month waits
        skipped.append(month_of(relative))
        remove(location, location.join(table, *relative.split("/")))
        rows -= outputs.pop(relative)["rows"]
    if outputs:
        commit_manifest(location, table, commit, outputs)
    clean(location, store.table_state(location, table))
    after = len(store.table_state(location, table).live)
    return Compacted(
        table, len(before), after, len(outputs), rows, written, time.perf_counter() - started, tuple(skipped)
    )


def new_commit() -> str:
    """A commit's id: its UTC start, then random hex (unique: stores merged by copying keep both)."""
    return f"{datetime.now(UTC):%Y%m%dT%H%M%S%f}-{uuid.uuid4().hex[:8]}"


def commit_manifest(location: store.Location, table: str, commit: str, outputs: dict[str, dict]) -> None:
    """The commit: the manifest naming ``outputs`` and what each covers, written whole."""
    manifest = {
        "format": MANIFEST_FORMAT,
        "table": table,
        "commit": commit,
        "created_at": datetime.now(UTC).isoformat(),
        "outputs": outputs,
    }
    store.write_bytes(location, location.join(table, store.MANIFESTS, f"{commit}.json"), json.dumps(manifest).encode())


def covers_of(state: store.TableState, path: str) -> dict[str, str]:
    """What a compacted file covers, itself included: what a file that replaces it covers."""
    relative = state.relative(path)
    return {**state.manifests[state.outputs[relative]]["outputs"][relative]["covers"], relative: ""}


def replace_run_ops(results: str | Path, run: dict, rows: list[dict]) -> Path | str:
    """Replace ``run``'s rows of the ops table by ``rows`` (``tpubench ops --ingest``); returns
    the file written.

    They live in the ops file of the run's invocation, next to its runs file (same date
    partition), rewritten atomically with the other runs' rows as they were; or, once that
    file was compacted, in its month's compacted file, which is rewritten the same way and
    committed as a compaction is (a new file and a manifest that covers the old one).
    """
    invocation = run["invocation_id"]
    location = store.Location(results)
    fresh = store.to_table([{"run_id": run["run_id"], "invocation_id": invocation, **row} for row in rows], "ops")
    with locked(location):
        runs = store.table_state(location, "runs")
        name = f"{invocation}.parquet"
        found = [runs.relative(p) for p in runs.files if p.endswith(f"/{name}")] + [
            relative for relative in runs.covered if relative.endswith(f"/{name}")
        ]
        if not found:
            raise store.StoreError(f"no runs file for invocation {invocation!r} under {results}")
        relative = f"{found[0].split('/')[0]}/{name}"
        state = store.table_state(location, "ops")
        path = location.join("ops", *relative.split("/"))
        compacted = [
            p for p in state.live if store.is_compacted(p) and month_of(state.relative(p)) == month_of(relative)
        ]
        if relative not in state.covered or path in state.live or not compacted:
            kept = store.TABLES["ops"].empty_table()
            if location.fs.exists(path):
                kept = location.read_table(path)
                kept = kept.filter(pc.not_equal(kept["run_id"], run["run_id"]))
            location.write_table(pa.concat_tables([kept, fresh], promote_options="permissive"), path)
            return Path(path) if not location.remote else location.display(path)
        [old] = compacted
        table = location.read_table(old)
        table = table.filter(pc.not_equal(table["run_id"], run["run_id"]))
        merged = pa.concat_tables([table, fresh], promote_options="permissive")
        commit = new_commit()
        output = f"date={month_of(relative)}/{store.COMPACTED_PREFIX}{commit}.parquet"
        target = location.join("ops", *output.split("/"))
        write_output(location, target, merged)
        commit_manifest(location, "ops", commit, {output: {"rows": merged.num_rows, "covers": covers_of(state, old)}})
        clean(location, store.table_state(location, "ops"))
        return Path(target) if not location.remote else location.display(target)


def merge(location: store.Location, inputs: list[str]) -> tuple[pa.Table | None, list[str]]:
    """The rows of ``inputs`` in their order as one table (their schemas unified as the
    readers unify them), and the inputs that could not be read (left as they are)."""

    def read(path: str) -> pa.Table | None:
        try:  # on a disk, ParquetFile: a third of read_table's time on a small file (no dataset set up)
            return location.read_table(path) if location.remote else pq.ParquetFile(path).read()
        except (pa.ArrowException, OSError) as error:
            warnings.warn(
                f"not compacted, unreadable: {location.display(path)}: {error}", store.StoreWarning, stacklevel=2
            )
            return None

    if location.remote:  # a bucket's reads wait on the network: several at once
        with ThreadPoolExecutor(READERS) as pool:
            tables = list(pool.map(read, inputs))
    else:  # a disk's are CPU (the footer's parse), which threads did not speed up
        tables = [read(path) for path in inputs]
    unread = [path for path, table in zip(inputs, tables, strict=True) if table is None]
    found = [table for table in tables if table is not None]
    if not found:
        return None, unread
    return pa.concat_tables(found, promote_options="permissive"), unread


def write_output(location: store.Location, path: str, table: pa.Table) -> int:
    """Write a compacted file at its final name, readable whole, and return its size. Until
    the manifest names it, readers of the store ignore it (a crashed compaction's debris)."""
    if location.remote:
        buffer = pa.BufferOutputStream()
        pq.write_table(table, buffer)
        data = buffer.getvalue().to_pybytes()
        location.fs.pipe_file(path, data)
        return len(data)
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.with_name(f".{target.name}.tmp")  # hidden from every glob until renamed
    try:
        pq.write_table(table, temporary)
        with open(temporary, "rb+") as stream:
            os.fsync(stream.fileno())
        os.replace(temporary, target)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return target.stat().st_size


def changed_since(location: store.Location, table: str, outputs: dict[str, dict]) -> list[str]:
    """The outputs one of whose invocations' files is no longer the version merged."""
    state = store.table_state(location, table)
    listed = {state.relative(path): path for path in state.files}
    changed = []
    for output, about in outputs.items():
        for relative, identity in about["covers"].items():
            if identity and relative in listed and store.signature(*state.stat(listed[relative])) != identity:
                changed.append(output)
                break
    return changed


def clean(location: store.Location, state: store.TableState) -> None:
    """Remove what no reader reads: files a committed manifest covers (an invocation's file
    only in the version it covers), compacted files no manifest names (a crashed
    compaction's), their hidden temporaries, and manifests whose outputs are all covered and
    gone (each later manifest repeats what they covered)."""
    now = time.time()
    gone = set()
    for path in state.files:
        relative = state.relative(path)
        if relative in state.outputs:
            debris = relative in state.covered
        elif store.is_compacted(relative):
            debris = not location.remote or now - state.stat(path)[1] > BUCKET_GRACE_S
        else:
            try:
                debris = store.signature(*state.stat(path)) == state.covered.get(relative)
            except FileNotFoundError:
                debris = False
        if debris:
            remove(location, path)
            gone.add(relative)
    if not location.remote:
        for folder in {Path(state.folder, relative.split("/", 1)[0]) for relative in gone}:
            if folder.name[5:] < f"{datetime.now(UTC) - timedelta(days=2):%Y-%m-%d}":  # no writer starts there now
                with contextlib.suppress(OSError):  # not empty
                    folder.rmdir()
        for temporary in Path(state.folder).glob(f"date=*/.{store.COMPACTED_PREFIX}*.tmp"):
            temporary.unlink(missing_ok=True)
        for temporary in Path(state.folder, store.MANIFESTS).glob(".*.tmp"):
            # append_store's may be in flight (it takes no lock): only a dead writer's goes at once
            if not writer_alive(temporary) or now - temporary.stat().st_mtime > BUCKET_GRACE_S:
                temporary.unlink(missing_ok=True)
    present = {state.relative(path) for path in state.files} - gone
    for name, manifest in state.manifests.items():
        outputs = manifest.get("outputs", {})
        if all(output in state.covered and output not in present for output in outputs):
            remove(location, name)


def writer_alive(temporary: Path) -> bool:
    """Whether the process that writes ``temporary`` (``.NAME.PID.tmp``, as
    :func:`tpubench.store.write_bytes` names it) may still be running: a killed compaction's
    manifest is debris at once, not after the grace (its writer held the lock this one holds)."""
    try:
        os.kill(int(temporary.name.rsplit(".", 2)[-2]), 0)
    except ProcessLookupError:
        return False
    except (ValueError, PermissionError, OverflowError):  # not our naming, or another user's process
        return True
    return True


def remove(location: store.Location, path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        if location.remote:
            location.fs.rm_file(path)
        else:
            os.unlink(path)


def mergeable(results: str | Path, older_than_s: float = 3600.0) -> int:
    """How many invocations' files a compaction would merge now (``tpubench ci``'s threshold)."""
    location = store.Location(results)
    cutoff = time.time() - older_than_s
    count = 0
    for table in TABLES:
        state = store.table_state(location, table)
        count += sum(1 for path in state.live if not store.is_compacted(path) and state.stat(path)[1] <= cutoff)
    return count
