"""The items of a JSON document's top-level ``traceEvents`` array, one at a time, in memory
that follows the largest item, not the file.

A Chrome trace is one object whose ``traceEvents`` array holds every event. The text is
read a MiB at a time and each event is decoded by the standard library's C scanner
(``json``'s ``scan_once``, what ``json.loads`` runs), which builds an event about 1.4x
faster than ijson's yajl2 C backend (0.13 against 0.18 CPU s for a 12 MB trace of gpt2
tiny training here) and gives the same values: ints for integers, floats for the rest.
The rest of the document is checked as JSON and skipped, so a truncated or corrupt file is
a :class:`JSONStreamError` wherever it breaks, as with a full parse.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import IO, Any

#: characters read at a time: thousands of events; 4 MiB cost a 12 MB trace's ingest 11 MB
#: more peak memory and no less time
CHUNK = 1 << 20
#: the most characters one value may take: a value still unfinished this far past its
#: start is corrupt, not cut by a chunk's end (torch.profiler's events are under a few KB)
LONGEST_VALUE = 1 << 26

_SPACE = re.compile(r"[ \t\n\r]*")
_COMMA = re.compile(r"[ \t\n\r]*,[ \t\n\r]*")
#: the chunk ends within what may be more of a number ("1" of "1e5" scans as 1)
_NUMBER_GOES_ON = re.compile(r"[0-9.eE+-]*\Z")


class JSONStreamError(ValueError):
    """Not JSON, or JSON cut short: the reason, as one line."""


class _Reader:
    """A window on the text: ``text[at:]`` is what is left of the part read so far."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream
        self.text = stream.read(CHUNK)
        self.at = 0
        self.passed = 0  # characters before text[0]: where an error is, in the file
        self.done = len(self.text) < CHUNK
        self.scan = json.JSONDecoder().scan_once

    def more(self) -> bool:
        """Read the next chunk onto what is left; False at the end of the file."""
        if self.done:
            return False
        extra = self.stream.read(CHUNK)
        self.done = len(extra) < CHUNK
        if not extra:
            return False
        self.passed += self.at
        self.text = self.text[self.at :] + extra
        self.at = 0
        return True

    def peek(self) -> str:
        """The next character that is not white space ("" at the end of the file)."""
        while True:
            self.at = _SPACE.match(self.text, self.at).end()
            if self.at < len(self.text) or not self.more():
                return self.text[self.at : self.at + 1]

    def expect(self, allowed: str, where: str) -> str:
        found = self.peek()
        if not found or found not in allowed:
            seen = repr(found) if found else "the end of the file"
            raise self.error(f"expected {' or '.join(map(repr, allowed))} {where}, found {seen}")
        self.at += 1
        return found

    def value(self) -> Any:
        """The JSON value that starts at the next character, read on across chunks."""
        self.peek()
        while True:
            try:
                found, end = self.scan(self.text, self.at)
            except StopIteration:  # no value starts here
                error, where = "no JSON value starts here", self.at
                if self.at == len(self.text):
                    error = "the file ends where a value should start"
            except json.JSONDecodeError as failure:
                error, where = failure.msg, failure.pos
            else:
                if self.done or not _NUMBER_GOES_ON.match(self.text, end):  # else read on: "1" of "1e5"
                    self.at = end
                    return found
                error = where = None
            if len(self.text) - self.at > LONGEST_VALUE or not self.more():
                if error is None:  # the file ended where the value did
                    self.at = end
                    return found
                if not self.done:
                    error, where = f"a value longer than {LONGEST_VALUE:,} characters", self.at
                elif where >= len(self.text) and self.at < len(self.text):
                    error = f"the file ends inside a value ({error})"
                raise JSONStreamError(f"{error} at character {self.passed + where:,}")

    def error(self, reason: str) -> JSONStreamError:
        return JSONStreamError(f"{reason} at character {self.passed + self.at:,}")


def trace_events(stream: IO[str]) -> Iterator[Any]:
    """Each item of the top-level object's ``traceEvents`` arrays, then a check that the
    document ends as JSON does. A top level that is not an object holds no events."""
    reader = _Reader(stream)
    if reader.peek() == "{":
        reader.at += 1
        yield from _members(reader)
    else:
        reader.value()  # JSON or not
    if reader.peek():
        raise reader.error(f"extra data after the document: {reader.text[reader.at : reader.at + 20]!r}")


def _members(reader: _Reader) -> Iterator[Any]:
    """The top-level object's members after its ``{``, up to its ``}``: the items of its
    ``traceEvents`` array, the other values read and dropped."""
    if reader.peek() == "}":
        reader.at += 1
        return
    while True:
        key = reader.value()
        if not isinstance(key, str):
            raise reader.error(f"expected an object key, found {key!r}")
        reader.expect(":", "after an object key")
        if key == "traceEvents" and reader.peek() == "[":
            reader.at += 1
            yield from _items(reader)
        else:
            reader.value()
        if reader.expect(",}", "between an object's members") == "}":
            return


def _items(reader: _Reader) -> Iterator[Any]:
    """An array's items after its ``[``, up to its ``]``. The loop runs once per event, so
    the usual case (an item, a comma, white space, all inside the chunk) takes one scan and
    one match; anything else (the chunk's end, the array's, an error) goes the careful way."""
    if reader.peek() == "]":
        reader.at += 1
        return
    scan, comma = reader.scan, _COMMA.match
    while True:
        try:
            item, end = scan(reader.text, reader.at)
            after = comma(reader.text, end)
        except (StopIteration, json.JSONDecodeError):
            after = None
        if after is not None and after.end() < len(reader.text):
            reader.at = after.end()
            yield item
            continue
        yield reader.value()
        if reader.expect(",]", "between events") == "]":
            return
        reader.peek()
