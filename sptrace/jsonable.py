"""Table rows as JSON: ``records(frame)``, one dict per row, every missing value None.

Every JSON report writes its tables through here, so that an unknown value is ``null`` in all of
them: pandas marks it NaN in a float column, which ``json.dumps`` would write as ``NaN`` (no JSON
reader takes it), and pd.NA in a nullable one, which it cannot write at all."""

from __future__ import annotations

import math
from typing import TypeVar

import pandas as pd

from sptrace.vocab.jsontypes import JSONObject

T = TypeVar("T")


def scalar(value: T) -> T | None:
    """``value``, or None where it is missing (None, pd.NA or NaN)."""
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return None
    return value


def records(frame: pd.DataFrame) -> list[JSONObject]:
    """The rows of ``frame`` as dicts of Python values (``to_dict`` unboxes numpy's scalars; tuples
    and lists stay as they are), each missing value None."""
    return [{k: scalar(v) for k, v in rec.items()} for rec in frame.to_dict(orient="records")]
