"""Selectors: pick runs out of the runs table by tag, invocation, git sha, date or any column.

A selector is text a user types (``tpubench compare --baseline SEL``): comma-separated
terms, all of which a run must satisfy.

=====================  =============================================================
``latest``             the runs of the most recent invocation among those the other terms keep
``previous``           the invocation before that one (``--baseline previous --candidate latest``:
                       tonight against last night)
``invocation=ID``      ``invocation_id`` equal to ID or starting with it
``sha=ABC``            ``git_sha`` starting with ABC (``git_sha`` ends in ``+dirty`` for an edited tree)
``date=YYYY-MM-DD``    started on that UTC day; ``since=DATE`` and ``until=DATE`` bound the day
``tag.KEY=VALUE``      the run was started with ``--tag KEY=VALUE``
``COLUMN=VALUE``       any runs column equal to VALUE (``backend=cuda``, ``batch_size=8``)
``COLUMN!=VALUE``      not equal
``COLUMN~TEXT``        contains TEXT, case aside (``device~TPU``)
=====================  =============================================================

:func:`select_runs` applies the terms in order; when one leaves nothing it raises
:class:`NoRunsMatch` naming the field and the values that do exist, because "no runs"
alone sends a user guessing.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pandas as pd

from tpubench.schema import RUNS

#: short names users type for the columns they select by most
ALIASES = {"invocation": "invocation_id", "sha": "git_sha", "run": "run_id"}
#: columns matched by prefix as well as in full: ids are long and users paste the start
PREFIX_COLUMNS = frozenset({"invocation_id", "git_sha", "run_id"})
_TERM = re.compile(r"^(?P<field>[A-Za-z_][\w.-]*?)\s*(?P<op>!=|=|~)\s*(?P<value>.*)$")
#: terms that pick an invocation by how recent it is (0: the newest), after the other terms
RECENCY = {"latest": 0, "previous": 1}
#: how an error names a field: as users type it, and a recency term by what it picks
ERROR_FIELD_NAMES = {"invocation_id": "invocation", "git_sha": "sha", **dict.fromkeys(RECENCY, "invocation")}
#: at most this many existing values are named in an error
SHOWN_VALUES = 12


class SelectorError(ValueError):
    """A selector that cannot be parsed (an unknown column, a malformed term or date)."""


class NoRunsMatch(SelectorError):
    """A well-formed selector that matches no run; the message names the values that exist."""


@dataclass(frozen=True)
class Term:
    """One ``field op value`` condition (``latest`` and ``previous`` are fields with no op)."""

    field: str
    op: str
    value: str

    def __str__(self) -> str:
        return self.field if self.field in RECENCY else f"{self.field}{self.op}{self.value}"


def parse_selector(text: str, columns: Sequence[str] = RUNS.names) -> list[Term]:
    """The terms of ``text``; a SelectorError names the first one that is not understood.
    ``columns`` are those a term may name (another table's: the ceilings table's)."""
    terms = []
    for raw in (part.strip() for part in text.split(",")):
        if not raw:
            continue
        if raw in RECENCY:
            terms.append(Term(raw, "", ""))
            continue
        match = _TERM.match(raw)
        if not match:
            raise SelectorError(
                f"cannot read selector term {raw!r}: expected latest, previous, COLUMN=VALUE, COLUMN!=VALUE, "
                "COLUMN~TEXT, tag.KEY=VALUE, invocation=ID, sha=ABC, date=/since=/until=YYYY-MM-DD"
            )
        field, op, value = match["field"], match["op"], match["value"].strip()
        field = ALIASES.get(field, field)
        if field in ("date", "since", "until"):
            if op != "=":
                raise SelectorError(f"{field} takes '=', as in {field}=2026-11-30")
            try:
                pd.Timestamp(value)
            except ValueError as error:
                raise SelectorError(f"{field}={value}: not a date (YYYY-MM-DD)") from error
        elif not field.startswith("tag.") and field not in columns:
            raise SelectorError(
                f"unknown field {field!r} in selector term {raw!r}; use tag.KEY for tags, "
                f"or a column: {', '.join(columns)}"
            )
        terms.append(Term(field, op, value))
    if not terms:
        raise SelectorError("empty selector")
    return terms


def _tags(runs: pd.DataFrame) -> pd.Series:
    return runs["tags"].map(lambda text: json.loads(text) if isinstance(text, str) and text else {})


def _day(runs: pd.DataFrame) -> pd.Series:
    return pd.to_datetime(runs["started_at"], utc=True).dt.strftime("%Y-%m-%d")


def _values(runs: pd.DataFrame, term: Term) -> list[str]:
    """The distinct values of ``term``'s field among ``runs``, as text, most recent first."""
    runs = runs.sort_values("started_at", ascending=False, kind="stable")
    if term.field in RECENCY:
        values = [str(v) for v in runs["invocation_id"]]
    elif term.field.startswith("tag."):
        key = term.field[4:]
        values = [tags[key] for tags in _tags(runs) if key in tags]
        if not values:
            keys = sorted({k for tags in _tags(runs) for k in tags})
            return [f"(no run has tag {key!r}; tags: {', '.join(keys) or 'none'})"]
    elif term.field in ("date", "since", "until"):
        values = list(_day(runs))
    else:
        values = [str(v) for v in runs[term.field] if pd.notna(v)]
    distinct = list(dict.fromkeys(values))
    shown = distinct[:SHOWN_VALUES]
    return shown + ([f"... {len(distinct) - SHOWN_VALUES} more"] if len(distinct) > SHOWN_VALUES else [])


