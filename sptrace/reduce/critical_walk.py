"""The critical path across ranks: the chain of work, transfers and waiting that set the step
time, walked back from the step's end.

The dependencies, on clocks aligned across ranks (sptrace.reduce.timebase):
* within a rank, its work lane (sptrace.detect.work: its GPU compute and, where the GPU idled,
  its CPU threads' work; on a CPU trace its busiest thread) runs in order; while the lane is
  busy, the rank is working in a module;
* where the lane is idle, the rank was held by what ended there: a collective's (or send's or
  receive's) transfer, or its call where the call returned at another time (a blocking gloo
  send, an async call); else by nothing the trace records (``idle``);
* a collective completes only once its last member has arrived, and a receive once its send
  has: before that moment the path is on the member that arrived last.

A rank's step ends when the work it launched in it has: a GPU runs behind the CPU that launched
its work, so a collective called in the step (and the wait in it for a late member) can end after
the step's CPU range; the step's end is the later of the two.

So from the end of the step of the rank that finished last, the walk goes back along the lane
while it is busy (``compute``), through what held it where it was idle (``transfer``: from the
last member's arrival to the end), and on the last-arriving member from its arrival, until it
reaches the step's start on the rank it is on. A collective whose group holds members the trace
lacks cannot name who arrived last: its span is ``wait``, as far as the trace can tell. The
segments tile the path exactly.

Hand-written: HTA's critical path covers one rank's trace, and no library walks dependencies
across ranks' clocks.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from sptrace.detect.layers import layer_of as path_layer
from sptrace.reduce.critical import SEGMENT_COLUMNS, CriticalPath, StepPath
from sptrace.reduce.timebase import aligned, arrival_us, end_us

if TYPE_CHECKING:
    from sptrace.detect.timing import RankTiming
    from sptrace.reduce.matching import Matching

EPS_US = 0.5
"""Times closer than this (us) are one instant: traces round to 1 us or 1 ns."""


class _Rank:
    """One rank's lane and collectives on the aligned clock, for the walk (built when the walk
    first reaches the rank: it visits few of a large run's ranks)."""

    def __init__(self, work: pd.DataFrame, colls: pd.DataFrame, start: float) -> None:
        work = work.sort_values("start_us", kind="stable")
        self.ws = work["start_us"].to_numpy(dtype=float)
        self.we = self.ws + work["dur_us"].to_numpy(dtype=float)
        self.module = work["module"].tolist()
        self.phase = work["phase"].tolist()
        self.lane = work["lane"].tolist() if "lane" in work else [None] * len(work)
        self.colls = colls.reset_index(drop=True)
        # what held the rank: a collective's transfer (from its arrival to its end) and, where
        # the call returned at another time (an async call, a blocking gloo send), the call itself
        n = len(self.colls)
        arr, end = self.colls["arr"].to_numpy(dtype=float), self.colls["end"].to_numpy(dtype=float)
        op_s, op_e = self.colls["op_s"].to_numpy(dtype=float), self.colls["op_e"].to_numpy(dtype=float)
        call = np.flatnonzero(np.abs(op_e - end) > EPS_US)
        release = np.concatenate([end, op_e[call]])
        order = np.argsort(release, kind="stable")
        self.release = release[order]
        self.held_from = np.concatenate([arr, op_s[call]])[order]
        self.which = np.concatenate([np.arange(n), call])[order]
        self.used = np.zeros(n, dtype=bool)
        self.start = start


def run_critical_path(
    collectives: pd.DataFrame, matching: Matching | None, timing: Iterable[RankTiming], work: Mapping[int, pd.DataFrame]
) -> CriticalPath | None:
    """The critical path over the ranks' measured steps (RankTiming's windows); module paths name
    their layer as the collectives inside them do. When every rank recorded the same profiler
    steps (two or more), one path per step, each over that step's window on every rank: the
    slowest step's path, with each step's in short (``steps``)."""
    walker = _Walker(
        collectives, matching.members if matching is not None else None,
        matching.offsets_us if matching is not None else {}, work, module_layers(collectives),
    )  # fmt: skip
    by_step = step_windows(timing)
    if set(by_step) <= {None}:
        return walker.walk(by_step.get(None, {}))
    paths = [(name, walker.walk(windows)) for name, windows in by_step.items()]
    walked = [(name, p) for name, p in paths if p is not None]
    if not walked:
        return None
    name, slowest = max(walked, key=lambda item: item[1].step_us)
    steps = tuple(StepPath(n, p.step_us, p.by_kind(), p.culprit) for n, p in walked)
    return replace(slowest, step=name, steps=steps)


