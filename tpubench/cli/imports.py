"""``tpubench import vllm-bench FILE`` and ``tpubench import sglang FILE``: the results other
tools already wrote, as serving points of a store (docs/serving.md, "Importing vLLM and SGLang
results").

Thin: :mod:`tpubench.serving.importers` reads the file, :mod:`tpubench.analysis.serving` prices
each point, :class:`tpubench.store.InvocationWriter` writes the ``serving`` and
``serving_requests`` rows, as one invocation per file.
"""

from __future__ import annotations

import math
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer

from tpubench.cli.common import BadInput, app, console, key_values, writable_results
from tpubench.results_dir import DEFAULT_RESULTS_DIR
from tpubench.serving.metrics import cost_per_m_output_tokens, parse_slos, slos_text
from tpubench.version import __version__

imports = typer.Typer(
    add_completion=False,
    rich_markup_mode=None,
    help="Store serving benchmark results written by other tools (vLLM, SGLang) as serving points.",
)
app.add_typer(imports, name="import")

Results = Annotated[str, typer.Option(help="Results directory (or object-store URL) to store the points in.")]
Engine = Annotated[str | None, typer.Option(help="The engine that served, where the file's backend does not name it.")]
EngineVersion = Annotated[str | None, typer.Option("--engine-version", help="The engine's version.")]
Model = Annotated[str | None, typer.Option(help="The model served, where the file does not name it.")]
Device = Annotated[
    str | None,
    typer.Option(help="The chip, as its runtime names it ('NVIDIA H100 80GB HBM3', 'TPU v6e'): prices match it."),
]
DeviceCount = Annotated[int | None, typer.Option("--device-count", min=1, help="Devices the engine served on.")]
TpSize = Annotated[int | None, typer.Option("--tp-size", min=1, help="Tensor-parallel degree.")]
Dtype = Annotated[str | None, typer.Option(help="The weights' dtype (bfloat16).")]
Quantization = Annotated[str | None, typer.Option(help="The quantization the engine applied (fp8).")]
Dataset = Annotated[str | None, typer.Option(help="The dataset the requests came from, where the file does not say.")]
InputLen = Annotated[int | None, typer.Option("--input-len", min=1, help="Prompt tokens per request.")]
OutputLen = Annotated[int | None, typer.Option("--output-len", min=1, help="Output tokens asked per request.")]
IgnoreEos = Annotated[
    bool | None, typer.Option("--ignore-eos/--no-ignore-eos", help="Whether the requests set ignore_eos.")
]
Goodput = Annotated[
    list[str] | None,
    typer.Option(help="The SLOs the file's goodput was measured at, as given to the tool: --goodput ttft:200 tpot:50."),
]
Price = Annotated[
    float | None,
    typer.Option(
        "--price-per-hour", help="USD per hour of every device the engine served on (else the price table's)."
    ),
]
Host = Annotated[str | None, typer.Option(help="The machine the engine ran on.")]
Tag = Annotated[list[str] | None, typer.Option("--tag", help="KEY=VALUE stored with the points (repeatable).")]


def _import(tool: str, file: Path, results: str, given_options: dict) -> None:
    """Read ``file`` with ``tool``'s importer, price its points and store them; bad input is one
    ``error:`` line (exit 2) before anything is written."""
    from tpubench import store  # pandas and pyarrow: after the options are checked
    from tpubench.analysis import prices as price_table
    from tpubench.serving import importers

    try:  # as tpubench serving reads and stores them
        given_options["goodput_slos"] = slos_text(parse_slos(given_options["goodput_slos"]))
    except ValueError as error:
        raise BadInput(f"--goodput {error}") from error
    price = given_options["price_per_hour"]
    if price is not None and not (math.isfinite(price) and price > 0):
        raise BadInput(f"--price-per-hour {price:g}: give a positive USD per hour")
    given = importers.Given(**given_options)
    try:
        imported = (importers.vllm_bench if tool == "vllm-bench" else importers.sglang)(file, given)
    except importers.ImportFormatError as error:
        raise BadInput(str(error)) from error
    try:
        table = price_table.load_prices()
    except price_table.PriceError as error:
        raise BadInput(str(error)) from error
    results_dir = writable_results(results)
    now = datetime.now(UTC)
    invocation = f"{now:%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:8]}"
    points = _priced(imported.points, table)
    for point in points:
        point["invocation_id"] = invocation
    requests = [{**row, "invocation_id": invocation} for row in imported.requests]
    writer = store.InvocationWriter(results_dir, invocation, now, tables=("serving", "serving_requests"))
    writer.add_rows({"serving": points, "serving_requests": requests})
    failed = sum(point["status"] != "ok" for point in points)
    console.print(
        f"imported {len(points)} serving point{'s' * (len(points) != 1)}"
        + (f" ({failed} with no completed request)" if failed else "")
        + f" and {len(requests):,} requests from {file} into {results_dir} (invocation {invocation}); "
        "`tpubench dashboard` shows them on its Serving page"
    )


