"""What every page shares: the sidebar's filters, the empty state, the warning banner, pickers.

``app.py`` calls :func:`sidebar` on every run, before the page; a page starts with
:func:`page_view`, which hands it the filtered runs or draws why there are none.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import streamlit as st
from PIL import Image, ImageDraw

from dashboard import charts, data, state
from tpubench.analysis.nulls import is_missing
from tpubench.analysis.shapes import whole_numbers
from tpubench.store import StoreError

_VIEW = "_view"
#: a picker lists at most this many runs (newest first): thousands of options make every rerun slow
RUN_CHOICES = 200
#: the sidebar's multiselect filters: runs column -> label
FILTER_LABELS = {
    "suite": "Suite",
    "workload": "Workload",
    "size": "Size",
    "backend": "Backend",
    "device": "Device",
    "mode": "Mode",
    "dtype": "Dtype",
}


@dataclass
class View:
    """The store and the runs the sidebar's filters keep (index columns: :data:`data.INDEX_COLUMNS`)."""

    results: str
    index: pd.DataFrame
    runs: pd.DataFrame
    skipped: tuple[str, ...] = ()
    problem: str | None = None  # why there is nothing to show: "missing", "empty", or the error reading it
    filters: data.Filters = field(default_factory=data.Filters)  # the sidebar's choice that kept ``runs``


def sidebar() -> None:
    """Draw the filters from the store's index and keep the resulting view for the page."""
    results = data.results_location()
    st.sidebar.caption("Results: " + ", ".join(f"`{location}`" for location in data.stores(results)))
    try:
        loaded = data.run_index(results)
    except StoreError:
        st.session_state[_VIEW] = View(results, pd.DataFrame(), pd.DataFrame(), problem="missing")
        return
    except Exception as error:  # object storage raises its own: no credentials, no such bucket, no network
        problem = f"{type(error).__name__}: {error}"
        st.session_state[_VIEW] = View(results, pd.DataFrame(), pd.DataFrame(), problem=problem)
        return
    index = loaded.frame
    if index.empty:
        st.session_state[_VIEW] = View(results, index, index, loaded.skipped, problem="empty")
        return
    chosen = []
    choices = data.filter_choices(results, index, tuple(FILTER_LABELS))
    for column, label in FILTER_LABELS.items():
        options = choices[column]
        key = state.bind(column, [], "list", options)
        chosen.append((column, tuple(st.sidebar.multiselect(label, options, key=key, placeholder="all"))))
    tag_options = choices["tag_pairs"]
    tags = st.sidebar.multiselect(
        "Tags",
        tag_options,
        key=state.bind("tag", [], "list", tag_options),
        placeholder="any" if tag_options else "no run has tags",
        help="`--tag KEY=VALUE` of `tpubench run`: a run must have one of the chosen values of each chosen key.",
    )
    days = st.sidebar.date_input(
        "Dates (UTC)",
        value=(),  # a range picker; what it holds comes from the session (and at first from the URL)
        key=state.bind("dates", (), "dates"),
        help="Runs started on these days. Leave empty for all.",
    )
    since, until = (*tuple(days), None, None)[:2]
    filters = data.Filters(tuple(chosen), tuple(tags), since, until)
    reload_help = f"Read the store again (new runs also appear by themselves within {data.TTL_S // 60} minutes)."
    if st.sidebar.button("Reload results", help=reload_help):
        st.cache_data.clear()
        st.rerun()
    st.session_state[_VIEW] = View(
        results, index, data.filtered(results, index, filters), loaded.skipped, filters=filters
    )


def empty_state(view: View) -> None:
    """No results yet: say so, and give the command that makes some (or why the store cannot be read)."""
    if view.problem not in ("missing", "empty"):
        st.error(f"The results store `{view.results}` cannot be read: {view.problem}")
        return
    where = "does not exist yet" if view.problem == "missing" else "has no runs yet"
    first = data.stores(view.results)[0]
    results = first if " " not in first else f"'{first}'"
    st.info(f"The results store `{first}` {where}. Run a suite to fill it, then reload this page:")
    st.code(f"tpubench run --suite llm --results {results}", language="bash")
    st.caption("`tpubench list` shows the suites and workloads; `tpubench env` the backends this machine has.")


def warn_skipped(skipped: tuple[str, ...]) -> None:
    """A banner naming the files the store could not read (the rest of the page still works)."""
    if skipped:
        st.warning("Some results files could not be read and were left out:\n\n" + "\n".join(f"- {m}" for m in skipped))


def page_view() -> View | None:
    """The page's view, or None after drawing why there is nothing to show."""
    view: View = st.session_state[_VIEW]
    warn_skipped(view.skipped)
    return view if has_runs(view) else None


def has_runs(view: View) -> bool:
    """Whether ``view`` has runs to show; else draws why not (a page that first asked
    :func:`store_view`, whose skipped files are already said)."""
    if view.problem:
        empty_state(view)
        return False
    if view.runs.empty:
        st.info("No runs match the filters in the sidebar. Clear some of them to see runs.")
        return False
    return True


