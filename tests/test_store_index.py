"""The kept run index (tpubench.store_index): the same rows as a full read, kept up with
nights still writing and with compaction, read again only where the store changed."""

from __future__ import annotations

import warnings
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tpubench import store, store_compact, store_index

WHEN = datetime(2026, 11, 29, 2, 0, tzinfo=UTC)
COLUMNS = store_index.RUN_COLUMNS


def run_row(run_id: str, invocation: str, **fields: object) -> dict:
    return {
        "run_id": run_id,
        "invocation_id": invocation,
        "started_at": WHEN,
        "workload": "gpt2",
        "size": "tiny",
        "backend": "cpu",
        "mode": "train",
        "status": "ok",
        "median_step_ms": 1.5,
        "tokens_per_s": 100.0,
        **fields,
    }


def night(results: Path, invocation: str, runs: int = 2, when: datetime = WHEN) -> store.InvocationWriter:
    writer = store.InvocationWriter(results, invocation, when)
    for index in range(runs):
        run_id = f"{invocation}-{index}"
        ids = {"run_id": run_id, "invocation_id": invocation}
        steps = [{**ids, "step": step, "phase": "measure", "step_ms": 1.0 + step} for step in range(3)]
        writer.add(run_row(run_id, invocation, started_at=when), steps)
    return writer


def full(results: Path, table: str = "runs", columns: tuple[str, ...] | None = COLUMNS) -> pd.DataFrame:
    return store.scan_table(results, table, columns).sort_values("run_id", ignore_index=True)


def indexed(results: Path) -> pd.DataFrame:
    frame = store_index.read_index(results, "runs", COLUMNS)
    return frame.drop(columns=store_index.FILE).sort_values("run_id", ignore_index=True)


def test_the_index_is_a_full_read_and_keeps_up_with_a_store_still_written(results_dir: Path, opened: list[str]) -> None:
    # an older file (no mfu column, schema 1 decode row: read as the readers upgrade it) beside new ones
    old_schema = pa.schema([field for field in store.TABLES["runs"] if field.name != "mfu"])
    old = [run_row("old-d", "old", mode="decode", tokens_per_s=900.0, output_tokens_per_s=90.0, schema_version=1)]
    path = store.partition_dir(results_dir, "runs", WHEN) / "old.parquet"
    path.parent.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(old, schema=old_schema), path)
    night(results_dir, "one")
    tonight = night(results_dir, "two")
    frame = indexed(results_dir)
    assert len(opened) == 3
    pd.testing.assert_frame_equal(frame, full(results_dir))
    assert frame.set_index("run_id").loc["old-d", "tokens_per_s"] == 90.0

    # another process: the cache folder's index, no file opened
    store_index.forget()
    opened.clear()
    frame = indexed(results_dir)
    assert opened == []
    pd.testing.assert_frame_equal(frame, full(results_dir))

    # tonight's invocation writes one more run, a new night starts: only their files are read
    opened.clear()
    tonight.add(run_row("two-late", "two"))
    night(results_dir, "three", when=datetime(2026, 11, 30, 2, 0, tzinfo=UTC))
    store_index.forget()
    frame = indexed(results_dir)
    assert sorted(Path(p).name for p in opened) == ["three.parquet", "two.parquet"]
    pd.testing.assert_frame_equal(frame, full(results_dir))
    assert {"two-late", "three-0", "three-1"} <= set(frame["run_id"])


def test_a_compaction_replaces_its_sources_with_every_row_once(results_dir: Path) -> None:
    """``tpubench compact`` changes the live file set (merged files in, their sources out):
    the index drops the sources' rows and reads the merged file's, and a night written after
    the compaction appears beside them."""
    for invocation in ("one", "two"):
        night(results_dir, invocation)
    for day in (3, 4):  # another month (a month of one file is left as it is)
        night(results_dir, f"october-{day}", when=datetime(2026, 10, day, 2, 0, tzinfo=UTC))
    before = indexed(results_dir)
    store_compact.compact(results_dir, older_than_s=0)
    assert all(store.is_compacted(path) for path in store.parquet_files(results_dir, "runs"))
    after = indexed(results_dir)
    pd.testing.assert_frame_equal(after, before)
    # a night's rows come from its month's compacted file only, in every table
    [november] = store_index.files_for(results_dir, "steps", ["one"])
    assert "/date=2026-11/" in november and store.is_compacted(november)
    one = store.scan_table(results_dir, "steps", paths=[november], invocation_id="one")
    pd.testing.assert_frame_equal(one, store.scan_table(results_dir, "steps", invocation_id="one"))
    assert sorted(one["run_id"].unique()) == ["one-0", "one-1"] and len(one) == 6
    assert store_index.files_for(results_dir, "steps", ["nobody"]) is None  # unknown: every file
    night(results_dir, "three", when=datetime(2026, 11, 30, 2, 0, tzinfo=UTC))
    store_index.forget()
    pd.testing.assert_frame_equal(indexed(results_dir), full(results_dir))
    assert len(indexed(results_dir)) == 10


def test_an_unreadable_file_is_named_skipped_and_tried_again(results_dir: Path) -> None:
    night(results_dir, "good")
    bad = store.partition_dir(results_dir, "runs", WHEN) / "bad.parquet"
    bad.write_bytes(b"PAR1 torn")
    with pytest.warns(store.StoreWarning, match="bad.parquet"):
        assert sorted(indexed(results_dir)["run_id"]) == ["good-0", "good-1"]
    with pytest.warns(store.StoreWarning, match="bad.parquet"):  # not remembered as read
        indexed(results_dir)
    bad.unlink()
    night(results_dir, "bad")  # the same name, now whole
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert sorted(indexed(results_dir)["run_id"]) == ["bad-0", "bad-1", "good-0", "good-1"]


