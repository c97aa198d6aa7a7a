"""Run shapes as text: the batch and each named dimension a row has, for every table and chart.

One function for a whole frame, so the CLI, the reports and the dashboard label a shape
alike: ``4x128+16`` (batch x tokens + generated), ``8xi224`` (pixels per side), ``2xl32``
(latent pixels per side); with ``prefix="b"`` the form run labels use, ``b4xs128+g16``.
A dimension a row's workload does not take is null, and left out. A run's layout
follows (``8x128 fsdp2xtp2``, ``4x32 dp2 on 2 hosts``), so no table or chart merges two layouts
of one shape.
"""

from __future__ import annotations

import pandas as pd

from tpubench.schema import RUNS
from tpubench.spec import DIMENSIONS, parallel_label

#: the runs columns that hold whole numbers (a shape, a count), null where a row has none
INTEGER_COLUMNS = frozenset(field.name for field in RUNS if field.type == "int64")


def whole(frame: pd.DataFrame, column: str) -> list[int | None]:
    """A column of whole numbers as Python ints, None where missing (a fraction is an error)."""
    return [None if value is pd.NA else int(value) for value in pd.to_numeric(frame[column]).astype("Int64").tolist()]


def shape_labels(frame: pd.DataFrame, prefix: str = "") -> pd.Series:
    """Each row's shape, as :func:`tpubench.spec.shape_label` writes it; missing where the batch is.

    The columns are converted once and the text joined per row: pandas' string operations cost
    about a millisecond each whatever the length, and a label took some forty of them, which
    made every table and chart of the dashboard pay tens of milliseconds per label column."""
    dimensions = [
        ("" if name == "seq_len" and not prefix else letter, whole(frame, name))
        for name, letter in DIMENSIONS.items()
        if name in frame  # a frame from before the dimension existed
    ]
    generated = pd.to_numeric(frame["gen_len"]).fillna(0).astype("Int64").tolist()
    labels: list[object] = []
    for row, (batch, layout) in enumerate(zip(whole(frame, "batch_size"), layout_labels(frame), strict=True)):
        if batch is None:
            labels.append(pd.NA)
            continue
        text = f"{prefix}{batch}" + "".join(
            f"x{tag}{values[row]}" for tag, values in dimensions if values[row] is not None
        )
        if generated[row]:
            text += f"+{'g' if prefix else ''}{generated[row]}"
        labels.append(f"{text} {layout}" if layout else text)
    return pd.Series(labels, index=frame.index, dtype="string")


def layout_labels(frame: pd.DataFrame) -> pd.Series:
    """Each row's layout as :func:`tpubench.spec.parallel_label` writes it (``dp4``,
    ``fsdp2xtp2``, ``fsdp1``, ``dp2 on 2 hosts``); "" for one device with no plan on one host
    and for frames from before ``--devices``."""
    if not {"parallel", "devices"} <= set(frame.columns):
        return pd.Series("", index=frame.index, dtype="string")
    tp = frame["tp_size"] if "tp_size" in frame.columns else pd.Series(1, index=frame.index)
    hosts = frame["hosts"] if "hosts" in frame.columns else pd.Series(1, index=frame.index)
    layouts = [
        parallel_label(parallel, devices, tp_size, count) if isinstance(parallel, str) else ""
        for parallel, devices, tp_size, count in zip(frame["parallel"], frame["devices"], tp, hosts, strict=True)
    ]
    return pd.Series(layouts, index=frame.index, dtype="string")


def whole_numbers(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with its :data:`INTEGER_COLUMNS` as nullable integers, for display. Parquet's
    int64 with nulls loads as float64, so a text row's ``seq_len`` showed as 128.0 beside an
    image row's empty one; a column with a fraction in it (not a count after all) is kept."""
    cast = {}
    for column in INTEGER_COLUMNS & set(frame.columns):
        values = frame[column]
        if pd.api.types.is_float_dtype(values) and (values.dropna() % 1 == 0).all():
            cast[column] = values.astype("Int64")
    return frame.assign(**cast) if cast else frame
