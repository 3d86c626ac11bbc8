"""A replay of the step's dependency graph (sptrace.reduce.replay_graph) with changed costs.

Each rank runs its pieces in order from its measured step start: a busy piece takes its measured
time times its scale, an idle piece its measured time, and a wait piece lasts until the collective
that released it has ended on this rank. A rank arrives at a collective at its measured offset
inside the piece that holds the arrival; a collective ends on each member its (scaled) transfer
time after its last member's arrival, or after the member's own arrival with ``no_wait`` (nobody
waits for anybody: the lower bound). With nothing changed the replay reproduces the measured ends.

The ranks advance in an event loop: a rank runs until a wait whose collective still lacks a
member's arrival, and resumes when that arrival makes it end. A graph whose order the trace
contradicts (a wait on a collective whose member can only arrive later) would stop; the replay
then ends that collective with the arrivals it has, counts it (``forced``), and goes on.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from sptrace.reduce.critical import CriticalPath
from sptrace.reduce.critical_walk import EPS_US, critical_path
from sptrace.reduce.replay_graph import BUSY, WAIT, RankPieces, ReplayGraph


@dataclass(frozen=True)
class Changes:
    """What a replay changes: ``comm`` scales every transfer and ``kinds`` one kind's (in place of
    ``comm``); ``compute`` scales busy time and ``modules`` a module's (path, or a path it is
    under: ``layers.2.mlp``), on top of ``compute``; ``ranks``: the scales apply to these ranks
    only (None: every rank); ``balance``: every rank's busy time per layer and phase set to the
    median rank's; ``no_wait``: no collective waits for its last member."""

    comm: float = 1.0
    kinds: Mapping[str, float] = field(default_factory=dict)
    compute: float = 1.0
    modules: tuple[tuple[str, float], ...] = ()
    ranks: frozenset[int] | None = None
    balance: bool = False
    no_wait: bool = False

    @property
    def none(self) -> bool:
        return (self.comm == 1.0 and not self.kinds and self.compute == 1.0 and not self.modules
                and not self.balance and not self.no_wait)  # fmt: skip

    def describe(self) -> str:
        """'all_gather x0.5, compute x0.8 on rank 5; balanced': the changes in words."""
        from sptrace.vocab.units import rank_text

        parts = [f"comm x{self.comm:g}"] if self.comm != 1.0 else []
        parts += [f"{k} x{v:g}" for k, v in self.kinds.items()]
        parts += [f"compute x{self.compute:g}"] if self.compute != 1.0 else []
        parts += [f"{m} x{v:g}" for m, v in self.modules]
        text = ", ".join(parts)
        if text and self.ranks is not None:
            text += f" on {rank_text(sorted(self.ranks))}"
        extra = [w for w, on in (("every rank's compute at the median rank's", self.balance),
                                 ("no collective waits for its last member", self.no_wait)) if on]  # fmt: skip
        return "; ".join(p for p in (text, *extra) if p) or "nothing changed"

    def applies(self, rank: int) -> bool:
        return self.ranks is None or rank in self.ranks

    def comm_scale(self, kind: str, rank: int) -> float:
        return self.kinds.get(kind, self.comm) if self.applies(rank) else 1.0

    def busy_scale(self, module: str | None, rank: int) -> float:
        if not self.applies(rank):
            return 1.0
        scale = self.compute
        for path, factor in self.modules:
            if isinstance(module, str) and (module == path or module.startswith(path + ".")):
                scale *= factor
        return scale


@dataclass(frozen=True)
class Replay:
    """One replay: the step it predicts (the slowest rank's window, us), each rank's predicted
    end, and how many collectives it had to end without all their arrivals (``forced``)."""

    step_us: float
    ends_us: dict[int, float]
    forced: int
    lanes: dict[int, list[tuple[float, float, str | None, str | None, str | None]]] = field(repr=False)
    """Each rank's busy pieces as replayed: (start_us, dur_us, module, phase, lane)."""
    members: pd.DataFrame = field(repr=False)
    """ReplayGraph.members with the replayed arrival and end (arr_us, end_us) and the scale of its
    communication (comm_factor)."""

    def path(self, graph: ReplayGraph) -> CriticalPath | None:
        """The critical path of the replayed step (sptrace.reduce.critical_walk), in the same
        terms as the measured one."""
        m, measured = self.members, graph.members
        moved_arr = m["arr_us"] - measured["arr_us"]
        # the call moves with the arrival; its return with the end (plus its scaled lateness) where it
        # returned after the transfer
        call_start = measured["call_start_us"] + moved_arr
        after = measured["call_end_us"] >= measured["end_us"] - EPS_US
        late = (measured["call_end_us"] - measured["end_us"]) * m["comm_factor"]  # scaled as the replay did
        call_end = (m["end_us"] + late).where(after, measured["call_end_us"] + moved_arr)
        frame = pd.DataFrame({
            "rank": m["rank"], "kind": m["kind"], "start_us": call_start, "dur_us": call_end - call_start,
            "transfer_start_us": m["arr_us"], "transfer_dur_us": m["end_us"] - m["arr_us"], "seq": m["seq"],
            "group_size": m["group_size"], "module": m["module"], "layer": m["layer"], "phase": m["phase"],
        })  # fmt: skip
        members = pd.DataFrame({"rank": m["rank"], "start_us": call_start, "group": m["group"], "key": m["key"]})
        steps = {r: (p.start_us, self.ends_us[r]) for r, p in graph.ranks.items()}
        lanes = {r: pd.DataFrame(rows, columns=["start_us", "dur_us", "module", "phase", "lane"])
                 for r, rows in self.lanes.items()}  # fmt: skip
        return critical_path(frame, members, {}, steps, lanes, dict(graph.layers))


