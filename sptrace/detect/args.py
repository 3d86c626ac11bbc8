"""Reading the arguments Kineto records on an op: present values, JSON lists, shapes. One place
for what every detector needs (collectives, their sizes, allocations' shapes)."""

from __future__ import annotations

import json
from typing import TypeGuard

import numpy as np
import pandas as pd

from sptrace.detect.intervals import EventRow


def present(value: object) -> bool:
    """Not None, NA or NaN (what a missing table cell reads as)."""
    return value is not None and value is not pd.NA and not (isinstance(value, float) and np.isnan(value))


def load_list(value: object) -> list:
    """A JSON list column (Input Dims, Input type, Concrete Inputs) as a list; [] when absent."""
    if not present(value):
        return []
    try:
        parsed = json.loads(value)
    except (TypeError, ValueError):
        return []
    return parsed if isinstance(parsed, list) else []


def is_shape(x: object) -> TypeGuard[list[int]]:
    """A non-empty list of ints (Kineto writes [] for arguments it records nothing of)."""
    return isinstance(x, list) and bool(x) and all(isinstance(d, int) and not isinstance(d, bool) for d in x)


def get(event: EventRow | None, key: str) -> object:
    """A field of an event row (None where the row or the column is missing)."""
    return None if event is None else event.get(key)
