"""Other tools' serving benchmark results as rows of the ``serving`` and ``serving_requests``
tables (docs/serving.md, "Importing vLLM and SGLang results").

* ``vllm bench serve --save-result`` (vllm/benchmarks/serve.py) writes one JSON object per run
  (one per line with ``--append-result``): the summary figures, ``mean_/median_/std_/pNN_``
  of ``ttft_ms``, ``tpot_ms``, ``itl_ms`` and ``e2el_ms`` for the metrics and percentiles it
  was asked for, and with ``--save-detailed`` the per-request arrays, in seconds.
* ``python -m sglang.bench_serving --output-file F`` appends one JSON line per run: the same
  figures under SGLang's names (``e2e_latency_ms``, ``input_throughput``, ``concurrency``),
  p99 only (p95 too for ITL), and with ``--output-details`` the per-request arrays.

Both tools use vLLM's definitions of each latency (docs/serving.md). A figure a file does not
hold is null in its row, never derived from another (a p90 from a p99, a total throughput
from an input and an output one); only a request's TPOT is computed, by the definition
(:meth:`GenerationTiming.tpot_ms`), where the file holds the request's end-to-end latency.
What no file says (the chip, the engine's version, the price) comes from the caller
(:class:`Given`). Parsing only: the CLI (``tpubench import``) stores the rows.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from tpubench.serving.metrics import GenerationTiming

#: the fields without which a record is not that tool's result
VLLM_REQUIRED = (
    "duration",
    "completed",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
)
SGLANG_REQUIRED = (
    "backend",
    "duration",
    "completed",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "input_throughput",
    "output_throughput",
    "mean_e2e_latency_ms",
)
#: each tool's name for a latency of the ``serving`` table's (ttft, tpot, itl, e2el)
VLLM_NAMES = {"ttft": "ttft", "tpot": "tpot", "itl": "itl", "e2el": "e2el"}
SGLANG_NAMES = {"ttft": "ttft", "tpot": "tpot", "itl": "itl", "e2el": "e2e_latency"}
#: the table's statistics and each tool's key for them (``median_`` is p50)
STATISTICS = {"mean": ("mean",), "p50": ("median", "p50"), "p90": ("p90",), "p99": ("p99",)}
#: the engines a file's ``backend`` (the benchmark's request format) names, by its first word:
#: vLLM's ``openai``/``openai-chat`` say only that the server spoke OpenAI's API
ENGINES = ("vllm", "sglang", "lmdeploy", "tgi", "trt", "tensorrt-llm", "deepspeed-mii", "scalellm")
#: the per-request arrays (seconds where a time) and what each becomes
REQUEST_ARRAYS = ("input_lens", "output_lens", "ttfts", "itls", "latencies", "start_times", "errors")
#: summary keys that are not metadata (vLLM stores ``--metadata KEY=VALUE`` pairs at the top level)
_KNOWN = {
    "date", "endpoint_type", "backend", "label", "model_id", "tokenizer_id", "num_prompts", "request_rate",
    "burstiness", "max_concurrency", "duration", "completed", "failed", "total_input_tokens",
    "total_output_tokens", "total_output_tokens_retokenized", "request_throughput", "request_goodput",
    "input_throughput", "output_throughput", "output_throughput_retokenized", "total_token_throughput",
    "total_throughput", "total_throughput_retokenized", "max_output_tokens_per_s", "max_concurrent_requests",
    "concurrency", "accept_length", "dataset_name", "random_input_len", "random_output_len",
    "random_range_ratio", "sharegpt_output_len", "fixed_output_len", "generated_texts", "rps_change_events",
    "ramp_up_strategy", "ramp_up_start_rps", "ramp_up_end_rps", "model", "tokenizer", "version", "tp",
    *REQUEST_ARRAYS,
}  # fmt: skip


#: the columns :class:`Given` may fill (the engine is chosen apart: :func:`_engine`)
GIVEN_COLUMNS = (
    "engine_version", "model", "device", "device_count", "tp_size", "dtype", "quantization", "dataset",
    "input_len", "output_len", "ignore_eos", "goodput_slos", "price_per_hour", "host",
)  # fmt: skip


class ImportFormatError(ValueError):
    """A file that cannot be read as the named tool's results: one line, for ``error:``."""


