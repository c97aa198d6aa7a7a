"""One definition of what a configuration is, and of how one reads, for every reader of a store.

A configuration is what a run computes and where: :data:`tpubench.spec.KEY_FIELDS` (the
identity ``--resume`` matches on: workload, size, backend, mode, dtype, shape, a user's
model's ``model_hash``, and the layout: devices, plan, tensor-parallel degree, scaling, hosts) and
the device it ran on. Summaries, reports, ``regressions`` and Trends, the Overview, Compare
and the HUD export all group and label runs with this module, so that no reader pools runs
that another keeps apart: with their own key lists, 1- and 2-device runs of one model read
as one figure, and two ``hf:bert`` tasks (one reference, two ``model_hash`` values) drew as
one Trends line.

Two decisions are made here for all of them:

- **The plan is part of a configuration at every device count, the hosts too.** A 1-device
  run started under a plan (``--devices 1,2 --parallel fsdp``'s N = 1) applies no plan
  (:func:`tpubench.parallel.apply` leaves the model as it is), yet it is the run the user
  asked for under that plan, and runs of two plans must never pool: ``report`` once gave a
  dp 1-device run (249 ms) and an fsdp one (125 ms) as one row of median 187 ms.
  Its label names the plan (``4x32 fsdp1``); :func:`configurations` keeps it, and reads a
  1-device row's tensor-parallel degree as 1 and its scaling as none (weak and strong are one
  computation on one device). Runs over several hosts are configurations of their own
  (``hosts``; ``devices`` is the total over them), labelled ``dp2 on 2 hosts``.
- **Where two plans meet, they are named.** Compare pairs a 1-device run under a plan with a
  plain 1-device run where the other side has no 1-device run of that plan (a sweep's N = 1
  against a night of plain runs: :mod:`tpubench.analysis.compare`), and Scaling takes a plan's
  own 1-device run as its N = 1 point, else a plain one, never another plan's
  (:mod:`tpubench.analysis.scaling`); both say which run they took.
"""

from __future__ import annotations

from collections.abc import Iterable

import pandas as pd

from tpubench.analysis.shapes import shape_labels
from tpubench.precision import choices as precisions
from tpubench.spec import ATTENTION_DEFAULT, DIMENSIONS, KEY_FIELDS, model_label

#: the columns that make a configuration: a run's identity and the device it ran on
_AFTER_BACKEND = KEY_FIELDS.index("backend") + 1
CONFIG_KEYS: tuple[str, ...] = (*KEY_FIELDS[:_AFTER_BACKEND], "device", *KEY_FIELDS[_AFTER_BACKEND:])
#: the layout columns, and what a row from before ``--devices`` (or a 1-device row) reads as
ONE_DEVICE = {"devices": 1, "parallel": "none", "tp_size": 1, "scaling": None}
#: a row from before multi-host runs ran on one host (as the store reads it: ``store.upgrade``)
ONE_HOST = {"hosts": 1}
#: a row from before ``--attention`` ran the backend's own kernel choice
ANY_ATTENTION = {"attention": ATTENTION_DEFAULT}
#: what a shape label reads of a row (:func:`tpubench.analysis.shapes.shape_labels`)
SHAPE_COLUMNS = frozenset({"batch_size", *DIMENSIONS, "gen_len", *ONE_DEVICE, *ONE_HOST})


def configurations(runs: pd.DataFrame, keep: Iterable[str] | None = None) -> pd.DataFrame:
    """``runs`` with every :data:`CONFIG_KEYS` column, read as one configuration is: a column a
    frame lacks (a store from before it) is null, or for the layout one device with no plan on
    one host; a 1-device row keeps its plan, with tensor-parallel degree 1 and no scaling (see
    the module doc). A copy; other columns as they were, or with ``keep`` only those of them:
    a reader that groups by configuration need not copy the 150 columns of a runs frame."""
    if keep is not None:
        kept = {*CONFIG_KEYS, *keep}
        runs = runs[[column for column in runs.columns if column in kept]]
    frame = runs.copy()
    for column in CONFIG_KEYS:
        if column not in frame:
            frame[column] = {**ONE_DEVICE, **ONE_HOST, **ANY_ATTENTION}.get(column)
    frame = with_run_settings(frame)
    frame["hosts"] = pd.to_numeric(frame["hosts"]).fillna(1).astype("int64")
    devices = pd.to_numeric(frame["devices"]).fillna(1).astype("int64")
    one = devices == 1
    frame["devices"] = devices
    frame["parallel"] = frame["parallel"].astype(object).where(frame["parallel"].notna(), "none")
    frame["tp_size"] = pd.to_numeric(frame["tp_size"]).fillna(1).astype("int64").where(~one, 1)
    frame["scaling"] = frame["scaling"].astype(object).where(frame["scaling"].notna() & ~one, None)
    return frame


