"""Runs as PyTorch OSS benchmark database v3 records, the format the PyTorch HUD ingests.

The schema is ``oss_ci_benchmark_v3`` in pytorch/test-infra (clickhouse_db_schema): each
record is one metric of one benchmark of one model, with ``benchmark``, ``model``,
``metric`` (``benchmark_values`` a list of floats), ``runners`` and ``dependencies``; every
``extra_info`` is a string-to-string map. vLLM's ``convert_to_pytorch_benchmark_format``
writes the same records. The upload step (CI metadata such as ``head_sha`` and
``workflow_id``) belongs to the HUD's uploader, so only the benchmark's own fields are here.
"""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

from tpubench.analysis.identity import configurations
from tpubench.analysis.nulls import is_missing
from tpubench.analysis.steps import job_steps
from tpubench.spec import DIMENSIONS

#: runs column -> (metric name, scale); a metric is written only where the run has a value
RUN_METRICS = {
    "tokens_per_s": ("tokens_per_s", 1.0),
    "samples_per_s": ("samples_per_s", 1.0),
    "output_tokens_per_s": ("output_tokens_per_s", 1.0),
    "ttft_p50_ms": ("ttft_p50_ms", 1.0),
    "tpot_p50_ms": ("tpot_p50_ms", 1.0),
    "mfu": ("mfu", 1.0),
    "first_step_s": ("first_step_s", 1.0),
    "compile_s": ("compile_s", 1.0),
    "peak_mem_bytes": ("peak_mem_mib", 2**-20),
}


#: the runs columns that say how a run was spread over devices (docs/multi-device.md)
LAYOUT = ("devices", "parallel", "parallel_impl", "mesh", "tp_size", "scaling", "simulated")


def _text(value: Any) -> str:
    if is_missing(value):
        return ""
    return str(value)


def _json_map(value: Any) -> dict[str, Any]:
    """A JSON-object column (``tags``, ``backend_versions``); null in rows that predate it."""
    text = _text(value)
    return json.loads(text) if text else {}


def _layout(run: dict[str, Any]) -> dict[str, str]:
    """A run's layout (:data:`LAYOUT`, read as :func:`tpubench.analysis.identity.configurations`
    reads it), so that its series is not another layout's of the same model: a multi-device
    run's, its hosts where there are several; a 1-device run's plan where it was started under
    one (a series of its own, as every reader keeps it); nothing for a plain 1-device run,
    whose records stay as they were."""
    hosts = {"hosts": str(int(run["hosts"]))} if int(run["hosts"]) > 1 else {}
    if int(run["devices"]) == 1:
        return {} if run["parallel"] == "none" else {"devices": "1", "parallel": str(run["parallel"]), **hosts}
    return {key: _text(run.get(key)) for key in LAYOUT if pd.notna(run.get(key))} | hosts


def records(runs: pd.DataFrame, steps: pd.DataFrame) -> list[dict[str, Any]]:
    """One v3 record per (ok run, metric): ``step_ms`` carries every measured step sample of the
    run in ``benchmark_values``; the other metrics (:data:`RUN_METRICS`) carry the run's value."""
    steps = job_steps(steps)  # a multi-rank run's samples: per step, its slowest rank's
    measured = steps[steps["phase"] == "measure"]
    samples = {run_id: group["step_ms"].dropna().tolist() for run_id, group in measured.groupby("run_id")}
    found = []
    for run in configurations(runs[runs["status"] == "ok"]).to_dict("records"):
        tags = _json_map(run.get("tags"))
        benchmark = {
            "name": "tpubench",
            "mode": "training" if run["mode"] == "train" else "inference",
            "dtype": _text(run["dtype"]),
            "extra_info": {
                key: _text(run[key])
                for key in ("mode", "size", "batch_size", "gen_len", "invocation_id", "run_id", "started_at")
            }
            # the shape's named dimensions that the run has (seq_len for text, image_size for images...)
            | {name: str(int(run[name])) for name in DIMENSIONS if pd.notna(run.get(name))}
            | _layout(run)
            # a user's model's config or source: two models under one reference are two series
            | ({"model_hash": _text(run["model_hash"])} if _text(run.get("model_hash")) else {})
            | {"measured_steps": _text(run["measured_steps"]), **{f"tag.{k}": str(v) for k, v in tags.items()}},
        }
        model = {
            "name": f"{run['workload']}/{run['size']}",
            "type": _text(run["suite"]),
            "backend": run["backend"],
            "origins": ["tpubench"],
            "extra_info": {
                key: _text(run.get(key))
                for key in ("param_count", "active_param_count", "flops_source", "attention_flops")
            },
        }
        accelerated = run["backend"].split("-")[0] != "cpu"
        runner = {
            "name": _text(run["host"]),
            "type": _text(run["device"]),
            "cpu_info": _text(run["cpu_model"]),
            "gpu_info": _text(run["device"]) if accelerated else "",
            "gpu_count": int(run["device_count"]) if accelerated and pd.notna(run["device_count"]) else 0,
            "extra_info": {"host_other_cpu_share": _text(run["host_other_cpu_share"])},
        }
        dependencies = {"torch": {"version": _text(run["torch_version"])}}
        for name, version in _json_map(run.get("backend_versions")).items():
            dependencies.setdefault(name, {"version": str(version)})
        dependencies["tpubench"] = {"version": _text(run["tpubench_version"]), "sha": _text(run["git_sha"])}
        metrics = [("step_ms", samples.get(run["run_id"]) or [run["median_step_ms"]])]
        for column, (name, scale) in RUN_METRICS.items():
            if run.get(column) is not None and pd.notna(run[column]):
                metrics.append((name, [float(run[column]) * scale]))
        for name, values in metrics:
            found.append(
                {
                    "benchmark": benchmark,
                    "model": model,
                    "metric": {"name": name, "benchmark_values": [float(v) for v in values], "extra_info": {}},
                    "runners": [runner],
                    "dependencies": dependencies,
                }
            )
    return found
