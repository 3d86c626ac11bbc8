"""sptrace's own tracks in a merged trace (sptrace.export): per rank, the step's phases, its layers
and modules, every collective as a slice (linked across ranks by flow events), its allocated bytes
as a counter; and the critical path as a process of its own.

Times here are integer nanoseconds on the file's clock (``Clock``): the ranks' clocks aligned on
matched collectives (sptrace.reduce.timebase), less one run-wide zero so that every timestamp is a
small number a double holds to the nanosecond (a Kineto timestamp in us since the epoch does not).

Each track is one or more thread tracks of the rank's process, at thread ids from ``OWN_TID`` up:
above Linux's largest thread id (2^22) and any CUDA stream id, so they never collide with the
threads and streams the profiler recorded. Slices that overlap without nesting (two collectives in
flight at once, a layer's transfer running into the next layer) go on further lanes of the track
("collectives 2"): the Trace Event Format requires the slices of one thread to nest, and a flow
binds to the slice that encloses it, which must be the collective's own.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from sptrace.detect.layers import layers_of_paths
from sptrace.jsonable import records
from sptrace.reduce.critical import CriticalPath
from sptrace.reduce.matching import Matching
from sptrace.reduce.timebase import transfer_span
from sptrace.vocab.jsontypes import JSONObject

OWN_TID = 1 << 30
LANES = 1 << 10
"""Lanes a track may take (its thread ids are OWN_TID + track * LANES + lane)."""
TRACKS = ("phases", "layers", "modules", "collectives", "memory", "critical path")
FLOW_CAT = "sptrace.collective"
COLLECTIVE_ARGS = ["kind", "op", "in_bytes", "out_bytes", "wire_bytes", "dtype", "group", "group_size", "seq", "key",
                   "phase", "layer", "module", "role", "straggler", "skew_us", "source"]  # fmt: skip


def track_tid(track: str, lane: int = 0) -> int:
    return OWN_TID + TRACKS.index(track) * LANES + min(lane, LANES - 1)


@dataclass(frozen=True)
class Clock:
    """The file's time base: ts = a rank's trace time - its clock offset - ``zero_ns``, in ns."""

    offsets_ns: dict[int, int]
    """Per rank: its clock minus the reference rank's (RunAnalysis.offsets_us, in whole ns)."""
    zero_ns: int
    """The aligned time of ts 0: a whole millisecond at or before the earliest event written."""

    @classmethod
    def of(cls, offsets_us: dict[int, float], earliest_us: Iterable[float]) -> Clock:
        zero_ms = math.floor(min(earliest_us, default=0.0) / 1e3)
        return cls({int(r): round(o * 1e3) for r, o in offsets_us.items()}, zero_ms * 1_000_000)

    def shift_ns(self, rank: int) -> int:
        """What to subtract from the rank's trace time (ns) to get the file's."""
        return self.offsets_ns.get(rank, 0) + self.zero_ns

    def trace_us(self, rank: int | pd.Series, us: Any) -> np.ndarray:
        """Trace-clock times in us (a rank's, or a Series of ranks beside ``us``) as file ns: the
        subtraction first, in us, where both terms are exact at the trace's own resolution."""
        if isinstance(rank, pd.Series):
            shift_us = rank.map(lambda r: self.shift_ns(int(r))).to_numpy(dtype=float) / 1e3
        else:
            shift_us = self.shift_ns(rank) / 1e3
        return np.round((np.asarray(us, dtype=float) - shift_us) * 1e3).astype(np.int64)

    def aligned_us(self, us: Any) -> np.ndarray:
        """Times already on the aligned clock (us) as file ns."""
        return np.round((np.asarray(us, dtype=float) - self.zero_ns / 1e3) * 1e3).astype(np.int64)


@dataclass
class Slice:
    """One X slice of a track, before it has a lane. ``ref``: what the caller finds it by (not
    written)."""

    name: str
    start_ns: int
    dur_ns: int
    args: JSONObject = field(default_factory=dict)
    ref: Any = None

    @property
    def end_ns(self) -> int:
        return self.start_ns + self.dur_ns


Window = tuple[int | None, int | None]
"""[start, end) in file ns; None: open."""


def pack_lanes(slices: Sequence[Slice], nested: bool) -> list[int]:
    """Each slice's lane: the first whose open slices it nests in (``nested``) or follows; slices
    that only touch share a lane. Sorted by start, longest first, so a parent precedes its child."""
    order = sorted(range(len(slices)), key=lambda i: (slices[i].start_ns, -slices[i].dur_ns))
    lanes: list[list[int]] = []  # per lane, the ends of its open slices (innermost last)
    out = [0] * len(slices)
    for i in order:
        s = slices[i]
        for k, stack in enumerate(lanes):
            while stack and stack[-1] <= s.start_ns:
                stack.pop()
            if not stack or (nested and s.end_ns <= stack[-1]):
                stack.append(s.end_ns)
                out[i] = k
                break
        else:
            lanes.append([s.end_ns])
            out[i] = len(lanes) - 1
    return out


