"""The parquet schemas of the results store: the data contract (documented in docs/schema.md).

Bump ``SCHEMA_VERSION`` when a column changes meaning or is removed; adding a nullable
column needs no bump, since older files load with it null. Units are in column names.
"""

from __future__ import annotations

import pyarrow as pa

from tpubench.serving import PERCENTILES

#: 2: a decode run's tokens_per_s is output tokens per second (was prompt plus output tokens)
SCHEMA_VERSION = 2

STATUSES = ("ok", "mismatch", "failed", "oom", "timeout", "crashed", "unavailable", "skipped")

_string, _int, _float = pa.string(), pa.int64(), pa.float64()

RUNS = pa.schema(
    [
        ("run_id", _string),
        ("invocation_id", _string),
        ("schema_version", pa.int32()),
        ("started_at", pa.timestamp("us", tz="UTC")),
        ("finished_at", pa.timestamp("us", tz="UTC")),
        ("suite", _string),
        ("workload", _string),
        ("size", _string),
        ("model_ref", _string),
        ("model_hash", _string),
        ("backend", _string),
        ("device", _string),
        ("mode", _string),
        ("dtype", _string),
        ("batch_size", _int),
        ("seq_len", _int),
        ("image_size", _int),
        ("latent_size", _int),
        ("gen_len", _int),
        ("devices", _int),
        ("parallel", _string),
        ("tp_size", _int),
        ("scaling", _string),
        ("warmup_min_steps", _int),
        ("status", _string),
        ("error", _string),
        ("stderr_tail", _string),
        ("warnings", _string),
        ("first_step_s", _float),
        ("first_step_compiles", _int),
        ("warmup_steps", _int),
        ("measured_steps", _int),
        ("compile_count", _int),
        ("compile_s", _float),
        ("recompiles_after_warmup", _int),
        ("capture_compiles", pa.bool_()),
        ("graph_breaks", _int),
        ("graph_break_ids", _string),
        ("recompile_causes", _string),
        ("recompile_limit_hit", pa.bool_()),
        ("executions_per_step", _float),
        ("host_reads_per_step", _float),
        ("missing_lowerings", _string),
        ("compile_s_warmup", _float),
        ("compile_s_measured", _float),
        ("compile_events_dropped", _int),
        ("median_step_ms", _float),
        ("p10_step_ms", _float),
        ("p90_step_ms", _float),
        ("mean_step_ms", _float),
        ("std_step_ms", _float),
        ("ci_low_step_ms", _float),
        ("ci_high_step_ms", _float),
        ("median_host_ms", _float),
        ("samples_per_s", _float),
        ("tokens_per_s", _float),
        *[(f"{metric}_p{p}_ms", _float) for metric in ("ttft", "tpot", "itl") for p in PERCENTILES],
        ("output_tokens_per_s", _float),
        ("total_tokens_per_s", _float),
        ("decode_bytes_per_step", _float),
        ("bandwidth_util", _float),
        ("flops_per_step", _float),
        ("flops_source", _string),
        ("flops_incomplete", _string),
        ("attention_flops", _string),
        ("mfu", _float),
        ("peak_mem_bytes", _int),
        ("estimated_mem_bytes", _int),
        ("baseline_mem_bytes", _int),
        ("param_count", _int),
        ("trainable_param_count", _int),
        ("active_param_count", _int),
        ("loss_source", _string),
        ("execute_s", _float),
        ("cached_compiles", _int),
        ("fallback_op_count", _int),
        ("fallback_ops", _string),
        ("compile_cache", _string),
        ("compile_cache_hits", _int),
        ("compile_cache_misses", _int),
        ("compile_cache_load_failures", _int),
        ("trace_path", _string),
        ("profile_steps", _int),
        ("ops_error", _string),
        ("tpu_eager_mode", _string),
        ("verified", _string),
        ("max_rel_err", _float),
        ("verify_tolerance", _float),
        ("tokens_match", pa.bool_()),
        ("backend_metrics", _string),
        ("worker_wall_s", _float),
        ("device_wait_s", _float),
        ("chip_wait_s", _float),
        ("host_load_1m", _float),
        ("host_other_cpu_share", _float),
        ("ray_node_id", _string),
        ("host", _string),
        ("cpu_model", _string),
        ("device_count", _int),
        ("python_executable", _string),
        ("python_version", _string),
        ("torch_version", _string),
        ("backend_versions", _string),
        ("tpubench_version", _string),
        ("git_sha", _string),
        ("env", _string),
        ("fingerprint", _string),
        ("tags", _string),
    ]
)

STEPS = pa.schema(
    [
        ("run_id", _string),
        ("invocation_id", _string),
        ("schema_version", pa.int32()),
        ("step", _int),
        ("phase", _string),
        ("step_ms", _float),
        ("host_ms", _float),
        ("ttft_ms", _float),
        ("tpot_ms", _float),
        ("compile_count", _int),
        ("compile_s", _float),
        ("executions", _int),
        ("host_reads", _int),
    ]
)

OPS = pa.schema(
    [
        ("run_id", _string),
        ("invocation_id", _string),
        ("schema_version", pa.int32()),
        ("source", _string),
        ("op", _string),
        ("category", _string),
        ("framework_op", _string),
        ("module", _string),
        ("calls", _int),
        ("self_time_us", _float),
        ("total_time_us", _float),
        ("self_pct", _float),
        ("self_us_per_step", _float),
        ("device_time_us", _float),
        ("flops", _float),
        ("bytes_accessed", _float),
        ("achieved_flops_per_s", _float),
        ("bound_by", _string),
        ("traced_steps", _int),
        ("step_time_us", _float),
        ("tool", _string),
    ]
)

#: one row per compile-related event of a run (docs/schema.md; captured by tpubench/compiles/)
COMPILES = pa.schema(
    [
        ("run_id", _string),
        ("invocation_id", _string),
        ("schema_version", pa.int32()),
        ("seq", _int),
        ("step", _int),
        ("phase", _string),
        ("event", _string),
        ("layer", _string),
        ("cause", _string),
        ("cause_inferred", pa.bool_()),
        ("raw", _string),
        ("graph_break_id", _string),
        ("source", _string),
        ("graph_id", _string),
        ("compile_id", _string),
        ("compile_s", _float),
        ("cache", _string),
        ("op", _string),
        ("count", _int),
    ]
)

TABLES = {"runs": RUNS, "steps": STEPS, "ops": OPS, "compiles": COMPILES}