@dataclass(frozen=True)
class Given:
    """What the caller says about the points a file holds, where the file does not say it
    (``tpubench import``'s options). A value the file holds too must agree with it."""

    engine: str | None = None
    engine_version: str | None = None
    model: str | None = None
    device: str | None = None  # the chip as its runtime names it (peaks.py, prices.py match it)
    device_count: int | None = None
    tp_size: int | None = None
    dtype: str | None = None
    quantization: str | None = None
    dataset: str | None = None
    input_len: int | None = None
    output_len: int | None = None
    ignore_eos: bool | None = None
    goodput_slos: str | None = None  # "ttft:200 tpot:50", what the file's request_goodput was measured at
    price_per_hour: float | None = None  # USD per hour of every device the engine served on
    host: str | None = None
    tags: dict[str, str] = field(default_factory=dict)


@dataclass
class Imported:
    """One file's rows: a ``serving`` row per point, a ``serving_requests`` row per request."""

    points: list[dict[str, Any]]
    requests: list[dict[str, Any]]


def vllm_bench(path: str | Path, given: Given = Given()) -> Imported:
    """The points of a ``vllm bench serve --save-result`` file (one JSON object, or one per line)."""
    path = Path(path)
    records = _records(path, "vllm bench serve result")
    for number, record in enumerate(records, 1):
        _check(record, VLLM_REQUIRED, path, number, "vllm bench serve result", _sglang_hint(record))
    return _collect(path, records, f"vllm-bench:{path.name}", given, VLLM_NAMES, _vllm_point)


def sglang(path: str | Path, given: Given = Given()) -> Imported:
    """The points of a ``sglang.bench_serving --output-file`` JSONL file, one per line."""
    path = Path(path)
    records = _records(path, "SGLang bench_serving JSONL")
    for number, record in enumerate(records, 1):
        hint = "; it looks like a vllm bench serve result: tpubench import vllm-bench" if _is_vllm(record) else ""
        _check(record, SGLANG_REQUIRED, path, number, "SGLang bench_serving line", hint)
    return _collect(path, records, f"sglang:{path.name}", given, SGLANG_NAMES, _sglang_point)


def _records(path: Path, what: str) -> list[dict[str, Any]]:
    """The JSON objects of ``path``: the whole file as one, else one per non-empty line."""
    if not path.exists():
        raise ImportFormatError(f"{path}: no such file")
    if not path.is_file():
        raise ImportFormatError(f"{path}: not a file")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ImportFormatError(f"{path}: cannot be read as text ({error})") from error
    try:
        whole = json.loads(text)
    except json.JSONDecodeError:
        whole = None
    if isinstance(whole, dict):
        return [whole]
    records = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ImportFormatError(f"{path}: not JSON (line {number}: {error.msg}); expected a {what}") from error
        if not isinstance(record, dict):
            raise ImportFormatError(f"{path}: line {number} is a JSON {type(record).__name__}, not a {what}")
        records.append(record)
    if not records:
        raise ImportFormatError(f"{path}: empty; expected a {what}")
    return records


def _check(record: dict[str, Any], required: tuple[str, ...], path: Path, number: int, what: str, hint: str) -> None:
    missing = [key for key in required if key not in record]
    if missing:
        where = f" (record {number})" if number > 1 else ""
        raise ImportFormatError(f"{path}{where} is not a {what}: it lacks {', '.join(missing)}{hint}")


def _is_vllm(record: dict[str, Any]) -> bool:
    return all(key in record for key in VLLM_REQUIRED)


def _sglang_hint(record: dict[str, Any]) -> str:
    looks = all(key in record for key in SGLANG_REQUIRED)
    return "; it looks like an SGLang bench_serving line: tpubench import sglang" if looks else ""


def _collect(
    path: Path,
    records: list[dict[str, Any]],
    source: str,
    given: Given,
    names: dict[str, str],
    point_of: Callable[[dict[str, Any], str, Given], dict[str, Any]],
) -> Imported:
    written = datetime.fromtimestamp(path.stat().st_mtime, UTC)
    points, requests = [], []
    for number, record in enumerate(records, 1):
        where = f"{path} (record {number})" if len(records) > 1 else str(path)
        point = {"run_id": uuid.uuid4().hex[:16], "source": source}
        point |= point_of(record, where, given)
        point |= _latencies(record, names, where)
        point |= _given(point, given, where)
        finished = _finished(record, written)
        duration = point["duration_s"]
        point["finished_at"] = finished
        point["started_at"] = finished - timedelta(seconds=duration) if duration and math.isfinite(duration) else None
        if not point["completed"]:
            point["status"], point["error"] = "failed", "no request completed"
        else:
            point["status"] = "ok"
        tags = {**_metadata(record), **given.tags}
        point["tags"] = json.dumps(tags, sort_keys=True) if tags else None
        rows = _requests(record, point["run_id"], where)
        points.append(point)
        requests += rows
    return Imported(points, requests)