def replay(graph: ReplayGraph, changes: Changes = Changes()) -> Replay:
    """The step replayed on ``graph`` with ``changes`` (module docstring)."""
    m = graph.members
    cid = m["collective"].to_numpy(dtype=np.int64)
    ranks_of = m["rank"].to_numpy(dtype=np.int64)
    factor = np.array([changes.comm_scale(k, int(r)) for k, r in zip(m["kind"], ranks_of)], dtype=float)
    transfer = m["transfer_us"].to_numpy(dtype=float) * factor
    pending = np.bincount(cid, minlength=graph.collectives)
    last = np.full(graph.collectives, -np.inf)
    arr = np.full(len(m), np.nan)
    end = np.full(len(m), np.nan)
    rows_of: dict[int, list[int]] = {}
    for row, c in enumerate(cid):
        rows_of.setdefault(int(c), []).append(row)
    waiting: dict[int, list[int]] = {}  # member row -> ranks blocked on it
    scales = {r: _busy_scales(p, changes) for r, p in graph.ranks.items()}
    if changes.balance:
        _balance(graph, scales)
    cursor = dict.fromkeys(graph.ranks, 0)
    entered = dict.fromkeys(graph.ranks, 0)
    next_arrival = dict.fromkeys(graph.ranks, 0)
    clock = {r: p.start_us for r, p in graph.ranks.items()}
    lanes: dict[int, list[tuple]] = {r: [] for r in graph.ranks}
    ready = deque(graph.ranks)
    forced = 0

    def ended(row: int) -> None:
        for r in waiting.pop(row, []):
            ready.append(r)

    def complete(c: int) -> None:
        for row in rows_of[c]:
            if np.isnan(end[row]):
                start = arr[row] if changes.no_wait and not np.isnan(arr[row]) else last[c]
                end[row] = start + transfer[row]
                ended(row)

    def arrive(row: int, t: float) -> None:
        arr[row] = t
        c = int(cid[row])
        last[c] = max(last[c], t)
        pending[c] -= 1
        if changes.no_wait:
            end[row] = t + transfer[row]
            ended(row)
        elif pending[c] == 0:
            complete(c)

    while True:
        while ready:
            r = ready.popleft()
            p, i, t = graph.ranks[r], cursor[r], clock[r]
            scale = scales[r]
            while i < len(p.kind):
                kind = int(p.kind[i])
                if entered[r] <= i:  # the arrivals inside this piece, once
                    entered[r] = i + 1
                    j = next_arrival[r]
                    while j < len(p.arrival_piece) and p.arrival_piece[j] == i:
                        arrive(int(p.arrival_row[j]), t + p.arrival_offset_us[j] * (scale[i] if kind == BUSY else 1.0))
                        j += 1
                    next_arrival[r] = j
                if kind == WAIT:
                    row = int(p.member[i])
                    if np.isnan(end[row]):
                        waiting.setdefault(row, []).append(r)
                        break
                    t = max(t, end[row] + p.after_end_us[i] * factor[row])  # (a call's return is communication)
                elif kind == BUSY:
                    d = p.dur_us[i] * scale[i]
                    lanes[r].append((t, d, p.module[i], p.phase[i], p.lane[i]))
                    t += d
                else:  # IDLE
                    t += p.dur_us[i]
                i += 1
            cursor[r], clock[r] = i, t
        blocked = [row for row, rs in waiting.items() if rs]
        if not blocked:
            break
        # the trace's order contradicts itself: end the earliest-ending blocked collective as it stands
        row = min(blocked, key=lambda x: float(m["end_us"].iat[x]))
        c = int(cid[row])
        if last[c] == -np.inf:
            last[c] = float(m["arr_us"].iat[row])
        forced += 1
        complete(c)
    step = max((clock[r] - p.start_us for r, p in graph.ranks.items()), default=0.0)
    return Replay(step, dict(clock), forced, lanes, m.assign(arr_us=arr, end_us=end, comm_factor=factor))


def _busy_scales(p: RankPieces, changes: Changes) -> np.ndarray:
    """Each piece's scale: its module's for a busy piece (worked out once per module), else 1."""
    scale = np.ones(len(p.kind))
    busy = p.kind == BUSY
    if not busy.any() or not changes.applies(p.rank):
        return scale
    modules = p.module[busy]
    by_module = {m: changes.busy_scale(m, p.rank) for m in set(modules.tolist())}
    scale[busy] = [by_module[m] for m in modules.tolist()]
    return scale


def _balance(graph: ReplayGraph, scales: dict[int, np.ndarray]) -> None:
    """Every rank's busy time per (layer, phase) scaled to the median rank's (of the ranks that
    have busy time there)."""
    totals: dict[tuple[object, object], dict[int, float]] = {}
    keys = {r: [(None if np.isnan(p.layer[i]) else int(p.layer[i]), p.phase[i]) for i in np.flatnonzero(p.kind == BUSY)]
            for r, p in graph.ranks.items()}  # fmt: skip
    for r, p in graph.ranks.items():
        for key, i in zip(keys[r], np.flatnonzero(p.kind == BUSY)):
            per = totals.setdefault(key, {})
            per[r] = per.get(r, 0.0) + float(p.dur_us[i] * scales[r][i])
    median = {key: float(np.median(list(per.values()))) for key, per in totals.items()}
    for r, p in graph.ranks.items():
        for key, i in zip(keys[r], np.flatnonzero(p.kind == BUSY)):
            own = totals[key][r]
            if own > 0:
                scales[r][i] *= median[key] / own
