"""Which boundary each of sptrace.instrument's release censuses (``sptrace.released::`` events)
belongs to: the first census after a boundary that no earlier boundary took, found by bisect and
a next-free index (a window of hundreds of boundaries is not a scan of the censuses per boundary)."""

from __future__ import annotations

import bisect

import pandas as pd

from sptrace.detect.boundaries import Boundary
from sptrace.vocab import markers


def census_of_boundaries(bounds: list[Boundary], censuses: pd.DataFrame) -> dict[Boundary, markers.ReleasedCensus]:
    """Each boundary's census of who released the buffers its forward's collectives filled
    (sptrace.instrument's ``sptrace.released::`` event, written when the backward that consumes
    the forward ends): the first one after the boundary that no earlier boundary took."""
    taken = sorted((int(ts), str(name)) for name, ts in zip(censuses["name"], censuses["ts_ns"]) if pd.notna(ts))
    times = [ts for ts, _ in taken]
    next_free = list(range(len(taken) + 1))  # k -> the first census at or after k no boundary took

    def first_free(k: int) -> int:
        root = k
        while next_free[root] != root:
            root = next_free[root]
        while next_free[k] != root:  # (path halving keeps each lookup near constant)
            next_free[k], k = root, next_free[k]
        return root

    out: dict[Boundary, markers.ReleasedCensus] = {}
    for b in sorted(bounds, key=lambda b: b.backward_ns):
        k = first_free(bisect.bisect_left(times, b.backward_ns))
        if k == len(taken):
            continue
        next_free[k] = k + 1
        census = markers.ReleasedCensus.from_marker(taken[k][1])
        if census is not None:
            out[b] = census
    return out
