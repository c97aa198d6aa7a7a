"""The parquet results store: atomic writes, Hive date partitions, forgiving reads.

Layout, one file per suite invocation per table::

    results/runs/date=YYYY-MM-DD/<invocation_id>.parquet
    results/steps/date=YYYY-MM-DD/<invocation_id>.parquet
    results/ops/date=YYYY-MM-DD/<invocation_id>.parquet
    results/compiles/date=YYYY-MM-DD/<invocation_id>.parquet
    results/memory/date=YYYY-MM-DD/<invocation_id>.parquet

``tpubench compact`` later merges them per table and month into
``results/TABLE/date=YYYY-MM/compacted-<commit>.parquet``, committed by a manifest in
``results/TABLE/_compacted/`` (:mod:`tpubench.store_compact`); :func:`parquet_files` says which
files make a table at any moment.

An invocation rewrites its own files after every run (temp file, then rename; the ops
and compiles files once a run has given them rows), so a
crash loses at most the run in flight and a reader never sees half a file. Invocations
never share a file, so concurrent suites in one directory lose nothing. pandas
(``pd.read_parquet("results/runs")``), pyarrow datasets and DuckDB
(``read_parquet('results/runs/*/*.parquet', hive_partitioning=true, union_by_name=true)``)
read it directly; :func:`load_runs`, :func:`load_steps` and :func:`load_ops` add schema
evolution and skip corrupt files with a warning.

A store may also live in object storage: ``s3://bucket/prefix`` or ``gs://bucket/prefix``
(fsspec, with s3fs or gcsfs installed: the ``[cloud]`` extra). Object stores have no
rename, so there each file is written whole in one PUT, which readers see entirely or not
at all; a PUT cut short leaves no object.
"""

from __future__ import annotations

import contextlib
import fnmatch
import glob as stdlib_glob
import itertools
import json
import os
import warnings
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from tpubench.precision import choices as precisions
from tpubench.results_dir import DEFAULT_RESULTS_DIR, is_remote
from tpubench.schema import SCHEMA_VERSION, TABLES
from tpubench.spec import ATTENTION_DEFAULT

if TYPE_CHECKING:
    import fsspec

#: tables whose file an invocation writes only once it has rows: most runs profile nothing,
#: eager runs compile nothing, and runs serve nothing
WRITTEN_WHEN_FILLED = frozenset({"ops", "compiles", "memory", "ceilings", "serving", "serving_requests"})


class StoreError(Exception):
    """A results directory that cannot be read (missing, not a directory)."""


class StoreWarning(UserWarning):
    """A store that can be read only in part (an unreadable file skipped): the command line
    prints it as one ``warning:`` line, not in Python's format with a source line."""


