"""``tpubench compact``: merge a store's small per-invocation files into one file per table and month.

Thin: :mod:`tpubench.store_compact` does the work; this module checks the input (a store that
exists and can be written, known tables, a duration) before anything is touched, and prints
what each table became.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

import typer

from tpubench.cli.common import BadInput, app, choose, console, writable_results
from tpubench.results_dir import DEFAULT_RESULTS_DIR, is_remote
from tpubench.schema import TABLES

#: the default of --older-than: an invocation rewrites its files after every run, so a file
#: untouched for an hour is a finished invocation's unless one run took longer than that
DEFAULT_OLDER_THAN = "1h"
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """``--older-than``: ``0``, or a number with a unit (``90s``, ``30m``, ``1h``, ``2d``), in seconds."""
    found = re.fullmatch(r"(\d+(?:\.\d+)?)([smhd]?)", text.strip())
    if not found or (not found[2] and float(found[1]) != 0):
        raise BadInput(f"--older-than expects a duration: 0, or a number with s, m, h or d (e.g. 2d), got {text!r}")
    return float(found[1]) * UNITS.get(found[2], 1)


def store_to_compact(results: str) -> str | Path:
    """``--results`` if it is a store this process may rewrite; a BadInput otherwise, before
    anything is changed (the write check's probe is removed again)."""
    from tpubench import store, store_compact

    if not is_remote(results):
        path = Path(results)
        if not path.exists():
            raise BadInput(f"--results {results}: no such directory")
        if not path.is_dir():
            raise BadInput(f"--results {results}: not a directory")
        if (hint := store.table_folder_hint(path)) is not None:
            raise BadInput(hint)
    try:
        found = store_compact.is_store(store.Location(results))
    except Exception as error:  # fsspec back ends raise their own types: a missing package, no credentials
        raise BadInput(f"--results {results}: cannot read there ({type(error).__name__}: {error})") from error
    if not found:
        raise BadInput(f"--results {results}: not a results store (it has none of the folders {', '.join(TABLES)})")
    return writable_results(results)


@app.command("compact")
def compact_command(
    results: Annotated[str, typer.Option(help="The store: a folder or s3://bucket/prefix.")] = str(DEFAULT_RESULTS_DIR),
    table: Annotated[
        list[str] | None, typer.Option(help=f"Table to compact; repeatable (default: all: {', '.join(TABLES)}).")
    ] = None,
    older_than: Annotated[
        str,
        typer.Option(
            help="Merge only files last written at least this long ago (0, 90s, 30m, 1h, 2d): a running "
            "invocation rewrites its file after every run, so give more than your longest run."
        ),
    ] = DEFAULT_OLDER_THAN,
) -> None:
    """Merge the store's per-invocation files into one file per table and month (docs/schema.md, "Compaction").

    Atomic (readers see the old files or the new ones), idempotent, and safe while runs are
    stored: only files untouched for --older-than are merged.
    """
    tables = choose("table", table, list(TABLES)) or list(TABLES)
    seconds = parse_duration(older_than)
    location = store_to_compact(results)
    from tpubench import store_compact

    done = store_compact.compact(location, tables, seconds)
    for item in done:
        note = f"; waiting: {', '.join(item.skipped)} (a file changed while it was merged)" if item.skipped else ""
        console.print(
            f"{item.table}: {item.files_before} file(s) -> {item.files_after} ({item.months} month(s) rewritten, "
            f"{item.rows:,} rows, {item.bytes_written / 1e6:.1f} MB) in {item.seconds:.1f} s{note}",
            highlight=False,
        )
