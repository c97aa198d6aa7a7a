"""How a configuration scales over devices: per-device throughput, MFU and efficiency over N.

Stateless functions from runs rows (:func:`tpubench.store.load_runs`) to DataFrames, shared
by ``tpubench scaling`` and the dashboard's Scaling page. Efficiency is computed here, at
read time, never stored: its baseline may run in a later invocation than the rows it
judges.

- **Configuration**: what a run computes and how it is split, without the device count
  (:data:`CONFIG_KEYS`). Weak scaling keeps the per-device batch, strong scaling the global
  one, so the batch in the key is the one the scaling keeps. Pure tp's degree is N itself;
  2-D keeps its tp degree as it grows the data-parallel axis. The hosts are part of it: a
  sweep over 2 hosts is a table of its own (``dp on 2 hosts``), N the devices over all its
  hosts (hosts x devices per host), so that its N = 2 never meets one host's N = 2.
- **N = 1**: a configuration's 1-device rows of the same computation and batch, started
  under its plan (``--devices 1,2 --parallel fsdp``'s N = 1), else plain ones (``--parallel
  none``; old rows without ``devices`` are such rows), never another plan's: a 1-device row
  is the same computation whatever its plan (the plan applies to nothing), but a dp table
  once took an fsdp run as its baseline where the dp one was in the store.
  1-device rows run on one host, so every host count's table shares them.
- **Baseline**: the configuration's 1-device row that ran, else the smallest N that ran (1
  device ran out of memory); the table names it (``baseline_devices``, ``baseline_run_id``,
  and its plan and hosts: ``baseline_parallel``, ``baseline_hosts``).
- **Efficiency** (torchtitan's TPS/GPU and MaxText's per-chip figures): weak, throughput per
  device at N over the same at the baseline; strong, speed-up x N0 / N.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from tpubench import peaks
from tpubench.analysis.identity import CONFIG_KEYS, ONE_DEVICE, ONE_HOST, with_run_settings
from tpubench.analysis.nulls import is_missing
from tpubench.analysis.prices import Price, device_kind, device_price
from tpubench.spec import DIMENSIONS, hosts_label, shape_label

#: the columns whose values make a configuration (with :func:`config_key`'s derived ones): every
#: reader's configuration (:data:`tpubench.analysis.identity.CONFIG_KEYS`, the hosts included)
#: but the layout and the batch, which scaling keys by what it keeps, and the device, which a
#: table spans
IDENTITY = tuple(key for key in CONFIG_KEYS if key not in ("device", "batch_size", *ONE_DEVICE))
#: what a configuration computes: :data:`IDENTITY` less the hosts (its N = 1 rows ran on one)
COMPUTATION = tuple(key for key in IDENTITY if key not in ONE_HOST)
#: a configuration, as the columns :func:`with_keys` adds
CONFIG_KEYS = (*IDENTITY, "parallel", "tp_key", "scaling", "batch_key")
#: the statuses whose timings count
RAN = ("ok", "mismatch")
#: the per-N table's columns, in order
TABLE_COLUMNS = (
    "devices",
    "devices_per_host",
    "run_id",
    "status",
    "step_ms",
    "tokens_per_s_per_device",
    "samples_per_s_per_device",
    "mfu",
    "efficiency",
    "baseline_devices",
    "baseline_run_id",
    "baseline_parallel",
    "baseline_hosts",
    "collective_share",
    "exposed_collective_share",
    "peak_mem_bytes",
    "peak_mem_bytes_min",
    "rank_skew_pct",
    "simulated",
)
#: the columns this module reads beyond the key ones, and what a store without them reads as
#: (a store from before multi-device runs: one device, no plan)
DEFAULTS: dict[str, Any] = {
    "devices": 1,
    "hosts": 1,  # rows from before multi-host runs ran on one
    "parallel": "none",
    "tp_size": 1,
    "scaling": None,
    "per_device_batch_size": None,
    "global_batch_size": None,
    "tokens_per_s_per_device": None,
    "samples_per_s_per_device": None,
    "collective_share": None,
    "exposed_collective_share": None,
    "peak_mem_bytes_min": None,
    "rank_skew_pct": None,
    "simulated": None,
    "model_hash": None,
    "mfu": None,
    "flops_per_step": None,
    "joules_per_token": None,  # a store from before energy was measured: none
    "energy_source": None,
    "peak_mem_bytes": None,
    "tokens_per_s": None,
    "samples_per_s": None,
    "device": None,
    "started_at": None,
}
#: what this module reads of a runs row (:data:`DEFAULTS`' columns too): a frame is
#: cut to these first, since each configuration's rows are copied several times over, and
#: copying the other columns too (the dashboard's index has 60, a store's runs 170) was
#: half of a report over a year of a fleet's runs
READS = frozenset(
    {
        *CONFIG_KEYS,
        *DEFAULTS,
        *DIMENSIONS,
        "gen_len",
        "run_id",
        "status",
        "median_step_ms",
        "batch_size",
        "flops_incomplete",
    }
)
#: a sweep that gives the scaling views something to show
SWEEP_HINT = "tpubench run --workload gpt2 --size 124m --devices 1,2,4,8 --parallel fsdp --profile"
SIMULATED_NOTE = (
    "simulated: virtual CPU devices or gloo ranks on one host; the mechanism ran, the timings mean nothing about a chip"
)
ANY = "*"  # a 1-device row's parallel and scaling in a key: configurations() places it by its stored plan


def normalised(runs: pd.DataFrame) -> pd.DataFrame:
    """``runs`` with every column this module reads, old rows read as one device."""
    frame = runs.copy()
    for column, default in DEFAULTS.items():
        if column not in frame:
            frame[column] = default
    for column in (*DIMENSIONS, "gen_len"):
        if column not in frame:
            frame[column] = None
    frame["devices"] = frame["devices"].astype("Float64").fillna(1).astype("Int64")
    frame["tp_size"] = frame["tp_size"].astype("Float64").fillna(1).astype("Int64")
    frame["hosts"] = frame["hosts"].astype("Float64").fillna(1).astype("Int64")
    frame["parallel"] = frame["parallel"].astype(object).where(frame["parallel"].notna(), "none")
    return with_run_settings(frame)


def data_parallel(row: Mapping[str, Any]) -> int:
    """The data-parallel degree of a row: N over its tp degree (pure tp: 1)."""
    devices = int(row["devices"])
    if row["parallel"] == "tp":
        return 1
    tp = 1 if is_missing(row["tp_size"]) else int(row["tp_size"])
    return max(devices // tp, 1) if row["parallel"] == "fsdp_tp" else devices


def per_device_batch(row: Mapping[str, Any]) -> int | None:
    """The batch one device holds per step: stored, else the global batch over the dp degree."""
    if not is_missing(row.get("per_device_batch_size")):
        return int(row["per_device_batch_size"])
    batch = row.get("batch_size") if is_missing(row.get("global_batch_size")) else row.get("global_batch_size")
    return None if is_missing(batch) else int(batch) // data_parallel(row)


def global_batch(row: Mapping[str, Any]) -> int | None:
    """The batch one step consumes over all devices (``batch_size`` is the global batch)."""
    for column in ("global_batch_size", "batch_size"):
        if not is_missing(row.get(column)):
            return int(row[column])
    return None


def config_key(row: Mapping[str, Any]) -> dict[str, Any]:
    """A row's configuration: :data:`IDENTITY`, plus the plan, the tp degree when it does
    not grow with N (2-D), the scaling and the batch that scaling keeps. A 1-device row's
    plan and scaling are :data:`ANY`."""
    identity = {column: None if is_missing(row.get(column)) else row.get(column) for column in IDENTITY}
    if int(row["devices"]) == 1:
        return {**identity, "parallel": ANY, "tp_key": ANY, "scaling": ANY, "batch_key": global_batch(row)}
    scaling = None if is_missing(row.get("scaling")) else row.get("scaling")
    tp_key = int(row["tp_size"]) if row["parallel"] == "fsdp_tp" and not is_missing(row.get("tp_size")) else None
    batch = per_device_batch(row) if scaling == "weak" else global_batch(row)
    return {**identity, "parallel": row["parallel"], "tp_key": tp_key, "scaling": scaling, "batch_key": batch}


def with_keys(runs: pd.DataFrame) -> pd.DataFrame:
    """``runs`` (normalised) with the :data:`CONFIG_KEYS` columns: :func:`config_key` of every
    row, computed over columns (a Python call per row cost seconds on a year of nights, on every
    first render of the Scaling page)."""
    frame = normalised(runs)
    devices = frame["devices"].astype("int64")
    tp = frame["tp_size"].astype("int64")
    one = devices == 1
    numbers = {
        column: pd.to_numeric(frame[column]).astype("Float64")
        for column in ("per_device_batch_size", "global_batch_size", "batch_size")
        if column in frame
    }
    none = pd.Series(pd.NA, index=frame.index, dtype="Float64")
    global_ = numbers.get("global_batch_size", none).fillna(numbers.get("batch_size", none))
    data_parallel = devices.where(frame["parallel"] != "fsdp_tp", (devices // tp).clip(lower=1))
    data_parallel = data_parallel.where(frame["parallel"] != "tp", 1)
    per_device_ = numbers.get("per_device_batch_size", none).fillna(global_.floordiv(data_parallel))
    scaling = frame["scaling"].astype(object).where(frame["scaling"].notna(), None)
    batch = global_.where(one | (scaling != "weak"), per_device_)
    keys = pd.DataFrame(
        {
            "parallel": frame["parallel"].astype(object).where(~one, ANY),
            "tp_key": _integers(tp.where(frame["parallel"] == "fsdp_tp")).where(~one, ANY),
            "scaling": scaling.where(~one, ANY),
            "batch_key": _integers(batch),
        },
        index=frame.index,
        dtype=object,
    )
    for column in ("parallel", "scaling"):
        frame[f"stored_{column}"] = frame[column]
    return frame.drop(columns=["parallel", "scaling"]).join(keys)


def _integers(values: pd.Series) -> pd.Series:
    """Whole numbers as Python ints and missing ones as None, as :func:`config_key` gives them."""
    known = values.notna().to_numpy()
    return pd.Series(
        [int(value) if present else None for value, present in zip(values.to_numpy(object), known, strict=True)],
        index=values.index,
        dtype=object,
    )


#: per-device throughput columns and the run-wide ones they derive from
PER_DEVICE = {"tokens_per_s_per_device": "tokens_per_s", "samples_per_s_per_device": "samples_per_s"}


def per_device(row: Mapping[str, Any], column: str) -> float | None:
    """A per-device throughput column (:data:`PER_DEVICE`): stored, else the run's over its devices."""
    if not is_missing(row.get(column)):
        return float(row[column])
    total = row.get(PER_DEVICE[column])
    if is_missing(total):
        return None
    return float(total) / (1 if is_missing(row.get("devices")) else int(row["devices"]))


