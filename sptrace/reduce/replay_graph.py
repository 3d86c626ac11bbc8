"""The step as a cross-rank dependency graph, for replays with changed costs (sptrace.reduce.replay).

Each rank's step window is tiled, on the aligned clock, by pieces in order:
* ``busy``: its work lane was busy (sptrace.detect.work), in a module and phase;
* ``wait``: its lane was idle until a collective it takes part in released it: the collective's
  end on this rank (its transfer's end), or the return of its call where the call returned after
  the transfer (a blocking gloo send);
* ``idle``: its lane was idle and nothing the trace records held it (Python, launch overhead).

A rank arrives at a collective (when its transfer could start: sptrace.reduce.timebase) at a
point inside one of its pieces, kept as (piece, offset). A collective ends on each member its
transfer time after the last member's arrival, where the transfer time is the measured one: from
the last arrival among the members the graph holds to that member's measured end. So a replay
with nothing changed reproduces every measured end, and a change moves only what depends on it.

Hand-written, like the critical path it extends: no library replays a trace's dependencies across
ranks' clocks.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from sptrace.detect.layers import layer_of as path_layer
from sptrace.reduce.critical_walk import EPS_US, aligned_collectives, module_layers, step_windows

if TYPE_CHECKING:
    from sptrace.detect.timing import RankTiming
    from sptrace.reduce.matching import Matching

BUSY, IDLE, WAIT = 0, 1, 2
PIECE_KINDS = ("busy", "idle", "wait")


@dataclass
class RankPieces:
    """One rank's step window as pieces (module docstring), in order, and its arrivals."""

    rank: int
    start_us: float
    end_us: float
    kind: np.ndarray
    """BUSY, IDLE or WAIT per piece."""
    dur_us: np.ndarray
    module: np.ndarray
    """Per piece, its module (a str; None outside busy pieces): an object array, as are phase and lane."""
    phase: np.ndarray
    layer: np.ndarray
    """Per piece, its layer (NaN where none)."""
    lane: np.ndarray
    member: np.ndarray
    """For a WAIT piece, the row of ReplayGraph.members whose end releases it (else -1)."""
    after_end_us: np.ndarray
    """For a WAIT piece released by its call's return: how long after the transfer's end it returned."""
    arrival_piece: np.ndarray
    """The members that arrive on this rank (rows of ReplayGraph.members in ``arrival_row``), each
    inside piece ``arrival_piece`` at ``arrival_offset_us`` from its start, in piece order."""
    arrival_row: np.ndarray
    arrival_offset_us: np.ndarray


@dataclass
class ReplayGraph:
    """The step's dependency graph (module docstring): each rank's pieces and every collective's
    members. ``members`` has one row per rank's part in a collective: rank, collective (an integer
    shared by the members of one matched collective), kind, module, phase, layer, name, arrival
    and end (us, aligned) and its transfer time (us)."""

    ranks: dict[int, RankPieces]
    members: pd.DataFrame = field(repr=False)
    collectives: int
    """How many collectives (distinct ``collective`` values)."""
    unseen: int
    """Collectives whose group holds members the trace lacks (their transfer is measured from the
    members it holds: a replay cannot move the missing ones)."""
    step: str | None = None
    layers: Mapping[str, int] = field(default_factory=dict)
    """Module path -> layer (the collectives' own), for the replayed path's words."""

    @property
    def measured_us(self) -> float:
        """The step as measured: the slowest rank's window."""
        return max((p.end_us - p.start_us for p in self.ranks.values()), default=0.0)


def replay_graphs(
    collectives: pd.DataFrame, matching: Matching | None, timing: Iterable[RankTiming], work: Mapping[int, pd.DataFrame]
) -> tuple[ReplayGraph, ...]:
    """One graph per profiled step every rank recorded (when they recorded two or more), else one
    over each rank's measured step window (RankTiming), as the critical path walks them."""
    layers = module_layers(collectives)
    members = matching.members if matching is not None else None
    offsets = matching.offsets_us if matching is not None else {}
    by_step = {step: windows for step, windows in step_windows(timing).items() if windows}
    graphs = (build_replay_graph(collectives, members, offsets, w, work, layers, step) for step, w in by_step.items())
    return tuple(g for g in graphs if g.ranks)


