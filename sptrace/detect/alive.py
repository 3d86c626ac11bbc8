"""The allocations of a size alive at a time, the latest first, without a pass over the ledger per
question: what sptrace.detect.handed asks for each collective call (the buffer it filled or read is
the latest allocation of its bytes alive when it started).

Each size's allocations are kept in allocation order with their free times (never freed: +inf).
The latest ones allocated before t and still alive at t are found walking back from t, a block of
64 at a time, past every block (and every 64 blocks) whose latest free is before t: a long trace's
many dead buffers of one size cost a block test each, not a row test each.

Hand-written: a "rightmost index before i whose value is at least x" query over a static array,
which numpy answers only with a pass over the prefix.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator

import numpy as np

_BLOCK = 64
_SUPER = _BLOCK * _BLOCK


class _Size:
    """One size's allocations: ledger rows, allocation and free times in allocation order, and
    the latest free of each block and super-block."""

    __slots__ = ("alloc", "block_free", "free", "rows", "super_free")

    def __init__(self, rows: np.ndarray, alloc: np.ndarray, free: np.ndarray) -> None:
        self.rows, self.alloc, self.free = rows, alloc, free
        self.block_free = _block_max(free, _BLOCK)
        self.super_free = _block_max(free, _SUPER)

    def made(self, before: int) -> Iterator[int]:
        """Rows allocated before ``before``, the latest first."""
        i = int(np.searchsorted(self.alloc, before, side="left"))
        rows = self.rows
        for k in range(i - 1, -1, -1):
            yield int(rows[k])

    def alive(self, at: int) -> Iterator[int]:
        """Rows allocated before ``at`` and alive at it (freed at or after it, or never), the
        latest first."""
        i = int(np.searchsorted(self.alloc, at, side="left"))  # rows [0, i) were allocated before
        free, rows = self.free, self.rows
        while i > 0:
            lo = (i - 1) // _BLOCK * _BLOCK
            hits = np.flatnonzero(free[lo:i] >= at)
            for h in hits[::-1].tolist():
                yield int(rows[lo + h])
            i = lo
            while i > 0:  # skip the blocks (and super-blocks) freed before ``at``
                if i % _SUPER == 0 and self.super_free[i // _SUPER - 1] < at:
                    i -= _SUPER
                elif self.block_free[i // _BLOCK - 1] < at:
                    i -= _BLOCK
                else:
                    break


def _block_max(values: np.ndarray, size: int) -> np.ndarray:
    """The largest value of each whole block of ``size`` (a partial last block is left out)."""
    whole = len(values) // size * size
    return values[:whole].reshape(-1, size).max(axis=1) if whole else np.empty(0)


class AliveBySize:
    """A ledger's allocations by bytes (sptrace.detect.ledger's alloc_ns, free_ns, bytes)."""

    def __init__(self, alloc: np.ndarray, free: np.ndarray, nbytes: np.ndarray) -> None:
        self._alloc = alloc
        order = np.lexsort((alloc, nbytes))  # by bytes, then allocation time (then row)
        sizes, firsts = np.unique(nbytes[order], return_index=True)
        self._sizes = sizes
        freed = np.where(np.isnan(free), np.inf, free)
        self._groups = [_Size(g, alloc[g], freed[g]) for g in (np.split(order, firsts[1:]) if len(order) else [])]

    def latest_made(self, low: int, high: int, before: int) -> Iterator[int]:
        """Rows of ``low`` to ``high`` bytes allocated before ``before``, alive or not, the latest
        first (ties: the later row first)."""
        return self._merged([g.made(before) for g in self._range(low, high)])

    def _range(self, low: int, high: int) -> list[_Size]:
        a = int(np.searchsorted(self._sizes, low, side="left"))
        b = int(np.searchsorted(self._sizes, high, side="right"))
        return self._groups[a:b]

    def _merged(self, runs: list[Iterator[int]]) -> Iterator[int]:
        if len(runs) == 1:
            return runs[0]
        alloc = self._alloc
        return heapq.merge(*runs, key=lambda r: (alloc[r], r), reverse=True)

    def latest_alive(self, low: int, high: int, at: int) -> Iterator[int]:
        """Rows of ``low`` to ``high`` bytes allocated before ``at`` and alive at it, the latest
        first (ties: the later row first)."""
        return self._merged([g.alive(at) for g in self._range(low, high)])
