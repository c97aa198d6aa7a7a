"""A small OpenAI-compatible server whose timings are known: the client's and the sweep's test
engine, and the load of ``benchmarks/serving_client.py``.

``POST /v1/completions`` with ``"stream": true`` answers ``max_tokens`` tokens (16 by default)
in chunks: the first after ``--first-s``, each next one ``--gap-s`` later, on a schedule kept
from the request's arrival so that sleeps' lateness does not add up. Every ``--double-every``-th
chunk carries two tokens, so that chunks and tokens differ as they do with real engines. The
``usage`` (completion tokens = ``max_tokens``, prompt tokens = the prompt's words) comes as
vLLM sends it, in a last chunk with empty ``choices`` when ``stream_options.include_usage`` asks
(``--usage separate``; one gap after the last token, so that an E2EL ending there would show),
in the last chunk with choices as ``transformers serve`` does (``--usage last``), or never
(``--usage none``); a request's ``testserver_usage`` field says which for that request alone.

``GET /stats`` gives its own count of requests in flight and the most seen at once
(``POST /stats/reset`` zeroes them); ``GET /v1/models`` and ``GET /version`` answer as vLLM's
do. ``--die-after N`` makes the process exit abruptly in the middle of the (N+1)-th request's
stream, as an engine that crashes under load.

    python -m tpubench.serving.testserver --port 0 --ready-file /tmp/ready   # prints "port N"
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

VERSION = "testserver-1"


@dataclass
class Behaviour:
    first_s: float = 0.0
    gap_s: float = 0.0
    double_every: int = 0  # 0: every chunk one token
    usage: str = "separate"  # separate | last | none
    die_after: int | None = None
    model: str = "tpubench-test"


class State:
    def __init__(self) -> None:
        self.in_flight = 0
        self.max_in_flight = 0
        self.requests = 0

    def stats(self) -> dict[str, int]:
        return {"in_flight": self.in_flight, "max_in_flight": self.max_in_flight, "requests": self.requests}


def chunk_tokens(max_tokens: int, double_every: int) -> list[int]:
    """How many tokens each chunk carries: ``max_tokens`` in all, every ``double_every``-th chunk two."""
    counts: list[int] = []
    while sum(counts) < max_tokens:
        two = double_every > 0 and (len(counts) + 1) % double_every == 0 and max_tokens - sum(counts) >= 2
        counts.append(2 if two else 1)
    return counts


def _event(payload: dict) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def make_app(behaviour: Behaviour) -> web.Application:
    state = State()

    async def completions(request: web.Request) -> web.StreamResponse:
        arrived = asyncio.get_running_loop().time()
        body = await request.json()
        state.requests += 1
        number = state.requests
        max_tokens = int(body.get("max_tokens") or 16)
        prompt_tokens = len(str(body.get("prompt", "")).split())
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        usage_mode = body.get("testserver_usage", behaviour.usage)
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": max_tokens}
        usage["total_tokens"] = prompt_tokens + max_tokens
        common = {"id": f"cmpl-{number}", "object": "text_completion", "created": int(time.time())}
        common["model"] = behaviour.model
        counts = chunk_tokens(max_tokens, behaviour.double_every)
        if not body.get("stream"):
            text = " tok" * max_tokens
            choice = {"index": 0, "text": text, "finish_reason": "length"}
            return web.json_response({**common, "choices": [choice], "usage": usage})
        state.in_flight += 1
        state.max_in_flight = max(state.max_in_flight, state.in_flight)
        try:
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            loop = asyncio.get_running_loop()
            for index, count in enumerate(counts):
                due = arrived + behaviour.first_s + index * behaviour.gap_s
                if (wait := due - loop.time()) > 0:
                    await asyncio.sleep(wait)
                last = index == len(counts) - 1
                choice = {"index": 0, "text": " tok" * count, "finish_reason": "length" if last else None}
                chunk = {**common, "choices": [choice]}
                if last and usage_mode == "last":
                    chunk["usage"] = usage
                await response.write(_event(chunk))
                if behaviour.die_after is not None and number > behaviour.die_after:
                    print(f"dying in the middle of request {number}", file=sys.stderr, flush=True)
                    os._exit(3)  # a crash mid-stream: no reply finished, no cleanup
            if usage_mode == "separate" and include_usage:  # one gap later: E2EL must not end at it
                due = arrived + behaviour.first_s + len(counts) * behaviour.gap_s
                if (wait := due - loop.time()) > 0:
                    await asyncio.sleep(wait)
                await response.write(_event({**common, "choices": [], "usage": usage}))
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
            return response
        finally:
            state.in_flight -= 1

    async def models(_: web.Request) -> web.Response:
        model = {"id": behaviour.model, "object": "model", "owned_by": "tpubench-testserver"}
        return web.json_response({"object": "list", "data": [model]})

    async def version(_: web.Request) -> web.Response:
        return web.json_response({"version": VERSION})

    async def stats(_: web.Request) -> web.Response:
        return web.json_response(state.stats())

    async def reset(_: web.Request) -> web.Response:
        state.max_in_flight = state.in_flight
        state.requests = 0
        return web.json_response(state.stats())

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/version", version)
    app.router.add_get("/health", version)
    app.router.add_get("/stats", stats)
    app.router.add_post("/stats/reset", reset)
    return app


async def serve(behaviour: Behaviour, port: int, ready_file: Path | None) -> None:
    runner = web.AppRunner(make_app(behaviour), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    bound = runner.addresses[0][1]
    print(f"port {bound}", flush=True)
    if ready_file is not None:  # written whole, then renamed: a reader never sees it half-written
        partial = ready_file.with_name(f".{ready_file.name}.tmp")
        partial.write_text(str(bound))
        partial.replace(ready_file)
    await asyncio.Event().wait()


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=0, help="0: any free port, printed as 'port N'")
    parser.add_argument("--ready-file", type=Path, help="written with the port once it listens")
    parser.add_argument("--first-s", type=float, default=0.0, help="seconds from a request to its first chunk")
    parser.add_argument("--gap-s", type=float, default=0.0, help="seconds between chunks")
    parser.add_argument("--double-every", type=int, default=0, help="every Nth chunk carries two tokens")
    parser.add_argument("--usage", choices=("separate", "last", "none"), default="separate")
    parser.add_argument("--die-after", type=int, help="exit mid-stream in the request after this many")
    parser.add_argument("--model", default="tpubench-test")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = arguments(argv)
    behaviour = Behaviour(args.first_s, args.gap_s, args.double_every, args.usage, args.die_after, args.model)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(behaviour, args.port, args.ready_file))


class TestServer:
    """The server in a subprocess of its own, for a ``with`` block: ``.url`` (``.../v1``) once it
    listens (its ready file written), its output in ``log_path``, stopped and reaped on leaving."""

    __test__ = False  # not a pytest test class

    def __init__(self, work_dir: Path, *args: str, ready_timeout_s: float = 30.0):
        self.ready_file = Path(work_dir) / f"testserver-{os.getpid()}-{id(self)}.port"
        self.log_path = self.ready_file.with_suffix(".log")
        self.args = args
        self.ready_timeout_s = ready_timeout_s
        self.process: subprocess.Popen | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> TestServer:
        self.ready_file.unlink(missing_ok=True)
        command = [sys.executable, "-m", "tpubench.serving.testserver", "--ready-file", str(self.ready_file)]
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen([*command, *self.args], stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self.ready_timeout_s
        while not self.ready_file.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.__exit__()
                raise RuntimeError(f"the test server did not start (exit {self.process.returncode})")
            time.sleep(0.02)
        self.port = int(self.ready_file.read_text())
        return self

    def log_tail(self, lines: int = 20) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def __exit__(self, *_: object) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.ready_file.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