def build_replay_graph(
    collectives: pd.DataFrame,
    members: pd.DataFrame | None,
    offsets: Mapping[int, float],
    windows: Mapping[int, tuple[float, float]],
    work: Mapping[int, pd.DataFrame],
    layers: Mapping[str, int] | None = None,
    step: str | None = None,
) -> ReplayGraph:
    """The graph over each rank's step window ``windows`` (us, the rank's own clock), from the
    ranks' collectives (matched: ``members`` is sptrace.reduce.matching.Matching.members), clock
    offsets and work lanes (sptrace.detect.work)."""
    colls = aligned_collectives(collectives, members, offsets)
    aligned = {r: (s - offsets.get(r, 0.0), e - offsets.get(r, 0.0)) for r, (s, e) in windows.items() if e > s}
    keep = np.array([r in aligned and aligned[r][0] - EPS_US <= a <= aligned[r][1] + EPS_US
                     for r, a in zip(colls["rank"], colls["arr"])], dtype=bool)  # fmt: skip
    inside = colls[keep].reset_index(drop=True)
    ids = inside.groupby(["m_group", "m_key"], sort=False).ngroup().to_numpy() if len(inside) else np.empty(0, int)
    last = inside.groupby(ids)["arr"].transform("max") if len(inside) else inside["arr"]
    table = pd.DataFrame({
        "rank": inside["rank"].astype(int).to_numpy(), "collective": ids, "kind": inside["kind"].astype(str).to_numpy(),
        "module": inside["module"].to_numpy(), "phase": inside["phase"].to_numpy(),
        "layer": inside["layer"].to_numpy(), "name": inside["name"].to_numpy(),
        "arr_us": inside["arr"].astype(float).to_numpy(), "end_us": inside["end"].astype(float).to_numpy(),
        "transfer_us": np.maximum(inside["end"].astype(float).to_numpy() - np.asarray(last, dtype=float), 0.0),
        "call_start_us": inside["op_s"].astype(float).to_numpy(),
        "call_end_us": inside["op_e"].astype(float).to_numpy(), "unseen": inside["unseen"].astype(bool).to_numpy(),
        "seq": inside["seq"].to_numpy(), "group_size": inside["group_size"].to_numpy(),
        "group": inside["m_group"].to_numpy(), "key": inside["m_key"].astype(str).to_numpy(),
    })  # fmt: skip
    rows_of = {int(r): np.asarray(i) for r, i in table.groupby("rank").indices.items()} if len(table) else {}
    times = (table["arr_us"].to_numpy(), table["end_us"].to_numpy(), table["call_end_us"].to_numpy())
    layers = dict(layers or {})
    none = np.empty(0, dtype=np.int64)
    ranks = {}
    for r, (s, e) in aligned.items():
        rows = rows_of.get(r, none)
        ranks[r] = _pieces(r, s, e, _lane(work.get(r), offsets.get(r, 0.0)), rows, *(t[rows] for t in times), layers)
    unseen = int(table.loc[table["unseen"], "collective"].nunique()) if len(table) else 0
    return ReplayGraph(ranks, table, int(ids.max()) + 1 if len(ids) else 0, unseen, step, layers)


