"""The ``tpubench`` command line, one module per command group.

``common`` holds the app and the input checks every command shares; importing a command
module registers its commands on the app. :func:`main` imports only the module of the
command it is asked for (all of them for ``--help``): the analysis commands bring scipy,
plotly and ruptures, which ``tpubench run`` would otherwise import for nothing before its
first run starts (0.6 s of a tiny suite's fixed cost).
"""

from __future__ import annotations

import importlib
import sys
import warnings
from typing import TextIO

import typer
from typer.exceptions import TyperException

from tpubench.cli.common import app

#: each command and the module that registers it
COMMANDS = {
    "list": "info",
    "env": "info",
    "run": "run",
    "ops": "ops",
    "trace": "ops",
    "roofline": "roofline",
    "compiles": "compiles",
    "compare": "compare",
    "regressions": "compare",
    "report": "compare",
    "export": "compare",
    "ci": "ci",
    "dashboard": "dashboard",
    "scaling": "scaling",
    "ceilings": "ceilings",
    "memory": "memory",
    "parity": "parity",
    "serving": "serving",
    "import": "imports",
    "compact": "compact",
}


def load_commands(argv: list[str]) -> None:
    """Register the command ``argv`` names, or every command when it names none we know; none
    for ``--version``, which the app's eager option answers before any command is looked at
    (loading them all, with pandas and plotly, made it take 2.3 s)."""
    if argv[1:] == ["--version"]:
        return
    wanted = COMMANDS.get(argv[1]) if len(argv) > 1 else None
    for module in [wanted] if wanted else dict.fromkeys(COMMANDS.values()):
        importlib.import_module(f"tpubench.cli.{module}")


PYTHON_SHOWWARNING = warnings.showwarning


def show_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: TextIO | None = None,
    line: str | None = None,
) -> None:
    """tpubench's own warnings (a store file skipped as unreadable) as one ``warning:`` line on
    stderr; Python's format (the source file, line and code of the ``warn`` call) says nothing
    to a user. Other libraries' warnings keep that format."""
    if issubclass(category, UserWarning) and category.__module__.split(".")[0] == "tpubench":
        print(f"warning: {message}", file=file or sys.stderr)
    else:
        PYTHON_SHOWWARNING(message, category, filename, lineno, file, line)


def main() -> None:
    warnings.showwarning = show_warning
    load_commands(sys.argv)
    try:
        code = app(standalone_mode=False)
    except TyperException as error:  # our BadInput and the parser's usage errors alike
        print(f"error: {error.format_message()}", file=sys.stderr)
        sys.exit(error.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)
