"""A stand-in serving engine for the launch tests: ``python -m fake_engine MODE --host H --port P``.

The mode (where an engine's model goes) says how it behaves:
``die``: prints a loading error and exits 3 before it is ready;
``never``: writes ``$FAKE_ENGINE_STARTED`` and never answers;
``ready``: answers ``/health`` with 200 and ``/version`` with ``{"version": "9.9"}``;
``stubborn``: as ``ready``, but it ignores SIGTERM, and so do two children of its own, one of
which left the process group for a session of its own; their pids are written to
``$FAKE_ENGINE_FAMILY``;
``openai``: tpubench's test server (tpubench/serving/testserver.py), which streams completions,
exiting mid-stream after ``$FAKE_ENGINE_DIE_AFTER`` requests where that is set.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

IGNORE_TERM = "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); signal.pause()"


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        answers = {"/health": b"", "/version": json.dumps({"version": "9.9"}).encode()}
        if self.path not in answers:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("content-length", str(len(answers[self.path])))
        self.end_headers()
        self.wfile.write(answers[self.path])


def _ignoring_term(session: bool) -> subprocess.Popen:
    child = subprocess.Popen(
        [sys.executable, "-c", IGNORE_TERM], stdout=subprocess.PIPE, text=True, start_new_session=session
    )
    assert child.stdout is not None and child.stdout.readline() == "up\n"  # its handler is set
    return child


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["die", "never", "ready", "stubborn", "openai"])
    parser.add_argument("--host")
    parser.add_argument("--port", type=int)
    args, _ = parser.parse_known_args()
    if args.mode == "openai":
        from tpubench.serving import testserver

        die_after = os.environ.get("FAKE_ENGINE_DIE_AFTER")
        dying = ["--die-after", die_after] if die_after else []
        testserver.main(["--port", str(args.port), "--usage", "last", *dying])
        return
    if args.mode == "die":
        print("loading weights...\nRuntimeError: CUDA out of memory (fake)", file=sys.stderr)
        sys.exit(3)
    if args.mode == "never":
        Path(os.environ["FAKE_ENGINE_STARTED"]).write_text(str(os.getpid()))
        signal.pause()
    if args.mode == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        family = [_ignoring_term(session=False).pid, _ignoring_term(session=True).pid]
        Path(os.environ["FAKE_ENGINE_FAMILY"]).write_text(json.dumps(family))
    print("serving", flush=True)
    ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
