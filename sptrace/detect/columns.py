"""Tests over one column of an event table, made once per distinct value (``Distinct``), columns
taken without pandas' label indexing (``take_columns``), sums by key (``sums_by``) and empty
frames (``empty_frame``): what every
per-rank detection selects and totals its rows with."""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable
from functools import cached_property

import numpy as np
import pandas as pd


def take_columns(frame: pd.DataFrame, rows: np.ndarray, columns: list[str]) -> pd.DataFrame:
    """``frame.loc[rows, columns]`` (``rows`` a boolean mask or positions), index kept: each
    column's array taken directly, without the label indexing (a few hundred microseconds a call,
    and a rank makes a dozen)."""
    at = np.flatnonzero(rows) if rows.dtype == bool else rows
    return pd.DataFrame({c: frame[c].array.take(at) for c in columns}, index=frame.index[at])


def notna_rows(column: pd.Series) -> np.ndarray:
    """``column.notna().to_numpy()`` without the Series pandas makes on the way (a twentieth of
    its time: a rank's map asks it of a dozen columns)."""
    return ~np.asarray(column.array.isna(), dtype=bool)


def empty_frame(columns: list[str]) -> pd.DataFrame:
    """``pd.DataFrame(columns=columns)`` (object columns, no rows) in a fifth of its time: a rank
    with nothing of a kind makes several."""
    return pd.DataFrame({c: np.empty(0, dtype=object) for c in columns})


def values_of(column: pd.Series) -> list[object]:
    """A column's values as a list, missing ones None (a categorical's ``tolist`` gives NaN)."""
    array = column.array
    if isinstance(array, pd.Categorical):
        lut = [*array.categories.tolist(), None]  # (code -1, missing: the last entry)
        return [lut[c] for c in array.codes.tolist()]
    return [None if v is None or v != v else v for v in column.tolist()]


def sums_by(keys: dict[str, list[object]], values: list[float], name: str) -> pd.DataFrame:
    """The sum of ``values`` per distinct tuple of ``keys`` (a row with a None key left out), one
    row each in order of first appearance: ``frame.groupby(list(keys), sort=False, as_index=False)
    [name].sum()`` for a few hundred rows. Hand-written: pandas' grouping costs about a millisecond
    of set-up a call, and each rank's map makes several; a dict does it in a tenth of that. The
    sums are compensated as pandas' are (Kahan's), in the rows' order: the same to the last bit."""
    totals: dict[tuple[object, ...], list[float]] = {}
    for key, v in zip(zip(*keys.values()), values):
        if None in key:
            continue
        acc = totals.get(key)
        if acc is None:
            totals[key] = acc = [0.0, 0.0]
        y = v - acc[1]  # Kahan's step, as pandas' group_sum takes it
        t = acc[0] + y
        acc[1] = (t - acc[0]) - y
        acc[0] = t
    columns: dict[str, object] = {k: [key[i] for key in totals] for i, k in enumerate(keys)}
    columns[name] = np.array([s for s, _ in totals.values()], dtype=float)
    return pd.DataFrame(columns)  # (keys, then name, in order: a columns= would cost pandas a reindex)


def is_one_of(column: pd.Series, values: Iterable[str]) -> np.ndarray:
    """Rows whose value is one of ``values``."""
    return Distinct(column).one_of(values)


def has_prefix(column: pd.Series, prefix: str | tuple[str, ...]) -> np.ndarray:
    """Rows whose value starts with ``prefix`` (or one of a tuple of them)."""
    return Distinct(column).prefix(prefix)


class Distinct:
    """A column's distinct values, read once for the tests made on it. Each test runs once per
    distinct value, in Python: an event table has a few hundred distinct names among 200k events,
    so this is far cheaper than turning every row into a Python string, and cheaper too than a
    pandas string method over the distinct values (its set-up alone costs more than a few hundred
    calls)."""

    def __init__(self, column: pd.Series) -> None:
        array = column.array
        if isinstance(array, pd.Categorical):  # the table's own dictionary: no factorize
            self.codes, uniques = array.codes, array.categories
        else:
            self.codes, found = pd.factorize(column, use_na_sentinel=True)
            uniques = pd.Index(found)
        self.values = uniques.tolist() if uniques.dtype == object else [str(u) for u in uniques]

    def passes(self, test: Callable[[str], bool], within: np.ndarray | None = None) -> np.ndarray:
        """``test`` of each row's value (a str; missing values are False), as a numpy bool array;
        ``within``: only these rows (a mask) can pass, and only their values are tested."""
        codes, values = self.codes, self.values
        if within is None:
            ok = np.fromiter((isinstance(v, str) and test(v) for v in values), dtype=bool, count=len(values))
        else:
            ok = np.zeros(len(values), dtype=bool)
            seen = np.unique(codes[within])
            for c in seen[seen >= 0].tolist():
                v = values[c]
                ok[c] = isinstance(v, str) and test(v)
        hit = np.append(ok, False)[codes]  # (code -1, missing: the appended False)
        return hit if within is None else hit & within

    def one_of(self, values: Iterable[str]) -> np.ndarray:
        """Rows whose value is one of ``values`` (looked up, not tested one by one)."""
        return self._rows_of([self._position[v] for v in set(values) if v in self._position])

    def prefix(self, prefix: str | tuple[str, ...]) -> np.ndarray:
        """Rows whose value starts with ``prefix`` (or one of a tuple of them): the values that
        do are one run of the sorted values, found by bisection."""
        keys, order = self._sorted
        found: list[int] = []
        for p in (prefix,) if isinstance(prefix, str) else prefix:
            lo = bisect.bisect_left(keys, p)
            hi = bisect.bisect_left(keys, p + "\U0010ffff", lo)
            found.extend(order[lo:hi])
        return self._rows_of(found)

    def _rows_of(self, codes: list[int]) -> np.ndarray:
        if not codes:
            return np.zeros(len(self.codes), dtype=bool)
        ok = np.zeros(len(self.values) + 1, dtype=bool)  # (code -1, missing: the last entry, False)
        ok[codes] = True
        return ok[self.codes]

    @cached_property
    def _position(self) -> dict[str, int]:
        return {v: i for i, v in enumerate(self.values) if isinstance(v, str)}

    @cached_property
    def _sorted(self) -> tuple[list[str], list[int]]:
        order = sorted((i for i, v in enumerate(self.values) if isinstance(v, str)), key=self.values.__getitem__)
        return [self.values[i] for i in order], order