class Location:
    """Where a store lives, for code that must work on a local directory and a bucket alike:
    the fsspec file system, and the root path (local: absolute; remote: bucket/prefix)."""

    def __init__(self, results: str | Path):
        self.url = str(results)
        if is_remote(results):
            import fsspec  # a bucket's file system gives its root, so it is made at once

            self.fs, root = fsspec.core.url_to_fs(self.url)
            self.root = root.rstrip("/")
        else:
            self.root = str(Path(results).resolve())

    @cached_property
    def fs(self) -> fsspec.AbstractFileSystem:
        """A local store's file system, made on first use (a bucket's is made with its root):
        its reads go through the standard library and pyarrow, and importing fsspec (40 ms)
        is a tenth of ``compare``'s own time."""
        import fsspec

        return fsspec.filesystem("file")

    @property
    def remote(self) -> bool:
        return is_remote(self.url)

    def join(self, *parts: str) -> str:
        return "/".join([self.root, *parts])

    def display(self, path: str) -> str:
        """``path`` as a user would type it: with its ``s3://`` scheme where it has one."""
        return self.fs.unstrip_protocol(path) if self.remote else path

    def glob(self, *parts: str) -> list[str]:
        if self.remote:
            # one listing of everything under the pattern's fixed start, matched here: the file
            # system's glob lists each partition folder on its own, a request per night (4,000
            # requests, over a minute at a bucket's 20 ms, for a year of nights); a listing
            # without folders is a request per 1,000 files. The file system keeps what it
            # listed, so each file's size and ETag come with it (store_index.identities)
            pattern = self.join(*parts)
            fixed = list(itertools.takewhile(lambda part: not stdlib_glob.has_magic(part), parts))
            listed = self.fs.find(self.join(*fixed))  # a folder that does not exist lists nothing
            depth = pattern.count("/")
            return sorted(path for path in listed if path.count("/") == depth and fnmatch.fnmatchcase(path, pattern))
        # the standard library's on a local store: fsspec's lists and stats every partition
        # folder in Python, a tenth of a second per table over a year of nights, paid by every read
        return sorted(stdlib_glob.glob("/".join([stdlib_glob.escape(self.root), *parts])))

    def exists(self) -> bool:
        return self.fs.exists(self.root) if self.remote else Path(self.root).is_dir()

    def write_table(self, table: pa.Table, path: str) -> None:
        """Write ``table`` to ``path`` so that readers see the old file or the new one."""
        if not self.remote:
            write_atomic(table, Path(path))
            return
        buffer = pa.BufferOutputStream()
        pq.write_table(table, buffer)
        self.fs.pipe_file(path, buffer.getvalue().to_pybytes())  # one PUT: whole or absent

    def read_table(self, path: str) -> pa.Table:
        return pq.read_table(path, filesystem=self.fs) if self.remote else pq.read_table(path)


def partition_dir(results_dir: Path, table: str, when: datetime) -> Path:
    return Path(results_dir) / table / partition(when)


def partition(when: datetime) -> str:
    return f"date={when:%Y-%m-%d}"


def write_atomic(table: pa.Table, path: Path) -> None:
    """Write ``table`` to ``path`` so that readers see the old file or the new one, never a torn one.

    The temporary name starts with a dot, which pyarrow, pandas and DuckDB globs skip.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        pq.write_table(table, temporary)
        with open(temporary, "rb+") as stream:
            os.fsync(stream.fileno())
        os.replace(temporary, path)
    except BaseException:  # an error, Ctrl-C or SIGTERM mid-write: no debris (SIGKILL may leave it)
        temporary.unlink(missing_ok=True)
        raise


def to_table(rows: list[dict[str, Any]], table: str) -> pa.Table:
    """Rows (dicts) as a table of ``table``'s schema; keys outside the schema are an error."""
    schema = TABLES[table]
    unknown = {key for row in rows for key in row} - set(schema.names)
    if unknown:
        raise ValueError(f"columns not in the {table} schema: {sorted(unknown)}")
    stamped = [{"schema_version": SCHEMA_VERSION, **row} for row in rows]
    return pa.Table.from_pylist(stamped, schema=schema)


class InvocationWriter:
    """Accumulates one invocation's rows and keeps its files current after each run.

    The rows are kept as Arrow tables, each run's converted once when it arrives: converting
    every row again at every run made an invocation of thousands of runs (a long
    ``tpubench ci`` night, the calibration) slower at each run. Each table with rows is
    rewritten whole, so a reader still sees the old file or the new one.
    """

    def __init__(
        self, results_dir: str | Path, invocation_id: str, started_at: datetime, tables: Sequence[str] = tuple(TABLES)
    ):
        self._location = Location(results_dir)
        self._paths = {
            name: self._location.join(name, partition(started_at), f"{invocation_id}.parquet") for name in tables
        }
        self._tables = {name: TABLES[name].empty_table() for name in tables}

    @property
    def paths(self) -> dict[str, str]:
        return {name: self._location.display(path) for name, path in self._paths.items()}

    def add(
        self,
        run: dict[str, Any],
        steps: Iterable[dict[str, Any]] = (),
        ops: Iterable[dict[str, Any]] = (),
        compiles: Iterable[dict[str, Any]] = (),
        memory: Iterable[dict[str, Any]] = (),
    ) -> None:
        self.add_rows({"runs": [run], "steps": steps, "ops": ops, "compiles": compiles, "memory": memory})

    def add_rows(self, tables: dict[str, Iterable[dict[str, Any]]]) -> None:
        """Add rows to any of this invocation's tables (a ceilings sweep's: ``ceilings``) and
        rewrite its files."""
        fresh = {name: list(rows) for name, rows in tables.items()}
        converted = {name: to_table(rows, name) for name, rows in fresh.items() if rows}  # all checked first
        for name, table in converted.items():  # one chunk: a table of a chunk per run writes 10x slower
            self._tables[name] = pa.concat_tables([self._tables[name], table]).combine_chunks()
        for name, path in self._paths.items():
            if name in WRITTEN_WHEN_FILLED and not self._tables[name].num_rows:
                continue
            self._location.write_table(self._tables[name], path)


