"""The load generator: streamed ``/v1/completions`` requests sent at their arrival times, as
``vllm bench serve`` sends them, with what each one saw kept as a :class:`RequestRecord`.

Each request asks for ``"stream": true`` with ``stream_options.include_usage`` and times,
with ``time.perf_counter``, its send and the arrival of every server-sent event that carries
``choices``; the server's ``usage`` gives its token counts. ``--max-concurrency`` is a
semaphore taken after a request's arrival time, and the send time is taken after it, so that
the client's own queue is not counted as the server's latency (vLLM's rule). Warm-up requests
go first and are not kept.

The client must not limit what it measures: the body of each request is encoded before the
point starts, an event is parsed only once its line is whole, and the arrival of a read is
timed once for every event it holds (``benchmarks/serving_client.py`` prints its CPU time per
request and per chunk). A request that loses its connection asks ``alive`` (at most once a
second) whether the server is still there; when it is not, no further request is sent and each
one left is recorded as failed, not sent.
"""

from __future__ import annotations

import asyncio
import json
import math
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from time import monotonic, perf_counter, sleep

import aiohttp

from tpubench.serving.datasets import Prompt
from tpubench.serving.metrics import RequestRecord, request_record

HEADERS = {"Content-Type": "application/json"}
#: errors of the connection, not of the request: the point asks whether the server is alive
CONNECTION_ERRORS = (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, ConnectionError)


@dataclass
class PointResult:
    records: list[RequestRecord]
    duration_s: float
    max_in_flight: int
    server_lost: bool = False


def request_body(model: str, prompt: Prompt, ignore_eos: bool, extra: dict | None = None) -> bytes:
    body = {
        "model": model,
        "prompt": prompt.text,
        "max_tokens": prompt.output_len,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
        **({"ignore_eos": True} if ignore_eos else {}),
        **(extra or {}),
    }
    return json.dumps(body).encode()


async def stream_request(
    session: aiohttp.ClientSession, url: str, body: bytes, input_len: int, start: float
) -> RequestRecord:
    """One request, timed: each chunk with ``choices`` at the moment its bytes were read."""
    chunk_times: list[float] = []
    output_len = prompt_tokens = error = None
    send = perf_counter()
    try:
        async with session.post(url, data=body, headers=HEADERS) as response:
            if response.status != 200:
                error = f"HTTP {response.status}: {(await response.text())[:300]}"
            else:
                pending = b""
                async for data in response.content.iter_any():
                    now = perf_counter()
                    *lines, pending = (pending + data).split(b"\n")
                    for line in lines:
                        if not line.startswith(b"data:"):
                            continue  # the blank line between events, an SSE comment
                        payload = line[5:].strip()
                        if payload == b"[DONE]":
                            continue
                        event = json.loads(payload)
                        if event.get("choices"):
                            chunk_times.append(now)
                        if usage := event.get("usage"):
                            output_len = usage.get("completion_tokens")
                            prompt_tokens = usage.get("prompt_tokens")
                        if (failure := event.get("error")) and error is None:  # vLLM's error inside a stream
                            error = f"in the stream: {str(failure)[:300]}"
    except (aiohttp.ClientError, TimeoutError, ConnectionError, ValueError) as caught:
        error = f"{type(caught).__name__}: {caught}"
        if isinstance(caught, CONNECTION_ERRORS):
            error = "connection: " + error
    return request_record(prompt_tokens or input_len, send, chunk_times, output_len, error, start)


