"""Reading the arguments Kineto records on an op: present values, JSON lists, shapes. One place
for what every detector needs (collectives, their sizes, allocations' shapes)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pandas as pd


def present(value: Any) -> bool:
    """Not None, NA or NaN (what a missing table cell reads as)."""
    return value is not None and value is not pd.NA and not (isinstance(value, float) and np.isnan(value))


def load_list(value: Any) -> list:
    """A JSON list column (Input Dims, Input type, Concrete Inputs) as a list; [] when absent."""
    if not present(value):
        return []
    try:
        parsed = json.loads(value)
    except (TypeError, ValueError):
        return []
    return parsed if isinstance(parsed, list) else []


def is_shape(x: Any) -> bool:
    """A non-empty list of ints (Kineto writes [] for arguments it records nothing of)."""
    return isinstance(x, list) and bool(x) and all(isinstance(d, int) and not isinstance(d, bool) for d in x)


def get(event: Any, key: str) -> Any:
    """A field of an event row, whether a dict, a pandas row or a named tuple."""
    if event is None:
        return None
    if isinstance(event, dict):
        return event.get(key)
    getter = getattr(event, "get", None)
    return getter(key) if getter is not None else getattr(event, key, None)