def parquet_files(results_dir: str | Path, table: str) -> list[str]:
    """The files that make ``table`` now, sorted by path: THE list every reader reads.

    Each invocation's own file (``TABLE/date=YYYY-MM-DD/<invocation_id>.parquet``) until a
    ``tpubench compact`` has merged it into its month's file (``TABLE/date=YYYY-MM/
    compacted-<id>.parquet``), then that file instead: the files a committed compaction
    manifest covers are left out (:func:`table_state`), as are a crashed compaction's
    uncommitted outputs, so a reader sees the old files or the new ones, never both.
    """
    location = Location(results_dir)
    if location.remote:  # listed first: a bucket's check that the store exists is two requests more
        state = table_state(location, table)
        if state.files or state.manifests or location.exists():
            return state.live
        raise StoreError(f"results directory {str(results_dir)!r} does not exist")
    if not location.exists():
        if Path(results_dir).exists():
            raise StoreError(f"results directory {str(results_dir)!r} is a file, not a directory")
        raise StoreError(f"results directory {str(results_dir)!r} does not exist")
    if (hint := table_folder_hint(results_dir)) is not None:
        raise StoreError(hint)
    return table_state(location, table).live


#: a table's folder of compaction manifests: the leading underscore keeps pandas', pyarrow's
#: and DuckDB's globs (``runs/*/*.parquet``) out of it
MANIFESTS = "_compacted"
#: the name a compacted file starts with, in its month's folder ``date=YYYY-MM``
COMPACTED_PREFIX = "compacted-"


def is_compacted(path: str) -> bool:
    """Whether ``path`` is a compacted file (many invocations' rows of one month), not one
    invocation's own file named after it."""
    return path.rsplit("/", 1)[-1].startswith(COMPACTED_PREFIX)


def signature(size: int, mtime: float) -> str:
    """What identifies one version of an invocation's file, which its writer replaces whole:
    its size and modification second (whole seconds: a copy by tar keeps only those)."""
    return f"{size}:{int(mtime)}"