def _mask(runs: pd.DataFrame, term: Term) -> pd.Series:
    if term.field in RECENCY:
        newest_first = runs.groupby("invocation_id")["started_at"].max().sort_values(ascending=False, kind="stable")
        wanted = RECENCY[term.field]
        if len(newest_first) <= wanted:
            return pd.Series(False, index=runs.index)
        return runs["invocation_id"] == newest_first.index[wanted]
    if term.field.startswith("tag."):
        key = term.field[4:]
        found = _tags(runs).map(lambda tags: tags.get(key))
        return _compare(found.astype("object"), term)
    if term.field in ("date", "since", "until"):
        day, wanted = _day(runs), pd.Timestamp(term.value).strftime("%Y-%m-%d")
        return {"date": day == wanted, "since": day >= wanted, "until": day <= wanted}[term.field]
    column = runs[term.field]
    if term.op == "=" and term.field in PREFIX_COLUMNS:
        return column.astype("string").str.startswith(term.value).fillna(False).astype(bool)
    return _compare(column, term)


def _compare(column: pd.Series, term: Term) -> pd.Series:
    text = column.map(lambda v: None if v is None or (isinstance(v, float) and v != v) else str(v))
    checks: dict[str, Callable[[pd.Series], pd.Series]] = {
        "=": lambda t: t == term.value,
        "!=": lambda t: t != term.value,
        "~": lambda t: t.map(lambda v: v is not None and term.value.lower() in v.lower()),
    }
    return checks[term.op](text).fillna(False).astype(bool)


def select_runs(runs: pd.DataFrame, selector: str | list[Term], columns: Sequence[str] = RUNS.names) -> pd.DataFrame:
    """The rows of ``runs`` (a :func:`tpubench.store.load_runs` frame) that ``selector`` picks.

    ``latest`` and ``previous`` are applied after the other terms, so ``backend=cuda,latest``
    is the latest invocation that ran cuda, and ``backend=cuda,previous`` the one before it.
    Raises :class:`SelectorError` for a malformed selector and
    :class:`NoRunsMatch` when nothing is left, naming the values the failing field has.
    """
    terms = parse_selector(selector, columns) if isinstance(selector, str) else selector
    ordered = [t for t in terms if t.field not in RECENCY] + [t for t in terms if t.field in RECENCY]
    if runs.empty:
        raise NoRunsMatch("no runs in the results store")
    chosen = runs
    for term in ordered:
        kept = chosen[_mask(chosen, term)]
        if kept.empty:
            field = ERROR_FIELD_NAMES.get(term.field, term.field)
            raise NoRunsMatch(
                f"no runs match {term}"
                + (f" after {', '.join(str(t) for t in ordered[: ordered.index(term)])}" if chosen is not runs else "")
                + f"; {field} has: {', '.join(_values(chosen, term))}"
            )
        chosen = kept
    return chosen.reset_index(drop=True)