def throughput_per_device(row: Mapping[str, Any]) -> float | None:
    """Tokens per second per device (samples where a workload has no tokens)."""
    tokens = per_device(row, "tokens_per_s_per_device")
    return tokens if tokens is not None else per_device(row, "samples_per_s_per_device")


def throughput_column(rows: pd.DataFrame) -> str:
    """The per-device throughput a configuration's table and chart show: tokens/s where its rows
    have tokens, else samples/s (:func:`throughput_per_device`, which efficiency divides)."""
    tokens = "tokens_per_s_per_device"
    return tokens if tokens in rows and rows[tokens].notna().any() else "samples_per_s_per_device"


def efficiency_note(report: pd.DataFrame) -> str:
    """How efficiency is read, in the throughput the report's configurations show: a footnote
    under samples/s tables that said tokens/s described a figure no table had."""
    units = dict.fromkeys(
        throughput_column(rows).removesuffix("_per_s_per_device") + "/s"
        for _, rows in report.groupby("configuration", sort=False)
    )
    throughput = " or ".join(units) or "tokens/s"
    return f"efficiency: weak, {throughput} per device at N / at the baseline; strong, speed-up x N0 / N"


def mfu_per_device(flops_per_step: float, step_ms: float, devices: int, peak_flops_per_device: float) -> float:
    """MFU per device: global FLOPs / (step s x N x peak per device) (torchprime, torchtitan)."""
    return flops_per_step / (step_ms / 1e3 * devices * peak_flops_per_device)