class TableState:
    """One table's files as its compaction manifests say they are (``tpubench compact``).

    A manifest (``TABLE/_compacted/<commit>.json``) is committed whole: by one rename on a
    local disk, by one PUT in a bucket. It names its compacted outputs and, for each, every
    file whose rows it holds (``covers``: invocations' files with their :func:`signature`,
    earlier compacted files, and what those covered in turn). The live files are the
    manifests' outputs no later manifest covers, and the invocations' files no manifest
    covers, or covers in another version (a writer that replaced its file after it was
    compacted: its rows are kept, never lost). A compacted file no manifest names is a
    crashed compaction's, not live; the next compaction removes it.
    """

    def __init__(self, location: Location, table: str):
        self.location, self.table = location, table
        self.folder = location.join(table)
        self.manifests: dict[str, dict[str, Any]] = {}
        self.info: dict[str, tuple[int, float]] = {}  # a bucket's listing: path -> (size, mtime)
        if location.remote:
            found = location.fs.find(self.folder, detail=True)
            self.info = {path: (item.get("size") or 0, _mtime(item)) for path, item in found.items()}
            self.files = sorted(
                path for path in found if _in_partition(path[len(self.folder) + 1 :]) and path.endswith(".parquet")
            )
            names = sorted(path for path in found if path.startswith(f"{self.folder}/{MANIFESTS}/"))
            names = [path for path in names if path.endswith(".json") and not path.rsplit("/", 1)[-1].startswith(".")]
            texts = location.fs.cat(names) if names else {}
        else:
            self.files = location.glob(table, "date=*", "*.parquet")
            names = location.glob(table, MANIFESTS, "*.json")
            texts = {name: Path(name).read_bytes() for name in names}
        for name in names:
            with contextlib.suppress(KeyError, ValueError):  # a manifest removed since the listing
                self.manifests[name] = json.loads(texts[name])
        self.outputs: dict[str, str] = {}  # relative path -> manifest
        self.covered: dict[str, str] = {}  # relative path -> signature ("" for a compacted file)
        for name, manifest in self.manifests.items():
            for output, about in manifest.get("outputs", {}).items():
                self.outputs[output] = name
                self.covered.update(about.get("covers", {}))

    def relative(self, path: str) -> str:
        return path[len(self.folder) + 1 :]

    def stat(self, path: str) -> tuple[int, float]:
        """(size, modification time) of a listed file."""
        if self.location.remote:
            return self.info[path]
        found = os.stat(path)
        return found.st_size, found.st_mtime

    def is_live(self, path: str) -> bool:
        relative = self.relative(path)
        if relative in self.outputs:
            return relative not in self.covered
        if is_compacted(relative):  # no committed manifest names it: a crashed compaction's
            return False
        if relative not in self.covered:
            return True
        try:
            return signature(*self.stat(path)) != self.covered[relative]
        except FileNotFoundError:  # removed since the listing (by a compaction's clean-up)
            return False

    @cached_property
    def live(self) -> list[str]:
        return [path for path in self.files if self.is_live(path)]


def table_state(location: Location, table: str) -> TableState:
    return TableState(location, table)


def _in_partition(relative: str) -> bool:
    """``date=.../NAME.parquet`` directly under a table's folder (a bucket's listing is recursive)."""
    parts = relative.split("/")
    return len(parts) == 2 and parts[0].startswith("date=")


def _mtime(item: dict[str, Any]) -> float:
    """A bucket listing's modification time, as seconds since the epoch."""
    stamp = item.get("LastModified") or item.get("mtime") or item.get("updated") or 0
    if isinstance(stamp, datetime):
        return stamp.timestamp()
    if isinstance(stamp, str):
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    return float(stamp)


def table_folder_hint(results_dir: str | Path) -> str | None:
    """Why ``results_dir`` is not a store but one of a store's tables (``DIR/runs``, which
    ``tpubench run`` used to print), naming the store to give instead; None otherwise.

    Read as a store, a table's folder holds no tables of its own: every command would
    report nothing and exit 0, so it is refused rather than read as empty.
    """
    path = Path(results_dir)
    if is_remote(results_dir) or path.name not in TABLES or not any(path.glob("date=*/*.parquet")):
        return None
    return f"{str(results_dir)!r} is the {path.name}/ folder of a results store; give the store itself: {path.parent}"


def load_table(results_dir: Path, table: str, **filters: Any) -> pd.DataFrame:
    """Every file of ``table`` under ``results_dir`` as one DataFrame, filtered by column values.

    A filter value may be a scalar (equality) or a list/tuple/set (membership). Files from
    older schema versions load with the newer columns null; an unreadable file is named
    in a warning and skipped.
    """
    schema = TABLES[table]
    unknown = set(filters) - set(schema.names)
    if unknown:
        raise ValueError(f"cannot filter on {sorted(unknown)}; columns: {', '.join(schema.names)}")
    pieces = [schema.empty_table()]
    location = Location(results_dir)
    for path in parquet_files(results_dir, table):
        try:
            pieces.append(location.read_table(path))
        except (pa.ArrowException, OSError) as error:
            warnings.warn(f"skipping unreadable results file {path}: {error}", StoreWarning, stacklevel=2)
    frame = upgrade(pa.concat_tables(pieces, promote_options="permissive").to_pandas(), table)
    for column, wanted in filters.items():
        if isinstance(wanted, (list, tuple, set, frozenset)):
            frame = frame[frame[column].isin(list(wanted))]
        else:
            frame = frame[frame[column] == wanted]
    return frame.reset_index(drop=True)