def module_layers(collectives: pd.DataFrame) -> dict[str, int]:
    """Module path -> layer, as the collectives inside each module name it."""
    if not len(collectives):
        return {}
    known = collectives[collectives["module"].notna() & collectives["layer"].notna()]
    return dict(zip(known["module"].astype(str), known["layer"].astype(int)))


def step_windows(timing: Iterable[RankTiming]) -> dict[str | None, dict[int, tuple[float, float]]]:
    """The windows a walk or a replay covers: each profiled step every rank recorded (name -> rank
    -> (start_us, end_us)) when they recorded two or more; else, under None, each rank's measured
    step window (RankTiming), empty when no rank has one."""
    timing = list(timing)
    by_step = common_steps(timing)
    if len(by_step) >= 2:
        return dict(by_step)
    return {None: {t.rank: (t.step_start_us, t.step_start_us + t.step_ms * 1e3) for t in timing
                   if t.step_start_us is not None and t.step_ms is not None}}  # fmt: skip


def common_steps(timing: list[RankTiming]) -> dict[str, dict[int, tuple[float, float]]]:
    """Each profiler step every rank recorded: name -> rank -> (start_us, end_us), in the order
    the steps ran; empty when a rank recorded none (its step came from another source)."""
    if not timing or any(not t.steps for t in timing):
        return {}
    names = set.intersection(*({n for n, _, _ in t.steps} for t in timing))
    order = [n for n, _, _ in timing[0].steps if n in names]
    windows = {t.rank: {n: (s, e) for n, s, e in t.steps} for t in timing}
    return {n: {r: w[n] for r, w in windows.items()} for n in order}


def critical_path(
    collectives: pd.DataFrame,
    members: pd.DataFrame | None,
    offsets: dict[int, float],
    steps: dict[int, tuple[float, float]],
    work: Mapping[int, pd.DataFrame] | pd.DataFrame,
    layer_of: dict[str, int] | None = None,
) -> CriticalPath | None:
    """The path (module docstring). ``members``: sptrace.reduce.matching.Matching.members (which
    rank's collective, by issue time, is which matched one); ``steps``: each rank's step
    [start, end] in us on its own clock; ``work``: each rank's lane (sptrace.detect.work), or one
    frame of every rank's; ``layer_of``: module path -> layer. None when no rank has a step."""
    return _Walker(collectives, members, offsets, work, layer_of or {}).walk(steps)


_EMPTY_WORK = pd.DataFrame(columns=["start_us", "dur_us", "module", "phase", "lane"])


