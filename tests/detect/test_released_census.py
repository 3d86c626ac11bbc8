"""GIVEN boundaries (in any order) and sptrace.instrument's release censuses, some before every
boundary, several after one, one at a boundary's very start
WHEN each boundary takes its census
THEN each takes the first census at or after its backward's start that no earlier boundary took,
as a scan of the censuses per boundary would, and a boundary with none left takes nothing."""

from __future__ import annotations

import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from sptrace.detect.boundaries import Boundary
from sptrace.detect.released_census import census_of_boundaries
from sptrace.vocab.markers import ReleasedCensus


def _boundary(backward_ns: int) -> Boundary:
    return Boundary(backward_ns - 5, backward_ns, backward_ns, backward_ns + 3, None, 0)


def test_each_boundary_takes_the_first_census_left():
    censuses = {ts: ReleasedCensus([(0x10 + ts, 1, "model")]) for ts in (5, 20, 26, 27, 40)}
    frame = pd.DataFrame({"name": [c.to_marker() for c in censuses.values()], "ts_ns": list(censuses)})
    b10, b20, b30, b50 = (_boundary(t) for t in (10, 20, 30, 50))
    held = census_of_boundaries([b30, b50, b10, b20], frame.sample(frac=1, random_state=3))
    # b10 -> 20 (5 is before it), b20 -> 26 (20 is taken), b30 -> 40 (26, 27 are before it), b50: none left
    assert {b.backward_ns: census.entries[0][0] - 0x10 for b, census in held.items()} == {10: 20, 20: 26, 30: 40}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 60), max_size=15), st.lists(st.integers(0, 60), max_size=15))
def test_as_a_scan_of_the_censuses_per_boundary(backwards, times):
    censuses = [ReleasedCensus([(0x10 + k, 1, "model")]) for k in range(len(times))]
    frame = pd.DataFrame({"name": [c.to_marker() for c in censuses], "ts_ns": times})
    bounds = [Boundary(t - 5, t, t, t + 3, k, 0) for k, t in enumerate(backwards)]  # (steps keep them distinct)
    taken = sorted((t, k) for k, t in enumerate(times))
    want, used = {}, set()
    for b in sorted(bounds, key=lambda b: b.backward_ns):
        k = next((i for i, (t, _) in enumerate(taken) if i not in used and t >= b.backward_ns), None)
        if k is not None:
            used.add(k)
            want[b] = taken[k][1]
    got = census_of_boundaries(bounds, frame)
    assert {b: c.entries[0][0] - 0x10 for b, c in got.items()} == want