def _pieces(
    rank: int,
    start: float,
    end: float,
    lane: Lane | None,
    rows: np.ndarray,
    arrivals_us: np.ndarray,
    ends: np.ndarray,
    calls: np.ndarray,
    layers: Mapping[str, int],
) -> RankPieces:
    """Rank ``rank``'s window [start, end] tiled by busy, idle and wait pieces: the lane's busy
    stretches (numpy, no loop over them), the gaps between them, and inside a gap the waits on what
    released it, in order, then idle (a loop over the rank's releases only). ``rows``: the rank's
    rows of ReplayGraph.members, with their arrival, end and call's return."""
    lo, hi, busy = _busy(start, end, lane)
    gap_lo, gap_hi = np.concatenate([[start], hi]), np.concatenate([lo, [end]])
    # what may release an idle lane: a member's transfer end, or its call's return when that came later
    late = calls > ends + EPS_US
    release = np.concatenate([ends, calls[late]])
    which = np.concatenate([rows, rows[late]])
    lateness = np.concatenate([np.zeros(len(rows)), (calls - ends)[late]])
    order = np.argsort(release, kind="stable")
    release, which, lateness = release[order], which[order], lateness[order]
    gap_of = np.searchsorted(gap_lo + EPS_US, release, side="right") - 1
    inside = (gap_of >= 0) & (release <= gap_hi[np.maximum(gap_of, 0)] + EPS_US)
    # the gaps' pieces: (start, end, kind, member row, lateness); a gap without a release is one idle piece
    waits: list[tuple[float, float, int, int, float]] = []
    t_of: dict[int, float] = {}
    for g, rel, row, lateness_ in zip(gap_of[inside], release[inside], which[inside], lateness[inside]):
        g = int(g)
        t = t_of.get(g, float(gap_lo[g]))
        rel = min(float(rel), float(gap_hi[g]))
        if rel > t + EPS_US:
            waits.append((t, rel, WAIT, int(row), float(lateness_)))
            t_of[g] = rel
    idle_lo = gap_lo.copy()
    for g, t in t_of.items():
        idle_lo[g] = t
    starts = np.concatenate([lo, [w[0] for w in waits], idle_lo])
    stops = np.concatenate([hi, [w[1] for w in waits], gap_hi])
    kinds = np.concatenate([np.full(len(lo), BUSY), np.full(len(waits), WAIT), np.full(len(idle_lo), IDLE)])
    member = np.concatenate([np.full(len(lo), -1), [w[3] for w in waits], np.full(len(idle_lo), -1)])
    after = np.concatenate([np.zeros(len(lo)), [w[4] for w in waits], np.zeros(len(idle_lo))])
    source = np.concatenate([np.arange(len(lo)), np.full(len(waits) + len(idle_lo), -1)])
    keep = stops - starts > 0
    order = np.argsort(starts[keep], kind="stable")
    starts, stops, kinds = starts[keep][order], stops[keep][order], kinds[keep][order]
    member, after, source = member[keep][order], after[keep][order], source[keep][order]
    text = [np.asarray([*col, None], dtype=object)[np.where(source >= 0, source, len(col))] for col in busy]
    modules, phases, lanes = text
    piece = np.maximum(np.searchsorted(starts, arrivals_us, side="right") - 1, 0)
    order = np.argsort(piece, kind="stable")
    piece, arrival_rows = piece[order], rows[order].astype(np.int64)
    offset = np.maximum(arrivals_us[order] - starts[piece], 0.0) if len(starts) else np.zeros(len(piece))
    names = {m: (layers.get(m) if m in layers else path_layer(m)) for m in set(modules.tolist()) if isinstance(m, str)}
    layer = np.array([np.nan if names.get(m) is None else names[m] for m in modules.tolist()], dtype=float)
    return RankPieces(rank, start, end, kinds.astype(np.int8), stops - starts, modules, phases, layer, lanes,
                      member.astype(np.int64), after.astype(float), piece, arrival_rows, offset)  # fmt: skip


@dataclass(frozen=True)
class Lane:
    """A rank's work lane as arrays, on the aligned clock, in time order."""

    start_us: np.ndarray
    end_us: np.ndarray
    module: np.ndarray
    phase: np.ndarray
    lane: np.ndarray


def _lane(work: pd.DataFrame | None, offset: float) -> Lane | None:
    if work is None or not len(work):
        return None
    start = work["start_us"].to_numpy(dtype=float) - offset
    order = np.argsort(start, kind="stable")
    end = start + work["dur_us"].to_numpy(dtype=float)
    names = work["lane"].to_numpy(dtype=object) if "lane" in work else np.full(len(work), None, dtype=object)
    text = (work["module"].to_numpy(dtype=object), work["phase"].to_numpy(dtype=object), names)
    return Lane(start[order], end[order], *(t[order] for t in text))


def _busy(
    start: float, end: float, lane: Lane | None
) -> tuple[np.ndarray, np.ndarray, tuple[list[str | None], list[str | None], list[str | None]]]:
    """The lane's busy stretches inside [start, end], in order and without overlap (a stretch that
    starts inside the one before starts where that one ends), with their module, phase and lane."""
    if lane is None:
        empty = np.empty(0, dtype=float)
        return empty, empty, ([], [], [])
    s, e = lane.start_us, lane.end_us
    usable = (e > s) & (s < end) & (e > start)
    s, e = np.maximum(s[usable], start), np.minimum(e[usable], end)
    before = np.maximum.accumulate(np.concatenate([[start], e[:-1]]))  # where the stretches before ended
    lo = np.maximum(s, before)
    kept = e > lo
    module, phase, names = ([v if isinstance(v, str) else None for v in col[usable][kept]]
                            for col in (lane.module, lane.phase, lane.lane))  # fmt: skip
    return lo[kept], e[kept], (module, phase, names)
