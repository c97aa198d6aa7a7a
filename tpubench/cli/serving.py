"""``tpubench serving``: an engine under request load, measured as ``vllm bench serve`` measures
it (docs/serving.md, "Engines under load").

Every input is checked before anything is sent: the rates and concurrencies, the SLOs, the
dataset (a ShareGPT file is read), the results directory, and that the server answers
``/models`` within ``--ready-timeout``. The sweep itself is :func:`tpubench.serving.sweep.run_sweep`;
this module picks the engine (a :class:`~tpubench.serving.sweep.Target`), checks and prints.
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Annotated, Any
from urllib.parse import urlparse

import typer

from tpubench.analysis.nulls import is_missing
from tpubench.cli.common import BadInput, app, console, int_list, key_values, writable_results
from tpubench.results_dir import DEFAULT_RESULTS_DIR
from tpubench.serving import client, datasets
from tpubench.serving.arrivals import check_rate
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


@contextlib.contextmanager
def open_target(
    url: str, model: str | None, ready_timeout_s: float, device: str | None, price: float | None
) -> Iterator[Target]:
    """The engine the sweep measures, for the sweep's duration. ``--url``: a server someone else
    runs, left running. (An engine this command starts, ``--engine``, is opened here too, by
    :mod:`tpubench.launch.engine`, and stopped on leaving.)"""
    yield url_target(url, model, ready_timeout_s, device, price)


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
    device: Annotated[str | None, typer.Option(help="The chip behind --url, stored with the rows.")] = None,
    price_per_hour: Annotated[
        float | None, typer.Option(min=0, help="$/hour of the server, for cost per million output tokens.")
    ] = None,
    ready_timeout: Annotated[float, typer.Option(min=0, help="Seconds to wait for the server to answer.")] = 30.0,
    request_timeout: Annotated[float, typer.Option(min=1, help="Seconds before one request is given up.")] = 3600.0,
    results: Annotated[str, typer.Option(help="Results directory.")] = str(DEFAULT_RESULTS_DIR),
    tag: Annotated[list[str] | None, typer.Option(help="KEY=VALUE stored with every row; repeatable.")] = None,
) -> None:
    """Sweep request rates and concurrencies against an OpenAI-compatible server, with vLLM's
    TTFT, TPOT, ITL, E2EL, throughput and goodput, one stored row per point and per request."""
    checked_url = check_url(url)
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
    with open_target(checked_url, model, ready_timeout, device, price_per_hour) as target:
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
