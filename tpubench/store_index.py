"""A narrow index of a store's table, kept between processes and read again only where the
store changed.

Why: a year of a fleet's nights is 4,000 invocations, one runs file each, and opening a runs
file costs milliseconds whatever is read of it (its footer describes 170 columns): a fresh
dashboard or ``tpubench compare`` that read a few columns of every run took 10 s at 100,000
runs, and minutes on a bucket at tens of milliseconds a request. The index holds
``columns`` of every row of ``table`` and, for each row, the file it came from. It is kept in
the cache folder (:func:`tpubench.cache_dir.cache_dir`, ``index/``), one Arrow IPC file
(LZ4) per store, table and set of columns, whose metadata records the identity of every file it was
read from (local: size and modification time; a bucket: size and ETag, from the listing
itself). The next read lists the table (:func:`tpubench.store.parquet_files`, the one
definition of which files make a table: what compaction changes) and reads again only the
files that are new or changed; rows of files no longer listed (a compaction's merged
sources, a deleted night) are dropped. So the index stays right whatever writes the store
(a night still writing, a compaction), and nothing in the cache folder is needed: a missing,
unreadable or foreign index file only costs reading the table again. Nothing is written into
the store, which may be read-only (a shared folder, a bucket without write access).
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import itertools
import json
import os
import threading
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from tpubench import store
from tpubench.analysis import identity, precision, scaling
from tpubench.cache_dir import cache_dir

#: a kept index of another format is read again from the store (1: parquet; 2: Arrow IPC,
#: which a fresh process reads in 0.015 s at 100,000 runs where the parquet took 0.15-0.2 s)
FORMAT = 2
#: the index's column naming each row's file (its path under the store's root)
FILE = "__file"
_METADATA = b"tpubench.index"

#: what the dashboard's sidebar filters and pickers need of every run
PICKER_COLUMNS = (
    "run_id",
    "invocation_id",
    "started_at",
    "suite",
    *identity.CONFIG_KEYS,  # a configuration: layout and a user's model's hash too
    "status",
    "tags",
    "trace_path",
    "compile_count",  # what the Compilation page opens on: the latest invocation that compiled a graph
)
#: what the readers of every run need: selectors (:mod:`tpubench.analysis.select`), a
#: configuration's identity and label (:mod:`tpubench.analysis.identity`), the dashboard's
#: filters, pickers, Scaling and Precision & context pages. One set, so that the dashboard and
#: ``tpubench compare`` keep one index of a store between them.
RUN_COLUMNS = tuple(
    dict.fromkeys(
        (
            *PICKER_COLUMNS,
            "git_sha",
            # the Scaling page's, which reads every invocation
            "median_step_ms",
            "tokens_per_s",
            "samples_per_s",
            "mfu",
            "flops_per_step",
            "flops_incomplete",  # a count that missed ops: no MFU from it (analysis.scaling.row_mfu)
            "peak_mem_bytes",
            *scaling.DEFAULTS,
            "tp_size",
            "per_device_batch_size",
            "global_batch_size",
            # the Precision & context page's, which reads every ok run the filters keep: from the
            # runs files that was 4 s of CPU at 100,000 runs
            *precision.BEST_READS,
            *precision.LENGTH_READS,
        )
    )
)


@dataclass
class _Kept:
    """An index as read: every file's identity, the rows (Arrow, ``FILE`` included), and
    the rows as the readers get them (pandas, upgraded), made on first use."""

    files: dict[str, list[Any]]
    table: pa.Table
    frame: pd.DataFrame | None = None
    version: int = field(default_factory=lambda: next(_VERSIONS))
    months: dict[str, frozenset[str]] | None = None  # a runs index's, each invocation's as asked: :func:`files_for`
    partial: bool = False  # some columns only (:func:`_load`'s ``fields``): never brought up to date or saved


_KEPT: dict[tuple[str, str, tuple[str, ...]], _Kept] = {}
_VERSIONS = itertools.count()
_LOCK = threading.Lock()


def read_index(
    results: str | Path, table: str, columns: Sequence[str], only: Sequence[str] | None = None
) -> pd.DataFrame:
    """``columns`` of every row of ``table`` in the store at ``results``, as
    :func:`tpubench.store.scan_table` reads them (older rows upgraded), with ``FILE``: the
    path under the store's root of the file each row is in. With ``only`` (some of
    ``columns``), the frame holds just those (and ``FILE``): a reader that picks a few runs
    by two columns does not make 40 columns of 100,000 rows into pandas to do it.

    Reads only the files that changed since the index was last kept (this process's, else
    the cache folder's); an unreadable file is named in a :class:`tpubench.store.StoreWarning`
    and tried again next time. Raises :class:`tpubench.store.StoreError` as
    :func:`tpubench.store.parquet_files` does (no such store).
    """
    columns = tuple(dict.fromkeys(columns))
    location = store.Location(results)
    listed = store.parquet_files(results, table)
    current = identities(location, listed)
    key = (location.url if location.remote else location.root, table, columns)
    # with ``only``, the columns to read from a kept index: :func:`files_for` reads invocation_id
    needed = None if only is None else [*store.upgrade_inputs(table, [*only, FILE]), "invocation_id"]
    with _LOCK:
        kept = _KEPT.get(key)
        if kept is None or not _holds(kept, needed):
            kept = _load(key, needed)
        if kept is not None and kept.files == current:
            _KEPT[key] = kept
            return _frame(kept, table, columns, only)
        if kept is not None and kept.partial:  # the whole index, to bring up to date
            kept = _load(key)
        known = kept.files if kept is not None else {}
        stale = [path for path, identity in current.items() if known.get(path) != identity]
        dropped = pa.array([*stale, *(known.keys() - current.keys())], pa.string())
        fresh, unread = _read(location, table, columns, stale)
        pieces = [fresh]
        if kept is not None:
            pieces.insert(0, kept.table.filter(pc.invert(pc.is_in(kept.table[FILE], value_set=dropped))))
        rows = pa.concat_tables(pieces, promote_options="permissive")
        kept = _Kept({path: identity for path, identity in current.items() if path not in unread}, rows)
        _KEPT[key] = kept
        _save(key, kept)
        return _frame(kept, table, columns, only)


def identities(location: store.Location, paths: Iterable[str]) -> dict[str, list[Any]]:
    """Each listed file's identity, by its path under the store's root: what changes when a
    writer replaces it (every write replaces a file whole). Local: size and modification time
    (a ``stat``, no read). A bucket: size and ETag, which the listing already holds (the
    file system keeps what it listed), so no request per file."""
    found: dict[str, list[Any]] = {}
    prefix = len(location.root) + 1
    for path in paths:
        try:
            if location.remote:
                info = location.fs.info(path)
                identity = [int(info.get("size") or 0), str(info.get("ETag") or info.get("LastModified") or "")]
            else:
                stat = os.stat(path)
                identity = [stat.st_size, stat.st_mtime_ns]
        except FileNotFoundError:  # removed since the listing (a compaction's source)
            continue
        found[path[prefix:]] = identity
    return found


def version(results: str | Path, table: str, columns: Sequence[str]) -> int | None:
    """A number that changes whenever this process's index of ``table``'s ``columns`` in the
    store at ``results`` changes (None: it keeps none), so that what a reader derives from it
    (the dashboard's tags and configuration codes) can be kept as long as it holds."""
    location = store.Location(results)
    key = (location.url if location.remote else location.root, table, tuple(dict.fromkeys(columns)))
    with _LOCK:
        kept = _KEPT.get(key)
        return None if kept is None else kept.version


def forget() -> None:
    """Drop this process's kept indexes: the next read starts from the cache folder's (what a
    fresh process does; ``benchmarks/dashboard_speed.py`` measures it)."""
    with _LOCK:
        _KEPT.clear()


def kept_path(results: str | Path, table: str, columns: Sequence[str]) -> Path:
    """Where the index of ``table``'s ``columns`` in the store at ``results`` is kept."""
    location = store.Location(results)
    return _path((location.url if location.remote else location.root, table, tuple(dict.fromkeys(columns))))


def _path(key: tuple[str, str, tuple[str, ...]]) -> Path:
    where, table, columns = key
    digest = hashlib.sha256(json.dumps([FORMAT, where, table, columns]).encode()).hexdigest()[:24]
    return cache_dir() / "index" / f"{table}-{digest}.arrow"


def _frame(kept: _Kept, table: str, columns: tuple[str, ...], only: Sequence[str] | None) -> pd.DataFrame:
    """The rows as readers get them: a copy of the whole frame (made once, then kept), or
    with ``only`` those columns, made from the Arrow rows with what upgrading them reads."""
    if only is not None:
        wanted = [*dict.fromkeys(only), FILE]
        read = store.upgrade_inputs(table, wanted)
        return store.upgrade(
            kept.table.select([name for name in read if name in kept.table.column_names]).to_pandas(), table
        )[wanted]
    if kept.frame is None:
        frame = store.upgrade(kept.table.to_pandas(), table)
        kept.frame = frame[[*columns, FILE]]
    return kept.frame.copy()


def _read(
    location: store.Location, table: str, columns: tuple[str, ...], paths: list[str]
) -> tuple[pa.Table, set[str]]:
    """``paths``' rows (``columns``, what :func:`tpubench.store.upgrade` needs, ``FILE``) and
    the paths that could not be read, each named in a warning."""
    absolute = [location.join(path) for path in paths]
    read_columns = store.read_columns(table, columns)
    unread: set[str] = set()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        found = store.scan_files(location, table, absolute, read_columns, with_file=True)
    for warning in caught:
        message = str(warning.message)
        unread |= {path for path, full in zip(paths, absolute, strict=True) if location.display(full) in message}
        warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    prefix = len(location.root) + 1
    files = pc.utf8_slice_codeunits(found[FILE], prefix)
    return found.set_column(found.schema.get_field_index(FILE), FILE, files), unread


def _holds(kept: _Kept, fields: Sequence[str] | None) -> bool:
    """Whether ``kept`` has ``fields`` (None: every column)."""
    return not kept.partial or (fields is not None and set(fields) <= set(kept.table.column_names))


def _load(key: tuple[str, str, tuple[str, ...]], fields: Sequence[str] | None = None) -> _Kept | None:
    """The cache folder's index for ``key``, or None where there is none it can trust; with
    ``fields``, only those of its columns are read (a fifth of the time for five of 40)."""
    _finish_saving(key)
    try:
        with pa.OSFile(str(_path(key))) as source:
            reader = pa.ipc.open_file(source)
            meta = json.loads((reader.schema.metadata or {})[_METADATA])
            names = reader.schema.names
            partial = fields is not None and not set(names) <= set(fields)
            if partial:
                included = [names.index(name) for name in dict.fromkeys(fields) if name in names]
                reader = pa.ipc.open_file(source, options=pa.ipc.IpcReadOptions(included_fields=included))
            table = reader.read_all()
    except (OSError, KeyError, ValueError, pa.ArrowException):
        return None
    if meta.get("format") != FORMAT or meta.get("key") != [key[0], key[1], list(key[2])]:
        return None
    return _Kept(meta["files"], table.replace_schema_metadata(None), partial=partial)


def _save(key: tuple[str, str, tuple[str, ...]], kept: _Kept) -> None:
    """Keep ``kept`` in the cache folder, atomically, in a thread of its own: the reader goes on
    with the rows while Arrow compresses and writes them (0.3 s over 100,000 runs, a sixth of a
    ``tpubench compare`` on a machine that never read the store), and this process waits for
    the write before it reads the file (:func:`_load`) or exits (:func:`finish_saving`). Where
    it cannot be written (a read-only home), nothing is kept and the next process reads the
    store again."""
    meta = {"format": FORMAT, "key": [key[0], key[1], list(key[2])], "files": kept.files}
    table = kept.table.replace_schema_metadata({_METADATA: json.dumps(meta).encode()})
    path = _path(key)  # the cache folder of now, whatever the environment says by the time it is written

    def write() -> None:
        with contextlib.suppress(OSError):
            _write_atomic(table, path)

    _finish_saving(key)  # one write of a key at a time, in order: a newer index is never overwritten
    _SAVING[key] = thread = threading.Thread(target=write, name="tpubench-index-save")
    thread.start()


#: the kept indexes being written to the cache folder, by key
_SAVING: dict[tuple[str, str, tuple[str, ...]], threading.Thread] = {}


def _finish_saving(key: tuple[str, str, tuple[str, ...]]) -> None:
    thread = _SAVING.pop(key, None)
    if thread is not None:
        thread.join()


@atexit.register
def finish_saving() -> None:
    """Wait for every kept index this process is writing (at exit, and for a reader that looks
    at the cache folder's files itself)."""
    for key in list(_SAVING):
        _finish_saving(key)


def _write_atomic(table: pa.Table, path: Path) -> None:
    """``table`` as an Arrow IPC file at ``path``, which readers see whole or not at all (two
    servers may keep the same index at once)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        options = pa.ipc.IpcWriteOptions(compression="lz4")
        with pa.OSFile(str(temporary), "wb") as sink, pa.ipc.new_file(sink, table.schema, options=options) as writer:
            writer.write_table(table)
        with open(temporary, "rb+") as stream:
            os.fsync(stream.fileno())
        os.replace(temporary, path)
    except BaseException:  # an error, Ctrl-C or SIGTERM mid-write: no debris
        temporary.unlink(missing_ok=True)
        raise


def files_for(results: str | Path, table: str, invocations: Any) -> list[str] | None:
    """The files of ``table`` (:func:`tpubench.store.parquet_files`) that can hold rows of
    ``invocations`` (an id or several), by the runs index this process keeps: each
    invocation's own file, and the compacted files of the months its runs are in (a
    compaction merges each month's files of every table into that month's file, and an
    invocation's files of all tables lie in one date partition). None, meaning every file,
    where the index does not know one of them (a night newer than it) or none is kept.

    Why: a compacted store holds a month per file, and a page about one night opened every
    month's file to filter it (132 of them over a year of a fleet's nights)."""
    wanted = set(invocations) if isinstance(invocations, (list, tuple, set, frozenset)) else {invocations}
    location = store.Location(results)
    where = location.url if location.remote else location.root
    months: set[str] = set()
    with _LOCK:
        kept = next(
            (
                k
                for (root, name, columns), k in _KEPT.items()
                if root == where and name == "runs" and "invocation_id" in columns
            ),
            None,
        )
        if kept is None:
            return None
        if kept.months is None:
            kept.months = {}
        if missing := wanted - kept.months.keys():  # only the invocations asked about: a year's
            # 100,000 rows grouped took 0.08 s of a 1.3 s compare that asks about two
            ids = kept.table["invocation_id"]
            rows = kept.table.filter(pc.is_in(ids, value_set=pa.array(sorted(missing), ids.type)))
            found: dict[str, set[str]] = {}
            for invocation, path in zip(rows["invocation_id"].to_pylist(), rows[FILE].to_pylist(), strict=True):
                found.setdefault(invocation, set()).add(_month(path))
            kept.months.update((invocation, frozenset(paths)) for invocation, paths in found.items())
        for invocation in wanted:
            if invocation not in kept.months:
                return None
            months |= kept.months[invocation]
    return [
        path
        for path in store.parquet_files(results, table)
        if (_month(path) in months if store.is_compacted(path) else store.file_invocation(path) in wanted)
    ]


def _month(path: str) -> str:
    """``YYYY-MM`` of a file's date partition (``date=YYYY-MM-DD`` or a compacted ``date=YYYY-MM``)."""
    return path.rsplit("/", 2)[-2].removeprefix("date=")[:7]