def scan_table(
    results_dir: str | Path,
    table: str,
    columns: Sequence[str] | None = None,
    paths: Sequence[str] | None = None,
    **filters: Any,
) -> pd.DataFrame:
    """:func:`load_table` for a big store: the work is pushed into the parquet reader.

    Only ``columns`` are read (default: all); an ``invocation_id`` filter picks the files
    to open by name (an invocation's own file is named after it; compacted files are all
    opened); the other filters (equality or
    membership, as in :func:`load_table`) are applied while reading, so row groups they
    exclude are skipped and only matching rows reach pandas. Files are read in parallel as
    one pyarrow dataset; should one be unreadable, each is read alone and the unreadable
    ones are named in a warning and skipped, as :func:`load_table` does. ``paths`` narrows
    the files to those of :func:`parquet_files`' list a caller knows may hold the rows
    (:func:`tpubench.store_index.files_for`: a compacted store's months).
    """
    schema = TABLES[table]
    unknown = (set(filters) | set(columns or ())) - set(schema.names)
    if unknown:
        raise ValueError(f"cannot read or filter {sorted(unknown)}; columns: {', '.join(schema.names)}")
    wanted = {column: _members(value) for column, value in filters.items()}
    paths = parquet_files(results_dir, table) if paths is None else paths
    if "invocation_id" in wanted:  # a compacted file holds many invocations: the row filter picks them
        paths = [path for path in paths if is_compacted(path) or file_invocation(path) in wanted["invocation_id"]]
    expression = None
    for column, values in wanted.items():
        term = pc.field(column).isin(sorted(values))
        expression = term if expression is None else expression & term
    found = scan_files(Location(results_dir), table, paths, read_columns(table, columns), expression)
    frame = upgrade(found.to_pandas(), table)
    return frame[list(columns)] if columns else frame


def read_columns(table: str, columns: Sequence[str] | None) -> list[str] | None:
    """The columns to read for ``columns`` of ``table`` (None: all): with those that
    :func:`upgrade` needs to convert an older row's ``tokens_per_s``."""
    if not columns:
        return None
    read = list(dict.fromkeys(columns))
    if table == "runs" and "tokens_per_s" in read:
        read += [column for column in UPGRADE_COLUMNS if column not in read]
    return read


def upgrade_inputs(table: str, columns: Sequence[str]) -> list[str]:
    """``columns`` and every column :func:`upgrade` reads to convert them: what a frame of
    some of a table's columns must hold for them to read as a frame of all of them does."""
    read = read_columns(table, columns) or []
    if table == "runs":
        read += [needed for column, needed in UPGRADE_INPUTS.items() if column in read and needed not in read]
    return read