def _finished(record: dict[str, Any], written: datetime) -> datetime:
    """When the run ended: vLLM's ``date`` (local time, zone unsaid: read as UTC), else the
    file's modification time (SGLang's lines carry no time)."""
    date = record.get("date")
    if isinstance(date, str):
        try:
            return datetime.strptime(date, "%Y%m%d-%H%M%S").replace(tzinfo=UTC)
        except ValueError:
            pass
    return written


def _vllm_point(record: dict[str, Any], where: str, given: Given) -> dict[str, Any]:
    model = _text(record, "model_id", where)
    return {
        "engine": _engine(record, given, where),
        "engine_version": _text(record, "version", where),
        "model": model,
        "tp_size": _integer(record, "tp", where),
        "dataset": _text(record, "dataset_name", where),
        "input_len": _integer(record, "random_input_len", where),
        "output_len": _integer(record, "random_output_len", where),
        "num_prompts": _integer(record, "num_prompts", where),
        "request_rate": _rate(record, where),
        "burstiness": _number(record, "burstiness", where),
        "max_concurrency": _integer(record, "max_concurrency", where),
        **_summary(record, where),
        "total_token_throughput": _number(record, "total_token_throughput", where),
        "request_goodput": _number(record, "request_goodput", where),
        "max_concurrent_requests": _integer(record, "max_concurrent_requests", where),
    }


def _sglang_point(record: dict[str, Any], where: str, given: Given) -> dict[str, Any]:
    dataset = _text(record, "dataset_name", where)
    random = dataset is not None and dataset.startswith("random")
    return {
        "engine": _engine(record, given, where),
        "model": _text(record, "model_id", where) or _text(record, "model", where),
        "dataset": dataset,
        "input_len": _integer(record, "random_input_len", where) if random else None,
        "output_len": _integer(record, "random_output_len", where) if random else None,
        "num_prompts": _integer(record, "num_prompts", where),
        "request_rate": _rate(record, where),
        "max_concurrency": _integer(record, "max_concurrency", where),
        **_summary(record, where),
        "total_token_throughput": _number(record, "total_throughput", where),
        "max_concurrent_requests": _integer(record, "max_concurrent_requests", where),
    }


def _summary(record: dict[str, Any], where: str) -> dict[str, Any]:
    """The figures both tools name alike."""
    return {
        "completed": _integer(record, "completed", where),
        "failed": _integer(record, "failed", where),
        "duration_s": _number(record, "duration", where),
        "total_input_tokens": _integer(record, "total_input_tokens", where),
        "total_output_tokens": _integer(record, "total_output_tokens", where),
        "request_throughput": _number(record, "request_throughput", where),
        "output_throughput": _number(record, "output_throughput", where),
    }


def _latencies(record: dict[str, Any], names: dict[str, str], where: str) -> dict[str, float | None]:
    """``{metric}_{stat}_ms`` of the table from the tool's keys; null where the file has none."""
    row = {}
    for metric, name in names.items():
        for stat, prefixes in STATISTICS.items():
            values = [_number(record, f"{prefix}_{name}_ms", where) for prefix in prefixes]
            row[f"{metric}_{stat}_ms"] = next((value for value in values if value is not None), None)
    return row


def _engine(record: dict[str, Any], given: Given, where: str) -> str:
    """The engine that served: ``--engine``, else the one the file's backend names."""
    backend = _text(record, "backend", where) or _text(record, "endpoint_type", where)
    named = next((engine for engine in ENGINES if backend and backend.split("-")[0] == engine.split("-")[0]), None)
    if given.engine:
        return given.engine
    if named is None:
        said = f"its backend is {backend!r}, a request format" if backend else "it names no backend"
        raise ImportFormatError(f"{where}: cannot tell which engine served it ({said}); name it with --engine")
    return named


