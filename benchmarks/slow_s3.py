"""moto's S3 server on 127.0.0.1 with a delay added to every request, standing for a real bucket.

A WSGI middleware in front of moto's own application (``moto.server``'s
``DomainDispatcherApplication``, what ``moto_server`` serves): each request sleeps ``--delay-ms``
before moto answers it, and is counted. The server is threaded, as a bucket is: requests
made in parallel wait their delays at the same time. ``GET /_requests`` (not delayed, not
counted) answers the count so far as JSON; ``POST /_requests`` sets it to zero and
``POST /_delay?ms=N`` changes the delay (0 while a store is uploaded).

    python benchmarks/slow_s3.py --port 5123 --delay-ms 20
"""

from __future__ import annotations

import argparse
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any


class Delayed:
    """The middleware: a delay and a count per request, and the control paths."""

    def __init__(self, app: Callable[..., Iterable[bytes]], delay_s: float) -> None:
        self.app, self.delay_s = app, delay_s
        self.requests = 0
        self.lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path in ("/_requests", "/_delay"):
            if path == "/_delay":
                query = dict(part.split("=", 1) for part in environ.get("QUERY_STRING", "").split("&") if "=" in part)
                self.delay_s = float(query.get("ms", 0)) / 1e3
            elif environ["REQUEST_METHOD"] == "POST":
                with self.lock:
                    self.requests = 0
            body = json.dumps({"requests": self.requests, "delay_ms": self.delay_s * 1e3}).encode()
            start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
            return [body]
        with self.lock:
            self.requests += 1
        if self.delay_s:
            time.sleep(self.delay_s)
        return self.app(environ, start_response)


def main() -> None:
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
    from werkzeug.serving import make_server

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--delay-ms", type=float, default=20.0)
    args = parser.parse_args()
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # not a line per request
    app = Delayed(DomainDispatcherApplication(create_backend_app), args.delay_ms / 1e3)
    server = make_server("127.0.0.1", args.port, app, threaded=True, request_handler=MotoRequestHandler)
    print(f"listening on 127.0.0.1:{args.port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