def place(slices: Sequence[Slice], nested: bool, window_ns: Window) -> list[tuple[Slice, int]]:
    """The slices that overlap the window (as sptrace.load.window.window_filter keeps events),
    each with its lane, in the order they are written: by start, longest first."""
    lo, hi = window_ns
    kept = [s for s in slices if (hi is None or s.start_ns < hi) and (lo is None or s.end_ns >= lo)]
    lanes = pack_lanes(kept, nested)
    order = sorted(range(len(kept)), key=lambda i: (kept[i].start_ns, -kept[i].dur_ns))
    return [(kept[i], lanes[i]) for i in order]


def lane_events(pid: int, track: str, cat: str, placed: list[tuple[Slice, int]]) -> list[JSONObject]:
    """Placed slices as X events, each lane named once and sorted above the recorded threads
    (``ts_ns``/``dur_ns``: the writer turns them into us)."""
    events: list[JSONObject] = []
    for k in range(max((lane for _, lane in placed), default=-1) + 1):
        tid = track_tid(track, k)
        events.append(thread_name(pid, tid, track if k == 0 else f"{track} {k + 1}"))
        events.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                       "args": {"sort_index": tid - OWN_TID - len(TRACKS) * LANES}})  # fmt: skip
    for s, lane in placed:
        events.append({"ph": "X", "name": s.name, "cat": cat, "pid": pid, "tid": track_tid(track, lane),
                       "ts_ns": s.start_ns, "dur_ns": s.dur_ns, "args": s.args})  # fmt: skip
    return events


def track_events(
    pid: int, track: str, cat: str, slices: list[Slice], *, nested: bool, window_ns: Window
) -> list[JSONObject]:
    return lane_events(pid, track, cat, place(slices, nested, window_ns))


def thread_name(pid: int, tid: int, name: str) -> JSONObject:
    return {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}}


_COUNTS = frozenset({"layer", "straggler", "group_size", "seq", "rank", "waiting"})
"""Args that count something: a float column (NaN for unknown) holds them as 3.0; written as 3."""


def _args(row: dict[str, Any], keys: Iterable[str]) -> JSONObject:
    """The row's known values of ``keys`` (JSON-ready: records' Python values)."""
    out = {}
    for k in keys:
        v = row.get(k)
        if v is None:
            continue
        out[k] = int(v) if k in _COUNTS and isinstance(v, float) and v.is_integer() else v
    return out


# ---- per rank ---------------------------------------------------------------------------------


def phase_slices(phases: pd.DataFrame, rank: int, clock: Clock) -> list[Slice]:
    """The rank's phases (sptrace.phase markers, else its ProfilerStep: sptrace.run.map.rank_phases)."""
    mine = phases[phases["rank"] == rank] if len(phases) else phases
    if mine.empty:
        return []
    start = clock.trace_us(rank, mine["start_us"])
    end = clock.trace_us(rank, mine["start_us"].astype(float) + mine["dur_us"].astype(float))
    return [Slice(str(p), int(s), int(e - s), {"phase": str(p)}) for p, s, e in zip(mine["phase"], start, end)]


@dataclass(frozen=True)
class CollectiveSlices:
    """Every chosen rank's collectives as slices with their lanes, and the flow events that link
    the members of each matched collective (and each send to its receive) across ranks."""

    by_rank: dict[int, list[JSONObject]]
    flows: dict[int, list[JSONObject]]
    """Per rank, the flow events (s / f) that bind to its collective slices."""
    n_flows: int