def _given(point: dict[str, Any], given: Given, where: str) -> dict[str, Any]:
    """The caller's values for what the file does not say; a value both give must agree."""
    filled = {}
    for column in GIVEN_COLUMNS:
        wanted = getattr(given, column)
        held = point.get(column)
        if wanted is None:
            filled[column] = held
        elif held is not None and held != wanted:
            option = "--" + column.replace("_", "-")
            raise ImportFormatError(f"{where} says {column} {held!r}; {option} says {wanted!r}: leave the option out")
        else:
            filled[column] = wanted
    if filled["model"] is None:
        raise ImportFormatError(f"{where} names no model; give it with --model")
    return filled


def _metadata(record: dict[str, Any]) -> dict[str, str]:
    """vLLM's ``--metadata`` pairs and the run's label: what the file says beyond the figures."""
    extra = {key: value for key, value in record.items() if key not in _KNOWN and not _is_figure(key)}
    if record.get("label"):
        extra["label"] = record["label"]
    return {key: str(value) for key, value in extra.items() if isinstance(value, str | int | float | bool)}


def _is_figure(key: str) -> bool:
    """A statistic of a latency (``mean_ttft_ms``, ``p99.9_itl_ms``, ``max_itl_ms``), not metadata."""
    return key.endswith("_ms")


def _requests(record: dict[str, Any], run_id: str, where: str) -> list[dict[str, Any]]:
    """A ``serving_requests`` row per request of the file's per-request arrays (none without them)."""
    arrays = {key: record[key] for key in REQUEST_ARRAYS if isinstance(record.get(key), list)}
    if not arrays:
        return []
    lengths = {key: len(values) for key, values in arrays.items()}
    if len(set(lengths.values())) > 1:
        said = ", ".join(f"{key} {count}" for key, count in lengths.items())
        raise ImportFormatError(f"{where}: its per-request arrays differ in length ({said})")
    count = next(iter(lengths.values()))
    starts = arrays.get("start_times")
    first = min(starts) if starts else None
    rows = []
    for index in range(count):
        value = {key: values[index] for key, values in arrays.items()}.get
        error = value("errors") or None
        ok = error is None
        ttft = _seconds_to_ms(value("ttfts"), where) if ok else None
        e2el = _seconds_to_ms(value("latencies"), where) if ok else None
        gaps = value("itls")
        itl = [_seconds_to_ms(gap, where) for gap in gaps] if ok and isinstance(gaps, list) else None
        output_len = value("output_lens")
        tpot = None
        if ttft is not None and e2el is not None and isinstance(output_len, int):
            tpot = GenerationTiming(ttft, e2e_ms=e2el).tpot_ms(output_len)
        rows.append(
            {
                "run_id": run_id,
                "request": index,
                "input_len": value("input_lens"),
                "output_len": output_len,
                "send_s": value("start_times") - first if starts else None,
                "ttft_ms": ttft,
                "tpot_ms": tpot,
                "e2el_ms": e2el,
                "itl_ms": itl,
                "error": str(error) if error is not None else None,
            }
        )
    return rows


def _seconds_to_ms(value: Any, where: str) -> float | None:
    if value is None:
        return None
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise ImportFormatError(f"{where}: a per-request time is {value!r}, not a number of seconds")
    return value * 1e3


def _rate(record: dict[str, Any], where: str) -> float | None:
    """The request rate: a number, or ``"inf"`` (vLLM) / ``Infinity`` (SGLang): all at once."""
    rate = record.get("request_rate")
    if isinstance(rate, str) and rate.strip().lower() in ("inf", "infinity"):
        return math.inf
    return _number(record, "request_rate", where)


def _number(record: dict[str, Any], key: str, where: str) -> float | None:
    value = record.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ImportFormatError(f"{where}: {key} is {value!r}, not a number")
    return float(value)


def _integer(record: dict[str, Any], key: str, where: str) -> int | None:
    value = record.get(key)
    if isinstance(value, str) and value.strip().isdigit():  # vLLM's --metadata tp=4 is text
        return int(value)
    number = _number(record, key, where)
    if number is None:
        return None
    if not number.is_integer():
        raise ImportFormatError(f"{where}: {key} is {value!r}, not a whole number")
    return int(number)


def _text(record: dict[str, Any], key: str, where: str) -> str | None:
    value = record.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str | int | float) or isinstance(value, bool):
        raise ImportFormatError(f"{where}: {key} is {value!r}, not text")
    return str(value)