def test_a_kept_index_that_cannot_be_trusted_is_read_again(results_dir: Path) -> None:
    night(results_dir, "one")
    expected = indexed(results_dir)
    kept = store_index.kept_path(results_dir, "runs", COLUMNS)
    store_index.finish_saving()  # written in the background
    assert kept.is_file()
    for damage in (b"not parquet", None):
        store_index.forget()
        if damage is None:  # another store's index under this name
            other = results_dir.parent / "other"
            night(other, "elsewhere")
            indexed(other)
            store_index.finish_saving()
            kept.write_bytes(store_index.kept_path(other, "runs", COLUMNS).read_bytes())
        else:
            kept.write_bytes(damage)
        pd.testing.assert_frame_equal(indexed(results_dir), expected)


def test_a_missing_store_is_a_store_error(tmp_path: Path) -> None:
    with pytest.raises(store.StoreError, match="does not exist"):
        store_index.read_index(tmp_path / "nowhere", "runs", COLUMNS)


def test_the_dashboards_index_sees_a_night_written_since(results_dir: Path) -> None:
    """The dashboard keeps what it derives from the index (order, tags, configuration codes)
    while the index holds: a night written since its cache expired (or Reload) is shown."""
    import streamlit as st

    from dashboard import data

    night(results_dir, "one")
    index = data.run_index(str(results_dir)).frame
    assert set(index["invocation_id"]) == {"one"}
    assert data.filter_choices(str(results_dir), index, ("invocation_id",))["invocation_id"] == ["one"]
    st.cache_data.clear()  # what the cache's expiry and Reload do
    assert set(data.run_index(str(results_dir)).frame["invocation_id"]) == {"one"}
    night(results_dir, "two", when=datetime(2026, 11, 30, 2, 0, tzinfo=UTC))
    st.cache_data.clear()
    frame = data.run_index(str(results_dir)).frame
    assert list(frame["invocation_id"]) == ["one", "one", "two", "two"]
    assert data.filter_choices(str(results_dir), frame, ("invocation_id",))["invocation_id"] == ["one", "two"]
    assert frame[data.CONFIG_CODE].nunique() == 1 and frame["tag_pairs"].map(len).eq(0).all()


def test_some_columns_of_the_index_read_as_the_whole_index_has_them(results_dir: Path) -> None:
    """``only``: a reader that picks runs by a few columns gets those columns as the whole
    frame has them (older rows upgraded from columns it did not ask for), from this process's
    index, from the cache folder's (read in part), and after a night written since."""
    old = [run_row("old-d", "old", mode="decode", tokens_per_s=900.0, output_tokens_per_s=90.0, schema_version=1)]
    old[0].update(dtype="bfloat16", precision=None, devices=None)
    path = store.partition_dir(results_dir, "runs", WHEN) / "old.parquet"
    path.parent.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(old, schema=store.TABLES["runs"]), path)
    night(results_dir, "one")
    only = ["run_id", "tokens_per_s", "precision", "devices"]

    def both() -> tuple[pd.DataFrame, pd.DataFrame]:
        part = store_index.read_index(results_dir, "runs", COLUMNS, only).sort_values("run_id", ignore_index=True)
        whole = store_index.read_index(results_dir, "runs", COLUMNS).sort_values("run_id", ignore_index=True)
        return part, whole[[*only, store_index.FILE]]

    # this process's index, the cache folder's (read in part), the cache folder's with a night since
    for write, forget in ((True, False), (False, True), (True, True)):
        if forget:
            store_index.forget()
        if write:
            night(results_dir, f"night-{len(store.parquet_files(results_dir, 'runs'))}")
        part, whole = both()
        pd.testing.assert_frame_equal(part, whole)
    assert list(part.columns) == [*only, store_index.FILE]
    assert part.set_index("run_id").loc["old-d", ["tokens_per_s", "precision", "devices"]].tolist() == [90.0, "bf16", 1]
    assert len(part) == 7


def test_two_selections_read_their_months_files_once(results_dir: Path, opened: list[str]) -> None:
    """``compare --baseline previous --candidate latest`` picks both sides from the index and
    reads their runs and steps together: a compacted month's file once, not once a side, with
    the selections a separate read of each gives."""
    from tpubench.cli.compare import SELECTOR_COLUMNS, select, select_each, selector_columns
    from tpubench.schema import SCHEMA_VERSION

    for day in (27, 28, 29):
        night(results_dir, f"night-{day}", when=datetime(2026, 11, day, 2, 0, tzinfo=UTC))
    store_compact.compact(results_dir, older_than_s=0)
    index = store_index.read_index(results_dir, "runs", COLUMNS, ["run_id", "invocation_id", "started_at"])
    opened.clear()
    latest, previous = select_each(str(results_dir), ["latest", "previous"], index)
    assert sorted(Path(path).parent.name for path in opened) == ["date=2026-11", "date=2026-11"]  # runs, steps
    for together, selector in ((latest, "latest"), (previous, "previous")):
        alone = select(str(results_dir), selector)
        for name in ("runs", "steps", "compiles"):
            pd.testing.assert_frame_equal(getattr(together, name), getattr(alone, name))
    assert set(latest.runs["invocation_id"]) == {"night-29"} and set(previous.steps["invocation_id"]) == {"night-28"}
    # a term on a column the narrow index lacks reads an index with it, as before
    assert selector_columns("latest,backend=cpu,schema_version=3") == [*SELECTOR_COLUMNS, "backend"]
    [versioned] = select_each(str(results_dir), [f"latest,schema_version={SCHEMA_VERSION}"], index)
    pd.testing.assert_frame_equal(versioned.runs, latest.runs)
