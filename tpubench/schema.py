"""The parquet schemas of the results store: the data contract (documented in docs/schema.md).

Bump ``SCHEMA_VERSION`` when a column changes meaning or is removed; adding a nullable
column needs no bump, since older files load with it null. Units are in column names.
"""

from __future__ import annotations

import pyarrow as pa

from tpubench.serving.metrics import PERCENTILES

#: 2: a decode run's tokens_per_s is output tokens per second (was prompt plus output tokens)
#: 3: a train step's loss in the steps table, the runs' data seed (docs/schema.md)
SCHEMA_VERSION = 3

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
        ("chips", _int),
        ("hosts", _int),
        ("parallel", _string),
        ("parallel_impl", _string),
        ("mesh", _string),
        ("comm_backend", _string),
        ("tp_size", _int),
        ("scaling", _string),
        ("global_batch_size", _int),
        ("per_device_batch_size", _int),
        ("simulated", pa.bool_()),
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
        ("samples_per_s_per_device", _float),
        ("tokens_per_s_per_device", _float),
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
        # the precision its matmuls ran in, and the peak MFU divides by (docs/precision.md)
        ("precision", _string),
        ("mfu_peak", _string),
        ("peak_flops_per_s", _float),
        ("converted_linears", _int),
        ("skipped_linears", _int),
        ("conversion", _string),
        # divergence from the bf16 run of the same seed and inputs (docs/precision.md)
        ("reference_precision", _string),
        ("final_loss", _float),
        ("reference_loss", _float),
        ("loss_rel_diff", _float),
        ("logits_rel_error", _float),
        ("top1_agreement", _float),
        ("quality_ok", pa.bool_()),
        # long context: the attention kernel asked for, the one that ran, its share of a step
        ("attention", _string),
        ("attention_kernel", _string),
        ("attention_kernel_source", _string),
        ("attention_share", _float),
        ("peak_mem_bytes", _int),
        ("peak_mem_bytes_min", _int),
        ("estimated_mem_bytes", _int),
        ("baseline_mem_bytes", _int),
        ("mem_weights_bytes", _int),
        ("mem_grads_bytes", _int),
        ("mem_optimizer_bytes", _int),
        ("mem_activations_bytes", _int),
        ("memory_breakdown_source", _string),
        ("energy_source", _string),
        ("energy_j", _float),
        ("joules_per_token", _float),
        ("joules_per_sample", _float),
        ("avg_power_w", _float),
        ("energy_window_s", _float),
        ("energy_steps", _int),
        ("param_count", _int),
        ("trainable_param_count", _int),
        ("active_param_count", _int),
        ("loss_source", _string),
        ("seed", _int),
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
        ("collective_ms", _float),
        ("collective_share", _float),
        ("exposed_collective_ms", _float),
        ("exposed_collective_share", _float),
        ("rank_skew_pct", _float),
        ("failed_rank", _int),
        ("host_skew_pct", _float),
        ("failed_host", _int),
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
        ("rank", _int),
        ("phase", _string),
        ("step_ms", _float),
        ("host_ms", _float),
        ("ttft_ms", _float),
        ("tpot_ms", _float),
        ("compile_count", _int),
        ("compile_s", _float),
        ("executions", _int),
        ("host_reads", _int),
        ("loss", _float),
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
        ("devices", _int),
        ("comm_bytes", _float),
        ("busbw_gbps", _float),
        ("flops_source", _string),
        ("bytes_source", _string),
        ("shapes", _string),
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
        ("rank", _int),
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

