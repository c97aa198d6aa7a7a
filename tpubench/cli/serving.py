"""``tpubench serving``: an engine under request load, measured as ``vllm bench serve`` measures
it (docs/serving.md, "Engines under load").

Every input is checked before anything is sent: the rates and concurrencies, the SLOs, the
dataset (a ShareGPT file is read), the results directory, and that the server answers
``/models`` within ``--ready-timeout``. The sweep itself is :func:`tpubench.serving.sweep.run_sweep`;
this module picks the engine (a :class:`~tpubench.serving.sweep.Target`), checks and prints.
With ``--engine`` it also starts the engine (:mod:`tpubench.launch.engine`): an unknown one, one
not installed here, or ``--ignore-eos`` for one that refuses it is refused before it starts; it
is stopped when the sweep ends, however it ends.
"""

from __future__ import annotations

import contextlib
import json
import math
import shlex
import signal
import sys
import uuid
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlparse

import typer

from tpubench.analysis.nulls import is_missing
from tpubench.cache_dir import cache_dir
from tpubench.cli.common import (
    BadInput,
    app,
    console,
    int_list,
    key_values,
    sigterm_as_interrupt,
    writable_results,
)
from tpubench.launch import engine as launch_engine
from tpubench.results_dir import DEFAULT_RESULTS_DIR
from tpubench.serving import client, datasets
from tpubench.serving.arrivals import check_rate
from tpubench.serving.engines import ENGINES, unknown
from tpubench.serving.engines.base import Engine, param_count
from tpubench.serving.metrics import parse_slos
from tpubench.serving.sweep import Load, Target, points, run_sweep


def rate_list(text: str) -> list[float]:
    """``"1,4,16,inf"`` as requests/s; a rate of 0, a negative one or junk is a BadInput."""
    rates = []
    for part in text.split(","):
        try:
            rate = float(part.strip())
            check_rate(rate)
        except ValueError as error:
            raise BadInput(
                f"--request-rate expects positive requests/s or inf separated by commas, got {text!r}"
            ) from error
        rates.append(rate)
    return list(dict.fromkeys(rates))


def goodput_slos(words: list[str]) -> dict[str, float]:
    try:
        return parse_slos(words)
    except ValueError as error:
        raise BadInput(f"--goodput {error}") from error


def check_dataset(name: str, input_len: int, output_len: int) -> None:
    """Draw one prompt, which reads a ShareGPT file and checks a prefix's length, before anything runs."""
    try:
        datasets.prompts(name, 1, input_len, output_len)
    except datasets.DatasetError as error:
        raise BadInput(f"--dataset {name}: {error}") from error


def check_url(url: str | None) -> str:
    """``--url``'s form, before anything else is checked or created."""
    if url is None:
        raise BadInput("--url is required: http://HOST:PORT/v1 of a running OpenAI-compatible server")
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise BadInput(f"--url expects http://HOST:PORT/v1, got {url!r}")
    return url


def url_target(url: str, model: str | None, ready_timeout_s: float, device: str | None, price: float | None) -> Target:
    """A server already running at ``url``: ready once ``/models`` answers (a BadInput after
    ``ready_timeout_s``), its version from ``/version`` where it gives one. No process to watch:
    the sweep knows it is there while ``/models`` answers."""
    served = client.wait_ready(url, ready_timeout_s)
    if served is None:
        raise BadInput(
            f"--url {url}: no OpenAI-compatible server answered {url.rstrip('/')}/models within {ready_timeout_s:g} s"
        )
    if model is None:
        if not served:
            raise BadInput(f"--model is required: {url} lists no model")
        model = served[0]
    elif served and model not in served:
        print(f"warning: {url} lists {', '.join(served)}, not {model}", file=sys.stderr)
    return Target(
        url=url,
        model=model,
        engine=client.engine_name(url) or "openai-compatible",
        engine_version=client.server_version(url),
        host=urlparse(url).hostname,
        device=device,
        price_per_hour=price,
    )


#: how long an engine this command starts may take to be ready (a TPU's first compile), and a
#: server at --url to answer
ENGINE_READY_TIMEOUT_S, URL_READY_TIMEOUT_S = 1800.0, 30.0


def check_engine(name: str | None, url: str | None, model: str | None, ignore_eos: bool) -> Engine | None:
    """The engine ``--engine`` names, refused before anything starts where it cannot run here."""
    if name is None:
        if url is None:
            raise BadInput(
                "--url is required (http://HOST:PORT/v1 of a running OpenAI-compatible server), "
                f"or --engine to start one: {', '.join(ENGINES)}"
            )
        return None
    if url is not None:
        raise BadInput("--engine starts a server and --url names a running one: give one of them")
    if problem := unknown(name):
        raise BadInput(problem)
    engine = ENGINES[name]
    if problem := engine.missing():
        raise BadInput(problem)
    if model is None:
        raise BadInput(f"--model is required with --engine: the model {name} serves (a local folder or a hub id)")
    if ignore_eos and not engine.honours["ignore_eos"]:
        raise BadInput(f"--ignore-eos: engine {name} does not honour ignore_eos (it refuses the field)")
    return engine


