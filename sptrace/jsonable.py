"""Table rows as JSON: ``records(frame)``, one dict per row, every missing value None;
``write_records(frame, stream)``, the same as one JSON array written a chunk of rows at a time.

Every JSON report writes its tables through here, so that an unknown value is ``null`` in all of
them: pandas marks it NaN in a float column, which ``json.dumps`` would write as ``NaN`` (no JSON
reader takes it), and pd.NA in a nullable one, which it cannot write at all."""

from __future__ import annotations

import json
import math
from typing import TextIO, TypeVar

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


def write_records(frame: pd.DataFrame, stream: TextIO, chunk_rows: int = 4096) -> None:
    """``json.dumps(records(frame), indent=1, default=str)`` and a newline, written to ``stream``
    a chunk of rows at a time: the same text, without a whole run's rows held as dicts and as one
    string (a 10,000-rank run's collectives are 80,000 rows, hundreds of MB that way)."""
    if frame.empty:
        stream.write("[]\n")
        return
    stream.write("[\n")
    for at in range(0, len(frame), chunk_rows):
        rows = [json.dumps(row, indent=1, default=str) for row in records(frame.iloc[at : at + chunk_rows])]
        stream.write((",\n " if at else " ") + ",\n".join(rows).replace("\n", "\n "))
    stream.write("\n]\n")
