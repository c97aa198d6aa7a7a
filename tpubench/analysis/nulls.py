"""One test of a missing value, for every reader of a store's cells.

A value taken out of a frame one at a time (``tolist()``, ``to_dict("records")``, a row) is
null in three ways: None, a float NaN (a float column's, or an object column's), or pandas'
NA (a nullable integer or string column's). Each reader had its own spelling of that test,
and the spellings that forgot NA printed ``<NA>`` where a dash belonged.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd


def is_missing(value: Any) -> bool:
    """Whether ``value`` is null: None, NaN or pandas' NA (never raises, unlike ``pd.isna``
    on a list, and never an array)."""
    return value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value))
