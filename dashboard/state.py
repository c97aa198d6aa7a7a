"""The view's state in the URL, so that a link opens the same view.

The one helper between widgets and ``st.query_params``. A widget's key is bound with
:func:`bind` before the widget is drawn: the first time a session meets the key, its value
comes from the URL (a pasted link), checked against the widget's choices. After the page
has run, :func:`publish` writes every key bound in this run back to the URL, leaving
defaults out; it has to run every time because Streamlit clears the query string when
the user switches pages. Parameters no longer bound are dropped, so the URL names this
page's view and nothing else.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date
from typing import Any

import streamlit as st

_BOUND = "_url_bound"  # session key: what this run bound, key -> Param
#: query parameters Streamlit itself uses, left alone
RESERVED = frozenset({"embed", "embed_options"})


@dataclass(frozen=True)
class Param:
    key: str  # the widget's key and the URL parameter's name
    default: Any
    kind: str  # "text" (a str), "list" (repeated parameter), "int", "bool" or "dates" (START..END)

    def encode(self, value: Any) -> list[str]:
        if self.kind == "list":
            return [str(v) for v in value]
        if self.kind == "dates":
            return ["..".join(day.isoformat() for day in value)] if value else []
        if self.kind == "bool":
            return ["1" if value else "0"]
        return [] if value is None else [str(value)]

    def decode(self, texts: list[str]) -> Any:
        """The value ``texts`` (the parameter's values in the URL) stand for; ValueError if none."""
        if self.kind == "list":
            return list(dict.fromkeys(texts))
        text = texts[-1]
        if self.kind == "dates":
            return tuple(date.fromisoformat(part) for part in text.split("..")[:2] if part)
        if self.kind == "int":
            return int(text)
        if self.kind == "bool":
            return text == "1"
        return text


def begin() -> None:
    """Start a run: nothing is bound yet."""
    st.session_state[_BOUND] = {}


def bind(key: str, default: Any, kind: str = "text", choices: Sequence[Any] | None = None) -> str:
    """Make ``key`` part of the URL state and give it a value before its widget is drawn.

    The value is the URL's on the session's first meeting with ``key``, else what the widget
    holds; one outside ``choices`` (a stale link, a run that is gone) falls back to
    ``default`` (list kinds keep the members that are valid). Returns ``key``.
    """
    param = Param(key, default, kind)
    st.session_state.setdefault(_BOUND, {})[key] = param
    if key not in st.session_state:
        texts = st.query_params.get_all(key)
        try:
            st.session_state[key] = param.decode(texts) if texts else default
        except ValueError:
            st.session_state[key] = default
    if choices is not None:
        value, valid = st.session_state[key], list(choices)
        if kind == "list":
            kept = [v for v in value if v in valid]
            if kept != value:
                st.session_state[key] = kept
        elif value not in valid:
            st.session_state[key] = default
    return key


def publish() -> None:
    """Write the values bound in this run to the URL (defaults left out), and drop the rest."""
    bound: dict[str, Param] = st.session_state.get(_BOUND, {})
    wanted = {}
    for key, param in bound.items():
        value = st.session_state.get(key, param.default)
        if value != param.default and (encoded := param.encode(value)):
            wanted[key] = encoded
    current = {key: st.query_params.get_all(key) for key in st.query_params if key not in RESERVED}
    if current == wanted:
        return  # an unchanged URL sends the browser nothing
    for key in current.keys() - wanted.keys():
        del st.query_params[key]
    for key, values in wanted.items():
        if current.get(key) != values:
            st.query_params[key] = values if len(values) > 1 else values[0]