def scan_files(
    location: Location,
    table: str,
    paths: Sequence[str],
    columns: Sequence[str] | None = None,
    expression: pc.Expression | None = None,
    with_file: bool = False,
) -> pa.Table:
    """``columns`` (None: all) of the rows of ``paths`` (files of ``table``) that ``expression``
    keeps, read in parallel as one pyarrow dataset in ``table``'s schema (an older file's newer
    columns null); with ``with_file``, a ``__file`` column naming each row's file. A bucket's
    small files are fetched whole first, all at once (:func:`_fetch_whole`), up to
    :data:`FETCHED_BYTES` at a time. Should one file be unreadable, each is read alone and the
    unreadable ones are named in a warning and skipped."""
    schema = TABLES[table]
    names = list(columns) if columns else schema.names
    filesystem = pafs.PyFileSystem(pafs.FSSpecHandler(location.fs)) if location.remote else pafs.LocalFileSystem()
    parquet = ds.ParquetFileFormat()
    if with_file:  # each file's path comes as its fragment's partition value: no pass over the batches
        schema = schema.append(pa.field(FILE_COLUMN, pa.string()))
        names = [*names, FILE_COLUMN]

    def read(files: Sequence[str], fetched: dict[str, bytes | Exception]) -> pa.Table:
        fragments = []
        for path in files:
            source = fetched.get(path, path)
            if isinstance(source, Exception):  # gone since the listing
                raise source
            fragments.append(
                parquet.make_fragment(
                    pa.BufferReader(source) if isinstance(source, bytes) else source,
                    filesystem,
                    partition_expression=pc.field(FILE_COLUMN) == path if with_file else None,
                )
            )
        return ds.FileSystemDataset(fragments, schema, parquet).to_table(columns=names, filter=expression)

    pieces = []
    for batch, fetched in _fetch_whole(location, paths) if location.remote else [(paths, {})]:
        try:
            pieces.append(read(batch, fetched))
        except (pa.ArrowException, OSError):
            pieces.append(read([], {}))
            for path in batch:
                try:
                    pieces.append(read([path], fetched))
                except (pa.ArrowException, OSError) as error:
                    warnings.warn(
                        f"skipping unreadable results file {location.display(path)}: {error}",
                        StoreWarning,
                        stacklevel=3,
                    )
    return pa.concat_tables(pieces) if len(pieces) != 1 else pieces[0]


#: the column :func:`scan_files` names each row's file in, with ``with_file``
FILE_COLUMN = "__file"

#: a bucket's files up to this size (its listing says) are fetched whole, all at once: one GET
#: each, where pyarrow's reader made two in turn (the footer, then the rest of the file, which
#: s3fs reads ahead 50 MiB), so a fresh dashboard's first read of a year of compacted runs
#: made 266 requests, four at a time (6.7 s at 20 ms a request, 133 requests and 3.1 s now)
WHOLE_FILE_BYTES = 32 * 2**20
#: at most this many bytes of a bucket's files are held at once while they are read
FETCHED_BYTES = 256 * 2**20


def _fetch_whole(location: Location, paths: Sequence[str]) -> Iterator[tuple[list[str], dict[str, bytes | Exception]]]:
    """A bucket's ``paths`` in batches of at most :data:`FETCHED_BYTES`, each with the bytes
    of its files no larger than :data:`WHOLE_FILE_BYTES`, by path, fetched concurrently (the
    file system's ``cat``); an object gone since the listing maps to its error. Sizes come
    from the listing the file system keeps (no request); a file whose size it does not know
    is left to pyarrow's reader."""
    try:  # one call: the sizes a file system's info gives one by one
        sizes = location.fs.sizes(list(paths)) if paths else []
    except OSError:  # one gone since the listing: pyarrow's reader names it
        sizes = [None] * len(paths)
    batch: list[str] = []
    wanted: list[str] = []
    held = 0
    for path, size in [*zip(paths, sizes, strict=True), (None, None)]:
        small = size is not None and size <= WHOLE_FILE_BYTES
        if path is None or (small and held + size > FETCHED_BYTES):
            found = location.fs.cat(wanted, on_error="return") if wanted else {}
            yield batch, {file: found.get(file, FileNotFoundError(file)) for file in wanted}
            batch, wanted, held = [], [], 0
        if path is not None:
            batch.append(path)
            if small:
                wanted.append(path)
                held += size


#: the runs columns :func:`upgrade` reads to convert an older row's ``tokens_per_s``
UPGRADE_COLUMNS = ("schema_version", "mode", "output_tokens_per_s")


#: the column :func:`upgrade` reads to convert each of these, besides :data:`UPGRADE_COLUMNS`
UPGRADE_INPUTS = {"precision": "dtype", "seed": "schema_version"}

#: the seed of every run stored before version 3 recorded it (``workloads.base.SEED`` then)
SEEDED_BEFORE_V3 = 0

#: what a runs row from before multi-device runs measured (``devices``, ``parallel``, ``tp_size`` null)
ONE_DEVICE = {"devices": 1, "parallel": "none", "tp_size": 1, "hosts": 1}


