"""Which boundary each of sptrace.instrument's release censuses (``sptrace.released::`` events)
belongs to: the first census after a boundary that no earlier boundary took, found by bisect (a
window of hundreds of boundaries is not a scan of the censuses per boundary). Boundaries taken in
the order of their backwards take censuses in time order, so the first one left at or after a
boundary is the later of its bisect and the one after the last taken."""

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
    out: dict[Boundary, markers.ReleasedCensus] = {}
    free = 0  # boundaries in time order take censuses in time order: those before ``free`` are taken
    for b in sorted(bounds, key=lambda b: b.backward_ns):
        k = max(bisect.bisect_left(times, b.backward_ns), free)
        if k == len(taken):
            continue
        free = k + 1
        census = markers.ReleasedCensus.from_marker(taken[k][1])
        if census is not None:
            out[b] = census
    return out