async def _run_point(
    url: str,
    bodies: Sequence[bytes],
    input_lens: Sequence[int],
    times: Sequence[float],
    max_concurrency: int | None,
    warmup_bodies: Sequence[bytes],
    request_timeout_s: float | None,
    alive: Callable[[], bool] | None,
) -> PointResult:
    limit = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    connector = aiohttp.TCPConnector(limit=max_concurrency or 0, limit_per_host=0, enable_cleanup_closed=True)
    timeout = aiohttp.ClientTimeout(total=request_timeout_s)
    in_flight = most = 0
    lost = asyncio.Event()
    next_check = 0.0  # a broken connection asks whether the server is alive, at most once a second
    completions = url.rstrip("/") + "/completions"

    async def limited(session: aiohttp.ClientSession, body: bytes, input_len: int, start: float) -> RequestRecord:
        nonlocal in_flight, most, next_check
        if limit is not None:
            await limit.acquire()
        try:
            if lost.is_set():
                return RequestRecord(input_len, perf_counter() - start, error="not sent: the server had stopped")
            in_flight += 1
            most = max(most, in_flight)
            try:
                record = await stream_request(session, completions, body, input_len, start)
            finally:
                in_flight -= 1
        finally:
            if limit is not None:
                limit.release()
        broken = record.error is not None and record.error.startswith("connection:")
        if broken and alive is not None and perf_counter() >= next_check:
            next_check = perf_counter() + 1.0
            if not await asyncio.to_thread(alive):
                lost.set()
        return record

    async with aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=False) as session:
        await asyncio.gather(*(limited(session, body, 0, perf_counter()) for body in warmup_bodies))
        in_flight = most = 0
        start = perf_counter()
        tasks: list[asyncio.Task[RequestRecord]] = []
        records: list[RequestRecord] = []
        for index, (body, at) in enumerate(zip(bodies, times, strict=True)):
            if (wait := start + at - perf_counter()) > 0:
                await asyncio.sleep(wait)
            if lost.is_set():
                not_sent = "not sent: the server had stopped"
                records = [
                    RequestRecord(n, t, error=not_sent) for n, t in zip(input_lens[index:], times[index:], strict=True)
                ]
                break
            tasks.append(asyncio.create_task(limited(session, body, input_lens[index], start)))
        records = [*await asyncio.gather(*tasks), *records]
        duration = perf_counter() - start
    return PointResult(
        records=records,
        duration_s=duration,
        max_in_flight=most,
        server_lost=lost.is_set(),
    )


def run_point(
    url: str,
    model: str,
    prompts: Sequence[Prompt],
    times: Sequence[float],
    max_concurrency: int | None = None,
    warmups: int = 0,
    ignore_eos: bool = False,
    request_timeout_s: float = 3600.0,
    alive: Callable[[], bool] | None = None,
    extra: dict | None = None,
) -> PointResult:
    """Send ``prompts`` to the OpenAI-compatible server at ``url`` (``http://HOST:PORT/v1``), the
    i-th at ``times[i]`` seconds after the point's start, after ``warmups`` warm-up requests (the
    first prompts again), at most ``max_concurrency`` in flight (None: unbounded)."""
    if len(prompts) != len(times):
        raise ValueError(f"{len(prompts)} prompts for {len(times)} arrival times")
    bodies = [request_body(model, prompt, ignore_eos, extra) for prompt in prompts]
    warmup_bodies = [bodies[i % len(bodies)] for i in range(warmups)] if bodies else []
    input_lens = [prompt.input_len for prompt in prompts]
    timeout = request_timeout_s if math.isfinite(request_timeout_s) else None
    return asyncio.run(_run_point(url, bodies, input_lens, times, max_concurrency, warmup_bodies, timeout, alive))


def _get_json(url: str, timeout_s: float) -> dict | None:
    """``GET url`` as JSON; None when it does not answer 200 with a JSON object in time."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            answer = json.loads(response.read())
    except (OSError, ValueError):
        return None
    return answer if isinstance(answer, dict) else None


def served_models(url: str, timeout_s: float = 2.0) -> list[str] | None:
    """The model ids of ``GET {url}/models``; None when the server does not answer."""
    answer = _get_json(url.rstrip("/") + "/models", timeout_s)
    if answer is None:
        return None
    return [str(entry.get("id")) for entry in answer.get("data") or [] if isinstance(entry, dict)]


def wait_ready(url: str, timeout_s: float) -> list[str] | None:
    """Ask ``/models`` until it answers, at most ``timeout_s``; its models, or None."""
    deadline = monotonic() + timeout_s
    while True:
        found = served_models(url, timeout_s=max(0.1, min(2.0, deadline - monotonic())))
        if found is not None or monotonic() >= deadline:
            return found
        sleep(min(0.2, max(0.0, deadline - monotonic())))


def server_version(url: str, timeout_s: float = 2.0) -> str | None:
    """The version a server gives at ``/version`` (vLLM, SGLang) beside its ``/v1``; None if none."""
    base = url.rstrip("/").removesuffix("/v1")
    answer = _get_json(base + "/version", timeout_s)
    version = (answer or {}).get("version")
    return str(version) if version else None


#: ``owned_by`` values that name the engine serving (``transformers serve`` says ``local``, which does not)
ENGINE_OWNERS = ("vllm", "sglang", "tpubench-testserver")


def engine_name(url: str, timeout_s: float = 2.0) -> str | None:
    """Who serves the models, where ``/models``' ``owned_by`` names an engine (vLLM says ``vllm``)."""
    answer = _get_json(url.rstrip("/") + "/models", timeout_s)
    owners = {entry.get("owned_by") for entry in (answer or {}).get("data") or [] if isinstance(entry, dict)}
    return owners.pop() if len(owners) == 1 and owners <= set(ENGINE_OWNERS) else None