def engine_args_of(values: Sequence[str] | None) -> list[str]:
    """``--engine-arg`` values, each split as a shell would: ``--engine-arg "--dtype bfloat16"``
    and ``--engine-arg --dtype --engine-arg bfloat16`` are the same."""
    try:
        return [word for value in values or [] for word in shlex.split(value)]
    except ValueError as error:
        raise BadInput(f"--engine-arg: {error} in {values!r}") from error


@contextlib.contextmanager
def engine_target(
    engine: Engine,
    model: str,
    engine_args: list[str],
    ready_timeout_s: float,
    device: str | None,
    price: float | None,
    log_path: Path,
) -> Iterator[Target]:
    """Start ``engine``, yield it as the sweep's target once ready, stop it on leaving. An engine
    that exits or is not ready in time is an ``error:`` line with its log's tail, exit 1."""
    console.print(f"starting {engine.name} (log: {log_path})", highlight=False)
    try:
        running = launch_engine.start(engine, model, engine_args, log_path, ready_timeout_s)
    except launch_engine.EngineError as error:
        typer.echo(f"error: {error}", err=True)
        typer.echo("\n".join(f"  {line}" for line in error.log_tail.splitlines()), err=True)
        raise typer.Exit(1) from None
    with running:
        console.print(f"{engine.name} ready after {running.cold_start_s:.1f} s (cold start)", highlight=False)
        settings = engine.settings(engine_args)
        yield Target(
            url=running.url,
            model=model,
            engine=engine.name,
            engine_version=running.version,
            engine_args=engine_args,
            honoured=running.honoured,
            cold_start_s=running.cold_start_s,
            device=device or running.device,
            device_count=settings["tp_size"] or 1,
            host=running.host,
            dtype=settings["dtype"],
            quantization=settings["quantization"],
            tp_size=settings["tp_size"],
            param_count=param_count(model),
            price_per_hour=price,
            log_tail=running.log_tail,
            alive=running.alive,
        )


@contextlib.contextmanager
def stopped_by_signals() -> Iterator[None]:
    """Ctrl-C or SIGTERM (a cancelled job) stops the sweep and the engine this command started,
    with exit status 128 + the signal, as ``tpubench run`` has it; the points written stay."""
    with sigterm_as_interrupt() as received:
        try:
            yield
        except KeyboardInterrupt:
            raise typer.Exit(128 + (received[0] if received else signal.SIGINT)) from None


@contextlib.contextmanager
def open_target(
    url: str | None,
    engine: Engine | None,
    model: str | None,
    engine_args: list[str],
    ready_timeout_s: float | None,
    device: str | None,
    price: float | None,
    log_path: Path,
) -> Iterator[Target]:
    """The engine the sweep measures, for the sweep's duration: one this command starts
    (``--engine``, stopped on leaving), or a server someone else runs (``--url``, left running)."""
    if engine is not None:
        assert model is not None  # check_engine
        timeout = ENGINE_READY_TIMEOUT_S if ready_timeout_s is None else ready_timeout_s
        with engine_target(engine, model, engine_args, timeout, device, price, log_path) as target:
            yield target
        return
    assert url is not None  # check_engine
    yield url_target(url, model, URL_READY_TIMEOUT_S if ready_timeout_s is None else ready_timeout_s, device, price)


def _ms(value: Any) -> str:
    return "-" if is_missing(value) else f"{value:,.1f} ms"


def point_line(row: dict[str, Any]) -> str:
    rate = "inf" if math.isinf(row["request_rate"]) else f"{row['request_rate']:g}/s"
    load = f"rate {rate}" + (f", concurrency {row['max_concurrency']}" if row["max_concurrency"] else "")
    counts = f"{row['completed']}/{row['completed'] + row['failed']} requests"
    figures = (
        f"TTFT p50 {_ms(row['ttft_p50_ms'])}, TPOT p50 {_ms(row['tpot_p50_ms'])}, "
        f"E2EL p50 {_ms(row['e2el_p50_ms'])}, {row['output_throughput'] or 0:,.1f} output tok/s, "
        f"{row['request_throughput'] or 0:,.2f} req/s"
    )
    if row["request_goodput"] is not None:
        figures += f", goodput {row['request_goodput']:,.2f} req/s"
    line = f"  {load}: {row['status']}, {counts}; {figures}"
    return line + (f"\n    {row['error']}" if row["error"] else "")