class _Walker:
    """The ranks' collectives (matched, on the aligned clock) and lanes, ready for walks over
    any step windows (the collectives are joined to their groups once for all steps)."""

    def __init__(
        self, collectives: pd.DataFrame, members: pd.DataFrame | None, offsets: dict[int, float],
        work: Mapping[int, pd.DataFrame] | pd.DataFrame, layers: dict[str, int],
    ) -> None:  # fmt: skip
        self.offsets, self.layers = offsets, layers
        self.colls = aligned_collectives(collectives, members, offsets)
        # each rank's rows, taken when a walk reaches the rank (a frame per rank of ten thousand
        # would cost more than the collectives themselves)
        self.rows_of = self.colls.groupby("rank").indices if len(self.colls) else {}
        self.lanes: Mapping[int, pd.DataFrame]
        if isinstance(work, pd.DataFrame):
            self.lanes = dict(tuple(work.groupby("rank"))) if len(work) else {}
        else:
            self.lanes = work  # (a SpooledRanks reads a lane from disk when asked: only the path's ranks are)
        self.aligned: dict[int, pd.DataFrame] = {}

    def rank(self, r: int, start: float) -> _Rank:
        """Rank ``r``'s lane and collectives for one walk (a walk marks the collectives it used)."""
        if r not in self.aligned:
            w = self.lanes.get(r)
            self.aligned[r] = _EMPTY_WORK if w is None else w.assign(
                start_us=w["start_us"].astype(float) - self.offsets.get(r, 0.0)
            )  # fmt: skip
        rows = self.rows_of.get(r)
        return _Rank(self.aligned[r], self.colls.iloc[rows] if rows is not None else self.colls.iloc[:0], start)

    def through_launched(self, steps: dict[int, tuple[float, float]]) -> dict[int, tuple[float, float]]:
        """Each window (aligned) ending no earlier than the collectives the rank called in it do."""
        c = self.colls
        if c.empty:
            return steps
        ranks = c["rank"].to_numpy()
        first = pd.Series({r: s for r, (s, _) in steps.items()}, dtype=float).reindex(ranks).to_numpy()
        last = pd.Series({r: e for r, (_, e) in steps.items()}, dtype=float).reindex(ranks).to_numpy()
        called = c["op_s"].to_numpy(dtype=float)
        inside = (called >= first - EPS_US) & (called <= last + EPS_US)
        ends = c.loc[inside].groupby("rank")["end"].max()
        return {r: (s, max(e, float(ends.get(r, e)))) for r, (s, e) in steps.items()}

    def walk(self, steps: dict[int, tuple[float, float]]) -> CriticalPath | None:
        """The path over the ranks' step windows ``steps`` (us, each rank's own clock)."""
        offsets = self.offsets
        steps = {r: (s - offsets.get(r, 0.0), e - offsets.get(r, 0.0)) for r, (s, e) in steps.items() if e > s}
        if not steps:
            return None
        steps = self.through_launched(steps)
        ranks: dict[int, _Rank] = {}

        def lane(r: int) -> _Rank:
            if r not in ranks:
                ranks[r] = self.rank(r, steps[r][0])
            return ranks[r]

        rank = max(steps, key=lambda r: steps[r][1])
        end_of_step = t = steps[rank][1]
        rows: list[tuple] = []
        layers = self.layers

        def emit(r: int, kind: str, lo: float, hi: float, module=None, phase=None, coll: str | None = None,
                 waiting: int = 0, layer=None, lane: str | None = None) -> None:  # fmt: skip
            if hi - lo > 0:
                if layer is None or pd.isna(layer):
                    layer = (
                        (layers.get(module) if module in layers else path_layer(module))
                        if isinstance(module, str)
                        else None
                    )
                rows.append((r, kind, module, layer, phase, lo, hi - lo, coll, waiting, lane))

        for _ in range(10_000_000):  # a bound never reached: every turn moves t back or uses a collective up
            state = lane(rank)
            if t <= state.start + EPS_US:
                break
            i = int(np.searchsorted(state.ws, t, side="left")) - 1
            if i >= 0 and state.we[i] >= t - EPS_US:  # the lane was busy up to t: the rank worked
                lo = max(state.ws[i], state.start)
                emit(rank, "compute", lo, t, state.module[i], state.phase[i], lane=state.lane[i])
                t = lo
                continue
            gap = max(state.we[i] if i >= 0 else state.start, state.start)
            j = int(np.searchsorted(state.release, t + EPS_US, side="right")) - 1
            while j >= 0 and state.used[state.which[j]]:
                j -= 1
            if j < 0 or state.release[j] < gap - EPS_US:  # nothing the trace records held the rank
                emit(rank, "idle", gap, t)
                t = gap
                continue
            state.used[state.which[j]] = True
            c = state.colls.iloc[state.which[j]]
            end = min(float(state.release[j]), t)
            emit(rank, "idle", end, t)
            held = min(max(float(state.held_from[j]), state.start), end)
            last = min(max(float(c["last"]), held), end)
            what = (c["module"], c["phase"], c["name"])
            if c["unseen"]:  # a member the trace lacks may have been the last: who held it is unknown
                emit(rank, "wait", held, end, *what, layer=c["layer"])
                t = held
                continue
            emit(int(c["last_rank"]), "transfer", last, end, *what, int(c["waiting"]), layer=c["layer"])
            if int(c["last_rank"]) != rank and int(c["last_rank"]) in steps:
                rank, t = int(c["last_rank"]), last
            else:  # this rank arrived last: before, it was in the collective's call; or the last has no step here
                emit(rank, "transfer" if int(c["last_rank"]) == rank else "wait", held, last, *what, layer=c["layer"])
                t = held
        if not rows:
            return None
        seg = pd.DataFrame(rows[::-1], columns=SEGMENT_COLUMNS)
        return CriticalPath(step_us=end_of_step - t, start_us=t, segments=seg)


