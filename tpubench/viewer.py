"""Open a run's trace in its viewer, served on 127.0.0.1 only (``tpubench trace --open``).

- An xplane logdir: XProf's own web app (the ``profile`` plugin XProf and TensorBoard
  serve), started here bound to the loopback address. ``xprof --logdir`` would bind every
  interface and start a gRPC worker service too, which a local viewer does not need.
- A Chrome trace: Perfetto's UI (ui.perfetto.dev) loads it from a local server that sends
  the one file with the CORS header Perfetto needs. Perfetto only fetches from
  ``http://127.0.0.1:9001``, hence the default port.
"""

from __future__ import annotations

import http.server
from collections.abc import Callable
from pathlib import Path

LOOPBACK = "127.0.0.1"
PERFETTO_PORT = 9001  # the one port ui.perfetto.dev's content security policy lets it fetch from
XPROF_PORT = 8791  # XProf's default
PERFETTO_UI = "https://ui.perfetto.dev"


class ViewerError(Exception):
    """The viewer cannot start: its library is missing or the port is taken."""


def perfetto_url(port: int, name: str) -> str:
    return f"{PERFETTO_UI}/#!/?url=http://{LOOPBACK}:{port}/{name}"


def serve_chrome_trace(path: Path, port: int, ready: Callable[[str], None]) -> None:
    """Serve ``path`` (only it) on 127.0.0.1:``port`` for Perfetto until interrupted;
    ``ready`` gets the URL that opens it once the socket listens."""
    data, name = path.read_bytes(), path.name

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?")[0] != f"/{name}":
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Access-Control-Allow-Origin", PERFETTO_UI)
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            """Quiet: the terminal shows the URL, not every request."""

    try:
        server = http.server.ThreadingHTTPServer((LOOPBACK, port), Handler)
    except OSError as error:
        raise ViewerError(f"cannot listen on {LOOPBACK}:{port}: {error.strerror}") from error
    with server:
        ready(perfetto_url(port, name))
        server.serve_forever()


def serve_xprof(logdir: Path, port: int, ready: Callable[[str], None]) -> None:
    """XProf's web app over ``logdir`` on 127.0.0.1:``port`` until interrupted."""
    try:
        from cheroot import wsgi  # XProf's own web server
        from xprof import server as xprof_server
    except ImportError as error:
        raise ViewerError(f"XProf is not installed for this Python ({error}): pip install xprof==2.24.2") from error
    context = xprof_server.TBContext(
        str(logdir), xprof_server.DataProvider(str(logdir)), xprof_server.TBContext.Flags(False)
    )
    context.hide_capture_profile_button = True  # a viewer of stored traces captures nothing
    context.enable_tab_name_label = False
    context.src_prefix = None
    plugin = xprof_server.ProfilePluginLoader().load(context)
    server = wsgi.Server((LOOPBACK, port), xprof_server.make_wsgi_app(plugin))
    try:
        server.prepare()
    except OSError as error:
        raise ViewerError(f"cannot listen on {LOOPBACK}:{port}: {error}") from error
    try:
        ready(f"http://{LOOPBACK}:{port}/")
        server.serve()
    finally:
        server.stop()