@app.command("serving", context_settings={"allow_extra_args": True})
def serving_command(
    ctx: typer.Context,
    engine: Annotated[str | None, typer.Option(help=f"An engine to start and stop: {', '.join(ENGINES)}.")] = None,
    engine_arg: Annotated[
        list[str] | None,
        typer.Option(help="An argument for the engine (--engine-arg=--dtype=bfloat16, or quoted words); repeatable."),
    ] = None,
    url: Annotated[str | None, typer.Option(help="A running OpenAI-compatible server: http://HOST:PORT/v1.")] = None,
    model: Annotated[str | None, typer.Option(help="The model to ask for (default: the server's first).")] = None,
    request_rate: Annotated[str, typer.Option(help="Requests/s, a comma list; inf sends all at once.")] = "inf",
    max_concurrency: Annotated[
        str | None, typer.Option(help="Most requests in flight, a comma list (default: unbounded).")
    ] = None,
    burstiness: Annotated[float, typer.Option(help="Gamma shape of the arrival gaps; 1 is Poisson.")] = 1.0,
    dataset: Annotated[str, typer.Option(help=f"{', '.join(datasets.KINDS)}.")] = "random",
    input_len: Annotated[int, typer.Option(min=1, help="Prompt length in tokens (words).")] = 1024,
    output_len: Annotated[int, typer.Option(min=1, help="Output tokens asked for (max_tokens).")] = 128,
    num_prompts: Annotated[int, typer.Option(min=1, help="Requests per point.")] = 100,
    warmups: Annotated[int, typer.Option(min=0, help="Warm-up requests before each point, not kept.")] = 1,
    seed: Annotated[int, typer.Option(help="Seed of the prompts and the arrival times.")] = 0,
    goodput: Annotated[
        list[str] | None, typer.Option(help="SLOs in ms a good request meets: --goodput ttft:200 tpot:50 (e2el too).")
    ] = None,
    ignore_eos: Annotated[bool, typer.Option(help="Ask the engine to ignore EOS (not every engine takes it).")] = False,
    device: Annotated[
        str | None, typer.Option(help="The chip behind --url, stored with the rows (--engine: read from this host).")
    ] = None,
    price_per_hour: Annotated[
        float | None, typer.Option(min=0, help="$/hour of the server, for cost per million output tokens.")
    ] = None,
    ready_timeout: Annotated[
        float | None,
        typer.Option(min=0, help="Seconds until the server must be ready (default: 1800 for --engine, 30 for --url)."),
    ] = None,
    request_timeout: Annotated[float, typer.Option(min=1, help="Seconds before one request is given up.")] = 3600.0,
    results: Annotated[str, typer.Option(help="Results directory.")] = str(DEFAULT_RESULTS_DIR),
    tag: Annotated[list[str] | None, typer.Option(help="KEY=VALUE stored with every row; repeatable.")] = None,
) -> None:
    """Sweep request rates and concurrencies against an OpenAI-compatible server, with vLLM's
    TTFT, TPOT, ITL, E2EL, throughput and goodput, one stored row per point and per request."""
    chosen = check_engine(engine, url, model, ignore_eos)
    checked_url = check_url(url) if chosen is None else None
    engine_args = engine_args_of(engine_arg)
    if engine_args and chosen is None:
        raise BadInput("--engine-arg is for an engine this command starts (--engine)")
    rates = rate_list(request_rate)
    concurrencies: list[int | None] = list(int_list("--max-concurrency", max_concurrency) or [None])
    # --goodput's further SLOs come as words of their own (``--goodput ttft:200 tpot:50``, as vLLM's)
    stray = [word for word in ctx.args if goodput is None or ":" not in word]
    if stray:
        raise BadInput(f"unexpected argument {stray[0]!r}")
    slos = goodput_slos([*goodput, *ctx.args] if goodput is not None else [])
    if goodput is not None and not slos:
        raise BadInput("--goodput expects NAME:MS, e.g. ttft:200 tpot:50")
    if not (burstiness > 0):
        raise BadInput(f"--burstiness expects a positive number (1: Poisson), got {burstiness:g}")
    check_dataset(dataset, input_len, output_len)
    tags = key_values("--tag", tag)
    results_dir = writable_results(results)
    load = Load(
        dataset=dataset,
        input_len=input_len,
        output_len=output_len,
        num_prompts=num_prompts,
        burstiness=burstiness,
        seed=seed,
        warmups=warmups,
        ignore_eos=ignore_eos,
        slos=slos,
        request_timeout_s=request_timeout,
    )
    from tpubench import store  # pyarrow and pandas: not before the input is checked

    started = datetime.now(UTC)
    invocation_id = f"{started:%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:8]}"
    writer = store.InvocationWriter(results_dir, invocation_id, started, tables=("serving", "serving_requests"))
    log_path = cache_dir() / "engine-logs" / f"{invocation_id}-{engine}.log"
    with (
        stopped_by_signals(),
        open_target(checked_url, chosen, model, engine_args, ready_timeout, device, price_per_hour, log_path) as target,
    ):
        version = f" {target.engine_version}" if target.engine_version else ""
        sweep = points(rates, concurrencies)
        console.print(
            f"{target.engine}{version} at {target.url}, model {target.model}: {len(sweep)} points of "
            f"{num_prompts} requests ({dataset}, {input_len} in / {output_len} out)",
            highlight=False,
        )
        written = run_sweep(
            target,
            load,
            sweep,
            writer,
            invocation_id,
            tags=json.dumps(tags, sort_keys=True),
            on_point=lambda row: console.print(point_line(row), highlight=False),
        )
    console.print(f"results: {', '.join(writer.paths.values())} (invocation {invocation_id})", highlight=False)
    if len(written) < len(sweep):
        console.print(f"stopped after {len(written)} of {len(sweep)} points: the server stopped answering")
    if any(row["status"] == "failed" for row in written):
        raise typer.Exit(1)