def upgrade(frame: pd.DataFrame, table: str) -> pd.DataFrame:
    """Rows of older schema versions in the current meaning of their columns (docs/schema.md).

    Version 2: a decode run's ``tokens_per_s`` is output tokens per second, the serving
    tools' meaning and the same figure as ``output_tokens_per_s``; before, it counted the
    prompt's tokens too (over the median generation), a second meaning under one name.
    Rows without ``devices`` (written before multi-device runs) get :data:`ONE_DEVICE`, and
    rows without ``attention`` (written before ``--attention``) ``auto``, the backend's choice.
    Version 3 stored the data seed (``seed``); every run before it was built from
    :data:`workloads.base.SEED`'s value, 0, which older rows get. Their steps keep ``loss``
    null: it was not read.
    """
    if table != "runs":
        return frame
    # rows from before multi-device runs (a nullable addition, no version) used one
    # device and no plan: so they pair, resume and scale with the one-device rows written since
    frame = frame.fillna({column: value for column, value in ONE_DEVICE.items() if column in frame.columns})
    if {"dtype", "precision"} <= set(frame.columns):  # a row from before --precision: its dtype's plain one
        frame = precisions.filled(frame)
    if "attention" in frame.columns:  # rows from before --attention let the backend choose: auto
        frame["attention"] = frame["attention"].fillna(ATTENTION_DEFAULT)
    if {"seed", "schema_version"} <= set(frame.columns):
        older = (frame["schema_version"] < 3) & frame["seed"].isna()
        if older.any():
            frame.loc[older, "seed"] = SEEDED_BEFORE_V3
    if not {"tokens_per_s", *UPGRADE_COLUMNS} <= set(frame.columns):
        return frame
    older = (frame["schema_version"] < 2) & (frame["mode"] == "decode")
    if older.any():
        frame.loc[older, "tokens_per_s"] = frame.loc[older, "output_tokens_per_s"]
    return frame


def file_invocation(path: str) -> str | None:
    """The invocation whose own file ``path`` is (its name); None for a compacted file."""
    return None if is_compacted(path) else path.rsplit("/", 1)[-1].removesuffix(".parquet")


def _members(value: Any) -> set[Any]:
    """A filter value as the set of values it accepts (a scalar accepts itself)."""
    return set(value) if isinstance(value, (list, tuple, set, frozenset)) else {value}


def load_runs(results_dir: Path = DEFAULT_RESULTS_DIR, **filters: Any) -> pd.DataFrame:
    """One row per run; e.g. ``load_runs("results", workload="gpt2", status="ok")``."""
    return load_table(results_dir, "runs", **filters)


def load_steps(results_dir: Path = DEFAULT_RESULTS_DIR, **filters: Any) -> pd.DataFrame:
    """One row per timed step; e.g. ``load_steps("results", run_id=ids, phase="measure")``."""
    return load_table(results_dir, "steps", **filters)


def append_store(source: str | Path, target: str | Path, tables: Iterable[str] = tuple(TABLES)) -> int:
    """Copy every live table file of the store ``source`` into the store ``target`` (a local
    directory or a bucket), at the same path; returns how many were copied.

    Each file is one invocation's, named by its id, or a compacted file with a unique name,
    so stores merge without collisions (``cp -rn``'s rule: a file ``target`` already has, or
    has compacted, is kept). A compacted file's manifest is copied after it, so that the
    target reads it only once it is whole. What ``tpubench ci --history`` does each night,
    so that one store holds every night for ``regressions``, the dashboard's Trends and the
    next night's creep check. ``tables``: only these (``tpubench ci --serving`` copies a
    sweep's serving points into tonight's results).
    """
    origin, destination = Location(source), Location(target)
    copied = 0
    for table in tables:
        state, there = table_state(origin, table), table_state(destination, table)
        has = set(there.covered) | {there.relative(path) for path in there.files}
        manifests = set()
        for path in state.live:
            relative = state.relative(path)
            if relative in has:
                continue
            destination.write_table(origin.read_table(path), destination.join(table, *relative.split("/")))
            copied += 1
            if relative in state.outputs:
                manifests.add(state.outputs[relative])
        held = {there.relative(path): path for path in there.files}
        for name in sorted(manifests):  # after the files they name: the commit, as in a compaction
            manifest = json.loads(json.dumps(state.manifests[name]))
            for about in manifest["outputs"].values():  # an invocation's file the target holds too: its copy
                for relative in about["covers"].keys() & held.keys():
                    about["covers"][relative] = "" if is_compacted(relative) else signature(*there.stat(held[relative]))
            goal = destination.join(table, MANIFESTS, name.rsplit("/", 1)[-1])
            write_bytes(destination, goal, json.dumps(manifest).encode())
    return copied