def row_mfu(row: Mapping[str, Any]) -> float | None:
    """The stored MFU (per device), else computed from the FLOPs and the device's peak; none
    for a FLOP count that missed ops (``flops_incomplete``), which the run left null on purpose."""
    if not is_missing(row.get("mfu")):
        return float(row["mfu"])
    if not is_missing(row.get("flops_incomplete")):
        return None
    if is_missing(row.get("flops_per_step")) or is_missing(row.get("median_step_ms")) or not row.get("device"):
        return None
    peak = peaks.lookup(str(row["device"]), device_kind(str(row["backend"]), str(row["device"])))
    per_device = peak.device_flops(str(row["dtype"])) if peak else None
    if not per_device:
        return None
    return mfu_per_device(float(row["flops_per_step"]), float(row["median_step_ms"]), int(row["devices"]), per_device)


def efficiency(row: Mapping[str, Any], baseline: Mapping[str, Any], scaling: str | None) -> float | None:
    """Scaling efficiency of ``row`` against ``baseline`` (the same configuration on N0 devices).

    Weak (and unspecified) scaling: throughput per device at N over the same at N0.
    Strong: speed-up x N0 / N, the speed-up being the baseline's step time over the row's.
    """
    if scaling == "strong":
        step, base_step = row.get("median_step_ms"), baseline.get("median_step_ms")
        if is_missing(step) or is_missing(base_step) or step <= 0:
            return None
        return float(base_step) / float(step) * int(baseline["devices"]) / int(row["devices"])
    mine, theirs = throughput_per_device(row), throughput_per_device(baseline)
    return mine / theirs if mine is not None and theirs else None


