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
from sptrace.reduce.critical_walk import EPS_US, aligned_collectives, common_steps

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
    module: list[str | None]
    phase: list[str | None]
    layer: list[int | None]
    lane: list[str | None]
    member: np.ndarray
    """For a WAIT piece, the row of ReplayGraph.members whose end releases it (else -1)."""
    after_end_us: np.ndarray
    """For a WAIT piece released by its call's return: how long after the transfer's end it returned."""
    arrivals: list[list[tuple[int, float]]] = field(default_factory=list)
    """Per piece, the members (rows of ReplayGraph.members) that arrive inside it, with their
    offset from the piece's start."""


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

    @property
    def measured_us(self) -> float:
        """The step as measured: the slowest rank's window."""
        return max((p.end_us - p.start_us for p in self.ranks.values()), default=0.0)


def replay_graphs(
    collectives: pd.DataFrame, matching: Matching | None, timing: Iterable[RankTiming], work: Mapping[int, pd.DataFrame]
) -> tuple[ReplayGraph, ...]:
    """One graph per profiled step every rank recorded (when they recorded two or more), else one
    over each rank's measured step window (RankTiming), as the critical path walks them."""
    timing = list(timing)
    layers: dict[str, int] = {}
    if len(collectives):
        known = collectives[collectives["module"].notna() & collectives["layer"].notna()]
        layers = dict(zip(known["module"].astype(str), known["layer"].astype(int)))
    members = matching.members if matching is not None else None
    offsets = matching.offsets_us if matching is not None else {}
    by_step = common_steps(timing)
    if len(by_step) < 2:
        windows = {t.rank: (t.step_start_us, t.step_start_us + t.step_ms * 1e3) for t in timing
                   if t.step_start_us is not None and t.step_ms is not None}  # fmt: skip
        by_step = {None: windows} if windows else {}
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
    by_rank = {int(r): g for r, g in table.groupby("rank")} if len(table) else {}
    layers = dict(layers or {})
    ranks = {}
    for r, (s, e) in aligned.items():
        lane = work.get(r)
        lane = lane.assign(start_us=lane["start_us"].astype(float) - offsets.get(r, 0.0)) if lane is not None else None
        ranks[r] = _pieces(r, s, e, lane, by_rank.get(r, table.iloc[:0]), layers)
    unseen = int(table.loc[table["unseen"], "collective"].nunique()) if len(table) else 0
    return ReplayGraph(ranks, table, int(ids.max()) + 1 if len(ids) else 0, unseen, step)


def _pieces(
    rank: int, start: float, end: float, lane: pd.DataFrame | None, mine: pd.DataFrame, layers: Mapping[str, int]
) -> RankPieces:
    """Rank ``rank``'s window [start, end] tiled by busy, idle and wait pieces."""
    kinds: list[int] = []
    durs: list[float] = []
    modules: list[str | None] = []
    phases: list[str | None] = []
    lanes: list[str | None] = []
    member: list[int] = []
    after: list[float] = []
    bounds: list[float] = []

    def add(kind: int, lo: float, hi: float, module=None, phase=None, lane_name=None, row=-1, late=0.0) -> None:
        if hi - lo > 0:
            kinds.append(kind)
            durs.append(hi - lo)
            modules.append(module)
            phases.append(phase)
            lanes.append(lane_name)
            member.append(row)
            after.append(late)
            bounds.append(lo)

    # what may release an idle lane: a member's transfer end, or its call's return when that came later
    rows = mine.index.to_numpy()
    ends = mine["end_us"].to_numpy(dtype=float)
    calls = mine["call_end_us"].to_numpy(dtype=float)
    late = calls > ends + EPS_US
    release = np.concatenate([ends, calls[late]])
    which = np.concatenate([rows, rows[late]])
    lateness = np.concatenate([np.zeros(len(rows)), (calls - ends)[late]])
    order = np.argsort(release, kind="stable")
    release, which, lateness = release[order], which[order], lateness[order]

    def gap(lo: float, hi: float) -> None:
        """An idle stretch: waits on what released it, in order, then idle."""
        t = lo
        i = int(np.searchsorted(release, lo + EPS_US, side="left"))
        while i < len(release) and release[i] <= hi + EPS_US:
            rel = min(float(release[i]), hi)
            if rel > t + EPS_US:
                add(WAIT, t, rel, row=int(which[i]), late=float(lateness[i]))
                t = rel
            i += 1
        add(IDLE, t, hi)

    t = start
    if lane is not None and len(lane):
        lane = lane.sort_values("start_us", kind="stable")
        names = lane["lane"] if "lane" in lane else [None] * len(lane)
        for s, d, module, phase, lane_name in zip(
            lane["start_us"], lane["dur_us"].astype(float), lane["module"], lane["phase"], names
        ):
            lo, hi = max(float(s), t), min(float(s) + d, end)
            if hi <= lo:
                continue
            gap(t, lo)
            add(BUSY, lo, hi, module if isinstance(module, str) else None, phase if isinstance(phase, str) else None,
                lane_name if isinstance(lane_name, str) else None)  # fmt: skip
            t = hi
    gap(t, end)
    starts = np.asarray(bounds, dtype=float)
    arrivals: list[list[tuple[int, float]]] = [[] for _ in kinds]
    for row, arr in zip(rows, mine["arr_us"].to_numpy(dtype=float)):
        i = max(int(np.searchsorted(starts, arr, side="right")) - 1, 0)
        if arrivals:
            arrivals[i].append((int(row), max(arr - starts[i], 0.0)))
    layer = [(layers.get(m) if m in layers else path_layer(m)) if isinstance(m, str) else None for m in modules]
    return RankPieces(rank, start, end, np.asarray(kinds, dtype=np.int8), np.asarray(durs, dtype=float), modules,
                      phases, layer, lanes, np.asarray(member, dtype=np.int64), np.asarray(after, dtype=float),
                      arrivals)  # fmt: skip
