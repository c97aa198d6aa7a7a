"""Every load and analysis the dashboard shows, cached with ``st.cache_data``; no widgets here.

Reads go through :func:`tpubench.store.scan_table`, which pushes the work into the parquet
reader. The sidebar filters a small index of every run (a few columns of the runs table);
each page then reads only the invocations (files), runs and columns it shows, so a page
costs what it shows, not what the store holds. Analyses are :mod:`tpubench.analysis`'s
own functions, called as the CLI calls them, so both show the same numbers.

Loads return the store's warnings (unreadable files) with the data, so a page can name
the files it skipped even when the value comes from the cache.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import date, timedelta
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import streamlit as st

from dashboard import RESULTS_ENV, STORE_SEPARATOR
from reports import summary_table
from tpubench import store, store_index
from tpubench.analysis import ceilings as ceilings_analysis
from tpubench.analysis import changepoints, compare, identity, roofline, serving_compare
from tpubench.analysis import serving as serving_analysis
from tpubench.analysis.prices import load_prices
from tpubench.analysis.select import parse_selector, select_runs
from tpubench.schema import RUNS
from tpubench.serving.metrics import PERCENTILES

#: a store grows every night: a dashboard left open sees new runs within this (or on Reload)
TTL_S = 300
#: one configuration: what a series follows over time and a comparison pairs on
CONFIG_KEYS = identity.CONFIG_KEYS
SERVING_MODES = ("prefill", "decode")
#: the steps columns a comparison reads: the sampled metrics' own, and the step and rank by
#: which a multi-rank run's samples become its job's (analysis.steps.job_steps)
COMPARED_STEPS = (
    "run_id",
    "phase",
    "step",
    "rank",
    *(metric.column for metric in compare.METRICS if metric.kind == "sampled"),
)
#: metrics the Trends page follows: runs column -> label with unit
TREND_METRICS = {
    "median_step_ms": "median step (ms)",
    "tokens_per_s": "tokens/s",
    "ttft_p50_ms": "TTFT p50 (ms)",
    "tpot_p50_ms": "TPOT p50 (ms)",
    "first_step_s": "first step (s)",
    "compile_s": "compile time (s)",
    "peak_mem_bytes": "peak memory (bytes)",
    "mem_activations_bytes": "activations + temporaries (bytes)",
    "joules_per_token": "energy per token (J, measured)",
}
SERVING_COLUMNS = (
    *store_index.PICKER_COLUMNS,
    *(f"{metric}_p{p}_ms" for metric in ("ttft", "tpot", "itl") for p in PERCENTILES),
    "output_tokens_per_s",
    "total_tokens_per_s",
    "tokens_per_s",
    "bandwidth_util",
    "median_step_ms",
    "model_ref",  # a --model hf:ID run is of the serving points of model ID (analysis.serving.run_models)
)


#: the index of every run: the pickers' columns and those of the Scaling and Precision & context
#: pages, which read every invocation: from the index they read no runs file (a second pass over all of them took longer
#: than the page's whole budget). The index is kept between servers (:mod:`tpubench.store_index`),
#: the same one ``tpubench compare`` keeps.
INDEX_COLUMNS = store_index.RUN_COLUMNS
#: the index's column of :func:`configuration_codes`
CONFIG_CODE = "config_code"


def results_location() -> str:
    """The store this dashboard shows (fixed at start: nothing in the UI can point it elsewhere)."""
    return os.environ.get(RESULTS_ENV) or str(store.DEFAULT_RESULTS_DIR)


@dataclass(frozen=True)
class Loaded:
    """A frame and the store's warnings about files it had to skip."""

    frame: pd.DataFrame
    skipped: tuple[str, ...] = ()


def stores(results: str) -> list[str]:
    """The stores ``results`` names: one, or several (one per line) read as one."""
    return [part for part in results.split(STORE_SEPARATOR) if part]


def _scan(
    results: str, table: str, columns: tuple[str, ...] | None = None, read: object = None, **filters: object
) -> Loaded:
    """``table``'s rows over every store of ``results``, as one frame; with several stores, a
    ``store`` column says which each row came from, a run found in two (a store copied into
    another) counts once, and a store that does not exist is named, not fatal, unless none does.
    ``read`` reads one store (default :func:`picked`)."""
    named = stores(results)
    frames, skipped = [], []
    read = read or picked
    for location in named:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                frame = read(location, table, columns, **filters)
            except store.StoreError as error:
                if len(named) == 1:
                    raise
                skipped.append(f"{error}: left out")
                continue
        skipped += [str(w.message) for w in caught if str(w.message).startswith("skipping unreadable")]
        frames.append(frame.assign(store=location) if len(named) > 1 else frame)
    if not frames:
        raise store.StoreError(f"none of the results stores {', '.join(named)} exists")
    frame = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
    if len(frames) > 1:  # the same file in two stores: its rows once
        frame = frame[~_hashable(frame.drop(columns="store")).duplicated()].reset_index(drop=True)
    return Loaded(frame, tuple(skipped))


