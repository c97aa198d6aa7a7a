"""A serving point's rows: one ``serving`` row (the engine, the load, the figures) and one
``serving_requests`` row per request (docs/schema.md). Pure functions of what the sweep
measured, so that the importers of other tools' results fill the same columns the same way.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from tpubench.schema import SERVING
from tpubench.serving.metrics import RequestRecord, cost_per_m_output_tokens


def point_row(
    run_id: str,
    invocation_id: str,
    started_at: datetime,
    finished_at: datetime,
    engine: dict[str, Any],
    load: dict[str, Any],
    figures: dict[str, Any],
    status: str,
    error: str | None = None,
    log_tail: str | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``serving`` row of one point: ``engine`` (the engine's and chip's columns, its
    arguments a list and ``honoured`` a mapping, stored as JSON), ``load`` (the dataset and
    arrival settings) and ``figures`` (:func:`tpubench.serving.metrics.summarize`'s)."""
    engine = dict(engine)
    for key in ("engine_args", "honoured"):
        if engine.get(key) is not None and not isinstance(engine[key], str):
            engine[key] = json.dumps(engine[key])
    row = {
        "run_id": run_id,
        "invocation_id": invocation_id,
        "started_at": started_at,
        "finished_at": finished_at,
        "status": status,
        "error": error,
        "log_tail": log_tail,
        **engine,
        **load,
        **figures,
        **(extra or {}),
    }
    row.setdefault("source", "tpubench")
    row["cost_per_m_output_tokens"] = cost_per_m_output_tokens(row.get("price_per_hour"), row.get("output_throughput"))
    unknown = set(row) - set(SERVING.names)
    if unknown:
        raise ValueError(f"columns not in the serving schema: {sorted(unknown)}")
    return row


def request_rows(run_id: str, invocation_id: str, records: list[RequestRecord]) -> list[dict[str, Any]]:
    """One ``serving_requests`` row per request, numbered in order of arrival time."""
    return [
        {
            "run_id": run_id,
            "invocation_id": invocation_id,
            "request": index,
            "input_len": record.input_len,
            "output_len": record.output_len,
            "send_s": record.send_s,
            "ttft_ms": record.ttft_ms,
            "tpot_ms": record.tpot_ms,
            "e2el_ms": record.e2el_ms,
            "itl_ms": record.itl_ms,
            "error": record.error,
        }
        for index, record in enumerate(records)
    ]
