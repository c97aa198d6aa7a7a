"""What every ``tpubench`` command shares: the app, the console, and the input checks.

Bad input (an unknown name, a nonsense number) raises :class:`BadInput`, which
:func:`tpubench.cli.main` prints as one ``error:`` line with exit code 2, never a traceback.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from typer.exceptions import TyperException

from tpubench.results_dir import is_remote

app = typer.Typer(
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    help="Benchmark the same PyTorch models on CPU, GPU and TPU backends.",
)


def _print_version(wanted: bool) -> None:
    if wanted:
        from tpubench.version import __version__

        print(f"tpubench {__version__}")
        raise typer.Exit()


@app.callback()
def command_group(
    version: Annotated[
        bool, typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """Always a group of commands, even when :func:`tpubench.cli.main` registered only the
    one it runs (typer would otherwise take a lone command as the whole program)."""


def console_width(environ: dict[str, str], tty: bool) -> int | None:
    """The terminal width tables are drawn to: ``COLUMNS`` when the user set it (piped or not:
    ``COLUMNS=80 tpubench compare | less`` was drawn 200 wide); else the terminal's (None) on a
    terminal, 200 when piped, so that CI logs and README examples are not squeezed into 80."""
    columns = environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    return None if tty else 200


#: what the CLI prints through. It reads no rich markup: what it prints holds users' text (an
#: error's first line, a model's name, a reason quoting either), in which ``[/i]`` raised a
#: MarkupError and ``[warning]`` vanished; styles are given as rich Text and Style objects
console = Console(width=console_width(dict(os.environ), sys.stdout.isatty()), markup=False)


class BadInput(TyperException):
    """Raised for user input we reject; printed as one line, exit code 2."""

    exit_code = 2


def choose(kind: str, wanted: list[str] | None, valid: list[str]) -> list[str]:
    for name in wanted or []:
        if name not in valid:
            raise BadInput(f"unknown {kind} {name!r}; valid: {', '.join(valid)}")
    return list(dict.fromkeys(wanted)) if wanted else []


def key_values(option: str, pairs: list[str] | None) -> dict[str, str]:
    parsed = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise BadInput(f"{option} expects KEY=VALUE, got {pair!r}")
        parsed[key] = value
    return parsed


def int_list(option: str, text: str | None) -> list[int] | None:
    """``"1,8,32"`` as ``[1, 8, 32]`` (a sweep); anything but positive integers is a BadInput."""
    if text is None:
        return None
    values = [part.strip() for part in text.split(",")]
    if not all(value.isdigit() and int(value) > 0 for value in values):
        raise BadInput(f"{option} expects positive integers separated by commas, got {text!r}")
    return list(dict.fromkeys(int(value) for value in values))


def writable_dir(option: str, path: Path) -> Path:
    """``path`` made absolute, created if missing; a BadInput if it cannot be written.

    Writability is tried for real (a file created and removed): permission bits do not
    tell root about a read-only mount or an immutable folder.
    """
    if path.exists() and not path.is_dir():
        raise BadInput(f"{option} {path}: not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as error:
        raise BadInput(f"{option} {path}: cannot write there ({error.strerror or error})") from error
    return path.resolve()


def writable_results(text: str, option: str = "--results") -> str | Path:
    """``--results``: a local directory (see :func:`writable_dir`) or an object-store URL,
    which gets a real write too (a probe object, removed), before anything runs."""
    if not is_remote(text):
        return writable_dir(option, Path(text))
    from tpubench import store  # pandas and pyarrow: only a bucket needs them this early

    try:
        location = store.Location(text)
        probe = location.join(f".tpubench-write-check-{os.getpid()}")
        location.fs.pipe_file(probe, b"")
        location.fs.rm(probe)
    except Exception as error:  # fsspec back ends raise their own types: a missing package, a denied bucket
        raise BadInput(f"{option} {text}: cannot write there ({type(error).__name__}: {error})") from error
    return text


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[list[int]]:
    """SIGTERM (a cancelled CI job, ``kill``) stops a command the way Ctrl-C does: a suite's run
    in flight is abandoned and finished runs are kept; an engine ``tpubench serving`` started is
    stopped. Yields the signals received."""
    received: list[int] = []

    def interrupt(signum: int, frame: object) -> None:
        received.append(signum)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield received
    finally:
        signal.signal(signal.SIGTERM, previous)