def picked(location: str, table: str, columns: tuple[str, ...] | None = None, **filters: object) -> pd.DataFrame:
    """:func:`tpubench.store.scan_table` of one store, opening for an invocation filter only the
    files that can hold those invocations (:func:`tpubench.store_index.files_for`)."""
    paths = store_index.files_for(location, table, filters["invocation_id"]) if "invocation_id" in filters else None
    return store.scan_table(location, table, columns, paths=paths, **filters)


def _hashable(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with each list cell (the ceilings' ``samples_s`` and ``warmup_s``, read as
    numpy arrays) as its bytes, so that rows can be compared whole: pandas hashes every cell to
    find duplicates, and an array cannot be hashed (the merge of two stores, one with ceilings,
    raised on every page that read them). Equal lists give equal bytes, NaN included."""
    listed = [column for column in frame.columns if _holds_lists(frame[column])]
    return frame.assign(**{column: frame[column].map(_cell_bytes) for column in listed})


def _holds_lists(column: pd.Series) -> bool:
    first = column.first_valid_index() if column.dtype == object else None
    return first is not None and isinstance(column[first], np.ndarray | list)


def _cell_bytes(value: object) -> object:
    return np.asarray(value).tobytes() if isinstance(value, np.ndarray | list) else value


def store_of(results: str, index: pd.DataFrame, run_ids: pd.Series | list[str]) -> str | None:
    """The one store that holds every run of ``run_ids`` (``--results`` for a terminal
    command about them); None when they lie in different stores."""
    if len(stores(results)) == 1:
        return results
    found = set(index.loc[index["run_id"].isin(list(run_ids)), "store"])
    return found.pop() if len(found) == 1 else None


def _indexed(location: str, table: str, columns: tuple[str, ...]) -> pd.DataFrame:
    """``columns`` of every row of one store's ``table``, from the index kept between servers
    (:func:`tpubench.store_index.read_index`): only files that are new or changed since are
    read, in a bucket as on a local disk."""
    return store_index.read_index(location, table, columns).drop(columns=store_index.FILE)


def forget_indexed() -> None:
    """Drop the indexes this process keeps: the next read starts from the cache folder's, as a
    server's first page does (``benchmarks/dashboard_speed.py`` measures that)."""
    store_index.forget()


def _tag_pairs(text: object) -> tuple[str, ...]:
    tags = json.loads(text) if isinstance(text, str) and text else {}
    return tuple(f"{key}={value}" for key, value in sorted(tags.items()))


#: the last index :func:`run_index` made of each ``results``, by the kept indexes it came from
_PROCESSED: dict[str, tuple[tuple[int | None, ...], pd.DataFrame]] = {}


def run_index(results: str) -> Loaded:
    """Every run, :data:`INDEX_COLUMNS` only, oldest first, with its tags as ``key=value`` pairs.

    What it adds to the kept index (the order, tags parsed, configuration codes: half a second
    over a year of a fleet's runs) is made again only when the kept index changed, not after
    every expiry of the cache or Reload.

    The store is read (its changed files) at most once per expiry of the cache
    (:func:`_read_run_index`); the frame itself is kept in this process, not in Streamlit's
    cache, which pickled it on a first render and unpickled it on every rerun: 0.1 to 0.2 s
    each way over a year of a fleet's runs, on every filter change of every page. Each caller
    gets its own copy, as the cache gave one: a shallow one, which pandas' copy-on-write keeps
    apart from the kept frame (a deep one cost 15 ms of every rerun over 100,000 runs).

    Raises :class:`tpubench.store.StoreError` when the store does not exist.
    """
    skipped = _read_run_index(results)
    kept = _PROCESSED.get(results)
    frame = kept[1] if kept is not None else _processed(results).frame
    return Loaded(frame.copy(deep=False), skipped)  # copy-on-write: a caller's changes stay its own


@st.cache_data(ttl=TTL_S, show_spinner="Reading the results store ...")
def _read_run_index(results: str) -> tuple[str, ...]:
    """Reads the store's runs index (:func:`_processed`), at most once per expiry of the cache;
    what it keeps is the files it could not read, not the frame."""
    return _processed(results).skipped


def _processed(results: str) -> Loaded:
    """The runs index read now (only the files that changed), ordered, tags parsed and
    configuration codes made; kept in :data:`_PROCESSED` by the kept indexes it came from."""
    loaded = _scan(results, "runs", INDEX_COLUMNS, read=_indexed)
    versions = index_versions(results)
    known, frame = _PROCESSED.get(results, ((), None))
    if frame is not None and known == versions and None not in versions:
        return Loaded(frame, loaded.skipped)
    frame = loaded.frame.sort_values(["started_at", "run_id"], kind="stable").reset_index(drop=True)
    # each distinct tags text parsed once: a night's runs share theirs, so 10,000 runs hold a few hundred
    distinct = frame["tags"].drop_duplicates()
    frame["tag_pairs"] = frame["tags"].map(dict(zip(distinct, distinct.map(_tag_pairs), strict=True)))
    frame[CONFIG_CODE] = configuration_codes(frame)
    _PROCESSED[results] = (versions, frame)
    return Loaded(frame, loaded.skipped)


#: the sidebar's choices of each ``results``' index, by the kept indexes it came from
_CHOICES: dict[str, tuple[tuple, dict[str, list]]] = {}


def _while_index_holds(kept: dict[str, tuple[tuple, Any]], results: str, asked: object, make: Callable[[], Any]) -> Any:
    """``make()``, kept in ``kept`` for ``results`` while the kept run indexes it reads
    (:func:`index_versions`) and ``asked`` (what ``make`` was asked for) stay the same."""
    versions = index_versions(results)
    known = kept.get(results)
    if known is None or known[0] != (versions, asked) or None in versions:
        known = ((versions, asked), make())
        kept[results] = known
    return known[1]


def filter_choices(results: str, index: pd.DataFrame, columns: tuple[str, ...]) -> dict[str, list]:
    """Each of ``columns``' values in ``index`` (the run index of ``results``), sorted, and
    ``tag_pairs``: every ``key=value`` tag; made again only when the index changed, not on every
    rerun (0.02-0.03 s of each over a year of a fleet's runs)."""

    def make() -> dict[str, list]:
        made = {column: sorted(index[column].dropna().unique()) for column in columns}
        made["tag_pairs"] = sorted({pair for pairs in index["tag_pairs"] for pair in pairs})
        return made

    return _while_index_holds(_CHOICES, results, columns, make)


def index_versions(results: str) -> tuple[int | None, ...]:
    """The versions of the kept run indexes ``results`` reads (:func:`tpubench.store_index.version`,
    one per store; None where this process keeps none): what is made of the index holds while they do."""
    return tuple(store_index.version(location, "runs", INDEX_COLUMNS) for location in stores(results))


@st.cache_data(ttl=TTL_S, show_spinner=False)
def _of_every_run(
    results: str, versions: tuple[int | None, ...], what: str, _index: pd.DataFrame, _make: Callable
) -> pd.DataFrame:
    """``_make`` of every run of the index (``_index``, of ``versions``); ``what`` names ``_make``."""
    return _make(_index)


def per_group(
    results: str,
    index: pd.DataFrame,
    runs: pd.DataFrame,
    filters: Filters,
    what: str,
    keys: tuple[str, ...],
    make: Callable[[pd.DataFrame], pd.DataFrame],
) -> pd.DataFrame:
    """``make`` of ``runs``, the runs ``filters`` keep of ``index``, for an analysis whose rows are groups
    of runs made from their group's runs alone, each row carrying its group's ``keys`` columns
    (``tpubench scaling``'s configurations, a chip's precisions).

    Where the filters choose only values of ``keys`` columns (a backend, a workload: not a tag,
    a date or the suite, which cut into groups), that is ``make`` of every run with the rows of
    the chosen values kept: made once per index and cached, so a filter change recomputes
    nothing (over 100,000 runs the Scaling page's report took 0.3 s of each filter change).
    Else ``make`` of the kept runs, as before."""
    chosen = [(column, values) for column, values in filters.columns if values]
    versions = index_versions(results)
    if (
        filters.tags
        or filters.since is not None
        or filters.until is not None
        or None in versions
        or any(column not in keys for column, _ in chosen)
    ):
        return make(runs)
    made = _of_every_run(results, versions, what, _index=index, _make=make)
    keep = np.ones(len(made), dtype=bool)
    for column, values in chosen:
        keep &= made[column].isin(values).to_numpy(bool)
    return made[keep].reset_index(drop=True)


def configuration_codes(runs: pd.DataFrame) -> pd.Series:
    """Each run's configuration as Compare may pair it (:data:`CONFIG_KEYS`, read as
    :func:`identity.pairable` reads it: a 1-device run under a plan pairs with plain ones) as
    one number, equal for runs that would pair: computed once with the index, so that pairing
    nights (:func:`last_two_nights`, on every rerun of Compare) compares numbers."""
    return identity.pairable(runs).groupby(list(CONFIG_KEYS), dropna=False, sort=False).ngroup()


@dataclass(frozen=True)
class Filters:
    """The sidebar's choice: accepted values per column, tags, a UTC date range; empty means all."""

    columns: tuple[tuple[str, tuple[str, ...]], ...] = ()
    tags: tuple[str, ...] = ()  # "key=value": any value of a key, every key
    since: date | None = None
    until: date | None = None

    @property
    def active(self) -> bool:
        """Whether any filter is set."""
        dated = self.since is not None or self.until is not None
        return dated or bool(self.tags) or any(values for _, values in self.columns)

    def apply(self, runs: pd.DataFrame) -> pd.DataFrame:
        """The rows of ``runs`` (index rows) the filters keep; ``runs`` itself (a shallow copy)
        when no filter is set, rather than a copy of every row (40 ms over 100,000 runs)."""
        if not self.active:
            return runs.copy(deep=False)
        mask = np.ones(len(runs), dtype=bool)
        for column, values in self.columns:
            if values:
                mask &= runs[column].isin(values).to_numpy()
        by_key: dict[str, set[str]] = {}
        for pair in self.tags:
            key, _, _ = pair.partition("=")
            by_key.setdefault(key, set()).add(pair)
        for wanted in by_key.values():
            mask &= runs["tag_pairs"].map(lambda pairs, wanted=wanted: not wanted.isdisjoint(pairs)).to_numpy(bool)
        if self.since is not None:
            mask &= (runs["started_at"] >= pd.Timestamp(self.since, tz="UTC")).to_numpy()
        if self.until is not None:
            mask &= (runs["started_at"] < pd.Timestamp(self.until + timedelta(days=1), tz="UTC")).to_numpy()
        return runs[mask]


#: what each ``results``' filters kept last, by the kept indexes it came from and the filters
_FILTERED: dict[str, tuple[tuple, pd.DataFrame]] = {}


def filtered(results: str, index: pd.DataFrame, filters: Filters) -> pd.DataFrame:
    """``filters.apply(index)`` (``index``: the run index of ``results``), kept while the filters
    and the index stay: a page's own widgets (a picker, a radio) rerun it with the same filters,
    which filtered 100,000 runs again each time (30 ms). Each caller gets its own (shallow) copy."""
    return _while_index_holds(_FILTERED, results, filters, lambda: filters.apply(index)).copy(deep=False)


def invocations(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per invocation of ``runs``, newest first: invocation_id, started_at, runs, not_ok."""
    return _invocations(runs)[0].drop(columns="code")


def _invocations(runs: pd.DataFrame) -> tuple[pd.DataFrame, np.ndarray]:
    """:func:`invocations`, with each invocation's number in ``code``, and each run's."""
    # grouped by numbers (pd.factorize), not by the ids' text, and not_ok summed from a column,
    # not counted by a function per group: a Python call per invocation cost seconds over a
    # year of nights, and a groupby of 100,000 ids 13 ms, on every rerun of the pages that pick one
    codes, ids = pd.factorize(runs["invocation_id"], sort=False)
    not_ok = (runs["status"] != "ok").to_numpy()
    started = pd.Series(runs["started_at"].array).groupby(codes, sort=True).min()
    table = pd.DataFrame(
        {
            "invocation_id": pd.Series(ids, dtype=runs["invocation_id"].dtype),
            "started_at": started.array,
            "runs": np.bincount(codes, minlength=len(ids)),
            "not_ok": np.bincount(codes, weights=not_ok, minlength=len(ids)).astype("int64"),
            "code": np.arange(len(ids)),
        }
    )
    return table.sort_values("started_at", ascending=False).reset_index(drop=True), codes


@dataclass(frozen=True)
class Nights:
    """The latest invocation, the earlier one it is compared with, and the ones passed over."""

    latest: str
    before: str | None  # None: no earlier invocation ran any of the latest's configurations
    passed_over: tuple[str, ...] = ()  # more recent than ``before``, with none of the latest's configurations
    #: newer than ``latest``, each with no earlier invocation that ran one of its configurations
    skipped: tuple[str, ...] = ()


def last_two_nights(runs: pd.DataFrame) -> Nights | None:
    """The latest invocation that has something to compare with, and "the one before": the
    latest earlier invocation that ran any of its configurations (:data:`CONFIG_KEYS`: same
    workload, shape, layout, backend and device). Newer invocations with no such earlier one
    (a new configuration's first night, another machine's runs in a merged store) are
    ``skipped``, so the page opens on a comparison that pairs rather than on "nothing would
    pair"; when none has one, the latest with ``before`` None. None with fewer than two
    invocations."""
    table, invocation_codes = _invocations(runs)
    nights = table["invocation_id"]
    if len(nights) < 2:
        return None
    newest_first = np.empty(len(table), dtype=np.int64)  # each invocation's place among the nights
    newest_first[table["code"].to_numpy()] = np.arange(len(table))
    # each configuration as one number, so a night is a set of numbers: the configurations
    # spelled out as tuples of text, night by night, took seconds over a year of nights; and
    # the (night, configuration) pairs in arrays ordered newest night first, so that the night
    # before is the first later pair with one of its numbers (a set per night, made by a
    # groupby over every night, took 0.1 s of each rerun of Compare at 100,000 runs)
    codes = runs[CONFIG_CODE] if CONFIG_CODE in runs else configuration_codes(runs)
    pairs = pd.DataFrame({"night": newest_first[invocation_codes], "code": codes.to_numpy()})
    pairs = pairs.drop_duplicates().sort_values("night", kind="stable")
    night, code = pairs["night"].to_numpy(), pairs["code"].to_numpy()
    ends = np.searchsorted(night, np.arange(len(nights)), side="right")
    for newest in range(len(nights) - 1):
        wanted = code[(ends[newest - 1] if newest else 0) : ends[newest]]
        shared = np.flatnonzero(np.isin(code[ends[newest] :], wanted))
        if len(shared):
            before = int(night[ends[newest] + shared[0]])
            passed = tuple(nights.iloc[newest + 1 : before])
            return Nights(nights.iloc[newest], nights.iloc[before], passed, tuple(nights.iloc[:newest]))
    return Nights(nights.iloc[0], None, tuple(nights.iloc[1:]))


def latest_per_config(runs: pd.DataFrame) -> pd.DataFrame:
    """The most recent run of each configuration (:data:`CONFIG_KEYS`) in ``runs``."""
    ordered = runs.sort_values("started_at", kind="stable")
    keyed = identity.configurations(ordered, keep=())  # grouped: not over every column
    latest = keyed.groupby(list(CONFIG_KEYS), dropna=False, sort=False).tail(1)
    return ordered.loc[latest.index]


def position_of(index: pd.DataFrame, run_id: str) -> int:
    """The row of ``run_id`` in ``index`` (a run index: every run once), found in Arrow (a
    comparison of 100,000 strings in pandas cost 5 ms, and a page asked three times)."""
    found = pc.index(pa.array(index["run_id"]), run_id).as_py()
    if found < 0:
        raise KeyError(run_id)
    return found


def series_label(runs: pd.DataFrame) -> pd.Series:
    """A configuration as one readable string (:func:`identity.config_labels`), its backend and
    device too: ``gpt2/tiny train bfloat16 4x128 cuda (NVIDIA H100)``."""
    return identity.config_labels(runs, backend=True)


def run_label(runs: pd.DataFrame) -> pd.Series:
    """A run as a picker shows it: when, what, where, and the start of its id."""
    when = runs["started_at"].dt.strftime("%Y-%m-%d %H:%M")
    return when + " · " + series_label(runs) + " · " + runs["status"] + " · " + runs["run_id"].str[:8]


@st.cache_data(ttl=TTL_S, show_spinner=False)
def runs(
    results: str,
    invocations: tuple[str, ...],
    run_ids: tuple[str, ...] | None = None,
    columns: tuple[str, ...] | None = None,
) -> Loaded:
    """Runs rows from ``invocations``' files only; only ``run_ids`` and ``columns`` if given."""
    filters: dict[str, object] = {"invocation_id": list(invocations)}
    if run_ids is not None:
        filters["run_id"] = list(run_ids)
    return _scan(results, "runs", columns, **filters)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def steps(
    results: str,
    invocations: tuple[str, ...],
    run_ids: tuple[str, ...] | None = None,
    phase: str | None = None,
    columns: tuple[str, ...] | None = None,
) -> Loaded:
    """Steps rows from ``invocations``' files only, of ``run_ids`` and ``phase`` if given."""
    filters: dict[str, object] = {"invocation_id": list(invocations)}
    if run_ids is not None:
        filters["run_id"] = list(run_ids)
    if phase is not None:
        filters["phase"] = phase
    return _scan(results, "steps", columns, **filters)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def run_ops(results: str, invocation: str, run_id: str) -> Loaded:
    """One run's rows of the ops table (from its invocation's file)."""
    return _scan(results, "ops", invocation_id=invocation, run_id=run_id)


def select(results: str, candidates: pd.DataFrame, selector: str) -> pd.DataFrame:
    """The rows of ``candidates`` (index rows) that ``selector`` picks, as ``tpubench compare``
    picks them (:func:`tpubench.analysis.select.select_runs`); columns its terms name beyond
    the index are read for those runs. Raises SelectorError / NoRunsMatch as the CLI's does."""
    terms = parse_selector(selector)
    extra = tuple(sorted({t.field for t in terms if t.field in RUNS.names} - set(candidates.columns)))
    if extra and not candidates.empty:
        loaded = runs(results, tuple(sorted(set(candidates["invocation_id"]))), None, ("run_id", *extra))
        candidates = candidates.merge(loaded.frame, on="run_id", how="left")
    return select_runs(candidates, terms)


@dataclass(frozen=True)
class Comparison:
    """What ``tpubench compare`` computes for two selections, plus each side's summary."""

    frame: pd.DataFrame  # compare.compare_runs
    cross: pd.DataFrame  # compare.cross_backend (empty when the sides share backend and device)
    keys: tuple[str, ...]  # what runs were paired on
    base_summary: pd.DataFrame  # reports.summary_table of each side (median step and its CI per configuration)
    test_summary: pd.DataFrame
    skipped: tuple[str, ...] = ()


@st.cache_data(ttl=TTL_S, show_spinner="Comparing: bootstrap CIs and significance tests ...")
def comparison(
    results: str,
    base_runs: tuple[tuple[str, str], ...],
    test_runs: tuple[tuple[str, str], ...],
    statistic: str = "median",
) -> Comparison:
    """Baseline against candidate, each given as (invocation_id, run_id) pairs, as ``tpubench
    compare`` does it: :func:`compare.compare_runs` on the runs and their measured steps, and
    :func:`compare.cross_backend` (prices: the built-in table or ``$TPUBENCH_PRICES``) when the
    two sides ran different backends or devices.

    Rows are read per invocation and then picked, so that a filter which only hides some runs
    of the same invocations (a backend, a workload) finds them cached.
    """
    invocations = tuple(sorted({invocation for invocation, _ in (*base_runs, *test_runs)}))
    rows = runs(results, invocations)
    base, test = (
        rows.frame[rows.frame["run_id"].isin([run_id for _, run_id in chosen])] for chosen in (base_runs, test_runs)
    )
    keys = compare.pair_keys(base, test)
    samples = _Samples(results, invocations)
    frame, skipped = [], list(rows.skipped)
    for pair in compare.pairs(base, test, keys):
        pair_rows, pair_skipped = _compared_pair(
            results, statistic, tuple(keys), *pair.run_ids(), _pair=pair, _samples=samples
        )
        frame.extend(pair_rows)
        skipped.extend(name for name in pair_skipped if name not in skipped)
    cross = pd.DataFrame(columns=compare.CROSS_COLUMNS)
    if not set(compare.SIDE_KEYS) <= set(keys):
        cross = compare.cross_backend(with_attained(results, base), with_attained(results, test), load_prices())
    return Comparison(
        pd.DataFrame(frame, columns=compare.COLUMNS),
        cross,
        tuple(keys),
        summary_table(base),
        summary_table(test),
        tuple(skipped),
    )


class _Samples(Mapping[str, pd.DataFrame]):
    """The measured samples of a comparison's runs by run id, read on first use: a comparison
    whose pairs all come from the cache (a filter that only hid some) reads no steps."""

    def __init__(self, results: str, invocations: tuple[str, ...]) -> None:
        self.results, self.invocations = results, invocations
        self.skipped: tuple[str, ...] = ()
        self._by_run: dict[str, pd.DataFrame] | None = None

    def _read(self) -> dict[str, pd.DataFrame]:
        if self._by_run is None:
            measured = steps(self.results, self.invocations, None, "measure", COMPARED_STEPS)
            self._by_run, self.skipped = compare.samples_by_run(measured.frame), measured.skipped
        return self._by_run

    def __getitem__(self, run_id: str) -> pd.DataFrame:
        return self._read()[run_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._read())

    def __len__(self) -> int:
        return len(self._read())


@st.cache_data(ttl=TTL_S, show_spinner=False)
def _compared_pair(
    results: str,
    statistic: str,
    keys: tuple[str, ...],
    base_ids: tuple[str, ...],
    test_ids: tuple[str, ...],
    _pair: compare.Pair,
    _samples: _Samples,
) -> tuple[list[dict], tuple[str, ...]]:
    """One configuration's rows of a comparison and the steps files skipped reading them,
    cached by its runs on each side (which fix its rows: :func:`compare.compare_pair`), so that
    a sidebar filter that hides some configurations recomputes none of the others' bootstraps."""
    rows = compare.compare_pair(_pair, list(keys), _samples, compare.Settings(statistic=statistic))
    return rows, _samples.skipped


def trend_columns(metric: str) -> tuple[str, ...]:
    band = ("p10_step_ms", "p90_step_ms") if metric == "median_step_ms" else ()
    return ("run_id", "invocation_id", "started_at", "git_sha", "status", *CONFIG_KEYS, metric, *band)


@st.cache_data(ttl=TTL_S, show_spinner="Reading the series ...")
def trend_runs(results: str, invocations: tuple[str, ...], metric: str) -> Loaded:
    """The runs of ``invocations`` with what a trend of ``metric`` needs, and a ``series`` label."""
    loaded = runs(results, invocations, None, trend_columns(metric))
    frame = loaded.frame.copy()
    frame["series"] = series_label(frame)
    return Loaded(frame, loaded.skipped)


@st.cache_data(ttl=TTL_S, show_spinner="Looking for change points (their cost grows with the square of the window) ...")
def change_points(results: str, invocations: tuple[str, ...], metric: str) -> pd.DataFrame:
    """:func:`changepoints.change_points` of every series in ``invocations``, with a ``series``
    label. Keyed by the invocations, not the filters: filters that keep the same invocations
    (a backend, a workload) only hide series, so their change points come from the cache."""
    found = changepoints.change_points(trend_runs(results, invocations, metric).frame, metric)
    found["series"] = series_label(found) if not found.empty else pd.Series(dtype="string")
    return found


@st.cache_data(ttl=TTL_S, show_spinner=False)
def serving_points(results: str) -> Loaded:
    """Every row of the serving table (``tpubench serving``, ``tpubench import``): a row per
    load point, read whole, as the ceilings; empty for a store without one."""
    try:
        return _scan(results, "serving")
    except store.StoreError:
        return Loaded(store.TABLES["serving"].empty_table().to_pandas())


#: the serving figures Trends follows (``tpubench regressions --serving --metric``)
SERVING_TREND_METRICS = {
    "tpot_p50_ms": "TPOT p50 (ms)",
    "ttft_p50_ms": "TTFT p50 (ms)",
    "output_throughput": "output tokens/s",
    "request_goodput": "goodput (requests/s)",
    "cold_start_s": "cold start (s)",
}


def serving_trend_points(results: str) -> pd.DataFrame:
    """The store's serving points with a ``series`` label (one per serving configuration,
    :func:`serving_compare.series_labels`) and a ``backend`` column (the engine) that the
    trend chart colours by."""
    frame = serving_points(results).frame.copy()
    frame["series"] = serving_compare.series_labels(frame)
    frame["backend"] = frame["engine"].fillna("unknown engine")
    return frame


@st.cache_data(ttl=TTL_S, show_spinner="Looking for change points ...")
def serving_change_points(results: str, invocations: tuple[str, ...], metric: str) -> pd.DataFrame:
    """:func:`changepoints.serving_change_points` of the serving points of ``invocations``,
    with a ``series`` label as :func:`serving_trend_points` gives."""
    points = serving_points(results).frame
    found = changepoints.serving_change_points(points[points["invocation_id"].isin(invocations)], metric)
    found["series"] = serving_compare.series_labels(found) if not found.empty else pd.Series(dtype="string")
    return found


@st.cache_data(ttl=TTL_S, show_spinner=False)
def compiles(results: str, invocations: tuple[str, ...], run_ids: tuple[str, ...] | None = None) -> Loaded:
    """Rows of the compiles table from ``invocations``' files only (of ``run_ids`` if given);
    empty for a store from before the table."""
    filters: dict[str, object] = {"invocation_id": list(invocations)}
    if run_ids is not None:
        filters["run_id"] = list(run_ids)
    return _scan(results, "compiles", **filters)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def ceilings(results: str) -> Loaded:
    """Every row of the ceilings table (``tpubench ceilings``); empty for a store without one.
    A small table (a row per sweep point), read whole, from the index kept between servers
    (each sweep is an invocation of its own: a year of them was 134 files to open again on
    every page that shows MFU against a ceiling)."""
    return _read_ceilings(results)


def _read_ceilings(results: str) -> Loaded:
    try:
        return _scan(results, "ceilings", tuple(store.TABLES["ceilings"].names), read=_indexed)
    except store.StoreError:
        return Loaded(store.TABLES["ceilings"].empty_table().to_pandas())


@dataclass(frozen=True)
class CeilingsRead:
    """What a page needs of a read of the ceilings table besides what is made of its rows:
    the unreadable files skipped, whether any point measured, and the versions of the kept
    indexes read (:func:`tpubench.store_index.version`, one per store)."""

    skipped: tuple[str, ...]
    measured: bool
    versions: tuple[int | None, ...]


@st.cache_data(ttl=TTL_S, show_spinner=False)
def ceilings_read(results: str) -> CeilingsRead:
    """Reads the store's ceilings (the kept index: only changed files), at most once per
    expiry of the cache, and says what :class:`CeilingsRead` holds, not the rows: Streamlit's
    cache pickles what it keeps and unpickles it on every call, and a year's sweeps with
    their samples took 0.14 s each way, four times on every render of the Ceilings page."""
    loaded = _read_ceilings(results)
    measured = not loaded.frame.empty and bool((loaded.frame["status"] == "ok").any())
    columns = tuple(store.TABLES["ceilings"].names)
    versions = tuple(store_index.version(location, "ceilings", columns) for location in stores(results))
    return CeilingsRead(loaded.skipped, measured, versions)


#: what :func:`_of_ceilings` made of each store's ceilings, by the kept index it came from
_OF_CEILINGS: dict[tuple[str, str], tuple[tuple[int | None, ...], pd.DataFrame]] = {}


def _of_ceilings(results: str, what: str, make: Callable[[pd.DataFrame], pd.DataFrame]) -> pd.DataFrame:
    """``make`` of the store's ceilings table, made again only when the kept index of the table
    changed: an analysis of a year's sweeps (134 of them) took a second of CPU, after every
    expiry of the cache or Reload, on the Ceilings page and every page showing MFU against one.
    The rows are read only to make it (:func:`ceilings_read` says whether they changed)."""
    versions = ceilings_read(results).versions
    known, made = _OF_CEILINGS.get((results, what), ((), None))
    if made is None or known != versions or None in versions:
        made = make(_read_ceilings(results).frame)
        _OF_CEILINGS[(results, what)] = (versions, made)
    return made


@st.cache_data(ttl=TTL_S, show_spinner=False)
def matmul_ceilings(results: str) -> pd.DataFrame:
    """The store's matmul ceiling per device and dtype (:func:`tpubench.analysis.ceilings.matmul_ceilings`):
    computed once per read of the ceilings table, not again on every rerun of the pages that show
    MFU against it."""
    return _of_ceilings(results, "matmul", ceilings_analysis.matmul_ceilings)


def with_attained(results: str, runs: pd.DataFrame) -> pd.DataFrame:
    """``runs`` with ``mfu_attained`` against the store's measured ceilings, as ``tpubench
    compare`` computes it (:func:`tpubench.analysis.ceilings.attach_attained`)."""
    return ceilings_analysis.attach_ceilings(runs, matmul_ceilings(results))


@st.cache_data(ttl=TTL_S, show_spinner=False)
def ceilings_summary(results: str) -> pd.DataFrame:
    """``tpubench ceilings --show``'s lines of the store (:func:`tpubench.analysis.ceilings.summary`),
    once per read of the table: no filter changes them, and the Ceilings page reruns on each."""
    return _of_ceilings(results, "summary", ceilings_analysis.summary)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def ceilings_curves(results: str, kind: str) -> pd.DataFrame:
    """A kind's curves of the store's ceilings (:func:`tpubench.analysis.ceilings.curves`), once
    per read of the table, as :func:`ceilings_summary`."""
    return _of_ceilings(results, f"curves {kind}", lambda frame: ceilings_analysis.curves(frame, kind))


@st.cache_data(ttl=TTL_S, show_spinner=False)
def roofline_ceilings(results: str) -> pd.DataFrame:
    """The store's measured ceilings as the Ops page's roofline reads them
    (:func:`tpubench.analysis.ceilings.roofline_frame`)."""
    return _of_ceilings(results, "roofline", ceilings_analysis.roofline_frame)


#: what the roofline of a profiled run reads of its runs row (:func:`run_roofline`)
ROOFLINE_RUN_COLUMNS = ("run_id", "backend", "device", "dtype", "backend_metrics", "precision")


@st.cache_data(ttl=TTL_S, show_spinner=False)
def run_roofline(results: str, invocation: str, run_id: str) -> tuple[pd.DataFrame, roofline.RooflineCeilings]:
    """A profiled run's ops against its ceilings, by op and shape
    (:func:`tpubench.analysis.roofline.roofline`), and those ceilings: the store's measured
    ones for its device and what its matmuls ran in (fp8 for a float8 run:
    :func:`tpubench.analysis.ceilings.matmul_dtype`), else the data sheet's. Cached by run: the
    Ops page made it again on every rerun, a filter change included."""
    run = runs(results, (invocation,), (run_id,), ROOFLINE_RUN_COLUMNS).frame
    first = run.iloc[0] if len(run) else pd.Series({"backend": "", "device": "", "dtype": ""})
    ceilings = roofline.ceilings_for(
        str(first["device"]),
        roofline.device_kind(first["backend"], first["device"]),
        str(ceilings_analysis.matmul_dtype(first["dtype"], first.get("backend_metrics"), first.get("precision"))),
        roofline_ceilings(results),
    )
    return roofline.roofline(run_ops(results, invocation, run_id).frame, ceilings, by="shape"), ceilings


@st.cache_data(ttl=TTL_S, show_spinner=False)
def run_step_shares(results: str, invocation: str, run_id: str) -> pd.DataFrame:
    """Where a profiled run's traced step went (:func:`tpubench.analysis.roofline.step_shares`,
    against :func:`run_roofline`'s ceilings), cached by run as that is."""
    _, ceilings = run_roofline(results, invocation, run_id)
    return roofline.step_shares(run_ops(results, invocation, run_id).frame, ceilings)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def memory(results: str, invocation: str, run_id: str) -> Loaded:
    """One run's rows of the memory table (its breakdown per rank, its profiled timeline);
    empty for a store from before the table."""
    return _scan(results, "memory", invocation_id=invocation, run_id=run_id)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def serving_curves(results: str) -> pd.DataFrame:
    """The store's serving points as curves, priced (:func:`tpubench.analysis.serving.curves`;
    prices: the built-in table or ``$TPUBENCH_PRICES``), once per read of the table."""
    return serving_analysis.curves(serving_points(results).frame, load_prices())


@st.cache_data(ttl=TTL_S, show_spinner=False)
def serving_requests(results: str, invocation: str, run_id: str) -> Loaded:
    """One serving point's requests (the serving_requests table, from its invocation's file):
    lengths, send time, TTFT, TPOT, E2EL and every chunk gap; empty where none were kept."""
    try:
        return _scan(results, "serving_requests", invocation_id=invocation, run_id=run_id)
    except store.StoreError:
        return Loaded(store.TABLES["serving_requests"].empty_table().to_pandas())