def collective_slices(collectives: pd.DataFrame, matching: Matching | None, ranks: Sequence[int], clock: Clock,
                      window_ns: Window) -> CollectiveSlices:  # fmt: skip
    """One slice per collective over its transfer (where the trace links one, else its CPU issue
    span: sptrace.reduce.timebase.transfer_span), at least 2 ns long so that a flow can sit
    strictly inside it; its matched key, skew and straggler from ``matching``."""
    frame = collectives[collectives["rank"].isin(ranks)] if len(collectives) else collectives
    by_rank: dict[int, list[JSONObject]] = {r: [] for r in ranks}
    flows: dict[int, list[JSONObject]] = {r: [] for r in ranks}
    if frame.empty:
        return CollectiveSlices(by_rank, flows, 0)
    members = matching.members if matching is not None else pd.DataFrame()
    if len(members):  # a member is its rank's collective issued at start_us (as the timeline joins them)
        keyed = members.drop_duplicates(["rank", "start_us"])[["rank", "start_us", "group", "key", "skew_us"]]
        keyed = keyed.rename(columns={"group": "matched_group"}).assign(skew_us=lambda f: f["skew_us"].round(3))
        if matching is not None and len(matching.matched):
            stragglers = matching.matched[["group", "key", "straggler"]].rename(columns={"group": "matched_group"})
            keyed = keyed.merge(stragglers, on=["matched_group", "key"], how="left")
        frame = frame.merge(keyed, on=["rank", "start_us"], how="left")
    start_us, dur_us = transfer_span(frame)
    start = clock.trace_us(frame["rank"], start_us)
    dur = np.maximum(np.round(dur_us.fillna(0.0).to_numpy() * 1e3).astype(np.int64), 2)
    frame = frame.assign(start_ns=start, dur_ns=dur)
    placed: dict[tuple[int, float], tuple[int, int, int]] = {}  # (rank, issue start_us) -> (tid, start, dur)
    for rank, rows in frame.groupby("rank", sort=True):
        slices = [Slice(str(r["kind"]), int(r["start_ns"]), int(r["dur_ns"]), _args(r, COLLECTIVE_ARGS),
                        ref=float(r["start_us"])) for r in records(rows)]  # fmt: skip
        lanes = place(slices, False, window_ns)
        by_rank[int(rank)] = lane_events(int(rank), "collectives", FLOW_CAT, lanes)
        for s, lane in lanes:
            placed.setdefault((int(rank), s.ref), (track_tid("collectives", lane), s.start_ns, s.dur_ns))
    n = _link_members(members, placed, flows) if len(members) else 0
    return CollectiveSlices(by_rank, flows, n)


