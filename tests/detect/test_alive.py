"""GIVEN a ledger of allocations (sizes repeating over a long trace, many freed long ago, some
never freed, ties in allocation time)
WHEN sptrace.detect.alive lists the allocations of a size range alive at a time
THEN they are exactly those a scan of the ledger finds, latest first (ties: the later row first)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sptrace.detect.alive import AliveBySize


@settings(max_examples=200, deadline=None)
@given(
    st.integers(0, 2**32 - 1),
    st.integers(1, 9000),
    st.lists(st.tuples(st.integers(0, 4), st.integers(0, 1), st.integers(-10, 10_010)), max_size=25),
)
def test_alive_allocations_latest_first(seed, n, queries):
    rng = np.random.default_rng(seed)
    alloc = np.sort(rng.integers(0, 10_000, n)).astype(np.int64)
    alloc = alloc[rng.permutation(n)] if rng.random() < 0.3 else alloc  # the ledger is not always in time order
    life = rng.choice([1, 5, 50, 5000], n)
    free = (alloc + life).astype(np.float64)
    free[rng.random(n) < 0.05] = np.nan  # never freed
    nbytes = rng.choice([64, 128, 192, 256, 4096], n).astype(np.int64)
    index = AliveBySize(alloc, free, nbytes)
    sizes = (64, 128, 192, 256, 4096)
    for k, slack, at in queries:
        low, high = sizes[k], sizes[k] + slack * 64
        hit = np.flatnonzero((nbytes >= low) & (nbytes <= high) & (alloc < at) & (np.isnan(free) | (free >= at)))
        want = hit[np.lexsort((hit, alloc[hit]))][::-1].tolist()
        assert list(index.latest_alive(low, high, at)) == want


def test_latest_made_lists_every_allocation_latest_first():
    alloc = np.array([5, 1, 5, 9, 3, 9], dtype=np.int64)
    nbytes = np.array([64, 64, 64, 128, 64, 64], dtype=np.int64)
    index = AliveBySize(alloc, np.array([6, 2, np.nan, 10, 4, 20], dtype=np.float64), nbytes)
    assert list(index.latest_made(64, 64, 9)) == [2, 0, 4, 1]  # made before 9, dead or alive; ties: later row first
    assert list(index.latest_made(64, 128, 10)) == [5, 3, 2, 0, 4, 1]
    assert list(index.latest_alive(64, 64, 5)) == []  # rows 1 and 4 are freed by then, 0 and 2 made at 5
    assert list(index.latest_alive(64, 64, 6)) == [2, 0]  # row 0 freed at 6 is alive at 6
