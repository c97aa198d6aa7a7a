"""The ``tpubench`` command line, one module per command group.

``common`` holds the app and the input checks every command shares; importing a command
module registers its commands on the app.
"""

from __future__ import annotations

import sys

import typer
from typer.exceptions import TyperException

from tpubench.cli import ci, compare, dashboard, info, ops, run  # noqa: F401  (registers the commands)
from tpubench.cli.common import app


def main() -> None:
    try:
        code = app(standalone_mode=False)
    except TyperException as error:  # our BadInput and the parser's usage errors alike
        print(f"error: {error.format_message()}", file=sys.stderr)
        sys.exit(error.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)