def with_run_settings(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with ``precision`` and ``attention`` read as a configuration reads them: a row
    from before ``--precision`` in its dtype's plain one (null without a dtype), a row from
    before ``--attention`` as ``auto``. For readers that key runs on :data:`CONFIG_KEYS`
    without :func:`configurations`' layout rules (Scaling)."""
    frame = precisions.filled(frame)
    if "precision" not in frame:
        frame = frame.assign(precision=None)
    attention = frame["attention"] if "attention" in frame else pd.Series(None, index=frame.index, dtype=object)
    return frame.assign(attention=attention.astype(object).where(attention.notna(), ATTENTION_DEFAULT))


def pairable(runs: pd.DataFrame) -> pd.DataFrame:
    """:func:`configurations`, with a 1-device row under a plan read as a plain one: what a run
    may pair with when the other side did not run its plan at 1 device (the plan applies to
    nothing there; :func:`tpubench.analysis.compare.pairs`). For a reader that asks whether
    two selections would pair at all (the dashboard's choice of the night to compare with)."""
    frame = configurations(runs)
    frame["parallel"] = frame["parallel"].where(frame["devices"] != 1, "none")
    return frame


def spec_key(values: dict) -> tuple:
    """A planned run's configuration (a :class:`tpubench.spec.RunSpec`'s fields, ``device``
    absent) as :func:`configurations` reads the stored row, in :data:`CONFIG_KEYS` order less
    ``device``; null for a dimension the run does not take."""
    row = configurations(pd.DataFrame([values])).iloc[0]
    return tuple(None if pd.isna(row[key]) else row[key] for key in CONFIG_KEYS if key != "device")


#: what a label reads of a row, beside :data:`SHAPE_COLUMNS` and the side's backend and device
LABEL_COLUMNS = ("workload", "size", "mode", "dtype", "precision", "model_hash", "attention")
#: labels made in this process, by what they read of a row: a store holds few configurations
#: and its readers label the same ones over and over (the dashboard, on every rerun of a page)
_LABELLED: dict[tuple, object] = {}
_LABELLED_MAX = 100_000


def config_labels(frame: pd.DataFrame, *, dtype: bool = True, backend: bool = False) -> pd.Series:
    """Each row's configuration in words, as every table, chart and picker shows it:
    ``gpt2/tiny train bfloat16 4x128 fsdp2`` (``fsdp1`` for a 1-device run under a plan,
    ``dp2 on 2 hosts`` over hosts: :func:`tpubench.spec.parallel_label`), then ``cuda (NVIDIA H100)`` with ``backend``
    (``frame`` may name the sides ``test_backend``/``test_device``), then a user's model's hash,
    ``model 68ee1cc9``, so that two models under one reference never read as one. A user's
    model is named as :func:`tpubench.spec.model_label` names it, by its workload, which says
    its task and non-default config: ``bench_mine:make_model(hidden=128) train float32 16``."""
    # each distinct configuration is labelled once (:data:`_LABELLED`): a label took 12 ms of
    # pandas per call whatever the rows, and a page calls this three or four times per rerun
    prefix = "" if "backend" in frame else "test_"
    sides = (f"{prefix}backend", f"{prefix}device") if backend else ()
    read = [column for column in (*LABEL_COLUMNS, *sides) if column in frame]
    read += [column for column in frame.columns if column in SHAPE_COLUMNS]
    if frame.empty or not read:
        return _made_labels(frame, dtype=dtype, backend=backend)
    values = [_keyable(frame[column]) for column in read]
    keys = [(dtype, backend, tuple(read), row) for row in zip(*values, strict=True)]
    missing = {key: position for position, key in enumerate(keys) if key not in _LABELLED}
    if missing:
        if len(_LABELLED) + len(missing) > _LABELLED_MAX:
            _LABELLED.clear()
        made = _made_labels(frame.iloc[list(missing.values())], dtype=dtype, backend=backend)
        _LABELLED.update(zip(missing, made.tolist(), strict=True))
    return pd.Series([_LABELLED[key] for key in keys], index=frame.index, dtype=object)


def _made_labels(frame: pd.DataFrame, *, dtype: bool, backend: bool) -> pd.Series:
    """:func:`config_labels`, made."""
    # joined per row from columns read once, as shape_labels does (pandas' string operations
    # cost about a millisecond each, and a label took a dozen of them beside the shape's)
    columns = [_texts(frame[column]) for column in ("workload", "size", "mode", *(("dtype",) if dtype else ()))]
    if "precision" in frame:  # named where it is not the dtype's plain one: fp8, int8-wo
        columns.append([precisions.label(p, d) for p, d in zip(frame["precision"], frame["dtype"], strict=True)])
    shaped = [column for column in frame.columns if column in SHAPE_COLUMNS]  # not a copy of 150 columns
    columns.append(shape_labels(configurations(frame[shaped])).tolist())
    if backend:
        prefix = "" if "backend" in frame else "test_"
        devices = [device if device is not None else "no device" for device in _texts(frame[f"{prefix}device"])]
        backends = [
            None if name is None else f"{name} ({device})"
            for name, device in zip(_texts(frame[f"{prefix}backend"]), devices, strict=True)
        ]
        columns.append(backends)
    models = _texts(frame["model_hash"]) if "model_hash" in frame else [None] * len(frame)
    kernels = _texts(frame["attention"]) if "attention" in frame else [None] * len(frame)
    labels: list[object] = []
    named: dict[tuple[str, str, str | None], str] = {}
    for parts, model, kernel in zip(zip(*columns, strict=True), models, kernels, strict=True):
        # as pandas' text: missing in, missing out; but a null dtype is a comparison paired
        # across dtypes (``compare --by precision``): its label leaves the dtype out
        if dtype and parts[3] is None:
            parts = (*parts[:3], *parts[4:])
        if any(part is None or part is pd.NA for part in parts):
            labels.append(pd.NA)
            continue
        (workload, size, mode, *rest) = parts
        if (workload, size, model) not in named:  # a store has few models and many runs
            named[workload, size, model] = model_label(workload, size, model)
        label = " ".join([f"{named[workload, size, model]} {mode}", *(part for part in rest if part)])
        if kernel not in (None, ATTENTION_DEFAULT):  # a forced kernel is a configuration of its own
            label = f"{label} {kernel} attention"
        labels.append(label if model is None else f"{label} model {model[:8]}")
    return pd.Series(labels, index=frame.index, dtype=object)


def _keyable(values: pd.Series) -> list:
    """A column's values, None where missing: NaN, unlike None, equals nothing, not even itself."""
    listed = values.tolist()
    if not values.hasnans:
        return listed
    return [None if value is None or value is pd.NA or value != value else value for value in listed]


def _texts(values: pd.Series) -> list[str | None]:
    """A column's values as text (``astype("string")``'s), None where missing."""
    return [None if pd.isna(value) else str(value) for value in values.tolist()]


#: what makes a serving point (the ``serving`` table) the same configuration in two stores:
#: the engine and what it served on which chip, and the load it was put under. The engine's
#: version and arguments are not part of it: a new engine release against the last is the
#: comparison users want (``tpubench compare``), as a new torch is for runs.
SERVING_KEYS: tuple[str, ...] = (
    "engine",
    "model",
    "device",
    "dtype",
    "quantization",
    "tp_size",
    "dataset",
    "input_len",
    "output_len",
    "request_rate",
    "burstiness",
    "max_concurrency",
    "ignore_eos",
)


def serving_lines(points: pd.DataFrame) -> pd.Series:
    """Each serving point's line on a latency-throughput chart, the engine and the chip it ran
    on: ``vllm 0.11.0 on NVIDIA H100`` (``tp4`` added past one chip, the quantization where one
    was set). Every rate and concurrency of one engine on one chip is one line."""
    labels = []
    for row in points.itertuples(index=False):
        engine = row.engine if pd.isna(row.engine_version) else f"{row.engine} {row.engine_version}"
        parts = [engine, "on", "unknown chip" if pd.isna(row.device) else str(row.device)]
        if not pd.isna(row.tp_size) and int(row.tp_size) > 1:
            parts.append(f"tp{int(row.tp_size)}")
        if not pd.isna(row.quantization) and row.quantization:
            parts.append(str(row.quantization))
        labels.append(" ".join(parts))
    return pd.Series(labels, index=points.index, dtype=object)


def serving_load_labels(points: pd.DataFrame) -> pd.Series:
    """Each serving point's load in words: ``rate 4/s, concurrency 8`` (``rate inf``: every
    request sent at once; no concurrency: unbounded), as tables and hover texts show it."""
    labels = []
    for rate, concurrency in zip(points["request_rate"], points["max_concurrency"], strict=True):
        text = "rate inf" if pd.isna(rate) or rate == float("inf") else f"rate {rate:g}/s"
        labels.append(text if pd.isna(concurrency) else f"{text}, concurrency {int(concurrency)}")
    return pd.Series(labels, index=points.index, dtype=object)
