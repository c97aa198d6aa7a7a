"""Precision and context read side: each chip at its best precision, quality beside speed,
and throughput against sequence length per chip and attention kernel.

Stateless functions over the runs table, shared by ``tpubench compare --by precision`` and the
dashboard's "Precision & context" page. A converted run (fp8, int8, int4) carries its
divergence from bf16 of the same seed and inputs (``quality_ok``, ``loss_rel_diff``,
``logits_rel_error``, ``top1_agreement``: docs/precision.md); a faster run whose
``quality_ok`` is false no longer computes the same model, and every reader here says so
beside its speed instead of ranking it silently.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from tpubench.analysis.identity import configurations
from tpubench.analysis.prices import Price, device_kind, device_price
from tpubench.precision import choices as precisions

#: what a run computes, less how: the precision and the attention kernel vary within one
#: of these groups (the dtype too: fp32 and bf16 are precisions)
WORKLOAD_KEYS = ("workload", "size", "mode", "batch_size", "seq_len", "gen_len", "devices", "parallel")
#: a chip: the device and the backend that drove it
CHIP_KEYS = ("device", "backend")
BEST_COLUMNS = [
    *WORKLOAD_KEYS,
    *CHIP_KEYS,
    "precision",
    "runs",
    "tokens_per_s",
    "mfu",
    "mfu_peak",
    "usd_per_m_tokens",
    "quality_ok",
    "quality",
]
#: what :func:`best_precision` reads of a run besides its configuration (:data:`tpubench.analysis.identity.CONFIG_KEYS`)
BEST_READS = (
    "dtype",
    "tokens_per_s",
    "mfu",
    "mfu_peak",
    "quality_ok",
    "reference_precision",
    "loss_rel_diff",
    "logits_rel_error",
    "top1_agreement",
)
#: what :func:`tokens_by_length` reads of a run besides its configuration
LENGTH_READS = ("tokens_per_s", "attention_kernel")
#: the quality checks' figures, a median of each per group (:func:`quality_text`)
_QUALITY_FIGURES = ("loss_rel_diff", "logits_rel_error", "top1_agreement")
LENGTH_COLUMNS = [
    "device",
    "backend",
    "kernel",
    "workload",
    "size",
    "mode",
    "batch_size",
    "seq_len",
    "runs",
    "tokens_per_s",
]


def precision_of(runs: pd.DataFrame) -> pd.Series:
    """Each run's precision as the store reads it (:func:`tpubench.precision.choices.filled`:
    its own, else for a row from before ``--precision`` its dtype's plain one)."""
    return precisions.filled(runs)["precision"]


def quality_flag(runs: pd.DataFrame) -> bool | None:
    """Whether ``runs`` (one configuration's repeats) still compute the model they were
    converted from: False if any says not, True if every one checked says so, None where none
    was checked (a plain bf16 or fp32 run is the reference: nothing to check)."""
    if "quality_ok" not in runs:
        return None
    known = runs["quality_ok"].dropna()
    if known.empty:
        return None
    return bool(known.astype(bool).all())


def quality_text(runs: pd.DataFrame) -> str:
    """The divergence behind :func:`quality_flag`, in words: ``loss +7.1% from bf16``,
    ``logits error 12.0%, top-1 84%``; "" where nothing was measured."""
    return _quality_words(
        _first(runs, "reference_precision"),
        _median(runs, "loss_rel_diff"),
        _median(runs, "logits_rel_error"),
        _median(runs, "top1_agreement"),
    )


def _quality_words(reference: Any, loss: float | None, error: float | None, agreement: float | None) -> str:
    """:func:`quality_text` of one group's medians (None or NaN: not measured)."""
    reference = reference if isinstance(reference, str) and reference else "bf16"
    parts = []
    if loss is not None and loss == loss:
        parts.append(f"loss {100 * loss:+.1f}% from {reference}")
    if error is not None and error == error:
        parts.append(f"logits error {100 * error:.1f}% from {reference}")
    if agreement is not None and agreement == agreement:
        parts.append(f"top-1 {100 * agreement:.0f}%")
    return ", ".join(parts)


def quality_note(runs: pd.DataFrame) -> str:
    """A comparison's word on the candidate's quality: "" unless it no longer computes the
    same model (:func:`quality_flag` false)."""
    if quality_flag(runs) is not False:
        return ""
    detail = quality_text(runs)
    return f"quality: no longer computes the same model ({detail})" if detail else "quality: no longer the same model"