def aligned_collectives(
    frame: pd.DataFrame, members: pd.DataFrame | None, offsets: Mapping[int, float]
) -> pd.DataFrame:
    """Each rank's collectives on the aligned clock (arr, end), each with its matched group's last
    arrival (last), the rank that arrived last, how many members waited for it, whether members
    the trace lacks may have been later (unseen), how the text names it, and its match (m_group,
    m_key: one pair per collective across its members)."""
    columns = ["rank", "arr", "end", "op_s", "op_e", "last", "last_rank", "waiting", "unseen", "name", "module",
               "layer", "phase", "kind", "seq", "group_size", "m_group", "m_key"]  # fmt: skip
    if frame is None or frame.empty:
        return pd.DataFrame(columns=columns)
    op_s = aligned(frame["start_us"], frame["rank"], offsets)
    f = frame.assign(arr=aligned(arrival_us(frame), frame["rank"], offsets).to_numpy(),
                     end=aligned(end_us(frame), frame["rank"], offsets).to_numpy(), op_s=op_s.to_numpy(),
                     op_e=(op_s + frame["dur_us"].astype(float).fillna(0.0)).to_numpy())  # fmt: skip
    f = f[f["arr"].notna() & f["end"].notna()]
    if members is not None and len(members):
        keys = members[["rank", "start_us", "group", "key"]].drop_duplicates(["rank", "start_us"])
        keys = keys.rename(columns={"group": "m_group", "key": "m_key"})
        f = f.merge(keys.assign(m_key=keys["m_key"].astype(str)), on=["rank", "start_us"], how="left")
    else:
        f = f.assign(m_group=None, m_key=None)
    f = f.assign(m_group=f["m_group"].fillna("").astype(str), alone=f["m_key"].isna())
    # a collective no other rank's matched stands alone: its own key
    own = "alone:" + pd.Series(np.arange(len(f)), index=f.index).astype(str)
    f = f.assign(m_key=f["m_key"].where(~f["alone"], own))
    by = f.groupby(["m_group", "m_key"], sort=False)["arr"]
    last = by.transform("max")
    f = f.assign(last=last, n=by.transform("count"), late=(f["arr"] < last - EPS_US).astype(int))
    f = f.assign(waiting=f.groupby(["m_group", "m_key"], sort=False)["late"].transform("sum"))
    who = f.loc[by.idxmax().to_numpy(), ["m_group", "m_key", "rank"]].rename(columns={"rank": "last_rank"})
    f = f.merge(who, on=["m_group", "m_key"], how="left")
    size = pd.to_numeric(f["group_size"], errors="coerce")
    f = f.assign(unseen=(size.notna() & (f["n"] < size) & ~f["kind"].isin(["send", "recv"])).to_numpy())
    names = [_name(*row) for row in zip(f["kind"], f["seq"], f["m_group"], f["m_key"])]
    return f.assign(name=names)[columns]


def _name(kind: str, seq: object, group: str, key: str) -> str:
    """How the text names a collective: ``reduce_scatter #88`` (its sequence number, else its
    place in its group), ``send 0->1 #2``."""
    if key.startswith("p2p:"):
        return f"{kind} {key[4:].replace('#', ' #')}"
    if seq is not None and not pd.isna(seq):
        return f"{kind} #{int(seq)}"
    if key.startswith("alone:"):
        return str(kind)
    return f"{kind} #{key}" + (f" (group {group})" if group not in ("?", "") else "")