def store_view() -> View | None:
    """The view of a page that reads a table of its own (Ceilings), which a store without
    runs may still have: None after drawing why the store cannot be read or does not exist."""
    view: View = st.session_state[_VIEW]
    warn_skipped(view.skipped)
    if view.problem and view.problem != "empty":
        empty_state(view)
        return None
    return view


def invocation_picker(
    runs: pd.DataFrame, label: str = "Invocation", key: str = "invocation", default: str | None = None
) -> str:
    """A choice among the invocations of ``runs``, newest first; the default is ``default``, else
    the newest."""
    table = data.invocations(runs)
    # made over columns, not a row at a time: a year of a fleet's nights is 4,000 labels on every rerun
    text = table["started_at"].dt.strftime("%Y-%m-%d %H:%M") + " UTC · " + table["invocation_id"] + " · "
    text += table["runs"].astype(str) + " runs"
    text = text.where(table["not_ok"] == 0, text + ", " + table["not_ok"].astype(str) + " not ok")
    labels = dict(zip(table["invocation_id"], text, strict=True))
    options = list(labels)
    state.bind(key, default if default in labels else options[0], choices=options)
    return st.selectbox(
        label, options, format_func=labels.__getitem__, key=key, help="A `tpubench run` invocation: newest first."
    )


def run_picker(
    candidates: pd.DataFrame,
    index: pd.DataFrame,
    label: str,
    key: str = "run",
    total: int | None = None,
    needs: str | None = None,
) -> str | None:
    """A choice among the newest :data:`RUN_CHOICES` runs of ``candidates`` (of ``total``, where
    the caller passed only the newest), plus the one the URL names if the store has it with
    ``needs`` set (a link to a run works whatever the filters). None when there is none."""
    wanted = st.session_state.get(key) or next(iter(st.query_params.get_all(key)[-1:]), None)
    recent = candidates.tail(RUN_CHOICES).iloc[::-1]  # not a reversed copy of 100,000 rows
    if wanted and wanted not in set(recent["run_id"]):
        try:
            found = index.iloc[[data.position_of(index, wanted)]]
        except KeyError:
            found = index.iloc[0:0]
        found = found if needs is None else found[found[needs].notna()]
        if found.empty:
            st.warning(f"There is no run `{wanted}` in this store; pick one below.")
        recent = pd.concat([found, recent])
    if recent.empty:
        return None
    labels = dict(zip(recent["run_id"], data.run_label(recent), strict=True))
    options = list(labels)
    state.bind(key, options[0], choices=options)
    total = len(candidates) if total is None else total
    if total > RUN_CHOICES:
        label += f" (the newest {RUN_CHOICES} of {total:,}; narrow the filters for older ones)"
    return st.selectbox(label, options, format_func=labels.__getitem__, key=key)


def invocation_of(view: View, run_id: str) -> str:
    """The invocation that stored ``run_id``, whatever the filters."""
    return view.index["invocation_id"].iloc[data.position_of(view.index, run_id)]


def table(data: Any, links: tuple[str, ...] = (), where: Any = st, **options: Any) -> None:
    """A table as every page shows one: full width, no index, missing values as a dash, and
    ``links`` (columns of relative URLs such as ``run_details?run=ID``) as "open run" links."""
    config = {column: st.column_config.LinkColumn(column, display_text="open run") for column in links}
    if isinstance(data, pd.DataFrame):
        data = whole_numbers(data)  # 128, not 128.0, beside an image row's empty seq_len
    options = {"hide_index": True, "width": "stretch", "placeholder": "-", **options}
    where.dataframe(data, column_config=config, **options)


def number(value: Any, digits: int = 2, suffix: str = "") -> str:
    """``value`` for a table cell: thousands separated, missing as a dash."""
    if is_missing(value):
        return "-"
    return f"{value:,.{digits}f}{suffix}"


def results_of(view: View, *run_ids: str) -> str:
    """``--results`` for a terminal command about ``run_ids``: the store that holds them."""
    return data.store_of(view.results, view.index, list(run_ids)) or data.stores(view.results)[0]


def trace_command(view: View, run_id: str) -> str:
    """The command that opens a run's trace in its viewer (on 127.0.0.1)."""
    return f"tpubench trace {run_id} --open --results {results_of(view, run_id)}"


@st.cache_resource
def favicon() -> Image.Image:
    """The browser tab's icon, drawn here and served by Streamlit from 127.0.0.1. A Material icon
    name (``:material/speed:``) makes the browser fetch it from fonts.gstatic.com, and an emoji
    from a CDN: a dashboard of private results reaches no third party, and works offline."""
    image = Image.new("RGBA", (64, 64), (0, 0, 0, 0))
    draw = ImageDraw.Draw(image)
    draw.ellipse((4, 4, 60, 60), fill=charts.colour("cpu-compile"))
    draw.pieslice((14, 14, 50, 50), 180, 360, fill="white")  # a gauge: half a dial and its needle
    draw.line((32, 32, 46, 20), fill=charts.colour("xla-compile"), width=5)
    return image