def _priced(points: list[dict], table: dict) -> list[dict]:
    """``points`` with the price they are costed at (the given one, else the price table's:
    :func:`tpubench.analysis.serving.usd_per_hour`) and the cost per million output tokens at it,
    as a sweep's rows have it (:func:`tpubench.serving.metrics.cost_per_m_output_tokens`); both null
    where no price is known, so that a row says what price its cost was read at."""
    import pandas as pd

    from tpubench.analysis import serving
    from tpubench.schema import SERVING

    hourly = serving.usd_per_hour(pd.DataFrame(points, columns=SERVING.names), table).astype(float)
    priced = []
    for point, price in zip(points, hourly, strict=True):
        price = None if math.isnan(price) else float(price)
        cost = cost_per_m_output_tokens(price, point["output_throughput"])
        priced.append(
            {**point, "price_per_hour": price, "cost_per_m_output_tokens": cost, "tpubench_version": __version__}
        )
    return priced


@imports.command("vllm-bench")
def vllm_bench(
    file: Annotated[Path, typer.Argument(help="A `vllm bench serve --save-result` JSON file.")],
    results: Results = str(DEFAULT_RESULTS_DIR),
    engine: Engine = None,
    engine_version: EngineVersion = None,
    model: Model = None,
    device: Device = None,
    device_count: DeviceCount = None,
    tp_size: TpSize = None,
    dtype: Dtype = None,
    quantization: Quantization = None,
    dataset: Dataset = None,
    input_len: InputLen = None,
    output_len: OutputLen = None,
    ignore_eos: IgnoreEos = None,
    goodput: Goodput = None,
    price_per_hour: Price = None,
    host: Host = None,
    tag: Tag = None,
) -> None:
    """Store a `vllm bench serve` result (one JSON object, or one per line with --append-result):
    its figures, and with --save-detailed every request."""
    given = locals().copy()
    _import("vllm-bench", file, results, _given(given))


@imports.command("sglang")
def sglang(
    file: Annotated[Path, typer.Argument(help="A `python -m sglang.bench_serving --output-file` JSONL file.")],
    results: Results = str(DEFAULT_RESULTS_DIR),
    engine: Engine = None,
    engine_version: EngineVersion = None,
    model: Model = None,
    device: Device = None,
    device_count: DeviceCount = None,
    tp_size: TpSize = None,
    dtype: Dtype = None,
    quantization: Quantization = None,
    dataset: Dataset = None,
    input_len: InputLen = None,
    output_len: OutputLen = None,
    ignore_eos: IgnoreEos = None,
    goodput: Goodput = None,
    price_per_hour: Price = None,
    host: Host = None,
    tag: Tag = None,
) -> None:
    """Store SGLang bench_serving's lines (one per run): their figures, and with --output-details
    every request."""
    given = locals().copy()
    _import("sglang", file, results, _given(given))


def _given(options: dict) -> dict:
    """The commands' options as :class:`tpubench.serving.importers.Given`'s fields."""
    options = {key: value for key, value in options.items() if key not in ("file", "results")}
    options["goodput_slos"] = options.pop("goodput")
    options["tags"] = key_values("--tag", options.pop("tag"))
    return options
