"""Each rank's lane on clocks aligned across ranks, as the timeline, memory and skew figures draw
it, computed from a finished RunAnalysis with the reduce's one time base (sptrace.reduce.timebase)
and matching (sptrace.reduce.matching): when each collective's data moved, its matched peers and
straggler, times of phases, compute and memory on the aligned clock, the forward -> backward
boundary, arrival skew per rank with its rows' labels, the ranks that kept the others waiting, and
a window of one rank's own events. The figures (sptrace.report) and the dashboard draw these and
never re-derive them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from sptrace.analysis import RunAnalysis
from sptrace.reduce.matching import STRAGGLER_COLUMNS, Matching, skew_by_rank, top_stragglers
from sptrace.reduce.timebase import aligned, transfer_span
from sptrace.vocab.units import rank_text


def on_aligned_clock(a: RunAnalysis, frame: pd.DataFrame, column: str = "start_us") -> pd.Series:
    """``frame[column]``, a time in us on each row's rank's own clock, on the clock aligned across
    ranks (us), row by row by its ``rank``."""
    return aligned(frame[column], frame["rank"], a.offsets_us)


def collective_bars(a: RunAnalysis, frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` (rows of the run's collectives) with when each one's data moved: ``raw_start``
    and ``bar_dur`` on its rank's own clock (its transfer where the trace links one, else its
    CPU issue span), ``bar_start`` on the aligned clock (us), and ``issue_ms``, when it was issued
    in ms from the step start on the aligned clock."""
    f = frame.copy()
    if f.empty:
        return f
    offsets = a.offsets_us
    f["raw_start"], f["bar_dur"] = transfer_span(f)
    f["bar_start"] = aligned(f["raw_start"], f["rank"], offsets)
    f["issue_ms"] = (aligned(f["start_us"], f["rank"], offsets) - a.step_zero_us) / 1e3
    return f


def matched_peers(a: RunAnalysis, frame: pd.DataFrame) -> pd.DataFrame:
    """Per row of ``frame`` (collectives, indexed as the run's table): its matched collective's
    bandwidth, peers and straggler, as text (``algbw``, ``peers``, ``straggler``)."""
    out = pd.DataFrame({"algbw": "bandwidth ?", "peers": "no other rank", "straggler": "-"}, index=frame.index)
    m = a.matching
    if m is None or m.matched.empty or m.members.empty:
        return out
    members = m.members.merge(m.matched[["group", "key", "ranks", "straggler", "algbw_gbps", "busbw_gbps"]],
                              on=["group", "key"], how="inner")  # fmt: skip
    keyed = frame[["rank", "start_us"]].reset_index().merge(members, on=["rank", "start_us"], how="inner")
    keyed = keyed.drop_duplicates("index", keep="last").set_index("index")
    if keyed.empty:
        return out
    names: dict[tuple[int, tuple[int, ...]], str] = {}  # a group's ranks but one, named once per rank and group
    peers, straggler, algbw = [], [], []
    for rank, ranks, strag, alg, bus in zip(keyed["rank"], keyed["ranks"], keyed["straggler"], keyed["algbw_gbps"],
                                            keyed["busbw_gbps"]):  # fmt: skip
        if not isinstance(ranks, list):
            peers.append("no other rank")
            straggler.append("-")
            algbw.append("bandwidth ?")
            continue
        key = (int(rank), tuple(ranks))
        if key not in names:
            names[key] = rank_text([r for r in ranks if r != rank], none="no other rank")
        peers.append(names[key])
        straggler.append(f"rank {int(strag)}" if pd.notna(strag) else "-")
        if pd.notna(alg):
            busbw = f"{bus:.2f} GB/s" if pd.notna(bus) else "? (group size unknown)"
            algbw.append(f"algbw {alg:.2f} GB/s, busbw {busbw}")
        else:
            algbw.append("bandwidth ?")
    out.loc[keyed.index, "peers"] = peers
    out.loc[keyed.index, "straggler"] = straggler
    out.loc[keyed.index, "algbw"] = algbw
    return out


def boundary_us(a: RunAnalysis) -> float | None:
    """The forward -> backward boundary on the aligned clock (us): the median over the ranks that
    record one; None when none does."""
    offsets = a.offsets_us
    boundaries = [aligned(r.boundary_ns / 1e3, r.rank, offsets) for r in a.retained if r.boundary_ns is not None]
    return float(np.median(boundaries)) if boundaries else None


@dataclass(frozen=True)
class ArrivalSkew:
    """Arrival skew as collectives x ranks (sptrace.reduce.matching.skew_by_rank): ``grid`` holds
    how long after the first rank of its group each rank (a column) arrived at its i-th collective
    (a row), in us; ``labels`` names each row by the lowest rank's collective (kind and layer)."""

    grid: pd.DataFrame
    labels: list[str]


def arrival_skew(a: RunAnalysis, max_rows: int = 400) -> ArrivalSkew | None:
    """The run's arrival skew over its first ``max_rows`` collectives; None when no collective
    matched across ranks."""
    m = a.matching
    grid = skew_by_rank(m, max_rows=max_rows) if m is not None else pd.DataFrame()
    if grid.empty or m is None:
        return None
    return ArrivalSkew(grid, _collective_labels(m, len(grid)))


def _collective_labels(m: Matching, n: int) -> list[str]:
    """Row i's label: the i-th collective of the lowest rank (kind and layer)."""
    mem = m.members
    low = mem[mem["rank"] == mem["rank"].min()].sort_values("start_us", kind="stable").head(n)
    info = low.merge(m.matched[["group", "key", "kind", "layer"]], on=["group", "key"], how="left")
    labels = [
        f"#{i} {k}" + ("" if pd.isna(layer) else f" L{int(layer)}")
        for i, (k, layer) in enumerate(zip(info["kind"].fillna("?"), info["layer"]))
    ]
    return labels + [f"#{i}" for i in range(len(labels), n)]


def stragglers(a: RunAnalysis, k: int = 10) -> pd.DataFrame:
    """The ``k`` ranks that kept their groups waiting longest (sptrace.reduce.matching.top_stragglers);
    no rows without a matching."""
    return top_stragglers(a.matching, k) if a.matching is not None else pd.DataFrame(columns=STRAGGLER_COLUMNS)


EVENT_COLUMNS = ["rank", "name", "cat", "ph", "start_ms", "dur_ms", "tid", "input_dims", "input_types"]


@dataclass(frozen=True)
class EventWindow:
    """One rank's own events in a window (``EVENT_COLUMNS``: times in ms from the step start on
    the aligned clock), and the window's ends on that clock (ms)."""

    rank: int
    events: pd.DataFrame
    start_ms: float
    end_ms: float


def events_around(a: RunAnalysis, rank: int, start_us: float, end_us: float, margin: float = 0.25) -> EventWindow:
    """The rank's events overlapping [start_us, end_us] on its own clock, widened by ``margin`` of
    its length on each side (at least 50 us), read from the run's table cache (that window only)."""
    from sptrace.load.window import event_window

    pad = max((end_us - start_us) * margin, 50.0)
    lo, hi = start_us - pad, end_us + pad
    frame = event_window(a.run, [rank], int(lo * 1e3), int(hi * 1e3)).to_pandas()
    frame = frame.assign(
        start_ms=a.clock_ms(frame["rank"], frame["ts_ns"] / 1e3).round(3) if len(frame) else [],
        dur_ms=(frame["dur_ns"].astype(float) / 1e6).round(3),
    )
    return EventWindow(rank, frame[EVENT_COLUMNS], a.clock_ms(rank, lo), a.clock_ms(rank, hi))
