"""``tpubench dashboard``: the Streamlit dashboard over a results store, served on 127.0.0.1."""

from __future__ import annotations

import importlib.util
import os
import socket
import sys
from pathlib import Path
from typing import Annotated

import typer

import dashboard
from tpubench import store
from tpubench.cli.common import BadInput, app, console
from tpubench.results_dir import DEFAULT_RESULTS_DIR

LOOPBACK = "127.0.0.1"
DEFAULT_PORT = 8501  # Streamlit's
APP = Path(dashboard.__file__).resolve().parent / "app.py"


#: ``-P``: ``python -m`` puts the working directory first on sys.path, where a folder named like
#: one of the app's packages (the parent of a clone named ``tpubench``: a namespace package
#: without its names) or a user's ``tpubench.py`` would be imported instead of the installed one
PYTHON_FLAGS = ("-P",)


def streamlit_command(address: str, port: int) -> list[str]:
    """The ``streamlit run`` line: no browser, no usage statistics, no file watching and no
    developer menu (a served dashboard is not a development server); the interpreter keeps
    the working directory off sys.path (:data:`PYTHON_FLAGS`)."""
    return [
        sys.executable,
        *PYTHON_FLAGS,
        "-m",
        "streamlit",
        "run",
        str(APP),
        "--server.address",
        address,
        "--server.port",
        str(port),
        "--server.headless",
        "true",
        "--server.fileWatcherType",
        "none",
        "--browser.gatherUsageStats",
        "false",
        "--client.toolbarMode",
        "minimal",
        "--global.disableWidgetStateDuplicationWarning",  # widgets take their first value from the URL
        "true",
        "--global.developmentMode",
        "false",
    ]


@app.command("dashboard")
def dashboard_command(
    results: Annotated[
        list[str] | None,
        typer.Option(
            help="Results directory or s3:// / gs:// URL; repeat it to show the stores of several machines as one."
        ),
    ] = None,
    port: Annotated[int, typer.Option(help="Port to listen on.")] = DEFAULT_PORT,
    address: Annotated[
        str,
        typer.Option(help="Address to listen on; 0.0.0.0 lets anyone who can reach this machine read the results."),
    ] = LOOPBACK,
) -> None:
    """Serve the dashboard (Ctrl-C stops it). It reads the results store and nothing else."""
    if not 0 < port < 65536:
        raise BadInput(f"--port expects 1-65535, got {port}")
    if importlib.util.find_spec("streamlit") is None:
        raise BadInput("the dashboard needs Streamlit: pip install -e '.[dashboard]'")
    locations = [store_location(text) for text in dict.fromkeys(results or [str(DEFAULT_RESULTS_DIR)])]
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind((address, port))
    except OSError as error:
        raise BadInput(
            f"cannot listen on {address}:{port} ({error.strerror or error}); --port P picks another"
        ) from error
    console.print(f"dashboard: http://{address}:{port}/   (results: {', '.join(locations)}; Ctrl-C stops it)")
    if address != LOOPBACK:
        console.print(f"[warning] listening on {address}: anyone who can reach it can read these results")
    sys.stdout.flush()
    # exec, not a child: Ctrl-C and SIGTERM reach Streamlit itself, and nothing outlives the command
    shown = dashboard.STORE_SEPARATOR.join(locations)
    os.execve(sys.executable, streamlit_command(address, port), {**os.environ, dashboard.RESULTS_ENV: shown})


def store_location(text: str) -> str:
    """One ``--results``: a bucket URL as it is, a local folder made absolute (a missing one is
    fine: the dashboard says how to fill it); a file or a store's table folder is bad input."""
    if store.is_remote(text):
        return text
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise BadInput(f"--results {text}: not a directory")
    if (hint := store.table_folder_hint(path)) is not None:
        raise BadInput(hint)
    if dashboard.STORE_SEPARATOR in text:
        raise BadInput(f"--results {text!r}: a line break in a path is not supported")
    return str(path.resolve())