def choose_baseline(rows: pd.DataFrame) -> dict[str, Any] | None:
    """A configuration's baseline among its rows: the 1-device row that ran, else the smallest
    N that ran (when 1 device ran out of memory); None when none ran."""
    ran = rows[rows["status"].isin(RAN) & rows["median_step_ms"].notna()]
    if ran.empty:
        return None
    return ran.sort_values(["devices", "started_at"], ascending=[True, False], na_position="last").iloc[0].to_dict()


def _latest_per_devices(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per N: the latest that ran, else the latest of any status (an OOM shows)."""
    ordered = rows.assign(_ran=rows["status"].isin(RAN)).sort_values(
        ["devices", "_ran", "started_at"], ascending=[True, False, False], na_position="last"
    )
    return ordered.drop_duplicates("devices").drop(columns="_ran")


def configurations(runs: pd.DataFrame) -> list[tuple[dict[str, Any], pd.DataFrame]]:
    """Each multi-device configuration and its rows over N, its N = 1 point included: the
    1-device rows of the same computation and batch started under its plan, else plain ones
    (see the module doc). Configurations without a row on more than one device are left out:
    they do not scale anything."""
    frame = with_keys(runs[[column for column in runs.columns if column in READS]])
    # the computation and batch of each row as one number, the hosts left out: a configuration's
    # N = 1 rows are the single-device rows with its number (comparing every single-device row
    # column by column, per configuration, took half of the Scaling page's rerun on a year of nights)
    computation = frame.groupby([*COMPUTATION, "batch_key"], dropna=False, sort=False).ngroup()
    multi = frame[frame["devices"] > 1]
    singles = frame[frame["devices"] == 1]
    plans = singles["stored_parallel"]
    found = []
    group_keys = list(CONFIG_KEYS)
    for key, rows in multi.groupby(group_keys, dropna=False, sort=True):
        config = dict(zip(group_keys, key, strict=True))
        config = {name: (None if is_missing(value) else value) for name, value in config.items()}
        same = computation.loc[singles.index] == computation.loc[rows.index[0]]  # a group shares its computation
        own = same & (plans == config["parallel"])
        ones = singles[own] if own.any() else singles[same & (plans == "none")]
        found.append((config, pd.concat([ones, rows]).sort_values("devices", kind="stable")))
    return found


def scaling_table(rows: pd.DataFrame, scaling: str | None) -> pd.DataFrame:
    """One configuration's rows over N (:data:`TABLE_COLUMNS`): the latest run per N, its
    figures per device, and its efficiency against the baseline (named in each row)."""
    rows = normalised(rows)
    baseline = choose_baseline(rows)
    records = []
    for row in _latest_per_devices(rows).to_dict("records"):
        ran = row["status"] in RAN and not is_missing(row.get("median_step_ms"))
        records.append(
            {
                "devices": int(row["devices"]),
                "devices_per_host": int(row["devices"]) // int(row["hosts"]),
                "run_id": row.get("run_id"),
                "status": row["status"],
                "step_ms": row.get("median_step_ms") if ran else None,
                **{column: per_device(row, column) if ran else None for column in PER_DEVICE},
                "mfu": row_mfu(row) if ran else None,
                "efficiency": efficiency(row, baseline, scaling) if ran and baseline else None,
                "baseline_devices": int(baseline["devices"]) if baseline else None,
                "baseline_run_id": baseline.get("run_id") if baseline else None,
                "baseline_parallel": _stored_plan(baseline) if baseline else None,
                "baseline_hosts": int(baseline["hosts"]) if baseline else None,
                **{
                    column: None if is_missing(row.get(column)) else row.get(column)
                    for column in (
                        "collective_share",
                        "exposed_collective_share",
                        "peak_mem_bytes",
                        "peak_mem_bytes_min",
                        "rank_skew_pct",
                    )
                },
                "simulated": None if is_missing(row.get("simulated")) else bool(row["simulated"]),
            }
        )
    return pd.DataFrame(records, columns=list(TABLE_COLUMNS))


def _stored_plan(row: Mapping[str, Any]) -> str:
    """The plan a row was started under (:func:`with_keys` keeps it beside the key's ``*``)."""
    plan = row.get("stored_parallel", row.get("parallel"))
    return "none" if is_missing(plan) else str(plan)


def config_label(config: Mapping[str, Any], backend: bool = True) -> str:
    """A configuration in one line: ``gpt2/124m cuda train bfloat16 fsdp weak b8xs1024 per device``,
    ``gpt2/tiny cpu train float32 dp on 2 hosts b4xs32`` (without the backend for a view across
    backends)."""
    plan = config["parallel"] if config["tp_key"] is None else f"{config['parallel']} tp{config['tp_key']}"
    plan = " ".join(part for part in (plan, hosts_label(config.get("hosts"))) if part)
    words = [f"{config['workload']}/{config['size']}", *([config["backend"]] if backend else [])]
    words += [config["mode"], config["dtype"], plan]
    if config["scaling"]:
        words.append(config["scaling"])
    if config["batch_key"] is not None:
        words.append(shape_label(config["batch_key"], config, config.get("gen_len")))
        if config["scaling"] == "weak":
            words.append("per device")
    return " ".join(str(word) for word in words)


def scaling_report(runs: pd.DataFrame) -> pd.DataFrame:
    """Every multi-device configuration's table, stacked: :data:`CONFIG_KEYS`, a
    ``configuration`` label, then :data:`TABLE_COLUMNS`."""
    pieces = []
    for config, rows in configurations(runs):
        table = scaling_table(rows, config["scaling"])
        for column in reversed(CONFIG_KEYS):
            table.insert(0, column, config[column])
        table.insert(0, "configuration", config_label(config))
        pieces.append(table)
    if not pieces:
        return pd.DataFrame(columns=["configuration", *CONFIG_KEYS, *TABLE_COLUMNS])
    return pd.concat(pieces, ignore_index=True)


def cross_backend(report: pd.DataFrame, runs: pd.DataFrame, prices: Mapping[str, Price]) -> pd.DataFrame:
    """The same configurations at equal N across backends: per (configuration without the
    backend, N), each backend's step ms, tokens/s per device, MFU, efficiency, its device's
    price per hour and the cost of a million tokens (``usd_per_million_tokens`` = price per
    device-hour / (tokens/s per device x 3600) x 10^6; null without a price or tokens), and
    beside it the measured energy of a token (``joules_per_token``, a counter's delta: NVML or
    RAPL, :mod:`tpubench.energy`) where every backend of the group measured one, so that an
    energy figure is never set against a side that has none (a TPU has no public counter)."""
    columns = [
        "configuration",
        "devices",
        "backend",
        "device",
        "run_id",
        "step_ms",
        "tokens_per_s_per_device",
        "mfu",
        "efficiency",
        "exposed_collective_share",
        "usd_per_device_hour",
        "usd_per_million_tokens",
        "joules_per_token",
        "energy_source",
        "simulated",
    ]
    ran = report[report["step_ms"].notna()]
    if ran.empty:
        return pd.DataFrame(columns=columns)
    known = normalised(runs[runs["run_id"].isin(ran["run_id"])]).set_index("run_id")  # the rows it looks up
    devices_of = known["device"].to_dict()
    energy_of = known[["joules_per_token", "energy_source"]].astype(object).to_dict("index")
    records = []
    for row in ran.to_dict("records"):
        device = devices_of.get(row["run_id"])
        price = device_price(device, device_kind(row["backend"], device), prices) if device else None
        tokens = row["tokens_per_s_per_device"]
        cost = price / (tokens * 3600) * 1e6 if price and not is_missing(tokens) and tokens else None
        records.append(
            {
                **{column: row.get(column) for column in columns},
                "configuration": config_label(row, backend=False),
                "device": device,
                "usd_per_device_hour": price,
                "usd_per_million_tokens": cost,
                **energy_of.get(row["run_id"], {}),
            }
        )
    frame = pd.DataFrame(records, columns=columns)
    measured = frame["joules_per_token"].notna() & frame["energy_source"].isin(["nvml_counter", "rapl"])
    frame["joules_per_token"] = frame["joules_per_token"].where(measured)
    both = measured.groupby([frame["configuration"], frame["devices"]]).transform("all")
    frame["joules_per_token"] = frame["joules_per_token"].where(both)
    shared = frame.groupby(["configuration", "devices"])["backend"].transform("nunique")
    return frame[shared > 1].sort_values(["configuration", "devices", "backend"]).reset_index(drop=True)
