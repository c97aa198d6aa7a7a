"""A serving sweep: an engine under each load point in turn, one ``serving`` row and its
``serving_requests`` rows written as each point ends.

The engine is a :class:`Target`: where it answers, what it is, and two callables, ``alive``
(is its process still there?) and ``log_tail`` (the end of its log), which the launch layer
gives for an engine it started; a server at ``--url`` has neither. Either way the engine is
gone when ``/models`` stops answering. Each point sends
the same prompts (the dataset's, drawn once with the seed) at its own rate and concurrency.
A server that dies in the middle of a point gives failed requests and a failed point with the
reason and its log's tail; the sweep stops there, and every point written before it stays.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from tpubench.fingerprint import git_sha
from tpubench.serving import arrivals, client, datasets, rows
from tpubench.serving.metrics import slos_text, summarize
from tpubench.version import __version__

#: a load point: requests/s (inf: all at once) and the most in flight (None: unbounded)
Point = tuple[float, int | None]


class Writer(Protocol):
    def add_rows(self, tables: dict[str, Any]) -> None: ...


def _no_log() -> str | None:
    return None


@dataclass
class Target:
    """An engine that answers OpenAI's API at ``url`` (``http://HOST:PORT/v1``), and what is
    known of it: each field a column of the ``serving`` table."""

    url: str
    model: str
    engine: str
    engine_version: str | None = None
    engine_args: list[str] = field(default_factory=list)
    honoured: dict[str, bool] = field(default_factory=dict)
    cold_start_s: float | None = None
    device: str | None = None
    device_count: int | None = None
    host: str | None = None
    dtype: str | None = None
    quantization: str | None = None
    tp_size: int | None = None
    param_count: int | None = None
    price_per_hour: float | None = None
    log_tail: Callable[[], str | None] = _no_log
    alive: Callable[[], bool] | None = None

    def columns(self) -> dict[str, Any]:
        names = ("url", "model", "engine", "engine_version", "engine_args", "honoured", "cold_start_s", "device")
        names += ("device_count", "host", "dtype", "quantization", "tp_size", "param_count", "price_per_hour")
        return {name: getattr(self, name) for name in names}


@dataclass(frozen=True)
class Load:
    """What every point of a sweep sends: the dataset and its lengths, the arrival settings
    besides the rate, the warm-ups, and the SLOs goodput is counted against."""

    dataset: str = "random"
    input_len: int = 1024
    output_len: int = 128
    num_prompts: int = 100
    burstiness: float = 1.0
    seed: int = 0
    warmups: int = 1
    ignore_eos: bool = False
    slos: dict[str, float] = field(default_factory=dict)
    request_timeout_s: float = 3600.0

    def columns(self, rate: float, concurrency: int | None) -> dict[str, Any]:
        return {
            "dataset": self.dataset,
            "input_len": None if self.dataset.startswith("sharegpt:") else self.input_len,  # the file's own
            "output_len": self.output_len,
            "num_prompts": self.num_prompts,
            "request_rate": rate,
            "burstiness": self.burstiness,
            "max_concurrency": concurrency,
            "seed": self.seed,
            "warmups": self.warmups,
            "ignore_eos": self.ignore_eos,
            "goodput_slos": slos_text(self.slos),
        }


def points(rates: Sequence[float], concurrencies: Sequence[int | None]) -> list[Point]:
    """Every rate at each concurrency: one latency-throughput curve per concurrency."""
    return [(rate, concurrency) for concurrency in concurrencies for rate in rates]


def answering(target: Target) -> bool:
    """Whether the engine is still there: its process alive where the target knows one, and
    ``/models`` answering. The process alone is not enough: a server's sockets close as it exits,
    before its process can be seen to have ended."""
    if target.alive is not None and not target.alive():
        return False
    return client.served_models(target.url, timeout_s=10.0) is not None


def _verdict(result: client.PointResult, target: Target) -> tuple[str, str | None, bool]:
    """The point's status, the reason when it is not plainly ok, and whether the server is gone."""
    failed = [record.error for record in result.records if record.error]
    lost = result.server_lost or (bool(failed) and not answering(target))
    if lost:
        return "failed", f"the server stopped answering during the point; first error: {failed[0]}", True
    if failed and len(failed) == len(result.records):
        return "failed", f"no request completed; first error: {failed[0]}", False
    if failed:
        return "ok", f"{len(failed)} of {len(result.records)} requests failed; first error: {failed[0]}", False
    return "ok", None, False


def run_sweep(
    target: Target,
    load: Load,
    sweep: Sequence[Point],
    writer: Writer,
    invocation_id: str,
    tags: str | None = None,
    on_point: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Run each point of ``sweep`` against ``target``, writing its rows through ``writer`` (a
    :class:`tpubench.store.InvocationWriter` of the serving tables) as it ends; the points' rows.
    Stops after a point in which the server died."""
    prompts = datasets.prompts(load.dataset, load.num_prompts, load.input_len, load.output_len, load.seed)
    common = {"tpubench_version": __version__, "git_sha": git_sha(), "tags": tags}
    written = []
    for rate, concurrency in sweep:
        run_id = uuid.uuid4().hex
        times = arrivals.arrival_times(len(prompts), rate, load.burstiness, load.seed)
        started = datetime.now(UTC)
        result = client.run_point(
            target.url,
            target.model,
            prompts,
            times,
            max_concurrency=concurrency,
            warmups=load.warmups,
            ignore_eos=load.ignore_eos,
            request_timeout_s=load.request_timeout_s,
            alive=lambda: answering(target),
        )
        status, error, lost = _verdict(result, target)
        figures = summarize(result.records, result.duration_s, load.slos)
        row = rows.point_row(
            run_id,
            invocation_id,
            started,
            datetime.now(UTC),
            target.columns(),
            load.columns(rate, concurrency),
            {**figures, "max_concurrent_requests": result.max_in_flight},
            status,
            error,
            target.log_tail() if status == "failed" else None,
            common,
        )
        writer.add_rows(
            {"serving": [row], "serving_requests": rows.request_rows(run_id, invocation_id, result.records)}
        )
        written.append(row)
        if on_point is not None:
            on_point(row)
        if lost:
            break
    return written