def write_bytes(location: Location, path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` whole or not at all: a hidden temporary file renamed over it
    on a local disk, one PUT in a bucket."""
    if location.remote:
        location.fs.pipe_file(path, data)
        return
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        with open(temporary, "wb") as stream:
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, target)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def recorded_path(results_dir: str | Path, path: str) -> str:
    """How a local store records a file of its own (``runs.trace_path``): relative to the
    results directory, so a store that is moved or copied (from a TPU VM to a laptop, into
    a CI artifact) still finds its traces. A path outside the directory is kept as it is."""
    absolute, root = Path(path).resolve(), Path(results_dir).resolve()
    return absolute.relative_to(root).as_posix() if absolute.is_relative_to(root) else path


def inside_results(results_dir: Path, recorded: str) -> Path:
    """A path read from the store (``runs.trace_path``), resolved, if it lies inside
    ``results_dir``; a relative one is taken from ``results_dir``. Anything that leads
    outside (``../../etc/passwd``, an absolute path elsewhere, a symlink out) is a StoreError,
    so that a store from elsewhere cannot make tpubench read or serve other files."""
    root = Path(results_dir).resolve()
    path = (root / recorded).resolve()  # an absolute ``recorded`` replaces root
    if not path.is_relative_to(root):
        raise StoreError(f"{recorded!r} is outside the results directory {str(root)!r}; refused")
    return path


def load_ops(results_dir: Path = DEFAULT_RESULTS_DIR, **filters: Any) -> pd.DataFrame:
    """One row per (run, op) of profiled runs; e.g. ``load_ops("results", run_id=run_id)``."""
    return load_table(results_dir, "ops", **filters)


def load_compiles(results_dir: Path = DEFAULT_RESULTS_DIR, **filters: Any) -> pd.DataFrame:
    """One row per compile, graph break, host read or fallback of a run (docs/schema.md);
    e.g. ``load_compiles("results", run_id=run_id)``. Stores from before the table load empty."""
    return load_table(results_dir, "compiles", **filters)


def load_ceilings(results_dir: Path = DEFAULT_RESULTS_DIR, **filters: Any) -> pd.DataFrame:
    """One row per point of a ceilings sweep (docs/ceilings.md); e.g.
    ``load_ceilings("results", kind="matmul")``. Stores from before the table load empty."""
    return load_table(results_dir, "ceilings", **filters)


def load_memory(results_dir: Path = DEFAULT_RESULTS_DIR, **filters: Any) -> pd.DataFrame:
    """A run's memory breakdown per rank and, with --profile-memory, its timeline by category
    (docs/schema.md); e.g. ``load_memory("results", run_id=run_id)``. Older stores load empty."""
    return load_table(results_dir, "memory", **filters)


def upload_trace(results: str, run_id: str, local_dir: str, local_path: str) -> str:
    """Copy a run's trace folder, written locally by its worker, to ``results/traces/<run_id>/``
    in object storage; returns the URL of the file that ``local_path`` named there."""
    location = Location(results)
    target = location.join("traces", run_id)
    location.fs.put(local_dir.rstrip("/") + "/", target, recursive=True)
    return location.display(f"{target}/{Path(local_path).relative_to(local_dir).as_posix()}")