#: one row per point of a ceilings sweep (``tpubench ceilings``; docs/ceilings.md): what a
#: device reaches in a matmul, a STREAM kernel, a collective or an empty step
CEILINGS = pa.schema(
    [
        ("run_id", _string),  # one worker's sweep (a backend, a kind, its dtypes, a group size)
        ("invocation_id", _string),
        ("schema_version", pa.int32()),
        ("started_at", pa.timestamp("us", tz="UTC")),
        ("finished_at", pa.timestamp("us", tz="UTC")),
        ("kind", _string),
        ("op", _string),
        ("dtype", _string),
        ("backend", _string),
        ("device", _string),
        ("device_kind", _string),
        ("devices", _int),
        ("simulated", pa.bool_()),
        ("shape", _string),
        ("m", _int),
        ("n", _int),
        ("k", _int),
        ("size_bytes", _int),
        ("flops_per_op", _float),
        ("bytes_per_op", _float),
        ("status", _string),
        ("error", _string),
        ("warnings", _string),
        ("timing", _string),
        ("reps", _int),
        ("flush_bytes", _int),
        ("llc_bytes", _int),
        ("samples", _int),
        ("samples_s", pa.list_(_float)),
        ("warmup_s", pa.list_(_float)),
        ("first_s", _float),
        ("median_s", _float),
        ("min_s", _float),
        ("p90_s", _float),
        ("rate_unit", _string),
        ("median_rate", _float),
        ("max_rate", _float),
        ("p10_rate", _float),
        ("busbw_factor", _float),
        ("algbw_median", _float),
        ("num_threads", _int),
        ("host_load_1m", _float),
        ("host_other_cpu_share", _float),
        ("worker_wall_s", _float),
        ("device_wait_s", _float),
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

#: a run's memory per rank (docs/schema.md): its breakdown (kind ``breakdown``: weights,
#: gradients, optimizer, activations, peak, baseline) and, with --profile-memory, one step's
#: bytes per torch.profiler category over time (kind ``timeline``)
MEMORY = pa.schema(
    [
        ("run_id", _string),
        ("invocation_id", _string),
        ("schema_version", pa.int32()),
        ("rank", _int),
        ("kind", _string),
        ("category", _string),
        ("t_us", _float),
        ("bytes", _int),
        ("source", _string),
    ]
)

_LATENCIES = ("ttft", "tpot", "itl", "e2el")
_STATS = ("mean", "p50", "p90", "p99")

#: one row per point of a serving sweep (``tpubench serving``, or imported from vLLM's and
#: SGLang's benchmark results): an engine under one request rate and concurrency, with
#: vLLM's definitions of each latency (docs/serving.md)
SERVING = pa.schema(
    [
        ("run_id", _string),  # the point
        ("invocation_id", _string),
        ("schema_version", pa.int32()),
        ("started_at", pa.timestamp("us", tz="UTC")),
        ("finished_at", pa.timestamp("us", tz="UTC")),
        ("source", _string),  # tpubench, or the importer and file: vllm-bench:NAME, sglang:NAME
        ("status", _string),
        ("error", _string),
        ("log_tail", _string),
        # the engine
        ("engine", _string),
        ("engine_version", _string),
        ("engine_args", _string),  # JSON list
        ("url", _string),
        ("honoured", _string),  # JSON: request fields the engine honoured, e.g. {"ignore_eos": false}
        ("cold_start_s", _float),  # engine start to ready, compile included
        ("model", _string),
        ("param_count", _int),
        ("device", _string),  # the chip, read from the engine's host when local
        ("device_count", _int),
        ("host", _string),
        ("dtype", _string),
        ("quantization", _string),
        ("tp_size", _int),
        # the load
        ("dataset", _string),
        ("input_len", _int),
        ("output_len", _int),
        ("num_prompts", _int),
        ("request_rate", _float),  # requests/s; inf: all sent at once
        ("burstiness", _float),
        ("max_concurrency", _int),  # null: unbounded
        ("seed", _int),
        ("warmups", _int),
        ("ignore_eos", pa.bool_()),
        ("goodput_slos", _string),  # e.g. "ttft:200 tpot:50" (ms)
        # what it measured
        ("completed", _int),
        ("failed", _int),
        ("duration_s", _float),
        ("total_input_tokens", _int),
        ("total_output_tokens", _int),
        *[(f"{metric}_{stat}_ms", _float) for metric in _LATENCIES for stat in _STATS],
        ("request_throughput", _float),  # requests/s
        ("output_throughput", _float),  # output tokens/s
        ("total_token_throughput", _float),  # input + output tokens/s
        ("request_goodput", _float),  # requests/s meeting every SLO
        ("max_concurrent_requests", _int),
        ("price_per_hour", _float),
        ("cost_per_m_output_tokens", _float),
        ("tpubench_version", _string),
        ("git_sha", _string),
        ("tags", _string),
    ]
)

#: one row per request of a serving point: what vLLM's result JSON keeps per request
SERVING_REQUESTS = pa.schema(
    [
        ("run_id", _string),
        ("invocation_id", _string),
        ("schema_version", pa.int32()),
        ("request", _int),
        ("input_len", _int),
        ("output_len", _int),  # from the server's usage
        ("send_s", _float),  # since the point's start
        ("ttft_ms", _float),
        ("tpot_ms", _float),
        ("e2el_ms", _float),
        ("itl_ms", pa.list_(_float)),  # every gap between chunks
        ("error", _string),
    ]
)

TABLES = {
    "runs": RUNS,
    "steps": STEPS,
    "ops": OPS,
    "compiles": COMPILES,
    "memory": MEMORY,
    "ceilings": CEILINGS,
    "serving": SERVING,
    "serving_requests": SERVING_REQUESTS,
}
