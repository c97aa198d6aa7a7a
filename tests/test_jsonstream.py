"""The Chrome reader's event stream gives every event a full parse gives, wherever the chunks
end, and a truncated or corrupt document is an error wherever it breaks."""

from __future__ import annotations

import gzip
import io
import json
from pathlib import Path

import pytest

from tpubench.traces import jsonstream
from tpubench.traces.jsonstream import JSONStreamError, trace_events

RECORDED = Path(__file__).parent / "data" / "gloo_fsdp2_rank0.json.gz"


def events(text: str) -> list:
    return list(trace_events(io.StringIO(text)))


@pytest.mark.parametrize("chunk", [1, 7, 4096, 1 << 22])
def test_every_event_of_a_recorded_trace_whatever_the_chunk(chunk: int, monkeypatch: pytest.MonkeyPatch) -> None:
    text = gzip.decompress(RECORDED.read_bytes()).decode()
    monkeypatch.setattr(jsonstream, "CHUNK", chunk)
    found = events(text)
    assert found == json.loads(text)["traceEvents"]
    assert [type(e.get("ts")) for e in found] == [type(e.get("ts")) for e in json.loads(text)["traceEvents"]]


@pytest.mark.parametrize("chunk", [1, 2, 3, 5, 1 << 22])
def test_values_cut_by_a_chunk_read_on(chunk: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """A number the chunk cuts ("1" of "1e5") reads whole; other members and repeated arrays are as JSON has them."""
    monkeypatch.setattr(jsonstream, "CHUNK", chunk)
    text = '{"n": -12.5e+3, "traceEvents": [12, 1e5, -2.5e-3, "x", true, null, {"a": [1, {"b": []}]}], "z": 1e5}'
    assert events(text) == [12, 1e5, -2.5e-3, "x", True, None, {"a": [1, {"b": []}]}]
    assert events('{"traceEvents": [1], "other": {"traceEvents": [9]}, "traceEvents": [2]}') == [1, 2]
    assert events("[1, 2]") == events("{}") == events('{"traceEvents": {"a": 1}}') == []


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "the file ends where a value should start at character 0"),
        ('{"traceEvents": [{"ph": "X", "ts": 1', "the file ends inside a value"),
        ('{"traceEvents": [{"ph": "X"}], "n": 12', "expected ',' or '}' between an object's members, found the end"),
        ('{"traceEvents": [{"ph": "X"},]}', "no JSON value starts here at character 29"),
        ('{"traceEvents": [1 2]}', "expected ',' or ']' between events, found '2'"),
        ('{"traceEvents": [1]} x', "extra data after the document"),
    ],
)
def test_a_truncated_or_corrupt_document_is_an_error_wherever_it_breaks(
    text: str, reason: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for chunk in (1, 3, 1 << 22):
        monkeypatch.setattr(jsonstream, "CHUNK", chunk)
        with pytest.raises(JSONStreamError, match=reason.replace("[", r"\[")):
            events(text)