def best_precision(runs: pd.DataFrame, prices: Mapping[str, Price]) -> pd.DataFrame:
    """Per workload configuration and chip, each precision's median tokens/s, MFU (against
    that precision's own peak, ``mfu_peak``), cost per million tokens and quality flag, the
    fastest first: the first row of each (configuration, chip) is its best precision, unless
    it no longer computes the same model (then the fastest whose quality holds or was the
    reference is best, and the faster one stays listed, flagged). Only ok runs with tokens/s.
    Columns: :data:`BEST_COLUMNS`, plus ``best`` (the chip's best precision)."""
    ok = _ok_with(runs, "tokens_per_s", BEST_READS)
    if ok.empty:
        return pd.DataFrame(columns=[*BEST_COLUMNS, "best"])
    ok = ok.assign(precision=precision_of(ok))
    # one pass of aggregations over every group, not a Python loop of them per group: over the
    # dashboard's 100,000 runs the loop's group copies and per-column medians took 0.3 s
    keys = [*WORKLOAD_KEYS, *CHIP_KEYS, "precision"]
    measured = ok[keys].assign(
        **{column: _numbers(ok, column) for column in ("tokens_per_s", "mfu", *_QUALITY_FIGURES)},
        **{column: ok.get(column) for column in ("mfu_peak", "reference_precision")},
    )
    quality = ok["quality_ok"] if "quality_ok" in ok else pd.Series(None, index=ok.index, dtype=object)
    measured["checked"] = quality.notna()
    measured["off"] = quality.notna() & ~quality.astype(object).where(quality.notna(), True).astype(bool)
    table = (
        measured.groupby(keys, dropna=False, sort=True)
        .agg(
            runs=("tokens_per_s", "size"),
            tokens_per_s=("tokens_per_s", "median"),
            mfu=("mfu", "median"),
            mfu_peak=("mfu_peak", "first"),
            reference=("reference_precision", "first"),
            **{column: (column, "median") for column in _QUALITY_FIGURES},
            checked=("checked", "any"),
            off=("off", "any"),
        )
        .reset_index()
    )
    table["usd_per_m_tokens"] = [
        price / (tokens * 3600) * 1e6 if price and tokens else None
        for price, tokens in zip(
            (
                device_price(device, device_kind(backend, device), prices)
                for device, backend in zip(table["device"], table["backend"], strict=True)
            ),
            table["tokens_per_s"],
            strict=True,
        )
    ]
    # Python's True, False or None (:func:`quality_flag`), which readers test with ``is False``
    table["quality_ok"] = pd.Series(
        [None if not checked else not off for checked, off in zip(table["checked"], table["off"], strict=True)],
        index=table.index,
        dtype=object,
    )
    table["quality"] = [
        _quality_words(*figures)
        for figures in zip(table["reference"], *(table[column] for column in _QUALITY_FIGURES), strict=True)
    ]
    table["mfu_peak"] = table["mfu_peak"].astype(object).where(table["mfu_peak"].notna(), None)
    table = table[BEST_COLUMNS]
    table = table.sort_values("tokens_per_s", ascending=False, kind="stable")
    keys = [*WORKLOAD_KEYS, *CHIP_KEYS]
    trusted = table["quality_ok"].map(lambda flag: flag is not False)
    best = table[trusted].groupby(keys, dropna=False, sort=False).head(1).index
    table["best"] = table.index.isin(best)
    return table.sort_values([*keys, "tokens_per_s"], ascending=[True] * len(keys) + [False], kind="stable")


def tokens_by_length(runs: pd.DataFrame) -> pd.DataFrame:
    """Median tokens/s per chip, attention kernel (the one that ran where the row names it,
    else the one asked for: ``auto``), model, mode and batch, at each sequence length: a
    long-context sweep's curve per chip and kernel. Columns: :data:`LENGTH_COLUMNS`."""
    ok = _ok_with(runs, "tokens_per_s", LENGTH_READS)
    ok = ok[ok["seq_len"].notna()] if not ok.empty else ok
    if ok.empty:
        return pd.DataFrame(columns=LENGTH_COLUMNS)
    kernel = ok["attention_kernel"] if "attention_kernel" in ok else pd.Series(None, index=ok.index, dtype=object)
    ok = ok.assign(kernel=kernel.astype(object).where(kernel.notna(), ok["attention"]))
    keys = LENGTH_COLUMNS[:-2]
    grouped = ok.groupby(keys, dropna=False, sort=True)["tokens_per_s"]
    table = grouped.agg(runs="size", tokens_per_s="median").reset_index()
    table[["batch_size", "seq_len"]] = table[["batch_size", "seq_len"]].astype("int64")
    return table[LENGTH_COLUMNS]


def _numbers(runs: pd.DataFrame, column: str) -> pd.Series | float:
    """``column`` of ``runs`` as floats (missing: NaN), NaN where the frame lacks it."""
    return pd.to_numeric(runs[column]).astype("float64") if column in runs else float("nan")


def _ok_with(runs: pd.DataFrame, column: str, reads: tuple[str, ...]) -> pd.DataFrame:
    """The ok runs of ``runs`` with ``column``, as configurations, with only their
    configuration's columns and ``reads``: grouping copies every column of each group, and
    the dashboard's run index has 60 (twice the analysis itself over 100,000 runs)."""
    if runs.empty or column not in runs:
        return runs.iloc[0:0]
    kept = runs[(runs["status"] == "ok") & runs[column].notna()]
    return configurations(kept, keep=reads)


def _median(runs: pd.DataFrame, column: str) -> float | None:
    if column not in runs or runs[column].isna().all():
        return None
    return float(pd.to_numeric(runs[column]).median())


def _first(runs: pd.DataFrame, column: str) -> Any:
    if column not in runs:
        return None
    known = runs[column].dropna()
    return known.iloc[0] if not known.empty else None