def _link_members(members: pd.DataFrame, placed: dict[tuple[int, float], tuple[int, int, int]],
                  flows: dict[int, list[JSONObject]]) -> int:  # fmt: skip
    """Flow events for each matched collective with two or more members written: ``s`` on the
    first member (the first to arrive; a send's sender), ``f`` (binding to the enclosing slice)
    on each other, all at the middle of their member's slice. Returns how many flows."""
    n = 0
    for (group, key), g in members.groupby(["group", "key"], sort=False):
        here = [(r, placed.get((int(r), float(s))), skew) for r, s, skew in zip(g["rank"], g["start_us"], g["skew_us"])]
        here = [(int(r), p, skew) for r, p, skew in here if p is not None]
        if len({r for r, _, _ in here}) < 2:
            continue
        if group != "p2p":  # matching lists a pair's sender first; a collective starts at its first arrival
            here.sort(key=lambda m: (m[2] if pd.notna(m[2]) else math.inf, m[0]))
        n += 1
        name = str(key) if group == "p2p" else f"group {group} #{key}"
        for i, (rank, (tid, start, dur), _) in enumerate(here):
            event = {"ph": "s" if i == 0 else "f", "name": name, "cat": FLOW_CAT, "id": n, "pid": rank, "tid": tid,
                     "ts_ns": start + dur // 2}  # fmt: skip
            if i:
                event["bp"] = "e"
            flows[rank].append(event)
    return n


def module_slices(markers: pd.DataFrame, clock: Clock, rank: int) -> list[Slice]:
    """The rank's module ranges (``markers``: path, start_ns, end_ns and tid on the trace clock,
    sptrace.module markers, else the Python stacks' nn.Module frames), named by path."""
    if markers.empty:
        return []
    shift = clock.shift_ns(rank)
    layers = layers_of_paths(markers["path"])
    return [Slice(p, int(s) - shift, max(int(e) - int(s), 0), _args({"module": p, "layer": layers.get(p)},
                                                                    ("module", "layer")))
            for p, s, e in zip(markers["path"], markers["start_ns"], markers["end_ns"])]  # fmt: skip


def layer_slices(modules: list[Slice], collectives: pd.DataFrame, phases: list[Slice]) -> list[Slice]:
    """A slice per layer call: each outermost module range of a layer (its forward), widened to
    the transfers of that layer's collectives in its phase that start inside it; the collectives
    of a (layer, phase) that no module range holds (backward runs in autograd's nodes) make one
    slice from the first to the last. ``collectives``: the rank's, with start_ns and dur_ns."""

    def phase_at(t: int) -> str:
        inside = [p for p in phases if p.start_ns <= t < p.end_ns and p.name != "step"]
        return inside[-1].name if inside else "forward"

    calls: dict[tuple[int, str], list[list[int]]] = {}  # (layer, phase) -> [[start, end]]
    open_end: dict[int, int] = {}
    for s in sorted(modules, key=lambda s: (s.start_ns, -s.dur_ns)):
        layer = s.args.get("layer")
        if layer is None or open_end.get(layer, -1) > s.start_ns:  # inside a range of its own layer
            continue
        open_end[layer] = s.end_ns
        calls.setdefault((layer, phase_at(s.start_ns)), []).append([s.start_ns, s.end_ns])
    loose: dict[tuple[int, str], list[int]] = {}
    if len(collectives):
        for layer, phase, start, dur in zip(collectives["layer"], collectives["phase"], collectives["start_ns"],
                                            collectives["dur_ns"]):  # fmt: skip
            if layer is None or pd.isna(layer):
                continue
            key, start, end = (int(layer), str(phase)), int(start), int(start) + int(dur)
            hit = next((c for c in calls.get(key, []) if c[0] <= start < c[1]), None)
            if hit is not None:
                hit[1] = max(hit[1], end)
            else:
                span = loose.setdefault(key, [start, end])
                span[0], span[1] = min(span[0], start), max(span[1], end)
    out = [Slice(f"layer {layer}", s, e - s, {"layer": layer, "phase": phase, "from": "module ranges"})
           for (layer, phase), spans in calls.items() for s, e in spans]  # fmt: skip
    out += [Slice(f"layer {layer}", s, e - s, {"layer": layer, "phase": phase, "from": "collectives"})
            for (layer, phase), (s, e) in loose.items()]  # fmt: skip
    return out


def memory_events(memory: pd.DataFrame, rank: int, clock: Clock, window_ns: Window) -> list[JSONObject]:
    """The rank's allocated bytes over the step (sptrace.run.map.rank_memory's thinned series) as
    a counter."""
    mine = memory[memory["rank"] == rank] if len(memory) else memory
    if mine.empty:
        return []
    lo, hi = window_ns
    tid = track_tid("memory")
    out = [thread_name(rank, tid, "memory")]
    values = mine["allocated_bytes"].astype("int64").tolist()
    for ts, value in zip(clock.trace_us(rank, mine["ts_us"]).tolist(), values):
        if (lo is None or ts >= lo) and (hi is None or ts < hi):
            out.append({"ph": "C", "name": "memory", "cat": "sptrace.memory", "pid": rank, "tid": tid, "ts_ns": ts,
                        "args": {"allocated bytes": value}})  # fmt: skip
    return out if len(out) > 1 else []


# ---- the critical path ------------------------------------------------------------------------


def critical_path_events(path: CriticalPath, pid: int, clock: Clock, window_ns: Window) -> list[JSONObject]:
    """The critical path (sptrace.reduce.critical.CriticalPath) as a process of its own: one
    slice per segment, named by its kind, rank and module."""
    segments = path.segments
    if segments is None or segments.empty:
        return []
    start = clock.aligned_us(segments["start_us"])
    end = clock.aligned_us(segments["start_us"].astype(float) + segments["dur_us"].astype(float))
    slices = []
    for row, s, e in zip(records(segments), start.tolist(), end.tolist()):
        where = " ".join(str(x) for x in (f"rank {row['rank']}" if row.get("rank") is not None else None,
                                          row.get("module")) if x)  # fmt: skip
        args = _args(row, ("kind", "rank", "module", "layer", "phase", "collective", "waiting"))
        slices.append(Slice(f"{row.get('kind')}: {where}" if where else str(row.get("kind")), s, max(e - s, 0), args))
    meta = [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": "critical path"}},
            {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": -1}}]  # fmt: skip
    events = track_events(pid, "critical path", "sptrace.critical_path", slices, nested=False, window_ns=window_ns)
    return [*meta, *events] if events else []


def own_rank_events(rank: int, *, clock: Clock, phases: pd.DataFrame, collectives: pd.DataFrame,
                    markers: pd.DataFrame, memory: pd.DataFrame, collective_events: list[JSONObject],
                    window_ns: Window) -> Iterator[JSONObject]:  # fmt: skip
    """sptrace's tracks of one rank: phases, layers, modules, collectives, memory."""
    phase = phase_slices(phases, rank, clock)
    modules = module_slices(markers, clock, rank)
    mine = collectives[collectives["rank"] == rank] if len(collectives) else collectives
    if len(mine):
        start_us, dur_us = transfer_span(mine)
        mine = mine.assign(start_ns=clock.trace_us(rank, start_us),
                           dur_ns=np.round(dur_us.fillna(0.0).to_numpy() * 1e3).astype(np.int64))  # fmt: skip
    yield from track_events(rank, "phases", "sptrace.phase", phase, nested=True, window_ns=window_ns)
    yield from track_events(rank, "layers", "sptrace.layer", layer_slices(modules, mine, phase), nested=False,
                            window_ns=window_ns)  # fmt: skip
    yield from track_events(rank, "modules", "sptrace.module", modules, nested=True, window_ns=window_ns)
    yield from collective_events
    yield from memory_events(memory, rank, clock, window_ns)
